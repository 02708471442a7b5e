// SPDX-License-Identifier: Apache-2.0
// The executor: runs one rank's schedules over a transport, slice by slice, reducing as data lands.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "chorus/concepts.hpp"
#include "chorus/detail/failures.hpp"
#include "chorus/detail/frame.hpp"
#include "chorus/error.hpp"
#include "chorus/executor/detail/hazards.hpp"
#include "chorus/executor/staging.hpp"
#include "chorus/reduce/reduce.hpp"
#include "chorus/schedule/schedule.hpp"

namespace chorus {

/// Tuning of the executor. Defaults were measured on 2 cores over TCP loopback
/// (bench/perf/all_reduce_perf); each field has a CHORUS_* variable.
struct executor_options {
  std::size_t slice_bytes = 2 << 20;  ///< CHORUS_SLICE_BYTES: largest frame payload, >= 4 KiB
  std::size_t window = 8;             ///< CHORUS_SLICES_IN_FLIGHT: posted sends (and recvs) per peer, 1..64
  std::chrono::microseconds spin{50};    ///< CHORUS_SPIN_US: poll this long before sleeping
  /// A wait that slept and still ended within `spin_max` lengthens the next spins to twice
  /// what it took, up to `spin_max`; longer waits shorten them again, down to `spin`. Waking
  /// a sleeping rank costs 100-300 µs on this VM (its virtual core halted), so with a fixed
  /// 50 µs two ranks that once fall asleep keep waking each other late, every exchange 100
  /// times slower, until the run ends. `spin_max` = `spin`: a fixed spin (CHORUS_SPIN_US).
  std::chrono::microseconds spin_max{1000};
  /// The largest frame every rank's transport takes (the communicator agrees it at start:
  /// a shared-memory ring holds a few slices, and both ends must cut messages alike).
  std::size_t max_slice_bytes = 64u << 20;
};

/// The buffers of one operation and how to combine elements.
struct op_buffers {
  const std::byte* input = nullptr;
  std::byte* output = nullptr;
  std::size_t input_bytes = 0;
  std::size_t output_bytes = 0;
  std::size_t elem_size = 1;
  reduce_fn reduce = nullptr;  ///< needed when a step reduces
};

/// One operation of a run: its schedule, the fingerprint its frames carry and its buffers.
/// Several jobs in one run progress together and complete together (grouped operations).
struct executor_job {
  const schedule* sched = nullptr;
  detail::op_fingerprint fp{};
  op_buffers buffers{};
  /// Mark every send exposable (transfer::exposable): the receiver may read it in place,
  /// and the send completes once it has. See detail::exposes_sends().
  bool expose = false;
};

namespace detail {

/// Whether an operation's sends are exposed (transfer::exposable) to receivers that can read
/// them in place. Direct steps, and the intra-node phases of hierarchical ones, send each
/// byte once and nothing waits for the send but the end of the operation, so a receiver that
/// reads them in place saves the sender a copy and costs nobody a wait. A ring's or a tree's
/// next step forwards what the last one received and would wait for its successor to read
/// it: over shared memory that measured slower than copying through the rings (a 4-rank
/// ring all_reduce 0.88-0.94 GB/s against 1.60-1.64 on 2 cores). Point-to-point sends are
/// exposed only where the caller asks (p2p_options::single_copy), because an exposed send
/// completes only when its receiver has taken it.
constexpr bool exposes_sends(collective kind, algo a) noexcept {
  return kind != collective::send_recv && (a == algo::direct || a == algo::hierarchical);
}

/// The slice size the executor cuts an operation's regions into. Both ends of every
/// message must cut it alike (a frame's length is checked against the receive's), so the
/// size depends only on what every rank knows of the call (collective, algorithm, count,
/// ranks), never on this rank's schedule: a quarter of the algorithm's typical region, so
/// that consecutive steps overlap slice by slice. The typical region is the ring's chunk
/// (count / P) for ring, direct and hierarchical all-reduce, a tree's half buffer over its depth for
/// the tree (its pipeline is as deep as the tree), half the buffer for halving-doubling, one
/// block for the block collectives, the buffer otherwise. Slices are no smaller than 64 KiB
/// (per-frame costs), no larger than `slice_bytes` or what the transports take (max_slice,
/// agreed by every rank), and a whole number of elements. all_to_allv, whose blocks differ
/// per rank, cuts at the largest size. The simulator prices schedules with the same cut.
inline std::size_t slice_for(collective kind, algo a, std::size_t count, int nranks,
                             std::size_t elem_size, std::size_t slice_bytes, std::size_t max_slice) {
  const std::size_t cap = std::min(slice_bytes, max_slice);
  const auto n = static_cast<std::size_t>(std::max(1, nranks));
  std::size_t typical = count * elem_size;
  if (kind == collective::all_reduce) {
    if (a == algo::ring || a == algo::hierarchical || a == algo::direct) typical /= n;
    if (a == algo::halving_doubling) typical /= 2;
    if (a == algo::tree) {
      std::size_t depth = 1;
      while ((std::size_t{1} << depth) < n) ++depth;
      typical /= 2 * depth;
    }
  }
  const std::size_t wanted =
      kind == collective::all_to_allv ? cap
                                      : std::min(std::max<std::size_t>(typical / 4, 64 * 1024), cap);
  return std::max<std::size_t>(1, wanted / elem_size) * elem_size;
}

}  // namespace detail

/// Runs schedules over a transport.
///
/// Per peer, sends are posted in schedule order and so are receives (the transport's
/// contract: the k-th frame to a peer matches its k-th receive), but peers do not wait for
/// each other: a send to one peer whose data is not ready yet never holds back a send to
/// another, and each peer has its own window of slices in flight. Between steps only the
/// bytes they share order them (detail/hazards.hpp), slice by slice, so a step forwards
/// slice k as soon as the step that produces it has written slice k.
class executor {
 public:
  executor(detail::any_transport& t, executor_options o) : transport_(t), opts_(o) {
    opts_.slice_bytes = std::max<std::size_t>(opts_.slice_bytes, 4096);
    opts_.window = std::clamp<std::size_t>(opts_.window, 1, 64);
    opts_.spin_max = std::max(opts_.spin_max, opts_.spin);
    spin_ = opts_.spin;
    transport_.remember(&history_);
  }
  executor(const executor&) = delete;  // the transport holds the address of history_
  executor& operator=(const executor&) = delete;

