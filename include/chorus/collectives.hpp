// SPDX-License-Identifier: Apache-2.0
// Options of each collective, and the request an asynchronous call returns.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string_view>

#include "chorus/schedule/schedule.hpp"
#include "chorus/types.hpp"

namespace chorus {

/// Parses an algorithm name as CHORUS_ALGO and the perf binaries spell it:
/// "auto", "ring", "rd" or "recursive_doubling". Returns nothing for anything else.
constexpr std::optional<algo> parse_algo(std::string_view s) noexcept {
  if (s == "auto" || s == "automatic") return algo::automatic;
  if (s == "ring") return algo::ring;
  if (s == "rd" || s == "recursive_doubling") return algo::recursive_doubling;
  if (s == "hier" || s == "hierarchical") return algo::hierarchical;
  return std::nullopt;
}

/// **Example**: `comm.all_reduce(grads, {.op = chorus::avg, .algorithm = chorus::algo::ring});`
struct all_reduce_options {
  reduce_op op = sum;                   ///< avg only for floating types
  algo algorithm = algo::automatic;     ///< automatic: the tuner picks (CHORUS_ALGO overrides)
};

struct reduce_scatter_options {
  reduce_op op = sum;                ///< avg only for floating types
  algo algorithm = algo::automatic;  ///< ring or automatic
};

struct all_gather_options {
  algo algorithm = algo::automatic;  ///< ring or automatic
};

namespace detail {

/// Shared between a request and the progress engine.
struct op_state {
  std::mutex m;
  std::condition_variable cv;
  bool finished = false;
  std::exception_ptr failure;

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
  void wait() {
    if (!s_) return;
    std::unique_lock lk(s_->m);
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

}  // namespace chorus
