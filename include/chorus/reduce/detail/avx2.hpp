// SPDX-License-Identifier: Apache-2.0
// AVX2 + F16C reduction kernels, compiled per function so that the library needs no -mavx2
// and runs on any x86-64; kernels.hpp only hands them out when the CPU has both extensions.
#pragma once

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define CHORUS_DETAIL_HAS_AVX2 1

#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "chorus/reduce/detail/scalar.hpp"
#include "chorus/types.hpp"

// Every function that touches a 256-bit value carries this attribute: a function without it
// cannot inline one that has it, and passing __m256 across such a boundary changes the ABI.
#define CHORUS_DETAIL_AVX2 __attribute__((target("avx2,f16c")))

namespace chorus::detail {

/// The float32 operations shared by float, half and bfloat16 (the latter two widen to float).
/// Each must equal apply_floating<Op> bit for bit, NaN and signed zeros included.
struct avx2_float_ops {
  using scalar = float;
  using vec = __m256;

  CHORUS_DETAIL_AVX2 static vec canonical(vec r) noexcept {
    const vec nan = _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(canonical_nan32)));
    return _mm256_blendv_ps(r, nan, _mm256_cmp_ps(r, r, _CMP_UNORD_Q));
  }

  template <reduce_op Op>
  CHORUS_DETAIL_AVX2 static vec apply(vec a, vec b) noexcept {
    if constexpr (Op == reduce_op::sum || Op == reduce_op::avg) {
      return canonical(_mm256_add_ps(a, b));
    } else if constexpr (Op == reduce_op::prod) {
      return canonical(_mm256_mul_ps(a, b));
    } else {
      // vminps/vmaxps return the second operand when the inputs are equal or unordered, so
      // they are not commutative for (-0, +0) or NaN; patch both cases. For equal inputs the
      // bits differ at most in the sign: OR picks -0 for min, AND picks +0 for max.
      const vec equal = _mm256_cmp_ps(a, b, _CMP_EQ_OQ);
      const vec nan = _mm256_cmp_ps(a, b, _CMP_UNORD_Q);
      vec r;
      if constexpr (Op == reduce_op::min) {
        r = _mm256_blendv_ps(_mm256_min_ps(a, b), _mm256_or_ps(a, b), equal);
      } else {
        r = _mm256_blendv_ps(_mm256_max_ps(a, b), _mm256_and_ps(a, b), equal);
      }
      const vec qnan = _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(canonical_nan32)));
      return _mm256_blendv_ps(r, qnan, nan);
    }
  }

  CHORUS_DETAIL_AVX2 static vec divide(vec v, scalar n) noexcept {
    return canonical(_mm256_div_ps(v, _mm256_set1_ps(n)));
  }
};

/// The float64 twin of avx2_float_ops.
struct avx2_double_ops {
  using scalar = double;
  using vec = __m256d;

  CHORUS_DETAIL_AVX2 static vec canonical(vec r) noexcept {
    const vec nan =
        _mm256_castsi256_pd(_mm256_set1_epi64x(static_cast<long long>(canonical_nan64)));
    return _mm256_blendv_pd(r, nan, _mm256_cmp_pd(r, r, _CMP_UNORD_Q));
  }

  template <reduce_op Op>
  CHORUS_DETAIL_AVX2 static vec apply(vec a, vec b) noexcept {
    if constexpr (Op == reduce_op::sum || Op == reduce_op::avg) {
      return canonical(_mm256_add_pd(a, b));
    } else if constexpr (Op == reduce_op::prod) {
      return canonical(_mm256_mul_pd(a, b));
    } else {
      const vec equal = _mm256_cmp_pd(a, b, _CMP_EQ_OQ);
      const vec nan = _mm256_cmp_pd(a, b, _CMP_UNORD_Q);
      vec r;
      if constexpr (Op == reduce_op::min) {
        r = _mm256_blendv_pd(_mm256_min_pd(a, b), _mm256_or_pd(a, b), equal);
      } else {
        r = _mm256_blendv_pd(_mm256_max_pd(a, b), _mm256_and_pd(a, b), equal);
      }
      const vec qnan =
          _mm256_castsi256_pd(_mm256_set1_epi64x(static_cast<long long>(canonical_nan64)));
      return _mm256_blendv_pd(r, qnan, nan);
    }
  }

