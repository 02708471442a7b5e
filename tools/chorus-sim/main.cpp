// SPDX-License-Identifier: Apache-2.0
// chorus-sim: predicts the time and bus bandwidth of a collective for each of its algorithms
// by running their real schedules, rank by rank, over a simulated cluster (chorus/tuner/
// simulator.hpp), from 1 to tens of thousands of ranks, in one process.
//
// Usage: chorus-sim --ranks N [--topology flat | nodes:M | fattree:M:L:O] [--collective C]
//                   [--algo A,B,...] [-b BYTES] [-e BYTES] [-f FACTOR] [--root R] [--dtype T]
//                   [--intra US:GBPS] [--pull US:GBPS] [--inter US:GBPS] [--reduce GBPS] [--copy GBPS]
//                   [--costs FILE] [--cpu] [--fold-above N] [--json FILE]
//
//   $ chorus-sim --ranks 1024 --topology nodes:8 -b 1M -e 64M -f 64
//   # chorus-sim: all_reduce, 1024 ranks (128 nodes x 8 ranks), ...
//   #        size  ring time  busbw  tree time  busbw  ...  best
//       1048576     ...
//
// Topologies: `flat`, one rank per node, every node on one non-blocking switch; `nodes:M`,
// nodes of M ranks on one switch; `fattree:M:L:O`, nodes of M ranks, L nodes per leaf switch,
// leaf uplinks oversubscribed O:1. Ranks of a node share memory (--intra: each rank's port)
// and the node's NIC (--inter: latency and the NIC's GB/s each way); with --cpu, inter-node
// transfers are priced on the ranks' cores instead (TCP between processes of one machine, as
// the tuner prices it). Sizes follow nccl-tests: bytes of the call's largest buffer, busbw in
// DESIGN.md's units. Exit status: 0, or 2 for a bad command line.

#include <chorus/collectives.hpp>
#include <chorus/tuner/simulator.hpp>
#include <chorus/tuner/tuner.hpp>

#include <malloc.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

