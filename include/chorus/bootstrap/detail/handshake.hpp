// SPDX-License-Identifier: Apache-2.0
// The mutual HMAC-SHA256 challenge every chorus connection runs before any payload.
#pragma once

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <array>
#include <chorus/bootstrap/auth.hpp>
#include <chorus/bootstrap/detail/store_protocol.hpp>  // store_put_le, store_get_le
#include <chorus/detail/socket.hpp>
#include <chorus/error.hpp>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cerrno>
#include <cstring>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace chorus::detail {

// Three messages; the side that opened the connection (initiator) speaks first.
//
//   1. hello, initiator -> responder, 88 bytes, little-endian:
//        0 u32 magic "CHAU"   4 u16 version    6 u8 kind (store, tcp)   7 u8 flags
//        8 u32 initiator rank 12 u32 responder rank   16 u32 connection index
//       20 u32 world size     24 job id (16)   40 communicator id (16)  56 nonce_i (32)
//   2. challenge, responder -> initiator, 80 bytes:
//        0 nonce_r (32)  32 the responder's job id (16)  48 proof_r (32)
//   3. proof, initiator -> responder: proof_i (32 bytes).
//
// With T = hello || nonce_r || job id, proof_r = HMAC(K, "chorus-auth/1 responder" || T) and
// proof_i = HMAC(K, "chorus-auth/1 initiator" || T). Why this shape:
//  - both nonces are fresh, so a recorded proof is useless in any later handshake (replay);
//  - the role is inside the MAC, so a responder's proof cannot be sent back to it as an
//    initiator's (reflection);
//  - T holds the transport kind, both ranks, the connection index, the job and the
//    communicator, so a proof made for one connection is wrong for every other;
//  - the responder answers only a well-formed hello it expects and decides after one proof,
//    so a stranger learns nothing but MACs over inputs that always include a fresh nonce_r.
// The store's responder mints the job id (the initiator sends zeros there) and vouches for it
// in proof_r; data transports bind to that job id and to a communicator id chosen by rank 0.
// A session key HMAC(K, "chorus-auth/1 session" || T) is derived on both sides for transports
// that protect their payload.
inline constexpr std::uint32_t auth_magic = 0x55414843;  // "CHAU" as little-endian bytes
inline constexpr std::uint16_t auth_version = 1;
inline constexpr std::size_t auth_hello_bytes = 88;
inline constexpr std::size_t auth_challenge_bytes = 80;
inline constexpr std::size_t auth_proof_bytes = 32;
/// How long a connection has from accept to a verified proof before it is closed.
inline constexpr std::chrono::seconds auth_timeout{5};
/// Strangers a server keeps in their handshake at once (the store: on top of its ranks); more
/// wait, not accepted, in the kernel's backlog. It bounds the descriptors a flood can take (a
/// quarter of the common soft limit of 1024), and sets how long a flood delays a rank queued
/// behind it: auth_timeout per auth_max_pending stalled strangers. At 64, the tcp set-up's
/// first value, a burst of 200 silent connections (tests/security) held set-up for 15 s.
inline constexpr std::size_t auth_max_pending = 256;

using auth_id = std::array<std::byte, 16>;
using auth_nonce = std::array<std::byte, 32>;
using auth_mac = std::array<std::byte, 32>;

enum class auth_kind : std::uint8_t { store = 1, tcp = 2 };

/// Hello flag: the initiator will seal its data in records (CHORUS_ENCRYPT); the responder
/// refuses a peer whose choice differs from its own.
inline constexpr std::uint8_t auth_flag_encrypt = 1;

inline const char* to_string(auth_kind k) noexcept {
  return k == auth_kind::store ? "store" : k == auth_kind::tcp ? "tcp" : "unknown";
}

struct auth_hello {
  auth_kind kind = auth_kind::store;
  std::uint8_t flags = 0;
  std::uint32_t initiator = 0;
  std::uint32_t responder = 0;
  std::uint32_t index = 0;
  std::uint32_t world = 0;
  auth_id job{};
  auth_id comm{};
  auth_nonce nonce{};
};

