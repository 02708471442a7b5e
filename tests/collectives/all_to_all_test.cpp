// SPDX-License-Identifier: Apache-2.0
// all_to_all and all_to_allv over real ranks: every algorithm and dtype, random counts with
// zeros, unaligned buffers, many slices, async.
#include <doctest/doctest.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "collectives/values.hpp"
#include "support/multirank.hpp"

using namespace chorus;
using chorus::test::run_ranks;

namespace {

/// One all_to_all of `block` elements per pair: block j of our input holds what we send
/// rank j, and block i of the output must hold what rank i sent us.
template <class T>
void check_all_to_all(communicator& comm, algo a, std::size_t block, std::size_t misalign,
                      std::uint64_t seed) {
  const int n = comm.size();
  const int me = comm.rank();
  const auto un = static_cast<std::size_t>(n);
  test::guarded_buffer in(un * block * sizeof(T), misalign), out(un * block * sizeof(T), (misalign + 3) % 8);
  for (int j = 0; j < n; ++j) {
    for (std::size_t i = 0; i < block; ++i) in.put(static_cast<std::size_t>(j) * block + i, test::pair_value<T>(me, j, i, seed));
  }
  const std::vector<unsigned char> before(in.data(), in.data() + in.size());
  comm.all_to_all(in.data(), out.data(), block, dtype_of<T>, {.algorithm = a});
  std::size_t wrong = 0;
  for (int from = 0; from < n; ++from) {
    for (std::size_t i = 0; i < block; ++i) {
      if (!test::same_bits(out.get<T>(static_cast<std::size_t>(from) * block + i), test::pair_value<T>(from, me, i, seed))) ++wrong;
    }
  }
  if (wrong != 0) {
    std::fprintf(stderr, "[rank %d of %d] all_to_all %s %s block %zu: %zu wrong\n", me, n,
                 std::string(to_string(a)).c_str(), std::string(to_string(dtype_of<T>)).c_str(), block, wrong);
  }
  RANK_CHECK(wrong == 0);
  RANK_CHECK(in.guards_intact() && out.guards_intact());
  if (!before.empty()) RANK_CHECK(std::memcmp(before.data(), in.data(), before.size()) == 0);
}

/// One all_to_allv whose counts come from `seed` (test::pair_count, up to `most` per pair,
/// about a quarter zero): we send rank j pair_count(me, j) elements and receive
/// pair_count(i, me) from rank i, which is what rank i computes it sends us.
template <class T>
void check_all_to_allv(communicator& comm, algo a, std::size_t most, std::size_t misalign,
                       std::uint64_t seed) {
  const int n = comm.size();
  const int me = comm.rank();
  std::vector<std::size_t> send_counts, recv_counts, send_at, recv_at;
  std::size_t sent = 0, received = 0;
  for (int p = 0; p < n; ++p) {
    send_counts.push_back(test::pair_count(me, p, most, seed));
    recv_counts.push_back(test::pair_count(p, me, most, seed));
    send_at.push_back(sent);
    recv_at.push_back(received);
    sent += send_counts.back();
    received += recv_counts.back();
  }
  test::guarded_buffer in(sent * sizeof(T), misalign), out(received * sizeof(T), (misalign + 5) % 8);
  for (int j = 0; j < n; ++j) {
    const auto uj = static_cast<std::size_t>(j);
    for (std::size_t i = 0; i < send_counts[uj]; ++i) in.put(send_at[uj] + i, test::pair_value<T>(me, j, i, seed));
  }
  const std::vector<unsigned char> before(in.data(), in.data() + in.size());
  comm.all_to_allv(in.data(), send_counts, out.data(), recv_counts, dtype_of<T>, {.algorithm = a});
  std::size_t wrong = 0;
  for (int from = 0; from < n; ++from) {
    const auto uf = static_cast<std::size_t>(from);
    for (std::size_t i = 0; i < recv_counts[uf]; ++i) {
      if (!test::same_bits(out.get<T>(recv_at[uf] + i), test::pair_value<T>(from, me, i, seed))) ++wrong;
    }
  }
  if (wrong != 0) {
    std::fprintf(stderr, "[rank %d of %d] all_to_allv %s %s most %zu seed %llu: %zu wrong\n", me, n,
                 std::string(to_string(a)).c_str(), std::string(to_string(dtype_of<T>)).c_str(), most,
                 static_cast<unsigned long long>(seed), wrong);
  }
  RANK_CHECK(wrong == 0);
  RANK_CHECK(in.guards_intact() && out.guards_intact());
  if (!before.empty()) RANK_CHECK(std::memcmp(before.data(), in.data(), before.size()) == 0);
}

}  // namespace

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