namespace {

struct usage_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct options {
  int ranks = 0;
  int per_node = 1;
  int cores = 0;  // per node; 0: a core per rank
  double pool_after_s = chorus::sim_network{}.pool_after_s;
  int nodes_per_leaf = 0;
  double oversubscription = 1;
  std::string topology = "flat";
  chorus::collective kind = chorus::collective::all_reduce;
  std::vector<chorus::algo> algos;
  std::size_t min_bytes = 8, max_bytes = std::size_t{256} << 20;
  double factor = 8;
  int root = 0;
  chorus::dtype type = chorus::dtype::float32;
  // Assumed costs of a cluster node (documented in --help): shared memory inside a node,
  // a 200 Gb/s NIC per node between nodes.
  chorus::link_cost intra{0.5e-6, 0.5 / 20e9, 0.5 / 20e9, 0.1e-6};
  chorus::link_cost pull{0.5e-6, 0, 1.0 / 20e9, 0.1e-6};
  chorus::link_cost inter{5e-6, 1.0 / 25e9, 1.0 / 25e9, 1e-6};
  double reduce_s_per_byte = 1.0 / 20e9, copy_s_per_byte = 1.0 / 20e9;
  double memory_s_per_byte = 0;
  std::size_t cache_bytes = 0;
  bool cpu = false;
  bool pulls = true;
  chorus::executor_options exec{};
  int fold_above = 4096;
  std::string json;
};

void help() {
  std::printf(
      "usage: chorus-sim --ranks N [flags]\n"
      "  --ranks N              ranks to simulate (1 .. 65536)\n"
      "  --topology T           flat (default) | nodes:M | fattree:M:L:O (M ranks per node, L nodes\n"
      "                         per leaf switch, uplinks oversubscribed O:1)\n"
      "  --collective C         all_reduce (default), reduce_scatter, all_gather, broadcast, reduce,\n"
      "                         all_to_all, gather, scatter, barrier, send_recv (every rank sends\n"
      "                         to rank + 1 and receives from rank - 1, as sendrecv_perf)\n"
      "  --algo A,B             algorithms to compare (default: every one the collective has)\n"
      "  -b, -e, -f             smallest and largest size in bytes (K/M/G suffixes), factor\n"
      "                         (defaults 8, 256M, 8)\n"
      "  --root R, --dtype T    rooted collectives' root (0); element type (float)\n"
      "  --intra US:GBPS[:O[:S]] inside a node: latency, GB/s each way per rank, each end's\n"
      "                         overhead per message in us (0.5:20:0.1), and what a message's\n"
      "                         first 2 KiB add to its time in flight, in us (none)\n"
      "  --pull US:GBPS[:O]     inside a node, sends of direct and hierarchical steps that the\n"
      "                         receiver reads in place: latency, GB/s it reads, overhead (0.5:20:0.1)\n"
      "  --inter US:GBPS[:O[:S]] between nodes: latency, the node NIC's GB/s each way, overhead,\n"
      "                         a message's first 2 KiB (5:25:1, none)\n"
      "  --reduce GBPS, --copy GBPS  reduction and local copy speed per core (20, 20)\n"
      "  --memory GBPS:CACHE    bytes a core reads or writes in the ranks' buffers cost it 1/GBPS ns\n"
      "                         more each, for the share of them beyond the CACHE bytes of a node's\n"
      "                         buffers that its caches hold (e.g. 28:16M; default: no such cost)\n"
      "  --costs FILE           read 'cost' lines of a tuning file (CHORUS_TUNING_FILE format)\n"
      "  --no-pull              inside a node every send goes through the link (TCP between the\n"
      "                         ranks of a node); default: reading in place as --pull prices,\n"
      "                         and reducing receives lent in place from a ring of 4 x\n"
      "                         --max-slice (chorus's 1 MiB ring: --max-slice 256K)\n"
      "  --cpu                  price inter-node transfers on the ranks' cores (TCP on one machine)\n"
      "  --slice B, --window N  the executor's largest slice (2M) and slices in flight per peer (8)\n"
      "  --max-slice B          the transport's cap on a slice (64M; chorus's shared memory: a\n"
      "                         quarter of its ring, 256K by default)\n"
      "  --cores C              each node's ranks share C cores (default: a core per rank)\n"
      "  --pool-after MS        with --cores: how long a collective runs before the scheduler has\n"
      "                         evened out the shared cores' load (20); the time priced with the\n"
      "                         cores pooled weighs pooled / (pooled + MS), the rest as dealt out\n"
      "                         (0: dealt out only)\n"
      "  --fold-above N         above N ranks (4096), where every node runs what the first does\n"
      "                         and receives from one other node, simulate only the first (0: at\n"
      "                         any size)\n"
      "  --json FILE            also write the rows as JSON (each with its size's best)\n");
}

std::size_t parse_size(std::string_view flag, std::string_view v) {
  const auto b = chorus::detail::parse_bytes(v);
  if (!b) throw usage_error(std::string(flag) + " wants a size such as 8, 64K or 256M, not '" + std::string(v) + "'");
  return *b;
}

double parse_positive(std::string_view flag, const std::string& v) {
  char* end = nullptr;
  const double d = std::strtod(v.c_str(), &end);
  if (end == v.c_str() || *end != '\0' || !(d > 0) || d > 1e12) {
    throw usage_error(std::string(flag) + " wants a positive number, not '" + v + "'");
  }
  return d;
}

int parse_int(std::string_view flag, const std::string& v, int lo, int hi) {
  char* end = nullptr;
  const long d = std::strtol(v.c_str(), &end, 10);
  if (end == v.c_str() || *end != '\0' || d < lo || d > hi) {
    throw usage_error(std::string(flag) + " wants a whole number in [" + std::to_string(lo) + ", " +
                      std::to_string(hi) + "], not '" + v + "'");
  }
  return static_cast<int>(d);
}

std::vector<std::string> split(const std::string& s, char sep);

/// LATENCY_US:GBPS[:OVERHEAD_US]; GBPS is what one port moves each way.
chorus::link_cost parse_link(std::string_view flag, const std::string& v, bool per_node) {
  const auto parts = split(v, ':');
  if (parts.size() < 2 || parts.size() > 4) {
    throw usage_error(std::string(flag) + " wants LATENCY_US:GBPS[:OVERHEAD_US[:SMALL_US]], not '" + v + "'");
  }
  const double us = parse_positive(flag, parts[0]);
  const double gbps = parse_positive(flag, parts[1]);
  const double o = parts.size() >= 3 ? parse_positive(flag, parts[2]) : 0.0;
  // A rank's port (the cores) sends and receives through one core: each way takes half of
  // it. A node's NIC has a port each way.
  const double share = per_node ? 1.0 : 0.5;
  chorus::link_cost l{us * 1e-6, share * 1e-9 / gbps, share * 1e-9 / gbps, o * 1e-6};
  if (parts.size() == 4) {
    l.set_start_s(parse_positive(flag, parts[3]) * 1e-6);
  }
  return l;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::size_t at = 0;
  for (;;) {
    const auto next = s.find(sep, at);
    out.push_back(s.substr(at, next == std::string::npos ? std::string::npos : next - at));
    if (next == std::string::npos) return out;
    at = next + 1;
  }
}

options parse(int argc, char** argv) {
  options o;
  std::string inter_text;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "-h" || a == "--help") {
      help();
      std::exit(0);
    }
    if (a == "--cpu") {
      o.cpu = true;
      continue;
    }
    if (a == "--no-pull") {
      o.pulls = false;
      continue;
    }
    if (i + 1 >= argc) throw usage_error(std::string(a) + " needs a value (see --help)");
    const std::string v = argv[++i];
    if (a == "--ranks") {
      o.ranks = parse_int(a, v, 1, 65536);
    } else if (a == "--topology") {
      o.topology = v;
      const auto parts = split(v, ':');
      if (parts[0] == "flat" && parts.size() == 1) {
        o.per_node = 1;
      } else if (parts[0] == "nodes" && parts.size() == 2) {
        o.per_node = parse_int("--topology nodes:M", parts[1], 1, 65536);
      } else if (parts[0] == "fattree" && parts.size() == 4) {
        o.per_node = parse_int("--topology fattree:M", parts[1], 1, 65536);
        o.nodes_per_leaf = parse_int("--topology fattree:M:L", parts[2], 1, 65536);
        o.oversubscription = parse_positive("--topology fattree:M:L:O", parts[3]);
      } else {
        throw usage_error("--topology wants flat, nodes:M or fattree:M:L:O, not '" + v + "'");
      }
    } else if (a == "--collective") {
      const auto c = chorus::parse_collective(v);
      if (!c || *c == chorus::collective::all_to_allv) {
        throw usage_error("--collective: '" + v + "' is not a collective chorus-sim prices");
      }
      o.kind = *c;
    } else if (a == "--algo") {
      for (const auto& name : split(v, ',')) {
        const auto al = chorus::parse_algo(name);
        if (!al || *al == chorus::algo::automatic) throw usage_error("--algo: '" + name + "' is not an algorithm");
        o.algos.push_back(*al);
      }
    } else if (a == "-b") {
      o.min_bytes = parse_size(a, v);
    } else if (a == "-e") {
      o.max_bytes = parse_size(a, v);
    } else if (a == "-f") {
      o.factor = parse_positive(a, v);
    } else if (a == "--root") {
      o.root = parse_int(a, v, 0, 65535);
    } else if (a == "--dtype") {
      bool found = false;
      for (int t = 0; t < chorus::dtype_count; ++t) {
        if (v == chorus::to_string(static_cast<chorus::dtype>(t)) ||
            (v == "float" && t == 0) || (v == "double" && t == 1) || (v == "half" && t == 2)) {
          o.type = static_cast<chorus::dtype>(t);
          found = true;
        }
      }
      if (!found) throw usage_error("--dtype: '" + v + "' is not a dtype");
    } else if (a == "--intra") {
      o.intra = parse_link(a, v, false);
    } else if (a == "--pull") {
      const chorus::link_cost l = parse_link(a, v, true);  // one end's GB/s: the reader's
      if (l.small_s_per_byte > 0) throw usage_error("--pull wants LATENCY_US:GBPS[:OVERHEAD_US], not '" + v + "'");
      o.pull = {l.latency_s, 0, l.send_s_per_byte, l.overhead_s};
    } else if (a == "--inter") {
      inter_text = v;
    } else if (a == "--cores") {
      o.cores = parse_int(a, v, 1, 65536);
    } else if (a == "--pool-after") {
      o.pool_after_s = v == "0" ? 0.0 : parse_positive(a, v) * 1e-3;
    } else if (a == "--reduce") {
      o.reduce_s_per_byte = 1e-9 / parse_positive(a, v);
    } else if (a == "--copy") {
      o.copy_s_per_byte = 1e-9 / parse_positive(a, v);
    } else if (a == "--memory") {
      const auto parts = split(v, ':');
      if (parts.size() != 2) throw usage_error("--memory wants GBPS:CACHE (e.g. 28:16M), not '" + v + "'");
      o.memory_s_per_byte = 1e-9 / parse_positive(a, parts[0]);
      o.cache_bytes = parse_size(a, parts[1]);
    } else if (a == "--costs") {
      const chorus::tuning_file f = chorus::tuning_file::load(v);
      if (f.intra) o.intra = *f.intra;
      if (f.pull) o.pull = *f.pull;
      if (f.inter) o.inter = *f.inter;
      if (f.reduce_s_per_byte) o.reduce_s_per_byte = *f.reduce_s_per_byte;
      if (f.copy_s_per_byte) o.copy_s_per_byte = *f.copy_s_per_byte;
      if (f.memory) std::tie(o.memory_s_per_byte, o.cache_bytes) = *f.memory;
    } else if (a == "--json") {
      o.json = v;
    } else if (a == "--slice") {
      o.exec.slice_bytes = parse_size(a, v);
      if (o.exec.slice_bytes < 4096) throw usage_error("--slice must be at least 4K");
    } else if (a == "--window") {
      o.exec.window = static_cast<std::size_t>(parse_int(a, v, 1, 64));
    } else if (a == "--max-slice") {
      o.exec.max_slice_bytes = parse_size(a, v);
      if (o.exec.max_slice_bytes == 0) throw usage_error("--max-slice must be positive");
    } else if (a == "--fold-above") {
      o.fold_above = parse_int(a, v, 0, 1 << 30);
    } else {
      throw usage_error("unknown flag '" + std::string(a) + "' (see --help)");
    }
  }
  // The NIC's GB/s is per direction of one port unless priced on the cores (--cpu).
  if (!inter_text.empty()) o.inter = parse_link("--inter", inter_text, !o.cpu);
  if (o.ranks == 0) throw usage_error("--ranks is required (see --help)");
  if (o.min_bytes > o.max_bytes) throw usage_error("-b is larger than -e");
  if (o.factor <= 1 && o.min_bytes != o.max_bytes) throw usage_error("-f must be > 1");
  if (o.root >= o.ranks) throw usage_error("--root must be a rank below --ranks");
  if (o.kind == chorus::collective::send_recv && o.ranks < 2) {
    throw usage_error("--collective send_recv needs --ranks 2 or more (a rank cannot send to itself)");
  }
  if (o.ranks % o.per_node != 0) throw usage_error("--ranks must be a multiple of the ranks per node");
  if (o.algos.empty()) {
    // Those the tuner would price; --algo names any.
    for (chorus::algo al : chorus::algorithms_for(o.kind)) {
      if (chorus::tuner::worth_pricing(o.kind, al, o.ranks, (o.ranks + o.per_node - 1) / o.per_node)) {
        o.algos.push_back(al);
      }
    }
  }
  for (chorus::algo al : o.algos) {
    if (!chorus::implements(o.kind, al)) {
      throw usage_error(std::string(chorus::to_string(o.kind)) + " has no " + std::string(chorus::to_string(al)) + " algorithm");
    }
  }
  return o;
}

