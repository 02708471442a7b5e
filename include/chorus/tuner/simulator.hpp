// SPDX-License-Identifier: Apache-2.0
// The simulator: runs the real schedules of every rank over a simulated network, in one
// process, and predicts how long a collective takes. The tuner prices algorithms with it.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <limits>
#include <queue>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "chorus/detail/op_desc.hpp"
#include "chorus/error.hpp"
#include "chorus/executor/executor.hpp"
#include "chorus/schedule/build.hpp"
#include "chorus/topology.hpp"
#include "chorus/tuner/detail/program.hpp"

namespace chorus {

/// What moving bytes over one kind of link costs: the alpha-beta model, with alpha split as
/// LogP does into the time a message is in flight (overlapped with everything else) and the
/// time it keeps each end's core busy, and beta split between the two ends, so that a rank
/// that sends and receives many messages at once is priced as it runs.
struct link_cost {
  double latency_s = 0;        ///< L: a message's (slice's) time in flight
  double send_s_per_byte = 0;  ///< time the sender's port is busy per byte
  double recv_s_per_byte = 0;  ///< time the receiver's port is busy per byte
  double overhead_s = 0;       ///< o: each end's core per message (system calls, wake-ups)
  /// More time in flight for each of a message's first small_message_bytes: the start of a
  /// message moves slower than its bulk. Over shared memory a frame of more than one cache
  /// line is taken head first, then line by line from the writer's core, before the copies
  /// stream (2 ranks here: 8 B 0.6 us, 2 KiB 1.0, then 15 GB/s).
  double small_s_per_byte = 0;

  /// What the start of a message of `bytes` adds to its time in flight.
  double small_extra(double bytes) const {
    return std::min(bytes, static_cast<double>(small_message_bytes)) * small_s_per_byte;
  }
  static constexpr std::size_t small_message_bytes = 2048;
  /// The whole start: what a message of small_message_bytes or more adds (the number the
  /// costs print, a tuning file and chorus-sim take), and its inverse.
  double start_s() const { return small_extra(static_cast<double>(small_message_bytes)); }
  void set_start_s(double s) { small_s_per_byte = s / static_cast<double>(small_message_bytes); }
};

/// The machine a collective runs on. Ports are what a transfer keeps busy: for links that
/// copy through the CPU (shared memory, and TCP between processes of one machine) each rank's
/// own core; for a network, each node's NIC, shared by the ranks of the node, and in a fat
/// tree the leaf switches' uplinks.
struct sim_network {
  std::vector<int> node_of;  ///< node of each rank; the size is the number of ranks
  link_cost intra;           ///< between ranks of one node
  link_cost inter;           ///< between nodes
  /// Where `intra_pulls`: between ranks of one node, a send of an exposing operation
  /// (executor_job::expose) of at least `pull_min_bytes`, which the receiver reads in place:
  /// its core copies the bytes (recv_s_per_byte) and the sender's pays only its overhead; the
  /// send completes when the receiver has read it.
  ///
  /// Where `intra_pulls`, the ring lends as well (chorus's shared memory: the one transport
  /// that pulls; it lends also with single copy turned off, which this does not follow): a
  /// reducing receive from a rank of the node whose payload lies whole in the ring, without
  /// wrapping, while the payloads lent from that ring take at most half of it, is reduced
  /// where it lies once all of it is there. The receiver's core pays the reduction and its
  /// overhead, no copy (shm/channel.hpp, may_lend). The ring is four times the transport's
  /// cap on a slice (exec.max_slice_bytes: the transport cuts slices at a quarter of its
  /// ring), its position counted from the start of the call.
  link_cost pull{};
  bool intra_pulls = false;
  std::size_t pull_min_bytes = 64 * 1024;  ///< the shared-memory transport's threshold
  /// true: inter-node transfers keep the ranks' cores busy (TCP on one machine); false: the
  /// nodes' NICs (inter.send/recv_s_per_byte are then the NIC's, shared by its ranks).
  bool inter_on_cpu = true;
  /// Fat tree: nodes per leaf switch (0: every node on one non-blocking switch) and the
  /// oversubscription of a leaf's uplinks (2: uplinks carry half of what its nodes can send).
  int nodes_per_leaf = 0;
  double oversubscription = 1;
  /// Cores each node's ranks share, one to every `cores_per_node`-th local rank (0: a core
  /// per rank). Where ranks outnumber cores, their copies and reductions queue for them.
  int cores_per_node = 0;
  /// How the operating system shares those cores: over a short span each rank stays on the
  /// core it was dealt; over longer ones the scheduler evens the load out, as if any core of
  /// the node took a rank's next piece of work (the earliest free; a rank's own work still
  /// one piece at a time). A collective is priced both ways, the pooled time weighing
  /// pooled / (pooled + pool_after_s). At 3 ranks on 2 cores a ring's ranks are equally
  /// busy: dealt out, two share a core and the ring runs at their pace, 1.25-1.5x slower
  /// than the 64-256 MiB all_reduces measured here, while pooled, the shorter ones came out
  /// up to 1.3x too fast. Replaying two sweeps (bench/README.md), any of 10 to 60 ms put
  /// more rows within 25% and more picks within 10% than either alone; 0: dealt out only.
  double pool_after_s = 0.02;
  double reduce_s_per_byte = 0;  ///< gamma: applying a reduction, per byte, on the receiver's core
  double copy_s_per_byte = 0;    ///< a local copy step, per byte
  /// Memory beyond the caches: where the buffers of a node's ranks (sim_call::in_place says
  /// whether a rank's input is its output) exceed `cache_bytes`, that share of the bytes a
  /// core reads in them comes from memory, each adding `memory_s_per_byte` to the core's work
  /// (the other costs are those of bytes in the caches), and of those it writes, each adds
  /// twice that (the line is read before it is written, and written back). Per core, not
  /// shared by a node's: here one copy alone moved 19.9, 19.2 and 11.8 GB/s out of 16, 32
  /// and 64 MiB, two at once 18.0, 18.3 and 17.9 each. 0: no such cost.
  double memory_s_per_byte = 0;
  std::size_t cache_bytes = 0;
  executor_options exec{};       ///< the executor's slice, window and transports' cap
  /// Above this many ranks, where every node runs what the first one runs, simulate only the
  /// first, as simulate() explains; 0: wherever that holds.
  int fold_above = 4096;

