// SPDX-License-Identifier: Apache-2.0
// The machinery behind chorus::communicator: validation, algorithm choice, progress engine.
#pragma once

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <limits>
#include <numeric>
#include <optional>
#include <span>
#include <thread>
#include <tuple>
#include <utility>

#include "chorus/bootstrap/detail/group_store.hpp"
#include "chorus/communicator.hpp"
#include "chorus/detail/flight_recorder.hpp"
#include "chorus/detail/op_desc.hpp"
#include "chorus/reduce/reduce.hpp"
#include "chorus/schedule/build.hpp"
#include "chorus/tuner/detail/probe.hpp"

namespace chorus {

namespace detail {
// Defined in tuner/detail/probe.hpp, which needs the whole communicator: when that header is
// the first one a file includes, it reaches this file before its own definitions.
inline cost_model job_costs(communicator& comm, store& own, store& root, store_turns& lock,
                            const std::string& signature, const cost_model& defaults,
                            const executor_options& exec);
}  // namespace detail

inline communicator_options communicator_options::from_env() {
  communicator_options o;
  o.timeout = env_seconds("CHORUS_TIMEOUT", o.timeout);
  o.bootstrap_timeout = env_seconds("CHORUS_BOOTSTRAP_TIMEOUT", o.bootstrap_timeout);
  if (const char* a = std::getenv("CHORUS_ALGO"); a != nullptr && *a != '\0') {
    o.algorithms = parse_algo_table(a);
  }
  o.tuning = tuner_options::from_env();
  o.exec.slice_bytes = static_cast<std::size_t>(
      env_int("CHORUS_SLICE_BYTES", static_cast<int>(o.exec.slice_bytes), 4096, 64 << 20));
  o.exec.window = static_cast<std::size_t>(
      env_int("CHORUS_SLICES_IN_FLIGHT", static_cast<int>(o.exec.window), 1, 64));
  o.heartbeat = heartbeat_options::from_env();
  o.flight_entries = static_cast<std::size_t>(
      env_int("CHORUS_FLIGHT_RECORDER_SIZE", static_cast<int>(o.flight_entries), 1, 1 << 20));
  if (const char* v = std::getenv("CHORUS_FLIGHT_RECORDER_DIR"); v != nullptr) o.flight_dir = v;
  if (const char* v = std::getenv("CHORUS_SPIN_US"); v != nullptr && *v != '\0') {
    o.spin = std::chrono::microseconds(parse_env_int("CHORUS_SPIN_US", v, 0, 10000000));
  }
  return o;
}

struct communicator::impl final : detail::op_runner {
  launch_info info;
  topology topo;
  std::shared_ptr<store> st;  // this communicator's view (split() groups: a group_store)
  transport_factory factory;
  std::unique_ptr<detail::any_transport> transport;
  communicator_options opts;
  executor exec;
  chorus::tuner tune;
  std::shared_ptr<detail::heartbeat> beat;  // the job's; null for a job of one rank
  detail::watch watch;                      // abort() and the failed ranks, as the executor sees them

  // Where split() children find the job's store: the root store, one lock for every view of
  // it, and this communicator's key prefix ("" for the job's own communicator).
  std::shared_ptr<store> root_store;
  std::shared_ptr<detail::store_turns> store_lock;
  std::string prefix;
  std::uint64_t splits = 0;
  std::uint64_t shrinks = 0;

  // Progress engine. Lock order: an operation's op_state::m (a waiting request), then m,
  // then nothing (execution happens outside m).
  std::mutex m;
  std::condition_variable cv;
  std::deque<detail::op_desc> queue;
  bool busy = false;  // an operation is executing (inline, on the worker or on a waiter)
  bool stopping = false;
  std::uint64_t next_seq = 0;                     // collectives
  std::vector<std::uint64_t> sent_to, recv_from;  // send_recv, per peer and direction
  std::thread worker;
  std::exception_ptr broken;  // the first failure: later operations fail with it
  detail::flight_recorder flight;  // the last operations, for finding where ranks diverged

  // An open group (group_start() without its group_end()); depth counts nesting.
  int group_depth = 0;
  std::vector<detail::op_desc> group_members;
  std::shared_ptr<detail::op_state> group_state;

  impl(const launch_info& i, topology tp, std::shared_ptr<store> s, transport_factory f,
       std::unique_ptr<detail::any_transport> t, communicator_options o)
      : info(i),
        topo(std::move(tp)),
        st(std::move(s)),
        factory(std::move(f)),
        transport(std::move(t)),
        opts(resolve(o, std::max(i.local_size, topo.local_size()))),
        exec(*transport, opts.exec),
        sent_to(static_cast<std::size_t>(i.size), 0),
        recv_from(static_cast<std::size_t>(i.size), 0),
        flight(opts.flight_entries) {
    exec.set_watch(&watch);
  }

  static communicator_options resolve(communicator_options o, int ranks_here) {
    const auto cores = std::max(1u, std::thread::hardware_concurrency());
    // A fixed spin where it is set or where this node runs more ranks than cores (none: a
    // spinning rank steals a peer's core); else the executor adapts it to this machine.
    if (o.spin || static_cast<unsigned>(ranks_here) > cores) {
      o.exec.spin = o.exec.spin_max = o.spin ? *o.spin : std::chrono::microseconds(0);
    }
    return o;
  }

