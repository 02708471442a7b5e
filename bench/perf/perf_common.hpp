// SPDX-License-Identifier: Apache-2.0
// The driver behind every *_perf binary (all_reduce, reduce_scatter, all_gather, broadcast,
// reduce, alltoall, gather, scatter, sendrecv): flags, size sweep, timing, exact result check,
// the tuner's prediction and nccl-tests style output.
//
// Units follow nccl-tests (DESIGN.md, "Units"). `count` is the count argument of the call
// (elements per rank: the all_reduce/broadcast/reduce buffer, one rank's block of
// reduce_scatter/all_gather/alltoall/gather/scatter, the sendrecv message). `size` is the
// largest buffer of one rank in bytes:
//   all_reduce, broadcast, reduce, sendrecv  count * elem        (the buffer)
//   reduce_scatter, all_gather               n * count * elem    (the gathered buffer)
//   alltoall                                 n * count * elem    (the whole send buffer)
//   gather, scatter                          n * count * elem    (the root's whole buffer)
// algbw = size / time in GB/s (1e9 bytes/s); busbw = algbw * factor, the factor being
//   all_reduce                                            2(n-1)/n
//   reduce_scatter, all_gather, alltoall, gather, scatter (n-1)/n
//   broadcast, reduce, sendrecv                           1
// `time` is the mean of -n back-to-back operations timed as one block after -w warm-up
// operations, the maximum over ranks. `#wrong` counts, over all ranks, the elements of one
// extra operation that differ from the exact expected value (reduce: on the root only;
// sendrecv: the left neighbour's message), plus elements of an input the operation changed.
// `algo` is the algorithm the call ran (-a, else CHORUS_ALGO's entry for the collective, else
// the tuner's pick for the row's count) and `pred` the simulator's time for it, with the costs
// the communicator measured when it started (tuner::predict).
#pragma once

#include <chorus/chorus.hpp>
#include <chorus/transport/auto.hpp>

#include <algorithm>
#include <array>
#include <charconv>
#include <chrono>
#include <cerrno>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <initializer_list>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <type_traits>
#include <vector>

namespace perf {

using chorus::collective;
using chorus::to_string;

/// The command line, after parsing. Defaults are those of nccl-tests except -e (64 MiB).
struct options {
  std::size_t min_bytes = 8;                       ///< -b: >= 1
  std::size_t max_bytes = std::size_t{64} << 20;   ///< -e: >= min_bytes
  double factor = 2.0;                             ///< -f: > 1 unless min_bytes == max_bytes
  int iters = 20;                                  ///< -n: >= 1
  int warmup = 5;                                  ///< -w: >= 0
  int rounds = 1;                                  ///< -R: >= 1; the row's time is their median
  chorus::dtype type = chorus::dtype::float32;     ///< -d
  chorus::reduce_op op = chorus::sum;              ///< -o: avg needs a floating type
  int root = 0;                                    ///< -r: a rank of the communicator
  /// -a: automatic or ones the collective has; with several, every size runs each in turn
  std::vector<chorus::algo> algorithms{chorus::algo::automatic};
  bool check = true;                               ///< -c
  std::string json;                                ///< --json: empty = no JSON file
  bool help = false;                               ///< -h
};

/// A bad command line or environment: main prints it (on rank 0 only) and exits with 2.
struct usage_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// --- command line ----------------------------------------------------------------------

/// Joins pieces with append: `"literal" + std::string(...)` trips a -Wrestrict false positive of
/// GCC 12 at -O3 (GCC bug 105329), an error under -Werror.
inline std::string cat(std::initializer_list<std::string_view> parts) {
  std::string s;
  for (std::string_view p : parts) s.append(p);
  return s;
}

/// The binary's name without "_perf", as nccl-tests spells it: "alltoall", "sendrecv",
/// otherwise the collective's name.
inline std::string binary_name(collective c) {
  if (c == collective::all_to_all) return "alltoall";
  if (c == collective::send_recv) return "sendrecv";
  return std::string(to_string(c));
}

/// "chain, binomial": the algorithms `c` has, as -a and CHORUS_ALGO spell them.
inline std::string algorithm_list(collective c) {
  std::string s;
  for (chorus::algo a : chorus::algorithms_for(c)) {
    if (!s.empty()) s.append(", ");
    s.append(to_string(a));
  }
  return s;
}

inline void print_help(collective c, std::FILE* f) {
  const std::string name = binary_name(c);
  const std::string algos = algorithm_list(c);
  std::fprintf(f,
               "usage: %s_perf [flags]   (one process per rank, e.g. chorus-run -n 4 %s_perf)\n"
               "  -b, --minbytes N      smallest size in bytes, suffix K/M/G = 2^10/2^20/2^30 "
               "(default 8)\n"
               "  -e, --maxbytes N      largest size in bytes (default 64M)\n"
               "  -f, --stepfactor F    multiply the size by F between rows (default 2)\n"
               "  -n, --iters N         timed operations per size, per round with -R (default 20)\n"
               "  -w, --warmup_iters N  untimed operations before timing each size (default 5; with "
               "several algorithms, one\n"
               "                        more before each later turn, if N > 0)\n"
               "  -R, --rounds N        time each size N times (-n operations each; with several "
               "algorithms the rounds\n"
               "                        take them in turn) and report the median round "
               "(default 1)\n"
               "  -d, --datatype T      float double half bfloat16 int8 uint8 int32 uint32 int64 "
               "uint64 (default float)\n"
               "  -o, --op OP           sum prod min max avg (default sum; avg needs a floating "
               "type;%s)\n"
               "  -r, --root N          the root rank of broadcast, reduce, gather and scatter, "
               "in [0, ranks) (default 0%s)\n"
               "  -a, --algo NAME       run every call with this algorithm: auto (default: "
               "CHORUS_ALGO, else the tuner) or one %s has: %s\n"
               "                        A list (ring,tree,auto) or 'all' (every one, then auto) "
               "times each in turn at every size, in one\n"
               "                        process: a row each, the auto row's algo written auto:NAME\n"
               "  -c, --check 0|1       check every element of one extra operation per size "
               "(default 1)\n"
               "      --json FILE       rank 0 also writes the rows to FILE as a JSON array\n"
               "  -h, --help            this text\n"
               "columns: size (B) and count (elements) in nccl-tests units, time (us, the slowest "
               "rank), algbw and busbw (GB/s), #wrong,\n"
               "  algo (what the calls ran) and pred (us, the tuner's simulated time for that "
               "algorithm); a last line compares pred with time\n"
               "environment:\n"
               "  CHORUS_TRANSPORT      auto tcp shm (default auto: shm inside a node, tcp between)\n"
               "  CHORUS_ALGO           one algorithm for every collective that has it (e.g. "
               "ring), or collective:algorithm pairs\n"
               "                        separated by ';' or ',' (e.g. "
               "allreduce:tree;allgather:bruck); algorithms: auto ring rd\n"
               "                        (recursive_doubling) hier (hierarchical) tree hd "
               "(halving_doubling) bruck chain binomial\n"
               "                        direct dissemination; -a overrides it\n"
               "  CHORUS_TUNER          probe (default: measure the links at start) or fixed; "
               "CHORUS_TUNING_FILE: costs and rules\n"
               "  CHORUS_DEBUG=INFO     log the tuner's costs and each pick with every "
               "algorithm's predicted time (stderr)\n"
               "  CHORUS_RANK, CHORUS_WORLD_SIZE, CHORUS_MASTER_ADDR, CHORUS_MASTER_PORT, ...\n"
               "                        as for every chorus program\n"
               "exit status: 0 all rows correct, 1 a wrong element or a chorus error, 2 bad flags "
               "or environment\n"
               "  (chorus-run itself exits 1 when a rank exits non-zero, and names the rank's "
               "status)\n",
               name.c_str(), name.c_str(),
               chorus::reduces(c) ? "" : " ignored: this collective does not reduce",
               chorus::rooted(c) ? "" : "; ignored: this collective has no root",
               std::string(to_string(c)).c_str(), algos.c_str());
}

/// "8", "64K", "1M", "2G" -> bytes (powers of 1024).
inline std::size_t parse_bytes(std::string_view flag, std::string_view text) {
  std::string_view s = text;
  unsigned shift = 0;
  if (!s.empty()) {
    switch (s.back()) {
      case 'K': case 'k': shift = 10; break;
      case 'M': case 'm': shift = 20; break;
      case 'G': case 'g': shift = 30; break;
      default: break;
    }
  }
  if (shift != 0) s.remove_suffix(1);
  std::uint64_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc{} || end != s.data() + s.size() ||
      v > (std::numeric_limits<std::size_t>::max() >> shift)) {
    throw usage_error(cat({flag, " wants a byte count such as 8, 64K, 1M or 2G, not '", text, "'"}));
  }
  return static_cast<std::size_t>(v) << shift;
}

