// SPDX-License-Identifier: Apache-2.0
// Which ranks share a node: discovered once per communicator through the store.
#pragma once

#include <chorus/bootstrap/env.hpp>
#include <chorus/bootstrap/store.hpp>
#include <string>
#include <vector>

namespace chorus {

/// The nodes of a job and where each rank sits. Two ranks are on one node when they can
/// share memory: same host name, same boot (so two machines cloned from one image differ)
/// and same network namespace (so emulated nodes made of namespaces are distinct nodes to
/// the hierarchical algorithms). `CHORUS_NODE_ID` replaces the detected identity.
///
/// Nodes are numbered by their lowest rank; ranks within a node keep rank order, so every
/// rank computes the same topology from the same gathered identities.
struct topology {
  int rank = 0;
  int size = 1;
  std::vector<int> node_of;               ///< node_of[r]: node of rank r
  std::vector<int> local_index_of;        ///< local_index_of[r]: position of r on its node
  std::vector<std::vector<int>> members;  ///< members[node]: its ranks, ascending

  int node() const { return node_of[static_cast<std::size_t>(rank)]; }
  int nodes() const { return static_cast<int>(members.size()); }
  int local_rank() const { return local_index_of[static_cast<std::size_t>(rank)]; }
  int local_size() const { return static_cast<int>(local_ranks().size()); }
  const std::vector<int>& local_ranks() const { return members[static_cast<std::size_t>(node())]; }
  bool same_node(int a, int b) const {
    return node_of[static_cast<std::size_t>(a)] == node_of[static_cast<std::size_t>(b)];
  }
  /// Every node has the same number of ranks.
  bool uniform() const;
  /// "2 nodes x 2 ranks" or "3 nodes (1, 2, 3 ranks)".
  std::string describe() const;

  /// Builds the topology from every rank's node identity (ids[r] for rank r).
  static topology from_ids(int rank, const std::vector<std::string>& ids);
  /// A topology in which every rank is on one node.
  static topology single_node(int rank, int size);
};

/// This process's node identity: CHORUS_NODE_ID when set, else
/// "<host name>/<boot id>/<network namespace>".
std::string node_id_from_env();

/// Exchanges node identities through the store (a collective call: every rank must make it).
///
/// **Example**:
///   chorus::topology topo = chorus::discover_topology(store, info);
///   if (topo.nodes() > 1) { /* hierarchical algorithms pay off */ }
topology discover_topology(tcp_store& store, const launch_info& info);

}  // namespace chorus

#include <chorus/bootstrap/detail/topology_impl.hpp>
