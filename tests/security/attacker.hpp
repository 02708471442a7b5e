// SPDX-License-Identifier: Apache-2.0
// A live attacker for tests: finds a running job's real listening ports and attacks each with
// malformed, replayed, stalled and flooding connections, timing how each one is closed.
//
//   chorus::test::attacker a({.world = 8});   // before the job forks: opens the sniffer
//   run_ranks(8, body, {.started = [&](auto& pids, int port) { a.start(pids, port); }});
//   a.finish();                               // stop, wait for the last closes
//   for (const auto& r : a.records()) ...     // one per connection: kind, target, times
//
// Design points:
//  1. Ports are found, never guessed: every millisecond during set-up (every 50 ms after) a
//     sock_diag dump (or /proc/net/tcp) lists the machine's listening TCP sockets, and a
//     socket is a target only when one of the job's processes holds it (/proc/<pid>/fd), so
//     nothing else on the machine is touched. The store's listener lives for the whole job;
//     the ranks' data listeners exist only during set-up, so each is attacked the moment it
//     appears, from a thread at real-time priority where that is allowed (see run()).
//  2. One thread, epoll, non-blocking sockets: a connection's close is seen when it happens,
//     and thousands of open connections cost nothing while they wait.
//  3. Replays use real handshakes: an AF_PACKET socket on `lo` (root or CAP_NET_RAW only),
//     filtered in the kernel to small TCP segments, reassembles the first 120 bytes each
//     rank sends on a connection (hello + proof) and replays them to the same port. Without
//     the capability no replay is made, and capture_note() says why.
//  4. The attacker never closes first: it waits for the server to close (EOF or RST), so a
//     connection's record says exactly how long the server took.
//  5. A server owes a connection its 5 s only from accept; beyond its cap a connection first
//     waits in the kernel's backlog. Each scan also reads every listener's accept-queue
//     length q: the queue is first in, first out, so all but the newest q of this attacker's
//     connections to it have been accepted. A record's queued_until, the last scan at which
//     it may still have been waiting, bounds its accept from below; the job's own
//     connections in the queue can only make that bound later (a shorter measured close),
//     never earlier.
//  6. A handshake can complete on the attacker's side only: when the server drops its last
//     ACK (a listen drop) and its listener then closes, the kernel forgets the half-made
//     connection without a reset, and a connection that sends nothing never learns. So a
//     connection still open 1 s after its listener went is looked up on the server's side
//     (sock_diag, the exact address pair); where the kernel holds no socket there, not even
//     a half-made one, it is recorded as orphaned and closed. A socket a rank accepted and
//     kept is found by that lookup and stays open, to be reported.
#pragma once

#include <arpa/inet.h>
#include <dirent.h>
#include <linux/filter.h>
#include <linux/if_ether.h>
#include <linux/if_packet.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <net/if.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <bitset>
#include <cerrno>
#include <chorus/bootstrap/detail/handshake.hpp>
#include <chorus/bootstrap/detail/store_protocol.hpp>
#include <chorus/detail/frame.hpp>
#include <chorus/detail/socket.hpp>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

namespace chorus::test {

using attack_clock = std::chrono::steady_clock;

enum class attack_kind : std::uint8_t {
  random_bytes,   ///< 1 to 4096 random bytes
  truncated,      ///< the first 40 bytes of a well-formed hello, then nothing
  wrong_magic,    ///< a hello with the store protocol's magic instead of the handshake's
  wrong_version,  ///< a hello of handshake version 2
  huge_length,    ///< a store frame header claiming 1 TiB (data port: a frame of 4 GiB)
  bad_proof,      ///< a well-formed hello, then 32 random bytes as the proof
  replay,         ///< a rank's recorded hello and proof, replayed to the same port
  slow_loris,     ///< a well-formed hello, one byte per second
  burst,          ///< many connections at once that send nothing
};
inline constexpr std::array all_attack_kinds = {
    attack_kind::random_bytes,  attack_kind::truncated,   attack_kind::wrong_magic,
    attack_kind::wrong_version, attack_kind::huge_length, attack_kind::bad_proof,
    attack_kind::replay,        attack_kind::slow_loris,  attack_kind::burst};

inline const char* to_string(attack_kind k) {
  switch (k) {
    case attack_kind::random_bytes:
      return "random bytes";
    case attack_kind::truncated:
      return "truncated hello";
    case attack_kind::wrong_magic:
      return "wrong magic";
    case attack_kind::wrong_version:
      return "wrong version";
    case attack_kind::huge_length:
      return "huge length";
    case attack_kind::bad_proof:
      return "bad proof";
    case attack_kind::replay:
      return "replayed handshake";
    case attack_kind::slow_loris:
      return "slow loris";
    case attack_kind::burst:
      return "burst";
  }
  return "?";
}

/// One listening socket of the job, as the scans saw it.
struct attack_target {
  int rank = 0;        ///< the process that holds it
  bool store = false;  ///< the rendezvous store (rank 0, the master port); else a data listener
  sockaddr_in addr{};  ///< where it listens
  unsigned long inode = 0;
  attack_clock::time_point first_seen{};
  attack_clock::time_point last_seen{};          ///< start of the last scan that saw it listening
  std::optional<attack_clock::time_point> gone;  ///< end of the first scan that did not

