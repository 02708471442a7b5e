// SPDX-License-Identifier: Apache-2.0
// Dissemination barrier, as a schedule: no rank leaves before every rank has arrived.
//
// barrier with P ranks: ceil(log2 P) steps, one element sent per step.
// Round k sends a one-byte token to rank r + 2^k and folds the token of rank r - 2^k into
// its own. After round k, rank r's token carries, directly or through the ranks it heard
// from, ranks r-1 .. r-(2^(k+1)-1): after ceil(log2 P) rounds, every rank, so its last
// receive cannot complete before every rank has entered the barrier. Unlike a gather to a
// root and a broadcast back (2 log2 P hops), every rank is done after log2 P hops, and no
// rank is hot.
//
// The token is there for the executor, not for its value: the executor orders steps only by
// the bytes they share, and runs steps with different peers at once. Empty messages would
// leave round k's send free to go before round k-1's receive, and a rank could leave having
// heard from a few ranks only. Sending the token that round k-1 folded into makes each send
// wait for the receive before it, which is the barrier.
#pragma once

#include "chorus/schedule/schedule.hpp"

namespace chorus {

/// Dissemination barrier over a one-element token in scratch (barrier has no data; the
/// token's value is whatever the scratch holds).
inline schedule dissemination_barrier(int rank, int nranks) {
  schedule s = new_schedule(collective::barrier, algo::dissemination, rank, nranks);
  const region token{buffer_id::scratch, 0, 1};
  if (nranks > 1) s.scratch_count = 1;
  for (int d = 1; d < nranks; d *= 2) {
    s.steps.push_back(step{.send_peer = wrap(rank + d, nranks), .send_from = token,
                           .recv_peer = wrap(rank - d, nranks), .action = recv_action::reduce,
                           .recv_into = token, .reduce_with = token});
  }
  return s;
}

}  // namespace chorus
