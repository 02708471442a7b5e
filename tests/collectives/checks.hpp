// SPDX-License-Identifier: Apache-2.0
// One call of broadcast, reduce, gather, scatter, all_to_all or all_to_allv on this rank,
// checked exactly: outputs against values every rank can recompute, inputs left as they
// were, guard bytes around every buffer. Failures are RANK_CHECKs.
#pragma once

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "collectives/values.hpp"
#include "support/multirank.hpp"

namespace chorus::test {

/// The roots a test tries with n ranks: every rank for small n, else the first, the last and
/// one in the middle.
inline std::vector<int> roots_of(int n) {
  if (n <= 5) {
    std::vector<int> all;
    for (int r = 0; r < n; ++r) all.push_back(r);
    return all;
  }
  return {0, n - 1, n / 2};
}

inline std::string name_of(algo a) { return std::string(to_string(a)); }
template <class T>
std::string name_of() { return std::string(to_string(dtype_of<T>)); }

/// Counts every element of `got` that differs from `want(i)`; prints what failed.
template <class T, class Want>
std::size_t count_wrong(const communicator& comm, const char* what, const guarded_buffer& got,
                        std::size_t first, std::size_t count, Want&& want, algo a, int root) {
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < count; ++i) {
    if (!same_bits(got.get<T>(first + i), want(i))) ++wrong;
  }
  if (wrong != 0) {
    std::fprintf(stderr, "[rank %d of %d] %s %s %s root %d count %zu: %zu wrong\n", comm.rank(),
                 comm.size(), what, name_of(a).c_str(), name_of<T>().c_str(), root, count, wrong);
  }
  return wrong;
}

/// One broadcast of `count` elements from `root`. In place every rank passes one buffer as
/// input and output (the typed form); out of place the root reads a separate input and the
/// others pass no input at all.
template <class T>
void check_broadcast(communicator& comm, algo a, std::size_t count, int root, std::size_t misalign,
                     bool in_place, std::uint64_t seed) {
  const bool is_root = comm.rank() == root;
  const std::size_t bytes = count * sizeof(T);
  guarded_buffer in(is_root ? bytes : 0, misalign), out_buf(bytes, (misalign + 3) % 8);
  guarded_buffer& out = in_place ? (is_root ? in : out_buf) : out_buf;
  guarded_buffer& src = in_place ? out : in;
  if (is_root) {
    for (std::size_t i = 0; i < count; ++i) src.put(i, input_value<T>(sum, root, i, seed));
  }
  const std::vector<unsigned char> before(in.data(), in.data() + in.size());
  const void* in_ptr = in_place ? out.data() : (is_root ? in.data() : nullptr);
  comm.broadcast(in_ptr, out.data(), count, dtype_of<T>, root, {.algorithm = a});
  const auto want = [&](std::size_t i) { return input_value<T>(sum, root, i, seed); };
  RANK_CHECK(count_wrong<T>(comm, "broadcast", out, 0, count, want, a, root) == 0);
  RANK_CHECK(in.guards_intact() && out_buf.guards_intact());
  if (is_root && !in_place && bytes > 0) RANK_CHECK(std::memcmp(before.data(), in.data(), bytes) == 0);
}

/// One reduce of `count` elements to `root`. In place every rank passes its data as input
/// and output (the typed form); out of place the root writes a separate output and the
/// others pass either no output or a buffer that must stay as it was. Every rank but the
/// root must find its input untouched.
template <class T>
void check_reduce(communicator& comm, reduce_op op, algo a, std::size_t count, int root,
                  std::size_t misalign, bool in_place, std::uint64_t seed) {
  const bool is_root = comm.rank() == root;
  const std::size_t bytes = count * sizeof(T);
  guarded_buffer in(bytes, misalign), out_buf(bytes, (misalign + 5) % 8);
  for (std::size_t i = 0; i < count; ++i) in.put(i, input_value<T>(op, comm.rank(), i, seed));
  const std::vector<unsigned char> before(in.data(), in.data() + bytes);
  // Out of place on a non-root: a null output or, every other call, a buffer of guard bytes.
  void* out_ptr = in_place ? in.data() : (is_root || seed % 2 == 0 ? out_buf.data() : nullptr);
  comm.reduce(in.data(), out_ptr, count, dtype_of<T>, root, {.op = op, .algorithm = a});
  if (is_root) {
    guarded_buffer& out = in_place ? in : out_buf;
    const auto want = [&](std::size_t i) { return expected_value<T>(op, comm.size(), i, seed); };
    RANK_CHECK(count_wrong<T>(comm, "reduce", out, 0, count, want, a, root) == 0);
  }
  RANK_CHECK(in.guards_intact() && out_buf.guards_intact());
  if ((!is_root || !in_place) && bytes > 0) RANK_CHECK(std::memcmp(before.data(), in.data(), bytes) == 0);
  if (!is_root) {  // a non-root's output is not written, whatever it passed
    bool untouched = true;
    for (std::size_t i = 0; i < out_buf.size(); ++i) untouched = untouched && out_buf.data()[i] == guarded_buffer::pattern;
    RANK_CHECK(untouched);
  }
}

