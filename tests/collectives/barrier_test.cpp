// SPDX-License-Identifier: Apache-2.0
// barrier over real ranks: no rank leaves before every rank has arrived, checked through a
// counter in memory every rank shares, never through timing.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

#include "collectives/shared_counters.hpp"
#include "collectives/values.hpp"
#include "support/multirank.hpp"

using namespace chorus;
using chorus::test::run_ranks;

namespace {

/// In round k one rank arrives late (it naps first): a barrier that let anyone leave early
/// would very likely show it. The nap only makes a wrong barrier easier to catch; no
/// assertion depends on how long anything takes.
void arrive_late_if_chosen(const communicator& comm, int round) {
  if (comm.size() > 1 && round % comm.size() == comm.rank()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

/// After k barriers every rank has arrived at barrier k, and none can have arrived at k + 2
/// (it would need us at k + 1): the counter is at least n*k and at most n*k + n-1.
void check_after_round(const communicator& comm, const std::atomic<int>& arrived, int round) {
  const int n = comm.size();
  const int seen = arrived.load();
  const bool ok = seen >= n * round && seen <= n * round + n - 1;
  if (!ok) {
    std::fprintf(stderr, "[rank %d of %d] left barrier %d having seen %d arrivals (at least %d due)\n",
                 comm.rank(), n, round, seen, n * round);
  }
  RANK_CHECK(ok);
}

}  // namespace

TEST_CASE("no rank leaves barrier before every rank has arrived, 1 to 8 ranks") {
  for (int n : test::all_world_sizes) {
    CAPTURE(n);
    test::shared_counters arrived(1);
    // Every rank arrives late twice.
    const int rounds = 2 * n + 2;
    run_ranks(n, [&](communicator& comm) {
      for (int round = 1; round <= rounds; ++round) {
        arrive_late_if_chosen(comm, round);
        arrived[0].fetch_add(1);
        comm.barrier();
        check_after_round(comm, arrived[0], round);
      }
    });
    CHECK(arrived[0].load() == rounds * n);
  }
}

TEST_CASE("no rank's barrier_async completes before every rank has arrived") {
  for (int n : {3, 4}) {
    CAPTURE(n);
    test::shared_counters arrived(1);
    run_ranks(n, [&](communicator& comm) {
      for (int round = 1; round <= 8; ++round) {
        arrive_late_if_chosen(comm, round);
        arrived[0].fetch_add(1);
        auto r = comm.barrier_async();
        r.wait();
        check_after_round(comm, arrived[0], round);
      }
    });
  }
}

TEST_CASE("a barrier queued behind async collectives still waits for every rank, and they are done by then") {
  test::shared_counters arrived(1);
  run_ranks(5, [&](communicator& comm) {
    std::vector<float> grads(200000, 1.0f);
    auto r = comm.all_reduce_async(std::span(grads));
    arrive_late_if_chosen(comm, 2);
    arrived[0].fetch_add(1);
    comm.barrier();
    check_after_round(comm, arrived[0], 1);
    RANK_CHECK(r.test());  // issued before the barrier, so complete once it returns
    RANK_CHECK(grads[199999] == 5.0f);
  });
}

TEST_CASE("a barrier of a split sub-communicator waits for its own members only") {
  // Counter 0 counts arrivals of the group of 3, counter 1 of the group of 2.
  test::shared_counters arrived(2);
  run_ranks(5, [&](communicator& comm) {
    const int color = comm.rank() < 3 ? 0 : 1;
    auto sub = comm.split(color, comm.rank());
    RANK_CHECK(sub.has_value());
    auto& mine = arrived[static_cast<std::size_t>(color)];
    for (int round = 1; round <= 6; ++round) {
      arrive_late_if_chosen(*sub, round);
      mine.fetch_add(1);
      sub->barrier();
      check_after_round(*sub, mine, round);
    }
    comm.barrier();
  });
  CHECK(arrived[0].load() == 18);
  CHECK(arrived[1].load() == 12);
}
