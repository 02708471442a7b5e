// SPDX-License-Identifier: Apache-2.0
// POSIX socket plumbing shared by the bootstrap store and the TCP transport: owned descriptors,
// name resolution, I/O with deadlines.
#pragma once

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

namespace chorus::detail {

using store_clock = std::chrono::steady_clock;

/// Owns one file descriptor; closes it on destruction.
class unique_fd {
 public:
  unique_fd() = default;
  explicit unique_fd(int fd) noexcept : fd_(fd) {}
  unique_fd(unique_fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  unique_fd& operator=(unique_fd&& other) noexcept {
    if (this != &other) reset(std::exchange(other.fd_, -1));
    return *this;
  }
  unique_fd(const unique_fd&) = delete;
  unique_fd& operator=(const unique_fd&) = delete;
  ~unique_fd() { reset(); }

  int get() const noexcept { return fd_; }
  explicit operator bool() const noexcept { return fd_ >= 0; }
  void reset(int fd = -1) noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

/// strerror's text for an errno value, thread-safe.
inline std::string store_errno_text(int err) { return std::generic_category().message(err); }

/// "host:port", with an IPv6 literal bracketed: "[::1]:29500".
inline std::string store_host_port(std::string_view host, std::uint16_t port) {
  std::string text =
      host.find(':') != std::string_view::npos ? "[" + std::string(host) + "]" : std::string(host);
  return text + ":" + std::to_string(port);
}

/// The numeric "address:port" of a socket address, e.g. "127.0.0.1:41234".
inline std::string store_numeric_address(const sockaddr* addr, socklen_t length) {
  char host[NI_MAXHOST];
  char serv[NI_MAXSERV];
  if (::getnameinfo(addr, length, host, sizeof host, serv, sizeof serv,
                    NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    return "?";
  }
  std::string h(host);
  return (h.find(':') != std::string::npos ? "[" + h + "]" : h) + ":" + serv;
}

/// One result of name resolution, copied out of getaddrinfo's list.
struct store_address {
  sockaddr_storage storage{};
  socklen_t length = 0;
  int family = 0;
  std::string text;  ///< numeric "address:port"

  const sockaddr* addr() const noexcept { return reinterpret_cast<const sockaddr*>(&storage); }
};

/// Resolves `host` for TCP on `port`, IPv4 and IPv6 alike. On failure returns an empty list
/// and puts getaddrinfo's reason in `reason`. No AI_ADDRCONFIG: in a network namespace with
/// only loopback it would hide 127.0.0.1 and ::1.
inline std::vector<store_address> store_resolve(const std::string& host, std::uint16_t port,
                                                std::string& reason) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_protocol = IPPROTO_TCP;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* list = nullptr;
  std::string service = std::to_string(port);
  int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &list);
  std::vector<store_address> out;
  if (rc != 0) {
    reason = "cannot resolve '" + host +
             "': " + (rc == EAI_SYSTEM ? store_errno_text(errno) : std::string(::gai_strerror(rc)));
    return out;
  }
  for (addrinfo* ai = list; ai != nullptr; ai = ai->ai_next) {
    if (ai->ai_addrlen > sizeof(sockaddr_storage)) continue;
    store_address r;
    std::copy_n(reinterpret_cast<const std::byte*>(ai->ai_addr), ai->ai_addrlen,
                reinterpret_cast<std::byte*>(&r.storage));
    r.length = ai->ai_addrlen;
    r.family = ai->ai_family;
    r.text = store_numeric_address(ai->ai_addr, ai->ai_addrlen);
    out.push_back(std::move(r));
  }
  ::freeaddrinfo(list);
  if (out.empty()) reason = "'" + host + "' resolves to no TCP address";
  return out;
}

/// Sends each small message at once instead of waiting for more (Nagle): the store is
/// request/response, where coalescing only adds latency.
inline void store_set_nodelay(int fd) noexcept {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/// Milliseconds until `deadline` for poll(): 0 when passed, rounded up, clamped to int.
inline int poll_ms(store_clock::time_point deadline) {
  auto left = deadline - store_clock::now();
  if (left <= store_clock::duration::zero()) return 0;
  auto ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
  return static_cast<int>(std::min<std::int64_t>(ms, INT_MAX));
}

/// How a blocking-with-deadline transfer ended.
enum class io_status { ok, closed, timed_out, failed };
struct io_result {
  io_status status = io_status::ok;
  int error = 0;  ///< errno for failed (and for closed by reset)
};

/// Waits for `events` on `fd` until `deadline`. Returns ok, timed_out or failed.
inline io_result wait_fd(int fd, short events, store_clock::time_point deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    int n = ::poll(&p, 1, poll_ms(deadline));
    if (n > 0) return {};
    if (n == 0) return {io_status::timed_out, 0};
    if (errno != EINTR) return {io_status::failed, errno};
  }
}

/// Writes every byte of `parts` to the non-blocking socket `fd` before `deadline`.
inline io_result send_all(int fd, std::vector<iovec> parts,
                                      store_clock::time_point deadline) {
  std::size_t first = 0;
  while (first < parts.size()) {
    if (parts[first].iov_len == 0) {
      ++first;
      continue;
    }
    msghdr msg{};
    msg.msg_iov = parts.data() + first;
    msg.msg_iovlen = std::min<std::size_t>(parts.size() - first, IOV_MAX);
    ssize_t n = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        io_result w = wait_fd(fd, POLLOUT, deadline);
        if (w.status != io_status::ok) return w;
        continue;
      }
      if (errno == EPIPE || errno == ECONNRESET) return {io_status::closed, errno};
      return {io_status::failed, errno};
    }
    auto sent = static_cast<std::size_t>(n);
    while (sent > 0 && first < parts.size()) {
      std::size_t take = std::min(sent, parts[first].iov_len);
      parts[first].iov_base = static_cast<char*>(parts[first].iov_base) + take;
      parts[first].iov_len -= take;
      sent -= take;
      if (parts[first].iov_len == 0) ++first;
    }
  }
  return {};
}

