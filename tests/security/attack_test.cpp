// SPDX-License-Identifier: Apache-2.0
// A live attacker against a running 8-rank TCP job: its real store and data ports get random
// bytes, malformed, truncated and replayed handshakes, huge lengths, slow-loris and bursts of
// more connections than a server serves at once. The job must still finish with exact results,
// and the servers must close every bad connection within 5 s of accepting it, with a logged
// reason. The job's throughput with and without the attack is printed, never asserted.
#include <doctest/doctest.h>
#include <sys/mman.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <new>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "security/attacker.hpp"
#include "support/multirank.hpp"

namespace {

using namespace std::chrono_literals;
using chorus::communicator;
using chorus::test::attack_clock;
using chorus::test::attack_kind;
using chorus::test::attack_record;
using chorus::test::attacker;

constexpr int world = 8;
constexpr std::size_t count = std::size_t{1} << 20;  // 4 MiB of float per rank and operation
constexpr auto run_for = 6s;  // longer than auth_timeout, so the store's stalled strangers time out
// The servers close a bad connection auth_timeout (5 s) after accepting it; the rest is slack
// for a loaded 2-core machine.
constexpr double close_bound_seconds = 6.5;

// What the ranks tell the parent, in memory shared across the fork.
struct job_report {
  double setup_seconds[world];  // fork to a connected communicator, per rank
  double run_seconds;           // rank 0: the timed loop
  long ops;
};

// Small integers: their float sums over 8 ranks are exact in any order, and the sum has a
// closed form, so checking costs one pass.
float input(int rank, std::size_t i, long op) {
  return static_cast<float>(((i + static_cast<std::size_t>(op)) & 1023) +
                            static_cast<std::size_t>(rank));
}
float expected(int ranks, std::size_t i, long op) {
  return static_cast<float>(static_cast<std::size_t>(ranks) *
                                ((i + static_cast<std::size_t>(op)) & 1023) +
                            static_cast<std::size_t>(ranks * (ranks - 1) / 2));
}

// One rank's view: all_reduce `count` floats again and again for run_for, checking every
// element every time. One more element carries rank 0's "stop", so that every rank stops
// after the same operation.
void reduce_until_told(communicator& comm, attack_clock::time_point forked, job_report* report) {
  const int rank = comm.rank();
  report->setup_seconds[rank] = std::chrono::duration<double>(attack_clock::now() - forked).count();
  std::vector<float> v(count + 1);
  const auto start = attack_clock::now();
  long op = 0;
  for (bool stop = false; !stop; ++op) {
    for (std::size_t i = 0; i < count; ++i) v[i] = input(rank, i, op);
    v[count] = rank == 0 && attack_clock::now() - start >= run_for ? 1.0f : 0.0f;
    comm.all_reduce(std::span(v));
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < count; ++i) {
      if (v[i] != expected(comm.size(), i, op)) ++wrong;
    }
    if (wrong != 0) std::fprintf(stderr, "[rank %d] op %ld: %zu wrong\n", rank, op, wrong);
    RANK_CHECK(wrong == 0);
    stop = v[count] != 0;
  }
  if (rank == 0) {
    report->run_seconds = std::chrono::duration<double>(attack_clock::now() - start).count();
    report->ops = op;
  }
}

struct job_result {
  job_report report{};
  std::string stderr_text;  // every rank's
};