inline int parse_int(std::string_view flag, std::string_view s, int lowest) {
  int v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc{} || end != s.data() + s.size() || v < lowest) {
    const std::string low = std::to_string(lowest);
    throw usage_error(cat({flag, " wants an integer >= ", low, ", not '", s, "'"}));
  }
  return v;
}

inline double parse_factor(std::string_view flag, std::string_view s) {
  double v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc{} || end != s.data() + s.size() || !(v > 1.0) || v > 1e6) {
    throw usage_error(cat({flag, " wants a factor > 1 such as 2, not '", s, "'"}));
  }
  return v;
}

inline chorus::dtype parse_dtype(std::string_view s) {
  struct name { std::string_view text; chorus::dtype type; };
  // The canonical names (chorus::to_string) plus the spellings nccl-tests accepts.
  static constexpr std::array names{
      name{"float", chorus::dtype::float32},     name{"float32", chorus::dtype::float32},
      name{"fp32", chorus::dtype::float32},      name{"double", chorus::dtype::float64},
      name{"float64", chorus::dtype::float64},   name{"fp64", chorus::dtype::float64},
      name{"half", chorus::dtype::float16},      name{"float16", chorus::dtype::float16},
      name{"fp16", chorus::dtype::float16},      name{"bfloat16", chorus::dtype::bfloat16},
      name{"bf16", chorus::dtype::bfloat16},     name{"int8", chorus::dtype::int8},
      name{"uint8", chorus::dtype::uint8},       name{"int32", chorus::dtype::int32},
      name{"int", chorus::dtype::int32},         name{"uint32", chorus::dtype::uint32},
      name{"int64", chorus::dtype::int64},       name{"uint64", chorus::dtype::uint64},
  };
  for (const name& n : names) {
    if (n.text == s) return n.type;
  }
  throw usage_error(cat({"-d wants one of float double half bfloat16 int8 uint8 int32 uint32 "
                         "int64 uint64, not '", s, "'"}));
}

/// Any integer: whether it is a rank is checked once the communicator knows its size.
inline int parse_root(std::string_view flag, std::string_view s) {
  int v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc{} || end != s.data() + s.size()) {
    throw usage_error(cat({flag, " wants a rank such as 0, not '", s, "'"}));
  }
  return v;
}

/// An algorithm name that `c` has (or auto).
inline chorus::algo parse_algorithm(collective c, std::string_view s) {
  const std::string have = algorithm_list(c);
  const std::string name = binary_name(c);
  const std::optional<chorus::algo> a = chorus::parse_algo(s);
  if (!a) {
    throw usage_error(cat({"-a '", s, "' is not an algorithm; ", name, " has: ", have,
                           " (or auto)"}));
  }
  if (*a != chorus::algo::automatic && !chorus::implements(c, *a)) {
    throw usage_error(cat({"-a ", to_string(*a), ": ", name, " has no such algorithm; it has: ",
                           have, " (or auto)"}));
  }
  return *a;
}

/// -a's value: one name, a comma-separated list of them (each at most once), or "all": every
/// algorithm `c` has, then auto.
inline std::vector<chorus::algo> parse_algorithms(collective c, std::string_view s) {
  std::vector<chorus::algo> v;
  if (s == "all") {
    const auto have = chorus::algorithms_for(c);
    v.assign(have.begin(), have.end());
    v.push_back(chorus::algo::automatic);
    return v;
  }
  for (std::size_t start = 0;;) {
    const std::size_t comma = s.find(',', start);
    const chorus::algo a = parse_algorithm(c, s.substr(start, comma == std::string_view::npos ? comma : comma - start));
    if (std::find(v.begin(), v.end(), a) != v.end()) {
      throw usage_error(cat({"-a names ", to_string(a), " twice"}));
    }
    v.push_back(a);
    if (comma == std::string_view::npos) return v;
    start = comma + 1;
  }
}

inline chorus::reduce_op parse_op(std::string_view s) {
  for (int i = 0; i < chorus::reduce_op_count; ++i) {
    const auto op = static_cast<chorus::reduce_op>(i);
    if (chorus::to_string(op) == s) return op;
  }
  throw usage_error(cat({"-o wants one of sum prod min max avg, not '", s, "'"}));
}

