// SPDX-License-Identifier: Apache-2.0
// The executor: runs one rank's schedule over a transport, slice by slice, reducing as data lands.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <limits>
#include <string>
#include <vector>

#include "chorus/concepts.hpp"
#include "chorus/detail/frame.hpp"
#include "chorus/error.hpp"
#include "chorus/executor/staging.hpp"
#include "chorus/reduce/reduce.hpp"
#include "chorus/schedule/schedule.hpp"

namespace chorus {

/// Tuning of the executor. Defaults were measured on 2 cores over TCP loopback
/// (bench/perf/all_reduce_perf); each field has a CHORUS_* variable.
struct executor_options {
  std::size_t slice_bytes = 2 << 20;  ///< CHORUS_SLICE_BYTES: largest frame payload, >= 4 KiB
  std::size_t window = 8;             ///< CHORUS_SLICES_IN_FLIGHT: posted sends (and recvs), 1..64
  std::chrono::microseconds spin{50};    ///< CHORUS_SPIN_US: poll this long before sleeping
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

class executor {
 public:
  executor(detail::any_transport& t, executor_options o) : transport_(t), opts_(o) {
    opts_.slice_bytes = std::max<std::size_t>(opts_.slice_bytes, 4096);
    opts_.window = std::clamp<std::size_t>(opts_.window, 1, 64);
  }

  /// Runs `s` to completion, or throws chorus::error naming the operation and the peer.
  void run(const schedule& s, const detail::op_fingerprint& fp, const op_buffers& b,
           clock::time_point deadline, std::chrono::milliseconds timeout);

 private:
  struct place {  // a region resolved to memory, with its canonical identity for hazards
    std::byte* ptr = nullptr;
    std::size_t bytes = 0;
    int canon = -1;  // canonical buffer (input aliased into output maps to output)
    std::size_t start = 0;
  };
  struct step_state {
    place send, recv, local;
    std::size_t send_slices = 0, recv_slices = 0;
    std::size_t send_posted = 0, send_done = 0;
    std::size_t recv_posted = 0, recv_done = 0;
    // Hazards, as lists of earlier (or same) steps whose progress gates ours slice by slice.
    std::vector<std::uint32_t> send_after_writes;  // steps writing what we send
    std::vector<std::uint32_t> recv_after_sends;   // steps sending what we overwrite
    std::vector<std::uint32_t> recv_after_writes;  // steps writing what we overwrite or reduce with
  };
  struct inflight {
    transfer x;
    std::uint32_t step = 0;
    std::size_t slice = 0;
    std::size_t slot = 0;  // staging slot of a reducing receive
  };

  std::size_t slice_len(const place& p, std::size_t k) const {
    const std::size_t first = k * slice_;
    return first >= p.bytes ? 0 : std::min(slice_, p.bytes - first);
  }
  static std::size_t slices_of(std::size_t bytes, std::size_t slice) {
    return std::max<std::size_t>(1, (bytes + slice - 1) / slice);
  }
  static bool overlaps(const place& a, const place& b) {
    if (a.canon != b.canon || a.bytes == 0 || b.bytes == 0) return false;
    return a.start < b.start + b.bytes && b.start < a.start + a.bytes;
  }
  bool written_upto(std::uint32_t t, std::size_t k) const {
    return steps_[t].recv_done >= std::min(k + 1, steps_[t].recv_slices);
  }
  bool sent_upto(std::uint32_t t, std::size_t k) const {
    return steps_[t].send_done >= std::min(k + 1, steps_[t].send_slices);
  }
  /// k for "every slice": written_upto and sent_upto then ask for the step's last slice.
  static constexpr std::size_t whole_step = std::numeric_limits<std::size_t>::max() - 1;
  /// May slice k of this step's destination be written now?
  bool hazards_clear(const step_state& ss, std::size_t k) const {
    for (auto t : ss.recv_after_sends) {
      if (!sent_upto(t, k)) return false;
    }
    for (auto t : ss.recv_after_writes) {
      if (!written_upto(t, k)) return false;
    }
    return true;
  }

  /// How input and output overlap: not at all, or one wholly inside the other (in-place
  /// calls). Overlapping buffers share one identity so that hazards between them are tracked.
  struct aliasing {
    bool input_in_output = false;  // all_reduce, all_gather in place
    bool output_in_input = false;  // reduce_scatter in place
    std::size_t offset = 0;        // bytes from the outer buffer's start to the inner one
  };
  place resolve(const region& r, const op_buffers& b, const aliasing& a);
  void plan(const schedule& s, const op_buffers& b);
  bool advance(const schedule& s, const detail::op_fingerprint& fp, const op_buffers& b);
  [[noreturn]] void fail_timeout(const schedule& s, const detail::op_fingerprint& fp,
                                 std::chrono::milliseconds timeout) const;

