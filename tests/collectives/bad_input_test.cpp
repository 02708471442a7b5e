// SPDX-License-Identifier: Apache-2.0
// Bad input gets a clear chorus::error, never a hang: sizes, pointers, env, peers.
#include <doctest/doctest.h>

#include <cstdlib>
#include <functional>
#include <string>
#include <limits>
#include <vector>

#include "support/multirank.hpp"

using namespace chorus;
using chorus::test::run_ranks;

TEST_CASE("counts that differ across ranks fail with mismatch on the ranks that see it, and no rank hangs") {
  for (int n : {2, 3, 4}) {
    CAPTURE(n);
    for (algo a : {algo::ring, algo::recursive_doubling}) {
      run_ranks(n, [a](communicator& comm) {
        std::vector<float> v(comm.rank() == 1 ? 20 : 10, 1.0f);
        try {
          comm.all_reduce(std::span(v), {.algorithm = a});
          RANK_CHECK(false);  // nobody may succeed with mismatched counts
        } catch (const error& e) {
          // A rank that compared headers says mismatch and names both calls; the others
          // learn of it from the abort frame (remote_error) or the closed connection.
          const bool ok = e.code() == errc::mismatch || e.code() == errc::remote_error ||
                          e.code() == errc::connection_lost;
          if (!ok) std::fprintf(stderr, "unexpected: %s\n", e.what());
          RANK_CHECK(ok);
          if (e.code() == errc::mismatch) {
            RANK_CHECK(std::string(e.what()).find("count=20") != std::string::npos);
            RANK_CHECK(std::string(e.what()).find("count=10") != std::string::npos);
          }
        }
        // Once failed, the communicator refuses further work instead of hanging.
        bool refused = false;
        try {
          comm.all_reduce(std::span(v));
        } catch (const error&) {
          refused = true;
        }
        RANK_CHECK(refused);
      }, {.deadline = std::chrono::seconds(60), .env = {{"CHORUS_TIMEOUT", "20"}}});
    }
  }
}

namespace {

/// Rank 1 issues a different call than everyone else; every rank must fail, none may hang,
/// and at least one must say mismatch.
void expect_mismatch(int n, const std::function<void(communicator&, bool odd)>& call) {
  run_ranks(n, [&](communicator& comm) {
    errc code = errc::aborted;
    try {
      call(comm, comm.rank() == 1);
    } catch (const error& e) {
      code = e.code();
      std::fprintf(stderr, "[rank %d] %s\n", comm.rank(), e.what());
    }
    RANK_CHECK(code == errc::mismatch || code == errc::remote_error || code == errc::connection_lost);
    // Tell rank 0 whether anyone saw the mismatch itself: the store is independent of the
    // failed data path.
  }, {.deadline = std::chrono::seconds(60), .env = {{"CHORUS_TIMEOUT", "20"}}});
}

}  // namespace

TEST_CASE("a different dtype, op, collective or order on one rank is a mismatch, not corrupt data") {
  SUBCASE("dtype") {
    expect_mismatch(3, [](communicator& comm, bool odd) {
      std::vector<std::int32_t> i(8, 1);
      std::vector<float> f(8, 1.0f);
      if (odd) comm.all_reduce(std::span(i)); else comm.all_reduce(std::span(f));
    });
  }
  SUBCASE("op") {
    expect_mismatch(2, [](communicator& comm, bool odd) {
      std::vector<float> f(8, 1.0f);
      comm.all_reduce(std::span(f), {.op = odd ? max : sum});
    });
  }
  SUBCASE("collective") {
    expect_mismatch(2, [](communicator& comm, bool odd) {
      std::vector<float> a(8, 1.0f), b(16);
      if (odd) comm.all_gather(std::span<const float>(a), std::span(b));
      else comm.reduce_scatter(std::span<const float>(b), std::span(a));
    });
  }
  SUBCASE("an extra operation on one rank") {
    expect_mismatch(4, [](communicator& comm, bool odd) {
      std::vector<float> a(1000, 1.0f);
      std::vector<float> b(3000, 1.0f);
      if (odd) comm.all_reduce(std::span(b));
      comm.all_reduce(std::span(a));
      comm.all_reduce(std::span(a));
    });
  }
}

