// SPDX-License-Identifier: Apache-2.0
// Shared by the peer drivers in bench/compare: size parsing, per-operation timing and the one
// result line that bench/compare/run parses, in nccl-tests units.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <string>
#include <string_view>
#include <vector>

namespace compare {

// "64M", "8", "4K", "1G" -> bytes (powers of 1024, as nccl-tests reads them).
inline std::size_t parse_size(std::string_view text) {
  std::size_t multiplier = 1;
  if (!text.empty()) {
    switch (text.back()) {
      case 'K': case 'k': multiplier = std::size_t{1} << 10; break;
      case 'M': case 'm': multiplier = std::size_t{1} << 20; break;
      case 'G': case 'g': multiplier = std::size_t{1} << 30; break;
      default: break;
    }
    if (multiplier != 1) text.remove_suffix(1);
  }
  return static_cast<std::size_t>(std::strtoull(std::string(text).c_str(), nullptr, 10)) *
         multiplier;
}

// Sizes given as "64M,8": each a bytes count.
inline std::vector<std::size_t> parse_sizes(std::string_view list) {
  std::vector<std::size_t> sizes;
  while (!list.empty()) {
    auto comma = list.find(',');
    sizes.push_back(parse_size(list.substr(0, comma)));
    if (comma == std::string_view::npos) break;
    list.remove_prefix(comma + 1);
  }
  return sizes;
}

inline double now_us() {
  using namespace std::chrono;
  return duration<double, std::micro>(steady_clock::now().time_since_epoch()).count();
}

struct summary {
  double median_us = 0;
  double mean_us = 0;
  double min_us = 0;
};

inline summary summarize(std::vector<double> times_us) {
  summary s;
  if (times_us.empty()) return s;
  std::sort(times_us.begin(), times_us.end());
  std::size_t n = times_us.size();
  s.median_us = n % 2 == 1 ? times_us[n / 2] : (times_us[n / 2 - 1] + times_us[n / 2]) / 2;
  s.mean_us = std::accumulate(times_us.begin(), times_us.end(), 0.0) / static_cast<double>(n);
  s.min_us = times_us.front();
  return s;
}

// One all-reduce result: algbw = bytes / mean time (GB/s, 1e9 bytes), the statistic chorus's
// perf binaries report (nccl-tests times a block of iterations), so stalls count for everyone;
// busbw = algbw * 2(n-1)/n, the nccl-tests bus bandwidth of all-reduce.
inline void print_allreduce(const char* impl, int ranks, std::size_t bytes, int iters,
                            const summary& s, long wrong) {
  double algbw = static_cast<double>(bytes) / (s.mean_us * 1e-6) / 1e9;
  double busbw = algbw * 2.0 * (ranks - 1) / ranks;
  std::printf(
      "RESULT impl=%s op=all_reduce ranks=%d size=%zu iters=%d median_us=%.3f mean_us=%.3f "
      "min_us=%.3f algbw=%.4f busbw=%.4f wrong=%ld\n",
      impl, ranks, bytes, iters, s.median_us, s.mean_us, s.min_us, algbw, busbw, wrong);
  std::fflush(stdout);
}

}  // namespace compare
