// SPDX-License-Identifier: Apache-2.0
// Tests for chorus/bootstrap/store.hpp: real ranks in forked processes meeting over loopback.
#include <arpa/inet.h>
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chorus/bootstrap/detail/group_store.hpp>
#include <chorus/bootstrap/detail/store_protocol.hpp>
#include <chorus/bootstrap/store.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace {

using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

// A port nobody listens on right now: bind port 0, read what the kernel chose, close.
std::uint16_t free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  socklen_t len = sizeof a;
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  ::close(fd);
  return ntohs(a.sin_port);
}

chorus::launch_info rank_info(int rank, int size, std::uint16_t port) {
  chorus::launch_info info;
  info.rank = rank;
  info.size = size;
  info.master_addr = "127.0.0.1";
  info.master_port = port;
  info.launcher = "chorus";
  return info;
}

std::vector<std::byte> bytes(std::string_view s) {
  auto b = std::as_bytes(std::span(s.data(), s.size()));
  return {b.begin(), b.end()};
}

std::string text(std::span<const std::byte> b) {
  return {reinterpret_cast<const char*>(b.data()), b.size()};
}

bool contains(std::string_view haystack, std::string_view needle) {
  return haystack.find(needle) != std::string_view::npos;
}

// In a child, where doctest's macros cannot report: print what failed and exit non-zero.
#define CHILD_CHECK(cond)                                                                 \
  do {                                                                                    \
    if (!(cond)) {                                                                        \
      std::fprintf(stderr, "%s:%d: child check failed: %s\n", __FILE__, __LINE__, #cond); \
      return 1;                                                                           \
    }                                                                                     \
  } while (0)

// Runs the expected error `code` through a call; in a child, returns 1 unless it is thrown
// and its message contains every one of `parts`.
int expect_error(const std::function<void()>& call, chorus::errc code,
                 std::initializer_list<std::string> parts,
                 const std::optional<std::vector<int>>& ranks = std::nullopt) {
  try {
    call();
  } catch (const chorus::error& e) {
    bool ok = e.code() == code && (!ranks || e.ranks() == *ranks);
    for (const auto& p : parts) ok = ok && contains(e.what(), p);
    if (!ok) {
      std::fprintf(stderr, "unexpected error (%s): %s\n",
                   std::string(chorus::to_string(e.code())).c_str(), e.what());
      return 1;
    }
    return 0;
  }
  std::fprintf(stderr, "expected a %s error, got none\n",
               std::string(chorus::to_string(code)).c_str());
  return 1;
}

struct child_outcome {
  int rank = 0;
  int status = 0;     // waitpid status
  bool hung = false;  // still running at the bound, so killed by us
};

// Forks one child per entry of `ranks` and runs body(rank) in it; the child's exit code is
// body's return (90 for an escaped chorus::error, 91 for anything else). Children still
// running after `bound` are killed, so no test can hang.
std::vector<child_outcome> run_ranks(const std::vector<int>& ranks,
                                     const std::function<int(int)>& body,
                                     std::chrono::milliseconds bound = 15s) {
  std::fflush(stdout);
  std::fflush(stderr);
  std::vector<pid_t> pids;
  for (int rank : ranks) {
    pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      int code = 91;
      try {
        code = body(rank);
      } catch (const chorus::error& e) {
        std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
        code = 90;
      } catch (...) {
      }
      std::fflush(stderr);
      ::_exit(code);
    }
    pids.push_back(pid);
  }
  std::vector<child_outcome> out(ranks.size());
  std::vector<bool> done(ranks.size(), false);
  auto deadline = clock_type::now() + bound;
  std::size_t remaining = ranks.size();
  while (remaining > 0 && clock_type::now() < deadline) {
    for (std::size_t i = 0; i < pids.size(); ++i) {
      if (done[i]) continue;
      int status = 0;
      if (::waitpid(pids[i], &status, WNOHANG) == pids[i]) {
        out[i] = {ranks[i], status, false};
        done[i] = true;
        --remaining;
      }
    }
    std::this_thread::sleep_for(5ms);
  }
  for (std::size_t i = 0; i < pids.size(); ++i) {
    if (done[i]) continue;
    ::kill(pids[i], SIGKILL);
    int status = 0;
    ::waitpid(pids[i], &status, 0);
    out[i] = {ranks[i], status, true};
  }
  return out;
}

std::vector<int> iota_ranks(int n) {
  std::vector<int> r;
  for (int i = 0; i < n; ++i) r.push_back(i);
  return r;
}

void check_exited_cleanly(const child_outcome& c) {
  INFO("rank ", c.rank);
  CHECK_FALSE(c.hung);
  CHECK(WIFEXITED(c.status));
  CHECK(WEXITSTATUS(c.status) == 0);
}

// ---- raw protocol helpers for the garbage sender ----

int raw_connect(std::uint16_t port, std::chrono::milliseconds patience) {
  auto deadline = clock_type::now() + patience;
  while (clock_type::now() < deadline) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(port);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) return fd;
    ::close(fd);
    std::this_thread::sleep_for(10ms);
  }
  return -1;
}

void raw_send(int fd, std::span<const std::byte> data) {
  // Errors are expected: the server may already have closed us.
  (void)::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
}

