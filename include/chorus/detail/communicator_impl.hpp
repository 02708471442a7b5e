// SPDX-License-Identifier: Apache-2.0
// The machinery behind chorus::communicator: validation, algorithm choice, progress engine.
#pragma once

#include <array>
#include <cstdlib>
#include <optional>
#include <cstring>
#include <deque>
#include <limits>
#include <thread>
#include <utility>

#include "chorus/communicator.hpp"
#include "chorus/reduce/reduce.hpp"
#include "chorus/schedule/build.hpp"

namespace chorus {

inline communicator_options communicator_options::from_env() {
  communicator_options o;
  o.timeout = env_seconds("CHORUS_TIMEOUT", o.timeout);
  o.bootstrap_timeout = env_seconds("CHORUS_BOOTSTRAP_TIMEOUT", o.bootstrap_timeout);
  if (const char* a = std::getenv("CHORUS_ALGO"); a != nullptr && *a != '\0') {
    const auto parsed = parse_algo(a);
    if (!parsed) {
      throw error(errc::invalid_argument, std::string("CHORUS_ALGO='") + a +
                                              "' is not an algorithm (use auto, ring, rd or hierarchical)");
    }
    o.algorithm = *parsed;
  }
  o.rd_max_bytes = static_cast<std::size_t>(
      env_int("CHORUS_RD_MAX_BYTES", static_cast<int>(o.rd_max_bytes), 0, 1 << 30));
  o.exec.slice_bytes = static_cast<std::size_t>(
      env_int("CHORUS_SLICE_BYTES", static_cast<int>(o.exec.slice_bytes), 4096, 64 << 20));
  o.exec.window = static_cast<std::size_t>(
      env_int("CHORUS_SLICES_IN_FLIGHT", static_cast<int>(o.exec.window), 1, 64));
  if (const char* v = std::getenv("CHORUS_SPIN_US"); v != nullptr && *v != '\0') {
    o.spin = std::chrono::microseconds(parse_env_int("CHORUS_SPIN_US", v, 0, 10000000));
  }
  return o;
}

namespace detail {

/// One collective call, type-erased, as the progress engine queues it.
struct op_desc {
  collective kind = collective::all_reduce;
  const void* in = nullptr;
  void* out = nullptr;
  std::size_t count = 0;  // all_reduce: elements; reduce_scatter: per-rank block; all_gather: per rank
  dtype type = dtype::float32;
  reduce_op op = reduce_op::sum;
  algo algorithm = algo::automatic;
  std::uint64_t seq = 0;
  std::shared_ptr<op_state> state = nullptr;  ///< made for queued operations only (see submit)
};

}  // namespace detail

struct communicator::impl {
  launch_info info;
  topology topo;
  std::shared_ptr<tcp_store> store;
  std::unique_ptr<detail::any_transport> transport;
  communicator_options opts;
  executor exec;

  // Progress engine. Lock order: m, then nothing (execution happens outside m).
  std::mutex m;
  std::condition_variable cv;
  std::deque<detail::op_desc> queue;
  bool busy = false;  // an operation is executing (inline or on the worker)
  bool stopping = false;
  std::uint64_t next_seq = 0;
  std::thread worker;
  std::exception_ptr broken;  // the first failure: later operations fail with it

  impl(const launch_info& i, topology tp, std::shared_ptr<tcp_store> s,
       std::unique_ptr<detail::any_transport> t, communicator_options o)
      : info(i),
        topo(std::move(tp)),
        store(std::move(s)),
        transport(std::move(t)),
        opts(resolve(o, std::max(i.local_size, topo.local_size()))),
        exec(*transport, opts.exec) {}

  static communicator_options resolve(communicator_options o, int ranks_here) {
    const auto cores = std::max(1u, std::thread::hardware_concurrency());
    o.exec.spin = o.spin ? *o.spin
                         : (static_cast<unsigned>(ranks_here) > cores ? std::chrono::microseconds(0)
                                                                        : o.exec.spin);
    return o;
  }

