// SPDX-License-Identifier: Apache-2.0
// reduce_scatter and all_gather over real ranks: every algorithm and dtype, odd sizes, in place, async.
#include <doctest/doctest.h>

#include <cstring>
#include <string>
#include <vector>

#include "collectives/values.hpp"
#include "support/multirank.hpp"

using namespace chorus;
using chorus::test::run_ranks;

namespace {

template <class T>
void check_reduce_scatter(communicator& comm, reduce_op op, std::size_t block, std::size_t misalign,
                          bool in_place, algo a, std::uint64_t seed) {
  const auto n = static_cast<std::size_t>(comm.size());
  const auto me = static_cast<std::size_t>(comm.rank());
  test::guarded_buffer in(block * n * sizeof(T), misalign), out_buf(block * sizeof(T), (misalign + 1) % 8);
  for (std::size_t i = 0; i < block * n; ++i) in.put(i, test::input_value<T>(op, comm.rank(), i, seed));
  const std::vector<unsigned char> before(in.data(), in.data() + in.size());
  // In place: our block of the input is the output (as NCCL's recvbuff = sendbuff + rank*count).
  unsigned char* out = in_place ? in.data() + me * block * sizeof(T) : out_buf.data();
  comm.reduce_scatter(in.data(), out, block, dtype_of<T>, {.op = op, .algorithm = a});
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < block; ++i) {
    T got;
    std::memcpy(&got, out + i * sizeof(T), sizeof(T));
    if (!test::same_bits(got, test::expected_value<T>(op, comm.size(), me * block + i, seed))) ++wrong;
  }
  if (wrong) {
    std::fprintf(stderr, "[rank %d of %d] reduce_scatter %s %s %s block %zu %s: %zu wrong\n", comm.rank(),
                 comm.size(), std::string(to_string(a)).c_str(), std::string(to_string(dtype_of<T>)).c_str(),
                 std::string(to_string(op)).c_str(), block, in_place ? "in place" : "out of place", wrong);
  }
  RANK_CHECK(wrong == 0);
  RANK_CHECK(in.guards_intact() && out_buf.guards_intact());
  // Out of place the input is left as it was; in place, the other ranks' blocks are.
  if (in_place && block > 0) {
    const std::size_t own = block * sizeof(T);
    RANK_CHECK(std::memcmp(before.data(), in.data(), me * own) == 0);
    RANK_CHECK(std::memcmp(before.data() + (me + 1) * own, in.data() + (me + 1) * own, (n - me - 1) * own) == 0);
  } else if (!in_place && !before.empty()) {
    RANK_CHECK(std::memcmp(before.data(), in.data(), before.size()) == 0);
  }
}

template <class T>
void check_all_gather(communicator& comm, std::size_t block, std::size_t misalign, bool in_place,
                      algo a, std::uint64_t seed) {
  const auto n = static_cast<std::size_t>(comm.size());
  const auto me = static_cast<std::size_t>(comm.rank());
  test::guarded_buffer in_buf(block * sizeof(T), (misalign + 5) % 8), out(block * n * sizeof(T), misalign);
  unsigned char* in = in_place ? out.data() + me * block * sizeof(T) : in_buf.data();
  for (std::size_t i = 0; i < block; ++i) {
    const T v = test::input_value<T>(reduce_op::sum, comm.rank(), i, seed);
    std::memcpy(in + i * sizeof(T), &v, sizeof(T));
  }
  const std::vector<unsigned char> before(in, in + block * sizeof(T));
  comm.all_gather(in, out.data(), block, dtype_of<T>, {.algorithm = a});
  std::size_t wrong = 0;
  for (std::size_t r = 0; r < n; ++r) {
    for (std::size_t i = 0; i < block; ++i) {
      if (!test::same_bits(out.get<T>(r * block + i), test::input_value<T>(reduce_op::sum, static_cast<int>(r), i, seed))) ++wrong;
    }
  }
  if (wrong) {
    std::fprintf(stderr, "[rank %d of %d] all_gather %s %s block %zu %s: %zu wrong\n", comm.rank(), comm.size(),
                 std::string(to_string(a)).c_str(), std::string(to_string(dtype_of<T>)).c_str(), block,
                 in_place ? "in place" : "out of place", wrong);
  }
  RANK_CHECK(wrong == 0);
  RANK_CHECK(in_buf.guards_intact() && out.guards_intact());
  if (!in_place && !before.empty()) RANK_CHECK(std::memcmp(before.data(), in, before.size()) == 0);
}

}  // namespace

TEST_CASE("every reduce_scatter algorithm leaves block r reduced on rank r for every dtype and op, 1 to 8 ranks") {
  for (int n : test::all_world_sizes) {
    CAPTURE(n);
    run_ranks(n, [](communicator& comm) {
      const auto nn = static_cast<std::size_t>(comm.size());
      std::uint64_t seed = 100;
      for (dtype t : test::all_dtypes) {
        for (reduce_op op : test::all_ops) {
          if (op == reduce_op::avg && !is_floating(t)) continue;
          test::with_dtype(t, [&]<class T>() {
            for (std::size_t block : {std::size_t{0}, std::size_t{1}, nn + 1, std::size_t{257}}) {
              for (algo a : algorithms_for(collective::reduce_scatter)) {
                const std::uint64_t h = test::mix(seed);
                check_reduce_scatter<T>(comm, op, block, h % 8, (h >> 8) % 2 == 0, a, seed);
                ++seed;
              }
            }
          });
        }
      }
    }, {.deadline = std::chrono::seconds(240)});
  }
}

