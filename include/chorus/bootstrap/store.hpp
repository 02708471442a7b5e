// SPDX-License-Identifier: Apache-2.0
// The rendezvous store: a key-value store served by rank 0 over TCP, through which ranks meet.
#pragma once

#include <array>
#include <chorus/bootstrap/auth.hpp>
#include <chorus/bootstrap/env.hpp>
#include <chorus/error.hpp>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace chorus {

namespace detail {
class store_server;
}

/// How the store waits. Every field has a visible default.
struct store_options {
  /// Deadline of each wait: the initial rendezvous (connecting included) and every get,
  /// all_gather, barrier. > 0. Default 120 s, or CHORUS_BOOTSTRAP_TIMEOUT in seconds
  /// (fractions allowed); a bad value throws errc::invalid_argument when options are made.
  std::chrono::milliseconds timeout =
      env_seconds("CHORUS_BOOTSTRAP_TIMEOUT", std::chrono::seconds(120));
  /// Rank 0 only: how long destroying its store keeps serving ranks still connected. >= 0.
  /// Rank 0 often finishes first; without this a slower rank's final get would see
  /// connection_lost. The server stops as soon as every rank has disconnected.
  std::chrono::milliseconds linger = std::chrono::seconds(10);
  /// The job's secret, which every connection of the job (this store's and the transports')
  /// proves it knows; see job_secret. Unset: connect() takes job_secret::from_env(), which
  /// throws errc::invalid_argument when the environment names no secret and does not say
  /// CHORUS_AUTH=none.
  std::optional<job_secret> secret = std::nullopt;
};

/// What ranks use to meet before their transports exist: a key-value store shared by the
/// ranks of one communicator. tcp_store is the job's; split() hands a sub-communicator a
/// view of it (detail/group_store.hpp) whose keys live under the group's own prefix.
/// Transports and the topology discovery take this interface.
///
/// Contract (tcp_store's comment below gives the details and the errors):
///  1. get() waits until some rank set the key, up to the store's timeout.
///  2. all_gather() and barrier() are rounds among all size() ranks; the same key may be
///     used again for a new round when every rank makes the same sequence of calls.
///  3. Every wait ends with chorus::error naming the store's address and, where it can, the
///     ranks that never arrived, or that left the store while others waited for them.
///  4. secret() and job_id() are the job's, for the transports' handshakes.
class store {
 public:
  virtual ~store() = default;
  /// Stores `value` under `key`, replacing any earlier value.
  virtual void set(std::string_view key, std::span<const std::byte> value) = 0;
  /// The value under `key`, waiting for some rank to set it.
  virtual std::vector<std::byte> get(std::string_view key) = 0;
  /// The values under `keys`, waiting for all of them; keys[i] is set by rank owners[i] of
  /// this store (-1: any rank). A store that tracks its ranks ends the wait as soon as an
  /// owner has left it with its key unset, with errc::peer_failed naming the owner, where
  /// get() would wait to the deadline. This default gets each key in turn.
  virtual std::vector<std::vector<std::byte>> get_all(std::span<const std::string> keys,
                                                      std::span<const int> /*owners*/) {
    std::vector<std::vector<std::byte>> values;
    for (const auto& k : keys) values.push_back(get(k));
    return values;
  }
  /// One slice of a get_all, for a store that several threads take turns on: waits at most
  /// `slice` for the keys and returns them, or std::nullopt while some are missing, leaving
  /// the store usable so that another thread may use it before the caller asks again. The
  /// whole wait's deadline is `begun` plus the store's timeout: a slice after it fails as
  /// get_all fails at its deadline, and an owner that left fails it at once as in get_all.
  /// This default, for stores that cannot wait in slices, is one whole get_all.
  virtual std::optional<std::vector<std::vector<std::byte>>> get_all_slice(
      std::span<const std::string> keys, std::span<const int> owners,
      std::chrono::steady_clock::time_point /*begun*/, std::chrono::milliseconds /*slice*/) {
    return get_all(keys, owners);
  }
  /// The ranks that have left the store (said hello, then disconnected), ascending, for
  /// set-up steps that wait outside it. This default, for stores that cannot tell, is none.
  virtual std::vector<int> departed() { return {}; }
  /// Adds `delta` to the counter under `key` (0 when absent) and returns the new value.
  virtual std::int64_t add(std::string_view key, std::int64_t delta) = 0;
  /// Every rank passes its own `mine`; returns every rank's value, indexed by rank.
  virtual std::vector<std::vector<std::byte>> all_gather(std::string_view key,
                                                         std::span<const std::byte> mine) = 0;
  /// Returns once every rank has called barrier with `key`.
  virtual void barrier(std::string_view key) = 0;
  virtual int rank() const noexcept = 0;
  virtual int size() const noexcept = 0;
  virtual const job_secret& secret() const noexcept = 0;
  virtual const std::array<std::byte, 16>& job_id() const noexcept = 0;
};