std::vector<std::byte> raw_header(std::uint8_t op, std::uint32_t key_len, std::uint64_t value_len) {
  chorus::detail::store_frame_header h;
  h.op = op;
  h.key_len = key_len;
  h.value_len = value_len;
  auto a = chorus::detail::store_encode_header(h);
  return {a.begin(), a.end()};
}

std::vector<std::byte> raw_hello(std::uint32_t magic, std::int32_t rank, std::int32_t size) {
  auto frame = raw_header(1, 0, 16);
  // Grown first and written in place: g++ 12 at -O3 misreads an insert of a
  // 16-byte array here as reading past it (-Warray-bounds).
  const std::size_t at = frame.size();
  frame.resize(at + 16);
  std::byte* v = frame.data() + at;
  chorus::detail::store_put_le(v, magic, 4);
  chorus::detail::store_put_le(v + 4, chorus::detail::store_version, 4);
  chorus::detail::store_put_le(v + 8, static_cast<std::uint32_t>(rank), 4);
  chorus::detail::store_put_le(v + 12, static_cast<std::uint32_t>(size), 4);
  return frame;
}

// The status byte of the server's reply, or -1 when none came within 2 s.
int raw_reply_status(int fd) {
  std::array<std::byte, chorus::detail::store_header_bytes> head{};
  std::size_t have = 0;
  auto deadline = clock_type::now() + 2s;
  while (have < head.size() && clock_type::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    ssize_t n = ::recv(fd, head.data() + have, head.size() - have, 0);
    if (n <= 0) return -1;
    have += static_cast<std::size_t>(n);
  }
  return have == head.size()
             ? static_cast<int>(chorus::detail::store_decode_header(head.data()).status)
             : -2;  // no answer, and still open
}

// Sends every kind of malformed input the server must survive, over and over.
int send_garbage(std::uint16_t port, int world_size) {
  std::mt19937 rng(12345);
  std::vector<int> held;  // connections left open mid-frame, closed at the end
  for (int round = 0; round < 15; ++round) {
    int fd = raw_connect(port, 5s);
    CHILD_CHECK(fd >= 0);
    std::vector<std::byte> noise(1 + rng() % 512);
    for (auto& b : noise) b = static_cast<std::byte>(rng());
    raw_send(fd, noise);
    ::close(fd);

    fd = raw_connect(port, 1s);
    raw_send(fd, raw_header(2, 0xffffffffu, 0));  // a 4 GiB key before hello
    ::close(fd);

    fd = raw_connect(port, 1s);
    raw_send(fd, raw_header(1, 0, std::uint64_t{1} << 40));  // a 1 TiB hello
    ::close(fd);

    fd = raw_connect(port, 1s);
    raw_send(fd, raw_hello(0xdeadbeef, 1, world_size));  // not chorus
    ::close(fd);

    // A well-formed store hello without the handshake first is only the start of a bad
    // handshake: closed without an answer as soon as it ends.
    fd = raw_connect(port, 1s);
    raw_send(fd, raw_hello(chorus::detail::store_magic, 7, world_size));
    ::shutdown(fd, SHUT_WR);
    CHILD_CHECK(raw_reply_status(fd) == -1);
    ::close(fd);

    fd = raw_connect(port, 1s);
    raw_send(fd, raw_hello(chorus::detail::store_magic, 1, world_size + 1));
    ::shutdown(fd, SHUT_WR);
    CHILD_CHECK(raw_reply_status(fd) == -1);
    ::close(fd);

    fd = raw_connect(port, 1s);
    raw_send(fd, bytes("GET / HTTP/1.1\r\nHost: x\r\n\r\n"));
    ::close(fd);

    fd = raw_connect(port, 1s);
    auto half = raw_hello(chorus::detail::store_magic, 0, world_size);
    half.resize(10);  // a frame that never finishes
    raw_send(fd, half);
    held.push_back(fd);
    std::this_thread::sleep_for(10ms);
  }
  for (int fd : held) ::close(fd);
  return 0;
}

}  // namespace

TEST_CASE("every rank of 1, 3 and 5 sees the others' set, get, add, all_gather and barrier") {
  for (int n : {1, 3, 5}) {
    CAPTURE(n);
    std::uint16_t port = free_port();
    auto outcomes = run_ranks(iota_ranks(n), [&](int r) {
      if (r == 0) std::this_thread::sleep_for(200ms);  // the master may start after the workers
      auto store = chorus::tcp_store::connect(rank_info(r, n, port), {.timeout = 10s});
      CHILD_CHECK(store.rank() == r);
      CHILD_CHECK(store.size() == n);

      store.set("key/" + std::to_string(r), bytes("value of " + std::to_string(r)));
      store.barrier("after set");
      for (int p = 0; p < n; ++p) {
        CHILD_CHECK(text(store.get("key/" + std::to_string(p))) == "value of " + std::to_string(p));
      }

      store.add("counter", r + 1);
      store.barrier("after add");
      CHILD_CHECK(store.add("counter", 0) == n * (n + 1) / 2);

      // Values of different lengths; the same key twice is two rounds.
      for (char round : {'a', 'b'}) {
        auto all =
            store.all_gather("ids", bytes(std::string(static_cast<std::size_t>(r + 1), round)));
        CHILD_CHECK(all.size() == static_cast<std::size_t>(n));
        for (int p = 0; p < n; ++p) {
          CHILD_CHECK(text(all[static_cast<std::size_t>(p)]) ==
                      std::string(static_cast<std::size_t>(p + 1), round));
        }
      }

      // A get waits for a key that the last rank sets later.
      if (r == n - 1) {
        std::this_thread::sleep_for(200ms);
        store.set("late", bytes("here"));
      }
      CHILD_CHECK(text(store.get("late")) == "here");
      store.barrier("end");
      return 0;
    });
    for (const auto& c : outcomes) check_exited_cleanly(c);
  }
}

