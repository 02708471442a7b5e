// SPDX-License-Identifier: Apache-2.0
// Definitions behind chorus/bootstrap/store.hpp: the client side of the rendezvous store.
#pragma once

#include <sys/uio.h>

#include <algorithm>
#include <array>
#include <chorus/bootstrap/detail/handshake.hpp>
#include <chorus/bootstrap/detail/store_protocol.hpp>
#include <chorus/detail/socket.hpp>
#include <chorus/bootstrap/detail/store_server.hpp>
#include <chorus/bootstrap/store.hpp>
#include <chorus/error.hpp>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <numeric>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

namespace chorus {
namespace detail {

/// "2 s", "1.5 s", "0.25 s": a duration as people read it in an error message.
inline std::string store_seconds_text(std::chrono::milliseconds d) {
  auto ms = d.count();
  std::string text = std::to_string(ms / 1000);
  if (auto frac = ms % 1000; frac != 0) {
    std::string digits = std::to_string(1000 + frac).substr(1);  // zero-padded to 3
    while (digits.back() == '0') digits.pop_back();
    text += "." + digits;
  }
  return text + " s";
}

/// "rank 2" or "ranks 2, 3".
inline std::string store_ranks_text(const std::vector<int>& ranks) {
  std::string text = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    text += (i == 0 ? "" : ", ") + std::to_string(ranks[i]);
  }
  return text;
}

/// A key as quoted in a message, shortened so that a 4 KiB key does not swamp it.
inline std::string store_key_text(std::string_view key) {
  constexpr std::size_t shown = 80;
  // Built with append: g++ 12 at -O3 warns falsely (-Wrestrict, GCC bug 105329) on "'" + s.
  std::string text(1, '\'');
  text.append(key.substr(0, shown));
  text.append(key.size() > shown ? "...'" : "'");
  return text;
}

inline void store_check_key(std::string_view key, std::string_view call) {
  if (key.empty()) {
    throw error(errc::invalid_argument, "store " + std::string(call) + ": the key is empty", {},
                std::nullopt, std::string(call));
  }
  if (key.size() > max_store_key) {
    throw error(errc::invalid_argument,
                "store " + std::string(call) + ": key " + store_key_text(key) + " is " +
                    std::to_string(key.size()) + " bytes, over the 4096-byte limit",
                {}, std::nullopt, std::string(call));
  }
}

inline void store_check_value(std::string_view key, std::size_t size, std::string_view call) {
  if (size > max_store_value) {
    throw error(errc::invalid_argument,
                "store " + std::string(call) + ": the value for key " + store_key_text(key) +
                    " is " + std::to_string(size) + " bytes, over the 64 MiB limit",
                {}, std::nullopt, std::string(call));
  }
}

inline std::int64_t store_ms_until(store_clock::time_point deadline) {
  auto left = deadline - store_clock::now();
  if (left <= store_clock::duration::zero()) return 0;
  return std::chrono::ceil<std::chrono::milliseconds>(left).count();
}

struct store_reply {
  store_frame_header header;
  std::vector<std::byte> value;
};

// How long a client waits for a reply beyond the wait it asked the server for. The server
// answers a wait's end itself (so the client learns the missing keys); this margin only
// catches a server that has frozen.
inline constexpr std::chrono::seconds store_reply_margin{2};

}  // namespace detail

struct tcp_store::state {
  launch_info info;
  store_options options;
  std::string address;  // "host:port" as every message names it
  detail::unique_fd fd;
  std::unique_ptr<detail::store_server> server;           // rank 0 only
  std::unordered_map<std::string, std::uint64_t> rounds;  // all_gather/barrier calls per key
  detail::auth_id job{};                                  // vouched for by the server
  bool broken = false;

  explicit state(store_options o) : options(std::move(o)) {}

  // The client closes first, so the server's linger counts only the other ranks.
  ~state() {
    fd.reset();
    if (server) server->shutdown(options.linger);
  }

  [[noreturn]] void fail(errc code, std::string message, std::string_view call,
                         std::vector<int> ranks = {}) {
    throw error(code, std::move(message), std::move(ranks), std::nullopt, std::string(call));
  }

