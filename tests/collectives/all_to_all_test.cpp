// SPDX-License-Identifier: Apache-2.0
// all_to_all and all_to_allv over real ranks: every algorithm and dtype, random counts with
// zeros, unaligned buffers, many slices, async.
#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "collectives/checks.hpp"
#include "collectives/values.hpp"
#include "support/multirank.hpp"

using namespace chorus;
using chorus::test::run_ranks;
using namespace chorus::test;

TEST_CASE("every all_to_all algorithm delivers block j of rank i's input to block i of rank j's output, for every dtype, 1 to 8 ranks") {
  for (int n : test::all_world_sizes) {
    CAPTURE(n);
    run_ranks(n, [](communicator& comm) {
      const auto nn = static_cast<std::size_t>(comm.size());
      std::uint64_t seed = 6000;
      for (algo a : algorithms_for(collective::all_to_all)) {
        for (dtype t : test::all_dtypes) {
          test::with_dtype(t, [&]<class T>() {
            for (std::size_t block : {std::size_t{0}, std::size_t{1}, nn - 1, nn + 1, std::size_t{257}}) {
              check_all_to_all<T>(comm, a, block, test::mix(seed) % 8, seed);
              ++seed;
            }
          });
        }
      }
    }, {.deadline = std::chrono::seconds(240)});
  }
}

TEST_CASE("every all_to_allv algorithm delivers random counts with zeros that every rank derives from one seed, 1 to 8 ranks") {
  for (int n : test::all_world_sizes) {
    CAPTURE(n);
    run_ranks(n, [](communicator& comm) {
      std::uint64_t seed = 7000;
      for (algo a : algorithms_for(collective::all_to_allv)) {
        for (dtype t : test::all_dtypes) {
          test::with_dtype(t, [&]<class T>() {
            // most = 0: every count is zero; 1: zeros and ones; then larger random counts.
            for (std::size_t most : {std::size_t{0}, std::size_t{1}, std::size_t{17}, std::size_t{600}}) {
              for (int k = 0; k < 2; ++k) {
                check_all_to_allv<T>(comm, a, most, test::mix(seed) % 8, seed);
                ++seed;
              }
            }
          });
        }
      }
    }, {.deadline = std::chrono::seconds(240)});
  }
}

TEST_CASE("all_to_all and all_to_allv of many slices are exact") {
  for (int n : {3, 4}) {
    CAPTURE(n);
    run_ranks(n, [](communicator& comm) {
      for (algo a : algorithms_for(collective::all_to_all)) {
        // 5 MiB per pair at the default slice size: several slices for every block.
        check_all_to_all<float>(comm, a, (5u << 18) + 1, 1, 8000);
      }
      for (algo a : algorithms_for(collective::all_to_allv)) {
        check_all_to_allv<double>(comm, a, 1u << 19, 3, 8001);
      }
    });
  }
  run_ranks(5, [](communicator& comm) {
    for (std::uint64_t seed = 8100; seed < 8104; ++seed) {
      for (algo a : algorithms_for(collective::all_to_all)) {
        check_all_to_all<std::int32_t>(comm, a, test::mix(seed) % 5000, seed % 8, seed);
      }
      for (algo a : algorithms_for(collective::all_to_allv)) {
        check_all_to_allv<half>(comm, a, 9000, seed % 8, seed);
      }
    }
  }, {.env = {{"CHORUS_SLICE_BYTES", "4096"}, {"CHORUS_SLICES_IN_FLIGHT", "2"}}});
}

TEST_CASE("the typed all_to_all(v) calls exchange between every pair, and their async forms complete in issue order") {
  for (int n : {2, 5}) {
    CAPTURE(n);
    run_ranks(n, [](communicator& comm) {
      const int r = comm.rank();
      const int nn = comm.size();
      const auto un = static_cast<std::size_t>(nn);
      // Block j holds 100 * r + j: rank j gets it.
      std::vector<std::int32_t> in(4 * un), out(4 * un, -1);
      for (std::size_t i = 0; i < in.size(); ++i) in[i] = 100 * r + static_cast<std::int32_t>(i / 4);
      comm.all_to_all(std::span<const std::int32_t>(in), std::span(out));
      bool ok = true;
      for (std::size_t i = 0; i < out.size(); ++i) ok = ok && out[i] == 100 * static_cast<std::int32_t>(i / 4) + r;
      RANK_CHECK(ok);
      // all_to_allv: rank r sends (r + j) % 3 elements to rank j.
      std::vector<std::size_t> sc(un), rc(un);
      for (int p = 0; p < nn; ++p) {
        sc[static_cast<std::size_t>(p)] = static_cast<std::size_t>((r + p) % 3);
        rc[static_cast<std::size_t>(p)] = static_cast<std::size_t>((p + r) % 3);
      }
      std::vector<float> vin, vout;
      for (int p = 0; p < nn; ++p) {
        for (std::size_t i = 0; i < sc[static_cast<std::size_t>(p)]; ++i) vin.push_back(static_cast<float>(r * 10 + p));
      }
      std::size_t total = 0;
      for (std::size_t c : rc) total += c;
      vout.assign(total, -1.0f);
      // Async: several in flight, then one blocking call after them.
      std::vector<std::vector<std::int32_t>> outs(3, std::vector<std::int32_t>(4 * un, -1));
      std::vector<request> reqs;
      for (auto& o : outs) reqs.push_back(comm.all_to_all_async(std::span<const std::int32_t>(in), std::span(o)));
      auto v = comm.all_to_allv_async(std::span<const float>(vin), std::span<const std::size_t>(sc), std::span(vout),
                                      std::span<const std::size_t>(rc));
      std::vector<int> last{1};
      comm.all_reduce(std::span(last));
      RANK_CHECK(last[0] == nn);
      for (auto& q : reqs) RANK_CHECK(q.test());  // issued before the all_reduce, so done by now
      v.wait();
      for (const auto& o : outs) RANK_CHECK(o == out);
      std::size_t at = 0;
      bool vok = true;
      for (int p = 0; p < nn; ++p) {
        for (std::size_t i = 0; i < rc[static_cast<std::size_t>(p)]; ++i) vok = vok && vout[at++] == static_cast<float>(p * 10 + r);
      }
      RANK_CHECK(vok);
    });
  }
}

TEST_CASE("the tuner's automatic choice of all_to_all(v) algorithm agrees across ranks at every size") {
  run_ranks(4, [](communicator& comm) {
    std::uint64_t seed = 8200;
    for (std::size_t block : {std::size_t{1}, std::size_t{300}, std::size_t{40000}, std::size_t{300001}}) {
      check_all_to_all<float>(comm, algo::automatic, block, seed % 8, seed);
      ++seed;
      check_all_to_allv<std::int32_t>(comm, algo::automatic, block, seed % 8, seed);
      ++seed;
    }
  });
}