  CHORUS_DETAIL_AVX2 static vec divide(vec v, scalar n) noexcept {
    return canonical(_mm256_div_pd(v, _mm256_set1_pd(n)));
  }
};

/// How one element type is loaded into, and stored from, a vector of `width` lanes, plus its
/// operations. Loads and stores are unaligned: buffers may start at any byte.
template <class T>
struct avx2_lanes {
  static_assert(always_false<T>, "chorus: no AVX2 lanes for this element type");
};

template <>
struct avx2_lanes<float> : avx2_float_ops {
  static constexpr std::size_t width = 8;
  CHORUS_DETAIL_AVX2 static vec load(const std::byte* p) noexcept {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(p));
  }
  CHORUS_DETAIL_AVX2 static void store(std::byte* p, vec v) noexcept {
    _mm256_storeu_ps(reinterpret_cast<float*>(p), v);
  }
};

template <>
struct avx2_lanes<double> : avx2_double_ops {
  static constexpr std::size_t width = 4;
  CHORUS_DETAIL_AVX2 static vec load(const std::byte* p) noexcept {
    return _mm256_loadu_pd(reinterpret_cast<const double*>(p));
  }
  CHORUS_DETAIL_AVX2 static void store(std::byte* p, vec v) noexcept {
    _mm256_storeu_pd(reinterpret_cast<double*>(p), v);
  }
};

// half: vcvtph2ps widens exactly; vcvtps2ph with an explicit rounding immediate rounds to
// nearest, ties to even, whatever MXCSR says, handles subnormals and overflow to infinity like
// to_half, and turns the canonical float NaN into 0x7e00 as to_half does.
template <>
struct avx2_lanes<half> : avx2_float_ops {
  static constexpr std::size_t width = 8;
  CHORUS_DETAIL_AVX2 static vec load(const std::byte* p) noexcept {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  CHORUS_DETAIL_AVX2 static void store(std::byte* p, vec v) noexcept {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  }
};

// bfloat16 is the upper half of a float, so 16 of them load as one 256-bit vector and split
// into floats without any shuffle: shifting each 32-bit lane left by 16 gives the even
// elements, masking off the low 16 bits gives the odd ones. Storing reverses it. (Widening with
// vpmovzxwd and narrowing with vpackusdw + vpermq ran at half this speed: three shuffles per
// 8 elements on the one shuffle port.)
template <>
struct avx2_lanes<bfloat16> {
  using scalar = float;
  struct vec {
    __m256 even;
    __m256 odd;
  };
  static constexpr std::size_t width = 16;

  CHORUS_DETAIL_AVX2 static vec load(const std::byte* p) noexcept {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return {_mm256_castsi256_ps(_mm256_slli_epi32(x, 16)),
            _mm256_castsi256_ps(_mm256_and_si256(x, _mm256_set1_epi32(-65536)))};
  }

  // to_bfloat16 in integer lanes, leaving the result in the upper 16 bits: add 0x7fff plus the
  // lowest kept bit (round to nearest, ties to even). to_bfloat16 special-cases NaN so that a
  // payload cannot round into infinity; here every NaN is already the canonical 0x7fc00000
  // (avx2_float_ops ensures it), which this rounding maps to 0x7fc0 exactly as to_bfloat16
  // does, so no NaN test is needed.
  CHORUS_DETAIL_AVX2 static __m256i round_to_upper_half(__m256 v) noexcept {
    const __m256i x = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
    return _mm256_add_epi32(x, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb));
  }

