// SPDX-License-Identifier: Apache-2.0
// all_reduce over real ranks: every algorithm, dtype and op, odd sizes, unaligned buffers, async.
#include <doctest/doctest.h>

#include <cstring>
#include <string>
#include <vector>

#include "collectives/values.hpp"
#include "support/multirank.hpp"

using namespace chorus;
using chorus::test::run_ranks;

namespace {

/// Runs one all_reduce of `count` elements at byte offset `misalign` and checks every
/// element against the exact expected value, the input (out of place) and the bytes around
/// both buffers. Returns nothing; failures are RANK_CHECKs.
template <class T>
void check_all_reduce(communicator& comm, reduce_op op, std::size_t count, std::size_t misalign,
                      bool in_place, algo a, std::uint64_t seed) {
  const std::size_t bytes = count * sizeof(T);
  test::guarded_buffer in(bytes, misalign), out_buf(bytes, (misalign + 3) % 8);
  for (std::size_t i = 0; i < count; ++i) in.put(i, test::input_value<T>(op, comm.rank(), i, seed));
  test::guarded_buffer& out = in_place ? in : out_buf;
  std::vector<unsigned char> before(in.data(), in.data() + bytes);
  comm.all_reduce(in.data(), out.data(), count, dtype_of<T>, {.op = op, .algorithm = a});
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < count; ++i) {
    if (!test::same_bits(out.get<T>(i), test::expected_value<T>(op, comm.size(), i, seed))) ++wrong;
  }
  if (wrong != 0) {
    std::fprintf(stderr, "[rank %d of %d] %s %s count %zu misalign %zu %s %s: %zu wrong\n",
                 comm.rank(), comm.size(), std::string(to_string(dtype_of<T>)).c_str(),
                 std::string(to_string(op)).c_str(), count, misalign,
                 in_place ? "in-place" : "out-of-place", std::string(to_string(a)).c_str(), wrong);
  }
  RANK_CHECK(wrong == 0);
  RANK_CHECK(in.guards_intact() && out.guards_intact());
  if (!in_place && bytes > 0) RANK_CHECK(std::memcmp(before.data(), in.data(), bytes) == 0);  // input untouched
}

void every_dtype_op_and_algorithm(communicator& comm) {
  const std::size_t n = static_cast<std::size_t>(comm.size());
  std::uint64_t seed = 1;
  for (dtype t : test::all_dtypes) {
    for (reduce_op op : test::all_ops) {
      if (op == reduce_op::avg && !is_floating(t)) continue;
      test::with_dtype(t, [&]<class T>() {
        // Counts: empty, one, fewer than ranks, more than ranks but not a multiple of them,
        // and a prime.
        for (std::size_t count : {std::size_t{0}, std::size_t{1}, n - 1, 2 * n + 1, std::size_t{1009}}) {
          for (algo a : algorithms_for(collective::all_reduce)) {
            const std::uint64_t h = test::mix(seed);
            check_all_reduce<T>(comm, op, count, h % 8, (h >> 8) % 2 == 0, a, seed);
            ++seed;
          }
        }
      });
    }
  }
}

}  // namespace

TEST_CASE("every all_reduce algorithm gives every rank the exact reduction for every dtype and op, 1 to 8 ranks") {
  for (int n : test::all_world_sizes) {
    CAPTURE(n);
    run_ranks(n, every_dtype_op_and_algorithm, {.deadline = std::chrono::seconds(240)});
  }
}

TEST_CASE("every all_reduce algorithm is exact for buffers of many slices, in place and out of place") {
  for (int n : {2, 3, 5}) {
    CAPTURE(n);
    run_ranks(n, [](communicator& comm) {
      // 3 MiB of float plus a prime tail: six 512 KiB slices per chunk at n = 2.
      const std::size_t count = (3u << 18) + 7;
      std::uint64_t seed = 11;
      for (algo a : algorithms_for(collective::all_reduce)) {
        check_all_reduce<float>(comm, reduce_op::sum, count, 0, true, a, seed++);
        check_all_reduce<half>(comm, reduce_op::avg, count, 2, false, a, seed++);
        check_all_reduce<std::int64_t>(comm, reduce_op::max, count / 2, 1, false, a, seed++);
      }
    });
  }
}

