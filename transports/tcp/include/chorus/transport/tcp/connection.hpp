// SPDX-License-Identifier: Apache-2.0
// One TCP connection to a peer: queued frames out, posted frames in, few system calls.
#pragma once

#include <linux/sockios.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <chorus/concepts.hpp>
#include <chorus/detail/frame.hpp>
#include <chorus/error.hpp>
#include <chorus/transport/tcp/cipher.hpp>
#include <chorus/transport/tcp/socket.hpp>

namespace chorus::detail {

/// Frames of at most this many payload bytes are read through the connection's buffer, so
/// that one recv() brings in several small frames; larger payloads are read straight into
/// their destination (no extra copy).
inline constexpr std::size_t tcp_small_payload = 16 * 1024;
inline constexpr std::size_t tcp_rx_buffer = 256 * 1024;
/// Longest abort message we accept from a peer.
inline constexpr std::uint32_t max_abort_text = 4096;

class tcp_connection {
 public:
  /// With a `cipher`, every byte goes through it (sealed records on the wire); without,
  /// frames go to the socket as they are.
  tcp_connection(unique_fd fd, int self, int peer, std::unique_ptr<tcp_cipher> cipher = nullptr)
      : fd_(std::move(fd)),
        self_(self),
        peer_(peer),
        cipher_(std::move(cipher)),
        rx_(new std::byte[tcp_rx_buffer]) {}

  int fd() const { return fd_.get(); }
  int peer() const { return peer_; }
  bool busy() const {
    return !txq_.empty() || !sealed_.empty() || !rxq_.empty() || (cipher_ && cipher_->pending());
  }
  /// Worth calling pump(): the socket may have bytes, or buffered bytes may answer a receive.
  bool wants_pump() const {
    return readable || (cipher_ && cipher_->buffered()) || (!rxq_.empty() && rx_end_ > rx_begin_);
  }

  // Readiness as last reported by edge-triggered epoll; cleared when a call says EAGAIN.
  bool readable = true;
  bool writable = true;

  /// This rank's recent calls, against which leftover frames and a peer's abort are read.
  void remember(const call_history* calls) { history_ = calls; }

  void post_send(transfer* x) {
    if (closed_) throw lost("send to");
    txq_.push_back(x);
  }
  void post_recv(transfer* x) {
    if (closed_ && rx_end_ == rx_begin_) throw lost("recv from");
    rxq_.push_back(x);
  }
  /// Queues a check frame (detail::frame_check) with header `h`, behind the frames queued
  /// before it; one at a time: while the last is unsent, a new one would say nothing more.
  void post_check(const frame_header& h) {
    if (closed_ || !check_.done) return;
    check_ = transfer{};
    check_.header = h;
    txq_.push_back(&check_);
  }

  /// Writes queued frames: one sendmsg() carries up to 32 frames (header + payload each).
  bool flush() {
    bool moved = false;
    if (cipher_ && cipher_->pending() && writable && !cipher_->drain(fd_.get())) {
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) fail_send(errno);
      writable = false;
    }
    moved |= complete_sealed();
    while (!txq_.empty() && writable) {
      iovec iov[64];
      int n = 0;
      std::size_t off = tx_off_;
      for (auto it = txq_.begin(); it != txq_.end() && n < 63; ++it) {
        transfer* x = *it;
        constexpr std::size_t hsz = sizeof(frame_header);
        if (off < hsz) {
          iov[n++] = {reinterpret_cast<char*>(&x->header) + off, hsz - off};
          if (x->length > 0) iov[n++] = {x->data, x->length};
        } else {
          iov[n++] = {x->data + (off - hsz), x->length - (off - hsz)};
        }
        off = 0;
      }
      msghdr msg{};
      msg.msg_iov = iov;
      msg.msg_iovlen = static_cast<std::size_t>(n);
      const ssize_t sent = cipher_ ? cipher_->send(fd_.get(), iov, static_cast<std::size_t>(n))
                                   : ::sendmsg(fd_.get(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (sent < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
          writable = false;
          break;
        }
        if (errno == EINTR) continue;
        fail_send(errno);
      }
      moved = true;
      // Retire whole frames; keep the offset into a partly written one.
      auto left = static_cast<std::size_t>(sent);
      while (left > 0) {
        transfer* x = txq_.front();
        const std::size_t total = sizeof(frame_header) + x->length - tx_off_;
        if (left >= total) {
          left -= total;
          tx_off_ = 0;
          if (cipher_) {
            sealed_.push_back(x);  // done once its record has left (complete_sealed)
          } else {
            x->done = true;
          }
          txq_.pop_front();
        } else {
          tx_off_ += left;
          left = 0;
        }
      }
      complete_sealed();
    }
    return moved;
  }

