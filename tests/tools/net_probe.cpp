// SPDX-License-Identifier: Apache-2.0
// net_probe: a rank program for the chorus-run --nodes tests. Every rank but 0 connects to
// rank 0 at CHORUS_MASTER_ADDR:CHORUS_MASTER_PORT and sends BYTES bytes; rank 0 accepts one
// connection per other rank and prints, per sender, what arrived, from where and how fast.
//
//   $ chorus-run --nodes 2 -n 1 net_probe 1000000
//   [0] got 1000000 bytes from rank 1 at 10.16.146.2 in 0.004 s
//
// Exit status 1 with a message when anything fails or takes longer than 30 s.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace {

using clock_type = std::chrono::steady_clock;
// Every wait of the probe ends by this long after it started, so a test cannot hang on it.
constexpr auto deadline_after = std::chrono::seconds(30);

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "net_probe: %s: %s\n", what.c_str(), std::strerror(errno));
  std::exit(1);
}

int env_int(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) {
    std::fprintf(stderr, "net_probe: %s is not set; run me under chorus-run\n", name);
    std::exit(1);
  }
  return std::atoi(v);
}

// Waits for `events` on `fd` until `deadline`; false when the deadline passed first.
bool wait_for(int fd, short events, clock_type::time_point deadline) {
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock_type::now());
    if (left.count() <= 0) return false;
    pollfd p{fd, events, 0};
    int n = ::poll(&p, 1, static_cast<int>(left.count()));
    if (n > 0) return true;
    if (n < 0 && errno != EINTR) fail("poll");
  }
}

void serve(int port, int peers, clock_type::time_point deadline) {
  int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  ::setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  if (::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) fail("bind");
  if (::listen(listener, peers) != 0) fail("listen");
  std::vector<char> buf(1 << 16);
  // One sender at a time: the others wait in the backlog and their send buffers, which
  // keeps each sender's rate measurement its own.
  for (int k = 0; k < peers; ++k) {
    if (!wait_for(listener, POLLIN, deadline)) fail("timed out waiting for a connection");
    sockaddr_in from{};
    socklen_t len = sizeof from;
    int conn = ::accept(listener, reinterpret_cast<sockaddr*>(&from), &len);
    if (conn < 0) fail("accept");
    auto start = clock_type::now();
    std::string header;  // "<rank>\n" comes first
    long long bytes = 0;
    for (;;) {
      if (!wait_for(conn, POLLIN, deadline)) fail("timed out reading");
      ssize_t n = ::read(conn, buf.data(), buf.size());
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) fail("read");
      if (n == 0) break;
      std::size_t used = 0;
      while (header.empty() || header.back() != '\n') {
        if (used == static_cast<std::size_t>(n)) break;
        header += buf[used++];
      }
      bytes += n - static_cast<ssize_t>(used);
    }
    double seconds = std::chrono::duration<double>(clock_type::now() - start).count();
    char ip[INET_ADDRSTRLEN] = {};
    ::inet_ntop(AF_INET, &from.sin_addr, ip, sizeof ip);
    if (header.empty() || header.back() != '\n') {
      errno = EPROTO;
      fail("a sender closed before naming its rank");
    }
    header.pop_back();
    std::printf("got %lld bytes from rank %s at %s in %.3f s\n", bytes, header.c_str(), ip,
                seconds);
    ::close(conn);
  }
  ::close(listener);
}

void send_to(const char* host, int port, int rank, long long bytes,
             clock_type::time_point deadline) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  if (::inet_pton(AF_INET, host, &addr.sin_addr) != 1) fail(std::string("address ") + host);
  int fd = -1;
  // Rank 0 may not listen yet: retry until it does.
  for (;;) {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) break;
    ::close(fd);
    if (clock_type::now() > deadline) fail(std::string("connect to ") + host);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::string header = std::to_string(rank) + "\n";
  std::vector<char> data(1 << 16, 'x');
  std::string_view pending = header;
  long long left = bytes;
  while (!pending.empty() || left > 0) {
    if (pending.empty()) {
      auto chunk = static_cast<std::size_t>(std::min<long long>(left, 1 << 16));
      pending = std::string_view(data.data(), chunk);
      left -= static_cast<long long>(chunk);
    }
    if (!wait_for(fd, POLLOUT, deadline)) fail("timed out sending");
    ssize_t n = ::send(fd, pending.data(), pending.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail("send");
    pending.remove_prefix(static_cast<std::size_t>(n));
  }
  ::shutdown(fd, SHUT_WR);
  // Wait for rank 0 to close: the bytes are then received, not just queued.
  char c;
  while (wait_for(fd, POLLIN, deadline) && ::read(fd, &c, 1) > 0) {
  }
  ::close(fd);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: net_probe BYTES   (under chorus-run)\n");
    return 2;
  }
  long long bytes = std::atoll(argv[1]);
  auto deadline = clock_type::now() + deadline_after;
  int rank = env_int("CHORUS_RANK");
  int size = env_int("CHORUS_WORLD_SIZE");
  int port = env_int("CHORUS_MASTER_PORT");
  const char* master = std::getenv("CHORUS_MASTER_ADDR");
  if (master == nullptr) fail("CHORUS_MASTER_ADDR is not set");
  if (rank == 0) {
    serve(port, size - 1, deadline);
  } else {
    send_to(master, port, rank, bytes, deadline);
  }
  return 0;
}
