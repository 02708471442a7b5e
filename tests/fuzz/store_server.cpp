// SPDX-License-Identifier: Apache-2.0
// Fuzz target: the rendezvous store's server (store_server.hpp), fed a client's bytes over a
// real loopback connection.
//
// One server (a world of 2 ranks, an ephemeral port) serves the inputs one connection each;
// it is replaced every 1000 inputs, so that the keys inputs set cannot pile up for a whole run.
// Per input: connect; if the input's first byte is odd, run the genuine handshake (the server's
// secret is known here) as rank (byte >> 1) & 1, so that the rest reaches the frame parser;
// if even, the rest goes to the handshake parser itself. Then send the bytes while reading
// whatever the server answers, shut down our sending side, and read until the server closes.
// Inputs over 64 KiB are skipped: they would outgrow the socket buffers while the server, by
// design, stops reading a connection whose request waits.
//
// What must hold: the server never crashes (ASan, UBSan, an exception that escapes its
// thread), and closes a connection whose peer has finished sending within seconds: it either
// reads the end of the stream or, busy with a wait, sees the peer hang up.
#include <poll.h>
#include <sys/socket.h>

#include <chorus/bootstrap/detail/handshake.hpp>
#include <chorus/bootstrap/detail/store_server.hpp>

#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

namespace {

using namespace chorus::detail;

constexpr std::size_t max_input = 64 * 1024 + 1;  // the mode byte and 64 KiB of bytes
constexpr int inputs_per_server = 1000;
constexpr auto close_deadline = std::chrono::seconds(5);

const chorus::job_secret& secret() {
  static const chorus::job_secret s = [] {
    const std::string text = "fuzz-store-server-secret";
    return chorus::job_secret::from_bytes(std::as_bytes(std::span(text.data(), text.size())));
  }();
  return s;
}

[[noreturn]] void fail(const char* why) {
  std::fprintf(stderr, "fuzz store_server: %s\n", why);
  std::abort();
}

/// The server for this input: a fresh one every inputs_per_server inputs.
store_server& server() {
  static std::unique_ptr<store_server> s;
  static int served = 0;
  if (!s || served++ == inputs_per_server) {
    s.reset();  // joins the old server's thread first
    s = std::make_unique<store_server>("127.0.0.1", std::uint16_t{0}, 2, std::chrono::seconds(1),
                                       secret());
    s->start();
    served = 1;
  }
  return *s;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0 || size > max_input) return 0;
  const std::uint8_t mode = data[0];
  ++data;
  --size;
  store_server& s = server();
  const auto deadline = store_clock::now() + close_deadline;
  std::string reason;
  const auto addresses = store_resolve("127.0.0.1", s.port(), reason);
  if (addresses.empty()) fail("cannot resolve 127.0.0.1");
  int err = 0;
  unique_fd fd = store_connect_tcp(addresses.front(), deadline, err);
  if (!fd) fail("cannot connect to the store server");
  if ((mode & 1) != 0) {
    auth_hello hello;
    hello.kind = auth_kind::store;
    hello.initiator = static_cast<std::uint32_t>((mode >> 1) & 1);
    hello.world = 2;
    auth_result proved;
    // The previous input's connection for the same rank may not be reaped yet; the server
    // then refuses the hello that follows, which is a path worth fuzzing too.
    if (auth_initiate(fd.get(), secret(), hello, deadline, proved)) {
      fail("the server refused a genuine handshake");
    }
  }

  std::size_t sent = 0;
  bool shut = false;
  for (;;) {
    if (sent == size && !shut) {
      ::shutdown(fd.get(), SHUT_WR);
      shut = true;
    }
    pollfd p{fd.get(), static_cast<short>(POLLIN | (shut ? 0 : POLLOUT)), 0};
    const int n = ::poll(&p, 1, poll_ms(deadline));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail("the server kept a connection open after its peer finished sending");
    if ((p.revents & POLLOUT) != 0) {
      const ssize_t w = ::send(fd.get(), data + sent, size - sent, MSG_NOSIGNAL);
      if (w > 0) {
        sent += static_cast<std::size_t>(w);
      } else if (w < 0 && errno != EAGAIN && errno != EINTR) {
        sent = size;  // the server closed on us (a bad frame): nothing more to send
      }
    }
    if ((p.revents & (POLLIN | POLLHUP | POLLERR)) != 0) {
      char sink[16384];
      const ssize_t r = ::recv(fd.get(), sink, sizeof sink, 0);
      if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) break;  // closed: done
    }
  }
  return 0;
}