  void check_io(detail::io_result r, std::string_view what) {
    using detail::io_status;
    if (r.status == io_status::ok) return;
    broken = true;
    fd.reset();
    std::string errno_part = r.error != 0 ? ": " + detail::store_errno_text(r.error) : "";
    switch (r.status) {
      case io_status::closed:
        fail(errc::connection_lost,
             "lost the connection to the rendezvous store at " + address + " during " +
                 std::string(what) + errno_part +
                 " (rank 0, which hosts the store, exited or failed)",
             what, {0});
      case io_status::timed_out:
        fail(errc::timeout,
             "the rendezvous store at " + address + " did not answer " + std::string(what) +
                 " in time; the store is unusable now",
             what, {0});
      default:
        fail(errc::system,
             "talking to the rendezvous store at " + address + " during " + std::string(what) +
                 " failed" + errno_part,
             what);
    }
  }

  [[noreturn]] void protocol_failure(std::string_view what, const std::string& why) {
    broken = true;
    fd.reset();
    fail(errc::protocol,
         "the rendezvous store at " + address + " sent a bad reply to " + std::string(what) + ": " +
             why,
         what, {0});
  }

  // One request/reply round trip. `reply_deadline` bounds the wait for the reply;
  // `max_reply` bounds the reply's value length before it is allocated.
  detail::store_reply call(detail::store_op op, std::string_view key,
                           std::span<const std::byte> value, std::int64_t arg,
                           detail::store_clock::time_point reply_deadline, std::size_t max_reply,
                           std::string_view what) {
    using namespace detail;
    if (broken) {
      fail(errc::connection_lost,
           "the connection to the rendezvous store at " + address +
               " failed earlier; this store can no longer be used",
           what, {0});
    }
    store_frame_header h;
    h.op = static_cast<std::uint8_t>(op);
    h.key_len = static_cast<std::uint32_t>(key.size());
    h.value_len = value.size();
    h.arg = arg;
    auto head = store_encode_header(h);
    // iovec wants non-const pointers; sendmsg only reads through them.
    std::vector<iovec> parts{
        {head.data(), head.size()},
        {const_cast<char*>(key.data()), key.size()},
        {const_cast<std::byte*>(value.data()), value.size()},
    };
    check_io(send_all(fd.get(), std::move(parts), store_clock::now() + options.timeout),
             what);

    std::array<std::byte, store_header_bytes> reply_head{};
    check_io(recv_exact(fd.get(), reply_head.data(), reply_head.size(), reply_deadline),
             what);
    store_reply r;
    r.header = store_decode_header(reply_head.data());
    if (r.header.op != h.op || r.header.status > static_cast<std::uint8_t>(store_status::left) ||
        r.header.reserved != 0 || r.header.key_len != 0) {
      protocol_failure(what, "malformed header");
    }
    std::size_t limit = r.header.status == static_cast<std::uint8_t>(store_status::error)
                            ? max_store_error_text
                            : max_reply;
    if (r.header.value_len > limit) {
      protocol_failure(what, "a value of " + std::to_string(r.header.value_len) +
                                 " bytes, over the " + std::to_string(limit) + "-byte limit");
    }
    // The buffer grows with the bytes that really arrive (64 KiB, then doubling), so a reply
    // header claiming 64 MiB costs the client nothing until the bytes come.
    const auto length = static_cast<std::size_t>(r.header.value_len);
    while (r.value.size() < length) {
      const std::size_t have = r.value.size();
      r.value.resize(std::min(length, std::max(2 * have, std::size_t{64} << 10)));
      check_io(recv_exact(fd.get(), r.value.data() + have, r.value.size() - have, reply_deadline),
               what);
    }
    return r;
  }

  void throw_reply_error(const detail::store_reply& r, std::string_view what) {
    auto code =
        static_cast<std::uint64_t>(r.header.arg) <= static_cast<std::uint64_t>(errc::peer_failed)
            ? static_cast<errc>(r.header.arg)
            : errc::remote_error;
    std::string text(reinterpret_cast<const char*>(r.value.data()), r.value.size());
    fail(code, "the rendezvous store at " + address + " refused " + std::string(what) + ": " + text,
         what);
  }

