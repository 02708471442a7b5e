// SPDX-License-Identifier: Apache-2.0
// Tests of chorus-run --nodes, emulated nodes in network namespaces: where each rank lands,
// what it can reach, rate shaping, byte counters, and that every namespace is removed however
// the run ends. They need root and iproute2 and skip with the reason otherwise.
#include <doctest/doctest.h>

#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "chorus_run_support.hpp"

using namespace chorus::test;

namespace {

// chorus-run with `args`, started in the background so that `then` (shell, may use $p for
// its pid) can act on it while it runs; the result is chorus-run's. `pid` gets its pid.
run_result run_nodes(const std::string& args, pid_t& pid, const std::string& then = "") {
  scratch_dir dir;
  auto r = run_shell(with_sbin + chorus_run() + " " + args + " & p=$!; echo $p > " + dir.path +
                     "/pid; " + then + " wait $p");
  pid = static_cast<pid_t>(std::stol("0" + read_file(dir.path + "/pid")));
  return r;
}

// The network namespaces of the chorus-run with pid `pid` that still exist.
std::vector<std::string> namespaces_of(pid_t pid) {
  const std::string prefix = "chorus-" + std::to_string(pid) + "-";
  std::vector<std::string> names;
  for (const auto& line : lines_of(run_shell(with_sbin + "ip netns list").out)) {
    std::string name = line.substr(0, line.find(' '));  // "name (id: 3)"
    if (name.rfind(prefix, 0) == 0) names.push_back(name);
  }
  return names;
}

// The names of the links in the root namespace.
std::set<std::string> root_links() {
  std::set<std::string> names;
  for (const auto& line : lines_of(run_shell(with_sbin + "ip -o link show").out)) {
    // "4: eth0@if5: <BROADCAST,..." -> "eth0"
    auto start = line.find(": ");
    if (start == std::string::npos) continue;
    start += 2;
    auto end = line.find_first_of(":@", start);
    names.insert(line.substr(start, end - start));
  }
  return names;
}

// How many processes live in the network namespace `ns` ("net:[4026532246]").
int processes_in(const std::string& ns) {
  int count = 0;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
    std::string name = entry.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::error_code link_ec;
    auto target = std::filesystem::read_symlink(entry.path() / "ns" / "net", link_ec);
    if (!link_ec && target.string() == ns) ++count;
  }
  return count;
}

// The --net-stats lines of a run: node -> {tx, rx}; node -1 is the total line.
std::map<int, std::pair<long long, long long>> net_stats(const std::string& err) {
  std::map<int, std::pair<long long, long long>> stats;
  std::regex node_re(R"(chorus-run: node (\d+) link tx (\d+) B rx (\d+) B)");
  std::regex total_re(R"(chorus-run: total link tx (\d+) B rx (\d+) B)");
  for (const auto& line : lines_of(err)) {
    std::smatch m;
    if (std::regex_match(line, m, node_re)) {
      stats[std::stoi(m[1])] = {std::stoll(m[2]), std::stoll(m[3])};
    } else if (std::regex_match(line, m, total_re)) {
      stats[-1] = {std::stoll(m[1]), std::stoll(m[2])};
    }
  }
  return stats;
}

// The namespace link of each rank, from lines "[r] ... net:[N]" where the link is last.
std::map<int, std::string> namespace_by_rank(const std::string& out) {
  std::map<int, std::string> ns;
  std::regex re(R"(\[(\d+)\] .*(net:\[\d+\]))");
  for (const auto& line : lines_of(out)) {
    std::smatch m;
    if (std::regex_match(line, m, re)) ns[std::stoi(m[1])] = m[2];
  }
  return ns;
}

std::string own_namespace() {
  std::error_code ec;
  return std::filesystem::read_symlink("/proc/self/ns/net", ec).string();
}

}  // namespace

