// SPDX-License-Identifier: Apache-2.0
// Emulated nodes for chorus-run --nodes: namespaces, veth pairs, a bridge and tbf shaping,
// built and torn down with `ip` and `tc`.
#include "emulated_network.hpp"

#include "command.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace chorus_run {

namespace {

// Where `ip netns add` mounts a namespace so that it outlives its processes.
constexpr std::string_view netns_dir = "/var/run/netns/";
constexpr std::string_view name_prefix = "chorus-";
constexpr std::string_view bridge = "br0";

// Capability bits, from <linux/capability.h>, spelled out to keep that header out.
constexpr int cap_net_admin = 12;  // create links, addresses, qdiscs
constexpr int cap_sys_admin = 21;  // create and enter namespaces, mount /sys

// tbf's queue behind the rate: as deep as 50 ms of traffic at the link rate, so that one TCP
// stream keeps the link busy, like a switch port's buffer.
constexpr std::uint64_t queue_ms = 50;
// The tbf burst is 1 ms at the link rate, but at least 128 KiB: one GSO packet on a veth is
// up to 64 KiB, and a burst smaller than a packet makes tbf cut it up (or drop it).
constexpr std::uint64_t min_burst = 128 * 1024;
// tc keeps both in 32-bit fields; these bounds keep them there and bind only beyond
// 100 gbit/s.
constexpr std::uint64_t max_burst = 64ull << 20;
constexpr std::uint64_t max_queue = 1ull << 30;

std::string netns_path(std::string_view name) { return std::string(netns_dir) + std::string(name); }

bool exists(const std::string& path) {
  struct stat st{};
  return ::stat(path.c_str(), &st) == 0;
}

// `name` as an executable in PATH, then in /usr/sbin and /sbin: on Debian, `su` without `-`
// leaves root a PATH without the sbin directories where `ip` and `tc` live.
std::string find_tool(std::string_view name) {
  std::string dirs;
  if (const char* path = std::getenv("PATH")) dirs = path;
  dirs += ":/usr/sbin:/sbin";
  std::istringstream in(dirs);
  for (std::string dir; std::getline(in, dir, ':');) {
    if (dir.empty()) continue;
    std::string candidate = dir + "/" + std::string(name);
    struct stat st{};
    if (::stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
        ::access(candidate.c_str(), X_OK) == 0) {
      return candidate;
    }
  }
  return {};
}

// Bit `cap` of this process's effective capabilities, from the CapEff line of
// /proc/self/status.
bool have_capability(int cap) {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("CapEff:", 0) != 0) continue;
    std::string_view hex = std::string_view(line).substr(7);
    while (!hex.empty() && (hex.front() == '\t' || hex.front() == ' ')) hex.remove_prefix(1);
    std::uint64_t bits = 0;
    auto [end, ec] = std::from_chars(hex.data(), hex.data() + hex.size(), bits, 16);
    return ec == std::errc{} && ((bits >> cap) & 1u) != 0;
  }
  return false;
}

// True while `pid` runs: it exists and is not a zombie (a killed chorus-run whose parent has
// not reaped it yet is gone for our purposes).
bool process_alive(pid_t pid) {
  if (::kill(pid, 0) != 0 && errno == ESRCH) return false;
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  std::getline(in, stat);
  auto close_paren = stat.rfind(')');
  if (close_paren == std::string::npos || close_paren + 2 >= stat.size()) return !stat.empty();
  return stat[close_paren + 2] != 'Z';
}

// The pid in a namespace name "chorus-<pid>-<suffix>"; nullopt for any other name.
std::optional<pid_t> owner_of(std::string_view name) {
  if (name.substr(0, name_prefix.size()) != name_prefix) return std::nullopt;
  name.remove_prefix(name_prefix.size());
  pid_t pid = 0;
  auto [end, ec] = std::from_chars(name.data(), name.data() + name.size(), pid);
  if (ec != std::errc{} || pid <= 0) return std::nullopt;
  std::string_view rest(end, static_cast<std::size_t>(name.data() + name.size() - end));
  if (rest.size() < 2 || rest[0] != '-') return std::nullopt;
  return pid;
}