/// Reads exactly `size` bytes from the non-blocking socket `fd` before `deadline`.
/// End of stream before the last byte is `closed`.
inline io_result recv_exact(int fd, void* data, std::size_t size,
                                        store_clock::time_point deadline) {
  auto* p = static_cast<char*>(data);
  std::size_t have = 0;
  while (have < size) {
    ssize_t n = ::recv(fd, p + have, size - have, 0);
    if (n > 0) {
      have += static_cast<std::size_t>(n);
      continue;
    }
    if (n == 0) return {io_status::closed, 0};
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      io_result w = wait_fd(fd, POLLIN, deadline);
      if (w.status != io_status::ok) return w;
      continue;
    }
    if (errno == ECONNRESET) return {io_status::closed, errno};
    return {io_status::failed, errno};
  }
  return {};
}

/// Opens a non-blocking TCP connection to `to`, waiting for it until `deadline`.
/// Returns the socket, or an empty one with the reason's errno in `err`.
inline unique_fd store_connect_tcp(const store_address& to, store_clock::time_point deadline,
                                  int& err) {
  unique_fd fd(::socket(to.family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, IPPROTO_TCP));
  if (!fd) {
    err = errno;
    return {};
  }
  if (::connect(fd.get(), to.addr(), to.length) == 0) {
    store_set_nodelay(fd.get());
    return fd;
  }
  if (errno != EINPROGRESS && errno != EINTR) {
    err = errno;
    return {};
  }
  io_result w = wait_fd(fd.get(), POLLOUT, deadline);
  if (w.status != io_status::ok) {
    err = w.status == io_status::timed_out ? ETIMEDOUT : w.error;
    return {};
  }
  int so_error = 0;
  socklen_t len = sizeof so_error;
  if (::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &so_error, &len) != 0) {
    err = errno;
    return {};
  }
  if (so_error != 0) {
    err = so_error;
    return {};
  }
  store_set_nodelay(fd.get());
  return fd;
}

/// Writes one line to stderr when a store event is worth a human's attention: a peer that
/// sent a bad frame, a rejected rank. Always on, because a silently dropped connection is
/// what makes bootstrap failures hard to diagnose; routine events print only with
/// CHORUS_DEBUG set.
inline void store_log(const std::string& line) {
  std::string text = "chorus: " + line + "\n";
  std::fwrite(text.data(), 1, text.size(), stderr);
}

inline bool store_debug_enabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("CHORUS_DEBUG");
    return v != nullptr && *v != '\0' && std::string_view(v) != "0";
  }();
  return enabled;
}

}  // namespace chorus::detail
