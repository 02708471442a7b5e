// SPDX-License-Identifier: Apache-2.0
// Emulated nodes for chorus-run --nodes: one network namespace per node, all joined by veth
// pairs to a bridge in a "switch" namespace of their own, each link optionally rate-capped.
//
// Layout of the run with pid 4242 and two nodes:
//
//   namespace chorus-4242-sw:  br0 ── node0, node1          (switch-side veth ends)
//   namespace chorus-4242-0:   lo, eth0 10.16.146.1/24       (peer of node0)
//   namespace chorus-4242-1:   lo, eth0 10.16.146.2/24       (peer of node1)
//
// Why a switch namespace rather than a bridge in the root namespace: nothing of the run is
// ever visible in the root namespace, so the host's links, addresses, routes and firewall
// never change, and deleting the run's namespaces deletes every link and the bridge with
// them; there is no second list of things to clean up. The nodes cannot reach the host or
// each other's loopback, only each other through the switch, as real nodes would.
//
// Addresses: 10.<pid bits 8..15>.<pid bits 0..7>.<node + 1>/24. Runs can never clash, since
// each has its own switch and no routes outside it; the pid only makes a run's addresses
// recognisable in a capture or a log.
//
// Names carry the pid of the chorus-run that made them ("chorus-<pid>-<node>" and
// "chorus-<pid>-sw"), so a later run can remove what a killed run left behind without
// touching a live run's namespaces.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace chorus_run {

inline constexpr int max_nodes = 64;
// The name of every node's interface, the same on each node, as on a homogeneous cluster.
inline constexpr std::string_view node_interface = "eth0";

// Parses a rate in tc's units ("500mbit", "2gbit", "100mbps" = megabytes/s, case does not
// matter) into bits per second. A bare number is refused: tc reads it as bit/s, which few
// people expect.
std::optional<std::uint64_t> parse_link_rate(std::string_view text);

// Why this process cannot build an emulated network (no CAP_NET_ADMIN or CAP_SYS_ADMIN, no
// `ip`, no `tc` when `need_tc`), as a sentence for the user; nullopt when it can.
std::optional<std::string> why_no_emulated_network(bool need_tc);

// Deletes the namespaces named "chorus-<pid>-..." whose chorus-run no longer runs (or is a
// zombie), and any carrying `self`'s pid: this process owns that pid now, so those are left
// over from an earlier process that had it. Returns how many it removed.
int remove_stale_namespaces(pid_t self);

struct link_counters {
  std::uint64_t tx_bytes = 0;  // sent by the node
  std::uint64_t rx_bytes = 0;  // received by the node
};

class emulated_network {
 public:
  // Plans a network of `nodes` nodes (1..max_nodes) for the run with pid `owner`; creates
  // nothing until build(). `link_rate_bits`: cap each link at this many bit/s each way.
  emulated_network(pid_t owner, int nodes, std::optional<std::uint64_t> link_rate_bits);
  // Tears down whatever is still up; tear_down() first if you want to hear about failures.
  ~emulated_network();
  emulated_network(const emulated_network&) = delete;
  emulated_network& operator=(const emulated_network&) = delete;

  // Creates the switch and the nodes. Throws std::runtime_error naming the command that
  // failed. Asks `interrupted` between steps and returns false as soon as it says yes.
  // Whatever was created is deleted by tear_down() in either case.
  bool build(const std::function<bool()>& interrupted);

  // Node i's address, e.g. "10.16.146.1" for node 0 of run 4242.
  std::string address(int node) const;

  // An O_CLOEXEC descriptor of node i's namespace, for enter_node_namespace().
  int namespace_fd(int node) const { return node_fds_[static_cast<std::size_t>(node)]; }

  // Bytes node i's link carried so far (its eth0 counters). Throws std::runtime_error.
  link_counters counters(int node) const;

  // Deletes every namespace it created, and with them every veth and the bridge. Returns a
  // message per namespace it could not delete.
  std::vector<std::string> tear_down();

 private:
  std::string namespace_name(std::string_view suffix) const;
  // Creates namespace `name` and returns an O_CLOEXEC descriptor of it.
  int add_namespace(const std::string& name);
  void add_node(int node);
  void shape(const std::string& netns, std::string_view dev);

  pid_t owner_;
  int nodes_;
  std::optional<std::uint64_t> link_rate_bits_;
  std::string ip_, tc_;               // absolute paths of the tools
  std::vector<std::string> created_;  // namespaces to delete, in creation order
  std::vector<int> node_fds_;         // -1 until the node's namespace exists
};

// The steps of entering a node that can fail, for the message of a rank that did not start.
enum class enter_step : int { none, setns, unshare, mount_private, mount_sys };
const char* describe(enter_step step);

// Moves the calling process into the node namespace `netns_fd`, with a private mount
// namespace whose /sys shows that namespace's interfaces (what `ip netns exec` does, so that
// /sys/class/net in a rank lists lo and eth0). Meant for the child between fork and exec:
// only system calls, no allocation. Returns the failed step and sets errno, or
// enter_step::none.
enter_step enter_node_namespace(int netns_fd);

}  // namespace chorus_run