  CHORUS_DETAIL_AVX2 static void store(std::byte* p, vec v) noexcept {
    const __m256i even = _mm256_srli_epi32(round_to_upper_half(v.even), 16);
    const __m256i odd = _mm256_and_si256(round_to_upper_half(v.odd), _mm256_set1_epi32(-65536));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm256_or_si256(even, odd));
  }

  template <reduce_op Op>
  CHORUS_DETAIL_AVX2 static vec apply(vec a, vec b) noexcept {
    return {avx2_float_ops::apply<Op>(a.even, b.even), avx2_float_ops::apply<Op>(a.odd, b.odd)};
  }

  CHORUS_DETAIL_AVX2 static vec divide(vec v, scalar n) noexcept {
    return {avx2_float_ops::divide(v.even, n), avx2_float_ops::divide(v.odd, n)};
  }
};

/// The integer types: lanes of 8, 32 or 64 bits. Addition and multiplication wrap, as
/// apply_integer does; AVX2 lacks 8- and 64-bit multiplies, so those are built from wider ones.
template <class T>
requires std::is_integral_v<T>
struct avx2_lanes<T> {
  using vec = __m256i;
  static constexpr std::size_t width = 32 / sizeof(T);
  static_assert(sizeof(T) == 1 || sizeof(T) == 4 || sizeof(T) == 8,
                "chorus: AVX2 integer lanes exist for 8-, 32- and 64-bit types only");

  CHORUS_DETAIL_AVX2 static vec load(const std::byte* p) noexcept {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  }
  CHORUS_DETAIL_AVX2 static void store(std::byte* p, vec v) noexcept {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v);
  }

  template <reduce_op Op>
  CHORUS_DETAIL_AVX2 static vec apply(vec a, vec b) noexcept {
    constexpr bool is_signed = std::is_signed_v<T>;
    if constexpr (Op == reduce_op::sum || Op == reduce_op::avg) {
      if constexpr (sizeof(T) == 1) return _mm256_add_epi8(a, b);
      if constexpr (sizeof(T) == 4) return _mm256_add_epi32(a, b);
      if constexpr (sizeof(T) == 8) return _mm256_add_epi64(a, b);
    } else if constexpr (Op == reduce_op::prod) {
      if constexpr (sizeof(T) == 1) {
        // The low byte of a 16-bit product depends only on the low bytes of its factors:
        // multiply the even bytes in place and the odd bytes shifted down, then merge.
        const vec even = _mm256_mullo_epi16(a, b);
        const vec odd = _mm256_mullo_epi16(_mm256_srli_epi16(a, 8), _mm256_srli_epi16(b, 8));
        return _mm256_or_si256(_mm256_and_si256(even, _mm256_set1_epi16(0x00ff)),
                               _mm256_slli_epi16(odd, 8));
      }
      if constexpr (sizeof(T) == 4) return _mm256_mullo_epi32(a, b);
      if constexpr (sizeof(T) == 8) {
        // (ah*2^32 + al)(bh*2^32 + bl) mod 2^64 = al*bl + ((ah*bl + al*bh) << 32).
        const vec cross = _mm256_add_epi64(_mm256_mul_epu32(_mm256_srli_epi64(a, 32), b),
                                           _mm256_mul_epu32(a, _mm256_srli_epi64(b, 32)));
        return _mm256_add_epi64(_mm256_mul_epu32(a, b), _mm256_slli_epi64(cross, 32));
      }
    } else {
      constexpr bool is_min = Op == reduce_op::min;
      if constexpr (sizeof(T) == 1 && is_signed)
        return is_min ? _mm256_min_epi8(a, b) : _mm256_max_epi8(a, b);
      if constexpr (sizeof(T) == 1 && !is_signed)
        return is_min ? _mm256_min_epu8(a, b) : _mm256_max_epu8(a, b);
      if constexpr (sizeof(T) == 4 && is_signed)
        return is_min ? _mm256_min_epi32(a, b) : _mm256_max_epi32(a, b);
      if constexpr (sizeof(T) == 4 && !is_signed)
        return is_min ? _mm256_min_epu32(a, b) : _mm256_max_epu32(a, b);
      if constexpr (sizeof(T) == 8) {
        // Only a signed 64-bit compare exists; flipping the sign bits makes it unsigned.
        vec ka = a;
        vec kb = b;
        if constexpr (!is_signed) {
          const vec flip = _mm256_set1_epi64x(static_cast<long long>(0x8000000000000000u));
          ka = _mm256_xor_si256(a, flip);
          kb = _mm256_xor_si256(b, flip);
        }
        const vec a_greater = _mm256_cmpgt_epi64(ka, kb);
        return is_min ? _mm256_blendv_epi8(a, b, a_greater) : _mm256_blendv_epi8(b, a, a_greater);
      }
    }
  }
};

