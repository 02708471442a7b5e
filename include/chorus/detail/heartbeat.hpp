// SPDX-License-Identifier: Apache-2.0
// The heartbeat: a thread per job that tells peers this rank is alive and notices peers
// that are not (frozen by SIGSTOP, cut off by a dead link), over authenticated UDP datagrams.
#pragma once

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "chorus/bootstrap/detail/handshake.hpp"  // auth_hmac, auth_random, auth_id
#include "chorus/bootstrap/env.hpp"
#include "chorus/bootstrap/store.hpp"
#include "chorus/concepts.hpp"  // clock
#include "chorus/detail/address.hpp"
#include "chorus/detail/failures.hpp"
#include "chorus/detail/log.hpp"

namespace chorus {

/// How ranks watch each other. Every rank of a job must use the same values.
struct heartbeat_options {
  /// CHORUS_HEARTBEAT_PERIOD (seconds, fractions allowed): how often a rank says it is alive.
  std::chrono::milliseconds period{500};
  /// CHORUS_HEARTBEAT_TIMEOUT (seconds): a peer unheard from for this long is failed, and
  /// every operation that involves it fails with errc::peer_failed naming it. At least twice
  /// the period. The TCP transport also fails a connection whose peer's host has not
  /// answered for this long (tcp_connection::check_link).
  std::chrono::milliseconds timeout{10000};
  /// CHORUS_SOCKET_IFNAME: the interface to bind (empty: the one that reaches the master).
  std::string ifname;

