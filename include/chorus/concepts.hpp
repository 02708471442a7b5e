// SPDX-License-Identifier: Apache-2.0
// Every contract a user can implement: today, a transport.
#pragma once

#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "chorus/detail/frame.hpp"

namespace chorus {

/// One posted send or receive. The executor owns it and keeps it at a stable address until
/// the transport sets `done`.
struct transfer {
  detail::frame_header header{};  ///< send: the header to send; recv: the header expected
  std::byte* data = nullptr;      ///< payload (send: read from; recv: written to)
  std::size_t length = 0;         ///< payload bytes, equal to header.length
  bool done = false;              ///< set by the transport when the buffer may be reused
  /// recv only, set by the executor: the transport may complete this receive by pointing
  /// `data` at the payload in its own memory (setting `lent`) instead of copying it out.
  bool lendable = false;
  /// Set by a transport that lent its memory; the executor reads `data` and then calls
  /// release(peer, this), in posting order per peer. Saves a copy of every reduced slice
  /// on shared memory, where copies are the whole cost.
  bool lent = false;
  /// send only, set by the executor: nothing writes `data` until `done`, and nothing waits
  /// for this send to finish before the receiver has taken it, so the transport may let the
  /// receiver read the payload straight out of our memory (shared memory with cross-memory
  /// attach: one copy instead of two) and set `done` only once it has. Set for the steps of
  /// direct schedules, which send each byte once and forward nothing they receive.
  bool exposable = false;
};

using clock = std::chrono::steady_clock;

/// A transport moves frames between this rank and its peers.
///
/// 1. `post_send(peer, t)` and `post_recv(peer, t)` never block. Frames to one peer arrive
///    in the order they were posted, and the k-th recv posted for a peer matches the k-th
///    send that peer posted to us: schedules are deterministic, so order is identity, and no
///    tag matching is needed on the hot path.
/// 2. `post_recv` checks the arriving header against `t.header` (detail::check_header) before
///    a payload byte is written, so a mismatched call fails with errc::mismatch, never with
///    silently wrong data.
/// 3. `progress()` moves as many bytes as are ready and returns whether anything moved; it
///    never blocks, because the executor decides when to spin and when to sleep.
/// 4. `wait(deadline)` sleeps until progress() may have work or the deadline passes, so a
///    rank that waits leaves the CPU to its peers (tests run 8 ranks on 2 cores).
/// 5. Failures throw chorus::error naming the peer: EOF or reset is errc::connection_lost,
///    bytes that are not a frame errc::protocol, a peer's abort frame errc::remote_error.
/// 6. `abort(message, call)` tells every peer, best effort and in bounded time, that this
///    rank failed, and in which call (`call` as its frames carry it; null outside one), so
///    their pending operations fail at once instead of at their timeouts. A peer's abort
///    becomes detail::peer_failed's error.
/// 7. A send marked `exposable` may complete only when the peer has read it; the peer's
///    receive completes as any other (its `data` filled). A transport ignores the mark where
///    it cannot do better than copying.
/// 8. Optionally, `release(peer, t)` takes back memory lent to a receive (`transfer::lent`);
///    a transport without it never lends. Optionally, `max_slice_bytes()` caps the slices
///    the executor cuts (a shared-memory ring must hold several at once). Optionally,
///    `remember(calls)` is given, once, the executor's record of this rank's recent calls,
///    against which the transport describes a frame left over from an earlier call
///    (check_header) and the call a failed peer names in its abort (peer_failed).
///    Optionally, `post_check(peer, h)` queues a check frame (detail::frame_check, header
///    `h`) behind the frames already queued to `peer`, and a transport that has it reads a
///    peer's check frames with detail::read_check, outside the order of messages.
///    Optionally, `reads_in_place()` says that every peer of this rank's node reads our
///    exposable sends in place, so that the tuner prices them so (transports without it
///    never do).
template <class T>
concept transport = requires(T& t, const T& ct, int peer, transfer* x, clock::time_point d,
                             const std::string& msg, const detail::frame_header* call) {
  { ct.rank() } -> std::convertible_to<int>;
  { ct.size() } -> std::convertible_to<int>;
  { ct.name() } -> std::convertible_to<std::string>;
  { ct.describe() } -> std::convertible_to<std::string>;
  t.post_send(peer, x);
  t.post_recv(peer, x);
  { t.progress() } -> std::same_as<bool>;
  t.wait(d);
  t.abort(msg, call);
};

namespace detail {

/// The type-erased transport the executor drives; one virtual call per slice is noise next
/// to the system call that moves the slice.
class any_transport {
 public:
  virtual ~any_transport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string name() const = 0;
  virtual std::string describe() const = 0;
  virtual void post_send(int peer, transfer* x) = 0;
  virtual void post_recv(int peer, transfer* x) = 0;
  virtual bool progress() = 0;
  virtual void wait(clock::time_point deadline) = 0;
  virtual void abort(const std::string& message, const frame_header* call) noexcept = 0;
  virtual void release(int peer, transfer* x) = 0;
  virtual std::size_t max_slice_bytes() const = 0;
  virtual void remember(const call_history* calls) = 0;
  virtual bool reads_in_place() const = 0;
  virtual void post_check(int peer, const frame_header& h) = 0;
};

template <transport T>
class transport_model final : public any_transport {
 public:
  explicit transport_model(T t) : t_(std::move(t)) {}
  int rank() const override { return t_.rank(); }
  int size() const override { return t_.size(); }
  std::string name() const override { return t_.name(); }
  std::string describe() const override { return t_.describe(); }
  void post_send(int peer, transfer* x) override { t_.post_send(peer, x); }
  void post_recv(int peer, transfer* x) override { t_.post_recv(peer, x); }
  bool progress() override { return t_.progress(); }
  void wait(clock::time_point deadline) override { t_.wait(deadline); }
  void abort(const std::string& message, const frame_header* call) noexcept override { t_.abort(message, call); }
  void release(int peer, transfer* x) override {
    if constexpr (requires { t_.release(peer, x); }) t_.release(peer, x);
  }
  std::size_t max_slice_bytes() const override {
    if constexpr (requires { t_.max_slice_bytes(); }) {
      return t_.max_slice_bytes();
    } else {
      return SIZE_MAX;
    }
  }
  void remember(const call_history* calls) override {
    if constexpr (requires { t_.remember(calls); }) t_.remember(calls);
  }
  void post_check(int peer, const frame_header& h) override {
    if constexpr (requires { t_.post_check(peer, h); }) t_.post_check(peer, h);
  }
  bool reads_in_place() const override {
    if constexpr (requires { t_.reads_in_place(); }) {
      return t_.reads_in_place();
    } else {
      return false;
    }
  }

 private:
  T t_;
};

}  // namespace detail
}  // namespace chorus
