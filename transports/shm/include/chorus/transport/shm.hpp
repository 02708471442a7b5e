// SPDX-License-Identifier: Apache-2.0
// chorus::shm_transport: collectives between the processes of one node through shared memory.
//
// Each node's ranks share one POSIX shared-memory segment holding a ring per ordered pair of
// ranks. A send copies its frame into the ring to the peer; a receive copies it out, or, for a
// reducing receive, lends the payload in place so the executor reduces straight from the ring
// (one copy per byte in each direction: the minimum between private buffers). A send the
// executor marks exposable goes as a pull frame instead, and the receiver reads its payload
// straight out of the sender's memory with process_vm_readv: one copy per byte in all, done
// by the receiver (channel.hpp). Waits spin on the ring counters, then sleep on a futex in
// the segment, so 8 ranks on 2 cores progress. A peer that dies is noticed through its pidfd,
// one that fails through its abort flag.
#pragma once

#include <poll.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <chorus/bootstrap/env.hpp>
#include <chorus/bootstrap/store.hpp>
#include <chorus/bootstrap/topology.hpp>
#include <chorus/concepts.hpp>
#include <chorus/detail/socket.hpp>
#include <chorus/error.hpp>
#include <chorus/transport/shm/channel.hpp>
#include <chorus/transport/shm/segment.hpp>

namespace chorus {

/// Options of the shared-memory transport; from_env() reads the CHORUS_* variables below.
struct shm_options {
  /// CHORUS_SHM_RING_BYTES: bytes of each ring, a power of two in [64 KiB, 256 MiB]. Slices
  /// are at most a quarter of it: with one payload lent (at most half the ring is), the
  /// frames behind it still fit.
  /// 1 MiB measured best at 4 and 8 ranks on 2 cores (rings stay in cache), and no worse at 2.
  std::size_t ring_bytes = 1 << 20;
  std::chrono::milliseconds connect_timeout{120000};  ///< CHORUS_BOOTSTRAP_TIMEOUT (seconds)
  /// CHORUS_SHM_SINGLE_COPY (0 or 1): receivers read exposable sends of 64 KiB and more
  /// straight out of the sender's memory, between every pair of ranks where a probe at
  /// connection shows that works (same user and pid namespace, and no ptrace restriction
  /// such as Yama's ptrace_scope >= 2 or a container's seccomp filter: elsewhere the rings
  /// carry everything). 0 on either end of a pair: the rings only.
  bool single_copy = true;

  static shm_options from_env() {
    shm_options o;
    o.single_copy = env_int("CHORUS_SHM_SINGLE_COPY", 1, 0, 1) == 1;
    const int v = env_int("CHORUS_SHM_RING_BYTES", static_cast<int>(o.ring_bytes), 64 << 10, 256 << 20);
    if ((v & (v - 1)) != 0) {
      throw error(errc::invalid_argument,
                  "CHORUS_SHM_RING_BYTES=" + std::to_string(v) + " is not a power of two");
    }
    o.ring_bytes = static_cast<std::size_t>(v);
    o.connect_timeout = env_seconds("CHORUS_BOOTSTRAP_TIMEOUT", o.connect_timeout);
    return o;
  }
};

class shm_transport {
 public:
  /// Joins the shared-memory segment of this rank's node. Every rank of the job calls it
  /// (it uses the store collectively); ranks alone on their node map nothing. The node's
  /// first rank creates the segment; it is unlinked as soon as every member has mapped it,
  /// so nothing is left in /dev/shm however the processes end.
  ///
  /// **Example**:
  ///   auto store = chorus::tcp_store::connect(chorus::launch_info_from_env());
  ///   auto topo = chorus::discover_topology(store, info);
  ///   auto t = chorus::shm_transport::connect(store, info, topo);
  static shm_transport connect(store& store, const launch_info& info, const topology& topo,
                               const shm_options& opts = shm_options::from_env());
  /// As above for a job that must be on one node: anything else is errc::invalid_argument.
  static shm_transport connect(store& store, const launch_info& info,
                               const shm_options& opts = shm_options::from_env());

  shm_transport(shm_transport&&) noexcept = default;
  shm_transport& operator=(shm_transport&&) noexcept = default;
  ~shm_transport() = default;