  static heartbeat_options from_env() {
    heartbeat_options o;
    o.period = env_seconds("CHORUS_HEARTBEAT_PERIOD", o.period);
    o.timeout = env_seconds("CHORUS_HEARTBEAT_TIMEOUT", o.timeout);
    if (const char* v = std::getenv("CHORUS_SOCKET_IFNAME"); v && *v) o.ifname = v;
    o.check();
    return o;
  }
  void check() const {
    if (period.count() <= 0 || timeout < 2 * period) {
      throw error(errc::invalid_argument,
                  "the heartbeat timeout (CHORUS_HEARTBEAT_TIMEOUT, " + std::to_string(timeout.count()) +
                      " ms) must be at least twice its period (CHORUS_HEARTBEAT_PERIOD, " +
                      std::to_string(period.count()) + " ms)");
    }
  }
};

namespace detail {

/// A heartbeat datagram (little-endian), then `failed` u32 job ranks, then a 16-byte tag:
/// HMAC-SHA256 under the job secret of a label, the job id and every byte before the tag.
/// `seq` grows with every datagram a rank sends, so a replayed one is ignored.
struct beat_header {
  std::uint32_t magic = 0x42484843;  // "CHHB"
  std::uint16_t version = 1;
  std::uint16_t flags = 0;           // beat_leaving: the sender's job ends normally
  std::uint32_t sender = 0;
  std::uint32_t failed = 0;          // how many failed ranks follow
  std::uint64_t seq = 0;
  auth_id comm{};                    // the heartbeat group (rank 0's random id)
};
static_assert(sizeof(beat_header) == 40);
inline constexpr std::uint16_t beat_leaving = 1;
/// The sender takes part in a shrink: a beat_shrink_ext follows the failed ranks.
inline constexpr std::uint16_t beat_shrink = 2;
struct beat_shrink_ext {
  std::uint64_t key = 0;         // which shrink (communicator and how many shrinks before)
  std::uint32_t digest = 0;      // of the failed members the sender proposes (shrink_digest)
  std::uint16_t store_port = 0;  // the survivors' new store for that set, from its host
  std::uint16_t decided = 0;     // 1: the sender has left the agreement with that set
};
inline constexpr std::uint16_t shrink_decided = 1;

/// FNV-1a (64-bit) of some bytes: names a shrink, and the set of ranks a shrink proposes.
inline std::uint64_t fnv1a(std::span<const std::byte> bytes) {
  std::uint64_t h = 0xcbf29ce484222325;
  for (std::byte b : bytes) h = (h ^ static_cast<std::uint8_t>(b)) * 0x100000001b3;
  return h;
}

/// What a shrink datagram says of the (sorted) set of failed ranks it proposes.
inline std::uint32_t shrink_digest(const std::vector<int>& ranks) {
  return static_cast<std::uint32_t>(fnv1a(std::as_bytes(std::span(ranks))));
}
static_assert(sizeof(beat_shrink_ext) == 16);
inline constexpr std::size_t beat_tag_bytes = 16;
inline constexpr std::uint32_t beat_max_failed = 256;
inline constexpr std::string_view beat_label = "chorus-heartbeat/1";

/// The ranks a rank sends heartbeats to and expects them from: those at distance 1, 2, 4, ...
/// either way round the ring, so each rank watches about 2 log2(n) peers and every failure
/// is seen by several. Symmetric: r watches p exactly when p watches r.
inline std::vector<int> beat_peers(int rank, int n) {
  std::vector<int> out;
  for (int d = 1; d < n; d *= 2) {
    for (int p : {(rank + d) % n, (rank - d % n + n) % n}) {
      if (p != rank && std::find(out.begin(), out.end(), p) == out.end()) out.push_back(p);
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

/// One per job, shared by its communicators (split() children watch the same processes).
///
/// Contract:
///  1. start() is a collective over the job's store: every rank binds a UDP socket on the
///     interface that reaches the master and learns every rank's address.
///  2. Every `period` a thread sends each watched peer a datagram carrying the failed ranks
///     this rank knows; a peer unheard from for `timeout` joins the failed set. A gap in the
///     thread's own schedule longer than two periods (this process was stopped) restarts
///     every peer's clock instead: a rank that cannot tell time judges nobody.
///  3. report() adds ranks found failed elsewhere (a lost connection); announce() tells every
///     rank at once, before it returns, the failed ranks known here. A rank calls it when its
///     thread finds a peer silent and before it sends abort frames, so that a peer that reads
///     our abort frame next finds the failed rank already reported (drain() reads what has
///     arrived).
///  4. Datagrams that are short, long, of another group, badly tagged or replayed are
///     dropped unread; one that names this rank failed (its peers gave up on it) fails it too.
///     What a rank counted failed here says of others is not believed.
///  5. agree() is shrink()'s agreement among a communicator's members (job ranks, in its
///     order): each sends every other live member datagrams carrying the shrink's key, the
///     failed ranks it knows (which every receiver adds to its own), the digest of the set of
///     failed members it proposes and, from the host (the first member not failed), the port
///     of the survivors' new store for that set. It returns when every live member's latest
///     datagram proposes this rank's set, and then keeps announcing that set, marked decided,
///     until end_shrink(). A failure found meanwhile grows the set and the round goes on; a
///     member that finds a peer decided on another set (a failure during the shrink) fails
///     at once instead of agreeing.
///     A member that said goodbye (its process ended) counts as failed.
///  6. The destructor says goodbye (peers stop watching a rank that ends normally), stops
///     and joins the thread, and closes its descriptors.
class heartbeat {
 public:
  static std::shared_ptr<heartbeat> start(store& st, const launch_info& info,
                                          const heartbeat_options& o) {
    o.check();
    auto h = std::shared_ptr<heartbeat>(new heartbeat(info.rank, info.size, o, st.secret(), st.job_id()));
    h->bind(info);
    h->meet(st);
    h->thread_ = std::thread([p = h.get()] { p->loop(); });
    return h;
  }

  heartbeat(const heartbeat&) = delete;
  heartbeat& operator=(const heartbeat&) = delete;
  ~heartbeat() {
    stop_.store(true, std::memory_order_release);
    poke();
    if (thread_.joinable()) thread_.join();
    // Goodbye only where the peers' addresses are known: start() destroys a heartbeat whose
    // bind() or meet() threw (no such interface, a peer gone during the round) before it has
    // them, and sending to addresses it did not have crashed the rank (SIGSEGV) instead of
    // letting the error reach the caller.
    if (addrs_.size() == static_cast<std::size_t>(size_)) send_beats(beat_leaving, all_peers());
  }

  std::shared_ptr<const failure_set> failures() const { return failed_; }
  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  /// The host part of this rank's heartbeat address (the interface that reaches the master).
  std::string local_host() const { return local_.host(); }

  /// Records ranks found failed by other means (contract 3), `why` for each; true when one of
  /// them was not known. announce() tells the other ranks.
  bool report(const std::vector<int>& ranks, const std::string& why) {
    bool added = false;
    for (int r : ranks) {
      if (r >= 0 && r < size_) added |= failed_->add(r, why);
    }
    return added;
  }

  /// Tells every rank the failed ranks known here, if any (contract 3). Before abort frames
  /// it tells them again what they may have heard: a rank may know of a failure from a
  /// datagram whose sender has not yet reached every rank (it sends one by one, and peers pass
  /// news on to a few ranks only), and a peer reading our abort must find the failure already
  /// reported, whoever first found it.
  void announce() noexcept {
    try {
      if (failed_->any()) send_beats(0, all_peers());
    } catch (...) {
      // Out of memory for the list of peers: the periodic heartbeats carry the news instead.
    }
  }

  /// Reads the datagrams that have arrived (the thread does it too; this is for a caller
  /// that must see a report that may have raced a frame).
  void drain() {
    std::lock_guard lk(recv_m_);
    receive();
  }

  /// What the live members of a shrink agreed on (contract 5).
  struct shrink_plan {
    std::vector<int> failed;  // job ranks, ascending
    int host = -1;            // job rank of the store's host
    std::string host_addr;    // where it listens
    std::uint16_t port = 0;
  };

  /// Contract 5. `members` are job ranks in the communicator's order; `serve(n)` is called
  /// on the host to start a store for n ranks (again if the set grows) and returns its port.
  /// Throws errc::peer_failed when the peers gave up on this rank, errc::timeout naming the
  /// members that did not agree by `deadline`.
  shrink_plan agree(std::uint64_t key, const std::vector<int>& members,
                    const std::function<std::uint16_t(int ranks)>& serve, clock::time_point deadline) {
    try {
      return agree_or_throw(key, members, serve, deadline);
    } catch (...) {
      end_shrink();
      throw;
    }
  }

  /// Stops announcing the shrink (its communicator is made, or the shrink failed).
  void end_shrink() noexcept {
    shrinking_.store(false, std::memory_order_release);
  }

 private:
  /// The failed members and the live ones (in `members`' order), from the failed set now.
  /// A member that said goodbye (its job ended, or it gave up) confirms nothing: it failed.
  std::pair<std::vector<int>, std::vector<int>> shrink_view(const std::vector<int>& members) {
    std::vector<int> left;
    {
      std::lock_guard lk(recv_m_);
      for (int m : members) {
        if (m != rank_ && gone_[static_cast<std::size_t>(m)]) left.push_back(m);
      }
    }
    for (int m : left) failed_->add(m, "left the job before the shrink");
    const auto all = failed_->snapshot();
    if (const auto me = all.find(rank_); me != all.end()) {
      throw error(errc::peer_failed, "shrink: the other ranks count this one failed (" + me->second + ")",
                  {rank_}, std::nullopt, "shrink");
    }
    std::vector<int> failed, live;
    for (int m : members) (all.count(m) ? failed : live).push_back(m);
    std::sort(failed.begin(), failed.end());
    return {failed, live};
  }

  shrink_plan agree_or_throw(std::uint64_t key, const std::vector<int>& members,
                             const std::function<std::uint16_t(int ranks)>& serve, clock::time_point deadline) {
    std::vector<int> known;  // the failed members this rank proposes
    bool first = true;
    auto next_send = clock::now();
    for (;;) {
      const auto [failed, live] = shrink_view(members);
      const int host = live.front();  // this rank is live, so there is one
      const auto now = clock::now();
      if (first || failed != known) {
        // A new proposal, and from the host a store for it (the old one is dropped).
        const std::uint16_t port = host == rank_ ? serve(static_cast<int>(live.size())) : 0;
        std::lock_guard lk(shrink_m_);
        shrink_ = {key, shrink_digest(failed), port, 0};
        shrink_to_.clear();
        for (int m : live) {
          if (m != rank_) shrink_to_.push_back(m);
        }
        shrinking_.store(true, std::memory_order_release);
        known = failed;
        first = false;
        next_send = now;
      }
      if (now >= next_send) {
        send_beats(0, shrink_peers());
        next_send = now + std::chrono::milliseconds(10);
      }
      const std::uint32_t mine = shrink_digest(known);
      std::vector<int> waiting;
      shrink_plan plan;
      {
        std::lock_guard lk(recv_m_);
        receive();
        for (int m : live) {
          if (m == rank_) continue;
          const auto& h = heard_shrink_[static_cast<std::size_t>(m)];
          if (h.key == key && h.decided && h.digest != mine) {
            throw error(errc::peer_failed,
                        "shrink: job rank " + std::to_string(m) +
                            " agreed on another set of failed ranks with the others (a rank failed "
                            "during the shrink); call shrink() again",
                        {m}, std::nullopt, "shrink");
          }
          if (h.key != key || h.digest != mine || (m == host && h.port == 0)) waiting.push_back(m);
          if (m == host) plan.port = h.port;
        }
      }
      // Decide only on the set known now: what arrived above may have grown it.
      if (waiting.empty() && shrink_view(members).first == known) {
        {
          std::lock_guard lk(shrink_m_);
          shrink_.decided = shrink_decided;
          if (host == rank_) plan.port = shrink_.store_port;
        }
        send_beats(0, shrink_peers());  // those still waiting learn it now, not a period later
        plan.failed = known;
        plan.host = host;
        plan.host_addr = host == rank_ ? local_.host() : addrs_[static_cast<std::size_t>(host)].host();
        return plan;
      }
      if (now >= deadline) {
        std::string who;
        for (int m : waiting) who += (who.empty() ? "" : ", ") + std::to_string(m);
        throw error(errc::timeout, "shrink: no agreement on the failed ranks in time: job ranks " + who +
                                       " never confirmed this rank's set", waiting, std::nullopt, "shrink");
      }
      pollfd p{fd_.get(), POLLIN, 0};
      ::poll(&p, 1, 5);
    }
  }

  heartbeat(int rank, int size, const heartbeat_options& o, const job_secret& secret, const auth_id& job)
      : rank_(rank), size_(size), opts_(o), secret_(secret), job_(job),
        failed_(std::make_shared<failure_set>()), watched_(beat_peers(rank, size)),
        heard_(static_cast<std::size_t>(size)), last_seq_(static_cast<std::size_t>(size), 0),
        gone_(static_cast<std::size_t>(size), false), heard_shrink_(static_cast<std::size_t>(size)) {}

  /// The watched peers and `more`, each once.
  std::vector<int> watched_and(std::vector<int> more) const {
    more.insert(more.end(), watched_.begin(), watched_.end());
    std::sort(more.begin(), more.end());
    more.erase(std::unique(more.begin(), more.end()), more.end());
    return more;
  }

  /// The live members of the shrink this rank announces, besides itself.
  std::vector<int> shrink_peers() const {
    std::lock_guard lk(shrink_m_);
    return shrink_to_;
  }

  void bind(const launch_info& info) {
    const sock_addr master = resolve(info.master_addr.empty() ? "127.0.0.1" : info.master_addr,
                                     info.master_port);
    local_ = choose_local_address(opts_.ifname, master);
    fd_ = unique_fd(::socket(local_.family(), SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (!fd_) throw sys_error("heartbeat socket");
    if (::bind(fd_.get(), local_.get(), local_.length) != 0) throw sys_error("heartbeat bind to " + local_.str());
    local_.length = sizeof local_.storage;
    ::getsockname(fd_.get(), local_.get(), &local_.length);
    wake_ = unique_fd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
    if (!wake_) throw sys_error("heartbeat eventfd");
  }

  void meet(store& st) {
    auto met = publish_addresses(st, "chorus/heartbeat/addr", local_, "heartbeat address");
    addrs_ = std::move(met.addrs);
    comm_ = met.group;
    const auto now = clock::now();
    std::fill(heard_.begin(), heard_.end(), now);
  }

  std::vector<int> all_peers() const {
    std::vector<int> out;
    for (int p = 0; p < size_; ++p) {
      if (p != rank_) out.push_back(p);
    }
    return out;
  }

  void poke() noexcept {
    const std::uint64_t one = 1;
    [[maybe_unused]] auto n = ::write(wake_.get(), &one, sizeof one);
  }

  auth_mac tag(std::span<const std::byte> body) const {
    std::vector<unsigned char> msg(beat_label.size() + job_.size() + body.size());
    std::memcpy(msg.data(), beat_label.data(), beat_label.size());
    std::memcpy(msg.data() + beat_label.size(), job_.data(), job_.size());
    std::memcpy(msg.data() + beat_label.size() + job_.size(), body.data(), body.size());
    return auth_hmac(secret_.key(), msg);
  }

  /// One datagram with the failed ranks known now, to each of `to`. Thread-safe.
  void send_beats(std::uint16_t flags, const std::vector<int>& to) noexcept {
    // One sender at a time, so that a later sequence number never carries older news.
    std::lock_guard send(send_m_);
    try {
      const auto f = failed_->snapshot();
      beat_shrink_ext ext;
      if (shrinking_.load(std::memory_order_acquire)) {
        std::lock_guard lk(shrink_m_);
        ext = shrink_;
        flags |= beat_shrink;
      }
      const std::size_t ext_bytes = (flags & beat_shrink) ? sizeof ext : 0;
      beat_header h;
      h.flags = flags;
      h.sender = static_cast<std::uint32_t>(rank_);
      h.failed = static_cast<std::uint32_t>(std::min<std::size_t>(f.size(), beat_max_failed));
      h.seq = seq_.fetch_add(1, std::memory_order_relaxed) + 1;
      h.comm = comm_;
      std::vector<std::byte> buf(sizeof h + 4 * h.failed + ext_bytes + beat_tag_bytes);
      std::memcpy(buf.data(), &h, sizeof h);
      std::size_t at = sizeof h;
      for (const auto& entry : f) {
        if (at >= sizeof h + 4 * h.failed) break;
        const auto r = static_cast<std::uint32_t>(entry.first);
        std::memcpy(buf.data() + at, &r, 4);
        at += 4;
      }
      if (ext_bytes != 0) {
        std::memcpy(buf.data() + at, &ext, sizeof ext);
        at += sizeof ext;
      }
      const auth_mac t = tag(std::span(buf.data(), at));
      std::memcpy(buf.data() + at, t.data(), beat_tag_bytes);
      for (int p : to) {
        const sock_addr& a = addrs_[static_cast<std::size_t>(p)];
        // Best effort: a full socket buffer or an unreachable peer is what heartbeats are for.
        ::sendto(fd_.get(), buf.data(), buf.size(), MSG_DONTWAIT, a.get(), a.length);
      }
    } catch (...) {
      // Out of memory while building a datagram: the next period tries again.
    }
  }

  /// Reads every datagram waiting; recv_m_ held.
  void receive() {
    std::array<std::byte, sizeof(beat_header) + 4 * beat_max_failed + sizeof(beat_shrink_ext) + beat_tag_bytes> buf;
    for (;;) {
      const ssize_t n = ::recv(fd_.get(), buf.data(), buf.size(), MSG_DONTWAIT);
      if (n < 0) return;  // EAGAIN (or an ICMP error left on the socket): nothing more now
      accept(std::span(buf.data(), static_cast<std::size_t>(n)));
    }
  }

  void accept(std::span<const std::byte> d) {
    beat_header h;
    if (d.size() < sizeof h + beat_tag_bytes) return;
    std::memcpy(&h, d.data(), sizeof h);
    const beat_header want;
    if (h.magic != want.magic || h.version != want.version || h.comm != comm_) return;
    if (h.sender >= static_cast<std::uint32_t>(size_) || h.sender == static_cast<std::uint32_t>(rank_)) return;
    const std::size_t ext_bytes = (h.flags & beat_shrink) ? sizeof(beat_shrink_ext) : 0;
    if (h.failed > beat_max_failed ||
        d.size() != sizeof h + 4 * std::size_t{h.failed} + ext_bytes + beat_tag_bytes) {
      return;
    }
    const std::size_t body = d.size() - beat_tag_bytes;
    const auth_mac t = tag(d.first(body));
    if (CRYPTO_memcmp(t.data(), d.data() + body, beat_tag_bytes) != 0) return;
    const auto s = static_cast<std::size_t>(h.sender);
    if (h.seq <= last_seq_[s]) return;  // replayed or reordered: nothing new
    last_seq_[s] = h.seq;
    heard_[s] = clock::now();
    if (h.flags & beat_leaving) gone_[s] = true;
    // A rank counted failed here may come back (it was frozen): its reports are not believed,
    // or a stale rank that lost its peers would fail the ranks that went on without it.
    if (failed_->contains(static_cast<int>(h.sender))) return;
    for (std::uint32_t i = 0; i < h.failed; ++i) {
      std::uint32_t r = 0;
      std::memcpy(&r, d.data() + sizeof h + 4 * i, 4);
      if (r >= static_cast<std::uint32_t>(size_)) continue;
      const int failed = static_cast<int>(r);
      const std::string why = failed == rank_
                                  ? "rank " + std::to_string(h.sender) + " gave up on this rank"
                                  : "reported by rank " + std::to_string(h.sender);
      if (failed_->add(failed, why)) fresh_ = true;
    }
    if (ext_bytes != 0) {
      beat_shrink_ext ext;
      std::memcpy(&ext, d.data() + sizeof h + 4 * std::size_t{h.failed}, sizeof ext);
      heard_shrink_[s] = {ext.key, ext.digest, ext.store_port, ext.decided == shrink_decided};
    }
  }

  void loop() {
    auto next_beat = clock::now();
    auto last_turn = next_beat;
    while (!stop_.load(std::memory_order_acquire)) {
      auto now = clock::now();
      if (now - last_turn > 2 * opts_.period) {
        // This process was stopped or starved: nobody's silence can be judged.
        std::lock_guard lk(recv_m_);
        std::fill(heard_.begin(), heard_.end(), now);
      }
      last_turn = now;
      if (now >= next_beat) {
        // During a shrink, its members that this rank does not watch need its datagram too.
        send_beats(0, shrinking_.load(std::memory_order_acquire) ? watched_and(shrink_peers()) : watched_);
        next_beat = now + opts_.period;
      }
      check(now);
      pollfd p[2] = {{fd_.get(), POLLIN, 0}, {wake_.get(), POLLIN, 0}};
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(next_beat - clock::now());
      const int ms = static_cast<int>(std::clamp<long long>(left.count(), 0, opts_.period.count()));
      if (::poll(p, 2, ms) > 0) {
        if (p[1].revents & POLLIN) {
          std::uint64_t v = 0;
          [[maybe_unused]] auto r = ::read(wake_.get(), &v, sizeof v);
        }
        std::lock_guard lk(recv_m_);
        receive();
      }
      // Pass on what a datagram taught us; the watched peers pass it on in turn, so a report
      // reaches every rank in about log2(n) hops without n^2 datagrams.
      if (fresh_.exchange(false)) send_beats(0, watched_);
    }
    auth_thread_done();
  }

  void check(clock::time_point now) {
    std::vector<std::pair<int, double>> silent;  // rank, seconds unheard
    {
      std::lock_guard lk(recv_m_);
      for (int p : watched_) {
        const auto s = static_cast<std::size_t>(p);
        if (!gone_[s] && now - heard_[s] > opts_.timeout && !failed_->contains(p)) {
          silent.emplace_back(p, std::chrono::duration<double>(now - heard_[s]).count());
        }
      }
    }
    bool added = false;
    for (const auto& [p, quiet] : silent) {
      char buf[96];
      std::snprintf(buf, sizeof buf, "no heartbeat for %.2f s (timeout %.3g s)", quiet,
                    std::chrono::duration<double>(opts_.timeout).count());
      detail::log(log_level::warn, rank_, "heartbeat: rank " + std::to_string(p) + " " + buf);
      added |= report({p}, buf);
    }
    if (added) announce();
  }

  int rank_;
  int size_;
  heartbeat_options opts_;
  job_secret secret_;
  auth_id job_;
  auth_id comm_{};
  std::shared_ptr<failure_set> failed_;
  std::vector<int> watched_;
  std::vector<sock_addr> addrs_;
  sock_addr local_;
  unique_fd fd_, wake_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<std::uint64_t> seq_{0};
  std::mutex recv_m_;  // guards what receive() writes: heard_, last_seq_, gone_, heard_shrink_
  std::vector<clock::time_point> heard_;
  std::vector<std::uint64_t> last_seq_;
  std::vector<bool> gone_;
  std::atomic<bool> fresh_{false};  // a datagram taught us a failure to pass on
  // The shrink this rank takes part in (contract 5) and what each peer said of its own.
  struct shrink_heard {
    std::uint64_t key = 0;
    std::uint32_t digest = 0;
    std::uint16_t port = 0;
    bool decided = false;
  };
  std::mutex send_m_;            // serialises send_beats (the heartbeat thread, report(), agree())
  mutable std::mutex shrink_m_;  // guards shrink_, shrink_to_
  std::atomic<bool> shrinking_{false};
  beat_shrink_ext shrink_;
  std::vector<int> shrink_to_;
  std::vector<shrink_heard> heard_shrink_;  // guarded by recv_m_
};

}  // namespace detail
}  // namespace chorus
