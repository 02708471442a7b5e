// SPDX-License-Identifier: Apache-2.0
// A symbolic executor for schedules: runs every rank's steps over values that record which
// ranks' contributions (and which element) they hold, with no I/O.
#pragma once

#include <chorus/schedule/schedule.hpp>

#include <algorithm>
#include <bitset>
#include <cstddef>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace chorus::test {

/// The most ranks the checker models. Rank sets are fixed-size bitsets so that a symbol
/// copies like plain bytes: the tests run tens of thousands of schedules of up to 128 ranks.
inline constexpr int max_ranks = 128;
using rank_set = std::bitset<max_ranks>;

/// One element's symbolic value: the element it belongs to (-1: unwritten, or values of
/// different elements were mixed), whose contributions are summed in, and whether any of
/// them is summed in more than once (so "every rank exactly once" is `from` all set and
/// `repeated` false).
struct symbol {
  long element = -1;
  rank_set from;
  bool repeated = false;

  friend bool operator==(const symbol&, const symbol&) = default;
};

/// Element `element` of rank `rank`'s contribution.
inline symbol contributed(int rank, long element) {
  symbol s;
  s.element = element;
  s.from.set(static_cast<std::size_t>(rank));
  return s;
}

/// Every rank of `nranks` summed in exactly once.
inline rank_set all_ranks(int nranks) {
  rank_set s;
  for (int r = 0; r < nranks; ++r) s.set(static_cast<std::size_t>(r));
  return s;
}

/// One rank's buffers. The input and the output are windows into one `memory`, so the
/// in-place forms (all_gather's input at out + rank * block, reduce_scatter's output at
/// in + rank * block, ...) are modelled exactly: writing the output overwrites the input.
struct symbolic_rank {
  struct window {
    std::size_t at = 0;
    std::size_t count = 0;
    bool present = true;  ///< false: the rank has no such buffer; naming it is an error
  };
  std::vector<symbol> memory;
  std::vector<symbol> scratch;
  window input, output;
  rank_set heard;  ///< after run_symbolic: the ranks this rank's completion causally follows
  /// After run_symbolic: steps whose receive wrote memory the same step sends from. The
  /// checker sends first, but an executor that slices both directions of one step may not:
  /// tests require none except where an algorithm relies on it on purpose.
  int self_overlaps = 0;

  std::span<const symbol> in() const { return {memory.data() + input.at, input.count}; }
  std::span<const symbol> out() const { return {memory.data() + output.at, output.count}; }
};

/// A rank whose input holds `input` and whose output, a separate buffer, `output_count`
/// unwritten elements. `has_input` / `has_output` false: that buffer does not exist here.
inline symbolic_rank separate_buffers(const std::vector<symbol>& input, std::size_t output_count,
                                      bool has_input = true, bool has_output = true) {
  symbolic_rank r;
  r.memory = input;
  r.memory.resize(input.size() + output_count);
  r.input = {0, input.size(), has_input};
  r.output = {input.size(), output_count, has_output};
  return r;
}

/// An in-place rank whose input lies inside its output: `output_count` elements, of which
/// [input_at, input_at + input.size()) hold `input` and the rest is unwritten.
inline symbolic_rank input_in_output(const std::vector<symbol>& input, std::size_t output_count,
                                     std::size_t input_at) {
  symbolic_rank r;
  r.memory.resize(std::max(output_count, input_at + input.size()));
  std::copy(input.begin(), input.end(), r.memory.begin() + static_cast<long>(input_at));
  r.input = {input_at, input.size(), true};
  r.output = {0, output_count, true};
  return r;
}

/// An in-place rank whose output lies inside its input, at `output_at` (reduce_scatter,
/// scatter's root).
inline symbolic_rank output_in_input(const std::vector<symbol>& input, std::size_t output_count,
                                     std::size_t output_at) {
  symbolic_rank r;
  r.memory = input;
  r.memory.resize(std::max(input.size(), output_at + output_count));
  r.input = {0, input.size(), true};
  r.output = {output_at, output_count, true};
  return r;
}

namespace detail {

inline std::string describe(const region& g) {
  const char* name = g.buffer == buffer_id::input    ? "input"
                     : g.buffer == buffer_id::output ? "output"
                                                     : "scratch";
  return std::string(name) + "[" + std::to_string(g.offset) + ", " +
         std::to_string(g.offset + g.count) + ")";
}

/// The first symbol `g` names on `me`, or why it names nothing valid.
inline std::optional<std::string> locate(symbolic_rank& me, const region& g, symbol*& first) {
  std::size_t base = 0;
  std::size_t size = 0;
  std::vector<symbol>* buf = &me.memory;
  switch (g.buffer) {
    case buffer_id::input:
    case buffer_id::output: {
      const auto& w = g.buffer == buffer_id::input ? me.input : me.output;
      if (!w.present) return describe(g) + " names a buffer this rank does not have";
      base = w.at;
      size = w.count;
      break;
    }
    case buffer_id::scratch:
      buf = &me.scratch;
      size = buf->size();
      break;
  }
  if (g.offset > size || g.count > size - g.offset) {
    return describe(g) + " is out of bounds (" + std::to_string(size) + " elements)";
  }
  first = buf->data() + base + g.offset;
  return std::nullopt;
}

}  // namespace detail

