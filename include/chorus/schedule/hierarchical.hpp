// SPDX-License-Identifier: Apache-2.0
// Hierarchical all-reduce, reduce-scatter and all-gather: most bytes stay inside the nodes.
//
// all_reduce:
// K nodes, node j with m_j ranks, M = max m_j, S bytes. The buffer is cut into M shards;
// on node j, shard s is owned by local rank s mod m_j (with equal nodes: one shard each).
//   phase 1, intra-node reduce-scatter (direct): every rank sends each shard it does not own
//            to its owner, which reduces them: (M-1)/M * S bytes per rank
//   phase 2, inter-node all-reduce: the K owners of shard s, one per node, run a ring over
//            it: 2(K-1) steps, 2(K-1)/K * S/M bytes per owned shard
//   phase 3, intra-node all-gather (direct): each owner sends its shards to the others.
// With equal nodes each rank sends 2(M-1)/M * S inside its node and 2(K-1)/K * S/M across
// nodes; the M rings of phase 2 run at once, so every rank's network link works, and no
// byte crosses between nodes that a flat ring would not (2(K-1)/K * S per node instead of
// a flat ring's 2(N-1)/N * S on every one of its K node-crossing edges).
//
// Direct exchanges rather than rings inside the node: over shared memory each transfer is
// one copy whichever peer it goes to, and direct steps take M-1 latencies, not 2(M-1).
// Every rank lists its steps by shard, then by sender, so no rank waits on another that
// waits on it (see the symbolic checker in tests/schedule).
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

#include "chorus/schedule/ring.hpp"
#include "chorus/schedule/schedule.hpp"
#include "chorus/topology.hpp"

