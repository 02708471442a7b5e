// SPDX-License-Identifier: Apache-2.0
// Reduction kernels against references computed in higher precision or exact integers.
#include "chorus/reduce/reduce.hpp"

#include <doctest/doctest.h>

#include <array>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

TYPE_TO_STRING(chorus::half);
TYPE_TO_STRING(chorus::bfloat16);
TYPE_TO_STRING(std::int8_t);
TYPE_TO_STRING(std::uint8_t);
TYPE_TO_STRING(std::int32_t);
TYPE_TO_STRING(std::uint32_t);
TYPE_TO_STRING(std::int64_t);
TYPE_TO_STRING(std::uint64_t);

namespace {

using chorus::bfloat16;
using chorus::half;
using chorus::reduce_op;

constexpr std::array all_ops = {reduce_op::sum, reduce_op::prod, reduce_op::min, reduce_op::max,
                                reduce_op::avg};
// Around the 8-, 16- and 32-element vector blocks and their 4x unrolling, plus long runs.
constexpr std::array counts = {std::size_t{0},    std::size_t{1},   std::size_t{7},
                               std::size_t{31},   std::size_t{32},  std::size_t{33},
                               std::size_t{1000}, std::size_t{4097}};

// The NaN every floating result must carry, written out here rather than taken from detail/.
constexpr std::uint32_t float_nan = 0x7fc00000u;
constexpr std::uint64_t double_nan = 0x7ff8000000000000u;
constexpr std::uint16_t half_nan = 0x7e00u;
constexpr std::uint16_t bfloat16_nan = 0x7fc0u;

template <class T>
auto bits_of(T v) {
  if constexpr (sizeof(T) == 1) return std::bit_cast<std::uint8_t>(v);
  if constexpr (sizeof(T) == 2) return std::bit_cast<std::uint16_t>(v);
  if constexpr (sizeof(T) == 4) return std::bit_cast<std::uint32_t>(v);
  if constexpr (sizeof(T) == 8) return std::bit_cast<std::uint64_t>(v);
}

template <class T>
std::string hex(T v) {
  char text[32];
  std::snprintf(text, sizeof text, "0x%llx", static_cast<unsigned long long>(bits_of(v)));
  return text;
}

template <class T>
constexpr bool is_small_float = std::is_same_v<T, half> || std::is_same_v<T, bfloat16>;

template <class T>
chorus::dtype dtype_for() {
  return chorus::dtype_of<T>;
}

template <class T>
T canonical_nan() {
  if constexpr (std::is_same_v<T, float>) return std::bit_cast<float>(float_nan);
  if constexpr (std::is_same_v<T, double>) return std::bit_cast<double>(double_nan);
  if constexpr (std::is_same_v<T, half>) return half{half_nan};
  if constexpr (std::is_same_v<T, bfloat16>) return bfloat16{bfloat16_nan};
}

template <class T>
double widen(T v) {
  if constexpr (is_small_float<T>) {
    return static_cast<double>(chorus::to_float(v));
  } else {
    return static_cast<double>(v);
  }
}

// a op b in double, with the min/max rules written independently of the library: NaN wins,
// and between equal values the sign decides (only -0 and +0 are equal with different bits).
double reference_floating(reduce_op op, double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<double>::quiet_NaN();
  switch (op) {
    case reduce_op::sum:
    case reduce_op::avg: return a + b;
    case reduce_op::prod: return a * b;
    case reduce_op::min:
      if (a == b) return std::signbit(a) || std::signbit(b) ? -std::fabs(a) : std::fabs(a);
      return std::fmin(a, b);
    case reduce_op::max:
      if (a == b) return std::signbit(a) && std::signbit(b) ? -std::fabs(a) : std::fabs(a);
      return std::fmax(a, b);
  }
  return 0;
}

// A double result as T: NaN becomes the canonical NaN; otherwise rounded once to float, then
// to half or bfloat16 with the scalar conversions (double is its own reference).
template <class T>
T narrow(double r) {
  if (std::isnan(r)) return canonical_nan<T>();
  if constexpr (std::is_same_v<T, double>) {
    return r;
  } else {
    const auto f = static_cast<float>(r);
    if constexpr (std::is_same_v<T, float>) return f;
    if constexpr (std::is_same_v<T, half>) return chorus::to_half(f);
    if constexpr (std::is_same_v<T, bfloat16>) return chorus::to_bfloat16(f);
  }
}

// The expected a op b. float, half and bfloat16 are computed in double and rounded once to
// float, which equals rounding the exact result to float (53 >= 2*24 + 2 bits), then narrowed
// with the scalar conversions; double has nothing wider that avoids double rounding, so it is
// its own reference. Integers are computed exactly modulo 2^64 and truncated.
template <class T>
T reference(reduce_op op, T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    const auto ua = static_cast<std::uint64_t>(a);
    const auto ub = static_cast<std::uint64_t>(b);
    switch (op) {
      case reduce_op::sum:
      case reduce_op::avg: return static_cast<T>(ua + ub);
      case reduce_op::prod: return static_cast<T>(ua * ub);
      case reduce_op::min: return a < b ? a : b;
      case reduce_op::max: return a < b ? b : a;
    }
    return T{};
  } else {
    return narrow<T>(reference_floating(op, widen(a), widen(b)));
  }
}

