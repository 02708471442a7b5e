// SPDX-License-Identifier: Apache-2.0
// Proves the schedules symbolically (every output holds exactly the right contributions,
// every rank finishes, no message is left over), prices them against their headers' cost
// formulas, and compares their listings with golden files.
#include <doctest/doctest.h>

#include <chorus/error.hpp>
#include <chorus/schedule/build.hpp>
#include <chorus/schedule/print.hpp>

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "symbolic.hpp"

using namespace chorus;
using chorus::test::symbol;

namespace {

// Sanitizer builds run the symbolic checker ~10x slower (50x unoptimized): there, up to 64
// ranks, the range the checker must prove (the g++ build, which CI also runs, covers 128).
#if defined(__SANITIZE_ADDRESS__)
#define CHORUS_TEST_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CHORUS_TEST_SANITIZED 1
#endif
#endif
#if defined(__OPTIMIZE__) && !defined(CHORUS_TEST_SANITIZED)
constexpr int max_n = 128;
constexpr int every_root_up_to = 16;  // beyond, roots 0, 1, n/2 and n-1
constexpr int max_layout_ranks = 64;
#elif defined(__OPTIMIZE__)
constexpr int max_n = 64;
constexpr int every_root_up_to = 8;
constexpr int max_layout_ranks = 32;
#else
constexpr int max_n = 40;
constexpr int every_root_up_to = 8;
constexpr int max_layout_ranks = 24;
#endif

using rank_schedule = std::function<schedule(int rank)>;

/// A flat (single-node) algorithm's schedule of `rank` through the one dispatcher.
rank_schedule flat(collective kind, algo a, int n, std::size_t count, int root = -1) {
  return [=](int rank) {
    return build_schedule(topology::single_node(rank, n),
                          {.kind = kind, .algorithm = a, .count = count, .root = root});
  };
}

// Counts that exercise empty chunks, uneven chunks and exact multiples.
std::vector<std::size_t> counts_for(int n) {
  const auto nn = static_cast<std::size_t>(n);
  return {0, 1, nn - 1, nn, 2 * nn + 1, 3 * nn + 2};
}

// Block sizes for the collectives whose count is one rank's block.
const std::vector<std::size_t> blocks{0, 1, 3};

std::vector<int> roots_for(int n) {
  std::set<int> roots{0, n / 2, n - 1, std::min(1, n - 1)};
  if (n <= every_root_up_to) {
    for (int r = 0; r < n; ++r) roots.insert(r);
  }
  return {roots.begin(), roots.end()};
}

std::string describe(const symbol& s) {
  std::string text = "element " + std::to_string(s.element) + " from {";
  bool first = true;
  for (std::size_t r = 0; r < s.from.size(); ++r) {
    if (!s.from[r]) continue;
    text += (first ? "" : ",") + std::to_string(r);
    first = false;
  }
  return text + "}" + (s.repeated ? " with a contribution counted twice" : "");
}

symbol expected(long element, const test::rank_set& from) {
  symbol s;
  s.element = element;
  s.from = from;
  return s;
}

test::rank_set only(int rank) {
  test::rank_set s;
  s.set(static_cast<std::size_t>(rank));
  return s;
}

/// Runs every rank's schedule over `ranks` (set up by the caller), then compares each
/// rank's output with want(rank, i) where `checked(rank)`. Returns the first complaint.
/// No step may receive into memory it sends from unless `self_overlap_ok`.
std::string run_and_compare(int n, const rank_schedule& make, std::vector<test::symbolic_rank>& ranks,
                            const std::function<bool(int)>& checked,
                            const std::function<symbol(int, std::size_t)>& want,
                            bool self_overlap_ok = false) {
  std::vector<schedule> scheds;
  scheds.reserve(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) {
    scheds.push_back(make(r));
    ranks[static_cast<std::size_t>(r)].scratch.assign(scheds.back().scratch_count, symbol{});
  }
  if (auto e = test::run_symbolic(scheds, ranks)) return *e;
  for (int r = 0; r < n; ++r) {
    if (!self_overlap_ok && ranks[static_cast<std::size_t>(r)].self_overlaps > 0) {
      return "rank " + std::to_string(r) + " has a step that receives into what it sends";
    }
    if (!checked(r)) continue;
    const auto out = ranks[static_cast<std::size_t>(r)].out();
    for (std::size_t i = 0; i < out.size(); ++i) {
      const symbol w = want(r, i);
      if (!(out[i] == w)) {
        return "rank " + std::to_string(r) + " output " + std::to_string(i) + " holds " +
               describe(out[i]) + ", not " + describe(w);
      }
    }
  }
  return {};
}

bool every_rank(int) { return true; }

std::vector<test::symbolic_rank> rank_buffers(int n) { return std::vector<test::symbolic_rank>(static_cast<std::size_t>(n)); }

std::string check_all_reduce(const rank_schedule& make, int n, std::size_t count, bool in_place,
                             bool self_overlap_ok = false) {
  auto ranks = rank_buffers(n);
  for (int r = 0; r < n; ++r) {
    const auto in = test::contribution(r, count);
    ranks[static_cast<std::size_t>(r)] = in_place ? test::input_in_output(in, count, 0)
                                                  : test::separate_buffers(in, count);
  }
  const auto all = test::all_ranks(n);
  return run_and_compare(
      n, make, ranks, every_rank, [&](int, std::size_t i) { return expected(static_cast<long>(i), all); },
      self_overlap_ok);
}

std::string check_reduce_scatter(const rank_schedule& make, int n, std::size_t block, bool in_place) {
  const auto nn = static_cast<std::size_t>(n);
  auto ranks = rank_buffers(n);
  for (int r = 0; r < n; ++r) {
    const auto in = test::contribution(r, nn * block);
    ranks[static_cast<std::size_t>(r)] =
        in_place ? test::output_in_input(in, block, static_cast<std::size_t>(r) * block)
                 : test::separate_buffers(in, block);
  }
  const auto all = test::all_ranks(n);
  return run_and_compare(n, make, ranks, every_rank, [&](int r, std::size_t i) {
    return expected(static_cast<long>(static_cast<std::size_t>(r) * block + i), all);
  });
}

std::string check_all_gather(const rank_schedule& make, int n, std::size_t block, bool in_place) {
  const auto nn = static_cast<std::size_t>(n);
  auto ranks = rank_buffers(n);
  for (int r = 0; r < n; ++r) {
    const std::size_t at = static_cast<std::size_t>(r) * block;
    const auto in = test::contribution(r, block, static_cast<long>(at));
    ranks[static_cast<std::size_t>(r)] =
        in_place ? test::input_in_output(in, nn * block, at) : test::separate_buffers(in, nn * block);
  }
  return run_and_compare(n, make, ranks, every_rank, [&](int, std::size_t i) {
    return expected(static_cast<long>(i), only(static_cast<int>(i / block)));
  });
}

std::string check_broadcast(const rank_schedule& make, int n, std::size_t count, int root, bool in_place) {
  auto ranks = rank_buffers(n);
  for (int r = 0; r < n; ++r) {
    auto& me = ranks[static_cast<std::size_t>(r)];
    if (r != root) {
      me = test::separate_buffers({}, count, /*has_input=*/false);
      continue;
    }
    const auto in = test::contribution(r, count);
    me = in_place ? test::input_in_output(in, count, 0) : test::separate_buffers(in, count);
  }
  return run_and_compare(n, make, ranks, every_rank,
                         [&](int, std::size_t i) { return expected(static_cast<long>(i), only(root)); });
}

std::string check_reduce(const rank_schedule& make, int n, std::size_t count, int root, bool in_place) {
  auto ranks = rank_buffers(n);
  for (int r = 0; r < n; ++r) {
    const auto in = test::contribution(r, count);
    ranks[static_cast<std::size_t>(r)] =
        r != root  ? test::separate_buffers(in, 0, true, /*has_output=*/false)
        : in_place ? test::input_in_output(in, count, 0)
                   : test::separate_buffers(in, count);
  }
  const auto all = test::all_ranks(n);
  return run_and_compare(n, make, ranks, [&](int r) { return r == root; },
                         [&](int, std::size_t i) { return expected(static_cast<long>(i), all); });
}

std::string check_gather(const rank_schedule& make, int n, std::size_t block, int root, bool in_place) {
  const auto nn = static_cast<std::size_t>(n);
  auto ranks = rank_buffers(n);
  for (int r = 0; r < n; ++r) {
    const std::size_t at = static_cast<std::size_t>(r) * block;
    const auto in = test::contribution(r, block, static_cast<long>(at));
    ranks[static_cast<std::size_t>(r)] =
        r != root  ? test::separate_buffers(in, 0, true, /*has_output=*/false)
        : in_place ? test::input_in_output(in, nn * block, at)
                   : test::separate_buffers(in, nn * block);
  }
  return run_and_compare(n, make, ranks, [&](int r) { return r == root; }, [&](int, std::size_t i) {
    return expected(static_cast<long>(i), only(static_cast<int>(i / block)));
  });
}

std::string check_scatter(const rank_schedule& make, int n, std::size_t block, int root, bool in_place) {
  const auto nn = static_cast<std::size_t>(n);
  auto ranks = rank_buffers(n);
  for (int r = 0; r < n; ++r) {
    auto& me = ranks[static_cast<std::size_t>(r)];
    if (r != root) {
      me = test::separate_buffers({}, block, /*has_input=*/false);
      continue;
    }
    const auto in = test::contribution(r, nn * block);
    me = in_place ? test::output_in_input(in, block, static_cast<std::size_t>(r) * block)
                  : test::separate_buffers(in, block);
  }
  return run_and_compare(n, make, ranks, every_rank, [&](int r, std::size_t i) {
    return expected(static_cast<long>(static_cast<std::size_t>(r) * block + i), only(root));
  });
}

/// all_to_all: element e of block j of rank i's input is numbered (i * n + j) * block + e
/// and must end in rank j's output at block i.
std::string check_all_to_all(const rank_schedule& make, int n, std::size_t block, bool in_place = false) {
  const auto nn = static_cast<std::size_t>(n);
  auto ranks = rank_buffers(n);
  for (int r = 0; r < n; ++r) {
    const auto in = test::contribution(r, nn * block, static_cast<long>(static_cast<std::size_t>(r) * nn * block));
    ranks[static_cast<std::size_t>(r)] =
        in_place ? test::input_in_output(in, nn * block, 0) : test::separate_buffers(in, nn * block);
  }
  return run_and_compare(n, make, ranks, every_rank, [&](int r, std::size_t i) {
    const std::size_t from = i / block;
    return expected(static_cast<long>((from * nn + static_cast<std::size_t>(r)) * block + i % block),
                    only(static_cast<int>(from)));
  });
}

/// all_to_allv with counts[i][j] elements from rank i to rank j. Rank i's input element k
/// is numbered i * 10^6 + k.
std::string check_all_to_allv(int n, const std::vector<std::vector<std::size_t>>& counts) {
  const auto nn = static_cast<std::size_t>(n);
  std::vector<std::vector<std::size_t>> send(nn), recv(nn), send_at(nn, std::vector<std::size_t>(nn + 1, 0)),
      recv_at(nn, std::vector<std::size_t>(nn + 1, 0));
  for (std::size_t i = 0; i < nn; ++i) {
    for (std::size_t j = 0; j < nn; ++j) {
      send[i].push_back(counts[i][j]);
      recv[i].push_back(counts[j][i]);
      send_at[i][j + 1] = send_at[i][j] + counts[i][j];
      recv_at[i][j + 1] = recv_at[i][j] + counts[j][i];
    }
  }
  constexpr long stride = 1'000'000;
  auto ranks = rank_buffers(n);
  for (int r = 0; r < n; ++r) {
    const auto ur = static_cast<std::size_t>(r);
    ranks[ur] = test::separate_buffers(test::contribution(r, send_at[ur][nn], r * stride), recv_at[ur][nn]);
  }
  const rank_schedule make = [&](int r) {
    const auto ur = static_cast<std::size_t>(r);
    return build_schedule(topology::single_node(r, n),
                          {.kind = collective::all_to_allv, .algorithm = algo::direct,
                           .send_counts = send[ur], .recv_counts = recv[ur]});
  };
  return run_and_compare(n, make, ranks, every_rank, [&](int r, std::size_t k) {
    const auto ur = static_cast<std::size_t>(r);
    // The sender is the rank whose block of our output holds position k.
    const auto from = static_cast<std::size_t>(
        std::upper_bound(recv_at[ur].begin(), recv_at[ur].end(), k) - recv_at[ur].begin() - 1);
    const std::size_t within = k - recv_at[ur][from];
    return expected(static_cast<long>(from) * stride + static_cast<long>(send_at[from][ur] + within),
                    only(static_cast<int>(from)));
  });
}

/// A barrier completes, and every rank's completion causally follows every rank's start,
/// through the data: each rank's token starts as its own contribution and must end holding
/// every rank's. (The executor orders steps by the bytes they share and nothing else, so a
/// barrier that synchronised only through the order of its steps would not synchronise.)
std::string check_barrier(const rank_schedule& make, int n) {
  auto ranks = rank_buffers(n);
  std::vector<schedule> scheds;
  for (int r = 0; r < n; ++r) {
    scheds.push_back(make(r));
    auto& me = ranks[static_cast<std::size_t>(r)];
    me = test::separate_buffers({}, 0, false, false);
    me.scratch.assign(scheds.back().scratch_count, test::contributed(r, 0));
  }
  if (auto e = test::run_symbolic(scheds, ranks)) return *e;
  for (int r = 0; r < n; ++r) {
    const auto& me = ranks[static_cast<std::size_t>(r)];
    const test::rank_set got = me.scratch.empty() ? test::rank_set{}.set(static_cast<std::size_t>(r)) : me.scratch[0].from;
    if (got != test::all_ranks(n)) {
      return "rank " + std::to_string(r) + " can leave the barrier before hearing from every rank (" +
             std::to_string(got.count()) + " of " + std::to_string(n) + ")";
    }
  }
  return {};
}

/// The flat algorithms of `kind` (hierarchical needs node layouts: tested on its own).
std::vector<algo> flat_algorithms(collective kind) {
  std::vector<algo> v;
  for (algo a : algorithms_for(kind)) {
    if (a != algo::hierarchical) v.push_back(a);
  }
  return v;
}

}  // namespace

