// SPDX-License-Identifier: Apache-2.0
// Counters every rank of a multi-rank test shares with the others and with the test itself.
#pragma once

#include <doctest/doctest.h>
#include <sys/mman.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <new>
#include <thread>

namespace chorus::test {

/// Counters in an anonymous shared mapping made before run_ranks forks, so every rank (and
/// the test) sees the same ones. std::atomic<int> is lock-free, hence address-free: it works
/// across processes.
class shared_counters {
 public:
  explicit shared_counters(std::size_t n) : n_(n) {
    static_assert(std::atomic<int>::is_always_lock_free);
    void* p = ::mmap(nullptr, bytes(), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    REQUIRE(p != MAP_FAILED);
    c_ = static_cast<std::atomic<int>*>(p);
    for (std::size_t i = 0; i < n_; ++i) new (&c_[i]) std::atomic<int>(0);
  }
  ~shared_counters() { ::munmap(c_, bytes()); }
  shared_counters(const shared_counters&) = delete;
  shared_counters& operator=(const shared_counters&) = delete;

  std::atomic<int>& operator[](std::size_t i) { return c_[i]; }

  /// Waits until counter `i` reaches `n`, at most 10 s (so a rank that never gets there
  /// cannot hang the test); sleeps between looks, for ranks that outnumber the cores.
  void wait_for(std::size_t i, int n) {
    for (int k = 0; k < 1000 && c_[i] < n; ++k) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }

 private:
  std::size_t bytes() const { return n_ * sizeof(std::atomic<int>); }
  std::size_t n_;
  std::atomic<int>* c_ = nullptr;
};

}  // namespace chorus::test