  ~impl() {
    {
      std::lock_guard lk(m);
      stopping = true;
    }
    cv.notify_all();
    if (worker.joinable()) worker.join();
  }

  /// Runs one operation; returns its failure, if any. The first failure breaks the
  /// communicator: later operations fail with it, and the peers are told at once.
  std::exception_ptr execute(detail::op_desc& d) noexcept {
    std::exception_ptr eptr;
    std::string why;
    try {
      if (broken) std::rethrow_exception(broken);
      run(d);
      return nullptr;
    } catch (const std::exception& e) {
      // chorus::error, and std::bad_alloc and the like: this rank cannot go on, so neither
      // can its peers.
      eptr = std::current_exception();
      why = e.what();
    } catch (...) {
      eptr = std::current_exception();
      why = "unknown exception";
    }
    if (!broken) {
      broken = eptr;
      transport->abort(why);  // let the peers fail now rather than at their timeouts
    }
    return eptr;
  }

  /// Schedules are pure functions of (kind, algorithm, count) for a communicator, and
  /// training loops repeat the same few calls: keep the last few instead of rebuilding.
  struct cached_schedule {
    collective kind;
    algo algorithm;
    std::size_t count;
    schedule s;
  };
  std::array<std::optional<cached_schedule>, 4> schedules;
  std::size_t next_schedule = 0;

  const schedule& schedule_for(const detail::op_desc& d) {
    for (const auto& c : schedules) {
      if (c && c->kind == d.kind && c->algorithm == d.algorithm && c->count == d.count) return c->s;
    }
    schedule s = build_schedule(topo, {.kind = d.kind, .algorithm = d.algorithm, .count = d.count});
    auto& slot = schedules[next_schedule++ % schedules.size()];
    slot = cached_schedule{d.kind, d.algorithm, d.count, std::move(s)};
    return slot->s;
  }

  void run(const detail::op_desc& d) {
    const int n = info.size;
    const std::size_t es = size_of(d.type);
    const auto nn = static_cast<std::size_t>(n);
    const schedule& s = schedule_for(d);
    op_buffers b;
    b.input = static_cast<const std::byte*>(d.in);
    b.output = static_cast<std::byte*>(d.out);
    b.elem_size = es;
    b.reduce = reduce_function(d.type, d.op);
    switch (d.kind) {
      case collective::all_reduce:
        b.input_bytes = b.output_bytes = d.count * es;
        break;
      case collective::reduce_scatter:
        b.input_bytes = d.count * nn * es;
        b.output_bytes = d.count * es;
        break;
      case collective::all_gather:
        b.input_bytes = d.count * es;
        b.output_bytes = d.count * nn * es;
        break;
      default:
        throw error(errc::invalid_argument, std::string(to_string(d.kind)) + " is not available yet");
    }
    const detail::op_fingerprint fp{d.seq, d.count, d.kind, d.type, d.op, s.algorithm};
    exec.run(s, fp, b, clock::now() + opts.timeout, opts.timeout);
    if (d.op == reduce_op::avg && d.kind != collective::all_gather) {
      divide_by(d.type, d.out, d.count, nn);
    }
  }

  algo choose(const detail::op_desc& d) const {
    algo a = d.algorithm != algo::automatic ? d.algorithm : opts.algorithm;
    // Several nodes of several ranks: keep most bytes inside the nodes (hierarchical.hpp).
    const bool layered = topo.nodes() > 1 && topo.nodes() < topo.size;
    if (d.kind != collective::all_reduce) {
      if (a == algo::recursive_doubling) {
        // CHORUS_ALGO applies where it can; only an explicit per-call choice is an error.
        if (d.algorithm == algo::automatic) return algo::ring;
        throw error(errc::invalid_argument,
                    std::string(to_string(d.kind)) + ": recursive_doubling is only available for all_reduce");
      }
      if (a == algo::automatic) a = layered ? algo::hierarchical : algo::ring;
      return a;
    }
    if (a == algo::automatic) {
      a = d.count * size_of(d.type) <= opts.rd_max_bytes ? algo::recursive_doubling
          : layered                                      ? algo::hierarchical
                                                         : algo::ring;
    }
    return a;
  }