// Random elements: integers and 16-bit floats are uniform random bits (which covers
// subnormals, infinities and NaNs); wider floats mix moderate values, whose sums and products
// round, with random bit patterns and a sprinkling of special values.
template <class T>
T random_element(std::mt19937_64& rng) {
  if constexpr (std::is_integral_v<T>) {
    return static_cast<T>(rng());
  } else if constexpr (is_small_float<T>) {
    if (rng() % 2 == 0) return T{static_cast<std::uint16_t>(rng())};
    std::uniform_real_distribution<float> moderate(-8.0f, 8.0f);
    if constexpr (std::is_same_v<T, half>) return chorus::to_half(moderate(rng));
    if constexpr (std::is_same_v<T, bfloat16>) return chorus::to_bfloat16(moderate(rng));
  } else {
    using uint = decltype(bits_of(T{}));
    constexpr std::array<T, 8> specials = {T{0},
                                           -T{0},
                                           std::numeric_limits<T>::infinity(),
                                           -std::numeric_limits<T>::infinity(),
                                           std::numeric_limits<T>::quiet_NaN(),
                                           std::numeric_limits<T>::denorm_min(),
                                           -std::numeric_limits<T>::min(),
                                           std::numeric_limits<T>::max()};
    const std::uint64_t pick = rng() % 16;
    if (pick == 0) return specials[rng() % specials.size()];
    if (pick < 4) return std::bit_cast<T>(static_cast<uint>(rng()));
    std::uniform_real_distribution<T> moderate(T{-1000}, T{1000});
    return moderate(rng);
  }
}

enum class aliasing { none, dst_is_a, dst_is_b };

// Runs one kernel on random data placed at the given byte offsets and checks every element
// against reference(), and that no byte outside the destination changed.
template <class T>
void check_kernel(chorus::reduce_fn kernel, reduce_op op, std::size_t count,
                  std::array<std::size_t, 3> offsets, aliasing alias, std::mt19937_64& rng) {
  const std::size_t bytes = count * sizeof(T);
  std::vector<std::byte> a_store(bytes + 8, std::byte{0xa5});
  std::vector<std::byte> b_store(bytes + 8, std::byte{0x5a});
  std::vector<std::byte> d_store(bytes + 8, std::byte{0xcd});
  std::vector<T> a(count), b(count);
  for (auto& v : a) v = random_element<T>(rng);
  for (auto& v : b) v = random_element<T>(rng);
  std::byte* pa = a_store.data() + offsets[0];
  std::byte* pb = b_store.data() + offsets[1];
  if (count > 0) {
    std::memcpy(pa, a.data(), bytes);
    std::memcpy(pb, b.data(), bytes);
  }

  std::vector<std::byte>* d_owner = &d_store;
  std::byte* pd = d_store.data() + offsets[2];
  if (alias == aliasing::dst_is_a) {
    d_owner = &a_store;
    pd = pa;
  } else if (alias == aliasing::dst_is_b) {
    d_owner = &b_store;
    pd = pb;
  }
  const std::vector<std::byte> before = *d_owner;

  kernel(pd, pa, pb, count);

  std::size_t wrong = 0;
  std::string first;
  for (std::size_t i = 0; i < count; ++i) {
    T got;
    std::memcpy(&got, pd + i * sizeof(T), sizeof got);
    const T want = reference<T>(op, a[i], b[i]);
    if (bits_of(got) != bits_of(want)) {
      if (wrong++ == 0) {
        first = "element " + std::to_string(i) + ": " + hex(a[i]) + " op " + hex(b[i]) + " gave " +
                hex(got) + ", expected " + hex(want);
      }
    }
  }
  const auto dst_begin = static_cast<std::size_t>(pd - d_owner->data());
  std::size_t outside_changed = 0;
  for (std::size_t i = 0; i < before.size(); ++i) {
    const bool inside = i >= dst_begin && i < dst_begin + bytes;
    if (!inside && before[i] != (*d_owner)[i]) ++outside_changed;
  }
  INFO("op ", std::string(chorus::to_string(op)), ", count ", count, ", offsets ", offsets[0], "/",
       offsets[1], "/", offsets[2], ", aliasing ", static_cast<int>(alias));
  INFO(first);
  CHECK(wrong == 0);
  CHECK(outside_changed == 0);
}