/// One gather of `block` elements per rank to `root`. In place the root's input is its own
/// block of the output (in == out + root * block); a non-root passes no output.
template <class T>
void check_gather(communicator& comm, algo a, std::size_t block, int root, std::size_t misalign,
                  bool in_place, std::uint64_t seed) {
  const bool is_root = comm.rank() == root;
  const auto n = static_cast<std::size_t>(comm.size());
  const auto me = static_cast<std::size_t>(comm.rank());
  guarded_buffer in_buf(block * sizeof(T), misalign), out(is_root ? n * block * sizeof(T) : 0, (misalign + 1) % 8);
  unsigned char* in = in_place && is_root ? out.data() + me * block * sizeof(T) : in_buf.data();
  for (std::size_t i = 0; i < block; ++i) {
    const T v = input_value<T>(sum, comm.rank(), i, seed);
    std::memcpy(in + i * sizeof(T), &v, sizeof(T));
  }
  const std::vector<unsigned char> before(in, in + block * sizeof(T));
  comm.gather(in, is_root ? out.data() : nullptr, block, dtype_of<T>, root, {.algorithm = a});
  if (is_root) {
    for (std::size_t r = 0; r < n; ++r) {
      const auto want = [&](std::size_t i) { return input_value<T>(sum, static_cast<int>(r), i, seed); };
      RANK_CHECK(count_wrong<T>(comm, "gather", out, r * block, block, want, a, root) == 0);
    }
  }
  RANK_CHECK(in_buf.guards_intact() && out.guards_intact());
  if (!before.empty()) RANK_CHECK(std::memcmp(before.data(), in, before.size()) == 0);
}

/// One scatter of `block` elements per rank from `root`. In place the root's output is its
/// own block of the input (out == in + root * block); a non-root passes no input.
template <class T>
void check_scatter(communicator& comm, algo a, std::size_t block, int root, std::size_t misalign,
                   bool in_place, std::uint64_t seed) {
  const bool is_root = comm.rank() == root;
  const auto n = static_cast<std::size_t>(comm.size());
  const auto me = static_cast<std::size_t>(comm.rank());
  guarded_buffer in(is_root ? n * block * sizeof(T) : 0, misalign), out_buf(block * sizeof(T), (misalign + 7) % 8);
  if (is_root) {
    for (std::size_t r = 0; r < n; ++r) {
      for (std::size_t i = 0; i < block; ++i) in.put(r * block + i, input_value<T>(sum, static_cast<int>(r), i, seed));
    }
  }
  const std::vector<unsigned char> before(in.data(), in.data() + in.size());
  unsigned char* out = in_place && is_root ? in.data() + me * block * sizeof(T) : out_buf.data();
  comm.scatter(is_root ? in.data() : nullptr, out, block, dtype_of<T>, root, {.algorithm = a});
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < block; ++i) {
    T got;
    std::memcpy(&got, out + i * sizeof(T), sizeof(T));
    if (!same_bits(got, input_value<T>(sum, comm.rank(), i, seed))) ++wrong;
  }
  if (wrong != 0) {
    std::fprintf(stderr, "[rank %d of %d] scatter %s %s root %d block %zu: %zu wrong\n", comm.rank(),
                 comm.size(), name_of(a).c_str(), name_of<T>().c_str(), root, block, wrong);
  }
  RANK_CHECK(wrong == 0);
  RANK_CHECK(in.guards_intact() && out_buf.guards_intact());
  if (!before.empty()) RANK_CHECK(std::memcmp(before.data(), in.data(), before.size()) == 0);  // the root's input stays
}

