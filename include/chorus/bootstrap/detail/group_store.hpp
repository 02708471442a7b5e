// SPDX-License-Identifier: Apache-2.0
// A sub-group's view of the job's store: its own key prefix, its own ranks and rounds.
#pragma once

#include <chorus/bootstrap/store.hpp>
#include <chorus/error.hpp>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace chorus::detail {

/// The store a communicator made by split() connects through. Keys go to the job's store
/// under `prefix`, which is unique to the sub-communicator (parent, split number, color), so
/// the transports' fixed key names ("chorus/tcp/addr", ...) never meet another group's.
/// Rounds (all_gather, barrier) run among the group's ranks only, built from set and get:
/// rank r sets "<prefix><key>#<round>/<r>" and gets everyone's.
///
/// The job's store serves one call at a time (its contract 7), and a parent and the groups
/// split from it may set up on different threads, so every view of one base shares a mutex.
class group_store final : public store {
 public:
  group_store(std::shared_ptr<store> base, std::shared_ptr<std::mutex> lock, std::string prefix,
              int rank, int size)
      : base_(std::move(base)), lock_(std::move(lock)), prefix_(std::move(prefix)),
        rank_(rank), size_(size) {}

  void set(std::string_view key, std::span<const std::byte> value) override {
    std::lock_guard lk(*lock_);
    base_->set(prefix_ + std::string(key), value);
  }
  std::vector<std::byte> get(std::string_view key) override {
    std::lock_guard lk(*lock_);
    return base_->get(prefix_ + std::string(key));
  }
  std::int64_t add(std::string_view key, std::int64_t delta) override {
    std::lock_guard lk(*lock_);
    return base_->add(prefix_ + std::string(key), delta);
  }
  std::vector<std::vector<std::byte>> all_gather(std::string_view key,
                                                 std::span<const std::byte> mine) override {
    const std::string round = next_round(key);
    std::lock_guard lk(*lock_);
    base_->set(round + "/" + std::to_string(rank_), mine);
    std::vector<std::vector<std::byte>> all(static_cast<std::size_t>(size_));
    for (int r = 0; r < size_; ++r) all[static_cast<std::size_t>(r)] = fetch(round, r);
    return all;
  }
  void barrier(std::string_view key) override {
    const std::string round = next_round(key);
    std::lock_guard lk(*lock_);
    // The last rank to arrive says so; everyone waits for that.
    if (base_->add(round, 1) == size_) base_->set(round + "/done", {});
    try {
      base_->get(round + "/done");
    } catch (const error& e) {
      if (e.code() != errc::timeout) throw;
      const std::int64_t arrived = base_->add(round, 0);
      throw error(errc::timeout, "barrier of a split group (" + std::to_string(arrived) + " of " +
                                     std::to_string(size_) + " ranks arrived): " +
                                     std::string(e.what()).substr(8),
                  {}, std::nullopt, "barrier");
    }
  }
  int rank() const noexcept override { return rank_; }
  int size() const noexcept override { return size_; }
  const job_secret& secret() const noexcept override { return base_->secret(); }
  const std::array<std::byte, 16>& job_id() const noexcept override { return base_->job_id(); }

 private:
  std::string next_round(std::string_view key) {
    const std::string k(key);
    return prefix_ + k + "#" + std::to_string(rounds_[k]++);
  }
  /// Rank r's part of a round, naming r when it never arrives.
  std::vector<std::byte> fetch(const std::string& round, int r) {
    try {
      return base_->get(round + "/" + std::to_string(r));
    } catch (const error& e) {
      if (e.code() != errc::timeout) throw;
      throw error(errc::timeout, "rank " + std::to_string(r) + " of a split group never arrived: " +
                                     std::string(e.what()).substr(8),
                  {r}, std::nullopt, "all_gather");
    }
  }

  std::shared_ptr<store> base_;
  std::shared_ptr<std::mutex> lock_;
  std::string prefix_;
  int rank_;
  int size_;
  std::map<std::string, int> rounds_;
};

}  // namespace chorus::detail