// ---------------------------------------------------------------------------------------
// Correctness, every registered algorithm, through build_schedule.

TEST_CASE("every all_reduce algorithm leaves every rank with every contribution exactly once, n = 1..128, in place and not") {
  for (algo a : flat_algorithms(collective::all_reduce)) {
    for (int n = 1; n <= max_n; ++n) {
      for (std::size_t count : counts_for(n)) {
        for (bool in_place : {false, true}) {
          const std::string_view name = to_string(a);
          CAPTURE(name);
          CAPTURE(n);
          CAPTURE(count);
          CAPTURE(in_place);
          // Recursive doubling swaps the whole buffer: each step sends the output and reduces
          // into it, relying on the send going first (so does the executor).
          const bool swaps = a == algo::recursive_doubling;
          CHECK(check_all_reduce(flat(collective::all_reduce, a, n, count), n, count, in_place, swaps) == "");
        }
      }
    }
  }
}

TEST_CASE("every reduce_scatter algorithm leaves block r fully reduced on rank r, n = 1..128, in place and not") {
  for (algo a : flat_algorithms(collective::reduce_scatter)) {
    for (int n = 1; n <= max_n; ++n) {
      for (std::size_t block : blocks) {
        for (bool in_place : {false, true}) {
          const std::string_view name = to_string(a);
          CAPTURE(name);
          CAPTURE(n);
          CAPTURE(block);
          CAPTURE(in_place);
          CHECK(check_reduce_scatter(flat(collective::reduce_scatter, a, n, block), n, block, in_place) == "");
        }
      }
    }
  }
}