  detail::any_transport& transport_;
  executor_options opts_;
  detail::staging_buffer staging_;  // window x slice bytes, for reducing receives
  detail::staging_buffer scratch_;  // the schedule's scratch buffer
  std::size_t slice_ = 0;

  // Per-run state; the vectors keep their capacity between operations.
  std::vector<step_state> steps_;  // the first nsteps_ belong to the running schedule
  std::size_t nsteps_ = 0;
  std::deque<inflight> sends_, recvs_;
  std::size_t send_step_ = 0, recv_step_ = 0;
  std::size_t next_slot_ = 0;
};

// ---------------------------------------------------------------------------------------

inline executor::place executor::resolve(const region& r, const op_buffers& b,
                                         const aliasing& a) {
  place p;
  p.bytes = r.count * b.elem_size;
  const std::size_t off = r.offset * b.elem_size;
  switch (r.buffer) {
    case buffer_id::input:
      // The input is only read; const_cast lets one place type serve sends and copies.
      p.ptr = const_cast<std::byte*>(b.input) + off;
      p.canon = a.input_in_output ? 1 : 0;
      p.start = a.input_in_output ? off + a.offset : off;
      break;
    case buffer_id::output:
      p.ptr = b.output + off;
      p.canon = a.output_in_input ? 0 : 1;
      p.start = a.output_in_input ? off + a.offset : off;
      break;
    case buffer_id::scratch:
      p.ptr = scratch_.data() + off;
      p.canon = 2;
      p.start = off;
      break;
  }
  return p;
}

inline void executor::plan(const schedule& s, const op_buffers& b) {
  aliasing a;
  if (b.input_bytes > 0 && b.output_bytes > 0) {
    if (b.input >= b.output && b.input + b.input_bytes <= b.output + b.output_bytes) {
      a.input_in_output = true;
      a.offset = static_cast<std::size_t>(b.input - b.output);
    } else if (b.output >= b.input && b.output + b.output_bytes <= b.input + b.input_bytes) {
      a.output_in_input = true;
      a.offset = static_cast<std::size_t>(b.output - b.input);
    }
  }

  // Reset in place: the hazard lists keep their capacity, so a repeated small operation
  // allocates nothing here.
  if (steps_.size() < s.steps.size()) steps_.resize(s.steps.size());
  for (std::size_t i = 0; i < s.steps.size(); ++i) {
    const step& st = s.steps[i];
    step_state& ss = steps_[i];
    ss.send = ss.recv = ss.local = place{};
    ss.send_slices = ss.recv_slices = 0;
    ss.send_posted = ss.send_done = ss.recv_posted = ss.recv_done = 0;
    ss.send_after_writes.clear();
    ss.recv_after_sends.clear();
    ss.recv_after_writes.clear();
    if (st.send_peer >= 0) {
      ss.send = resolve(st.send_from, b, a);
      ss.send_slices = slices_of(ss.send.bytes, slice_);
    }
    if (st.action != recv_action::none) {
      ss.recv = resolve(st.recv_into, b, a);
      ss.recv_slices = st.action == recv_action::copy ? 1 : slices_of(ss.recv.bytes, slice_);
      if (st.action == recv_action::reduce || st.action == recv_action::copy) {
        ss.local = resolve(st.reduce_with, b, a);
      }
    }
    auto same_start = [&](const place& x, const place& c) {
      if (overlaps(x, c) && x.start != c.start) {
        throw error(errc::invalid_argument,
                    "schedule bug: step " + std::to_string(i) +
                        " touches a region that overlaps another without starting at the same "
                        "offset (see schedule.hpp)");
      }
      return overlaps(x, c);
    };
    for (std::size_t t = 0; t <= i; ++t) {
      const step_state& ts = steps_[t];
      const step& tt = s.steps[t];
      const auto tu = static_cast<std::uint32_t>(t);
      const bool t_writes = tt.action != recv_action::none;
      if (t < i && t_writes && st.send_peer >= 0 && same_start(ts.recv, ss.send)) {
        ss.send_after_writes.push_back(tu);
      }
      if (st.action != recv_action::none) {
        if (tt.send_peer >= 0 && same_start(ts.send, ss.recv)) ss.recv_after_sends.push_back(tu);
        // Earlier writes of what we overwrite or reduce with, and earlier steps that read
        // what we overwrite as their local operand: a step counts a slice written only after
        // it applied it, which is also after it read its local operand.
        if (t < i && t_writes &&
            (same_start(ts.recv, ss.recv) ||
             (ss.local.bytes > 0 && same_start(ts.recv, ss.local)) ||
             (ts.local.bytes > 0 && same_start(ts.local, ss.recv)))) {
          ss.recv_after_writes.push_back(tu);
        }
      }
    }
  }
}

inline bool executor::advance(const schedule& s, const detail::op_fingerprint& fp,
                              const op_buffers& b) {
  bool moved = false;

  // 1. Retire finished sends and receives in posting order; apply reductions as data lands.
  while (!sends_.empty() && sends_.front().x.done) {
    ++steps_[sends_.front().step].send_done;
    sends_.pop_front();
    moved = true;
  }
  while (!recvs_.empty() && recvs_.front().x.done) {
    inflight& f = recvs_.front();
    step_state& ss = steps_[f.step];
    const step& st = s.steps[f.step];
    const bool reducing = st.action == recv_action::reduce;
    if (reducing && !hazards_clear(ss, f.slice)) {
      if (f.x.lent) {
        // Lent memory must not wait on our hazards: the peer may need that room before it
        // can send what clears them. Take a copy into our own slot and give it back.
        std::byte* own = staging_.data() + f.slot * slice_;
        std::memcpy(own, f.x.data, f.x.length);
        transport_.release(st.recv_peer, &f.x);
        f.x.data = own;
        f.x.lent = false;
      }
      break;
    }
    if (reducing && f.x.length > 0) {
      const std::size_t off = f.slice * slice_;
      b.reduce(ss.recv.ptr + off, ss.local.ptr + off, f.x.data, f.x.length / b.elem_size);
    }
    if (f.x.lent) transport_.release(st.recv_peer, &f.x);
    ++ss.recv_done;
    recvs_.pop_front();
    moved = true;
  }

  // 2. Post sends in schedule order while the window has room and the data is ready.
  while (send_step_ < nsteps_ && sends_.size() < opts_.window) {
    step_state& ss = steps_[send_step_];
    const step& st = s.steps[send_step_];
    if (st.send_peer < 0 || ss.send_posted == ss.send_slices) {
      ++send_step_;
      continue;
    }
    const std::size_t k = ss.send_posted;
    bool ready = true;
    for (auto t : ss.send_after_writes) ready = ready && written_upto(t, k);
    if (!ready) break;
    inflight& f = sends_.emplace_back();
    const std::size_t len = slice_len(ss.send, k);
    f.step = static_cast<std::uint32_t>(send_step_);
    f.slice = k;
    f.x.data = ss.send.ptr + k * slice_;
    f.x.length = len;
    f.x.header = detail::make_header(fp, f.step, k, static_cast<std::uint32_t>(len));
    ++ss.send_posted;
    transport_.post_send(st.send_peer, &f.x);
    moved = true;
  }

  // 3. Post receives (and run local copies) in schedule order.
  while (recv_step_ < nsteps_ && recvs_.size() < opts_.window) {
    step_state& ss = steps_[recv_step_];
    const step& st = s.steps[recv_step_];
    if (st.action == recv_action::none || ss.recv_posted == ss.recv_slices) {
      ++recv_step_;
      continue;
    }
    if (st.action == recv_action::copy) {
      // A copy moves its whole region at once, so every hazard must be wholly done; earlier
      // receives may still write our source. (Cheap test first: this runs on every spin.)
      if (!recvs_.empty() || !hazards_clear(ss, whole_step)) break;
      if (ss.recv.bytes > 0 && ss.recv.ptr != ss.local.ptr) {
        std::memmove(ss.recv.ptr, ss.local.ptr, ss.recv.bytes);
      }
      ss.recv_posted = ss.recv_done = 1;
      moved = true;
      continue;
    }
    const std::size_t k = ss.recv_posted;
    // A storing receive writes its destination as bytes arrive, so its hazards must be clear
    // before it is posted. A reducing one lands in staging and checks them when it applies
    // (step 1): were it posted only after this step's own send of the slice went out, two
    // ranks exchanging slices larger than their socket buffers would wait on each other.
    if (st.action == recv_action::store && !hazards_clear(ss, k)) break;
    inflight& f = recvs_.emplace_back();
    const std::size_t len = slice_len(ss.recv, k);
    f.step = static_cast<std::uint32_t>(recv_step_);
    f.slice = k;
    f.x.length = len;
    if (st.action == recv_action::reduce) {
      f.slot = next_slot_++ % opts_.window;  // FIFO retirement frees slots in this order
      f.x.data = staging_.data() + f.slot * slice_;
      f.x.lendable = true;
    } else {
      f.x.data = ss.recv.ptr + k * slice_;
    }
    f.x.header = detail::make_header(fp, f.step, k, static_cast<std::uint32_t>(len));
    ++ss.recv_posted;
    transport_.post_recv(st.recv_peer, &f.x);
    moved = true;
  }
  return moved;
}

inline void executor::run(const schedule& s, const detail::op_fingerprint& fp,
                          const op_buffers& b, clock::time_point deadline,
                          std::chrono::milliseconds timeout) {
  // Cut the largest region into at least 4 slices so consecutive steps overlap, but keep
  // slices large enough (>= 64 KiB) that per-frame costs stay small.
  std::size_t largest = 0;
  for (const step& st : s.steps) {
    largest = std::max({largest, st.send_from.count, st.recv_into.count});
  }
  const std::size_t wanted =
      std::min({std::max<std::size_t>(largest * b.elem_size / 4, 64 * 1024), opts_.slice_bytes,
                transport_.max_slice_bytes()});
  slice_ = std::max<std::size_t>(1, wanted / b.elem_size) * b.elem_size;
  staging_.reserve(opts_.window * slice_);
  scratch_.reserve(s.scratch_count * b.elem_size);
  nsteps_ = s.steps.size();
  plan(s, b);
  sends_.clear();
  recvs_.clear();
  send_step_ = recv_step_ = 0;
  next_slot_ = 0;

  // Both cursors pass a step only once all its slices are posted (copies run on the spot),
  // and nothing posted is left in flight: then every step is done. O(1) per loop turn,
  // where scanning the steps would cost O(P) on every spin.
  auto finished = [&] {
    return sends_.empty() && recvs_.empty() && send_step_ == nsteps_ && recv_step_ == nsteps_;
  };
  try {
    // Reading the clock costs as much as a poll of shared memory on some VMs, so an idle
    // loop reads it only every 16 turns; the spin starts at the first read after a move.
    clock::time_point idle_since{};
    bool idle = false;
    unsigned idle_turns = 0;
    for (;;) {
      bool moved = advance(s, fp, b);
      if (finished()) return;
      moved = transport_.progress() || moved;
      if (moved) {
        idle = false;
        idle_turns = 0;
        continue;
      }
      if (++idle_turns % 16 != 0 && opts_.spin.count() > 0) continue;
      const auto now = clock::now();
      if (now >= deadline) fail_timeout(s, fp, timeout);
      if (!idle) {
        idle = true;
        idle_since = now;
      }
      // Spin briefly (a reply often lands within microseconds), then sleep in the kernel so
      // that ranks sharing a core with us can run.
      if (now - idle_since >= opts_.spin) transport_.wait(deadline);
    }
  } catch (const error& e) {
    // Transfers point into sends_/recvs_: drop them only after the transport forgot them,
    // which the communicator guarantees by never using a failed transport again.
    if (e.op()) throw;
    throw error(e.code(),
                std::string(e.what()).substr(8) + " (op " + std::to_string(fp.op_seq) + ", " +
                    std::string(to_string(fp.kind)) + ")",
                e.ranks(), fp.op_seq, std::string(to_string(fp.kind)));
  }
}

inline void executor::fail_timeout(const schedule& s, const detail::op_fingerprint& fp,
                                   std::chrono::milliseconds timeout) const {
  std::string what;
  std::vector<int> ranks;
  if (!recvs_.empty()) {
    const int peer = s.steps[recvs_.front().step].recv_peer;
    what = "recv from rank " + std::to_string(peer);
    ranks.push_back(peer);
  } else if (!sends_.empty()) {
    const int peer = s.steps[sends_.front().step].send_peer;
    what = "send to rank " + std::to_string(peer);
    ranks.push_back(peer);
  } else {
    what = "operation";
  }
  const double secs = static_cast<double>(timeout.count()) / 1000.0;
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", secs);
  throw error(errc::timeout,
              what + " (op " + std::to_string(fp.op_seq) + ", " + std::string(to_string(fp.kind)) +
                  ") timed out after " + buf + " s",
              ranks, fp.op_seq, std::string(to_string(fp.kind)));
}

}  // namespace chorus
