// SPDX-License-Identifier: Apache-2.0
// chorus::tcp_transport: collectives over TCP sockets (Ethernet, loopback), epoll-driven.
//
// Each pair of ranks is joined by `conns` connections (CHORUS_TCP_CONNS, else picked and
// agreed at set-up: tcp_options::conns); slices to one peer go round-robin over them, because
// one TCP stream is capped below what the machine can move (bbr paces one loopback stream at
// ~1.8 GB/s here). Every socket is non-blocking and
// registered edge-triggered in one epoll set; the executor spins on progress() briefly and
// then sleeps in wait(), so more ranks than cores still make progress.
#pragma once

#include <sys/epoll.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <chorus/bootstrap/env.hpp>
#include <chorus/bootstrap/store.hpp>
#include <chorus/concepts.hpp>
#include <chorus/error.hpp>
#include <chorus/transport/tcp/connection.hpp>
#include <chorus/transport/tcp/socket.hpp>

namespace chorus {

/// Options of the TCP transport; from_env() reads the CHORUS_* variables named below.
struct tcp_options {
  /// CHORUS_TCP_CONNS, connections per peer, 1..16; 0 (the default) picks for this machine:
  /// 4, or 1 where some node runs more ranks than it has cores (there the extra sockets only
  /// add wake-ups: 4 ranks on 2 cores ran a 64 MiB all_reduce ~6% slower with 4). Ranks
  /// agree on the number when they connect; explicit values that differ are an error.
  int conns = 0;
  std::string ifname;         ///< CHORUS_SOCKET_IFNAME; empty: the interface that reaches the master
  int buffer_bytes = 0;       ///< CHORUS_TCP_BUFFER, SO_SNDBUF/SO_RCVBUF; 0 keeps autotuning
  int rto_min_us = 0;         ///< CHORUS_TCP_RTO_MIN_US, minimum retransmission timeout; 0 keeps the system's
  std::string congestion;     ///< CHORUS_TCP_CONGESTION, e.g. "cubic"; empty keeps the system's
  std::chrono::milliseconds connect_timeout{120000};  ///< CHORUS_BOOTSTRAP_TIMEOUT (seconds)
  /// CHORUS_HEARTBEAT_TIMEOUT (seconds): how long a peer's host may leave our bytes
  /// unacknowledged and the kernel's resends or probes unanswered before the connection
  /// fails (a dead link; tcp_connection::check_link), and the keepalive of every data socket,
  /// which probes an idle connection after a third of it and gives up at about the timeout
  /// (whole seconds, at least 2), so that a peer behind a dead link is noticed without data
  /// in flight too. A peer that is up but reads late is waited for.
  std::chrono::milliseconds link_timeout{10000};
  /// CHORUS_ENCRYPT=aes-gcm: seal every byte of the data connections with AES-256-GCM under
  /// per-connection keys from the handshake (confidentiality and integrity on an untrusted
  /// network, at a bandwidth cost bench/compare measures). "off" (the default) sends frames
  /// as they are. Every rank must choose the same.
  bool encrypt = false;

  static tcp_options from_env() {
    tcp_options o;
    o.conns = env_int("CHORUS_TCP_CONNS", o.conns, 1, 16);  // unset: 0, picked at connect
    if (const char* v = std::getenv("CHORUS_SOCKET_IFNAME"); v && *v) o.ifname = v;
    o.buffer_bytes = env_int("CHORUS_TCP_BUFFER", 0, 0, 1 << 30);
    o.rto_min_us = env_int("CHORUS_TCP_RTO_MIN_US", o.rto_min_us, 0, 200000);
    if (const char* v = std::getenv("CHORUS_TCP_CONGESTION"); v && *v) o.congestion = v;
    o.connect_timeout = env_seconds("CHORUS_BOOTSTRAP_TIMEOUT", o.connect_timeout);
    o.link_timeout = env_seconds("CHORUS_HEARTBEAT_TIMEOUT", o.link_timeout);
    if (const char* v = std::getenv("CHORUS_ENCRYPT"); v && *v) {
      const std::string_view mode = v;
      if (mode != "off" && mode != "aes-gcm") {
        throw error(errc::invalid_argument,
                    "CHORUS_ENCRYPT='" + std::string(mode) + "' is neither 'off' nor 'aes-gcm'");
      }
      o.encrypt = mode == "aes-gcm";
    }
    return o;
  }
};

class tcp_transport {
 public:
  /// Listens on the chosen interface, publishes the address through the store, and connects
  /// to every peer: the lower rank of a pair dials, the higher accepts. Each connection opens
  /// with a hello naming the dialler's rank and connection index; anything else is closed.
  ///
  /// **Example**:
  ///   auto store = chorus::tcp_store::connect(chorus::launch_info_from_env());
  ///   auto t = chorus::tcp_transport::connect(store, chorus::tcp_options::from_env());
  static tcp_transport connect(store& store, const launch_info& info,
                               const tcp_options& opts = tcp_options::from_env());
  /// As above, but connects only to the peers p with wanted[p] (wanted has size() entries,
  /// and peers must agree: p wants us exactly when we want p). Composite transports use it
  /// to leave ranks of the same node to shared memory. A collective call all the same.
  static tcp_transport connect(store& store, const launch_info& info,
                               const std::vector<bool>& wanted, const tcp_options& opts);

