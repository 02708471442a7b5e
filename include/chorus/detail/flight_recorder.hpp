// SPDX-License-Identifier: Apache-2.0
// The flight recorder: a communicator's last operations, with their state and times, for
// finding after a failure which call the ranks disagreed on and who never reached it.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>
#include <vector>

#include "chorus/detail/op_desc.hpp"
#include "chorus/schedule/schedule.hpp"
#include "chorus/types.hpp"

namespace chorus::detail {

/// The last `capacity` operations of one communicator, oldest overwritten first. Thread-safe:
/// callers record from their threads, the progress engine from its own.
///
/// json() writes one object: {"rank", "size", "communicator", "reason", "ops": [...]}, each
/// op {"seq", "kind", "dtype", "count", "op", "root", "algorithm", "peer", "tag", "state",
/// "queued_us", "started_us", "ended_us", "error"}; seq is the communicator's operation number
/// for collectives and the pair's for send/recv ("kind": "send_recv", "peer" set); times are
/// microseconds of the system clock (0: not yet); state is queued, running, done or failed.
/// tools/chorus-flight merges the dumps of all ranks.
class flight_recorder {
 public:
  explicit flight_recorder(std::size_t capacity) : ring_(std::max<std::size_t>(capacity, 1)) {}

  /// Records `d` (each member of a group) as queued; returns its first ticket.
  std::uint64_t queued(const op_desc& d) {
    std::lock_guard lk(m_);
    const std::uint64_t first = next_;
    if (d.is_group) {
      for (const op_desc& m : d.members) add(m);
    } else {
      add(d);
    }
    return first;
  }
  /// The operations recorded from `first` until the next `n` tickets change state.
  void started(std::uint64_t first, std::size_t n) { mark(first, n, state::running, {}); }
  void ended(std::uint64_t first, std::size_t n, const std::string& error) {
    mark(first, n, error.empty() ? state::done : state::failed, error);
  }

  std::string json(int rank, int size, const std::string& communicator, const std::string& reason) const {
    std::lock_guard lk(m_);
    std::string s = "{\"rank\": " + std::to_string(rank) + ", \"size\": " + std::to_string(size) +
                    ", \"communicator\": " + quote(communicator) + ", \"reason\": " + quote(reason) +
                    ", \"ops\": [";
    const std::uint64_t begin = next_ > ring_.size() ? next_ - ring_.size() : 0;
    for (std::uint64_t t = begin; t < next_; ++t) {
      const entry& e = ring_[t % ring_.size()];
      const bool p2p = e.kind == collective::send_recv;
      s += std::string(t == begin ? "\n" : ",\n") + "  {\"seq\": " + std::to_string(e.seq) +
           ", \"kind\": " + quote(std::string(to_string(e.kind))) +
           ", \"dtype\": " + quote(std::string(to_string(e.type))) +
           ", \"count\": " + std::to_string(e.count) +
           ", \"op\": " + quote(reduces(e.kind) ? std::string(to_string(e.op)) : "") +
           ", \"root\": " + std::to_string(rooted(e.kind) ? e.root : -1) +
           ", \"algorithm\": " + quote(std::string(to_string(e.algorithm))) +
           ", \"peer\": " + std::to_string(p2p ? e.root : -1) +
           ", \"sending\": " + (p2p && e.sending ? "true" : "false") +
           ", \"tag\": " + std::to_string(e.tag) +
           ", \"state\": " + quote(names[static_cast<int>(e.st)]) +
           ", \"queued_us\": " + std::to_string(e.queued_us) +
           ", \"started_us\": " + std::to_string(e.started_us) +
           ", \"ended_us\": " + std::to_string(e.ended_us) + ", \"error\": " + quote(e.error) + "}";
    }
    return s + "\n]}\n";
  }

 private:
  enum class state : std::uint8_t { queued, running, done, failed };
  static constexpr const char* names[] = {"queued", "running", "done", "failed"};
  struct entry {
    std::uint64_t seq = 0;
    collective kind = collective::all_reduce;
    dtype type = dtype::float32;
    std::size_t count = 0;
    reduce_op op = reduce_op::sum;
    algo algorithm = algo::automatic;
    int root = -1;
    bool sending = false;
    int tag = 0;
    state st = state::queued;
    std::int64_t queued_us = 0, started_us = 0, ended_us = 0;
    std::string error;
  };

  static std::int64_t now_us() {
    return std::chrono::duration_cast<std::chrono::microseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  }

  void add(const op_desc& d) {  // m_ held
    entry& e = ring_[next_++ % ring_.size()];
    e = entry{d.seq, d.kind, d.type, d.count, d.op, d.algorithm, d.root, d.sending, d.tag,
              state::queued, now_us(), 0, 0, {}};
  }

  void mark(std::uint64_t first, std::size_t n, state st, const std::string& error) {
    std::lock_guard lk(m_);
    const std::int64_t now = now_us();
    for (std::uint64_t t = first; t < first + n && t < next_; ++t) {
      if (next_ - t > ring_.size()) continue;  // overwritten since
      entry& e = ring_[t % ring_.size()];
      e.st = st;
      (st == state::running ? e.started_us : e.ended_us) = now;
      if (!error.empty()) e.error = error;
    }
  }

  static std::string quote(const std::string& in) {
    std::string out = "\"";
    for (const char ch : in) {
      const auto c = static_cast<unsigned char>(ch);
      if (c == '"' || c == '\\') {
        out += '\\';
        out += static_cast<char>(c);
      } else if (c < 0x20) {
        char buf[8];
        std::snprintf(buf, sizeof buf, "\\u%04x", c);
        out += buf;
      } else {
        out += static_cast<char>(c);
      }
    }
    return out + "\"";
  }

  mutable std::mutex m_;
  std::vector<entry> ring_;
  std::uint64_t next_ = 0;
};

}  // namespace chorus::detail