TEST_CASE("every all_reduce algorithm with a small slice size pipelines many slices per step") {
  for (int n : {4, 5}) {
    CAPTURE(n);
    run_ranks(n, [](communicator& comm) {
      for (std::uint64_t seed = 20; seed < 24; ++seed) {
        const std::size_t count = test::mix(seed) % 50000;
        for (algo a : algorithms_for(collective::all_reduce)) {
          check_all_reduce<double>(comm, reduce_op::sum, count, seed % 5, seed % 2 == 1, a, seed);
          check_all_reduce<std::uint8_t>(comm, reduce_op::prod, count, seed % 3, seed % 2 == 0, a, seed);
        }
      }
    }, {.env = {{"CHORUS_SLICE_BYTES", "4096"}, {"CHORUS_SLICES_IN_FLIGHT", "3"}}});
  }
}

TEST_CASE("the tuner's automatic choice of all_reduce algorithm agrees across ranks at every size") {
  for (int n : {3, 4, 8}) {
    CAPTURE(n);
    run_ranks(n, [](communicator& comm) {
      std::uint64_t seed = 60;
      for (std::size_t count : {std::size_t{1}, std::size_t{100}, std::size_t{5000}, std::size_t{70000}, std::size_t{600001}}) {
        check_all_reduce<float>(comm, reduce_op::sum, count, seed % 8, seed % 2 == 0, algo::automatic, seed);
        ++seed;
        check_all_reduce<std::int32_t>(comm, reduce_op::max, count, seed % 8, seed % 2 == 0, algo::automatic, seed);
        ++seed;
      }
    });
  }
}

TEST_CASE("all_reduce with one connection per peer and no spinning still completes") {
  run_ranks(3, [](communicator& comm) {
    check_all_reduce<float>(comm, reduce_op::sum, 100000, 0, true, algo::ring, 40);
    check_all_reduce<float>(comm, reduce_op::min, 10, 0, false, algo::automatic, 41);
  }, {.env = {{"CHORUS_TCP_CONNS", "1"}, {"CHORUS_SPIN_US", "0"}}});
}

TEST_CASE("several async all_reduces in flight complete in issue order with correct results") {
  for (int n : {2, 4}) {
    CAPTURE(n);
    run_ranks(n, [](communicator& comm) {
      const int k = 6;
      std::vector<std::vector<float>> bufs(k);
      std::vector<request> reqs;
      for (int j = 0; j < k; ++j) {
        bufs[static_cast<std::size_t>(j)].assign(static_cast<std::size_t>(1000 * (j + 1) + j),
                                                 static_cast<float>(comm.rank() + j));
        reqs.push_back(comm.all_reduce_async(std::span(bufs[static_cast<std::size_t>(j)])));
      }
      // A blocking call issued after the async ones runs after them.
      std::vector<int> last(17, 1);
      comm.all_reduce(std::span(last));
      RANK_CHECK(last[16] == comm.size());
      for (int j = 0; j < k; ++j) {
        reqs[static_cast<std::size_t>(j)].wait();
        RANK_CHECK(reqs[static_cast<std::size_t>(j)].test());
        const int nn = comm.size();
        const float want = static_cast<float>(nn * (nn - 1) / 2 + nn * j);
        bool ok = true;
        for (float v : bufs[static_cast<std::size_t>(j)]) ok = ok && v == want;
        RANK_CHECK(ok);
      }
    });
  }
}

TEST_CASE("every rank gets bit-identical float results from random non-integer data, whatever the algorithm") {
  run_ranks(5, [](communicator& comm) {
    for (algo a : algorithms_for(collective::all_reduce)) {
      std::vector<float> v(4099);
      for (std::size_t i = 0; i < v.size(); ++i) {
        v[i] = static_cast<float>(test::mix(i * 7 + static_cast<std::size_t>(comm.rank())) % 100000) / 977.0f;
      }
      comm.all_reduce(std::span(v), {.op = sum, .algorithm = a});
      // Gather everyone's result and compare bit for bit.
      std::vector<float> all(v.size() * static_cast<std::size_t>(comm.size()));
      comm.all_gather(std::span<const float>(v), std::span(all));
      bool same = true;
      for (std::size_t r = 0; r < static_cast<std::size_t>(comm.size()); ++r) {
        same = same && std::memcmp(all.data() + r * v.size(), v.data(), v.size() * sizeof(float)) == 0;
      }
      RANK_CHECK(same);
      // And close to the sum computed in double.
      double worst = 0;
      for (std::size_t i = 0; i < v.size(); ++i) {
        double ref = 0;
        for (int r = 0; r < comm.size(); ++r) ref += static_cast<float>(test::mix(i * 7 + static_cast<std::size_t>(r)) % 100000) / 977.0f;
        worst = std::max(worst, std::abs(ref - v[i]) / std::max(1.0, std::abs(ref)));
      }
      RANK_CHECK(worst < 1e-5);
    }
  });
}