  /// Frames the cipher has sealed are done only once all of their ciphertext is with the
  /// kernel: done as soon as it was sealed, a send whose record had not all fit in the socket
  /// left its tail here until this rank's next call on the connection (and lost it if the
  /// process ended first), while the peer waited for it. Returns whether any completed.
  bool complete_sealed() {
    if (sealed_.empty() || (cipher_ && cipher_->pending())) return false;
    for (transfer* x : sealed_) x->done = true;
    sealed_.clear();
    return true;
  }

  /// Reads whatever has arrived and completes posted receives. Also reads when nothing is
  /// posted, so that a peer's abort frame or EOF is noticed while we wait on someone else.
  bool pump() {
    bool moved = false;
    for (;;) {
      // 1. Deliver what is buffered.
      if (parse_buffered()) moved = true;
      if (!readable && !(cipher_ && cipher_->buffered())) break;
      // 2. A large payload in progress with the buffer drained: read straight into place.
      if (rx_has_header_ && !rxq_.empty() && rx_begin_ == rx_end_) {
        transfer* x = rxq_.front();
        const std::size_t want = x->length - rx_got_;
        if (want > tcp_small_payload) {
          const ssize_t n = recv_some(x->data + rx_got_, want);
          if (!after_recv(n)) break;
          rx_got_ += static_cast<std::size_t>(n);
          moved = true;
          if (rx_got_ == x->length) complete_front();
          continue;
        }
      }
      // 3. Otherwise fill the buffer, unless it is full of frames nobody has asked for yet.
      if (rx_begin_ > 0 && rx_begin_ == rx_end_) rx_begin_ = rx_end_ = 0;
      if (rx_end_ == tcp_rx_buffer) {
        if (rx_begin_ == 0) break;  // full: wait for a recv to be posted
        std::memmove(rx_.get(), rx_.get() + rx_begin_, rx_end_ - rx_begin_);
        rx_end_ -= rx_begin_;
        rx_begin_ = 0;
      }
      std::size_t room = tcp_rx_buffer - rx_end_;
      if (!rx_has_header_ && !rxq_.empty() && rxq_.front()->length > tcp_small_payload &&
          rx_end_ - rx_begin_ < sizeof(frame_header)) {
        // A large payload is due next: read only its header, so that the payload lands in
        // place in step 2 instead of being copied through the buffer.
        room = std::min(room, sizeof(frame_header) - (rx_end_ - rx_begin_));
      }
      const ssize_t n = recv_some(rx_.get() + rx_end_, room);
      if (!after_recv(n)) break;
      rx_end_ += static_cast<std::size_t>(n);
      moved = true;
    }
    if (closed_ && !rxq_.empty()) {
      parse_buffered();
      if (!rxq_.empty()) throw lost("recv from");
    }
    return moved;
  }

