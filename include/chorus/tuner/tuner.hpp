// SPDX-License-Identifier: Apache-2.0
// The tuner: which algorithm a collective runs when the caller leaves it automatic.
//
// It prices every algorithm of the collective by running the algorithms' real schedules on
// the simulator (simulator.hpp) over this communicator's ranks and nodes, with link costs
// measured by a short probe when the communicator starts (detail/probe.hpp), and picks the
// fastest. Every rank computes the same pick from the same inputs (the probe's results are
// averaged across ranks), so all ranks run the same schedule. A tuning file can replace the
// costs and pin algorithms to size ranges; CHORUS_ALGO overrides both.
#pragma once

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "chorus/bootstrap/env.hpp"
#include "chorus/collectives.hpp"
#include "chorus/detail/log.hpp"
#include "chorus/error.hpp"
#include "chorus/schedule/build.hpp"
#include "chorus/schedule/schedule.hpp"
#include "chorus/topology.hpp"
#include "chorus/tuner/simulator.hpp"

namespace chorus {

/// The costs the tuner prices schedules with (per rank, as measured with every rank busy).
struct cost_model {
  link_cost intra{0.5e-6, 0.5 / 5e9, 0.5 / 5e9, 0.2e-6};  ///< between ranks of one node
  link_cost inter{10e-6, 0.5 / 2e9, 0.5 / 2e9, 3e-6};     ///< between nodes
  /// Between ranks of one node, a send the receiver reads in place (sim_network::pull): all
  /// of its per-byte cost is the receiver's. Used where `pulls`.
  link_cost pull{0.5e-6, 0, 1.0 / 8e9, 0.2e-6};
  /// Whether the ranks of a node read each other's exposed sends in place (the transport says
  /// so, and every rank agrees at creation; TCP never does).
  bool pulls = false;
  double reduce_s_per_byte = 1.0 / 20e9;            ///< applying a reduction
  double copy_s_per_byte = 1.0 / 20e9;              ///< a local copy
  /// Cores a node's ranks share where they outnumber them (0: a core per rank); the probe's
  /// per-byte costs are then one rank's with a core to itself.
  int cores_per_node = 0;
  /// A node's memory beyond its caches (sim_network::memory_s_per_byte, cache_bytes); 0: none.
  double memory_s_per_byte = 0;
  std::size_t cache_bytes = 0;
  std::string source = "defaults";  ///< "probe", "cache" (the job's earlier probe), "file", "defaults"
  /// Where the probe fitted latency and overhead: what it timed and the multipliers it chose
  /// ("barrier 206.5 us, ring all_gather 420.1 us, all_to_all 207.3 us: latency x1.52,
  /// overhead x0.87"); empty otherwise.
  std::string fitted;

