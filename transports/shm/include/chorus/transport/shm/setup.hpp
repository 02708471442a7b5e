// SPDX-License-Identifier: Apache-2.0
// Wiring of the shared-memory transport: create or attach the node's segment, then unlink it.
#pragma once

#include <sys/syscall.h>
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
        remove_stale_segments();
        name = shm_segment::unique_name();
        t.seg_ = std::make_unique<shm_segment>(shm_segment::create(name, layout));
        store.set(key, std::as_bytes(std::span<const char>(name.data(), name.size())));
      } else {
        const auto v = store.get(key);
        name.assign(reinterpret_cast<const char*>(v.data()), v.size());
        t.seg_ = std::make_unique<shm_segment>(shm_segment::open(name, layout));
      }
      shm_member& me = t.seg_->member(static_cast<std::size_t>(t.my_index_));
      me.pid_ns = my_ns;
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
  if (alone) return t;

  // 3. Wire a sender and a receiver to every other local rank, and watch its process.
  for (std::size_t j = 0; j < t.local_.size(); ++j) {
    if (static_cast<int>(j) == t.my_index_) continue;
    const auto i = static_cast<std::size_t>(t.my_index_);
    shm_member& peer = t.seg_->member(j);
    const int peer_rank = t.local_[j];
    t.slot_of_[static_cast<std::size_t>(peer_rank)] = t.peers_.size();
    peer_link p{peer_rank,
                &peer,
                shm_sender(&t.seg_->ring_ctl(i, j), {t.seg_->ring_data(i, j), opts.ring_bytes}, &peer,
                           t.seg_->salt()),
                shm_receiver(&t.seg_->ring_ctl(j, i), {t.seg_->ring_data(j, i), opts.ring_bytes},
                             &peer, t.seg_->salt(), info.rank, peer_rank),
                unique_fd(),
                0,
                false};
    // Pids mean the same process only inside one pid namespace; elsewhere we rely on the
    // peer's abort flag and the operation timeout.
    if (peer.pid_ns == my_ns) {
      p.pid = peer.pid.load(std::memory_order_acquire);
#ifdef SYS_pidfd_open
      p.pidfd = unique_fd(static_cast<int>(::syscall(SYS_pidfd_open, p.pid, 0)));
#endif
    }
    t.peers_.push_back(std::move(p));
  }
  return t;
}

}  // namespace chorus