  int size() const { return static_cast<int>(node_of.size()); }
  /// Every rank on its own node (`per_node` 1) or nodes of `per_node` ranks, in rank order.
  static std::vector<int> nodes_of(int ranks, int per_node) {
    std::vector<int> v(static_cast<std::size_t>(ranks));
    for (int r = 0; r < ranks; ++r) v[static_cast<std::size_t>(r)] = r / std::max(1, per_node);
    return v;
  }
};

/// What the simulation found.
struct sim_result {
  double seconds = 0;          ///< until the last rank finished
  std::uint64_t steps = 0;     ///< of the slowest rank... of every rank together
  std::uint64_t messages = 0;  ///< slices sent, all ranks
  std::uint64_t bytes = 0;     ///< bytes sent, all ranks
  std::uint64_t events = 0;    ///< simulation events processed
  int simulated = 0;           ///< ranks simulated: the network's, or one node's where it folds
  int compared = 0;            ///< ranks whose programs were compared to decide that it folds
};

namespace detail {

/// A resource that serves one transfer at a time, first come first served.
struct sim_port {
  double free_at = 0;
};

/// The discrete-event engine. Each rank runs its program as the executor would: per peer,
/// sends in schedule order with at most `window` in flight, receives matched in order, every
/// slice gated by the hazards it shares with earlier steps, reductions and copies on the
/// rank's core. Ranks wake up when something of theirs completes; every reservation of a port
/// happens at the simulated time it is made, so ports are shared first come first served.
class sim_engine {
 public:
  /// `programs` holds each distinct program once; rank r runs programs[program_of[r]]. With
  /// `simulated` below the network's size, only ranks 0 .. simulated - 1 are simulated, each
  /// standing for every rank r + k * simulated (see simulate()): program_of has `simulated`
  /// entries, and a message to rank p is received by rank p mod simulated. `footprint`: the
  /// bytes of one rank's buffers (sim_network::cache_bytes). `pooled`: the node's cores
  /// pooled rather than dealt out (sim_network::pool_after_s).
  sim_engine(const sim_network& net, std::vector<sim_program> programs, std::vector<std::uint32_t> program_of,
             int simulated, double footprint = 0, bool pooled = false)
      : net_(net), progs_(std::move(programs)), prog_of_(std::move(program_of)), sim_(simulated) {
    const int n = simulated;
    ranks_.resize(static_cast<std::size_t>(n));
    int nodes = 0;
    for (int r = 0; r < n; ++r) nodes = std::max(nodes, net.node_of[static_cast<std::size_t>(r)] + 1);
    port_nodes_ = nodes;
    // Each rank's core: its own, or one of its node's cores_per_node, dealt out in turn.
    core_of_.resize(static_cast<std::size_t>(n));
    std::vector<int> seen(static_cast<std::size_t>(nodes), 0);
    int cores = 0;
    for (int r = 0; r < n; ++r) {
      const int node = net.node_of[static_cast<std::size_t>(r)];
      const int local = seen[static_cast<std::size_t>(node)]++;
      core_of_[static_cast<std::size_t>(r)] =
          net.cores_per_node > 0 ? node * net.cores_per_node + local % net.cores_per_node : r;
      cores = std::max(cores, core_of_[static_cast<std::size_t>(r)] + 1);
    }
    // Pooled, a rank may take any of its node's cores, dealt to a rank or not.
    if (pooled && net.cores_per_node > 0) cores = std::max(cores, nodes * net.cores_per_node);
    cpu_.resize(static_cast<std::size_t>(cores));
    pool_ = net.cores_per_node > 0 && pooled;  // see busy()
    rank_free_.assign(static_cast<std::size_t>(n), 0.0);
    nic_tx_.resize(static_cast<std::size_t>(nodes));
    nic_rx_.resize(static_cast<std::size_t>(nodes));
    // What a byte touched costs each rank's core from memory: the memory's cost for the
    // share its node's caches do not hold, of buffers touched in turn as much as exceeds the
    // caches. A rough rule: reading through a buffer here slowed from 16 MiB on and was at its
    // slowest from 64 MiB, not along 1 - C / W.
    memory_of_.assign(static_cast<std::size_t>(n), 0.0);
    if (net.memory_s_per_byte > 0 && footprint > 0) {
      std::vector<double> ranks_on(static_cast<std::size_t>(nodes), 0.0);
      for (int v : net.node_of) {
        if (v < nodes) ranks_on[static_cast<std::size_t>(v)] += 1;
      }
      for (int r = 0; r < n; ++r) {
        const double touched = ranks_on[static_cast<std::size_t>(net.node_of[static_cast<std::size_t>(r)])] * footprint;
        const double missed = std::max(0.0, 1.0 - static_cast<double>(net.cache_bytes) / std::max(1.0, touched));
        memory_of_[static_cast<std::size_t>(r)] = missed * net.memory_s_per_byte;
      }
    }
    const int leaves = net.nodes_per_leaf > 0 ? (nodes + net.nodes_per_leaf - 1) / net.nodes_per_leaf : 0;
    up_.resize(static_cast<std::size_t>(leaves));
    down_.resize(static_cast<std::size_t>(leaves));
    for (int r = 0; r < n; ++r) ranks_[static_cast<std::size_t>(r)].cur.emplace(prog(r));
    // As many steps ahead as the whole network's ranks would look (folded or not).
    lookahead_ = std::clamp<std::uint64_t>((std::uint64_t{1} << 24) / static_cast<std::uint64_t>(std::max(1, net.size())),
                                           256, 8192);
  }

