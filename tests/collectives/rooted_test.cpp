// SPDX-License-Identifier: Apache-2.0
// broadcast, reduce, gather and scatter over real ranks: every algorithm, root, dtype and op,
// in place and out of place, unaligned buffers, many slices, async.
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

TEST_CASE("every broadcast algorithm gives every rank the root's data, for every root and dtype, 1 to 8 ranks") {
  for (int n : test::all_world_sizes) {
    CAPTURE(n);
    run_ranks(n, [](communicator& comm) {
      const auto nn = static_cast<std::size_t>(comm.size());
      std::uint64_t seed = 1000;
      for (int root : roots_of(comm.size())) {
        for (algo a : algorithms_for(collective::broadcast)) {
          for (dtype t : test::all_dtypes) {
            test::with_dtype(t, [&]<class T>() {
              for (std::size_t count : {std::size_t{0}, std::size_t{1}, nn - 1, std::size_t{1009}}) {
                check_broadcast<T>(comm, a, count, root, misalign_for(seed), in_place_for(seed), seed);
                ++seed;
              }
            });
          }
        }
      }
    }, {.deadline = std::chrono::seconds(240)});
  }
}

TEST_CASE("every reduce algorithm leaves the exact reduction on the root and the others' data as it was, for every root, dtype and op") {
  for (int n : test::all_world_sizes) {
    CAPTURE(n);
    run_ranks(n, [](communicator& comm) {
      const auto nn = static_cast<std::size_t>(comm.size());
      std::uint64_t seed = 2000;
      for (int root : roots_of(comm.size())) {
        for (algo a : algorithms_for(collective::reduce)) {
          for (dtype t : test::all_dtypes) {
            for (reduce_op op : test::all_ops) {
              if (op == avg && !is_floating(t)) continue;
              test::with_dtype(t, [&]<class T>() {
                for (std::size_t count : {std::size_t{0}, std::size_t{1}, nn - 1, std::size_t{523}}) {
                  check_reduce<T>(comm, op, a, count, root, misalign_for(seed), in_place_for(seed), seed);
                  ++seed;
                }
              });
            }
          }
        }
      }
    }, {.deadline = std::chrono::seconds(240)});
  }
}

TEST_CASE("every gather algorithm collects every rank's block on the root in rank order, for every root and dtype") {
  for (int n : test::all_world_sizes) {
    CAPTURE(n);
    run_ranks(n, [](communicator& comm) {
      const auto nn = static_cast<std::size_t>(comm.size());
      std::uint64_t seed = 3000;
      for (int root : roots_of(comm.size())) {
        for (algo a : algorithms_for(collective::gather)) {
          for (dtype t : test::all_dtypes) {
            test::with_dtype(t, [&]<class T>() {
              for (std::size_t block : {std::size_t{0}, std::size_t{1}, nn + 1, std::size_t{257}}) {
                check_gather<T>(comm, a, block, root, misalign_for(seed), in_place_for(seed), seed);
                ++seed;
              }
            });
          }
        }
      }
    }, {.deadline = std::chrono::seconds(240)});
  }
}

TEST_CASE("every scatter algorithm hands rank r block r of the root's data, for every root and dtype") {
  for (int n : test::all_world_sizes) {
    CAPTURE(n);
    run_ranks(n, [](communicator& comm) {
      const auto nn = static_cast<std::size_t>(comm.size());
      std::uint64_t seed = 4000;
      for (int root : roots_of(comm.size())) {
        for (algo a : algorithms_for(collective::scatter)) {
          for (dtype t : test::all_dtypes) {
            test::with_dtype(t, [&]<class T>() {
              for (std::size_t block : {std::size_t{0}, std::size_t{1}, nn + 1, std::size_t{257}}) {
                check_scatter<T>(comm, a, block, root, misalign_for(seed), in_place_for(seed), seed);
                ++seed;
              }
            });
          }
        }
      }
    }, {.deadline = std::chrono::seconds(240)});
  }
}