  int port() const { return ntohs(addr.sin_port); }
  std::string name() const {
    return (store ? "store" : "rank " + std::to_string(rank) + " data") + " :" +
           std::to_string(port());
  }
};

/// What happened to one attack connection.
struct attack_record {
  enum class ending {
    open,       ///< still open when the attacker gave up waiting
    eof,        ///< the server closed it (FIN)
    reset,      ///< the server reset it (RST): closed with unread bytes, or its listener closed
    refused,    ///< the connect itself was refused: nothing was listening any more
    orphaned,   ///< open on our side only: the server held no socket for it (design point 6)
    no_socket,  ///< the attacker could not make a socket (descriptors)
  };
  attack_kind kind = attack_kind::random_bytes;
  std::size_t target = 0;  ///< index into attacker::targets()
  int local_port = 0;
  attack_clock::time_point start{};
  std::optional<attack_clock::time_point> connected;
  /// Start of the last scan at which it may still have waited in the listener's backlog,
  /// not yet accepted (design point 5); unset when the first scan saw it accepted.
  std::optional<attack_clock::time_point> queued_until;
  std::optional<attack_clock::time_point> closed;
  ending how = ending::open;
  std::size_t sent = 0;
  std::size_t received = 0;

  /// Accept to close, in seconds (accepted: no earlier than the bound above); -1 when it
  /// never connected or never closed.
  double close_seconds() const {
    if (!connected || !closed) return -1;
    return std::chrono::duration<double>(*closed -
                                         std::max(*connected, queued_until.value_or(*connected)))
        .count();
  }
  /// Connect to accept, in seconds: how long it waited in the backlog (at most).
  double queued_seconds() const {
    if (!connected || !queued_until) return 0;
    return std::chrono::duration<double>(*queued_until - *connected).count();
  }
};

class attacker {
 public:
  struct options {
    int world = 8;    ///< ranks in the job
    int conns = 4;    ///< CHORUS_TCP_CONNS of the job (picks hello indices)
    int burst = 300;  ///< connections per burst: more than a server's 256 at once
    std::chrono::milliseconds store_wave_every{1000};  ///< one connection of each kind
    std::chrono::milliseconds store_burst_every{5000};
  };

  /// Opens the sniffer now, so that it sees the handshakes of ranks forked right after.
  explicit attacker(options o) : o_(o) {
    // A burst on every listener holds a few thousand descriptors at once.
    rlimit lim{};
    if (::getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < lim.rlim_max) {
      lim.rlim_cur = std::min<rlim_t>(lim.rlim_max, 65536);
      ::setrlimit(RLIMIT_NOFILE, &lim);
    }
    open_sniffer();
  }
  attacker(const attacker&) = delete;
  attacker& operator=(const attacker&) = delete;
  ~attacker() { finish(); }

  /// Starts attacking the job whose ranks are `pids` (rank order) and whose store listens on
  /// `store_port`. Call in the parent, after the fork.
  void start(const std::vector<pid_t>& pids, int store_port) {
    pids_ = pids;
    store_port_ = store_port;
    thread_ = std::thread([this] { run(); });
  }

  /// Stops making connections and waits (up to `wait`) until every open one is closed.
  void finish(std::chrono::seconds wait = std::chrono::seconds(10)) {
    if (!thread_.joinable()) return;
    finish_wait_ = wait;
    stopping_.store(true, std::memory_order_release);
    thread_.join();
  }

  const std::vector<attack_target>& targets() const { return targets_; }
  const std::vector<attack_record>& records() const { return records_; }
  /// Attacks planned but never made, per kind, with why (e.g. no handshake to replay).
  const std::map<std::string, int>& skipped() const { return skipped_; }
  /// Empty when handshakes could be captured; otherwise why not (no replays were made).
  const std::string& capture_note() const { return capture_note_; }
  std::size_t captured_handshakes() const { return captures_.size(); }
  /// Whether the attacker ran at real-time priority; if not, the ranks ran at nice 10 (see
  /// run()).
  bool realtime() const { return realtime_; }
  /// Set when the attacker itself hit an error it could not attack through.
  const std::string& failure() const { return failure_; }

 private:
  using bytes = std::vector<std::byte>;

  struct capture {
    int dport = 0;
    std::array<std::byte, detail::auth_hello_bytes> hello{};
    std::array<std::byte, detail::auth_proof_bytes> proof{};
  };
  // The initiator's side of one sniffed connection: its first 120 bytes, by sequence number.
  struct stream {
    std::uint32_t base = 0;  // sequence number of the hello's first byte
    std::array<std::byte, detail::auth_hello_bytes + detail::auth_proof_bytes> data{};
    std::bitset<detail::auth_hello_bytes + detail::auth_proof_bytes> have;
    bool done = false;
  };
  struct live {
    std::size_t record = 0;
    detail::unique_fd fd;
    bool connecting = true;
    bytes out;              // still to send
    bytes after_challenge;  // sent once the 80-byte challenge has arrived
    bytes drip;             // sent one byte a second
    std::size_t drip_at = 0;
    attack_clock::time_point next_drip{};
    bool watching_write = false;
  };
  struct deferred {
    attack_kind kind;
    std::size_t target;
  };

  // ---- discovery -------------------------------------------------------------------------

  struct listening {
    unsigned long inode;
    sockaddr_in addr;
    std::size_t queue;  // connections waiting to be accepted
  };

