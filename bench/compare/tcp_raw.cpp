// SPDX-License-Identifier: Apache-2.0
// The raw TCP baseline for bench/compare: what two processes on loopback get from plain
// sockets with system defaults, the ceiling a TCP collective can approach.
//
// Usage: tcp_raw pingpong [--iters I] [--warmup W]
//          8-byte ping-pong with TCP_NODELAY; one-way latency = mean round trip / 2.
//        tcp_raw bandwidth [--conns K] [--bytes 64M] [--iters I] [--warmup W]
//          both processes send and receive BYTES at the same time (full duplex, the traffic
//          of a 2-rank ring), split over K connections; GB/s per direction = BYTES / time.
//        tcp_raw ring [--ranks N] [--bytes 64M] [--iters I] [--warmup W]
//          N processes in a ring, each streaming 2(N-1)/N * BYTES to the next while it
//          receives as much from the previous, on one connection: the bytes a bandwidth-optimal
//          all-reduce of BYTES sends per rank, with no step waiting for another and nothing
//          reduced. busbw_ceiling = those bytes / time, what no TCP all-reduce of BYTES on N
//          ranks here can beat (nccl-tests busbw of all-reduce is the same ratio).
// The program forks its peers; it prints one RESULT line. Build: g++ -O2 -std=c++20 tcp_raw.cpp
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "measure.hpp"

namespace {

[[noreturn]] void die(const char* what) {
  std::fprintf(stderr, "tcp_raw: %s: %s\n", what, std::strerror(errno));
  std::exit(1);
}

void send_all(int fd, const void* data, std::size_t n) {
  auto p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL);
    if (k < 0) {
      if (errno == EINTR) continue;
      die("send");
    }
    p += k;
    n -= static_cast<std::size_t>(k);
  }
}

void recv_all(int fd, void* data, std::size_t n) {
  auto p = static_cast<char*>(data);
  while (n > 0) {
    ssize_t k = ::recv(fd, p, n, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) die("recv");
    p += k;
    n -= static_cast<std::size_t>(k);
  }
}

// Sets up K connections between this process (the listener, "rank 0") and a forked child
// ("rank 1"). Returns the connections of this side; *child tells which side we are.
std::vector<int> connect_pair(int k, bool* child, pid_t* child_pid) {
  int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  if (listener < 0) die("socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) die("bind");
  if (::listen(listener, k) != 0) die("listen");
  if (::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0) die("getsockname");
  std::fflush(stdout);
  pid_t pid = ::fork();
  if (pid < 0) die("fork");
  std::vector<int> fds;
  if (pid == 0) {
    ::close(listener);
    for (int i = 0; i < k; ++i) {
      int fd = ::socket(AF_INET, SOCK_STREAM, 0);
      if (fd < 0) die("socket");
      if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) die("connect");
      fds.push_back(fd);
    }
  } else {
    for (int i = 0; i < k; ++i) {
      int fd = ::accept(listener, nullptr, nullptr);
      if (fd < 0) die("accept");
      fds.push_back(fd);
    }
    ::close(listener);
  }
  *child = pid == 0;
  *child_pid = pid;
  return fds;
}

int finish(bool child, pid_t pid, const std::vector<int>& fds) {
  for (int fd : fds) ::close(fd);
  if (child) std::_Exit(0);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}

int pingpong(int iters, int warmup) {
  bool child = false;
  pid_t pid = 0;
  auto fds = connect_pair(1, &child, &pid);
  int fd = fds[0];
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  std::uint64_t msg = 0;
  std::vector<double> round_trips;
  round_trips.reserve(static_cast<std::size_t>(iters));
  for (int i = 0; i < warmup + iters; ++i) {
    if (child) {
      recv_all(fd, &msg, sizeof msg);
      send_all(fd, &msg, sizeof msg);
    } else {
      double start = compare::now_us();
      send_all(fd, &msg, sizeof msg);
      recv_all(fd, &msg, sizeof msg);
      if (i >= warmup) round_trips.push_back(compare::now_us() - start);
      ++msg;
    }
  }
  if (!child) {
    auto s = compare::summarize(round_trips);
    std::printf("RESULT impl=tcp_raw op=pingpong size=8 iters=%d rtt_median_us=%.3f "
                "rtt_mean_us=%.3f oneway_us=%.3f\n",
                iters, s.median_us, s.mean_us, s.mean_us / 2);
  }
  return finish(child, pid, fds);
}

