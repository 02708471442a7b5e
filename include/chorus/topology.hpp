// SPDX-License-Identifier: Apache-2.0
// Which ranks share a node. Pure data: schedules read it, the bootstrap discovers it.
#pragma once

#include <map>
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
  /// Nodes of the given sizes, ranks numbered node after node: from_sizes(r, {2, 3}) puts
  /// ranks 0-1 on node 0 and 2-4 on node 1.
  static topology from_sizes(int rank, const std::vector<int>& sizes);
};

inline bool topology::uniform() const {
  for (const auto& m : members) {
    if (m.size() != members.front().size()) return false;
  }
  return true;
}

inline std::string topology::describe() const {
  std::string s = std::to_string(nodes()) + (nodes() == 1 ? " node" : " nodes");
  if (uniform()) return s + " x " + std::to_string(members.front().size()) + " ranks";
  s += " (";
  for (std::size_t i = 0; i < members.size(); ++i) {
    s += (i ? ", " : "") + std::to_string(members[i].size());
  }
  return s + " ranks)";
}

inline topology topology::from_ids(int rank, const std::vector<std::string>& ids) {
  topology t;
  t.rank = rank;
  t.size = static_cast<int>(ids.size());
  std::map<std::string, int> node_by_id;
  for (std::size_t r = 0; r < ids.size(); ++r) {
    auto [it, fresh] = node_by_id.try_emplace(ids[r], static_cast<int>(t.members.size()));
    if (fresh) t.members.emplace_back();
    auto& m = t.members[static_cast<std::size_t>(it->second)];
    t.node_of.push_back(it->second);
    t.local_index_of.push_back(static_cast<int>(m.size()));
    m.push_back(static_cast<int>(r));
  }
  return t;
}

inline topology topology::from_sizes(int rank, const std::vector<int>& sizes) {
  std::vector<std::string> ids;
  for (std::size_t node = 0; node < sizes.size(); ++node) {
    ids.insert(ids.end(), static_cast<std::size_t>(sizes[node]), std::to_string(node));
  }
  return from_ids(rank, ids);
}

inline topology topology::single_node(int rank, int size) {
  return from_ids(rank, std::vector<std::string>(static_cast<std::size_t>(size), "node"));
}

}  // namespace chorus