TEST_CASE("--nodes 2 -n 2 numbers ranks node by node and gives every rank node 0's address") {
  if (skip_without_netns()) return;
  pid_t pid = 0;
  auto r = run_nodes(
      "--nodes 2 -n 2 sh -c 'echo $CHORUS_RANK $CHORUS_WORLD_SIZE $CHORUS_LOCAL_RANK "
      "$CHORUS_LOCAL_WORLD_SIZE $CHORUS_MASTER_ADDR $CHORUS_MASTER_PORT $CHORUS_SOCKET_IFNAME "
      "$(readlink /proc/self/ns/net)'",
      pid);
  CHECK(r.exit_code == 0);
  auto lines = lines_of(r.out);
  REQUIRE(lines.size() == 4);
  std::regex line_re(R"(\[(\d)\] (\d) 4 (\d) 2 (10\.\d+\.\d+\.1) 29500 eth0 net:\[\d+\])");
  std::set<std::string> masters;
  for (const auto& line : lines) {
    CAPTURE(line);
    std::smatch m;
    REQUIRE(std::regex_match(line, m, line_re));
    CHECK(m[1] == m[2]);
    CHECK(std::stoi(m[3]) == std::stoi(m[2]) % 2);  // ranks 0,1 on node 0; 2,3 on node 1
    masters.insert(m[4]);
  }
  CHECK(masters.size() == 1);
  auto ns = namespace_by_rank(r.out);
  REQUIRE(ns.size() == 4);
  CHECK(ns[0] == ns[1]);
  CHECK(ns[2] == ns[3]);
  CHECK(ns[0] != ns[2]);
  CHECK(ns[0] != own_namespace());
  CHECK(ns[2] != own_namespace());
  CHECK(namespaces_of(pid).empty());
}

TEST_CASE("--nodes 1,2,3 puts one, two and three ranks on three nodes") {
  if (skip_without_netns()) return;
  pid_t pid = 0;
  auto r = run_nodes(
      "--nodes 1,2,3 sh -c 'echo $CHORUS_WORLD_SIZE $CHORUS_LOCAL_RANK $CHORUS_LOCAL_WORLD_SIZE "
      "$(readlink /proc/self/ns/net)'",
      pid);
  CHECK(r.exit_code == 0);
  std::regex line_re(R"(\[(\d)\] 6 (\d) (\d) net:\[\d+\])");
  // rank -> {local rank, local world size}
  const std::map<int, std::pair<int, int>> expected = {{0, {0, 1}}, {1, {0, 2}}, {2, {1, 2}},
                                                       {3, {0, 3}}, {4, {1, 3}}, {5, {2, 3}}};
  std::map<int, std::pair<int, int>> seen;
  for (const auto& line : lines_of(r.out)) {
    CAPTURE(line);
    std::smatch m;
    REQUIRE(std::regex_match(line, m, line_re));
    seen[std::stoi(m[1])] = {std::stoi(m[2]), std::stoi(m[3])};
  }
  CHECK(seen == expected);
  auto ns = namespace_by_rank(r.out);
  REQUIRE(ns.size() == 6);
  CHECK(ns[1] == ns[2]);
  CHECK(ns[3] == ns[4]);
  CHECK(ns[4] == ns[5]);
  CHECK(std::set<std::string>{ns[0], ns[1], ns[3]}.size() == 3);
  CHECK(namespaces_of(pid).empty());
}

TEST_CASE("a rank sees only its node's interfaces, lo and eth0, in /sys/class/net") {
  if (skip_without_netns()) return;
  pid_t pid = 0;
  auto r = run_nodes("--nodes 2 -n 1 sh -c 'echo $(ls /sys/class/net)'", pid);
  CHECK(r.exit_code == 0);
  auto lines = lines_of(r.out);
  CHECK(contains(lines, "[0] eth0 lo"));
  CHECK(contains(lines, "[1] eth0 lo"));
}

