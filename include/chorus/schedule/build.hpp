// SPDX-License-Identifier: Apache-2.0
// One entry point from (collective, algorithm, arguments) to a rank's schedule: the
// communicator, the tuner and the simulator all build schedules through it.
#pragma once

#include <array>
#include <cstddef>
#include <span>
#include <string>

#include "chorus/error.hpp"
#include "chorus/schedule/barrier.hpp"
#include "chorus/schedule/binomial.hpp"
#include "chorus/schedule/bruck.hpp"
#include "chorus/schedule/chain.hpp"
#include "chorus/schedule/direct.hpp"
#include "chorus/schedule/halving_doubling.hpp"
#include "chorus/schedule/hierarchical.hpp"
#include "chorus/schedule/p2p.hpp"
#include "chorus/schedule/recursive_doubling.hpp"
#include "chorus/schedule/ring.hpp"
#include "chorus/schedule/schedule.hpp"
#include "chorus/schedule/tree.hpp"
#include "chorus/topology.hpp"

namespace chorus {

/// What a schedule is built from besides the topology. `count` as collective's comment in
/// schedule.hpp defines it per kind.
struct schedule_args {
  collective kind = collective::all_reduce;
  algo algorithm = algo::ring;  ///< never automatic: the tuner resolves that first
  std::size_t count = 0;
  int root = -1;  ///< rooted collectives: the root rank; send_recv: the peer
  /// all_to_allv: elements this rank sends to / receives from each rank (size() entries).
  std::span<const std::size_t> send_counts{};
  std::span<const std::size_t> recv_counts{};
  bool sending = false;  ///< send_recv: true on the sender's side
};

namespace detail {
inline constexpr std::array all_reduce_algos{algo::ring, algo::recursive_doubling, algo::hierarchical,
                                             algo::tree, algo::halving_doubling, algo::direct};
inline constexpr std::array reduce_scatter_algos{algo::ring, algo::hierarchical, algo::halving_doubling,
                                                 algo::direct};
inline constexpr std::array all_gather_algos{algo::ring, algo::hierarchical, algo::recursive_doubling,
                                             algo::bruck, algo::direct};
inline constexpr std::array rooted_flow_algos{algo::chain, algo::binomial};  // broadcast, reduce
inline constexpr std::array rooted_block_algos{algo::direct, algo::binomial};  // gather, scatter
inline constexpr std::array direct_algos{algo::direct};
inline constexpr std::array barrier_algos{algo::dissemination};
}  // namespace detail

/// The algorithms that implement `kind`, in no particular order.
constexpr std::span<const algo> algorithms_for(collective kind) noexcept {
  switch (kind) {
    case collective::all_reduce: return detail::all_reduce_algos;
    case collective::reduce_scatter: return detail::reduce_scatter_algos;
    case collective::all_gather: return detail::all_gather_algos;
    case collective::broadcast:
    case collective::reduce: return detail::rooted_flow_algos;
    case collective::gather:
    case collective::scatter: return detail::rooted_block_algos;
    case collective::all_to_all:
    case collective::all_to_allv:
    case collective::send_recv: return detail::direct_algos;
    case collective::barrier: return detail::barrier_algos;
  }
  return {};
}

/// Whether `a` implements `kind`.
constexpr bool implements(collective kind, algo a) noexcept {
  for (algo x : algorithms_for(kind)) {
    if (x == a) return true;
  }
  return false;
}

/// Builds this rank's (topo.rank's) schedule. Throws errc::invalid_argument when `a.algorithm`
/// does not implement `a.kind`, when a rooted collective's root (send_recv's peer) is not a
/// rank, or when all_to_allv's counts do not have one entry per rank.
///
/// **Example**:
///   schedule s = build_schedule(topology::single_node(0, 4),
///                               {.kind = collective::all_reduce, .algorithm = algo::ring,
///                                .count = 1024});
///   schedule b = build_schedule(topology::single_node(0, 4),
///                               {.kind = collective::broadcast, .algorithm = algo::binomial,
///                                .count = 1024, .root = 2});
inline schedule build_schedule(const topology& topo, const schedule_args& a) {
  const int r = topo.rank;
  const int n = topo.size;
  const std::string what = std::string(to_string(a.kind)) + " " + std::string(to_string(a.algorithm));
  if (!implements(a.kind, a.algorithm)) {
    throw error(errc::invalid_argument, std::string(to_string(a.kind)) + " has no " +
                                            std::string(to_string(a.algorithm)) + " algorithm");
  }
  if ((rooted(a.kind) || a.kind == collective::send_recv) && (a.root < 0 || a.root >= n)) {
    throw error(errc::invalid_argument, what + ": root " + std::to_string(a.root) + " is not a rank of " +
                                            std::to_string(n));
  }
  if (a.kind == collective::all_to_allv &&
      (a.send_counts.size() != static_cast<std::size_t>(n) || a.recv_counts.size() != static_cast<std::size_t>(n))) {
    throw error(errc::invalid_argument, what + ": send_counts and recv_counts need " + std::to_string(n) +
                                            " entries each");
  }
  switch (a.kind) {
    case collective::all_reduce:
      switch (a.algorithm) {
        case algo::ring: return ring_all_reduce(r, n, a.count);
        case algo::recursive_doubling: return recursive_doubling_all_reduce(r, n, a.count);
        case algo::hierarchical: return hierarchical_all_reduce(topo, a.count);
        case algo::tree: return tree_all_reduce(r, n, a.count);
        case algo::halving_doubling: return halving_doubling_all_reduce(r, n, a.count);
        case algo::direct: return direct_all_reduce(r, n, a.count);
        default: break;
      }
      break;
    case collective::reduce_scatter:
      switch (a.algorithm) {
        case algo::ring: return ring_reduce_scatter(r, n, a.count);
        case algo::hierarchical: return hierarchical_reduce_scatter(topo, a.count);
        case algo::halving_doubling: return halving_doubling_reduce_scatter(r, n, a.count);
        case algo::direct: return direct_reduce_scatter(r, n, a.count);
        default: break;
      }
      break;
    case collective::all_gather:
      switch (a.algorithm) {
        case algo::ring: return ring_all_gather(r, n, a.count);
        case algo::hierarchical: return hierarchical_all_gather(topo, a.count);
        case algo::recursive_doubling: return recursive_doubling_all_gather(r, n, a.count);
        case algo::bruck: return bruck_all_gather(r, n, a.count);
        case algo::direct: return direct_all_gather(r, n, a.count);
        default: break;
      }
      break;
    case collective::broadcast:
      return a.algorithm == algo::chain ? chain_broadcast(r, n, a.count, a.root)
                                        : binomial_broadcast(r, n, a.count, a.root);
    case collective::reduce:
      return a.algorithm == algo::chain ? chain_reduce(r, n, a.count, a.root)
                                        : binomial_reduce(r, n, a.count, a.root);
    case collective::gather:
      return a.algorithm == algo::direct ? direct_gather(r, n, a.count, a.root)
                                         : binomial_gather(r, n, a.count, a.root);
    case collective::scatter:
      return a.algorithm == algo::direct ? direct_scatter(r, n, a.count, a.root)
                                         : binomial_scatter(r, n, a.count, a.root);
    case collective::all_to_all: return direct_all_to_all(r, n, a.count);
    case collective::all_to_allv: return direct_all_to_allv(r, n, a.send_counts, a.recv_counts);
    case collective::barrier: return dissemination_barrier(r, n);
    case collective::send_recv:
      return a.sending ? send_schedule(r, n, a.root, a.count) : recv_schedule(r, n, a.root, a.count);
  }
  throw error(errc::invalid_argument, what + ": no schedule");  // unreachable: implements() said yes
}

}  // namespace chorus