TEST_CASE("a rendezvous that ranks never reach names exactly those ranks") {
  std::uint16_t port = free_port();
  auto outcomes = run_ranks({0, 2}, [&](int r) {
    return expect_error(
        [&] { (void)chorus::tcp_store::connect(rank_info(r, 4, port), {.timeout = 1s}); },
        chorus::errc::timeout,
        {"rendezvous at 127.0.0.1:" + std::to_string(port) +
         " timed out after 1 s: ranks 1, 3 never arrived"});
  });
  for (const auto& c : outcomes) check_exited_cleanly(c);
}

TEST_CASE("an all_gather or barrier that a rank skips names exactly that rank") {
  std::uint16_t port = free_port();
  auto outcomes = run_ranks(iota_ranks(3), [&](int r) {
    auto store = chorus::tcp_store::connect(rank_info(r, 3, port), {.timeout = 1s});
    if (r == 2) {
      // Present at the rendezvous, absent afterwards, but still connected: a rank that had
      // left would be named at once (the next test).
      std::this_thread::sleep_for(4s);
      return 0;
    }
    std::string address = "127.0.0.1:" + std::to_string(port);
    int failures = 0;
    try {
      store.all_gather("addr", bytes("x"));
      failures += 1;
    } catch (const chorus::error& e) {
      std::string want =
          "all_gather 'addr' at " + address + " timed out after 1 s: rank 2 never arrived";
      if (e.code() != chorus::errc::timeout || !contains(e.what(), want) ||
          e.ranks() != std::vector<int>{2}) {
        std::fprintf(stderr, "rank %d: %s\n", r, e.what());
        failures += 1;
      }
    }
    failures += expect_error(
        [&] { store.barrier("done"); }, chorus::errc::timeout,
        {"barrier 'done' at " + address + " timed out after 1 s: rank 2 never arrived"});
    // A timeout the server reported leaves the store usable.
    store.set("still", bytes("fine"));
    CHILD_CHECK(text(store.get("still")) == "fine");
    return failures;
  });
  for (const auto& c : outcomes) check_exited_cleanly(c);
}

TEST_CASE("an unreachable master is a bootstrap error naming its address and the reason") {
  std::uint16_t port = free_port();
  try {
    (void)chorus::tcp_store::connect(rank_info(1, 2, port), {.timeout = 300ms});
    FAIL("connected to nothing");
  } catch (const chorus::error& e) {
    CHECK(e.code() == chorus::errc::bootstrap);
    CHECK(contains(e.what(), "rank 1 of 2 could not reach the rendezvous store at 127.0.0.1:" +
                                 std::to_string(port) + " within 0.3 s"));
    CHECK(contains(e.what(), "Connection refused"));
  }
}

TEST_CASE("rank 0 refuses to host the store on an address that is not its own") {
  auto info = rank_info(0, 2, free_port());
  info.master_addr = "192.0.2.1";  // TEST-NET-1: never a local address
  try {
    (void)chorus::tcp_store::connect(info, {.timeout = 300ms});
    FAIL("hosted on a foreign address");
  } catch (const chorus::error& e) {
    CHECK(e.code() == chorus::errc::bootstrap);
    CHECK(contains(e.what(), "192.0.2.1"));
    CHECK(contains(e.what(), "is not an address of this machine"));
  }
}

TEST_CASE("rank 0 cannot host the store on a port another process listens on") {
  std::uint16_t port = free_port();
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  REQUIRE(::listen(fd, 1) == 0);
  try {
    (void)chorus::tcp_store::connect(rank_info(0, 2, port), {.timeout = 300ms});
    FAIL("hosted on a busy port");
  } catch (const chorus::error& e) {
    CHECK(e.code() == chorus::errc::bootstrap);
    CHECK(contains(e.what(), "127.0.0.1:" + std::to_string(port)));
    CHECK(contains(e.what(), "Address already in use"));
  }
  ::close(fd);
}