  // A sock_diag request about IPv4 TCP sockets; the caller picks states and address. Each
  // has its own sequence number, and replies to others (what a dump broken off early left
  // behind) are skipped.
  struct diag_request {
    nlmsghdr nlh;
    inet_diag_req_v2 req;
  };
  diag_request diag_request_for(int flags) {
    diag_request msg{};
    msg.nlh.nlmsg_len = sizeof msg;
    msg.nlh.nlmsg_type = SOCK_DIAG_BY_FAMILY;
    msg.nlh.nlmsg_flags = static_cast<std::uint16_t>(flags);
    msg.nlh.nlmsg_seq = ++diag_seq_;
    msg.req.sdiag_family = AF_INET;
    msg.req.sdiag_protocol = IPPROTO_TCP;
    return msg;
  }

  // Every listening IPv4 TCP socket of this network namespace: a sock_diag dump, or
  // /proc/net/tcp where netlink is unavailable. Nothing when the dump broke off, so that a
  // listener is never taken for gone on a partial list.
  std::optional<std::vector<listening>> list_listeners() {
    std::vector<listening> out;
    if (diag_) {
      diag_request msg = diag_request_for(NLM_F_REQUEST | NLM_F_DUMP);
      msg.req.idiag_states = 1u << 10;  // TCP_LISTEN
      bool done = false;
      const bool asked = diag_ask(msg, [&](const nlmsghdr& h) {
        done = h.nlmsg_type == NLMSG_DONE;
        if (h.nlmsg_type != SOCK_DIAG_BY_FAMILY || h.nlmsg_len < NLMSG_LENGTH(sizeof(inet_diag_msg))) {
          return false;  // the end, an error, or a reply too short
        }
        const auto* m = reinterpret_cast<const inet_diag_msg*>(&h + 1);
        listening l{m->idiag_inode, {}, m->idiag_rqueue};
        l.addr.sin_family = AF_INET;
        l.addr.sin_port = m->id.idiag_sport;
        std::memcpy(&l.addr.sin_addr, &m->id.idiag_src[0], 4);
        out.push_back(l);
        return true;
      });
      if (asked) return done ? std::optional(out) : std::nullopt;
    }
    std::ifstream in("/proc/net/tcp");
    std::string line;
    if (!std::getline(in, line)) return std::nullopt;  // header
    while (std::getline(in, line)) {
      std::istringstream f(line);
      std::string slot, local, remote, state, queues, timer, retr, uid, timeout;
      unsigned long inode = 0;
      f >> slot >> local >> remote >> state >> queues >> timer >> retr >> uid >> timeout >> inode;
      if (state != "0A") continue;
      // queues is "tx:rx" in hex; a listener's rx is its accept queue.
      listening l{inode, {}, std::stoul(queues.substr(queues.find(':') + 1), nullptr, 16)};
      l.addr.sin_family = AF_INET;
      l.addr.sin_addr.s_addr = static_cast<in_addr_t>(std::stoul(local.substr(0, 8), nullptr, 16));
      l.addr.sin_port = htons(static_cast<std::uint16_t>(std::stoul(local.substr(9), nullptr, 16)));
      out.push_back(l);
    }
    return out;
  }

  // Whether the kernel holds a socket for the server's side of connection `l` to target t
  // (accepted, waiting to be accepted, or half made): a sock_diag lookup of the exact
  // address pair. Unknown (nullopt) when the lookup itself failed.
  std::optional<bool> server_holds(const live& l, const attack_target& t) {
    if (!diag_) return std::nullopt;
    sockaddr_in local{};
    socklen_t len = sizeof local;
    if (::getsockname(l.fd.get(), reinterpret_cast<sockaddr*>(&local), &len) != 0) {
      return std::nullopt;
    }
    diag_request msg = diag_request_for(NLM_F_REQUEST);
    msg.req.idiag_states = ~0u;
    // The server's side: its address is the source, ours the destination.
    msg.req.id.idiag_sport = t.addr.sin_port;
    msg.req.id.idiag_dport = local.sin_port;
    std::memcpy(&msg.req.id.idiag_src[0], &t.addr.sin_addr, 4);
    std::memcpy(&msg.req.id.idiag_dst[0], &local.sin_addr, 4);
    msg.req.id.idiag_cookie[0] = msg.req.id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;
    std::optional<bool> holds;
    diag_ask(msg, [&](const nlmsghdr& h) {
      if (h.nlmsg_type == SOCK_DIAG_BY_FAMILY && h.nlmsg_len >= NLMSG_LENGTH(sizeof(inet_diag_msg))) {
        // A listener on that port answers a lookup that matches no connection: not ours.
        holds = reinterpret_cast<const inet_diag_msg*>(&h + 1)->idiag_state != 10;  // TCP_LISTEN
      } else if (h.nlmsg_type == NLMSG_ERROR && h.nlmsg_len >= NLMSG_LENGTH(sizeof(nlmsgerr)) &&
                 reinterpret_cast<const nlmsgerr*>(&h + 1)->error == -ENOENT) {
        holds = false;
      }
      return false;  // one reply answers a lookup
    });
    return holds;
  }

