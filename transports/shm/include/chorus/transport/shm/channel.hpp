// SPDX-License-Identifier: Apache-2.0
// The two ends of one shared-memory ring: frames streamed in, frames copied or lent out.
#pragma once

#include <sys/uio.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <string>

#include <chorus/concepts.hpp>
#include <chorus/detail/frame.hpp>
#include <chorus/error.hpp>
#include <chorus/transport/shm/segment.hpp>

namespace chorus::detail {

// A ring carries the same frames as a TCP stream (header, then payload), each preceded by an
// 8-byte tag and padded so that every frame starts on its own cache line:
//
//   [tag][frame_header][payload][padding to 64 bytes]
//
// The producer stores the tag, a function of the frame's ring position, after the frame's
// first chunk; a consumer that reads the expected tag knows the header is there, and for a
// frame of one cache line (payloads up to 16 bytes) the whole frame: a small operation then
// costs the consumer one cache-line transfer instead of two (the head, then the data). Larger
// payloads are followed through `head`. Tags of earlier laps never match (positions only
// grow, and a per-segment salt keeps payload bytes from looking like a tag by accident).
inline constexpr std::size_t shm_line = 64;
inline constexpr std::size_t shm_tag_bytes = 8;
inline constexpr std::size_t shm_prefix_bytes = shm_tag_bytes + sizeof(frame_header);
/// Progress is published every this many bytes, so the other end starts on a large frame
/// while it is still being copied (a 1 MiB copy takes ~50 µs; its reader would idle).
inline constexpr std::size_t shm_publish_bytes = 64 * 1024;

// A pull frame stands for a payload the consumer reads straight out of the producer's memory
// (process_vm_readv, "cross-memory attach") instead of out of the ring: the producer's send
// was marked exposable (concepts.hpp) and the consumer showed at connection that it can read
// us (shm_ring_ctl::can_pull). The frame is one cache line, its header marked by
// shm_pull_magic and followed by the payload's address; the send completes when the consumer
// counts the frame in `pulled`. One copy per byte instead of two (into the ring, out of it),
// and none of it on the sender's core: on a 2-core VM a 64 MiB all-reduce among 8 ranks ran
// 2-3x faster that way (direct schedules; bench/compare).
inline constexpr std::uint32_t shm_pull_magic = 0x50524843;  // "CHRP"
struct shm_pull_desc {
  std::uint64_t address;  ///< of the payload, in the producer's address space
  std::uint64_t length;   ///< equal to the header's
};
/// Smaller payloads go through the ring: a read of another process's memory costs a system
/// call and pinning its pages, more than copying a few KiB twice.
inline constexpr std::size_t shm_pull_min_bytes = 64 * 1024;

inline std::size_t shm_frame_bytes(std::size_t payload) {
  return shm_round_up(shm_prefix_bytes + payload, shm_line);
}
inline std::uint64_t shm_tag(std::uint64_t position, std::uint64_t salt) {
  return (position + 1) ^ salt;
}

/// Tells the rank behind `m` that something it may wait for changed. The fence pairs with
/// the one in shm_transport::wait(): either the sleeper sees our update before sleeping, or
/// we see it sleeping and wake it (Dekker's pattern; both sides fence after their store).
inline void shm_ring_bell(shm_member& m) {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (m.sleeping.load(std::memory_order_relaxed) != 0) {
    // Release: a sleeper that reads the new bell value also sees what we published.
    m.bell.fetch_add(1, std::memory_order_release);
    futex_wake_all(&m.bell);
  }
}

/// Copies between linear memory and ring positions, splitting at the ring's end.
struct shm_ring_view {
  std::byte* data = nullptr;
  std::size_t bytes = 0;  // a power of two

  std::size_t at(std::uint64_t pos) const { return static_cast<std::size_t>(pos & (bytes - 1)); }
  void put(std::uint64_t pos, const void* src, std::size_t n) const {
    const std::size_t i = at(pos);
    const std::size_t first = std::min(n, bytes - i);
    std::memcpy(data + i, src, first);
    if (n > first) std::memcpy(data, static_cast<const std::byte*>(src) + first, n - first);
  }
  std::atomic_ref<std::uint64_t> tag_at(std::uint64_t pos) const {
    return std::atomic_ref<std::uint64_t>(*reinterpret_cast<std::uint64_t*>(data + at(pos)));
  }
  void get(std::uint64_t pos, void* dst, std::size_t n) const {
    const std::size_t i = at(pos);
    const std::size_t first = std::min(n, bytes - i);
    std::memcpy(dst, data + i, first);
    if (n > first) std::memcpy(static_cast<std::byte*>(dst) + first, data, n - first);
  }
};

/// This rank's end of the ring to one peer: queued frames are streamed in as room appears;
/// exposable payloads go as pull frames where the peer can read our memory (`pulls`).
class shm_sender {
 public:
  shm_sender(shm_ring_ctl* ctl, shm_ring_view ring, shm_member* reader, std::uint64_t salt,
             int peer = -1, bool pulls = false)
      : ctl_(ctl), ring_(ring), reader_(reader), salt_(salt), peer_(peer), pulls_(pulls) {}