  /// What an idle wait checks besides its deadline: abort() and the job's failed ranks. A run
  /// that waits on a failed rank, or on an aborted communicator, ends with the watch's error.
  void set_watch(const detail::watch* w) { watch_ = w; }

  /// Sets the largest frame: the smallest any rank's transport takes (see executor_options).
  void set_max_slice(std::size_t bytes) {
    opts_.max_slice_bytes = std::max<std::size_t>(bytes, 1);
    last_plan_.clear();
  }

  /// Runs `s` to completion, or throws chorus::error naming the operation and the peer.
  void run(const schedule& s, const detail::op_fingerprint& fp, const op_buffers& b,
           clock::time_point deadline, std::chrono::milliseconds timeout) {
    const executor_job j{&s, fp, b};
    run(std::span<const executor_job>(&j, 1), deadline, timeout);
  }

  /// Runs every job to completion together (a group), or throws chorus::error.
  void run(std::span<const executor_job> jobs, clock::time_point deadline,
           std::chrono::milliseconds timeout) {
    run_until(jobs, deadline, timeout);
  }
  /// As above, with the deadline `timeout` after the run's first idle turn: a run that never
  /// waits never reads the clock (a read costs ~16 ns here, a tenth of a small operation).
  void run(std::span<const executor_job> jobs, std::chrono::milliseconds timeout) {
    run_until(jobs, std::nullopt, timeout);
  }

  /// Sends in flight per peer where they are exposed (see plan()).
  static constexpr std::size_t exposed_window = 64;

  /// The collective the last failed run failed in, as its frames name it; null where that
  /// run was a send or receive, or none failed. The communicator's abort tells the peers.
  const detail::frame_header* failed_call() const { return failed_; }

 private:
  using role = detail::access_role;

  void run_until(std::span<const executor_job> jobs, std::optional<clock::time_point> deadline,
                 std::chrono::milliseconds timeout);
  struct place {
    std::byte* ptr = nullptr;
    std::size_t bytes = 0;
    std::uintptr_t lo() const { return reinterpret_cast<std::uintptr_t>(ptr); }
    std::uintptr_t hi() const { return lo() + bytes; }
  };
  struct step_state {
    const step* st = nullptr;
    std::uint32_t job = 0;
    std::uint32_t index = 0;  // within its job's schedule
    place send, recv, local;
    std::size_t unit = 1;  // slice bytes (a copy moves its region as one unit)
    std::size_t send_slices = 0, recv_slices = 0;
    std::size_t send_posted = 0, send_done = 0;
    std::size_t recv_posted = 0, recv_done = 0;
    std::uint32_t hazards_begin = 0, hazards_end = 0;  // into hazards_.gates