  // Waits for every key, keys[i] set by rank owners[i] (all of them store_any_owner when
  // `owners` is empty); returns their values. When the wait ended without them, `missing`
  // holds the indices of the keys still missing and `left` says whether the server ended it
  // because their owners left the store (else the deadline passed).
  std::vector<std::vector<std::byte>> get_many(const std::vector<std::string>& keys,
                                               std::span<const std::uint32_t> owners,
                                               detail::store_clock::time_point deadline,
                                               std::string_view what,
                                               std::vector<std::size_t>& missing, bool& left) {
    using namespace detail;
    if (const std::size_t most = store_max_wait_keys(static_cast<std::size_t>(info.size)); keys.size() > most) {
      fail(errc::invalid_argument,
           "store " + std::string(what) + ": " + std::to_string(keys.size()) + " keys, at most " +
               std::to_string(most) + " in one wait",
           what);
    }
    auto list = store_encode_keys(keys, owners);
    if (list.size() > max_store_value) {
      fail(errc::invalid_argument,
           "store " + std::string(what) + ": the list of keys is over 64 MiB", what);
    }
    std::size_t max_reply = keys.size() * (8 + max_store_value);
    auto r = call(store_op::get_many, {}, list, store_ms_until(deadline),
                  deadline + store_reply_margin, max_reply, what);
    std::vector<std::vector<std::byte>> values;
    auto status = static_cast<store_status>(r.header.status);
    if (status == store_status::error) throw_reply_error(r, what);
    left = status == store_status::left;
    if (status == store_status::timeout || left) {
      if (auto bad = store_decode_missing(r.value, keys.size(), missing)) {
        protocol_failure(what, *bad);
      }
      if (left && (owners.empty() || std::any_of(missing.begin(), missing.end(), [&](std::size_t i) {
                     return owners[i] == store_any_owner;
                   }))) {
        protocol_failure(what, "a key any rank may set is reported as left");
      }
      return values;
    }
    if (auto bad = store_decode_values(r.value, keys.size(), values)) protocol_failure(what, *bad);
    return values;
  }

  // get_many for keys that each name their owner, failing with the ranks to blame: a wait
  // that ran out is errc::timeout naming the owners that never set their keys, one that an
  // owner left is errc::peer_failed naming the owners that left.
  std::vector<std::vector<std::byte>> wait_for(const std::vector<std::string>& keys,
                                               std::span<const std::uint32_t> owners,
                                               detail::store_clock::time_point deadline,
                                               std::string_view call_name,
                                               const std::string& what) {
    using namespace detail;
    std::vector<std::size_t> missing;
    bool left = false;
    auto values = get_many(keys, owners, deadline, what, missing, left);
    if (missing.empty()) return values;
    blame(keys, owners, missing, left, call_name, what);
  }

  // Fails a wait that ended with keys[missing] unset: errc::peer_failed naming their owners
  // when they `left`, else errc::timeout naming the owners (or keys) that never came.
  [[noreturn]] void blame(const std::vector<std::string>& keys,
                          std::span<const std::uint32_t> owners,
                          const std::vector<std::size_t>& missing, bool left,
                          std::string_view call_name, const std::string& what) {
    using namespace detail;
    std::vector<int> ranks;
    std::string unowned;
    for (std::size_t i : missing) {
      if (owners[i] != store_any_owner) {
        ranks.push_back(static_cast<int>(owners[i]));  // < world size, checked by the server
      } else {
        unowned += (unowned.empty() ? "" : ", ") + store_key_text(keys[i]);
      }
    }
    std::sort(ranks.begin(), ranks.end());
    ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
    if (left) {
      fail(errc::peer_failed,
           what + " at " + address + ": " + store_ranks_text(ranks) +
               (ranks.size() == 1 ? " has" : " have") +
               " left the store without taking part (exited, failed, or closed " +
               (ranks.size() == 1 ? "its" : "their") + " store)",
           call_name, ranks);
    }
    std::string absent = ranks.empty() ? "" : store_ranks_text(ranks) + " never arrived";
    if (!unowned.empty()) absent += (absent.empty() ? "" : "; ") + ("no rank set " + unowned);
    fail(errc::timeout,
         what + " at " + address + " timed out after " + store_seconds_text(options.timeout) +
             ": " + absent,
         call_name, ranks);
  }

