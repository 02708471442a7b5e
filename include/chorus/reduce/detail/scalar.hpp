// SPDX-License-Identifier: Apache-2.0
// One-element reduction semantics and the portable loops built from them; the vector kernels
// must agree with these bit for bit.
#pragma once

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "chorus/types.hpp"

namespace chorus::detail {

/// Same type as chorus::reduce_fn, spelled here so that detail code needs no public header.
using kernel_fn = void (*)(void* dst, const void* a, const void* b, std::size_t count) noexcept;

// Buffers may start at any byte address, so every element goes through memcpy: compilers turn
// it into one (unaligned) load or store, and no misaligned T* is ever dereferenced.
template <class T>
T load_element(const std::byte* p) noexcept {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

template <class T>
void store_element(std::byte* p, T v) noexcept {
  std::memcpy(p, &v, sizeof v);
}

// The one NaN every floating reduction produces. x86 would otherwise give the NaN of the first
// operand (so a+b and b+a could differ in payload) or, for inf-inf, the negative "default" NaN;
// other CPUs differ again. Ranks that combine operands in different orders must agree bit for
// bit, so every NaN result is replaced by the positive quiet NaN (std::numeric_limits<>::
// quiet_NaN() on IEEE platforms).
inline constexpr std::uint32_t canonical_nan32 = 0x7fc00000u;
inline constexpr std::uint64_t canonical_nan64 = 0x7ff8000000000000u;

inline float canonical(float x) noexcept {
  return std::isnan(x) ? std::bit_cast<float>(canonical_nan32) : x;
}
inline double canonical(double x) noexcept {
  return std::isnan(x) ? std::bit_cast<double>(canonical_nan64) : x;
}

/// a op b for float and double. min and max are commutative bit for bit: NaN if either operand
/// is NaN (std::fmin would drop the NaN and hide a diverged model), and min(-0, +0) = -0,
/// max(-0, +0) = +0 whichever order the zeros come in.
template <reduce_op Op, class F>
F apply_floating(F a, F b) noexcept {
  if constexpr (Op == reduce_op::sum || Op == reduce_op::avg) {
    return canonical(a + b);
  } else if constexpr (Op == reduce_op::prod) {
    return canonical(a * b);
  } else {
    if (std::isnan(a) || std::isnan(b)) return canonical(a + b);
    if (a < b) return Op == reduce_op::min ? a : b;
    if (b < a) return Op == reduce_op::min ? b : a;
    // Equal: identical bits unless they are -0 and +0; pick by sign so the order is irrelevant.
    if constexpr (Op == reduce_op::min) {
      return std::signbit(a) ? a : b;
    } else {
      return std::signbit(a) ? b : a;
    }
  }
}

/// a op b for the integer types. sum and prod are done in the unsigned type (at least unsigned
/// int, since uint8 * uint8 would otherwise promote to signed int), so they wrap modulo 2^bits
/// without signed-overflow UB; converting back to a signed type is modular since C++20.
template <reduce_op Op, class T>
T apply_integer(T a, T b) noexcept {
  using wide = decltype(std::make_unsigned_t<T>{} + 0u);
  if constexpr (Op == reduce_op::sum || Op == reduce_op::avg) {
    return static_cast<T>(static_cast<wide>(a) + static_cast<wide>(b));
  } else if constexpr (Op == reduce_op::prod) {
    return static_cast<T>(static_cast<wide>(a) * static_cast<wide>(b));
  } else if constexpr (Op == reduce_op::min) {
    return b < a ? b : a;
  } else {
    return a < b ? b : a;
  }
}

/// a op b for any element type. half and bfloat16 are widened to float (exactly), combined in
/// float and rounded back to nearest, ties to even: what the F16C and bf16 vector paths do.
template <class T, reduce_op Op>
T apply(T a, T b) noexcept {
  if constexpr (std::is_same_v<T, half>) {
    return to_half(apply_floating<Op>(to_float(a), to_float(b)));
  } else if constexpr (std::is_same_v<T, bfloat16>) {
    return to_bfloat16(apply_floating<Op>(to_float(a), to_float(b)));
  } else if constexpr (std::is_floating_point_v<T>) {
    return apply_floating<Op>(a, b);
  } else {
    return apply_integer<Op>(a, b);
  }
}

/// dst[i] = a[i] op b[i], one element at a time. Also finishes the vector kernels' tails.
template <class T, reduce_op Op>
void scalar_kernel(void* dst, const void* a, const void* b, std::size_t count) noexcept {
  auto* d = static_cast<std::byte*>(dst);
  const auto* pa = static_cast<const std::byte*>(a);
  const auto* pb = static_cast<const std::byte*>(b);
  for (std::size_t i = 0; i < count; ++i) {
    const std::size_t at = i * sizeof(T);
    store_element(d + at, apply<T, Op>(load_element<T>(pa + at), load_element<T>(pb + at)));
  }
}

/// data[i] /= n for a floating type, NaN results canonical (see canonical_nan32).
template <class T>
void scalar_divide(void* data, std::size_t count, std::size_t n) noexcept {
  auto* p = static_cast<std::byte*>(data);
  for (std::size_t i = 0; i < count; ++i) {
    std::byte* at = p + i * sizeof(T);
    const T x = load_element<T>(at);
    if constexpr (std::is_same_v<T, half>) {
      store_element(at, to_half(canonical(to_float(x) / static_cast<float>(n))));
    } else if constexpr (std::is_same_v<T, bfloat16>) {
      store_element(at, to_bfloat16(canonical(to_float(x) / static_cast<float>(n))));
    } else {
      store_element(at, canonical(x / static_cast<T>(n)));
    }
  }
}

}  // namespace chorus::detail
