// SPDX-License-Identifier: Apache-2.0
// memcpy's bandwidth on this machine, for bench/compare's shared-memory rows: one process
// copies a buffer of --bytes into another, --iters times after --warmup, both touched first.
//
// Usage: memcpy_bw [--bytes 64M] [--iters I] [--warmup W]
// Prints "RESULT impl=memcpy size=BYTES iters=I mean_us=... gbps=..." (bytes copied per second).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "measure.hpp"

int main(int argc, char** argv) {
  std::size_t bytes = 64 << 20;
  int iters = 20, warmup = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string arg = argv[i];
    if (arg == "--bytes") bytes = compare::parse_size(argv[i + 1]);
    else if (arg == "--iters") iters = std::atoi(argv[i + 1]);
    else if (arg == "--warmup") warmup = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: memcpy_bw [--bytes 64M] [--iters I] [--warmup W]\n");
      return 2;
    }
  }
  std::vector<char> src(bytes, 1), dst(bytes, 2);
  for (int i = 0; i < warmup; ++i) std::memcpy(dst.data(), src.data(), bytes);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) {
    std::memcpy(dst.data(), src.data(), bytes);
    asm volatile("" : : "r"(dst.data()) : "memory");  // the copy must happen every time
  }
  const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / iters;
  std::printf("RESULT impl=memcpy size=%zu iters=%d mean_us=%.3f gbps=%.3f\n", bytes, iters, us,
              static_cast<double>(bytes) / us / 1e3);
  return dst[bytes / 2] == 1 ? 0 : 1;
}