  // Sends request `msg` and hands each reply to it to `reply` until that returns false;
  // replies to other requests are skipped. Stops early where the socket fails or a reply is
  // malformed. False when the request could not be sent.
  template <class F>
  bool diag_ask(const diag_request& msg, F&& reply) {
    if (::send(diag_.get(), &msg, sizeof msg, 0) != static_cast<ssize_t>(sizeof msg)) return false;
    alignas(nlmsghdr) char buf[32768];
    for (;;) {
      const ssize_t n = ::recv(diag_.get(), buf, sizeof buf, 0);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return true;
      const auto got = static_cast<std::size_t>(n);
      // NLMSG_OK/NLMSG_NEXT by hand: the macros mix signed and unsigned.
      for (std::size_t at = 0; at + sizeof(nlmsghdr) <= got;) {
        const auto* h = reinterpret_cast<const nlmsghdr*>(buf + at);
        if (h->nlmsg_len < sizeof(nlmsghdr) || at + h->nlmsg_len > got) return true;
        at += NLMSG_ALIGN(h->nlmsg_len);
        if (h->nlmsg_seq != msg.nlh.nlmsg_seq) continue;  // an earlier request's
        if (!reply(*h)) return true;
      }
    }
  }

  // Design point 6: ends the connections whose listener has been gone a second and for which
  // the server's kernel holds nothing.
  void end_orphans(attack_clock::time_point now) {
    if (now < next_orphan_check_) return;
    next_orphan_check_ = now + std::chrono::milliseconds(250);
    std::vector<live*> candidates;
    for (auto& [key, l] : live_) {
      const attack_target& t = targets_[records_[l->record].target];
      if (!l->connecting && t.gone && now - *t.gone >= std::chrono::seconds(1)) {
        candidates.push_back(l.get());
      }
    }
    for (live* l : candidates) {
      const attack_target& t = targets_[records_[l->record].target];
      if (server_holds(*l, t) == false) end(*l, attack_record::ending::orphaned, now);
    }
  }

  // The rank whose process holds socket `inode`, or -1.
  int owner_of(unsigned long inode) const {
    const std::string want = "socket:[" + std::to_string(inode) + "]";
    for (std::size_t r = 0; r < pids_.size(); ++r) {
      const std::string dir = "/proc/" + std::to_string(pids_[r]) + "/fd";
      DIR* d = ::opendir(dir.c_str());
      if (d == nullptr) continue;
      bool found = false;
      while (dirent* e = ::readdir(d)) {
        char link[64];
        const ssize_t n = ::readlinkat(::dirfd(d), e->d_name, link, sizeof link);
        if (n > 0 && want == std::string_view(link, static_cast<std::size_t>(n))) {
          found = true;
          break;
        }
      }
      ::closedir(d);
      if (found) return static_cast<int>(r);
    }
    return -1;
  }

  void scan(attack_clock::time_point now) {
    const auto seen = list_listeners();
    if (!seen) return;
    const auto end = attack_clock::now();
    std::set<unsigned long> present;
    for (const auto& l : *seen) {
      present.insert(l.inode);
      if (auto it = by_inode_.find(l.inode); it != by_inode_.end()) {
        targets_[it->second].last_seen = now;
        track_accepts(it->second, l.queue, now);
        continue;
      }
      if (foreign_.contains(l.inode)) continue;
      const int rank = owner_of(l.inode);
      if (rank < 0) {
        foreign_.insert(l.inode);  // another process's listener: never touched
        continue;
      }
      attack_target t;
      t.rank = rank;
      t.store = rank == 0 && ntohs(l.addr.sin_port) == store_port_;
      t.addr = l.addr;
      t.inode = l.inode;
      t.first_seen = t.last_seen = now;
      by_inode_[l.inode] = targets_.size();
      targets_.push_back(t);
      unaccepted_.emplace_back();
      attack_new_target(targets_.size() - 1);
    }
    for (std::size_t i = 0; i < targets_.size(); ++i) {
      if (targets_[i].gone || present.contains(targets_[i].inode)) continue;
      targets_[i].gone = end;
      unaccepted_[i].clear();  // those are reset with the listener, never accepted
    }
  }

  // Design point 5: `queue` connections wait in target t's backlog, the newest ones.
  void track_accepts(std::size_t t, std::size_t queue, attack_clock::time_point now) {
    auto& fifo = unaccepted_[t];
    std::erase_if(fifo, [&](std::size_t r) { return records_[r].closed.has_value(); });
    const std::size_t waiting = std::min(queue, fifo.size());
    for (std::size_t i = fifo.size() - waiting; i < fifo.size(); ++i) {
      records_[fifo[i]].queued_until = now;
    }
    fifo.erase(fifo.begin(), fifo.end() - static_cast<std::ptrdiff_t>(waiting));
  }

  void attack_new_target(std::size_t t) {
    for (attack_kind k : all_attack_kinds) {
      if (k == attack_kind::burst) continue;
      plan(k, t);
    }
    for (int i = 0; i < o_.burst; ++i) launch(attack_kind::burst, t, {}, {}, {});
    if (targets_[t].store) {
      next_store_wave_ = attack_clock::now() + o_.store_wave_every;
      next_store_burst_ = attack_clock::now() + o_.store_burst_every;
    }
  }

  // ---- payloads ----------------------------------------------------------------------------

  bytes random_bytes(std::size_t n) {
    bytes b(n);
    for (auto& x : b) x = static_cast<std::byte>(rng_());
    return b;
  }