/// Accepts `-b 8`, `-b8`, `--minbytes 8` and `--minbytes=8`, as getopt_long does.
inline options parse_args(collective c, int argc, char** argv) {
  struct flag { char short_name; std::string_view long_name; bool takes_value; };
  static constexpr std::array flags{
      flag{'b', "minbytes", true}, flag{'e', "maxbytes", true},     flag{'f', "stepfactor", true},
      flag{'n', "iters", true},    flag{'w', "warmup_iters", true}, flag{'d', "datatype", true},
      flag{'o', "op", true},       flag{'c', "check", true},        flag{'j', "json", true},
      flag{'r', "root", true},     flag{'a', "algo", true},         flag{'R', "rounds", true},
      flag{'h', "help", false},
  };
  options o;
  const std::vector<std::string_view> args(argv + 1, argv + argc);
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string_view arg = args[i];
    const flag* found = nullptr;
    std::string_view value;
    bool has_value = false;
    if (arg.starts_with("--")) {
      std::string_view name = arg.substr(2);
      if (const auto eq = name.find('='); eq != std::string_view::npos) {
        value = name.substr(eq + 1);
        name = name.substr(0, eq);
        has_value = true;
      }
      for (const flag& f : flags) {
        if (f.long_name == name) found = &f;
      }
    } else if (arg.size() >= 2 && arg[0] == '-') {
      for (const flag& f : flags) {
        // --json has no short form: -j would collide with nothing, but nccl-tests has none.
        if (f.short_name == arg[1] && f.short_name != 'j') found = &f;
      }
      if (arg.size() > 2) {
        value = arg.substr(2);
        has_value = true;
      }
    }
    if (found == nullptr) {
      throw usage_error(cat({"unknown flag '", arg, "'; -h lists the flags"}));
    }
    const std::string name =
        found->short_name == 'j' ? std::string("--json") : std::string{'-', found->short_name};
    if (!found->takes_value) {
      if (has_value) throw usage_error(cat({name, " takes no value"}));
    } else if (!has_value) {
      if (i + 1 >= args.size()) {
        throw usage_error(cat({name, " needs a value; -h lists the flags"}));
      }
      value = args[++i];
    }
    switch (found->short_name) {
      case 'b': o.min_bytes = parse_bytes(name, value); break;
      case 'e': o.max_bytes = parse_bytes(name, value); break;
      case 'f': o.factor = parse_factor(name, value); break;
      case 'n': o.iters = parse_int(name, value, 1); break;
      case 'w': o.warmup = parse_int(name, value, 0); break;
      case 'R': o.rounds = parse_int(name, value, 1); break;
      case 'd': o.type = parse_dtype(value); break;
      case 'o': o.op = parse_op(value); break;
      case 'r': o.root = parse_root(name, value); break;
      case 'a': o.algorithms = parse_algorithms(c, value); break;
      case 'c':
        if (value != "0" && value != "1") throw usage_error("-c wants 0 or 1");
        o.check = value == "1";
        break;
      case 'j':
        if (value.empty()) throw usage_error("--json needs a file name");
        o.json = std::string(value);
        break;
      case 'h': o.help = true; break;
      default: break;
    }
  }
  if (o.min_bytes == 0) throw usage_error("-b must be at least 1 byte");
  if (o.max_bytes < o.min_bytes) throw usage_error("-e must be >= -b");
  if (chorus::reduces(c) && o.op == chorus::avg && !chorus::is_floating(o.type)) {
    throw usage_error("-o avg needs a floating type (float, double, half, bfloat16): an integer "
                      "average would truncate");
  }
  return o;
}

// --- environment -------------------------------------------------------------------------

/// Transports this binary is linked with; CHORUS_TRANSPORT picks one.
inline constexpr std::array<std::string_view, 3> transport_names{"auto", "tcp", "shm"};

inline std::string transport_from_env() {
  const char* env = std::getenv("CHORUS_TRANSPORT");
  if (env == nullptr || *env == '\0') return std::string(transport_names[0]);
  for (std::string_view name : transport_names) {
    if (name == env) return std::string(name);
  }
  std::string valid;
  for (std::string_view name : transport_names) valid.append(" ").append(name);
  throw usage_error(cat({"CHORUS_TRANSPORT=", env, " is not a transport this binary has; valid:",
                         valid}));
}

/// CHORUS_ALGO as the communicator will read it (parse_algo_table): a bad value is a usage
/// error here, before any rank connects.
inline chorus::algo_table algo_table_from_env() {
  const char* env = std::getenv("CHORUS_ALGO");
  if (env == nullptr || *env == '\0') return chorus::algo_table{};
  try {
    return chorus::parse_algo_table(env);
  } catch (const chorus::error& e) {
    throw usage_error(e.what());
  }
}

/// The launcher's rank before a communicator exists, so that only one process prints a usage
/// message; 0 when no launcher variable is set.
inline int launcher_rank() {
  for (const char* var : {"CHORUS_RANK", "RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK",
                          "SLURM_PROCID"}) {
    if (const char* env = std::getenv(var); env != nullptr && *env != '\0') {
      return std::atoi(env);
    }
  }
  return 0;
}

/// Guaranteed copy elision: the communicator is built in the caller's variable.
inline chorus::communicator make_communicator() {
  // auto_transport reads CHORUS_TRANSPORT itself (auto, tcp or shm), already validated.
  return chorus::communicator::from_env<chorus::auto_transport>();
}

// --- units -------------------------------------------------------------------------------

/// Blocks of `count` elements in the buffer `size` measures (see the header comment).
inline std::size_t blocks_in_size(collective c, int nranks) {
  switch (c) {
    case collective::reduce_scatter:
    case collective::all_gather:
    case collective::all_to_all:
    case collective::gather:
    case collective::scatter: return static_cast<std::size_t>(nranks);
    default: return 1;
  }
}

/// busbw / algbw, as nccl-tests computes it.
inline double bus_factor(collective c, int nranks) {
  const double n = nranks;
  switch (c) {
    case collective::all_reduce: return 2.0 * (n - 1) / n;
    case collective::reduce_scatter:
    case collective::all_gather:
    case collective::all_to_all:
    case collective::gather:
    case collective::scatter: return (n - 1) / n;
    default: return 1.0;
  }
}

/// Elements of input and output one rank's call touches: the others' buffers are not passed
/// (null), as the communicator's documentation allows.
struct extent {
  std::size_t in = 0, out = 0;
};

