// SPDX-License-Identifier: Apache-2.0
// Collectives across emulated nodes (chorus-run --nodes: network namespaces joined by a
// bridge): exact results for even and uneven nodes, shared memory inside a node and TCP
// between, and the bytes that cross between nodes. Needs root and iproute2; skips otherwise.
#include <doctest/doctest.h>

#include <regex>
#include <string>

#include "tools/chorus_run_support.hpp"

using namespace chorus::test;

namespace {

/// Runs nodes_rank on `nodes` with CHORUS_ALGO=`algo` (and the variables in `env`, "A=1 ");
/// returns chorus-run's result.
run_result run_on_nodes(const std::string& nodes, const std::string& algo, std::size_t count,
                        const std::string& extra = "", const std::string& env = "") {
  return run_shell(with_sbin + env + "CHORUS_ALGO=" + algo + " CHORUS_TIMEOUT=60 " + chorus_run() +
                   " --nodes " + nodes + " --timeout 120 " + extra + " '" + NODES_RANK_PATH +
                   "' " + std::to_string(count));
}

/// The bytes all node links sent, from --net-stats' total line.
double link_bytes(const std::string& err) {
  std::smatch m;
  static const std::regex total("chorus-run: total link tx ([0-9]+) B");
  return std::regex_search(err, m, total) ? std::stod(m[1]) : -1;
}

}  // namespace

TEST_CASE("every collective is exact across emulated nodes, with even and uneven nodes") {
  if (skip_without_netns()) return;
  for (const char* nodes : {"2 -n 2", "3 -n 1", "3 -n 2", "3 -n 3", "1,2,3", "3,1"}) {
    for (const char* algo : {"hierarchical", "ring", "auto"}) {
      for (std::size_t count : {std::size_t{1}, std::size_t{1000}, std::size_t{300001}}) {
        CAPTURE(nodes);
        CAPTURE(algo);
        CAPTURE(count);
        const auto r = run_on_nodes(nodes, algo, count);
        CHECK_MESSAGE(r.exit_code == 0, r.out << r.err);
        CHECK(r.out.find(" 0 wrong") != std::string::npos);
      }
    }
  }
}

TEST_CASE("ranks of one node talk through shared memory and nodes through tcp") {
  if (skip_without_netns()) return;
  const auto r = run_on_nodes("2 -n 2", "auto", 10);
  CHECK_MESSAGE(r.exit_code == 0, r.err);
  CHECK(r.out.find("shm 2 ranks") != std::string::npos);
  CHECK(r.out.find("between nodes") != std::string::npos);
  CHECK(r.out.find("2 nodes") != std::string::npos);
}

TEST_CASE("hierarchical all_reduce sends 2/3 of a flat ring's bytes between 2 nodes of 2 ranks") {
  if (skip_without_netns()) return;
  // Per operation a flat ring over 4 ranks sends 2 * 3/4 S over each of its 2 node-crossing
  // edges (3 S in all); hierarchical sends 2(K-1)/K * S/M from each of 4 ranks (2 S in all).
  // Each run does one all_reduce of 8 MiB each way in nodes_rank's first two calls, plus
  // smaller ones; the ratio of the totals must be near 2/3. Without the tuner's probe, whose
  // 2 MiB exchanges between nodes would count in both totals alike.
  const std::size_t count = 1 << 20;  // int64: 8 MiB
  const auto ring = run_on_nodes("2 -n 2", "ring", count, "--net-stats", "CHORUS_TUNER=fixed ");
  const auto hier = run_on_nodes("2 -n 2", "hierarchical", count, "--net-stats", "CHORUS_TUNER=fixed ");
  REQUIRE(ring.exit_code == 0);
  REQUIRE(hier.exit_code == 0);
  const double ratio = link_bytes(hier.err) / link_bytes(ring.err);
  MESSAGE("link bytes: ring " << link_bytes(ring.err) << ", hierarchical " << link_bytes(hier.err)
                              << ", ratio " << ratio);
  CHECK(ratio > 0.55);
  CHECK(ratio < 0.75);
}