TEST_CASE("a rank that leaves before its part of a wait ends that wait at once, naming it") {
  // Rank 2 sets one key and leaves: returning (its store closed) or killed. Its key still
  // arrives; every wait on a part it never gave fails with peer_failed, well before the 60 s
  // deadline (run_ranks kills the test's ranks after 15 s).
  for (const bool killed : {false, true}) {
    CAPTURE(killed);
    std::uint16_t port = free_port();
    const std::string address = "127.0.0.1:" + std::to_string(port);
    auto outcomes = run_ranks(iota_ranks(3), [&](int r) {
      auto store = chorus::tcp_store::connect(rank_info(r, 3, port), {.timeout = 60s});
      CHILD_CHECK(store.departed().empty());
      if (r == 2) {
        store.set("k2", bytes("from 2"));
        std::this_thread::sleep_for(300ms);  // the others are waiting by now, or soon
        if (killed) ::raise(SIGKILL);
        return 0;
      }
      const std::vector<std::string> keys = {"k2"};
      const std::vector<int> owners = {2};
      auto got = store.get_all(keys, owners);
      CHILD_CHECK(got.size() == 1 && text(got[0]) == "from 2");
      int failed = 0;
      auto names_rank_2 = [&](const std::function<void()>& call, const std::string& what) {
        try {
          call();
          std::fprintf(stderr, "rank %d: %s returned\n", r, what.c_str());
          return 1;
        } catch (const chorus::error& e) {
          const std::string want =
              what + " at " + address + ": rank 2 has left the store without taking part";
          if (e.code() == chorus::errc::peer_failed && contains(e.what(), want) &&
              e.ranks() == std::vector<int>{2}) {
            return 0;
          }
          std::fprintf(stderr, "rank %d: %s\n", r, e.what());
          return 1;
        }
      };
      failed += names_rank_2([&] { store.all_gather("addr", bytes("x")); }, "all_gather 'addr'");
      failed += names_rank_2([&] { store.barrier("done"); }, "barrier 'done'");
      store.set("k" + std::to_string(r), bytes("mine"));
      const std::vector<std::string> three = {"k0", "k1", "k3"};
      const std::vector<int> three_owners = {0, 1, 2};
      failed += names_rank_2([&] { (void)store.get_all(three, three_owners); },
                             "get_all of 'k0' and 2 more");
      // The server answered each of these, so the store is still usable, and says who left:
      store.set("still", bytes("fine"));
      CHILD_CHECK(text(store.get("still")) == "fine");
      // rank 2, and the other of ranks 0 and 1 if it has finished first (rank 0's store
      // lingers for rank 1).
      const auto gone = store.departed();
      const auto other = std::vector<int>({r == 0 ? 1 : 0, 2});
      CHILD_CHECK(gone == std::vector<int>{2} || gone == other);
      return failed;
    });
    check_exited_cleanly(outcomes[0]);
    check_exited_cleanly(outcomes[1]);
    if (killed) {
      CHECK(WIFSIGNALED(outcomes[2].status));
    } else {
      check_exited_cleanly(outcomes[2]);
    }
  }
}

TEST_CASE("get_all refuses keys named twice, owners outside the world and lists of unequal length") {
  auto store = chorus::tcp_store::connect(rank_info(0, 1, 1), {.timeout = 5s});
  store.set("a", bytes("1"));
  store.set("b", bytes("2"));
  const std::vector<std::string> ab = {"a", "b"};
  const std::vector<int> any_and_0 = {-1, 0};
  auto got = store.get_all(ab, any_and_0);
  REQUIRE(got.size() == 2);
  CHECK(text(got[0]) == "1");
  CHECK(text(got[1]) == "2");
  const std::vector<std::string> aa = {"a", "a"};
  const std::vector<int> owner_1 = {0, 1};
  const std::vector<int> one_owner = {0};
  CHECK_THROWS_WITH_AS((void)store.get_all(aa, any_and_0),
                       "chorus: store get_all: key 'a' is named twice", chorus::error);
  CHECK_THROWS_WITH_AS((void)store.get_all(ab, owner_1),
                       "chorus: store get_all: key 'b' names owner 1, not a rank of 1 (or -1 for any)",
                       chorus::error);
  CHECK_THROWS_WITH_AS(
      (void)store.get_all(ab, one_owner),
      "chorus: store get_all: wants one owner per key and at least one key, got 2 keys and 1 owners",
      chorus::error);
  // None of these reached the server: the store is as usable as before.
  CHECK(text(store.get("a")) == "1");
}

TEST_CASE("a split group's rounds wait only for its members, and name a member that left") {
  // Job ranks 0 and 2 form a group (its ranks 0 and 1); job rank 1 is not in it and leaves
  // at once, which must not disturb the group. Then job rank 2 leaves, and the group's next
  // round names it by its rank in the group.
  std::uint16_t port = free_port();
  auto outcomes = run_ranks(iota_ranks(3), [&](int r) {
    auto job = std::make_shared<chorus::tcp_store>(
        chorus::tcp_store::connect(rank_info(r, 3, port), {.timeout = 60s}));
    if (r == 1) return 0;
    chorus::detail::group_store group(job, std::make_shared<chorus::detail::store_turns>(), "g/", r == 0 ? 0 : 1,
                                      {0, 2});
    auto all = group.all_gather("addr", bytes("from " + std::to_string(r)));
    CHILD_CHECK(all.size() == 2 && text(all[0]) == "from 0" && text(all[1]) == "from 2");
    group.barrier("up");
    if (r == 2) return 0;
    int failed = expect_error([&] { group.barrier("down"); }, chorus::errc::peer_failed,
                              {"rank 2 has left the store", "(in a split group: its rank 1)"});
    // Job rank 1 left too, but is no member: the group names its own rank 1 (job rank 2).
    // Rank 1's exit may reach the store after rank 2's under load; wait for it (run_ranks
    // bounds the wait).
    while (job->departed().size() < 2) std::this_thread::sleep_for(5ms);
    CHILD_CHECK(job->departed() == std::vector<int>({1, 2}));
    CHILD_CHECK(group.departed() == std::vector<int>{1});
    return failed;
  });
  for (const auto& c : outcomes) check_exited_cleanly(c);
}

