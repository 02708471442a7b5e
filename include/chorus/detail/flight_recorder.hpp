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

#if defined(__x86_64__)
#include <x86intrin.h>
#endif

#include "chorus/detail/op_desc.hpp"
#include "chorus/schedule/schedule.hpp"
#include "chorus/types.hpp"

namespace chorus::detail {

/// The recorder's clock. Every operation is stamped up to three times, so the stamp is read
/// raw: on x86-64 the time-stamp counter (~7 ns here, where clock_gettime takes ~16 ns and
/// three of them were a fifth of an 8-byte all_reduce on shared memory), elsewhere
/// steady_clock. Ticks become system-clock microseconds only when a record is written, along
/// the line through two (ticks, system time) pairs: one taken when the recorder was made,
/// one at that moment.
struct flight_clock {
  static std::uint64_t ticks() noexcept {
#if defined(__x86_64__)
    return __rdtsc();
#else
    return static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
#endif
  }
  static std::int64_t system_us() noexcept {
    return std::chrono::duration_cast<std::chrono::microseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  }
  struct pair {
    std::uint64_t ticks;
    std::int64_t us;
  };
  static pair now() noexcept { return {ticks(), system_us()}; }
  /// `t` (ticks, 0: never) in system microseconds, from the pairs `a` (earlier) and `b`.
  static std::int64_t to_us(std::uint64_t t, pair a, pair b) noexcept {
    if (t == 0) return 0;
    if (b.ticks <= a.ticks || b.us <= a.us) return a.us;  // no measurable time between them
    const double us_per_tick = static_cast<double>(b.us - a.us) / static_cast<double>(b.ticks - a.ticks);
    return a.us + static_cast<std::int64_t>((static_cast<double>(t) - static_cast<double>(a.ticks)) * us_per_tick);
  }
};

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
  explicit flight_recorder(std::size_t capacity)
      : ring_(std::max<std::size_t>(capacity, 1)), origin_(flight_clock::now()) {}

  /// Records `d` (each member of a group) as queued, or as running where it starts at once
  /// (a blocking call run on its caller's thread); returns its first ticket.
  std::uint64_t queued(const op_desc& d, bool running = false) {
    const std::uint64_t now = flight_clock::ticks();
    const state st = running ? state::running : state::queued;
    std::lock_guard lk(m_);
    const std::uint64_t first = next_;
    if (d.is_group) {
      for (const op_desc& m : d.members) add(m, st, now);
    } else {
      add(d, st, now);
    }
    return first;
  }
  /// The operations recorded from `first` until the next `n` tickets change state.
  void started(std::uint64_t first, std::size_t n) { mark(first, n, state::running, nullptr); }
  void ended(std::uint64_t first, std::size_t n, const std::string& error) {
    mark(first, n, error.empty() ? state::done : state::failed, error.empty() ? nullptr : &error);
  }

  std::string json(int rank, int size, const std::string& communicator, const std::string& reason) const {
    const flight_clock::pair now = flight_clock::now();
    auto us = [&](std::uint64_t t) { return std::to_string(flight_clock::to_us(t, origin_, now)); };
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
           ", \"queued_us\": " + us(e.queued) + ", \"started_us\": " + us(e.started) +
           ", \"ended_us\": " + us(e.ended) + ", \"error\": " + quote(e.error) + "}";
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
    std::uint64_t queued = 0, started = 0, ended = 0;  // flight_clock ticks; 0: not yet
    std::string error;
  };

  void add(const op_desc& d, state st, std::uint64_t now) {  // m_ held
    entry& e = ring_[next_++ % ring_.size()];
    e.seq = d.seq;
    e.kind = d.kind;
    e.type = d.type;
    e.count = d.count;
    e.op = d.op;
    e.algorithm = d.algorithm;
    e.root = d.root;
    e.sending = d.sending;
    e.tag = d.tag;
    e.st = st;
    e.queued = now;
    e.started = st == state::running ? now : 0;
    e.ended = 0;
    e.error.clear();  // keeps its buffer: no allocation per operation
  }

  void mark(std::uint64_t first, std::size_t n, state st, const std::string* error) {
    const std::uint64_t now = flight_clock::ticks();
    std::lock_guard lk(m_);
    for (std::uint64_t t = first; t < first + n && t < next_; ++t) {
      if (next_ - t > ring_.size()) continue;  // overwritten since
      entry& e = ring_[t % ring_.size()];
      e.st = st;
      (st == state::running ? e.started : e.ended) = now;
      if (error != nullptr) e.error = *error;
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
  flight_clock::pair origin_;
};

}  // namespace chorus::detail
