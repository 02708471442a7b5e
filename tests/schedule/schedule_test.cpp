// SPDX-License-Identifier: Apache-2.0
// Proves the schedules symbolically: every output holds every contribution exactly once.
#include <doctest/doctest.h>

#include <chorus/schedule/hierarchical.hpp>
#include <chorus/schedule/recursive_doubling.hpp>
#include <chorus/schedule/ring.hpp>

#include <algorithm>
#include <cstddef>
#include <functional>
#include <random>
#include <optional>
#include <utility>
#include <string>
#include <vector>

#include "symbolic.hpp"

using namespace chorus;
using chorus::test::symbol;

namespace {

using maker = std::function<schedule(int, int, std::size_t)>;

// Counts that exercise empty chunks, uneven chunks and exact multiples.
std::vector<std::size_t> counts_for(int n) {
  const auto nn = static_cast<std::size_t>(n);
  return {0, 1, nn - 1, nn, 2 * nn + 1, 3 * nn + 2};
}

/// Runs every rank's schedule `make(r, n, arg)` symbolically. Rank r contributes `in_count`
/// elements numbered from first(r); output and scratch start unwritten. Returns the checker's
/// complaint, or nothing with every rank's buffers in `ranks`.
std::optional<std::string> simulate(const maker& make, int n, std::size_t arg,
                                    std::size_t in_count, std::size_t out_count,
                                    const std::function<long(int)>& first,
                                    std::vector<test::symbolic_rank>& ranks) {
  std::vector<schedule> scheds;
  ranks.assign(static_cast<std::size_t>(n), {});
  for (int r = 0; r < n; ++r) {
    scheds.push_back(make(r, n, arg));
    auto& me = ranks[static_cast<std::size_t>(r)];
    me.input = test::contribution(r, n, in_count, first(r));
    me.output = test::unwritten(n, out_count);
    me.scratch = test::unwritten(n, scheds.back().scratch_count);
  }
  return test::run_symbolic(scheds, ranks);
}

long from_zero(int) { return 0; }

std::string check_all_reduce(const maker& make, int n, std::size_t count) {
  std::vector<test::symbolic_rank> ranks;
  if (auto e = simulate(make, n, count, count, count, from_zero, ranks)) return *e;
  const std::vector<int> once(static_cast<std::size_t>(n), 1);
  for (int r = 0; r < n; ++r) {
    const auto& out = ranks[static_cast<std::size_t>(r)].output;
    for (std::size_t i = 0; i < count; ++i) {
      if (out[i].element != static_cast<long>(i) || out[i].from != once) {
        return "rank " + std::to_string(r) + " element " + std::to_string(i) +
               " does not hold every rank's contribution exactly once";
      }
    }
  }
  return {};
}

std::string check_reduce_scatter(const maker& make, int n, std::size_t block) {
  const auto nn = static_cast<std::size_t>(n);
  std::vector<test::symbolic_rank> ranks;
  if (auto e = simulate(make, n, block, block * nn, block, from_zero, ranks)) return *e;
  const std::vector<int> once(nn, 1);
  for (int r = 0; r < n; ++r) {
    for (std::size_t i = 0; i < block; ++i) {
      const symbol& v = ranks[static_cast<std::size_t>(r)].output[i];
      if (v.element != static_cast<long>(static_cast<std::size_t>(r) * block + i) || v.from != once) {
        return "rank " + std::to_string(r) + " element " + std::to_string(i) +
               " is not its block reduced over every rank exactly once";
      }
    }
  }
  return {};
}

std::string check_all_gather(const maker& make, int n, std::size_t block) {
  const auto nn = static_cast<std::size_t>(n);
  auto own_block = [block](int r) { return static_cast<long>(static_cast<std::size_t>(r) * block); };
  std::vector<test::symbolic_rank> ranks;
  if (auto e = simulate(make, n, block, block, block * nn, own_block, ranks)) return *e;
  for (int r = 0; r < n; ++r) {
    for (std::size_t i = 0; i < block * nn; ++i) {
      const symbol& v = ranks[static_cast<std::size_t>(r)].output[i];
      std::vector<int> expect(nn, 0);
      expect[i / block] = 1;
      if (v.element != static_cast<long>(i) || v.from != expect) {
        return "rank " + std::to_string(r) + " element " + std::to_string(i) +
               " is not rank " + std::to_string(i / block) + "'s";
      }
    }
  }
  return {};
}

}  // namespace

TEST_CASE("ring and recursive doubling all_reduce leave every rank with every contribution exactly once, n = 1..64") {
  for (const auto& algorithm : {std::pair<const char*, maker>{"ring", ring_all_reduce},
                                 {"recursive_doubling", recursive_doubling_all_reduce}}) {
    // Named copies: clang 14 cannot capture structured bindings in CAPTURE's lambda.
    const char* name = algorithm.first;
    const maker& make = algorithm.second;
    for (int n = 1; n <= 64; ++n) {
      for (std::size_t count : counts_for(n)) {
        CAPTURE(name);
        CAPTURE(n);
        CAPTURE(count);
        CHECK(check_all_reduce(make, n, count) == "");
      }
    }
  }
}