TEST_CASE("two groups' rounds on two threads of each rank both finish, whichever thread waits first") {
  // Each rank has two views of the job's store (groups g1 and g2 of both ranks), sharing its
  // one connection, on two threads. Rank 0 enters g1's round first and waits there for rank
  // 1, whose g1 thread comes 200 ms later; rank 1 enters g2's round first and waits for rank
  // 0's g2 thread, which also comes later. A wait that held the connection to its end would
  // keep each rank's late thread from setting the key the other rank waits for, until the
  // store's timeout (5 s here) failed both.
  std::uint16_t port = free_port();
  auto outcomes = run_ranks(iota_ranks(2), [&](int r) {
    auto job = std::make_shared<chorus::tcp_store>(
        chorus::tcp_store::connect(rank_info(r, 2, port), {.timeout = 5s}));
    auto turns = std::make_shared<chorus::detail::store_turns>();
    chorus::detail::group_store g1(job, turns, "g1/", r, {0, 1});
    chorus::detail::group_store g2(job, turns, "g2/", r, {0, 1});
    int failed = 0;
    std::mutex m;
    auto round = [&](chorus::detail::group_store& g, const char* name, bool late) {
      if (late) std::this_thread::sleep_for(200ms);
      try {
        auto all = g.all_gather("k", bytes(std::string(name) + " from " + std::to_string(r)));
        std::lock_guard lk(m);
        if (all.size() != 2 || text(all[0]) != std::string(name) + " from 0" ||
            text(all[1]) != std::string(name) + " from 1") {
          ++failed;
        }
      } catch (const chorus::error& e) {
        std::lock_guard lk(m);
        std::fprintf(stderr, "rank %d, %s: %s\n", r, name, e.what());
        ++failed;
      }
    };
    std::thread other([&] { round(g2, "g2", r == 0); });
    round(g1, "g1", r == 1);
    other.join();
    return failed;
  });
  for (const auto& c : outcomes) check_exited_cleanly(c);
}

TEST_CASE("a split group's store errors name its own ranks, in order, and no job rank outside it") {
  // Job ranks 3, 1 and 2 form a group in that order (split's key), its ranks 0, 1 and 2; job
  // rank 0, the store's host, is no member. Job ranks 3 and 1 leave: job rank 2's next round
  // names its group's ranks 0 and 1, ascending. Then job rank 0 is killed: the store's lost
  // connection names no rank of the group (its rank 0 is job rank 3, not the store's host).
  std::uint16_t port = free_port();
  auto outcomes = run_ranks(iota_ranks(4), [&](int r) {
    auto job = std::make_shared<chorus::tcp_store>(
        chorus::tcp_store::connect(rank_info(r, 4, port), {.timeout = 60s}));
    if (r == 0) {
      (void)job->get("checked");
      ::raise(SIGKILL);
    }
    const std::vector<int> members = {3, 1, 2};
    const int mine = static_cast<int>(std::find(members.begin(), members.end(), r) - members.begin());
    chorus::detail::group_store group(job, std::make_shared<chorus::detail::store_turns>(), "g/", mine, members);
    auto all = group.all_gather("addr", bytes("job rank " + std::to_string(r)));
    CHILD_CHECK(all.size() == 3 && text(all[0]) == "job rank 3" && text(all[2]) == "job rank 2");
    if (r != 2) return 0;
    while (job->departed() != std::vector<int>({1, 3})) std::this_thread::sleep_for(5ms);
    int failed = expect_error([&] { group.barrier("down"); }, chorus::errc::peer_failed,
                              {"ranks 1, 3 have left the store without taking part (exited, failed, or "
                               "closed their store) (in a split group: its ranks 0, 1)"},
                              std::vector<int>{0, 1});
    job->set("checked", bytes("yes"));
    failed += expect_error(
        [&] {
          while (true) {
            group.set("after", bytes("x"));
            std::this_thread::sleep_for(5ms);
          }
        },
        chorus::errc::connection_lost, {"(in a split group: job rank 0 is not in it)"}, std::vector<int>{});
    return failed;
  });
  CHECK(WIFSIGNALED(outcomes[0].status));
  for (int r = 1; r < 4; ++r) check_exited_cleanly(outcomes[static_cast<std::size_t>(r)]);
}

TEST_CASE("when rank 0 is killed the other ranks fail with connection_lost at once") {
  std::uint16_t port = free_port();
  auto outcomes = run_ranks(iota_ranks(3), [&](int r) {
    auto store = chorus::tcp_store::connect(rank_info(r, 3, port), {.timeout = 10s});
    store.barrier("up");
    if (r == 0) {
      // Die only once the others are past the barrier: dying with their requests unread
      // would reset the connections and could discard the barrier's replies.
      while (store.add("past barrier", 0) < 2) std::this_thread::sleep_for(5ms);
      ::raise(SIGKILL);
    }
    store.add("past barrier", 1);
    auto start = clock_type::now();
    int failed = expect_error([&] { store.get("never set"); }, chorus::errc::connection_lost,
                              {"127.0.0.1:" + std::to_string(port)});
    CHILD_CHECK(clock_type::now() - start < 3s);  // not the 10 s timeout
    failed +=
        expect_error([&] { store.set("after", bytes("x")); }, chorus::errc::connection_lost, {});
    return failed;
  });
  CHECK(WIFSIGNALED(outcomes[0].status));
  CHECK(WTERMSIG(outcomes[0].status) == SIGKILL);
  check_exited_cleanly(outcomes[1]);
  check_exited_cleanly(outcomes[2]);
}

