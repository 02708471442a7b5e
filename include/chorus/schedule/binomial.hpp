// SPDX-License-Identifier: Apache-2.0
// Binomial-tree broadcast, reduce, gather and scatter, as schedules, for any root and any
// number of ranks.
//
// With P ranks, L = ceil(log2 P), S bytes (gather, scatter: the root's whole buffer,
// P blocks of B bytes):
//   broadcast: L hops; a rank sends S to each of its children (the root: L of them,
//              L * S bytes), receives S once
//   reduce:    L hops; a rank receives and reduces S from each child, sends S once
//   gather:    L hops; a rank sends its subtree's blocks once (s * B bytes for a subtree
//              of s ranks), the root receives (P-1) * B in L steps (+1 where a subtree's
//              blocks wrap around the end of the root's buffer)
//   scatter:   the reverse of gather
// Logarithmic latency for any P. Broadcast and reduce move L times the chain's bytes through
// the root, so the chain (chain.hpp) takes over for large buffers.
//
// The tree, over relative ranks v = (rank - root) mod P: v > 0 receives from its parent,
// v with its lowest set bit cleared, and v's children are v + d for the powers of two d
// below both that bit and P - v (the root: below P). Relative ranks [v, v + s) form v's
// subtree, s = min(lowest bit of v, P - v) (the root's: all P). A parent serves its
// children largest subtree first when data flows down (the longest path starts first) and
// hears from them smallest first when data flows up (the first to finish).
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>

#include "chorus/schedule/schedule.hpp"