/// nccl-tests' units: the call's count from the size, and the bus factor.
std::size_t count_for(chorus::collective k, std::size_t bytes, std::size_t es, int n) {
  const auto nn = static_cast<std::size_t>(n);
  switch (k) {
    case chorus::collective::reduce_scatter:
    case chorus::collective::all_gather:
    case chorus::collective::all_to_all:
    case chorus::collective::gather:
    case chorus::collective::scatter: return bytes / es / nn;
    case chorus::collective::barrier: return 0;
    default: return bytes / es;
  }
}

double bus_factor(chorus::collective k, int n) {
  const double nn = n;
  switch (k) {
    case chorus::collective::all_reduce: return 2 * (nn - 1) / nn;
    case chorus::collective::reduce_scatter:
    case chorus::collective::all_gather:
    case chorus::collective::all_to_all:
    case chorus::collective::gather:
    case chorus::collective::scatter: return (nn - 1) / nn;
    default: return 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  // Every rank's schedule is built, compiled into its program and freed in turn: megabytes
  // each at thousands of ranks. Kept in the process instead of handed back to the kernel and
  // faulted in again, 1,024-rank ring all_reduce took 20% less CPU time.
  mallopt(M_MMAP_THRESHOLD, 1 << 30);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  mallopt(M_TOP_PAD, 64 << 20);
  options o;
  // --json is opened before the simulations, so that a file that cannot be written fails at
  // once (a 16,384-rank sweep takes minutes), and written after them.
  std::ofstream json_file;
  try {
    o = parse(argc, argv);
    if (!o.json.empty()) {
      json_file.open(o.json);
      if (!json_file) throw usage_error("--json " + o.json + " cannot be written: " + std::strerror(errno));
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "chorus-sim: %s\n", e.what());
    return 2;
  }
  chorus::sim_network net;
  net.node_of = chorus::sim_network::nodes_of(o.ranks, o.per_node);
  net.intra = o.intra;
  net.pull = o.pull;
  net.intra_pulls = o.pulls;  // chorus's shared memory reads direct sends in place on Linux
  net.inter = o.inter;
  net.inter_on_cpu = o.cpu;
  net.nodes_per_leaf = o.nodes_per_leaf;
  net.oversubscription = o.oversubscription;
  net.cores_per_node = o.cores < o.per_node ? o.cores : 0;
  net.pool_after_s = o.pool_after_s;
  net.reduce_s_per_byte = o.reduce_s_per_byte;
  net.copy_s_per_byte = o.copy_s_per_byte;
  net.memory_s_per_byte = o.memory_s_per_byte;
  net.cache_bytes = o.cache_bytes;
  net.fold_above = o.fold_above;
  net.exec = o.exec;
  const std::size_t es = chorus::size_of(o.type);
  const int nodes = (o.ranks + o.per_node - 1) / o.per_node;

  std::string cores;
  if (net.cores_per_node > 0) {
    char pool[48] = ", dealt out";
    if (net.pool_after_s > 0) std::snprintf(pool, sizeof pool, ", pooled after %g ms", net.pool_after_s * 1e3);
    cores = " on " + std::to_string(net.cores_per_node) + " cores" + pool;
  }
  std::printf("# chorus-sim: %s, %d ranks (%d nodes x %d ranks%s%s), %s\n",
              std::string(chorus::to_string(o.kind)).c_str(), o.ranks, nodes, o.per_node, cores.c_str(),
              o.nodes_per_leaf > 0 ? (", " + std::to_string(o.nodes_per_leaf) + " nodes per leaf, " +
                                      std::to_string(o.oversubscription) + ":1 uplinks").c_str()
                                   : "",
              std::string(chorus::to_string(o.type)).c_str());
  char pull_text[48] = "not read in place";
  if (o.pulls) std::snprintf(pull_text, sizeof pull_text, "read in place: %.1f GB/s", 1e-9 / o.pull.recv_s_per_byte);
  std::printf("# intra %.2f us (o %.2f) + %.1f GB/s per rank (%s), inter %.2f us (o %.2f) + %.1f GB/s %s, reduce %.1f GB/s, copy %.1f GB/s\n",
              o.intra.latency_s * 1e6, o.intra.overhead_s * 1e6,
              1e-9 / (o.intra.send_s_per_byte + o.intra.recv_s_per_byte), pull_text,
              o.inter.latency_s * 1e6, o.inter.overhead_s * 1e6,
              o.cpu ? 1e-9 / (o.inter.send_s_per_byte + o.inter.recv_s_per_byte) : 1e-9 / o.inter.send_s_per_byte,
              o.cpu ? "per rank (on the cores)" : "per node NIC", 1e-9 / o.reduce_s_per_byte,
              1e-9 / o.copy_s_per_byte);
  for (const auto& [name, l] : {std::pair{"intra", o.intra}, std::pair{"inter", o.inter}}) {
    if (l.small_s_per_byte > 0) {
      std::printf("# %s: a message's first %zu B take %.2f us more in flight\n", name,
                  chorus::link_cost::small_message_bytes,
                  l.start_s() * 1e6);
    }
  }
  if (o.memory_s_per_byte > 0) {
    std::printf("# memory %.1f GB/s per core beyond %zu B of a node's ranks' buffers\n", 1e-9 / o.memory_s_per_byte,
                o.cache_bytes);
  }
  if (const chorus::executor_options usual; o.exec.slice_bytes != usual.slice_bytes || o.exec.window != usual.window ||
                                              o.exec.max_slice_bytes != usual.max_slice_bytes) {
    std::printf("# slice %zu B, window %zu, transport's largest slice %zu B\n", o.exec.slice_bytes, o.exec.window,
                o.exec.max_slice_bytes);
  }
  std::printf("# %12s", "size (B)");
  for (chorus::algo a : o.algos) std::printf("  %18s", (std::string(chorus::to_string(a)) + " us|GB/s").c_str());
  std::printf("  %s\n", "best");

  std::string json = "[";
  int folded = 0, runs = 0, fold_ranks = 0;
  const double bus = bus_factor(o.kind, o.ranks);
  for (std::size_t bytes = o.min_bytes;;) {
    const std::size_t count = count_for(o.kind, bytes, es, o.ranks);
    std::printf("  %12zu", bytes);
    double best = std::numeric_limits<double>::infinity();
    chorus::algo best_algo = o.algos.front();
    std::vector<std::string> rows;  // this size's JSON rows, less their best
    for (chorus::algo a : o.algos) {
      const auto t0 = std::chrono::steady_clock::now();
      const chorus::sim_result r = chorus::simulate(
          net, {.kind = o.kind, .algorithm = a, .count = count, .elem_size = es, .root = o.root});
      const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const double busbw = r.seconds > 0 ? static_cast<double>(bytes) / r.seconds * bus / 1e9 : 0;
      ++runs;
      if (r.simulated < o.ranks) {
        ++folded;
        fold_ranks = r.simulated;
      }
      std::printf("  %10.1f|%7.2f", r.seconds * 1e6, busbw);
      std::fflush(stdout);
      if (chorus::tuner::beats(r.seconds, best)) {  // the tuner's pick, ties to the earlier
        best = r.seconds;
        best_algo = a;
      }
      char row[320];
      std::snprintf(row, sizeof row,
                    "{\"size\": %zu, \"count\": %zu, \"algo\": \"%s\", \"time_us\": %.3f, \"busbw\": %.4f, "
                    "\"messages\": %llu, \"events\": %llu, \"simulated\": %d, \"compared\": %d, "
                    "\"sim_seconds\": %.3f",
                    bytes, count, std::string(chorus::to_string(a)).c_str(), r.seconds * 1e6, busbw,
                    static_cast<unsigned long long>(r.messages), static_cast<unsigned long long>(r.events),
                    r.simulated, r.compared, wall);
      rows.emplace_back(row);
    }
    const std::string best_name(chorus::to_string(best_algo));
    for (const std::string& row : rows) {
      json += (json.size() > 1 ? ",\n " : "") + row + ", \"best\": \"" + best_name + "\"}";
    }
    std::printf("  %s\n", best_name.c_str());
    if (bytes >= o.max_bytes) break;
    const auto next = static_cast<std::size_t>(static_cast<double>(bytes) * o.factor);
    bytes = std::min(o.max_bytes, std::max(next, bytes + 1));
  }
  if (folded > 0) {
    std::printf("# folded: %d of %d simulations ran %d ranks for all %d (every node's programs those of "
                "the first)\n",
                folded, runs, fold_ranks, o.ranks);
  }
  json += "]\n";
  if (!o.json.empty()) {
    json_file << json;
    json_file.close();
    if (!json_file) {
      std::fprintf(stderr, "chorus-sim: writing --json %s failed\n", o.json.c_str());
      return 1;
    }
  }
  return 0;
}