TEST_CASE("garbage sent to the store's port does not disturb a concurrent rendezvous") {
  std::uint16_t port = free_port();
  constexpr int garbage = -1;
  auto outcomes = run_ranks({garbage, 0, 1, 2}, [&](int r) {
    if (r == garbage) return send_garbage(port, 3);
    auto store = chorus::tcp_store::connect(rank_info(r, 3, port), {.timeout = 10s});
    for (int round = 0; round < 100; ++round) {
      auto all = store.all_gather("round", bytes(std::to_string(r * round)));
      for (int p = 0; p < 3; ++p) {
        CHILD_CHECK(text(all[static_cast<std::size_t>(p)]) == std::to_string(p * round));
      }
      std::this_thread::sleep_for(2ms);
    }
    store.barrier("end");
    return 0;
  });
  for (const auto& c : outcomes) check_exited_cleanly(c);
}

TEST_CASE("the store never listens on every address") {
  for (const char* any : {"0.0.0.0", "::"}) {
    CAPTURE(any);
    auto info = rank_info(0, 2, free_port());
    info.master_addr = any;
    try {
      (void)chorus::tcp_store::connect(info, {.timeout = 1s});
      FAIL("a wildcard master address was accepted");
    } catch (const chorus::error& e) {
      CHECK(e.code() == chorus::errc::invalid_argument);
      CHECK(contains(e.what(), "means every address of this host"));
    }
  }
}

TEST_CASE("a rank with another secret is refused and named; the store serves the job on") {
  std::uint16_t port = free_port();
  auto secret = [](std::string_view text) {
    return chorus::job_secret::from_bytes(std::as_bytes(std::span(text.data(), text.size())));
  };
  auto outcomes = run_ranks({0, 1, 11}, [&](int r) {
    if (r == 11) {  // a process of another job, which tries to join as rank 1 first
      return expect_error(
          [&] {
            (void)chorus::tcp_store::connect(
                rank_info(1, 2, port), {.timeout = 5s, .secret = secret("the-other-job-secret")});
          },
          chorus::errc::bootstrap, {"could not authenticate with the rendezvous store",
                                    "could not prove it knows the job secret"});
    }
    if (r == 1) std::this_thread::sleep_for(300ms);
    auto store = chorus::tcp_store::connect(rank_info(r, 2, port),
                                            {.timeout = 10s, .secret = secret("this-job-secret!")});
    store.barrier("up");
    return 0;
  });
  for (const auto& c : outcomes) check_exited_cleanly(c);
}

TEST_CASE("the store refuses a second process for a connected rank and a different world size") {
  std::uint16_t port = free_port();
  auto outcomes = run_ranks(iota_ranks(2), [&](int r) {
    auto store = chorus::tcp_store::connect(rank_info(r, 2, port), {.timeout = 10s});
    store.barrier("up");
    int failed = 0;
    if (r == 1) {
      failed += expect_error(
          [&] { (void)chorus::tcp_store::connect(rank_info(1, 2, port), {.timeout = 2s}); },
          chorus::errc::bootstrap, {"rank 1 is already connected"});
      failed += expect_error(
          [&] { (void)chorus::tcp_store::connect(rank_info(1, 3, port), {.timeout = 2s}); },
          chorus::errc::bootstrap,
          {"rank 1 says the world size is 3 but the store at 127.0.0.1:" + std::to_string(port) +
           " serves 2 ranks"});
    }
    store.barrier("done");
    return failed;
  });
  for (const auto& c : outcomes) check_exited_cleanly(c);
}

TEST_CASE("rank 0 may leave first: its store keeps serving a slower rank's final get") {
  std::uint16_t port = free_port();
  auto outcomes = run_ranks(iota_ranks(2), [&](int r) {
    auto store = chorus::tcp_store::connect(rank_info(r, 2, port), {.timeout = 10s});
    if (r == 0) {
      store.set("final", bytes("bye"));
      return 0;  // the store is destroyed here, before rank 1 asks
    }
    std::this_thread::sleep_for(300ms);
    CHILD_CHECK(text(store.get("final")) == "bye");
    return 0;
  });
  for (const auto& c : outcomes) check_exited_cleanly(c);
}

TEST_CASE("a single process's store works alone on an ephemeral port") {
  auto store = chorus::tcp_store::connect(rank_info(0, 1, 1), {.timeout = 300ms});
  store.set("k", bytes("v"));
  CHECK(text(store.get("k")) == "v");
  CHECK(store.add("n", 5) == 5);
  CHECK(store.add("n", -7) == -2);
  auto all = store.all_gather("g", bytes("mine"));
  REQUIRE(all.size() == 1);
  CHECK(text(all[0]) == "mine");
  store.barrier("b");
  // An empty value is a value.
  store.set("empty", {});
  CHECK(store.get("empty").empty());
}

