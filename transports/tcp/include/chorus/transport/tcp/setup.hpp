// SPDX-License-Identifier: Apache-2.0
// Wiring of the TCP transport: listen, publish, accept the lower ranks while dialing the higher;
// every connection authenticated (detail/handshake.hpp) before it carries a frame.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <exception>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <chorus/bootstrap/detail/handshake.hpp>
#include <chorus/transport/tcp.hpp>

namespace chorus {
namespace detail {

inline void tune_socket(int fd, const tcp_options& o) {
  set_int_option(fd, IPPROTO_TCP, TCP_NODELAY, 1, "setsockopt(TCP_NODELAY)");
  // No TCP_USER_TIMEOUT: Linux applies it to a peer's closed window as well, failing a peer
  // that is up but posts its receive late. The transport judges its links itself
  // (tcp_connection::check_link); keepalive covers idle connections, giving up after
  // about the same time: idle a third of it, then probes a ninth apart (whole seconds, at
  // least one each: 2 s for timeouts under 3 s).
  const auto link_s = static_cast<int>(std::clamp<long long>(o.link_timeout.count() / 1000, 1, 86400));
  const int idle_s = std::max(1, link_s / 3);
  const int interval_s = std::max(1, idle_s / 3);
  set_int_option(fd, SOL_SOCKET, SO_KEEPALIVE, 1, "setsockopt(SO_KEEPALIVE)");
  set_int_option(fd, IPPROTO_TCP, TCP_KEEPIDLE, idle_s, "setsockopt(TCP_KEEPIDLE)");
  set_int_option(fd, IPPROTO_TCP, TCP_KEEPINTVL, interval_s, "setsockopt(TCP_KEEPINTVL)");
  set_int_option(fd, IPPROTO_TCP, TCP_KEEPCNT, std::max(1, (link_s - idle_s + interval_s - 1) / interval_s),
                 "setsockopt(TCP_KEEPCNT)");
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

/// Fails set-up naming the wanted peers that have left the store: exited, failed or killed
/// after publishing their addresses. Their connections will never come, and dialing a dead
/// listener would retry refusals until the deadline.
inline void fail_if_departed(store& st, const launch_info& info, const std::vector<bool>& wanted) {
  std::vector<int> gone;
  for (int r : st.departed()) {
    if (r != info.rank && wanted[static_cast<std::size_t>(r)]) gone.push_back(r);
  }
  if (gone.empty()) return;
  const bool one = gone.size() == 1;
  std::string message = "rank " + std::to_string(info.rank) + ": " + store_ranks_text(gone) +
                        (one ? " has" : " have") + " left the job during tcp set-up (exited, failed, or closed " +
                        (one ? "its store); its" : "their stores); their") + " connections will never come";
  throw error(errc::peer_failed, std::move(message), std::move(gone), std::nullopt, "connect");
}

/// Connections per peer: every rank's CHORUS_TCP_CONNS where set (all that set it must
/// agree), else the machine's pick (see tcp_options::conns), the smallest any rank made.
/// One store round: a pair that dialled different numbers would wait for connections never
/// made.
inline int agree_conns(store& st, const launch_info& info, int requested) {
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  const int mine = requested > 0 ? requested : (static_cast<unsigned>(info.local_size) > cores ? 1 : 4);
  const std::array<std::byte, 2> entry{static_cast<std::byte>(requested > 0),
                                       static_cast<std::byte>(mine)};
  const auto all = st.all_gather("chorus/tcp/conns", entry);
  int explicit_rank = -1, explicit_k = 0, k = 16;
  for (std::size_t r = 0; r < all.size(); ++r) {
    if (all[r].size() != entry.size() || std::to_integer<int>(all[r][1]) < 1 ||
        std::to_integer<int>(all[r][1]) > 16) {
      throw error(errc::protocol, "a malformed tcp connection count from rank " + std::to_string(r) +
                                      " in the store");
    }
    const int v = std::to_integer<int>(all[r][1]);
    if (all[r][0] != std::byte{0}) {
      if (explicit_rank >= 0 && v != explicit_k) {
        throw error(errc::invalid_argument,
                    "CHORUS_TCP_CONNS differs across ranks: rank " + std::to_string(explicit_rank) +
                        " has " + std::to_string(explicit_k) + ", rank " + std::to_string(r) +
                        " has " + std::to_string(v) + " (set it the same on every rank)",
                    {explicit_rank, static_cast<int>(r)});
      }
      if (explicit_rank < 0) {
        explicit_rank = static_cast<int>(r);
        explicit_k = v;
      }
    }
    k = std::min(k, v);
  }
  return explicit_rank >= 0 ? explicit_k : k;
}

}  // namespace detail

inline tcp_transport tcp_transport::connect(store& store, const launch_info& info,
                                            const tcp_options& opts) {
  return connect(store, info, std::vector<bool>(static_cast<std::size_t>(info.size), true), opts);
}

inline tcp_transport tcp_transport::connect(store& store, const launch_info& info,
                                            const std::vector<bool>& wanted,
                                            const tcp_options& opts) {
  using namespace detail;
  if (wanted.size() != static_cast<std::size_t>(info.size)) {
    throw error(errc::invalid_argument, "tcp_transport::connect: wanted has " +
                                            std::to_string(wanted.size()) + " entries for " +
                                            std::to_string(info.size) + " ranks");
  }
  if (opts.conns < 0 || opts.conns > 16) {  // from_env clamps CHORUS_TCP_CONNS alike
    throw error(errc::invalid_argument,
                "tcp_options::conns = " + std::to_string(opts.conns) +
                    ": connections per pair are 1 to 16 (0: picked at connect)",
                {info.rank}, std::nullopt, "connect");
  }
  tcp_transport t;
  t.rank_ = info.rank;
  t.size_ = info.size;
  t.opts_ = opts;
  t.opts_.conns = agree_conns(store, info, opts.conns);
  const auto n = static_cast<std::size_t>(info.size);
  const auto k = static_cast<std::size_t>(t.opts_.conns);
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
  unique_fd listener(::socket(local.family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!listener) throw sys_error("socket");
  if (::bind(listener.get(), local.get(), local.length) != 0) {
    throw sys_error("bind to " + local.str());
  }
  if (::listen(listener.get(), 1024) != 0) throw sys_error("listen");
  local.length = sizeof local.storage;
  ::getsockname(listener.get(), local.get(), &local.length);
  t.local_ = local;

  // 2. Publish our address; learn everyone's. Each entry starts with 16 random bytes, of
  //    which rank 0's become the communicator id that every handshake binds to, so a
  //    connection made for one communicator is refused by another.
  auto met = publish_addresses(store, "chorus/tcp/addr", local, "tcp address");
  const std::vector<sock_addr> addrs = std::move(met.addrs);
  const auth_id comm = met.group;
  const job_secret& secret = store.secret();
  const auth_id job = store.job_id();

  auto install = [&](unique_fd fd, std::size_t peer, std::size_t idx, const auth_result& proved,
                     bool initiator) {
    tune_socket(fd.get(), opts);
    set_nonblocking(fd.get());
    auto cipher = opts.encrypt ? std::make_unique<tcp_cipher>(proved.session, initiator,
                                                              static_cast<int>(peer))
                               : nullptr;
    auto c = std::make_unique<tcp_connection>(std::move(fd), info.rank, static_cast<int>(peer),
                                              std::move(cipher));
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET;
    ev.data.ptr = c.get();
    if (::epoll_ctl(t.epoll_.get(), EPOLL_CTL_ADD, c->fd(), &ev) != 0) throw sys_error("epoll_ctl");
    t.conns_[peer * k + idx] = std::move(c);
  };

  // 3. Accept the lower ranks' connections, on a thread of their own while this one dials
  //    (step 4). Handshakes run side by side under poll(), each with auth_timeout (5 s) to
  //    finish, so a stranger that connects and stalls, or sends garbage, costs one logged
  //    line and never the set-up. Accepting while dialing matters under a flood: a
  //    stranger's 5 s start when it is accepted, and when ranks accepted only after their
  //    own dials, a flood beyond auth_max_pending on every listener (tests/security) held
  //    each rank's accepts until the rank above it had served its own flood: 5 s per rank,
  //    30 s for 8 ranks, past the bootstrap timeout for a few dozen.
  std::size_t expected = 0;
  for (std::size_t peer = 0; peer < static_cast<std::size_t>(info.rank); ++peer) {
    if (wanted[peer]) expected += k;
  }
  auto check = [&](const auth_hello& h) -> std::optional<std::string> {
    if (h.kind != auth_kind::tcp) {
      return std::string("a ") + to_string(h.kind) + " connection sent to a tcp port";
    }
    if (h.world != static_cast<std::uint32_t>(info.size)) {
      return "a world of " + std::to_string(h.world) + " ranks, not " + std::to_string(info.size);
    }
    if (h.responder != static_cast<std::uint32_t>(info.rank)) {
      return "a connection meant for rank " + std::to_string(h.responder);
    }
    if (h.initiator >= static_cast<std::uint32_t>(info.rank) || !wanted[h.initiator]) {
      return "rank " + std::to_string(h.initiator) + " is not expected to dial this rank";
    }
    if (h.index >= k) return "connection index " + std::to_string(h.index) + " out of range";
    if (h.job != job) return "a connection of another job";
    if (h.comm != comm) return "a connection of another communicator";
    if (((h.flags & auth_flag_encrypt) != 0) != opts.encrypt) {
      return "rank " + std::to_string(h.initiator) +
             (opts.encrypt ? " does not encrypt and this rank does"
                           : " encrypts and this rank does not") +
             " (set CHORUS_ENCRYPT the same on every rank)";
    }
    if (t.conns_[h.initiator * k + h.index]) return "a duplicate connection";
    return std::nullopt;
  };
  struct pending {
    unique_fd fd;
    sock_addr from;
    auth_responder auth;
    clock::time_point deadline;
    std::vector<std::byte> out;
  };
  auto reject = [&](const pending& p, const std::string& why) {
    std::fprintf(stderr, "chorus: rank %d rejected a connection from %s: %s\n", info.rank,
                 p.from.str().c_str(), why.c_str());
  };
  // More concurrent handshakes than auth_max_pending wait in the kernel's backlog: a burst of
  // strangers cannot exhaust descriptors.
  constexpr std::size_t max_handshakes = auth_max_pending;
  // Written when dialing fails, so that the accepting thread stops at once.
  int stop_pipe[2];
  if (::pipe2(stop_pipe, O_CLOEXEC) != 0) throw sys_error("pipe2");
  unique_fd stop_read(stop_pipe[0]), stop_write(stop_pipe[1]);
  auto accept_lower = [&] {
    std::vector<std::unique_ptr<pending>> handshakes;
    std::vector<pollfd> fds;
    bool stopped = false;
    while (expected > 0) {
      auto now = clock::now();
      std::erase_if(handshakes, [&](const auto& p) {
        if (p->deadline > now) return false;
        reject(*p, "no complete handshake within 5 s");
        return true;
      });
      if (now >= deadline) {
        std::vector<int> missing;
        for (std::size_t peer = 0; peer < static_cast<std::size_t>(info.rank); ++peer) {
          for (std::size_t idx = 0; idx < k && wanted[peer]; ++idx) {
            if (!t.conns_[peer * k + idx]) {
              missing.push_back(static_cast<int>(peer));
              break;
            }
          }
        }
        std::string message = "rank " + std::to_string(info.rank) + " at " + local.str() +
                              " timed out waiting for connections from " + store_ranks_text(missing);
        throw error(errc::bootstrap, std::move(message), std::move(missing), std::nullopt, "accept");
      }
      auto wake = deadline;
      fds.clear();
      fds.push_back({stop_read.get(), POLLIN, 0});
      fds.push_back({listener.get(), static_cast<short>(handshakes.size() < max_handshakes ? POLLIN : 0), 0});
      for (const auto& p : handshakes) {
        fds.push_back({p->fd.get(), static_cast<short>(p->out.empty() ? POLLIN : POLLOUT), 0});
        wake = std::min(wake, p->deadline);
      }
      if (::poll(fds.data(), fds.size(), poll_ms(wake)) < 0 && errno != EINTR) throw sys_error("poll");
      if (fds[0].revents != 0) {
        stopped = true;
        break;
      }
      now = clock::now();
      // Handshakes first (the indices of fds match them), then new connections.
      for (std::size_t i = 0; i < handshakes.size(); ++i) {
        pending& p = *handshakes[i];
        if (fds[2 + i].revents == 0) continue;
        std::string why;
        if (!p.out.empty()) {
          const ssize_t sent = ::send(p.fd.get(), p.out.data(), p.out.size(), MSG_NOSIGNAL);
          if (sent > 0) p.out.erase(p.out.begin(), p.out.begin() + sent);
          if (sent < 0 && errno != EAGAIN && errno != EINTR) why = "send: " + store_errno_text(errno);
        } else if (auto failed = p.auth.read_from(p.fd.get(), p.out)) {
          why = *failed;
        }
        if (!why.empty()) {
          reject(p, why);
          handshakes[i].reset();
        } else if (p.auth.done()) {
          // Checked again: two connections may have claimed the slot while both were proving.
          const auto& h = p.auth.hello();
          if (t.conns_[h.initiator * k + h.index]) {
            reject(p, "a duplicate connection");
          } else {
            install(std::move(p.fd), h.initiator, h.index, p.auth.result(), false);
            --expected;
          }
          handshakes[i].reset();
        }
      }
      std::erase_if(handshakes, [](const auto& p) { return p == nullptr; });
      if (fds[1].revents & POLLIN) {
        while (handshakes.size() < max_handshakes) {
          sock_addr from;
          from.length = sizeof from.storage;
          unique_fd fd(::accept4(listener.get(), from.get(), &from.length, SOCK_NONBLOCK | SOCK_CLOEXEC));
          if (!fd) break;
          handshakes.push_back(std::make_unique<pending>(
              pending{std::move(fd), from, auth_responder(secret, job, check), now + auth_timeout, {}}));
        }
      }
    }
    // Every rank it expects is in (or set-up failed): strangers are refused from now on,
    // and those still in their handshake are closed, each with its line like any other.
    listener.reset();
    for (const auto& p : handshakes) {
      reject(*p, stopped ? "set-up failed" : "set-up finished before it completed a handshake");
    }
  };
  std::exception_ptr accept_failure;
  std::promise<void> accepted;
  auto accept_done = accepted.get_future();
  std::thread acceptor([&] {
    try {
      accept_lower();
    } catch (...) {
      accept_failure = std::current_exception();
    }
    auth_thread_done();
    accepted.set_value();
  });
  // Peers that left the store are asked after about this long of waiting on them.
  constexpr auto departure_check = std::chrono::milliseconds(100);

  // 4. Dial every higher rank and prove the secret to it. Each answers from its own
  //    accepting thread (step 3), so the ranks need no order among them.
  try {
    for (std::size_t peer = static_cast<std::size_t>(info.rank) + 1; peer < n; ++peer) {
      if (!wanted[peer]) continue;
      store_address to;
      to.storage = addrs[peer].storage;
      to.length = addrs[peer].length;
      to.family = addrs[peer].family();
      for (std::size_t idx = 0; idx < k; ++idx) {
        const auto fail = [&](const std::string& why) {
          return error(errc::bootstrap,
                       "rank " + std::to_string(info.rank) + " cannot connect to rank " +
                           std::to_string(peer) + " at " + addrs[peer].str() + ": " + why,
                       {static_cast<int>(peer)}, std::nullopt, "connect");
        };
        unique_fd fd;
        auto next_check = clock::now() + departure_check;
        for (;;) {
          int err = 0;
          fd = store_connect_tcp(to, deadline, err);
          if (fd) break;
          // Refused: the peer's listener may be momentarily full, or the peer gone (then
          // its port may even be reused); retry until the deadline unless it left.
          if ((err != ECONNREFUSED && err != EINTR && err != EAGAIN) || clock::now() > deadline) {
            throw fail(store_errno_text(err));
          }
          if (clock::now() >= next_check) {
            fail_if_departed(store, info, wanted);
            next_check = clock::now() + departure_check;
          }
          ::usleep(10000);
        }
        auth_hello hello;
        hello.kind = auth_kind::tcp;
        hello.initiator = static_cast<std::uint32_t>(info.rank);
        hello.responder = static_cast<std::uint32_t>(peer);
        hello.index = static_cast<std::uint32_t>(idx);
        hello.world = static_cast<std::uint32_t>(info.size);
        hello.job = job;
        hello.comm = comm;
        hello.flags = opts.encrypt ? auth_flag_encrypt : 0;
        auth_result proved;
        if (auto why = auth_initiate(fd.get(), secret, hello, deadline, proved)) {
          fail_if_departed(store, info, wanted);  // a dead peer's reused port, say
          throw fail(*why);
        }
        install(std::move(fd), peer, idx, proved, true);
      }
    }
    // The lower ranks' connections: a lower rank that left will never dial.
    while (accept_done.wait_for(departure_check) != std::future_status::ready) {
      fail_if_departed(store, info, wanted);
    }
  } catch (...) {
    char byte = 1;
    while (::write(stop_write.get(), &byte, 1) < 0 && errno == EINTR) {
    }
    acceptor.join();
    throw;
  }
  acceptor.join();
  if (accept_failure) std::rethrow_exception(accept_failure);
  return t;
}

}  // namespace chorus
