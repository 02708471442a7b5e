// SPDX-License-Identifier: Apache-2.0
// The schedule vocabulary: what one rank sends, receives, reduces and copies, step by step.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

namespace chorus {

/// The collective a schedule implements. The numbering is part of the wire format.
enum class collective : std::uint8_t { all_reduce = 0, reduce_scatter = 1, all_gather = 2 };

constexpr std::string_view to_string(collective c) noexcept {
  switch (c) {
    case collective::all_reduce: return "all_reduce";
    case collective::reduce_scatter: return "reduce_scatter";
    case collective::all_gather: return "all_gather";
  }
  return "invalid";
}

/// Algorithms. The numbering is part of the wire format (it is in every frame header, so two
/// ranks that picked different algorithms fail with errc::mismatch instead of hanging).
enum class algo : std::uint8_t { automatic = 0, ring = 1, recursive_doubling = 2, hierarchical = 3 };

constexpr std::string_view to_string(algo a) noexcept {
  switch (a) {
    case algo::automatic: return "auto";
    case algo::ring: return "ring";
    case algo::recursive_doubling: return "recursive_doubling";
    case algo::hierarchical: return "hierarchical";
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
/// Two regions a schedule uses in one buffer either start at the same offset or do not
/// overlap. The executor relies on it: slice k of one then only ever touches slice k of the
/// other, which makes the dependency between two steps a per-slice counter.
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
  std::size_t scratch_count = 0;  ///< elements of scratch the executor must provide
  std::vector<step> steps;
};

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
