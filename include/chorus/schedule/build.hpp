// SPDX-License-Identifier: Apache-2.0
// One entry point from (collective, algorithm, arguments) to a rank's schedule: the
// communicator, the tuner and the simulator all build schedules through it.
#pragma once

#include <array>
#include <cstddef>
#include <span>
#include <string>

#include "chorus/error.hpp"
#include "chorus/schedule/hierarchical.hpp"
#include "chorus/schedule/p2p.hpp"
#include "chorus/schedule/recursive_doubling.hpp"
#include "chorus/schedule/ring.hpp"
#include "chorus/schedule/schedule.hpp"
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
inline constexpr std::array all_reduce_algos{algo::ring, algo::recursive_doubling,
                                             algo::hierarchical};
inline constexpr std::array reduce_scatter_algos{algo::ring, algo::hierarchical};
inline constexpr std::array all_gather_algos{algo::ring, algo::hierarchical};
inline constexpr std::array direct_algos{algo::direct};
}  // namespace detail

/// The algorithms that implement `kind`, in no particular order.
constexpr std::span<const algo> algorithms_for(collective kind) noexcept {
  switch (kind) {
    case collective::all_reduce: return detail::all_reduce_algos;
    case collective::reduce_scatter: return detail::reduce_scatter_algos;
    case collective::all_gather: return detail::all_gather_algos;
    case collective::send_recv: return detail::direct_algos;
    default: return {};
  }
}

/// Whether `a` implements `kind`.
constexpr bool implements(collective kind, algo a) noexcept {
  for (algo x : algorithms_for(kind)) {
    if (x == a) return true;
  }
  return false;
}

/// Builds this rank's (topo.rank's) schedule. Throws errc::invalid_argument when `a.algorithm`
/// does not implement `a.kind`.
///
/// **Example**:
///   schedule s = build_schedule(topology::single_node(0, 4),
///                               {.kind = collective::all_reduce, .algorithm = algo::ring,
///                                .count = 1024});
inline schedule build_schedule(const topology& topo, const schedule_args& a) {
  const int r = topo.rank;
  const int n = topo.size;
  switch (a.kind) {
    case collective::all_reduce:
      switch (a.algorithm) {
        case algo::ring: return ring_all_reduce(r, n, a.count);
        case algo::recursive_doubling: return recursive_doubling_all_reduce(r, n, a.count);
        case algo::hierarchical: return hierarchical_all_reduce(topo, a.count);
        default: break;
      }
      break;
    case collective::reduce_scatter:
      switch (a.algorithm) {
        case algo::ring: return ring_reduce_scatter(r, n, a.count);
        case algo::hierarchical: return hierarchical_reduce_scatter(topo, a.count);
        default: break;
      }
      break;
    case collective::all_gather:
      switch (a.algorithm) {
        case algo::ring: return ring_all_gather(r, n, a.count);
        case algo::hierarchical: return hierarchical_all_gather(topo, a.count);
        default: break;
      }
      break;
    case collective::send_recv:
      if (a.algorithm == algo::direct) {
        return a.sending ? send_schedule(r, n, a.root, a.count) : recv_schedule(r, n, a.root, a.count);
      }
      break;
    default:
      break;
  }
  throw error(errc::invalid_argument, std::string(to_string(a.kind)) + " has no " +
                                          std::string(to_string(a.algorithm)) + " algorithm");
}

}  // namespace chorus
