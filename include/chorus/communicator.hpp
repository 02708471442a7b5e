// SPDX-License-Identifier: Apache-2.0
// chorus::communicator: a group of ranks and the collectives they run together.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>

#include "chorus/bootstrap/env.hpp"
#include "chorus/bootstrap/store.hpp"
#include "chorus/bootstrap/topology.hpp"
#include "chorus/collectives.hpp"
#include "chorus/concepts.hpp"
#include "chorus/executor/executor.hpp"
#include "chorus/types.hpp"

namespace chorus {

/// Options of a communicator. from_env() reads the CHORUS_* variables named per field.
struct communicator_options {
  /// CHORUS_TIMEOUT (seconds): the deadline of every operation. An operation that has not
  /// completed by then fails with errc::timeout naming the rank it waited for.
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
  /// CHORUS_BOOTSTRAP_TIMEOUT (seconds): rendezvous and connection set-up.
  std::chrono::milliseconds bootstrap_timeout{std::chrono::seconds(120)};
  /// CHORUS_ALGO: "auto", "ring", "rd" (all_reduce only; the others then use ring) or
  /// "hierarchical"; applies where a call leaves algorithm automatic. Automatic: all_reduce
  /// uses rd up to rd_max_bytes; beyond that, and for the other collectives, hierarchical when
  /// the job has several nodes of several ranks, else ring.
  algo algorithm = algo::automatic;
  /// CHORUS_RD_MAX_BYTES: automatic all_reduce uses recursive doubling up to this size.
  std::size_t rd_max_bytes = 32 * 1024;
  /// CHORUS_SPIN_US: how long a wait polls before it sleeps. Unset: 50 µs, or 0 when this
  /// node runs more ranks than it has cores (a spinning rank then steals a peer's core).
  std::optional<std::chrono::microseconds> spin;
  executor_options exec{};  ///< exec.spin is set from `spin` when the communicator starts

  static communicator_options from_env();
};

/// A communicator owns this rank's connections, a progress engine that completes
/// operations in issue order, and staging memory allocated once.
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
  static communicator create(const launch_info& info, std::shared_ptr<tcp_store> store,
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

  /// Returns once every rank has called barrier().
  void barrier();

  struct impl;

 private:
  explicit communicator(std::unique_ptr<impl> p);
  static communicator make(const launch_info& info, topology topo,
                           std::shared_ptr<tcp_store> store,
                           std::unique_ptr<detail::any_transport> t, communicator_options opts);
  static void check_sizes(const char* call, std::size_t small, std::size_t big, int factor);

  std::unique_ptr<impl> p_;
};

template <class T>
communicator communicator::create(const launch_info& info, std::shared_ptr<tcp_store> store,
                                  communicator_options opts) {
  static_assert(transport<T>, "chorus: T does not satisfy chorus::transport (see concepts.hpp)");
  topology topo = discover_topology(*store, info);
  std::unique_ptr<detail::any_transport> t;
  if constexpr (requires { T::connect(*store, info, topo); }) {
    t = std::make_unique<detail::transport_model<T>>(T::connect(*store, info, topo));
  } else {
    t = std::make_unique<detail::transport_model<T>>(T::connect(*store, info));
  }
  return make(info, std::move(topo), std::move(store), std::move(t), opts);
}

template <class T>
communicator communicator::from_env(communicator_options opts) {
  const launch_info info = launch_info_from_env();
  store_options so;
  so.timeout = opts.bootstrap_timeout;
  auto store = std::make_shared<tcp_store>(tcp_store::connect(info, so));
  return create<T>(info, std::move(store), opts);
}

}  // namespace chorus

#include "chorus/detail/communicator_impl.hpp"