// Sends `bytes` over `out` while receiving as many over `in` (the same sockets for a pair,
// the next and previous rank's in a ring): each connection carries an equal part; one poll()
// loop drives every socket, as an event-driven transport would.
double exchange(const std::vector<int>& out, const std::vector<int>& in, const char* send_buf,
                char* recv_buf, std::size_t bytes) {
  const std::size_t k = out.size();
  const std::size_t part = (bytes + k - 1) / k;
  std::vector<std::size_t> sent(k, 0), received(k, 0), length(k);
  for (std::size_t i = 0; i < k; ++i) {
    std::size_t begin = std::min(bytes, i * part);
    length[i] = std::min(bytes, begin + part) - begin;
  }
  // pfds[2i] sends on out[i], pfds[2i + 1] receives on in[i] (poll() takes a socket twice).
  std::vector<pollfd> pfds(2 * k);
  double start = compare::now_us();
  for (;;) {
    bool pending = false;
    for (std::size_t i = 0; i < k; ++i) {
      pfds[2 * i] = {sent[i] < length[i] ? out[i] : -1, POLLOUT, 0};
      pfds[2 * i + 1] = {received[i] < length[i] ? in[i] : -1, POLLIN, 0};
      pending = pending || sent[i] < length[i] || received[i] < length[i];
    }
    if (!pending) break;
    if (::poll(pfds.data(), static_cast<nfds_t>(pfds.size()), -1) < 0) {
      if (errno == EINTR) continue;
      die("poll");
    }
    for (std::size_t i = 0; i < k; ++i) {
      const std::size_t base = i * part;
      if (pfds[2 * i].revents & (POLLOUT | POLLERR)) {
        ssize_t n = ::send(out[i], send_buf + base + sent[i], length[i] - sent[i],
                           MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) sent[i] += static_cast<std::size_t>(n);
        else if (n < 0 && errno != EAGAIN && errno != EINTR) die("send");
      }
      if (pfds[2 * i + 1].revents & (POLLIN | POLLHUP | POLLERR)) {
        ssize_t n = ::recv(in[i], recv_buf + base + received[i], length[i] - received[i],
                           MSG_DONTWAIT);
        if (n > 0) received[i] += static_cast<std::size_t>(n);
        else if (n == 0) die("recv (peer closed)");
        else if (errno != EAGAIN && errno != EINTR) die("recv");
      }
    }
  }
  return compare::now_us() - start;
}

int bandwidth(int conns, std::size_t bytes, int iters, int warmup) {
  bool child = false;
  pid_t pid = 0;
  auto fds = connect_pair(conns, &child, &pid);
  // Touched before timing; page faults are not what we measure.
  std::vector<char> send_buf(bytes, 1), recv_buf(bytes, 0);
  std::vector<double> times;
  for (int i = 0; i < warmup + iters; ++i) {
    // Start together: a one-byte handshake on connection 0.
    char token = 0;
    send_all(fds[0], &token, 1);
    recv_all(fds[0], &token, 1);
    double us = exchange(fds, fds, send_buf.data(), recv_buf.data(), bytes);
    if (i >= warmup) times.push_back(us);
  }
  if (!child) {
    auto s = compare::summarize(times);
    double gbps = static_cast<double>(bytes) / (s.mean_us * 1e-6) / 1e9;
    std::printf("RESULT impl=tcp_raw op=bandwidth conns=%d size=%zu iters=%d median_us=%.3f "
                "mean_us=%.3f gbps_per_direction=%.4f\n",
                conns, bytes, iters, s.median_us, s.mean_us, gbps);
  }
  return finish(child, pid, fds);
}

// Rank r of n listens on listeners[r], dials listeners[(r + 1) % n] and accepts its
// previous rank: returns {to next, from previous}. Rank 0 is this process; the others are
// forked (their pids in *children).
std::pair<int, int> connect_ring(int n, int* rank, std::vector<pid_t>* children) {
  std::vector<int> listeners(static_cast<std::size_t>(n));
  std::vector<sockaddr_in> addrs(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) die("socket");
    sockaddr_in& a = addrs[static_cast<std::size_t>(r)];
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) die("bind");
    if (::listen(fd, 1) != 0) die("listen");
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) die("getsockname");
    listeners[static_cast<std::size_t>(r)] = fd;
  }
  std::fflush(stdout);
  *rank = 0;
  for (int r = 1; r < n; ++r) {
    pid_t pid = ::fork();
    if (pid < 0) die("fork");
    if (pid == 0) {
      *rank = r;
      children->clear();
      break;
    }
    children->push_back(pid);
  }
  const auto me = static_cast<std::size_t>(*rank);
  const sockaddr_in& next = addrs[(me + 1) % static_cast<std::size_t>(n)];
  int to_next = ::socket(AF_INET, SOCK_STREAM, 0);
  if (to_next < 0) die("socket");
  // Listeners have backlog room, so every dial completes before anyone accepts.
  if (::connect(to_next, reinterpret_cast<const sockaddr*>(&next), sizeof next) != 0) die("connect");
  int from_prev = ::accept(listeners[me], nullptr, nullptr);
  if (from_prev < 0) die("accept");
  for (int fd : listeners) ::close(fd);
  return {to_next, from_prev};
}

