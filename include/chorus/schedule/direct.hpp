// SPDX-License-Identifier: Apache-2.0
// Direct collectives, as schedules: every block goes straight from the rank that has it to
// the rank that needs it, in P-1 concurrent exchanges with every peer.
//
// With P ranks, S bytes (the whole buffer; all_to_all, gather and scatter: P blocks of B):
//   all_reduce:     2 rounds of P-1 exchanges, 2(P-1)/P * S bytes sent per rank
//   reduce_scatter: 1 round of P-1 exchanges, (P-1)/P * S bytes sent per rank
//   all_gather:     1 round of P-1 exchanges (+1 local copy), (P-1)/P * S bytes sent per rank
//   all_to_all:     P-1 steps (+1 local copy), (P-1)/P * S bytes sent per rank
//   all_to_allv:    P-1 steps (+1 local copy), the elements sent to other ranks
//   gather:         the root receives (P-1) * B in P-1 steps (+1 local copy); others send B in 1
//   scatter:        the root sends (P-1) * B in P-1 steps (+1 local copy); others receive B in 1
// No byte travels twice, so these are bandwidth-optimal; the latency term is P-1 messages
// per round, all in flight at once.
//
// Why all-reduce has a direct form besides the ring: on shared memory a transport can let the
// receiver read a sent buffer straight out of the sender's memory (one copy per byte instead
// of two through a ring; see concepts.hpp, transfer::exposable). That pays only where the
// sender has nothing else to do with the bytes until they are read, which holds for direct
// steps and not for a ring's, whose every step forwards what the last one received. The
// executor exposes the sends of direct (and hierarchical) schedules.
//
// Every exchange runs in rounds: in round k, rank r sends to r+k and receives from r-k, so
// every rank sends one block and receives one block per round and no rank is the target of
// two senders at once.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "chorus/schedule/schedule.hpp"