  /// Judges the link while the kernel holds bytes of ours that the peer has not
  /// acknowledged (tcp_transport::wait calls it every so often), from what the kernel
  /// knows (TCP_INFO), and throws errc::connection_lost when the peer's host has stopped
  /// answering. A host answers the kernel's resends of our oldest segment and its probes of
  /// a closed window (sent at doubling intervals, from 0.2 s up to 2 minutes) within a round
  /// trip, as long as it is up, whether its process reads or not: a window stays closed as
  /// long as the receive is not posted, which may rightly be any time. Some go unanswered
  /// all the same: one may be lost, and a host answers window probes at most every 0.5 s
  /// (net.ipv4.tcp_invalid_ratelimit), so the second of a closed window is not. Dead:
  /// nothing heard for `timeout`, and since then
  ///  - segments in flight: two of our transmissions seen unanswered, the latest for longer
  ///    than a round trip and a delayed acknowledgement may take (0.5 s);
  ///  - a closed window: three probes unanswered, the latest for 0.5 s.
  /// Behind a window closed for long the probes are minutes apart, and so is the verdict.
  /// TCP_USER_TIMEOUT is not used: Linux applies it to a closed window too, and failed a
  /// live peer that posted its receive of 64 MiB 15 s after the send.
  void check_link(clock::time_point now, std::chrono::milliseconds timeout) {
    if (closed_) return;
    int queued = 0;
    if (::ioctl(fd_.get(), SIOCOUTQ, &queued) != 0 || queued <= 0) return;
    tcp_info info{};
    socklen_t len = sizeof info;
    if (::getsockopt(fd_.get(), IPPROTO_TCP, TCP_INFO, &info, &len) != 0) return;
    using ms = std::chrono::milliseconds;
    constexpr ms round_trip(500), jitter(50);  // jitter: the kernel's clock ticks, and ours
    const ms heard(info.tcpi_last_ack_recv);     // since the peer's last answer
    const ms sent(info.tcpi_last_data_sent);     // since our latest segment, new or sent again
    if (const auto answer = now - heard; answer > link_.answer + jitter) link_ = {.answer = answer};
    std::string why;
    if (info.tcpi_unacked > 0) {
      // A transmission after the last answer (a later one: a new one).
      if (sent < heard && now - sent > link_.sent + jitter) {
        link_.sent = now - sent;
        ++link_.unanswered;
      }
      if (link_.unanswered < 2 || now - link_.sent < round_trip) return;
      why = std::to_string(link_.unanswered) + " transmissions unanswered";
    } else {
      if (info.tcpi_probes != link_.probes) {
        link_.probes = info.tcpi_probes;
        link_.probed = now;
      }
      if (link_.probes < 3 || now - link_.probed < round_trip) return;
      why = std::to_string(link_.probes) + " window probes unanswered";
    }
    if (heard < timeout) return;
    closed_ = true;
    throw error(errc::connection_lost,
                "connection lost: send to rank " + std::to_string(peer_) + ": its host has not answered for " +
                    std::to_string(heard.count()) + " ms (" + why + ", " + std::to_string(queued) +
                    " bytes queued): it or the link to it is down",
                {peer_}, std::nullopt, "send to");
  }

  /// Best effort, bounded: if no frame is half-sent, send an abort frame carrying `text` and
  /// the call this rank failed in, if any.
  void send_abort(const std::string& text, const frame_header* call, clock::time_point deadline) noexcept {
    if (closed_ || tx_off_ != 0) return;
    try {
      const auto len = static_cast<std::uint32_t>(std::min<std::size_t>(text.size(), max_abort_text));
      frame_header h = abort_header(len, call);
      if (cipher_) {
        // Sealed like every other frame, after whatever ciphertext is still unsent.
        iovec parts[2] = {{&h, sizeof h}, {const_cast<char*>(text.data()), len}};
        if (cipher_->drain_until(fd_.get(), deadline) && cipher_->send(fd_.get(), parts, 2) >= 0) {
          cipher_->drain_until(fd_.get(), deadline);
        }
      } else {
        send_all(fd_.get(), {{&h, sizeof h}, {const_cast<char*>(text.data()), len}}, deadline);
      }
    } catch (...) {
    }
    txq_.clear();
    sealed_.clear();
  }

