// SPDX-License-Identifier: Apache-2.0
// chorus::communicator: a group of ranks and the collectives they run together.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <type_traits>

#include "chorus/bootstrap/env.hpp"
#include "chorus/bootstrap/store.hpp"
#include "chorus/bootstrap/topology.hpp"
#include "chorus/collectives.hpp"
#include "chorus/concepts.hpp"
#include "chorus/detail/heartbeat.hpp"
#include "chorus/executor/executor.hpp"
#include "chorus/tuner/tuner.hpp"
#include "chorus/types.hpp"

namespace chorus {

namespace detail {
class store_turns;  // bootstrap/detail/group_store.hpp
}

/// Options of a communicator. from_env() reads the CHORUS_* variables named per field.
struct communicator_options {
  /// CHORUS_TIMEOUT (seconds): the deadline of every operation. An operation that has not
  /// completed by then fails with errc::timeout naming the rank it waited for.
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
  /// CHORUS_BOOTSTRAP_TIMEOUT (seconds): rendezvous and connection set-up.
  std::chrono::milliseconds bootstrap_timeout{std::chrono::seconds(120)};
  /// CHORUS_ALGO: the algorithm of each collective where a call leaves it automatic (see
  /// parse_algo_table: "ring", or "allreduce:tree;allgather:bruck"); automatic entries are
  /// the tuner's to choose.
  algo_table algorithms{};
  /// How the tuner chooses (CHORUS_TUNER, CHORUS_TUNING_FILE; see tuner.hpp).
  tuner_options tuning{};
  /// CHORUS_SPIN_US: how long a wait polls before it sleeps, fixed. Unset: 0 when this node
  /// runs more ranks than it has cores (a spinning rank then steals a peer's core), else
  /// 50 µs growing to 1 ms after short waits that slept (executor_options::spin_max).
  std::optional<std::chrono::microseconds> spin;
  executor_options exec{};  ///< exec.spin is set from `spin` when the communicator starts
  /// CHORUS_HEARTBEAT_PERIOD, CHORUS_HEARTBEAT_TIMEOUT: how ranks notice a frozen or cut-off
  /// peer (a killed one is noticed at once from its closed connections or its pidfd).
  heartbeat_options heartbeat{};
  /// CHORUS_FLIGHT_RECORDER_SIZE: how many of the last operations the flight recorder keeps.
  std::size_t flight_entries = 256;
  /// CHORUS_FLIGHT_RECORDER_DIR: where each rank writes its flight record
  /// (chorus-flight-COMMUNICATOR-rankR.json) when an operation of this communicator first
  /// fails or times out; empty: nowhere (flight_record() still returns it).
  std::string flight_dir;

  static communicator_options from_env();
};

/// A communicator owns this rank's connections, a progress engine that completes
/// operations in issue order, and staging memory allocated once.
///
/// Every collective is a call every rank of the communicator makes, in the same order, with
/// matching arguments (count, dtype, op, root); a mismatch is errc::mismatch on the ranks
/// involved, never a hang. Buffers of an `_async` call must stay valid and untouched until
/// its request completes.
///
/// **Example**:
///   #include <chorus/chorus.hpp>
///   #include <chorus/transport/tcp.hpp>
///
///   auto comm = chorus::communicator::from_env<chorus::tcp_transport>();
///   std::vector<float> grads = compute_gradients();
///   comm.all_reduce(std::span(grads), {.op = chorus::avg});
class communicator {
 public:
  /// Creates the communicator of this process from its launcher's environment (chorus-run,
  /// torchrun, mpirun, srun; see launch_info_from_env) over transport T.
  template <class T>
  static communicator from_env(communicator_options opts = communicator_options::from_env());

  /// Joins a communicator given who we are, over a store we already have.
  template <class T>
  static communicator create(const launch_info& info, std::shared_ptr<store> st,
                             communicator_options opts = communicator_options::from_env());

  communicator(communicator&&) noexcept;
  communicator& operator=(communicator&&) noexcept;
  ~communicator();

