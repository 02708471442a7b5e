// SPDX-License-Identifier: Apache-2.0
// Node identity and the topology built from every rank's identity.
#pragma once

#include <unistd.h>

#include <chorus/bootstrap/topology.hpp>
#include <chorus/error.hpp>
#include <cstdlib>
#include <fstream>
#include <map>
#include <span>

namespace chorus {

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

inline topology topology::single_node(int rank, int size) {
  return from_ids(rank, std::vector<std::string>(static_cast<std::size_t>(size), "node"));
}

inline std::string node_id_from_env() {
  if (const char* v = std::getenv("CHORUS_NODE_ID"); v != nullptr && *v != '\0') {
    const std::string id = v;
    if (id.size() > 1024) {
      throw error(errc::invalid_argument, "CHORUS_NODE_ID is longer than 1024 characters");
    }
    return id;
  }
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  std::string boot;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot;
  // The namespace link reads "net:[4026531840]"; its inode number identifies the namespace.
  char ns[128] = {};
  const ssize_t n = ::readlink("/proc/self/ns/net", ns, sizeof ns - 1);
  return std::string(host) + "/" + boot + "/" + (n > 0 ? std::string(ns, static_cast<std::size_t>(n)) : "");
}

inline topology discover_topology(tcp_store& store, const launch_info& info) {
  const std::string me = node_id_from_env();
  const auto all = store.all_gather(
      "chorus/topology/node", std::as_bytes(std::span<const char>(me.data(), me.size())));
  std::vector<std::string> ids;
  ids.reserve(all.size());
  for (const auto& v : all) ids.emplace_back(reinterpret_cast<const char*>(v.data()), v.size());
  return topology::from_ids(info.rank, ids);
}

}  // namespace chorus