  sim_result run() {
    const int n = sim_;
    for (int r = 0; r < n; ++r) wake(r, 0.0);
    while (!events_.empty()) {
      // Apply every event of one rank at one time, then visit the rank once.
      const double t = events_.front().at;
      const int r = events_.front().rank;
      rank_state& rs = ranks_[static_cast<std::size_t>(r)];
      rs.now = t;
      do {
        std::pop_heap(events_.begin(), events_.end(), later{});
        const event e = events_.back();
        events_.pop_back();
        ++result_.events;
        if (e.kind == event_kind::wake) continue;
        step_rt* st = live_step(rs, e.step);
        if (e.kind == event_kind::sent) {
          ++st->send_done;
          --rs.peers[e.peer].in_flight;
        } else {
          ++st->recv_done;
        }
        rs.finished = std::max(rs.finished, t);
      } while (!events_.empty() && events_.front().at == t && events_.front().rank == r);
      advance(r);
    }
    for (int r = 0; r < n; ++r) {
      const rank_state& rs = ranks_[static_cast<std::size_t>(r)];
      const sim_program& p = prog(r);
      if (rs.base != p.steps) {
        throw error(errc::invalid_argument,
                    "simulator: rank " + std::to_string(r) + " stopped at step " + std::to_string(rs.base) +
                        " of " + std::to_string(p.steps) + " (deadlock)");
      }
      result_.seconds = std::max(result_.seconds, rs.finished);
      result_.steps += p.steps;
      result_.messages += p.messages;
      result_.bytes += p.sent_bytes;
    }
    // Each simulated rank stands for size / simulated ranks that did the same.
    const auto copies = static_cast<std::uint64_t>(net_.size() / sim_);
    result_.steps *= copies;
    result_.messages *= copies;
    result_.bytes *= copies;
    return result_;
  }

 private:
  struct step_rt {
    const sim_step* st = nullptr;
    std::uint64_t send_posted = 0, send_done = 0;
    std::uint64_t recv_done = 0;   // slices applied
    std::uint64_t recv_taken = 0;  // slices matched with an arrival (store or reduce begun)
    bool copied = false;
  };
  struct arrival {
    double at;    // the receiver may start taking it (its first byte is there)
    double sent;  // the sender finished: the receiver cannot finish before sent + latency
    std::uint64_t bytes;
    std::uint64_t pulled_step = none;  // read in place: the sender's step, done when read
  };
  static constexpr std::uint64_t none = std::numeric_limits<std::uint64_t>::max();
  /// A first-in first-out queue that allocates nothing until its first push: a peer's
  /// queues come and go with it, and std::deque's first block (512 bytes, three per peer)
  /// made an all_to_all of 64 ranks spend 40% of its time in malloc and page faults.
  template <class T>
  struct queue {
    std::vector<T> items;
    std::size_t head = 0;
    bool empty() const { return head == items.size(); }
    T& front() { return items[head]; }
    const T& front() const { return items[head]; }
    void push_back(const T& v) { items.push_back(v); }
    void pop_front() {
      if (++head == items.size()) {
        items.clear();
        head = 0;
      } else if (head >= 64 && 2 * head >= items.size()) {  // a queue that never drains
        items.erase(items.begin(), items.begin() + static_cast<std::ptrdiff_t>(head));
        head = 0;
      }
    }
  };
  /// A rank's business with one peer, which it knows by their distance: the peer is rank
  /// (r + rel) mod size. (Folded, two peers may be simulated by one rank; their distances
  /// still differ.)
  struct peer_rt {
    int rel = -1;
    queue<std::uint64_t> sends, recvs;  // discovered steps with this peer, in order
    std::uint32_t in_flight = 0;
    queue<arrival> arrived;  // slices the peer sent us, in its order
    // Where the peer's shared memory ring lends (sim_network::intra_pulls): where its next
    // frame starts and the frames lent, counted from when this rank last had business with
    // the peer (a peer dropped while idle starts again at the ring's start, none lent).
    std::uint64_t ring_at = 0;
    struct lent_frame {
      double until;  // its reduction's end, when the ring has it back
      std::uint64_t bytes;
    };
    std::vector<lent_frame> lent;
    bool idle() const { return sends.empty() && recvs.empty() && in_flight == 0 && arrived.empty(); }
    /// The earliest step with this peer still listed (none: after every step).
    std::uint64_t first_step() const {
      return std::min(sends.empty() ? none : sends.front(), recvs.empty() ? none : recvs.front());
    }
  };
  /// The peers a rank has business with now. Few at a time for every algorithm (all-to-all's
  /// are bounded by the lookahead), so a list searched linearly, with idle peers dropped,
  /// beats a hash map here.
  struct peer_list {
    // A deque: folded, a rank may send to a rank it simulates itself (serve_peer adds to
    // the list it is serving from), and a deque's elements stay where they are.
    std::deque<peer_rt> v;
    peer_rt& operator[](int rel) {
      for (auto& p : v) {
        if (p.rel == rel) return p;
      }
      v.emplace_back().rel = rel;
      return v.back();
    }
    void drop_idle() {
      std::erase_if(v, [](const peer_rt& p) { return p.idle(); });
    }
  };
  enum class event_kind : std::uint8_t { wake, sent, applied };
  /// Something that happens to a rank at a known time: a send it posted is done (its window
  /// slot frees), a receive or copy step's slice is applied, or just a look (an arrival).
  struct event {
    double at;
    int rank;
    event_kind kind;
    int peer;  // the peer's distance (peer_rt::rel)
    std::uint64_t step;
  };
  /// Heap order: earliest first, and one rank's events at one time together.
  struct later {
    bool operator()(const event& a, const event& b) const {
      return a.at > b.at || (a.at == b.at && a.rank > b.rank);
    }
  };
  struct rank_state {
    std::optional<sim_program::cursor> cur;
    std::uint64_t base = 0;       // steps below base are complete
    std::uint64_t frontier = 0;   // steps discovered
    std::deque<step_rt> live;     // steps [base, frontier)
    peer_list peers;
    std::deque<std::uint64_t> copies;
    double now = 0;
    double finished = 0;
  };