  bool busy() const { return !txq_.empty() || !exposed_.empty(); }
  void post(transfer* x) { txq_.push_back(x); }
  /// Queues a check frame (detail::frame_check) with header `h`; one at a time: while the
  /// last is unsent, a new one would say nothing more.
  void post_check(const frame_header& h) {
    if (!check_.done) return;
    check_ = transfer{};
    check_.header = h;
    txq_.push_back(&check_);
  }
  /// The consumer moved its tail, or read a payload we exposed, since we last looked (we
  /// may wait for either).
  bool room_changed() const {
    return (!txq_.empty() && ctl_->tail.load(std::memory_order_acquire) != tail_) ||
           (!exposed_.empty() && ctl_->pulled.load(std::memory_order_acquire) != acked_);
  }
  /// Whether exposable payloads go as pull frames.
  bool pulls() const { return pulls_; }

  bool flush() {
    bool moved = retire_pulled();
    while (!txq_.empty()) {
      transfer* x = txq_.front();
      const bool pull = off_ == 0 && pulls_ && x->exposable && x->length >= shm_pull_min_bytes;
      if (pull) {
        // One line, written whole: the tag covers it, and the consumer reads it at once.
        if (room() < shm_line) {
          tail_ = ctl_->tail.load(std::memory_order_acquire);
          if (room() < shm_line) break;
        }
        frame_header h = x->header;
        h.magic = shm_pull_magic;
        const shm_pull_desc d{reinterpret_cast<std::uintptr_t>(x->data), x->length};
        ring_.put(head_ + shm_tag_bytes, &h, sizeof h);
        ring_.put(head_ + shm_prefix_bytes, &d, sizeof d);
        ring_.tag_at(head_).store(shm_tag(head_, salt_), std::memory_order_release);
        head_ += shm_line;
        ctl_->head.store(head_, std::memory_order_release);
        txq_.pop_front();
        exposed_.push_back(x);  // done once the consumer has read it
        moved = true;
        continue;
      }
      const std::size_t frame = shm_frame_bytes(x->length);
      std::size_t free = room();
      if (free < std::min(frame - off_, shm_publish_bytes)) {
        tail_ = ctl_->tail.load(std::memory_order_acquire);
        free = room();
        // A frame starts only with its whole first line free: the tag covers that line.
        if (free == 0 || (off_ == 0 && free < shm_line)) break;
      }
      const std::size_t n = std::min({free, frame - off_, shm_publish_bytes});
      write_frame_bytes(*x, off_, n);
      if (off_ == 0) ring_.tag_at(head_).store(shm_tag(head_, salt_), std::memory_order_release);
      head_ += n;
      off_ += n;
      ctl_->head.store(head_, std::memory_order_release);
      moved = true;
      if (off_ == frame) {
        x->done = true;
        txq_.pop_front();
        off_ = 0;
      }
    }
    if (moved) shm_ring_bell(*reader_);
    return moved;
  }

 private:
  static_assert(shm_prefix_bytes + sizeof(shm_pull_desc) <= shm_line, "a pull frame is one line");

  /// Completes the exposed sends the consumer has read, in order.
  bool retire_pulled() {
    if (exposed_.empty()) return false;
    const std::uint64_t pulled = ctl_->pulled.load(std::memory_order_acquire);
    if (pulled - acked_ > exposed_.size()) {
      throw error(errc::protocol,
                  "the shared-memory ring to rank " + std::to_string(peer_) + " is corrupt: it says " +
                      std::to_string(pulled - acked_) + " payloads were read in place, of " +
                      std::to_string(exposed_.size()) + " offered",
                  {peer_}, std::nullopt, "send to");
    }
    if (pulled == acked_) return false;
    for (; acked_ != pulled; ++acked_) {
      exposed_.front()->done = true;
      exposed_.pop_front();
    }
    return true;
  }