/// Fills `out` from OpenSSL's CSPRNG; errc::system when it cannot.
inline void auth_random(std::span<std::byte> out) {
  if (RAND_bytes(reinterpret_cast<unsigned char*>(out.data()), static_cast<int>(out.size())) != 1) {
    throw error(errc::system, "RAND_bytes failed", {}, std::nullopt, "RAND_bytes");
  }
}

inline std::array<std::byte, auth_hello_bytes> auth_encode(const auth_hello& h) {
  std::array<std::byte, auth_hello_bytes> out{};
  store_put_le(out.data() + 0, auth_magic, 4);
  store_put_le(out.data() + 4, auth_version, 2);
  store_put_le(out.data() + 6, static_cast<std::uint8_t>(h.kind), 1);
  store_put_le(out.data() + 7, h.flags, 1);
  store_put_le(out.data() + 8, h.initiator, 4);
  store_put_le(out.data() + 12, h.responder, 4);
  store_put_le(out.data() + 16, h.index, 4);
  store_put_le(out.data() + 20, h.world, 4);
  std::memcpy(out.data() + 24, h.job.data(), 16);
  std::memcpy(out.data() + 40, h.comm.data(), 16);
  std::memcpy(out.data() + 56, h.nonce.data(), 32);
  return out;
}

/// Decodes a hello; the reason it is not one otherwise. Unknown kinds and flags are refused,
/// so that a later version cannot be misread as this one.
inline std::optional<std::string> auth_decode(std::span<const std::byte, auth_hello_bytes> in,
                                              auth_hello& h) {
  if (store_get_le(in.data(), 4) != auth_magic) return "not a chorus handshake (bad magic)";
  if (auto v = store_get_le(in.data() + 4, 2); v != auth_version) {
    return "handshake version " + std::to_string(v) + ", this rank speaks " +
           std::to_string(auth_version) + " (mixed chorus versions?)";
  }
  auto kind = static_cast<std::uint8_t>(store_get_le(in.data() + 6, 1));
  if (kind != static_cast<std::uint8_t>(auth_kind::store) &&
      kind != static_cast<std::uint8_t>(auth_kind::tcp)) {
    return "unknown connection kind " + std::to_string(kind);
  }
  h.kind = static_cast<auth_kind>(kind);
  h.flags = static_cast<std::uint8_t>(store_get_le(in.data() + 7, 1));
  if ((h.flags & ~auth_flag_encrypt) != 0) {
    return "unknown handshake flags " + std::to_string(h.flags);
  }
  h.initiator = static_cast<std::uint32_t>(store_get_le(in.data() + 8, 4));
  h.responder = static_cast<std::uint32_t>(store_get_le(in.data() + 12, 4));
  h.index = static_cast<std::uint32_t>(store_get_le(in.data() + 16, 4));
  h.world = static_cast<std::uint32_t>(store_get_le(in.data() + 20, 4));
  std::memcpy(h.job.data(), in.data() + 24, 16);
  std::memcpy(h.comm.data(), in.data() + 40, 16);
  std::memcpy(h.nonce.data(), in.data() + 56, 32);
  return std::nullopt;
}

/// HMAC-SHA256 of `message` under `key` (which may be empty).
inline auth_mac auth_hmac(std::span<const unsigned char> key, std::span<const unsigned char> message) {
  // HMAC() treats a null key as "reuse the previous one"; an empty key needs a real pointer.
  static const unsigned char empty_key = 0;
  auth_mac out{};
  unsigned int length = 0;
  if (HMAC(EVP_sha256(), key.empty() ? &empty_key : key.data(), static_cast<int>(key.size()),
           message.data(), message.size(), reinterpret_cast<unsigned char*>(out.data()),
           &length) == nullptr ||
      length != out.size()) {
    throw error(errc::system, "HMAC-SHA256 failed", {}, std::nullopt, "HMAC");
  }
  return out;
}

/// HMAC-SHA256 under the job secret of `label` || T, T = hello || nonce_r || job id.
inline auth_mac auth_proof(const job_secret& secret, std::string_view label,
                           std::span<const std::byte, auth_hello_bytes> hello,
                           const auth_nonce& nonce_r, const auth_id& job) {
  std::array<unsigned char, 64 + auth_hello_bytes + 32 + 16> msg{};
  std::size_t at = 0;
  auto put = [&](const void* p, std::size_t n) {
    std::memcpy(msg.data() + at, p, n);
    at += n;
  };
  put(label.data(), label.size());
  msg[at++] = 0;  // so that no label is a prefix of another's message
  put(hello.data(), hello.size());
  put(nonce_r.data(), nonce_r.size());
  put(job.data(), job.size());
  auto out = auth_hmac(secret.key(), std::span(msg.data(), at));
  OPENSSL_cleanse(msg.data(), msg.size());
  return out;
}