TEST_CASE("recursive doubling with slices larger than the socket buffers does not deadlock") {
  // Each rank posts its reducing receive before its own send of the slice has left: the
  // send can only drain once the peer reads.
  for (int n : {2, 4}) {
    CAPTURE(n);
    run_ranks(n, [](communicator& comm) {
      check_all_reduce<float>(comm, reduce_op::sum, std::size_t{1} << 22, 0, true, algo::recursive_doubling, 50);
      check_all_reduce<float>(comm, reduce_op::max, std::size_t{1} << 22, 0, false, algo::recursive_doubling, 51);
    }, {.deadline = std::chrono::seconds(60),
        .env = {{"CHORUS_TCP_BUFFER", "65536"}, {"CHORUS_SLICE_BYTES", "8388608"}, {"CHORUS_TIMEOUT", "20"}}});
  }
}

TEST_CASE("the same call on the same buffers again replays its plan exactly, between other calls on those buffers") {
  // The executor keeps the plan of its last single operation and replays it for the same
  // schedule and buffers. New values every round, another output buffer for the same call,
  // and calls in between that use the same memory differently (another count, another
  // algorithm, all_to_allvs whose counts change while their buffers' sizes and fingerprint
  // do not) must never see a stale plan.
  for (int n : {2, 3, 4}) {
    run_ranks(n, [](communicator& comm) {
      const auto ranks = static_cast<std::size_t>(comm.size());
      const std::size_t count = 50000 * ranks;  // a few slices per step
      std::vector<std::int64_t> a(count), b(count), c(count);
      for (int round = 0; round < 12; ++round) {
        for (algo al : {algo::ring, algo::direct}) {
          for (int again = 0; again < 3; ++again) {
            const std::int64_t base = round * 7 + again;
            for (std::size_t i = 0; i < count; ++i) a[i] = static_cast<std::int64_t>(i * 3) + base + comm.rank();
            // The second of three calls writes elsewhere: a plan replayed on the wrong
            // buffers shows.
            std::vector<std::int64_t>& out = again == 1 ? c : b;
            comm.all_reduce(std::span<const std::int64_t>(a), std::span(out), {.algorithm = al});
            std::size_t wrong = 0;
            const auto r = static_cast<std::int64_t>(ranks);
            for (std::size_t i = 0; i < count; ++i) {
              wrong += out[i] != r * (static_cast<std::int64_t>(i * 3) + base) + r * (r - 1) / 2;
            }
            RANK_CHECK(wrong == 0);
          }
        }
        // The same buffers, another shape of call.
        comm.all_reduce(std::span(a).first(count / 2), {.algorithm = algo::ring});
        // Two all_to_allvs in a row on the same buffers, with counts that differ while their
        // sums, and so the buffers' sizes and the fingerprint, stay the same.
        const int me = comm.rank();
        for (int shift = round; shift < round + 2; ++shift) {
          std::vector<std::size_t> send(ranks), recv(ranks);
          for (std::size_t j = 0; j < ranks; ++j) {
            send[j] = (j + static_cast<std::size_t>(me + shift)) % ranks;
            recv[j] = (static_cast<std::size_t>(me + shift) + j) % ranks;  // what rank j sends us
          }
          std::size_t at = 0;
          for (std::size_t j = 0; j < ranks; ++j) {
            for (std::size_t k = 0; k < send[j]; ++k) a[at++] = static_cast<std::int64_t>(me * 1000) + static_cast<std::int64_t>(j);
          }
          comm.all_to_allv(a.data(), send, b.data(), recv, dtype::int64);
          at = 0;
          std::size_t wrong = 0;
          for (std::size_t j = 0; j < ranks; ++j) {
            for (std::size_t k = 0; k < recv[j]; ++k) wrong += b[at++] != static_cast<std::int64_t>(j * 1000) + me;
          }
          RANK_CHECK(wrong == 0);
        }
      }
    }, {.deadline = std::chrono::seconds(120)});
  }
}