// The network namespace chorus-run started in, to come back to after with_namespace().
int home_namespace() {
  static const int fd = ::open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
  return fd;
}

// Runs `fn` with this (single-threaded) process inside the network namespace `fd`: files
// under /proc/thread-self/net and /proc/sys/net are opened in the namespace of the opener,
// which saves a fork for reading counters and writing sysctls.
template <typename F>
void with_namespace(int fd, F&& fn) {
  int home = home_namespace();
  if (home < 0) throw std::runtime_error(std::string("/proc/self/ns/net: ") + std::strerror(errno));
  if (::setns(fd, CLONE_NEWNET) != 0) {
    throw std::runtime_error(std::string("setns: ") + std::strerror(errno));
  }
  struct go_home {
    int home;
    ~go_home() {
      // Failing to return would leave every later `ip` in the wrong namespace; with the
      // capability to leave, coming back cannot fail, so this is only a safety net.
      if (::setns(home, CLONE_NEWNET) != 0) std::abort();
    }
  } guard{home};
  fn();
}

// Turns IPv6 off in the namespace `fd` for every interface made after this: without it, each
// node and the bridge send router solicitations and multicast reports of their own, which
// would show up in --net-stats as traffic no rank sent. A kernel without IPv6 has no files.
void disable_ipv6(int fd) {
  with_namespace(fd, [] {
    for (const char* knob : {"/proc/sys/net/ipv6/conf/all/disable_ipv6",
                             "/proc/sys/net/ipv6/conf/default/disable_ipv6"}) {
      int f = ::open(knob, O_WRONLY | O_CLOEXEC);
      if (f < 0) continue;
      [[maybe_unused]] ssize_t n = ::write(f, "1", 1);
      ::close(f);
    }
  });
}

}  // namespace

std::optional<std::uint64_t> parse_link_rate(std::string_view text) {
  // tc's own table (tc_util.c), matched ignoring case as tc does: "mbps" is megabytes/s.
  struct unit {
    std::string_view name;
    double bits;
  };
  static constexpr unit units[] = {
      {"bit", 1.},
      {"kibit", 1024.},
      {"kbit", 1e3},
      {"mibit", 1048576.},
      {"mbit", 1e6},
      {"gibit", 1073741824.},
      {"gbit", 1e9},
      {"tibit", 1099511627776.},
      {"tbit", 1e12},
      {"bps", 8.},
      {"kibps", 8. * 1024},
      {"kbps", 8e3},
      {"mibps", 8. * 1048576},
      {"mbps", 8e6},
      {"gibps", 8. * 1073741824},
      {"gbps", 8e9},
      {"tibps", 8. * 1099511627776.},
      {"tbps", 8e12},
  };
  double value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc{} || end == text.data()) return std::nullopt;
  std::string suffix(end, static_cast<std::size_t>(text.data() + text.size() - end));
  std::transform(suffix.begin(), suffix.end(), suffix.begin(),
                 [](char c) { return static_cast<char>(c >= 'A' && c <= 'Z' ? c + 32 : c); });
  for (const auto& u : units) {
    if (suffix != u.name) continue;
    double bits = value * u.bits;
    // tc's tbf keeps a burst's sending time in 32 bits of its clock, about 274 s: below
    // 4 kbit/s the 128 KiB burst (min_burst) wraps (tc showed 27992 bytes at 3 kbit), and tbf
    // drops every packet larger than that. 8 kbit/s leaves twice the margin. No veth carries
    // 10 tbit/s.
    if (!std::isfinite(bits) || bits < 8e3 || bits > 1e13) return std::nullopt;
    return static_cast<std::uint64_t>(std::llround(bits));
  }
  return std::nullopt;
}

std::optional<std::string> why_no_emulated_network(bool need_tc) {
  if (!have_capability(cap_net_admin) || !have_capability(cap_sys_admin)) {
    return "--nodes needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN) to create network namespaces";
  }
  if (find_tool("ip").empty()) {
    return "--nodes needs the 'ip' command (package iproute2); it is not in PATH, /usr/sbin "
           "or /sbin";
  }
  if (need_tc && find_tool("tc").empty()) {
    return "--link-rate needs the 'tc' command (package iproute2); it is not in PATH, "
           "/usr/sbin or /sbin";
  }
  return std::nullopt;
}

