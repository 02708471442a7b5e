// SPDX-License-Identifier: Apache-2.0
// A rank's schedule as the simulator runs it: steps reduced to peers, byte counts, slices and
// the hazards between them, run-length encoded so that 16k ranks of rings fit in memory.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "chorus/executor/detail/hazards.hpp"
#include "chorus/executor/executor.hpp"
#include "chorus/schedule/schedule.hpp"

namespace chorus::detail {

/// "Slice k of my `mine` place waits until step (this - rel) is done with its `theirs` place
/// up to the bytes slice k touches." Offsets are relative to my place's start, so that the
/// gates of a ring's steps are equal step after step and runs compress.
struct sim_gate {
  std::uint32_t rel = 0;  ///< how many steps back (0: this step's own send)
  access_role mine = access_role::send;
  access_role theirs = access_role::send;
  std::int64_t delta = 0;      ///< their place's start minus mine, in bytes
  std::uint64_t bytes = 0;     ///< their place's size
  std::uint64_t unit = 1;      ///< their slice size
  friend bool operator==(const sim_gate&, const sim_gate&) = default;
};

/// One step without its memory: who it talks to, how much, in how many slices. Peers are
/// counted from the rank that runs it ((peer - rank) mod n), so that the ranks of a ring, or
/// the same local rank of every node, can share one program.
struct sim_step {
  std::int32_t send_peer = -1, recv_peer = -1;  ///< -1: none
  recv_action action = recv_action::none;
  std::uint64_t send_bytes = 0, recv_bytes = 0;
  std::uint64_t unit = 1;  ///< slice bytes (a copy: its whole size)
  std::vector<sim_gate> gates;
  friend bool operator==(const sim_step&, const sim_step&) = default;

  std::uint64_t send_slices() const {
    return send_peer < 0 ? 0 : std::max<std::uint64_t>(1, (send_bytes + unit - 1) / unit);
  }
  std::uint64_t recv_slices() const {
    if (action == recv_action::none) return 0;
    if (action == recv_action::copy) return 1;
    return std::max<std::uint64_t>(1, (recv_bytes + unit - 1) / unit);
  }
  std::uint64_t place_bytes(access_role r) const {
    return r == access_role::send ? send_bytes : recv_bytes;  // a local operand is the recv's size
  }
};

/// A rank's program: its distinct steps, each once, and runs of repeats, in schedule order.
struct sim_program {
  std::vector<sim_step> distinct;
  struct run {
    std::uint32_t step = 0;   ///< index into distinct
    std::uint32_t count = 0;  ///< consecutive steps equal to it
    friend bool operator==(const run&, const run&) = default;
  };
  std::vector<run> runs;
  std::uint64_t steps = 0;
  std::uint64_t sent_bytes = 0;  ///< everything this rank sends
  std::uint64_t messages = 0;    ///< slices this rank sends
  bool expose = false;           ///< its sends are exposed (executor_job::expose)
  friend bool operator==(const sim_program&, const sim_program&) = default;

  /// Walks the steps in order without expanding the runs.
  class cursor {
   public:
    explicit cursor(const sim_program& p) : p_(&p) {}
    bool done() const { return run_ >= p_->runs.size(); }
    const sim_step& get() const { return p_->distinct[p_->runs[run_].step]; }
    void next() {
      if (++off_ == p_->runs[run_].count) {
        ++run_;
        off_ = 0;
      }
    }