TEST_CASE("every all_gather algorithm delivers every rank's block to every rank in rank order, n = 1..128, in place and not") {
  for (algo a : flat_algorithms(collective::all_gather)) {
    for (int n = 1; n <= max_n; ++n) {
      for (std::size_t block : blocks) {
        for (bool in_place : {false, true}) {
          const std::string_view name = to_string(a);
          CAPTURE(name);
          CAPTURE(n);
          CAPTURE(block);
          CAPTURE(in_place);
          CHECK(check_all_gather(flat(collective::all_gather, a, n, block), n, block, in_place) == "");
        }
      }
    }
  }
}

TEST_CASE("chain and binomial broadcast deliver the root's buffer to every rank, n = 1..128, every root up to n = 16, in place and not") {
  for (algo a : algorithms_for(collective::broadcast)) {
    for (int n = 1; n <= max_n; ++n) {
      for (int root : roots_for(n)) {
        for (std::size_t count : counts_for(n)) {
          for (bool in_place : {false, true}) {
            const std::string_view name = to_string(a);
            CAPTURE(name);
            CAPTURE(n);
            CAPTURE(root);
            CAPTURE(count);
            CAPTURE(in_place);
            CHECK(check_broadcast(flat(collective::broadcast, a, n, count, root), n, count, root, in_place) == "");
          }
        }
      }
    }
  }
}

