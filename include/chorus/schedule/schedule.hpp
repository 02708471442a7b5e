// SPDX-License-Identifier: Apache-2.0
// The schedule vocabulary: what one rank sends, receives, reduces and copies, step by step.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

namespace chorus {

/// The collective a schedule implements. The numbering is part of the wire format.
///
/// What `count` means for each (the argument every schedule function takes):
///   all_reduce, broadcast, reduce:       elements of the buffer
///   reduce_scatter, all_gather, gather,
///   scatter, all_to_all:                 elements of one rank's block (buffers of size() blocks)
///   all_to_allv:                         per-peer counts instead (see direct.hpp)
///   barrier:                             none (0)
///   send_recv:                           elements of the message (point to point, two ranks)
enum class collective : std::uint8_t {
  all_reduce = 0,
  reduce_scatter = 1,
  all_gather = 2,
  broadcast = 3,
  reduce = 4,
  all_to_all = 5,
  all_to_allv = 6,
  gather = 7,
  scatter = 8,
  barrier = 9,
  send_recv = 10,
};
inline constexpr int collective_count = 11;

constexpr std::string_view to_string(collective c) noexcept {
  switch (c) {
    case collective::all_reduce: return "all_reduce";
    case collective::reduce_scatter: return "reduce_scatter";
    case collective::all_gather: return "all_gather";
    case collective::broadcast: return "broadcast";
    case collective::reduce: return "reduce";
    case collective::all_to_all: return "all_to_all";
    case collective::all_to_allv: return "all_to_allv";
    case collective::gather: return "gather";
    case collective::scatter: return "scatter";
    case collective::barrier: return "barrier";
    case collective::send_recv: return "send_recv";
  }
  return "invalid";
}

/// Collectives that reduce, and so take a reduce_op.
constexpr bool reduces(collective c) noexcept {
  return c == collective::all_reduce || c == collective::reduce_scatter || c == collective::reduce;
}
/// Collectives with a root rank.
constexpr bool rooted(collective c) noexcept {
  return c == collective::broadcast || c == collective::reduce || c == collective::gather ||
         c == collective::scatter;
}

/// Algorithms. The numbering is part of the wire format (it is in every frame header, so two
/// ranks that picked different algorithms fail with errc::mismatch instead of hanging).
enum class algo : std::uint8_t {
  automatic = 0,           ///< let the tuner choose
  ring = 1,                ///< ring.hpp: bandwidth-optimal, latency linear in P
  recursive_doubling = 2,  ///< recursive_doubling.hpp: log2(P) exchanges of the whole buffer
  hierarchical = 3,        ///< hierarchical.hpp: inside nodes first, shards across nodes
  tree = 4,                ///< tree.hpp: pipelined double binary tree
  halving_doubling = 5,    ///< halving_doubling.hpp: Rabenseifner's reduce-scatter + all-gather
  bruck = 6,               ///< bruck.hpp: log2(P) steps for any P
  chain = 7,               ///< chain.hpp: a pipelined chain from (or to) the root
  binomial = 8,            ///< binomial.hpp: a binomial tree from (or to) the root
  direct = 9,              ///< direct.hpp: straight to every peer, one round of P-1 exchanges per phase
  dissemination = 10,      ///< barrier.hpp: ceil(log2 P) rounds of empty messages
};
inline constexpr int algo_count = 11;

constexpr std::string_view to_string(algo a) noexcept {
  switch (a) {
    case algo::automatic: return "auto";
    case algo::ring: return "ring";
    case algo::recursive_doubling: return "recursive_doubling";
    case algo::hierarchical: return "hierarchical";
    case algo::tree: return "tree";
    case algo::halving_doubling: return "halving_doubling";
    case algo::bruck: return "bruck";
    case algo::chain: return "chain";
    case algo::binomial: return "binomial";
    case algo::direct: return "direct";
    case algo::dissemination: return "dissemination";
  }
  return "invalid";
}

/// The three buffers a step can name. `scratch` is executor-owned staging that persists
/// across steps of one operation (reduce-scatter keeps its running partial sums there).
enum class buffer_id : std::uint8_t { input = 0, output = 1, scratch = 2 };

/// A contiguous run of elements in one buffer. Offsets and counts are in elements.
struct region {
  buffer_id buffer = buffer_id::output;
  std::size_t offset = 0;
  std::size_t count = 0;

  friend constexpr bool operator==(const region&, const region&) = default;
};

/// What happens to the bytes a step receives.
enum class recv_action : std::uint8_t {
  none,    ///< the step receives nothing
  store,   ///< received bytes are written to `recv_into`
  reduce,  ///< recv_into = reduce_with (op) received; reduce_with may equal recv_into
  copy,    ///< a local step: recv_into = reduce_with, nothing crosses the wire
};

/// One step of one rank. A step may send one region to one peer and, concurrently, receive
/// one region from one peer (a ring step does both). The executor cuts regions into slices
/// and overlaps consecutive steps slice by slice, so a schedule states only the order of
/// data, never the pipelining.
///
/// What a schedule promises the executor:
///  1. Per peer, the k-th send to p matches p's k-th receive from us (same element count):
///     frames carry no tags, order is identity.
///  2. Steps touching overlapping memory run in schedule order: a later step that reads what
///     an earlier one writes waits for those bytes, a later write waits for earlier reads
///     and writes of the same bytes (byte ranges, so regions may overlap in any way).
///  3. Run one step at a time in order, with sends that never block, every rank finishes
///     (the symbolic checker in tests/schedule proves it); the executor, which lets steps to
///     different peers overlap, then cannot deadlock either.
///  4. Whatever must happen before what flows through data: the executor orders steps by
///     the bytes they share and nothing else (a barrier sends a token it received, not an
///     empty message; see barrier.hpp).
struct step {
  int send_peer = -1;  ///< -1: this step sends nothing
  region send_from{};
  int recv_peer = -1;  ///< -1: this step receives nothing (a `copy` step has none)
  recv_action action = recv_action::none;
  region recv_into{};
  region reduce_with{};  ///< the local operand of `reduce`, the source of `copy`
};

/// A rank's whole part in one collective.
struct schedule {
  collective kind = collective::all_reduce;
  algo algorithm = algo::ring;
  int rank = 0;
  int nranks = 1;
  int root = -1;                  ///< rooted collectives (see rooted()); -1 otherwise
  std::size_t scratch_count = 0;  ///< elements of scratch the executor must provide
  std::vector<step> steps;
};

/// An empty schedule of `rank` of `nranks` for collective `kind` built by algorithm `a`.
inline schedule new_schedule(collective kind, algo a, int rank, int nranks, int root = -1) {
  schedule s;
  s.kind = kind;
  s.algorithm = a;
  s.rank = rank;
  s.nranks = nranks;
  s.root = root;
  return s;
}

/// The i-th of n near-equal chunks of `count` elements: the first count % n chunks are one
/// element longer. Every ring algorithm cuts its buffer this way.
constexpr region chunk_of(buffer_id b, std::size_t count, int n, int i) noexcept {
  const std::size_t nn = static_cast<std::size_t>(n);
  const std::size_t ii = static_cast<std::size_t>(i);
  const std::size_t q = count / nn;
  const std::size_t rem = count % nn;
  return region{b, ii * q + (ii < rem ? ii : rem), q + (ii < rem ? 1 : 0)};
}

/// (a mod n) for possibly negative a.
constexpr int wrap(int a, int n) noexcept { return ((a % n) + n) % n; }

}  // namespace chorus
