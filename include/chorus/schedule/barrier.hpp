// SPDX-License-Identifier: Apache-2.0
// Dissemination barrier, as a schedule: no rank leaves before every rank has arrived.
//
// barrier with P ranks: ceil(log2 P) steps, ceil(log2 P) empty messages sent per rank.
// Round k sends an empty message to rank r + 2^k and receives one from rank r - 2^k. After
// round k, rank r has heard, directly or through the ranks it heard from, from ranks r-1 ..
// r-(2^(k+1)-1): after ceil(log2 P) rounds, from every rank, so its last receive cannot
// complete before every rank has entered the barrier. Unlike a gather to a root and a
// broadcast back (2 log2 P hops), every rank is done after log2 P hops, and no rank is hot.
#pragma once

#include "chorus/schedule/schedule.hpp"

namespace chorus {

/// Dissemination barrier. Its messages are empty regions of the output (barrier has no data).
inline schedule dissemination_barrier(int rank, int nranks) {
  schedule s = new_schedule(collective::barrier, algo::dissemination, rank, nranks);
  for (int d = 1; d < nranks; d *= 2) {
    s.steps.push_back(step{.send_peer = wrap(rank + d, nranks), .send_from = {},
                           .recv_peer = wrap(rank - d, nranks), .action = recv_action::store,
                           .recv_into = {}});
  }
  return s;
}

}  // namespace chorus