  /// "intra 0.4 us (o 0.2 us) + 6.1 GB/s (+0.45 us over its first 2 KiB), pull ..., inter ...,
  /// reduce 19.5 GB/s, copy 21.0 GB/s (probe)": latency, per-message overhead of each end, the
  /// GB/s one rank moves each way while also receiving, and what a message's start adds
  /// (link_cost::small_s_per_byte; left out where nothing).
  std::string describe() const {
    auto link = [](const link_cost& c) {
      char buf[96];
      std::snprintf(buf, sizeof buf, "%.1f us (o %.1f us) + %.2f GB/s", c.latency_s * 1e6,
                    c.overhead_s * 1e6, 1e-9 / std::max(1e-30, c.send_s_per_byte + c.recv_s_per_byte));
      std::string text = buf;
      if (c.small_s_per_byte > 0) {
        std::snprintf(buf, sizeof buf, " (+%.2f us over its first %zu KiB)",
                      c.start_s() * 1e6,
                      link_cost::small_message_bytes >> 10);
        text += buf;
      }
      return text;
    };
    char tail[96];
    std::snprintf(tail, sizeof tail, ", reduce %.1f GB/s, copy %.1f GB/s", 1e-9 / reduce_s_per_byte,
                  1e-9 / copy_s_per_byte);
    const std::string cores =
        cores_per_node > 0 ? ", " + std::to_string(cores_per_node) + " cores per node" : "";
    char memory[96] = "";
    if (memory_s_per_byte > 0) {
      std::snprintf(memory, sizeof memory, ", memory %.1f GB/s beyond %zu MiB", 1e-9 / memory_s_per_byte,
                    cache_bytes >> 20);
    }
    return "intra " + link(intra) + (pulls ? ", pull " + link(pull) : "") + ", inter " + link(inter) + tail +
           cores + memory + " (" + source + (fitted.empty() ? "" : "; fitted to " + fitted) + ")";
  }
};

/// "collective bytes [ranks] algorithm" in a tuning file: `kind` runs `a` for sizes (bytes of
/// the call's count) in [min_bytes, max_bytes] on communicators of min_ranks..max_ranks.
struct tuning_rule {
  collective kind = collective::all_reduce;
  std::size_t min_bytes = 0, max_bytes = std::numeric_limits<std::size_t>::max();
  int min_ranks = 1, max_ranks = std::numeric_limits<int>::max();
  algo algorithm = algo::ring;
  std::string where;  ///< "file:line", for the log
};

/// A tuning file (CHORUS_TUNING_FILE): costs that replace the probe's and rules that pin
/// algorithms. One entry per line, '#' starts a comment:
///
///   cost intra 0.5 6.0 0.2    # latency in us, GB/s one rank moves each way, and optionally
///                             # each end's overhead per message in us and what a message's
///                             # first 2 KiB add to its time in flight, in us (intra, inter)
///   cost pull 0.5 8.0         # inside a node, sends read in place: GB/s the reader moves
///   cost inter 15 1.9
///   cost reduce 20            # GB/s
///   cost copy 21
///   cost memory 28 16M        # GB/s a core reads or writes memory beyond the caches, and
///                             # the bytes of a node's buffers the caches hold
///   rule all_reduce 0-32K rd           # sizes: N, N-M, N- (up), -M, *; K M G suffixes
///   rule all_reduce 32K- 2-8 ring      # optional rank range: N or N-M
///
/// The first rule that matches a call wins.
struct tuning_file {
  std::optional<link_cost> intra, inter, pull;
  std::optional<double> reduce_s_per_byte, copy_s_per_byte;
  std::optional<std::pair<double, std::size_t>> memory;  ///< cost_model::memory_s_per_byte, cache_bytes
  std::vector<tuning_rule> rules;

  /// Parses `text`; errors name `name` and the line.
  static tuning_file parse(std::string_view text, const std::string& name);
  static tuning_file load(const std::string& path);
};

/// How the tuner decides; from_env() reads the variables named per field.
struct tuner_options {
  /// CHORUS_TUNER: "probe" (default): measure the links when a communicator starts (a job's
  /// communicators of one shape share the first measurement); "fixed": no probe, the
  /// built-in costs (or the tuning file's).
  bool probe = true;
  /// CHORUS_TUNING_FILE: a tuning_file; empty: none.
  std::string file;

  static tuner_options from_env();
};

/// Picks an algorithm per (collective, size).
class tuner {
 public:
  tuner() = default;
  tuner(const topology& topo, cost_model costs, std::vector<tuning_rule> rules,
        executor_options exec)
      : topo_(topo), costs_(std::move(costs)), rules_(std::move(rules)), exec_(exec) {}
  tuner(const tuner& o) : topo_(o.topo_), costs_(o.costs_), rules_(o.rules_), exec_(o.exec_) {}
  tuner& operator=(const tuner& o) {
    if (this != &o) {
      topo_ = o.topo_;
      costs_ = o.costs_;
      rules_ = o.rules_;
      exec_ = o.exec_;
      std::lock_guard lk(m_);
      last_.store(nullptr, std::memory_order_relaxed);
      picks_.clear();
    }
    return *this;
  }

