// SPDX-License-Identifier: Apache-2.0
// Pipelined chain broadcast and reduce, as schedules: root -> root+1 -> ... -> root-1, and
// the other way for reduce.
//
// With P ranks and S bytes:
//   broadcast: 2 steps per rank, S bytes sent per rank (the last rank in the chain sends
//              nothing); P-1 hops
//   reduce:    at most 2 steps per rank, S bytes sent per rank (the root sends nothing);
//              P-1 hops
// Each rank receives the whole buffer from one neighbour and sends it to the other, and the
// executor forwards every slice as soon as it has landed (schedule.hpp), so with k slices
// the time is about (P - 1 + k) slice times: bandwidth-optimal for large buffers, every
// link used once, but latency linear in P (binomial.hpp has log2 P).
#pragma once

#include <cstddef>

#include "chorus/schedule/schedule.hpp"

namespace chorus {

/// Chain broadcast of the root's `count` input elements to every rank's output. The root
/// sends from its input and copies it to its output (nothing to copy in place), so the two
/// run at once.
inline schedule chain_broadcast(int rank, int nranks, std::size_t count, int root) {
  schedule s = new_schedule(collective::broadcast, algo::chain, rank, nranks, root);
  const region in{buffer_id::input, 0, count};
  const region out{buffer_id::output, 0, count};
  const int v = wrap(rank - root, nranks);  // our place in the chain
  const int next = wrap(rank + 1, nranks);
  if (v == 0) {
    if (nranks > 1) s.steps.push_back(step{.send_peer = next, .send_from = in});
    s.steps.push_back(step{.action = recv_action::copy, .recv_into = out, .reduce_with = in});
    return s;
  }
  s.steps.push_back(step{.recv_peer = wrap(rank - 1, nranks), .action = recv_action::store,
                         .recv_into = out});
  if (v < nranks - 1) s.steps.push_back(step{.send_peer = next, .send_from = out});
  return s;
}

/// Chain reduce of every rank's `count` input elements into the root's output. The sum
/// starts at the far end of the chain, rank root-1, and flows toward the root; ranks
/// between keep their running sum in scratch, since only the root has an output.
inline schedule chain_reduce(int rank, int nranks, std::size_t count, int root) {
  schedule s = new_schedule(collective::reduce, algo::chain, rank, nranks, root);
  const region in{buffer_id::input, 0, count};
  const region out{buffer_id::output, 0, count};
  const region partial{buffer_id::scratch, 0, count};
  const int v = wrap(rank - root, nranks);
  const int prev = wrap(rank - 1, nranks);  // toward the root
  const int next = wrap(rank + 1, nranks);  // away from it
  if (nranks == 1) {
    s.steps.push_back(step{.action = recv_action::copy, .recv_into = out, .reduce_with = in});
  } else if (v == 0) {
    s.steps.push_back(step{.recv_peer = next, .action = recv_action::reduce, .recv_into = out,
                           .reduce_with = in});
  } else if (v == nranks - 1) {
    s.steps.push_back(step{.send_peer = prev, .send_from = in});
  } else {
    s.scratch_count = count;
    s.steps.push_back(step{.recv_peer = next, .action = recv_action::reduce, .recv_into = partial,
                           .reduce_with = in});
    s.steps.push_back(step{.send_peer = prev, .send_from = partial});
  }
  return s;
}

}  // namespace chorus