int remove_stale_namespaces(pid_t self) {
  std::string ip = find_tool("ip");
  DIR* dir = ::opendir(std::string(netns_dir).c_str());
  if (ip.empty() || dir == nullptr) {
    if (dir != nullptr) ::closedir(dir);
    return 0;
  }
  std::vector<std::string> stale;
  while (const dirent* entry = ::readdir(dir)) {
    auto pid = owner_of(entry->d_name);
    if (pid && (*pid == self || !process_alive(*pid))) stale.emplace_back(entry->d_name);
  }
  ::closedir(dir);
  int removed = 0;
  // Two runs starting together may race for the same stale name; losing is fine.
  for (const auto& name : stale) removed += run_command({ip, "netns", "del", name}).ok ? 1 : 0;
  return removed;
}

const char* describe(enter_step step) {
  switch (step) {
    case enter_step::none:
      break;
    case enter_step::setns:
      return "cannot enter its network namespace (setns)";
    case enter_step::unshare:
      return "cannot get a mount namespace (unshare)";
    case enter_step::mount_private:
      return "cannot make its mounts private (mount /)";
    case enter_step::mount_sys:
      return "cannot mount /sys for its network namespace";
  }
  return "";
}

enter_step enter_node_namespace(int netns_fd) {
  if (::setns(netns_fd, CLONE_NEWNET) != 0) return enter_step::setns;
  // A sysfs mount shows the interfaces of the namespace that mounted it; ours would still
  // list the host's. Mount a fresh one in a mount namespace of the rank's own, after making
  // sure none of it propagates back to the host.
  if (::unshare(CLONE_NEWNS) != 0) return enter_step::unshare;
  if (::mount("", "/", "none", MS_SLAVE | MS_REC, nullptr) != 0) return enter_step::mount_private;
  unsigned long flags = 0;
  if (::umount2("/sys", MNT_DETACH) != 0) {
    // Not unmountable (a container's locked mount): mount over it, read-only if it was, as a
    // read-write mount cannot shadow a read-only one there.
    struct statvfs st{};
    if (::statvfs("/sys", &st) == 0 && (st.f_flag & ST_RDONLY) != 0) flags = MS_RDONLY;
  }
  if (::mount("sysfs", "/sys", "sysfs", flags, nullptr) != 0) return enter_step::mount_sys;
  return enter_step::none;
}

emulated_network::emulated_network(pid_t owner, int nodes,
                                   std::optional<std::uint64_t> link_rate_bits)
    : owner_(owner),
      nodes_(nodes),
      link_rate_bits_(link_rate_bits),
      ip_(find_tool("ip")),
      tc_(find_tool("tc")),
      node_fds_(static_cast<std::size_t>(nodes), -1) {}

emulated_network::~emulated_network() { tear_down(); }

std::string emulated_network::namespace_name(std::string_view suffix) const {
  return std::string(name_prefix) + std::to_string(owner_) + "-" + std::string(suffix);
}

std::string emulated_network::address(int node) const {
  auto pid = static_cast<unsigned>(owner_);
  return "10." + std::to_string((pid >> 8) & 0xffu) + "." + std::to_string(pid & 0xffu) + "." +
         std::to_string(node + 1);
}

