// SPDX-License-Identifier: Apache-2.0
// What the fault tests share: a quick heartbeat, times comparable across ranks, and a loop
// that runs until a peer's failure reaches this rank.
#pragma once

#include <chorus/chorus.hpp>

#include <chrono>
#include <cstddef>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace chorus::test {

using steady = std::chrono::steady_clock;

// Heartbeats every 100 ms, a peer failed after 1 s unheard.
inline const std::map<std::string, std::string> quick_heartbeat{{"CHORUS_HEARTBEAT_PERIOD", "0.1"},
                                                                {"CHORUS_HEARTBEAT_TIMEOUT", "1"}};

/// Microseconds since `base`, for times compared across processes (CLOCK_MONOTONIC is the
/// machine's, not the process's).
inline int micros_since(steady::time_point base) {
  return static_cast<int>(std::chrono::duration_cast<std::chrono::microseconds>(steady::now() - base).count());
}

/// Runs all_reduces until one fails; returns its error (or nothing after `limit` calls).
inline std::optional<error> reduce_until_error(communicator& comm, int limit, std::size_t count = 4096) {
  std::vector<float> v(count, 1.0f);
  for (int i = 0; i < limit; ++i) {
    try {
      comm.all_reduce(std::span(v));
    } catch (const error& e) {
      return e;
    }
  }
  return std::nullopt;
}

}  // namespace chorus::test
