// SPDX-License-Identifier: Apache-2.0
// Fuzz target: the rendezvous store's server (store_server.hpp), fed a client's bytes over a
// real loopback connection.
//
// One server (a world of 2 ranks, an ephemeral port) serves the inputs one connection each;
// it is replaced every 1000 inputs, so that the keys inputs set cannot pile up for a whole run.
// Per input: connect, send the bytes while reading whatever the server answers, shut down our
// sending side, then read until the server closes. Inputs over 64 KiB are skipped: they would
// outgrow the socket buffers while the server, by design, stops reading a connection whose
// request waits.
//
// What must hold: the server never crashes (ASan, UBSan, an exception that escapes its
// thread), and closes a connection whose peer has finished sending within seconds: it either
// reads the end of the stream or, busy with a wait, sees the peer hang up.
#include <poll.h>
#include <sys/socket.h>

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

constexpr std::size_t max_input = 64 * 1024;
constexpr int inputs_per_server = 1000;
constexpr auto close_deadline = std::chrono::seconds(5);

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
    s = std::make_unique<store_server>("127.0.0.1", std::uint16_t{0}, 2, std::chrono::seconds(1));
    s->start();
    served = 1;
  }
  return *s;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size > max_input) return 0;
  store_server& s = server();
  const auto deadline = store_clock::now() + close_deadline;
  std::string reason;
  const auto addresses = store_resolve("127.0.0.1", s.port(), reason);
  if (addresses.empty()) fail("cannot resolve 127.0.0.1");
  int err = 0;
  unique_fd fd = store_connect_tcp(addresses.front(), deadline, err);
  if (!fd) fail("cannot connect to the store server");

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