TEST_CASE("rooted collectives of a few MiB at the default slice size are exact for every algorithm") {
  for (int n : {3, 4}) {
    CAPTURE(n);
    run_ranks(n, [](communicator& comm) {
      const int last = comm.size() - 1;
      std::uint64_t seed = 5000;
      const std::size_t count = (5u << 18) + 3;  // 5 MiB of float: two default slices and a tail
      for (algo a : algorithms_for(collective::broadcast)) {
        check_broadcast<float>(comm, a, count, last, 1, false, seed++);
        check_broadcast<double>(comm, a, count / 2, 1, 0, true, seed++);
      }
      for (algo a : algorithms_for(collective::reduce)) {
        check_reduce<float>(comm, sum, a, count, 0, 2, false, seed++);
        check_reduce<bfloat16>(comm, avg, a, count, last, 0, true, seed++);
      }
      for (algo a : algorithms_for(collective::gather)) {
        check_gather<float>(comm, a, count / 4, last, 3, seed % 2 == 0, seed);
        ++seed;
      }
      for (algo a : algorithms_for(collective::scatter)) {
        check_scatter<float>(comm, a, count / 4, 1, 0, seed % 2 == 0, seed);
        ++seed;
      }
    });
  }
}

TEST_CASE("rooted collectives with 4 KiB slices pipeline many slices, for every algorithm") {
  for (int n : {5, 8}) {
    CAPTURE(n);
    run_ranks(n, [](communicator& comm) {
      for (std::uint64_t seed = 5100; seed < 5103; ++seed) {
        const std::size_t count = test::mix(seed) % 20000 + 1;
        const int root = static_cast<int>(seed % static_cast<std::uint64_t>(comm.size()));
        for (algo a : algorithms_for(collective::broadcast)) {
          check_broadcast<std::int32_t>(comm, a, count, root, seed % 4, in_place_for(seed), seed);
        }
        for (algo a : algorithms_for(collective::reduce)) {
          check_reduce<double>(comm, sum, a, count, root, seed % 5, in_place_for(seed + 1), seed);
          check_reduce<half>(comm, avg, a, count, root, seed % 3, in_place_for(seed + 2), seed);
        }
        for (algo a : algorithms_for(collective::gather)) {
          check_gather<std::uint8_t>(comm, a, count / 4, root, seed % 7, in_place_for(seed), seed);
        }
        for (algo a : algorithms_for(collective::scatter)) {
          check_scatter<std::int64_t>(comm, a, count / 8, root, seed % 6, in_place_for(seed), seed);
        }
      }
    }, {.env = {{"CHORUS_SLICE_BYTES", "4096"}, {"CHORUS_SLICES_IN_FLIGHT", "2"}}});
  }
}

TEST_CASE("the typed rooted calls take empty spans where a rank has no buffer") {
  run_ranks(4, [](communicator& comm) {
    const int r = comm.rank();
    const int n = comm.size();
    const bool root = r == 2;
    // broadcast: one buffer in place on every rank.
    std::vector<std::int32_t> weights(100, root ? 7 : -1);
    comm.broadcast(std::span(weights), 2);
    RANK_CHECK(weights[0] == 7 && weights[99] == 7);
    // reduce: the others' out is empty, and their input stays.
    const std::vector<float> grads(33, static_cast<float>(r + 1));
    std::vector<float> total(root ? 33 : 0);
    comm.reduce(std::span<const float>(grads), std::span(total), 2, {.op = max});
    if (root) RANK_CHECK(total[32] == static_cast<float>(n));
    RANK_CHECK(grads[0] == static_cast<float>(r + 1));
    // reduce in place.
    std::vector<std::int64_t> counts(5, r);
    comm.reduce(std::span(counts), 2);
    RANK_CHECK(counts[4] == (root ? n * (n - 1) / 2 : r));
    // gather and scatter: the root's big buffer only.
    const std::vector<std::int32_t> mine(3, r * 10);
    std::vector<std::int32_t> all(root ? 3 * static_cast<std::size_t>(n) : 0);
    comm.gather(std::span<const std::int32_t>(mine), std::span(all), 2);
    if (root) RANK_CHECK(all[0] == 0 && all[3 * static_cast<std::size_t>(n) - 1] == (n - 1) * 10);
    std::vector<std::int32_t> part(3, -1);
    comm.scatter(std::span<const std::int32_t>(all), std::span(part), 2);
    RANK_CHECK(part[0] == r * 10 && part[2] == r * 10);
  });
}

