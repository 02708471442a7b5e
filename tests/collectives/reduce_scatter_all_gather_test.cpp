// SPDX-License-Identifier: Apache-2.0
// reduce_scatter and all_gather over real TCP ranks: every dtype, odd sizes, in place, async.
#include <doctest/doctest.h>

#include <cstring>
#include <vector>

#include "collectives/values.hpp"
#include "support/multirank.hpp"

using namespace chorus;
using chorus::test::run_ranks;

namespace {

template <class T>
void check_reduce_scatter(communicator& comm, reduce_op op, std::size_t block, std::size_t misalign,
                          bool in_place, std::uint64_t seed) {
  const auto n = static_cast<std::size_t>(comm.size());
  const auto me = static_cast<std::size_t>(comm.rank());
  std::vector<unsigned char> in_buf(block * n * sizeof(T) + 16), out_buf(block * sizeof(T) + 16);
  unsigned char* in = in_buf.data() + misalign;
  // In place: our block of the input is the output (as NCCL's recvbuff = sendbuff + rank*count).
  unsigned char* out = in_place ? in + me * block * sizeof(T) : out_buf.data() + (misalign + 1) % 8;
  for (std::size_t i = 0; i < block * n; ++i) {
    const T v = test::input_value<T>(op, comm.rank(), i, seed);
    std::memcpy(in + i * sizeof(T), &v, sizeof(T));
  }
  comm.reduce_scatter(in, out, block, dtype_of<T>, {.op = op});
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < block; ++i) {
    T got;
    std::memcpy(&got, out + i * sizeof(T), sizeof(T));
    if (!test::same_bits(got, test::expected_value<T>(op, comm.size(), me * block + i, seed))) ++wrong;
  }
  if (wrong) std::fprintf(stderr, "[rank %d] reduce_scatter %s %s block %zu: %zu wrong\n", comm.rank(),
                          std::string(to_string(dtype_of<T>)).c_str(), std::string(to_string(op)).c_str(), block, wrong);
  RANK_CHECK(wrong == 0);
}

template <class T>
void check_all_gather(communicator& comm, std::size_t block, std::size_t misalign, bool in_place,
                      std::uint64_t seed) {
  const auto n = static_cast<std::size_t>(comm.size());
  const auto me = static_cast<std::size_t>(comm.rank());
  std::vector<unsigned char> in_buf(block * sizeof(T) + 16), out_buf(block * n * sizeof(T) + 16);
  unsigned char* out = out_buf.data() + misalign;
  unsigned char* in = in_place ? out + me * block * sizeof(T) : in_buf.data() + (misalign + 5) % 8;
  for (std::size_t i = 0; i < block; ++i) {
    const T v = test::input_value<T>(reduce_op::sum, comm.rank(), i, seed);
    std::memcpy(in + i * sizeof(T), &v, sizeof(T));
  }
  comm.all_gather(in, out, block, dtype_of<T>);
  std::size_t wrong = 0;
  for (std::size_t r = 0; r < n; ++r) {
    for (std::size_t i = 0; i < block; ++i) {
      T got;
      std::memcpy(&got, out + (r * block + i) * sizeof(T), sizeof(T));
      if (!test::same_bits(got, test::input_value<T>(reduce_op::sum, static_cast<int>(r), i, seed))) ++wrong;
    }
  }
  if (wrong) std::fprintf(stderr, "[rank %d] all_gather %s block %zu: %zu wrong\n", comm.rank(),
                          std::string(to_string(dtype_of<T>)).c_str(), block, wrong);
  RANK_CHECK(wrong == 0);
}

}  // namespace

TEST_CASE("reduce_scatter leaves block r reduced on rank r for every dtype and op, 1 to 8 ranks") {
  for (int n : test::all_world_sizes) {
    CAPTURE(n);
    run_ranks(n, [](communicator& comm) {
      std::uint64_t seed = 100;
      for (dtype t : test::all_dtypes) {
        for (reduce_op op : test::all_ops) {
          if (op == reduce_op::avg && !is_floating(t)) continue;
          test::with_dtype(t, [&]<class T>() {
            for (std::size_t block : {std::size_t{0}, std::size_t{1}, std::size_t{257}}) {
              check_reduce_scatter<T>(comm, op, block, seed % 7, seed % 3 == 0, seed);
              ++seed;
            }
          });
        }
      }
    }, {.deadline = std::chrono::seconds(240)});
  }
}

TEST_CASE("all_gather delivers every rank's block to every rank for every dtype, 1 to 8 ranks") {
  for (int n : test::all_world_sizes) {
    CAPTURE(n);
    run_ranks(n, [](communicator& comm) {
      std::uint64_t seed = 200;
      for (dtype t : test::all_dtypes) {
        test::with_dtype(t, [&]<class T>() {
          for (std::size_t block : {std::size_t{0}, std::size_t{1}, std::size_t{3}, std::size_t{1001}}) {
            check_all_gather<T>(comm, block, seed % 7, seed % 2 == 0, seed);
            ++seed;
          }
        });
      }
    }, {.deadline = std::chrono::seconds(240)});
  }
}

TEST_CASE("reduce_scatter and all_gather of many slices match all_reduce") {
  run_ranks(3, [](communicator& comm) {
    check_reduce_scatter<float>(comm, reduce_op::sum, (1u << 18) + 3, 0, false, 300);
    check_reduce_scatter<bfloat16>(comm, reduce_op::avg, (1u << 18) + 1, 1, true, 301);
    check_all_gather<double>(comm, (1u << 17) + 5, 0, false, 302);
    check_all_gather<std::int8_t>(comm, (1u << 20) + 5, 3, true, 303);
  }, {.env = {{"CHORUS_SLICE_BYTES", "65536"}}});
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
