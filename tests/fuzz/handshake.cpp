// SPDX-License-Identifier: Apache-2.0
// Fuzz target: the connection handshake (bootstrap/detail/handshake.hpp) from both ends.
//
// Responder: the input is fed to an auth_responder in chunks no larger than it asks for, as
// a stranger's bytes would arrive; its answers are dropped. Initiator: the input's first 80
// bytes are the responder's challenge, waiting in a socket pair when auth_initiate reads it.
//
// What must hold beyond "no crash": neither end may ever accept. Accepting needs a proof
// that only the secret can make, and the responder's proof covers a nonce it has just drawn,
// so an input that completes either handshake means the check is broken.
#include <sys/socket.h>

#include <chorus/bootstrap/detail/handshake.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

using namespace chorus::detail;

[[noreturn]] void fail(const char* why) {
  std::fprintf(stderr, "fuzz handshake: %s\n", why);
  std::abort();
}

const chorus::job_secret& secret() {
  static const chorus::job_secret s = [] {
    const std::string text = "fuzz-handshake-secret";
    return chorus::job_secret::from_bytes(std::as_bytes(std::span(text.data(), text.size())));
  }();
  return s;
}

void as_responder(const std::uint8_t* data, std::size_t size) {
  auth_id job{};
  auth_responder r(secret(), job, [](const auth_hello& h) -> std::optional<std::string> {
    if (h.kind != auth_kind::tcp || h.world == 0) return "not expected";
    return std::nullopt;
  });
  std::size_t at = 0;
  while (at < size && !r.done() && !r.failed()) {
    auto into = r.next_read();
    if (into.empty()) fail("the responder asked for nothing while neither done nor failed");
    // Chunks of 1..16 bytes (from the data itself), so partial reads are exercised.
    const std::size_t chunk = std::min({into.size(), size - at, std::size_t{data[at] % 16u} + 1});
    std::memcpy(into.data(), data + at, chunk);
    (void)r.received(chunk);
    at += chunk;
  }
  if (r.done()) fail("the responder accepted a proof it did not ask for");
}

void as_initiator(const std::uint8_t* data, std::size_t size) {
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, fds) != 0) {
    fail("socketpair");
  }
  unique_fd ours(fds[0]), theirs(fds[1]);
  const std::size_t n = std::min(size, auth_challenge_bytes);
  if (n > 0 && ::send(theirs.get(), data, n, MSG_NOSIGNAL) != static_cast<ssize_t>(n)) {
    fail("send");
  }
  ::shutdown(theirs.get(), SHUT_WR);  // a short challenge then ends in EOF, not a wait
  auth_hello hello;
  hello.kind = auth_kind::tcp;
  hello.initiator = 0;
  hello.responder = 1;
  hello.world = 2;
  auth_result result;
  const auto deadline = store_clock::now() + std::chrono::seconds(1);
  if (!auth_initiate(ours.get(), secret(), hello, deadline, result)) {
    fail("the initiator accepted a challenge that no secret made");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  as_responder(data, size);
  as_initiator(data, size);
  return 0;
}