TEST_CASE("async rooted collectives with different roots and algorithms complete in issue order with correct results") {
  for (int n : {3, 5}) {
    CAPTURE(n);
    run_ranks(n, [](communicator& comm) {
      const int r = comm.rank();
      const int nn = comm.size();
      const auto un = static_cast<std::size_t>(nn);
      const int k = 4;
      std::vector<std::vector<std::int32_t>> bcast(k), red_in(k), red_out(k), gat_out(k), sca_in(k), sca_out(k);
      std::vector<std::int32_t> gat_in(7, r + 1);
      std::vector<request> reqs;
      for (int j = 0; j < k; ++j) {
        const auto uj = static_cast<std::size_t>(j);
        const int root = j % nn;
        const algo flow = algorithms_for(collective::broadcast)[uj % algorithms_for(collective::broadcast).size()];
        const algo blocks = algorithms_for(collective::gather)[uj % algorithms_for(collective::gather).size()];
        bcast[uj].assign(1000 + uj, r == root ? j + 100 : -1);
        reqs.push_back(comm.broadcast_async(std::span(bcast[uj]), root, {.algorithm = flow}));
        red_in[uj].assign(999, r + j);
        red_out[uj].assign(r == root ? 999 : 0, -1);
        reqs.push_back(comm.reduce_async(std::span<const std::int32_t>(red_in[uj]), std::span(red_out[uj]), root,
                                         {.op = sum, .algorithm = flow}));
        gat_out[uj].assign(r == root ? 7 * un : 0, -1);
        reqs.push_back(comm.gather_async(std::span<const std::int32_t>(gat_in), std::span(gat_out[uj]), root,
                                         {.algorithm = blocks}));
        sca_in[uj].assign(r == root ? 5 * un : 0, 0);
        for (std::size_t i = 0; i < sca_in[uj].size(); ++i) sca_in[uj][i] = static_cast<std::int32_t>(i / 5) * 3 + j;
        sca_out[uj].assign(5, -1);
        reqs.push_back(comm.scatter_async(std::span<const std::int32_t>(sca_in[uj]), std::span(sca_out[uj]), root,
                                          {.algorithm = blocks}));
      }
      // Waited for in reverse: the last to complete first waits for all before it.
      for (auto it = reqs.rbegin(); it != reqs.rend(); ++it) it->wait();
      for (int j = 0; j < k; ++j) {
        const auto uj = static_cast<std::size_t>(j);
        const int root = j % nn;
        RANK_CHECK(bcast[uj].front() == j + 100 && bcast[uj].back() == j + 100);
        if (r == root) {
          RANK_CHECK(red_out[uj][998] == nn * (nn - 1) / 2 + nn * j);
          RANK_CHECK(gat_out[uj][0] == 1 && gat_out[uj][7 * un - 1] == nn);
        }
        RANK_CHECK(red_in[uj][0] == r + j);
        RANK_CHECK(sca_out[uj][0] == r * 3 + j && sca_out[uj][4] == r * 3 + j);
      }
    });
  }
}

TEST_CASE("the tuner's automatic choice of rooted algorithm agrees across ranks at every size") {
  for (int n : {3, 8}) {
    CAPTURE(n);
    run_ranks(n, [](communicator& comm) {
      std::uint64_t seed = 5200;
      const int last = comm.size() - 1;
      // From one element to past the point where the chain should take over.
      for (std::size_t count : {std::size_t{1}, std::size_t{100}, std::size_t{5000}, std::size_t{70000}, std::size_t{600001}}) {
        check_broadcast<float>(comm, algo::automatic, count, last, 0, in_place_for(seed), seed);
        ++seed;
        check_reduce<float>(comm, sum, algo::automatic, count, 1, 1, in_place_for(seed), seed);
        ++seed;
        check_gather<std::int8_t>(comm, algo::automatic, count / 8, 0, 2, in_place_for(seed), seed);
        ++seed;
        check_scatter<std::int8_t>(comm, algo::automatic, count / 8, last, 3, in_place_for(seed), seed);
        ++seed;
      }
    });
  }
}