  // A well-formed hello to target t: the store's (responder 0, job id zeros, as a real rank
  // sends), or a data listener's, with the job and communicator ids of a captured handshake
  // when there is one (random ones otherwise, which the listener refuses at once).
  bytes hello_for(std::size_t t) {
    detail::auth_hello h;
    const attack_target& target = targets_[t];
    h.world = static_cast<std::uint32_t>(o_.world);
    if (target.store) {
      h.kind = detail::auth_kind::store;
      h.initiator = static_cast<std::uint32_t>(o_.world - 1);
      h.responder = 0;
    } else {
      h.kind = detail::auth_kind::tcp;
      // Rank 0 dials each rank's last connection last, so this slot is free the longest.
      h.initiator = 0;
      h.responder = static_cast<std::uint32_t>(target.rank);
      h.index = static_cast<std::uint32_t>(o_.conns - 1);
      if (const capture* c = any_tcp_capture()) {
        std::memcpy(h.job.data(), c->hello.data() + 24, 16);
        std::memcpy(h.comm.data(), c->hello.data() + 40, 16);
      } else {
        auto r = random_bytes(32);
        std::memcpy(h.job.data(), r.data(), 16);
        std::memcpy(h.comm.data(), r.data() + 16, 16);
      }
    }
    auto n = random_bytes(32);
    std::memcpy(h.nonce.data(), n.data(), 32);
    const auto encoded = detail::auth_encode(h);
    return bytes(encoded.begin(), encoded.end());
  }

  const capture* any_tcp_capture() const {
    for (const auto& c : captures_) {
      if (c.hello[6] == static_cast<std::byte>(detail::auth_kind::tcp)) return &c;
    }
    return nullptr;
  }

  const capture* capture_to(int port) {
    std::vector<const capture*> found;
    for (const auto& c : captures_) {
      if (c.dport == port) found.push_back(&c);
    }
    if (found.empty()) return nullptr;
    return found[rng_() % found.size()];
  }

  // Makes the connection of kind k to target t now, or keeps it for later when it needs a
  // captured handshake that has not been seen yet.
  void plan(attack_kind k, std::size_t t) {
    const attack_target& target = targets_[t];
    switch (k) {
      case attack_kind::random_bytes:
        return launch(k, t, random_bytes(1 + rng_() % 4096), {}, {});
      case attack_kind::truncated: {
        auto h = hello_for(t);
        h.resize(40);
        return launch(k, t, std::move(h), {}, {});
      }
      case attack_kind::wrong_magic: {
        auto h = hello_for(t);
        detail::store_put_le(h.data(), detail::store_magic, 4);
        return launch(k, t, std::move(h), {}, {});
      }
      case attack_kind::wrong_version: {
        auto h = hello_for(t);
        detail::store_put_le(h.data() + 4, detail::auth_version + 1, 2);
        return launch(k, t, std::move(h), {}, {});
      }
      case attack_kind::huge_length: {
        if (target.store) {
          detail::store_frame_header f;
          f.op = static_cast<std::uint8_t>(detail::store_op::set);
          f.value_len = std::uint64_t{1} << 40;
          const auto head = detail::store_encode_header(f);
          return launch(k, t, bytes(head.begin(), head.end()), {}, {});
        }
        detail::frame_header f{};
        f.magic = detail::frame_magic;
        f.length = 0xffffffffu;
        bytes b(sizeof f);
        std::memcpy(b.data(), &f, sizeof f);
        return launch(k, t, std::move(b), {}, {});
      }
      case attack_kind::bad_proof:
        // A data listener checks the job and communicator ids before it challenges, so wait
        // for a captured handshake to borrow them from (when capture works at all).
        if (!target.store && sniffer_ && any_tcp_capture() == nullptr) {
          waiting_.push_back({k, t});
          return;
        }
        return launch(k, t, hello_for(t), random_bytes(detail::auth_proof_bytes), {});
      case attack_kind::replay: {
        if (!sniffer_) {
          ++skipped_[std::string(to_string(k)) + ": no capture (" + capture_note_ + ")"];
          return;
        }
        const capture* c = capture_to(target.port());
        if (c == nullptr) {
          waiting_.push_back({k, t});
          return;
        }
        return launch(k, t, bytes(c->hello.begin(), c->hello.end()),
                      bytes(c->proof.begin(), c->proof.end()), {});
      }
      case attack_kind::slow_loris:
        return launch(k, t, {}, {}, hello_for(t));
      case attack_kind::burst:
        return launch(k, t, {}, {}, {});
    }
  }

  void retry_waiting() {
    std::vector<deferred> still;
    for (const auto& w : std::exchange(waiting_, {})) {
      const attack_target& target = targets_[w.target];
      if (target.gone) {
        ++skipped_[std::string(to_string(w.kind)) + " to " +
                   (target.store ? "the store" : "a data listener") +
                   ": the listener closed before the handshake it needs was captured"];
        continue;
      }
      const bool ready = w.kind == attack_kind::replay ? capture_to(target.port()) != nullptr
                                                       : any_tcp_capture() != nullptr;
      if (ready) {
        plan(w.kind, w.target);
      } else {
        still.push_back(w);
      }
    }
    waiting_.insert(waiting_.end(), still.begin(), still.end());
  }

  // ---- connections -------------------------------------------------------------------------