namespace chorus {

/// Direct reduce-scatter: rank r ends with block r (`block` elements) reduced. Round k sends
/// block r+k of our input to its owner and adds rank r-k's copy of block r to ours, so every
/// rank reduces only its own block, reading each peer's copy once. In place (output ==
/// input + r * block) the first round reduces into the input's block r, which no peer reads.
inline schedule direct_reduce_scatter(int rank, int nranks, std::size_t block) {
  schedule s = new_schedule(collective::reduce_scatter, algo::direct, rank, nranks);
  auto in = [&](int j) { return region{buffer_id::input, static_cast<std::size_t>(j) * block, block}; };
  const region out{buffer_id::output, 0, block};
  if (nranks == 1) {
    s.steps.push_back(step{.action = recv_action::copy, .recv_into = out, .reduce_with = in(rank)});
    return s;
  }
  for (int k = 1; k < nranks; ++k) {
    const int to = wrap(rank + k, nranks);
    s.steps.push_back(step{.send_peer = to, .send_from = in(to), .recv_peer = wrap(rank - k, nranks),
                           .action = recv_action::reduce, .recv_into = out,
                           .reduce_with = k == 1 ? in(rank) : out});
  }
  return s;
}

/// Direct all-gather: our `block` input elements go to every peer, and each peer's block
/// lands at its place in our output. In place (input == output + r * block) the copy does
/// nothing.
inline schedule direct_all_gather(int rank, int nranks, std::size_t block) {
  schedule s = new_schedule(collective::all_gather, algo::direct, rank, nranks);
  auto out = [&](int j) { return region{buffer_id::output, static_cast<std::size_t>(j) * block, block}; };
  const region in{buffer_id::input, 0, block};
  s.steps.push_back(step{.action = recv_action::copy, .recv_into = out(rank), .reduce_with = in});
  for (int k = 1; k < nranks; ++k) {
    const int from = wrap(rank - k, nranks);
    s.steps.push_back(step{.send_peer = wrap(rank + k, nranks), .send_from = in, .recv_peer = from,
                           .action = recv_action::store, .recv_into = out(from)});
  }
  return s;
}

/// Direct all-reduce of `count` elements, cut into P chunks as the ring cuts them.
///   phase 1, reduce-scatter: round k sends chunk r+k of our input to rank r+k and adds rank
///            r-k's chunk r to ours: rank r ends owning chunk r reduced
///   phase 2, all-gather: round k sends our chunk r to rank r+k and stores rank r-k's.
/// A chunk is reduced by one rank only, so every rank ends with the same bits. Phase 2's
/// sends of a slice wait only for that slice's reductions (the executor orders steps by the
/// bytes they share), so the phases overlap. In place, phase 2 overwrites chunk r-k only
/// after phase 1's send of it is complete, for the same reason.
inline schedule direct_all_reduce(int rank, int nranks, std::size_t count) {
  schedule s = new_schedule(collective::all_reduce, algo::direct, rank, nranks);
  const int n = nranks;
  auto in = [&](int c) { return chunk_of(buffer_id::input, count, n, wrap(c, n)); };
  auto out = [&](int c) { return chunk_of(buffer_id::output, count, n, wrap(c, n)); };
  if (n == 1) {
    s.steps.push_back(step{.action = recv_action::copy, .recv_into = {buffer_id::output, 0, count},
                           .reduce_with = {buffer_id::input, 0, count}});
    return s;
  }
  // Phase 1: reduce-scatter.
  for (int k = 1; k < n; ++k) {
    s.steps.push_back(step{.send_peer = wrap(rank + k, n), .send_from = in(rank + k), .recv_peer = wrap(rank - k, n),
                           .action = recv_action::reduce, .recv_into = out(rank),
                           .reduce_with = k == 1 ? in(rank) : out(rank)});
  }
  // Phase 2: all-gather.
  for (int k = 1; k < n; ++k) {
    s.steps.push_back(step{.send_peer = wrap(rank + k, n), .send_from = out(rank), .recv_peer = wrap(rank - k, n),
                           .action = recv_action::store, .recv_into = out(rank - k)});
  }
  return s;
}

/// All-to-all: block j of the input (`block` elements each) goes to rank j's output at
/// block r; our own block is copied. Not for in place (input == output): round k would
/// overwrite block r-k before round P-k sends it.
inline schedule direct_all_to_all(int rank, int nranks, std::size_t block) {
  schedule s = new_schedule(collective::all_to_all, algo::direct, rank, nranks);
  auto blk = [&](buffer_id b, int j) { return region{b, static_cast<std::size_t>(j) * block, block}; };
  s.steps.push_back(step{.action = recv_action::copy, .recv_into = blk(buffer_id::output, rank),
                         .reduce_with = blk(buffer_id::input, rank)});
  for (int k = 1; k < nranks; ++k) {
    const int to = wrap(rank + k, nranks);
    const int from = wrap(rank - k, nranks);
    s.steps.push_back(step{.send_peer = to, .send_from = blk(buffer_id::input, to), .recv_peer = from,
                           .action = recv_action::store, .recv_into = blk(buffer_id::output, from)});
  }
  return s;
}

/// All-to-allv: `send_counts[j]` elements go to rank j, `recv_counts[i]` come from rank i;
/// both buffers hold their blocks contiguously in rank order (offsets are prefix sums).
/// Both spans have P entries, and send_counts[rank] == recv_counts[rank] (our own block,
/// copied). Pairs with a count of zero still exchange an empty message: a rank knows only
/// its own counts, and an empty frame lets a receiver that expected data (a caller's
/// mismatch) fail with a length mismatch instead of waiting forever for a message that
/// its peer, seeing a zero, never sent.
inline schedule direct_all_to_allv(int rank, int nranks, std::span<const std::size_t> send_counts,
                                   std::span<const std::size_t> recv_counts) {
  schedule s = new_schedule(collective::all_to_allv, algo::direct, rank, nranks);
  const auto n = static_cast<std::size_t>(nranks);
  std::vector<std::size_t> send_at(n + 1, 0);
  std::vector<std::size_t> recv_at(n + 1, 0);
  for (std::size_t j = 0; j < n; ++j) {
    send_at[j + 1] = send_at[j] + send_counts[j];
    recv_at[j + 1] = recv_at[j] + recv_counts[j];
  }
  auto sent = [&](int j) {
    const auto uj = static_cast<std::size_t>(j);
    return region{buffer_id::input, send_at[uj], send_counts[uj]};
  };
  auto received = [&](int i) {
    const auto ui = static_cast<std::size_t>(i);
    return region{buffer_id::output, recv_at[ui], recv_counts[ui]};
  };
  s.steps.push_back(step{.action = recv_action::copy, .recv_into = received(rank), .reduce_with = sent(rank)});
  for (int k = 1; k < nranks; ++k) {
    const int to = wrap(rank + k, nranks);
    const int from = wrap(rank - k, nranks);
    s.steps.push_back(step{.send_peer = to, .send_from = sent(to), .recv_peer = from,
                           .action = recv_action::store, .recv_into = received(from)});
  }
  return s;
}

/// Direct gather of every rank's `block` input elements into the root's output, in rank
/// order. The root receives from root+1, root+2, ... in turn; in place (input == output +
/// root * block) its own copy does nothing.
inline schedule direct_gather(int rank, int nranks, std::size_t block, int root) {
  schedule s = new_schedule(collective::gather, algo::direct, rank, nranks, root);
  const region in{buffer_id::input, 0, block};
  if (rank != root) {
    s.steps.push_back(step{.send_peer = root, .send_from = in});
    return s;
  }
  auto out = [&](int j) { return region{buffer_id::output, static_cast<std::size_t>(j) * block, block}; };
  s.steps.push_back(step{.action = recv_action::copy, .recv_into = out(rank), .reduce_with = in});
  for (int k = 1; k < nranks; ++k) {
    const int from = wrap(rank + k, nranks);
    s.steps.push_back(step{.recv_peer = from, .action = recv_action::store, .recv_into = out(from)});
  }
  return s;
}

/// Direct scatter of the root's input, P blocks of `block` elements in rank order, block r
/// to rank r's output. In place (output == input + root * block) the root's own copy does
/// nothing.
inline schedule direct_scatter(int rank, int nranks, std::size_t block, int root) {
  schedule s = new_schedule(collective::scatter, algo::direct, rank, nranks, root);
  const region out{buffer_id::output, 0, block};
  if (rank != root) {
    s.steps.push_back(step{.recv_peer = root, .action = recv_action::store, .recv_into = out});
    return s;
  }
  auto in = [&](int j) { return region{buffer_id::input, static_cast<std::size_t>(j) * block, block}; };
  for (int k = 1; k < nranks; ++k) {
    const int to = wrap(rank + k, nranks);
    s.steps.push_back(step{.send_peer = to, .send_from = in(to)});
  }
  s.steps.push_back(step{.action = recv_action::copy, .recv_into = out, .reduce_with = in(rank)});
  return s;
}

}  // namespace chorus