// A token once around the ring: when it is back at rank 0, every rank has passed this point.
void ring_token(int rank, int to_next, int from_prev) {
  char token = 0;
  if (rank == 0) {
    send_all(to_next, &token, 1);
    recv_all(from_prev, &token, 1);
  } else {
    recv_all(from_prev, &token, 1);
    send_all(to_next, &token, 1);
  }
}

int ring(int n, std::size_t bytes, int iters, int warmup) {
  int rank = 0;
  std::vector<pid_t> children;
  auto [to_next, from_prev] = connect_ring(n, &rank, &children);
  const std::size_t moved =
      bytes / static_cast<std::size_t>(n) * 2 * static_cast<std::size_t>(n - 1);
  std::vector<char> send_buf(moved, 1), recv_buf(moved, 0);  // touched before timing
  std::vector<double> times;
  for (int i = 0; i < warmup + iters; ++i) {
    ring_token(rank, to_next, from_prev);  // everyone is ready
    const double start = compare::now_us();
    exchange({to_next}, {from_prev}, send_buf.data(), recv_buf.data(), moved);
    ring_token(rank, to_next, from_prev);  // everyone is done
    if (i >= warmup) times.push_back(compare::now_us() - start);
  }
  ::close(to_next);
  ::close(from_prev);
  if (rank != 0) std::_Exit(0);
  int failed = 0;
  for (pid_t pid : children) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    failed += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  auto s = compare::summarize(times);
  std::printf("RESULT impl=tcp_raw op=ring ranks=%d size=%zu bytes_per_rank=%zu iters=%d "
              "median_us=%.3f mean_us=%.3f busbw_ceiling=%.4f\n",
              n, bytes, moved, iters, s.median_us, s.mean_us,
              static_cast<double>(moved) / (s.mean_us * 1e-6) / 1e9);
  return failed == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: tcp_raw pingpong [--iters I] [--warmup W]\n"
                         "       tcp_raw bandwidth [--conns K] [--bytes 64M] [--iters I] "
                         "[--warmup W]\n"
                         "       tcp_raw ring [--ranks N] [--bytes 64M] [--iters I] [--warmup W]\n");
    return 2;
  }
  std::string mode = argv[1];
  int iters = mode == "pingpong" ? 20000 : 10;
  int warmup = mode == "pingpong" ? 1000 : 2;
  int conns = 1;
  int ranks = 4;
  std::size_t bytes = std::size_t{64} << 20;
  for (int i = 2; i + 1 < argc; i += 2) {
    std::string arg = argv[i];
    if (arg == "--iters") iters = std::atoi(argv[i + 1]);
    else if (arg == "--warmup") warmup = std::atoi(argv[i + 1]);
    else if (arg == "--conns") conns = std::atoi(argv[i + 1]);
    else if (arg == "--ranks") ranks = std::atoi(argv[i + 1]);
    else if (arg == "--bytes") bytes = compare::parse_size(argv[i + 1]);
    else {
      std::fprintf(stderr, "tcp_raw: unknown option %s\n", arg.c_str());
      return 2;
    }
  }
  if (conns < 1 || iters < 1 || bytes < 1) {
    std::fprintf(stderr, "tcp_raw: --conns, --iters and --bytes must be positive\n");
    return 2;
  }
  if (ranks < 2 || ranks > 256) {
    std::fprintf(stderr, "tcp_raw: --ranks must be in [2, 256]\n");
    return 2;
  }
  if (mode == "pingpong") return pingpong(iters, warmup);
  if (mode == "bandwidth") return bandwidth(conns, bytes, iters, warmup);
  if (mode == "ring") return ring(ranks, bytes, iters, warmup);
  std::fprintf(stderr, "tcp_raw: unknown mode %s\n", mode.c_str());
  return 2;
}
