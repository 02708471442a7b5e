// SPDX-License-Identifier: Apache-2.0
// Socket addresses and the choice of the local one: shared by the TCP transport and the
// heartbeat, which both bind to the interface that reaches the master (or CHORUS_SOCKET_IFNAME).
#pragma once

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>
#include <system_error>

#include "chorus/bootstrap/detail/handshake.hpp"  // auth_id, auth_random
#include "chorus/bootstrap/store.hpp"
#include "chorus/detail/socket.hpp"  // unique_fd, store_resolve
#include "chorus/error.hpp"

namespace chorus::detail {

/// A socket address that fits IPv4 and IPv6.
struct sock_addr {
  sockaddr_storage storage{};
  socklen_t length = 0;

  int family() const { return storage.ss_family; }
  const sockaddr* get() const { return reinterpret_cast<const sockaddr*>(&storage); }
  sockaddr* get() { return reinterpret_cast<sockaddr*>(&storage); }

  std::string host() const {
    char buf[INET6_ADDRSTRLEN] = {};
    const void* a = family() == AF_INET6
                        ? static_cast<const void*>(&reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_addr)
                        : static_cast<const void*>(&reinterpret_cast<const sockaddr_in*>(&storage)->sin_addr);
    ::inet_ntop(family(), a, buf, sizeof buf);
    return buf;
  }
  std::uint16_t port() const {
    return ntohs(family() == AF_INET6 ? reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_port
                                      : reinterpret_cast<const sockaddr_in*>(&storage)->sin_port);
  }
  void set_port(std::uint16_t p) {
    if (family() == AF_INET6) {
      reinterpret_cast<sockaddr_in6*>(&storage)->sin6_port = htons(p);
    } else {
      reinterpret_cast<sockaddr_in*>(&storage)->sin_port = htons(p);
    }
  }
  /// "host:port", with IPv6 hosts in brackets.
  std::string str() const {
    return (family() == AF_INET6 ? "[" + host() + "]" : host()) + ":" + std::to_string(port());
  }
};

/// Resolves a numeric or named host and a port: the first address store_resolve finds.
inline sock_addr resolve(const std::string& host, std::uint16_t port) {
  std::string reason;
  const auto found = store_resolve(host, port, reason);
  if (found.empty()) {
    throw error(errc::invalid_argument, reason, {}, std::nullopt, "getaddrinfo");
  }
  sock_addr a;
  a.storage = found.front().storage;
  a.length = found.front().length;
  return a;
}

/// Parses "host:port" or "[v6]:port" as published in the store.
inline sock_addr parse_host_port(const std::string& s) {
  const auto colon = s.rfind(':');
  if (colon == std::string::npos || colon + 1 >= s.size()) {
    throw error(errc::protocol, "bad address '" + s + "' in the store");
  }
  std::string host = s.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  // The store is written by peers: parse without exceptions other than chorus::error.
  unsigned long port = 0;
  const char* first = s.data() + colon + 1;
  const char* last = s.data() + s.size();
  const auto [end, ec] = std::from_chars(first, last, port);
  if (ec != std::errc{} || end != last || port == 0 || port > 65535) {
    throw error(errc::protocol, "bad port in '" + s + "'");
  }
  return resolve(host, static_cast<std::uint16_t>(port));
}

/// The address our listener binds: the first address of interface `ifname` when given,
/// else the local address the kernel would use to reach the master (so the data path uses
/// the same network as the store, and loopback jobs stay on loopback).
inline sock_addr choose_local_address(const std::string& ifname, const sock_addr& master) {
  if (!ifname.empty()) {
    ifaddrs* list = nullptr;
    if (::getifaddrs(&list) != 0) throw sys_error("getifaddrs");
    sock_addr found;
    std::string names;
    for (ifaddrs* it = list; it != nullptr; it = it->ifa_next) {
      if (it->ifa_addr == nullptr) continue;
      const int fam = it->ifa_addr->sa_family;
      if (fam != AF_INET && fam != AF_INET6) continue;
      if (names.find(std::string(it->ifa_name) + " ") == std::string::npos) {
        names += std::string(it->ifa_name) + " ";
      }
      // Prefer IPv4, which every peer can reach without a scope id.
      if (ifname == it->ifa_name && (found.length == 0 || (fam == AF_INET && found.family() != AF_INET))) {
        found.length = fam == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
        std::memcpy(&found.storage, it->ifa_addr, found.length);
      }
    }
    ::freeifaddrs(list);
    if (found.length == 0) {
      if (!names.empty()) names.pop_back();
      throw error(errc::invalid_argument, "CHORUS_SOCKET_IFNAME='" + ifname +
                                              "' names no interface with an IP address (have: " +
                                              names + ")");
    }
    found.set_port(0);
    return found;
  }
  unique_fd probe(::socket(master.family(), SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!probe) throw sys_error("socket");
  if (::connect(probe.get(), master.get(), master.length) != 0) {
    throw sys_error("no route to the master " + master.str());
  }
  sock_addr local;
  local.length = sizeof local.storage;
  if (::getsockname(probe.get(), local.get(), &local.length) != 0) throw sys_error("getsockname");
  local.set_port(0);
  return local;
}

/// What publish_addresses() learns: every rank's address, and rank 0's 16 random bytes,
/// which name the group (a communicator's connections, a job's heartbeats) so that what was
/// made for one is refused by another.
struct published_addresses {
  auth_id group{};
  std::vector<sock_addr> addrs;
};

/// A collective over `st`: publishes `local` under `key` and returns every rank's address.
/// `what` names the addresses in the error a malformed entry raises.
inline published_addresses publish_addresses(store& st, std::string_view key, const sock_addr& local,
                                             const std::string& what) {
  auth_id mine_id{};
  auth_random(mine_id);
  const std::string me = local.str();
  std::vector<std::byte> mine(mine_id.begin(), mine_id.end());
  for (char c : me) mine.push_back(static_cast<std::byte>(c));
  const auto all = st.all_gather(key, mine);
  published_addresses out;
  for (const auto& a : all) {
    if (a.size() <= mine_id.size()) throw error(errc::protocol, "a malformed " + what + " in the store");
    out.addrs.push_back(parse_host_port(
        std::string(reinterpret_cast<const char*>(a.data()) + mine_id.size(), a.size() - mine_id.size())));
  }
  std::copy_n(all[0].begin(), out.group.size(), out.group.begin());
  return out;
}

}  // namespace chorus::detail