/// Whether call number `seed` runs in place, and the byte offset of its buffers.
inline bool in_place_for(std::uint64_t seed) { return (mix(seed) >> 8) % 2 == 0; }
inline std::size_t misalign_for(std::uint64_t seed) { return mix(seed) % 8; }

/// One all_to_all of `block` elements per pair: block j of our input holds what we send
/// rank j, and block i of the output must hold what rank i sent us.
template <class T>
void check_all_to_all(communicator& comm, algo a, std::size_t block, std::size_t misalign,
                      std::uint64_t seed) {
  const int n = comm.size();
  const int me = comm.rank();
  const auto un = static_cast<std::size_t>(n);
  guarded_buffer in(un * block * sizeof(T), misalign), out(un * block * sizeof(T), (misalign + 3) % 8);
  for (int j = 0; j < n; ++j) {
    for (std::size_t i = 0; i < block; ++i) in.put(static_cast<std::size_t>(j) * block + i, pair_value<T>(me, j, i, seed));
  }
  const std::vector<unsigned char> before(in.data(), in.data() + in.size());
  comm.all_to_all(in.data(), out.data(), block, dtype_of<T>, {.algorithm = a});
  std::size_t wrong = 0;
  for (int from = 0; from < n; ++from) {
    for (std::size_t i = 0; i < block; ++i) {
      if (!same_bits(out.get<T>(static_cast<std::size_t>(from) * block + i), pair_value<T>(from, me, i, seed))) ++wrong;
    }
  }
  if (wrong != 0) {
    std::fprintf(stderr, "[rank %d of %d] all_to_all %s %s block %zu: %zu wrong\n", me, n,
                 std::string(to_string(a)).c_str(), std::string(to_string(dtype_of<T>)).c_str(), block, wrong);
  }
  RANK_CHECK(wrong == 0);
  RANK_CHECK(in.guards_intact() && out.guards_intact());
  if (!before.empty()) RANK_CHECK(std::memcmp(before.data(), in.data(), before.size()) == 0);
}

/// One all_to_allv whose counts come from `seed` (pair_count, up to `most` per pair,
/// about a quarter zero): we send rank j pair_count(me, j) elements and receive
/// pair_count(i, me) from rank i, which is what rank i computes it sends us.
template <class T>
void check_all_to_allv(communicator& comm, algo a, std::size_t most, std::size_t misalign,
                       std::uint64_t seed) {
  const int n = comm.size();
  const int me = comm.rank();
  std::vector<std::size_t> send_counts, recv_counts, send_at, recv_at;
  std::size_t sent = 0, received = 0;
  for (int p = 0; p < n; ++p) {
    send_counts.push_back(pair_count(me, p, most, seed));
    recv_counts.push_back(pair_count(p, me, most, seed));
    send_at.push_back(sent);
    recv_at.push_back(received);
    sent += send_counts.back();
    received += recv_counts.back();
  }
  guarded_buffer in(sent * sizeof(T), misalign), out(received * sizeof(T), (misalign + 5) % 8);
  for (int j = 0; j < n; ++j) {
    const auto uj = static_cast<std::size_t>(j);
    for (std::size_t i = 0; i < send_counts[uj]; ++i) in.put(send_at[uj] + i, pair_value<T>(me, j, i, seed));
  }
  const std::vector<unsigned char> before(in.data(), in.data() + in.size());
  comm.all_to_allv(in.data(), send_counts, out.data(), recv_counts, dtype_of<T>, {.algorithm = a});
  std::size_t wrong = 0;
  for (int from = 0; from < n; ++from) {
    const auto uf = static_cast<std::size_t>(from);
    for (std::size_t i = 0; i < recv_counts[uf]; ++i) {
      if (!same_bits(out.get<T>(recv_at[uf] + i), pair_value<T>(from, me, i, seed))) ++wrong;
    }
  }
  if (wrong != 0) {
    std::fprintf(stderr, "[rank %d of %d] all_to_allv %s %s most %zu seed %llu: %zu wrong\n", me, n,
                 std::string(to_string(a)).c_str(), std::string(to_string(dtype_of<T>)).c_str(), most,
                 static_cast<unsigned long long>(seed), wrong);
  }
  RANK_CHECK(wrong == 0);
  RANK_CHECK(in.guards_intact() && out.guards_intact());
  if (!before.empty()) RANK_CHECK(std::memcmp(before.data(), in.data(), before.size()) == 0);
}

}  // namespace chorus::test
