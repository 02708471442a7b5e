// SPDX-License-Identifier: Apache-2.0
// The tuner: which algorithm a collective runs when the caller leaves it automatic.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include "chorus/bootstrap/env.hpp"
#include "chorus/schedule/build.hpp"
#include "chorus/schedule/schedule.hpp"
#include "chorus/topology.hpp"

namespace chorus {

/// How the tuner decides; from_env() reads the variables named per field.
struct tuner_options {
  /// CHORUS_RD_MAX_BYTES: all_reduce up to this size uses recursive doubling.
  std::size_t rd_max_bytes = 32 * 1024;

  static tuner_options from_env();
};

/// Picks an algorithm per (collective, size). Every rank of a communicator computes the same
/// pick from the same inputs, so all ranks run the same schedule.
class tuner {
 public:
  tuner() = default;
  tuner(const topology& topo, tuner_options o) : topo_(topo), opts_(o) {}

  /// The algorithm for `kind` over `bytes` bytes (per rank's block where `kind` has blocks).
  algo choose(collective kind, std::size_t bytes) const {
    // Several nodes of several ranks: keep most bytes inside the nodes (hierarchical.hpp).
    const bool layered = topo_.nodes() > 1 && topo_.nodes() < topo_.size;
    switch (kind) {
      case collective::all_reduce:
        return bytes <= opts_.rd_max_bytes ? algo::recursive_doubling
               : layered                   ? algo::hierarchical
                                           : algo::ring;
      case collective::reduce_scatter:
      case collective::all_gather:
        return layered ? algo::hierarchical : algo::ring;
      case collective::broadcast:
      case collective::reduce:
        return implements(kind, algo::chain) ? algo::chain : algo::automatic;
      case collective::gather:
      case collective::scatter:
      case collective::all_to_all:
      case collective::all_to_allv:
      case collective::send_recv:
        return algo::direct;
      case collective::barrier:
        return algo::dissemination;
    }
    return algo::ring;
  }

  const tuner_options& options() const noexcept { return opts_; }

 private:
  topology topo_;
  tuner_options opts_;
};

inline tuner_options tuner_options::from_env() {
  tuner_options o;
  o.rd_max_bytes = static_cast<std::size_t>(
      env_int("CHORUS_RD_MAX_BYTES", static_cast<int>(o.rd_max_bytes), 0, 1 << 30));
  return o;
}

}  // namespace chorus