  int rank() const { return rank_; }
  int size() const { return size_; }
  std::string name() const { return "shm"; }
  std::string describe() const {
    std::size_t pulls = 0;
    for (const auto& p : peers_) pulls += p.tx.pulls() ? 1u : 0u;
    const std::string single = !opts_.single_copy ? ", single copy off"
                               : peers_.empty()   ? ""
                               : pulls == peers_.size()
                                   ? ", single copy"
                                   : ", single copy to " + std::to_string(pulls) + " of " +
                                         std::to_string(peers_.size()) + " peers";
    return "shm " + std::to_string(local_.size()) + " ranks, ring " +
           std::to_string(opts_.ring_bytes >> 10) + " KiB" + single;
  }
  /// Whether every peer on our node reads our exposable sends in place (see
  /// shm_options::single_copy); true for a rank alone on its node.
  bool reads_in_place() const {
    return std::all_of(peers_.begin(), peers_.end(), [](const peer_link& p) { return p.tx.pulls(); });
  }
  /// Largest slice the executor should cut: a quarter ring (see shm_options::ring_bytes).
  std::size_t max_slice_bytes() const { return opts_.ring_bytes / 4; }
  /// Whether `peer` shares our segment.
  bool reaches(int peer) const {
    return peer >= 0 && peer < size_ && index_of_[static_cast<std::size_t>(peer)] >= 0 &&
           peer != rank_;
  }

  /// Some posted send or receive has not completed.
  bool busy() const {
    for (const auto& p : peers_) {
      if (p.tx.busy() || p.rx.busy()) return true;
    }
    return false;
  }

  void post_send(int peer, transfer* x) {
    auto& p = link(peer);
    p.tx.post(x);
    p.tx.flush();
  }
  void post_recv(int peer, transfer* x) {
    auto& p = link(peer);
    p.rx.post(x);
    p.rx.pump();
  }
  void release(int peer, transfer* x) { link(peer).rx.release(x); }
  /// A check frame (detail::frame_check) to `peer`, behind the frames queued before it.
  void post_check(int peer, const detail::frame_header& h) {
    auto& p = link(peer);
    p.tx.post_check(h);
    p.tx.flush();
  }
  /// This rank's recent calls, against which leftover frames and peers' aborts are read.
  void remember(const detail::call_history* calls) {
    history_ = calls;
    for (auto& p : peers_) p.rx.remember(calls);
  }

  bool progress() {
    bool moved = false;
    for (auto& p : peers_) {
      if (p.tx.busy()) moved |= p.tx.flush();
      if (p.rx.busy()) moved |= p.rx.pump();
    }
    return moved;
  }

  /// Sleeps on our doorbell until a ring we use changes, a peer fails, or `deadline`; wakes
  /// every 20 ms to check that the peers we wait on are alive.
  void wait(clock::time_point deadline) {
    if (peers_.empty()) return;
    detail::shm_member& me = seg_->member(static_cast<std::size_t>(my_index_));
    me.sleeping.store(1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_seq_cst);  // pairs with shm_ring_bell
    const std::uint32_t seen = me.bell.load(std::memory_order_acquire);
    bool ready = false;
    for (const auto& p : peers_) {
      ready = ready || (p.rx.busy() && p.rx.data_changed()) || (p.tx.busy() && p.tx.room_changed());
    }
    if (!ready) {
      const auto left = deadline - clock::now();
      const auto nap = std::clamp<std::chrono::nanoseconds>(left, std::chrono::nanoseconds(0),
                                                            std::chrono::milliseconds(20));
      if (nap.count() > 0) detail::futex_wait(&me.bell, seen, nap);
    }
    me.sleeping.store(0, std::memory_order_relaxed);
    check_peers();
    // Peers we do not wait for may wait for us, in a call that differs from ours.
    for (auto& p : peers_) {
      if (!p.rx.busy()) p.rx.skim_checks();
    }
  }

  /// Raises our failure flag with `message` and the call we failed in, and wakes every peer,
  /// which then fails at once.
  void abort(const std::string& message, const detail::frame_header* call = nullptr) noexcept {
    if (!seg_) return;
    detail::shm_member& me = seg_->member(static_cast<std::size_t>(my_index_));
    const std::size_t n = std::min(message.size(), detail::shm_abort_text);
    std::memcpy(me.abort_text, message.data(), n);
    me.abort_len = static_cast<std::uint32_t>(n);
    me.abort_call = detail::abort_header(static_cast<std::uint32_t>(n), call);
    me.failed.store(1, std::memory_order_release);
    for (auto& p : peers_) {
      p.member->bell.fetch_add(1, std::memory_order_release);
      detail::futex_wake_all(&p.member->bell);
    }
  }

 private:
  struct peer_link {
    int rank = -1;
    detail::shm_member* member = nullptr;
    detail::shm_sender tx;
    detail::shm_receiver rx;
    detail::unique_fd pidfd;  // readable once the peer has exited; may be absent
    int pid = 0;
    bool populated = false;  // our page tables map its rings (see populate)
  };

  shm_transport() = default;