  ~impl() {
    {
      std::lock_guard lk(m);
      stopping = true;
      // A group never ended: its operations never ran, and never will. Their requests, which
      // may outlive us, end with that rather than wait forever.
      if (group_depth > 0 && group_state) {
        group_state->finish(std::make_exception_ptr(
            error(errc::invalid_argument,
                  "the communicator was destroyed inside a group (group_start() without group_end()): "
                  "the group's operations never ran",
                  {info.rank}, std::nullopt, "group_end")));
      }
    }
    cv.notify_all();
    if (worker.joinable()) worker.join();
  }

  /// Runs one operation; returns its failure, if any. The first failure breaks the
  /// communicator: later operations fail with it, and the peers are told at once.
  /// `running`: d's flight record already says it runs (queued(d, true)).
  std::exception_ptr execute(detail::op_desc& d, bool running = false) noexcept {
    std::exception_ptr eptr;
    std::string why;
    const std::size_t tickets = d.is_group ? d.members.size() : 1;
    if (!running) flight.started(d.flight, tickets);
    try {
      // A group (grouped calls, sendrecv) is named by its first member: it has no number or
      // kind of its own (its descriptor's defaults named an "op 0 (all_reduce)" never made).
      const detail::op_desc& named = d.is_group && !d.members.empty() ? d.members.front() : d;
      if (broken) fail_broken(named);
      if (watch.alarm()) {
        if (auto e = watch.verdict(named.seq, named.kind)) throw *e;
      }
      run(d);
      // Aborted while it ran, and done before it looked: it fails all the same, as abort()
      // promises, and the peers hear of it now (the catch below), not at our next call.
      if (watch.aborted()) {
        if (auto e = watch.verdict(named.seq, named.kind)) throw *e;
      }
      flight.ended(d.flight, tickets, {});
      return nullptr;
    } catch (const error& e) {
      eptr = explain(e);
      why = e.message();  // peers read it after "rank R failed: "
    } catch (const std::exception& e) {
      // std::bad_alloc and the like: this rank cannot go on, so neither can its peers.
      eptr = std::current_exception();
      why = e.what();
    } catch (...) {
      eptr = std::current_exception();
      why = "unknown exception";
    }
    flight.ended(d.flight, tickets, why);
    if (!broken) {
      broken = eptr;
      if (beat) beat->announce();  // the failures we know reach the peers before our abort
      transport->abort(why, exec.failed_call());  // let the peers fail now, not at their timeouts
      dump_flight(why);
    }
    return eptr;
  }

  /// How a store this communicator's ranks make (shrink(), grow()) waits and authenticates.
  store_options new_store_options() const {
    store_options so;
    so.timeout = opts.bootstrap_timeout;
    so.secret = st->secret();
    return so;
  }

  /// This communicator's name in flight records: "world", or its split prefix.
  std::string name() const {
    std::string s = prefix.empty() ? "world" : prefix;
    while (!s.empty() && s.back() == '/') s.pop_back();
    std::replace(s.begin(), s.end(), '/', '.');
    return s;
  }

  /// Writes the flight record where CHORUS_FLIGHT_RECORDER_DIR says, best effort: a failure
  /// to write is logged, never thrown over the error being reported.
  void dump_flight(const std::string& reason) const noexcept {
    if (opts.flight_dir.empty()) return;
    try {
      const std::string path = opts.flight_dir + "/chorus-flight-" + name() + "-rank" + std::to_string(info.rank) + ".json";
      const std::string text = flight.json(info.rank, info.size, name(), reason);
      std::FILE* f = std::fopen(path.c_str(), "w");
      const bool ok = f != nullptr && std::fwrite(text.data(), 1, text.size(), f) == text.size();
      if (f != nullptr && std::fclose(f) != 0 && ok) throw detail::sys_error("fclose " + path);
      if (!ok) throw detail::sys_error("writing the flight record " + path);
      detail::log(detail::log_level::warn, info.rank, "flight record written to " + path);
    } catch (const std::exception& e) {
      detail::log(detail::log_level::warn, info.rank, std::string("flight record not written: ") + e.what());
    }
  }

  /// An operation on a communicator that failed earlier fails at once, naming itself and
  /// the first failure.
  [[noreturn]] void fail_broken(const detail::op_desc& d) const {
    try {
      std::rethrow_exception(broken);
    } catch (const error& e) {
      const std::string kind(to_string(d.kind));
      throw error(e.code(),
                  "op " + std::to_string(d.seq) + " (" + kind +
                      ") not run: this communicator failed earlier: " + e.message(),
                  e.ranks(), d.seq, kind);
    }
  }

  /// The error `e` as this rank reports it. A lost connection is a failed rank, which every
  /// rank hears of (execute() announces it before our abort frames leave, so a peer reading
  /// one finds the report already there). A peer's abort is read against the failed ranks known here: when it
  /// came because a rank failed, the error names that rank, as the peer's own does.
  std::exception_ptr explain(const error& e) {
    if (beat && e.code() == errc::connection_lost && !e.ranks().empty()) {
      std::vector<int> job;
      for (int r : e.ranks()) job.push_back(watch.job_rank(r));
      beat->report(job, e.message());
    }
    if (beat && e.code() == errc::remote_error) {
      beat->drain();
      const auto f = watch.failed();
      if (!f.empty()) {
        // The abort's text says "rank J failed: ..." of the rank that sent it, which did not
        // fail but gave up: say so.
        std::string told = e.message();
        if (const auto at = told.find(" failed: "); at != std::string::npos && told.rfind("rank ", 0) == 0) {
          told.replace(at, 9, " aborted: ");
        }
        const std::string where = e.op() ? " (op " + std::to_string(*e.op()) + ", " + e.call() + ")" : "";
        return std::make_exception_ptr(error(errc::peer_failed, detail::watch::describe(f) + where + "; " + told,
                                             detail::watch::ranks_of(f), e.op(), e.call()));
      }
    }
    return std::make_exception_ptr(e);
  }