// The kernels to test: the portable ones and, where the CPU runs them, the vectorised ones.
struct kernel_path {
  std::string name;
  bool vectorised;
};

std::vector<kernel_path> paths() {
  std::vector<kernel_path> result = {{"scalar", false}};
  if (chorus::detail::cpu_has_avx2()) {
    result.push_back({"avx2", true});
  } else {
    MESSAGE("this CPU lacks AVX2 or F16C: only the portable kernels are tested");
  }
  return result;
}

// Runs `kernel` on arrays holding every pair (x, y) of `values`, returning r[i*n + j] =
// x_i op y_j. n*n elements make the vector body and the scalar tail both run.
template <class T>
std::vector<T> all_pairs(chorus::reduce_fn kernel, const std::vector<T>& values) {
  const std::size_t n = values.size();
  std::vector<T> a(n * n), b(n * n), r(n * n);
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t j = 0; j < n; ++j) {
      a[i * n + j] = values[i];
      b[i * n + j] = values[j];
    }
  }
  kernel(r.data(), a.data(), b.data(), n * n);
  return r;
}

template <class T>
std::vector<T> special_values() {
  if constexpr (std::is_same_v<T, half>) {
    // +-0, NaNs with other payloads and sign, +-inf, smallest subnormals, 1, -2, max.
    return {half{0x0000}, half{0x8000}, half{0x7e01}, half{0xfe00}, half{0x7d00}, half{0x7c00},
            half{0xfc00}, half{0x0001}, half{0x8001}, half{0x3c00}, half{0xc000}, half{0x7bff}};
  } else if constexpr (std::is_same_v<T, bfloat16>) {
    return {bfloat16{0x0000}, bfloat16{0x8000}, bfloat16{0x7fc1}, bfloat16{0xffc0},
            bfloat16{0x7f81}, bfloat16{0x7f80}, bfloat16{0xff80}, bfloat16{0x0001},
            bfloat16{0x8001}, bfloat16{0x3f80}, bfloat16{0xc000}, bfloat16{0x7f7f}};
  } else {
    using uint = decltype(bits_of(T{}));
    using limits = std::numeric_limits<T>;
    const uint quiet = bits_of(limits::quiet_NaN());
    return {T{0},
            -T{0},
            limits::quiet_NaN(),
            -limits::quiet_NaN(),
            std::bit_cast<T>(static_cast<uint>(quiet | 1u)),  // quiet NaN, other payload
            std::bit_cast<T>(static_cast<uint>(bits_of(limits::infinity()) | 1u)),  // signalling
            limits::infinity(),
            -limits::infinity(),
            limits::denorm_min(),
            -limits::denorm_min(),
            T{1},
            T{-2},
            limits::max()};
  }
}

template <class T>
bool is_nan(T v) {
  return std::isnan(widen(v));
}

}  // namespace

