// SPDX-License-Identifier: Apache-2.0
// Point-to-point messages, grouped operations and split() sub-communicators over real ranks.
#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <numeric>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "support/multirank.hpp"

using namespace chorus;
using chorus::test::run_ranks;

namespace {

/// The value element i of message k from rank `from` holds.
std::int32_t msg_value(int from, int k, std::size_t i) {
  return from * 1000003 + k * 7919 + static_cast<std::int32_t>(i % 100003);
}

std::vector<std::int32_t> message(int from, int k, std::size_t count) {
  std::vector<std::int32_t> v(count);
  for (std::size_t i = 0; i < count; ++i) v[i] = msg_value(from, k, i);
  return v;
}

bool holds(const std::vector<std::int32_t>& v, int from, int k) {
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (v[i] != msg_value(from, k, i)) return false;
  }
  return true;
}

}  // namespace

TEST_CASE("send and recv deliver messages between two ranks in issue order, whatever the size") {
  run_ranks(3, [](communicator& comm) {
    const std::vector<std::size_t> sizes{0, 1, 1000, 300000, 7};
    if (comm.rank() == 0) {
      for (std::size_t k = 0; k < sizes.size(); ++k) {
        const auto m = message(0, static_cast<int>(k), sizes[k]);
        comm.send(std::span<const std::int32_t>(m), 2, {.tag = static_cast<int>(k)});
      }
    } else if (comm.rank() == 2) {
      for (std::size_t k = 0; k < sizes.size(); ++k) {
        std::vector<std::int32_t> got(sizes[k], -1);
        comm.recv(std::span(got), 0, {.tag = static_cast<int>(k)});
        RANK_CHECK(holds(got, 0, static_cast<int>(k)));
      }
    }
    // Rank 1 took no part: the collectives after the messages still line up on every rank.
    std::vector<int> one{1};
    comm.all_reduce(std::span(one));
    RANK_CHECK(one[0] == 3);
  });
}

TEST_CASE("asynchronous sends and receives complete, and pairs exchange both ways at once") {
  for (int n : {2, 4, 5}) {
    CAPTURE(n);
    run_ranks(n, [](communicator& comm) {
      const int r = comm.rank();
      const int nn = comm.size();
      const int right = (r + 1) % nn;
      const int left = (r + nn - 1) % nn;
      // Small messages around the ring: async sends complete into the socket buffers.
      const auto out = message(r, 1, 513);
      std::vector<std::int32_t> in(513, -1);
      auto s = comm.send_async(std::span<const std::int32_t>(out), right);
      comm.recv(std::span(in), left);
      s.wait();
      RANK_CHECK(holds(in, left, 1));
    });
  }
}

TEST_CASE("queued operations complete whichever thread waits first and in whatever order") {
  // A waiting request runs what is queued before it itself where the worker has not taken
  // it (request::wait): waited last first, from two threads at once, and with the
  // communicator destroyed while another thread waits, every operation still completes in
  // issue order, exactly.
  for (int n : {2, 3}) {
    CAPTURE(n);
    run_ranks(n, [](communicator& comm) {
      const int r = comm.rank();
      const int nn = comm.size();
      constexpr std::size_t k = 6;
      auto expected = [&](std::size_t j) {  // the sum over ranks of (rank + 1) * (j + 1)
        return static_cast<std::int32_t>(j + 1) * nn * (nn + 1) / 2;
      };
      std::vector<std::vector<std::int32_t>> bufs(k, std::vector<std::int32_t>(1000));
      std::vector<request> reqs;
      auto issue = [&](communicator& c) {  // fresh inputs, k all_reduces queued on c
        for (std::size_t j = 0; j < k; ++j) std::fill(bufs[j].begin(), bufs[j].end(), (r + 1) * static_cast<std::int32_t>(j + 1));
        reqs.clear();
        for (std::size_t j = 0; j < k; ++j) reqs.push_back(c.all_reduce_async(std::span(bufs[j])));
      };
      auto all_hold = [&] {
        for (std::size_t j = 0; j < k; ++j) {
          for (std::int32_t v : bufs[j]) {
            if (v != expected(j)) return false;
          }
        }
        return true;
      };

      issue(comm);
      for (std::size_t j = k; j-- > 0;) reqs[j].wait();
      RANK_CHECK(all_hold());

      issue(comm);
      std::thread other([&] { reqs[1].wait(); });
      reqs[k - 1].wait();
      other.join();
      for (auto& q : reqs) q.wait();
      RANK_CHECK(all_hold());

      // A sub-communicator destroyed while another thread still waits on its operations.
      std::thread waiter;
      {
        communicator child = comm.split(0, r).value();
        issue(child);
        waiter = std::thread([&] { reqs[k - 1].wait(); });
      }
      waiter.join();
      for (auto& q : reqs) q.wait();
      RANK_CHECK(all_hold());
    });
  }
}