inline extent extent_of(collective c, std::size_t count, int rank, int nranks, int root) {
  const auto n = static_cast<std::size_t>(nranks);
  const bool is_root = rank == root;
  switch (c) {
    case collective::all_reduce: return {count, count};
    case collective::reduce_scatter: return {count * n, count};
    case collective::all_gather: return {count, count * n};
    case collective::broadcast: return {is_root ? count : 0, count};
    case collective::reduce: return {count, is_root ? count : 0};
    case collective::all_to_all: return {count * n, count * n};
    case collective::gather: return {count, is_root ? count * n : 0};
    case collective::scatter: return {is_root ? count * n : 0, count};
    case collective::send_recv: return {count, count};
    default: return {};
  }
}

// --- size sweep ----------------------------------------------------------------------------

struct row_size {
  std::size_t bytes;  ///< `size` (see the header comment)
  std::size_t count;  ///< the call's count
};

/// min, min*f, min*f^2, ... <= max, each rounded down to whole elements per block (at least
/// one), dropping a row that rounds to the same size as the row before.
inline std::vector<row_size> sweep(const options& o, collective c, int nranks) {
  const std::size_t unit = chorus::size_of(o.type) * blocks_in_size(c, nranks);
  std::vector<row_size> rows;
  std::size_t s = o.min_bytes;
  while (true) {
    const std::size_t count = std::max<std::size_t>(1, s / unit);
    if (rows.empty() || rows.back().count != count) rows.push_back({count * unit, count});
    if (s >= o.max_bytes) break;
    const double next = static_cast<double>(s) * o.factor;
    if (next > static_cast<double>(o.max_bytes)) break;
    s = std::max(s + 1, static_cast<std::size_t>(next));
  }
  return rows;
}

// --- element types ---------------------------------------------------------------------------

template <class F>
void visit(chorus::dtype t, F&& f) {
  using chorus::dtype;
  switch (t) {
    case dtype::float32: f(std::type_identity<float>{}); return;
    case dtype::float64: f(std::type_identity<double>{}); return;
    case dtype::float16: f(std::type_identity<chorus::half>{}); return;
    case dtype::bfloat16: f(std::type_identity<chorus::bfloat16>{}); return;
    case dtype::int8: f(std::type_identity<std::int8_t>{}); return;
    case dtype::uint8: f(std::type_identity<std::uint8_t>{}); return;
    case dtype::int32: f(std::type_identity<std::int32_t>{}); return;
    case dtype::uint32: f(std::type_identity<std::uint32_t>{}); return;
    case dtype::int64: f(std::type_identity<std::int64_t>{}); return;
    case dtype::uint64: f(std::type_identity<std::uint64_t>{}); return;
  }
  throw usage_error("invalid dtype");
}

template <class T>
T from_double(double x) {
  if constexpr (std::is_same_v<T, chorus::half>) {
    return chorus::to_half(static_cast<float>(x));
  } else if constexpr (std::is_same_v<T, chorus::bfloat16>) {
    return chorus::to_bfloat16(static_cast<float>(x));
  } else {
    return static_cast<T>(x);
  }
}

template <class T>
double to_double(T v) {
  if constexpr (std::is_same_v<T, chorus::half> || std::is_same_v<T, chorus::bfloat16>) {
    return static_cast<double>(chorus::to_float(v));
  } else {
    return static_cast<double>(v);
  }
}

/// Every integer in [0, limit] is exact in `t` and fits, with room for the check's sentinel
/// (all bits set) to be none of them.
constexpr std::uint64_t exact_limit(chorus::dtype t) noexcept {
  using chorus::dtype;
  switch (t) {
    case dtype::float32: return std::uint64_t{1} << 24;
    case dtype::float64: return std::uint64_t{1} << 53;
    case dtype::float16: return 2048;
    case dtype::bfloat16: return 256;
    case dtype::int8: return 127;
    case dtype::uint8: return 254;
    case dtype::int32: return (std::uint64_t{1} << 31) - 1;
    case dtype::uint32: return (std::uint64_t{1} << 32) - 2;
    case dtype::int64: return std::uint64_t{1} << 62;
    case dtype::uint64: return std::uint64_t{1} << 63;
  }
  return 0;
}

/// The largest k with 2^k exact and in range.
constexpr int max_pow2(chorus::dtype t) noexcept {
  using chorus::dtype;
  switch (t) {
    case dtype::float32: return 127;
    case dtype::float64: return 1023;
    case dtype::float16: return 15;
    case dtype::bfloat16: return 127;
    case dtype::int8: return 6;
    case dtype::uint8: return 7;
    case dtype::int32: return 30;
    case dtype::uint32: return 31;
    case dtype::int64: return 62;
    case dtype::uint64: return 63;
  }
  return 0;
}

// --- the check ---------------------------------------------------------------------------------

/// What rank r puts at global index j. Every value is a small integer (or a power of two for
/// prod) chosen so that every partial result, in any order of reduction, is exact in the
/// element type: the expected result is then exact, and the check compares with ==. Values
/// depend on j only through j mod period(), so expectations are tabulated once per size.
struct pattern {
  enum class kind {
    modular,   ///< (j + 7r) mod m: sum, min, max, collectives that move data; m odd so no
               ///< power-of-two shift hides
    one_hot,   ///< 1 where (j + r) mod n == 0: sum when n exceeds the type's exact range
    twos,      ///< 2 where (j + r) mod m == 0, else 1: prod, at most max_pow2 twos per element
    balanced,  ///< (j mod m) +/- c on rank pairs, c in 1..3: avg, whose exact sum is n*(j mod m)
  };
  kind k = kind::modular;
  std::size_t m = 1;
  int nranks = 1;

  std::size_t period() const noexcept {
    switch (k) {
      case kind::modular: return m;
      case kind::one_hot: return static_cast<std::size_t>(nranks);
      case kind::twos: return m;
      case kind::balanced: return 3 * m;
    }
    return 1;
  }

  double value(int rank, std::size_t j) const noexcept {
    const auto r = static_cast<std::size_t>(rank);
    switch (k) {
      case kind::modular: return static_cast<double>((j % m + (7 * r) % m) % m);
      case kind::one_hot: return (j + r) % static_cast<std::size_t>(nranks) == 0 ? 1.0 : 0.0;
      case kind::twos: return (j + r) % m == 0 ? 2.0 : 1.0;
      case kind::balanced: {
        const auto b = static_cast<double>(j % m);
        if (nranks % 2 == 1 && rank == nranks - 1) return b;  // the unpaired rank
        const auto c = static_cast<double>(1 + (j % 3 + (r / 2) % 3) % 3);
        return r % 2 == 0 ? b + c : b - c;
      }
    }
    return 0;
  }
};