  /// How many steps past its oldest unfinished one a rank looks for work (the executor plans
  /// them all; the simulator keeps about 16M steps of all ranks in memory at most).
  std::uint64_t lookahead_ = 256;
  static constexpr std::uint64_t whole = std::numeric_limits<std::uint64_t>::max();

  void push(const event& e) {
    events_.push_back(e);
    std::push_heap(events_.begin(), events_.end(), later{});
  }
  void wake(int r, double t) { push({t, r, event_kind::wake, -1, 0}); }

  step_rt* live_step(rank_state& rs, std::uint64_t i) {
    if (i < rs.base || i >= rs.frontier) return nullptr;
    return &rs.live[i - rs.base];
  }

  bool clear(rank_state& rs, std::uint64_t i, const step_rt& s, access_role mine, std::uint64_t k) {
    const sim_step& st = *s.st;
    const std::uint64_t bytes = st.place_bytes(mine);
    if (bytes == 0) return true;
    const std::int64_t lo = k == whole ? 0 : static_cast<std::int64_t>(std::min(k * st.unit, bytes));
    const std::int64_t hi = k == whole ? static_cast<std::int64_t>(bytes)
                                       : static_cast<std::int64_t>(std::min(static_cast<std::uint64_t>(lo) + st.unit, bytes));
    for (const sim_gate& g : st.gates) {
      if (g.mine != mine) continue;
      const step_rt* t = g.rel == 0 ? &s : live_step(rs, i - g.rel);
      if (t == nullptr) continue;  // long complete
      const std::int64_t qlo = g.delta;
      const std::int64_t qhi = g.delta + static_cast<std::int64_t>(g.bytes);
      if (hi <= qlo || lo >= qhi) continue;
      const auto upto = static_cast<std::uint64_t>(std::min(hi, qhi) - qlo);
      const std::uint64_t needed = (upto + g.unit - 1) / g.unit;
      const bool sends = g.theirs == access_role::send;
      const std::uint64_t done = sends ? t->send_done : t->recv_done;
      const std::uint64_t total = sends ? t->st->send_slices() : t->st->recv_slices();
      if (done < std::min(needed, total)) return false;
    }
    return true;
  }

  double reserve(sim_port& p, double start, double seconds) {
    const double s = std::max(start, p.free_at);
    p.free_at = s + seconds;
    return p.free_at;
  }

  /// Keeps rank r's core busy from `now` (or when it frees) for `seconds` of work that touches
  /// `touched` bytes of the ranks' buffers (a byte written counting twice), and for the memory
  /// time of the share of those its node's caches miss. Returns when the work is done.
  /// Pooled (sim_network::pool_after_s), the work goes to whichever of the node's cores can
  /// start it first, its own dealt core on a tie, once the rank's last work is done.
  double busy(int r, double now, double seconds, double touched) {
    const auto i = static_cast<std::size_t>(r % sim_);
    const double work = seconds + touched * memory_of_[i];
    if (!pool_) return reserve(core(r), now, work);
    const double start = std::max(now, rank_free_[i]);
    const int home = core_of_[i];
    const int first = home - home % net_.cores_per_node;  // the node's cores, from its first
    sim_port* best = &cpu_[static_cast<std::size_t>(home)];
    for (int c = first; c < first + net_.cores_per_node; ++c) {
      sim_port& p = cpu_[static_cast<std::size_t>(c)];
      if (std::max(start, p.free_at) < std::max(start, best->free_at)) best = &p;
    }
    return rank_free_[i] = reserve(*best, start, work);
  }

  /// Whether a slice of `bytes` from `from` to `to` is read in place by the receiver.
  bool pulled(int from, int to, std::uint64_t bytes) const {
    return net_.intra_pulls && prog(from).expose && bytes >= net_.pull_min_bytes && same_node(from, to);
  }