  /// communicator::abort(): see communicator.hpp.
  void abort(const std::string& why) {
    if (!watch.abort(why)) return;
    std::unique_lock lk(m);
    // A running operation fails at its next idle turn or as it ends (execute); one that had
    // looked for the last time when the flag was set leaves it to whoever ends it (idle()).
    if (busy || broken) return;
    fail_aborted(lk);
    lk.unlock();
    cv.notify_all();
  }

  /// Where an operation has just ended (`lk` holds m, busy just cleared): an abort() made
  /// after the operation last looked, which left the failing to it, fails the communicator now.
  void idle(std::unique_lock<std::mutex>& lk) {
    if (watch.aborted() && !broken) fail_aborted(lk);
  }

  /// Fails an idle communicator that was aborted, and tells the peers, holding `busy` so that
  /// no operation starts on the transport meanwhile. `lk` holds m, and does again after.
  void fail_aborted(std::unique_lock<std::mutex>& lk) {
    busy = true;
    const std::string why = watch.abort_reason();
    broken = std::make_exception_ptr(error(errc::aborted, "communicator aborted: " + why));
    lk.unlock();
    transport->abort("rank " + std::to_string(info.rank) + " aborted its communicator: " + why, nullptr);
    lk.lock();
    busy = false;
  }

  schedule build(const detail::op_desc& d) const {
    return build_schedule(topo, {.kind = d.kind,
                                 .algorithm = d.algorithm,
                                 .count = d.count,
                                 .root = d.root,
                                 .send_counts = d.send_counts,
                                 .recv_counts = d.recv_counts,
                                 .sending = d.sending});
  }

  /// Schedules are pure functions of (kind, algorithm, count, root or peer, side) for a
  /// communicator, and training loops repeat the same few calls: keep the last few instead
  /// of rebuilding.
  struct schedule_key {
    collective kind;
    algo algorithm;
    std::size_t count;
    int root;
    bool sending;
    static schedule_key of(const detail::op_desc& d) {
      return {d.kind, d.algorithm, d.count, d.root, d.sending};
    }
    friend bool operator==(const schedule_key&, const schedule_key&) = default;
  };
  struct cached_schedule {
    schedule_key key;
    schedule s;
  };
  std::array<std::optional<cached_schedule>, 8> schedules;
  std::size_t next_schedule = 0;
  schedule uncached;  // all_to_allv: its counts are the key, so it is rebuilt each time

  const schedule& schedule_for(const detail::op_desc& d) {
    if (d.kind == collective::all_to_allv) return uncached = build(d);
    const schedule_key key = schedule_key::of(d);
    for (const auto& c : schedules) {
      if (c && c->key == key) return c->s;
    }
    auto& slot = schedules[next_schedule++ % schedules.size()];
    slot = cached_schedule{key, build(d)};
    return slot->s;
  }

  /// The last group's schedules, which must all live through its run (the single cache
  /// above could evict one member's for another's): a pipeline's sendrecv, repeated, builds
  /// none. A new group's are built before the old ones are freed, so that no schedule of
  /// the new group sits where the executor's last plan saw one of the old (plan_key).
  std::vector<schedule_key> group_keys;
  std::vector<schedule> group_schedules;
  std::vector<executor_job> group_jobs;

  const std::vector<schedule>& schedules_for(std::span<const detail::op_desc> members) {
    bool same = group_keys.size() == members.size();
    for (std::size_t i = 0; same && i < members.size(); ++i) {
      same = members[i].kind != collective::all_to_allv &&
             group_keys[i] == schedule_key::of(members[i]);
    }
    if (same) return group_schedules;
    std::vector<schedule_key> keys;
    std::vector<schedule> built;
    keys.reserve(members.size());
    built.reserve(members.size());
    for (const auto& mem : members) {
      keys.push_back(schedule_key::of(mem));
      built.push_back(build(mem));
    }
    group_keys = std::move(keys);
    group_schedules = std::move(built);
    return group_schedules;
  }

  /// The executor's view of `d`: buffers, reduce function and the fingerprint its frames carry.
  executor_job job_for(const detail::op_desc& d, const schedule& s) const {
    const std::size_t es = size_of(d.type);
    const auto n = static_cast<std::size_t>(info.size);
    const detail::buffer_sizes sz = detail::buffer_sizes_of(d, info.rank, info.size);
    executor_job j;
    j.sched = &s;
    j.buffers.input = static_cast<const std::byte*>(d.in);
    j.buffers.output = static_cast<std::byte*>(d.out);
    j.buffers.input_bytes = sz.in * es;
    j.buffers.output_bytes = sz.out * es;
    j.buffers.elem_size = es;
    j.buffers.reduce = reduce_function(d.type, d.op);
    (void)n;
    j.fp = detail::op_fingerprint{d.seq, d.count, d.kind, d.type, reduces(d.kind) ? d.op : reduce_op::sum,
                                  s.algorithm, detail::no_root, d.kind == collective::all_to_allv};
    if (rooted(d.kind)) j.fp.root = static_cast<std::uint32_t>(d.root);
    if (d.kind == collective::send_recv) j.fp.root = static_cast<std::uint32_t>(d.tag);
    j.expose = detail::exposes_sends(d.kind, s.algorithm) || d.single_copy;
    return j;
  }

