// SPDX-License-Identifier: Apache-2.0
// Wiring of the TCP transport: listen, publish, dial the higher ranks, accept the lower.
#pragma once

#include <sys/epoll.h>

#include <cstdio>
#include <string>
#include <vector>

#include <chorus/transport/tcp.hpp>

namespace chorus {
namespace detail {

/// The first bytes on every data connection. Sent by the dialler; checked field by field by
/// the acceptor before the connection is used. (The authentication handshake goes here.)
struct tcp_hello {
  std::uint32_t magic = 0x48524843;  // "CHRH"
  std::uint32_t version = 1;
  std::uint32_t rank = 0;
  std::uint32_t index = 0;
  std::uint32_t size = 0;
};

inline void tune_socket(int fd, const tcp_options& o) {
  set_int_option(fd, IPPROTO_TCP, TCP_NODELAY, 1, "setsockopt(TCP_NODELAY)");
  if (o.rto_min_us > 0) {
    // Linux >= 6.15 lets a socket lower its minimum retransmission timeout (200 ms by
    // default, a WAN-sized number). Loopback and datacenter links reorder packets now and
    // then; each spurious loss then stalls the stream for the whole RTO. Older kernels lack
    // the option: keep their default silently.
    constexpr int tcp_rto_min_us = 45;
    ::setsockopt(fd, IPPROTO_TCP, tcp_rto_min_us, &o.rto_min_us, sizeof o.rto_min_us);
  }
  if (!o.congestion.empty()) {
    if (::setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, o.congestion.data(),
                     static_cast<socklen_t>(o.congestion.size())) != 0) {
      throw sys_error("CHORUS_TCP_CONGESTION='" + o.congestion + "': setsockopt(TCP_CONGESTION)");
    }
  }
  if (o.buffer_bytes > 0) {
    set_int_option(fd, SOL_SOCKET, SO_SNDBUF, o.buffer_bytes, "setsockopt(SO_SNDBUF)");
    set_int_option(fd, SOL_SOCKET, SO_RCVBUF, o.buffer_bytes, "setsockopt(SO_RCVBUF)");
  }
}

}  // namespace detail

inline tcp_transport tcp_transport::connect(tcp_store& store, const launch_info& info,
                                            const tcp_options& opts) {
  return connect(store, info, std::vector<bool>(static_cast<std::size_t>(info.size), true), opts);
}

