// SPDX-License-Identifier: Apache-2.0
// The job secret and the handshake: where secrets come from, and that the handshake accepts
// exactly the peers that know the secret (no replay, no reflection, no wrong binding).
#include <doctest/doctest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <chorus/bootstrap/auth.hpp>
#include <chorus/bootstrap/detail/handshake.hpp>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace std::chrono_literals;
using chorus::job_secret;
namespace cd = chorus::detail;

job_secret secret_from(std::map<std::string, std::string> env) {
  return job_secret::from([env = std::move(env)](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

// The message of the chorus::error that make() throws; fails the test when none is thrown.
std::string error_of(const std::function<void()>& make) {
  try {
    make();
  } catch (const chorus::error& e) {
    CHECK(e.code() == chorus::errc::invalid_argument);
    return e.what();
  }
  FAIL("no error thrown");
  return {};
}

job_secret text_secret(std::string_view text) {
  return job_secret::from_bytes(std::as_bytes(std::span(text.data(), text.size())));
}

std::string temp_file(std::string_view content, mode_t mode) {
  char path[] = "/tmp/chorus-secret-XXXXXX";
  int fd = ::mkstemp(path);
  REQUIRE(fd >= 0);
  REQUIRE(::write(fd, content.data(), content.size()) == static_cast<ssize_t>(content.size()));
  REQUIRE(::fchmod(fd, mode) == 0);
  ::close(fd);
  return path;
}

// A connected pair of non-blocking stream sockets.
std::array<cd::unique_fd, 2> socket_pair() {
  int fds[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, fds) == 0);
  return {cd::unique_fd(fds[0]), cd::unique_fd(fds[1])};
}

// Drives a responder over `fd` until it is done or failed (blocking with a deadline).
void respond(int fd, cd::auth_responder& r) {
  auto deadline = cd::store_clock::now() + 5s;
  std::vector<std::byte> out;
  while (!r.done()) {
    if (r.read_from(fd, out)) return;  // failed, or the initiator hung up
    if (!out.empty()) {
      REQUIRE(cd::send_all(fd, {{out.data(), out.size()}}, deadline).status == cd::io_status::ok);
      out.clear();
    } else if (!r.done() && cd::wait_fd(fd, POLLIN, deadline).status != cd::io_status::ok) {
      return;
    }
  }
}

cd::auth_hello tcp_hello(std::uint32_t from, std::uint32_t to) {
  cd::auth_hello h;
  h.kind = cd::auth_kind::tcp;
  h.initiator = from;
  h.responder = to;
  h.world = 4;
  h.job.fill(std::byte{7});
  h.comm.fill(std::byte{9});
  return h;
}

std::optional<std::string> accept_all(const cd::auth_hello&) { return std::nullopt; }

struct outcome {
  std::optional<std::string> initiator;  // failure reason, nullopt when it succeeded
  bool responder_done = false;
  std::string responder_failure;
  cd::auth_result initiator_result, responder_result;
};

// One handshake between an initiator knowing `mine` and a responder knowing `theirs`.
outcome handshake(const job_secret& mine, const job_secret& theirs,
                  cd::auth_responder::check_function check = accept_all) {
  auto [a, b] = socket_pair();
  cd::auth_id job;
  job.fill(std::byte{7});
  cd::auth_responder r(theirs, job, std::move(check));
  outcome o;
  std::thread responder([&, fd = b.get()] {
    respond(fd, r);
    ::shutdown(fd, SHUT_RDWR);  // the way a server closes a refused peer
  });
  o.initiator = cd::auth_initiate(a.get(), mine, tcp_hello(1, 2), cd::store_clock::now() + 5s,
                                  o.initiator_result);
  ::shutdown(a.get(), SHUT_RDWR);
  responder.join();
  o.responder_done = r.done();
  o.responder_failure = r.failure();
  o.responder_result = r.result();
  return o;
}

}  // namespace

TEST_CASE("job_secret comes from CHORUS_SECRET or a private CHORUS_SECRET_FILE") {
  const std::string text = "0123456789abcdef0123";
  auto s = secret_from({{"CHORUS_SECRET", text}});
  CHECK(s.authenticated());
  CHECK(std::string(s.key().begin(), s.key().end()) == text);

  auto path = temp_file(text + "\n", 0600);
  auto f = secret_from({{"CHORUS_SECRET_FILE", path}});
  CHECK(std::string(f.key().begin(), f.key().end()) == text);  // one newline dropped
  ::unlink(path.c_str());

  auto none = secret_from({{"CHORUS_AUTH", "none"}});
  CHECK_FALSE(none.authenticated());
  CHECK(none.key().empty());
  CHECK(secret_from({{"CHORUS_AUTH", "hmac"}, {"CHORUS_SECRET", text}}).authenticated());

  auto copy = s;
  CHECK(std::string(copy.key().begin(), copy.key().end()) == text);
  auto moved = std::move(copy);
  CHECK(std::string(moved.key().begin(), moved.key().end()) == text);

  auto generated = job_secret::generate_text();
  CHECK(generated.size() == 64);
  CHECK(generated != job_secret::generate_text());
}

TEST_CASE("job_secret refuses bad configurations by name, never printing the secret") {
  const std::string secret_text = "do-not-print-me";  // 15 bytes: one too few
  auto msg = error_of([&] { (void)secret_from({{"CHORUS_SECRET", secret_text}}); });
  CHECK(msg.find("CHORUS_SECRET has 15 bytes") != std::string::npos);
  CHECK(msg.find(secret_text) == std::string::npos);

  msg = error_of([] { (void)secret_from({}); });
  CHECK(msg.find("no job secret") != std::string::npos);
  CHECK(msg.find("CHORUS_SECRET_FILE") != std::string::npos);
  CHECK(msg.find("CHORUS_AUTH=none") != std::string::npos);

  msg = error_of([] { (void)secret_from({{"CHORUS_AUTH", "maybe"}}); });
  CHECK(msg == "chorus: CHORUS_AUTH='maybe' is neither 'hmac' nor 'none'");  // the prefix once

  msg = error_of([] {
    (void)secret_from({{"CHORUS_AUTH", "none"}, {"CHORUS_SECRET", "0123456789abcdef"}});
  });
  CHECK(msg.find("CHORUS_AUTH=none but a secret is set") != std::string::npos);

  msg = error_of([] {
    (void)secret_from({{"CHORUS_SECRET", "0123456789abcdef"}, {"CHORUS_SECRET_FILE", "/x"}});
  });
  CHECK(msg.find("both CHORUS_SECRET and CHORUS_SECRET_FILE") != std::string::npos);

  const std::string file_text = "0123456789abcdef-private";
  auto path = temp_file(file_text, 0644);
  msg = error_of([&] { (void)secret_from({{"CHORUS_SECRET_FILE", path}}); });
  CHECK(msg.find("mode 0644") != std::string::npos);
  CHECK(msg.find("chmod 600") != std::string::npos);
  CHECK(msg.find(file_text) == std::string::npos);
  ::unlink(path.c_str());

  msg = error_of([] { (void)secret_from({{"CHORUS_SECRET_FILE", "/nonexistent/chorus"}}); });
  CHECK(msg.find("cannot be opened") != std::string::npos);
}

TEST_CASE("the handshake succeeds exactly when both ends know the same secret") {
  auto a = text_secret("the-secret-of-job-A");
  auto b = text_secret("the-secret-of-job-B");

  auto same = handshake(a, a);
  CHECK_FALSE(same.initiator.has_value());
  CHECK(same.responder_done);
  CHECK(same.initiator_result.session == same.responder_result.session);

  auto differ = handshake(a, b);
  REQUIRE(differ.initiator.has_value());
  CHECK(differ.initiator->find("could not prove it knows the job secret") != std::string::npos);
  CHECK_FALSE(differ.responder_done);

  // Unauthenticated ends talk only to each other.
  CHECK_FALSE(handshake(job_secret::none(), job_secret::none()).initiator.has_value());
  CHECK(handshake(job_secret::none(), a).initiator.has_value());
  CHECK_FALSE(handshake(a, job_secret::none()).responder_done);
}

TEST_CASE("the responder refuses what its check refuses, before any proof") {
  auto s = text_secret("the-secret-of-job-A");
  auto o = handshake(s, s, [](const cd::auth_hello& h) -> std::optional<std::string> {
    if (h.initiator == 1) return "rank 1 is not expected";
    return std::nullopt;
  });
  CHECK_FALSE(o.responder_done);
  CHECK(o.responder_failure == "rank 1 is not expected");
  REQUIRE(o.initiator.has_value());
  CHECK(o.initiator->find("closed the connection") != std::string::npos);
}

TEST_CASE("a recorded handshake cannot be replayed, and a responder's proof cannot be reflected") {
  auto s = text_secret("the-secret-of-job-A");
  cd::auth_id job;
  job.fill(std::byte{7});

  // Record a genuine initiator's messages by playing the responder by hand.
  auto hello = tcp_hello(1, 2);
  cd::auth_random(hello.nonce);
  const auto m1 = cd::auth_encode(hello);
  cd::auth_responder genuine(s, job, accept_all);
  std::copy(m1.begin(), m1.end(), genuine.next_read().begin());
  auto m2 = genuine.received(m1.size());
  REQUIRE(m2.size() == cd::auth_challenge_bytes);
  cd::auth_nonce nonce_r;
  std::copy_n(m2.begin(), 32, nonce_r.begin());
  const auto m3 = cd::auth_proof(s, cd::auth_initiator_label, m1, nonce_r, job);
  std::copy(m3.begin(), m3.end(), genuine.next_read().begin());
  genuine.received(m3.size());
  CHECK(genuine.done());

  // Replay: the same hello and proof to a fresh responder, which picks a fresh nonce.
  cd::auth_responder replayed(s, job, accept_all);
  std::copy(m1.begin(), m1.end(), replayed.next_read().begin());
  replayed.received(m1.size());
  std::copy(m3.begin(), m3.end(), replayed.next_read().begin());
  replayed.received(m3.size());
  CHECK(replayed.failed());
  CHECK(replayed.failure().find("wrong proof") != std::string::npos);

  // Reflection: send the responder its own proof back as the initiator's.
  cd::auth_responder reflected(s, job, accept_all);
  std::copy(m1.begin(), m1.end(), reflected.next_read().begin());
  auto challenge = reflected.received(m1.size());
  std::array<std::byte, 32> own_proof;
  std::copy_n(challenge.begin() + 48, 32, own_proof.begin());
  std::copy(own_proof.begin(), own_proof.end(), reflected.next_read().begin());
  reflected.received(own_proof.size());
  CHECK(reflected.failed());

  // A proof made for another connection (other ranks) fails too.
  auto other = tcp_hello(0, 2);
  other.nonce = hello.nonce;
  const auto m1_other = cd::auth_encode(other);
  cd::auth_responder rebound(s, job, accept_all);
  std::copy(m1_other.begin(), m1_other.end(), rebound.next_read().begin());
  rebound.received(m1_other.size());
  std::copy(m3.begin(), m3.end(), rebound.next_read().begin());
  rebound.received(m3.size());
  CHECK(rebound.failed());
}

TEST_CASE("the responder names malformed hellos and reads nothing past the handshake") {
  auto s = text_secret("the-secret-of-job-A");
  cd::auth_id job{};
  auto feed = [&](std::array<std::byte, cd::auth_hello_bytes> m1) {
    cd::auth_responder r(s, job, accept_all);
    // Byte by byte: next_read() never asks for more than the message lacks.
    for (std::size_t i = 0; i < m1.size() && !r.failed(); ++i) {
      REQUIRE(r.next_read().size() == m1.size() - i);
      r.next_read()[0] = m1[i];
      r.received(1);
    }
    return r.failed() ? r.failure() : std::string();
  };
  auto good = cd::auth_encode(tcp_hello(1, 2));
  CHECK(feed(good).empty());
  auto bad = good;
  bad[0] = std::byte{'X'};
  CHECK(feed(bad).find("bad magic") != std::string::npos);
  bad = good;
  bad[4] = std::byte{9};
  CHECK(feed(bad).find("handshake version 9") != std::string::npos);
  bad = good;
  bad[6] = std::byte{77};
  CHECK(feed(bad).find("unknown connection kind 77") != std::string::npos);
  bad = good;
  bad[7] = std::byte{0x82};  // bit 1 (encrypt) is known; bit 7 is not
  CHECK(feed(bad).find("unknown handshake flags") != std::string::npos);
}