  int rank() const noexcept;
  int size() const noexcept;
  /// This rank's position among the ranks of its node, and their number (from the
  /// discovered topology, which is what shared memory and the hierarchical algorithms use).
  int local_rank() const noexcept;
  int local_size() const noexcept;
  /// The node this rank is on, in [0, nodes()).
  int node() const noexcept;
  int nodes() const noexcept;
  /// Every rank's node; see chorus::topology.
  const chorus::topology& topo() const noexcept;
  std::string transport_name() const;
  /// One line on how data moves, e.g. "tcp conns 4 via 127.0.0.1, slice 512 KiB, window 8".
  std::string describe() const;
  /// The tuner of this communicator: its measured costs and the algorithm it picks.
  const chorus::tuner& tuner() const noexcept;

  // --- all_reduce: every rank ends with the element-wise reduction of all ranks' data ------

  template <class T>
  void all_reduce(std::span<T> data, all_reduce_options o = {}) {
    all_reduce(data.data(), data.data(), data.size(), dtype_of<T>, o);
  }
  template <class T>
  void all_reduce(std::span<const T> in, std::span<T> out, all_reduce_options o = {}) {
    check_sizes("all_reduce", in.size(), out.size(), 1);
    all_reduce(in.data(), out.data(), in.size(), dtype_of<T>, o);
  }
  template <class T>
  request all_reduce_async(std::span<T> data, all_reduce_options o = {}) {
    return all_reduce_async(data.data(), data.data(), data.size(), dtype_of<T>, o);
  }
  template <class T>
  request all_reduce_async(std::span<const T> in, std::span<T> out, all_reduce_options o = {}) {
    check_sizes("all_reduce", in.size(), out.size(), 1);
    return all_reduce_async(in.data(), out.data(), in.size(), dtype_of<T>, o);
  }

  // --- reduce_scatter: in holds size() blocks; rank r ends with block r reduced -----------

  template <class T>
  void reduce_scatter(std::span<const T> in, std::span<T> out, reduce_scatter_options o = {}) {
    check_sizes("reduce_scatter", out.size(), in.size(), size());
    reduce_scatter(in.data(), out.data(), out.size(), dtype_of<T>, o);
  }
  template <class T>
  request reduce_scatter_async(std::span<const T> in, std::span<T> out,
                               reduce_scatter_options o = {}) {
    check_sizes("reduce_scatter", out.size(), in.size(), size());
    return reduce_scatter_async(in.data(), out.data(), out.size(), dtype_of<T>, o);
  }

  // --- all_gather: out holds every rank's in, in rank order -------------------------------

  template <class T>
  void all_gather(std::span<const T> in, std::span<T> out, all_gather_options o = {}) {
    check_sizes("all_gather", in.size(), out.size(), size());
    all_gather(in.data(), out.data(), in.size(), dtype_of<T>, o);
  }
  template <class T>
  request all_gather_async(std::span<const T> in, std::span<T> out, all_gather_options o = {}) {
    check_sizes("all_gather", in.size(), out.size(), size());
    return all_gather_async(in.data(), out.data(), in.size(), dtype_of<T>, o);
  }

  // --- broadcast: every rank ends with root's data ----------------------------------------

  /// **Example**: `comm.broadcast(std::span(weights), 0);  // rank 0's weights everywhere`
  template <class T>
  void broadcast(std::span<T> data, int root, broadcast_options o = {}) {
    broadcast(data.data(), data.data(), data.size(), dtype_of<T>, root, o);
  }
  template <class T>
  request broadcast_async(std::span<T> data, int root, broadcast_options o = {}) {
    return broadcast_async(data.data(), data.data(), data.size(), dtype_of<T>, root, o);
  }

  // --- reduce: root ends with the reduction; the others' data is left as it was -----------

