// SPDX-License-Identifier: Apache-2.0
// Picks a reduction kernel for a (dtype, op) pair: AVX2 when the CPU has it, scalar otherwise.
#pragma once

#include <cstddef>

#include "chorus/reduce/detail/avx2.hpp"
#if defined(CHORUS_DETAIL_HAS_AVX2)
#include <cpuid.h>
#endif
#include "chorus/reduce/detail/scalar.hpp"
#include "chorus/types.hpp"

namespace chorus::detail {

/// True when this CPU (and OS) can run the AVX2 + F16C kernels. Every x86 CPU with AVX2 also
/// has F16C, but virtual machines may mask either, so both are checked. Asked once; a
/// function-local static keeps the header free of global constructors, and __builtin_cpu_init
/// makes the answer right even if the first call happens inside another static initialiser.
/// F16C is read with cpuid because clang 14's __builtin_cpu_supports does not know "f16c";
/// the avx2 check already covers the OS saving the 256-bit registers.
inline bool cpu_has_avx2() noexcept {
#if defined(CHORUS_DETAIL_HAS_AVX2)
  static const bool has = [] {
    __builtin_cpu_init();
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
    return __builtin_cpu_supports("avx2") && f16c;
  }();
  return has;
#else
  return false;
#endif
}

template <class T, reduce_op Op>
kernel_fn kernel_for(bool vectorised) noexcept {
#if defined(CHORUS_DETAIL_HAS_AVX2)
  if (vectorised) return &avx2_kernel<T, Op>;
#else
  (void)vectorised;
#endif
  return &scalar_kernel<T, Op>;
}

template <class T>
kernel_fn kernel_for(reduce_op op, bool vectorised) noexcept {
  switch (op) {
    case reduce_op::sum:
    case reduce_op::avg: return kernel_for<T, reduce_op::sum>(vectorised);
    case reduce_op::prod: return kernel_for<T, reduce_op::prod>(vectorised);
    case reduce_op::min: return kernel_for<T, reduce_op::min>(vectorised);
    case reduce_op::max: return kernel_for<T, reduce_op::max>(vectorised);
  }
  return nullptr;
}

/// The kernel for (t, op), vectorised or not; nullptr if either is out of range. Tests call it
/// with vectorised = false to check the portable path on machines that have AVX2.
inline kernel_fn select_kernel(dtype t, reduce_op op, bool vectorised) noexcept {
  switch (t) {
    case dtype::float32: return kernel_for<float>(op, vectorised);
    case dtype::float64: return kernel_for<double>(op, vectorised);
    case dtype::float16: return kernel_for<half>(op, vectorised);
    case dtype::bfloat16: return kernel_for<bfloat16>(op, vectorised);
    case dtype::int8: return kernel_for<std::int8_t>(op, vectorised);
    case dtype::uint8: return kernel_for<std::uint8_t>(op, vectorised);
    case dtype::int32: return kernel_for<std::int32_t>(op, vectorised);
    case dtype::uint32: return kernel_for<std::uint32_t>(op, vectorised);
    case dtype::int64: return kernel_for<std::int64_t>(op, vectorised);
    case dtype::uint64: return kernel_for<std::uint64_t>(op, vectorised);
  }
  return nullptr;
}

template <class T>
void divide_as(void* data, std::size_t count, std::size_t n, bool vectorised) noexcept {
#if defined(CHORUS_DETAIL_HAS_AVX2)
  if (vectorised) return avx2_divide<T>(data, count, n);
#else
  (void)vectorised;
#endif
  scalar_divide<T>(data, count, n);
}

/// divide_by, vectorised or not. Integer and invalid dtypes are left untouched.
inline void divide(dtype t, void* data, std::size_t count, std::size_t n,
                   bool vectorised) noexcept {
  switch (t) {
    case dtype::float32: return divide_as<float>(data, count, n, vectorised);
    case dtype::float64: return divide_as<double>(data, count, n, vectorised);
    case dtype::float16: return divide_as<half>(data, count, n, vectorised);
    case dtype::bfloat16: return divide_as<bfloat16>(data, count, n, vectorised);
    default: return;
  }
}

}  // namespace chorus::detail
