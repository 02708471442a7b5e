// SPDX-License-Identifier: Apache-2.0
// Ring reduce-scatter, all-gather and all-reduce, as schedules.
//
// With P ranks and S bytes (the whole buffer):
//   reduce_scatter: P-1 steps, (P-1)/P * S bytes sent per rank
//   all_gather:     P-1 steps, (P-1)/P * S bytes sent per rank
//   all_reduce:     2(P-1) steps, 2(P-1)/P * S bytes sent per rank
// Every step sends one chunk to the right neighbour and receives one from the left, so all
// links are busy at once and no rank sends more than its share: bandwidth-optimal, but the
// latency term grows linearly with P (recursive doubling wins for small messages).
#pragma once

#include <cstddef>

#include "chorus/schedule/schedule.hpp"

namespace chorus {

/// Ring all-reduce of `count` elements. Rank r ends the reduce-scatter phase owning chunk
/// r+1 fully reduced; the all-gather phase then circulates the owned chunks.
inline schedule ring_all_reduce(int rank, int nranks, std::size_t count) {
  schedule s = new_schedule(collective::all_reduce, algo::ring, rank, nranks);
  const int n = nranks;
  if (n == 1) {
    s.steps.push_back(step{.action = recv_action::copy,
                           .recv_into = {buffer_id::output, 0, count},
                           .reduce_with = {buffer_id::input, 0, count}});
    return s;
  }
  const int right = wrap(rank + 1, n);
  const int left = wrap(rank - 1, n);
  auto in = [&](int c) { return chunk_of(buffer_id::input, count, n, wrap(c, n)); };
  auto out = [&](int c) { return chunk_of(buffer_id::output, count, n, wrap(c, n)); };

  // Phase 1, reduce-scatter: step k sends the partial sum of chunk r-k (the input itself at
  // k = 0) and adds the left neighbour's partial of chunk r-k-1 to our input chunk, writing
  // the output buffer, so the input is never modified (out-of-place costs nothing extra).
  for (int k = 0; k < n - 1; ++k) {
    s.steps.push_back(step{.send_peer = right,
                           .send_from = k == 0 ? in(rank - k) : out(rank - k),
                           .recv_peer = left,
                           .action = recv_action::reduce,
                           .recv_into = out(rank - k - 1),
                           .reduce_with = in(rank - k - 1)});
  }
  // Phase 2, all-gather: step k forwards chunk r+1-k (ours, fully reduced, at k = 0) and
  // stores chunk r-k from the left.
  for (int k = 0; k < n - 1; ++k) {
    s.steps.push_back(step{.send_peer = right,
                           .send_from = out(rank + 1 - k),
                           .recv_peer = left,
                           .action = recv_action::store,
                           .recv_into = out(rank - k)});
  }
  return s;
}

/// Ring reduce-scatter: the input holds P blocks of `block` elements; rank r ends with block r
/// reduced over all ranks in its output (`block` elements). Running partial sums live in two
/// scratch slots used alternately: the slot written at step k is sent at step k+1 while the
/// other slot receives, so scratch is 2 blocks, never the whole input.
inline schedule ring_reduce_scatter(int rank, int nranks, std::size_t block) {
  schedule s = new_schedule(collective::reduce_scatter, algo::ring, rank, nranks);
  const int n = nranks;
  auto in = [&](int c) {
    return region{buffer_id::input, static_cast<std::size_t>(wrap(c, n)) * block, block};
  };
  if (n == 1) {
    s.steps.push_back(step{.action = recv_action::copy,
                           .recv_into = {buffer_id::output, 0, block},
                           .reduce_with = in(0)});
    return s;
  }
  s.scratch_count = 2 * block;
  const int right = wrap(rank + 1, n);
  const int left = wrap(rank - 1, n);
  auto slot = [&](int k) {
    return region{buffer_id::scratch, static_cast<std::size_t>(k % 2) * block, block};
  };
  // Step k sends the partial of block r-k-1 and receives the partial of block r-k-2; the
  // last step (k = P-2) receives block r itself and writes it to the output.
  for (int k = 0; k < n - 1; ++k) {
    const bool last = k == n - 2;
    s.steps.push_back(step{.send_peer = right,
                           .send_from = k == 0 ? in(rank - 1) : slot(k - 1),
                           .recv_peer = left,
                           .action = recv_action::reduce,
                           .recv_into = last ? region{buffer_id::output, 0, block} : slot(k),
                           .reduce_with = in(rank - k - 2)});
  }
  return s;
}

/// Ring all-gather: rank r contributes `block` elements; the output holds P blocks in rank
/// order. A local copy places our own block; step k forwards block r-k and stores r-k-1.
inline schedule ring_all_gather(int rank, int nranks, std::size_t block) {
  schedule s = new_schedule(collective::all_gather, algo::ring, rank, nranks);
  const int n = nranks;
  auto out = [&](int c) {
    return region{buffer_id::output, static_cast<std::size_t>(wrap(c, n)) * block, block};
  };
  s.steps.push_back(step{.action = recv_action::copy,
                         .recv_into = out(rank),
                         .reduce_with = {buffer_id::input, 0, block}});
  const int right = wrap(rank + 1, n);
  const int left = wrap(rank - 1, n);
  for (int k = 0; k < n - 1; ++k) {
    s.steps.push_back(step{.send_peer = right,
                           .send_from = k == 0 ? region{buffer_id::input, 0, block}
                                               : out(rank - k),
                           .recv_peer = left,
                           .action = recv_action::store,
                           .recv_into = out(rank - k - 1)});
  }
  return s;
}

}  // namespace chorus