/// A key-value store every rank of a job shares, hosted by rank 0. Used to exchange
/// transport addresses and to agree before the transports exist.
///
/// Contract:
///  1. connect() returns only when all `size` ranks have connected and said hello, so a
///     returned store means the whole job is present. Rank 0 binds the listening socket
///     before it connects, and other ranks retry refused connections until the deadline,
///     because launchers start ranks in any order.
///  2. Every wait ends by `options.timeout`. A timeout throws errc::timeout naming the store's
///     address and, where ranks are waited for (connect, all_gather, barrier), exactly the
///     ranks that never arrived, also in error::ranks():
///     "chorus: rendezvous at 127.0.0.1:29512 timed out after 2 s: ranks 2, 3 never arrived".
///     A master that cannot be reached is errc::bootstrap with the last errno's text.
///  3. If rank 0 (the server) dies, every call on other ranks fails at once with
///     errc::connection_lost: its sockets close with it, so nobody waits for a timeout.
///     If another rank leaves (exits, fails, or destroys its store) before setting its part
///     of an all_gather, barrier or get_all that others wait in, their waits fail at once
///     with errc::peer_failed naming it:
///     "chorus: all_gather 'addr' at 127.0.0.1:29512: rank 2 has left the store without
///     taking part (exited, failed, or closed its store)".
///  4. The server rejects a second connection claiming a connected rank, and a rank that
///     disagrees on the world size (errc::bootstrap on that client), because either means two
///     jobs or a misconfigured launcher, which would otherwise corrupt the rendezvous.
///  5. Keys are 1..4096 bytes, values at most 64 MiB, and one get_all waits for at most
///     max(size, 65,536) keys; beyond these, errc::invalid_argument is thrown before anything
///     is sent. Keys beginning with "__chorus/" are the store's own.
///  6. all_gather and barrier may be called repeatedly with the same key: each call is a new
///     round, provided every rank makes the same sequence of calls.
///  7. Calls are synchronous and not thread-safe: one thread uses a store at a time. After a
///     timeout or lost connection the store is unusable (connection_lost on every call).
///  8. Destroying rank 0's store lingers (store_options::linger) until every connected rank
///     has disconnected, so rank 0 may leave first.
///  9. Every connection runs the mutual HMAC-SHA256 handshake over options.secret before a
///     frame is read (DESIGN.md "Security model"): a client whose secret differs fails with
///     errc::bootstrap saying so; the server closes connections that do not prove the secret
///     within 5 s, logging one line each, and keeps serving the job.
///
/// **Example**:
///   auto store = chorus::tcp_store::connect(chorus::launch_info_from_env());
///   auto addrs = store.all_gather("tcp/addr", as_bytes(my_address));  // addrs[r]: rank r's
///   store.barrier("ready");
class tcp_store final : public store {
 public:
  /// Connects `info.rank` to the store at info.master_addr:info.master_port; rank 0 starts
  /// the server first, on every address master_addr resolves to (which must be local to it).
  /// With info.size == 1 rank 0 listens on an ephemeral port instead, so single-process runs
  /// never collide on a port.
  [[nodiscard]] static tcp_store connect(const launch_info& info, store_options options = {});
  /// Rank 0's connect() to a server it started earlier (a detail::store_server for
  /// info.size ranks, not yet started), so that its port could be announced before any rank
  /// connects: communicator::shrink() hosts the survivors' store on an ephemeral port.
  [[nodiscard]] static tcp_store connect(const launch_info& info, store_options options,
                                         std::unique_ptr<detail::store_server> server);

  /// Stores `value` under `key`, replacing any earlier value.
  void set(std::string_view key, std::span<const std::byte> value) override;
  /// The value under `key`, waiting for some rank to set it.
  std::vector<std::byte> get(std::string_view key) override;
  /// The values under `keys`, keys[i] set by rank owners[i] (-1: any rank), in one round
  /// trip. errc::invalid_argument for a key named twice or an owner outside the world;
  /// errc::timeout naming the owners (or keys) missing at the deadline; errc::peer_failed
  /// naming the owners that left first (contract 3).
  std::vector<std::vector<std::byte>> get_all(std::span<const std::string> keys,
                                              std::span<const int> owners) override;
  /// get_all's wait cut into slices (store's comment): the server answers after at most
  /// `slice`, and a slice that ends with keys missing before `begun` + options.timeout
  /// returns std::nullopt and leaves the connection usable.
  std::optional<std::vector<std::vector<std::byte>>> get_all_slice(
      std::span<const std::string> keys, std::span<const int> owners,
      std::chrono::steady_clock::time_point begun, std::chrono::milliseconds slice) override;
  /// The ranks that said hello and have disconnected since, ascending: exited, failed, or
  /// destroyed their store. One round trip, no wait.
  std::vector<int> departed() override;
  /// Adds `delta` to the counter under `key` (0 when absent) and returns the new value.
  /// errc::invalid_argument when the key holds something other than a counter.
  std::int64_t add(std::string_view key, std::int64_t delta) override;
  /// Every rank passes its own `mine`; returns every rank's value, indexed by rank.
  std::vector<std::vector<std::byte>> all_gather(std::string_view key,
                                                 std::span<const std::byte> mine) override;
  /// Returns once every rank has called barrier with `key`.
  void barrier(std::string_view key) override;

  int rank() const noexcept override;
  int size() const noexcept override;
  /// The job's secret, for the transports' own handshakes.
  const job_secret& secret() const noexcept override;
  /// The random id rank 0's store minted for this job and vouched for in the handshake;
  /// transports bind their handshakes to it. Not secret.
  const std::array<std::byte, 16>& job_id() const noexcept override;

  tcp_store(tcp_store&&) noexcept;
  tcp_store& operator=(tcp_store&&) noexcept;
  tcp_store(const tcp_store&) = delete;
  tcp_store& operator=(const tcp_store&) = delete;
  ~tcp_store() override;

 private:
  struct state;
  explicit tcp_store(std::unique_ptr<state> s) noexcept;
  std::unique_ptr<state> state_;
};

}  // namespace chorus

#include <chorus/bootstrap/detail/store_impl.hpp>