inline pattern make_pattern(collective c, chorus::dtype t, chorus::reduce_op op, int nranks) {
  const std::uint64_t limit = exact_limit(t);
  const auto n = static_cast<std::uint64_t>(nranks);
  constexpr std::uint64_t max_modulus = 1021;  // a prime: no chunk or slice size is a multiple
  auto odd = [](std::uint64_t m) { return m > 2 && m % 2 == 0 ? m - 1 : m; };
  pattern p;
  p.nranks = nranks;
  if (!chorus::reduces(c) || op == chorus::min || op == chorus::max) {
    p.k = pattern::kind::modular;
    p.m = static_cast<std::size_t>(odd(std::min(limit + 1, max_modulus)));
  } else if (op == chorus::prod) {
    // ceil(n / k) ranks put a 2 at any index: keep that within the type's largest power of two.
    const auto e = static_cast<std::uint64_t>(max_pow2(t));
    p.k = pattern::kind::twos;
    p.m = static_cast<std::size_t>(std::max<std::uint64_t>(3, (n + e - 1) / e));
  } else if (op == chorus::avg && limit / n >= 4) {
    // Partial sums stay within n * (m + 2), in any order.
    p.k = pattern::kind::balanced;
    p.m = static_cast<std::size_t>(std::min(limit / n - 2, max_modulus));
  } else if (op == chorus::avg) {
    // More ranks than bfloat16 (64) or half (512) can average exactly: all zeros.
    p.k = pattern::kind::modular;
    p.m = 1;
  } else if (limit / n + 1 >= 2) {  // sum: partial sums stay within n * (m - 1)
    p.k = pattern::kind::modular;
    p.m = static_cast<std::size_t>(odd(std::min(limit / n + 1, max_modulus)));
  } else {
    p.k = pattern::kind::one_hot;
  }
  return p;
}

/// The exact result at global index p (0 <= p < period) of reducing every rank's value.
inline double expected(const pattern& pat, chorus::reduce_op op, std::size_t p) {
  double acc = pat.value(0, p);
  for (int r = 1; r < pat.nranks; ++r) {
    const double v = pat.value(r, p);
    if (op == chorus::sum || op == chorus::avg) acc += v;
    if (op == chorus::prod) acc *= v;
    if (op == chorus::min) acc = std::min(acc, v);
    if (op == chorus::max) acc = std::max(acc, v);
  }
  return op == chorus::avg ? acc / pat.nranks : acc;
}

/// Writes rank `rank`'s values for global indices [first, first + n).
template <class T>
void fill(T* data, std::size_t n, const pattern& pat, int rank, std::size_t first) {
  const std::size_t period = pat.period();
  std::vector<T> table(period);
  for (std::size_t p = 0; p < period; ++p) table[p] = perf::from_double<T>(pat.value(rank, p));
  std::size_t p = first % period;
  for (std::size_t j = 0; j < n; ++j) {
    data[j] = table[p];
    if (++p == period) p = 0;
  }
}

/// Counts elements of data[0, n) that differ from want(first + j).
template <class T>
std::uint64_t count_wrong(const T* data, std::size_t n, const std::vector<double>& want,
                          std::size_t first) {
  const std::size_t period = want.size();
  std::uint64_t wrong = 0;
  std::size_t p = first % period;
  for (std::size_t j = 0; j < n; ++j) {
    // NaN (the sentinel for floating types) compares unequal: an element never written counts.
    if (!(perf::to_double(data[j]) == want[p])) ++wrong;
    if (++p == period) p = 0;
  }
  return wrong;
}

// --- buffers, results ---------------------------------------------------------------------------

/// Page-aligned, touched once up front: the timed loop never takes a first-touch page fault.
class buffer {
 public:
  explicit buffer(std::size_t bytes)
      : bytes_(bytes),
        // At least one page: aligned_alloc(4096, 0) may return null (a rank's unused buffer).
        data_(static_cast<std::byte*>(
            std::aligned_alloc(4096, (std::max<std::size_t>(bytes, 1) + 4095) / 4096 * 4096))) {
    if (data_ == nullptr) throw std::bad_alloc();
    std::memset(data_.get(), 0, bytes_);
  }
  std::byte* data() const noexcept { return data_.get(); }
  std::size_t bytes() const noexcept { return bytes_; }
  template <class T>
  T* as() const noexcept {
    return reinterpret_cast<T*>(data_.get());
  }

 private:
  struct free_deleter {
    void operator()(std::byte* p) const noexcept { std::free(p); }
  };
  std::size_t bytes_;
  std::unique_ptr<std::byte, free_deleter> data_;
};

struct result {
  std::size_t bytes;
  std::size_t count;
  double time_us;
  double algbw;
  double busbw;
  std::uint64_t wrong;  ///< meaningful when checked
  chorus::algo algorithm;  ///< what the calls ran
  double pred_us;       ///< NaN when the tuner cannot predict this call
  chorus::algo requested;  ///< -a's entry for the row: automatic, or the algorithm itself
  std::vector<double> rounds_us;  ///< -R's rounds in order; time_us is their median
};

/// What one run is: the collective, its arguments, how its algorithm is chosen.
struct setup {
  collective c;
  options o;
  int nranks;
  chorus::algo_table table;  ///< CHORUS_ALGO
};

/// Why rank 0 cannot write the --json file `path`, or empty: tried before the sweep (opened to
/// append, so nothing in it is lost yet), so that a path that cannot be written fails the run
/// at its start, not after it has measured everything.
inline std::string json_unwritable(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "a");
  if (f == nullptr) return cat({"--json ", path, " cannot be written: ", std::strerror(errno)});
  std::fclose(f);
  return {};
}