  void validate(const char* call, const detail::op_desc& d) const {
    auto bad = [&](const std::string& what) {
      throw error(errc::invalid_argument, std::string(call) + ": " + what, {info.rank}, std::nullopt, call);
    };
    if (!is_valid(d.type)) bad("dtype " + std::to_string(static_cast<int>(d.type)) + " is not a chorus::dtype");
    if (!is_valid(d.op)) bad("op " + std::to_string(static_cast<int>(d.op)) + " is not a chorus::reduce_op");
    if (d.op == reduce_op::avg && !is_floating(d.type)) {
      bad("avg is defined for floating types only, not " + std::string(to_string(d.type)) +
          " (an integer average would truncate; use sum and divide)");
    }
    const std::size_t es = size_of(d.type);
    const auto nn = static_cast<std::size_t>(info.size);
    const std::size_t limit = std::numeric_limits<std::size_t>::max() / es / nn;
    if (d.count > limit) bad("count " + std::to_string(d.count) + " overflows the buffer size");
    if (d.count > 0 && (d.in == nullptr || d.out == nullptr)) {
      bad(std::string(d.in == nullptr ? "input" : "output") + " is null but count is " +
          std::to_string(d.count));
    }
    // Buffers may be identical (in place) or disjoint; a partial overlap would corrupt data.
    const std::size_t in_bytes = d.count * es * (d.kind == collective::reduce_scatter ? nn : 1);
    const std::size_t out_bytes = d.count * es * (d.kind == collective::all_gather ? nn : 1);
    const auto in = reinterpret_cast<std::uintptr_t>(d.in);
    const auto out = reinterpret_cast<std::uintptr_t>(d.out);
    const bool overlap = in < out + out_bytes && out < in + in_bytes;
    const std::uintptr_t own = d.count * es * static_cast<std::size_t>(info.rank);
    // In place means NCCL's forms: all_reduce in == out; all_gather in == out + rank * count;
    // reduce_scatter out == in + rank * count. Anything else that overlaps is refused.
    const bool in_place = (d.kind == collective::all_reduce && in == out) ||
                          (d.kind == collective::all_gather && in == out + own) ||
                          (d.kind == collective::reduce_scatter && out == in + own);
    if (d.count > 0 && overlap && !in_place) {
      bad("input and output overlap without being in place");
    }
  }

  request submit(const char* call, detail::op_desc d, bool async) {
    validate(call, d);
    d.algorithm = choose(d);
    std::unique_lock lk(m);
    d.seq = next_seq++;
    if (!async && queue.empty() && !busy) {
      // Nothing queued: run on the caller's thread, saving two thread hand-offs (~10 µs on
      // this machine, as much as a whole small all_reduce) and the request's state.
      busy = true;
      lk.unlock();
      const std::exception_ptr failure = execute(d);
      lk.lock();
      busy = false;
      if (!queue.empty()) cv.notify_all();
      lk.unlock();
      if (failure) std::rethrow_exception(failure);
      return request();
    }
    d.state = std::make_shared<detail::op_state>();
    auto state = d.state;
    queue.push_back(std::move(d));
    if (!worker.joinable()) worker = std::thread([this] { work(); });
    lk.unlock();
    cv.notify_all();
    request req(state);
    if (!async) req.wait();
    return req;
  }