    const place& at(role r) const {
      return r == role::send ? send : r == role::write ? recv : local;
    }
  };
  struct inflight {
    transfer x;
    std::uint32_t step = 0;
    std::size_t slice = 0;
    std::size_t slot = 0;  // staging slot of a reducing receive
  };
  /// A FIFO of at most `window` transfers at stable addresses (transports keep pointers).
  struct fifo {
    std::vector<inflight> ring;
    std::size_t head = 0, size = 0;
    bool full() const { return size == ring.size(); }
    inflight& front() { return ring[head]; }
    inflight& push() {
      inflight& f = ring[(head + size++) % ring.size()];
      f = inflight{};
      return f;
    }
    void pop() {
      head = (head + 1) % ring.size();
      --size;
    }
  };
  struct peer_state {
    std::vector<std::uint32_t> sends, recvs;  // steps sending to / receiving from this peer
    std::size_t send_cur = 0, recv_cur = 0;   // first of them with slices left to post
    fifo tx, rx;
    std::size_t slot_base = 0, slots = 0, slots_used = 0, next_slot = 0;
  };

  /// Is every byte that slice k of `ss`'s place `mine` touches free of earlier steps?
  bool clear(const step_state& ss, role mine, std::size_t k) const {
    const place& p = ss.at(mine);
    if (p.bytes == 0) return true;
    const std::uintptr_t lo = k == whole ? p.lo() : p.lo() + std::min(k * ss.unit, p.bytes);
    const std::uintptr_t hi = k == whole ? p.hi() : std::min(lo + ss.unit, p.hi());
    for (std::uint32_t i = ss.hazards_begin; i < ss.hazards_end; ++i) {
      const detail::gate& g = hazards_.gates[i];
      if (g.mine != mine) continue;
      const step_state& t = steps_[g.step];
      const place& q = t.at(g.theirs);
      if (hi <= q.lo() || lo >= q.hi()) continue;
      // t works through its place in order: it must have finished every slice below hi.
      const std::size_t upto = std::min(hi, q.hi()) - q.lo();
      const std::size_t needed = (upto + t.unit - 1) / t.unit;
      const std::size_t done = g.theirs == role::send ? t.send_done : t.recv_done;
      const std::size_t total = g.theirs == role::send ? t.send_slices : t.recv_slices;
      if (done < std::min(needed, total)) return false;
    }
    return true;
  }
  static constexpr std::size_t whole = std::numeric_limits<std::size_t>::max();

  place resolve(const region& r, const op_buffers& b, std::size_t scratch_base, std::size_t i);
  void plan(std::span<const executor_job> jobs);
  bool advance(std::span<const executor_job> jobs);
  bool advance_peer(std::span<const executor_job> jobs, int p);
  bool run_copies();
  /// After a wait that slept and took `waited` in all: spin for twice that next time if it
  /// was short enough (a sleep that short only added a wake-up), else halve the spin.
  void adapt_spin(std::chrono::nanoseconds waited) {
    spin_ = waited <= opts_.spin_max ? std::clamp<std::chrono::nanoseconds>(2 * waited, spin_, opts_.spin_max)
                                     : std::max<std::chrono::nanoseconds>(opts_.spin, spin_ / 2);
  }
  /// The transfer waited for longest: a receive where one is posted, else a send (peer -1
  /// and step 0 when nothing is posted, e.g. a run of copies only).
  struct waiting {
    int peer = -1;
    bool receiving = false;
    std::uint32_t step = 0;
  };
  waiting oldest_waiting() const;
  /// Tells every peer we wait to receive from which collective we wait in (a check frame).
  void post_checks(std::span<const executor_job> jobs);
  [[noreturn]] void fail_timeout(std::span<const executor_job> jobs,
                                 std::chrono::milliseconds timeout);

  detail::any_transport& transport_;
  executor_options opts_;
  std::chrono::nanoseconds spin_{};  // the current spin, between opts_.spin and opts_.spin_max
  detail::staging_buffer staging_;  // slots for reducing receives, per peer
  detail::staging_buffer scratch_;  // the schedules' scratch buffers
  detail::call_history history_;    // this rank's last calls, for leftover frames
  const detail::frame_header* failed_ = nullptr;  // into history_
  const detail::watch* watch_ = nullptr;
  std::size_t slot_bytes_ = 0;