TEST_CASE("every all_gather algorithm delivers every rank's block to every rank for every dtype, 1 to 8 ranks") {
  for (int n : test::all_world_sizes) {
    CAPTURE(n);
    run_ranks(n, [](communicator& comm) {
      const auto nn = static_cast<std::size_t>(comm.size());
      std::uint64_t seed = 200;
      for (dtype t : test::all_dtypes) {
        test::with_dtype(t, [&]<class T>() {
          for (std::size_t block : {std::size_t{0}, std::size_t{1}, std::size_t{3}, nn + 1, std::size_t{1001}}) {
            for (algo a : algorithms_for(collective::all_gather)) {
              const std::uint64_t h = test::mix(seed);
              check_all_gather<T>(comm, block, h % 8, (h >> 8) % 2 == 0, a, seed);
              ++seed;
            }
          }
        });
      }
    }, {.deadline = std::chrono::seconds(240)});
  }
}

TEST_CASE("reduce_scatter and all_gather of many slices are exact for every algorithm") {
  for (int n : {3, 4}) {
    CAPTURE(n);
    run_ranks(n, [](communicator& comm) {
      std::uint64_t seed = 300;
      for (algo a : algorithms_for(collective::reduce_scatter)) {
        check_reduce_scatter<float>(comm, reduce_op::sum, (1u << 18) + 3, 0, false, a, seed++);
        check_reduce_scatter<bfloat16>(comm, reduce_op::avg, (1u << 18) + 1, 1, true, a, seed++);
      }
      for (algo a : algorithms_for(collective::all_gather)) {
        check_all_gather<double>(comm, (1u << 17) + 5, 0, false, a, seed++);
        check_all_gather<std::int8_t>(comm, (1u << 20) + 5, 3, true, a, seed++);
      }
    }, {.env = {{"CHORUS_SLICE_BYTES", "65536"}}});
  }
}

TEST_CASE("reduce_scatter and all_gather of a few MiB at the default slice size are exact for every algorithm") {
  for (int n : {2, 5}) {
    CAPTURE(n);
    run_ranks(n, [](communicator& comm) {
      std::uint64_t seed = 320;
      // 5 MiB of float per rank's block: three default slices and a tail.
      const std::size_t block = (5u << 18) + 11;
      for (algo a : algorithms_for(collective::reduce_scatter)) {
        check_reduce_scatter<float>(comm, reduce_op::max, block / 4, 2, seed % 2 == 0, a, seed);
        ++seed;
      }
      for (algo a : algorithms_for(collective::all_gather)) {
        check_all_gather<float>(comm, block, 1, seed % 2 == 0, a, seed);
        ++seed;
      }
    });
  }
}

TEST_CASE("reduce_scatter and all_gather with 4 KiB slices pipeline many slices per step") {
  for (int n : {3, 5, 8}) {
    CAPTURE(n);
    run_ranks(n, [](communicator& comm) {
      for (std::uint64_t seed = 340; seed < 343; ++seed) {
        const std::size_t block = test::mix(seed) % 9000;
        for (algo a : algorithms_for(collective::reduce_scatter)) {
          check_reduce_scatter<std::int32_t>(comm, reduce_op::sum, block, seed % 5, seed % 2 == 1, a, seed);
        }
        for (algo a : algorithms_for(collective::all_gather)) {
          check_all_gather<half>(comm, block, seed % 3, seed % 2 == 0, a, seed);
        }
      }
    }, {.env = {{"CHORUS_SLICE_BYTES", "4096"}, {"CHORUS_SLICES_IN_FLIGHT", "2"}}});
  }
}

TEST_CASE("the tuner's automatic choice of reduce_scatter and all_gather algorithm agrees across ranks at every size") {
  for (int n : {3, 4, 8}) {
    CAPTURE(n);
    run_ranks(n, [](communicator& comm) {
      std::uint64_t seed = 360;
      for (std::size_t block : {std::size_t{1}, std::size_t{100}, std::size_t{5000}, std::size_t{70000}, std::size_t{300001}}) {
        check_reduce_scatter<float>(comm, reduce_op::sum, block, seed % 8, seed % 2 == 0, algo::automatic, seed);
        ++seed;
        check_all_gather<std::int32_t>(comm, block, seed % 8, seed % 2 == 0, algo::automatic, seed);
        ++seed;
      }
    });
  }
}

TEST_CASE("async reduce_scatter and all_gather interleave with all_reduce in issue order") {
  run_ranks(4, [](communicator& comm) {
    const auto n = static_cast<std::size_t>(comm.size());
    std::vector<int> rs_in(100 * n, comm.rank() + 1), rs_out(100);
    std::vector<int> ag_in(50, comm.rank()), ag_out(50 * n);
    std::vector<int> ar(33, 2);
    auto a = comm.reduce_scatter_async(std::span<const int>(rs_in), std::span(rs_out));
    auto b = comm.all_gather_async(std::span<const int>(ag_in), std::span(ag_out));
    auto c = comm.all_reduce_async(std::span(ar), {.op = prod});
    c.wait();
    a.wait();
    b.wait();
    const int nn = comm.size();
    RANK_CHECK(rs_out[99] == nn * (nn + 1) / 2);
    RANK_CHECK(ag_out[50 * n - 1] == nn - 1 && ag_out[0] == 0);
    RANK_CHECK(ar[32] == (1 << nn));
  });
}