namespace chorus {

inline schedule hierarchical_all_reduce(const topology& topo, std::size_t count) {
  schedule s = new_schedule(collective::all_reduce, algo::hierarchical, topo.rank, topo.size);
  const std::vector<int>& local = topo.local_ranks();
  const int m = static_cast<int>(local.size());
  const int me = topo.local_rank();
  int shards = 1;
  for (const auto& node : topo.members) shards = std::max(shards, static_cast<int>(node.size()));
  const int k = topo.nodes();
  // Phases 1 and 3 move every shard as the K pieces phase 2's ring cuts it into, in the
  // order the ring uses them: phase 1 reduces first the piece this node's ring sends first
  // (piece `node`), so the ring starts while the rest is still being reduced; phase 3 sends
  // first the piece the ring finishes first (node + 1, then node, node - 1, ...). Every rank
  // of a node lists them in the same order, so per peer the messages still match.
  const int my_node = topo.node();
  auto reduced_order = [&](int j) { return (my_node + j) % k; };
  auto finished_order = [&](int j) { return ((my_node + 1 - j) % k + k) % k; };
  auto piece = [&](buffer_id b, int shard, int c) {
    const region whole = chunk_of(b, count, shards, shard);
    region r = chunk_of(b, whole.count, k, c);
    r.offset += whole.offset;
    return r;
  };
  auto owns = [&](int shard) { return shard % m == me; };
  auto owner = [&](int shard) { return local[static_cast<std::size_t>(shard % m)]; };

  // Phase 1: owners reduce every local rank's copy of their shards into the output.
  for (int sh = 0; sh < shards; ++sh) {
    for (int j = 0; j < k; ++j) {
      const int c = reduced_order(j);
      const region in = piece(buffer_id::input, sh, c);
      const region out = piece(buffer_id::output, sh, c);
      if (m == 1) {
        s.steps.push_back(step{.action = recv_action::copy, .recv_into = out, .reduce_with = in});
      } else if (owns(sh)) {
        bool first = true;
        for (int q = 0; q < m; ++q) {
          if (q == me) continue;
          s.steps.push_back(step{.recv_peer = local[static_cast<std::size_t>(q)],
                                 .action = recv_action::reduce,
                                 .recv_into = out,
                                 .reduce_with = first ? in : out});
          first = false;
        }
      } else {
        s.steps.push_back(step{.send_peer = owner(sh), .send_from = in});
      }
    }
  }

  // Phase 2: a ring over the owners of each shard, one per node, in place on the output.
  if (k > 1) {
    for (int sh = 0; sh < shards; ++sh) {
      if (!owns(sh)) continue;
      std::vector<int> ring;
      for (const auto& node : topo.members) {
        ring.push_back(node[static_cast<std::size_t>(sh) % node.size()]);
      }
      const region shard = chunk_of(buffer_id::output, count, shards, sh);
      const schedule r = ring_all_reduce(topo.node(), k, shard.count);
      for (step st : r.steps) {
        for (region* g : {&st.send_from, &st.recv_into, &st.reduce_with}) {
          g->buffer = buffer_id::output;
          g->offset += shard.offset;
        }
        if (st.send_peer >= 0) st.send_peer = ring[static_cast<std::size_t>(st.send_peer)];
        if (st.recv_peer >= 0) st.recv_peer = ring[static_cast<std::size_t>(st.recv_peer)];
        if (st.action == recv_action::copy) continue;  // in place: nothing to copy
        s.steps.push_back(st);
      }
    }
  }

  // Phase 3: owners send their reduced shards to every other rank of the node.
  if (m > 1) {
    for (int sh = 0; sh < shards; ++sh) {
      for (int j = 0; j < k; ++j) {
        const region out = piece(buffer_id::output, sh, finished_order(j));
        if (!owns(sh)) {
          s.steps.push_back(step{.recv_peer = owner(sh), .action = recv_action::store, .recv_into = out});
          continue;
        }
        for (int q = 0; q < m; ++q) {
          if (q != me) {
            s.steps.push_back(step{.send_peer = local[static_cast<std::size_t>(q)], .send_from = out});
          }
        }
      }
    }
  }
  return s;
}

namespace detail {

/// The rank of `node` that stands in for rank b there: b itself on its own node, else the
/// rank with b's local index modulo the node's size (so the work spreads over the node).
inline int delegate(const topology& topo, int node, int b) {
  if (topo.node_of[static_cast<std::size_t>(b)] == node) return b;
  const auto& m = topo.members[static_cast<std::size_t>(node)];
  return m[static_cast<std::size_t>(topo.local_index_of[static_cast<std::size_t>(b)]) % m.size()];
}

}  // namespace detail

// reduce_scatter: rank b ends with block b reduced. On every node one rank collects each block
// (block b's collector on node j is its local rank local(b) mod m_j; on b's own node, b):
//   phase 1, inside nodes: every other local rank sends its copy of the block to the
//            collector, which reduces it: (m_j-1)/m_j of the input per rank, over shm
//   phase 2, across nodes: each collector sends its partial to b, which reduces it:
//            (K-1)/K * S per node crosses the network, where a flat ring sends (N-1)/N * S
//            over each of its K node-crossing edges.
// Steps are listed block by block (phase 1, then 2), senders in rank order, on every rank.
inline schedule hierarchical_reduce_scatter(const topology& topo, std::size_t block) {
  schedule s = new_schedule(collective::reduce_scatter, algo::hierarchical, topo.rank, topo.size);
  const int n = topo.size;
  const int me = topo.rank;
  const auto nb = static_cast<std::size_t>(n);
  auto in = [&](int b) { return region{buffer_id::input, static_cast<std::size_t>(b) * block, block}; };
  // Partials of blocks we collect for other nodes live in scratch, one slot per block.
  auto slot = [&](int b) { return region{buffer_id::scratch, static_cast<std::size_t>(b) * block, block}; };
  const region out{buffer_id::output, 0, block};
  auto collector = [&](int node, int b) { return detail::delegate(topo, node, b); };
  const int my_node = topo.node();
  bool uses_scratch = false;
  for (int b = 0; b < n; ++b) {
    const int home = topo.node_of[static_cast<std::size_t>(b)];
    // The accumulator of block b on this rank, if we collect it; `fresh` until first written.
    const int local_collector = collector(my_node, b);
    const bool collecting = local_collector == me;
    const region acc = b == me ? out : slot(b);
    bool fresh = true;
    auto add = [&](int from) {
      s.steps.push_back(step{.recv_peer = from, .action = recv_action::reduce, .recv_into = acc,
                             .reduce_with = fresh ? in(b) : acc});
      fresh = false;
    };
    // Phase 1: inside our node.
    for (int q : topo.local_ranks()) {
      if (q == me) continue;
      if (collecting) {
        add(q);
      } else if (q == local_collector) {
        s.steps.push_back(step{.send_peer = q, .send_from = in(b)});
      }
    }
    // Phase 2: across nodes, collectors to b.
    if (collecting && b != me) {
      // A collector alone on its node forwards its input unchanged.
      s.steps.push_back(step{.send_peer = b, .send_from = fresh ? in(b) : acc});
      uses_scratch = uses_scratch || !fresh;
    } else if (b == me) {
      for (int node = 0; node < topo.nodes(); ++node) {
        if (node != home) add(collector(node, b));
      }
      if (fresh) {
        s.steps.push_back(step{.action = recv_action::copy, .recv_into = out, .reduce_with = in(b)});
      }
    }
  }
  if (uses_scratch) s.scratch_count = nb * block;
  return s;
}

// all_gather: the reverse of reduce_scatter. Rank b's block goes once to its distributor on
// every other node (phase 1, across nodes: (K-1)/K * S per node), then each distributor, and
// b on its own node, sends it to the other ranks of the node (phase 2, inside nodes).
inline schedule hierarchical_all_gather(const topology& topo, std::size_t block) {
  schedule s = new_schedule(collective::all_gather, algo::hierarchical, topo.rank, topo.size);
  const int n = topo.size;
  const int me = topo.rank;
  auto out = [&](int b) { return region{buffer_id::output, static_cast<std::size_t>(b) * block, block}; };
  const region in{buffer_id::input, 0, block};
  auto distributor = [&](int node, int b) { return detail::delegate(topo, node, b); };
  const int my_node = topo.node();
  for (int b = 0; b < n; ++b) {
    const int home = topo.node_of[static_cast<std::size_t>(b)];
    const int source = distributor(my_node, b);  // who holds block b on our node
    // Phase 1: across nodes.
    if (b == me) {
      s.steps.push_back(step{.action = recv_action::copy, .recv_into = out(b), .reduce_with = in});
      for (int node = 0; node < topo.nodes(); ++node) {
        if (node != home) s.steps.push_back(step{.send_peer = distributor(node, b), .send_from = in});
      }
    } else if (source == me) {
      s.steps.push_back(step{.recv_peer = b, .action = recv_action::store, .recv_into = out(b)});
    }
    // Phase 2: inside our node.
    if (source == me) {
      for (int q : topo.local_ranks()) {
        if (q != me) s.steps.push_back(step{.send_peer = q, .send_from = b == me ? in : out(b)});
      }
    } else {
      s.steps.push_back(step{.recv_peer = source, .action = recv_action::store, .recv_into = out(b)});
    }
  }
  return s;
}

}  // namespace chorus