 private:
  /// A send failed (errno `err`): the connection is gone. A peer that gives up sends its
  /// abort frame and then closes, and closing with our bytes unread resets the connection,
  /// so the send that fails may have the peer's reason waiting behind it, perhaps after data
  /// frames not yet asked for. That reason is worth more than the reset: read what the socket
  /// still holds, without waiting, and throw the abort if it is there.
  [[noreturn]] void fail_send(int err) {
    closed_ = true;
    std::optional<error> why;
    try {
      why = abort_left();
    } catch (const error&) {
      // A tail that does not decrypt says nothing more than the reset.
    }
    if (why) throw *why;
    throw lost("send to", err);
  }

  /// fail_send(): the peer's abort among the bytes still buffered or on the socket, if any.
  std::optional<error> abort_left() {
    std::vector<std::byte> rest(rx_.get() + rx_begin_, rx_.get() + rx_end_);
    // Where the next header starts: after what is still due to the frame being received.
    std::size_t at = rx_has_header_ ? rx_hdr_.length - rx_got_ : 0;
    std::size_t read = 0;
    for (int resets = 0;;) {
      while (rest.size() >= at + sizeof(frame_header)) {
        frame_header h;
        std::memcpy(&h, rest.data() + at, sizeof h);
        if (h.magic != frame_magic) return std::nullopt;
        if (h.kind != frame_abort) {
          at += sizeof h + h.length;
          continue;
        }
        if (h.length > max_abort_text) return std::nullopt;
        if (rest.size() < at + sizeof h + h.length) break;  // its text is still on the socket
        const std::string text(reinterpret_cast<const char*>(rest.data() + at + sizeof h), h.length);
        return peer_failed(peer_, self_, h, text, history_);
      }
      // Keep only bytes from the next header on, and read more: what a socket buffers is
      // bounded by its size, and we stop well past any.
      const std::size_t drop = std::min(at, rest.size());
      rest.erase(rest.begin(), rest.begin() + static_cast<std::ptrdiff_t>(drop));
      at -= drop;
      if (read > (64u << 20)) return std::nullopt;
      const std::size_t had = rest.size();
      rest.resize(had + tcp_rx_buffer);
      const ssize_t n = recv_some(rest.data() + had, tcp_rx_buffer);
      rest.resize(had + static_cast<std::size_t>(std::max<ssize_t>(n, 0)));
      if (n > 0) {
        read += static_cast<std::size_t>(n);
      } else if (n == 0 || errno == EAGAIN || errno == EWOULDBLOCK || ++resets > 1) {
        // One error is allowed: a reset the send did not report is reported to the first
        // read, and the bytes that arrived before it are readable after.
        return std::nullopt;
      }
    }
  }

  error lost(const char* dir, int err = 0) const {
    std::string why = err ? std::string(": ") + std::strerror(err) : ": the peer closed the connection";
    return error(errc::connection_lost,
                 std::string("connection lost: ") + dir + " rank " + std::to_string(peer_) + why,
                 {peer_}, std::nullopt, dir);
  }

  ssize_t recv_some(std::byte* dst, std::size_t size) {
    return cipher_ ? cipher_->recv(fd_.get(), dst, size)
                   : ::recv(fd_.get(), dst, size, MSG_DONTWAIT);
  }

  /// Handles a recv() result; false means stop reading for now.
  bool after_recv(ssize_t n) {
    if (n > 0) {
      // Linux leaves quick-ACK mode on its own and then delays ACKs up to 200 ms; a bulk
      // sender whose window is full waits that long. Re-arming after each large read keeps
      // ACKs prompt; small frames skip the extra system call (their ACKs ride on replies).
      if (static_cast<std::size_t>(n) > tcp_small_payload) {
        const int one = 1;
        ::setsockopt(fd_.get(), IPPROTO_TCP, TCP_QUICKACK, &one, sizeof one);
      }
      return true;
    }
    if (n == 0) {
      // EOF between operations is how a finished peer says goodbye: its last frames may
      // still sit in our buffer. Only a receive that the buffer cannot answer is a failure
      // (pump() checks that once the buffer is parsed).
      closed_ = true;
      readable = false;
      return false;
    }
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      readable = false;
      return false;
    }
    if (errno == EINTR) return true;
    closed_ = true;
    throw lost("recv from", errno);
  }