TEST_CASE("values of every size up to the 64 MiB limit arrive whole as the server's buffer grows") {
  // The server grows a request's body as its bytes arrive (64 KiB, then doubling), so sizes
  // around the steps and the limit itself, behind the longest key, must all arrive intact.
  auto store = chorus::tcp_store::connect(rank_info(0, 1, 1), {.timeout = 30s});
  const std::string long_key(chorus::detail::max_store_key, 'k');
  for (std::size_t size : {std::size_t{65535}, std::size_t{65536}, std::size_t{65537},
                           std::size_t{(1 << 20) + 3}, chorus::detail::max_store_value}) {
    CAPTURE(size);
    std::vector<std::byte> value(size);
    for (std::size_t i = 0; i < size; ++i) value[i] = static_cast<std::byte>(i % 251);
    store.set(long_key, value);
    CHECK(store.get(long_key) == value);
  }
}

TEST_CASE("a get_many key list that names a key twice is refused, so a reply cannot outgrow the store") {
  using chorus::detail::store_any_owner;
  using chorus::detail::store_decode_keys;
  using chorus::detail::store_encode_keys;
  const std::vector<std::string> distinct = {"a", "b", "ab"};
  const std::vector<std::string> repeated = {"a", "b", "a"};
  const std::vector<std::uint32_t> owners = {2, store_any_owner, 0};
  std::string why;
  const auto list = store_decode_keys(store_encode_keys(distinct, owners), 3, why);
  REQUIRE(list);
  CHECK(list->keys == distinct);
  CHECK(list->owners == owners);
  CHECK(store_decode_keys(store_encode_keys(distinct), 3, why)->owners ==
        std::vector<std::uint32_t>(3, store_any_owner));
  CHECK(!store_decode_keys(store_encode_keys(repeated), 3, why));
  CHECK(why == "key 'a' named twice");
  // More keys than one wait may hold (chorus::detail::store_max_wait_keys) are refused too.
  CHECK(!store_decode_keys(store_encode_keys(distinct), 2, why));
  CHECK(why == "3 keys (at most 2 in one wait)");
}

TEST_CASE("a wait for more keys than a round's, and 65,536, is refused before anything is sent") {
  auto store = chorus::tcp_store::connect(rank_info(0, 1, 1), {.timeout = 5s});
  std::vector<std::string> keys;
  for (std::size_t i = 0; i <= std::size_t{1} << 16; ++i) keys.push_back("k" + std::to_string(i));
  const std::vector<int> owners(keys.size(), -1);
  CHECK_THROWS_WITH_AS((void)store.get_all(keys, owners),
                       "chorus: store get_all of 'k0' and 65536 more: 65537 keys, at most 65536 in one wait",
                       chorus::error);
  store.set("a", bytes("1"));
  CHECK(text(store.get("a")) == "1");  // still usable: nothing was sent
}

TEST_CASE("a get of a key nobody sets times out naming the key and the store's address") {
  auto store = chorus::tcp_store::connect(rank_info(0, 1, 1), {.timeout = 300ms});
  auto start = clock_type::now();
  try {
    store.get("nope");
    FAIL("got a key nobody set");
  } catch (const chorus::error& e) {
    CHECK(e.code() == chorus::errc::timeout);
    CHECK(contains(e.what(), "get 'nope' at 127.0.0.1:"));
    CHECK(contains(e.what(), "timed out after 0.3 s: no rank set the key"));
  }
  CHECK(clock_type::now() - start < 2s);
  store.set("after", bytes("ok"));
  CHECK(text(store.get("after")) == "ok");
}

TEST_CASE("a get_all slice that ends with keys missing returns nothing and leaves the store usable") {
  auto store = chorus::tcp_store::connect(rank_info(0, 1, 1), {.timeout = 300ms});
  const std::vector<std::string> keys = {"k"};
  const std::vector<int> any = {-1};
  // Slices before the whole wait's deadline: nothing yet, no error.
  const auto begun = clock_type::now();
  CHECK_FALSE(store.get_all_slice(keys, any, begun, 20ms).has_value());
  CHECK_FALSE(store.get_all_slice(keys, any, begun, 20ms).has_value());
  store.set("k", bytes("v"));
  auto got = store.get_all_slice(keys, any, begun, 20ms);
  REQUIRE(got.has_value());
  CHECK(text(got->at(0)) == "v");
  // A slice that reaches the deadline fails as get_all does there, and only then.
  const std::vector<std::string> never = {"never"};
  const auto long_ago = clock_type::now() - 250ms;
  try {
    while (!store.get_all_slice(never, any, long_ago, 20ms)) {
    }
    FAIL("got a key nobody set");
  } catch (const chorus::error& e) {
    CHECK(e.code() == chorus::errc::timeout);
    CHECK(contains(e.what(), "get_all of 'never' at 127.0.0.1:"));
    CHECK(contains(e.what(), "timed out after 0.3 s: no rank set 'never'"));
  }
  CHECK(text(store.get("k")) == "v");
}

TEST_CASE("a split group's get of a key nobody sets times out at the store's deadline") {
  auto job = std::make_shared<chorus::tcp_store>(
      chorus::tcp_store::connect(rank_info(0, 1, 1), {.timeout = 300ms}));
  chorus::detail::group_store group(job, std::make_shared<chorus::detail::store_turns>(), "g/", 0, {0});
  try {
    (void)group.get("nope");
    FAIL("got a key nobody set");
  } catch (const chorus::error& e) {
    CHECK(e.code() == chorus::errc::timeout);
    CHECK(contains(e.what(), "timed out after 0.3 s: no rank set 'g/nope'"));
  }
  group.set("after", bytes("ok"));
  CHECK(text(group.get("after")) == "ok");
}

