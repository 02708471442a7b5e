// SPDX-License-Identifier: Apache-2.0
// Node identity, exchanged through the store.
#pragma once

#include <unistd.h>

#include <chorus/bootstrap/topology.hpp>
#include <chorus/error.hpp>
#include <cstdlib>
#include <fstream>
#include <span>

namespace chorus {

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

inline topology discover_topology(store& store, const launch_info& info) {
  const std::string me = node_id_from_env();
  const auto all = store.all_gather(
      "chorus/topology/node", std::as_bytes(std::span<const char>(me.data(), me.size())));
  std::vector<std::string> ids;
  ids.reserve(all.size());
  for (const auto& v : all) ids.emplace_back(reinterpret_cast<const char*>(v.data()), v.size());
  return topology::from_ids(info.rank, ids);
}

}  // namespace chorus