  /// avg is a sum until every contribution is in; then each holder of a result divides.
  void finish_avg(const detail::op_desc& d) const {
    if (d.op != reduce_op::avg || !reduces(d.kind)) return;
    if (d.kind == collective::reduce && info.rank != d.root) return;
    divide_by(d.type, d.out, d.count, static_cast<std::size_t>(info.size));
  }

  void run(const detail::op_desc& d) {
    if (!d.is_group) {
      const schedule& s = schedule_for(d);
      const executor_job j = job_for(d, s);
      exec.run(std::span<const executor_job>(&j, 1), opts.timeout);
      finish_avg(d);
      return;
    }
    const std::vector<schedule>& scheds = schedules_for(d.members);
    group_jobs.clear();
    for (std::size_t i = 0; i < d.members.size(); ++i) {
      group_jobs.push_back(job_for(d.members[i], scheds[i]));
    }
    if (!group_jobs.empty()) exec.run(group_jobs, opts.timeout);
    for (const auto& mem : d.members) finish_avg(mem);
  }

  /// The call's algorithm: its own choice, else CHORUS_ALGO's for its collective, else the
  /// tuner's. An explicit choice the collective does not have is an error.
  algo choose(const char* call, const detail::op_desc& d) const {
    if (d.algorithm != algo::automatic) {
      if (!implements(d.kind, d.algorithm)) {
        std::string have;
        for (algo a : algorithms_for(d.kind)) have += (have.empty() ? "" : ", ") + std::string(to_string(a));
        throw error(errc::invalid_argument,
                    std::string(call) + ": " + std::string(to_string(d.kind)) + " has no " +
                        std::string(to_string(d.algorithm)) + " algorithm (it has " + have + ")",
                    {info.rank}, std::nullopt, call);
      }
      return d.algorithm;
    }
    const algo table = opts.algorithms[static_cast<std::size_t>(d.kind)];
    if (table != algo::automatic) return table;
    return tune.choose(d.kind, detail::tuning_count(d, info.size), size_of(d.type));
  }

  request submit(const char* call, detail::op_desc d, bool async) {
    detail::validate(call, d, info.rank, info.size);
    d.algorithm = choose(call, d);
    std::unique_lock lk(m);
    // Refuse before numbering: a refused call must not take an operation number.
    if (group_depth > 0 && !async) {
      throw error(errc::invalid_argument,
                  std::string(call) + ": a blocking call inside a group (between group_start() "
                                      "and group_end()); use its _async form",
                  {info.rank}, std::nullopt, call);
    }
    if (d.kind == collective::send_recv) {
      auto& seq = d.sending ? sent_to : recv_from;
      d.seq = seq[static_cast<std::size_t>(d.root)]++;
    } else {
      d.seq = next_seq++;
    }
    if (group_depth > 0) {
      group_members.push_back(std::move(d));
      return request(group_state);
    }
    return enqueue(lk, std::move(d), async);
  }

  /// Runs `d` now on the caller's thread when nothing is queued (blocking calls), else hands
  /// it to the worker. `lk` holds m.
  request enqueue(std::unique_lock<std::mutex>& lk, detail::op_desc d, bool async) {
    if (!async && queue.empty() && !busy) {
      // Nothing queued: run on the caller's thread, saving two thread hand-offs (~10 µs on
      // this machine, as much as a whole small all_reduce) and the request's state.
      d.flight = flight.queued(d, true);
      busy = true;
      lk.unlock();
      const std::exception_ptr failure = execute(d, true);
      lk.lock();
      busy = false;
      idle(lk);
      if (!queue.empty()) cv.notify_all();
      lk.unlock();
      if (failure) std::rethrow_exception(failure);
      return request();
    }
    d.flight = flight.queued(d);
    if (!d.state) d.state = std::make_shared<detail::op_state>();
    d.state->runner.store(this, std::memory_order_release);
    auto state = d.state;
    queue.push_back(std::move(d));
    if (!worker.joinable()) worker = std::thread([this] { work(); });
    lk.unlock();
    cv.notify_all();
    request req(state);
    if (!async) req.wait();
    return req;
  }

  /// A group of one send and one receive, run on the caller's thread when it can be.
  void sendrecv(const void* out, std::size_t send_count, int dest, void* in, std::size_t recv_count,
                int source, dtype t, p2p_options o) {
    detail::op_desc s = detail::op_desc::of_p2p(true, out, send_count, t, dest, o);
    detail::op_desc r = detail::op_desc::of_p2p(false, in, recv_count, t, source, o);
    detail::validate("sendrecv", s, info.rank, info.size);
    detail::validate("sendrecv", r, info.rank, info.size);
    std::unique_lock lk(m);
    if (group_depth > 0) {
      throw error(errc::invalid_argument, "sendrecv: a blocking call inside a group", {info.rank},
                  std::nullopt, "sendrecv");
    }
    s.seq = sent_to[static_cast<std::size_t>(dest)]++;
    r.seq = recv_from[static_cast<std::size_t>(source)]++;
    detail::op_desc g;
    g.is_group = true;
    g.members.push_back(std::move(s));
    g.members.push_back(std::move(r));
    enqueue(lk, std::move(g), false);
  }

  void group_start() {
    std::lock_guard lk(m);
    if (group_depth++ == 0) {
      group_members.clear();
      group_state = std::make_shared<detail::op_state>();
    }
  }