/// Writes the rows to `path`; false, having said why on stderr, where that failed.
[[nodiscard]] inline bool write_json(const std::string& path, const std::vector<result>& rows, const setup& su) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) {
    std::fprintf(stderr, "# cannot write %s: %s\n", path.c_str(), std::strerror(errno));
    return false;
  }
  const options& o = su.o;
  const std::string type(chorus::to_string(o.type));
  const std::string op(chorus::reduces(su.c) ? chorus::to_string(o.op) : "none");
  const std::string coll(to_string(su.c));
  const int root = chorus::rooted(su.c) ? o.root : -1;
  std::fprintf(f, "[");
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const result& r = rows[i];
    std::fprintf(f,
                 "%s\n  {\"size\": %zu, \"count\": %zu, \"type\": \"%s\", \"op\": \"%s\", "
                 "\"time_us\": %.6g, \"algbw\": %.6g, \"busbw\": %.6g, \"wrong\": ",
                 i == 0 ? "" : ",", r.bytes, r.count, type.c_str(), op.c_str(), r.time_us, r.algbw,
                 r.busbw);
    if (o.check) {
      std::fprintf(f, "%llu", static_cast<unsigned long long>(r.wrong));
    } else {
      std::fprintf(f, "null");
    }
    std::fprintf(f, ", \"collective\": \"%s\", \"nranks\": %d, \"root\": %d, \"algo\": \"%s\", "
                    "\"requested\": \"%s\", \"pred_us\": ",
                 coll.c_str(), su.nranks, root, std::string(to_string(r.algorithm)).c_str(),
                 std::string(to_string(r.requested)).c_str());
    if (std::isfinite(r.pred_us)) {
      std::fprintf(f, "%.6g", r.pred_us);
    } else {
      std::fprintf(f, "null");
    }
    if (r.rounds_us.size() > 1) {
      std::fprintf(f, ", \"rounds_us\": [");
      for (std::size_t k = 0; k < r.rounds_us.size(); ++k) {
        std::fprintf(f, "%s%.6g", k == 0 ? "" : ", ", r.rounds_us[k]);
      }
      std::fprintf(f, "]");
    }
    std::fprintf(f, "}");
  }
  std::fprintf(f, "\n]\n");
  const bool written = std::ferror(f) == 0;
  if (std::fclose(f) != 0 || !written) {
    std::fprintf(stderr, "# writing %s failed: %s\n", path.c_str(), std::strerror(errno));
    return false;
  }
  return true;
}

/// The algorithm a call with `count` runs: -a's entry `requested`, else CHORUS_ALGO's entry,
/// else the tuner's pick, as the communicator resolves an automatic call.
inline chorus::algo algorithm_of(const setup& su, const chorus::communicator& comm,
                                 std::size_t count, chorus::algo requested) {
  if (requested != chorus::algo::automatic) return requested;
  const chorus::algo t = su.table[static_cast<std::size_t>(su.c)];
  if (t != chorus::algo::automatic) return t;
  return comm.tuner().choose(su.c, count, chorus::size_of(su.o.type));
}

/// "ring (-a)", "tree (CHORUS_ALGO)", "auto (the tuner's pick per row)" or, for a list,
/// "ring, tree, auto (-a, each in turn at every size)".
inline std::string algorithm_source(const setup& su) {
  const auto& list = su.o.algorithms;
  if (list.size() > 1) {
    std::string s;
    for (chorus::algo a : list) {
      if (!s.empty()) s.append(", ");
      s.append(to_string(a));
    }
    return cat({s, " (-a, each in turn at every size)"});
  }
  if (list.front() != chorus::algo::automatic) return cat({to_string(list.front()), " (-a)"});
  const chorus::algo t = su.table[static_cast<std::size_t>(su.c)];
  if (t != chorus::algo::automatic) return cat({to_string(t), " (CHORUS_ALGO)"});
  return "auto (the tuner's pick per row)";
}

/// The median of `v` (which it sorts); NaN when empty.
inline double median(std::vector<double>& v) {
  if (v.empty()) return std::nan("");
  std::sort(v.begin(), v.end());
  const std::size_t h = v.size() / 2;
  return v.size() % 2 == 1 ? v[h] : (v[h - 1] + v[h]) / 2;
}

// --- the driver --------------------------------------------------------------------------------

