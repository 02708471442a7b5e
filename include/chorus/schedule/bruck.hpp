// SPDX-License-Identifier: Apache-2.0
// Bruck's all-gather, as a schedule: ceil(log2 P) steps for any number of ranks.
//
// all_gather with P ranks, S bytes (the whole gathered buffer):
//   ceil(log2 P) steps on the wire (+3 local copies, 2 on rank 0), (P-1)/P * S bytes sent
//   per rank
//     phase 1, doubling: step k sends the first min(2^k, P - 2^k) blocks held to rank r - 2^k
//              and receives as many from rank r + 2^k behind them
//     phase 2, rotation: two local copies put the blocks in rank order
// The latency of recursive doubling without its fold for non-powers of two (which costs
// two more steps and a whole extra buffer on the wire), and as few bytes as the ring; the
// price is scratch for the whole buffer and a final copy of it.
//
// Rank r works in a rotated layout in scratch: position j holds rank r+j's block, so its
// own block is position 0 and what it has after k steps is always positions [0, 2^k). The
// blocks rank r+2^k holds at positions [0, c) are the ones rank r needs at [2^k, 2^k + c).
#pragma once

#include <algorithm>
#include <cstddef>

#include "chorus/schedule/schedule.hpp"

namespace chorus {

/// Bruck all-gather: rank r contributes `block` elements; the output holds P blocks in rank
/// order. The input is read once, by the first step, and the output written only by the
/// rotation, so in place (input == output + rank * block) is the same schedule.
inline schedule bruck_all_gather(int rank, int nranks, std::size_t block) {
  schedule s = new_schedule(collective::all_gather, algo::bruck, rank, nranks);
  const int n = nranks;
  const region in{buffer_id::input, 0, block};
  auto blocks = [&](buffer_id b, int first, int count) {
    return region{b, static_cast<std::size_t>(first) * block, static_cast<std::size_t>(count) * block};
  };
  if (n == 1) {
    s.steps.push_back(step{.action = recv_action::copy, .recv_into = blocks(buffer_id::output, 0, 1),
                           .reduce_with = in});
    return s;
  }
  s.scratch_count = static_cast<std::size_t>(n) * block;
  auto rotated = [&](int first, int count) { return blocks(buffer_id::scratch, first, count); };

  // Phase 1: doubling.
  s.steps.push_back(step{.action = recv_action::copy, .recv_into = rotated(0, 1), .reduce_with = in});
  for (int d = 1; d < n; d *= 2) {
    const int c = std::min(d, n - d);
    s.steps.push_back(step{.send_peer = wrap(rank - d, n),
                           .send_from = rotated(0, c),
                           .recv_peer = wrap(rank + d, n),
                           .action = recv_action::store,
                           .recv_into = rotated(d, c)});
  }
  // Phase 2: positions [0, P-r) are ranks r..P-1, positions [P-r, P) ranks 0..r-1.
  s.steps.push_back(step{.action = recv_action::copy, .recv_into = blocks(buffer_id::output, rank, n - rank),
                         .reduce_with = rotated(0, n - rank)});
  if (rank > 0) {
    s.steps.push_back(step{.action = recv_action::copy, .recv_into = blocks(buffer_id::output, 0, rank),
                           .reduce_with = rotated(n - rank, rank)});
  }
  return s;
}

}  // namespace chorus