TEST_CASE("bad arguments are rejected with invalid_argument before anything is sent") {
  run_ranks(2, [](communicator& comm) {
    std::vector<float> f(8);
    std::vector<int> i(8);
    const std::size_t huge = std::numeric_limits<std::size_t>::max() / 2;
    RANK_CHECK_THROWS_CODE(comm.all_reduce(nullptr, nullptr, 5, dtype::float32), errc::invalid_argument);
    RANK_CHECK_THROWS_CODE(comm.all_reduce(f.data(), f.data(), huge, dtype::float32), errc::invalid_argument);
    RANK_CHECK_THROWS_CODE(comm.all_gather(f.data(), f.data(), huge, dtype::float64), errc::invalid_argument);
    RANK_CHECK_THROWS_CODE(comm.all_reduce(std::span(i), {.op = avg}), errc::invalid_argument);
    RANK_CHECK_THROWS_CODE(comm.all_reduce(std::span<const float>(f), std::span(f).first(7)), errc::invalid_argument);
    RANK_CHECK_THROWS_CODE(comm.reduce_scatter(std::span<const float>(f), std::span(f).first(3)), errc::invalid_argument);
    RANK_CHECK_THROWS_CODE(comm.all_gather(std::span<const float>(f).first(4), std::span(f).first(7)), errc::invalid_argument);
    RANK_CHECK_THROWS_CODE(comm.all_reduce(f.data(), f.data() + 1, 4, dtype::float32), errc::invalid_argument);
    // reduce_scatter in place means out == in + rank * count; out == in is that only on rank 0.
    if (comm.rank() != 0) {
      RANK_CHECK_THROWS_CODE(comm.reduce_scatter(f.data(), f.data(), 4, dtype::float32), errc::invalid_argument);
    }
    // all_gather in place means in == out + rank * count.
    if (comm.rank() != 0) {
      RANK_CHECK_THROWS_CODE(comm.all_gather(f.data(), f.data(), 4, dtype::float32), errc::invalid_argument);
    }
    RANK_CHECK_THROWS_CODE(comm.all_reduce(f.data(), f.data(), 4, static_cast<dtype>(77)), errc::invalid_argument);
    RANK_CHECK_THROWS_CODE(comm.all_reduce(f.data(), f.data(), 4, dtype::float32, {.op = static_cast<reduce_op>(9)}), errc::invalid_argument);
    RANK_CHECK_THROWS_CODE(comm.all_gather(std::span<const float>(f).first(4), std::span(f), {.algorithm = algo::tree}), errc::invalid_argument);
    // None of that consumed an operation: the ranks still agree and work.
    std::vector<float> ok(3, 1.0f);
    comm.all_reduce(std::span(ok));
    RANK_CHECK(ok[2] == 2.0f);
  });
}

TEST_CASE("bad CHORUS_ environment variables are errors that name the variable") {
  struct bad { const char* name; const char* value; };
  for (bad b : {bad{"CHORUS_TIMEOUT", "abc"}, bad{"CHORUS_TIMEOUT", "-3"}, bad{"CHORUS_ALGO", "bogus"},
                bad{"CHORUS_SLICE_BYTES", "12x"}, bad{"CHORUS_SLICES_IN_FLIGHT", "0"},
                bad{"CHORUS_TCP_CONNS", "99"}}) {
    CAPTURE(b.name);
    CAPTURE(b.value);
    ::setenv(b.name, b.value, 1);
    try {
      (void)communicator_options::from_env();
      (void)tcp_options::from_env();
      FAIL_CHECK("no error");
    } catch (const error& e) {
      CHECK(e.code() == errc::invalid_argument);
      CHECK(std::string(e.what()).find(b.name) != std::string::npos);
    }
    ::unsetenv(b.name);
  }
}

TEST_CASE("an unreachable master is a bootstrap error naming its address, within the deadline") {
  const int port = test::free_port();
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setenv("CHORUS_RANK", "1", 1);
    ::setenv("CHORUS_WORLD_SIZE", "2", 1);
    ::setenv("CHORUS_MASTER_ADDR", "127.0.0.1", 1);
    ::setenv("CHORUS_MASTER_PORT", std::to_string(port).c_str(), 1);
    ::setenv("CHORUS_BOOTSTRAP_TIMEOUT", "1", 1);
    int code = 3;
    try {
      (void)communicator::from_env<tcp_transport>();
    } catch (const error& e) {
      const bool names = std::string(e.what()).find(std::to_string(port)) != std::string::npos;
      std::fprintf(stderr, "%s\n", e.what());
      code = (e.code() == errc::bootstrap || e.code() == errc::timeout) && names ? 0 : 2;
    }
    ::_exit(code);
  }
  int st = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (;;) {
    if (::waitpid(pid, &st, WNOHANG) == pid) break;
    if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(20)) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &st, 0);
      FAIL("rank hung waiting for an unreachable master");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  CHECK(WIFEXITED(st));
  CHECK(WEXITSTATUS(st) == 0);
}

TEST_CASE("a peer that exits early turns the survivors' operation into an error naming it") {
  run_ranks(3, [](communicator& comm) {
    if (comm.rank() == 2) ::_exit(0);  // leaves without a word
    std::vector<float> v(100000, 1.0f);
    try {
      comm.all_reduce(std::span(v));
      RANK_CHECK(false);
    } catch (const error& e) {
      std::fprintf(stderr, "[rank %d] %s\n", comm.rank(), e.what());
      RANK_CHECK(e.code() == errc::connection_lost || e.code() == errc::remote_error);
      RANK_CHECK(std::string(e.what()).find("rank 2") != std::string::npos);
    }
  }, {.deadline = std::chrono::seconds(60), .env = {{"CHORUS_TIMEOUT", "20"}}});
}
