// SPDX-License-Identifier: Apache-2.0
// Options of each collective, and the request an asynchronous call returns.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "chorus/schedule/build.hpp"
#include "chorus/schedule/schedule.hpp"
#include "chorus/types.hpp"

namespace chorus {

/// Parses an algorithm name as CHORUS_ALGO and the perf binaries spell it: "auto", "ring",
/// "rd" or "recursive_doubling", "hier" or "hierarchical", "tree", "hd" or "halving_doubling"
/// (Rabenseifner), "bruck", "chain", "binomial", "direct", "dissemination". Returns nothing for
/// anything else.
constexpr std::optional<algo> parse_algo(std::string_view s) noexcept {
  if (s == "auto" || s == "automatic") return algo::automatic;
  if (s == "ring") return algo::ring;
  if (s == "rd" || s == "recursive_doubling") return algo::recursive_doubling;
  if (s == "hier" || s == "hierarchical") return algo::hierarchical;
  if (s == "tree") return algo::tree;
  if (s == "hd" || s == "halving_doubling" || s == "rabenseifner") return algo::halving_doubling;
  if (s == "bruck") return algo::bruck;
  if (s == "chain") return algo::chain;
  if (s == "binomial") return algo::binomial;
  if (s == "direct" || s == "pairwise") return algo::direct;
  if (s == "dissemination") return algo::dissemination;
  return std::nullopt;
}

/// Parses a collective's name: "all_reduce" or "allreduce", "reduce_scatter" or
/// "reducescatter", "all_gather" or "allgather", "broadcast" or "bcast", "reduce",
/// "all_to_all" or "alltoall", "all_to_allv" or "alltoallv", "gather", "scatter", "barrier",
/// "send_recv" or "sendrecv".
constexpr std::optional<collective> parse_collective(std::string_view s) noexcept {
  for (int i = 0; i < collective_count; ++i) {
    const auto c = static_cast<collective>(i);
    const std::string_view name = to_string(c);
    if (s == name) return c;
    // The same name without underscores (NCCL's and Gloo's spelling).
    std::size_t j = 0;
    bool same = true;
    for (char ch : name) {
      if (ch == '_') continue;
      if (j >= s.size() || s[j++] != ch) {
        same = false;
        break;
      }
    }
    if (same && j == s.size()) return c;
  }
  if (s == "bcast") return collective::broadcast;
  return std::nullopt;
}

/// The algorithm each collective uses where a call leaves it automatic; automatic entries
/// leave the choice to the tuner.
using algo_table = std::array<algo, collective_count>;

/// Parses CHORUS_ALGO: one algorithm name for every collective that has it (the others stay
/// automatic), e.g. "ring", or a list of collective:algorithm pairs separated by ';' or ',',
/// e.g. "allreduce:tree;allgather:bruck;broadcast:chain". Throws errc::invalid_argument
/// naming the part that is not a collective, not an algorithm, or an algorithm the
/// collective does not have.
algo_table parse_algo_table(std::string_view spec);

/// **Example**: `comm.all_reduce(grads, {.op = chorus::avg, .algorithm = chorus::algo::ring});`
struct all_reduce_options {
  reduce_op op = sum;                   ///< avg only for floating types
  algo algorithm = algo::automatic;     ///< ring, recursive_doubling, tree, halving_doubling, hierarchical; automatic: the tuner picks (CHORUS_ALGO overrides)
};

struct reduce_scatter_options {
  reduce_op op = sum;                ///< avg only for floating types
  algo algorithm = algo::automatic;  ///< ring, halving_doubling, hierarchical or automatic
};

struct all_gather_options {
  algo algorithm = algo::automatic;  ///< ring, recursive_doubling, bruck, hierarchical or automatic
};

struct broadcast_options {
  algo algorithm = algo::automatic;  ///< chain (large), binomial (small) or automatic
};

struct reduce_options {
  reduce_op op = sum;                ///< avg only for floating types
  algo algorithm = algo::automatic;  ///< chain (large), binomial (small) or automatic
};

struct all_to_all_options {
  algo algorithm = algo::automatic;  ///< direct or automatic
};

struct gather_options {
  algo algorithm = algo::automatic;  ///< direct, binomial or automatic
};

struct scatter_options {
  algo algorithm = algo::automatic;  ///< direct, binomial or automatic
};

/// Point-to-point messages between one pair of ranks match in the order each side issues
/// them; the tag must agree too (a different tag is errc::mismatch naming both).
struct p2p_options {
  int tag = 0;  ///< in [0, 2^31)
  /// Sends only: where the transport can (shared memory, CHORUS_SHM_SINGLE_COPY), the
  /// receiver reads a message of 64 KiB or more straight out of this buffer, one copy instead
  /// of two, and the send completes only once it has (as MPI_Ssend). Off by default, so that
  /// a send completes as soon as its bytes are in the transport's buffers.
  bool single_copy = false;
};

namespace detail {

struct op_state;

/// A communicator's queue of operations, as a waiting request sees it.
struct op_runner {
  /// Runs the queue's next operation on the calling thread, if the worker has not taken it
  /// and nothing runs; returns whether it ran one. `waiting` holds the lock of an operation
  /// of this queue that has not finished (which keeps the communicator alive: it drains its
  /// queue before it goes); it is let go while the operation runs and held again after.
  virtual bool run_next(std::unique_lock<std::mutex>& waiting) = 0;