  /// The algorithm for `kind` with `count` elements of `elem_size` bytes (count as
  /// schedule.hpp defines it per collective). The same inputs give the same pick on every
  /// rank; picks are remembered. With CHORUS_DEBUG=INFO rank 0 logs each new pick and why.
  algo choose(collective kind, std::size_t count, std::size_t elem_size) const {
    const auto key = std::tuple(kind, count, elem_size);
    // The same call again, the common case in a training loop, takes no lock: a lock and
    // unlock cost ~20 ns here, a tenth of the software in an 8-byte all_reduce.
    if (const auto* last = last_.load(std::memory_order_acquire); last != nullptr && last->first == key) {
      return last->second;
    }
    {
      std::lock_guard lk(m_);
      if (auto it = picks_.find(key); it != picks_.end()) {
        last_.store(&*it, std::memory_order_release);
        return it->second;
      }
    }
    std::string why;
    const algo a = decide(kind, count, elem_size, why);
    if (topo_.rank == 0) detail::log(detail::log_level::info, 0, why);
    std::lock_guard lk(m_);
    last_.store(&*picks_.emplace(key, a).first, std::memory_order_release);
    return a;
  }

  /// Predicted seconds for `kind` run by `a` on this communicator (the simulator over the
  /// real schedules with this tuner's costs).
  double predict(collective kind, algo a, std::size_t count, std::size_t elem_size, int root = 0) const {
    return simulate(network(), {.kind = kind, .algorithm = a, .count = count,
                                .elem_size = elem_size, .root = root})
        .seconds;
  }

  /// The algorithms the model compares for `kind` here (some are left out where their
  /// schedules would be needlessly large to price: hierarchical on one node of many ranks).
  std::vector<algo> candidates(collective kind) const {
    std::vector<algo> v;
    for (algo a : algorithms_for(kind)) {
      if (worth_pricing(kind, a, topo_.size, topo_.nodes())) v.push_back(a);
    }
    return v;
  }
  /// Whether an algorithm priced at `seconds` is picked over the best so far, priced at
  /// `best_seconds`: ties (within 0.1%) keep the earlier one, in candidates()' order, so that
  /// a pick does not flip on rounding. chorus-sim's best, and bench/tuner/replay's, are this.
  static constexpr bool beats(double seconds, double best_seconds) noexcept {
    return seconds < best_seconds * 0.999;
  }

  /// Whether the tuner prices `a` for `kind` on `ranks` ranks in `nodes` nodes: not
  /// hierarchical on one node (it runs the direct algorithm's exchanges there, in another
  /// order, and measured no faster: the direct one is priced), nor direct reduce_scatter,
  /// all_gather or all_reduce beyond 64 ranks (P-1 messages per rank per round: never the
  /// fastest at that scale, and P^2 steps to simulate).
  static bool worth_pricing(collective kind, algo a, int ranks, int nodes) {
    if (a == algo::hierarchical && nodes == 1) return false;
    const bool flow = kind == collective::all_reduce || kind == collective::reduce_scatter ||
                      kind == collective::all_gather;
    return !(flow && a == algo::direct && ranks > 64);
  }

  /// The simulated network of this communicator under this tuner's costs.
  sim_network network() const {
    sim_network net;
    net.node_of = topo_.node_of;
    net.intra = costs_.intra;
    net.inter = costs_.inter;
    net.pull = costs_.pull;
    net.intra_pulls = costs_.pulls;
    net.inter_on_cpu = true;  // the probe measured per-rank costs with every rank busy
    net.reduce_s_per_byte = costs_.reduce_s_per_byte;
    net.copy_s_per_byte = costs_.copy_s_per_byte;
    net.cores_per_node = costs_.cores_per_node;
    net.memory_s_per_byte = costs_.memory_s_per_byte;
    net.cache_bytes = costs_.cache_bytes;
    net.exec = exec_;
    return net;
  }

  const cost_model& costs() const noexcept { return costs_; }
  const std::vector<tuning_rule>& rules() const noexcept { return rules_; }