job_result run_job(const std::function<void(const std::vector<pid_t>&, int)>& started) {
  void* mem = ::mmap(nullptr, sizeof(job_report), PROT_READ | PROT_WRITE,
                     MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  REQUIRE(mem != MAP_FAILED);
  auto* shared = new (mem) job_report{};
  char path[] = "/tmp/chorus-attack-stderr-XXXXXX";
  const int fd = ::mkstemp(path);
  REQUIRE(fd >= 0);
  ::close(fd);
  const auto forked = attack_clock::now();
  chorus::test::run_ranks(world,
                          [&](communicator& comm) { reduce_until_told(comm, forked, shared); },
                          {.deadline = 180s,
                           // 4 connections per peer, as the attacker assumes (unset, 8 ranks
                           // on fewer cores would take 1, and its hellos for index 3 would be
                           // refused before any proof is checked).
                           .env = {{"CHORUS_TRANSPORT", "tcp"}, {"CHORUS_TCP_CONNS", "4"}},
                           .stderr_path = path,
                           .started = started});
  job_result out;
  out.report = *shared;
  std::ifstream in(path);
  out.stderr_text.assign(std::istreambuf_iterator<char>(in), {});
  ::unlink(path);
  ::munmap(mem, sizeof(job_report));
  return out;
}

// A whole decimal number, or -2.
int number(std::string_view text) {
  int v = -1;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  return ec == std::errc{} && end == text.data() + text.size() ? v : -2;
}

// The rejections the ranks logged, by (rank, or -1 for the store) and the peer's port:
//   chorus: store 127.0.0.1:PORT: 127.0.0.1:PEER: closing connection: REASON
//   chorus: rank R rejected a connection from 127.0.0.1:PEER: REASON
// Every other line goes to `other`.
using rejection_log = std::map<std::pair<int, int>, std::vector<std::string>>;
rejection_log parse_rejections(const std::string& text, std::vector<std::string>& other) {
  rejection_log out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    int key = -2;
    std::string rest;
    const std::string store = "chorus: store ", rank = "chorus: rank ",
                      rejected = " rejected a connection from ";
    if (line.starts_with(store)) {
      const auto colon = line.find(": ", store.size());
      if (colon != std::string::npos) {
        key = -1;
        rest = line.substr(colon + 2);
      }
    } else if (const auto at = line.find(rejected);
               line.starts_with(rank) && at != std::string::npos) {
      key = number(std::string_view(line).substr(rank.size(), at - rank.size()));
      rest = line.substr(at + rejected.size());
    }
    // rest: "127.0.0.1:PEER: REASON"; a rank's own connection reads "rank 3 (...)".
    const auto end = rest.find(": ");
    const auto port_at = end == std::string::npos ? end : rest.rfind(':', end - 1);
    const int port = port_at == std::string::npos
                         ? -1
                         : number(std::string_view(rest).substr(port_at + 1, end - port_at - 1));
    if (key < -1 || port < 0 || rest.starts_with("rank ")) {
      other.push_back(line);
      continue;
    }
    out[{key, port}].push_back(rest.substr(end + 2));
  }
  return out;
}

double throughput_gbps(const job_report& r) {
  return static_cast<double>(r.ops) * count * sizeof(float) / r.run_seconds / 1e9;
}

double max_setup(const job_report& r) {
  return *std::max_element(std::begin(r.setup_seconds), std::end(r.setup_seconds));
}

void print_other_lines(const char* run, const std::vector<std::string>& other) {
  if (other.empty()) return;
  std::printf("ranks' other stderr lines (%s run, %zu):\n", run, other.size());
  for (std::size_t i = 0; i < other.size() && i < 40; ++i) std::printf("  %s\n", other[i].c_str());
}

bool any_line_contains(const std::vector<std::string>& lines, const char* what) {
  return std::any_of(lines.begin(), lines.end(),
                     [&](const std::string& l) { return l.find(what) != std::string::npos; });
}

// What one kind of attack on one kind of port came to.
struct tally {
  int made = 0, connected = 0, refused = 0, no_socket = 0, logged = 0, with_listener = 0,
      orphaned = 0;
  std::vector<double> close_seconds;  // of the logged ones
  double with_listener_max = 0;
  double queued_max = 0;  // longest wait in a backlog before being accepted
  std::map<std::string, int> reasons;
};