TEST_CASE("ranks on every node reach rank 0's listener at CHORUS_MASTER_ADDR") {
  if (skip_without_netns()) return;
  pid_t pid = 0;
  auto r = run_nodes(std::string("--nodes 2 -n 2 '") + NET_PROBE_PATH + "' 1000", pid);
  CHECK(r.exit_code == 0);
  CAPTURE(r.err);
  std::regex line_re(R"(\[0\] got 1000 bytes from rank (\d) at 10\.\d+\.\d+\.(\d+) in .* s)");
  std::map<int, int> host_of_rank;  // the last byte of each sender's address
  for (const auto& line : lines_of(r.out)) {
    CAPTURE(line);
    std::smatch m;
    REQUIRE(std::regex_match(line, m, line_re));
    host_of_rank[std::stoi(m[1])] = std::stoi(m[2]);
  }
  // Rank 1 shares node 0 (address .1) with rank 0; ranks 2 and 3 come from node 1 (.2).
  CHECK(host_of_rank == std::map<int, int>{{1, 1}, {2, 2}, {3, 2}});
}

TEST_CASE("--nodes with a wrong -n, a bad count or a bad rate is refused with exit 2") {
  // Usage is checked before anything needs root, so this runs everywhere.
  for (const char* args :
       {"--nodes 1,2 -n 4 true", "--nodes 0 -n 1 true", "--nodes 65 -n 1 true", "--nodes 2 true",
        "--nodes 1,,2 true", "--nodes 1,0 true", "--nodes 2, true", "--nodes 64 -n 17 true",
        "--nodes 2 -n 1 --link-rate fast true", "--nodes 2 -n 1 --link-rate 100 true",
        "--nodes 2 -n 1 --link-rate 3kbit true",
        "-n 2 --link-rate 2gbit true", "-n 2 --net-stats true", "--nodes 2 -n 1"}) {
    check_usage_error(args);
  }
  auto r = run("--nodes 1,2 -n 4 true");
  CHECK(r.err.find("-n 4 does not match --nodes, which lists 3 ranks") != std::string::npos);
}

TEST_CASE("--nodes without root is refused with a clear message and exit 2") {
  std::string as_user;  // how to run chorus-run without root's capabilities
  if (::geteuid() == 0) {
    if (run_shell("command -v setpriv").exit_code != 0) {
      MESSAGE("skipped: running as root and setpriv (util-linux) is missing to drop root");
      return;
    }
    as_user = "setpriv --reuid=65534 --regid=65534 --clear-groups --inh-caps=-all ";
  }
  auto r = run_shell(as_user + chorus_run() + " --nodes 2 -n 1 true");
  if (r.exit_code == 126 || r.exit_code == 127) {
    MESSAGE("skipped: user nobody cannot run " << CHORUS_RUN_PATH << ": " << r.err);
    return;
  }
  CHECK(r.exit_code == 2);
  CHECK(r.err ==
        "chorus-run: --nodes needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN) to create network "
        "namespaces\n");
}

TEST_CASE("a failing rank under --nodes still removes every namespace and leaves no link") {
  if (skip_without_netns()) return;
  auto links_before = root_links();
  pid_t pid = 0;
  // Rank 0 shows that the switch and both nodes existed while the ranks ran.
  auto r = run_nodes(
      "--nodes 2 -n 2 sh -c 'echo $(readlink /proc/self/ns/net); "
      "if [ $CHORUS_RANK = 0 ]; then ls /var/run/netns | grep -c \"^chorus-$PPID-\"; fi; "
      "if [ $CHORUS_RANK = 3 ]; then sleep 0.3; exit 3; fi; exec sleep 100'",
      pid);
  CHECK(r.exit_code == 1);
  CHECK(r.seconds < 5.0);
  CHECK(r.err.find("chorus-run: rank 3 exited with status 3") != std::string::npos);
  CHECK(contains(lines_of(r.out), "[0] 3"));
  CHECK(namespaces_of(pid).empty());
  CHECK(root_links() == links_before);
  auto ns = namespace_by_rank(r.out);
  CHECK(ns.size() == 4);
  for (const auto& rank_ns : ns) {
    CAPTURE(rank_ns.first);
    CHECK(processes_in(rank_ns.second) == 0);
  }
}

