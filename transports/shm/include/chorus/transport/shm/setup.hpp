// SPDX-License-Identifier: Apache-2.0
// Wiring of the shared-memory transport: create or attach the node's segment, then unlink it.
#pragma once

#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <string>

#include <chorus/transport/shm.hpp>

namespace chorus {

namespace detail {

/// Fails unless the job fits one node: CHORUS_TRANSPORT=shm asked for shared memory to every
/// peer. One check and one message for shm_transport and auto_transport alike.
inline void shm_require_one_node(const topology& topo) {
  if (topo.nodes() > 1) {
    throw error(errc::invalid_argument,
                "CHORUS_TRANSPORT=shm needs every rank on one node, but the job spans " +
                    topo.describe() + " (use tcp or auto)");
  }
}

/// Whether this process can read `bytes`' worth at `at` in process `pid` and finds `want`
/// there: cross-memory attach needs ptrace permission over the peer (same user, and no Yama
/// or seccomp rule against it), which only trying tells.
inline bool shm_can_read(int pid, std::uint64_t at, std::uint64_t want) {
  if (pid <= 0 || at == 0) return false;
  std::uint64_t got = 0;
  iovec local{&got, sizeof got};
  iovec remote{reinterpret_cast<void*>(static_cast<std::uintptr_t>(at)), sizeof got};
  return ::process_vm_readv(pid, &local, 1, &remote, 1, 0) == static_cast<ssize_t>(sizeof got) && got == want;
}

}  // namespace detail

inline shm_transport shm_transport::connect(store& store, const launch_info& info,
                                            const shm_options& opts) {
  const topology topo = discover_topology(store, info);
  detail::shm_require_one_node(topo);
  return connect(store, info, topo, opts);
}

inline shm_transport shm_transport::connect(store& store, const launch_info& info,
                                            const topology& topo, const shm_options& opts) {
  using namespace detail;
  if ((opts.ring_bytes & (opts.ring_bytes - 1)) != 0 || opts.ring_bytes < 4096) {
    throw error(errc::invalid_argument, "shm_options::ring_bytes must be a power of two >= 4096");
  }
  shm_transport t;
  t.rank_ = info.rank;
  t.size_ = info.size;
  t.opts_ = opts;
  t.local_ = topo.local_ranks();
  t.my_index_ = topo.local_rank();
  t.index_of_.assign(static_cast<std::size_t>(info.size), -1);
  t.slot_of_.assign(static_cast<std::size_t>(info.size), 0);
  for (std::size_t i = 0; i < t.local_.size(); ++i) {
    t.index_of_[static_cast<std::size_t>(t.local_[i])] = static_cast<int>(i);
  }
  const std::string key = "chorus/shm/segment/" + std::to_string(topo.node());
  const bool alone = t.local_.size() == 1;
  const bool creator = t.my_index_ == 0;
  const shm_layout layout{t.local_.size(), opts.ring_bytes};
  const std::uint64_t my_ns = pid_namespace_id();

  std::string name;
  try {
    // 1. The node's first rank creates the segment and publishes its name.
    if (!alone) {
      if (creator) {
        remove_stale_segments(my_ns);
        name = shm_segment::unique_name(my_ns);
        t.seg_ = std::make_unique<shm_segment>(shm_segment::create(name, layout));
        store.set(key, std::as_bytes(std::span<const char>(name.data(), name.size())));
      } else {
        // The creator sets it: a creator that has left ends the wait at once, naming it.
        const std::string keys[] = {key};
        const int owners[] = {t.local_.front()};
        const auto v = store.get_all(keys, owners).front();
        name.assign(reinterpret_cast<const char*>(v.data()), v.size());
        t.seg_ = std::make_unique<shm_segment>(shm_segment::open(name, layout));
      }
      shm_member& me = t.seg_->member(static_cast<std::size_t>(t.my_index_));
      me.pid_ns = my_ns;
      t.probe_ = std::make_unique<std::uint64_t>(
          shm_probe_word(t.seg_->salt(), static_cast<std::size_t>(t.my_index_)));
      me.probe_at = reinterpret_cast<std::uintptr_t>(t.probe_.get());
      me.pid.store(static_cast<std::int32_t>(::getpid()), std::memory_order_release);
    }
    // 2. Once every member has mapped it, the name can go: the mappings keep the memory,
    //    and no crash from here on can leave the segment behind.
    store.barrier("chorus/shm/attached");
    if (!alone && creator) ::shm_unlink(name.c_str());
  } catch (...) {
    if (!name.empty()) ::shm_unlink(name.c_str());  // whoever fails first removes it
    throw;
  }
  // 3. Every rank tries to read each peer's probe word in place, and tells the peer
  //    through the ring between them whether it can (shm_ring_ctl::can_pull); once all
  //    have, each sender knows which receivers may read its sends in place.
  if (!alone && opts.single_copy) {
    for (std::size_t j = 0; j < t.local_.size(); ++j) {
      if (static_cast<int>(j) == t.my_index_) continue;
      const shm_member& peer = t.seg_->member(j);
      if (!same_pid_namespace(peer.pid_ns, my_ns)) continue;
      if (shm_can_read(peer.pid.load(std::memory_order_acquire), peer.probe_at,
                       shm_probe_word(t.seg_->salt(), j))) {
        t.seg_->ring_ctl(j, static_cast<std::size_t>(t.my_index_)).can_pull.store(1, std::memory_order_release);
      }
    }
  }
  store.barrier("chorus/shm/probed");
  if (alone) return t;

  // 4. Wire a sender and a receiver to every other local rank, and watch its process.
  for (std::size_t j = 0; j < t.local_.size(); ++j) {
    if (static_cast<int>(j) == t.my_index_) continue;
    const auto i = static_cast<std::size_t>(t.my_index_);
    shm_member& peer = t.seg_->member(j);
    const int peer_rank = t.local_[j];
    // Pids mean the same process only inside one pid namespace; elsewhere we rely on the
    // peer's abort flag and the operation timeout, and read nothing in place.
    const int pid = same_pid_namespace(peer.pid_ns, my_ns) ? peer.pid.load(std::memory_order_acquire) : 0;
    const bool pulls = opts.single_copy && t.seg_->ring_ctl(i, j).can_pull.load(std::memory_order_acquire) != 0;
    t.slot_of_[static_cast<std::size_t>(peer_rank)] = t.peers_.size();
    peer_link p{peer_rank,
                &peer,
                shm_sender(&t.seg_->ring_ctl(i, j), {t.seg_->ring_data(i, j), opts.ring_bytes}, &peer,
                           t.seg_->salt(), peer_rank, pulls),
                shm_receiver(&t.seg_->ring_ctl(j, i), {t.seg_->ring_data(j, i), opts.ring_bytes},
                             &peer, t.seg_->salt(), info.rank, peer_rank, opts.single_copy ? pid : 0),
                unique_fd(),
                pid,
                false};
#ifdef SYS_pidfd_open
    if (pid > 0) p.pidfd = unique_fd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
#endif
    t.peers_.push_back(std::move(p));
  }
  return t;
}

}  // namespace chorus
