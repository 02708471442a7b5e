// SPDX-License-Identifier: Apache-2.0
// Bad input gets a clear chorus::error, never a hang: sizes, pointers, roots, counts,
// algorithms, env, peers, and calls that differ across ranks.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "collectives/shared_counters.hpp"
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
  test::shared_counters said_mismatch(1);  // the ranks whose own error was the mismatch
  run_ranks(n, [&](communicator& comm) {
    errc code = errc::aborted;
    try {
      call(comm, comm.rank() == 1);
    } catch (const error& e) {
      code = e.code();
      std::fprintf(stderr, "[rank %d] %s\n", comm.rank(), e.what());
    }
    RANK_CHECK(code == errc::mismatch || code == errc::remote_error || code == errc::connection_lost);
    if (code == errc::mismatch) ++said_mismatch[0];
  }, {.deadline = std::chrono::seconds(60), .env = {{"CHORUS_TIMEOUT", "20"}}});
  CHECK_MESSAGE(said_mismatch[0].load() > 0, "no rank failed with errc::mismatch");
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

TEST_CASE("ranks that wait for each other in calls that differ fail with mismatch, not at their timeouts") {
  // Roots that differ: at 2 ranks each waits to receive from the other, and no frame is
  // ever sent. The wait's check frames name the calls (CHORUS_TIMEOUT is 20 s here, and a
  // timeout is not among the errors expect_mismatch accepts).
  for (int n : {2, 3}) {
    for (algo a : {algo::chain, algo::binomial}) {
      const std::string algorithm(to_string(a));
      CAPTURE(n);
      CAPTURE(algorithm);
      expect_mismatch(n, [a](communicator& comm, bool odd) {
        std::vector<float> v(1000, 1.0f);
        comm.broadcast(std::span(v), odd ? 0 : 1, {.algorithm = a});
      });
    }
  }
}