/// dst[i] = a[i] op b[i] with 256-bit vectors, four at a time, then the scalar loop for the
/// tail. No pointer is __restrict: dst may be a or b. All loads of a block come before its
/// stores and blocks do not overlap, so exact aliasing reads every element before writing it.
template <class T, reduce_op Op>
CHORUS_DETAIL_AVX2 void avx2_kernel(void* dst, const void* a, const void* b,
                                    std::size_t count) noexcept {
  using lanes = avx2_lanes<T>;
  constexpr std::size_t w = lanes::width;
  constexpr std::size_t bytes = w * sizeof(T);
  auto* d = static_cast<std::byte*>(dst);
  const auto* pa = static_cast<const std::byte*>(a);
  const auto* pb = static_cast<const std::byte*>(b);
  std::size_t i = 0;
  for (; i + 4 * w <= count; i += 4 * w) {
    const std::size_t at = i * sizeof(T);
    const auto a0 = lanes::load(pa + at);
    const auto a1 = lanes::load(pa + at + bytes);
    const auto a2 = lanes::load(pa + at + 2 * bytes);
    const auto a3 = lanes::load(pa + at + 3 * bytes);
    const auto b0 = lanes::load(pb + at);
    const auto b1 = lanes::load(pb + at + bytes);
    const auto b2 = lanes::load(pb + at + 2 * bytes);
    const auto b3 = lanes::load(pb + at + 3 * bytes);
    lanes::store(d + at, lanes::template apply<Op>(a0, b0));
    lanes::store(d + at + bytes, lanes::template apply<Op>(a1, b1));
    lanes::store(d + at + 2 * bytes, lanes::template apply<Op>(a2, b2));
    lanes::store(d + at + 3 * bytes, lanes::template apply<Op>(a3, b3));
  }
  for (; i + w <= count; i += w) {
    const std::size_t at = i * sizeof(T);
    lanes::store(d + at, lanes::template apply<Op>(lanes::load(pa + at), lanes::load(pb + at)));
  }
  const std::size_t at = i * sizeof(T);
  scalar_kernel<T, Op>(d + at, pa + at, pb + at, count - i);
}

/// data[i] /= n for a floating type; the tail goes to scalar_divide.
template <class T>
CHORUS_DETAIL_AVX2 void avx2_divide(void* data, std::size_t count, std::size_t n) noexcept {
  using lanes = avx2_lanes<T>;
  constexpr std::size_t w = lanes::width;
  const auto divisor = static_cast<typename lanes::scalar>(n);
  auto* p = static_cast<std::byte*>(data);
  std::size_t i = 0;
  for (; i + w <= count; i += w) {
    std::byte* at = p + i * sizeof(T);
    lanes::store(at, lanes::divide(lanes::load(at), divisor));
  }
  scalar_divide<T>(p + i * sizeof(T), count - i, n);
}

}  // namespace chorus::detail

#endif  // x86-64 with GNU attributes