TEST_CASE("SIGTERM to chorus-run under --nodes stops the ranks and removes the namespaces") {
  if (skip_without_netns()) return;
  scratch_dir dir;
  auto links_before = root_links();
  pid_t pid = 0;
  auto r = run_nodes("--nodes 2 -n 1 sh -c 'readlink /proc/self/ns/net > " + dir.path +
                         "/ns.$CHORUS_RANK; exec sleep 100'",
                     pid,
                     "for i in $(seq 200); do [ -s " + dir.path + "/ns.0 ] && [ -s " + dir.path +
                         "/ns.1 ] && break; sleep 0.05; done; kill -TERM $p;");
  CHECK(r.exit_code == 128 + SIGTERM);
  CHECK(r.err.find("got SIGTERM") != std::string::npos);
  CHECK(namespaces_of(pid).empty());
  CHECK(root_links() == links_before);
  for (const char* rank : {"0", "1"}) {
    std::string ns = read_file(dir.path + "/ns." + rank);
    REQUIRE_MESSAGE(!ns.empty(), "rank " << rank << " did not start");
    ns.pop_back();  // the newline
    CHECK(processes_in(ns) == 0);
  }
}

TEST_CASE("SIGINT while 64 nodes are being built removes what was built") {
  if (skip_without_netns()) return;
  pid_t pid = 0;
  // Building 64 nodes takes seconds; if this machine is faster, the signal reaches the
  // ranks instead, and the namespaces must go all the same.
  auto r = run_nodes("--nodes 64 -n 1 sleep 100", pid, "sleep 0.3; kill -INT $p;");
  CHECK(r.exit_code == 128 + SIGINT);
  CHECK(r.err.find("got SIGINT") != std::string::npos);
  CHECK(namespaces_of(pid).empty());
}

TEST_CASE("--timeout under --nodes stops the ranks, exits 124 and removes the namespaces") {
  if (skip_without_netns()) return;
  pid_t pid = 0;
  auto r = run_nodes("--nodes 2 -n 1 --timeout 0.5 sleep 100", pid);
  CHECK(r.exit_code == 124);
  CHECK(r.seconds < 5.0);
  CHECK(namespaces_of(pid).empty());
}

TEST_CASE("namespaces of a SIGKILLed chorus-run are removed by the next run; a live run's stay") {
  if (skip_without_netns()) return;
  scratch_dir dir;
  pid_t killed = 0;
  run_nodes("--nodes 2 -n 1 sh -c 'echo > " + dir.path + "/up.$CHORUS_RANK; exec sleep 100'",
            killed,
            "for i in $(seq 200); do [ -e " + dir.path + "/up.0 ] && [ -e " + dir.path +
                "/up.1 ] && break; sleep 0.05; done; kill -KILL $p;");
  REQUIRE(namespaces_of(killed).size() == 3);  // the switch and two nodes, left behind
  // A namespace named for a live process (this test) must survive the sweep.
  const std::string live = "chorus-" + std::to_string(::getpid()) + "-0";
  REQUIRE(run_shell(with_sbin + "ip netns add " + live).exit_code == 0);

  auto r = run("--nodes 1 -n 1 true");
  CHECK(r.exit_code == 0);
  CHECK(r.err.find("removed") != std::string::npos);
  CHECK(namespaces_of(killed).empty());
  CHECK(namespaces_of(::getpid()) == std::vector<std::string>{live});
  run_shell(with_sbin + "ip netns del " + live);
}

TEST_CASE("--link-rate puts a tbf qdisc with that rate on both ends of every node's link") {
  if (skip_without_netns(true)) return;
  scratch_dir dir;
  pid_t pid = 0;
  // The ranks show their side; the switch side is read from outside while they wait.
  auto r = run_nodes("--nodes 2 -n 1 --link-rate 2gbit sh -c 'tc qdisc show dev eth0; echo > " +
                         dir.path + "/up.$CHORUS_RANK; while [ ! -e " + dir.path +
                         "/done ]; do sleep 0.05; done'",
                     pid,
                     "for i in $(seq 200); do [ -e " + dir.path + "/up.0 ] && [ -e " + dir.path +
                         "/up.1 ] && break; sleep 0.05; done; tc -n chorus-$p-sw qdisc show > " +
                         dir.path + "/switch; touch " + dir.path + "/done;");
  CHECK(r.exit_code == 0);
  CAPTURE(r.out);
  CAPTURE(r.err);
  std::regex tbf_2gbit(R"(.*qdisc tbf [0-9a-f]+: (dev (\S+) )?root .*rate 2Gbit.*)");
  std::set<std::string> shaped;
  for (const auto& line : lines_of(r.out)) {
    std::smatch m;
    if (std::regex_match(line, m, tbf_2gbit)) shaped.insert(line.substr(0, 3));
  }
  CHECK(shaped == std::set<std::string>{"[0]", "[1]"});
  std::set<std::string> ports;
  CAPTURE(read_file(dir.path + "/switch"));
  for (const auto& line : lines_of(read_file(dir.path + "/switch"))) {
    std::smatch m;
    if (std::regex_match(line, m, tbf_2gbit)) ports.insert(m[2]);
  }
  CHECK(ports == std::set<std::string>{"node0", "node1"});
}