TEST_CASE("sendrecvs and groups repeated on the same buffers reach the peers each call names") {
  // A repeated call replays its schedules and the executor's plan; one that names another
  // peer, the same size, buffers and tag otherwise, must not.
  for (int n : {3, 5}) {
    CAPTURE(n);
    run_ranks(n, [](communicator& comm) {
      const int r = comm.rank();
      const int nn = comm.size();
      std::vector<std::int32_t> out(1000), in(1000);
      int k = 0;
      for (int shift : {1, 1, 2, 1, nn - 1, 2, 2, 1}) {
        const int to = (r + shift) % nn;
        const int from = (r + nn - shift) % nn;
        out = message(r, k, out.size());
        std::fill(in.begin(), in.end(), -1);
        if (k % 2 == 0) {
          comm.sendrecv(std::span<const std::int32_t>(out), to, std::span(in), from);
        } else {
          comm.group_start();
          comm.send_async(std::span<const std::int32_t>(out), to);
          comm.recv_async(std::span(in), from);
          comm.group_end().wait();
        }
        CAPTURE(shift);
        RANK_CHECK(holds(in, from, k));
        ++k;
      }
    });
  }
}

TEST_CASE("a group of sends and receives around a ring cannot deadlock, however large the messages") {
  for (int n : {2, 3, 8}) {
    CAPTURE(n);
    run_ranks(n, [](communicator& comm) {
      const int r = comm.rank();
      const int nn = comm.size();
      const std::size_t count = 1u << 20;  // 4 MiB each way, more than the socket buffers
      const auto out = message(r, 2, count);
      std::vector<std::int32_t> from_left(count, -1), from_right(count, -1);
      comm.group_start();
      auto a = comm.send_async(std::span<const std::int32_t>(out), (r + 1) % nn);
      auto b = comm.send_async(std::span<const std::int32_t>(out), (r + nn - 1) % nn, {.tag = 1});
      comm.recv_async(std::span(from_left), (r + nn - 1) % nn);
      comm.recv_async(std::span(from_right), (r + 1) % nn, {.tag = 1});
      auto all = comm.group_end();
      all.wait();
      RANK_CHECK(a.test());
      RANK_CHECK(b.test());
      RANK_CHECK(holds(from_left, (r + nn - 1) % nn, 2));
      RANK_CHECK(holds(from_right, (r + 1) % nn, 2));
    }, {.env = {{"CHORUS_TCP_BUFFER", "65536"}}});
  }
}

TEST_CASE("a group runs its collectives before its point-to-point calls on every rank") {
  run_ranks(4, [](communicator& comm) {
    const int r = comm.rank();
    std::vector<float> grads(10000, static_cast<float>(r));
    const auto out = message(r, 3, 100);
    std::vector<std::int32_t> in(100, -1);
    comm.group_start();
    if (r % 2 == 0) {  // even ranks issue the send first, odd ranks the all_reduce first
      comm.send_async(std::span<const std::int32_t>(out), r ^ 1);
      comm.recv_async(std::span(in), r ^ 1);
      comm.all_reduce_async(std::span(grads));
    } else {
      comm.all_reduce_async(std::span(grads));
      comm.recv_async(std::span(in), r ^ 1);
      comm.send_async(std::span<const std::int32_t>(out), r ^ 1);
    }
    comm.group_end().wait();
    RANK_CHECK(holds(in, r ^ 1, 3));
    RANK_CHECK(grads[9999] == 6.0f);
  });
}

TEST_CASE("a blocking call inside a group is refused, and an empty group completes") {
  run_ranks(2, [](communicator& comm) {
    std::vector<float> v(4, 1.0f);
    comm.group_start();
    RANK_CHECK_THROWS_CODE(comm.all_reduce(std::span(v)), errc::invalid_argument);
    comm.group_end().wait();
    comm.group_start();
    comm.group_end().wait();
    comm.all_reduce(std::span(v));
    RANK_CHECK(v[0] == 2.0f);
  });
}

TEST_CASE("send and recv with different tags or counts fail with mismatch, and never hang") {
  for (bool tags : {true, false}) {
    CAPTURE(tags);
    run_ranks(2, [tags](communicator& comm) {
      std::vector<std::int32_t> v(tags ? 8 : (comm.rank() == 0 ? 8 : 9), 0);
      try {
        if (comm.rank() == 0) {
          comm.send(std::span<const std::int32_t>(v), 1, {.tag = 4});
          std::vector<int> x{1};
          comm.all_reduce(std::span(x));  // fails once rank 1 has seen the mismatch
        } else {
          comm.recv(std::span(v), 0, {.tag = tags ? 5 : 4});
        }
        RANK_CHECK(false);
      } catch (const error& e) {
        const bool ok = e.code() == errc::mismatch || e.code() == errc::remote_error ||
                        e.code() == errc::connection_lost;
        if (!ok) std::fprintf(stderr, "unexpected: %s\n", e.what());
        RANK_CHECK(ok);
        if (e.code() == errc::mismatch) {
          const std::string what = e.what();
          RANK_CHECK(what.find(tags ? "tag 5" : "count=9") != std::string::npos);
          RANK_CHECK(what.find(tags ? "tag 4" : "count=8") != std::string::npos);
        }
      }
    }, {.env = {{"CHORUS_TIMEOUT", "20"}}});
  }
}