TEST_CASE("a rank that comes late to the same call is waited for, however many checks its peers send") {
  run_ranks(3, [](communicator& comm) {
    // The others wait about 1.5 s: check frames at 0.25, 0.75 s and later, all of the same call.
    if (comm.rank() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    std::vector<float> v(1000, comm.rank() == 0 ? 3.0f : 0.0f);
    comm.broadcast(std::span(v), 0);
    RANK_CHECK(std::all_of(v.begin(), v.end(), [](float x) { return x == 3.0f; }));
    if (comm.rank() == 2) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    std::vector<float> w(4096, 1.0f);
    comm.all_reduce(std::span(w));
    RANK_CHECK(std::all_of(w.begin(), w.end(), [](float x) { return x == 3.0f; }));
  }, {.deadline = std::chrono::seconds(60), .env = {{"CHORUS_TIMEOUT", "20"}}});
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
  // late: rank 0 calls only after rank 1 has failed on rank 2, reported it and left.
  for (const bool late : {false, true}) {
    CAPTURE(late);
    run_ranks(3, [late](communicator& comm) {
      if (comm.rank() == 2) ::_exit(0);  // leaves without a word
      if (late && comm.rank() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(500));
      std::vector<float> v(100000, 1.0f);
      try {
        comm.all_reduce(std::span(v));
        RANK_CHECK(false);
      } catch (const error& e) {
        std::fprintf(stderr, "[rank %d] %s\n", comm.rank(), e.what());
        RANK_CHECK(e.code() == errc::connection_lost || e.code() == errc::peer_failed);
        RANK_CHECK(e.ranks() == std::vector<int>{2});
        RANK_CHECK(std::string(e.what()).find("rank 2") != std::string::npos);
      }
    }, {.deadline = std::chrono::seconds(60), .env = {{"CHORUS_TIMEOUT", "20"}}});
  }
}

// --- rooted collectives, all_to_all(v) and algorithm choices -----------------------------

namespace {

/// A collective every rank can check after a refused call: it runs only if the refusal
/// consumed nothing (no operation number, no message), since the ranks must still agree.
void still_works(communicator& comm) {
  const int root = comm.size() - 1;
  std::vector<std::int32_t> v(1000, comm.rank() == root ? 17 : -1);
  comm.broadcast(std::span(v), root);
  RANK_CHECK(v[0] == 17 && v[999] == 17);
  std::vector<std::int32_t> one{1};
  comm.all_reduce(std::span(one));
  RANK_CHECK(one[0] == comm.size());
}

/// Asserts that `expr` throws errc::invalid_argument whose message contains `needle`.
#define RANK_CHECK_REFUSED_NAMING(expr, needle)                                              \
  do {                                                                                    \
    bool named_ = false;                                                                  \
    try {                                                                                 \
      expr;                                                                               \
    } catch (const ::chorus::error& e_) {                                                 \
      named_ = e_.code() == errc::invalid_argument && std::string(e_.what()).find(needle) != std::string::npos; \
      if (!named_) std::fprintf(stderr, "[rank %d] %s: %s\n", comm.rank(), #expr, e_.what()); \
    }                                                                                     \
    if (!named_) std::fprintf(stderr, "[rank %d] %s:%d: %s not refused naming '%s'\n",      \
                              comm.rank(), __FILE__, __LINE__, #expr, std::string(needle).c_str()); \
    RANK_CHECK(named_);                                                                   \
  } while (0)

}  // namespace

TEST_CASE("a root outside the communicator, or negative, is invalid_argument for every rooted call, and consumes nothing") {
  for (int n : {1, 3}) {
    CAPTURE(n);
    run_ranks(n, [](communicator& comm) {
      const auto nn = static_cast<std::size_t>(comm.size());
      std::vector<float> data(8, 1.0f), big(8 * nn);
      for (int root : {comm.size(), -1, comm.size() + 7, std::numeric_limits<int>::min()}) {
        const std::string says = "root " + std::to_string(root) + " is not a rank";
        RANK_CHECK_REFUSED_NAMING(comm.broadcast(std::span(data), root), says);
        RANK_CHECK_REFUSED_NAMING(comm.broadcast_async(std::span(data), root), says);
        RANK_CHECK_REFUSED_NAMING(comm.reduce(std::span(data), root), says);
        RANK_CHECK_REFUSED_NAMING(comm.reduce(std::span<const float>(data), std::span(big).first(8), root), says);
        RANK_CHECK_REFUSED_NAMING(comm.reduce_async(std::span<const float>(data), std::span(big).first(8), root), says);
        RANK_CHECK_REFUSED_NAMING(comm.gather(std::span<const float>(data), std::span(big), root), says);
        RANK_CHECK_REFUSED_NAMING(comm.gather_async(std::span<const float>(data), std::span(big), root), says);
        RANK_CHECK_REFUSED_NAMING(comm.scatter(std::span<const float>(big), std::span(data), root), says);
        RANK_CHECK_REFUSED_NAMING(comm.scatter_async(std::span<const float>(big), std::span(data), root), says);
        RANK_CHECK_REFUSED_NAMING(comm.broadcast(data.data(), data.data(), 8, dtype::float32, root), says);
        RANK_CHECK_REFUSED_NAMING(comm.gather(data.data(), big.data(), 8, dtype::float32, root), says);
      }
      still_works(comm);
    });
  }
}

TEST_CASE("an algorithm a collective does not have is invalid_argument naming the ones it has") {
  run_ranks(2, [](communicator& comm) {
    std::vector<float> a(8, 1.0f), b(16), c(8), d(16);
    const std::vector<std::size_t> counts{4, 4};
    RANK_CHECK_REFUSED_NAMING(comm.broadcast(std::span(a), 0, {.algorithm = algo::ring}), "it has chain, binomial");
    RANK_CHECK_REFUSED_NAMING(comm.reduce(std::span(a), 0, {.algorithm = algo::direct}), "it has chain, binomial");
    RANK_CHECK_REFUSED_NAMING(comm.gather(std::span<const float>(a), std::span(b), 0, {.algorithm = algo::chain}), "it has direct, binomial");
    RANK_CHECK_REFUSED_NAMING(comm.scatter(std::span<const float>(b), std::span(a), 0, {.algorithm = algo::tree}), "it has direct, binomial");
    RANK_CHECK_REFUSED_NAMING(comm.all_to_all(std::span<const float>(b), std::span(d), {.algorithm = algo::bruck}), "it has direct");
    RANK_CHECK_REFUSED_NAMING(comm.all_to_allv(std::span<const float>(a), std::span<const std::size_t>(counts), std::span(c),
                                               std::span<const std::size_t>(counts), {.algorithm = algo::ring}), "it has direct");
    RANK_CHECK_REFUSED_NAMING(comm.all_reduce(std::span(a), {.algorithm = algo::bruck}), "all_reduce has no bruck algorithm");
    RANK_CHECK_REFUSED_NAMING(comm.reduce_scatter(std::span<const float>(b), std::span(a), {.algorithm = algo::recursive_doubling}),
                              "reduce_scatter has no recursive_doubling algorithm");
    RANK_CHECK_REFUSED_NAMING(comm.all_gather(std::span<const float>(a), std::span(b), {.algorithm = algo::dissemination}),
                              "all_gather has no dissemination algorithm");
    RANK_CHECK_REFUSED_NAMING(comm.broadcast(std::span(a), 0, {.algorithm = static_cast<algo>(200)}), "has no");
    still_works(comm);
  });
}

TEST_CASE("typed rooted and all_to_all calls check their spans' sizes where the rank uses them") {
  run_ranks(3, [](communicator& comm) {
    const bool root = comm.rank() == 0;
    std::vector<float> a(8, 1.0f), b(24), c(23), d(24);
    RANK_CHECK_REFUSED_NAMING(comm.all_to_all(std::span<const float>(c), std::span(c)), "3 equal blocks, not 23 and 23");
    RANK_CHECK_REFUSED_NAMING(comm.all_to_all(std::span<const float>(b), std::span(d).first(21)), "not 24 and 21");
    RANK_CHECK_REFUSED_NAMING(comm.all_to_all_async(std::span<const float>(b).first(21), std::span(d)), "not 21 and 24");
    if (root) {  // the root's buffers only: the others' are not looked at
      RANK_CHECK_REFUSED_NAMING(comm.reduce(std::span<const float>(a), std::span(b).first(7), 0), "buffer sizes do not match");
      RANK_CHECK_REFUSED_NAMING(comm.gather(std::span<const float>(a), std::span(c), 0), "23 elements where 8 x 3");
      RANK_CHECK_REFUSED_NAMING(comm.scatter_async(std::span<const float>(c), std::span(a), 0), "23 elements where 8 x 3");
    }
    // The same calls are fine where the rank is not the root: their big buffers are unused.
    comm.reduce(std::span<const float>(a), std::span(b).first(root ? 8 : 7), 0);
    comm.gather(std::span<const float>(a), root ? std::span(b) : std::span(c), 0);
    if (root) RANK_CHECK(b[23] == 1.0f);
    comm.scatter(root ? std::span<const float>(b) : std::span<const float>(c), std::span(a), 0);
    RANK_CHECK(a[7] == 1.0f);
    still_works(comm);
  });
}

TEST_CASE("all_to_allv counts of the wrong length, or that disagree with the buffers or with themselves, are invalid_argument") {
  run_ranks(3, [](communicator& comm) {
    const auto me = static_cast<std::size_t>(comm.rank());
    std::vector<float> in(30, 1.0f), out(30);
    const std::vector<std::size_t> two{10, 20}, four{5, 5, 10, 10}, three{10, 10, 10};
    auto v = [](const std::vector<std::size_t>& c) { return std::span<const std::size_t>(c); };
    RANK_CHECK_REFUSED_NAMING(comm.all_to_allv(std::span<const float>(in), v(two), std::span(out), v(three)), "one send and one receive count per rank (3)");
    RANK_CHECK_REFUSED_NAMING(comm.all_to_allv(std::span<const float>(in), v(three), std::span(out), v(four)), "not 3 and 4");
    RANK_CHECK_REFUSED_NAMING(comm.all_to_allv_async(std::span<const float>(in), v(four), std::span(out), v(four)), "not 4 and 4");
    RANK_CHECK_REFUSED_NAMING(comm.all_to_allv(in.data(), v(two), out.data(), v(two), dtype::float32), "not 2 and 2");
    // The counts must describe the buffers exactly.
    RANK_CHECK_REFUSED_NAMING(comm.all_to_allv(std::span<const float>(in).first(29), v(three), std::span(out), v(three)), "add up to 30");
    // What we send ourselves is what we expect from ourselves.
    std::vector<std::size_t> self = three;
    self[me] = 9;
    self[(me + 1) % 3] = 11;
    RANK_CHECK_REFUSED_NAMING(comm.all_to_allv(std::span<const float>(in), v(self), std::span(out), v(three)), "sends itself 9 elements but expects 10");
    // A count list whose sum overflows.
    const std::vector<std::size_t> huge{std::numeric_limits<std::size_t>::max() / 2, std::numeric_limits<std::size_t>::max() / 2, 2};
    RANK_CHECK_THROWS_CODE(comm.all_to_allv(in.data(), v(huge), out.data(), v(huge), dtype::float32), errc::invalid_argument);
    // Of one-byte elements too, with either buffer first: the sum saturates at SIZE_MAX bytes,
    // which once passed for them, and broke the communicator in the executor.
    std::vector<std::uint8_t> bytes(64);
    std::vector<std::size_t> wrapping(3, std::size_t{1} << 63);
    wrapping[me] = 1;
    for (auto [a, b] : {std::pair{bytes.data(), bytes.data() + 32}, std::pair{bytes.data() + 32, bytes.data()}}) {
      RANK_CHECK_REFUSED_NAMING(comm.all_to_allv(a, v(wrapping), b, v(wrapping), dtype::uint8), "the counts overflow the buffer size");
    }
    still_works(comm);
  });
}

TEST_CASE("all_to_all and all_to_allv refuse to run in place or on overlapping buffers") {
  run_ranks(3, [](communicator& comm) {
    std::vector<std::int32_t> buf(30, 1);
    const std::vector<std::size_t> counts{10, 10, 10};
    auto c = std::span<const std::size_t>(counts);
    RANK_CHECK_REFUSED_NAMING(comm.all_to_all(buf.data(), buf.data(), 10, dtype::int32), "all_to_all does not run in place");
    RANK_CHECK_REFUSED_NAMING(comm.all_to_all_async(buf.data(), buf.data() + 5, 5, dtype::int32), "does not run in place");
    RANK_CHECK_REFUSED_NAMING(comm.all_to_allv(buf.data(), c, buf.data(), c, dtype::int32), "all_to_allv does not run in place");
    still_works(comm);
  });
}

TEST_CASE("overlapping buffers that are not broadcast's, reduce's, gather's or scatter's in-place form are refused") {
  run_ranks(3, [](communicator& comm) {
    // Every rank is root of its own refused call here, so each refuses on its own.
    const int root = comm.rank();
    std::vector<float> buf(64, 1.0f);
    float* p = buf.data();
    RANK_CHECK_REFUSED_NAMING(comm.broadcast(p, p + 1, 8, dtype::float32, root), "overlap without being in place");
    RANK_CHECK_REFUSED_NAMING(comm.reduce(p + 3, p, 8, dtype::float32, root), "overlap without being in place");
    // gather in place is in == out + root * block; scatter's is out == in + root * block.
    RANK_CHECK_REFUSED_NAMING(comm.gather(p + root * 4 + 1, p, 4, dtype::float32, root), "overlap without being in place");
    RANK_CHECK_REFUSED_NAMING(comm.gather(p + ((root + 1) % 3) * 4, p, 4, dtype::float32, root), "overlap without being in place");
    RANK_CHECK_REFUSED_NAMING(comm.scatter(p, p + root * 4 + 2, 4, dtype::float32, root), "overlap without being in place");
    RANK_CHECK_REFUSED_NAMING(comm.scatter(p, p + ((root + 2) % 3) * 4, 4, dtype::float32, root), "overlap without being in place");
    still_works(comm);
  });
}

TEST_CASE("a null buffer the rank needs is refused on that rank alone, and its peers, which made no call, still agree with it") {
  run_ranks(3, [](communicator& comm) {
    const bool root = comm.rank() == 1;
    std::vector<float> buf(12, 1.0f);
    // Only rank 1 makes the refused calls; the others make none. Had a refusal taken an
    // operation number, the collectives after it would not match.
    if (root) {
      RANK_CHECK_REFUSED_NAMING(comm.broadcast(nullptr, buf.data(), 4, dtype::float32, 1), "input is null but holds 4 elements");
      RANK_CHECK_REFUSED_NAMING(comm.broadcast(buf.data(), nullptr, 4, dtype::float32, 1), "output is null but holds 4 elements");
      RANK_CHECK_REFUSED_NAMING(comm.reduce(buf.data(), nullptr, 4, dtype::float32, 1), "output is null but holds 4 elements");
      RANK_CHECK_REFUSED_NAMING(comm.reduce_async(nullptr, buf.data(), 4, dtype::float32, 1), "input is null");
      RANK_CHECK_REFUSED_NAMING(comm.gather(buf.data(), nullptr, 4, dtype::float32, 1), "output is null but holds 12 elements");
      RANK_CHECK_REFUSED_NAMING(comm.scatter(nullptr, buf.data(), 4, dtype::float32, 1), "input is null but holds 12 elements");
      RANK_CHECK_REFUSED_NAMING(comm.all_to_all(nullptr, buf.data(), 4, dtype::float32), "input is null");
    } else {
      // A non-root needs no input for broadcast and no output for reduce or gather, but it
      // needs its own input of reduce and gather and its output of scatter.
      RANK_CHECK_REFUSED_NAMING(comm.reduce(nullptr, nullptr, 4, dtype::float32, 1), "input is null but holds 4 elements");
      RANK_CHECK_REFUSED_NAMING(comm.gather(nullptr, nullptr, 4, dtype::float32, 1), "input is null but holds 4 elements");
      RANK_CHECK_REFUSED_NAMING(comm.scatter(nullptr, nullptr, 4, dtype::float32, 1), "output is null but holds 4 elements");
      RANK_CHECK_REFUSED_NAMING(comm.broadcast(nullptr, nullptr, 4, dtype::float32, 1), "output is null but holds 4 elements");
    }
    still_works(comm);
    // And the calls that pass null where the API allows it run.
    std::vector<float> got(4, -1.0f);
    comm.broadcast(root ? buf.data() : nullptr, got.data(), 4, dtype::float32, 1);
    RANK_CHECK(got[3] == 1.0f);
    comm.reduce(buf.data(), root ? got.data() : nullptr, 4, dtype::float32, 1);
    if (root) RANK_CHECK(got[3] == 3.0f);
    // In place on the root (its block of the output is its input), no output elsewhere.
    comm.gather(root ? buf.data() + 4 : buf.data(), root ? buf.data() : nullptr, 4, dtype::float32, 1, {.algorithm = algo::binomial});
    RANK_CHECK(buf[11] == 1.0f);
    comm.scatter(root ? buf.data() : nullptr, got.data(), 4, dtype::float32, 1);
    RANK_CHECK(got[0] == 1.0f);
  });
}

TEST_CASE("a blocking call refused inside a group on one rank only consumes nothing") {
  run_ranks(3, [](communicator& comm) {
    std::vector<float> v(4, 1.0f);
    if (comm.rank() == 0) {
      comm.group_start();
      RANK_CHECK_REFUSED_NAMING(comm.broadcast(std::span(v), 0), "a blocking call inside a group");
      std::vector<float> w(3);
      RANK_CHECK_REFUSED_NAMING(comm.all_to_all(std::span<const float>(v).first(3), std::span(w)), "a blocking call inside a group");
      RANK_CHECK_REFUSED_NAMING(comm.send(std::span<const float>(v), 1), "a blocking call inside a group");
      comm.group_end().wait();
    }
    still_works(comm);
    // The pair 0 -> 1 still agrees on its message numbers.
    if (comm.rank() == 0) comm.send(std::span<const float>(v), 1);
    if (comm.rank() == 1) comm.recv(std::span(v), 0);
    RANK_CHECK(v[0] == 1.0f);
  });
}

TEST_CASE("an invalid call inside a group is refused at once, and the rest of the group runs") {
  run_ranks(3, [](communicator& comm) {
    std::vector<float> v(100, comm.rank() == 0 ? 3.0f : -1.0f), w(100, 1.0f);
    comm.group_start();
    auto b = comm.broadcast_async(std::span(v), 0);
    if (comm.rank() == 2) {  // one rank alone adds calls that are refused
      RANK_CHECK_REFUSED_NAMING(comm.broadcast_async(std::span(w), 3), "root 3 is not a rank");
      RANK_CHECK_REFUSED_NAMING(comm.reduce_async(w.data(), w.data(), w.size(), dtype::float32, 0, {.algorithm = algo::ring}), "reduce has no ring algorithm");
      RANK_CHECK_REFUSED_NAMING(comm.send_async(std::span<const float>(w), 2), "cannot send to or receive from itself");
    }
    auto r = comm.all_reduce_async(std::span(w));
    comm.group_end().wait();
    RANK_CHECK(b.test() && r.test());
    RANK_CHECK(v[99] == 3.0f && w[99] == 3.0f);
    RANK_CHECK_THROWS_CODE(comm.group_end(), errc::invalid_argument);  // no group is open
    still_works(comm);
  });
}

TEST_CASE("waiting on a grouped operation before group_end, or after its communicator went inside the group, fails instead of hanging") {
  run_ranks(2, [](communicator& comm) {
    std::vector<float> v(16, 1.0f);
    comm.group_start();
    auto early = comm.all_reduce_async(std::span(v));
    RANK_CHECK_REFUSED_NAMING(early.wait(), "a group that has not ended: call group_end() first");
    RANK_CHECK(!early.test());
    comm.group_end().wait();
    early.wait();
    RANK_CHECK(v[15] == 2.0f);
    // A communicator destroyed with its group open: the group's requests end, failing.
    request orphan;
    {
      std::optional<communicator> sub = comm.split(0, comm.rank());
      RANK_CHECK(sub.has_value());
      sub->group_start();
      orphan = sub->all_reduce_async(std::span(v));
    }
    RANK_CHECK_REFUSED_NAMING(orphan.wait(), "destroyed inside a group");
    still_works(comm);
  });
}

TEST_CASE("a bad CHORUS_ALGO fails communicator creation with invalid_argument naming it") {
  struct bad { const char* value; const char* names; };
  for (bad b : {bad{"allreduce:bogus", "'bogus' is not an algorithm"}, bad{"bogus:ring", "'bogus' is not a collective"},
                bad{"allgather:tree", "all_gather has no tree algorithm"}, bad{"broadcast:ring", "broadcast has no ring algorithm"},
                bad{"gather:chain;scatter:direct", "gather has no chain algorithm"}, bad{"alltoall", "not an algorithm"},
                bad{"reduce", "not an algorithm"}, bad{"allreduce=ring", "not an algorithm"}}) {
    CAPTURE(b.value);
    run_ranks(2, [b](communicator& comm) {
      // Every rank creates a second communicator, as a job would at start: it must fail
      // before any rank waits on another.
      ::setenv("CHORUS_ALGO", b.value, 1);
      bool named = false;
      try {
        (void)communicator::from_env<auto_transport>();
      } catch (const error& e) {
        const std::string what = e.what();
        named = e.code() == errc::invalid_argument && what.find("CHORUS_ALGO") != std::string::npos &&
                what.find(b.names) != std::string::npos;
        if (!named) std::fprintf(stderr, "[rank %d] %s\n", comm.rank(), e.what());
      }
      RANK_CHECK(named);
      ::unsetenv("CHORUS_ALGO");
      still_works(comm);
    });
  }
}

namespace {

/// Runs `call` on every rank, where some ranks' arguments differ from the others'. Each rank
/// either fails the call itself (mismatch where it compared, remote_error or connection_lost
/// where a peer told it or left, peer_failed where the heartbeat said a peer failed), or
/// finishes it (it only sent, or its tree never read from the disagreeing rank) and then
/// fails its next all_reduce. Where `in_call` is false, the
/// first failure may come only in that all_reduce, and it may still succeed on ranks that do
/// not read the leftover frames, the failing rank having sent its share before it read one;
/// then the all_reduce after it fails, for the failed rank contributes nothing to it. So
/// there the next two all_reduces are run. No rank hangs, and at least one rank fails with
/// errc::mismatch naming both calls (every string in `names`): in the call itself where
/// `in_call`, else in the call or after it, where a leftover frame or a peer's abort meets
/// this rank's record of the call.
///
/// The next all_reduce is the direct one, whatever the tuner would pick: it sends to every
/// rank, so a rank still waiting in the mismatched call meets its frame. A ring may send
/// only to a rank that is not reading from this one: with different roots for reduce
/// (binomial) or gather, ranks 0 and 1 then wait on each other and the rank that finished
/// waits on rank 1, and only CHORUS_TIMEOUT ends it (errc::timeout; seen with
/// CHORUS_ALGO=allreduce:ring).
void expect_mismatch_naming(int n, const std::function<void(communicator&)>& call,
                            const std::vector<std::string>& names,
                            const std::map<std::string, std::string>& env = {}, bool in_call = true) {
  // Per rank: 1 + the errc of the call (0: it finished), 1 if it said mismatch naming both,
  // and 1 + the errc of the next calls where the first finished.
  test::shared_counters board(3 * static_cast<std::size_t>(n));
  auto allowed = [](errc c) {
    return c == errc::mismatch || c == errc::remote_error || c == errc::connection_lost || c == errc::peer_failed;
  };
  std::map<std::string, std::string> e = env;
  e.emplace("CHORUS_TIMEOUT", "10");
  auto names_both = [&](const error& err) {
    bool all = err.code() == errc::mismatch;
    for (const auto& s : names) all = all && std::string(err.what()).find(s) != std::string::npos;
    return all;
  };
  run_ranks(n, [&](communicator& comm) {
    const auto at = 3 * static_cast<std::size_t>(comm.rank());
    try {
      call(comm);
    } catch (const error& err) {
      std::fprintf(stderr, "[rank %d] %s: %s\n", comm.rank(), std::string(to_string(err.code())).c_str(), err.what());
      board[at] = 1 + static_cast<int>(err.code());
      RANK_CHECK(allowed(err.code()));
      board[at + 1] = names_both(err) ? 1 : 0;
      return;
    }
    std::vector<int> next{1};
    try {
      for (int i = 0; i < (in_call ? 1 : 2); ++i) comm.all_reduce(std::span(next), {.algorithm = algo::direct});
      RANK_CHECK(false);  // the peers failed: this rank cannot go on as if nothing happened
    } catch (const error& err) {
      std::fprintf(stderr, "[rank %d] finished the call; its next failed: %s\n", comm.rank(), err.what());
      board[at + 2] = 1 + static_cast<int>(err.code());
      RANK_CHECK(allowed(err.code()));
      if (!in_call && names_both(err)) board[at + 1] = 1;
    }
  }, {.deadline = std::chrono::seconds(60), .env = e});
  int named = 0;
  for (int r = 0; r < n; ++r) named += board[3 * static_cast<std::size_t>(r) + 1].load();
  CHECK_MESSAGE(named > 0, (in_call ? "no rank failed the mismatched call itself with a mismatch naming both calls"
                                     : "no rank failed the mismatched call or the next with a mismatch naming both calls"));
}

template <class F>
std::function<void(communicator&)> for_rank_1_and_others(F f) {
  return [f](communicator& comm) { f(comm, comm.rank() == 1); };
}

}  // namespace

TEST_CASE("different roots on different ranks are a mismatch naming both roots, for every rooted collective and algorithm") {
  // A rank that believes it is the root only sends, and a tree rooted elsewhere may finish
  // without reading the frames it sent: the receiver meets them at its next call, where the
  // call history names both calls. So these cases accept the mismatch in the call or the next.
  constexpr bool in_call = false;
  for (int n : {3, 4}) {
    CAPTURE(n);
    for (algo a : algorithms_for(collective::broadcast)) {
      const std::string algorithm(to_string(a));
      SUBCASE(("broadcast " + algorithm).c_str()) {
        expect_mismatch_naming(n, for_rank_1_and_others([a](communicator& comm, bool odd) {
          std::vector<float> v(1000, 1.0f);
          comm.broadcast(std::span(v), odd ? 1 : 0, {.algorithm = a});
        }), {"root 0", "root 1"}, {}, in_call);
      }
      SUBCASE(("reduce " + algorithm).c_str()) {
        expect_mismatch_naming(n, for_rank_1_and_others([a](communicator& comm, bool odd) {
          std::vector<float> v(1000, 1.0f);
          comm.reduce(std::span(v), odd ? 1 : 0, {.algorithm = a});
        }), {"root 0", "root 1"}, {}, in_call);
      }
    }
    for (algo a : algorithms_for(collective::gather)) {
      const std::string algorithm(to_string(a));
      SUBCASE(("gather " + algorithm).c_str()) {
        expect_mismatch_naming(n, for_rank_1_and_others([a](communicator& comm, bool odd) {
          std::vector<float> in(100, 1.0f), out(100 * static_cast<std::size_t>(comm.size()));
          comm.gather(std::span<const float>(in), std::span(out), odd ? 1 : 0, {.algorithm = a});
        }), {"root 0", "root 1"}, {}, in_call);
      }
      SUBCASE(("scatter " + algorithm).c_str()) {
        expect_mismatch_naming(n, for_rank_1_and_others([a](communicator& comm, bool odd) {
          std::vector<float> in(100 * static_cast<std::size_t>(comm.size()), 1.0f), out(100);
          comm.scatter(std::span<const float>(in), std::span(out), odd ? 1 : 0, {.algorithm = a});
        }), {"root 0", "root 1"}, {}, in_call);
      }
    }
  }
}

TEST_CASE("different counts, ops or algorithms on one rank are a mismatch naming both calls") {
  SUBCASE("broadcast counts") {
    for (algo a : algorithms_for(collective::broadcast)) {
      expect_mismatch_naming(3, for_rank_1_and_others([a](communicator& comm, bool odd) {
        std::vector<float> v(odd ? 20 : 10, 1.0f);
        comm.broadcast(std::span(v), 0, {.algorithm = a});
      }), {"count=20", "count=10"});
    }
  }
  SUBCASE("gather counts") {
    for (algo a : algorithms_for(collective::gather)) {
      expect_mismatch_naming(4, for_rank_1_and_others([a](communicator& comm, bool odd) {
        const std::size_t block = odd ? 7 : 5;
        std::vector<float> in(block, 1.0f), out(block * static_cast<std::size_t>(comm.size()));
        comm.gather(std::span<const float>(in), std::span(out), 0, {.algorithm = a});
      }), {"count=7", "count=5"});
    }
  }
  SUBCASE("reduce ops") {
    expect_mismatch_naming(3, for_rank_1_and_others([](communicator& comm, bool odd) {
      std::vector<float> v(100, 1.0f);
      comm.reduce(std::span(v), 0, {.op = odd ? max : sum});
    }), {"max", "sum"});
  }
  SUBCASE("all_to_all blocks") {
    expect_mismatch_naming(3, for_rank_1_and_others([](communicator& comm, bool odd) {
      const std::size_t block = odd ? 9 : 8;
      std::vector<float> in(3 * block, 1.0f), out(3 * block);
      comm.all_to_all(std::span<const float>(in), std::span(out));
    }), {"count=9", "count=8"});
  }
  SUBCASE("broadcast algorithms") {
    expect_mismatch_naming(4, for_rank_1_and_others([](communicator& comm, bool odd) {
      std::vector<float> v(100, 1.0f);
      comm.broadcast(std::span(v), 0, {.algorithm = odd ? algo::binomial : algo::chain});
    }), {"chain", "binomial"});
  }
  SUBCASE("CHORUS_ALGO's broadcast algorithm against a call's own choice") {
    expect_mismatch_naming(4, for_rank_1_and_others([](communicator& comm, bool odd) {
      std::vector<float> v(100, 1.0f);
      comm.broadcast(std::span(v), 0, {.algorithm = odd ? algo::binomial : algo::automatic});
    }), {"chain", "binomial"}, {{"CHORUS_ALGO", "broadcast:chain"}});
  }
}

TEST_CASE("an all_to_allv whose send count to a peer differs from that peer's receive count is a mismatch naming both") {
  for (int n : {2, 4}) {
    CAPTURE(n);
    expect_mismatch_naming(n, [](communicator& comm) {
      // Everyone sends everyone 4 elements and expects 4, except that rank 0 sends rank 1
      // five: rank 1 still expects four.
      const auto nn = static_cast<std::size_t>(comm.size());
      std::vector<std::size_t> send(nn, 4), recv(nn, 4);
      if (comm.rank() == 0) send[1] = 5;
      std::vector<float> in(4 * nn + (comm.rank() == 0 ? 1 : 0), 1.0f), out(4 * nn);
      comm.all_to_allv(std::span<const float>(in), std::span<const std::size_t>(send), std::span(out),
                       std::span<const std::size_t>(recv));
    }, {"count=5", "count=4"});
    expect_mismatch_naming(n, [](communicator& comm) {
      // A zero against a count: rank 1 expects 3 elements from rank 0, which sends none.
      const auto nn = static_cast<std::size_t>(comm.size());
      std::vector<std::size_t> send(nn, 2), recv(nn, 2);
      if (comm.rank() == 0) send[1] = 0;
      if (comm.rank() == 1) recv[0] = 3;
      std::size_t s = 0, r = 0;
      for (std::size_t i = 0; i < nn; ++i) {
        s += send[i];
        r += recv[i];
      }
      std::vector<float> in(s, 1.0f), out(r);
      comm.all_to_allv(std::span<const float>(in), std::span<const std::size_t>(send), std::span(out),
                       std::span<const std::size_t>(recv));
    }, {"count=0", "count=3"});
    expect_mismatch_naming(n, [](communicator& comm) {
      // A count against a zero: rank 0 sends rank 1 three elements, rank 1 expects none.
      const auto nn = static_cast<std::size_t>(comm.size());
      std::vector<std::size_t> send(nn, 1), recv(nn, 1);
      if (comm.rank() == 0) send[1] = 3;
      if (comm.rank() == 1) recv[0] = 0;
      std::size_t s = 0, r = 0;
      for (std::size_t i = 0; i < nn; ++i) {
        s += send[i];
        r += recv[i];
      }
      std::vector<float> in(s, 1.0f), out(r);
      comm.all_to_allv(std::span<const float>(in), std::span<const std::size_t>(send), std::span(out),
                       std::span<const std::size_t>(recv));
    }, {"count=3", "count=0"});
  }
}

TEST_CASE("the TCP connection count is agreed: the machine's pick, or CHORUS_TCP_CONNS where set") {
  // Unset, every rank takes 4, or 1 where a node runs more ranks than cores (here: the 3
  // ranks of this test on fewer than 3 cores).
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  const std::string picked = std::string("tcp conns ") + (3 > cores ? "1" : "4") + " ";
  // Each job below has a store of its own, on a port found just before it starts.
  auto fresh_port = [](communicator& comm) { return std::to_string(test::agreed_free_port(comm)); };
  run_ranks(3, [&](communicator& comm) {
    const std::string outer_port = std::getenv("CHORUS_MASTER_PORT");
    ::unsetenv("CHORUS_TCP_CONNS");
    ::setenv("CHORUS_MASTER_PORT", fresh_port(comm).c_str(), 1);
    {
      auto c = communicator::from_env<tcp_transport>();
      RANK_CHECK(c.describe().find(picked) != std::string::npos);
      still_works(c);
    }
    ::setenv("CHORUS_TCP_CONNS", "3", 1);
    ::setenv("CHORUS_MASTER_PORT", fresh_port(comm).c_str(), 1);
    {
      auto c = communicator::from_env<tcp_transport>();
      RANK_CHECK(c.describe().find("tcp conns 3 ") != std::string::npos);
      still_works(c);
    }
    // One rank set differently: every rank fails at set-up, naming the variable and both
    // ranks, instead of waiting for connections its peer never dials.
    if (comm.rank() == 2) ::setenv("CHORUS_TCP_CONNS", "2", 1);
    ::setenv("CHORUS_MASTER_PORT", fresh_port(comm).c_str(), 1);
    bool named = false;
    try {
      (void)communicator::from_env<tcp_transport>();
    } catch (const error& e) {
      const std::string what = e.what();
      named = e.code() == errc::invalid_argument && what.find("CHORUS_TCP_CONNS") != std::string::npos &&
              what.find("rank 0 has 3, rank 2 has 2") != std::string::npos;
      if (!named) std::fprintf(stderr, "[rank %d] %s\n", comm.rank(), e.what());
    }
    RANK_CHECK(named);
    ::unsetenv("CHORUS_TCP_CONNS");
    ::setenv("CHORUS_MASTER_PORT", outer_port.c_str(), 1);
    still_works(comm);
  });
}
