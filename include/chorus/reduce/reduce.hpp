// SPDX-License-Identifier: Apache-2.0
// Element-wise reduction of two type-erased buffers: the arithmetic every collective ends in.
#pragma once

#include <cstddef>

#include "chorus/reduce/detail/kernels.hpp"
#include "chorus/types.hpp"

namespace chorus {

/// Computes dst[i] = a[i] op b[i] for i < count, elements of one fixed dtype.
///
/// Contract, each point with its reason:
///  1. dst may be the same pointer as a or as b, but must not overlap either partially: the
///     executor reduces into its receive or accumulation buffer in place.
///  2. Pointers may have any byte alignment: slices of a user's buffer start wherever the
///     chunking puts them. Kernels use unaligned loads and stores, never a misaligned T*.
///  3. float and double follow IEEE 754 (round to nearest even, no flush-to-zero of our own).
///     half and bfloat16 are widened to float exactly, combined in float and rounded to nearest,
///     ties to even, bit-identical to to_half / to_bfloat16 in types.hpp (subnormals, overflow
///     to infinity included): the vector and scalar paths, and every rank, must agree.
///  4. Every floating NaN result is one canonical positive quiet NaN (0x7fc00000, 0x7ff8...,
///     half 0x7e00, bfloat16 0x7fc0). Hardware propagates the first operand's payload, so
///     without this a op b and b op a could differ in their bits between ranks.
///  5. Floating min and max are commutative bit for bit: NaN if either operand is NaN (a
///     diverged value must not be hidden, as std::fmin would), min(-0, +0) = -0 and
///     max(-0, +0) = +0 in either order. Ranks that combine in different orders (halving-
///     doubling, trees) must end with identical bytes.
///  6. Integer sum and prod wrap modulo 2^bits, computed in the unsigned type so there is no
///     signed-overflow UB; min and max compare with the type's signedness.
using reduce_fn = void (*)(void* dst, const void* a, const void* b, std::size_t count) noexcept;

/// Returns the fastest kernel this CPU runs for (t, op): AVX2 + F16C when present (detected
/// once at run time), otherwise portable scalar code. avg returns the sum kernel: an average is
/// a sum followed by divide_by once every rank's contribution is in. Returns nullptr when t or
/// op is out of range.
///
/// **Example**:
///   chorus::reduce_fn add = chorus::reduce_function(chorus::dtype::float32, chorus::sum);
///   add(acc.data(), acc.data(), incoming.data(), acc.size());  // acc += incoming
inline reduce_fn reduce_function(dtype t, reduce_op op) noexcept {
  return detail::select_kernel(t, op, detail::cpu_has_avx2());
}

/// dst[i] = a[i] op b[i] through reduce_function(t, op). Writes nothing if t or op is out of
/// range (the communicator rejects those before any data moves).
inline void reduce(dtype t, reduce_op op, void* dst, const void* a, const void* b,
                   std::size_t count) noexcept {
  if (const reduce_fn kernel = reduce_function(t, op)) kernel(dst, a, b, count);
}

/// Divides count elements of floating dtype t in place by n (n >= 1): the last step of avg.
/// half and bfloat16 are divided in float and rounded to nearest even; NaN results are the
/// canonical NaN, as in point 4 above. Integer dtypes are left untouched (an integer average
/// would truncate, so the communicator rejects avg on them).
///
/// **Example**:
///   chorus::reduce(chorus::dtype::float16, chorus::avg, acc, acc, incoming, count);  // sum
///   chorus::divide_by(chorus::dtype::float16, acc, count, 2);                        // halve
inline void divide_by(dtype t, void* data, std::size_t count, std::size_t n) noexcept {
  detail::divide(t, data, count, n, detail::cpu_has_avx2());
}

}  // namespace chorus
