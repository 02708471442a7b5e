// SPDX-License-Identifier: Apache-2.0
// A symbolic executor for schedules: runs every rank's steps over values that record which
// ranks' contributions (and which element) they hold, with no I/O.
#pragma once

#include <chorus/schedule/schedule.hpp>

#include <cstddef>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace chorus::test {

/// One element's symbolic value: the element index it belongs to (-1: unwritten, or values
/// of different elements were mixed) and how many times each rank's input is summed in.
struct symbol {
  long element = -1;
  std::vector<int> from;  // from[r] = multiplicity of rank r's contribution

  friend bool operator==(const symbol&, const symbol&) = default;
};

struct symbolic_rank {
  std::vector<symbol> input, output, scratch;

  std::vector<symbol>& buffer(buffer_id b) {
    return b == buffer_id::input ? input : b == buffer_id::output ? output : scratch;
  }
};

/// Runs the schedules of all ranks to completion over unbounded FIFO channels, as the TCP
/// transport orders messages. Returns an error sentence, or nothing on success; `ranks`
/// holds every rank's buffers afterwards.
inline std::optional<std::string> run_symbolic(const std::vector<schedule>& scheds,
                                               std::vector<symbolic_rank>& ranks) {
  const int n = static_cast<int>(scheds.size());
  std::map<std::pair<int, int>, std::deque<std::vector<symbol>>> channel;
  std::vector<std::size_t> pc(scheds.size(), 0);
  std::vector<bool> sent(scheds.size(), false);  // the current step's send went out
  auto slice = [](std::vector<symbol>& buf, const region& r) -> std::optional<std::string> {
    if (r.offset + r.count > buf.size()) return std::string("region out of bounds");
    return std::nullopt;
  };
  bool moved = true;
  while (moved) {
    moved = false;
    for (int r = 0; r < n; ++r) {
      const auto& steps = scheds[static_cast<std::size_t>(r)].steps;
      auto& me = ranks[static_cast<std::size_t>(r)];
      while (pc[static_cast<std::size_t>(r)] < steps.size()) {
        const step& st = steps[pc[static_cast<std::size_t>(r)]];
        const std::string where =
            "rank " + std::to_string(r) + " step " + std::to_string(pc[static_cast<std::size_t>(r)]);
        // A step sends before it waits: sends never block (unbounded channels).
        if (st.send_peer >= 0 && !sent[static_cast<std::size_t>(r)]) {
          if (st.send_peer >= n || st.send_peer == r) return where + ": bad send peer";
          auto& src = me.buffer(st.send_from.buffer);
          if (auto e = slice(src, st.send_from)) return where + ": send " + *e;
          auto first = src.begin() + static_cast<long>(st.send_from.offset);
          channel[{r, st.send_peer}].emplace_back(first, first + static_cast<long>(st.send_from.count));
          sent[static_cast<std::size_t>(r)] = true;
          moved = true;
        }
        std::vector<symbol> incoming;
        if (st.recv_peer >= 0) {
          auto& q = channel[{st.recv_peer, r}];
          if (q.empty()) break;  // blocked: try other ranks
          incoming = std::move(q.front());
          q.pop_front();
        }
        if (st.action != recv_action::none) {
          auto& dst = me.buffer(st.recv_into.buffer);
          if (auto e = slice(dst, st.recv_into)) return where + ": recv_into " + *e;
          if (st.action == recv_action::copy) {
            auto& src = me.buffer(st.reduce_with.buffer);
            if (auto e = slice(src, st.reduce_with)) return where + ": copy source " + *e;
            incoming.assign(src.begin() + static_cast<long>(st.reduce_with.offset),
                            src.begin() + static_cast<long>(st.reduce_with.offset + st.reduce_with.count));
          }
          if (incoming.size() != st.recv_into.count) {
            return where + ": received " + std::to_string(incoming.size()) +
                   " elements into a region of " + std::to_string(st.recv_into.count);
          }
          if (st.action == recv_action::reduce) {
            auto& local = me.buffer(st.reduce_with.buffer);
            if (auto e = slice(local, st.reduce_with)) return where + ": reduce_with " + *e;
            if (st.reduce_with.count != st.recv_into.count) return where + ": reduce size differs";
            for (std::size_t i = 0; i < incoming.size(); ++i) {
              const symbol& a = local[st.reduce_with.offset + i];
              symbol& b = incoming[i];
              b.element = a.element == b.element ? a.element : -1;
              for (std::size_t k = 0; k < b.from.size(); ++k) b.from[k] += a.from[k];
            }
          }
          std::copy(incoming.begin(), incoming.end(),
                    dst.begin() + static_cast<long>(st.recv_into.offset));
        }
        ++pc[static_cast<std::size_t>(r)];
        sent[static_cast<std::size_t>(r)] = false;
        moved = true;
      }
    }
  }
  for (int r = 0; r < n; ++r) {
    if (pc[static_cast<std::size_t>(r)] != scheds[static_cast<std::size_t>(r)].steps.size()) {
      return "deadlock: rank " + std::to_string(r) + " is stuck at step " +
             std::to_string(pc[static_cast<std::size_t>(r)]);
    }
  }
  for (const auto& [key, q] : channel) {
    if (!q.empty()) {
      return "rank " + std::to_string(key.first) + " sent " + std::to_string(q.size()) +
             " message(s) rank " + std::to_string(key.second) + " never received";
    }
  }
  return std::nullopt;
}

/// A fresh symbolic buffer of `count` elements: element i of rank r's contribution.
inline std::vector<symbol> contribution(int rank, int nranks, std::size_t count,
                                        long first_element = 0) {
  std::vector<symbol> v(count);
  for (std::size_t i = 0; i < count; ++i) {
    v[i].element = first_element + static_cast<long>(i);
    v[i].from.assign(static_cast<std::size_t>(nranks), 0);
    v[i].from[static_cast<std::size_t>(rank)] = 1;
  }
  return v;
}

inline std::vector<symbol> unwritten(int nranks, std::size_t count) {
  symbol s{-1, std::vector<int>(static_cast<std::size_t>(nranks), 0)};
  return std::vector<symbol>(count, s);
}

}  // namespace chorus::test