TEST_CASE("chain and binomial reduce leave every contribution exactly once in the root's output, n = 1..128, every root up to n = 16, in place and not") {
  for (algo a : algorithms_for(collective::reduce)) {
    for (int n = 1; n <= max_n; ++n) {
      for (int root : roots_for(n)) {
        for (std::size_t count : counts_for(n)) {
          for (bool in_place : {false, true}) {
            const std::string_view name = to_string(a);
            CAPTURE(name);
            CAPTURE(n);
            CAPTURE(root);
            CAPTURE(count);
            CAPTURE(in_place);
            CHECK(check_reduce(flat(collective::reduce, a, n, count, root), n, count, root, in_place) == "");
          }
        }
      }
    }
  }
}

TEST_CASE("direct and binomial gather put every rank's block in the root's output in rank order, n = 1..128, every root up to n = 16, in place and not") {
  for (algo a : algorithms_for(collective::gather)) {
    for (int n = 1; n <= max_n; ++n) {
      for (int root : roots_for(n)) {
        for (std::size_t block : blocks) {
          for (bool in_place : {false, true}) {
            const std::string_view name = to_string(a);
            CAPTURE(name);
            CAPTURE(n);
            CAPTURE(root);
            CAPTURE(block);
            CAPTURE(in_place);
            CHECK(check_gather(flat(collective::gather, a, n, block, root), n, block, root, in_place) == "");
          }
        }
      }
    }
  }
}

TEST_CASE("direct and binomial scatter deliver block r of the root's input to rank r, n = 1..128, every root up to n = 16, in place and not") {
  for (algo a : algorithms_for(collective::scatter)) {
    for (int n = 1; n <= max_n; ++n) {
      for (int root : roots_for(n)) {
        for (std::size_t block : blocks) {
          for (bool in_place : {false, true}) {
            const std::string_view name = to_string(a);
            CAPTURE(name);
            CAPTURE(n);
            CAPTURE(root);
            CAPTURE(block);
            CAPTURE(in_place);
            CHECK(check_scatter(flat(collective::scatter, a, n, block, root), n, block, root, in_place) == "");
          }
        }
      }
    }
  }
}

TEST_CASE("direct all_to_all delivers block j of rank i to block i of rank j, n = 1..128") {
  for (int n = 1; n <= max_n; ++n) {
    for (std::size_t block : blocks) {
      CAPTURE(n);
      CAPTURE(block);
      CHECK(check_all_to_all(flat(collective::all_to_all, algo::direct, n, block), n, block) == "");
    }
  }
}

TEST_CASE("direct all_to_all is wrong in place, as its header says, and the checker sees it") {
  CHECK(check_all_to_all(flat(collective::all_to_all, algo::direct, 4, 2), 4, 2, /*in_place=*/true) != "");
}

TEST_CASE("direct all_to_allv delivers exactly each rank's elements for each peer, random counts with zeros, n = 1..128") {
  std::mt19937 rng(7);
  for (int n = 1; n <= max_n; ++n) {
    for (int trial = 0; trial < 3; ++trial) {
      const auto nn = static_cast<std::size_t>(n);
      std::vector<std::vector<std::size_t>> counts(nn, std::vector<std::size_t>(nn));
      for (auto& row : counts) {
        for (auto& c : row) {
          // A third of the pairs exchange nothing; trial 2 is all zeros but the diagonal.
          c = trial == 2 || rng() % 3 == 0 ? 0 : rng() % 5;
        }
      }
      if (trial == 2) {
        for (std::size_t i = 0; i < nn; ++i) counts[i][i] = 2;
      }
      CAPTURE(n);
      CAPTURE(trial);
      CHECK(check_all_to_allv(n, counts) == "");
    }
  }
}

TEST_CASE("dissemination barrier completes, and no rank completes before hearing from every rank, n = 1..128") {
  for (int n = 1; n <= max_n; ++n) {
    CAPTURE(n);
    CHECK(check_barrier(flat(collective::barrier, algo::dissemination, n, 0), n) == "");
  }
}

TEST_CASE("send_recv moves the sender's message to the receiver's output") {
  for (const auto& pair : {std::pair{0, 1}, {3, 1}, {2, 4}}) {
    // Named copies: clang 14 cannot capture structured bindings.
    const int from = pair.first;
    const int to = pair.second;
    const int n = 5;
    const std::size_t count = 7;
    auto ranks = rank_buffers(n);
    for (int r = 0; r < n; ++r) ranks[static_cast<std::size_t>(r)] = test::separate_buffers(test::contribution(r, count), count);
    const rank_schedule make = [&](int r) {
      if (r != from && r != to) return new_schedule(collective::send_recv, algo::direct, r, n);
      return build_schedule(topology::single_node(r, n),
                            {.kind = collective::send_recv, .algorithm = algo::direct, .count = count,
                             .root = r == from ? to : from, .sending = r == from});
    };
    CAPTURE(from);
    CAPTURE(to);
    CHECK(run_and_compare(n, make, ranks, [&](int r) { return r == to; },
                          [&](int, std::size_t i) { return expected(static_cast<long>(i), only(from)); }) == "");
  }
}

// ---------------------------------------------------------------------------------------
// The checker itself.

TEST_CASE("the symbolic checker rejects a schedule that counts a contribution twice") {
  // A broken ring: the all-gather phase reduces instead of storing.
  auto broken = [](int r) {
    schedule s = ring_all_reduce(r, 4, 8);
    for (auto& st : s.steps) {
      if (st.action == recv_action::store) {
        st.action = recv_action::reduce;
        st.reduce_with = st.recv_into;
      }
    }
    return s;
  };
  CHECK(check_all_reduce(broken, 4, 8, false) != "");
}

TEST_CASE("the symbolic checker reports a deadlock when a rank waits for a message never sent") {
  auto broken = [](int r) {
    schedule s = ring_all_reduce(r, 3, 6);
    if (r == 0) s.steps.pop_back();  // rank 0 skips its last step: rank 1 waits forever
    return s;
  };
  CHECK(check_all_reduce(broken, 3, 6, false).starts_with("deadlock"));
}

