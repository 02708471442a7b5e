// SPDX-License-Identifier: Apache-2.0
// Recursive halving-doubling (Rabenseifner's) all-reduce and reduce-scatter, as schedules.
//
// With P ranks, S bytes (reduce_scatter: the whole input), p = the largest power of two <= P:
//   all_reduce:     2 log2(p) steps, 2(p-1)/p * S bytes sent per rank
//     phase 2, reduce-scatter by recursive halving: log2(p) steps, (p-1)/p * S
//     phase 3, all-gather by recursive doubling:    log2(p) steps, (p-1)/p * S
//   reduce_scatter: log2(p) steps, (p-1)/p * S bytes sent per rank (phase 2 alone)
//   P not a power of two: phase 1 folds ranks 0..2e-1 (e = P - p) in pairs, each even rank
//   sending its whole buffer (S) to the odd one above it; the last phase hands each even
//   rank its result (all_reduce: S; reduce_scatter: its block). +1 step before and +1 after
//   on the odd ranks of the pairs (+1 local copy for reduce_scatter); the even ones take 2
//   steps in all.
// As few bytes as the ring, in 2 log2(p) steps instead of 2(P-1): the large-message
// algorithm for many ranks when latency matters, as long as P is near a power of two.
//
// The p taking part cut the buffer into p chunks, chunk v for virtual rank v. Recursive
// halving: at step i (distance p/2, p/4, ..., 1) a rank and its partner each hold a run of
// chunks reduced over their groups so far; each keeps the half on its side of the partner's
// virtual rank, sends the other half and reduces what it receives into the kept half. After
// log2(p) steps virtual rank v holds chunk v reduced over all ranks. Recursive doubling
// reverses the pattern, swapping ever longer runs of reduced chunks.
#pragma once

#include <cstddef>

#include "chorus/schedule/recursive_doubling.hpp"
#include "chorus/schedule/schedule.hpp"

