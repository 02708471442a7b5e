// SPDX-License-Identifier: Apache-2.0
// A sub-group's view of the job's store: its own key prefix, its own ranks and rounds.
#pragma once

#include <algorithm>
#include <chorus/bootstrap/store.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <chorus/error.hpp>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace chorus::detail {

/// The turns the threads of one process take on the job's store connection (its contract 7:
/// one call at a time). A lock that is granted in the order it was asked for, so that a view
/// which gives the connection up between the slices of a long wait lets every thread queued
/// behind it have a turn before its next slice.
class store_turns {
 public:
  void lock() {
    std::unique_lock lk(m_);
    const std::uint64_t mine = next_++;
    turn_.wait(lk, [&] { return serving_ == mine; });
  }
  void unlock() {
    {
      std::lock_guard lk(m_);
      ++serving_;
    }
    turn_.notify_all();
  }
  /// Whether some thread waits for a turn now.
  bool queued() {
    std::lock_guard lk(m_);
    return next_ - serving_ > 1;
  }

 private:
  std::mutex m_;
  std::condition_variable turn_;
  std::uint64_t next_ = 0;     // the ticket the next lock() takes
  std::uint64_t serving_ = 0;  // the ticket whose turn it is
};

/// The store a communicator made by split() connects through. Keys go to the job's store
/// under `prefix`, which is unique to the sub-communicator (parent, split number, color), so
/// the transports' fixed key names ("chorus/tcp/addr", ...) never meet another group's.
/// Rounds (all_gather, barrier) run among the group's ranks only: rank r sets
/// "<prefix><key>#<round>/<r>" and waits for everyone's with one get_all, which names each
/// key's owner by its rank in the base store (`base_ranks`), so a member that left ends the
/// wait at once (errc::peer_failed) rather than at the deadline.
///
/// The job's store serves one call at a time (its contract 7), and a parent and the groups
/// split from it may set up on different threads, so every view of one base takes turns
/// (store_turns). A wait is cut into slices, the turn given up between them: two threads
/// splitting two communicators at once each wait for keys that the other thread's peers set
/// only when they get a turn.
class group_store final : public store {
 public:
  group_store(std::shared_ptr<store> base, std::shared_ptr<store_turns> lock, std::string prefix,
              int rank, std::vector<int> base_ranks)
      : base_(std::move(base)), lock_(std::move(lock)), prefix_(std::move(prefix)),
        rank_(rank), base_ranks_(std::move(base_ranks)) {}

  void set(std::string_view key, std::span<const std::byte> value) override {
    std::lock_guard lk(*lock_);
    in_group_ranks([&] { base_->set(prefix_ + std::string(key), value); });
  }
  std::vector<std::byte> get(std::string_view key) override {
    const std::string full[] = {prefix_ + std::string(key)};
    const int any[] = {-1};
    return std::move(in_turns(full, any).front());
  }
  std::vector<std::vector<std::byte>> get_all(std::span<const std::string> keys,
                                              std::span<const int> owners) override {
    std::vector<std::string> full;
    for (const auto& k : keys) full.push_back(prefix_ + k);
    std::vector<int> base_owners;
    for (int o : owners) {
      if (o < -1 || o >= size()) {
        throw error(errc::invalid_argument,
                    "store get_all: owner " + std::to_string(o) + " is not a rank of a split group of " +
                        std::to_string(size()) + " (or -1 for any)",
                    {}, std::nullopt, "get_all");
      }
      base_owners.push_back(o < 0 ? -1 : base_ranks_[static_cast<std::size_t>(o)]);
    }
    return in_turns(full, base_owners);
  }
  std::vector<int> departed() override {
    std::vector<int> base_gone;
    {
      std::lock_guard lk(*lock_);
      base_gone = in_group_ranks([&] { return base_->departed(); });
    }
    std::vector<int> gone;
    for (std::size_t r = 0; r < base_ranks_.size(); ++r) {
      if (std::binary_search(base_gone.begin(), base_gone.end(), base_ranks_[r])) {
        gone.push_back(static_cast<int>(r));
      }
    }
    return gone;
  }
  std::int64_t add(std::string_view key, std::int64_t delta) override {
    std::lock_guard lk(*lock_);
    return in_group_ranks([&] { return base_->add(prefix_ + std::string(key), delta); });
  }
  std::vector<std::vector<std::byte>> all_gather(std::string_view key,
                                                 std::span<const std::byte> mine) override {
    const std::string round = next_round(key);
    std::vector<std::string> keys;
    for (int r = 0; r < size(); ++r) keys.push_back(round + "/" + std::to_string(r));
    {
      std::lock_guard lk(*lock_);
      in_group_ranks([&] { base_->set(keys[static_cast<std::size_t>(rank_)], mine); });
    }
    return in_turns(keys, base_ranks_);
  }
  void barrier(std::string_view key) override { (void)all_gather(key, {}); }
  int rank() const noexcept override { return rank_; }
  int size() const noexcept override { return static_cast<int>(base_ranks_.size()); }
  const job_secret& secret() const noexcept override { return base_->secret(); }
  const std::array<std::byte, 16>& job_id() const noexcept override { return base_->job_id(); }