 private:
  algo decide(collective kind, std::size_t count, std::size_t elem_size, std::string& why) const {
    const std::size_t bytes = count * elem_size;
    std::string what = std::string(to_string(kind)) + " of " + std::to_string(bytes) + " B on " +
                       std::to_string(topo_.size) + " ranks (" + topo_.describe() + ")";
    for (const tuning_rule& r : rules_) {
      if (r.kind == kind && bytes >= r.min_bytes && bytes <= r.max_bytes && topo_.size >= r.min_ranks &&
          topo_.size <= r.max_ranks) {
        why = "tuner: " + what + " -> " + std::string(to_string(r.algorithm)) + " (rule at " + r.where + ")";
        return r.algorithm;
      }
    }
    const std::vector<algo> cands = candidates(kind);
    if (cands.empty()) throw error(errc::invalid_argument, std::string(to_string(kind)) + " has no algorithm");
    if (cands.size() == 1) {
      why = "tuner: " + what + " -> " + std::string(to_string(cands[0])) + " (its only algorithm)";
      return cands[0];
    }
    algo best = cands[0];
    double best_s = std::numeric_limits<double>::infinity();
    std::string priced;
    for (algo a : cands) {
      const double s = predict(kind, a, count, elem_size);
      char buf[64];
      std::snprintf(buf, sizeof buf, "%s %.1f us", std::string(to_string(a)).c_str(), s * 1e6);
      priced += (priced.empty() ? "" : ", ") + std::string(buf);
      if (beats(s, best_s)) {
        best_s = s;
        best = a;
      }
    }
    why = "tuner: " + what + ": " + priced + " -> " + std::string(to_string(best)) + " (costs: " +
          costs_.describe() + ")";
    return best;
  }

  topology topo_;
  cost_model costs_;
  std::vector<tuning_rule> rules_;
  executor_options exec_{};
  using pick_map = std::map<std::tuple<collective, std::size_t, std::size_t>, algo>;
  mutable std::mutex m_;
  mutable pick_map picks_;  // nodes never move or go (but in operator=): last_ points into it
  mutable std::atomic<const pick_map::value_type*> last_{nullptr};
};

// ---------------------------------------------------------------------------------------

inline tuner_options tuner_options::from_env() {
  tuner_options o;
  if (const char* v = std::getenv("CHORUS_TUNER"); v != nullptr && *v != '\0') {
    const std::string_view s(v);
    if (s != "probe" && s != "fixed") {
      throw error(errc::invalid_argument, "CHORUS_TUNER='" + std::string(s) + "' is neither 'probe' nor 'fixed'");
    }
    o.probe = s == "probe";
  }
  if (const char* v = std::getenv("CHORUS_TUNING_FILE"); v != nullptr && *v != '\0') o.file = v;
  return o;
}

namespace detail {

/// "64K" -> 65536; K, M, G are powers of 1024. Returns nothing for anything else.
inline std::optional<std::size_t> parse_bytes(std::string_view s) {
  if (s.empty()) return std::nullopt;
  std::size_t mult = 1;
  switch (s.back()) {
    case 'K': case 'k': mult = std::size_t{1} << 10; s.remove_suffix(1); break;
    case 'M': case 'm': mult = std::size_t{1} << 20; s.remove_suffix(1); break;
    case 'G': case 'g': mult = std::size_t{1} << 30; s.remove_suffix(1); break;
    default: break;
  }
  if (s.empty() || s.size() > 15) return std::nullopt;
  std::size_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + static_cast<std::size_t>(c - '0');
  }
  return v * mult;
}

/// "A-B", "A-", "-B", "A" or "*" as an inclusive range.
inline std::optional<std::pair<std::size_t, std::size_t>> parse_range(std::string_view s) {
  constexpr std::size_t top = std::numeric_limits<std::size_t>::max();
  if (s == "*") return std::pair<std::size_t, std::size_t>{0, top};
  const std::size_t dash = s.find('-');
  if (dash == std::string_view::npos) {
    auto v = parse_bytes(s);
    if (!v) return std::nullopt;
    return std::pair{*v, *v};
  }
  const std::string_view a = s.substr(0, dash), b = s.substr(dash + 1);
  std::optional<std::size_t> lo = a.empty() ? std::optional<std::size_t>(0) : parse_bytes(a);
  std::optional<std::size_t> hi = b.empty() ? std::optional<std::size_t>(top) : parse_bytes(b);
  if (!lo || !hi || *lo > *hi) return std::nullopt;
  return std::pair{*lo, *hi};
}

}  // namespace detail