  tcp_transport(tcp_transport&&) noexcept = default;
  tcp_transport& operator=(tcp_transport&&) noexcept = default;
  ~tcp_transport() = default;

  int rank() const { return rank_; }
  int size() const { return size_; }
  std::string name() const { return "tcp"; }
  std::string describe() const {
    return "tcp conns " + std::to_string(opts_.conns) + " via " + local_.host() +
           (opts_.encrypt ? " sealed aes-256-gcm" : "");
  }

  /// Some posted send or receive has not completed.
  bool busy() const {
    for (const auto& c : conns_) {
      if (c && c->busy()) return true;
    }
    return false;
  }

  void post_send(int peer, transfer* x) {
    auto& c = conn_for(peer, send_seq_);
    c.post_send(x);
    c.flush();  // eager: small frames leave now, without a trip through epoll
  }
  void post_recv(int peer, transfer* x) {
    auto& c = conn_for(peer, recv_seq_);
    c.post_recv(x);
    c.pump();  // the frame may already be buffered
  }

  /// A check frame (detail::frame_check) to `peer`, on its first connection: not a message,
  /// so it takes no turn in the round robin of frames over the connections.
  void post_check(int peer, const detail::frame_header& h) {
    if (peer < 0 || peer >= size_) return;
    auto& c = conns_[static_cast<std::size_t>(peer) * static_cast<std::size_t>(opts_.conns)];
    if (!c) return;
    c->post_check(h);
    c->flush();
  }

  bool progress() {
    bool moved = step_all();
    if (!moved) {
      // Nothing was ready by our own flags: ask the kernel what changed, then try again.
      moved = poll_events(0) && step_all();
    }
    return moved;
  }

  void wait(clock::time_point deadline) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock::now());
    // Sleep at most 100 ms so that callers can notice abort flags and deadlines.
    const long long ms = std::clamp<long long>(left.count() + 1, 0, 100);
    poll_events(static_cast<int>(ms));
    // Nothing moved for a while, perhaps for want of a peer's answer: judge the links,
    // eight times per timeout, 10 to 250 ms apart (two system calls a connection).
    const auto now = clock::now();
    if (now >= next_link_check_) {
      const auto every = std::clamp<clock::duration>(opts_.link_timeout / 8, std::chrono::milliseconds(10),
                                                     std::chrono::milliseconds(250));
      next_link_check_ = now + every;
      for (auto& c : conns_) {
        if (c) c->check_link(now, opts_.link_timeout);
      }
    }
  }

  /// This rank's recent calls, against which every connection reads leftover frames and peers'
  /// aborts.
  void remember(const detail::call_history* calls) {
    for (auto& c : conns_) {
      if (c) c->remember(calls);
    }
  }

  void abort(const std::string& message, const detail::frame_header* call = nullptr) noexcept {
    const auto deadline = clock::now() + std::chrono::milliseconds(500);
    for (auto& c : conns_) {
      if (c) c->send_abort(message, call, deadline);
    }
  }

 private:
  tcp_transport() = default;

  detail::tcp_connection& conn_for(int peer, std::vector<std::uint64_t>& seq) {
    const auto p = static_cast<std::size_t>(peer);
    if (peer < 0 || peer >= size_ || !conns_[p * static_cast<std::size_t>(opts_.conns)]) {
      throw error(errc::invalid_argument,
                  "tcp transport: rank " + std::to_string(rank_) + " has no connection to rank " +
                      std::to_string(peer),
                  {peer});
    }
    const auto k = static_cast<std::size_t>(seq[p]++ % static_cast<std::uint64_t>(opts_.conns));
    return *conns_[p * static_cast<std::size_t>(opts_.conns) + k];
  }

  bool step_all() {
    bool moved = false;
    for (auto& c : conns_) {
      if (!c) continue;
      if (c->writable && c->busy()) moved |= c->flush();
      if (c->wants_pump()) moved |= c->pump();
    }
    return moved;
  }

  bool poll_events(int timeout_ms) {
    epoll_event ev[64];
    const int n = ::epoll_wait(epoll_.get(), ev, 64, timeout_ms);
    if (n < 0) {
      if (errno == EINTR) return false;
      throw detail::sys_error("epoll_wait");
    }
    for (int i = 0; i < n; ++i) {
      auto* c = static_cast<detail::tcp_connection*>(ev[i].data.ptr);
      if (ev[i].events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) c->readable = true;
      if (ev[i].events & (EPOLLOUT | EPOLLHUP | EPOLLERR)) c->writable = true;
    }
    return n > 0;
  }

  int rank_ = 0;
  int size_ = 1;
  tcp_options opts_;
  detail::sock_addr local_;
  detail::unique_fd epoll_;
  // conns_[peer * conns + k]; null for ourselves. unique_ptr: epoll holds their addresses.
  std::vector<std::unique_ptr<detail::tcp_connection>> conns_;
  std::vector<std::uint64_t> send_seq_, recv_seq_;
  clock::time_point next_link_check_{};
};

static_assert(transport<tcp_transport>);

}  // namespace chorus

#include <chorus/transport/tcp/setup.hpp>