TEST_CASE("ring reduce_scatter leaves block r fully reduced on rank r, n = 1..64") {
  for (int n = 1; n <= 64; ++n) {
    for (std::size_t block : {std::size_t{0}, std::size_t{1}, std::size_t{3}}) {
      CAPTURE(n);
      CAPTURE(block);
      CHECK(check_reduce_scatter(ring_reduce_scatter, n, block) == "");
    }
  }
}

TEST_CASE("ring all_gather delivers every rank's block to every rank, n = 1..64") {
  for (int n = 1; n <= 64; ++n) {
    for (std::size_t block : {std::size_t{0}, std::size_t{1}, std::size_t{3}}) {
      CAPTURE(n);
      CAPTURE(block);
      CHECK(check_all_gather(ring_all_gather, n, block) == "");
    }
  }
}

TEST_CASE("the symbolic checker rejects a schedule that counts a contribution twice") {
  // A broken ring: the all-gather phase reduces instead of storing.
  auto broken = [](int r, int n, std::size_t count) {
    schedule s = ring_all_reduce(r, n, count);
    for (auto& st : s.steps) {
      if (st.action == recv_action::store) {
        st.action = recv_action::reduce;
        st.reduce_with = st.recv_into;
      }
    }
    return s;
  };
  CHECK(check_all_reduce(broken, 4, 8) != "");
}

TEST_CASE("the symbolic checker reports a deadlock when a rank waits for a message never sent") {
  auto broken = [](int r, int n, std::size_t count) {
    schedule s = ring_all_reduce(r, n, count);
    if (r == 0) s.steps.pop_back();  // rank 0 skips its last step: rank 1 waits forever
    return s;
  };
  CHECK(check_all_reduce(broken, 3, 6) != "");
}

TEST_CASE("ring all_reduce sends 2(P-1)/P of the buffer per rank, as its header says") {
  for (int n = 2; n <= 16; ++n) {
    const std::size_t count = static_cast<std::size_t>(n) * 10;
    std::size_t sent = 0;
    for (const auto& st : ring_all_reduce(0, n, count).steps) {
      if (st.send_peer >= 0) sent += st.send_from.count;
    }
    CHECK(sent == 2 * static_cast<std::size_t>(n - 1) * 10);
  }
}

namespace {

/// The executor's rule (schedule.hpp): two regions of one buffer start together or do not
/// overlap. Returns the first violation.
std::string check_region_rule(const schedule& s) {
  std::vector<region> all;
  for (const step& st : s.steps) {
    if (st.send_peer >= 0) all.push_back(st.send_from);
    if (st.action != recv_action::none) all.push_back(st.recv_into);
    if (st.action == recv_action::reduce || st.action == recv_action::copy) all.push_back(st.reduce_with);
  }
  // Sorted by buffer and start, a region breaks the rule exactly when it starts inside a
  // non-empty region that started earlier: compare with the furthest end seen so far.
  std::erase_if(all, [](const region& r) { return r.count == 0; });
  std::sort(all.begin(), all.end(), [](const region& a, const region& b) {
    return std::pair(a.buffer, a.offset) < std::pair(b.buffer, b.offset);
  });
  std::size_t end_before = 0;  // furthest end of the regions starting before the current start
  std::size_t group_end = 0;   // furthest end of the regions starting at the current start
  for (std::size_t i = 0; i < all.size(); ++i) {
    const bool new_buffer = i == 0 || all[i].buffer != all[i - 1].buffer;
    if (new_buffer) {
      end_before = group_end = 0;
    } else if (all[i].offset != all[i - 1].offset) {
      end_before = std::max(end_before, group_end);
      group_end = 0;
    }
    if (all[i].offset < end_before) {
      return "a region at " + std::to_string(all[i].offset) +
             " starts inside an earlier one that ends at " + std::to_string(end_before);
    }
    group_end = std::max(group_end, all[i].offset + all[i].count);
  }
  return {};
}

/// Node layouts to check: every K x M with K * M <= 64, hand-picked uneven ones, and two
/// random splits of every n in 2..64 (fixed seed).
std::vector<std::vector<int>> node_layouts() {
  // Unoptimized sanitizer builds run the symbolic checker ~50x slower: there, layouts up to
  // 24 ranks (the optimized build, which CI also runs, covers 64).
#if defined(__OPTIMIZE__)
  constexpr int max_ranks = 64;
#else
  constexpr int max_ranks = 24;
#endif
  std::vector<std::vector<int>> layouts;
  for (int k = 1; k <= max_ranks; ++k) {
    for (int m = 1; k * m <= max_ranks; ++m) layouts.emplace_back(static_cast<std::size_t>(k), m);
  }
  for (auto l : {std::vector<int>{1, 2, 3}, {3, 2, 1}, {2, 1}, {1, 4}, {5, 3, 2, 7}, {8, 1, 8}}) {
    layouts.push_back(l);
  }
  std::mt19937 rng(42);
  for (int n = 2; n <= max_ranks; ++n) {
    for (int trial = 0; trial < 2; ++trial) {
      std::vector<int> sizes;
      for (int left = n; left > 0;) {
        const int take = std::uniform_int_distribution<int>(1, std::min(left, 8))(rng);
        sizes.push_back(take);
        left -= take;
      }
      layouts.push_back(sizes);
    }
  }
  return layouts;
}

}  // namespace