  /// `out` is used on `root` only (it may be empty elsewhere); in place when it is `in`.
  template <class T>
  void reduce(std::span<const T> in, std::span<T> out, int root, reduce_options o = {}) {
    if (rank() == root) check_sizes("reduce", in.size(), out.size(), 1);
    reduce(in.data(), rank() == root ? out.data() : nullptr, in.size(), dtype_of<T>, root, o);
  }
  template <class T>
  void reduce(std::span<T> data, int root, reduce_options o = {}) {
    reduce(data.data(), data.data(), data.size(), dtype_of<T>, root, o);
  }
  template <class T>
  request reduce_async(std::span<const T> in, std::span<T> out, int root, reduce_options o = {}) {
    if (rank() == root) check_sizes("reduce", in.size(), out.size(), 1);
    return reduce_async(in.data(), rank() == root ? out.data() : nullptr, in.size(), dtype_of<T>,
                        root, o);
  }

  // --- all_to_all: block j of in goes to rank j; block i of out comes from rank i ---------

  template <class T>
  void all_to_all(std::span<const T> in, std::span<T> out, all_to_all_options o = {}) {
    all_to_all(in.data(), out.data(), block_of("all_to_all", in.size(), out.size()), dtype_of<T>, o);
  }
  template <class T>
  request all_to_all_async(std::span<const T> in, std::span<T> out, all_to_all_options o = {}) {
    return all_to_all_async(in.data(), out.data(), block_of("all_to_all", in.size(), out.size()),
                            dtype_of<T>, o);
  }

  /// Blocks of different sizes: send_counts[j] elements of `in` (consecutive, in rank order)
  /// go to rank j, recv_counts[i] elements of `out` come from rank i; every rank's
  /// send_counts[j] must equal rank j's recv_counts[i] for i = this rank (errc::mismatch
  /// otherwise).
  template <class T>
  void all_to_allv(std::span<const T> in, std::span<const std::size_t> send_counts,
                   std::span<T> out, std::span<const std::size_t> recv_counts,
                   all_to_all_options o = {}) {
    check_counts(in.size(), send_counts, out.size(), recv_counts);
    all_to_allv(in.data(), send_counts, out.data(), recv_counts, dtype_of<T>, o);
  }
  template <class T>
  request all_to_allv_async(std::span<const T> in, std::span<const std::size_t> send_counts,
                            std::span<T> out, std::span<const std::size_t> recv_counts,
                            all_to_all_options o = {}) {
    check_counts(in.size(), send_counts, out.size(), recv_counts);
    return all_to_allv_async(in.data(), send_counts, out.data(), recv_counts, dtype_of<T>, o);
  }

  // --- gather / scatter: one block per rank, to or from root ------------------------------

  /// `out` (size() blocks of in.size()) is used on `root` only.
  template <class T>
  void gather(std::span<const T> in, std::span<T> out, int root, gather_options o = {}) {
    if (rank() == root) check_sizes("gather", in.size(), out.size(), size());
    gather(in.data(), rank() == root ? out.data() : nullptr, in.size(), dtype_of<T>, root, o);
  }
  template <class T>
  request gather_async(std::span<const T> in, std::span<T> out, int root, gather_options o = {}) {
    if (rank() == root) check_sizes("gather", in.size(), out.size(), size());
    return gather_async(in.data(), rank() == root ? out.data() : nullptr, in.size(), dtype_of<T>,
                        root, o);
  }
  /// `in` (size() blocks of out.size()) is used on `root` only.
  template <class T>
  void scatter(std::span<const T> in, std::span<T> out, int root, scatter_options o = {}) {
    if (rank() == root) check_sizes("scatter", out.size(), in.size(), size());
    scatter(rank() == root ? in.data() : nullptr, out.data(), out.size(), dtype_of<T>, root, o);
  }
  template <class T>
  request scatter_async(std::span<const T> in, std::span<T> out, int root, scatter_options o = {}) {
    if (rank() == root) check_sizes("scatter", out.size(), in.size(), size());
    return scatter_async(rank() == root ? in.data() : nullptr, out.data(), out.size(), dtype_of<T>,
                         root, o);
  }

  // --- point to point (pipeline parallelism) ----------------------------------------------