namespace chorus {

namespace detail {

/// The size of relative rank v's subtree in the binomial tree over n ranks.
inline int binomial_span(int v, int n) { return v == 0 ? n : std::min(v & -v, n - v); }

/// The largest power of two below `span` (0 for span <= 1): the farthest child of a rank
/// whose subtree has `span` ranks.
inline int farthest_child(int span) {
  return span > 1 ? static_cast<int>(std::bit_floor(static_cast<unsigned>(span - 1))) : 0;
}

/// A subtree's blocks are its ranks' in relative order, `count` of them from real rank
/// `first`'s, which in the root's rank-ordered buffer wrap past rank n-1 to rank 0 at most
/// once: how many come before the wrap.
inline int before_wrap(int first, int count, int n) { return std::min(count, n - first); }

}  // namespace detail

/// Binomial broadcast of the root's `count` input elements to every rank's output. The root
/// sends from its input and copies it to its output last (nothing to copy in place).
inline schedule binomial_broadcast(int rank, int nranks, std::size_t count, int root) {
  schedule s = new_schedule(collective::broadcast, algo::binomial, rank, nranks, root);
  const region in{buffer_id::input, 0, count};
  const region out{buffer_id::output, 0, count};
  const int v = wrap(rank - root, nranks);
  auto real = [&](int u) { return wrap(u + root, nranks); };
  const int span = detail::binomial_span(v, nranks);
  if (v != 0) {
    s.steps.push_back(step{.recv_peer = real(v - (v & -v)), .action = recv_action::store,
                           .recv_into = out});
  }
  for (int d = detail::farthest_child(span); d > 0; d /= 2) {
    s.steps.push_back(step{.send_peer = real(v + d), .send_from = v == 0 ? in : out});
  }
  if (v == 0) s.steps.push_back(step{.action = recv_action::copy, .recv_into = out, .reduce_with = in});
  return s;
}

/// Binomial reduce of every rank's `count` input elements into the root's output. Ranks
/// other than the root keep their subtree's sum in scratch (they have no output); leaves
/// send their input as it is.
inline schedule binomial_reduce(int rank, int nranks, std::size_t count, int root) {
  schedule s = new_schedule(collective::reduce, algo::binomial, rank, nranks, root);
  const region in{buffer_id::input, 0, count};
  const int v = wrap(rank - root, nranks);
  auto real = [&](int u) { return wrap(u + root, nranks); };
  const int span = detail::binomial_span(v, nranks);
  const region partial = v == 0 ? region{buffer_id::output, 0, count} : region{buffer_id::scratch, 0, count};
  bool reduced = false;
  for (int d = 1; d < span; d *= 2) {
    s.steps.push_back(step{.recv_peer = real(v + d), .action = recv_action::reduce, .recv_into = partial,
                           .reduce_with = reduced ? partial : in});
    reduced = true;
  }
  if (v != 0) {
    s.steps.push_back(step{.send_peer = real(v - (v & -v)), .send_from = reduced ? partial : in});
    if (reduced) s.scratch_count = count;
  } else if (!reduced) {  // P == 1
    s.steps.push_back(step{.action = recv_action::copy, .recv_into = partial, .reduce_with = in});
  }
  return s;
}

/// Binomial gather of every rank's `block` input elements into the root's output, in rank
/// order. A rank with children collects its subtree's blocks in scratch, in relative order,
/// and sends them up in one message; a child of the root whose blocks wrap past rank P-1 in
/// the root's output sends them in two, so the root receives straight into its output.
inline schedule binomial_gather(int rank, int nranks, std::size_t block, int root) {
  schedule s = new_schedule(collective::gather, algo::binomial, rank, nranks, root);
  const int n = nranks;
  const region in{buffer_id::input, 0, block};
  auto blocks = [&](buffer_id b, int first, int count) {
    return region{b, static_cast<std::size_t>(first) * block, static_cast<std::size_t>(count) * block};
  };
  const int v = wrap(rank - root, n);
  auto real = [&](int u) { return wrap(u + root, n); };
  const int span = detail::binomial_span(v, n);

  if (v == 0) {
    s.steps.push_back(step{.action = recv_action::copy, .recv_into = blocks(buffer_id::output, rank, 1),
                           .reduce_with = in});
    for (int d = 1; d < n; d *= 2) {
      const int child = real(d);
      const int size = detail::binomial_span(d, n);
      const int head = detail::before_wrap(child, size, n);
      s.steps.push_back(step{.recv_peer = child, .action = recv_action::store,
                             .recv_into = blocks(buffer_id::output, child, head)});
      if (head < size) {
        s.steps.push_back(step{.recv_peer = child, .action = recv_action::store,
                               .recv_into = blocks(buffer_id::output, 0, size - head)});
      }
    }
    return s;
  }
  const int parent = real(v - (v & -v));
  if (span == 1) {
    s.steps.push_back(step{.send_peer = parent, .send_from = in});
    return s;
  }
  s.scratch_count = static_cast<std::size_t>(span) * block;
  auto subtree = [&](int first, int count) { return blocks(buffer_id::scratch, first, count); };
  s.steps.push_back(step{.action = recv_action::copy, .recv_into = subtree(0, 1), .reduce_with = in});
  for (int d = 1; d < span; d *= 2) {
    s.steps.push_back(step{.recv_peer = real(v + d), .action = recv_action::store,
                           .recv_into = subtree(d, detail::binomial_span(v + d, n))});
  }
  const int head = parent == root ? detail::before_wrap(rank, span, n) : span;
  s.steps.push_back(step{.send_peer = parent, .send_from = subtree(0, head)});
  if (head < span) s.steps.push_back(step{.send_peer = parent, .send_from = subtree(head, span - head)});
  return s;
}

/// Binomial scatter of the root's input, P blocks of `block` elements in rank order, block
/// r to rank r's output. The reverse of binomial_gather: the root sends each child its
/// subtree's blocks (in two messages where they wrap past rank P-1), a rank with children
/// receives them in scratch and passes theirs on.
inline schedule binomial_scatter(int rank, int nranks, std::size_t block, int root) {
  schedule s = new_schedule(collective::scatter, algo::binomial, rank, nranks, root);
  const int n = nranks;
  const region out{buffer_id::output, 0, block};
  auto blocks = [&](buffer_id b, int first, int count) {
    return region{b, static_cast<std::size_t>(first) * block, static_cast<std::size_t>(count) * block};
  };
  const int v = wrap(rank - root, n);
  auto real = [&](int u) { return wrap(u + root, n); };
  const int span = detail::binomial_span(v, n);

  if (v == 0) {
    for (int d = detail::farthest_child(n); d > 0; d /= 2) {
      const int child = real(d);
      const int size = detail::binomial_span(d, n);
      const int head = detail::before_wrap(child, size, n);
      s.steps.push_back(step{.send_peer = child, .send_from = blocks(buffer_id::input, child, head)});
      if (head < size) {
        s.steps.push_back(step{.send_peer = child, .send_from = blocks(buffer_id::input, 0, size - head)});
      }
    }
    s.steps.push_back(step{.action = recv_action::copy, .recv_into = out,
                           .reduce_with = blocks(buffer_id::input, rank, 1)});
    return s;
  }
  const int parent = real(v - (v & -v));
  if (span == 1) {
    s.steps.push_back(step{.recv_peer = parent, .action = recv_action::store, .recv_into = out});
    return s;
  }
  s.scratch_count = static_cast<std::size_t>(span) * block;
  auto subtree = [&](int first, int count) { return blocks(buffer_id::scratch, first, count); };
  const int head = parent == root ? detail::before_wrap(rank, span, n) : span;
  s.steps.push_back(step{.recv_peer = parent, .action = recv_action::store, .recv_into = subtree(0, head)});
  if (head < span) {
    s.steps.push_back(step{.recv_peer = parent, .action = recv_action::store,
                           .recv_into = subtree(head, span - head)});
  }
  for (int d = detail::farthest_child(span); d > 0; d /= 2) {
    s.steps.push_back(step{.send_peer = real(v + d),
                           .send_from = subtree(d, detail::binomial_span(v + d, n))});
  }
  s.steps.push_back(step{.action = recv_action::copy, .recv_into = out, .reduce_with = subtree(0, 1)});
  return s;
}

}  // namespace chorus