  request group_end() {
    std::unique_lock lk(m);
    if (group_depth == 0) {
      throw error(errc::invalid_argument, "group_end() without group_start()", {info.rank},
                  std::nullopt, "group_end");
    }
    if (--group_depth > 0) return request(group_state);
    detail::op_desc g;
    g.is_group = true;
    g.state = std::move(group_state);
    // Collectives first, then point-to-point, each in issue order: every rank runs the
    // group's collectives in the same order whatever it interleaved them with.
    std::stable_partition(group_members.begin(), group_members.end(), [](const detail::op_desc& x) {
      return x.kind != collective::send_recv;
    });
    g.members = std::move(group_members);
    group_members.clear();
    return enqueue(lk, std::move(g), true);
  }

  /// The next queued operation, marked running (m held; it runs outside m, and whoever
  /// took it clears busy under m once it has finished).
  detail::op_desc take_next() {
    detail::op_desc d = std::move(queue.front());
    queue.pop_front();
    busy = true;
    return d;
  }

  /// A waiting request runs the next queued operation itself (detail::op_runner): the
  /// worker takes it otherwise, as work() does. The worker is woken after it only where the
  /// waiter stops (its own operation done) and more is queued, or to end.
  bool run_next(std::unique_lock<std::mutex>& waiting) override {
    std::unique_lock lk(m);
    if (busy || queue.empty()) return false;
    detail::op_desc d = take_next();
    const bool last = waiting.mutex() == &d.state->m;  // the waiter's own: it stops after
    lk.unlock();
    waiting.unlock();
    d.state->finish(execute(d));
    lk.lock();
    busy = false;
    idle(lk);
    // Under m: once it is let go, the worker may end and this be destroyed. Only where the
    // worker has something to do: a wake-up for nothing costs the core a peer may be using.
    if ((last && !queue.empty()) || stopping) cv.notify_all();
    lk.unlock();
    waiting.lock();
    return true;
  }

