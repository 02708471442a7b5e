// SPDX-License-Identifier: Apache-2.0
// The raw TCP baseline for bench/compare: what two processes on loopback get from plain
// sockets with system defaults, the ceiling a TCP collective can approach.
//
// Usage: tcp_raw pingpong [--iters I] [--warmup W]
//          8-byte ping-pong with TCP_NODELAY; one-way latency = mean round trip / 2.
//        tcp_raw bandwidth [--conns K] [--bytes 64M] [--iters I] [--warmup W]
//          both processes send and receive BYTES at the same time (full duplex, the traffic
//          of a 2-rank ring), split over K connections; GB/s per direction = BYTES / time.
// The program forks its peer; it prints one RESULT line. Build: g++ -O2 -std=c++20 tcp_raw.cpp
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

// Moves `bytes` each way at once over the connections: each connection carries an equal
// part in both directions; one poll() loop drives every socket, as an event-driven
// transport would.
double exchange(const std::vector<int>& fds, const char* send_buf, char* recv_buf,
                std::size_t bytes) {
  const std::size_t k = fds.size();
  const std::size_t part = (bytes + k - 1) / k;
  std::vector<std::size_t> sent(k, 0), received(k, 0), length(k);
  for (std::size_t i = 0; i < k; ++i) {
    std::size_t begin = std::min(bytes, i * part);
    length[i] = std::min(bytes, begin + part) - begin;
  }
  std::vector<pollfd> pfds(k);
  double start = compare::now_us();
  for (;;) {
    bool pending = false;
    for (std::size_t i = 0; i < k; ++i) {
      short events = 0;
      if (sent[i] < length[i]) events |= POLLOUT;
      if (received[i] < length[i]) events |= POLLIN;
      pfds[i] = {fds[i], events, 0};
      pending = pending || events != 0;
    }
    if (!pending) break;
    if (::poll(pfds.data(), static_cast<nfds_t>(k), -1) < 0) {
      if (errno == EINTR) continue;
      die("poll");
    }
    for (std::size_t i = 0; i < k; ++i) {
      const std::size_t base = i * part;
      if (pfds[i].revents & POLLOUT) {
        ssize_t n = ::send(fds[i], send_buf + base + sent[i], length[i] - sent[i],
                           MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) sent[i] += static_cast<std::size_t>(n);
        else if (n < 0 && errno != EAGAIN && errno != EINTR) die("send");
      }
      if (pfds[i].revents & (POLLIN | POLLHUP | POLLERR)) {
        ssize_t n = ::recv(fds[i], recv_buf + base + received[i], length[i] - received[i],
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
    double us = exchange(fds, send_buf.data(), recv_buf.data(), bytes);
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

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: tcp_raw pingpong [--iters I] [--warmup W]\n"
                         "       tcp_raw bandwidth [--conns K] [--bytes 64M] [--iters I] "
                         "[--warmup W]\n");
    return 2;
  }
  std::string mode = argv[1];
  int iters = mode == "pingpong" ? 20000 : 10;
  int warmup = mode == "pingpong" ? 1000 : 2;
  int conns = 1;
  std::size_t bytes = std::size_t{64} << 20;
  for (int i = 2; i + 1 < argc; i += 2) {
    std::string arg = argv[i];
    if (arg == "--iters") iters = std::atoi(argv[i + 1]);
    else if (arg == "--warmup") warmup = std::atoi(argv[i + 1]);
    else if (arg == "--conns") conns = std::atoi(argv[i + 1]);
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
  if (mode == "pingpong") return pingpong(iters, warmup);
  if (mode == "bandwidth") return bandwidth(conns, bytes, iters, warmup);
  std::fprintf(stderr, "tcp_raw: unknown mode %s\n", mode.c_str());
  return 2;
}
