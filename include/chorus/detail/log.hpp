// SPDX-License-Identifier: Apache-2.0
// CHORUS_DEBUG logging: one line per event on stderr, prefixed with the rank.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

namespace chorus::detail {

enum class log_level { warn = 0, info = 1, trace = 2 };

/// CHORUS_DEBUG: unset, empty or "0": warnings only; "INFO" (or "1"): also decisions such as
/// the tuner's picks; "TRACE": everything. Read once. Anything else is treated as INFO, so a
/// typo still shows more, never less.
inline log_level log_threshold() {
  static const log_level level = [] {
    const char* v = std::getenv("CHORUS_DEBUG");
    if (v == nullptr || *v == '\0' || std::string_view(v) == "0") return log_level::warn;
    const std::string_view s(v);
    if (s == "TRACE" || s == "trace") return log_level::trace;
    return log_level::info;
  }();
  return level;
}

inline bool log_enabled(log_level l) { return static_cast<int>(l) <= static_cast<int>(log_threshold()); }

/// Writes "chorus[rank]: text" as one write, so lines of several ranks do not interleave.
inline void log(log_level l, int rank, const std::string& text) {
  if (!log_enabled(l)) return;
  const std::string line = "chorus[" + std::to_string(rank) + "]: " + text + "\n";
  std::fwrite(line.data(), 1, line.size(), stderr);
}

}  // namespace chorus::detail