TEST_CASE_TEMPLATE("reduce matches a higher-precision reference for every op, count and alignment",
                   T, float, double, half, bfloat16, std::int8_t, std::uint8_t, std::int32_t,
                   std::uint32_t, std::int64_t, std::uint64_t) {
  std::mt19937_64 rng(12345);
  const chorus::dtype t = dtype_for<T>();
  for (const kernel_path& path : paths()) {
    CAPTURE(path.name);
    for (const reduce_op op : all_ops) {
      const chorus::reduce_fn kernel = chorus::detail::select_kernel(t, op, path.vectorised);
      REQUIRE(static_cast<bool>(kernel));
      for (const std::size_t count : counts) {
        // Aligned, then each buffer shifted by a different 1..3 bytes.
        check_kernel<T>(kernel, op, count, {0, 0, 0}, aliasing::none, rng);
        check_kernel<T>(kernel, op, count, {1, 2, 3}, aliasing::none, rng);
        check_kernel<T>(kernel, op, count, {3, 1, 2}, aliasing::none, rng);
        check_kernel<T>(kernel, op, count, {2, 3, 1}, aliasing::dst_is_a, rng);
        check_kernel<T>(kernel, op, count, {1, 2, 0}, aliasing::dst_is_b, rng);
        check_kernel<T>(kernel, op, count, {0, 0, 0}, aliasing::dst_is_a, rng);
      }
    }
  }
}

namespace {
void public_max(void* d, const void* a, const void* b, std::size_t n) noexcept {
  chorus::reduce(chorus::dtype::float32, chorus::max, d, a, b, n);
}
}  // namespace

TEST_CASE("the public reduce dispatches to the kernel this CPU runs best") {
  std::mt19937_64 rng(7);
  check_kernel<float>(&public_max, chorus::max, 1000, {1, 2, 3}, aliasing::none, rng);
  for (const reduce_op op : all_ops) {
    const bool same =
        chorus::reduce_function(chorus::dtype::float32, op) ==
        chorus::detail::select_kernel(chorus::dtype::float32, op, chorus::detail::cpu_has_avx2());
    CHECK(same);
  }
}

TEST_CASE("avg reduces with the sum kernel") {
  for (int t = 0; t < chorus::dtype_count; ++t) {
    const auto d = static_cast<chorus::dtype>(t);
    const bool same =
        chorus::reduce_function(d, chorus::avg) == chorus::reduce_function(d, chorus::sum);
    CHECK(same);
  }
}

TEST_CASE("out-of-range dtypes and ops have no kernel and reduce writes nothing") {
  const bool no_dtype = chorus::reduce_function(static_cast<chorus::dtype>(chorus::dtype_count),
                                                chorus::sum) == nullptr;
  const bool no_op =
      chorus::reduce_function(chorus::dtype::float32,
                              static_cast<reduce_op>(chorus::reduce_op_count)) == nullptr;
  CHECK(no_dtype);
  CHECK(no_op);
  std::array<float, 4> a = {1, 2, 3, 4}, b = {1, 1, 1, 1}, d = {9, 9, 9, 9};
  chorus::reduce(chorus::dtype::float32, static_cast<reduce_op>(99), d.data(), a.data(), b.data(),
                 4);
  CHECK(d == std::array<float, 4>{9, 9, 9, 9});
}

