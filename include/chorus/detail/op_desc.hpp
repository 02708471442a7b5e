// SPDX-License-Identifier: Apache-2.0
// One call as the progress engine queues it, type-erased, and the checks every call passes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "chorus/collectives.hpp"
#include "chorus/error.hpp"
#include "chorus/schedule/schedule.hpp"
#include "chorus/types.hpp"

namespace chorus::detail {

struct op_desc {
  collective kind = collective::all_reduce;
  const void* in = nullptr;
  void* out = nullptr;
  std::size_t count = 0;  ///< as schedule.hpp's collective comment defines it
  dtype type = dtype::float32;
  reduce_op op = reduce_op::sum;
  algo algorithm = algo::automatic;
  int root = -1;          ///< rooted collectives: the root; send_recv: the peer
  bool sending = false;   ///< send_recv: this rank sends
  int tag = 0;            ///< send_recv
  bool single_copy = false;  ///< send_recv: p2p_options::single_copy
  std::vector<std::size_t> send_counts, recv_counts;  ///< all_to_allv (copied: the call returns)
  std::uint64_t seq = 0;  ///< collectives: the communicator's; send_recv: the pair's
  bool is_group = false;
  std::vector<op_desc> members;  ///< a group's operations
  std::shared_ptr<op_state> state = nullptr;  ///< made for queued operations only
  std::uint64_t flight = 0;  ///< its first ticket in the communicator's flight recorder

