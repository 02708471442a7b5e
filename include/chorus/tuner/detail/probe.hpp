// SPDX-License-Identifier: Apache-2.0
// The probe: a few milliseconds of exchanges when a communicator starts, which give the tuner
// its link costs, agreed by every rank and kept in the job's store for later communicators.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
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

/// Median seconds of one exchange of `bytes` each way with `partner` (both send, both
/// receive, in one group), after a warm-up.
inline double probe_exchange(communicator& comm, int partner, std::byte* out, std::byte* in,
                             std::size_t bytes, int reps) {
  std::vector<double> times;
  for (int i = -2; i < reps; ++i) {
    const auto t0 = clock::now();
    comm.sendrecv(out, bytes, partner, in, bytes, partner, dtype::uint8);
    if (i >= 0) times.push_back(std::chrono::duration<double>(clock::now() - t0).count());
  }
  std::nth_element(times.begin(), times.begin() + static_cast<long>(times.size() / 2), times.end());
  return times[times.size() / 2];
}

/// Median seconds of one exchange of `k` small messages each way with `partner`, all in one
/// group: against a single message, what each extra message costs the ends' cores.
inline double probe_burst(communicator& comm, int partner, std::byte* out, std::byte* in, int k,
                          int reps) {
  std::vector<double> times;
  for (int i = -2; i < reps; ++i) {
    const auto t0 = clock::now();
    comm.group_start();
    for (int j = 0; j < k; ++j) {
      comm.send_async(out + 64 * j, 8, dtype::uint8, partner, {.tag = 78});
      comm.recv_async(in + 64 * j, 8, dtype::uint8, partner, {.tag = 78});
    }
    comm.group_end().wait();
    if (i >= 0) times.push_back(std::chrono::duration<double>(clock::now() - t0).count());
  }
  std::nth_element(times.begin(), times.begin() + static_cast<long>(times.size() / 2), times.end());
  return times[times.size() / 2];
}

/// Median seconds of `f()` over a few runs.
template <class F>
double probe_time(int reps, F&& f) {
  std::vector<double> times;
  for (int i = -1; i < reps; ++i) {
    const auto t0 = clock::now();
    f();
    if (i >= 0) times.push_back(std::chrono::duration<double>(clock::now() - t0).count());
  }
  std::nth_element(times.begin(), times.begin() + static_cast<long>(times.size() / 2), times.end());
  return times[times.size() / 2];
}

/// Measures the links every pair of this communicator uses and agrees on the costs: each
/// pair fits per-message overhead from a burst of small messages against one (each extra
/// message costs both ends o for its send and o for its receive), latency from the single
/// small exchange less those overheads, and per-byte cost from a large exchange; each rank
/// times a reduction and a copy; an all_reduce averages it all. Kinds of link the
/// communicator does not have keep `defaults`.
///
/// Pairs that exchange over and over keep each other awake; a collective's steps wait on
/// ever different peers, and where ranks outnumber cores each such wait may cost a trip
/// through the scheduler. So last, every rank times dissemination barriers (log2 P rounds of
/// such waits), and whatever a barrier takes beyond what the pair costs predict for it is
/// added to every link's latency, per round. A collective call: every rank makes it.
inline cost_model probe_costs(communicator& comm, const cost_model& defaults,
                              const executor_options& exec) {
  const topology& t = comm.topo();
  constexpr std::size_t small = 8, large = std::size_t{2} << 20;
  staging_buffer buf;  // huge pages: fresh 4 KiB pages cost 3 ms per MiB here
  buf.reserve(3 * large);
  std::byte* out = buf.data();
  std::byte* in = out + large;
  std::byte* third = in + large;
  // Sums of {latency, per-byte, overhead} for intra and inter links, the number of pairs
  // measuring each, and the reduce and copy times.
  std::array<double, 11> sum{};
  constexpr int burst = 8;
  for (bool inter : {false, true}) {
    const int partner = probe_partner(t, inter);
    if (partner < 0) continue;
    const double ts = probe_exchange(comm, partner, out, in, small, 15);
    const double tb = probe_burst(comm, partner, out, in, burst, 9);
    const double tl = probe_exchange(comm, partner, out, in, large, 3);
    const double o = std::max(0.0, tb - ts) / (2.0 * (burst - 1));
    const std::size_t k = inter ? 4 : 0;
    sum[k] += std::max(0.0, ts - 2 * o);
    sum[k + 1] += std::max(0.0, tl - ts) / static_cast<double>(large - small);
    sum[k + 2] += o;
    sum[k + 3] += 1;
  }
  comm.barrier();  // every rank times its kernels at once, as they run in a collective
  const reduce_fn add = reduce_function(dtype::float32, reduce_op::sum);
  const std::size_t floats = large / sizeof(float);
  sum[8] = probe_time(3, [&] { add(third, out, in, floats); }) / static_cast<double>(large);
  sum[9] = probe_time(3, [&] { std::memcpy(third, out, large); }) / static_cast<double>(large);
  constexpr int barriers = 10;
  sum[10] = probe_time(3, [&] {
              for (int i = 0; i < barriers; ++i) comm.barrier();
            }) / barriers;
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
  }
  c.reduce_s_per_byte = sum[8] / n;
  c.copy_s_per_byte = sum[9] / n;
  c.source = "probe";
  // The barrier's rounds against what these costs predict for them (same on every rank: the
  // inputs are the agreed sums).
  int rounds = 0;
  for (int d = 1; d < comm.size(); d *= 2) ++rounds;
  if (rounds > 0) {
    const tuner model(t, c, {}, exec);
    const double predicted = model.predict(collective::barrier, algo::dissemination, 0, 1);
    const double extra = (sum[10] / n - predicted) / rounds;
    if (extra > 0) {
      if (sum[3] > 0) c.intra.latency_s += extra;
      if (sum[7] > 0) c.inter.latency_s += extra;
    }
  }
  return c;
}

inline cost_model job_costs_agreed(communicator& comm, store& root, std::mutex& lock,
                                   const std::string& signature, const cost_model& defaults,
                                   const executor_options& exec);

/// The costs for `comm`: the job's earlier measurement for a communicator of the same shape
/// and transport (key `signature` in the job's store `root`), else a fresh probe, which is
/// then kept there. A collective call.
inline cost_model job_costs(communicator& comm, store& own, store& root, std::mutex& lock,
                            const std::string& signature, const cost_model& defaults,
                            const executor_options& exec) {
  cost_model c = job_costs_agreed(comm, root, lock, signature, defaults, exec);
  // Nobody leaves until everyone is done: a rank that went on and failed at once (a
  // mismatched first call) would otherwise fail the probe of a rank still finishing it,
  // inside communicator creation instead of the call that was wrong.
  own.barrier("chorus/tuner/probed");
  return c;
}

inline cost_model job_costs_agreed(communicator& comm, store& root, std::mutex& lock,
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
  std::array<double, 10> v{};
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
    c.source = "cache";
    return c;
  }
  cost_model c = probe_costs(comm, defaults, exec);
  if (comm.rank() == 0) {
    v = {c.intra.latency_s, c.intra.send_s_per_byte, c.intra.recv_s_per_byte, c.intra.overhead_s,
         c.inter.latency_s, c.inter.send_s_per_byte, c.inter.recv_s_per_byte, c.inter.overhead_s,
         c.reduce_s_per_byte, c.copy_s_per_byte};
    std::lock_guard lk(lock);
    root.set(key, std::as_bytes(std::span(v)));
    root.add(key + "/ready", 1);
  }
  return c;
}

}  // namespace chorus::detail