inline constexpr std::string_view auth_responder_label = "chorus-auth/1 responder";
inline constexpr std::string_view auth_initiator_label = "chorus-auth/1 initiator";
inline constexpr std::string_view auth_session_label = "chorus-auth/1 session";

/// Frees what OpenSSL keeps per thread (its random generator's state): called at the end of
/// every thread of ours that ran a handshake. Without it each such thread leaves a few KiB
/// behind (LeakSanitizer finds them when a fuzz run replaces the store server's thread).
inline void auth_thread_done() noexcept { OPENSSL_thread_stop(); }

/// Constant-time equality of two proofs.
inline bool auth_equal(const auth_mac& a, std::span<const std::byte> b) {
  return b.size() == a.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

/// What a completed handshake established.
struct auth_result {
  auth_id job{};    ///< the job id the responder vouched for
  auth_mac session{};  ///< a key only the two ends know
};

/// The initiator's side, blocking on the connected non-blocking socket `fd` until `deadline`.
/// `hello.nonce` is filled here. Returns the reason on failure (the caller names the peer).
inline std::optional<std::string> auth_initiate(int fd, const job_secret& secret, auth_hello hello,
                                                store_clock::time_point deadline,
                                                auth_result& result) {
  auth_random(hello.nonce);
  const auto m1 = auth_encode(hello);
  auto why_io = [&](io_result r, const char* during) -> std::string {
    if (r.status == io_status::timed_out) return std::string("no ") + during + " before the deadline";
    if (r.status == io_status::closed) {
      return std::string("the peer closed the connection instead of sending its ") + during +
             " (it refused us; its log says why)";
    }
    return std::string("handshake failed: ") + std::generic_category().message(r.error);
  };
  if (auto r = send_all(fd, {{const_cast<std::byte*>(m1.data()), m1.size()}}, deadline);
      r.status != io_status::ok) {
    return why_io(r, "challenge");
  }
  std::array<std::byte, auth_challenge_bytes> m2{};
  if (auto r = recv_exact(fd, m2.data(), m2.size(), deadline); r.status != io_status::ok) {
    return why_io(r, "challenge");
  }
  auth_nonce nonce_r{};
  std::memcpy(nonce_r.data(), m2.data(), 32);
  std::memcpy(result.job.data(), m2.data() + 32, 16);
  const auto expected = auth_proof(secret, auth_responder_label, m1, nonce_r, result.job);
  if (!auth_equal(expected, std::span(m2).subspan(48))) {
    return std::string("the peer could not prove it knows the job secret: the ranks were "
                       "started with different secrets (CHORUS_SECRET / CHORUS_SECRET_FILE, or "
                       "CHORUS_AUTH=none on one side only), or it is not a rank of this job");
  }
  if (hello.kind != auth_kind::store && result.job != hello.job) {
    return std::string("the peer vouched for another job id (a rank of another job on this "
                       "port?)");
  }
  const auto proof = auth_proof(secret, auth_initiator_label, m1, nonce_r, result.job);
  if (auto r = send_all(fd, {{const_cast<std::byte*>(proof.data()), proof.size()}}, deadline);
      r.status != io_status::ok) {
    return why_io(r, "acceptance");
  }
  result.session = auth_proof(secret, auth_session_label, m1, nonce_r, result.job);
  return std::nullopt;
}

/// The responder's side as a state machine that never blocks: the caller reads into
/// next_read() and reports what arrived with received(); whatever received() returns is sent
/// to the initiator. next_read() asks for exactly the bytes the current message lacks, so the
/// caller never reads past the handshake into what follows it.
///
///   auth_responder r(secret, job, [](const auth_hello& h) { return check(h); });
///   while (!r.done() && !r.failed()) {
///     auto into = r.next_read();
///     n = recv(fd, into.data(), into.size());           // with the caller's deadline
///     send_all(fd, r.received(n));                       // the challenge, once
///   }
///   // r.failed(): close with r.failure() logged.  r.done(): r.hello() is authenticated.
class auth_responder {
 public:
  /// `check` accepts or refuses a decoded hello before any proof is computed: it returns
  /// the reason to refuse, or nullopt. `secret` must outlive the responder.
  using check_function = std::function<std::optional<std::string>(const auth_hello&)>;

  auth_responder(const job_secret& secret, const auth_id& job, check_function check)
      : secret_(&secret), job_(job), check_(std::move(check)) {}

  bool done() const noexcept { return stage_ == stage::done; }
  bool failed() const noexcept { return stage_ == stage::failed; }
  const std::string& failure() const noexcept { return failure_; }
  /// The initiator's hello; authenticated once done().
  const auth_hello& hello() const noexcept { return hello_; }
  const auth_result& result() const noexcept { return result_; }

  /// Reads from the non-blocking socket `fd` what it has of the handshake (never past it) and
  /// appends the answers to `out`, for the caller to send. Returns why the connection must be
  /// closed (failure() when the initiator failed the handshake), else nullopt: done() once
  /// the proof verified, otherwise the socket has no more bytes for now.
  std::optional<std::string> read_from(int fd, std::vector<std::byte>& out) {
    while (!done() && !failed()) {
      const auto into = next_read();
      const ssize_t n = ::recv(fd, into.data(), into.size(), 0);
      if (n == 0) return std::string("closed the connection during the handshake");
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return std::nullopt;
        return "recv: " + store_errno_text(errno);
      }
      const auto reply = received(static_cast<std::size_t>(n));
      out.insert(out.end(), reply.begin(), reply.end());
    }
    if (failed()) return failure();
    return std::nullopt;
  }

  std::span<std::byte> next_read() noexcept {
    switch (stage_) {
      case stage::hello:
        return std::span(in_hello_).subspan(have_);
      case stage::proof:
        return std::span(in_proof_).subspan(have_);
      default:
        return {};
    }
  }

  /// `n` bytes (at most next_read().size()) arrived in next_read(). Returns the bytes to
  /// send: the challenge right after the hello is complete, else nothing.
  std::span<const std::byte> received(std::size_t n) {
    if (n > next_read().size()) return fail("internal: more bytes than asked for");
    have_ += n;
    if (stage_ == stage::hello && have_ == in_hello_.size()) {
      if (auto bad = auth_decode(in_hello_, hello_)) return fail(*bad);
      if (auto refused = check_(hello_)) return fail(*refused);
      auth_nonce nonce_r{};
      auth_random(nonce_r);
      std::memcpy(out_.data(), nonce_r.data(), 32);
      std::memcpy(out_.data() + 32, job_.data(), 16);
      auto proof = auth_proof(*secret_, auth_responder_label, in_hello_, nonce_r, job_);
      std::memcpy(out_.data() + 48, proof.data(), 32);
      expected_ = auth_proof(*secret_, auth_initiator_label, in_hello_, nonce_r, job_);
      result_.job = job_;
      result_.session = auth_proof(*secret_, auth_session_label, in_hello_, nonce_r, job_);
      stage_ = stage::proof;
      have_ = 0;
      return out_;
    }
    if (stage_ == stage::proof && have_ == in_proof_.size()) {
      if (!auth_equal(expected_, in_proof_)) {
        return fail("wrong proof of the job secret (a different CHORUS_SECRET, CHORUS_AUTH=none "
                    "on one side only, or not a rank of this job)");
      }
      stage_ = stage::done;
    }
    return {};
  }

 private:
  enum class stage { hello, proof, done, failed };

  std::span<const std::byte> fail(std::string why) {
    stage_ = stage::failed;
    failure_ = std::move(why);
    result_ = {};
    return {};
  }

  const job_secret* secret_;
  auth_id job_;
  check_function check_;
  stage stage_ = stage::hello;
  std::size_t have_ = 0;
  std::array<std::byte, auth_hello_bytes> in_hello_{};
  std::array<std::byte, auth_proof_bytes> in_proof_{};
  std::array<std::byte, auth_challenge_bytes> out_{};
  auth_mac expected_{};
  auth_hello hello_;
  auth_result result_;
  std::string failure_;
};

}  // namespace chorus::detail