std::string seconds_summary(std::vector<double> s) {
  if (s.empty()) return "-";
  std::sort(s.begin(), s.end());
  char text[64];
  std::snprintf(text, sizeof text, "%.3f / %.3f / %.3f", s.front(), s[s.size() / 2], s.back());
  return text;
}

}  // namespace

TEST_CASE(
    "an 8-rank job attacked on its real ports finishes exactly, and every bad connection "
    "is closed within 5 s with a logged reason") {
  // 1. The same job, unattacked: the baseline, and proof that nothing rejects a genuine rank.
  const job_result quiet = run_job({});
  std::vector<std::string> quiet_other;
  const auto quiet_rejections = parse_rejections(quiet.stderr_text, quiet_other);
  print_other_lines("quiet", quiet_other);
  CHECK_MESSAGE(quiet_rejections.empty(), "a rank rejected a connection with no attacker running");
  CHECK(quiet.report.ops > 0);

  // 2. The same job while the attacker runs.
  attacker a({.world = world});
  const job_result attacked =
      run_job([&](const std::vector<pid_t>& pids, int port) { a.start(pids, port); });
  a.finish();
  REQUIRE_MESSAGE(a.failure().empty(), "the attacker failed: " << a.failure());
  std::vector<std::string> other;
  auto rejections = parse_rejections(attacked.stderr_text, other);
  print_other_lines("attacked", other);
  CHECK_FALSE(any_line_contains(other, "uncaught exception"));
  CHECK_FALSE(any_line_contains(other, "server stopped"));
  CHECK(attacked.report.ops > 0);

  // 3. Every connection the attacker made, against what the ranks logged.
  const auto& targets = a.targets();
  std::map<std::pair<attack_kind, bool>, tally> tallies;  // (kind, at the store)
  std::vector<std::string> violations;
  for (const attack_record& r : a.records()) {
    const auto& target = targets[r.target];
    tally& t = tallies[{r.kind, target.store}];
    ++t.made;
    if (r.how == attack_record::ending::refused) ++t.refused;
    if (r.how == attack_record::ending::no_socket) ++t.no_socket;
    if (!r.connected) continue;
    ++t.connected;
    t.queued_max = std::max(t.queued_max, r.queued_seconds());
    const std::string what = std::string(to_string(r.kind)) + " to " + target.name() +
                             " from port " + std::to_string(r.local_port);
    if (r.how == attack_record::ending::open) {
      violations.push_back(what + ": never closed");
      continue;
    }
    auto& reasons = rejections[{target.store ? -1 : target.rank, r.local_port}];
    if (!reasons.empty()) {
      ++t.logged;
      ++t.reasons[reasons.front()];
      reasons.erase(reasons.begin());
      t.close_seconds.push_back(r.close_seconds());
      if (r.close_seconds() > close_bound_seconds) {
        violations.push_back(what + ": closed " + std::to_string(r.close_seconds()) +
                             " s after it was accepted");
      }
      continue;
    }
    // Not logged, and the server's kernel held no socket for it once its listener had gone:
    // its handshake completed on our side only (attacker.hpp, design point 6).
    if (r.how == attack_record::ending::orphaned) {
      ++t.orphaned;
      continue;
    }
    // Not logged: only a connection the server never accepted may end so, reset when its
    // listener closed with it still in the backlog (at the end of set-up, or of the job).
    // So it must have been maybe waiting when the listener was last seen, and have ended
    // when the listener went.
    const bool with_listener =
        target.gone &&
        std::max(*r.connected, r.queued_until.value_or(*r.connected)) >= target.last_seen &&
        *r.closed >= target.last_seen && *r.closed <= *target.gone + 2s;
    const double connect_to_close = std::chrono::duration<double>(*r.closed - *r.connected).count();
    if (with_listener) {
      ++t.with_listener;
      t.with_listener_max = std::max(t.with_listener_max, connect_to_close);
    } else {
      violations.push_back(what + ": closed " + std::to_string(connect_to_close) +
                           " s after connecting, with no logged reason");
    }
  }

  // 4. The report.
  std::printf("\nattacker: %zu listeners found (", targets.size());
  int data_listeners = 0;
  for (const auto& t : targets) {
    std::printf(" %s", t.name().c_str());
    if (!t.store) ++data_listeners;
  }
  std::printf(" ), %zu connections, %zu genuine handshakes captured%s%s, %s\n", a.records().size(),
              a.captured_handshakes(),
              a.capture_note().empty() ? "" : "; capture: ", a.capture_note().c_str(),
              a.realtime() ? "attacker at real-time priority"
                           : "ranks at nice 10 (real-time not permitted)");
  // made / conn: connections attempted / connected; refsd: refused at connect (no listener);
  // queued: longest wait in a backlog before accept; logged: closed with a logged reason,
  // accept to close in seconds; reset: never accepted, reset when the listener closed;
  // orphan: open on our side only, the server holding no socket for it after its listener went.
  std::printf("%-18s %-5s %5s %5s %5s %7s %6s %-24s %6s %7s %6s  %s\n", "kind", "port", "made",
              "conn", "refsd", "queued", "logged", "close s min/median/max", "reset", "reset s",
              "orphan", "reasons logged");
  for (const auto& [key, t] : tallies) {
    std::string reasons;
    for (const auto& [why, n] : t.reasons)
      reasons += (reasons.empty() ? "" : "; ") + std::to_string(n) + "x " + why;
    std::printf("%-18s %-5s %5d %5d %5d %7.3f %6d %-24s %6d %7.3f %6d  %s\n",
                to_string(key.first), key.second ? "store" : "data", t.made, t.connected,
                t.refused, t.queued_max, t.logged, seconds_summary(t.close_seconds).c_str(),
                t.with_listener, t.with_listener_max, t.orphaned, reasons.c_str());
  }
  for (const auto& [why, n] : a.skipped()) std::printf("not made: %dx %s\n", n, why.c_str());
  const double quiet_gbps = throughput_gbps(quiet.report);
  const double attacked_gbps = throughput_gbps(attacked.report);
  std::printf("job: %d ranks, all_reduce of %zu MiB per rank, tcp\n", world,
              count * sizeof(float) >> 20);
  std::printf("  quiet:    set-up %.2f s, %ld ops in %.2f s, %.3f GB/s\n", max_setup(quiet.report),
              quiet.report.ops, quiet.report.run_seconds, quiet_gbps);
  std::printf("  attacked: set-up %.2f s, %ld ops in %.2f s, %.3f GB/s (%.2f of quiet)\n",
              max_setup(attacked.report), attacked.report.ops, attacked.report.run_seconds,
              attacked_gbps, attacked_gbps / quiet_gbps);
  for (std::size_t i = 0; i < violations.size() && i < 20; ++i) {
    std::printf("VIOLATION: %s\n", violations[i].c_str());
  }
  std::fflush(stdout);

  // 5. What must hold.
  CHECK_MESSAGE(violations.empty(), violations.size() << " bad connections not closed in time "
                                                         "with a logged reason (listed above)");
  CHECK(std::any_of(targets.begin(), targets.end(), [](const auto& t) { return t.store; }));
  // Data listeners live for tens of milliseconds. Without real-time priority the attacker
  // may find none before set-up ends: said, not failed, as the store was still attacked.
  if (a.realtime()) {
    CHECK_MESSAGE(data_listeners >= 1, "no data listener was found during set-up");
  } else if (data_listeners == 0) {
    MESSAGE("set-up outran the attacker: no data listener found (no real-time priority)");
  }
  for (attack_kind k : chorus::test::all_attack_kinds) {
    if (k == attack_kind::replay && !a.capture_note().empty()) continue;  // said above
    CAPTURE(to_string(k));
    CHECK(tallies[{k, true}].connected > 0);
  }
}