  // all_gather and barrier: every rank sets its key of this round, then waits for all.
  std::vector<std::vector<std::byte>> gather(std::string_view kind, std::string_view key,
                                             std::span<const std::byte> mine) {
    using namespace detail;
    std::string what = std::string(kind) + " " + store_key_text(key);
    store_check_key(key, kind);
    store_check_value(key, mine.size(), kind);
    auto deadline = store_clock::now() + options.timeout;
    std::uint64_t round = rounds[std::string(kind) + "/" + std::string(key)]++;
    // The user's key goes last: round and rank are digits, so no two calls share a key even
    // when user keys contain '/'.
    std::string prefix = "__chorus/" + std::string(kind) + "/" + std::to_string(round) + "/";
    std::vector<std::string> keys;
    keys.reserve(static_cast<std::size_t>(info.size));
    for (int r = 0; r < info.size; ++r) {
      keys.push_back(prefix + std::to_string(r) + "/" + std::string(key));
    }
    if (keys.back().size() > max_store_key) {
      fail(errc::invalid_argument,
           "store " + std::string(kind) + ": key " + store_key_text(key) +
               " is too long once the store's round and rank prefix is added (limit 4096 bytes)",
           kind);
    }
    auto& my_key = keys[static_cast<std::size_t>(info.rank)];
    auto r = call(store_op::set, my_key, mine, 0, store_clock::now() + options.timeout, 0, what);
    if (r.header.status != 0) throw_reply_error(r, what);
    std::vector<std::uint32_t> owners(keys.size());
    std::iota(owners.begin(), owners.end(), std::uint32_t{0});
    return wait_for(keys, owners, deadline, kind, what);
  }

  detail::unique_fd connect_with_retry(detail::store_clock::time_point deadline) {
    using namespace detail;
    std::string reason = "no attempt finished";
    auto backoff = std::chrono::milliseconds(10);
    for (;;) {
      auto addresses = store_resolve(info.master_addr, info.master_port, reason);
      for (const auto& a : addresses) {
        int err = 0;
        // A bounded attempt, so that one black-holed address does not eat the whole deadline.
        auto attempt_deadline = std::min(deadline, store_clock::now() + std::chrono::seconds(5));
        unique_fd socket = store_connect_tcp(a, attempt_deadline, err);
        if (socket) return socket;
        reason = a.text + ": " + store_errno_text(err);
      }
      // Refused, unreachable or not resolvable yet: rank 0 may simply not have started.
      auto now = store_clock::now();
      if (now >= deadline) break;
      std::this_thread::sleep_for(std::min<store_clock::duration>(backoff, deadline - now));
      backoff = std::min(backoff * 2, std::chrono::milliseconds(250));
    }
    fail(errc::bootstrap,
         "rank " + std::to_string(info.rank) + " of " + std::to_string(info.size) +
             " could not reach the rendezvous store at " + address + " within " +
             store_seconds_text(options.timeout) + ": " + reason,
         "connect", {0});
  }
};

inline tcp_store tcp_store::connect(const launch_info& info, store_options options) {
  return connect(info, std::move(options), nullptr);
}