  /// Sends `data` to `peer`, which receives it with recv(). Between one pair of ranks,
  /// messages match in the order each side issues them, and the tags must agree. These are
  /// operations of this rank and its peer only; the other ranks do not call them.
  ///
  /// **Example** (stage s of a pipeline):
  ///   comm.recv(std::span(activations), s - 1);
  ///   forward(activations, out);
  ///   auto r = comm.send_async(std::span<const float>(out), s + 1);
  template <class T>
  void send(std::span<const T> data, int peer, p2p_options o = {}) {
    send(data.data(), data.size(), dtype_of<T>, peer, o);
  }
  template <class T>
  request send_async(std::span<const T> data, int peer, p2p_options o = {}) {
    return send_async(data.data(), data.size(), dtype_of<T>, peer, o);
  }
  template <class T>
  void recv(std::span<T> data, int peer, p2p_options o = {}) {
    recv(data.data(), data.size(), dtype_of<T>, peer, o);
  }
  template <class T>
  request recv_async(std::span<T> data, int peer, p2p_options o = {}) {
    return recv_async(data.data(), data.size(), dtype_of<T>, peer, o);
  }

  /// Sends `out` to `dest` while receiving `in` from `source` (MPI_Sendrecv): both progress
  /// at once, so a ring or halo exchange cannot deadlock however large the messages.
  ///
  /// **Example**: `comm.sendrecv(std::span<const float>(mine), right, std::span(theirs), left);`
  template <class T>
  void sendrecv(std::span<const T> out, int dest, std::span<T> in, int source, p2p_options o = {}) {
    sendrecv(out.data(), out.size(), dest, in.data(), in.size(), source, dtype_of<T>, o);
  }
  void sendrecv(const void* out, std::size_t send_count, int dest, void* in, std::size_t recv_count,
                int source, dtype t, p2p_options o = {});

  // --- groups: operations that progress together and complete together -------------------

  /// Between group_start() and group_end(), `_async` calls are collected instead of started
  /// (a blocking call there is errc::invalid_argument); group_end() starts them as one
  /// operation in which they all progress at once, and every request they returned, like
  /// the one group_end() returns, completes when all of them have. Inside a group the
  /// collectives run first, in issue order, then the sends and receives, so that two ranks
  /// that issued one collective and some point-to-point calls in different orders still
  /// match. One thread builds a group.
  ///
  /// **Example** (a ring exchange that cannot deadlock, however large the messages):
  ///   comm.group_start();
  ///   comm.send_async(std::span<const float>(mine), (comm.rank() + 1) % comm.size());
  ///   comm.recv_async(std::span(theirs), (comm.rank() + comm.size() - 1) % comm.size());
  ///   comm.group_end().wait();
  void group_start();
  request group_end();

  // --- failures ------------------------------------------------------------------------------

  /// Aborts this communicator, from any thread, at any time; idempotent. The operation in
  /// flight and every later one fail with errc::aborted on this rank, and the peers' pending
  /// operations with this communicator fail at once (errc::remote_error quoting `why`)
  /// instead of at their timeouts. Returns within about half a second (the transports' abort
  /// has that deadline) and never waits for the operation in flight.
  void abort(const std::string& why = "abort() was called");

  /// The ranks of this communicator known to have failed (dead, frozen, cut off, or reported
  /// so by a peer), in order, with the reason each is believed failed.
  std::map<int, std::string> failed_ranks() const;

  /// The flight recorder's JSON: this communicator's last operations (kind, count, dtype, op,
  /// root, algorithm), each with its state and times. Merge every rank's with
  /// tools/chorus-flight to find the first call they disagree on and who never reached it.
  std::string flight_record() const;