 private:
  /// get_all on the base (keys and owners in its terms), a slice per turn. Keys that arrive
  /// end a slice at once, so the waiting thread loses nothing by slicing; a thread that needs
  /// the connection meanwhile waits for the slice in progress. Slices start at 20 ms and double
  /// up to 200 ms while nobody else asks for a turn (a long wait for a slow rank then asks the
  /// server 5 times a second); once another thread has asked, they stay at 20 ms.
  std::vector<std::vector<std::byte>> in_turns(std::span<const std::string> keys,
                                               std::span<const int> owners) {
    constexpr auto shortest = std::chrono::milliseconds(20);
    constexpr auto longest = std::chrono::milliseconds(200);
    const auto begun = std::chrono::steady_clock::now();
    auto slice = shortest;
    bool shared = false;  // another thread asked for a turn during this wait
    for (;;) {
      std::lock_guard lk(*lock_);
      auto values = in_group_ranks([&] { return base_->get_all_slice(keys, owners, begun, slice); });
      if (values) return std::move(*values);
      shared = shared || lock_->queued();
      slice = shared ? shortest : std::min(2 * slice, longest);
    }
  }

  std::string next_round(std::string_view key) {
    const std::string k(key);
    return prefix_ + k + "#" + std::to_string(rounds_[k]++);
  }
  /// Runs a call on the base store. Its errors name job ranks, and are rethrown naming the
  /// group's, as the communicator over this view numbers them (error::ranks() is read as
  /// ranks of the communicator, e.g. to declare them failed): a member by its rank in the
  /// group, and a job rank outside it (rank 0, the store's host, when its connection is lost)
  /// only in the text.
  template <class Call>
  auto in_group_ranks(Call call) -> decltype(call()) {
    try {
      return call();
    } catch (const error& e) {
      if (e.ranks().empty()) throw;
      std::vector<int> mine, outside;
      for (int b : e.ranks()) {
        auto at = std::find(base_ranks_.begin(), base_ranks_.end(), b);
        if (at != base_ranks_.end()) {
          mine.push_back(static_cast<int>(at - base_ranks_.begin()));
        } else {
          outside.push_back(b);
        }
      }
      std::sort(mine.begin(), mine.end());  // members are ordered by split's key, not job rank
      std::string where = mine.empty() ? std::string() : "its " + store_ranks_text(mine);
      if (!outside.empty()) {
        where += (where.empty() ? "job " : "; job ") + store_ranks_text(outside) +
                 (outside.size() == 1 ? " is" : " are") + " not in it";
      }
      std::string message = e.message() + " (in a split group: " + where + ")";
      throw error(e.code(), std::move(message), std::move(mine), std::nullopt,
                  e.call().empty() ? "store" : e.call());
    }
  }

  std::shared_ptr<store> base_;
  std::shared_ptr<store_turns> lock_;
  std::string prefix_;
  int rank_;
  std::vector<int> base_ranks_;
  std::map<std::string, int> rounds_;
};

}  // namespace chorus::detail
