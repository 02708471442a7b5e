// SPDX-License-Identifier: Apache-2.0
// chorus::auto_transport: shared memory to ranks of this node, TCP to ranks of other nodes.
//
// The transport most programs want: CHORUS_TRANSPORT picks "auto" (the default: per peer, shm
// when it shares our node, else tcp), "shm" (the job must fit one node) or "tcp" (every peer
// over TCP, loopback included). Schedules do not know which transport carries a step; the
// topology tells the hierarchical algorithms which peers are cheap.
#pragma once

#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include <chorus/bootstrap/topology.hpp>
#include <chorus/concepts.hpp>
#include <chorus/transport/shm.hpp>
#include <chorus/transport/tcp.hpp>

namespace chorus {

class auto_transport {
 public:
  enum class mode { automatic, tcp, shm };

  /// CHORUS_TRANSPORT: "auto" (or unset/empty), "tcp" or "shm"; anything else is
  /// errc::invalid_argument naming the value.
  static mode mode_from_env() {
    const char* v = std::getenv("CHORUS_TRANSPORT");
    const std::string s = v == nullptr ? "" : v;
    if (s.empty() || s == "auto") return mode::automatic;
    if (s == "tcp") return mode::tcp;
    if (s == "shm") return mode::shm;
    throw error(errc::invalid_argument,
                "CHORUS_TRANSPORT='" + s + "' is not a transport (use auto, tcp or shm)");
  }

  /// Connects to every peer over the transport `m` gives it (a collective call).
  ///
  /// **Example**:
  ///   auto comm = chorus::communicator::from_env<chorus::auto_transport>();
  static auto_transport connect(store& store, const launch_info& info, const topology& topo,
                                mode m = mode_from_env()) {
    auto_transport t;
    t.rank_ = info.rank;
    t.size_ = info.size;
    if (m == mode::shm) detail::shm_require_one_node(topo);
    if (m != mode::tcp) t.shm_.emplace(shm_transport::connect(store, info, topo));
    // TCP to every rank that shared memory does not reach. Every rank decides the same way
    // from the same topology, so either all ranks make this collective call or none does.
    std::vector<bool> wanted(static_cast<std::size_t>(info.size), false);
    for (int p = 0; p < info.size; ++p) {
      wanted[static_cast<std::size_t>(p)] =
          m == mode::tcp ? p != info.rank : !topo.same_node(p, info.rank);
    }
    const bool needed = m == mode::tcp ? info.size > 1 : topo.nodes() > 1;
    if (needed) t.tcp_.emplace(tcp_transport::connect(store, info, wanted, tcp_options::from_env()));
    return t;
  }

  auto_transport(auto_transport&&) noexcept = default;
  auto_transport& operator=(auto_transport&&) noexcept = default;

  int rank() const { return rank_; }
  int size() const { return size_; }
  std::string name() const {
    if (shm_ && tcp_) return "auto";
    return tcp_ ? "tcp" : "shm";
  }
  std::string describe() const {
    std::string s;
    if (shm_) s = shm_->describe() + " inside the node";
    if (tcp_) s += std::string(s.empty() ? "" : ", ") + tcp_->describe() + (shm_ ? " between nodes" : "");
    return s.empty() ? "no peers" : s;
  }
  std::size_t max_slice_bytes() const { return shm_ ? shm_->max_slice_bytes() : SIZE_MAX; }
  /// Whether the ranks of our node read our exposable sends in place (over TCP nobody does).
  bool reads_in_place() const { return shm_ ? shm_->reads_in_place() : !tcp_; }

  void post_send(int peer, transfer* x) {
    if (via_shm(peer)) {
      shm_->post_send(peer, x);
    } else {
      tcp().post_send(peer, x);
    }
  }
  void post_recv(int peer, transfer* x) {
    if (via_shm(peer)) {
      shm_->post_recv(peer, x);
    } else {
      tcp().post_recv(peer, x);
    }
  }
  void release(int peer, transfer* x) {
    if (via_shm(peer)) shm_->release(peer, x);
  }
  void post_check(int peer, const detail::frame_header& h) {
    if (via_shm(peer)) {
      shm_->post_check(peer, h);
    } else {
      tcp().post_check(peer, h);
    }
  }

  bool progress() {
    bool moved = false;
    if (shm_) moved |= shm_->progress();
    if (tcp_) moved |= tcp_->progress();
    return moved;
  }

  /// Sleeps in whichever transport has work outstanding. With work on both, naps 1 ms in
  /// each in turn: a futex and an epoll set cannot be waited on together.
  void wait(clock::time_point deadline) {
    const bool s = shm_ && shm_->busy();
    const bool t = tcp_ && tcp_->busy();
    if (s && t) {
      const auto nap = std::min(deadline, clock::now() + std::chrono::milliseconds(1));
      shm_->wait(nap);
      if (!shm_->progress()) tcp_->wait(std::min(deadline, clock::now() + std::chrono::milliseconds(1)));
    } else if (t || !shm_) {
      if (tcp_) tcp_->wait(deadline);
    } else {
      shm_->wait(deadline);
    }
  }

  void remember(const detail::call_history* calls) {
    if (shm_) shm_->remember(calls);
    if (tcp_) tcp_->remember(calls);
  }

  void abort(const std::string& message, const detail::frame_header* call = nullptr) noexcept {
    if (shm_) shm_->abort(message, call);
    if (tcp_) tcp_->abort(message, call);
  }

 private:
  auto_transport() = default;

  bool via_shm(int peer) const { return shm_ && shm_->reaches(peer); }
  tcp_transport& tcp() {
    if (!tcp_) {
      throw error(errc::invalid_argument, "auto transport: no connection to that rank", {});
    }
    return *tcp_;
  }

  int rank_ = 0;
  int size_ = 1;
  std::optional<shm_transport> shm_;
  std::optional<tcp_transport> tcp_;
};

static_assert(transport<auto_transport>);

}  // namespace chorus
