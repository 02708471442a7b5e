// SPDX-License-Identifier: Apache-2.0
// Element types and reduction operators: the vocabulary shared by every layer.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>

namespace chorus {

/// IEEE 754 binary16. Arithmetic happens in float; storing rounds to nearest, ties to even.
struct half {
  std::uint16_t bits = 0;
};

/// bfloat16: the upper half of a float32. Storing rounds to nearest, ties to even.
struct bfloat16 {
  std::uint16_t bits = 0;
};

/// Element types a collective can carry. The numbering is part of the wire format.
enum class dtype : std::uint8_t {
  float32 = 0,
  float64 = 1,
  float16 = 2,
  bfloat16 = 3,
  int8 = 4,
  uint8 = 5,
  int32 = 6,
  uint32 = 7,
  int64 = 8,
  uint64 = 9,
};
inline constexpr int dtype_count = 10;

/// Reduction operators. `avg` is sum divided by the number of ranks; it is defined for the
/// floating types only (an integer average would silently truncate, so it is rejected with
/// errc::invalid_argument). Integer sum and prod wrap modulo 2^bits, as unsigned arithmetic
/// does, on every rank identically.
enum class reduce_op : std::uint8_t { sum = 0, prod = 1, min = 2, max = 3, avg = 4 };
inline constexpr int reduce_op_count = 5;

inline constexpr reduce_op sum = reduce_op::sum;
inline constexpr reduce_op prod = reduce_op::prod;
inline constexpr reduce_op min = reduce_op::min;
inline constexpr reduce_op max = reduce_op::max;
inline constexpr reduce_op avg = reduce_op::avg;

template <class>
inline constexpr bool always_false = false;

/// Maps a C++ element type to its dtype. Specialised for the ten supported types only.
template <class T>
struct dtype_traits {
  static_assert(always_false<T>,
                "chorus: no dtype_traits<T>; use float, double, chorus::half, chorus::bfloat16 "
                "or an 8/32/64-bit integer, or specialise chorus::dtype_traits");
};

#define CHORUS_DTYPE_TRAIT(T, D)                \
  template <>                                   \
  struct dtype_traits<T> {                      \
    static constexpr dtype value = dtype::D;    \
  };
CHORUS_DTYPE_TRAIT(float, float32)
CHORUS_DTYPE_TRAIT(double, float64)
CHORUS_DTYPE_TRAIT(half, float16)
CHORUS_DTYPE_TRAIT(bfloat16, bfloat16)
CHORUS_DTYPE_TRAIT(std::int8_t, int8)
CHORUS_DTYPE_TRAIT(std::uint8_t, uint8)
CHORUS_DTYPE_TRAIT(std::int32_t, int32)
CHORUS_DTYPE_TRAIT(std::uint32_t, uint32)
CHORUS_DTYPE_TRAIT(std::int64_t, int64)
CHORUS_DTYPE_TRAIT(std::uint64_t, uint64)
#undef CHORUS_DTYPE_TRAIT

template <class T>
inline constexpr dtype dtype_of = dtype_traits<std::remove_cv_t<T>>::value;

/// Size in bytes of one element of `t`.
constexpr std::size_t size_of(dtype t) noexcept {
  switch (t) {
    case dtype::int8:
    case dtype::uint8: return 1;
    case dtype::float16:
    case dtype::bfloat16: return 2;
    case dtype::float32:
    case dtype::int32:
    case dtype::uint32: return 4;
    case dtype::float64:
    case dtype::int64:
    case dtype::uint64: return 8;
  }
  return 0;
}

constexpr bool is_floating(dtype t) noexcept {
  return t == dtype::float32 || t == dtype::float64 || t == dtype::float16 ||
         t == dtype::bfloat16;
}

constexpr bool is_valid(dtype t) noexcept { return static_cast<int>(t) < dtype_count; }
constexpr bool is_valid(reduce_op op) noexcept { return static_cast<int>(op) < reduce_op_count; }

/// Names as the perf binaries and error messages print them (nccl-tests spelling).
constexpr std::string_view to_string(dtype t) noexcept {
  switch (t) {
    case dtype::float32: return "float";
    case dtype::float64: return "double";
    case dtype::float16: return "half";
    case dtype::bfloat16: return "bfloat16";
    case dtype::int8: return "int8";
    case dtype::uint8: return "uint8";
    case dtype::int32: return "int32";
    case dtype::uint32: return "uint32";
    case dtype::int64: return "int64";
    case dtype::uint64: return "uint64";
  }
  return "invalid";
}

constexpr std::string_view to_string(reduce_op op) noexcept {
  switch (op) {
    case reduce_op::sum: return "sum";
    case reduce_op::prod: return "prod";
    case reduce_op::min: return "min";
    case reduce_op::max: return "max";
    case reduce_op::avg: return "avg";
  }
  return "invalid";
}

// --- scalar conversions for half and bfloat16 ------------------------------------------

/// float -> binary16, round to nearest, ties to even; overflow goes to infinity, NaN stays NaN.
constexpr half to_half(float f) noexcept {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // inf or NaN: keep NaN quiet and non-zero
    return half{static_cast<std::uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u))};
  }
  if (abs >= 0x477ff000u) {  // rounds to >= 65520: overflow to infinity
    return half{static_cast<std::uint16_t>(sign | 0x7c00u)};
  }
  if (abs < 0x38800000u) {  // result is subnormal or zero: shift mantissa with rounding
    if (abs < 0x33000000u) return half{static_cast<std::uint16_t>(sign)};  // < 2^-25
    const std::uint32_t exp = abs >> 23;
    const std::uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    const std::uint32_t shift = 126u - exp;  // 14..24 (result units of 2^-24)
    std::uint32_t r = mant >> shift;
    const std::uint32_t rem = mant & ((1u << shift) - 1u);
    const std::uint32_t halfway = 1u << (shift - 1u);
    if (rem > halfway || (rem == halfway && (r & 1u))) ++r;
    return half{static_cast<std::uint16_t>(sign | r)};
  }
  // normal: rebias exponent (127 -> 15), round the 13 dropped mantissa bits
  std::uint32_t r = (abs - 0x38000000u) >> 13;
  const std::uint32_t rem = abs & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r;  // may carry into the exponent: fine
  return half{static_cast<std::uint16_t>(sign | r)};
}

/// binary16 -> float, exact.
constexpr float to_float(half h) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(h.bits & 0x8000u) << 16;
  const std::uint32_t exp = (h.bits >> 10) & 0x1fu;
  std::uint32_t mant = h.bits & 0x3ffu;
  if (exp == 0x1fu) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));
  if (exp == 0) {
    if (mant == 0) return std::bit_cast<float>(sign);
    // subnormal: normalise
    std::uint32_t e = 113;  // 127 - 15 + 1
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      --e;
    }
    return std::bit_cast<float>(sign | (e << 23) | ((mant & 0x3ffu) << 13));
  }
  return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (mant << 13));
}

/// float -> bfloat16, round to nearest, ties to even; NaN stays NaN.
constexpr bfloat16 to_bfloat16(float f) noexcept {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) {
    return bfloat16{static_cast<std::uint16_t>((x >> 16) | 0x40u)};
  }
  const std::uint32_t rounding = 0x7fffu + ((x >> 16) & 1u);
  return bfloat16{static_cast<std::uint16_t>((x + rounding) >> 16)};
}

/// bfloat16 -> float, exact.
constexpr float to_float(bfloat16 b) noexcept {
  return std::bit_cast<float>(static_cast<std::uint32_t>(b.bits) << 16);
}

}  // namespace chorus