  void work() {
    std::unique_lock lk(m);
    for (;;) {
      // Ending waits for an operation a waiter runs (run_next) as well as for the queue.
      cv.wait(lk, [&] { return (!queue.empty() && !busy) || (stopping && queue.empty() && !busy); });
      if (queue.empty()) return;
      // No yield to a caller about to wait here: where the caller computes on the same core
      // instead, the operation would then wait for the end of its time slice, not overlap
      // with it (an 8 B all_reduce_async beside 0.2-1 ms of computing: done 16-17 µs after
      // it over TCP, 2 ranks, against 0.1 µs).
      detail::op_desc d = take_next();
      lk.unlock();
      d.state->finish(execute(d));
      lk.lock();
      busy = false;
      idle(lk);
      cv.notify_all();
    }
  }
};

inline communicator::communicator(std::unique_ptr<impl> p) : p_(std::move(p)) {}
inline communicator::communicator(communicator&&) noexcept = default;
inline communicator& communicator::operator=(communicator&&) noexcept = default;
inline communicator::~communicator() = default;

inline communicator communicator::make(const launch_info& info, std::shared_ptr<store> st,
                                       transport_factory factory, communicator_options opts,
                                       std::shared_ptr<store> root, std::shared_ptr<detail::store_turns> lock,
                                       std::string prefix, std::shared_ptr<detail::heartbeat> beat,
                                       std::vector<int> job_ranks, const cost_model* known_costs) {
  const tuning_file file = opts.tuning.file.empty() ? tuning_file{} : tuning_file::load(opts.tuning.file);
  topology topo = discover_topology(*st, info);
  auto t = factory(*st, info, topo);
  auto p = std::make_unique<impl>(info, std::move(topo), std::move(st), std::move(factory),
                                  std::move(t), opts);
  p->root_store = std::move(root);
  p->store_lock = std::move(lock);
  p->prefix = std::move(prefix);
  // The job's own communicator starts the heartbeat; split() children share it.
  if (!beat && info.size > 1) {
    std::lock_guard lk(*p->store_lock);
    beat = detail::heartbeat::start(*p->root_store, info, opts.heartbeat);
  }
  if (job_ranks.empty()) {
    job_ranks.resize(static_cast<std::size_t>(info.size));
    std::iota(job_ranks.begin(), job_ranks.end(), 0);
  }
  p->beat = beat;
  p->watch.bind(beat ? beat->failures() : nullptr, std::move(job_ranks));
  impl& i = *p;
  communicator c(std::move(p));

  // Costs: the tuning file's, else the probe's (or the job's earlier probe), else defaults.
  cost_model costs;
  if (known_costs != nullptr) {
    costs = *known_costs;  // shrink(): the same machines, measured
  } else if (file.intra || file.inter || file.pull || file.reduce_s_per_byte || file.copy_s_per_byte || file.memory) {
    if (file.intra) costs.intra = *file.intra;
    if (file.inter) costs.inter = *file.inter;
    if (file.pull) costs.pull = *file.pull;
    if (file.reduce_s_per_byte) costs.reduce_s_per_byte = *file.reduce_s_per_byte;
    if (file.copy_s_per_byte) costs.copy_s_per_byte = *file.copy_s_per_byte;
    if (file.memory) std::tie(costs.memory_s_per_byte, costs.cache_bytes) = *file.memory;
    costs.source = "file";
  }
  // Both ends of a message cut it into the same slices, so every rank must use the smallest
  // frame any rank's transport takes (a rank alone on its node has no shared memory). And
  // every rank's tuner must make the same picks, so they agree whether sends are read in
  // place everywhere (CHORUS_SHM_SINGLE_COPY may differ between ranks, or a probe fail).
  std::array<std::uint64_t, 2> agreed{std::min<std::uint64_t>(i.transport->max_slice_bytes(), detail::max_frame_payload),
                                      i.transport->reads_in_place() ? 1u : 0u};
  if (info.size > 1) {
    i.exec.set_max_slice(agreed[0]);  // so far: enough for this one small all_reduce
    c.all_reduce(std::span<std::uint64_t>(agreed), {.op = reduce_op::min, .algorithm = algo::ring});
  }
  i.opts.exec.max_slice_bytes = static_cast<std::size_t>(agreed[0]);
  i.exec.set_max_slice(i.opts.exec.max_slice_bytes);
  costs.pulls = agreed[1] == 1;
  i.tune = chorus::tuner(i.topo, costs, file.rules, i.opts.exec);  // for the probe's own calls
  if (known_costs == nullptr && costs.source == "defaults" && opts.tuning.probe && info.size > 1) {
    const std::string signature = i.transport->name() + "/" + i.topo.describe() + "/slice " +
                                  std::to_string(i.opts.exec.slice_bytes) + "/window " +
                                  std::to_string(i.opts.exec.window);
    costs = detail::job_costs(c, *i.st, *i.root_store, *i.store_lock, signature, costs, i.opts.exec);
    i.tune = chorus::tuner(i.topo, costs, file.rules, i.opts.exec);
  }
  if (info.rank == 0) detail::log(detail::log_level::info, 0, "tuner costs: " + costs.describe());
  return c;
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

inline std::size_t communicator::block_of(const char* call, std::size_t in, std::size_t out) const {
  const auto n = static_cast<std::size_t>(size());
  if (in != out || in % n != 0) {
    throw error(errc::invalid_argument,
                std::string(call) + ": input and output must both hold " + std::to_string(n) +
                    " equal blocks, not " + std::to_string(in) + " and " + std::to_string(out) +
                    " elements",
                {rank()}, std::nullopt, call);
  }
  return in / n;
}

inline void communicator::check_counts(std::size_t in, std::span<const std::size_t> send_counts,
                                       std::size_t out,
                                       std::span<const std::size_t> recv_counts) const {
  // Sizes first (validate checks the rest): the sums must describe the spans exactly.
  const auto n = static_cast<std::size_t>(size());
  const std::size_t sent = detail::sum_counts(send_counts);
  const std::size_t received = detail::sum_counts(recv_counts);
  if (send_counts.size() == n && recv_counts.size() == n && (sent != in || received != out)) {
    throw error(errc::invalid_argument,
                "all_to_allv: the counts add up to " + std::to_string(sent) + " and " +
                    std::to_string(received) + " elements but the buffers hold " +
                    std::to_string(in) + " and " + std::to_string(out),
                {rank()}, std::nullopt, "all_to_allv");
  }
}

inline int communicator::rank() const noexcept { return p_->info.rank; }
inline int communicator::size() const noexcept { return p_->info.size; }
inline int communicator::local_rank() const noexcept { return p_->topo.local_rank(); }
inline int communicator::local_size() const noexcept { return p_->topo.local_size(); }
inline int communicator::node() const noexcept { return p_->topo.node(); }
inline int communicator::nodes() const noexcept { return p_->topo.nodes(); }
inline const topology& communicator::topo() const noexcept { return p_->topo; }
inline const tuner& communicator::tuner() const noexcept { return p_->tune; }
inline std::string communicator::transport_name() const { return p_->transport->name(); }
inline std::string communicator::describe() const {
  return p_->transport->describe() + ", slice " +
         std::to_string(p_->opts.exec.slice_bytes / 1024) + " KiB, window " +
         std::to_string(p_->opts.exec.window);
}

// --- the type-erased calls: each makes an op_desc and submits it --------------------------

inline request communicator::all_reduce_async(const void* in, void* out, std::size_t count,
                                              dtype t, all_reduce_options o) {
  return p_->submit("all_reduce", detail::op_desc::of(collective::all_reduce, in, out, count, t, o.op, o.algorithm), true);
}
inline void communicator::all_reduce(const void* in, void* out, std::size_t count, dtype t,
                                     all_reduce_options o) {
  p_->submit("all_reduce", detail::op_desc::of(collective::all_reduce, in, out, count, t, o.op, o.algorithm), false);
}
inline request communicator::reduce_scatter_async(const void* in, void* out,
                                                  std::size_t recv_count, dtype t,
                                                  reduce_scatter_options o) {
  return p_->submit("reduce_scatter", detail::op_desc::of(collective::reduce_scatter, in, out, recv_count, t, o.op, o.algorithm), true);
}
inline void communicator::reduce_scatter(const void* in, void* out, std::size_t recv_count,
                                         dtype t, reduce_scatter_options o) {
  p_->submit("reduce_scatter", detail::op_desc::of(collective::reduce_scatter, in, out, recv_count, t, o.op, o.algorithm), false);
}
inline request communicator::all_gather_async(const void* in, void* out, std::size_t send_count,
                                              dtype t, all_gather_options o) {
  return p_->submit("all_gather", detail::op_desc::of(collective::all_gather, in, out, send_count, t, sum, o.algorithm), true);
}
inline void communicator::all_gather(const void* in, void* out, std::size_t send_count, dtype t,
                                     all_gather_options o) {
  p_->submit("all_gather", detail::op_desc::of(collective::all_gather, in, out, send_count, t, sum, o.algorithm), false);
}
inline request communicator::broadcast_async(const void* in, void* out, std::size_t count, dtype t,
                                             int root, broadcast_options o) {
  return p_->submit("broadcast", detail::op_desc::of(collective::broadcast, in, out, count, t, sum, o.algorithm, root), true);
}
inline void communicator::broadcast(const void* in, void* out, std::size_t count, dtype t, int root,
                                    broadcast_options o) {
  p_->submit("broadcast", detail::op_desc::of(collective::broadcast, in, out, count, t, sum, o.algorithm, root), false);
}
inline request communicator::reduce_async(const void* in, void* out, std::size_t count, dtype t,
                                          int root, reduce_options o) {
  return p_->submit("reduce", detail::op_desc::of(collective::reduce, in, out, count, t, o.op, o.algorithm, root), true);
}
inline void communicator::reduce(const void* in, void* out, std::size_t count, dtype t, int root,
                                 reduce_options o) {
  p_->submit("reduce", detail::op_desc::of(collective::reduce, in, out, count, t, o.op, o.algorithm, root), false);
}
inline request communicator::all_to_all_async(const void* in, void* out, std::size_t block, dtype t,
                                               all_to_all_options o) {
  return p_->submit("all_to_all", detail::op_desc::of(collective::all_to_all, in, out, block, t, sum, o.algorithm), true);
}
inline void communicator::all_to_all(const void* in, void* out, std::size_t block, dtype t,
                                     all_to_all_options o) {
  p_->submit("all_to_all", detail::op_desc::of(collective::all_to_all, in, out, block, t, sum, o.algorithm), false);
}
inline request communicator::all_to_allv_async(const void* in, std::span<const std::size_t> send_counts,
                                                void* out, std::span<const std::size_t> recv_counts,
                                                dtype t, all_to_all_options o) {
  return p_->submit("all_to_allv", detail::op_desc::of_counts(in, send_counts, out, recv_counts, t, o.algorithm), true);
}
inline void communicator::all_to_allv(const void* in, std::span<const std::size_t> send_counts,
                                      void* out, std::span<const std::size_t> recv_counts, dtype t,
                                      all_to_all_options o) {
  p_->submit("all_to_allv", detail::op_desc::of_counts(in, send_counts, out, recv_counts, t, o.algorithm), false);
}
inline request communicator::gather_async(const void* in, void* out, std::size_t block, dtype t,
                                          int root, gather_options o) {
  return p_->submit("gather", detail::op_desc::of(collective::gather, in, out, block, t, sum, o.algorithm, root), true);
}
inline void communicator::gather(const void* in, void* out, std::size_t block, dtype t, int root,
                                 gather_options o) {
  p_->submit("gather", detail::op_desc::of(collective::gather, in, out, block, t, sum, o.algorithm, root), false);
}
inline request communicator::scatter_async(const void* in, void* out, std::size_t block, dtype t,
                                           int root, scatter_options o) {
  return p_->submit("scatter", detail::op_desc::of(collective::scatter, in, out, block, t, sum, o.algorithm, root), true);
}
inline void communicator::scatter(const void* in, void* out, std::size_t block, dtype t, int root,
                                  scatter_options o) {
  p_->submit("scatter", detail::op_desc::of(collective::scatter, in, out, block, t, sum, o.algorithm, root), false);
}
inline request communicator::send_async(const void* data, std::size_t count, dtype t, int peer,
                                        p2p_options o) {
  return p_->submit("send", detail::op_desc::of_p2p(true, data, count, t, peer, o), true);
}
inline void communicator::send(const void* data, std::size_t count, dtype t, int peer,
                               p2p_options o) {
  p_->submit("send", detail::op_desc::of_p2p(true, data, count, t, peer, o), false);
}
inline request communicator::recv_async(void* data, std::size_t count, dtype t, int peer,
                                        p2p_options o) {
  return p_->submit("recv", detail::op_desc::of_p2p(false, data, count, t, peer, o), true);
}
inline void communicator::recv(void* data, std::size_t count, dtype t, int peer, p2p_options o) {
  p_->submit("recv", detail::op_desc::of_p2p(false, data, count, t, peer, o), false);
}

inline request communicator::barrier_async() {
  return p_->submit("barrier", detail::op_desc::of(collective::barrier, nullptr, nullptr, 0, dtype::uint8, sum, algo::automatic), true);
}
inline void communicator::barrier() {
  p_->submit("barrier", detail::op_desc::of(collective::barrier, nullptr, nullptr, 0, dtype::uint8, sum, algo::automatic), false);
}

inline void communicator::sendrecv(const void* out, std::size_t send_count, int dest, void* in,
                                   std::size_t recv_count, int source, dtype t, p2p_options o) {
  p_->sendrecv(out, send_count, dest, in, recv_count, source, t, o);
}

inline void communicator::abort(const std::string& why) { p_->abort(why); }
inline std::map<int, std::string> communicator::failed_ranks() const { return p_->watch.failed(); }
inline std::string communicator::flight_record() const {
  return p_->flight.json(rank(), size(), p_->name(), "on request");
}

inline void communicator::group_start() { p_->group_start(); }
inline request communicator::group_end() { return p_->group_end(); }

inline std::optional<communicator> communicator::split(int color, int key) {
  // Everyone learns everyone's (color, key) over this communicator itself.
  const std::array<std::int64_t, 2> mine{color, key};
  std::vector<std::int64_t> all(2 * static_cast<std::size_t>(size()));
  all_gather(std::span<const std::int64_t>(mine), std::span(all));
  const std::uint64_t id = p_->splits++;
  if (color < 0) return std::nullopt;
  std::vector<int> members;
  for (int r = 0; r < size(); ++r) {
    if (all[2 * static_cast<std::size_t>(r)] == color) members.push_back(r);
  }
  std::stable_sort(members.begin(), members.end(), [&](int a, int b) {
    return all[2 * static_cast<std::size_t>(a) + 1] < all[2 * static_cast<std::size_t>(b) + 1];
  });
  launch_info ci = p_->info;
  ci.size = static_cast<int>(members.size());
  ci.rank = static_cast<int>(std::find(members.begin(), members.end(), rank()) - members.begin());
  ci.local_rank = 0;
  ci.local_size = 0;
  for (int r : members) {
    if (!p_->topo.same_node(r, rank())) continue;
    if (r == rank()) ci.local_rank = ci.local_size;
    ++ci.local_size;
  }
  // The prefix names this split uniquely in the job: the parent's prefix, the parent's split
  // count (every rank counts the same calls) and the color.
  std::string prefix = p_->prefix + "split/" + std::to_string(id) + "/" + std::to_string(color) + "/";
  std::vector<int> job_ranks;
  for (int r : members) job_ranks.push_back(p_->watch.job_rank(r));
  auto view = std::make_shared<detail::group_store>(p_->root_store, p_->store_lock, prefix, ci.rank,
                                                    job_ranks);
  return make(ci, view, p_->factory, p_->opts, p_->root_store, p_->store_lock, std::move(prefix),
              p_->beat, std::move(job_ranks));
}

inline communicator communicator::own_job(const launch_info& info, std::shared_ptr<store> st,
                                          transport_factory factory, const communicator_options& opts,
                                          const cost_model* costs) {
  auto root = st;
  return make(info, std::move(st), std::move(factory), opts, std::move(root), std::make_shared<detail::store_turns>(), "",
              nullptr, {}, costs);
}

inline communicator communicator::grow(int joiners, const std::string& host, std::uint16_t port) {
  if (joiners < 0 || port == 0 || host.empty()) {
    throw error(errc::invalid_argument,
                "grow: wants a count of joiners >= 0, a host and a port, got " + std::to_string(joiners) + ", '" +
                    host + "' and " + std::to_string(port),
                {rank()}, std::nullopt, "grow");
  }
  launch_info next = p_->info;
  next.size = size() + joiners;
  next.master_addr = host;
  next.master_port = port;
  auto st = std::make_shared<tcp_store>(tcp_store::connect(next, p_->new_store_options()));
  // The joiners make theirs with from_env(): the same path, so the same tuning (a new probe
  // where the options say so), for every rank.
  return own_job(next, std::move(st), p_->factory, p_->opts);
}

inline communicator communicator::shrink() {
  impl& i = *p_;
  abort("shrink() was called");
  const store_options so = i.new_store_options();
  launch_info next = i.info;
  std::unique_ptr<detail::store_server> server;
  if (!i.beat) {
    // A job of one rank: nobody to agree with, and a store of its own.
    next.master_addr = "127.0.0.1";
    next.master_port = 0;
    return own_job(next, std::make_shared<tcp_store>(tcp_store::connect(next, so)), i.factory, i.opts,
                   &i.tune.costs());
  }
  // Every member names this shrink alike: this communicator and how many shrinks it had.
  const std::string name = i.name() + "#" + std::to_string(i.shrinks++);
  const std::uint64_t key = detail::fnv1a(std::as_bytes(std::span(name.data(), name.size())));
  try {
    detail::heartbeat::shrink_plan plan;
    try {
      plan = i.beat->agree(
          key, i.watch.job_ranks(),
          [&](int ranks) {
            server = std::make_unique<detail::store_server>(i.beat->local_host(), std::uint16_t{0}, ranks,
                                                            so.timeout, *so.secret);
            return server->port();
          },
          clock::now() + i.opts.bootstrap_timeout);
    } catch (const error& e) {
      // The heartbeat speaks of job ranks; the caller knows this communicator's.
      std::vector<int> ranks;
      for (int j : e.ranks()) {
        const auto& all = i.watch.job_ranks();
        const auto at = std::find(all.begin(), all.end(), j);
        ranks.push_back(at == all.end() ? j : static_cast<int>(at - all.begin()));
      }
      throw error(e.code(), e.message(), ranks, e.op(), e.call());
    }
    // The survivors in this communicator's order; the first (the store's host) is rank 0.
    std::vector<int> survivors;
    for (int r = 0; r < size(); ++r) {
      if (!std::binary_search(plan.failed.begin(), plan.failed.end(), i.watch.job_rank(r))) {
        survivors.push_back(r);
      }
    }
    next.size = static_cast<int>(survivors.size());
    next.rank = static_cast<int>(std::find(survivors.begin(), survivors.end(), rank()) - survivors.begin());
    next.local_rank = 0;
    next.local_size = 0;
    for (int r : survivors) {
      if (!i.topo.same_node(r, rank())) continue;
      if (r == rank()) next.local_rank = next.local_size;
      ++next.local_size;
    }
    next.master_addr = plan.host_addr;
    next.master_port = plan.port;
    auto st = std::make_shared<tcp_store>(next.rank == 0 ? tcp_store::connect(next, so, std::move(server))
                                                         : tcp_store::connect(next, so));
    communicator c = own_job(next, std::move(st), i.factory, i.opts, &i.tune.costs());
    i.beat->end_shrink();
    return c;
  } catch (...) {
    i.beat->end_shrink();
    throw;
  }
}

}  // namespace chorus