TEST_CASE("--net-stats counts the bytes that crossed each node's link, and their total") {
  if (skip_without_netns()) return;
  pid_t pid = 0;
  auto r =
      run_nodes(std::string("--nodes 2 -n 1 --net-stats '") + NET_PROBE_PATH + "' 1000000", pid);
  CHECK(r.exit_code == 0);
  auto stats = net_stats(r.err);
  CAPTURE(r.err);
  REQUIRE(stats.size() == 3);
  auto [tx0, rx0] = stats[0];
  auto [tx1, rx1] = stats[1];
  // Node 1 sent the megabyte plus TCP/IP headers; node 0 sent little more than ACKs.
  CHECK(tx1 >= 1000000);
  CHECK(tx1 < 1100000);
  CHECK(tx0 < 100000);
  // With two nodes, whatever one sends the other receives.
  CHECK(rx0 == tx1);
  CHECK(rx1 == tx0);
  CHECK(stats[-1] == std::pair<long long, long long>{tx0 + tx1, rx0 + rx1});
}

TEST_CASE("--link-rate caps the bytes per second between nodes") {
  if (skip_without_netns(true)) return;
  pid_t pid = 0;
  // 8 mbit/s is 1 MB/s: 1.5 MB take about 1.4 s after the first burst, where an unshaped
  // veth carries them in milliseconds.
  auto r = run_nodes(
      std::string("--nodes 2 -n 1 --link-rate 8mbit '") + NET_PROBE_PATH + "' 1500000", pid);
  CHECK(r.exit_code == 0);
  std::regex line_re(R"(\[0\] got 1500000 bytes from rank 1 at \S+ in (\S+) s)");
  std::smatch m;
  std::string out = r.out.substr(0, r.out.find('\n'));
  CAPTURE(r.out);
  REQUIRE(std::regex_match(out, m, line_re));
  double seconds = std::stod(m[1]);
  CHECK(seconds > 1.0);
  CHECK(seconds < 5.0);
}

TEST_CASE("a failing tc is named with its output, and what was built is removed") {
  if (skip_without_netns()) return;
  scratch_dir dir;
  // A tc, first in PATH, that fails as a real one would and notes its parent, chorus-run.
  REQUIRE(run_shell("printf '#!/bin/sh\\necho $PPID > " + dir.path +
                    "/chorus-run.pid\\necho \"Error: no tbf here\" >&2\\nexit 2\\n' > " +
                    dir.path + "/tc && chmod +x " + dir.path + "/tc")
              .exit_code == 0);
  auto r = run_shell(with_sbin + "PATH='" + dir.path + "':$PATH " + chorus_run() +
                     " --nodes 2 -n 1 --link-rate 2gbit true");
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("chorus-run: cannot build the emulated nodes: command 'tc -n chorus-") == 0);
  CHECK(r.err.find(" qdisc add dev eth0 root tbf rate 2000000000bit ") != std::string::npos);
  CHECK(r.err.find("failed (exit status 2): Error: no tbf here") != std::string::npos);
  std::string pid = read_file(dir.path + "/chorus-run.pid");
  REQUIRE(!pid.empty());
  CHECK(namespaces_of(static_cast<pid_t>(std::stol(pid))).empty());
}