  /// Free bytes: the consumer's tail only grows and never passes our head, but a tail we
  /// cannot trust (memory shared with another process) must not make us overrun the ring.
  std::size_t room() const {
    const std::uint64_t used = head_ - tail_;
    return used > ring_.bytes ? 0 : ring_.bytes - static_cast<std::size_t>(used);
  }

  /// Writes bytes [from, from + n) of x's frame at head_: the header and payload parts of
  /// them (the tag is stored apart, the padding is never read).
  void write_frame_bytes(const transfer& x, std::size_t from, std::size_t n) {
    const std::size_t end = from + n;
    auto part = [&](std::size_t begin, std::size_t size, const std::byte* src) {
      const std::size_t lo = std::max(from, begin);
      const std::size_t hi = std::min(end, begin + size);
      if (lo < hi) ring_.put(head_ + (lo - from), src + (lo - begin), hi - lo);
    };
    part(shm_tag_bytes, sizeof(frame_header), reinterpret_cast<const std::byte*>(&x.header));
    part(shm_prefix_bytes, x.length, x.data);
  }

  shm_ring_ctl* ctl_;
  shm_ring_view ring_;
  shm_member* reader_;
  std::uint64_t salt_;
  int peer_;
  bool pulls_;
  std::deque<transfer*> txq_;
  std::deque<transfer*> exposed_;  // sent as pull frames, not yet read
  std::uint64_t head_ = 0;   // our copy: only we write it
  std::uint64_t tail_ = 0;   // the consumer's, as last read
  std::uint64_t acked_ = 0;  // pull frames known read
  std::size_t off_ = 0;      // bytes of txq_.front()'s frame already in the ring
  transfer check_{.done = true};  // the check frame post_check() queued last
};

/// This rank's end of the ring from one peer: frames are checked against the posted
/// receive, then copied out, lent in place to a reducing receive, or, for a pull frame, read
/// out of the peer's memory (process `peer_pid`; 0 where we cannot read it).
class shm_receiver {
 public:
  shm_receiver(shm_ring_ctl* ctl, shm_ring_view ring, shm_member* writer, std::uint64_t salt,
               int self, int peer, int peer_pid = 0)
      : ctl_(ctl), ring_(ring), writer_(writer), salt_(salt), self_(self), peer_(peer), peer_pid_(peer_pid) {}

  bool busy() const { return !rxq_.empty(); }
  void post(transfer* x) { rxq_.push_back(x); }
  /// The producer wrote since we last looked (we may wait for data).
  /// Between frames only the next tag tells (head_ may lag behind frames read by their tag,
  /// so comparing it would report news forever and keep a waiter from ever sleeping).
  bool data_changed() const {
    if (!have_header_) {
      return ring_.tag_at(rd_).load(std::memory_order_acquire) == shm_tag(rd_, salt_);
    }
    return ctl_->head.load(std::memory_order_acquire) != head_;
  }