  /// Recovery after a failure (MPI's MPIX_Comm_shrink): every surviving rank calls it.
  /// shrink() first aborts this communicator, so that peers still waiting in it fail now and
  /// come to shrink() too. The survivors then agree, over the heartbeat, on one set of
  /// failed ranks (every rank leaves with the same set, or with an error); the first
  /// survivor in this communicator's order hosts a new rendezvous store (rank 0's may have
  /// died with it), and the survivors make a new communicator there with the same kind of
  /// transport, ranked in this communicator's order, with this one's options and measured
  /// costs. Errors: errc::peer_failed on a rank the others counted failed; errc::timeout
  /// naming the ranks that did not come within CHORUS_BOOTSTRAP_TIMEOUT. This communicator
  /// stays failed; destroy it when done.
  ///
  /// **Example**:
  ///   try { comm.all_reduce(std::span(grads)); }
  ///   catch (const chorus::error& e) {
  ///     if (e.code() != chorus::errc::peer_failed && e.code() != chorus::errc::connection_lost &&
  ///         e.code() != chorus::errc::remote_error) throw;
  ///     comm = comm.shrink();  // the survivors, renumbered 0..size()-1
  ///   }
  communicator shrink();

  /// The other way (MPI_Comm_connect/accept for a whole job): every rank of this
  /// communicator calls grow(joiners, host, port) and gets a communicator of size() +
  /// `joiners` ranks, keeping its rank; the joiners are new processes started with the
  /// launcher environment of ranks size() .. size() + joiners - 1 of that many
  /// (CHORUS_RANK, CHORUS_WORLD_SIZE, CHORUS_MASTER_ADDR = host, CHORUS_MASTER_PORT = port,
  /// the job's CHORUS_SECRET) and call from_env() as any rank does. Rank 0 hosts their store
  /// at host:port (an address of its own, a free port). This communicator is untouched.
  /// Errors: errc::invalid_argument for a negative count or port 0; errc::timeout naming
  /// the ranks that did not come within CHORUS_BOOTSTRAP_TIMEOUT.
  ///
  /// **Example** (after a shrink, one replacement; the launcher starts it with rank 3 of 4):
  ///   comm = comm.shrink();                            // 3 ranks
  ///   comm = comm.grow(1, "10.0.0.1", 29600);          // 4 ranks; the joiner is rank 3
  communicator grow(int joiners, const std::string& host, std::uint16_t port);

  // --- sub-communicators ------------------------------------------------------------------

  /// Splits this communicator as MPI_Comm_split does: every rank calls it; ranks passing the
  /// same `color` form a new communicator, ranked by (`key`, rank here). A negative color
  /// joins none (returns nothing). The new communicators have their own connections and
  /// progress engines, so they run concurrently with this one and with each other (the
  /// data, tensor and pipeline groups of 3D parallelism).
  ///
  /// **Example**: `auto tp = comm.split(comm.rank() / 4, comm.rank());  // groups of 4`
  std::optional<communicator> split(int color, int key);

  // --- type-erased forms (counts in elements) ---------------------------------------------

  void all_reduce(const void* in, void* out, std::size_t count, dtype t, all_reduce_options o = {});
  request all_reduce_async(const void* in, void* out, std::size_t count, dtype t,
                           all_reduce_options o = {});
  void reduce_scatter(const void* in, void* out, std::size_t recv_count, dtype t,
                      reduce_scatter_options o = {});
  request reduce_scatter_async(const void* in, void* out, std::size_t recv_count, dtype t,
                               reduce_scatter_options o = {});
  void all_gather(const void* in, void* out, std::size_t send_count, dtype t,
                  all_gather_options o = {});
  request all_gather_async(const void* in, void* out, std::size_t send_count, dtype t,
                           all_gather_options o = {});
  /// `in` is read on root only (it may be null elsewhere); in place when in == out.
  void broadcast(const void* in, void* out, std::size_t count, dtype t, int root,
                 broadcast_options o = {});
  request broadcast_async(const void* in, void* out, std::size_t count, dtype t, int root,
                          broadcast_options o = {});
  /// `out` is written on root only (it may be null elsewhere).
  void reduce(const void* in, void* out, std::size_t count, dtype t, int root,
              reduce_options o = {});
  request reduce_async(const void* in, void* out, std::size_t count, dtype t, int root,
                       reduce_options o = {});
  /// `in` and `out` hold size() blocks of `block` elements.
  void all_to_all(const void* in, void* out, std::size_t block, dtype t, all_to_all_options o = {});
  request all_to_all_async(const void* in, void* out, std::size_t block, dtype t,
                           all_to_all_options o = {});
  void all_to_allv(const void* in, std::span<const std::size_t> send_counts, void* out,
                   std::span<const std::size_t> recv_counts, dtype t, all_to_all_options o = {});
  request all_to_allv_async(const void* in, std::span<const std::size_t> send_counts, void* out,
                            std::span<const std::size_t> recv_counts, dtype t,
                            all_to_all_options o = {});
  void gather(const void* in, void* out, std::size_t block, dtype t, int root,
              gather_options o = {});
  request gather_async(const void* in, void* out, std::size_t block, dtype t, int root,
                       gather_options o = {});
  void scatter(const void* in, void* out, std::size_t block, dtype t, int root,
               scatter_options o = {});
  request scatter_async(const void* in, void* out, std::size_t block, dtype t, int root,
                        scatter_options o = {});
  void send(const void* data, std::size_t count, dtype t, int peer, p2p_options o = {});
  request send_async(const void* data, std::size_t count, dtype t, int peer, p2p_options o = {});
  void recv(void* data, std::size_t count, dtype t, int peer, p2p_options o = {});
  request recv_async(void* data, std::size_t count, dtype t, int peer, p2p_options o = {});

