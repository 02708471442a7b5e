// SPDX-License-Identifier: Apache-2.0
// The probe: a few milliseconds of exchanges when a communicator starts, which give the tuner
// its link costs, agreed by every rank and kept in the job's store for later communicators.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <limits>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "chorus/bootstrap/store.hpp"
#include "chorus/communicator.hpp"
#include "chorus/executor/staging.hpp"
#include "chorus/reduce/reduce.hpp"
#include "chorus/tuner/tuner.hpp"

namespace chorus::detail {

/// The partner this rank exchanges with to measure one kind of link, or -1: inside a node,
/// local ranks 2i and 2i+1; across nodes, the ranks with the same local index on nodes 2j
/// and 2j+1. Every pair measures at once, so the costs include what ranks sharing cores (or
/// a NIC) do to each other, as they will in a collective.
inline int probe_partner(const topology& t, bool inter) {
  const int me = t.local_rank();
  if (!inter) {
    const int q = me ^ 1;
    return q < t.local_size() ? t.local_ranks()[static_cast<std::size_t>(q)] : -1;
  }
  const int other = t.node() ^ 1;
  if (other >= t.nodes()) return -1;
  const auto& m = t.members[static_cast<std::size_t>(other)];
  return me < static_cast<int>(m.size()) ? m[static_cast<std::size_t>(me)] : -1;
}

/// The most ranks any node of `t` has.
inline int most_local_ranks(const topology& t) {
  int most = 1;
  for (const auto& m : t.members) most = std::max(most, static_cast<int>(m.size()));
  return most;
}

/// The median of `v` (not empty); reorders it. Every probe keeps the median of many samples:
/// on a shared machine one sample in ten may include a sleep and a wake-up that cost 100
/// times the exchange.
inline double median(std::vector<double>& v) {
  std::nth_element(v.begin(), v.begin() + static_cast<long>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

/// Median seconds of one exchange of `bytes` each way with `partner` (both send, both
/// receive, in one group), after a warm-up; with `single_copy`, each reads the other's send
/// in place where the transport can (p2p_options::single_copy). Each exchange sends the next
/// of `windows` consecutive stretches of `bytes` at `out`, round robin, the first two rounds
/// a warm-up, so that memory and links are measured as a loop of collectives finds them. The
/// first round faults the pages in (3.7 ms per 2 MiB here); in the second, TCP streams (each
/// carrying every CHORUS_TCP_CONNS-th message) come up to speed after that slow start: with
/// one round, the first timed exchanges of 2 TCP ranks took 1-1.7 ms against 0.45-0.6 ms
/// later, and 6 of 10 launches measured 0.9-1.2 GB/s where the ring then moved 3.4.
inline double probe_exchange(communicator& comm, int partner, std::byte* out, std::byte* in,
                             std::size_t bytes, int reps, bool single_copy = false,
                             std::size_t windows = 1) {
  std::vector<double> times;
  const int warm = std::max(2, 2 * static_cast<int>(windows));
  for (int i = -warm; i < reps; ++i) {
    const std::byte* from = out + static_cast<std::size_t>(i + warm) % windows * bytes;
    const auto t0 = clock::now();
    comm.sendrecv(from, bytes, partner, in, bytes, partner, dtype::uint8, {.single_copy = single_copy});
    if (i >= 0) times.push_back(std::chrono::duration<double>(clock::now() - t0).count());
  }
  return median(times);
}

/// Median seconds that `k` - 1 extra small messages each way with `partner` add to a group
/// of one: bursts of `k` and of one alternate, and each pair's difference is one sample. A
/// group runs on the communicator's worker thread unless the waiting thread takes it first
/// (request::wait), so either burst alone may include the hand-off to that thread (6-10 µs
/// here, 10-20 times an 8-byte exchange); alternating them, both of a pair see the machine
/// alike even while it is briefly slower (another guest's turn).
inline double probe_burst(communicator& comm, int partner, std::byte* out, std::byte* in, int k,
                          int reps) {
  auto burst = [&](int messages) {
    const auto t0 = clock::now();
    comm.group_start();
    for (int j = 0; j < messages; ++j) {
      comm.send_async(out + 64 * j, 8, dtype::uint8, partner, {.tag = 78});
      comm.recv_async(in + 64 * j, 8, dtype::uint8, partner, {.tag = 78});
    }
    comm.group_end().wait();
    return std::chrono::duration<double>(clock::now() - t0).count();
  };
  std::vector<double> extra;
  for (int i = -2; i < reps; ++i) {
    const double one = burst(1);
    const double many = burst(k);
    if (i >= 0) extra.push_back(many - one);
  }
  return median(extra);
}

/// Median seconds of `f()` over `reps` runs, after one.
template <class F>
double probe_time(int reps, F&& f) {
  std::vector<double> times;
  for (int i = -1; i < reps; ++i) {
    const auto t0 = clock::now();
    f();
    if (i >= 0) times.push_back(std::chrono::duration<double>(clock::now() - t0).count());
  }
  return median(times);
}

inline void with_pull_overheads(cost_model& c);

/// Seconds of CPU this thread has used: what a core spent on it, waits for memory included
/// and turns of other ranks sharing the core left out.
inline double thread_seconds() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

/// The cost of memory beyond the caches (sim_network::memory_s_per_byte, cache_bytes) that
/// explains reading a buffer through, in seconds per byte: `cached` for `cached_bytes` that
/// are in the caches, `alone` with buffers of `alone_bytes` in all, and `together` where the
/// node's ranks read at once with `together_bytes` in all. The model: of buffers of W bytes
/// the caches miss 1 - C / W, each byte missed costing m, so a byte read costs
/// cached + m (1 - C / W). Two measured sizes give m and C; where the smaller read as fast as
/// the cached one, C is taken to be its size (the least it can be), and C is at least
/// `cached_bytes`; where the larger read as fast, there is no cost to see and {0, 0} is
/// returned. Noise of a tenth of `cached` is no slowdown.
inline std::pair<double, std::size_t> fit_memory(double cached, double cached_bytes, double alone, double alone_bytes,
                                                 double together, double together_bytes) {
  const double slack = cached / 10;
  const double d1 = alone - cached, d2 = together - cached;
  if (!(cached > 0) || !(together_bytes > alone_bytes) || !(d2 > slack)) return {0, 0};
  double x = 0, cache = 0;  // x = m
  if (!(d1 > slack)) {
    cache = alone_bytes;
    x = d2 / (1 - alone_bytes / together_bytes);
  } else if (d2 > d1) {
    const double xc = (d2 - d1) / (1 / alone_bytes - 1 / together_bytes);
    x = d2 + xc / together_bytes;
    cache = xc / x;
  }
  if (!(cache >= cached_bytes)) {  // the larger no slower than the smaller (noise), or little more
    cache = cached_bytes;
    x = d2 / (1 - cache / together_bytes);
  }
  return {x, static_cast<std::size_t>(cache)};
}

/// Reads `bytes` at `p` (a multiple of 32) through the core, as a copy or a reduction reads
/// its input, and returns something of what it read so that the reads cannot be left out.
inline std::uint64_t read_through(const std::byte* p, std::size_t bytes) {
  std::uint64_t a[4]{};
  for (std::size_t i = 0; i + 32 <= bytes; i += 32) {
    for (std::size_t k = 0; k < 4; ++k) {
      std::uint64_t w;
      std::memcpy(&w, p + i + 8 * k, sizeof w);
      a[k] ^= w;
    }
  }
  return a[0] ^ a[1] ^ a[2] ^ a[3];
}

/// A small collective the probe timed with every rank at once: what the model must predict.
struct calibration_run {
  collective kind = collective::barrier;
  algo algorithm = algo::automatic;
  std::size_t count = 0;  ///< elements of one byte (schedule.hpp's count)
  double seconds = 0;     ///< measured, the mean of a run of them
};

/// Multipliers {a, b} for every link's latency and per-message overhead in `c` such that the
/// model predicts `runs` best (least squares of the log of predicted over measured). Messages
/// this small cost nearly nothing per byte, so a prediction scales as both costs do: for each
/// ratio b/a on a grid (1/64 to 64, steps of sqrt 2) the best a has a closed form, and the
/// ratio with the smallest error wins (nearest 1, the pairs' own split, on a tie). With one
/// run, or runs that cannot tell the two apart, the ratio stays 1. A link's overhead of 0
/// would not move with its multiplier: the caller starts such a one from a quarter of its
/// latency.
inline std::pair<double, double> fit_latency_overhead(const topology& t, const cost_model& c,
                                                      const executor_options& exec,
                                                      const std::vector<calibration_run>& runs) {
  std::pair<double, double> best{1, 1};
  double best_err = std::numeric_limits<double>::infinity();
  for (int k : {0, 1, -1, 2, -2, 3, -3, 4, -4, 5, -5, 6, -6, 7, -7, 8, -8, 9, -9, 10, -10, 11, -11, 12, -12}) {
    if (runs.size() < 2 && k != 0) break;
    const double ratio = std::pow(2.0, k / 2.0);
    cost_model m = c;
    m.intra.overhead_s *= ratio;
    m.inter.overhead_s *= ratio;
    with_pull_overheads(m);
    const tuner priced(t, m, {}, exec);
    std::vector<double> logs;
    for (const calibration_run& r : runs) {
      const double p = priced.predict(r.kind, r.algorithm, r.count, 1);
      if (!(p > 0) || !(r.seconds > 0)) return best;
      logs.push_back(std::log(r.seconds / p));
    }
    double mean = 0;
    for (double v : logs) mean += v / static_cast<double>(logs.size());
    double err = 0;
    for (double v : logs) err += (v - mean) * (v - mean);
    if (err < best_err - 1e-12) {
      best_err = err;
      best = {std::exp(mean), std::exp(mean) * ratio};
    }
  }
  return best;
}

/// Measures the links every pair of this communicator uses and agrees on the costs: each
/// pair fits per-message overhead from a burst of small messages against a burst of one
/// (each extra message costs both ends o for its send and o for its receive), latency from
/// the single small exchange less those overheads, per-byte cost from a large exchange, and
/// what the start of a message adds (link_cost::small_s_per_byte) from a 2 KiB exchange;
/// each rank times a reduction and a copy, and reads to price memory beyond the caches
/// (fit_memory); an all_reduce averages it all. Kinds of link the communicator does not have
/// keep `defaults`. Every figure is a median of many samples (the calibration's collectives'
/// of rounds, each round a mean).
///
/// Pairs that exchange over and over keep each other awake; a collective's steps wait on
/// ever different peers, and where ranks outnumber cores each such wait may cost a trip
/// through the scheduler. So every rank also times small collectives with everyone at once,
/// and the pairs' latencies and overheads are scaled until the model predicts those
/// (fit_latency_overhead): from 3 to 64 ranks three patterns, a dissemination barrier (log2 P
/// rounds of one message, mostly latency), a ring all_gather of 8 bytes (P - 1 steps, each
/// from the same neighbour) and a direct all_to_all of 8 bytes (P - 1 messages at once,
/// mostly overhead), which fit latency and overhead apart; elsewhere the barrier alone, which
/// scales both alike. A collective call: every rank makes it.
inline cost_model probe_costs(communicator& comm, const cost_model& defaults,
                              const executor_options& exec) {
  const topology& t = comm.topo();
  constexpr std::size_t small = 8, large = std::size_t{2} << 20;
  // Plain pages, as callers' buffers have: a receiver reading another process's memory in
  // place pins it page by page, and on 4 KiB pages that reading ran at 17 GB/s where huge
  // pages gave 27 (2 ranks, 2 MiB): probed on huge pages, the tuner preferred reading in
  // place at 2 ranks, where it ran 30% slower than a ring on plain buffers. (Faulted in by
  // the kernel: a fault taken from user space costs ~12 µs a page here.)
  staging_buffer buf = staging_buffer::plain();
  buf.reserve(3 * large);
  std::byte* out = buf.data();
  std::byte* in = out + large;
  std::byte* third = in + large;
  // A node's links are timed in the caches, one 2 MiB send over and over: what buffers
  // beyond the caches add is the memory cost's (cost_model::memory_s_per_byte, measured
  // below), which the simulator charges on top. Timed out of stretches as the rest, a sweep
  // of 2 to 8 ranks put 448 of its 624 rows within 0.75-1.25 of their times, timed in the
  // caches 468 (the picks within 10% of the fastest 91 and 90 of 104; bench/README.md).
  // Links between nodes, and reads in place, go out of stretch after stretch of a larger
  // buffer, as a collective large enough for their costs to matter finds its memory: used
  // before, but not in the caches and TLBs. A reader in place pins the writer's pages and
  // walks its page tables, a cost per page: read over and over from 2 MiB, it ran at 13 GB/s
  // here, and a 64 MiB all_reduce read at 9.5 (the tuner then took reading in place for 2
  // ranks, where it ran 1.5x slower than the ring); timed in the caches at 10-19 GB/s, it was
  // picked at 2 ranks where it took 2.3x the fastest.
  constexpr std::size_t windows = 8;
  const int most_local = most_local_ranks(t);
  staging_buffer stretches = staging_buffer::plain();
  if (most_local > 1 || t.nodes() > 1) stretches.reserve(windows * large);
  // Sums of {latency, per-byte, overhead} for intra and inter links, the number of pairs
  // measuring each, the reduce and copy times, a barrier's, the per-byte cost of reading a
  // send in place inside a node, the ring all_gather's and the all_to_all's times, and the
  // reads for memory beyond the caches (alone, nodes reading, together, ranks reading, cached),
  // and what the start of a message adds, per byte of its first 2 KiB (intra, inter).
  std::array<double, 21> sum{};
  // The calibration's collectives first, on the caller's thread as a blocking collective
  // runs, timed as a perf binary times a collective: warmed up, then rounds of runs, the
  // median round. Where ranks outnumber cores one barrier in ten takes ten times the median,
  // and those count: a round's time is its mean. Timed after one warm-up as the mean of 15,
  // the barrier took 248-367 µs in six launches of 8 shared memory ranks on 2 cores, and
  // 0-18 of each launch's 30 rows up to 2 KiB were predicted at 0.8-1.25 of their times;
  // timed this way, in six launches alternating with those, 166-217 µs and 21-27 rows.
  const int n_ranks = comm.size();
  const bool patterns = n_ranks >= 3 && n_ranks <= 64;
  constexpr std::size_t tiny = 8;
  std::vector<std::byte> block(tiny), gathered(tiny * static_cast<std::size_t>(n_ranks)),
      exchanged(tiny * static_cast<std::size_t>(n_ranks));
  auto time_of = [&](auto&& f) {
    constexpr int warmup = 5, rounds = 5, runs = 10;
    for (int i = 0; i < warmup; ++i) f();
    std::vector<double> round(rounds);
    for (double& r : round) {
      const auto t0 = clock::now();
      for (int i = 0; i < runs; ++i) f();
      r = std::chrono::duration<double>(clock::now() - t0).count() / runs;
    }
    return median(round);
  };
  // The barrier's, the ring all_gather's and the all_to_all's times.
  auto calibrate = [&] {
    std::array<double, 3> v{};
    v[0] = time_of([&] { comm.barrier(); });
    if (patterns) {
      v[1] = time_of([&] {
        comm.all_gather(block.data(), gathered.data(), tiny, dtype::uint8, {.algorithm = algo::ring});
      });
      v[2] = time_of([&] {
        comm.all_to_all(gathered.data(), exchanged.data(), tiny, dtype::uint8, {.algorithm = algo::direct});
      });
    }
    return v;
  };
  const std::array<double, 3> early = calibrate();
  // Where a node runs more ranks than it has cores, the tuner's simulator deals its ranks
  // out to its cores (cost_model::cores_per_node) and wants what one rank moves with a core
  // to itself: bandwidths and kernels are then timed one pair (one rank) of a node at a
  // time, the rest asleep in a barrier. Elsewhere everyone measures at once, as they run.
  std::array<std::int64_t, 1> cores{static_cast<std::int64_t>(std::max(1u, std::thread::hardware_concurrency()))};
  comm.all_reduce(std::span<std::int64_t>(cores), {.op = reduce_op::min});
  const bool shared_cores = most_local > cores[0];
  // Runs f() on every rank, in turn by local rank (`per_turn` at a time) where cores are shared.
  auto in_turn = [&](int per_turn, auto&& f) {
    if (!shared_cores) return f();
    for (int turn = 0; turn * per_turn < most_local; ++turn) {
      if (t.local_rank() / per_turn == turn) f();
      comm.barrier();
    }
  };
  constexpr int burst = 8;
  for (bool inter : {false, true}) {
    const int partner = probe_partner(t, inter);
    // Every rank takes part in the turns (they end in barriers), partner or not.
    const bool any = inter ? t.nodes() > 1 : most_local > 1;
    if (!any) continue;
    // Per-byte costs are what a large exchange takes beyond a small one timed in the same
    // turn. With shared cores the turns leave a pair alone, while the small exchanges below
    // run with every pair at once and include trips through the scheduler (70 µs at 8 ranks
    // on 2 cores): subtracted from a large exchange timed alone, they made its bytes look
    // up to twice as cheap, by as much as the scheduler happened to cost. Without shared
    // cores the turn is everyone at once, and its small exchange is the latency's too.
    double tl = 0, tp = 0, alone = 0, start = 0;
    in_turn(inter ? 1 : 2, [&] {
      if (partner < 0) return;
      alone = probe_exchange(comm, partner, out, in, small, 31);
      start = probe_exchange(comm, partner, out, in, link_cost::small_message_bytes, 31);
      // Inside a node in the caches, between nodes out of the stretches (above).
      tl = probe_exchange(comm, partner, inter ? stretches.data() : out, in, large, 2 * windows, false,
                          inter ? windows : 1);
      if (!inter) tp = probe_exchange(comm, partner, stretches.data(), in, large, 2 * windows, true, windows);
    });
    if (partner < 0) continue;
    const double ts = shared_cores ? probe_exchange(comm, partner, out, in, small, 31) : alone;
    // A message's overhead at its two ends is part of the single exchange (ts = L + 2o), so
    // a burst that says more met a slow hand-off to the worker, not slow messages.
    const double o = std::clamp(probe_burst(comm, partner, out, in, burst, 15) / (2.0 * (burst - 1)), 0.0, ts / 2);
    const std::size_t k = inter ? 4 : 0;
    sum[k] += std::max(0.0, ts - 2 * o);
    // On a machine too busy to tell (the small exchange's median as long as the large one's:
    // seen once in tuner_test beside two simulations) the difference says nothing, and 0
    // would make bytes free: at least half of the large exchange is taken to be its bytes'.
    auto beyond_small = [&](double large_time) {
      return std::max(large_time - alone, large_time / 2) / static_cast<double>(large - small);
    };
    sum[k + 1] += beyond_small(tl);
    sum[k + 2] += o;
    sum[k + 3] += 1;
    // A message of 2 KiB beyond what its bytes cost at the large exchange's rate: the start
    // of a message (link_cost::small_s_per_byte). 2 shared memory ranks here took 0.6 us for
    // 8 B each way and 1.0 for 2 KiB, 0.3 us more than the bytes at 15 GB/s.
    constexpr auto start_bytes = static_cast<double>(link_cost::small_message_bytes);
    const double bulk = (start_bytes - static_cast<double>(small)) * beyond_small(tl);
    sum[inter ? 20 : 19] += std::max(0.0, start - alone - bulk) / start_bytes;
    // Read in place, all of an exchange's per-byte cost is the reader's (each end reads once).
    if (!inter) sum[11] += beyond_small(tp);
  }
  comm.barrier();  // every rank times its kernels at once, as they run in a collective
  const reduce_fn add = reduce_function(dtype::float32, reduce_op::sum);
  const std::size_t floats = large / sizeof(float);
  in_turn(1, [&] {
    sum[8] = probe_time(5, [&] { add(third, out, in, floats); }) / static_cast<double>(large);
    sum[9] = probe_time(5, [&] { std::memcpy(third, out, large); }) / static_cast<double>(large);
  });
  // Memory beyond the caches (fit_memory): a buffer read through, in CPU time, the median of
  // five: by one rank of each node its first 2 MiB (in the caches) and then all of it alone,
  // and by every rank of the fullest nodes at once, each read followed by a barrier, so that
  // between two of its reads every rank reads once (the node's caches then hold every rank's
  // buffer, or fail to), as a collective touches all of its ranks' buffers in turn. On huge
  // pages, written when allocated: on this VM a page's first touch from user space cost
  // 5.6 us, and reading the plain pages of the stretches (sent from, never touched) made this
  // part take 134 ms at 8 TCP ranks instead of 25.
  // Read alone, the buffer is 16 MiB; read together, each rank's is 16 MiB or at few ranks
  // enough that the node's come to 64 MiB (32 MiB at 2 ranks, 22 at 3): two ranks' 16 MiB
  // were barely beyond the caches, and in most launches of 2 ranks the probe saw no slowdown,
  // where a cost of 40 GB/s beyond 16 MiB put 5-23 more of a sweep's 624 rows within 25%.
  // The read alone stays at 16 MiB: at 32 MiB (2 ranks, run V in bench/README.md) the fit
  // put the caches at 2-8 MiB, where launches of more ranks fitted 10-22.
  const std::size_t alone_bytes = windows * large;
  const auto node_ranks = static_cast<std::size_t>(most_local);  // at least 1
  const std::size_t read_bytes = std::max(windows, (32 + node_ranks - 1) / node_ranks) * large;
  if (most_local > 1) {
    staging_buffer scratch;
    scratch.reserve(read_bytes);
    auto read_seconds = [&](std::size_t bytes, bool barriers) {  // per byte
      std::vector<double> v;
      for (int i = -1; i < 5; ++i) {
        const double t0 = thread_seconds();
        const std::uint64_t folded = read_through(scratch.data(), bytes);
        std::memcpy(third, &folded, sizeof folded);  // kept, so that the reads must be made
        if (i >= 0) v.push_back((thread_seconds() - t0) / static_cast<double>(bytes));
        if (barriers) comm.barrier();
      }
      return median(v);
    };
    if (t.local_rank() == 0) {
      sum[18] = read_seconds(large, false);
      sum[14] = read_seconds(alone_bytes, false);
      sum[15] = 1;
    }
    comm.barrier();
    const double together = read_seconds(read_bytes, true);
    if (t.local_size() == most_local) {
      sum[16] = together;
      sum[17] = 1;
    }
  }
  // The calibration again, keeping the quicker of each: a machine briefly slower (another
  // guest's turn) during one of the two does not make every step look slow.
  const std::array<double, 3> late = calibrate();
  sum[10] = std::min(early[0], late[0]);
  sum[12] = std::min(early[1], late[1]);
  sum[13] = std::min(early[2], late[2]);
  comm.all_reduce(std::span<double>(sum));
  cost_model c = defaults;
  const double n = static_cast<double>(comm.size());
  for (bool inter : {false, true}) {
    const std::size_t k = inter ? 4 : 0;
    if (sum[k + 3] == 0) continue;
    link_cost& l = inter ? c.inter : c.intra;
    l.latency_s = sum[k] / sum[k + 3];
    // An exchange keeps both ends' ports busy with their send and their receive.
    l.send_s_per_byte = l.recv_s_per_byte = 0.5 * sum[k + 1] / sum[k + 3];
    l.overhead_s = sum[k + 2] / sum[k + 3];
    l.small_s_per_byte = sum[inter ? 20 : 19] / sum[k + 3];
    if (!inter) c.pull.recv_s_per_byte = sum[11] / sum[k + 3];
  }
  c.reduce_s_per_byte = sum[8] / n;
  c.copy_s_per_byte = sum[9] / n;
  c.cores_per_node = shared_cores ? static_cast<int>(cores[0]) : 0;
  if (sum[15] > 0 && sum[17] > 0) {
    const auto node_bytes = static_cast<double>(most_local) * static_cast<double>(read_bytes);
    std::tie(c.memory_s_per_byte, c.cache_bytes) =
        fit_memory(sum[18] / sum[15], static_cast<double>(large), sum[14] / sum[15],
                   static_cast<double>(alone_bytes), sum[16] / sum[17], node_bytes);
  }
  c.source = "probe";
  // The pairs' small-message costs say how links compare; the calibration's collectives,
  // run by every rank at once as the others will be, say what a message costs in them and,
  // from 3 ranks up, how that splits into latency and overhead. The pairs' split alone (a
  // burst of 8 against 1) measured overheads of 0.4 to 11 µs in launches of one shape (8
  // ranks on 2 cores), and scaled to the barrier alone the ring and direct all_reduce of
  // 8 B were predicted 2-3x too slow there. The same on every rank: the inputs are the
  // agreed sums. A measured link predicts a step of at least its exchange's time (L + 2o =
  // ts > 0, o being bounded).
  std::vector<calibration_run> runs{{collective::barrier, algo::dissemination, 0, sum[10] / n}};
  if (patterns) {
    runs.push_back({collective::all_gather, algo::ring, tiny, sum[12] / n});
    runs.push_back({collective::all_to_all, algo::direct, tiny, sum[13] / n});
  }
  for (link_cost* l : {&c.intra, &c.inter}) {
    if (sum[l == &c.inter ? 7 : 3] == 0) continue;
    if (l->overhead_s <= 0) l->overhead_s = l->latency_s / 4;
    if (l->latency_s <= 0) l->latency_s = l->overhead_s;
  }
  const auto [latency_scale, overhead_scale] = fit_latency_overhead(t, c, exec, runs);
  // In the log, so that a sweep can be fitted again (bench/tuner/replay starts from the result).
  for (const calibration_run& r : runs) {
    char us[32];
    std::snprintf(us, sizeof us, " %.1f us", r.seconds * 1e6);
    c.fitted += (c.fitted.empty() ? "" : ", ") + std::string(to_string(r.algorithm)) + " " +
                std::string(to_string(r.kind)) + us;
  }
  char scales[64];
  std::snprintf(scales, sizeof scales, ": latency x%.3g, overhead x%.3g", latency_scale, overhead_scale);
  c.fitted += scales;
  for (link_cost* l : {&c.intra, &c.inter}) {
    if (sum[l == &c.inter ? 7 : 3] == 0) continue;
    l->latency_s *= latency_scale;
    l->overhead_s *= overhead_scale;
  }
  with_pull_overheads(c);
  return c;
}

/// A send read in place starts as any message inside the node does (its frame is a small
/// one): the pull link takes the intra link's latency and overhead, and its own per-byte cost.
inline void with_pull_overheads(cost_model& c) {
  c.pull.latency_s = c.intra.latency_s;
  c.pull.overhead_s = c.intra.overhead_s;
  c.pull.send_s_per_byte = 0;
}

inline cost_model job_costs_agreed(communicator& comm, store& root, store_turns& lock,
                                   const std::string& signature, const cost_model& defaults,
                                   const executor_options& exec);

/// The costs for `comm`: the job's earlier measurement for a communicator of the same shape
/// and transport (key `signature` in the job's store `root`), else a fresh probe, which is
/// then kept there. A collective call.
inline cost_model job_costs(communicator& comm, store& own, store& root, store_turns& lock,
                            const std::string& signature, const cost_model& defaults,
                            const executor_options& exec) {
  cost_model c = job_costs_agreed(comm, root, lock, signature, defaults, exec);
  // Nobody leaves until everyone is done: a rank that went on and failed at once (a
  // mismatched first call) would otherwise fail the probe of a rank still finishing it,
  // inside communicator creation instead of the call that was wrong.
  own.barrier("chorus/tuner/probed");
  return c;
}

inline cost_model job_costs_agreed(communicator& comm, store& root, store_turns& lock,
                                   const std::string& signature, const cost_model& defaults,
                                   const executor_options& exec) {
  const std::string key = "chorus/tuner/costs/" + signature;
  // Rank 0 looks; everyone learns the answer, so all take the same branch.
  std::array<std::int64_t, 1> cached{0};
  if (comm.rank() == 0) {
    std::lock_guard lk(lock);
    cached[0] = root.add(key + "/ready", 0);
  }
  comm.all_reduce(std::span<std::int64_t>(cached), {.op = reduce_op::max});
  std::array<double, 16> v{};
  if (cached[0] > 0) {
    std::vector<std::byte> bytes;
    {
      std::lock_guard lk(lock);
      bytes = root.get(key);
    }
    if (bytes.size() != sizeof v) throw error(errc::protocol, "the store's tuner costs under " + key + " are malformed");
    std::memcpy(v.data(), bytes.data(), sizeof v);
    cost_model c = defaults;
    c.intra = {v[0], v[1], v[2], v[3]};
    c.inter = {v[4], v[5], v[6], v[7]};
    c.reduce_s_per_byte = v[8];
    c.copy_s_per_byte = v[9];
    c.cores_per_node = static_cast<int>(v[10]);
    c.pull.recv_s_per_byte = v[11];
    c.memory_s_per_byte = v[12];
    c.cache_bytes = static_cast<std::size_t>(v[13]);
    c.intra.small_s_per_byte = v[14];
    c.inter.small_s_per_byte = v[15];
    with_pull_overheads(c);
    c.source = "cache";
    return c;
  }
  cost_model c = probe_costs(comm, defaults, exec);
  if (comm.rank() == 0) {
    v = {c.intra.latency_s, c.intra.send_s_per_byte, c.intra.recv_s_per_byte, c.intra.overhead_s,
         c.inter.latency_s, c.inter.send_s_per_byte, c.inter.recv_s_per_byte, c.inter.overhead_s,
         c.reduce_s_per_byte, c.copy_s_per_byte, static_cast<double>(c.cores_per_node),
         c.pull.recv_s_per_byte, c.memory_s_per_byte, static_cast<double>(c.cache_bytes),
         c.intra.small_s_per_byte, c.inter.small_s_per_byte};
    std::lock_guard lk(lock);
    root.set(key, std::as_bytes(std::span(v)));
    root.add(key + "/ready", 1);
  }
  return c;
}

}  // namespace chorus::detail