inline int run_sweep(const setup& su, chorus::communicator& comm) {
  using clock = std::chrono::steady_clock;
  const collective c = su.c;
  const options& o = su.o;
  const int rank = comm.rank();
  const int n = comm.size();
  const auto nn = static_cast<std::size_t>(n);
  const int root = o.root;
  const bool is_root = rank == root;
  const std::size_t esize = chorus::size_of(o.type);
  const std::string name = binary_name(c);

  if (root < 0 || root >= n) {
    throw usage_error(cat({"-r ", std::to_string(root), " is not a rank of this communicator of ",
                           std::to_string(n), " (ranks 0..", std::to_string(n - 1), ")"}));
  }

  const std::string type(chorus::to_string(o.type));
  const std::string op(chorus::reduces(c) ? chorus::to_string(o.op) : "none");
  if (rank == 0) {
    std::printf("# chorus %s_perf: nranks %d, %s\n", name.c_str(), n, comm.describe().c_str());
    std::printf("# tuner costs: %s\n", comm.tuner().costs().describe().c_str());
    const std::string root_text =
        chorus::rooted(c) ? cat({"root ", std::to_string(root), ", "}) : std::string();
    const std::string rounds_text =
        o.rounds > 1 ? cat({"rounds ", std::to_string(o.rounds), " (median), "}) : std::string();
    std::printf("# algo %s, %sminbytes %zu, maxbytes %zu, factor %g, iters %d, %swarmup %d, "
                "check %d\n",
                algorithm_source(su).c_str(), root_text.c_str(), o.min_bytes, o.max_bytes,
                o.factor, o.iters, rounds_text.c_str(), o.warmup, o.check ? 1 : 0);
    std::fflush(stdout);
  }
  // chorus refuses a message to oneself (nccl-tests' one-rank sendrecv is a local copy): with
  // one rank there is nothing to measure, and the run says so instead of printing numbers.
  if (c == collective::send_recv && n < 2) {
    if (rank == 0) {
      std::printf("# sendrecv needs 2 or more ranks (a rank cannot send to itself): no rows\n");
      if (!o.json.empty() && !write_json(o.json, {}, su)) return 1;
    }
    return 0;
  }

  const std::vector<row_size> rows = sweep(o, c, n);
  const std::size_t max_count = rows.back().count;
  const extent most = extent_of(c, max_count, rank, n, root);
  const int right = (rank + 1) % n;      // sendrecv: where this rank sends
  const int left = (rank + n - 1) % n;   // sendrecv: where its message comes from

  // Allocated once for the largest row and reused by every row (see DESIGN.md: never allocate
  // per operation, and never measure page faults).
  buffer in(most.in * esize);
  buffer out(most.out * esize);

  const pattern pat = make_pattern(c, o.type, o.op, n);
  // Values depend only on the index into the input, so the input of every row is a prefix of
  // this one and is written once; the check verifies that the operations never write it.
  perf::visit(o.type, [&]<class T>(std::type_identity<T>) {
    perf::fill(in.as<T>(), most.in, pat, rank, 0);
  });
  // values[r]: what rank r puts at each index mod period; want: the reduction of all ranks'.
  std::vector<std::vector<double>> values(nn);
  for (std::size_t r = 0; r < nn; ++r) {
    for (std::size_t p = 0; p < pat.period(); ++p) {
      values[r].push_back(pat.value(static_cast<int>(r), p));
    }
  }
  std::vector<double> want;
  if (chorus::reduces(c)) {
    for (std::size_t p = 0; p < pat.period(); ++p) want.push_back(perf::expected(pat, o.op, p));
  }

  // Buffers a rank does not use are passed as null, as the API allows: a call that touched
  // them anyway would crash here rather than pass unnoticed.
  const void* in_arg = most.in > 0 ? in.data() : nullptr;
  void* out_arg = most.out > 0 ? out.data() : nullptr;
  // `forced`: -a's entry; automatic: the communicator resolves each call.
  auto operation = [&](std::size_t count, chorus::algo forced) {
    switch (c) {
      case collective::all_reduce:
        comm.all_reduce(in_arg, out_arg, count, o.type, {.op = o.op, .algorithm = forced});
        break;
      case collective::reduce_scatter:
        comm.reduce_scatter(in_arg, out_arg, count, o.type, {.op = o.op, .algorithm = forced});
        break;
      case collective::all_gather:
        comm.all_gather(in_arg, out_arg, count, o.type, {.algorithm = forced});
        break;
      case collective::broadcast:
        comm.broadcast(in_arg, out_arg, count, o.type, root, {.algorithm = forced});
        break;
      case collective::reduce:
        comm.reduce(in_arg, out_arg, count, o.type, root, {.op = o.op, .algorithm = forced});
        break;
      case collective::all_to_all:
        comm.all_to_all(in_arg, out_arg, count, o.type, {.algorithm = forced});
        break;
      case collective::gather:
        comm.gather(in_arg, out_arg, count, o.type, root, {.algorithm = forced});
        break;
      case collective::scatter:
        comm.scatter(in_arg, out_arg, count, o.type, root, {.algorithm = forced});
        break;
      case collective::send_recv:
        // sendrecv has one algorithm (direct) and no option to choose it.
        comm.sendrecv(in_arg, count, right, out_arg, count, left, o.type);
        break;
      default: break;
    }
  };

  // Counts the elements of this rank's buffers after one operation that differ from what
  // they must hold.
  auto check_row = [&](std::size_t count) {
    const extent ex = extent_of(c, count, rank, n, root);
    const auto me = static_cast<std::size_t>(rank);
    std::uint64_t wrong = 0;
    perf::visit(o.type, [&]<class T>(std::type_identity<T>) {
      const T* data = out.as<T>();
      switch (c) {
        case collective::all_reduce: wrong += perf::count_wrong(data, count, want, 0); break;
        case collective::reduce_scatter:
          // This rank holds the reduced block `rank` of the input.
          wrong += perf::count_wrong(data, count, want, me * count);
          break;
        case collective::reduce:
          if (is_root) wrong += perf::count_wrong(data, count, want, 0);
          break;
        case collective::all_gather:
          for (std::size_t r = 0; r < nn; ++r) {
            wrong += perf::count_wrong(data + r * count, count, values[r], 0);
          }
          break;
        case collective::gather:
          if (is_root) {
            for (std::size_t r = 0; r < nn; ++r) {
              wrong += perf::count_wrong(data + r * count, count, values[r], 0);
            }
          }
          break;
        case collective::broadcast:
          wrong += perf::count_wrong(data, count, values[static_cast<std::size_t>(root)], 0);
          break;
        case collective::scatter:
          // Block `rank` of the root's input.
          wrong += perf::count_wrong(data, count, values[static_cast<std::size_t>(root)],
                                     me * count);
          break;
        case collective::all_to_all:
          // Block r of the output is block `rank` of rank r's input.
          for (std::size_t r = 0; r < nn; ++r) {
            wrong += perf::count_wrong(data + r * count, count, values[r], me * count);
          }
          break;
        case collective::send_recv:
          wrong += perf::count_wrong(data, count, values[static_cast<std::size_t>(left)], 0);
          break;
        default: break;
      }
      // The input must be as it was written.
      wrong += perf::count_wrong(in.as<T>(), ex.in, values[me], 0);
    });
    return wrong;
  };

  if (rank == 0) {
    std::printf("#\n");
    std::printf("# %11s  %12s  %8s  %6s  %10s  %8s  %8s  %7s  %-23s  %10s\n", "size", "count",
                "type", "redop", "time", "algbw", "busbw", "#wrong", "algo", "pred");
    std::printf("# %11s  %12s  %8s  %6s  %10s  %8s  %8s  %7s  %-23s  %10s\n", "(B)", "(elements)",
                "", "", "(us)", "(GB/s)", "(GB/s)", "", "", "(us)");
    std::fflush(stdout);
  }

  const double factor = bus_factor(c, n);
  std::vector<result> results;
  std::uint64_t total_wrong = 0;
  std::string no_prediction;  // why the tuner could not predict, if it could not
  auto last_progress = clock::now();
  const bool several = o.algorithms.size() > 1;
  for (std::size_t k = 0; k < rows.size(); ++k) {
    const row_size& row = rows[k];
    const auto row_start = clock::now();
    // With several algorithms, each in turn at this size: the same processes, placement and
    // measured costs for all, and the same minute of a shared machine. With several rounds,
    // each takes its turn again in every round, and a row reports its median round: a pause of
    // the machine (another guest, a rank descheduled mid-step) then costs one round of one
    // algorithm, not the comparison. The first round warms up with -w calls; with several
    // algorithms each later turn with one (if -w > 0), because the first calls after a
    // different algorithm are slower and no algorithm should be timed right after another
    // (bench/README.md, "An algorithm's turn").
    const std::size_t algos = o.algorithms.size();
    const auto rounds = static_cast<std::size_t>(o.rounds);
    std::vector<double> round_us(algos * rounds);  // [a * rounds + r]: this rank's mean per call
    for (std::size_t r = 0; r < rounds; ++r) {
      for (std::size_t a = 0; a < algos; ++a) {
        const chorus::algo requested = o.algorithms[a];
        comm.barrier();
        const int warm = r == 0 ? o.warmup : several && o.warmup > 0 ? 1 : 0;
        if (warm > 0) {
          for (int i = 0; i < warm; ++i) operation(row.count, requested);
          comm.barrier();
        }
        const auto t0 = clock::now();
        for (int i = 0; i < o.iters; ++i) operation(row.count, requested);
        const auto t1 = clock::now();
        round_us[a * rounds + r] = std::chrono::duration<double, std::micro>(t1 - t0).count() / o.iters;
      }
    }
    // A collective is done when its slowest rank is: each round's time is the maximum over ranks.
    comm.all_reduce(std::span<double>(round_us), {.op = chorus::max});
    for (std::size_t a = 0; a < algos; ++a) {
      const chorus::algo requested = o.algorithms[a];
      const auto first = round_us.begin() + static_cast<std::ptrdiff_t>(a * rounds);
      std::vector<double> this_algo(first, first + static_cast<std::ptrdiff_t>(rounds));
      std::vector<double> sorted = this_algo;
      const double time_us = median(sorted);

      std::uint64_t wrong = 0;
      if (o.check) {
        const extent ex = extent_of(c, row.count, rank, n, root);
        // All bits set: NaN for floating types, -1 or the maximum for integers; no expected
        // value is one of these, so an element the operation never wrote is counted.
        if (ex.out > 0) std::memset(out.data(), 0xff, ex.out * esize);
        operation(row.count, requested);
        wrong = check_row(row.count);
        comm.all_reduce(std::span<std::uint64_t>(&wrong, 1));  // sum over ranks
        total_wrong += wrong;
      }

      // Outside the timed block, on rank 0 only: the others wait in the next barrier.
      const chorus::algo ran = algorithm_of(su, comm, row.count, requested);
      double pred_us = std::nan("");
      if (rank == 0) {
        try {
          pred_us = comm.tuner().predict(c, ran, row.count, esize, root) * 1e6;
        } catch (const std::exception& e) {
          if (no_prediction.empty()) no_prediction = e.what();
        }
      }

      const double algbw = static_cast<double>(row.bytes) / time_us / 1e3;  // bytes/us -> GB/s
      const result res{row.bytes, row.count, time_us, algbw,  algbw * factor,
                       wrong,     ran,       pred_us, requested, std::move(this_algo)};
      results.push_back(res);
      if (rank == 0) {
        const std::string wrong_text = o.check ? std::to_string(wrong) : std::string("N/A");
        char pred_text[32] = "n/a";
        if (std::isfinite(pred_us)) std::snprintf(pred_text, sizeof pred_text, "%.2f", pred_us);
        const std::string algo_text = several && requested == chorus::algo::automatic
                                          ? cat({"auto:", to_string(ran)})
                                          : std::string(to_string(ran));
        std::printf("  %11zu  %12zu  %8s  %6s  %10.2f  %8.2f  %8.2f  %7s  %-23s  %10s\n", res.bytes,
                    res.count, type.c_str(), op.c_str(), res.time_us, res.algbw, res.busbw,
                    wrong_text.c_str(), algo_text.c_str(), pred_text);
        std::fflush(stdout);
      }
    }
    if (rank == 0) {
      const auto now = clock::now();
      const double row_s = std::chrono::duration<double>(now - row_start).count();
      if (k + 1 < rows.size() &&
          (row_s > 1.0 || now - last_progress > std::chrono::seconds(10))) {
        std::fprintf(stderr, "# [%zu/%zu sizes] %zu bytes took %.1f s\n", k + 1, rows.size(),
                     row.bytes, row_s);
        last_progress = now;
      }
    }
  }

  if (rank == 0) {
    double sum_busbw = 0;
    for (const result& r : results) sum_busbw += r.busbw;
    const std::string verdict = !o.check          ? std::string("not checked (-c 0)")
                                : total_wrong == 0 ? std::string("0 OK")
                                                   : std::to_string(total_wrong) + " FAILED";
    std::printf("# wrong elements: %s\n", verdict.c_str());
    std::printf("# avg busbw: %.3f GB/s\n", sum_busbw / static_cast<double>(results.size()));
    // The worst row is the one whose ratio is furthest from 1 either way.
    std::vector<double> ratios;
    double worst = 1;
    std::size_t worst_bytes = 0;
    for (const result& r : results) {
      if (!std::isfinite(r.pred_us) || !(r.time_us > 0)) continue;
      const double ratio = r.pred_us / r.time_us;
      if (ratios.empty() || std::abs(std::log(ratio)) > std::abs(std::log(worst))) {
        worst = ratio;
        worst_bytes = r.bytes;
      }
      ratios.push_back(ratio);
    }
    if (!ratios.empty()) {
      const std::size_t rated = ratios.size();
      const double mid = median(ratios);  // sorts
      std::printf("# pred/measured: median %.3f, worst %.3f (at %zu B), min %.3f, max %.3f over "
                  "%zu rows\n",
                  mid, worst, worst_bytes, ratios.front(), ratios.back(), rated);
    } else {
      std::printf("# pred/measured: n/a (%s)\n",
                  no_prediction.empty() ? "no prediction" : no_prediction.c_str());
    }
    std::fflush(stdout);
    if (!o.json.empty() && !write_json(o.json, results, su)) return 1;
  }
  return total_wrong == 0 ? 0 : 1;
}

