// SPDX-License-Identifier: Apache-2.0
// The multi-rank test harness: fork N real processes, each a rank of a real communicator
// (CHORUS_TRANSPORT picks tcp, shm or auto, as in any chorus program).
//
// A test body is written from one rank's point of view:
//
//   TEST_CASE("all_reduce sums every rank's data") {
//     chorus::test::run_ranks(4, [](chorus::communicator& comm) {
//       std::vector<int> v(10, comm.rank());
//       comm.all_reduce(std::span(v));
//       RANK_CHECK(v[0] == 6);
//     });
//   }
//
// Each child counts its failed RANK_CHECKs and exits with that count; the parent CHECKs
// every rank's exit status and kills every rank still running at the deadline, so no test
// can hang.
#pragma once

#include <doctest/doctest.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chorus/chorus.hpp>
#include <chorus/transport/auto.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

namespace chorus::test {

inline int& rank_failures() {
  static int failures = 0;
  return failures;
}
inline int& current_rank() {
  static int rank = -1;
  return rank;
}

#define RANK_CHECK(cond)                                                                  \
  do {                                                                                    \
    if (!(cond)) {                                                                        \
      std::fprintf(stderr, "[rank %d] %s:%d: RANK_CHECK(%s) failed\n",                    \
                   ::chorus::test::current_rank(), __FILE__, __LINE__, #cond);            \
      ++::chorus::test::rank_failures();                                                  \
    }                                                                                     \
  } while (0)

/// Asserts that `expr` throws chorus::error with code `code`; prints the message either way
/// when it does not.
#define RANK_CHECK_THROWS_CODE(expr, want_code)                                                \
  do {                                                                                    \
    bool thrown_ = false;                                                                 \
    try {                                                                                 \
      expr;                                                                               \
    } catch (const ::chorus::error& e_) {                                                 \
      thrown_ = true;                                                                     \
      if (e_.code() != (want_code)) {                                                          \
        std::fprintf(stderr, "[rank %d] %s:%d: %s threw %s: %s\n",                        \
                     ::chorus::test::current_rank(), __FILE__, __LINE__, #expr,           \
                     std::string(::chorus::to_string(e_.code())).c_str(), e_.what());     \
        ++::chorus::test::rank_failures();                                                \
      }                                                                                   \
    }                                                                                     \
    if (!thrown_) {                                                                       \
      std::fprintf(stderr, "[rank %d] %s:%d: %s did not throw\n",                         \
                   ::chorus::test::current_rank(), __FILE__, __LINE__, #expr);            \
      ++::chorus::test::rank_failures();                                                  \
    }                                                                                     \
  } while (0)

/// A port nobody listens on right now (bind port 0, read it, close).
inline int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

/// A port rank 0 of `comm` finds free now, the same on every rank: for a store a job makes
/// next. Found just before use, not at the test's start, where a listener of the jobs
/// before it may take it meanwhile.
inline int agreed_free_port(communicator& comm) {
  std::vector<std::int32_t> port{comm.rank() == 0 ? free_port() : 0};
  comm.broadcast(std::span(port), 0);
  return port[0];
}

struct run_options {
  std::chrono::seconds deadline{60};          ///< every rank is killed after this
  std::map<std::string, std::string> env{};  ///< extra environment for every rank
  std::vector<int> expect_killed{};          ///< ranks that kill themselves on purpose
  std::string stderr_path{};                  ///< non-empty: every rank appends its stderr here
  /// Called in the parent once every rank is forked, with their pids (rank order) and the
  /// store's port, while they run: to watch them, or attack them (tests/security).
  std::function<void(const std::vector<pid_t>&, int master_port)> started{};
};

/// Forks n ranks, each with a launcher's environment, running `body(rank)`; CHECKs that each
/// exits 0. Returns the exit statuses. For bodies that make their own communicators.
inline std::vector<int> run_processes(int n, const std::function<void(int rank)>& body,
                                      const run_options& o = {}) {
  const int port = free_port();
  std::fflush(stdout);
  std::fflush(stderr);
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      if (!o.stderr_path.empty()) {
        const int fd =
            ::open(o.stderr_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
        if (fd >= 0) {
          ::dup2(fd, STDERR_FILENO);
          ::close(fd);
        }
      }
      ::setenv("CHORUS_RANK", std::to_string(r).c_str(), 1);
      ::setenv("CHORUS_WORLD_SIZE", std::to_string(n).c_str(), 1);
      ::setenv("CHORUS_LOCAL_RANK", std::to_string(r).c_str(), 1);
      ::setenv("CHORUS_LOCAL_WORLD_SIZE", std::to_string(n).c_str(), 1);
      ::setenv("CHORUS_MASTER_ADDR", "127.0.0.1", 1);
      ::setenv("CHORUS_MASTER_PORT", std::to_string(port).c_str(), 1);
      if (::getenv("CHORUS_TIMEOUT") == nullptr) ::setenv("CHORUS_TIMEOUT", "30", 1);
      for (const auto& [k, v] : o.env) ::setenv(k.c_str(), v.c_str(), 1);
      current_rank() = r;
      int code = 0;
      try {
        body(r);
        code = std::min(rank_failures(), 100);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "[rank %d] uncaught exception: %s\n", r, e.what());
        code = 101;
      }
      std::fflush(stdout);
      std::fflush(stderr);
      ::_exit(code);
    }
    pids.push_back(pid);
  }
  if (o.started) o.started(pids, port);
  std::vector<int> status(static_cast<std::size_t>(n), -1);
  const auto deadline = std::chrono::steady_clock::now() + o.deadline;
  int left = n;
  while (left > 0) {
    int st = 0;
    const pid_t pid = ::waitpid(-1, &st, WNOHANG);
    if (pid > 0) {
      for (int r = 0; r < n; ++r) {
        if (pids[static_cast<std::size_t>(r)] == pid) {
          status[static_cast<std::size_t>(r)] = st;
          --left;
        }
      }
      continue;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      for (int r = 0; r < n; ++r) {
        if (status[static_cast<std::size_t>(r)] == -1) {
          ::kill(pids[static_cast<std::size_t>(r)], SIGKILL);
          FAIL_CHECK("rank " << r << " of " << n << " hung past the test deadline");
        }
      }
      while (left > 0 && ::waitpid(-1, nullptr, 0) > 0) --left;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  for (int r = 0; r < n; ++r) {
    const int st = status[static_cast<std::size_t>(r)];
    if (st == -1) continue;
    if (std::find(o.expect_killed.begin(), o.expect_killed.end(), r) != o.expect_killed.end()) continue;
    CAPTURE(r);
    CAPTURE(n);
    if (WIFSIGNALED(st)) FAIL_CHECK("rank " << r << " was killed by signal " << WTERMSIG(st));
    else CHECK_MESSAGE(WEXITSTATUS(st) == 0, "rank " << r << " of " << n << " failed (exit " << WEXITSTATUS(st) << ")");
  }
  return status;
}

/// Forks n ranks running `body(comm)` on a communicator of their own; see run_processes.
inline std::vector<int> run_ranks(int n, const std::function<void(communicator&)>& body,
                                  const run_options& o = {}) {
  return run_processes(
      n,
      [&](int) {
        auto comm = communicator::from_env<auto_transport>();
        body(comm);
      },
      o);
}

}  // namespace chorus::test