  void work() {
    std::unique_lock lk(m);
    for (;;) {
      cv.wait(lk, [&] { return (!queue.empty() && !busy) || (stopping && queue.empty()); });
      if (queue.empty()) return;
      detail::op_desc d = std::move(queue.front());
      queue.pop_front();
      busy = true;
      lk.unlock();
      d.state->finish(execute(d));
      lk.lock();
      busy = false;
      cv.notify_all();
    }
  }
};

inline communicator::communicator(std::unique_ptr<impl> p) : p_(std::move(p)) {}
inline communicator::communicator(communicator&&) noexcept = default;
inline communicator& communicator::operator=(communicator&&) noexcept = default;
inline communicator::~communicator() = default;

inline communicator communicator::make(const launch_info& info, topology topo,
                                       std::shared_ptr<tcp_store> store,
                                       std::unique_ptr<detail::any_transport> t,
                                       communicator_options opts) {
  return communicator(
      std::make_unique<impl>(info, std::move(topo), std::move(store), std::move(t), opts));
}

inline void communicator::check_sizes(const char* call, std::size_t small, std::size_t big,
                                      int factor) {
  const auto f = static_cast<std::size_t>(factor);
  if (small > std::numeric_limits<std::size_t>::max() / f || small * f != big) {
    throw error(errc::invalid_argument,
                std::string(call) + ": buffer sizes do not match: " + std::to_string(big) +
                    " elements where " + std::to_string(small) + " x " + std::to_string(factor) +
                    " were expected",
                {}, std::nullopt, call);
  }
}

inline int communicator::rank() const noexcept { return p_->info.rank; }
inline int communicator::size() const noexcept { return p_->info.size; }
inline int communicator::local_rank() const noexcept { return p_->topo.local_rank(); }
inline int communicator::local_size() const noexcept { return p_->topo.local_size(); }
inline int communicator::node() const noexcept { return p_->topo.node(); }
inline int communicator::nodes() const noexcept { return p_->topo.nodes(); }
inline const topology& communicator::topo() const noexcept { return p_->topo; }
inline std::string communicator::transport_name() const { return p_->transport->name(); }
inline std::string communicator::describe() const {
  return p_->transport->describe() + ", slice " +
         std::to_string(p_->opts.exec.slice_bytes / 1024) + " KiB, window " +
         std::to_string(p_->opts.exec.window);
}

inline request communicator::all_reduce_async(const void* in, void* out, std::size_t count,
                                              dtype t, all_reduce_options o) {
  return p_->submit("all_reduce",
                    {collective::all_reduce, in, out, count, t, o.op, o.algorithm}, true);
}
inline void communicator::all_reduce(const void* in, void* out, std::size_t count, dtype t,
                                     all_reduce_options o) {
  p_->submit("all_reduce", {collective::all_reduce, in, out, count, t, o.op, o.algorithm}, false);
}
inline request communicator::reduce_scatter_async(const void* in, void* out,
                                                  std::size_t recv_count, dtype t,
                                                  reduce_scatter_options o) {
  return p_->submit("reduce_scatter",
                    {collective::reduce_scatter, in, out, recv_count, t, o.op, o.algorithm}, true);
}
inline void communicator::reduce_scatter(const void* in, void* out, std::size_t recv_count,
                                         dtype t, reduce_scatter_options o) {
  p_->submit("reduce_scatter",
             {collective::reduce_scatter, in, out, recv_count, t, o.op, o.algorithm}, false);
}
inline request communicator::all_gather_async(const void* in, void* out, std::size_t send_count,
                                              dtype t, all_gather_options o) {
  return p_->submit("all_gather",
                    {collective::all_gather, in, out, send_count, t, reduce_op::sum, o.algorithm},
                    true);
}
inline void communicator::all_gather(const void* in, void* out, std::size_t send_count, dtype t,
                                     all_gather_options o) {
  p_->submit("all_gather",
             {collective::all_gather, in, out, send_count, t, reduce_op::sum, o.algorithm}, false);
}

inline void communicator::barrier() {
  // An all_reduce of one byte: no rank can finish it before every rank has contributed.
  std::uint8_t token = 0;
  all_reduce(&token, &token, 1, dtype::uint8, {.op = reduce_op::max});
}

}  // namespace chorus