  /// Returns once every rank has called barrier().
  void barrier();
  request barrier_async();

  struct impl;

 private:
  /// Makes a communicator over the transport its factory connects (split() makes children
  /// with the parent's factory, so they use the same kind of transport).
  using transport_factory =
      std::function<std::unique_ptr<detail::any_transport>(store&, const launch_info&, const topology&)>;

  explicit communicator(std::unique_ptr<impl> p);
  /// `root` is the job's store and `lock` serialises its users; `prefix` names this
  /// communicator's keys there (split() children; the job's own communicator: "").
  /// `beat` is the job's heartbeat (null: the job's own communicator starts it) and
  /// `job_ranks` the job rank of each rank here (empty: the identity).
  static communicator make(const launch_info& info, std::shared_ptr<store> st,
                           transport_factory factory, communicator_options opts,
                           std::shared_ptr<store> root, std::shared_ptr<detail::store_turns> lock,
                           std::string prefix, std::shared_ptr<detail::heartbeat> beat = nullptr,
                           std::vector<int> job_ranks = {}, const cost_model* costs = nullptr);
  /// make() for a communicator that is a job of its own on `st` (its root store, with a
  /// lock of its own): create(), grow() and shrink(). `costs`, where given, are used unprobed.
  static communicator own_job(const launch_info& info, std::shared_ptr<store> st, transport_factory factory,
                              const communicator_options& opts, const cost_model* costs = nullptr);
  static void check_sizes(const char* call, std::size_t small, std::size_t big, int factor);
  std::size_t block_of(const char* call, std::size_t in, std::size_t out) const;
  void check_counts(std::size_t in, std::span<const std::size_t> send_counts, std::size_t out,
                    std::span<const std::size_t> recv_counts) const;

  std::unique_ptr<impl> p_;
};

template <class T>
communicator communicator::create(const launch_info& info, std::shared_ptr<store> st,
                                  communicator_options opts) {
  static_assert(transport<T>, "chorus: T does not satisfy chorus::transport (see concepts.hpp)");
  transport_factory factory = [](store& s, const launch_info& i,
                                 const topology& topo) -> std::unique_ptr<detail::any_transport> {
    if constexpr (requires { T::connect(s, i, topo); }) {
      return std::make_unique<detail::transport_model<T>>(T::connect(s, i, topo));
    } else {
      return std::make_unique<detail::transport_model<T>>(T::connect(s, i));
    }
  };
  return own_job(info, std::move(st), std::move(factory), opts);
}

template <class T>
communicator communicator::from_env(communicator_options opts) {
  const launch_info info = launch_info_from_env();
  store_options so;
  so.timeout = opts.bootstrap_timeout;
  auto st = std::make_shared<tcp_store>(tcp_store::connect(info, so));
  return create<T>(info, std::move(st), opts);
}

}  // namespace chorus

#include "chorus/detail/communicator_impl.hpp"
