// SPDX-License-Identifier: Apache-2.0
// What the fault tests share: a quick heartbeat and times comparable across ranks.
#pragma once

#include <chrono>
#include <map>
#include <string>

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

}  // namespace chorus::test