TEST_CASE("the symbolic checker rejects a non-root rank that names the input broadcast does not give it") {
  auto broken = [](int r) {
    schedule s = chain_broadcast(r, 4, 5, 0);
    for (auto& st : s.steps) {
      if (st.send_peer >= 0 && r != 0) st.send_from.buffer = buffer_id::input;  // forwards "its" input
    }
    return s;
  };
  const std::string e = check_broadcast(broken, 4, 5, 0, false);
  CHECK(e.find("does not have") != std::string::npos);
}

TEST_CASE("the symbolic checker notices a step that receives into the memory it sends from") {
  // Recursive doubling's exchanges do, on purpose; the check must see it.
  CHECK(check_all_reduce(flat(collective::all_reduce, algo::recursive_doubling, 4, 4), 4, 4, false).find("receives into what it sends") !=
        std::string::npos);
}

TEST_CASE("the symbolic checker rejects a barrier whose ranks leave after hearing from one neighbour") {
  auto broken = [](int r) {
    schedule s = dissemination_barrier(r, 8);
    s.steps.resize(1);
    return s;
  };
  CHECK(check_barrier(broken, 8) != "");
}

// ---------------------------------------------------------------------------------------
// Hierarchical: node layouts.

namespace {

/// Node layouts to check: every K x M with K * M <= 64, hand-picked uneven ones, and two
/// random splits of every n in 2..64 (fixed seed).
std::vector<std::vector<int>> node_layouts() {
  std::vector<std::vector<int>> layouts;
  for (int k = 1; k <= max_layout_ranks; ++k) {
    for (int m = 1; k * m <= max_layout_ranks; ++m) layouts.emplace_back(static_cast<std::size_t>(k), m);
  }
  for (auto l : {std::vector<int>{1, 2, 3}, {3, 2, 1}, {2, 1}, {1, 4}, {5, 3, 2, 7}, {8, 1, 8}}) {
    layouts.push_back(l);
  }
  std::mt19937 rng(42);
  for (int n = 2; n <= max_layout_ranks; ++n) {
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

std::string describe_layout(const std::vector<int>& sizes) {
  std::string layout;
  for (int m : sizes) layout += std::to_string(m) + " ";
  return layout;
}

}  // namespace

TEST_CASE("hierarchical all_reduce leaves every rank with every contribution exactly once, even and uneven nodes up to 64 ranks, in place and not") {
  std::size_t checked = 0;
  for (const auto& sizes : node_layouts()) {
    int n = 0;
    for (int m : sizes) n += m;
    for (std::size_t count : counts_for(n)) {
      const rank_schedule make = [&](int r) { return hierarchical_all_reduce(topology::from_sizes(r, sizes), count); };
      for (bool in_place : {false, true}) {
        const std::string layout = describe_layout(sizes);
        CAPTURE(layout);
        CAPTURE(count);
        CAPTURE(in_place);
        CHECK(check_all_reduce(make, n, count, in_place) == "");
      }
      ++checked;
    }
  }
  CHECK(checked > 300);
}

TEST_CASE("hierarchical reduce_scatter and all_gather are exact for even and uneven nodes up to 64 ranks, in place and not") {
  std::size_t checked = 0;
  for (const auto& sizes : node_layouts()) {
    int n = 0;
    for (int m : sizes) n += m;
    for (std::size_t block : blocks) {
      const rank_schedule rs = [&](int r) { return hierarchical_reduce_scatter(topology::from_sizes(r, sizes), block); };
      const rank_schedule ag = [&](int r) { return hierarchical_all_gather(topology::from_sizes(r, sizes), block); };
      for (bool in_place : {false, true}) {
        const std::string layout = describe_layout(sizes);
        CAPTURE(layout);
        CAPTURE(block);
        CAPTURE(in_place);
        CHECK(check_reduce_scatter(rs, n, block, in_place) == "");
        CHECK(check_all_gather(ag, n, block, in_place) == "");
      }
      ++checked;
    }
  }
  CHECK(checked > 300);
}

// ---------------------------------------------------------------------------------------
// Costs, as each header states them.

namespace {

struct cost {
  int steps = 0;          // steps that send or receive (local copies excluded)
  int copies = 0;         // local copy steps
  std::size_t sent = 0;   // elements sent
  std::size_t received = 0;
};

cost cost_of(const schedule& s) {
  cost c;
  for (const step& st : s.steps) {
    if (st.action == recv_action::copy) {
      ++c.copies;
      continue;
    }
    ++c.steps;
    if (st.send_peer >= 0) c.sent += st.send_from.count;
    if (st.recv_peer >= 0) c.received += st.recv_into.count;
  }
  return c;
}

int log2_ceil(int n) { return n <= 1 ? 0 : static_cast<int>(std::bit_width(static_cast<unsigned>(n - 1))); }
int log2_floor(int n) { return static_cast<int>(std::bit_width(static_cast<unsigned>(n))) - 1; }

}  // namespace

TEST_CASE("ring all_reduce sends 2(P-1)/P of the buffer per rank, as its header says") {
  for (int n = 2; n <= 16; ++n) {
    const std::size_t count = static_cast<std::size_t>(n) * 10;
    const cost c = cost_of(ring_all_reduce(0, n, count));
    CHECK(c.sent == 2 * static_cast<std::size_t>(n - 1) * 10);
    CHECK(c.steps == 2 * (n - 1));
  }
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

TEST_CASE("recursive doubling all_reduce sends log2(p) buffers in log2(p) steps, and all_gather (p-1)/p of the buffer") {
  for (int n = 2; n <= 64; ++n) {
    const int p = static_cast<int>(std::bit_floor(static_cast<unsigned>(n)));
    const std::size_t count = 12;
    const detail::power_of_two_fold fold(n);
    for (int r = 0; r < n; ++r) {
      CAPTURE(n);
      CAPTURE(r);
      const cost ar = cost_of(recursive_doubling_all_reduce(r, n, count));
      const cost ag = cost_of(recursive_doubling_all_gather(r, n, count));
      if (fold.sits_out(r)) {
        CHECK(ar.steps == 2);
        CHECK(ar.sent == count);
        CHECK(ag.steps == 2);
        CHECK(ag.sent == count);
      } else {
        const int extra = fold.paired(r) ? 2 : 0;
        CHECK(ar.steps == log2_floor(p) + extra);
        CHECK(ar.sent == static_cast<std::size_t>(log2_floor(p) + extra / 2) * count);
        CHECK(ag.steps == log2_floor(p) + extra);
        if (n == p) CHECK(ag.sent == static_cast<std::size_t>(n - 1) * count);
      }
    }
  }
}

TEST_CASE("tree all_reduce: two trees over every rank, interior in at most one, at most 2S sent in at most 8 steps, depth floor(log2(m-1))+1") {
  for (int n = 2; n <= 128; ++n) {
    CAPTURE(n);
    const int m = n % 2 == 0 ? n : n - 1;
    const int depth_bound = m == 2 ? 1 : log2_floor(m - 1) + 1;
    std::vector<int> interior(static_cast<std::size_t>(n), 0);
    for (int t = 0; t < 2; ++t) {
      CAPTURE(t);
      std::vector<detail::tree_links> links;
      for (int r = 0; r < n; ++r) links.push_back(detail::double_tree(r, n, t));
      int roots = 0;
      for (int r = 0; r < n; ++r) {
        const auto& l = links[static_cast<std::size_t>(r)];
        if (l.parent < 0) ++roots;
        bool has_child = false;
        for (int c : l.children) {
          if (c < 0) continue;
          has_child = true;
          CHECK(links[static_cast<std::size_t>(c)].parent == r);  // links agree both ways
        }
        if (l.parent >= 0) {
          const auto& up = links[static_cast<std::size_t>(l.parent)].children;
          CHECK((up[0] == r || up[1] == r));
        }
        interior[static_cast<std::size_t>(r)] += has_child ? 1 : 0;
        // Every rank reaches the root within the depth bound (so the tree spans every rank).
        int hops = 0;
        for (int x = r; links[static_cast<std::size_t>(x)].parent >= 0 && hops <= n; ++hops) {
          x = links[static_cast<std::size_t>(x)].parent;
        }
        CHECK(hops <= depth_bound);
      }
      CHECK(roots == 1);
    }
    for (int r = 0; r < n; ++r) CHECK(interior[static_cast<std::size_t>(r)] <= 1);
    for (std::size_t count : {std::size_t{1000}, std::size_t{1001}}) {
      std::size_t total = 0;
      for (int r = 0; r < n; ++r) {
        const cost c = cost_of(tree_all_reduce(r, n, count));
        CHECK(c.steps <= 8);
        CHECK(c.sent <= 2 * count + 1);
        total += c.sent;
      }
      // In each tree every rank but the root sends the half up once, and receives it once.
      CHECK(total == 2 * static_cast<std::size_t>(n - 1) * count);
    }
  }
}

TEST_CASE("halving_doubling all_reduce sends 2(p-1)/p * S in 2 log2(p) steps, reduce_scatter (p-1)/p * S in log2(p)") {
  for (int n = 2; n <= 128; ++n) {
    const detail::power_of_two_fold fold(n);
    const int p = fold.p;
    const std::size_t count = static_cast<std::size_t>(p) * 10;  // equal chunks
    const std::size_t block = 4;
    for (int r = 0; r < n; ++r) {
      CAPTURE(n);
      CAPTURE(r);
      const cost ar = cost_of(halving_doubling_all_reduce(r, n, count));
      const cost rs = cost_of(halving_doubling_reduce_scatter(r, n, block));
      if (fold.sits_out(r)) {
        CHECK(ar.steps == 2);
        CHECK(ar.sent == count);
        CHECK(rs.steps == 2);
        CHECK(rs.sent == static_cast<std::size_t>(n) * block);
        continue;
      }
      const bool paired = fold.paired(r);
      CHECK(ar.steps == 2 * log2_floor(p) + (paired ? 2 : 0));
      CHECK(ar.sent == 2 * static_cast<std::size_t>(p - 1) * 10 + (paired ? count : 0));
      CHECK(rs.steps == log2_floor(p) + (paired ? 2 : 0));
      if (n == p) CHECK(rs.sent == static_cast<std::size_t>(n - 1) * block);
    }
  }
}

TEST_CASE("bruck all_gather takes ceil(log2 P) steps and sends (P-1)/P of the buffer for every P") {
  for (int n = 1; n <= 128; ++n) {
    for (int r = 0; r < n; r += std::max(1, n / 5)) {
      CAPTURE(n);
      CAPTURE(r);
      const cost c = cost_of(bruck_all_gather(r, n, 3));
      CHECK(c.steps == log2_ceil(n));
      CHECK(c.sent == static_cast<std::size_t>(n - 1) * 3);
      CHECK(c.copies <= 3);
    }
  }
}

TEST_CASE("chain broadcast and reduce: at most 2 steps and S bytes sent per rank") {
  for (int n = 1; n <= 32; ++n) {
    for (int root : roots_for(n)) {
      for (int r = 0; r < n; ++r) {
        CAPTURE(n);
        CAPTURE(root);
        CAPTURE(r);
        const cost b = cost_of(chain_broadcast(r, n, 9, root));
        const cost d = cost_of(chain_reduce(r, n, 9, root));
        CHECK(b.steps + b.copies <= 2);
        CHECK(d.steps + d.copies <= 2);
        CHECK(b.sent == (r == wrap(root - 1, n) ? 0u : 9u));
        CHECK(d.sent == (r == root ? 0u : 9u));
      }
    }
  }
}

TEST_CASE("binomial trees: the root sends or receives ceil(log2 P) times, every rank once in the other direction") {
  for (int n = 1; n <= 128; ++n) {
    for (int root : {0, n / 3, n - 1}) {
      std::size_t bcast_total = 0, gathered = 0;
      for (int r = 0; r < n; ++r) {
        CAPTURE(n);
        CAPTURE(root);
        CAPTURE(r);
        const cost b = cost_of(binomial_broadcast(r, n, 9, root));
        const cost d = cost_of(binomial_reduce(r, n, 9, root));
        const cost g = cost_of(binomial_gather(r, n, 2, root));
        const cost s = cost_of(binomial_scatter(r, n, 2, root));
        bcast_total += b.sent;
        if (r == root) {
          CHECK(b.steps == log2_ceil(n));
          CHECK(b.sent == static_cast<std::size_t>(log2_ceil(n)) * 9);
          CHECK(d.steps == log2_ceil(n));
          CHECK(g.steps <= log2_ceil(n) + 1);  // +1 where a subtree wraps
          CHECK(s.steps <= log2_ceil(n) + 1);
          CHECK(g.received == static_cast<std::size_t>(n - 1) * 2);
          CHECK(s.sent == static_cast<std::size_t>(n - 1) * 2);
          gathered = g.received;
        } else {
          CHECK(b.received == 9);
          CHECK(d.sent == 9);
          const int v = wrap(r - root, n);
          CHECK(g.sent == static_cast<std::size_t>(detail::binomial_span(v, n)) * 2);
          CHECK(s.received == static_cast<std::size_t>(detail::binomial_span(v, n)) * 2);
        }
      }
      CHECK(bcast_total == static_cast<std::size_t>(n - 1) * 9);
      CHECK(gathered == static_cast<std::size_t>(n - 1) * 2);
    }
  }
}

TEST_CASE("direct all_to_all, gather and scatter: P-1 steps, no byte sent twice") {
  for (int n = 1; n <= 64; ++n) {
    const cost a = cost_of(direct_all_to_all(n / 2, n, 3));
    CHECK(a.steps == n - 1);
    CHECK(a.sent == static_cast<std::size_t>(n - 1) * 3);
    const cost g = cost_of(direct_gather(0, n, 3, 0));
    const cost s = cost_of(direct_scatter(n - 1, n, 3, n - 1));
    CHECK(g.steps == n - 1);
    CHECK(g.received == static_cast<std::size_t>(n - 1) * 3);
    CHECK(s.steps == n - 1);
    CHECK(s.sent == static_cast<std::size_t>(n - 1) * 3);
    if (n > 1) CHECK(cost_of(direct_gather(1, n, 3, 0)).sent == 3);
  }
}

TEST_CASE("direct all_reduce sends 2(P-1)/P of the buffer in 2(P-1) messages, reduce_scatter and all_gather (P-1)/P in P-1, each chunk to its owner only") {
  for (int n = 1; n <= 64; ++n) {
    const auto un = static_cast<std::size_t>(n);
    const std::size_t count = un * 10;
    for (int r : {0, n / 2, n - 1}) {
      const schedule ar = direct_all_reduce(r, n, count);
      const cost c = cost_of(ar);
      CHECK(c.sent == 2 * (un - 1) * 10);
      CHECK(c.received == 2 * (un - 1) * 10);
      CHECK(cost_of(direct_reduce_scatter(r, n, 10)).sent == (un - 1) * 10);
      CHECK(cost_of(direct_all_gather(r, n, 10)).sent == (un - 1) * 10);
      // Phase 1 sends chunk q to rank q and nobody else; each peer gets one message a phase.
      std::vector<int> messages(un, 0);
      for (const step& st : ar.steps) {
        if (st.send_peer < 0) continue;
        ++messages[static_cast<std::size_t>(st.send_peer)];
        if (st.send_from.buffer == buffer_id::input) {
          CHECK(st.send_from == chunk_of(buffer_id::input, count, n, st.send_peer));
        }
      }
      for (int q = 0; q < n; ++q) CHECK(messages[static_cast<std::size_t>(q)] == (q == r ? 0 : 2));
    }
  }
}

TEST_CASE("dissemination barrier takes ceil(log2 P) steps of one-element tokens") {
  for (int n = 1; n <= 128; ++n) {
    const cost c = cost_of(dissemination_barrier(n - 1, n));
    CHECK(c.steps == log2_ceil(n));
    CHECK(c.sent == static_cast<std::size_t>(log2_ceil(n)));
  }
}

// ---------------------------------------------------------------------------------------
// The dispatcher and the listing.

TEST_CASE("algorithms_for lists every algorithm of every collective, and build_schedule builds each") {
  const std::vector<std::pair<collective, std::vector<algo>>> want{
      {collective::all_reduce, {algo::ring, algo::recursive_doubling, algo::hierarchical, algo::tree, algo::halving_doubling, algo::direct}},
      {collective::reduce_scatter, {algo::ring, algo::hierarchical, algo::halving_doubling, algo::direct}},
      {collective::all_gather, {algo::ring, algo::hierarchical, algo::recursive_doubling, algo::bruck, algo::direct}},
      {collective::broadcast, {algo::chain, algo::binomial}},
      {collective::reduce, {algo::chain, algo::binomial}},
      {collective::all_to_all, {algo::direct}},
      {collective::all_to_allv, {algo::direct}},
      {collective::gather, {algo::direct, algo::binomial}},
      {collective::scatter, {algo::direct, algo::binomial}},
      {collective::barrier, {algo::dissemination}},
      {collective::send_recv, {algo::direct}},
  };
  CHECK(want.size() == static_cast<std::size_t>(collective_count));
  const std::vector<std::size_t> counts(4, 1);
  for (const auto& [kind, algos] : want) {
    const auto listed = algorithms_for(kind);
    CHECK(std::set<algo>(listed.begin(), listed.end()) == std::set<algo>(algos.begin(), algos.end()));
    for (algo a : algos) {
      const schedule s = build_schedule(topology::from_sizes(1, {2, 2}),
                                        {.kind = kind, .algorithm = a, .count = 5, .root = 2,
                                         .send_counts = counts, .recv_counts = counts});
      CHECK(s.kind == kind);
      CHECK(s.algorithm == a);
      CHECK(s.root == (rooted(kind) || kind == collective::send_recv ? 2 : -1));
    }
  }
}

TEST_CASE("build_schedule refuses an algorithm that does not implement the collective, a root that is not a rank, and all_to_allv counts of the wrong size") {
  const topology t = topology::single_node(0, 4);
  auto refuses = [&](const schedule_args& a) {
    try {
      build_schedule(t, a);
    } catch (const error& e) {
      return e.code() == errc::invalid_argument;
    }
    return false;
  };
  CHECK(refuses({.kind = collective::broadcast, .algorithm = algo::ring, .count = 1, .root = 0}));
  CHECK(refuses({.kind = collective::barrier, .algorithm = algo::automatic}));
  CHECK(refuses({.kind = collective::reduce, .algorithm = algo::binomial, .count = 1, .root = 4}));
  CHECK(refuses({.kind = collective::gather, .algorithm = algo::direct, .count = 1, .root = -1}));
  const std::vector<std::size_t> three(3, 1);
  CHECK(refuses({.kind = collective::all_to_allv, .algorithm = algo::direct, .send_counts = three, .recv_counts = three}));
}

TEST_CASE("to_string lists a schedule one step per line") {
  CHECK(to_string(ring_all_reduce(0, 2, 4)) ==
        "all_reduce ring, rank 0 of 2\n"
        "  0  send in[0,2) to 1; reduce out[2,4) = in[2,4) + from 1\n"
        "  1  send out[2,4) to 1; recv out[0,2) from 1\n");
  CHECK(to_string(binomial_reduce(1, 4, 3, 0)) ==
        "reduce binomial, rank 1 of 4, root 0\n"
        "  0  send in[0,3) to 0\n");
  CHECK(to_string(dissemination_barrier(0, 2)) ==
        "barrier dissemination, rank 0 of 2, scratch 1\n"
        "  0  send scratch[0,1) to 1; reduce scratch[0,1) = scratch[0,1) + from 1\n");
}

namespace {

/// Every rank's schedule of (kind, a) for the golden cases: n = 5 (nodes of 2 and 3 for
/// hierarchical) and n = 4 (2 x 2), count 11 for whole-buffer collectives and block 3 for
/// block-wise ones, root 2; all_to_allv sends (i + 2j) mod 4 elements from i to j;
/// send_recv, rank 1 to rank 3.
std::string golden_listing(collective kind, algo a) {
  std::string text;
  for (int n : {5, 4}) {
    const bool whole = kind == collective::all_reduce || kind == collective::broadcast ||
                       kind == collective::reduce || kind == collective::send_recv;
    const std::size_t count = whole ? 11 : kind == collective::barrier || kind == collective::all_to_allv ? 0 : 3;
    const std::vector<int> sizes = n == 5 ? std::vector<int>{2, 3} : std::vector<int>{2, 2};
    text += "# " + std::string(to_string(kind)) + " " + std::string(to_string(a)) + ", n = " +
            std::to_string(n) + (a == algo::hierarchical ? " (nodes " + describe_layout(sizes) + ")" : "") +
            (kind == collective::all_to_allv ? ", (i + 2j) mod 4 elements from i to j" : ", count " + std::to_string(count)) +
            (rooted(kind) ? ", root 2" : "") + (kind == collective::send_recv ? ", rank 1 to rank 3" : "") + "\n";
    for (int r = 0; r < n; ++r) {
      if (kind == collective::send_recv && r != 1 && r != 3) continue;
      std::vector<std::size_t> send, recv;
      for (int j = 0; j < n; ++j) {
        send.push_back(static_cast<std::size_t>((r + 2 * j) % 4));
        recv.push_back(static_cast<std::size_t>((j + 2 * r) % 4));
      }
      const topology t = a == algo::hierarchical ? topology::from_sizes(r, sizes) : topology::single_node(r, n);
      text += to_string(build_schedule(t, {.kind = kind, .algorithm = a, .count = count,
                                           .root = kind == collective::send_recv ? 4 - r : rooted(kind) ? 2 : -1,
                                           .send_counts = send, .recv_counts = recv,
                                           .sending = r == 1}));
    }
    text += "\n";
  }
  return text;
}

}  // namespace

TEST_CASE("every algorithm's schedules match their golden listings (CHORUS_UPDATE_GOLDEN=1 rewrites them)") {
  const char* update = std::getenv("CHORUS_UPDATE_GOLDEN");
  const bool rewrite = update != nullptr && std::string(update) == "1";
  for (int k = 0; k < collective_count; ++k) {
    const auto kind = static_cast<collective>(k);
    for (algo a : algorithms_for(kind)) {
      const std::string path = std::string(CHORUS_GOLDEN_DIR) + "/" + std::string(to_string(kind)) + "_" +
                               std::string(to_string(a)) + ".txt";
      const std::string listing = golden_listing(kind, a);
      CAPTURE(path);
      if (rewrite) {
        std::ofstream(path, std::ios::binary) << listing;
        continue;
      }
      std::ifstream file(path, std::ios::binary);
      REQUIRE_MESSAGE(file.good(), "no golden file: run with CHORUS_UPDATE_GOLDEN=1 and review it");
      std::stringstream stored;
      stored << file.rdbuf();
      CHECK(stored.str() == listing);
    }
  }
}
