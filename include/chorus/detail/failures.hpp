// SPDX-License-Identifier: Apache-2.0
// What a rank knows of failed ranks: the job's failed set (filled by the heartbeat, by lost
// connections and by peers' reports) and each communicator's view of it (its watch).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "chorus/error.hpp"
#include "chorus/schedule/schedule.hpp"  // collective
#include "chorus/types.hpp"

namespace chorus::detail {

/// The job's failed ranks (job ranks) and why each is believed failed. Thread-safe: the
/// heartbeat thread writes it, executors read it. A rank never leaves the set.
class failure_set {
 public:
  /// Records `rank` as failed for `why`; true when it was not known before.
  bool add(int rank, std::string why) {
    std::lock_guard lk(m_);
    if (!why_.emplace(rank, std::move(why)).second) return false;
    any_.store(true, std::memory_order_release);
    return true;
  }
  /// Something failed: the executor's cheap test, a relaxed load.
  bool any() const noexcept { return any_.load(std::memory_order_acquire); }
  bool contains(int rank) const {
    std::lock_guard lk(m_);
    return why_.count(rank) != 0;
  }
  /// The failed ranks in order, with their reasons.
  std::map<int, std::string> snapshot() const {
    std::lock_guard lk(m_);
    return why_;
  }

 private:
  mutable std::mutex m_;
  std::map<int, std::string> why_;
  std::atomic<bool> any_{false};
};

/// One communicator's view of failures: the job's failed set, where it has one, mapped onto
/// this communicator's ranks, and abort() on this communicator.
class watch {
 public:
  /// Sets what this watch reads, before any operation runs: the job's failed set (null for a
  /// job of one rank) and the job rank of each of this communicator's ranks.
  void bind(std::shared_ptr<const failure_set> job, std::vector<int> job_rank) {
    job_ = std::move(job);
    job_rank_ = std::move(job_rank);
  }

  /// Whether anything could fail an operation now: one or two atomic loads.
  bool alarm() const noexcept {
    return aborted_.load(std::memory_order_acquire) || (job_ && job_->any());
  }

  /// abort(): the first reason wins; later calls change nothing. True for the first call.
  bool abort(const std::string& why) {
    std::lock_guard lk(m_);
    if (aborted_.load(std::memory_order_relaxed)) return false;
    abort_why_ = why;
    aborted_.store(true, std::memory_order_release);
    return true;
  }
  bool aborted() const noexcept { return aborted_.load(std::memory_order_acquire); }
  /// The reason the first abort() gave (empty before one).
  std::string abort_reason() const {
    std::lock_guard lk(m_);
    return abort_why_;
  }

  /// This communicator's failed ranks (its own numbering) with their reasons.
  std::map<int, std::string> failed() const {
    std::map<int, std::string> out;
    if (!job_ || !job_->any()) return out;
    const auto all = job_->snapshot();
    for (std::size_t r = 0; r < job_rank_.size(); ++r) {
      if (auto it = all.find(job_rank_[r]); it != all.end()) out.emplace(static_cast<int>(r), it->second);
    }
    return out;
  }

  /// The error operation `op` (`kind`) fails with, if this communicator was aborted or one
  /// of its ranks failed: errc::aborted, or errc::peer_failed naming the failed ranks.
  std::optional<error> verdict(std::uint64_t op, collective kind) const {
    const std::string where = " (op " + std::to_string(op) + ", " + std::string(to_string(kind)) + ")";
    if (aborted()) {
      std::lock_guard lk(m_);
      return error(errc::aborted, "communicator aborted: " + abort_why_ + where, {}, op,
                   std::string(to_string(kind)));
    }
    const auto f = failed();
    if (f.empty()) return std::nullopt;
    return error(errc::peer_failed, describe(f) + where, ranks_of(f), op, std::string(to_string(kind)));
  }

  /// "rank 3 failed: no heartbeat for 1.2 s (timeout 1 s)"; several joined by "; ".
  static std::string describe(const std::map<int, std::string>& f) {
    std::string s;
    for (const auto& [r, why] : f) {
      s += (s.empty() ? "" : "; ") + std::string("rank ") + std::to_string(r) + " failed: " + why;
    }
    return s;
  }
  static std::vector<int> ranks_of(const std::map<int, std::string>& f) {
    std::vector<int> out;
    for (const auto& entry : f) out.push_back(entry.first);
    return out;
  }

  /// The job rank of this communicator's rank `r`.
  int job_rank(int r) const {
    return r >= 0 && static_cast<std::size_t>(r) < job_rank_.size() ? job_rank_[static_cast<std::size_t>(r)] : r;
  }
  const std::vector<int>& job_ranks() const noexcept { return job_rank_; }

 private:
  std::shared_ptr<const failure_set> job_;
  std::vector<int> job_rank_;
  std::atomic<bool> aborted_{false};
  mutable std::mutex m_;
  std::string abort_why_;
};

}  // namespace chorus::detail
