// SPDX-License-Identifier: Apache-2.0
// Double binary tree all-reduce (after NCCL's): two complementary binary trees over all
// ranks, each reducing then broadcasting half of the buffer.
//
// all_reduce with P ranks, S bytes, depth d = floor(log2(m-1)) + 1 where m is P rounded
// down to even (P = 2 or 3: d = 1):
//   at most 8 steps per rank, at most 2S bytes sent per rank (+1 element when the halves
//   are uneven), 2d hops from a leaf up to the root and back down
//     phase 1, up (reduce): in each tree, a rank reduces its children's partials of the
//              tree's half into its output and sends the sum to its parent
//     phase 2, down (broadcast): in each tree, a rank stores its parent's result and sends
//              it to its children
// A rank with two children in a tree sends S/2 up and S down there; every rank has
// children in at most one tree and is a leaf (S/2 up) in the other, so no rank sends more
// than 2S, near the ring's 2(P-1)/P * S, while the latency is 2d hops, not the ring's 2(P-1).
// The executor forwards each slice as soon as it has landed, so both phases pipeline.
//
// The trees. Tree 0 is the in-order binary tree over positions 0..m-1 (position = rank):
// a position p > 0 whose lowest set bit is b has children p - b/2 and the first of
// p + b/2, p + b/4, ... below m; position 0 is the root with one child, the largest power
// of two below m. Its leaves are exactly the odd positions. Tree 1 mirrors it (rank
// m-1-p at position p), so its leaves are the even ranks: the two trees' interior ranks
// are disjoint. With P odd, rank P-1 joins both trees as a leaf, second child of both
// roots. (NCCL shifts tree 1 by one rank for odd P instead, which leaves rank 0 interior in
// both trees.)
//
// Per peer, messages match in schedule order (schedule.hpp): every rank lists tree 0's up
// phase, tree 1's, then tree 0's down phase, tree 1's. Two ranks are linked in at most one
// way per tree, so between any two ranks both sides list their messages in the same order.
#pragma once

#include <array>
#include <bit>
#include <cstddef>

#include "chorus/schedule/schedule.hpp"

namespace chorus {

namespace detail {

/// A rank's place in one tree: its parent (-1 at the root) and children (-1: none).
struct tree_links {
  int parent = -1;
  std::array<int, 2> children{-1, -1};
};

/// Position p's links in the in-order binary tree over positions 0..m-1 (see above).
inline tree_links inorder_tree(int p, int m) {
  tree_links l;
  if (p == 0) {
    if (m > 1) l.children[0] = static_cast<int>(std::bit_floor(static_cast<unsigned>(m - 1)));
    return l;
  }
  const int b = p & -p;
  // Our parent is p with bit b cleared and the next bit set, unless that is past the end:
  // then p - b, which adopted us when the subtree between was cut off.
  const int up = (p ^ b) | (b << 1);
  l.parent = up < m ? up : p ^ b;
  if (b > 1) {
    l.children[0] = p - b / 2;
    for (int d = b / 2; d > 0; d /= 2) {
      if (p + d < m) {
        l.children[1] = p + d;
        break;
      }
    }
  }
  return l;
}

/// Rank `rank`'s links in tree t (0 or 1) of the double binary tree over n >= 2 ranks.
inline tree_links double_tree(int rank, int n, int t) {
  const int m = n % 2 == 0 ? n : n - 1;
  auto to_rank = [&](int pos) { return pos < 0 ? -1 : t == 0 ? pos : m - 1 - pos; };
  const int root = to_rank(0);
  if (rank == m) return tree_links{.parent = root, .children = {-1, -1}};  // odd n's last rank
  const tree_links at = inorder_tree(t == 0 ? rank : m - 1 - rank, m);
  tree_links l{.parent = to_rank(at.parent),
               .children = {to_rank(at.children[0]), to_rank(at.children[1])}};
  if (rank == root && m < n) l.children[1] = m;
  return l;
}

}  // namespace detail

/// Double binary tree all-reduce of `count` elements: tree t reduces and broadcasts half t
/// (chunk_of(count, 2, t)). The input is read only by the up phase, before the down phase
/// writes the output, so in place (input == output) is the same schedule.
inline schedule tree_all_reduce(int rank, int nranks, std::size_t count) {
  schedule s = new_schedule(collective::all_reduce, algo::tree, rank, nranks);
  auto in = [&](int t) { return chunk_of(buffer_id::input, count, 2, t); };
  auto out = [&](int t) { return chunk_of(buffer_id::output, count, 2, t); };
  if (nranks == 1) {
    s.steps.push_back(step{.action = recv_action::copy, .recv_into = {buffer_id::output, 0, count},
                           .reduce_with = {buffer_id::input, 0, count}});
    return s;
  }
  const std::array trees{detail::double_tree(rank, nranks, 0), detail::double_tree(rank, nranks, 1)};

  // Phase 1, up: the first child's partial is added to our input, later ones to the sum.
  for (int t = 0; t < 2; ++t) {
    const detail::tree_links& l = trees[static_cast<std::size_t>(t)];
    bool reduced = false;
    for (int c : l.children) {
      if (c < 0) continue;
      s.steps.push_back(step{.recv_peer = c, .action = recv_action::reduce, .recv_into = out(t),
                             .reduce_with = reduced ? out(t) : in(t)});
      reduced = true;
    }
    if (l.parent >= 0) {
      s.steps.push_back(step{.send_peer = l.parent, .send_from = reduced ? out(t) : in(t)});
    }
  }
  // Phase 2, down: the root holds the result already; everyone else receives it.
  for (int t = 0; t < 2; ++t) {
    const detail::tree_links& l = trees[static_cast<std::size_t>(t)];
    if (l.parent >= 0) {
      s.steps.push_back(step{.recv_peer = l.parent, .action = recv_action::store, .recv_into = out(t)});
    }
    for (int c : l.children) {
      if (c >= 0) s.steps.push_back(step{.send_peer = c, .send_from = out(t)});
    }
  }
  return s;
}

}  // namespace chorus