   private:
    const sim_program* p_;
    std::size_t run_ = 0;
    std::uint32_t off_ = 0;
  };
};

/// FNV-1a over 64-bit words, for the hashes below (heartbeat.hpp's fnv1a reads bytes; these
/// structs have padding, so they are hashed field by field).
struct word_hash {
  std::uint64_t h = 0xcbf29ce484222325;
  void add(std::uint64_t v) { h = (h ^ v) * 0x100000001b3; }
};

/// What make_program dedupes steps by.
struct sim_step_hash {
  std::size_t operator()(const sim_step& x) const noexcept {
    word_hash w;
    for (std::uint64_t v : {std::uint64_t{static_cast<std::uint32_t>(x.send_peer)},
                            std::uint64_t{static_cast<std::uint32_t>(x.recv_peer)},
                            static_cast<std::uint64_t>(x.action), x.send_bytes, x.recv_bytes, x.unit}) {
      w.add(v);
    }
    for (const sim_gate& g : x.gates) {
      w.add(g.rel);
      w.add(static_cast<std::uint64_t>(g.delta));
      w.add(g.bytes);
    }
    return static_cast<std::size_t>(w.h);
  }
};

/// A hash of a whole program, to find ranks that can share one.
inline std::size_t hash_of(const sim_program& p) {
  word_hash w;
  w.add(p.steps);
  w.add(p.sent_bytes);
  w.add(p.expose ? 1 : 0);
  for (const sim_step& x : p.distinct) w.add(sim_step_hash{}(x));
  for (const sim_program::run& r : p.runs) w.add(std::uint64_t{r.step} << 32 | r.count);
  return static_cast<std::size_t>(w.h);
}

/// Builds the program of schedule `s` (for a call of `count` elements of `elem_size` bytes) as
/// the executor would run it: the same slice size (slice_for) and the same hazards
/// (hazard_table), found from addresses the buffers would have (input and output apart, or
/// aliased when `in_place`).
inline sim_program make_program(const schedule& s, std::size_t count, std::size_t elem_size,
                                const executor_options& opts, bool in_place = false) {
  sim_program p;
  const std::size_t unit =
      slice_for(s.kind, s.algorithm, count, s.nranks, elem_size, opts.slice_bytes, opts.max_slice_bytes);
  // Far-apart bases: no two buffers overlap unless in place.
  constexpr std::uintptr_t input_base = std::uintptr_t{1} << 40;
  const std::uintptr_t output_base = in_place ? input_base : std::uintptr_t{2} << 40;
  constexpr std::uintptr_t scratch_base = std::uintptr_t{3} << 40;
  auto base_of = [&](buffer_id b) {
    return b == buffer_id::input ? input_base : b == buffer_id::output ? output_base : scratch_base;
  };
  struct place {
    std::uintptr_t lo = 0;
    std::uint64_t bytes = 0;
  };
  std::vector<std::array<place, 3>> places(s.steps.size());
  std::vector<std::uint64_t> units(s.steps.size(), unit);
  hazard_table h;
  const int n = s.nranks;
  auto relative = [&](int peer) { return peer < 0 ? -1 : ((peer - s.rank) % n + n) % n; };
  std::unordered_map<sim_step, std::uint32_t, sim_step_hash> index;  // into p.distinct
  for (std::size_t i = 0; i < s.steps.size(); ++i) {
    const step& st = s.steps[i];
    auto at = [&](const region& r) {
      return place{base_of(r.buffer) + r.offset * elem_size, r.count * elem_size};
    };
    auto& pl = places[i];
    if (st.send_peer >= 0) pl[0] = at(st.send_from);
    if (st.action != recv_action::none) pl[1] = at(st.recv_into);
    if (st.action == recv_action::reduce || st.action == recv_action::copy) pl[2] = at(st.reduce_with);
    if (st.action == recv_action::copy) units[i] = std::max<std::uint64_t>(1, pl[1].bytes);
    const auto g = static_cast<std::uint32_t>(i);
    h.add(g, access_role::send, pl[0].lo, pl[0].lo + pl[0].bytes);
    h.add(g, access_role::write, pl[1].lo, pl[1].lo + pl[1].bytes);
    h.add(g, access_role::local, pl[2].lo, pl[2].lo + pl[2].bytes);
  }
  h.build(s.steps.size());
  auto role_index = [](access_role r) { return r == access_role::send ? 0 : r == access_role::write ? 1 : 2; };
  for (std::size_t i = 0; i < s.steps.size(); ++i) {
    const step& st = s.steps[i];
    sim_step x;
    x.send_peer = relative(st.send_peer);
    x.recv_peer = st.action == recv_action::copy || st.action == recv_action::none ? -1 : relative(st.recv_peer);
    x.action = st.action;
    x.send_bytes = places[i][0].bytes;
    x.recv_bytes = places[i][1].bytes;
    x.unit = units[i];
    for (std::uint32_t gi = h.first[i]; gi < h.first[i + 1]; ++gi) {
      const gate& g = h.gates[gi];
      const place& mine = places[i][static_cast<std::size_t>(role_index(g.mine))];
      const place& theirs = places[g.step][static_cast<std::size_t>(role_index(g.theirs))];
      x.gates.push_back(sim_gate{static_cast<std::uint32_t>(i - g.step), g.mine, g.theirs,
                                 static_cast<std::int64_t>(theirs.lo) - static_cast<std::int64_t>(mine.lo),
                                 theirs.bytes, units[g.step]});
    }
    // The hazard table lists a step's gates in an order that shifts with where its places
    // lie; clear() needs them all whatever the order, and a fixed one lets equal steps be
    // equal, so that the runs compress (a 1,024-rank ring all_reduce of 128 MiB: 702
    // distinct steps of 2,046 in hazard order).
    std::sort(x.gates.begin(), x.gates.end(), [](const sim_gate& a, const sim_gate& b) {
      return std::tie(a.rel, a.mine, a.theirs, a.delta, a.bytes, a.unit) <
             std::tie(b.rel, b.mine, b.theirs, b.delta, b.bytes, b.unit);
    });
    p.sent_bytes += x.send_peer >= 0 ? x.send_bytes : 0;
    p.messages += x.send_slices();
    ++p.steps;
    if (!p.runs.empty() && p.distinct[p.runs.back().step] == x) {
      ++p.runs.back().count;
      continue;
    }
    // A step seen before (a hierarchical rank's steps alternate between a few) is kept once.
    const auto [at, fresh] = index.try_emplace(x, static_cast<std::uint32_t>(p.distinct.size()));
    if (fresh) p.distinct.push_back(std::move(x));
    p.runs.push_back({at->second, 1});
  }
  return p;
}

}  // namespace chorus::detail