inline tuning_file tuning_file::parse(std::string_view text, const std::string& name) {
  tuning_file f;
  std::istringstream in{std::string(text)};
  std::string line;
  int lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    const std::string where = name + ":" + std::to_string(lineno);
    auto bad = [&](const std::string& why) {
      return error(errc::invalid_argument, "tuning file " + where + ": " + why + " in '" + line + "'");
    };
    if (const auto hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    std::istringstream words(line);
    std::vector<std::string> w;
    for (std::string x; words >> x;) w.push_back(x);
    if (w.empty()) continue;
    auto number = [&](const std::string& s) {
      char* end = nullptr;
      const double v = std::strtod(s.c_str(), &end);
      if (end == s.c_str() || *end != '\0' || !std::isfinite(v) || v <= 0) throw bad("'" + s + "' is not a positive number");
      return v;
    };
    if (w[0] == "cost") {
      const bool link = w.size() >= 2 && (w[1] == "intra" || w[1] == "inter" || w[1] == "pull");
      if (link && (w.size() == 4 || w.size() == 5 || (w.size() == 6 && w[1] != "pull"))) {
        const double us = number(w[2]), gbps = number(w[3]);
        const double o = w.size() >= 5 ? number(w[4]) : 0.0;
        if (w[1] == "pull") {
          f.pull = link_cost{us * 1e-6, 0, 1e-9 / gbps, o * 1e-6};
        } else {
          link_cost l{us * 1e-6, 0.5e-9 / gbps, 0.5e-9 / gbps, o * 1e-6};
          if (w.size() == 6) {
            l.set_start_s(number(w[5]) * 1e-6);
          }
          (w[1] == "intra" ? f.intra : f.inter) = l;
        }
      } else if (w.size() == 3 && (w[1] == "reduce" || w[1] == "copy")) {
        (w[1] == "reduce" ? f.reduce_s_per_byte : f.copy_s_per_byte) = 1e-9 / number(w[2]);
      } else if (w.size() == 4 && w[1] == "memory") {
        const double gbps = number(w[2]);
        const auto cache = detail::parse_bytes(w[3]);
        if (!cache) throw bad("'" + w[3] + "' is not a size");
        f.memory = std::pair{1e-9 / gbps, *cache};
      } else {
        throw bad("expected 'cost intra|inter|pull LATENCY_US GBPS [OVERHEAD_US]', 'cost intra|inter "
                  "LATENCY_US GBPS OVERHEAD_US SMALL_US', 'cost reduce|copy GBPS' or 'cost memory GBPS CACHE_BYTES'");
      }
    } else if (w[0] == "rule") {
      if (w.size() != 4 && w.size() != 5) throw bad("expected 'rule COLLECTIVE BYTES [RANKS] ALGORITHM'");
      tuning_rule r;
      r.where = where;
      const auto c = parse_collective(w[1]);
      if (!c) throw bad("'" + w[1] + "' is not a collective");
      r.kind = *c;
      const auto sizes = detail::parse_range(w[2]);
      if (!sizes) throw bad("'" + w[2] + "' is not a size range");
      r.min_bytes = sizes->first;
      r.max_bytes = sizes->second;
      if (w.size() == 5) {
        const auto ranks = detail::parse_range(w[3]);
        if (!ranks || ranks->first == 0 || ranks->first > 1u << 30) throw bad("'" + w[3] + "' is not a rank range");
        r.min_ranks = static_cast<int>(ranks->first);
        r.max_ranks = static_cast<int>(std::min<std::size_t>(ranks->second, std::numeric_limits<int>::max()));
      }
      const auto a = parse_algo(w.back());
      if (!a || *a == algo::automatic) throw bad("'" + w.back() + "' is not an algorithm");
      if (!implements(r.kind, *a)) {
        throw bad(std::string(to_string(r.kind)) + " has no " + std::string(to_string(*a)) + " algorithm");
      }
      r.algorithm = *a;
      f.rules.push_back(r);
    } else {
      throw bad("'" + w[0] + "' is neither 'cost' nor 'rule'");
    }
  }
  return f;
}

inline tuning_file tuning_file::load(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw error(errc::invalid_argument, "CHORUS_TUNING_FILE='" + path + "' cannot be read");
  std::stringstream all;
  all << in.rdbuf();
  return parse(all.str(), path);
}

}  // namespace chorus
