// SPDX-License-Identifier: Apache-2.0
// Optional AES-256-GCM protection of a TCP data connection (CHORUS_ENCRYPT=aes-gcm).
#pragma once

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <chorus/bootstrap/detail/handshake.hpp>
#include <chorus/detail/socket.hpp>
#include <chorus/error.hpp>

namespace chorus::detail {

/// Plaintext bytes of one record at most. Big enough that the 20 bytes a record adds are
/// noise, small enough that a receiver holds one record in a fixed buffer.
inline constexpr std::size_t tcp_record_plain = 256 * 1024;
inline constexpr std::size_t tcp_record_tag = 16;

/// Turns the connection's byte stream into a stream of sealed records and back, below the
/// frame logic (which is unchanged: it sends and receives plaintext bytes through here).
///
/// A record on the wire is: u32 L (little-endian, 1..tcp_record_plain), L bytes of AES-256-GCM
/// ciphertext, a 16-byte tag; L is authenticated as associated data. Each direction has its
/// own key, HMAC(session, direction label), where `session` is the handshake's session key,
/// unique to this connection; the 96-bit nonce is the record's sequence number in its
/// direction, so no (key, nonce) pair ever repeats. A record whose tag does not verify (bytes
/// altered, dropped, reordered or injected) is errc::protocol and ends the connection.
class tcp_cipher {
 public:
  /// `initiator`: whether this end opened the connection (it decides which key is whose).
  tcp_cipher(const auth_mac& session, bool initiator, int peer)
      : peer_(peer), seal_(EVP_CIPHER_CTX_new()), open_(EVP_CIPHER_CTX_new()) {
    if (!seal_ || !open_) throw error(errc::system, "EVP_CIPHER_CTX_new failed");
    // Direction keys: HMAC under the session key of a label naming the direction.
    auto key_for = [&](std::string_view label) {
      return auth_hmac({reinterpret_cast<const unsigned char*>(session.data()), session.size()},
                       {reinterpret_cast<const unsigned char*>(label.data()), label.size()});
    };
    auto i2r = key_for("chorus-tcp/1 initiator to responder");
    auto r2i = key_for("chorus-tcp/1 responder to initiator");
    init(seal_.get(), initiator ? i2r : r2i, true);
    init(open_.get(), initiator ? r2i : i2r, false);
    OPENSSL_cleanse(i2r.data(), i2r.size());
    OPENSSL_cleanse(r2i.data(), r2i.size());
    in_.resize(4 + tcp_record_plain + tcp_record_tag);
    plain_.resize(tcp_record_plain);
  }

  /// Ciphertext sealed but not yet accepted by the kernel.
  bool pending() const noexcept { return out_sent_ < out_.size(); }
  /// Decrypted bytes not yet handed out.
  bool buffered() const noexcept { return plain_begin_ < plain_end_; }

  /// Writes pending ciphertext. Returns false when the socket would block with some left.
  bool drain(int fd) {
    while (pending()) {
      const ssize_t n = ::send(fd, out_.data() + out_sent_, out_.size() - out_sent_,
                               MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0) {
        if (errno == EINTR) continue;
        return false;  // errno says whether it would block or failed
      }
      out_sent_ += static_cast<std::size_t>(n);
    }
    out_.clear();
    out_sent_ = 0;
    return true;
  }

  /// drain() that waits for the socket until `deadline`. Returns whether nothing is pending.
  bool drain_until(int fd, store_clock::time_point deadline) {
    while (!drain(fd)) {
      if (errno != EAGAIN && errno != EWOULDBLOCK) return false;
      if (wait_fd(fd, POLLOUT, deadline).status != io_status::ok) return false;
    }
    return true;
  }

  /// sendmsg's contract for the frame logic: seals up to one record of the plaintext in
  /// `iov` and returns how many plaintext bytes it took (all of them now owned here), or -1
  /// with errno (EAGAIN while earlier ciphertext is still unsent).
  ssize_t send(int fd, const iovec* iov, std::size_t count) {
    if (!drain(fd)) return -1;
    std::size_t total = 0;
    for (std::size_t i = 0; i < count; ++i) total += iov[i].iov_len;
    const std::size_t take = std::min(total, tcp_record_plain);
    if (take == 0) return 0;
    out_.resize(4 + take + tcp_record_tag);
    store_put_le(out_.data(), take, 4);
    start(seal_.get(), send_seq_++);
    int len = 0;
    bool ok = EVP_EncryptUpdate(seal_.get(), nullptr, &len, as_uchar(out_.data()), 4) == 1;
    std::size_t at = 4;
    for (std::size_t i = 0, left = take; i < count && left > 0 && ok; ++i) {
      const std::size_t part = std::min(left, iov[i].iov_len);
      ok = EVP_EncryptUpdate(seal_.get(), as_uchar(out_.data() + at), &len,
                             static_cast<const unsigned char*>(iov[i].iov_base),
                             static_cast<int>(part)) == 1;
      at += static_cast<std::size_t>(len);
      left -= part;
    }
    ok = ok && EVP_EncryptFinal_ex(seal_.get(), as_uchar(out_.data() + at), &len) == 1;
    at += static_cast<std::size_t>(len);
    ok = ok && at == 4 + take &&
         EVP_CIPHER_CTX_ctrl(seal_.get(), EVP_CTRL_GCM_GET_TAG, tcp_record_tag,
                             out_.data() + at) == 1;
    if (!ok) throw error(errc::system, "AES-GCM encryption failed", {peer_});
    out_sent_ = 0;
    drain(fd);  // a would-block here is fine: the bytes are taken, flush() comes back
    return static_cast<ssize_t>(take);
  }