 protected:
  ~op_runner() = default;
};

/// Shared between a request and the progress engine.
struct op_state {
  std::mutex m;
  std::condition_variable cv;
  bool finished = false;
  std::exception_ptr failure;
  /// The queue it waits in, once queued (set before it is, never changed after).
  std::atomic<op_runner*> runner{nullptr};

  void finish(std::exception_ptr e) {
    {
      std::lock_guard lk(m);
      finished = true;
      failure = std::move(e);
    }
    cv.notify_all();
  }
};

}  // namespace detail

/// The handle of an asynchronous collective. Operations complete in the order they were
/// issued; the buffers must stay valid and untouched until the request completes.
///
/// **Example**:
///   auto r = comm.all_reduce_async(std::span(bucket));  // starts now, in the background
///   compute_next_layer();                              // overlaps with the reduction
///   r.wait();                                          // throws chorus::error on failure
class request {
 public:
  request() = default;
  explicit request(std::shared_ptr<detail::op_state> s) : s_(std::move(s)) {}

  /// Blocks until the operation completes; rethrows its chorus::error. Each operation's
  /// deadline (communicator_options::timeout) starts when the progress engine starts it, so
  /// waiting on the k-th queued operation is bounded by about k timeouts.
  ///
  /// While the progress engine has not taken it or what is queued before it, the waiting
  /// thread runs them itself: handing an operation to the engine's thread and its end back
  /// cost 6-8 µs here, where a grouped send and receive of 8 B between two shared memory
  /// ranks then takes 0.7-1.2. The worker, woken at once, still wins that race at times.
  ///
  /// An operation issued inside group_start() ... group_end() is queued by group_end(): waited
  /// for before that, it would never complete, so wait() throws errc::invalid_argument.
  void wait() {
    if (!s_) return;
    std::unique_lock lk(s_->m);
    if (!s_->finished && s_->runner.load(std::memory_order_acquire) == nullptr) {
      throw error(errc::invalid_argument,
                  "wait() on an operation of a group that has not ended: call group_end() first", {},
                  std::nullopt, "wait");
    }
    for (detail::op_runner* q = nullptr; !s_->finished && (q = s_->runner.load(std::memory_order_acquire)) != nullptr;) {
      if (!q->run_next(lk)) break;
    }
    s_->cv.wait(lk, [&] { return s_->finished; });
    if (s_->failure) std::rethrow_exception(s_->failure);
  }

  /// Waits until `deadline`; returns false if the operation is still running then (it goes
  /// on), true once it completed (rethrowing its error, if any).
  bool wait(std::chrono::steady_clock::time_point deadline) {
    if (!s_) return true;
    std::unique_lock lk(s_->m);
    if (!s_->cv.wait_until(lk, deadline, [&] { return s_->finished; })) return false;
    if (s_->failure) std::rethrow_exception(s_->failure);
    return true;
  }

  /// Non-blocking: true once the operation completed (rethrowing its error, if any).
  bool test() { return wait(std::chrono::steady_clock::time_point::min()); }

 private:
  std::shared_ptr<detail::op_state> s_;
};

inline algo_table parse_algo_table(std::string_view spec) {
  algo_table t{};
  auto bad = [&](const std::string& why) {
    return error(errc::invalid_argument, "CHORUS_ALGO='" + std::string(spec) + "': " + why);
  };
  if (spec.find(':') == std::string_view::npos) {
    const auto a = parse_algo(spec);
    if (!a) {
      throw bad("not an algorithm (use auto, ring, rd, hierarchical, tree, hd, bruck, chain, "
                "binomial, direct or dissemination, or a list such as allreduce:tree;allgather:ring)");
    }
    for (int i = 0; i < collective_count; ++i) {
      const auto c = static_cast<collective>(i);
      if (implements(c, *a)) t[static_cast<std::size_t>(i)] = *a;
    }
    return t;
  }
  // A collective named twice is refused: which of its algorithms was meant is not ours to guess.
  std::array<bool, collective_count> named{};
  std::size_t at = 0;
  while (at <= spec.size()) {
    std::size_t end = spec.find_first_of(";,", at);
    if (end == std::string_view::npos) end = spec.size();
    const std::string_view part = spec.substr(at, end - at);
    at = end + 1;
    if (part.empty()) continue;
    const std::size_t colon = part.find(':');
    if (colon == std::string_view::npos) throw bad("'" + std::string(part) + "' is not collective:algorithm");
    const auto c = parse_collective(part.substr(0, colon));
    if (!c) throw bad("'" + std::string(part.substr(0, colon)) + "' is not a collective");
    const auto a = parse_algo(part.substr(colon + 1));
    if (!a) throw bad("'" + std::string(part.substr(colon + 1)) + "' is not an algorithm");
    if (*a != algo::automatic && !implements(*c, *a)) {
      throw bad(std::string(to_string(*c)) + " has no " + std::string(to_string(*a)) + " algorithm");
    }
    if (named[static_cast<std::size_t>(*c)]) throw bad(std::string(to_string(*c)) + " is named twice");
    named[static_cast<std::size_t>(*c)] = true;
    t[static_cast<std::size_t>(*c)] = *a;
  }
  return t;
}

}  // namespace chorus