  /// Sends one slice now. Returns when the sender is done with it (its window slot frees)
  /// and the arrival the receiver sees; the receiver's own work happens when it takes it. A
  /// slice read in place is done only when its receiver has read it (see serve_peer).
  std::pair<double, arrival> transfer(int from, int to, double now, std::uint64_t bytes) {
    const auto b = static_cast<double>(bytes);
    const int nf = net_.node_of[static_cast<std::size_t>(from)];
    const int nt = net_.node_of[static_cast<std::size_t>(to)];
    const bool inside = nf == nt;
    sim_port& tx = nic_tx_[static_cast<std::size_t>(nf % port_nodes_)];
    sim_port& rx = nic_rx_[static_cast<std::size_t>(nt % port_nodes_)];
    if (pulled(from, to, bytes)) {
      const double posted = busy(from, now, net_.pull.overhead_s, 0);
      return {posted, arrival{posted + net_.pull.latency_s, posted + net_.pull.latency_s, bytes}};
    }
    const link_cost& c = inside ? net_.intra : net_.inter;
    const double flight = c.latency_s + c.small_extra(b);
    if (inside || net_.inter_on_cpu) {
      // The sender's core copies the slice out; the receiver's copies it in when it takes it.
      const double sent = busy(from, now, c.overhead_s + b * c.send_s_per_byte, b);
      return {sent, arrival{sent - b * c.send_s_per_byte + flight, sent + flight, bytes}};
    }
    // The sender's core posts it; then through the NICs (and the leaf switches of a fat tree),
    // cut through: the slice occupies every port on its path at once and finishes no earlier
    // than its slowest.
    const double posted = busy(from, now, c.overhead_s, 0);
    double start = std::max(posted, tx.free_at);
    double end = start + b * c.send_s_per_byte;
    tx.free_at = end;
    const double sent = end;
    auto hop = [&](sim_port& p, double s_per_byte) {
      const double s0 = std::max(start, p.free_at);
      const double e = std::max(s0 + b * s_per_byte, end);
      p.free_at = e;
      start = s0;
      end = e;
    };
    if (net_.nodes_per_leaf > 0) {
      const int lf = nf / net_.nodes_per_leaf;
      const int lt = nt / net_.nodes_per_leaf;
      if (lf != lt) {
        // A leaf's uplinks carry nodes_per_leaf NICs' worth of traffic / oversubscription.
        const double up = c.send_s_per_byte * net_.oversubscription / net_.nodes_per_leaf;
        hop(up_[static_cast<std::size_t>(lf)], up);
        hop(down_[static_cast<std::size_t>(lt)], up);
      }
    }
    hop(rx, c.recv_s_per_byte);
    return {sent, arrival{end + flight, end + flight, bytes}};
  }

  /// What taking an arrived slice costs the receiver's core: its per-message overhead, the
  /// copy in (links through the cores) and the reduction; and the bytes of the ranks' buffers
  /// that takes, a byte written counting twice (sim_network::memory_s_per_byte): the copy
  /// writes them and a reduction reads the receiver's own. Read in place, the reader also
  /// reads the sender's, but the pull's cost per byte was timed out of buffers beyond the
  /// caches (tuner/detail/probe.hpp) and so holds what those reads miss: not charged again,
  /// 4 of 5 sweeps replayed put 1-5 more rows within 25% (bench/README.md).
  std::pair<double, double> receive_work(int from, int to, std::uint64_t bytes, bool reducing) const {
    const bool inside = same_node(from, to);
    const bool pull = pulled(from, to, bytes);
    const link_cost& c = pull ? net_.pull : inside ? net_.intra : net_.inter;
    const bool copies = inside || net_.inter_on_cpu;
    const double copy = copies ? c.recv_s_per_byte : 0.0;
    const auto b = static_cast<double>(bytes);
    return {c.overhead_s + b * (copy + (reducing ? net_.reduce_s_per_byte : 0.0)),
            b * ((copies ? 2 : 0) + (reducing ? 1 : 0))};
  }

  /// Whether the slice of `bytes` that rank `to` takes from `from` next is lent in place
  /// (sim_network::intra_pulls): its frame's bytes in the ring, else 0. Moves the ring on.
  std::uint64_t lends(peer_rt& ps, int from, int to, std::uint64_t bytes, bool reducing,
                      double now) {
    if (!net_.intra_pulls || !same_node(from, to)) return 0;
    constexpr std::uint64_t prefix = 48, line = 64;  // shm_prefix_bytes, shm_line
    if (pulled(from, to, bytes)) {
      ps.ring_at += line;  // the frame naming the sender's buffer
      return 0;
    }
    const std::uint64_t ring = 4 * static_cast<std::uint64_t>(net_.exec.max_slice_bytes);
    const std::uint64_t frame = (prefix + bytes + line - 1) / line * line;
    const std::uint64_t at = (ps.ring_at + prefix) % ring;  // where the payload starts
    ps.ring_at += frame;
    std::erase_if(ps.lent, [&](const peer_rt::lent_frame& l) { return l.until <= now; });
    std::uint64_t held = 0;
    for (const auto& l : ps.lent) held += l.bytes;
    const bool fits = at + bytes <= ring && held + frame <= ring / 2;
    return reducing && bytes > 0 && fits ? frame : 0;
  }

  void discover(int r, rank_state& rs) {
    const std::uint64_t total = prog(r).steps;
    while (rs.frontier < total && rs.frontier - rs.base < lookahead_) {
      step_rt s;
      s.st = &rs.cur->get();
      rs.cur->next();
      const std::uint64_t i = rs.frontier++;
      rs.live.push_back(s);
      if (s.st->send_peer >= 0) rs.peers[s.st->send_peer].sends.push_back(i);
      if (s.st->action == recv_action::copy) {
        rs.copies.push_back(i);
      } else if (s.st->action != recv_action::none) {
        rs.peers[s.st->recv_peer].recvs.push_back(i);
      }
    }
  }

  static bool complete(const step_rt& s) {
    return s.send_done == s.st->send_slices() && s.recv_done == s.st->recv_slices();
  }