  /// recv's contract for the frame logic: up to `size` plaintext bytes into `dst`; 0 at the
  /// end of the stream (between records only); -1 with errno, EAGAIN when no whole record
  /// has arrived. A record that fails to verify throws errc::protocol.
  ssize_t recv(int fd, std::byte* dst, std::size_t size) {
    if (buffered()) return hand_out(dst, size);
    for (;;) {
      const std::size_t need = in_have_ < 4 ? 4 : 4 + record_length() + tcp_record_tag;
      if (in_have_ == need && need > 4) break;
      const ssize_t n = ::recv(fd, in_.data() + in_have_, need - in_have_, MSG_DONTWAIT);
      if (n == 0) {
        if (in_have_ == 0) return 0;
        throw error(errc::protocol,
                    "rank " + std::to_string(peer_) + " closed the connection inside an "
                    "encrypted record",
                    {peer_}, std::nullopt, "recv");
      }
      if (n < 0) return -1;  // errno as recv left it
      in_have_ += static_cast<std::size_t>(n);
      if (in_have_ == 4) check_length();
    }
    const std::size_t length = record_length();
    in_have_ = 0;
    // A large read takes the record straight into place, without the bounce buffer.
    if (size >= length) {
      open(dst, length);
      return static_cast<ssize_t>(length);
    }
    open(plain_.data(), length);
    plain_begin_ = 0;
    plain_end_ = length;
    return hand_out(dst, size);
  }

 private:
  struct ctx_free {
    void operator()(EVP_CIPHER_CTX* c) const noexcept { EVP_CIPHER_CTX_free(c); }
  };

  static unsigned char* as_uchar(std::byte* p) { return reinterpret_cast<unsigned char*>(p); }

  // The context's direction is fixed here (EVP_CipherInit_ex's last argument); -1 in start()
  // keeps it.
  void init(EVP_CIPHER_CTX* c, const auth_mac& key, bool encrypt) {
    const bool ok =
        EVP_CipherInit_ex(c, EVP_aes_256_gcm(), nullptr, nullptr, nullptr, encrypt ? 1 : 0) == 1 &&
        EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_SET_IVLEN, 12, nullptr) == 1 &&
        EVP_CipherInit_ex(c, nullptr, nullptr, reinterpret_cast<const unsigned char*>(key.data()),
                          nullptr, -1) == 1;
    if (!ok) throw error(errc::system, "AES-256-GCM set-up failed", {peer_});
  }

  // Starts a record: the nonce is the sequence number, so it never repeats under one key.
  void start(EVP_CIPHER_CTX* c, std::uint64_t seq) {
    std::array<std::byte, 12> iv{};
    store_put_le(iv.data() + 4, seq, 8);
    if (EVP_CipherInit_ex(c, nullptr, nullptr, nullptr, as_uchar(iv.data()), -1) != 1) {
      throw error(errc::system, "AES-GCM nonce set-up failed", {peer_});
    }
  }

  std::size_t record_length() const {
    return static_cast<std::size_t>(store_get_le(in_.data(), 4));
  }

  void check_length() const {
    const std::size_t length = record_length();
    if (length == 0 || length > tcp_record_plain) {
      throw error(errc::protocol,
                  "rank " + std::to_string(peer_) + " sent an encrypted record of " +
                      std::to_string(length) + " bytes (limit " +
                      std::to_string(tcp_record_plain) + "; is CHORUS_ENCRYPT the same on "
                      "every rank?)",
                  {peer_}, std::nullopt, "recv");
    }
  }

  void open(std::byte* dst, std::size_t length) {
    start(open_.get(), recv_seq_++);
    int len = 0;
    bool ok = EVP_DecryptUpdate(open_.get(), nullptr, &len, as_uchar(in_.data()), 4) == 1 &&
              EVP_DecryptUpdate(open_.get(), as_uchar(dst), &len, as_uchar(in_.data() + 4),
                                static_cast<int>(length)) == 1 &&
              static_cast<std::size_t>(len) == length &&
              EVP_CIPHER_CTX_ctrl(open_.get(), EVP_CTRL_GCM_SET_TAG, tcp_record_tag,
                                  in_.data() + 4 + length) == 1;
    ok = ok && EVP_DecryptFinal_ex(open_.get(), as_uchar(dst) + length, &len) == 1;
    if (!ok) {
      // GCM checks the tag after decrypting, and a large record is decrypted straight into
      // the receiver's buffer: what failed to verify is wiped, never left there.
      OPENSSL_cleanse(dst, length);
      throw error(errc::protocol,
                  "rank " + std::to_string(peer_) + " sent an encrypted record that failed "
                  "authentication (altered on the way, or not sealed with this connection's key)",
                  {peer_}, std::nullopt, "recv");
    }
  }

  ssize_t hand_out(std::byte* dst, std::size_t size) {
    const std::size_t n = std::min(size, plain_end_ - plain_begin_);
    std::memcpy(dst, plain_.data() + plain_begin_, n);
    plain_begin_ += n;
    return static_cast<ssize_t>(n);
  }

  int peer_;
  std::unique_ptr<EVP_CIPHER_CTX, ctx_free> seal_, open_;
  std::uint64_t send_seq_ = 0, recv_seq_ = 0;
  std::vector<std::byte> out_;
  std::size_t out_sent_ = 0;
  std::vector<std::byte> in_;
  std::size_t in_have_ = 0;
  std::vector<std::byte> plain_;
  std::size_t plain_begin_ = 0, plain_end_ = 0;
};

}  // namespace chorus::detail