namespace chorus {

/// Halving-doubling all-reduce of `count` elements, chunks cut as chunk_of does. Partial
/// sums live in the output: the input is read only by the fold and by the first halving
/// step, so in place (input == output) is the same schedule.
inline schedule halving_doubling_all_reduce(int rank, int nranks, std::size_t count) {
  schedule s = new_schedule(collective::all_reduce, algo::halving_doubling, rank, nranks);
  const region in{buffer_id::input, 0, count};
  const region out{buffer_id::output, 0, count};
  if (nranks == 1) {
    s.steps.push_back(step{.action = recv_action::copy, .recv_into = out, .reduce_with = in});
    return s;
  }
  const detail::power_of_two_fold fold(nranks);
  const int p = fold.p;
  // Chunks [lo, hi) of buffer b: one run, since chunk_of cuts in order.
  auto chunks = [&](buffer_id b, int lo, int hi) {
    const std::size_t first = chunk_of(b, count, p, lo).offset;
    return region{b, first, chunk_of(b, count, p, hi).offset - first};
  };

  // Phase 1: fold.
  if (fold.sits_out(rank)) {
    s.steps.push_back(step{.send_peer = rank + 1, .send_from = in});
    s.steps.push_back(step{.recv_peer = rank + 1, .action = recv_action::store, .recv_into = out});
    return s;
  }
  bool have_output = false;  // our partial sums are in the output, not the input
  if (fold.paired(rank)) {
    s.steps.push_back(step{.recv_peer = rank - 1, .action = recv_action::reduce,
                           .recv_into = out, .reduce_with = in});
    have_output = true;
  }

  // Phase 2: recursive halving; [lo, hi) is the run of chunks we still reduce.
  const int v = fold.vrank(rank);
  int lo = 0;
  int hi = p;
  for (int mask = p / 2; mask > 0; mask /= 2) {
    const int partner = fold.real(v ^ mask);
    const int mid = lo + mask;
    const bool upper = (v & mask) != 0;  // we keep the upper half
    const int keep_lo = upper ? mid : lo;
    const int keep_hi = upper ? hi : mid;
    const buffer_id src = have_output ? buffer_id::output : buffer_id::input;
    s.steps.push_back(step{.send_peer = partner,
                           .send_from = upper ? chunks(src, lo, mid) : chunks(src, mid, hi),
                           .recv_peer = partner,
                           .action = recv_action::reduce,
                           .recv_into = chunks(buffer_id::output, keep_lo, keep_hi),
                           .reduce_with = chunks(src, keep_lo, keep_hi)});
    have_output = true;
    lo = keep_lo;
    hi = keep_hi;
  }

  // Phase 3: recursive doubling; [lo, hi) is the run of reduced chunks we hold.
  for (int mask = 1; mask < p; mask *= 2) {
    const int partner = fold.real(v ^ mask);
    const bool upper = (v & mask) != 0;  // the partner's run lies below ours
    const int plo = upper ? lo - mask : hi;
    const int phi = upper ? lo : hi + mask;
    s.steps.push_back(step{.send_peer = partner,
                           .send_from = chunks(buffer_id::output, lo, hi),
                           .recv_peer = partner,
                           .action = recv_action::store,
                           .recv_into = chunks(buffer_id::output, plo, phi)});
    lo = upper ? plo : lo;
    hi = upper ? hi : phi;
  }

  // Phase 4: hand the result to the rank that sat out.
  if (fold.paired(rank)) s.steps.push_back(step{.send_peer = rank - 1, .send_from = out});
  return s;
}

/// Halving-doubling reduce-scatter: the input holds P blocks of `block` elements; rank r
/// ends with block r reduced over all ranks in its output (`block` elements).
///
/// Chunk v is the blocks of the real ranks virtual rank v stands for (two for a pair, one
/// otherwise), so halving leaves every block where it belongs: virtual rank v ends with the
/// blocks of ranks first_rank(v) .. first_rank(v + 1) - 1, and a pair's odd rank sends
/// its partner's block on. Partial sums live in scratch, which holds the run of blocks kept
/// after the first halving step (a pair's odd rank: all P blocks, since the fold sums the
/// whole input). The output is written only by the last step, so in place (output == input
/// + rank * block) every input block is read before it is overwritten.
inline schedule halving_doubling_reduce_scatter(int rank, int nranks, std::size_t block) {
  schedule s = new_schedule(collective::reduce_scatter, algo::halving_doubling, rank, nranks);
  // Blocks [first, last) of the input.
  auto in = [&](int first, int last) {
    return region{buffer_id::input, static_cast<std::size_t>(first) * block,
                  static_cast<std::size_t>(last - first) * block};
  };
  const region out{buffer_id::output, 0, block};
  if (nranks == 1) {
    s.steps.push_back(step{.action = recv_action::copy, .recv_into = out, .reduce_with = in(0, 1)});
    return s;
  }
  const detail::power_of_two_fold fold(nranks);
  const int p = fold.p;

  // Phase 1: fold.
  if (fold.sits_out(rank)) {
    s.steps.push_back(step{.send_peer = rank + 1, .send_from = in(0, nranks)});
    s.steps.push_back(step{.recv_peer = rank + 1, .action = recv_action::store, .recv_into = out});
    return s;
  }
  const bool paired = fold.paired(rank);
  const int v = fold.vrank(rank);
  // Scratch holds blocks [base, base + scratch blocks) of the input's layout.
  int base = 0;
  if (paired) {
    s.scratch_count = static_cast<std::size_t>(nranks) * block;
  } else if (p > 2) {  // with p == 2 the only step writes the output
    const bool upper = (v & (p / 2)) != 0;
    base = fold.first_rank(upper ? p / 2 : 0);
    const int last = fold.first_rank(upper ? p : p / 2);
    s.scratch_count = static_cast<std::size_t>(last - base) * block;
  }
  auto tmp = [&](int first, int last) {
    return region{buffer_id::scratch, static_cast<std::size_t>(first - base) * block,
                  static_cast<std::size_t>(last - first) * block};
  };
  bool in_scratch = false;  // our partial sums are in scratch, not the input
  if (paired) {
    s.steps.push_back(step{.recv_peer = rank - 1, .action = recv_action::reduce,
                           .recv_into = tmp(0, nranks), .reduce_with = in(0, nranks)});
    in_scratch = true;
  }
  // The blocks of virtual ranks [lo, hi), where our partial sums are.
  auto partial = [&](int lo, int hi) {
    const int first = fold.first_rank(lo);
    const int last = fold.first_rank(hi);
    return in_scratch ? tmp(first, last) : in(first, last);
  };

  // Phase 2: recursive halving; [lo, hi) is the run of virtual ranks' blocks we reduce.
  int lo = 0;
  int hi = p;
  for (int mask = p / 2; mask > 0; mask /= 2) {
    const int partner = fold.real(v ^ mask);
    const int mid = lo + mask;
    const bool upper = (v & mask) != 0;
    const int keep_lo = upper ? mid : lo;
    const int keep_hi = upper ? hi : mid;
    const bool last = mask == 1;
    const region into = last && !paired ? out
                                        : tmp(fold.first_rank(keep_lo), fold.first_rank(keep_hi));
    s.steps.push_back(step{.send_peer = partner,
                           .send_from = upper ? partial(lo, mid) : partial(mid, hi),
                           .recv_peer = partner,
                           .action = recv_action::reduce,
                           .recv_into = into,
                           .reduce_with = partial(keep_lo, keep_hi)});
    in_scratch = true;
    lo = keep_lo;
    hi = keep_hi;
  }

  // Phase 3: a pair's odd rank holds blocks rank - 1 and rank.
  if (paired) {
    s.steps.push_back(step{.send_peer = rank - 1, .send_from = tmp(rank - 1, rank)});
    s.steps.push_back(step{.action = recv_action::copy, .recv_into = out,
                           .reduce_with = tmp(rank, rank + 1)});
  }
  return s;
}

}  // namespace chorus