TEST_CASE("keys and values over the limits, and adds on non-counters, are invalid arguments") {
  auto store = chorus::tcp_store::connect(rank_info(0, 1, 1), {.timeout = 1s});
  std::string long_key(4097, 'k');
  CHECK_THROWS_WITH_AS(store.set("", bytes("v")), "chorus: store set: the key is empty",
                       chorus::error);
  try {
    store.get(long_key);
    FAIL("accepted a 4097-byte key");
  } catch (const chorus::error& e) {
    CHECK(e.code() == chorus::errc::invalid_argument);
    CHECK(contains(e.what(), "is 4097 bytes, over the 4096-byte limit"));
  }
  std::size_t too_big = chorus::detail::max_store_value + 1;
  std::unique_ptr<std::byte[]> big(new std::byte[too_big]);  // never touched: the check comes first
  try {
    store.set("big", std::span<const std::byte>(big.get(), too_big));
    FAIL("accepted a value over 64 MiB");
  } catch (const chorus::error& e) {
    CHECK(e.code() == chorus::errc::invalid_argument);
    CHECK(contains(e.what(), "over the 64 MiB limit"));
  }
  store.set("word", bytes("abc"));
  try {
    store.add("word", 1);
    FAIL("added to a non-counter");
  } catch (const chorus::error& e) {
    CHECK(e.code() == chorus::errc::invalid_argument);
    CHECK(contains(e.what(), "holds a 3-byte value, not a counter"));
  }
  // The store is still usable after refusals.
  CHECK(store.add("fresh", 2) == 2);
}

TEST_CASE("a connect with a rank outside the world is an invalid argument") {
  CHECK_THROWS_AS((void)chorus::tcp_store::connect(rank_info(2, 2, 1)), chorus::error);
  CHECK_THROWS_AS((void)chorus::tcp_store::connect(rank_info(-1, 2, 1)), chorus::error);
}

TEST_CASE("CHORUS_BOOTSTRAP_TIMEOUT sets the default store timeout") {
  ::setenv("CHORUS_BOOTSTRAP_TIMEOUT", "2.5", 1);
  chorus::store_options options;
  CHECK(options.timeout == 2500ms);
  ::setenv("CHORUS_BOOTSTRAP_TIMEOUT", "later", 1);
  CHECK_THROWS_WITH_AS((void)chorus::store_options{},
                       "chorus: CHORUS_BOOTSTRAP_TIMEOUT='later' is not a number of seconds",
                       chorus::error);
  ::unsetenv("CHORUS_BOOTSTRAP_TIMEOUT");
  CHECK(chorus::store_options{}.timeout == 120s);
}

TEST_CASE("a frozen rank 0 turns a wait into a timeout shortly after the deadline") {
  std::uint16_t port = free_port();
  auto outcomes = run_ranks(iota_ranks(2), [&](int r) {
    auto store = chorus::tcp_store::connect(rank_info(r, 2, port), {.timeout = 500ms});
    if (r == 0) {
      store.add("pid", ::getpid());
      store.barrier("up");
      while (store.add("past barrier", 0) < 1) std::this_thread::sleep_for(5ms);
      ::raise(SIGSTOP);  // frozen, server thread included; rank 1 kills it
      return 1;
    }
    store.barrier("up");
    auto pid = static_cast<pid_t>(store.add("pid", 0));
    CHILD_CHECK(pid > 0);  // kill(0) would kill the whole test
    store.add("past barrier", 1);
    auto start = clock_type::now();
    int failed = expect_error(
        [&] { (void)store.get("never set"); }, chorus::errc::timeout,
        {"the rendezvous store at 127.0.0.1:" + std::to_string(port) + " did not answer"});
    ::kill(pid, SIGKILL);
    CHILD_CHECK(clock_type::now() - start < 5s);
    return failed;
  });
  CHECK(WIFSIGNALED(outcomes[0].status));
  check_exited_cleanly(outcomes[1]);
}

TEST_CASE("ranks meet over IPv6 loopback") {
  int probe = ::socket(AF_INET6, SOCK_STREAM, 0);
  sockaddr_in6 a{};
  a.sin6_family = AF_INET6;
  a.sin6_addr = in6addr_loopback;
  bool have_ipv6 = probe >= 0 && ::bind(probe, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  socklen_t len = sizeof a;
  if (have_ipv6) ::getsockname(probe, reinterpret_cast<sockaddr*>(&a), &len);
  if (probe >= 0) ::close(probe);
  if (!have_ipv6) {
    MESSAGE("skipped: this machine has no IPv6 loopback (::1)");
    return;
  }
  std::uint16_t port = ntohs(a.sin6_port);
  auto outcomes = run_ranks(iota_ranks(3), [&](int r) {
    auto info = rank_info(r, 3, port);
    info.master_addr = "::1";
    auto store = chorus::tcp_store::connect(info, {.timeout = 10s});
    auto all = store.all_gather("v6", bytes(std::to_string(r)));
    for (int p = 0; p < 3; ++p)
      CHILD_CHECK(text(all[static_cast<std::size_t>(p)]) == std::to_string(p));
    return 0;
  });
  for (const auto& c : outcomes) check_exited_cleanly(c);
}