TEST_CASE("integer sum and prod wrap modulo 2^bits on every path") {
  // Forty copies of each pair: one 32-byte vector block and a scalar tail for every type.
  auto run = [](auto x, auto y, reduce_op op) {
    using T = decltype(x);
    std::vector<T> a(40, x), b(40, y), r(40);
    std::vector<T> results;
    for (const kernel_path& path : paths()) {
      chorus::detail::select_kernel(chorus::dtype_of<T>, op, path.vectorised)(r.data(), a.data(),
                                                                              b.data(), r.size());
      for (const T v : r) CHECK(v == r.front());
      results.push_back(r.back());
    }
    for (const T v : results) CHECK(v == results.front());
    return results.front();
  };
  CHECK(run(std::int8_t{127}, std::int8_t{1}, chorus::sum) == std::int8_t{-128});
  CHECK(run(std::uint8_t{255}, std::uint8_t{2}, chorus::sum) == std::uint8_t{1});
  CHECK(run(std::int8_t{-128}, std::int8_t{-1}, chorus::prod) == std::int8_t{-128});
  CHECK(run(std::int8_t{16}, std::int8_t{17}, chorus::prod) == std::int8_t{16});  // 272 - 256
  CHECK(run(std::uint8_t{200}, std::uint8_t{200}, chorus::prod) == std::uint8_t{64});
  CHECK(run(std::int32_t{2147483647}, std::int32_t{1}, chorus::sum) ==
        std::int32_t{-2147483647 - 1});
  CHECK(run(std::int32_t{65536}, std::int32_t{65537}, chorus::prod) == std::int32_t{65536});
  CHECK(run(std::uint32_t{4294967295u}, std::uint32_t{4294967295u}, chorus::prod) ==
        std::uint32_t{1});
  CHECK(run(std::int64_t{9223372036854775807}, std::int64_t{1}, chorus::sum) ==
        std::numeric_limits<std::int64_t>::min());
  // 0x5555555555555556 = (2^64 + 2) / 3, so -3 times it is -2 modulo 2^64.
  CHECK(run(std::int64_t{-3}, std::int64_t{0x5555555555555556}, chorus::prod) == -2);
  CHECK(run(std::uint64_t{0xffffffffffffffffu}, std::uint64_t{0xffffffffffffffffu}, chorus::prod) ==
        std::uint64_t{1});
  CHECK(run(std::uint64_t{0x100000001u}, std::uint64_t{0x100000001u}, chorus::prod) ==
        std::uint64_t{0x200000001u});
  // min and max follow signedness, also for the 64-bit lanes built from a signed compare.
  CHECK(run(std::uint64_t{0x8000000000000000u}, std::uint64_t{1}, chorus::min) == 1u);
  CHECK(run(std::int64_t{std::numeric_limits<std::int64_t>::min()}, std::int64_t{1}, chorus::min) ==
        std::numeric_limits<std::int64_t>::min());
  CHECK(run(std::uint8_t{0x80}, std::uint8_t{1}, chorus::max) == 0x80u);
  CHECK(run(std::int8_t{-128}, std::int8_t{1}, chorus::max) == 1);
  CHECK(run(std::uint32_t{0x80000000u}, std::uint32_t{1}, chorus::max) == 0x80000000u);
}

TEST_CASE_TEMPLATE(
    "floating min and max are commutative bit for bit with NaN, inf and signed zeros", T, float,
    double, half, bfloat16) {
  const std::vector<T> values = special_values<T>();
  const std::size_t n = values.size();
  for (const kernel_path& path : paths()) {
    CAPTURE(path.name);
    for (const reduce_op op : {reduce_op::min, reduce_op::max, reduce_op::sum, reduce_op::prod}) {
      CAPTURE(std::string(chorus::to_string(op)));
      const std::vector<T> r =
          all_pairs(chorus::detail::select_kernel(dtype_for<T>(), op, path.vectorised), values);
      for (std::size_t i = 0; i < n; ++i) {
        for (std::size_t j = 0; j < n; ++j) {
          CAPTURE(hex(values[i]));
          CAPTURE(hex(values[j]));
          CHECK(bits_of(r[i * n + j]) == bits_of(r[j * n + i]));
          if (is_nan(values[i]) || is_nan(values[j])) {
            CHECK(bits_of(r[i * n + j]) == bits_of(canonical_nan<T>()));
          }
          CHECK(bits_of(r[i * n + j]) == bits_of(reference<T>(op, values[i], values[j])));
        }
      }
    }
    // The zero rules spelled out: min(+0, -0) = -0 and max(-0, +0) = +0.
    const std::vector<T> zeros = all_pairs(
        chorus::detail::select_kernel(dtype_for<T>(), chorus::min, path.vectorised), values);
    CHECK(bits_of(zeros[0 * n + 1]) == bits_of(values[1]));
    const std::vector<T> maxes = all_pairs(
        chorus::detail::select_kernel(dtype_for<T>(), chorus::max, path.vectorised), values);
    CHECK(bits_of(maxes[1 * n + 0]) == bits_of(values[0]));
  }
}

