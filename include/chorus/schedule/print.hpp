// SPDX-License-Identifier: Apache-2.0
// A schedule as text, one line per step: for reading, for golden files and for logs.
#pragma once

#include <string>

#include "chorus/schedule/schedule.hpp"

namespace chorus {

namespace detail {

inline std::string to_string(const region& g) {
  if (g.count == 0) return "empty";
  const char* name = g.buffer == buffer_id::input    ? "in"
                     : g.buffer == buffer_id::output ? "out"
                                                     : "scratch";
  return std::string(name) + "[" + std::to_string(g.offset) + "," +
         std::to_string(g.offset + g.count) + ")";
}

}  // namespace detail

/// The schedule as a header line and one numbered line per step; regions are half-open
/// element ranges, "in[0,6)" the input's first six elements.
///
/// **Example**:
///   to_string(ring_all_reduce(0, 2, 4)) ==
///     "all_reduce ring, rank 0 of 2\n"
///     "  0  send in[0,2) to 1; reduce out[2,4) = in[2,4) + from 1\n"
///     "  1  send out[2,4) to 1; recv out[0,2) from 1\n"
inline std::string to_string(const schedule& s) {
  std::string text = std::string(to_string(s.kind)) + " " + std::string(to_string(s.algorithm)) +
                     ", rank " + std::to_string(s.rank) + " of " + std::to_string(s.nranks);
  if (s.root >= 0) text += (s.kind == collective::send_recv ? ", peer " : ", root ") + std::to_string(s.root);
  if (s.scratch_count > 0) text += ", scratch " + std::to_string(s.scratch_count);
  text += "\n";
  for (std::size_t i = 0; i < s.steps.size(); ++i) {
    const step& st = s.steps[i];
    std::string line;
    auto part = [&](const std::string& p) { line += (line.empty() ? "" : "; ") + p; };
    if (st.send_peer >= 0) part("send " + detail::to_string(st.send_from) + " to " + std::to_string(st.send_peer));
    const std::string from = " from " + std::to_string(st.recv_peer);
    switch (st.action) {
      case recv_action::none:
        if (st.recv_peer >= 0) part("recv (dropped)" + from);
        break;
      case recv_action::store:
        part("recv " + detail::to_string(st.recv_into) + from);
        break;
      case recv_action::reduce:
        part("reduce " + detail::to_string(st.recv_into) + " = " + detail::to_string(st.reduce_with) + " +" + from);
        break;
      case recv_action::copy:
        part("copy " + detail::to_string(st.recv_into) + " = " + detail::to_string(st.reduce_with));
        break;
    }
    if (line.empty()) line = "nothing";
    std::string index = std::to_string(i);
    text += std::string(index.size() < 3 ? 3 - index.size() : 0, ' ') + index + "  " + line + "\n";
  }
  return text;
}

}  // namespace chorus