int emulated_network::add_namespace(const std::string& name) {
  // Listed before it exists: if `ip netns add` fails half-way, tear_down() still looks.
  created_.push_back(name);
  run_checked({ip_, "netns", "add", name});
  int fd = ::open(netns_path(name).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error(netns_path(name) + ": " + std::strerror(errno));
  try {
    disable_ipv6(fd);
  } catch (...) {
    ::close(fd);
    throw;
  }
  return fd;
}

void emulated_network::shape(const std::string& netns, std::string_view dev) {
  std::uint64_t bytes_per_s = *link_rate_bits_ / 8;
  std::uint64_t burst = std::clamp(bytes_per_s / 1000, min_burst, max_burst);
  std::uint64_t queue = std::min(burst + bytes_per_s * queue_ms / 1000, max_queue);
  run_checked({tc_, "-n", netns, "qdisc", "add", "dev", std::string(dev), "root", "tbf", "rate",
               std::to_string(*link_rate_bits_) + "bit", "burst", std::to_string(burst), "limit",
               std::to_string(queue)});
}

void emulated_network::add_node(int node) {
  const std::string sw = namespace_name("sw");
  const std::string netns = namespace_name(std::to_string(node));
  const std::string port = "node" + std::to_string(node);  // the switch-side end
  const std::string eth(node_interface);
  node_fds_[static_cast<std::size_t>(node)] = add_namespace(netns);
  // Both ends are created where they live: nothing passes through the root namespace.
  run_checked(
      {ip_, "-n", sw, "link", "add", port, "type", "veth", "peer", "name", eth, "netns", netns});
  run_checked({ip_, "-n", sw, "link", "set", port, "master", std::string(bridge), "up"});
  run_checked({ip_, "-n", netns, "addr", "add", address(node) + "/24", "dev", eth});
  run_checked({ip_, "-n", netns, "link", "set", eth, "up"});
  run_checked({ip_, "-n", netns, "link", "set", "lo", "up"});
  if (link_rate_bits_) {
    // A qdisc shapes what leaves an interface: the node's eth0 caps what the node sends, the
    // switch port caps what it receives.
    shape(netns, eth);
    shape(sw, port);
  }
}

bool emulated_network::build(const std::function<bool()>& interrupted) {
  if (ip_.empty()) throw std::runtime_error("the 'ip' command is not installed");
  if (link_rate_bits_ && tc_.empty()) throw std::runtime_error("the 'tc' command is not installed");
  const std::string sw = namespace_name("sw");
  ::close(add_namespace(sw));  // only the ranks and --net-stats enter namespaces later
  // With STP off (the default), a bridge forwards on a port as soon as the port is up.
  // Without IGMP snooping it floods multicast like a plain switch, and it sends no IGMP of
  // its own, which would show in --net-stats as bytes no rank sent.
  run_checked(
      {ip_, "-n", sw, "link", "add", std::string(bridge), "type", "bridge", "mcast_snooping", "0"});
  run_checked({ip_, "-n", sw, "link", "set", std::string(bridge), "up"});
  for (int node = 0; node < nodes_; ++node) {
    if (interrupted()) return false;
    add_node(node);
  }
  return !interrupted();
}

link_counters emulated_network::counters(int node) const {
  std::string dev;
  with_namespace(namespace_fd(node), [&] {
    std::ifstream in("/proc/thread-self/net/dev");
    std::stringstream text;
    text << in.rdbuf();
    dev = text.str();
  });
  // One line per interface: "  eth0: <8 receive fields> <8 transmit fields>", bytes first.
  const std::string key = std::string(node_interface) + ":";
  std::istringstream lines(dev);
  for (std::string line; std::getline(lines, line);) {
    auto at = line.find(key);
    if (at == std::string::npos || line.find_first_not_of(' ') != at) continue;
    std::istringstream fields(line.substr(at + key.size()));
    std::uint64_t f[9] = {};
    for (auto& v : f) fields >> v;
    if (fields) return {.tx_bytes = f[8], .rx_bytes = f[0]};
  }
  throw std::runtime_error("no " + key + " line in /proc/net/dev of node " + std::to_string(node));
}

std::vector<std::string> emulated_network::tear_down() {
  // Our descriptors would keep the namespaces (and their links) alive after `ip netns del`.
  for (int& fd : node_fds_) {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
  std::vector<std::string> failures;
  // Deleting a namespace deletes its interfaces; deleting one end of a veth deletes the other.
  for (auto it = created_.rbegin(); it != created_.rend(); ++it) {
    if (!exists(netns_path(*it))) continue;
    command_result r = run_command({ip_, "netns", "del", *it});
    if (!r.ok) {
      failures.push_back("cannot delete network namespace " + *it + " (" + r.verdict + ")" +
                         (r.output.empty() ? "" : ": " + r.output));
    }
  }
  created_.clear();
  return failures;
}

}  // namespace chorus_run