TEST_CASE_TEMPLATE(
    "16-bit float ops round to nearest even like the scalar conversion for every input", T, half,
    bfloat16) {
  // Every one of the 65536 bit patterns (subnormals, infinities, NaNs included) against a
  // handful of partners chosen to land on ties, in the subnormal range and past overflow.
  std::vector<T> a(65536);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = T{static_cast<std::uint16_t>(i)};
  std::vector<std::uint16_t> partners;
  if constexpr (std::is_same_v<T, half>) {
    partners = {0x0000, 0x8000, 0x0001, 0x8001, 0x0200, 0x03ff, 0x0400, 0x1000,
                0x3c00, 0xbc01, 0x3800, 0x1400, 0x7bff, 0x7c00, 0x7e00, 0x4000};
  } else {
    partners = {0x0000, 0x8000, 0x0001, 0x8001, 0x0080, 0x007f, 0x3b80, 0x3f80,
                0xbf81, 0x3f00, 0x3380, 0x7f7f, 0x7f80, 0x7fc0, 0x4000, 0x0100};
  }
  std::mt19937_64 rng(99);
  for (int k = 0; k < 4; ++k) partners.push_back(static_cast<std::uint16_t>(rng()));

  std::vector<T> b(a.size()), r(a.size());
  for (const kernel_path& path : paths()) {
    CAPTURE(path.name);
    for (const reduce_op op : {reduce_op::sum, reduce_op::prod, reduce_op::min, reduce_op::max}) {
      CAPTURE(std::string(chorus::to_string(op)));
      const chorus::reduce_fn kernel =
          chorus::detail::select_kernel(dtype_for<T>(), op, path.vectorised);
      for (const std::uint16_t p : partners) {
        CAPTURE(p);
        for (auto& v : b) v = T{p};
        kernel(r.data(), a.data(), b.data(), a.size());
        std::size_t wrong = 0;
        std::string first;
        for (std::size_t i = 0; i < a.size(); ++i) {
          const T want = reference<T>(op, a[i], b[i]);
          if (bits_of(r[i]) != bits_of(want) && wrong++ == 0) {
            first = hex(a[i]) + " gave " + hex(r[i]) + ", expected " + hex(want);
          }
        }
        INFO(first);
        CHECK(wrong == 0);
      }
    }
  }
}

TEST_CASE("half sum rounds to nearest even like the scalar conversion") {
  // 1 + 2^-11 lies halfway between 1 and the next half (1 + 2^-10): the tie goes to even 1.
  // (1 + 2^-10) + 2^-11 lies halfway between odd 1 + 2^-10 and even 1 + 2^-9: it goes up.
  // 2^-24 * 0.5 is halfway between 0 and the smallest subnormal: ties to even 0.
  // 2^-24 * 1.5 is halfway between subnormals 1 and 2 (units of 2^-24): goes to even 2.
  struct example {
    std::uint16_t a, b;
    reduce_op op;
    std::uint16_t want;
  };
  const std::vector<example> examples = {
      {0x3c00, 0x1000, reduce_op::sum, 0x3c00},
      {0x3c01, 0x1000, reduce_op::sum, 0x3c02},
      {0x0001, 0x3800, reduce_op::prod, 0x0000},
      {0x0001, 0x3e00, reduce_op::prod, 0x0002},
      // 65504 (odd mantissa) + 16 = 65520 ties between 65504 and 65536: even is 65536, which
      // overflows to infinity. 65504 + 14 stays below the tie.
      {0x7bff, 0x4c00, reduce_op::sum, 0x7c00},
      {0x7bff, 0x4b00, reduce_op::sum, 0x7bff},
  };
  for (const kernel_path& path : paths()) {
    CAPTURE(path.name);
    for (const example& e : examples) {
      std::vector<half> a(9, half{e.a}), b(9, half{e.b}), r(9);
      chorus::detail::select_kernel(chorus::dtype::float16, e.op, path.vectorised)(
          r.data(), a.data(), b.data(), 9);
      CAPTURE(e.a);
      CAPTURE(e.b);
      for (const half h : r) CHECK(h.bits == e.want);
    }
  }
}