  peer_link& link(int peer) {
    if (!reaches(peer)) {
      throw error(errc::invalid_argument,
                  "shm transport: rank " + std::to_string(peer) + " is not on rank " +
                      std::to_string(rank_) + "'s node",
                  {peer});
    }
    peer_link& p = peers_[slot_of_[static_cast<std::size_t>(peer)]];
    if (!p.populated) populate(p);
    return p;
  }

  /// Touches every page of the two rings we share with `p`, once, before the first frame:
  /// on this kind of VM the first access to a page from each process costs ~12 µs (page
  /// tables, then the hypervisor's), and a ring touched page by page slowed its whole first
  /// pass, e.g. 2 KiB all_reduces from 1 µs to 12 µs. Rings of peers we never talk to stay
  /// unallocated. We write only the ring we produce into (nobody else writes it, and its
  /// reader reads only bytes behind our head); the ring we read is only read.
  void populate(peer_link& p) {
    const auto i = static_cast<std::size_t>(my_index_);
    const auto j = static_cast<std::size_t>(index_of_[static_cast<std::size_t>(p.rank)]);
    // Their pages first (shm_segment::reserve): a /dev/shm without room for them is an error
    // naming it, where touching them would be SIGBUS.
    const std::string pair = "the rings between ranks " + std::to_string(std::min(rank_, p.rank)) + " and " +
                             std::to_string(std::max(rank_, p.rank));
    seg_->reserve(seg_->ring_offset(i, j), opts_.ring_bytes, pair);
    seg_->reserve(seg_->ring_offset(j, i), opts_.ring_bytes, pair);
    p.populated = true;
    auto* out = reinterpret_cast<volatile unsigned char*>(seg_->ring_data(i, j));
    auto* in = reinterpret_cast<volatile const unsigned char*>(seg_->ring_data(j, i));
    unsigned sink = 0;
    for (int pass = 0; pass < 3; ++pass) {
      for (std::size_t k = 0; k < opts_.ring_bytes; k += 64) {
        out[k] = 0;
        sink += in[k];
      }
    }
    (void)sink;
  }

  /// Fails if a peer raised its abort flag, or exited while we still expect data from it or
  /// have data for it (a peer that finished its part and left is no failure). Whether peers
  /// live is asked of the kernel at most every `liveness_period`: a poll of 7 pidfds after
  /// every wait took 13% of an 8-rank all_reduce on 2 cores, where ranks wait very often.
  void check_peers() {
    for (auto& p : peers_) {
      if (p.member->failed.load(std::memory_order_acquire) != 0) {
        const std::size_t n = std::min<std::size_t>(p.member->abort_len, detail::shm_abort_text);
        throw detail::peer_failed(p.rank, rank_, p.member->abort_call, std::string(p.member->abort_text, n),
                                  history_);
      }
    }
    const auto now = clock::now();
    if (now - last_liveness_ < liveness_period) return;
    last_liveness_ = now;
    for (auto& p : peers_) {
      if (!(p.rx.busy() || p.tx.busy()) || alive(p)) continue;
      p.tx.flush();
      p.rx.pump();  // its last frames may already be in the ring
      if (p.rx.busy() || p.tx.busy()) {
        throw error(errc::connection_lost,
                    "connection lost: rank " + std::to_string(p.rank) + " (pid " +
                        std::to_string(p.pid) + ") exited",
                    {p.rank}, std::nullopt, p.rx.busy() ? "recv from" : "send to");
      }
    }
  }

  static bool alive(const peer_link& p) {
    if (p.pidfd) {
      pollfd pfd{p.pidfd.get(), POLLIN, 0};
      return ::poll(&pfd, 1, 0) == 0;
    }
    return p.pid <= 0 || ::kill(p.pid, 0) == 0 || errno != ESRCH;
  }

  int rank_ = 0;
  int size_ = 1;
  int my_index_ = 0;
  shm_options opts_;
  std::vector<int> local_;                   // global ranks on this node, ascending
  std::vector<int> index_of_;                // global rank -> index in local_, or -1
  std::vector<std::size_t> slot_of_;         // global rank -> index in peers_
  std::unique_ptr<detail::shm_segment> seg_;  // stable address: channels point into it
  std::unique_ptr<std::uint64_t> probe_;      // our probe word: peers read it (setup.hpp)
  std::vector<peer_link> peers_;
  const detail::call_history* history_ = nullptr;  // see remember()
  static constexpr auto liveness_period = std::chrono::milliseconds(5);
  clock::time_point last_liveness_{};  // of the last look at the peers' pidfds
};

static_assert(transport<shm_transport>);

}  // namespace chorus

#include <chorus/transport/shm/setup.hpp>