  void advance(int r) {
    rank_state& rs = ranks_[static_cast<std::size_t>(r)];
    const double now = rs.now;
    for (bool moved = true; moved;) {
      moved = false;
      while (!rs.live.empty() && complete(rs.live.front())) {
        rs.live.pop_front();
        ++rs.base;
        moved = true;
      }
      discover(r, rs);
      // Local copies, in order, once every hazard is wholly clear.
      while (!rs.copies.empty()) {
        const std::uint64_t i = rs.copies.front();
        step_rt& s = *live_step(rs, i);
        if (s.copied) {
          rs.copies.pop_front();
          continue;
        }
        if (!clear(rs, i, s, access_role::write, whole) || !clear(rs, i, s, access_role::local, whole)) break;
        s.copied = true;
        const auto b = static_cast<double>(s.st->recv_bytes);
        const double end = busy(r, now, b * net_.copy_s_per_byte, 3 * b);  // read, written
        push({end, r, event_kind::applied, -1, i});
        rs.copies.pop_front();
        moved = true;
      }
      // Peers in schedule order (the earliest step each has waiting, then distance), as
      // the executor takes its steps, not in the order they became busy: which of two peers
      // is served first (a send posted before a receive is taken, or after) must not depend
      // on which rank the engine happened to visit first at one simulated time.
      const auto sooner = [](const peer_rt& a, const peer_rt& b) {
        return std::pair(a.first_step(), a.rel) < std::pair(b.first_step(), b.rel);
      };
      if (!std::is_sorted(rs.peers.v.begin(), rs.peers.v.end(), sooner)) {
        std::sort(rs.peers.v.begin(), rs.peers.v.end(), sooner);
      }
      // serve_peer may add peers to lists (folded, ours too): indices, not iterators.
      for (std::size_t j = 0; j < rs.peers.v.size(); ++j) {
        moved = serve_peer(r, rs, rs.peers.v[j], now) || moved;
      }
    }
    rs.peers.drop_idle();
  }


  bool serve_peer(int r, rank_state& rs, peer_rt& ps, double now) {
    bool moved = false;
    const int peer = peer_at(r, ps.rel);    // the real rank
    const int sim_peer = peer % sim_;       // the rank that simulates it
    const int back = (net_.size() - ps.rel) % net_.size();  // our distance from the peer
    // Sends: the first step with slices left, while the window has room and data is ready.
    const std::size_t window = prog(r).expose
                                   ? std::max(net_.exec.window, executor::exposed_window)
                                   : net_.exec.window;
    while (!ps.sends.empty() && ps.in_flight < window) {
      const std::uint64_t i = ps.sends.front();
      step_rt* sp = live_step(rs, i);
      if (sp == nullptr || sp->send_posted == sp->st->send_slices()) {
        ps.sends.pop_front();
        continue;
      }
      step_rt& s = *sp;
      const std::uint64_t k = s.send_posted;
      if (!clear(rs, i, s, access_role::send, k)) break;
      const std::uint64_t first = k * s.st->unit;
      const std::uint64_t len = first >= s.st->send_bytes ? 0 : std::min(s.st->unit, s.st->send_bytes - first);
      auto [sent, a] = transfer(r, peer, now, len);
      ++s.send_posted;
      ++ps.in_flight;
      if (pulled(r, peer, len)) {
        a.pulled_step = i;  // its receiver completes it
      } else {
        push({sent, r, event_kind::sent, ps.rel, i});
      }
      ranks_[static_cast<std::size_t>(sim_peer)].peers[back].arrived.push_back(a);
      wake(sim_peer, a.at);
      moved = true;
    }
    // Receives: match arrivals in order; a slice lands once its hazards are clear.
    while (!ps.recvs.empty() && !ps.arrived.empty() && ps.arrived.front().at <= now) {
      const std::uint64_t i = ps.recvs.front();
      step_rt* sp = live_step(rs, i);
      if (sp == nullptr || sp->recv_taken == sp->st->recv_slices()) {
        ps.recvs.pop_front();
        continue;
      }
      step_rt& s = *sp;
      const std::uint64_t k = s.recv_taken;
      const bool reducing = s.st->action == recv_action::reduce;
      if (!clear(rs, i, s, access_role::write, k)) break;
      if (reducing && !clear(rs, i, s, access_role::local, k)) break;
      const arrival a = ps.arrived.front();
      ps.arrived.pop_front();
      ++s.recv_taken;
      auto [work, touched] = receive_work(peer, r, a.bytes, reducing);
      double start = now;
      const std::uint64_t lent = lends(ps, peer, r, a.bytes, reducing, now);
      if (lent > 0) {
        // Reduced in the ring once the whole payload is there. It touches as many bytes of
        // the ranks' buffers as a copied one: the receiver's own read, the result written.
        work = net_.intra.overhead_s + static_cast<double>(a.bytes) * net_.reduce_s_per_byte;
        start = std::max(now, a.sent);
      }
      const double end = std::max(work > 0 ? busy(r, start, work, touched) : start, a.sent);
      if (lent > 0) ps.lent.push_back({end, lent});
      push({end, r, event_kind::applied, ps.rel, i});
      if (a.pulled_step != none) push({end, sim_peer, event_kind::sent, back, a.pulled_step});
      moved = true;
    }
    return moved;
  }

  const sim_network& net_;
  std::vector<sim_program> progs_;
  std::vector<std::uint32_t> prog_of_;
  const sim_program& prog(int r) const { return progs_[prog_of_[static_cast<std::size_t>(r % sim_)]]; }
  /// The rank a step's peer (counted from r) is.
  int peer_at(int r, int rel) const { return (r + rel) % net_.size(); }
  bool same_node(int a, int b) const {
    return net_.node_of[static_cast<std::size_t>(a)] == net_.node_of[static_cast<std::size_t>(b)];
  }
  int sim_;  // ranks simulated: the first sim_ of the network's
  // Nodes that have ports here (those of the simulated ranks): a folded simulation's other
  // nodes use the ports of the node they mirror.
  int port_nodes_ = 1;
  std::vector<rank_state> ranks_;
  sim_port& core(int rank) {
    return cpu_[static_cast<std::size_t>(core_of_[static_cast<std::size_t>(rank % sim_)])];
  }