  void launch(attack_kind kind, std::size_t t, bytes first, bytes after_challenge, bytes drip) {
    attack_record rec;
    rec.kind = kind;
    rec.target = t;
    rec.start = attack_clock::now();
    detail::unique_fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (!fd) {
      rec.how = attack_record::ending::no_socket;
      records_.push_back(rec);
      return;
    }
    const sockaddr_in to = targets_[t].addr;
    const int rc = ::connect(fd.get(), reinterpret_cast<const sockaddr*>(&to), sizeof to);
    if (rc != 0 && errno != EINPROGRESS) {
      rec.how = attack_record::ending::refused;
      records_.push_back(rec);
      return;
    }
    sockaddr_in local{};
    socklen_t len = sizeof local;
    ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&local), &len);
    rec.local_port = ntohs(local.sin_port);
    own_ports_.insert(rec.local_port);  // before a byte is sent, so the sniffer skips it
    auto l = std::make_unique<live>();
    l->record = records_.size();
    records_.push_back(rec);
    l->fd = std::move(fd);
    l->out = std::move(first);
    l->after_challenge = std::move(after_challenge);
    l->drip = std::move(drip);
    const int key = l->fd.get();
    epoll_event ev{};
    ev.events = EPOLLOUT;
    ev.data.fd = key;
    l->watching_write = true;
    ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, key, &ev);
    if (!l->drip.empty()) dripping_.push_back(key);
    live_[key] = std::move(l);
    if (rc == 0) on_connected(*live_[key], rec.start);
  }

  void end(live& l, attack_record::ending how, attack_clock::time_point now) {
    attack_record& rec = records_[l.record];
    rec.how = how;
    if (how != attack_record::ending::refused) rec.closed = now;
    const int key = l.fd.get();
    ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, key, nullptr);
    std::erase(dripping_, key);
    live_.erase(key);  // closes it
  }

  void watch(live& l) {
    const bool want_write = l.connecting || !l.out.empty();
    if (want_write == l.watching_write) return;
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP | (want_write ? EPOLLOUT : 0u);
    ev.data.fd = l.fd.get();
    ::epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, l.fd.get(), &ev);
    l.watching_write = want_write;
  }

  void on_connected(live& l, attack_clock::time_point now) {
    l.connecting = false;
    records_[l.record].connected = now;
    unaccepted_[records_[l.record].target].push_back(l.record);
    l.next_drip = now;
    l.watching_write = true;  // force the MOD below to add EPOLLIN
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP | EPOLLOUT;
    ev.data.fd = l.fd.get();
    ::epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, l.fd.get(), &ev);
    watch(l);
  }

  // Returns false when the connection ended.
  bool send_some(live& l, attack_clock::time_point now) {
    while (!l.out.empty()) {
      const ssize_t n = ::send(l.fd.get(), l.out.data(), l.out.size(), MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) break;
        end(l, attack_record::ending::reset, now);
        return false;
      }
      records_[l.record].sent += static_cast<std::size_t>(n);
      l.out.erase(l.out.begin(), l.out.begin() + n);
    }
    watch(l);
    return true;
  }

  bool receive(live& l, attack_clock::time_point now) {
    std::byte buf[4096];
    for (;;) {
      const ssize_t n = ::recv(l.fd.get(), buf, sizeof buf, 0);
      if (n == 0) {
        end(l, attack_record::ending::eof, now);
        return false;
      }
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return true;
        end(l, attack_record::ending::reset, now);
        return false;
      }
      attack_record& rec = records_[l.record];
      const bool had_challenge = rec.received >= detail::auth_challenge_bytes;
      rec.received += static_cast<std::size_t>(n);
      if (!had_challenge && rec.received >= detail::auth_challenge_bytes &&
          !l.after_challenge.empty()) {
        l.out = std::move(l.after_challenge);
        l.after_challenge.clear();
        if (!send_some(l, now)) return false;
      }
    }
  }

  void on_event(int key, std::uint32_t events, attack_clock::time_point now) {
    auto it = live_.find(key);
    if (it == live_.end()) return;
    live& l = *it->second;
    if (l.connecting) {
      int err = 0;
      socklen_t len = sizeof err;
      ::getsockopt(key, SOL_SOCKET, SO_ERROR, &err, &len);
      if (err != 0) return end(l, attack_record::ending::refused, now);
      if ((events & EPOLLOUT) == 0) return;
      on_connected(l, now);
    }
    if ((events & EPOLLOUT) && !send_some(l, now)) return;
    if (events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) receive(l, now);
  }

  void drip(attack_clock::time_point now) {
    for (int key : std::vector<int>(dripping_)) {
      auto it = live_.find(key);
      if (it == live_.end()) continue;
      live& l = *it->second;
      if (l.connecting || l.next_drip > now) continue;
      if (l.drip_at < l.drip.size()) {
        l.out.push_back(l.drip[l.drip_at++]);
        l.next_drip = now + std::chrono::seconds(1);
        send_some(l, now);
      }
    }
  }

  // ---- sniffing ----------------------------------------------------------------------------

  void open_sniffer() {
    detail::unique_fd fd(
        ::socket(AF_PACKET, SOCK_RAW | SOCK_NONBLOCK | SOCK_CLOEXEC, htons(ETH_P_ALL)));
    if (!fd) {
      capture_note_ =
          std::string("AF_PACKET socket: ") + std::strerror(errno) + " (needs root or CAP_NET_RAW)";
      return;
    }
    // Keep only IPv4 TCP segments carrying 1 to 256 bytes: handshakes, not the job's bulk
    // data, so that sniffing costs the job next to nothing.
    sock_filter code[] = {
        BPF_STMT(BPF_LD | BPF_H | BPF_ABS, 12),  // 0: ethertype
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, ETH_P_IP, 0, 17),
        BPF_STMT(BPF_LD | BPF_B | BPF_ABS, 23),  // 2: IP protocol
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, IPPROTO_TCP, 0, 15),
        BPF_STMT(BPF_LD | BPF_H | BPF_ABS, 20),  // 4: fragment offset
        BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, 0x1fff, 13, 0),
        BPF_STMT(BPF_LDX | BPF_B | BPF_MSH, 14),  // 6: X = IP header bytes
        BPF_STMT(BPF_LD | BPF_H | BPF_ABS, 16),   // 7: IP total length
        BPF_STMT(BPF_ST, 0),
        BPF_STMT(BPF_LD | BPF_B | BPF_IND, 26),  // 9: TCP data offset
        BPF_STMT(BPF_ALU | BPF_AND | BPF_K, 0xf0),
        BPF_STMT(BPF_ALU | BPF_RSH | BPF_K, 2),  // A = TCP header bytes
        BPF_STMT(BPF_ALU | BPF_ADD | BPF_X, 0),  // + IP header bytes
        BPF_STMT(BPF_MISC | BPF_TAX, 0),
        BPF_STMT(BPF_LD | BPF_MEM, 0),
        BPF_STMT(BPF_ALU | BPF_SUB | BPF_X, 0),  // 15: A = payload bytes
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0, 2, 0),
        BPF_JUMP(BPF_JMP | BPF_JGT | BPF_K, 256, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, 0xffff),
        BPF_STMT(BPF_RET | BPF_K, 0),  // 19: drop
    };
    sock_fprog prog{static_cast<unsigned short>(std::size(code)), code};
    sockaddr_ll at{};
    at.sll_family = AF_PACKET;
    at.sll_protocol = htons(ETH_P_ALL);
    at.sll_ifindex = static_cast<int>(::if_nametoindex("lo"));
    int big = 8 << 20;
    if (::setsockopt(fd.get(), SOL_SOCKET, SO_ATTACH_FILTER, &prog, sizeof prog) != 0 ||
        at.sll_ifindex == 0 || ::bind(fd.get(), reinterpret_cast<sockaddr*>(&at), sizeof at) != 0) {
      capture_note_ = std::string("cannot sniff lo: ") + std::strerror(errno);
      return;
    }
    if (::setsockopt(fd.get(), SOL_SOCKET, SO_RCVBUFFORCE, &big, sizeof big) != 0) {
      ::setsockopt(fd.get(), SOL_SOCKET, SO_RCVBUF, &big, sizeof big);
    }
    sniffer_ = std::move(fd);
  }

  void sniff() {
    std::byte pkt[2048];
    for (;;) {
      sockaddr_ll from{};
      socklen_t len = sizeof from;
      const ssize_t n =
          ::recvfrom(sniffer_.get(), pkt, sizeof pkt, 0, reinterpret_cast<sockaddr*>(&from), &len);
      if (n < 0) return;
      // Loopback shows each segment twice, leaving and arriving; keep the arrival.
      if (from.sll_pkttype == PACKET_OUTGOING) continue;
      on_segment(std::span(pkt, static_cast<std::size_t>(n)));
    }
  }

  void on_segment(std::span<const std::byte> p) {
    auto u8 = [&](std::size_t at) { return std::to_integer<std::uint32_t>(p[at]); };
    auto be16 = [&](std::size_t at) { return (u8(at) << 8) | u8(at + 1); };
    auto be32 = [&](std::size_t at) { return (be16(at) << 16) | be16(at + 2); };
    if (p.size() < 14 + 20) return;
    const std::size_t ip = 14, ihl = (u8(ip) & 0xf) * 4;
    const std::size_t tcp = ip + ihl;
    if (p.size() < tcp + 20) return;
    const std::size_t payload = tcp + ((u8(tcp + 12) >> 4) * 4);
    const std::size_t end = std::min(p.size(), ip + be16(ip + 2));
    if (payload >= end) return;
    const int sport = static_cast<int>(be16(tcp)), dport = static_cast<int>(be16(tcp + 2));
    if (own_ports_.contains(sport)) return;  // the attacker's own hellos are no genuine capture
    const std::uint32_t seq = be32(tcp + 4);
    const auto data = p.subspan(payload, end - payload);
    const auto key = (static_cast<std::uint32_t>(sport) << 16) | static_cast<std::uint32_t>(dport);
    auto it = streams_.find(key);
    if (it == streams_.end()) {
      // A stream starts being recorded at a segment that opens with the handshake's magic.
      if (data.size() < 4 || detail::store_get_le(data.data(), 4) != detail::auth_magic) return;
      it = streams_.emplace(key, stream{}).first;
      it->second.base = seq;
    }
    stream& s = it->second;
    if (s.done) return;
    const std::uint32_t off = seq - s.base;
    for (std::size_t i = 0; i < data.size() && off + i < s.data.size(); ++i) {
      s.data[off + i] = data[i];
      s.have.set(off + i);
    }
    if (s.have.all()) {
      s.done = true;
      capture c;
      c.dport = dport;
      std::copy_n(s.data.begin(), c.hello.size(), c.hello.begin());
      std::copy_n(s.data.begin() + c.hello.size(), c.proof.size(), c.proof.begin());
      captures_.push_back(c);
    }
  }

  // ---- the loop ----------------------------------------------------------------------------

  void run() {
    // An attacker on another machine has CPUs of its own; here it shares two cores with the
    // ranks, and at their priority it would find the data listeners, which live for tens of
    // milliseconds, mostly after they closed. Real-time priority (root only) gives it the
    // head start a remote attacker has; it sleeps in epoll_wait between scans, never spins.
    // Elsewhere the ranks' nice value is raised instead (any user may do that to its own
    // processes; threads they start later inherit it).
    sched_param sp{};
    sp.sched_priority = 1;
    realtime_ = ::pthread_setschedparam(::pthread_self(), SCHED_FIFO, &sp) == 0;
    if (!realtime_) {
      for (pid_t pid : pids_) ::setpriority(PRIO_PROCESS, static_cast<id_t>(pid), 10);
    }
    try {
      loop();
    } catch (const std::exception& e) {
      failure_ = e.what();
    }
    live_.clear();
  }

  void loop() {
    epoll_.reset(::epoll_create1(EPOLL_CLOEXEC));
    diag_.reset(::socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG));
    constexpr int sniffer_key = -1;
    if (sniffer_) {
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.fd = sniffer_key;
      ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, sniffer_.get(), &ev);
    }
    std::optional<attack_clock::time_point> give_up;
    auto next_scan = attack_clock::now();
    std::vector<epoll_event> events(512);
    for (;;) {
      auto now = attack_clock::now();
      const bool stopping = stopping_.load(std::memory_order_acquire);
      if (stopping && !give_up) {
        give_up = now + finish_wait_;
        scan(now);  // which listeners went since the last scan, for end_orphans
      }
      if (stopping && (live_.empty() || now >= *give_up)) return;
      end_orphans(now);
      if (!stopping) {
        if (now >= next_scan) {
          scan(now);
          // Quickly while data listeners may still appear or connections wait to be
          // accepted; then only to see the store go.
          const auto data_gone = std::count_if(targets_.begin(), targets_.end(),
                                               [](const auto& t) { return !t.store && t.gone; });
          const bool waiting = std::any_of(unaccepted_.begin(), unaccepted_.end(),
                                           [](const auto& q) { return !q.empty(); });
          next_scan = now + (data_gone < o_.world || waiting ? std::chrono::milliseconds(1)
                                                             : std::chrono::milliseconds(50));
        }
        retry_waiting();
        attack_store_again(now);
      }
      drip(now);
      const int n = ::epoll_wait(epoll_.get(), events.data(), static_cast<int>(events.size()), 1);
      now = attack_clock::now();
      for (int i = 0; i < n; ++i) {
        const auto& e = events[static_cast<std::size_t>(i)];
        if (e.data.fd == sniffer_key) {
          sniff();
        } else {
          on_event(e.data.fd, e.events, now);
        }
      }
    }
  }

  void attack_store_again(attack_clock::time_point now) {
    for (std::size_t t = 0; t < targets_.size(); ++t) {
      if (!targets_[t].store || targets_[t].gone) continue;
      if (now >= next_store_wave_) {
        for (attack_kind k : all_attack_kinds) {
          if (k != attack_kind::burst) plan(k, t);
        }
        next_store_wave_ = now + o_.store_wave_every;
      }
      if (now >= next_store_burst_) {
        for (int i = 0; i < o_.burst; ++i) launch(attack_kind::burst, t, {}, {}, {});
        next_store_burst_ = now + o_.store_burst_every;
      }
    }
  }

  options o_;
  std::vector<pid_t> pids_;
  int store_port_ = 0;
  std::thread thread_;
  std::atomic<bool> stopping_{false};
  std::chrono::seconds finish_wait_{10};
  std::string failure_;
  bool realtime_ = false;

  // Owned by the attacker's thread once start() has run; read by others after finish().
  detail::unique_fd epoll_;
  detail::unique_fd diag_;
  detail::unique_fd sniffer_;
  std::string capture_note_;
  std::mt19937_64 rng_{std::random_device{}()};
  std::vector<attack_target> targets_;
  std::vector<std::vector<std::size_t>> unaccepted_;  // per target: records maybe in its backlog

  std::unordered_map<unsigned long, std::size_t> by_inode_;
  std::set<unsigned long> foreign_;
  std::vector<attack_record> records_;
  std::unordered_map<int, std::unique_ptr<live>> live_;
  std::vector<int> dripping_;
  std::vector<deferred> waiting_;
  std::map<std::string, int> skipped_;
  std::set<int> own_ports_;
  std::unordered_map<std::uint32_t, stream> streams_;
  std::vector<capture> captures_;
  attack_clock::time_point next_store_wave_ = attack_clock::time_point::max();
  attack_clock::time_point next_store_burst_ = attack_clock::time_point::max();
  attack_clock::time_point next_orphan_check_{};
  std::uint32_t diag_seq_ = 0;
};

}  // namespace chorus::test