TEST_CASE("send and recv refuse a bad peer or tag before anything is sent") {
  run_ranks(2, [](communicator& comm) {
    std::vector<float> v(4, 1.0f);
    RANK_CHECK_THROWS_CODE(comm.send(std::span<const float>(v), 2), errc::invalid_argument);
    RANK_CHECK_THROWS_CODE(comm.send(std::span<const float>(v), -1), errc::invalid_argument);
    RANK_CHECK_THROWS_CODE(comm.recv(std::span(v), comm.rank()), errc::invalid_argument);
    RANK_CHECK_THROWS_CODE(comm.send(std::span<const float>(v), 1 - comm.rank(), {.tag = -3}),
                           errc::invalid_argument);
    RANK_CHECK_THROWS_CODE(comm.send(nullptr, 4, dtype::float32, 1 - comm.rank()), errc::invalid_argument);
    comm.all_reduce(std::span(v));  // the communicator is still usable
    RANK_CHECK(v[0] == 2.0f);
  });
}

TEST_CASE("split makes sub-communicators ranked by key that run beside their parent") {
  run_ranks(6, [](communicator& comm) {
    const int r = comm.rank();
    // Two groups by parity, ranked in reverse.
    auto sub = comm.split(r % 2, -r);
    RANK_CHECK(sub.has_value());
    RANK_CHECK(sub->size() == 3);
    RANK_CHECK(sub->rank() == 2 - r / 2);
    // The child and the parent work at the same time.
    std::vector<double> big(1 << 16, 1.0);
    auto parent_op = comm.all_reduce_async(std::span(big));
    std::vector<int> v{r};
    sub->all_reduce(std::span(v));
    RANK_CHECK(v[0] == (r % 2 == 0 ? 0 + 2 + 4 : 1 + 3 + 5));
    std::vector<int> gathered(3);
    sub->all_gather(std::span<const int>(v.data(), 1), std::span(gathered));
    RANK_CHECK(gathered[2] == v[0]);
    parent_op.wait();
    RANK_CHECK(big[0] == 6.0);
    // A rank with a negative color joins nothing; a child can split again.
    auto none = comm.split(r == 0 ? -1 : 0, r);
    RANK_CHECK(none.has_value() == (r != 0));
    if (none) {
      RANK_CHECK(none->size() == 5);
      auto pair = none->split(none->rank() / 2, 0);
      RANK_CHECK(pair.has_value());
      std::vector<int> one{1};
      pair->all_reduce(std::span(one));
      RANK_CHECK(one[0] == (none->rank() == 4 ? 1 : 2));
    }
    comm.barrier();
  });
}

TEST_CASE("two threads splitting two communicators at once both finish") {
  // Every split view talks to the job's store over one connection, and each rank's two
  // threads start their splits in a different order. When one thread's set-up waits in the
  // store for a peer whose other thread holds that peer's connection in a wait of its own,
  // each view must give the connection up while it waits, or both waits run to the bootstrap
  // deadline. (Whether the threads meet that way depends on timing; bootstrap_test's
  // two-groups case sets it up every time.)
  chorus::test::run_options o;
  o.env["CHORUS_BOOTSTRAP_TIMEOUT"] = "20";
  run_ranks(4, [](communicator& comm) {
    const int r = comm.rank();
    auto a = comm.split(0, r);
    auto b = comm.split(0, -r);
    RANK_CHECK((a && b));
    std::optional<communicator> a2, b2;
    const auto late = std::chrono::milliseconds(200);
    std::thread other([&] {
      if (r % 2 == 0) std::this_thread::sleep_for(late);
      b2 = b->split(r / 2, r);
    });
    if (r % 2 == 1) std::this_thread::sleep_for(late);
    a2 = a->split(r % 2, r);
    other.join();
    RANK_CHECK((a2 && b2));
    std::vector<int> va{r}, vb{r};
    std::thread other_sum([&] { b2->all_reduce(std::span(vb)); });
    a2->all_reduce(std::span(va));
    other_sum.join();
    RANK_CHECK(va[0] == (r % 2 == 0 ? 0 + 2 : 1 + 3));
    RANK_CHECK(vb[0] == (r / 2 == 0 ? 0 + 1 : 2 + 3));
    comm.barrier();
  }, o);
}
