// SPDX-License-Identifier: Apache-2.0
// Test data for collectives: inputs any rank can recompute, and exact expected results.
#pragma once

#include <chorus/types.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

namespace chorus::test {

/// Calls f.template operator()<T>() with the C++ type of dtype t.
template <class F>
void with_dtype(dtype t, F&& f) {
  switch (t) {
    case dtype::float32: f.template operator()<float>(); break;
    case dtype::float64: f.template operator()<double>(); break;
    case dtype::float16: f.template operator()<half>(); break;
    case dtype::bfloat16: f.template operator()<bfloat16>(); break;
    case dtype::int8: f.template operator()<std::int8_t>(); break;
    case dtype::uint8: f.template operator()<std::uint8_t>(); break;
    case dtype::int32: f.template operator()<std::int32_t>(); break;
    case dtype::uint32: f.template operator()<std::uint32_t>(); break;
    case dtype::int64: f.template operator()<std::int64_t>(); break;
    case dtype::uint64: f.template operator()<std::uint64_t>(); break;
  }
}

inline constexpr dtype all_dtypes[] = {dtype::float32, dtype::float64, dtype::float16,
                                       dtype::bfloat16, dtype::int8,    dtype::uint8,
                                       dtype::int32,   dtype::uint32,  dtype::int64,
                                       dtype::uint64};
inline constexpr reduce_op all_ops[] = {reduce_op::sum, reduce_op::prod, reduce_op::min,
                                        reduce_op::max, reduce_op::avg};
// The world sizes the exhaustive tests sweep: one rank alone, powers of two, and the odd
// sizes 3 and 5, whose ranks cannot all pair up.
inline constexpr int all_world_sizes[] = {1, 2, 3, 4, 5, 8};

inline std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

template <class T>
constexpr bool is_float_v = std::is_floating_point_v<T> || std::is_same_v<T, half> ||
                            std::is_same_v<T, bfloat16>;

template <class T>
T from_double(double d) {
  if constexpr (std::is_same_v<T, half>) return to_half(static_cast<float>(d));
  else if constexpr (std::is_same_v<T, bfloat16>) return to_bfloat16(static_cast<float>(d));
  else return static_cast<T>(d);
}
template <class T>
double to_double(T v) {
  if constexpr (std::is_same_v<T, half> || std::is_same_v<T, bfloat16>) return to_float(v);
  else return static_cast<double>(v);
}

/// Rank r's element i. Floats get small integers (sums and products of up to 8 ranks stay
/// exact in every float type, even bfloat16), so the expected result is exact whatever
/// order an algorithm adds in. Integers get random bits, so wrap-around is exercised.
template <class T>
T input_value(reduce_op op, int rank, std::size_t i, std::uint64_t seed) {
  const std::uint64_t h = mix(seed ^ mix(static_cast<std::uint64_t>(rank) * 1000003u + i));
  if constexpr (is_float_v<T>) {
    if (op == reduce_op::prod) {
      static constexpr double pick[] = {-2, -1, 1, 2, 1, -1, 1, 1};
      return from_double<T>(pick[h % 8]);
    }
    return from_double<T>(static_cast<double>(static_cast<int>(h % 17) - 8));
  } else {
    T v;
    std::memcpy(&v, &h, sizeof v);
    return v;
  }
}

/// The exact result of reducing element i over n ranks with op, as chorus defines it
/// (integers wrap; avg is the float sum divided by n, rounded once to T).
template <class T>
T expected_value(reduce_op op, int n, std::size_t i, std::uint64_t seed) {
  if constexpr (is_float_v<T>) {
    double acc = to_double(input_value<T>(op, 0, i, seed));
    for (int r = 1; r < n; ++r) {
      const double v = to_double(input_value<T>(op, r, i, seed));
      switch (op) {
        case reduce_op::sum:
        case reduce_op::avg: acc += v; break;
        case reduce_op::prod: acc *= v; break;
        case reduce_op::min: acc = std::min(acc, v); break;
        case reduce_op::max: acc = std::max(acc, v); break;
      }
    }
    if (op == reduce_op::avg) {
      if constexpr (std::is_same_v<T, double>) return acc / n;
      else return from_double<T>(static_cast<float>(acc) / static_cast<float>(n));
    }
    return from_double<T>(acc);
  } else {
    using U = std::make_unsigned_t<T>;
    U acc = static_cast<U>(input_value<T>(op, 0, i, seed));
    for (int r = 1; r < n; ++r) {
      const T v = input_value<T>(op, r, i, seed);
      const T a = static_cast<T>(acc);
      switch (op) {
        case reduce_op::sum:
        case reduce_op::avg: acc = static_cast<U>(acc + static_cast<U>(v)); break;
        case reduce_op::prod: acc = static_cast<U>(acc * static_cast<U>(v)); break;
        case reduce_op::min: acc = static_cast<U>(v < a ? v : a); break;
        case reduce_op::max: acc = static_cast<U>(v > a ? v : a); break;
      }
    }
    return static_cast<T>(acc);
  }
}

template <class T>
bool same_bits(const T& a, const T& b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

/// Element i of the block rank `from` sends rank `to` in all_to_all(v): every rank can
/// recompute what every other sends it.
template <class T>
T pair_value(int from, int to, std::size_t i, std::uint64_t seed) {
  return input_value<T>(reduce_op::sum, from * 4099 + to, i, seed);
}

/// How many elements rank `from` sends rank `to` in an all_to_allv drawn from `seed`: about
/// a quarter are zero, the rest up to `most`. Every rank derives every pair's count from the
/// same seed, so its recv_counts are what its peers send it.
inline std::size_t pair_count(int from, int to, std::size_t most, std::uint64_t seed) {
  const std::uint64_t h = mix(seed ^ mix(static_cast<std::uint64_t>(from) * 65537u +
                                         static_cast<std::uint64_t>(to)));
  if (h % 4 == 0 || most == 0) return 0;
  return static_cast<std::size_t>((h >> 8) % most) + 1;
}

/// A buffer with guard bytes on both sides of a window that starts `misalign` bytes past an
/// aligned address: a collective that writes outside its buffer changes a guard.
class guarded_buffer {
 public:
  static constexpr std::size_t guard = 64;
  static constexpr unsigned char pattern = 0xA5;

  guarded_buffer(std::size_t bytes, std::size_t misalign)
      : bytes_(bytes), at_(guard + misalign), store_(bytes + 2 * guard + misalign + 8, pattern) {}

  unsigned char* data() noexcept { return store_.data() + at_; }
  std::size_t size() const noexcept { return bytes_; }
  /// Whether every byte outside the window still holds the guard pattern.
  bool guards_intact() const noexcept {
    for (std::size_t i = 0; i < store_.size(); ++i) {
      if ((i < at_ || i >= at_ + bytes_) && store_[i] != pattern) return false;
    }
    return true;
  }
  template <class T>
  void put(std::size_t i, T v) noexcept {
    std::memcpy(data() + i * sizeof(T), &v, sizeof(T));
  }
  template <class T>
  T get(std::size_t i) const noexcept {
    T v;
    std::memcpy(&v, store_.data() + at_ + i * sizeof(T), sizeof(T));
    return v;
  }

 private:
  std::size_t bytes_, at_;
  std::vector<unsigned char> store_;
};

}  // namespace chorus::test
