// SPDX-License-Identifier: Apache-2.0
// The rendezvous store's server: one thread on rank 0 serving every rank's requests over poll().
#pragma once

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chorus/bootstrap/auth.hpp>
#include <chorus/bootstrap/detail/handshake.hpp>
#include <chorus/bootstrap/detail/store_protocol.hpp>
#include <chorus/detail/socket.hpp>
#include <chorus/error.hpp>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

namespace chorus::detail {

/// The key under which the server records that `rank` said hello; the initial rendezvous is a
/// get_many over these keys, so it reports the missing ranks exactly as all_gather does.
inline std::string store_hello_key(int rank) { return "__chorus/hello/" + std::to_string(rank); }

/// Serves the store on every address `host` resolves to.
///
/// Design points:
///  1. One thread, poll(), non-blocking sockets: a peer that stalls mid-frame or never reads
///     its replies cannot stall the others.
///  2. Every header is checked before its body is allocated (store_check_request), and the body
///     grows only as its bytes arrive; a bad frame closes that connection with a logged reason
///     and nothing else.
///  3. One request per connection at a time: while a request waits (get) or its reply is
///     unsent, the server stops reading that connection. Clients are synchronous, so this
///     costs nothing and bounds the server's memory per connection to one frame.
///  4. Waits have deadlines chosen by the client; when one passes the server answers
///     `timeout` listing the keys still missing, so the client can name the missing ranks.
///     A get_many names each key's owner: once an owner that said hello has disconnected,
///     with its key still missing, the wait is answered `left` at once. A rank that exited
///     or failed in the middle of a rendezvous ends its peers' waits in milliseconds, not at
///     the deadline.
///  5. Nothing but the handshake (detail/handshake.hpp) is read from a connection until it
///     has proved knowledge of the job secret; a connection that has not proved it and said
///     hello within auth_timeout (5 s) is closed with a logged reason, so neither garbage
///     nor a silent connection can hold a slot for long.
///  6. At most auth_max_pending strangers (ranks get room on top) are served at once; the
///     rest wait in the kernel's backlog, first come first served, and are accepted as
///     stalled strangers time out. Accepting and closing the excess instead, as the store
///     once did, let a burst of 400 strangers at start-up (tests/security) close ranks' own
///     connections as strangers' and fail the job; now a flood can only delay the ranks,
///     by auth_timeout per auth_max_pending stalled strangers ahead of them.
class store_server {
 public:
  /// Binds and listens on `host`:`port` (port 0: an ephemeral port; see port()). Throws
  /// chorus::error(errc::bootstrap) naming the address when it cannot be bound. Clients must
  /// prove they know `secret`; the server mints a random job id that it vouches for to them.
  store_server(const std::string& host, std::uint16_t port, int world_size,
               std::chrono::milliseconds hello_timeout, job_secret secret)
      : world_size_(world_size),
        hello_timeout_(std::min<std::chrono::milliseconds>(hello_timeout, auth_timeout)),
        secret_(std::move(secret)),
        by_rank_(static_cast<std::size_t>(world_size)),
        left_(static_cast<std::size_t>(world_size), false) {
    auth_random(job_);
    std::string reason;
    auto addresses = store_resolve(host, port, reason);
    address_ = store_host_port(host, port);
    if (addresses.empty()) {
      throw error(errc::bootstrap,
                  "cannot host the rendezvous store at " + address_ + ": " + reason, {0},
                  std::nullopt, "bind");
    }
    // The store listens where ranks were told to find it, never on every address: a
    // wildcard would expose it on interfaces the job never meant to use.
    for (const auto& a : addresses) {
      const bool any4 = a.family == AF_INET &&
                        reinterpret_cast<const sockaddr_in*>(&a.storage)->sin_addr.s_addr ==
                            htonl(INADDR_ANY);
      const bool any6 =
          a.family == AF_INET6 &&
          IN6_IS_ADDR_UNSPECIFIED(&reinterpret_cast<const sockaddr_in6*>(&a.storage)->sin6_addr);
      if (any4 || any6) {
        throw error(errc::invalid_argument,
                    "cannot host the rendezvous store at " + address_ + ": '" + host +
                        "' means every address of this host; set CHORUS_MASTER_ADDR / "
                        "MASTER_ADDR to the address the other ranks reach rank 0 at",
                    {0}, std::nullopt, "bind");
      }
    }
    std::string failures;
    bool not_local = true;
    for (const auto& a : addresses) {
      int err = 0;
      unique_fd fd = listen_on(a, err);
      if (!fd) {
        if (err == EADDRINUSE) {
          throw error(errc::bootstrap,
                      "cannot host the rendezvous store at " + a.text + ": " +
                          store_errno_text(err) +
                          " (another job on this port? choose another CHORUS_MASTER_PORT)",
                      {0}, std::nullopt, "bind");
        }
        if (err != EADDRNOTAVAIL) not_local = false;
        failures += (failures.empty() ? "" : "; ") + a.text + ": " + store_errno_text(err);
        continue;
      }
      if (port == 0) {
        sockaddr_storage bound{};
        socklen_t len = sizeof bound;
        ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&bound), &len);
        port_ =
            ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                              : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
        listeners_.push_back(std::move(fd));
        break;  // each further bind to port 0 would get a different port
      }
      listeners_.push_back(std::move(fd));
    }
    if (port != 0) port_ = port;
    address_ = store_host_port(host, port_);
    if (listeners_.empty()) {
      std::string why = not_local
                            ? "'" + host + "' is not an address of this machine (" + failures +
                                  "); rank 0 hosts the store and must run on the host that "
                                  "CHORUS_MASTER_ADDR / MASTER_ADDR names"
                            : failures;
      throw error(errc::bootstrap, "cannot host the rendezvous store at " + address_ + ": " + why,
                  {0}, std::nullopt, "bind");
    }
    int fds[2];
    if (::pipe2(fds, O_NONBLOCK | O_CLOEXEC) != 0) {
      throw error(errc::system, "pipe2 for the rendezvous store failed: " + store_errno_text(errno),
                  {}, std::nullopt, "pipe2");
    }
    wake_read_.reset(fds[0]);
    wake_write_.reset(fds[1]);
  }

  store_server(const store_server&) = delete;
  store_server& operator=(const store_server&) = delete;
  ~store_server() { shutdown(std::chrono::milliseconds(0)); }

  /// The port actually listened on (the ephemeral one when constructed with port 0).
  std::uint16_t port() const noexcept { return port_; }
  int world_size() const noexcept { return world_size_; }
  const std::string& address() const noexcept { return address_; }
  /// The random id of this job that the server vouches for in every handshake.
  const auth_id& job_id() const noexcept { return job_; }

  void start() {
    thread_ = std::thread([this] { run(); });
  }

  /// Stops serving once every rank that said hello has disconnected, or `linger` has passed,
  /// whichever is first; then joins the thread. Idempotent.
  void shutdown(std::chrono::milliseconds linger) {
    if (!thread_.joinable()) return;
    linger_ms_.store(linger.count(), std::memory_order_relaxed);
    // The release store pairs with the thread's acquire load: it sees linger_ms_ set.
    draining_.store(true, std::memory_order_release);
    char byte = 1;
    while (::write(wake_write_.get(), &byte, 1) < 0 && errno == EINTR) {
    }
    thread_.join();
  }

 private:
  struct pending_wait {
    std::vector<std::string> keys;
    std::vector<std::uint32_t> owners;  // get_many only: who sets each key
    bool many = false;
    store_clock::time_point deadline;
  };

  struct connection {
    unique_fd fd;
    std::string peer;
    std::optional<auth_responder> auth;  // until the peer has proved the secret
    int proved_rank = -1;                // the rank its handshake named
    int rank = -1;                       // once it has said hello
    store_clock::time_point hello_deadline;
    std::array<std::byte, store_header_bytes> head{};
    std::size_t head_have = 0;
    bool have_header = false;
    store_frame_header header;
    std::vector<std::byte> body;
    std::size_t body_have = 0;
    std::vector<std::byte> out;
    std::size_t out_sent = 0;
    bool close_after_flush = false;
    bool dead = false;
    std::optional<pending_wait> wait;

    bool busy() const { return wait.has_value() || out_sent < out.size() || close_after_flush; }
  };

  // A body's buffer starts at this size and doubles as its bytes arrive.
  static constexpr std::size_t body_step = 64 * 1024;

  static unique_fd listen_on(const store_address& a, int& err) {
    unique_fd fd(::socket(a.family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, IPPROTO_TCP));
    if (!fd) {
      err = errno;
      return {};
    }
    int one = 1;
    // SO_REUSEADDR: a job restarted on the same port must not wait out TIME_WAIT.
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    // IPv6 sockets serve IPv6 only; IPv4 gets its own listener when the name resolves to one.
    if (a.family == AF_INET6) ::setsockopt(fd.get(), IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
    if (::bind(fd.get(), a.addr(), a.length) != 0 || ::listen(fd.get(), SOMAXCONN) != 0) {
      err = errno;
      return {};
    }
    return fd;
  }

  void log(const connection& c, const std::string& what) const {
    std::string who = c.rank >= 0 ? "rank " + std::to_string(c.rank) + " (" + c.peer + ")" : c.peer;
    store_log("store " + address_ + ": " + who + ": " + what);
  }

  // Closes a connection for a protocol violation; the reason goes to the log, not the peer.
  void drop(connection& c, const std::string& reason) {
    log(c, "closing connection: " + reason);
    c.dead = true;
  }

  void reply(connection& c, store_op op, store_status status, std::span<const std::byte> value,
             std::int64_t arg = 0) {
    store_frame_header h;
    h.op = static_cast<std::uint8_t>(op);
    h.status = static_cast<std::uint8_t>(status);
    h.value_len = value.size();
    h.arg = arg;
    auto head = store_encode_header(h);
    c.out.insert(c.out.end(), head.begin(), head.end());
    c.out.insert(c.out.end(), value.begin(), value.end());
  }

  void reply_error(connection& c, store_op op, errc code, const std::string& message) {
    auto bytes = std::as_bytes(std::span(message.data(), message.size()));
    reply(c, op, store_status::error, bytes, static_cast<std::int64_t>(code));
  }

  // Answers a wait if every key it needs now exists. Returns whether it did.
  bool try_answer(connection& c) {
    const pending_wait& w = *c.wait;
    for (const auto& k : w.keys) {
      if (!data_.contains(k)) return false;
    }
    auto op = w.many ? store_op::get_many : store_op::get;
    if (!w.many) {
      reply(c, op, store_status::ok, data_.at(w.keys[0]));
    } else {
      std::vector<std::byte> value;
      for (const auto& k : w.keys) {
        const auto& v = data_.at(k);
        std::byte len[8];
        store_put_le(len, v.size(), 8);
        value.insert(value.end(), len, len + 8);
        value.insert(value.end(), v.begin(), v.end());
      }
      reply(c, op, store_status::ok, value);
    }
    c.wait.reset();
    return true;
  }

  // The indices of the wait's keys still missing; with `only_left`, just those whose owner
  // has left the store.
  std::vector<std::uint32_t> missing_keys(const pending_wait& w, bool only_left) const {
    std::vector<std::uint32_t> missing;
    for (std::size_t i = 0; i < w.keys.size(); ++i) {
      if (data_.contains(w.keys[i])) continue;
      if (only_left && (w.owners[i] == store_any_owner || !left_[w.owners[i]])) continue;
      missing.push_back(static_cast<std::uint32_t>(i));
    }
    return missing;
  }

  // Ends a wait without its values: `status` (timeout or left) and the keys it lists.
  void answer_missing(connection& c, store_status status, const std::vector<std::uint32_t>& missing) {
    reply(c, c.wait->many ? store_op::get_many : store_op::get, status,
          c.wait->many ? store_encode_indices(missing) : std::vector<std::byte>{});
    c.wait.reset();
  }

  void answer_timeout(connection& c) {
    answer_missing(c, store_status::timeout,
                   c.wait->many ? missing_keys(*c.wait, false) : std::vector<std::uint32_t>{});
  }

  // Design point 4: answers `left` if a key the wait needs belongs to a rank that has gone.
  void answer_if_left(connection& c) {
    if (!c.wait || !c.wait->many) return;
    auto gone = missing_keys(*c.wait, true);
    if (!gone.empty()) answer_missing(c, store_status::left, gone);
  }

  void wake_waiters() {
    for (auto& c : conns_) {
      if (!c->dead && c->wait) try_answer(*c);
    }
  }

  void set_key(std::string key, std::vector<std::byte> value) {
    data_.insert_or_assign(std::move(key), std::move(value));
    wake_waiters();
  }

  static store_clock::time_point wait_deadline(std::int64_t ms) {
    return store_clock::now() +
           std::chrono::milliseconds(std::clamp<std::int64_t>(ms, 0, max_store_wait_ms));
  }

  // Accepts a handshake addressed to the store. Rank and world size are checked at hello,
  // where a refusal can tell an authenticated peer why.
  static std::optional<std::string> check_handshake(const auth_hello& h) {
    if (h.kind != auth_kind::store) {
      return std::string("a ") + to_string(h.kind) + " connection sent to the store's port";
    }
    if (h.responder != 0) return "a connection for rank " + std::to_string(h.responder);
    return std::nullopt;
  }

  // Reads handshake bytes; the handshake's challenge is queued for the peer. Returns whether
  // the connection may go on to frames.
  bool authenticate(connection& c) {
    if (auto why = c.auth->read_from(c.fd.get(), c.out)) {
      drop(c, c.auth->failed() ? "handshake refused: " + *why : *why);
      return false;
    }
    if (!c.auth->done()) return false;
    c.proved_rank = static_cast<int>(c.auth->hello().initiator);
    c.auth.reset();
    if (store_debug_enabled()) log(c, "proved the job secret as rank " + std::to_string(c.proved_rank));
    return true;
  }

  void handle_hello(connection& c) {
    const std::byte* v = c.body.data();
    auto magic = static_cast<std::uint32_t>(store_get_le(v, 4));
    auto version = static_cast<std::uint32_t>(store_get_le(v + 4, 4));
    auto rank = static_cast<std::int32_t>(static_cast<std::uint32_t>(store_get_le(v + 8, 4)));
    auto size = static_cast<std::int32_t>(static_cast<std::uint32_t>(store_get_le(v + 12, 4)));
    if (magic != store_magic)
      return drop(c, "hello without the chorus magic (not a chorus client?)");
    auto refuse = [&](const std::string& why) {
      log(c, "refused: " + why);
      reply_error(c, store_op::hello, errc::bootstrap, why);
      c.close_after_flush = true;
    };
    if (version != store_version) {
      return refuse("client speaks store protocol " + std::to_string(version) + ", this store " +
                    std::to_string(store_version) + " (mixed chorus versions?)");
    }
    if (size != world_size_) {
      return refuse("rank " + std::to_string(rank) + " says the world size is " +
                    std::to_string(size) + " but the store at " + address_ + " serves " +
                    std::to_string(world_size_) + " ranks");
    }
    if (rank < 0 || rank >= world_size_) {
      return refuse("rank " + std::to_string(rank) + " is outside the world of " +
                    std::to_string(world_size_) + " ranks");
    }
    if (rank != c.proved_rank) {
      return drop(c, "hello as rank " + std::to_string(rank) + " after a handshake as rank " +
                         std::to_string(c.proved_rank));
    }
    auto slot = static_cast<std::size_t>(rank);
    if (by_rank_[slot] != nullptr) {
      return refuse("rank " + std::to_string(rank) + " is already connected (from " +
                    by_rank_[slot]->peer + "); two processes claim the same rank");
    }
    by_rank_[slot] = &c;
    left_[slot] = false;  // a rank may come back after its process restarted
    c.rank = rank;
    if (store_debug_enabled()) log(c, "said hello");
    reply(c, store_op::hello, store_status::ok, {});
    set_key(store_hello_key(rank), {});
  }

  void handle_frame(connection& c) {
    auto op = static_cast<store_op>(c.header.op);
    if (c.rank < 0) return handle_hello(c);
    std::string key(reinterpret_cast<const char*>(c.body.data()), c.header.key_len);
    std::span<const std::byte> value(c.body.data() + c.header.key_len,
                                     c.body.size() - c.header.key_len);
    switch (op) {
      case store_op::set:
        reply(c, op, store_status::ok, {});
        set_key(std::move(key), std::vector<std::byte>(value.begin(), value.end()));
        return;
      case store_op::get:
        c.wait = pending_wait{{std::move(key)}, {}, false, wait_deadline(c.header.arg)};
        if (!try_answer(c) && c.wait->deadline <= store_clock::now()) answer_timeout(c);
        return;
      case store_op::add: {
        std::int64_t current = 0;
        if (auto it = data_.find(key); it != data_.end()) {
          if (it->second.size() != 8) {
            return reply_error(c, op, errc::invalid_argument,
                               "add on key '" + key + "', which holds a " +
                                   std::to_string(it->second.size()) +
                                   "-byte value, not a counter");
          }
          current = static_cast<std::int64_t>(store_get_le(it->second.data(), 8));
        }
        std::int64_t delta = c.header.arg;
        if ((delta > 0 && current > std::numeric_limits<std::int64_t>::max() - delta) ||
            (delta < 0 && current < std::numeric_limits<std::int64_t>::min() - delta)) {
          return reply_error(c, op, errc::invalid_argument, "add on key '" + key + "' overflows");
        }
        std::vector<std::byte> stored(8);
        store_put_le(stored.data(), static_cast<std::uint64_t>(current + delta), 8);
        reply(c, op, store_status::ok, {}, current + delta);
        set_key(std::move(key), std::move(stored));
        return;
      }
      case store_op::get_many: {
        std::string why;
        auto list = store_decode_keys(value, store_max_wait_keys(static_cast<std::size_t>(world_size_)), why);
        if (!list) return drop(c, "malformed get_many key list: " + why);
        for (auto owner : list->owners) {
          if (owner != store_any_owner && owner >= static_cast<std::uint32_t>(world_size_)) {
            return drop(c, "get_many names owner rank " + std::to_string(owner) +
                               ", outside the world of " + std::to_string(world_size_));
          }
        }
        c.wait = pending_wait{std::move(list->keys), std::move(list->owners), true,
                              wait_deadline(c.header.arg)};
        if (try_answer(c)) return;
        answer_if_left(c);
        if (c.wait && c.wait->deadline <= store_clock::now()) answer_timeout(c);
        return;
      }
      case store_op::departed: {
        std::vector<std::uint32_t> gone;
        for (std::size_t r = 0; r < left_.size(); ++r) {
          if (left_[r]) gone.push_back(static_cast<std::uint32_t>(r));
        }
        return reply(c, op, store_status::ok, store_encode_indices(gone));
      }
      case store_op::hello:
        return;  // rejected by store_check_request
    }
  }

  // Reads whatever is available, a frame at a time, until the socket would block or a frame
  // makes the connection busy.
  void read_some(connection& c) {
    if (c.auth && !authenticate(c)) return;
    auto body_bytes = [&] {
      return c.header.key_len + static_cast<std::size_t>(c.header.value_len);
    };
    while (!c.dead && !c.busy()) {
      std::byte* dst = nullptr;
      std::size_t want = 0;
      if (!c.have_header) {
        dst = c.head.data() + c.head_have;
        want = store_header_bytes - c.head_have;
      } else {
        // A header may claim 64 MiB: the body's memory follows the bytes that really arrive
        // (sized from the header alone, 24 bytes made the server allocate and zero 64 MiB).
        if (c.body_have == c.body.size()) {
          c.body.resize(std::min(body_bytes(), std::max(2 * c.body.size(), body_step)));
        }
        dst = c.body.data() + c.body_have;
        want = c.body.size() - c.body_have;
      }
      if (want > 0) {
        ssize_t n = ::recv(c.fd.get(), dst, want, 0);
        if (n == 0) {
          if (c.have_header || c.head_have > 0) log(c, "disconnected in the middle of a frame");
          c.dead = true;
          return;
        }
        if (n < 0) {
          if (errno == EINTR) continue;
          if (errno != EAGAIN && errno != EWOULDBLOCK) c.dead = true;
          return;
        }
        (c.have_header ? c.body_have : c.head_have) += static_cast<std::size_t>(n);
      }
      if (!c.have_header) {
        if (c.head_have < store_header_bytes) continue;
        c.header = store_decode_header(c.head.data());
        if (auto bad = store_check_request(c.header, c.rank >= 0))
          return drop(c, "bad frame: " + *bad);
        c.have_header = true;
        c.body.clear();
        c.body_have = 0;
      }
      if (c.body_have < body_bytes()) continue;
      handle_frame(c);
      c.have_header = false;
      c.head_have = 0;
      c.body = {};
    }
  }

  void flush(connection& c) {
    while (c.out_sent < c.out.size()) {
      ssize_t n =
          ::send(c.fd.get(), c.out.data() + c.out_sent, c.out.size() - c.out_sent, MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) c.dead = true;
        return;
      }
      c.out_sent += static_cast<std::size_t>(n);
    }
    c.out.clear();
    c.out_sent = 0;
    if (c.close_after_flush) c.dead = true;
  }

  // Design point 6: the rest wait in the backlog.
  bool full() const {
    return conns_.size() >= auth_max_pending + static_cast<std::size_t>(world_size_);
  }

  void accept_all(int listener, store_clock::time_point now) {
    while (!full()) {
      sockaddr_storage peer{};
      socklen_t len = sizeof peer;
      int fd = ::accept4(listener, reinterpret_cast<sockaddr*>(&peer), &len,
                         SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
          // Out of descriptors: stop accepting for a moment rather than spin on a readable
          // listener.
          store_log("store " + address_ + ": accept: " + store_errno_text(errno) +
                    "; pausing accepts");
          accept_paused_until_ = now + std::chrono::milliseconds(100);
        }
        return;
      }
      auto c = std::make_unique<connection>();
      c->fd.reset(fd);
      c->peer = store_numeric_address(reinterpret_cast<sockaddr*>(&peer), len);
      c->hello_deadline = now + hello_timeout_;
      store_set_nodelay(fd);
      c->auth.emplace(secret_, job_, check_handshake);
      conns_.push_back(std::move(c));
    }
  }

  void reap() {
    bool someone_left = false;
    for (auto& c : conns_) {
      if (c->dead && c->rank >= 0) {
        if (store_debug_enabled()) log(*c, "disconnected");
        by_rank_[static_cast<std::size_t>(c->rank)] = nullptr;
        left_[static_cast<std::size_t>(c->rank)] = true;
        someone_left = true;
      }
    }
    std::erase_if(conns_, [](const auto& c) { return c->dead; });
    if (!someone_left) return;
    for (auto& c : conns_) answer_if_left(*c);
  }

  bool any_rank_connected() const {
    return std::any_of(by_rank_.begin(), by_rank_.end(),
                       [](const connection* c) { return c != nullptr; });
  }

  void run() noexcept {
    try {
      serve();
    } catch (const std::exception& e) {
      // Closing every socket (below, by destruction) turns this into connection_lost on the
      // clients instead of a hang.
      store_log("store " + address_ + ": server stopped: " + e.what());
    }
    // Strangers still in their handshake get their line too, so that every connection the
    // store refused says why.
    for (auto& c : conns_) {
      if (!c->dead && c->rank < 0 && !c->close_after_flush) {
        log(*c, "closing connection: the store is shutting down");
      }
    }
    conns_.clear();
    listeners_.clear();
    auth_thread_done();
  }

  void serve() {
    std::optional<store_clock::time_point> linger_deadline;
    std::vector<pollfd> fds;
    for (;;) {
      auto now = store_clock::now();
      // Lingering: rank 0 has left, but ranks still connected may be doing a final get.
      if (linger_deadline && (!any_rank_connected() || now >= *linger_deadline)) return;

      // Deadlines first, so that what poll reports below acts on a settled state.
      for (auto& c : conns_) {
        if (c->dead) continue;
        if (c->wait && c->wait->deadline <= now) answer_timeout(*c);
        if (c->rank < 0 && !c->close_after_flush && c->hello_deadline <= now) {
          drop(*c, c->auth ? "no complete handshake within " +
                                 std::to_string(hello_timeout_.count()) + " ms of connecting"
                           : "no hello within " + std::to_string(hello_timeout_.count()) +
                                 " ms of connecting");
        }
        if (!c->dead && c->out_sent < c->out.size()) flush(*c);
      }
      reap();

      auto next = now + std::chrono::seconds(1);
      if (linger_deadline) next = std::min(next, *linger_deadline);
      fds.clear();
      fds.push_back({wake_read_.get(), POLLIN, 0});
      bool accepting = accept_paused_until_ <= now && !full();
      // Full: the next hello deadline below frees a slot, and wakes the loop.
      if (accept_paused_until_ > now) next = std::min(next, accept_paused_until_);
      for (const auto& l : listeners_)
        fds.push_back({l.get(), static_cast<short>(accepting ? POLLIN : 0), 0});
      for (const auto& c : conns_) {
        short events = POLLRDHUP;
        if (!c->busy()) events |= POLLIN;
        if (c->out_sent < c->out.size()) events |= POLLOUT;
        fds.push_back({c->fd.get(), events, 0});
        if (c->wait) next = std::min(next, c->wait->deadline);
        if (c->rank < 0) next = std::min(next, c->hello_deadline);
      }
      int n = ::poll(fds.data(), fds.size(), poll_ms(next));
      if (n < 0) {
        if (errno == EINTR) continue;
        throw error(errc::system, "poll: " + store_errno_text(errno), {}, std::nullopt, "poll");
      }
      now = store_clock::now();
      if (fds[0].revents != 0) {
        char sink[64];
        while (::read(wake_read_.get(), sink, sizeof sink) > 0) {
        }
        if (draining_.load(std::memory_order_acquire) && !linger_deadline) {
          linger_deadline =
              now + std::chrono::milliseconds(linger_ms_.load(std::memory_order_relaxed));
        }
      }
      std::size_t listener_count = listeners_.size();
      // Connections accepted now are appended after the ones polled, so indices stay valid.
      std::size_t polled = conns_.size();
      for (std::size_t i = 0; i < polled; ++i) {
        connection& c = *conns_[i];
        short re = fds[1 + listener_count + i].revents;
        if (re == 0 || c.dead) continue;
        if (re & POLLOUT) flush(c);
        if (!c.dead && (re & POLLIN) && !c.busy()) read_some(c);
        if (!c.dead && c.out_sent < c.out.size()) flush(c);
        // A peer gone while we were not reading (busy): nobody will read our reply.
        if (!c.dead && (re & (POLLERR | POLLHUP | POLLNVAL))) c.dead = true;
        if (!c.dead && (re & POLLRDHUP) && c.busy()) c.dead = true;
      }
      for (std::size_t i = 0; i < listener_count; ++i) {
        if (fds[1 + i].revents & POLLIN) accept_all(listeners_[i].get(), now);
      }
      // Replies made for other connections (a set waking their gets) are flushed here.
      for (auto& c : conns_) {
        if (!c->dead && c->out_sent < c->out.size()) flush(*c);
      }
      reap();
    }
  }

  int world_size_;
  std::chrono::milliseconds hello_timeout_;  // connect to hello, handshake included
  job_secret secret_;
  auth_id job_{};
  std::uint16_t port_ = 0;
  std::string address_;
  std::vector<unique_fd> listeners_;
  unique_fd wake_read_;
  unique_fd wake_write_;
  std::atomic<bool> draining_{false};
  std::atomic<std::int64_t> linger_ms_{0};
  std::thread thread_;

  // Owned by the server thread alone once start() has run.
  std::vector<std::unique_ptr<connection>> conns_;
  std::vector<connection*> by_rank_;  // rank -> its connection, or null
  std::vector<bool> left_;            // rank -> said hello, then disconnected
  std::unordered_map<std::string, std::vector<std::byte>> data_;
  store_clock::time_point accept_paused_until_{};
};

}  // namespace chorus::detail
