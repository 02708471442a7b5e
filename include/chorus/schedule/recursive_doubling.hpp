// SPDX-License-Identifier: Apache-2.0
// Recursive-doubling all-reduce and all-gather, as schedules: the small-message algorithms.
//
// With P ranks, S bytes (all_gather: the whole gathered buffer), p = the largest power of
// two <= P:
//   all_reduce: log2(p) steps, log2(p) * S bytes sent per rank
//   all_gather: log2(p) steps (+1 local copy), (p-1)/p * S bytes sent per rank
//   P not a power of two: +1 step before and +1 after on ranks 0..2(P-p)-1 (below)
// Every rank exchanges with the rank whose number differs in bit i, so the latency term is
// log2(P) instead of the ring's P-1 or 2(P-1). All-reduce exchanges the whole buffer every
// time, log2(P) times the ring's 2(P-1)/P, which is why the ring takes over for large
// messages; all-gather exchanges what it holds so far (1, 2, 4, ... blocks), as few bytes
// as the ring.
//
// Non-powers of two (P = p + e), phase 1, fold: among ranks 0..2e-1, each even rank sends
// its buffer (all_gather: its block) to the odd rank above it and sits out; phase 2, the p
// remaining ranks run recursive doubling; phase 3, each odd rank hands the result (the
// whole buffer) to its even partner.
//
// Every rank must end with the same bits. Each all-reduce exchange computes a (op) b on one
// side and b (op) a on the other; the reductions are commutative bit for bit (see
// reduce.hpp), so the two sides agree at every step, and so do all ranks at the end.
#pragma once

#include <bit>
#include <cstddef>

#include "chorus/schedule/schedule.hpp"

namespace chorus {

namespace detail {

/// How the recursive algorithms run on P = p + e ranks, p = the largest power of two <= P:
/// ranks 0..2e-1 pair up, the even rank of each pair folds into the odd one above it, and
/// the p ranks left take part as virtual ranks 0..p-1. Virtual rank v stands for the real
/// ranks [first_rank(v), first_rank(v + 1)): two ranks for v < e, one after, in rank order,
/// so a run of virtual ranks stands for a run of real ranks (and of their blocks).
struct power_of_two_fold {
  int p = 1;
  int extra = 0;

  explicit power_of_two_fold(int nranks)
      : p(static_cast<int>(std::bit_floor(static_cast<unsigned>(nranks)))), extra(nranks - p) {}

  /// Even ranks of the pairs: they fold into rank + 1 and wait for the result.
  bool sits_out(int r) const { return r < 2 * extra && r % 2 == 0; }
  /// Odd ranks of the pairs: they take part for themselves and for rank - 1.
  bool paired(int r) const { return r < 2 * extra && r % 2 == 1; }
  /// The virtual rank of a rank that takes part.
  int vrank(int r) const { return r < 2 * extra ? r / 2 : r - extra; }
  /// The real rank that takes part as virtual rank v.
  int real(int v) const { return v < extra ? 2 * v + 1 : v + extra; }
  /// The lowest real rank virtual rank v stands for; first_rank(p) is P.
  int first_rank(int v) const { return v < extra ? 2 * v : v + extra; }
};

}  // namespace detail

inline schedule recursive_doubling_all_reduce(int rank, int nranks, std::size_t count) {
  schedule s = new_schedule(collective::all_reduce, algo::recursive_doubling, rank, nranks);
  const region in{buffer_id::input, 0, count};
  const region out{buffer_id::output, 0, count};
  const detail::power_of_two_fold fold(nranks);

  // Phase 1: fold the extra ranks in.
  if (fold.sits_out(rank)) {
    s.steps.push_back(step{.send_peer = rank + 1, .send_from = in});
    // ... and wait for the result in phase 3.
    s.steps.push_back(step{.recv_peer = rank + 1, .action = recv_action::store,
                           .recv_into = out});
    return s;
  }
  bool have_output = false;  // the fold already wrote our output
  if (fold.paired(rank)) {
    s.steps.push_back(step{.recv_peer = rank - 1, .action = recv_action::reduce,
                           .recv_into = out, .reduce_with = in});
    have_output = true;
  }
  const int vrank = fold.vrank(rank);

  // Phase 2: exchange and reduce with the partner across bit i.
  for (int mask = 1; mask < fold.p; mask <<= 1) {
    const int partner = fold.real(vrank ^ mask);
    const region src = have_output ? out : in;
    s.steps.push_back(step{.send_peer = partner, .send_from = src, .recv_peer = partner,
                           .action = recv_action::reduce, .recv_into = out,
                           .reduce_with = src});
    have_output = true;
  }
  if (!have_output) {  // P == 1
    s.steps.push_back(step{.action = recv_action::copy, .recv_into = out, .reduce_with = in});
  }

  // Phase 3: hand the result back to the rank that sat out.
  if (fold.paired(rank)) s.steps.push_back(step{.send_peer = rank - 1, .send_from = out});
  return s;
}

/// Recursive-doubling all-gather: rank r contributes `block` elements; the output holds P
/// blocks in rank order. At step i a rank holds the blocks of its aligned group of 2^i
/// virtual ranks, one run of the output, and swaps it for the partner group's run.
inline schedule recursive_doubling_all_gather(int rank, int nranks, std::size_t block) {
  schedule s = new_schedule(collective::all_gather, algo::recursive_doubling, rank, nranks);
  const detail::power_of_two_fold fold(nranks);
  const region in{buffer_id::input, 0, block};
  // The blocks of real ranks [first, last).
  auto out = [&](int first, int last) {
    return region{buffer_id::output, static_cast<std::size_t>(first) * block,
                  static_cast<std::size_t>(last - first) * block};
  };
  // The blocks virtual ranks [lo, hi) stand for.
  auto group = [&](int lo, int hi) { return out(fold.first_rank(lo), fold.first_rank(hi)); };

  // Phase 1: fold. A rank that sits out gets the whole output, its own block included, in
  // phase 3, so it copies nothing (in place, its input is overwritten only then).
  if (fold.sits_out(rank)) {
    s.steps.push_back(step{.send_peer = rank + 1, .send_from = in});
    s.steps.push_back(step{.recv_peer = rank + 1, .action = recv_action::store,
                           .recv_into = out(0, nranks)});
    return s;
  }
  s.steps.push_back(step{.action = recv_action::copy, .recv_into = out(rank, rank + 1),
                         .reduce_with = in});
  if (fold.paired(rank)) {
    s.steps.push_back(step{.recv_peer = rank - 1, .action = recv_action::store,
                           .recv_into = out(rank - 1, rank)});
  }

  // Phase 2: double the group held, [lo, hi) in virtual ranks, with the partner's.
  const int v = fold.vrank(rank);
  int lo = v;
  int hi = v + 1;
  for (int mask = 1; mask < fold.p; mask <<= 1) {
    const int partner = fold.real(v ^ mask);
    const bool upper = (v & mask) != 0;  // the partner's group lies below ours
    const int plo = upper ? lo - mask : hi;
    const int phi = upper ? lo : hi + mask;
    s.steps.push_back(step{.send_peer = partner, .send_from = group(lo, hi), .recv_peer = partner,
                           .action = recv_action::store, .recv_into = group(plo, phi)});
    lo = upper ? plo : lo;
    hi = upper ? hi : phi;
  }

  // Phase 3: hand the whole output to the rank that sat out.
  if (fold.paired(rank)) s.steps.push_back(step{.send_peer = rank - 1, .send_from = out(0, nranks)});
  return s;
}

}  // namespace chorus
