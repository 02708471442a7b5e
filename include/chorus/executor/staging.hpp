// SPDX-License-Identifier: Apache-2.0
// Staging memory: allocated once per communicator, grown rarely, backed by huge pages.
#pragma once

#include <sys/mman.h>

#include <cstddef>
#include <cstring>
#include <new>
#include <utility>

namespace chorus::detail {

/// A grow-only buffer. A fresh page costs ~12 µs to touch here and a 64 MiB allocation
/// ~200 ms, so staging is mapped once, pre-faulted, advised onto 2 MiB pages (32x cheaper
/// faults), and reused by every later operation; it only grows when an operation needs more.
class staging_buffer {
 public:
  staging_buffer() = default;
  /// A buffer of the pages a plain allocation gets here (4 KiB unless the system backs all
  /// memory with huge pages), pre-faulted by the kernel: what callers' buffers are made of,
  /// for measuring what moving their bytes costs (the probe).
  static staging_buffer plain() {
    staging_buffer b;
    b.huge_ = false;
    return b;
  }
  staging_buffer(staging_buffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)), huge_(o.huge_) {}
  staging_buffer& operator=(staging_buffer&& o) noexcept {
    if (this != &o) {
      release();
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
      huge_ = o.huge_;
    }
    return *this;
  }
  staging_buffer(const staging_buffer&) = delete;
  staging_buffer& operator=(const staging_buffer&) = delete;
  ~staging_buffer() { release(); }

  std::byte* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }

  /// Ensures at least `bytes` are available. Throws std::bad_alloc when the kernel refuses.
  void reserve(std::size_t bytes) {
    if (bytes <= size_) return;
    constexpr std::size_t huge = std::size_t{2} << 20;
    const std::size_t want = (bytes + huge - 1) / huge * huge;
    void* p = ::mmap(nullptr, want, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | (huge_ ? 0 : MAP_POPULATE), -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    if (huge_) {
      ::madvise(p, want, MADV_HUGEPAGE);  // advice only: fine if the kernel declines
      std::memset(p, 0, want);            // fault it in now, not in the middle of an operation
    }
    release();
    data_ = static_cast<std::byte*>(p);
    size_ = want;
  }

 private:
  void release() noexcept {
    if (data_ != nullptr) ::munmap(data_, size_);
    data_ = nullptr;
    size_ = 0;
  }

  std::byte* data_ = nullptr;
  std::size_t size_ = 0;
  bool huge_ = true;
};

}  // namespace chorus::detail