  bool pump() {
    bool moved = false;
    while (!rxq_.empty() && !sender_failed_) {
      transfer* x = rxq_.front();
      if (!have_header_) {
        if (ring_.tag_at(rd_).load(std::memory_order_acquire) != shm_tag(rd_, salt_)) break;
        frame_header h;
        ring_.get(rd_ + shm_tag_bytes, &h, sizeof h);
        if (take_check(h)) {
          moved = true;
          continue;
        }
        pull_ = h.magic == shm_pull_magic;
        if (pull_) h.magic = frame_magic;
        check_header(h, x->header, peer_, self_, history_);  // lengths now agree with the post
        frame_start_ = rd_;
        rd_ += shm_prefix_bytes;
        have_header_ = true;
        got_ = 0;
        moved = true;
        // A one-line frame is complete with its tag; longer ones are followed by head.
        frame_bytes_ = shm_frame_bytes(pull_ ? sizeof(shm_pull_desc) : x->length);
        whole_ = frame_bytes_ == shm_line;
      }
      const std::uint64_t frame_end = frame_start_ + frame_bytes_;
      if (pull_) {
        // A sender that failed may have handed its buffers back to its caller (or exited)
        // before we read them: what we read is then not what it sent. Its flag is raised
        // before it returns (shm_transport::abort), so a read that saw its caller's writes
        // sees the flag too; the transport's check of its peers then names the failure.
        if (writer_->failed.load(std::memory_order_acquire) != 0) {
          sender_failed_ = true;
          break;
        }
        shm_pull_desc d;
        ring_.get(rd_, &d, sizeof d);
        try {
          pull(d, *x);
        } catch (const error&) {
          // It failed, then exited, while we read: its failure is the news, not the exit.
          if (writer_->failed.load(std::memory_order_acquire) == 0) throw;
          sender_failed_ = true;
          break;
        }
        std::atomic_thread_fence(std::memory_order_seq_cst);
        if (writer_->failed.load(std::memory_order_acquire) != 0) {
          sender_failed_ = true;
          break;
        }
        x->lent = false;
        rd_ = frame_end;
        have_header_ = false;
        x->done = true;
        rxq_.pop_front();
        ctl_->pulled.store(++pulled_, std::memory_order_release);
        publish_tail();
        shm_ring_bell(*writer_);  // the sender may sleep until its send completes
        continue;
      }
      if (x->lendable && got_ == 0 && x->length > 0 && may_lend(*x)) {
        // The whole payload, in place: the executor reduces straight from the ring.
        if (!available(static_cast<std::size_t>(frame_end - rd_))) break;
        x->data = ring_.data + ring_.at(rd_);
        x->lent = true;
        lent_.push_back({frame_start_, frame_end, false});
        lent_bytes_ += frame_end - frame_start_;
      } else {
        while (got_ < x->length) {
          if (!available(1)) break;
          const std::size_t n = std::min({whole_ ? x->length - got_ : static_cast<std::size_t>(head_ - rd_),
                                          x->length - got_, shm_publish_bytes});
          ring_.get(rd_, x->data + got_, n);
          rd_ += n;
          got_ += n;
          publish_tail();
          moved = true;
        }
        // The padding too: our tail must never pass the producer's head.
        if (got_ < x->length || !available(static_cast<std::size_t>(frame_end - rd_))) break;
      }
      rd_ = frame_end;
      have_header_ = false;
      x->done = true;
      rxq_.pop_front();
      publish_tail();
      moved = true;
    }
    return moved;
  }

  /// Reads the check frames at the front of the ring while no receive is posted
  /// (shm_transport::wait() calls it): a peer that waits for us, in a call we made
  /// differently, says so with one, perhaps while we wait for someone else.
  bool skim_checks() {
    bool moved = false;
    while (rxq_.empty() && !have_header_ && !sender_failed_ &&
           ring_.tag_at(rd_).load(std::memory_order_acquire) == shm_tag(rd_, salt_)) {
      frame_header h;
      ring_.get(rd_ + shm_tag_bytes, &h, sizeof h);
      if (!take_check(h)) break;
      moved = true;
    }
    return moved;
  }

  /// Gives back a lent payload; lent payloads come back in the order they were lent.
  /// This rank's recent calls, against which a frame left over from one is described.
  void remember(const call_history* calls) { history_ = calls; }

  void release(const transfer* x) {
    const auto start = static_cast<std::uint64_t>(x->data - ring_.data);  // ring offset
    for (auto& l : lent_) {
      if (!l.released && ring_.at(l.start + shm_prefix_bytes) == start) {
        l.released = true;
        break;
      }
    }
    while (!lent_.empty() && lent_.front().released) {
      lent_bytes_ -= lent_.front().end - lent_.front().start;
      lent_.pop_front();
    }
    publish_tail();
  }

 private:
  struct lent_frame {
    std::uint64_t start, end;
    bool released;
  };

  /// Where `h`, the header of the frame at rd_ (its tag seen), is a check frame
  /// (detail::frame_check), reads it and moves past it: no payload, and not a message, one
  /// line complete with its tag.
  bool take_check(const frame_header& h) {
    if (h.magic != frame_magic || h.kind != frame_check) return false;
    read_check(h, peer_, self_, history_);
    rd_ += shm_frame_bytes(0);
    publish_tail();
    return true;
  }

