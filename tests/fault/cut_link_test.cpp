// SPDX-License-Identifier: Apache-2.0
// A node cut off the network mid-run (iptables DROP or REJECT in its namespace, its link set
// down, or throttled to nearly nothing by tc tbf): every rank's all_reduce must fail naming
// ranks across the cut, none may hang.
// Runs cut_rank under chorus-run --nodes 2 -n 2; needs root, iproute2 and iptables.
#include <doctest/doctest.h>

#include <cstdlib>
#include <regex>
#include <string>

#include "tools/chorus_run_support.hpp"

using namespace chorus::test;

namespace {

bool have_iptables() {
  return run_shell(with_sbin + "command -v iptables >/dev/null").exit_code == 0;
}

struct outcome {
  int ranks_failed = 0;   // lines reporting an error
  int named_across = 0;   // ... whose ranks are all across the cut, and at least one
  int timed_out = 0;      // ... that are the operation's timeout, not a failure found
  double slowest_ms = 0;  // after the cut
  std::string out;        // the ranks' output
};

/// Ranks 0 and 1 are node 0, ranks 2 and 3 node 1 (the one cut off).
outcome cut(const std::string& mode, int op_timeout_s = 60, const std::string& env = "",
            const std::string& cut_after = "") {
  const auto r = run_shell(with_sbin + "CHORUS_HEARTBEAT_PERIOD=0.1 CHORUS_HEARTBEAT_TIMEOUT=1 " + env +
                           " CHORUS_TIMEOUT=" + std::to_string(op_timeout_s) + " " + chorus_run() +
                           " --nodes 2 -n 2 --timeout 60 '" + CUT_RANK_PATH + "' " + mode + " " + cut_after);
  INFO(r.out << r.err);
  CHECK(r.exit_code == 0);
  outcome o;
  std::smatch m;
  long long cut_at = 0;
  if (std::regex_search(r.out, m, std::regex("cut at ([0-9]+)"))) cut_at = std::stoll(m[1]);
  CHECK(cut_at > 0);
  static const std::regex line("rank ([0-9]) node ([01]): ([a-z_]+) ranks ([0-9,]*) at ([0-9]+)");
  for (auto it = std::sregex_iterator(r.out.begin(), r.out.end(), line); it != std::sregex_iterator(); ++it) {
    const auto& g = *it;
    ++o.ranks_failed;
    o.timed_out += g[3] == "timeout";
    const int node = std::stoi(g[2]);
    const std::string ranks = g[4];
    bool across = !ranks.empty();
    for (char c : ranks) {
      if (c != ',' && ((c - '0') / 2) == node) across = false;
    }
    o.named_across += across;
    o.slowest_ms = std::max(o.slowest_ms, static_cast<double>(std::stoll(g[5]) - cut_at) / 1000.0);
  }
  o.out = r.out;
  return o;
}

/// The ranks' output reports a connection found dead by the TCP transport's watch or by
/// keepalive.
bool by_tcp(const std::string& out) {
  return out.find("has not answered") != std::string::npos || out.find("Connection timed out") != std::string::npos;
}

}  // namespace

TEST_CASE("a node cut off by iptables DROP or REJECT: every rank fails naming ranks across the cut") {
  if (skip_without_netns()) return;
  if (!have_iptables()) {
    MESSAGE("skipped: iptables is not installed (scripts/setup installs it)");
    return;
  }
  for (const char* mode : {"drop", "reject"}) {
    CAPTURE(mode);
    const auto o = cut(mode);
    CHECK(o.ranks_failed == 4);
    CHECK(o.named_across == 4);
    MESSAGE("iptables " << std::string(mode) << ": slowest rank's error " << o.slowest_ms
                        << " ms after the cut (heartbeat timeout 1000 ms)");
  }
}

// Heartbeats pass these cuts: only the TCP transport's own watch of its links finds them
// (it replaced TCP_USER_TIMEOUT, which Linux applies to a peer's closed window as well and
// so failed live ranks that read late). A rank across the cut is found silent; which side
// the others then count failed is the heartbeat's choice, so only the finder is checked
// for naming a rank across. Which finds it first, the watch or an idle socket's keepalive
// (kernel: "Connection timed out"), depends on timing; tcp_connection_test checks the
// watch's rules alone.
TEST_CASE("a node whose TCP traffic alone is dropped: the TCP transport finds the dead link") {
  if (skip_without_netns()) return;
  if (!have_iptables()) {
    MESSAGE("skipped: iptables is not installed (scripts/setup installs it)");
    return;
  }
  SUBCASE("while the all_reduces run") {
    const auto o = cut("tcpdrop", 30);
    INFO(o.out);
    CHECK(o.ranks_failed == 4);
    CHECK(o.timed_out == 0);
    CHECK(o.named_across >= 1);
    CHECK(by_tcp(o.out));
    MESSAGE("TCP dropped: slowest rank's error " << o.slowest_ms << " ms after the cut (timeout 1000 ms)");
  }
  SUBCASE("while the cut-off node sleeps, the windows toward it closed") {
    // Node 1 sleeps through the cut with the windows toward it closed (256 KiB socket
    // buffers, the ring's 8 MiB first sends): node 0 hears nothing, and its kernel only
    // probes the windows, at doubling intervals.
    const auto o = cut("tcpdrop-window", 30, "CHORUS_TCP_BUFFER=262144 CHORUS_ALGO=allreduce:ring", "3");
    INFO(o.out);
    CHECK(o.ranks_failed == 4);
    CHECK(o.timed_out == 0);
    CHECK(o.named_across >= 1);
    CHECK(by_tcp(o.out));
    MESSAGE("TCP dropped behind closed windows: slowest rank's error " << o.slowest_ms
                                                                      << " ms after the cut (node 1 sleeps 8 s of it)");
  }
}

TEST_CASE("a node whose link goes down: every rank fails, none hangs") {
  if (skip_without_netns()) return;
  const auto o = cut("down");
  CHECK(o.ranks_failed == 4);
  CHECK(o.named_across >= 2);  // node 0's ranks name node 1's; node 1 may lose its own address
  MESSAGE("ip link set down: slowest rank's error " << o.slowest_ms << " ms after the cut");
}

TEST_CASE("a node whose link tc tbf throttles to 8 kbit/s: every rank fails, none hangs") {
  if (skip_without_netns()) return;
  // Some datagrams still pass, so a rank may see its peers alive until the op timeout (10 s
  // here): either error is right, a hang is not.
  const auto o = cut("tbf", 10);
  CHECK(o.ranks_failed == 4);
  CHECK(o.named_across >= 2);
  MESSAGE("tc tbf 8 kbit/s: slowest rank's error " << o.slowest_ms << " ms after the throttle");
}