  std::vector<int> core_of_;
  bool pool_ = false;               // the node's cores pooled (busy())
  std::vector<double> rank_free_;   // pooled: when each simulated rank's last work ends
  std::vector<sim_port> cpu_, nic_tx_, nic_rx_, up_, down_;
  std::vector<double> memory_of_;  // per simulated rank: its core's memory seconds per byte touched
  std::vector<event> events_;  // a heap (later)
  sim_result result_;
};

}  // namespace detail

/// The arguments of the collective to simulate (as build_schedule takes them, less the rank).
/// send_recv is sendrecv_perf's exchange: every rank sends `count` elements to rank + 1 and
/// receives as many from rank - 1 (mod P, so at 2 ranks they swap), and `root` is not used.
struct sim_call {
  collective kind = collective::all_reduce;
  algo algorithm = algo::ring;
  std::size_t count = 0;   ///< as schedule.hpp defines it per collective
  std::size_t elem_size = 4;
  int root = 0;
  bool in_place = false;
};

namespace detail {

/// Rank `topo.rank`'s schedule in `call`. A sendrecv is two operations of one run, the send
/// to rank + 1 and the receive from rank - 1, each one step; the executor progresses the jobs
/// of a run together, so the simulator runs their steps as one step that sends and receives.
inline schedule schedule_of(const topology& topo, const sim_call& call) {
  if (call.kind != collective::send_recv) {
    return build_schedule(topo, {.kind = call.kind,
                                 .algorithm = call.algorithm,
                                 .count = call.count,
                                 .root = rooted(call.kind) ? call.root : -1});
  }
  const int n = topo.size;
  if (n < 2) {
    throw error(errc::invalid_argument, "send_recv needs 2 or more ranks (a rank cannot send to itself)");
  }
  auto side = [&](int peer, bool sending) {
    return build_schedule(topo, {.kind = call.kind, .algorithm = call.algorithm, .count = call.count,
                                 .root = peer, .sending = sending});
  };
  schedule s = side((topo.rank + 1) % n, true);
  const schedule r = side((topo.rank + n - 1) % n, false);
  step& both = s.steps.front();
  const step& recv = r.steps.front();
  both.recv_peer = recv.recv_peer;
  both.action = recv.action;
  both.recv_into = recv.recv_into;
  return s;
}

/// The bytes of a rank's buffers in `call` on `n` ranks, input and output (one of them in
/// place), as a call checks them (buffer_sizes_of): a root's, where only a root has a buffer
/// of P blocks.
inline double footprint(const sim_call& call, int n) {
  if (call.kind == collective::send_recv) {  // the message out and the one in
    const double message = static_cast<double>(call.count) * static_cast<double>(call.elem_size);
    return call.in_place ? message : 2 * message;
  }
  const int root = rooted(call.kind) ? call.root : -1;
  const buffer_sizes e =
      buffer_sizes_of(op_desc::of(call.kind, nullptr, nullptr, call.count, dtype::uint8, reduce_op::sum,
                                  call.algorithm, root),
                      root, n);
  const auto bytes = [&](std::size_t elements) {
    return static_cast<double>(elements) * static_cast<double>(call.elem_size);
  };
  return call.in_place ? bytes(std::max(e.in, e.out)) : bytes(e.in) + bytes(e.out);
}

/// The ranks whose programs repeat, where the whole network is copies of them: one node, when
/// every node has the same number of ranks, in rank order, on one switch. The network's size
/// where nothing repeats. (Not a leaf of a fat tree: what crosses into a leaf's downlink from
/// other leaves would be served in another order than unfolded.)
inline int fold_unit(const sim_network& net) {
  const int n = net.size();
  if (net.nodes_per_leaf > 0) return n;
  int per_node = 0;
  while (per_node < n && net.node_of[static_cast<std::size_t>(per_node)] == 0) ++per_node;
  if (per_node == 0) return n;  // nodes not numbered from rank 0's
  for (int r = 0; r < n; ++r) {
    if (net.node_of[static_cast<std::size_t>(r)] != r / per_node) return n;
  }
  return n % per_node == 0 ? per_node : n;
}

/// The ranks beyond the first `unit` whose programs are compared with the rank they would be
/// folded onto: all of them up to 4,096 ranks. Above, where building every rank's program
/// would take longer than the simulation (16,384 hierarchical programs of 61,438 steps: an
/// hour), those of the second and last unit, of the ranks at and just below each power of
/// two (where recursive doubling, halving-doubling and the trees change shape), and 64
/// others spread at random.
inline std::vector<int> fold_checks(int n, int unit) {
  std::vector<int> v;
  if (n <= 4096) {
    for (int r = unit; r < n; ++r) v.push_back(r);
    return v;
  }
  for (int j = 0; j < unit; ++j) {
    v.push_back(unit + j);
    v.push_back(n - unit + j);
  }
  for (int p = 1; p < n; p = p > n / 2 ? n : 2 * p) {
    if (p >= unit) v.push_back(p);
    if (p - 1 >= unit) v.push_back(p - 1);
  }
  std::uint64_t x = 0x9e3779b97f4a7c15;
  for (int i = 0; i < 64; ++i) {
    x = x * 6364136223846793005 + 1442695040888963407;
    v.push_back(unit + static_cast<int>((x >> 33) % static_cast<std::uint64_t>(n - unit)));
  }
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
  return v;
}

/// Whether a node of `net` has more ranks than cores (sim_network::cores_per_node).
inline bool shares_cores(const sim_network& net) {
  if (net.cores_per_node <= 0) return false;
  std::vector<int> ranks_on;
  for (int v : net.node_of) {
    if (static_cast<std::size_t>(v) >= ranks_on.size()) ranks_on.resize(static_cast<std::size_t>(v) + 1, 0);
    if (++ranks_on[static_cast<std::size_t>(v)] > net.cores_per_node) return true;
  }
  return false;
}

}  // namespace detail

/// Simulates `call` on every rank of `net` and returns when the last rank finishes.
///
/// Folding (networks of more than net.fold_above ranks): programs count peers from the rank
/// that runs them, so where every node runs what the first runs, all nodes do the same thing
/// at the same simulated times, each with its own ports. Then only the first node's ranks are
/// simulated; a message to rank p is received by rank p mod unit, which plays p, on the link
/// and with the ports p's node would use (sim_engine). Whether they do is decided by
/// comparing programs (detail::fold_checks); the result says how many ranks were simulated
/// and compared.
///
/// **Example**:
///   chorus::sim_network net;
///   net.node_of = chorus::sim_network::nodes_of(1024, 8);   // 128 nodes of 8 ranks
///   net.intra = {1e-6, 1.0 / 100e9, 1.0 / 100e9};
///   net.inter = {5e-6, 1.0 / 25e9, 1.0 / 25e9};
///   net.inter_on_cpu = false;
///   double t = chorus::simulate(net, {.kind = chorus::collective::all_reduce,
///                                     .algorithm = chorus::algo::tree, .count = 1 << 24}).seconds;
inline sim_result simulate(const sim_network& net, const sim_call& call) {
  const int n = net.size();
  std::vector<std::string> ids;
  ids.reserve(static_cast<std::size_t>(n));
  for (int v : net.node_of) ids.push_back(std::to_string(v));
  topology topo = topology::from_ids(0, ids);
  // Ranks whose programs are equal (every rank of a ring; the same local rank of every node
  // when the pieces divide evenly) share one: at 16,384 ranks, kept per rank, the programs
  // alone would not fit in memory.
  std::vector<detail::sim_program> progs;
  constexpr std::uint32_t unbuilt = std::numeric_limits<std::uint32_t>::max();
  std::vector<std::uint32_t> program_of(static_cast<std::size_t>(n), unbuilt);
  std::unordered_map<std::size_t, std::vector<std::uint32_t>> alike;  // by hash
  auto add = [&](int r) {  // builds rank r's program, or finds an equal one
    topo.rank = r;
    const schedule s = detail::schedule_of(topo, call);
    detail::sim_program p = detail::make_program(s, call.count, call.elem_size, net.exec, call.in_place);
    p.expose = detail::exposes_sends(call.kind, call.algorithm);
    auto& same_hash = alike[detail::hash_of(p)];
    const auto found = std::find_if(same_hash.begin(), same_hash.end(),
                                    [&](std::uint32_t i) { return progs[i] == p; });
    if (found != same_hash.end()) {
      program_of[static_cast<std::size_t>(r)] = *found;
      return;
    }
    program_of[static_cast<std::size_t>(r)] = static_cast<std::uint32_t>(progs.size());
    same_hash.push_back(static_cast<std::uint32_t>(progs.size()));
    progs.push_back(std::move(p));
  };
  // Rooted collectives do not fold: the root's node is unlike the others, and the samples
  // of fold_checks could miss it. Nor do networks whose messages can take no time at all:
  // one sent and received at one simulated time depends on which rank acts first.
  const bool takes_time = net.intra.latency_s + net.intra.overhead_s > 0 &&
                          net.inter.latency_s + net.inter.overhead_s > 0 &&
                          (!net.intra_pulls || net.pull.latency_s + net.pull.overhead_s > 0);
  const int unit = n > net.fold_above && !rooted(call.kind) && takes_time ? detail::fold_unit(net) : n;
  for (int r = 0; r < unit; ++r) add(r);
  int simulated = unit, compared = 0;
  // Where a node receives from ranks of several other nodes at once, unfolded, those sending
  // at one simulated time take its NIC in rank order, and folded in another (an all_to_all
  // on a fat tree of 8 nodes of 8 ranks took 0.59 s unfolded and 0.35 folded). So it folds
  // only where each node receives from one other node (rings across nodes, hierarchical).
  if (unit < n) {
    std::vector<int> from;  // nodes received from, counted from the receiver's
    for (int r = 0; r < unit; ++r) {
      for (const detail::sim_step& st : progs[program_of[static_cast<std::size_t>(r)]].distinct) {
        if (st.action == recv_action::none || st.action == recv_action::copy || st.recv_peer < 0) continue;
        const int d = ((r + st.recv_peer) % n) / unit;
        if (d != 0 && std::find(from.begin(), from.end(), d) == from.end()) from.push_back(d);
      }
    }
    if (from.size() > 1) simulated = n;
  }
  // Programs compared are kept (equal ones share an index), so that a fold refused builds
  // none of them twice.
  if (simulated < n) {
    for (int r : detail::fold_checks(n, unit)) {
      ++compared;
      add(r);
      if (program_of[static_cast<std::size_t>(r)] != program_of[static_cast<std::size_t>(r % unit)]) {
        simulated = n;
        break;
      }
    }
  }
  if (simulated == n) {
    for (int r = unit; r < n; ++r) {
      if (program_of[static_cast<std::size_t>(r)] == unbuilt) add(r);
    }
  }
  program_of.resize(static_cast<std::size_t>(simulated));
  // Shared cores (sim_network::pool_after_s): the ranks dealt out to the cores, and the
  // cores pooled, blended by how long the pooled run takes.
  const bool blend = net.pool_after_s > 0 && detail::shares_cores(net);
  const double pooled = blend ? detail::sim_engine(net, progs, program_of, simulated, detail::footprint(call, n),
                                                   true).run().seconds
                              : 0.0;
  detail::sim_engine e(net, std::move(progs), std::move(program_of), simulated, detail::footprint(call, n));
  sim_result result = e.run();
  if (blend) {
    const double w = pooled / (pooled + net.pool_after_s);
    result.seconds = (1 - w) * result.seconds + w * pooled;
  }
  result.simulated = simulated;
  result.compared = compared;
  return result;
}

}  // namespace chorus