  static op_desc of(collective k, const void* in, void* out, std::size_t count, dtype t,
                    reduce_op op, algo a, int root = -1) {
    op_desc d;
    d.kind = k;
    d.in = in;
    d.out = out;
    d.count = count;
    d.type = t;
    d.op = op;
    d.algorithm = a;
    d.root = root;
    return d;
  }
  static op_desc of_counts(const void* in, std::span<const std::size_t> send_counts, void* out,
                           std::span<const std::size_t> recv_counts, dtype t, algo a) {
    op_desc d = of(collective::all_to_allv, in, out, 0, t, reduce_op::sum, a);
    d.send_counts.assign(send_counts.begin(), send_counts.end());
    d.recv_counts.assign(recv_counts.begin(), recv_counts.end());
    return d;
  }
  static op_desc of_p2p(bool sending, const void* data, std::size_t count, dtype t, int peer,
                        const p2p_options& o) {
    op_desc d = of(collective::send_recv, sending ? data : nullptr,
                   sending ? nullptr : const_cast<void*>(data), count, t, reduce_op::sum,
                   algo::direct, peer);
    d.sending = sending;
    d.tag = o.tag;
    d.single_copy = sending && o.single_copy;
    return d;
  }
};

/// Elements of input and output this rank's part of `d` uses (0 for buffers it does not).
struct buffer_sizes {
  std::size_t in = 0, out = 0;
};

/// Saturating sum, so that an overflowing count list is caught rather than wrapped.
inline std::size_t sum_counts(std::span<const std::size_t> c) {
  std::size_t s = 0;
  for (std::size_t x : c) {
    if (x > std::numeric_limits<std::size_t>::max() - s) return std::numeric_limits<std::size_t>::max();
    s += x;
  }
  return s;
}

inline buffer_sizes buffer_sizes_of(const op_desc& d, int rank, int size) {
  const auto n = static_cast<std::size_t>(size);
  const bool root = rank == d.root;
  switch (d.kind) {
    case collective::all_reduce: return {d.count, d.count};
    case collective::reduce_scatter: return {d.count * n, d.count};
    case collective::all_gather: return {d.count, d.count * n};
    case collective::broadcast: return {root ? d.count : 0, d.count};
    case collective::reduce: return {d.count, root ? d.count : 0};
    case collective::all_to_all: return {d.count * n, d.count * n};
    case collective::all_to_allv: return {sum_counts(d.send_counts), sum_counts(d.recv_counts)};
    case collective::gather: return {d.count, root ? d.count * n : 0};
    case collective::scatter: return {root ? d.count * n : 0, d.count};
    case collective::barrier: return {0, 0};
    case collective::send_recv: return {d.sending ? d.count : 0, d.sending ? 0 : d.count};
  }
  return {};
}

/// The count the tuner prices: the call's own, or for all_to_allv the average block.
inline std::size_t tuning_count(const op_desc& d, int size) {
  if (d.kind != collective::all_to_allv) return d.count;
  return sum_counts(d.send_counts) / static_cast<std::size_t>(std::max(1, size));
}

/// Checks one call on this rank; throws errc::invalid_argument naming the call and what is
/// wrong. What only the peers can see (a different count, root or dtype there) is caught
/// from the frame headers instead (errc::mismatch).
inline void validate(const char* call, const op_desc& d, int rank, int size) {
  auto bad = [&](const std::string& what) {
    throw error(errc::invalid_argument, std::string(call) + ": " + what, {rank}, std::nullopt, call);
  };
  const auto n = static_cast<std::size_t>(size);
  if (!is_valid(d.type)) bad("dtype " + std::to_string(static_cast<int>(d.type)) + " is not a chorus::dtype");
  if (reduces(d.kind)) {
    if (!is_valid(d.op)) bad("op " + std::to_string(static_cast<int>(d.op)) + " is not a chorus::reduce_op");
    if (d.op == reduce_op::avg && !is_floating(d.type)) {
      bad("avg is defined for floating types only, not " + std::string(to_string(d.type)) +
          " (an integer average would truncate; use sum and divide)");
    }
  }
  if (rooted(d.kind) && (d.root < 0 || d.root >= size)) {
    bad("root " + std::to_string(d.root) + " is not a rank of this communicator of " +
        std::to_string(size));
  }
  if (d.kind == collective::send_recv) {
    if (d.root < 0 || d.root >= size) {
      bad("peer " + std::to_string(d.root) + " is not a rank of this communicator of " +
          std::to_string(size));
    }
    if (d.root == rank) bad("rank " + std::to_string(rank) + " cannot send to or receive from itself");
    if (d.tag < 0) bad("tag " + std::to_string(d.tag) + " is negative");
  }
  const std::size_t es = size_of(d.type);
  // No buffer holds more than PTRDIFF_MAX bytes. (Against SIZE_MAX, a count list that
  // overflowed, summed to SIZE_MAX by sum_counts, passed for one-byte types.)
  constexpr auto most_bytes = static_cast<std::size_t>(std::numeric_limits<std::ptrdiff_t>::max());
  if (d.kind == collective::all_to_allv) {
    if (d.send_counts.size() != n || d.recv_counts.size() != n) {
      bad("needs one send and one receive count per rank (" + std::to_string(n) + "), not " +
          std::to_string(d.send_counts.size()) + " and " + std::to_string(d.recv_counts.size()));
    }
    const auto me = static_cast<std::size_t>(rank);
    if (d.send_counts[me] != d.recv_counts[me]) {
      bad("this rank sends itself " + std::to_string(d.send_counts[me]) + " elements but expects " +
          std::to_string(d.recv_counts[me]));
    }
    for (const auto* c : {&d.send_counts, &d.recv_counts}) {
      if (sum_counts(*c) > most_bytes / es) bad("the counts overflow the buffer size");
    }
  } else if (d.count > most_bytes / es / n) {
    bad("count " + std::to_string(d.count) + " overflows the buffer size");
  }
  const buffer_sizes sz = buffer_sizes_of(d, rank, size);
  if (sz.in > 0 && d.in == nullptr) bad("input is null but holds " + std::to_string(sz.in) + " elements");
  if (sz.out > 0 && d.out == nullptr) bad("output is null but holds " + std::to_string(sz.out) + " elements");

  // Buffers may be identical (in place) or disjoint; a partial overlap would corrupt data.
  const std::size_t in_bytes = sz.in * es;
  const std::size_t out_bytes = sz.out * es;
  if (in_bytes == 0 || out_bytes == 0) return;
  const auto in = reinterpret_cast<std::uintptr_t>(d.in);
  const auto out = reinterpret_cast<std::uintptr_t>(d.out);
  if (!(in < out + out_bytes && out < in + in_bytes)) return;
  const std::uintptr_t own = d.count * es * static_cast<std::size_t>(rank);
  const std::uintptr_t roots = d.count * es * static_cast<std::size_t>(std::max(d.root, 0));
  // In place means NCCL's and MPI's forms; anything else that overlaps is refused.
  bool in_place = false;
  switch (d.kind) {
    case collective::all_reduce:
    case collective::broadcast:
    case collective::reduce: in_place = in == out; break;
    case collective::all_gather: in_place = in == out + own; break;
    case collective::reduce_scatter: in_place = out == in + own; break;
    case collective::gather: in_place = in == out + roots; break;
    case collective::scatter: in_place = out == in + roots; break;
    default: break;
  }
  if (!in_place) {
    bad(d.kind == collective::all_to_all || d.kind == collective::all_to_allv
            ? std::string("input and output overlap (") + call + " does not run in place)"
            : "input and output overlap without being in place");
  }
}

}  // namespace chorus::detail
