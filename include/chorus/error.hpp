// SPDX-License-Identifier: Apache-2.0
// The one error type of chorus: what went wrong, on which rank(s), in which operation.
#pragma once

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace chorus {

/// What kind of failure an error reports. Callers branch on this, never on the message.
enum class errc : std::uint8_t {
  invalid_argument,  ///< a bad size, pointer, option or environment variable on this rank
  mismatch,          ///< ranks called different operations (count, dtype, op, kind, order)
  timeout,           ///< a deadline passed before the peer(s) answered
  connection_lost,   ///< a peer closed its connection or died
  remote_error,      ///< another rank failed and told us; the message names it
  protocol,          ///< a peer sent bytes that are not a valid chorus frame
  bootstrap,         ///< rendezvous failed: master unreachable, ranks missing
  system,            ///< an operating-system call failed (errno in the message)
  aborted,           ///< abort() was called on the communicator
  /// a peer stopped answering heartbeats (frozen, cut off) or another rank reported it
  /// failed; error::ranks() names the failed ranks
  peer_failed,
};

/// Returns the stable name of an error code, e.g. "timeout".
constexpr std::string_view to_string(errc code) noexcept {
  switch (code) {
    case errc::invalid_argument: return "invalid_argument";
    case errc::mismatch: return "mismatch";
    case errc::timeout: return "timeout";
    case errc::connection_lost: return "connection_lost";
    case errc::remote_error: return "remote_error";
    case errc::protocol: return "protocol";
    case errc::bootstrap: return "bootstrap";
    case errc::system: return "system";
    case errc::aborted: return "aborted";
    case errc::peer_failed: return "peer_failed";
  }
  return "unknown";
}

/// The exception every chorus call throws. what() is a whole sentence such as
/// "chorus: recv from rank 3 (op 1042, all_reduce) timed out after 30 s"; the fields
/// let a program react without parsing it.
///
/// **Example**:
///   try { comm.all_reduce(grads); }
///   catch (const chorus::error& e) {
///     if (e.code() == chorus::errc::connection_lost) restart_from_checkpoint(e.ranks());
///   }
class error : public std::runtime_error {
 public:
  error(errc code, std::string message, std::vector<int> ranks = {},
        std::optional<std::uint64_t> op = std::nullopt, std::string call = {})
      : std::runtime_error("chorus: " + message),
        code_(code),
        ranks_(std::move(ranks)),
        op_(op),
        call_(std::move(call)) {}

  errc code() const noexcept { return code_; }
  /// The ranks the failure concerns (the dead peer, the mismatching ranks); may be empty.
  const std::vector<int>& ranks() const noexcept { return ranks_; }
  /// The communicator's sequence number of the failed operation, if one was running.
  std::optional<std::uint64_t> op() const noexcept { return op_; }
  /// The operation or system call that failed ("all_reduce", "connect", ...).
  const std::string& call() const noexcept { return call_; }
  /// what() without its "chorus: " prefix: the sentence an error that relays or wraps this
  /// one quotes.
  std::string message() const { return std::string(what()).substr(prefix_bytes); }

 private:
  static constexpr std::size_t prefix_bytes = 8;  // "chorus: "
  errc code_;
  std::vector<int> ranks_;
  std::optional<std::uint64_t> op_;
  std::string call_;
};

namespace detail {

/// errc::system for a failed system call, with errno's text: "shm_open(/chorus-1): Permission denied".
inline error sys_error(const std::string& what, int err = errno) {
  return error(errc::system, what + ": " + std::strerror(err), {}, std::nullopt, what);
}

}  // namespace detail
}  // namespace chorus