inline tcp_transport tcp_transport::connect(tcp_store& store, const launch_info& info,
                                            const std::vector<bool>& wanted,
                                            const tcp_options& opts) {
  using namespace detail;
  if (wanted.size() != static_cast<std::size_t>(info.size)) {
    throw error(errc::invalid_argument, "tcp_transport::connect: wanted has " +
                                            std::to_string(wanted.size()) + " entries for " +
                                            std::to_string(info.size) + " ranks");
  }
  tcp_transport t;
  t.rank_ = info.rank;
  t.size_ = info.size;
  t.opts_ = opts;
  const auto n = static_cast<std::size_t>(info.size);
  const auto k = static_cast<std::size_t>(opts.conns);
  t.conns_.resize(n * k);
  t.send_seq_.assign(n, 0);
  t.recv_seq_.assign(n, 0);
  t.epoll_ = unique_fd(::epoll_create1(EPOLL_CLOEXEC));
  if (!t.epoll_) throw sys_error("epoll_create1");
  const auto deadline = clock::now() + opts.connect_timeout;

  // 1. Listen on the chosen interface, never on every address.
  const sock_addr master = resolve(info.master_addr.empty() ? "127.0.0.1" : info.master_addr,
                                   info.master_port);
  sock_addr local = choose_local_address(opts.ifname, master);
  unique_fd listener(::socket(local.family(), SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!listener) throw sys_error("socket");
  if (::bind(listener.get(), local.get(), local.length) != 0) {
    throw sys_error("bind to " + local.str());
  }
  if (::listen(listener.get(), 1024) != 0) throw sys_error("listen");
  local.length = sizeof local.storage;
  ::getsockname(listener.get(), local.get(), &local.length);
  t.local_ = local;

  // 2. Publish our address; learn everyone's.
  const std::string me = local.str();
  const auto all = store.all_gather(
      "chorus/tcp/addr", std::as_bytes(std::span<const char>(me.data(), me.size())));
  std::vector<sock_addr> addrs;
  for (const auto& a : all) {
    addrs.push_back(parse_host_port(std::string(reinterpret_cast<const char*>(a.data()), a.size())));
  }

  auto install = [&](unique_fd fd, std::size_t peer, std::size_t idx) {
    tune_socket(fd.get(), opts);
    set_nonblocking(fd.get());
    auto c = std::make_unique<tcp_connection>(std::move(fd), info.rank, static_cast<int>(peer));
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET;
    ev.data.ptr = c.get();
    if (::epoll_ctl(t.epoll_.get(), EPOLL_CTL_ADD, c->fd(), &ev) != 0) throw sys_error("epoll_ctl");
    t.conns_[peer * k + idx] = std::move(c);
  };

  // 3. Dial every higher rank. connect() completes in the peer's backlog, so dialling all
  //    before accepting any cannot deadlock.
  for (std::size_t peer = static_cast<std::size_t>(info.rank) + 1; peer < n; ++peer) {
    if (!wanted[peer]) continue;
    for (std::size_t idx = 0; idx < k; ++idx) {
      unique_fd fd;
      for (;;) {
        fd = unique_fd(::socket(addrs[peer].family(), SOCK_STREAM | SOCK_CLOEXEC, 0));
        if (!fd) throw sys_error("socket");
        if (::connect(fd.get(), addrs[peer].get(), addrs[peer].length) == 0) break;
        const int err = errno;
        if ((err != ECONNREFUSED && err != EINTR && err != ETIMEDOUT && err != EAGAIN) ||
            clock::now() > deadline) {
          throw error(errc::bootstrap,
                      "cannot connect to rank " + std::to_string(peer) + " at " +
                          addrs[peer].str() + ": " + std::strerror(err),
                      {static_cast<int>(peer)}, std::nullopt, "connect");
        }
        ::usleep(10000);
      }
      tcp_hello hello;
      hello.rank = static_cast<std::uint32_t>(info.rank);
      hello.index = static_cast<std::uint32_t>(idx);
      hello.size = static_cast<std::uint32_t>(info.size);
      if (send_all(fd.get(), {{&hello, sizeof hello}}, deadline).status != io_status::ok) {
        throw error(errc::bootstrap,
                    "cannot send the hello to rank " + std::to_string(peer) + " at " +
                        addrs[peer].str(),
                    {static_cast<int>(peer)}, std::nullopt, "connect");
      }
      install(std::move(fd), peer, idx);
    }
  }

  // 4. Accept the lower ranks' connections, checking each hello.
  std::size_t expected = 0;
  for (std::size_t peer = 0; peer < static_cast<std::size_t>(info.rank); ++peer) {
    if (wanted[peer]) expected += k;
  }
  while (expected > 0) {
    if (wait_fd(listener.get(), POLLIN, deadline).status != io_status::ok) {
      std::string missing;
      for (std::size_t peer = 0; peer < static_cast<std::size_t>(info.rank); ++peer) {
        for (std::size_t idx = 0; idx < k && wanted[peer]; ++idx) {
          if (!t.conns_[peer * k + idx]) {
            missing += (missing.empty() ? "" : ", ") + std::to_string(peer);
            break;
          }
        }
      }
      throw error(errc::bootstrap,
                  "rank " + std::to_string(info.rank) + " at " + local.str() +
                      " timed out waiting for connections from ranks " + missing,
                  {}, std::nullopt, "accept");
    }
    sock_addr from;
    from.length = sizeof from.storage;
    // Non-blocking, so that recv_exact below keeps its deadline: a stranger that connects
    // and sends nothing must not hang the set-up.
    unique_fd fd(::accept4(listener.get(), from.get(), &from.length, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (!fd) continue;
    tcp_hello hello{};
    const bool ok = recv_exact(fd.get(), &hello, sizeof hello,
                               std::min(deadline, clock::now() + std::chrono::seconds(5)))
                        .status == io_status::ok;
    const tcp_hello want;
    const char* why = !ok                                         ? "no hello"
                      : hello.magic != want.magic                 ? "bad magic"
                      : hello.version != want.version             ? "unsupported version"
                      : hello.size != static_cast<std::uint32_t>(info.size) ? "different world size"
                      : hello.rank >= static_cast<std::uint32_t>(info.rank) ? "rank out of range"
                      : !wanted[hello.rank]                       ? "rank not expected over tcp"
                      : hello.index >= k                          ? "connection index out of range"
                      : t.conns_[hello.rank * k + hello.index]    ? "duplicate connection"
                                                                  : nullptr;
    if (why != nullptr) {
      std::fprintf(stderr, "chorus: rank %d rejected a connection from %s: %s\n", info.rank,
                   from.str().c_str(), why);
      continue;
    }
    install(std::move(fd), hello.rank, hello.index);
    --expected;
  }
  return t;
}

}  // namespace chorus