  // Per-run state; the vectors keep their capacity between operations.
  std::vector<step_state> steps_;
  detail::hazard_table hazards_;
  std::vector<peer_state> peers_;  // by rank
  std::vector<int> active_;        // peers this run talks to
  std::vector<std::uint32_t> copies_;
  std::size_t copy_cur_ = 0;
  std::size_t units_left_ = 0;  // slices (and copies) not yet completed

  /// What the last plan was made for, a key per job: the same calls on the same buffers
  /// again (a training loop's, a benchmark's, a pipeline's sendrecv) replay it instead of
  /// planning anew, which took a sixth of an 8-byte all_reduce's software.
  struct plan_key {
    const schedule* sched = nullptr;
    const step* steps = nullptr;
    std::size_t nsteps = 0;
    detail::op_fingerprint fp{};
    op_buffers buffers{};
    bool expose = false;
    bool matches(const executor_job& j) const {
      const detail::op_fingerprint& f = j.fp;
      const op_buffers& b = j.buffers;
      // all_to_allv's counts are not in its fingerprint, and its schedule is rebuilt in place.
      return sched != nullptr && !f.count_per_block && j.sched == sched && j.sched->steps.data() == steps &&
             j.sched->steps.size() == nsteps && f.kind == fp.kind && f.algorithm == fp.algorithm &&
             f.count == fp.count && f.root == fp.root && f.type == fp.type && b.input == buffers.input &&
             b.output == buffers.output && b.input_bytes == buffers.input_bytes &&
             b.output_bytes == buffers.output_bytes && b.elem_size == buffers.elem_size &&
             b.reduce == buffers.reduce && j.expose == expose;
    }
  };
  std::vector<plan_key> last_plan_;  // empty: replay nothing
  bool replays(std::span<const executor_job> jobs) const {
    if (last_plan_.empty() || last_plan_.size() != jobs.size()) return false;
    for (std::size_t i = 0; i < jobs.size(); ++i) {
      if (!last_plan_[i].matches(jobs[i])) return false;
    }
    return true;
  }
  std::size_t planned_units_ = 0;
  void replan(std::span<const executor_job> jobs);
};

// ---------------------------------------------------------------------------------------

inline executor::place executor::resolve(const region& r, const op_buffers& b,
                                         std::size_t scratch_base, std::size_t i) {
  place p;
  p.bytes = r.count * b.elem_size;
  const std::size_t off = r.offset * b.elem_size;
  const std::size_t limit = r.buffer == buffer_id::input    ? b.input_bytes
                            : r.buffer == buffer_id::output ? b.output_bytes
                                                            : scratch_.size() - scratch_base;
  if (r.count > 0 && (off > limit || p.bytes > limit - off)) {
    throw error(errc::invalid_argument,
                "schedule bug: step " + std::to_string(i) + " names bytes [" + std::to_string(off) +
                    ", " + std::to_string(off + p.bytes) + ") of a " + std::to_string(limit) +
                    "-byte buffer");
  }
  switch (r.buffer) {
    case buffer_id::input:
      // The input is only read; const_cast lets one place type serve sends and copies.
      p.ptr = const_cast<std::byte*>(b.input) + off;
      break;
    case buffer_id::output:
      p.ptr = b.output + off;
      break;
    case buffer_id::scratch:
      p.ptr = scratch_.data() + scratch_base + off;
      break;
  }
  return p;
}

inline void executor::plan(std::span<const executor_job> jobs) {
  std::size_t nsteps = 0, scratch_bytes = 0;
  for (const executor_job& j : jobs) {
    nsteps += j.sched->steps.size();
    scratch_bytes += (j.sched->scratch_count * j.buffers.elem_size + 63) / 64 * 64;
  }
  scratch_.reserve(scratch_bytes);
  steps_.resize(nsteps);
  const int n = transport_.size();
  if (peers_.size() < static_cast<std::size_t>(n)) peers_.resize(static_cast<std::size_t>(n));
  for (int p : active_) {
    peer_state& ps = peers_[static_cast<std::size_t>(p)];
    ps.sends.clear();
    ps.recvs.clear();
    ps.send_cur = ps.recv_cur = 0;
    ps.tx.head = ps.tx.size = ps.rx.head = ps.rx.size = 0;
    ps.slots = ps.slots_used = ps.next_slot = 0;
  }
  active_.clear();
  copies_.clear();
  copy_cur_ = 0;
  units_left_ = 0;
  hazards_.clear();

  auto touch = [&](int p) {
    if (p < 0 || p >= n || p == transport_.rank()) {
      throw error(errc::invalid_argument,
                  "schedule bug: a step names rank " + std::to_string(p) + " as its peer");
    }
    peer_state& ps = peers_[static_cast<std::size_t>(p)];
    if (ps.sends.empty() && ps.recvs.empty()) active_.push_back(p);
    return &ps;
  };

  std::size_t g = 0, scratch_base = 0;
  slot_bytes_ = 0;
  for (std::uint32_t ji = 0; ji < jobs.size(); ++ji) {
    const executor_job& j = jobs[ji];
    const schedule& s = *j.sched;
    const std::size_t slice =
        detail::slice_for(j.fp.kind, j.fp.algorithm, j.fp.count, s.nranks, j.buffers.elem_size,
                          opts_.slice_bytes, opts_.max_slice_bytes);
    if (slice > detail::max_frame_payload) {
      throw error(errc::invalid_argument, "a slice of " + std::to_string(slice) +
                                              " bytes exceeds the largest frame");
    }
    for (std::size_t i = 0; i < s.steps.size(); ++i, ++g) {
      const step& st = s.steps[i];
      step_state& ss = steps_[g];
      ss = step_state{};
      ss.st = &st;
      ss.job = ji;
      ss.index = static_cast<std::uint32_t>(i);
      ss.unit = slice;
      if (st.send_peer >= 0) {
        ss.send = resolve(st.send_from, j.buffers, scratch_base, i);
        ss.send_slices = std::max<std::size_t>(1, (ss.send.bytes + slice - 1) / slice);
        touch(st.send_peer)->sends.push_back(static_cast<std::uint32_t>(g));
      }
      if (st.action != recv_action::none) {
        ss.recv = resolve(st.recv_into, j.buffers, scratch_base, i);
        if (st.action == recv_action::reduce || st.action == recv_action::copy) {
          ss.local = resolve(st.reduce_with, j.buffers, scratch_base, i);
          if (ss.local.bytes != ss.recv.bytes) {
            throw error(errc::invalid_argument, "schedule bug: step " + std::to_string(i) +
                                                    " reduces or copies regions of different sizes");
          }
        }
        if (st.action == recv_action::copy) {
          ss.recv_slices = 1;
          ss.unit = std::max<std::size_t>(1, ss.recv.bytes);
          copies_.push_back(static_cast<std::uint32_t>(g));
        } else {
          if (st.recv_peer < 0) {
            throw error(errc::invalid_argument,
                        "schedule bug: step " + std::to_string(i) + " receives from no peer");
          }
          ss.recv_slices = std::max<std::size_t>(1, (ss.recv.bytes + slice - 1) / slice);
          touch(st.recv_peer)->recvs.push_back(static_cast<std::uint32_t>(g));
          if (st.action == recv_action::reduce) slot_bytes_ = std::max(slot_bytes_, slice);
        }
      }
      if (ss.send_slices + ss.recv_slices > std::numeric_limits<std::uint32_t>::max()) {
        throw error(errc::invalid_argument, "a step of more than 2^32 slices");
      }
      units_left_ += ss.send_slices + ss.recv_slices;
      hazards_.add(static_cast<std::uint32_t>(g), role::send, ss.send.lo(), ss.send.hi());
      hazards_.add(static_cast<std::uint32_t>(g), role::write, ss.recv.lo(), ss.recv.hi());
      hazards_.add(static_cast<std::uint32_t>(g), role::local, ss.local.lo(), ss.local.hi());
    }
    scratch_base += (s.scratch_count * j.buffers.elem_size + 63) / 64 * 64;
  }
  hazards_.build(nsteps);
  for (std::size_t i = 0; i < nsteps; ++i) {
    steps_[i].hazards_begin = hazards_.first[i];
    steps_[i].hazards_end = hazards_.first[i + 1];
  }

  // Each peer we receive reduced slices from gets its own staging slots, so that slices from
  // one peer waiting on their hazards never starve another peer's (whose reduction may be
  // what clears them). A window's worth for up to two such peers, fewer each beyond that.
  std::size_t reducing_peers = 0;
  for (int p : active_) {
    peer_state& ps = peers_[static_cast<std::size_t>(p)];
    for (std::uint32_t t : ps.recvs) {
      if (steps_[t].st->action == recv_action::reduce) {
        ++reducing_peers;
        ps.slots = 1;
        break;
      }
    }
  }
  const std::size_t per_peer =
      reducing_peers <= 2 ? opts_.window
                          : std::max<std::size_t>(2, 2 * opts_.window / reducing_peers);
  // Exposed sends (executor_job::expose) take no room in the transport until read, so many
  // more go out at once: the receiver then reads at its own pace, without waking its sender
  // for each slice (with more ranks than cores each such wake-up cost 100-300 µs here, and a
  // 4-rank direct all_reduce of 64 MiB ran 4x slower with a window of 8).
  bool exposing = false;
  for (const executor_job& j : jobs) exposing = exposing || j.expose;
  const std::size_t tx_window = exposing ? std::max(opts_.window, exposed_window) : opts_.window;
  std::size_t base = 0;
  for (int p : active_) {
    peer_state& ps = peers_[static_cast<std::size_t>(p)];
    if (ps.tx.ring.size() != tx_window) ps.tx.ring.resize(tx_window);
    if (ps.rx.ring.size() != opts_.window) ps.rx.ring.resize(opts_.window);
    if (ps.slots == 0) continue;
    ps.slots = std::min(per_peer, opts_.window);
    ps.slot_base = base;
    base += ps.slots;
  }
  staging_.reserve(base * slot_bytes_);
}

inline void executor::replan(std::span<const executor_job> jobs) {
  if (replays(jobs)) {
    // The same plan: only the progress made through it starts over.
    for (step_state& ss : steps_) ss.send_posted = ss.send_done = ss.recv_posted = ss.recv_done = 0;
    for (int p : active_) {
      peer_state& ps = peers_[static_cast<std::size_t>(p)];
      ps.send_cur = ps.recv_cur = 0;
      ps.tx.head = ps.tx.size = ps.rx.head = ps.rx.size = 0;
      ps.slots_used = ps.next_slot = 0;
    }
    copy_cur_ = 0;
    units_left_ = planned_units_;
    return;
  }
  plan(jobs);
  planned_units_ = units_left_;
  last_plan_.clear();
  for (const executor_job& j : jobs) {
    last_plan_.push_back(
        {j.sched, j.sched->steps.data(), j.sched->steps.size(), j.fp, j.buffers, j.expose});
  }
}

inline bool executor::advance_peer(std::span<const executor_job> jobs, int p) {
  peer_state& ps = peers_[static_cast<std::size_t>(p)];
  bool moved = false;

  // 1. Retire finished sends and receives in posting order; apply reductions as data lands.
  while (ps.tx.size > 0 && ps.tx.front().x.done) {
    ++steps_[ps.tx.front().step].send_done;
    ps.tx.pop();
    --units_left_;
    moved = true;
  }
  while (ps.rx.size > 0 && ps.rx.front().x.done) {
    inflight& f = ps.rx.front();
    step_state& ss = steps_[f.step];
    const bool reducing = ss.st->action == recv_action::reduce;
    if (reducing && !(clear(ss, role::write, f.slice) && clear(ss, role::local, f.slice))) {
      if (f.x.lent) {
        // Lent memory must not wait on our hazards: the peer may need that room before it
        // can send what clears them. Take a copy into our own slot and give it back.
        std::byte* own = staging_.data() + f.slot * slot_bytes_;
        std::memcpy(own, f.x.data, f.x.length);
        transport_.release(p, &f.x);
        f.x.data = own;
        f.x.lent = false;
      }
      break;
    }
    if (reducing && f.x.length > 0) {
      const op_buffers& b = jobs[ss.job].buffers;
      const std::size_t off = f.slice * ss.unit;
      b.reduce(ss.recv.ptr + off, ss.local.ptr + off, f.x.data, f.x.length / b.elem_size);
    }
    if (f.x.lent) transport_.release(p, &f.x);
    if (reducing) --ps.slots_used;
    ++ss.recv_done;
    ps.rx.pop();
    --units_left_;
    moved = true;
  }

  // 2. Post sends in schedule order while the window has room and the data is ready.
  while (ps.send_cur < ps.sends.size() && !ps.tx.full()) {
    step_state& ss = steps_[ps.sends[ps.send_cur]];
    if (ss.send_posted == ss.send_slices) {
      ++ps.send_cur;
      continue;
    }
    const std::size_t k = ss.send_posted;
    if (!clear(ss, role::send, k)) break;
    const std::size_t first = k * ss.unit;
    const std::size_t len = first >= ss.send.bytes ? 0 : std::min(ss.unit, ss.send.bytes - first);
    inflight& f = ps.tx.push();
    f.step = ps.sends[ps.send_cur];
    f.slice = k;
    f.x.data = ss.send.ptr + first;
    f.x.length = len;
    f.x.exposable = jobs[ss.job].expose;
    f.x.header = detail::make_header(jobs[ss.job].fp, ss.index, k, static_cast<std::uint32_t>(len),
                                     ss.st->send_from.count);
    ++ss.send_posted;
    transport_.post_send(p, &f.x);
    moved = true;
  }

  // 3. Post receives in schedule order. A storing receive writes its destination as bytes
  //    arrive, so its hazards must be clear before it is posted. A reducing one lands in
  //    staging and checks them when it applies (step 1): were it posted only after this
  //    step's own send of the slice went out, two ranks exchanging slices larger than their
  //    socket buffers would wait on each other.
  while (ps.recv_cur < ps.recvs.size() && !ps.rx.full()) {
    step_state& ss = steps_[ps.recvs[ps.recv_cur]];
    if (ss.recv_posted == ss.recv_slices) {
      ++ps.recv_cur;
      continue;
    }
    const std::size_t k = ss.recv_posted;
    const bool reducing = ss.st->action == recv_action::reduce;
    if (reducing ? ps.slots_used == ps.slots : !clear(ss, role::write, k)) break;
    const std::size_t first = k * ss.unit;
    const std::size_t len = first >= ss.recv.bytes ? 0 : std::min(ss.unit, ss.recv.bytes - first);
    inflight& f = ps.rx.push();
    f.step = ps.recvs[ps.recv_cur];
    f.slice = k;
    f.x.length = len;
    if (reducing) {
      // FIFO retirement frees a peer's slots in the order they were taken.
      f.slot = ps.slot_base + ps.next_slot++ % ps.slots;
      ++ps.slots_used;
      f.x.data = staging_.data() + f.slot * slot_bytes_;
      f.x.lendable = true;
    } else {
      f.x.data = ss.recv.ptr + first;
    }
    f.x.header = detail::make_header(jobs[ss.job].fp, ss.index, k, static_cast<std::uint32_t>(len),
                                     ss.st->recv_into.count);
    ++ss.recv_posted;
    transport_.post_recv(p, &f.x);
    moved = true;
  }
  return moved;
}

inline bool executor::run_copies() {
  bool moved = false;
  // A copy moves its whole region at once, so every hazard must be wholly done.
  while (copy_cur_ < copies_.size()) {
    step_state& ss = steps_[copies_[copy_cur_]];
    if (!clear(ss, role::write, whole) || !clear(ss, role::local, whole)) break;
    if (ss.recv.bytes > 0 && ss.recv.ptr != ss.local.ptr) {
      std::memmove(ss.recv.ptr, ss.local.ptr, ss.recv.bytes);
    }
    ss.recv_posted = ss.recv_done = 1;
    ++copy_cur_;
    --units_left_;
    moved = true;
  }
  return moved;
}

inline bool executor::advance(std::span<const executor_job> jobs) {
  bool moved = run_copies();
  for (int p : active_) moved = advance_peer(jobs, p) || moved;
  return moved;
}

inline void executor::run_until(std::span<const executor_job> jobs,
                                std::optional<clock::time_point> deadline,
                                std::chrono::milliseconds timeout) {
  failed_ = nullptr;
  replan(jobs);
  for (const executor_job& j : jobs) history_.record(j.fp);
  try {
    // Reading the clock costs as much as a poll of shared memory on some VMs, so an idle
    // loop reads it only every 16 turns; the spin starts at the first read after a move.
    clock::time_point idle_since{}, next_check{};
    bool idle = false, slept = false;
    // A wait that lasts says so to the peers it waits for (post_checks), after check_first
    // and then at doubling intervals up to check_most: a peer that made a different call of
    // that number, and perhaps waits for us in turn, then fails with errc::mismatch instead
    // of both waiting out their timeouts. A peer that made the same call ignores it.
    constexpr auto check_first = std::chrono::milliseconds(250), check_most = std::chrono::milliseconds(4000);
    std::chrono::milliseconds check_every = check_first;
    unsigned idle_turns = 0;
    for (;;) {
      bool moved = advance(jobs);
      const bool done = units_left_ == 0;
      if (!done) moved = transport_.progress() || moved;
      if (slept && (moved || done)) adapt_spin(clock::now() - idle_since);
      if (done) return;
      if (moved) {
        idle = slept = false;
        idle_turns = 0;
        continue;
      }
      if (++idle_turns % 16 != 0 && spin_.count() > 0) continue;
      const auto now = clock::now();
      if (!deadline) deadline = now + timeout;
      if (now >= *deadline) fail_timeout(jobs, timeout);
      if (watch_ != nullptr && watch_->alarm()) {
        // The job of the oldest waiting transfer names the operation, as for a timeout.
        const executor_job& j = jobs[steps_[oldest_waiting().step].job];
        if (auto e = watch_->verdict(j.fp.op_seq, j.fp.kind)) throw *e;
      }
      if (!idle) {
        idle = true;
        idle_since = now;
        check_every = check_first;
        next_check = now + check_every;
      } else if (now >= next_check) {
        post_checks(jobs);
        check_every = std::min(2 * check_every, check_most);
        next_check = now + check_every;
      }
      // Spin briefly (a reply often lands within microseconds), then sleep in the kernel so
      // that ranks sharing a core with us can run.
      if (now - idle_since >= spin_) {
        transport_.wait(*deadline);
        slept = true;
      }
    }
  } catch (const error& e) {
    last_plan_.clear();
    // Transfers point into the peers' fifos: they are reset only by the next plan(), after
    // the transport forgot them, which the communicator guarantees by never using a failed
    // transport again.
    // The collective that failed, for the abort (send_recv numbers are the pair's, not ours).
    auto blame = [this](const executor_job& k) {
      if (k.fp.kind != collective::send_recv) failed_ = history_.find(k.fp.op_seq);
    };
    if (e.op()) {
      for (const executor_job& k : jobs) {
        if (k.fp.op_seq == *e.op() && to_string(k.fp.kind) == e.call()) blame(k);
      }
      // A peer's check frame can name one of our earlier calls (read_check): the abort then
      // names that call, so that the peer, which waits in its own, reads it as a mismatch.
      if (failed_ == nullptr && e.code() == errc::mismatch) failed_ = history_.find(*e.op());
      throw;
    }
    // Name the operation: the one that talks to the failing peer, else the first.
    const executor_job* j = &jobs.front();
    for (int r : e.ranks()) {
      if (r < 0 || static_cast<std::size_t>(r) >= peers_.size()) continue;
      const peer_state& ps = peers_[static_cast<std::size_t>(r)];
      if (ps.rx.size > 0) j = &jobs[steps_[ps.rx.ring[ps.rx.head].step].job];
      else if (ps.tx.size > 0) j = &jobs[steps_[ps.tx.ring[ps.tx.head].step].job];
      break;
    }
    blame(*j);
    throw error(e.code(),
                e.message() + " (op " + std::to_string(j->fp.op_seq) + ", " +
                    std::string(to_string(j->fp.kind)) + ")",
                e.ranks(), j->fp.op_seq, std::string(to_string(j->fp.kind)));
  }
}

inline executor::waiting executor::oldest_waiting() const {
  // The oldest receive still waiting names the peer we wait for; else the oldest send.
  for (bool receiving : {true, false}) {
    for (int p : active_) {
      const fifo& q = receiving ? peers_[static_cast<std::size_t>(p)].rx
                                : peers_[static_cast<std::size_t>(p)].tx;
      if (q.size > 0) return {p, receiving, q.ring[q.head].step};
    }
  }
  return {};
}

inline void executor::post_checks(std::span<const executor_job> jobs) {
  for (int p : active_) {
    const fifo& q = peers_[static_cast<std::size_t>(p)].rx;
    if (q.size == 0) continue;
    const detail::op_fingerprint& f = jobs[steps_[q.ring[q.head].step].job].fp;
    // Point-to-point messages are numbered per pair, and all_to_allv's counts per block.
    if (f.kind == collective::send_recv || f.count_per_block) continue;
    transport_.post_check(p, detail::check_header_of(detail::make_header(f, 0, 0, 0)));
  }
}

inline void executor::fail_timeout(std::span<const executor_job> jobs,
                                   std::chrono::milliseconds timeout) {
  std::string what = "operation";
  std::vector<int> ranks;
  const waiting w = oldest_waiting();
  const executor_job* j = &jobs[steps_[w.step].job];
  if (w.peer >= 0) {
    what = (w.receiving ? "recv from rank " : "send to rank ") + std::to_string(w.peer);
    ranks.push_back(w.peer);
  }
  const double secs = static_cast<double>(timeout.count()) / 1000.0;
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", secs);
  throw error(errc::timeout,
              what + " (op " + std::to_string(j->fp.op_seq) + ", " +
                  std::string(to_string(j->fp.kind)) + ") timed out after " + buf + " s",
              ranks, j->fp.op_seq, std::string(to_string(j->fp.kind)));
}

}  // namespace chorus