/// Runs the schedules of all ranks to completion over unbounded FIFO channels, as the TCP
/// transport orders messages: one step at a time per rank, in order, a step's send going out
/// before it waits for its receive. Returns an error sentence (a bad step, a deadlock, a
/// message never received), or nothing on success; `ranks` holds every rank's buffers and
/// heard-from sets afterwards.
inline std::optional<std::string> run_symbolic(const std::vector<schedule>& scheds,
                                               std::vector<symbolic_rank>& ranks) {
  const int n = static_cast<int>(scheds.size());
  if (n > max_ranks) return "the symbolic checker models at most 128 ranks";
  struct message {
    std::vector<symbol> data;
    rank_set heard;  // the sender's heard-from set when it sent
  };
  std::map<std::pair<int, int>, std::deque<message>> channel;
  std::vector<std::size_t> pc(scheds.size(), 0);
  std::vector<bool> sent(scheds.size(), false);  // the current step's send went out
  for (int r = 0; r < n; ++r) {
    ranks[static_cast<std::size_t>(r)].heard.reset();
    ranks[static_cast<std::size_t>(r)].heard.set(static_cast<std::size_t>(r));
    ranks[static_cast<std::size_t>(r)].self_overlaps = 0;
  }
  std::vector<symbol> incoming;
  bool moved = true;
  while (moved) {
    moved = false;
    for (int r = 0; r < n; ++r) {
      const auto ur = static_cast<std::size_t>(r);
      const auto& steps = scheds[ur].steps;
      auto& me = ranks[ur];
      while (pc[ur] < steps.size()) {
        const step& st = steps[pc[ur]];
        auto where = [&] { return "rank " + std::to_string(r) + " step " + std::to_string(pc[ur]); };
        const bool receives = st.action == recv_action::store || st.action == recv_action::reduce;
        if (receives != (st.recv_peer >= 0)) {
          return where() + ": a receive needs both a peer and a store or reduce action";
        }
        // A step sends before it waits: sends never block (unbounded channels).
        if (st.send_peer >= 0 && !sent[ur]) {
          if (st.send_peer >= n || st.send_peer == r) return where() + ": bad send peer";
          symbol* src = nullptr;
          if (auto e = detail::locate(me, st.send_from, src)) return where() + ": send " + *e;
          channel[{r, st.send_peer}].push_back(
              message{std::vector<symbol>(src, src + st.send_from.count), me.heard});
          sent[ur] = true;
          moved = true;
        }
        if (st.recv_peer >= 0) {
          if (st.recv_peer >= n || st.recv_peer == r) return where() + ": bad receive peer";
          auto& q = channel[{st.recv_peer, r}];
          if (q.empty()) break;  // blocked: try other ranks
          incoming = std::move(q.front().data);
          me.heard |= q.front().heard;
          q.pop_front();
        }
        if (st.action != recv_action::none) {
          symbol* dst = nullptr;
          if (auto e = detail::locate(me, st.recv_into, dst)) return where() + ": into " + *e;
          if (st.action == recv_action::copy) {
            symbol* src = nullptr;
            if (auto e = detail::locate(me, st.reduce_with, src)) return where() + ": copy from " + *e;
            incoming.assign(src, src + st.reduce_with.count);  // memmove: read all, then write
          }
          if (incoming.size() != st.recv_into.count) {
            return where() + ": " + std::to_string(incoming.size()) +
                   " elements arrive for a region of " + std::to_string(st.recv_into.count);
          }
          if (st.action == recv_action::reduce) {
            symbol* local = nullptr;
            if (auto e = detail::locate(me, st.reduce_with, local)) return where() + ": reduce with " + *e;
            if (st.reduce_with.count != st.recv_into.count) return where() + ": reduce sizes differ";
            for (std::size_t i = 0; i < incoming.size(); ++i) {
              const symbol& a = local[i];
              symbol& b = incoming[i];
              b.element = a.element == b.element ? a.element : -1;
              b.repeated = a.repeated || b.repeated || (a.from & b.from).any();
              b.from |= a.from;
            }
          }
          if (st.send_peer >= 0 && st.send_from.count > 0 && st.recv_into.count > 0) {
            symbol* src = nullptr;
            detail::locate(me, st.send_from, src);  // located fine when it was sent
            const std::less<const symbol*> before;
            if (before(src, dst + st.recv_into.count) && before(dst, src + st.send_from.count)) ++me.self_overlaps;
          }
          std::copy(incoming.begin(), incoming.end(), dst);
        } else if (st.send_peer < 0) {
          return where() + ": a step that does nothing";
        }
        ++pc[ur];
        sent[ur] = false;
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

/// `count` elements of rank `rank`'s contribution, numbered from `first_element`.
inline std::vector<symbol> contribution(int rank, std::size_t count, long first_element = 0) {
  std::vector<symbol> v(count);
  for (std::size_t i = 0; i < count; ++i) v[i] = contributed(rank, first_element + static_cast<long>(i));
  return v;
}

}  // namespace chorus::test