TEST_CASE("the region rule check rejects regions that overlap without starting together") {
  schedule s;
  s.steps.push_back(step{.send_peer = 1, .send_from = {buffer_id::output, 0, 10}});
  s.steps.push_back(step{.send_peer = 1, .send_from = {buffer_id::output, 0, 4}});  // same start: fine
  CHECK(check_region_rule(s) == "");
  s.steps.push_back(step{.send_peer = 1, .send_from = {buffer_id::input, 5, 10}});  // other buffer: fine
  CHECK(check_region_rule(s) == "");
  s.steps.push_back(step{.send_peer = 1, .send_from = {buffer_id::output, 9, 3}});  // inside [0, 10)
  CHECK(check_region_rule(s) != "");
}

TEST_CASE("hierarchical all_reduce leaves every rank with every contribution exactly once, even and uneven nodes up to 64 ranks") {
  std::size_t checked = 0;
  for (const auto& sizes : node_layouts()) {
    int n = 0;
    for (int m : sizes) n += m;
    const maker make = [&sizes](int r, int, std::size_t count) {
      return hierarchical_all_reduce(topology::from_sizes(r, sizes), count);
    };
    for (std::size_t count : counts_for(n)) {
      std::string layout;
      for (int m : sizes) layout += std::to_string(m) + " ";
      CAPTURE(layout);
      CAPTURE(count);
      const std::string e = check_all_reduce(make, n, count);
      CHECK(e == "");
      for (int r = 0; r < n && e.empty(); ++r) CHECK(check_region_rule(make(r, n, count)) == "");
      ++checked;
    }
  }
  CHECK(checked > 300);
}

TEST_CASE("hierarchical reduce_scatter and all_gather are exact for even and uneven nodes up to 64 ranks") {
  std::size_t checked = 0;
  for (const auto& sizes : node_layouts()) {
    int n = 0;
    for (int m : sizes) n += m;
    auto topo_of = [&sizes](int r) { return topology::from_sizes(r, sizes); };
    const maker rs = [&](int r, int, std::size_t b) { return hierarchical_reduce_scatter(topo_of(r), b); };
    const maker ag = [&](int r, int, std::size_t b) { return hierarchical_all_gather(topo_of(r), b); };
    for (std::size_t block : {std::size_t{0}, std::size_t{1}, std::size_t{3}}) {
      std::string layout;
      for (int m : sizes) layout += std::to_string(m) + " ";
      CAPTURE(layout);
      CAPTURE(block);
      CHECK(check_reduce_scatter(rs, n, block) == "");
      CHECK(check_all_gather(ag, n, block) == "");
      for (int r = 0; r < n; ++r) {
        CHECK(check_region_rule(rs(r, n, block)) == "");
        CHECK(check_region_rule(ag(r, n, block)) == "");
      }
      ++checked;
    }
  }
  CHECK(checked > 300);
}

TEST_CASE("hierarchical all_reduce sends 2(K-1)/K * S/M across nodes per rank, and 2(M-1)/M * S inside") {
  for (int k : {2, 3, 4}) {
    for (int m : {1, 2, 4}) {
      const std::vector<int> sizes(static_cast<std::size_t>(k), m);
      const std::size_t count = static_cast<std::size_t>(k * m) * 100;
      const topology t = topology::from_sizes(0, sizes);
      std::size_t across = 0, inside = 0;
      for (const auto& st : hierarchical_all_reduce(t, count).steps) {
        if (st.send_peer < 0) continue;
        (t.same_node(0, st.send_peer) ? inside : across) += st.send_from.count;
      }
      CAPTURE(k);
      CAPTURE(m);
      CHECK(across == 2 * static_cast<std::size_t>(k - 1) * count / static_cast<std::size_t>(k * m));
      CHECK(inside == 2 * static_cast<std::size_t>(m - 1) * count / static_cast<std::size_t>(m));
    }
  }
}