TEST_CASE("bfloat16 sum rounds to nearest even and keeps NaN out of infinity") {
  // 1 + 2^-8 is a tie between 1 (even) and 1 + 2^-7: goes to 1. 0x3f81 + 2^-8 goes up to 0x3f82.
  std::vector<bfloat16> a = {bfloat16{0x3f80}, bfloat16{0x3f81}, bfloat16{0x7f7f},
                             bfloat16{0x7fff}};
  std::vector<bfloat16> b = {bfloat16{0x3b80}, bfloat16{0x3b80}, bfloat16{0x7f7f},
                             bfloat16{0x3f80}};
  for (const kernel_path& path : paths()) {
    CAPTURE(path.name);
    // Repeat to 36 elements so the vector body handles the first 32.
    std::vector<bfloat16> ra, rb;
    for (int k = 0; k < 9; ++k) {
      ra.insert(ra.end(), a.begin(), a.end());
      rb.insert(rb.end(), b.begin(), b.end());
    }
    std::vector<bfloat16> r(ra.size());
    chorus::detail::select_kernel(chorus::dtype::bfloat16, chorus::sum, path.vectorised)(
        r.data(), ra.data(), rb.data(), r.size());
    for (std::size_t i = 0; i < r.size(); i += 4) {
      CHECK(r[i].bits == 0x3f80);
      CHECK(r[i + 1].bits == 0x3f82);
      CHECK(r[i + 2].bits == 0x7f80);  // max + max overflows to infinity
      CHECK(r[i + 3].bits == bfloat16_nan);
    }
  }
}

TEST_CASE_TEMPLATE("divide_by matches dividing in higher precision and rounding to nearest even", T,
                   float, double, half, bfloat16) {
  std::mt19937_64 rng(2024);
  for (const kernel_path& path : paths()) {
    CAPTURE(path.name);
    for (const std::size_t n :
         {std::size_t{1}, std::size_t{2}, std::size_t{3}, std::size_t{7}, std::size_t{1000}}) {
      for (const std::size_t count : counts) {
        for (const std::size_t offset : {std::size_t{0}, std::size_t{3}}) {
          std::vector<T> values(count);
          for (auto& v : values) v = random_element<T>(rng);
          std::vector<std::byte> store(count * sizeof(T) + 4);
          if (count > 0) std::memcpy(store.data() + offset, values.data(), count * sizeof(T));
          chorus::detail::divide(dtype_for<T>(), store.data() + offset, count, n, path.vectorised);
          std::size_t wrong = 0;
          std::string first;
          for (std::size_t i = 0; i < count; ++i) {
            T got;
            std::memcpy(&got, store.data() + offset + i * sizeof(T), sizeof got);
            // Division by an exactly representable n: one rounding of the double quotient to
            // float equals the float quotient (53 >= 2*24 + 2), so double is a valid reference
            // for float, half and bfloat16.
            const T want = narrow<T>(widen(values[i]) / static_cast<double>(n));
            if (bits_of(got) != bits_of(want) && wrong++ == 0) {
              first = hex(values[i]) + " / " + std::to_string(n) + " gave " + hex(got) +
                      ", expected " + hex(want);
            }
          }
          CAPTURE(n);
          CAPTURE(count);
          INFO(first);
          CHECK(wrong == 0);
        }
      }
    }
  }
}

TEST_CASE("divide_by finishes an average and leaves integers untouched") {
  std::vector<float> a = {1, 2, 3, 4, 5, 6, 7, 8, 9}, b = {3, 2, 1, 0, -1, -2, -3, -4, -5};
  chorus::reduce(chorus::dtype::float32, chorus::avg, a.data(), a.data(), b.data(), a.size());
  chorus::divide_by(chorus::dtype::float32, a.data(), a.size(), 2);
  for (const float v : a) CHECK(v == 2.0f);

  std::vector<std::int32_t> ints = {10, 20, 30};
  chorus::divide_by(chorus::dtype::int32, ints.data(), ints.size(), 10);
  CHECK(ints == std::vector<std::int32_t>{10, 20, 30});
}