  /// Consumes complete headers and buffered payload bytes.
  bool parse_buffered() {
    bool moved = false;
    for (;;) {
      const std::size_t avail = rx_end_ - rx_begin_;
      if (!rx_has_header_) {
        if (avail < sizeof(frame_header)) return moved;
        std::memcpy(&rx_hdr_, rx_.get() + rx_begin_, sizeof rx_hdr_);
        if (rx_hdr_.magic != frame_magic) {
          check_header(rx_hdr_, frame_header{}, peer_, self_);  // throws errc::protocol
        }
        if (rx_hdr_.kind == frame_abort) {
          if (rx_hdr_.length > max_abort_text) {
            throw error(errc::protocol, "rank " + std::to_string(peer_) + " sent an abort frame of " +
                                            std::to_string(rx_hdr_.length) + " bytes",
                        {peer_});
          }
          if (avail < sizeof(frame_header) + rx_hdr_.length) return moved;  // wait for the text
          std::string text(reinterpret_cast<const char*>(rx_.get() + rx_begin_ + sizeof(frame_header)),
                           rx_hdr_.length);
          throw peer_failed(peer_, self_, rx_hdr_, text, history_);
        }
        if (rx_hdr_.kind == frame_check) {  // no payload, and not a message: read it and go on
          read_check(rx_hdr_, peer_, self_, history_);
          rx_begin_ += sizeof(frame_header);
          moved = true;
          continue;
        }
        if (rxq_.empty()) return moved;  // a frame for a receive not yet posted: keep it
        transfer* x = rxq_.front();
        check_header(rx_hdr_, x->header, peer_, self_, history_);  // lengths now agree with the post
        rx_begin_ += sizeof(frame_header);
        rx_has_header_ = true;
        rx_got_ = 0;
        moved = true;
        if (x->length == 0) {
          complete_front();
          continue;
        }
      }
      transfer* x = rxq_.front();
      const std::size_t take = std::min(rx_end_ - rx_begin_, x->length - rx_got_);
      if (take == 0) return moved;
      std::memcpy(x->data + rx_got_, rx_.get() + rx_begin_, take);
      rx_begin_ += take;
      rx_got_ += take;
      moved = true;
      if (rx_got_ == x->length) complete_front();
    }
  }

  void complete_front() {
    rxq_.front()->done = true;
    rxq_.pop_front();
    rx_has_header_ = false;
    rx_got_ = 0;
  }

  unique_fd fd_;
  int self_;
  int peer_;
  bool closed_ = false;
  std::unique_ptr<tcp_cipher> cipher_;

  std::deque<transfer*> txq_;
  std::vector<transfer*> sealed_;  // taken whole by the cipher, their record not all sent
  std::size_t tx_off_ = 0;  // bytes of txq_.front() (header + payload) already sent

  std::deque<transfer*> rxq_;
  std::unique_ptr<std::byte[]> rx_;
  std::size_t rx_begin_ = 0, rx_end_ = 0;
  bool rx_has_header_ = false;  // rx_hdr_ belongs to rxq_.front() and its payload is due
  frame_header rx_hdr_{};
  const call_history* history_ = nullptr;
  transfer check_{.done = true};  // the check frame post_check() queued last
  std::size_t rx_got_ = 0;
  // check_link(): the peer's last answer, as last seen, and what it left unanswered since.
  struct link_watch {
    clock::time_point answer{};      // when the peer last answered
    clock::time_point sent{};        // our latest transmission seen unanswered
    int unanswered = 0;              // transmissions seen unanswered
    std::uint8_t probes = 0;         // window probes unanswered (tcpi_probes), as last seen
    clock::time_point probed{};      // when that count was first seen
  } link_;
};

}  // namespace chorus::detail
