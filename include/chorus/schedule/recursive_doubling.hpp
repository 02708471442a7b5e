// SPDX-License-Identifier: Apache-2.0
// Recursive-doubling all-reduce, as a schedule: the small-message algorithm.
//
// all_reduce with P ranks, S bytes, p = the largest power of two <= P:
//   log2(p) steps (+2 when P is not a power of two), log2(p) * S bytes sent per rank.
// Every rank exchanges its whole buffer with the rank whose number differs in bit i, so the
// latency term is log2(P) instead of the ring's 2(P-1); the bandwidth term is log2(P) times
// the ring's 2(P-1)/P, which is why the ring takes over for large messages.
//
// Non-powers of two (P = p + e): first, among ranks 0..2e-1, each even rank sends its buffer
// to the odd rank above it and sits out; the p remaining ranks run recursive doubling; last,
// each odd rank returns the result to its even partner.
//
// Every rank must end with the same bits. Each exchange computes a (op) b on one side and
// b (op) a on the other; the reductions are commutative bit for bit (see reduce.hpp), so the
// two sides agree at every step, and so do all ranks at the end.
#pragma once

#include <bit>
#include <cstddef>

#include "chorus/schedule/schedule.hpp"

namespace chorus {

inline schedule recursive_doubling_all_reduce(int rank, int nranks, std::size_t count) {
  schedule s = new_schedule(collective::all_reduce, algo::recursive_doubling, rank, nranks);
  const region in{buffer_id::input, 0, count};
  const region out{buffer_id::output, 0, count};
  const int p = static_cast<int>(std::bit_floor(static_cast<unsigned>(nranks)));
  const int extra = nranks - p;

  // Phase 1: fold the extra ranks in.
  int vrank = -1;  // our rank among the p participants, -1 if we sit out
  if (rank < 2 * extra) {
    if (rank % 2 == 0) {
      s.steps.push_back(step{.send_peer = rank + 1, .send_from = in});
      // ... and wait for the result in phase 3.
      s.steps.push_back(step{.recv_peer = rank + 1, .action = recv_action::store,
                             .recv_into = out});
      return s;
    }
    s.steps.push_back(step{.recv_peer = rank - 1, .action = recv_action::reduce,
                           .recv_into = out, .reduce_with = in});
    vrank = rank / 2;
  } else {
    vrank = rank - extra;
  }
  auto real = [&](int v) { return v < extra ? 2 * v + 1 : v + extra; };

  // Phase 2: exchange and reduce with the partner across bit i.
  bool have_output = rank < 2 * extra;  // the fold already wrote our output
  for (int mask = 1; mask < p; mask <<= 1) {
    const int partner = real(vrank ^ mask);
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
  if (rank < 2 * extra) s.steps.push_back(step{.send_peer = rank - 1, .send_from = out});
  return s;
}

}  // namespace chorus