inline tcp_store tcp_store::connect(const launch_info& info, store_options options,
                                    std::unique_ptr<detail::store_server> server) {
  using namespace detail;
  if (server && (info.rank != 0 || server->world_size() != info.size)) {
    throw error(errc::invalid_argument,
                "tcp_store::connect: a server passed in must serve info.size ranks, and only rank 0 hosts it", {},
                std::nullopt, "connect");
  }
  if (info.size < 1 || info.rank < 0 || info.rank >= info.size) {
    throw error(errc::invalid_argument,
                "tcp_store::connect: rank " + std::to_string(info.rank) + " is not in [0, " +
                    std::to_string(info.size) + ")",
                {}, std::nullopt, "connect");
  }
  if (options.timeout <= std::chrono::milliseconds::zero() ||
      options.linger < std::chrono::milliseconds::zero()) {
    throw error(errc::invalid_argument,
                "tcp_store::connect: store_options.timeout must be positive and linger "
                "non-negative",
                {}, std::nullopt, "connect");
  }
  if (!options.secret) options.secret = job_secret::from_env();
  auto deadline = store_clock::now() + options.timeout;
  auto s = std::make_unique<state>(std::move(options));
  s->info = info;
  s->address = store_host_port(info.master_addr, info.master_port);
  if (server) {
    s->server = std::move(server);
    s->info.master_port = s->server->port();
    s->address = s->server->address();
    s->server->start();
  } else if (info.rank == 0) {
    s->server = std::make_unique<store_server>(info.master_addr,
                                               info.size == 1 ? std::uint16_t{0} : info.master_port,
                                               info.size, s->options.timeout,
                                               *s->options.secret);
    s->info.master_port = s->server->port();
    s->address = s->server->address();
    s->server->start();
  }
  s->fd = s->connect_with_retry(deadline);

  // Prove the secret, and have the server prove it, before a frame is sent.
  auth_hello proof_of;
  proof_of.kind = auth_kind::store;
  proof_of.initiator = static_cast<std::uint32_t>(info.rank);
  proof_of.responder = 0;
  proof_of.world = static_cast<std::uint32_t>(info.size);
  auth_result proved;
  if (auto why = auth_initiate(s->fd.get(), *s->options.secret, proof_of, deadline, proved)) {
    throw error(errc::bootstrap,
                "rank " + std::to_string(info.rank) + " could not authenticate with the "
                "rendezvous store at " + s->address + ": " + *why,
                {0}, std::nullopt, "connect");
  }
  s->job = proved.job;

  std::array<std::byte, store_hello_bytes> hello{};
  store_put_le(hello.data(), store_magic, 4);
  store_put_le(hello.data() + 4, store_version, 4);
  store_put_le(hello.data() + 8, static_cast<std::uint32_t>(info.rank), 4);
  store_put_le(hello.data() + 12, static_cast<std::uint32_t>(info.size), 4);
  auto r = s->call(store_op::hello, {}, hello, 0, deadline + store_reply_margin, 0, "hello");
  if (r.header.status != 0) {
    std::string text(reinterpret_cast<const char*>(r.value.data()), r.value.size());
    throw error(errc::bootstrap,
                "the rendezvous store at " + s->address + " refused rank " +
                    std::to_string(info.rank) + ": " + text,
                {info.rank}, std::nullopt, "connect");
  }

  // The rendezvous: wait until every rank has said hello.
  std::vector<std::string> keys;
  for (int rank = 0; rank < info.size; ++rank) keys.push_back(store_hello_key(rank));
  // Any rank sets hello keys (the server does), so this wait never ends with `left`.
  std::vector<std::size_t> missing;
  bool left = false;
  s->get_many(keys, {}, deadline, "rendezvous", missing, left);
  if (!missing.empty()) {
    std::vector<int> ranks(missing.begin(), missing.end());  // key i is rank i's hello
    throw error(errc::timeout,
                "rendezvous at " + s->address + " timed out after " +
                    store_seconds_text(s->options.timeout) + ": " + store_ranks_text(ranks) +
                    " never arrived",
                ranks, std::nullopt, "connect");
  }
  return tcp_store(std::move(s));
}

inline void tcp_store::set(std::string_view key, std::span<const std::byte> value) {
  detail::store_check_key(key, "set");
  detail::store_check_value(key, value.size(), "set");
  auto what = "set " + detail::store_key_text(key);
  auto r = state_->call(detail::store_op::set, key, value, 0,
                        detail::store_clock::now() + state_->options.timeout, 0, what);
  if (r.header.status != 0) state_->throw_reply_error(r, what);
}

inline std::vector<std::byte> tcp_store::get(std::string_view key) {
  using namespace detail;
  store_check_key(key, "get");
  auto what = "get " + store_key_text(key);
  auto deadline = store_clock::now() + state_->options.timeout;
  auto r = state_->call(store_op::get, key, {}, store_ms_until(deadline),
                        deadline + store_reply_margin, max_store_value, what);
  auto status = static_cast<store_status>(r.header.status);
  if (status == store_status::timeout) {
    state_->fail(errc::timeout,
                 what + " at " + state_->address + " timed out after " +
                     store_seconds_text(state_->options.timeout) + ": no rank set the key",
                 "get");
  }
  if (status == store_status::error) state_->throw_reply_error(r, what);
  return std::move(r.value);
}

