// SPDX-License-Identifier: Apache-2.0
// Direct all-to-all, all-to-allv, gather and scatter, as schedules: every block goes
// straight from the rank that has it to the rank that needs it.
//
// With P ranks, S bytes (the whole buffer of P blocks of B bytes each):
//   all_to_all:  P-1 steps (+1 local copy), (P-1)/P * S bytes sent per rank
//   all_to_allv: P-1 steps (+1 local copy), the elements sent to other ranks
//   gather:      the root receives (P-1) * B in P-1 steps (+1 local copy); others send B in 1
//   scatter:     the root sends (P-1) * B in P-1 steps (+1 local copy); others receive B in 1
// No byte travels twice, so these are bandwidth-optimal; the latency term is P-1 (the
// root's) or, for all-to-all, P-1 steps that each move one block both ways.
//
// All-to-all runs in P-1 pairwise rounds: in round k, rank r sends to r+k and receives from
// r-k, so every rank sends one block and receives one block per round and no rank is the
// target of two senders at once.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "chorus/schedule/schedule.hpp"

namespace chorus {

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
