// SPDX-License-Identifier: Apache-2.0
// Where this process runs, and the topology of the job, discovered through the store.
#pragma once

#include <chorus/bootstrap/env.hpp>
#include <chorus/bootstrap/store.hpp>
#include <chorus/topology.hpp>
#include <string>
#include <vector>

namespace chorus {

/// This process's node identity: CHORUS_NODE_ID when set, else
/// "<host name>/<boot id>/<network namespace>".
std::string node_id_from_env();

/// Exchanges node identities through the store (a collective call: every rank must make it).
///
/// **Example**:
///   chorus::topology topo = chorus::discover_topology(store, info);
///   if (topo.nodes() > 1) { /* hierarchical algorithms pay off */ }
topology discover_topology(store& store, const launch_info& info);

}  // namespace chorus

#include <chorus/bootstrap/detail/topology_impl.hpp>