inline std::vector<int> tcp_store::departed() {
  using namespace detail;
  const auto world = static_cast<std::size_t>(size());
  auto r = state_->call(store_op::departed, {}, {}, 0, store_clock::now() + state_->options.timeout,
                        4 + 4 * world, "departed");
  if (r.header.status != 0) state_->throw_reply_error(r, "departed");
  std::vector<std::size_t> ranks;
  if (auto bad = store_decode_departed(r.value, world, ranks)) {
    state_->protocol_failure("departed", *bad);
  }
  return {ranks.begin(), ranks.end()};  // each < world size
}

inline std::int64_t tcp_store::add(std::string_view key, std::int64_t delta) {
  detail::store_check_key(key, "add");
  auto what = "add " + detail::store_key_text(key);
  auto r = state_->call(detail::store_op::add, key, {}, delta,
                        detail::store_clock::now() + state_->options.timeout, 0, what);
  if (r.header.status != 0) state_->throw_reply_error(r, what);
  return r.header.arg;
}

inline std::vector<std::vector<std::byte>> tcp_store::get_all(std::span<const std::string> keys,
                                                              std::span<const int> owners) {
  // One slice as long as the timeout ends at the wait's deadline: it returns the values or
  // throws, never std::nullopt.
  return std::move(*get_all_slice(keys, owners, detail::store_clock::now(), state_->options.timeout));
}

inline std::optional<std::vector<std::vector<std::byte>>> tcp_store::get_all_slice(
    std::span<const std::string> keys, std::span<const int> owners,
    std::chrono::steady_clock::time_point begun, std::chrono::milliseconds slice) {
  using namespace detail;
  if (keys.empty() || keys.size() != owners.size()) {
    state_->fail(errc::invalid_argument,
                 "store get_all: wants one owner per key and at least one key, got " +
                     std::to_string(keys.size()) + " keys and " + std::to_string(owners.size()) +
                     " owners",
                 "get_all");
  }
  std::vector<std::string> list(keys.begin(), keys.end());
  std::vector<std::uint32_t> owner_of;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    store_check_key(keys[i], "get_all");
    if (owners[i] < -1 || owners[i] >= size()) {
      state_->fail(errc::invalid_argument,
                   "store get_all: key " + store_key_text(keys[i]) + " names owner " +
                       std::to_string(owners[i]) + ", not a rank of " + std::to_string(size()) +
                       " (or -1 for any)",
                   "get_all");
    }
    owner_of.push_back(owners[i] < 0 ? store_any_owner : static_cast<std::uint32_t>(owners[i]));
  }
  if (auto twice = store_key_named_twice(std::span<const std::string>(list))) {
    state_->fail(errc::invalid_argument,
                 "store get_all: key " + store_key_text(*twice) + " is named twice", "get_all");
  }
  std::string what = "get_all of " + store_key_text(list.front()) +
                     (list.size() > 1 ? " and " + std::to_string(list.size() - 1) + " more" : "");
  const auto deadline = begun + state_->options.timeout;
  const auto end = std::min(deadline, store_clock::now() + std::max(slice, std::chrono::milliseconds(1)));
  std::vector<std::size_t> missing;
  bool left = false;
  auto values = state_->get_many(list, owner_of, end, what, missing, left);
  if (missing.empty()) return values;
  if (left || end >= deadline) state_->blame(list, owner_of, missing, left, "get_all", what);
  return std::nullopt;
}

inline std::vector<std::vector<std::byte>> tcp_store::all_gather(std::string_view key,
                                                                 std::span<const std::byte> mine) {
  return state_->gather("all_gather", key, mine);
}

inline void tcp_store::barrier(std::string_view key) { state_->gather("barrier", key, {}); }

inline int tcp_store::rank() const noexcept { return state_->info.rank; }
inline int tcp_store::size() const noexcept { return state_->info.size; }
inline const job_secret& tcp_store::secret() const noexcept { return *state_->options.secret; }
inline const std::array<std::byte, 16>& tcp_store::job_id() const noexcept {
  return state_->job;
}

inline tcp_store::tcp_store(std::unique_ptr<state> s) noexcept : state_(std::move(s)) {}
inline tcp_store::tcp_store(tcp_store&&) noexcept = default;
inline tcp_store& tcp_store::operator=(tcp_store&&) noexcept = default;
inline tcp_store::~tcp_store() = default;

}  // namespace chorus