  /// Reads the payload a pull frame names out of the sender's memory into x.data.
  void pull(const shm_pull_desc& d, transfer& x) const {
    if (d.length != x.length) {
      throw error(errc::protocol,
                  "rank " + std::to_string(peer_) + " offered " + std::to_string(d.length) +
                      " bytes to read in place where its frame said " + std::to_string(x.length),
                  {peer_}, std::nullopt, "recv");
    }
    if (peer_pid_ <= 0) {
      throw error(errc::protocol,
                  "rank " + std::to_string(peer_) +
                      " offered its memory to read in place, which this rank cannot read (another "
                      "pid namespace, or reading was not agreed)",
                  {peer_}, std::nullopt, "recv");
    }
    std::uint64_t from = d.address;
    std::byte* to = x.data;
    std::size_t left = x.length;
    while (left > 0) {
      iovec local{to, left};
      iovec remote{reinterpret_cast<void*>(static_cast<std::uintptr_t>(from)), left};
      const ssize_t got = ::process_vm_readv(peer_pid_, &local, 1, &remote, 1, 0);
      if (got > 0) {
        to += got;
        from += static_cast<std::uint64_t>(got);
        left -= static_cast<std::size_t>(got);
        continue;
      }
      const int err = got == 0 ? EFAULT : errno;
      if (err == EINTR) continue;
      if (err == ESRCH) {
        throw error(errc::connection_lost,
                    "connection lost: rank " + std::to_string(peer_) + " (pid " + std::to_string(peer_pid_) +
                        ") exited while its send was read",
                    {peer_}, std::nullopt, "recv from");
      }
      throw error(errc::protocol,
                  "reading " + std::to_string(left) + " bytes that rank " + std::to_string(peer_) +
                      " offered at 0x" + to_hex(from) + " in place failed: " + std::strerror(err),
                  {peer_}, std::nullopt, "recv");
    }
  }
  static std::string to_hex(std::uint64_t v) {
    char buf[24];
    std::snprintf(buf, sizeof buf, "%llx", static_cast<unsigned long long>(v));
    return buf;
  }

  /// Lend only while half the ring stays free for the frames behind it, so the producer
  /// never waits on a payload the executor holds, and only payloads that do not wrap.
  bool may_lend(const transfer& x) const {
    const std::size_t frame = shm_frame_bytes(x.length);
    return lent_bytes_ + frame <= ring_.bytes / 2 && ring_.at(rd_) + x.length <= ring_.bytes;
  }

  /// n more bytes at rd_ have been written. (A one-line frame read through its tag may put
  /// rd_ ahead of the head we last saw, hence no subtraction.)
  bool available(std::size_t n) {
    if (whole_ && have_header_) return true;
    if (head_ >= rd_ + n) return true;
    head_ = ctl_->head.load(std::memory_order_acquire);
    // The producer never gets more than a ring ahead of the tail we published. A head past
    // that is memory another process corrupted; trusted, it had us copy bytes nobody wrote,
    // and with rings under 64 KiB read past the ring's end (seen writing fuzz_shm_frame).
    if (head_ > published_ + ring_.bytes) {
      throw error(errc::protocol,
                  "the shared-memory ring from rank " + std::to_string(peer_) +
                      " is corrupt: its head is " + std::to_string(head_ - published_) +
                      " bytes past our tail, in a ring of " + std::to_string(ring_.bytes) +
                      " bytes",
                  {peer_}, std::nullopt, "recv");
    }
    return head_ >= rd_ + n;
  }

  /// The producer may reuse everything before the first payload still lent, and before the
  /// frame being parsed unless its payload is already being copied out (a frame whose header
  /// we have read may still be lent whole, tag and header included, so the tail must not
  /// pass its start meanwhile: a tail that moved back would let the producer overrun us).
  void publish_tail() {
    const std::uint64_t current = have_header_ && got_ == 0 ? frame_start_ : rd_;
    const std::uint64_t t = lent_.empty() ? current : lent_.front().start;
    if (t != published_) {
      ctl_->tail.store(t, std::memory_order_release);
      published_ = t;
      shm_ring_bell(*writer_);
    }
  }

  shm_ring_ctl* ctl_;
  shm_ring_view ring_;
  shm_member* writer_;
  std::uint64_t salt_;
  int self_, peer_;
  int peer_pid_;
  const call_history* history_ = nullptr;
  std::deque<transfer*> rxq_;
  std::uint64_t head_ = 0;       // the producer's, as last read
  std::uint64_t rd_ = 0;         // next byte to parse
  std::uint64_t published_ = 0;  // tail as last stored
  bool have_header_ = false;
  bool whole_ = false;  // the current frame fits one line: its tag covers it all
  bool pull_ = false;   // the current frame is a pull frame
  bool sender_failed_ = false;  // raised its failure flag while we read its memory
  std::size_t frame_bytes_ = 0;  // of the current frame in the ring
  std::uint64_t pulled_ = 0;     // pull frames read, as published in ctl_->pulled
  std::uint64_t frame_start_ = 0;
  std::size_t got_ = 0;
  std::deque<lent_frame> lent_;
  std::size_t lent_bytes_ = 0;
};

}  // namespace chorus::detail