/// Prints a usage error on the rank that speaks and returns 2. Every rank finds the same
/// error; the others wait a moment first, because a launcher that stops the job when one rank
/// fails (chorus-run sends SIGTERM) would otherwise kill the speaker before it has printed.
inline int usage_exit(bool speaks, const std::string& name, const usage_error& e) {
  if (speaks) {
    std::fprintf(stderr, "%s_perf: %s\n", name.c_str(), e.what());
    std::fflush(stderr);
  } else {
    std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  return 2;
}

/// main() of a perf binary: `return perf::run(perf::collective::all_reduce, argc, argv);`
inline int run(collective c, int argc, char** argv) {
  const bool speaks = launcher_rank() == 0;  // only one process prints usage messages
  const std::string name = binary_name(c);
  setup su{c, options{}, 0, chorus::algo_table{}};
  try {
    su.o = parse_args(c, argc, argv);
    if (su.o.help) {
      if (speaks) print_help(c, stdout);
      return 0;
    }
    (void)transport_from_env();  // auto_transport reads it; a bad value is a usage error here
    su.table = algo_table_from_env();
  } catch (const usage_error& e) {
    return usage_exit(speaks, name, e);
  }
  try {
    chorus::communicator comm = make_communicator();
    su.nranks = comm.size();
    if (!su.o.json.empty()) {  // rank 0 writes it; every rank learns whether it can
      const std::string why = comm.rank() == 0 ? json_unwritable(su.o.json) : std::string();
      std::array<std::int32_t, 1> writable{why.empty() ? 1 : 0};
      comm.broadcast(std::span<std::int32_t>(writable), 0);
      if (writable[0] == 0) throw usage_error(comm.rank() == 0 ? why : "rank 0 cannot write --json " + su.o.json);
    }
    return run_sweep(su, comm);
  } catch (const usage_error& e) {
    return usage_exit(speaks, name, e);  // a root outside the communicator
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s_perf: %s\n", name.c_str(), e.what());
    return 1;
  }
}

}  // namespace perf
