// SPDX-License-Identifier: Apache-2.0
// The frame header every transport puts before every slice, and its validation.
#pragma once

#include <array>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#include "chorus/error.hpp"
#include "chorus/schedule/schedule.hpp"
#include "chorus/types.hpp"

namespace chorus::detail {

/// Layout (little-endian, 40 bytes, no padding). The fingerprint fields (op_seq, count,
/// kind, dtype, redop, algorithm, root) let a receiver notice that two ranks called different
/// operations from the very first frame, instead of hanging or reducing garbage.
struct frame_header {
  std::uint32_t magic = 0;
  std::uint32_t length = 0;  ///< payload bytes after the header
  std::uint64_t op_seq = 0;  ///< the communicator's operation number (send_recv: the pair's)
  std::uint64_t count = 0;   ///< elements the sender's call named (all_to_allv: this block's)
  std::uint8_t kind = 0;     ///< collective, or frame_abort
  std::uint8_t dtype = 0;
  std::uint8_t redop = 0;
  std::uint8_t algorithm = 0;
  std::uint32_t step = 0;
  std::uint32_t slice = 0;
  std::uint32_t root = 0;  ///< rooted collectives: the root; send_recv: the tag; else no_root
};
static_assert(sizeof(frame_header) == 40, "frame_header must have no padding");

inline constexpr std::uint32_t frame_magic = 0x31524843;  // "CHR1"
/// A frame of this kind carries an error message instead of data: the sender failed and
/// every operation with it must fail too.
inline constexpr std::uint8_t frame_abort = 0xff;
/// A frame of this kind carries no payload: its sender has waited a while for a frame from
/// us in the collective its header names (as abort_header() names a call: the kind in
/// `step`). A receiver that made a different call of that number fails with errc::mismatch
/// naming both (read_check()), so ranks that wait on each other in calls that do not match
/// (roots that differ, say) fail at once instead of at their timeouts.
inline constexpr std::uint8_t frame_check = 0xfe;
/// `root` of a collective that has none.
inline constexpr std::uint32_t no_root = 0xffffffffu;
/// Whether receivers compare the fingerprint of every frame with their own call: always,
/// except in bench/perf's *_unchecked binaries, which measure what mismatch detection costs
/// (bench/mismatch/run) and must never be used otherwise.
#ifdef CHORUS_BENCH_UNCHECKED_FINGERPRINTS
inline constexpr bool check_fingerprints = false;
#else
inline constexpr bool check_fingerprints = true;
#endif

/// Largest payload of one frame. Larger lengths on the wire are rejected before any use.
inline constexpr std::uint32_t max_frame_payload = 64u << 20;

/// The operation-wide part of a header, which every frame of one operation shares.
struct op_fingerprint {
  std::uint64_t op_seq = 0;
  std::uint64_t count = 0;
  collective kind = collective::all_reduce;
  chorus::dtype type = chorus::dtype::float32;
  reduce_op op = reduce_op::sum;
  algo algorithm = algo::ring;
  std::uint32_t root = no_root;  ///< rooted collectives: the root; send_recv: the tag
  /// all_to_allv: ranks send each peer a different count, so each frame carries the count of
  /// its own block (what the receiver expects from that peer) instead of `count`.
  bool count_per_block = false;
};

/// The header of slice `slice` of step `step`; `block_count` is the step's element count,
/// which replaces the operation's where f.count_per_block.
inline frame_header make_header(const op_fingerprint& f, std::uint32_t step, std::uint64_t slice,
                                std::uint32_t length, std::uint64_t block_count = 0) {
  return frame_header{frame_magic,
                      length,
                      f.op_seq,
                      f.count_per_block ? block_count : f.count,
                      static_cast<std::uint8_t>(f.kind),
                      static_cast<std::uint8_t>(f.type),
                      static_cast<std::uint8_t>(f.op),
                      static_cast<std::uint8_t>(f.algorithm),
                      step,
                      static_cast<std::uint32_t>(slice),
                      f.root};
}

/// "all_reduce(count=10, float32, sum, ring) as op 7", "broadcast(count=4, int32, root 2,
/// chain) as op 3", "send_recv(count=8, float32, tag 5) as message 2 of the pair".
inline std::string describe_call(const frame_header& h) {
  const auto kind = static_cast<collective>(h.kind);
  std::string s = std::string(to_string(kind)) + "(count=" + std::to_string(h.count) +
                  ", " + std::string(to_string(static_cast<chorus::dtype>(h.dtype)));
  if (reduces(kind)) s += ", " + std::string(to_string(static_cast<reduce_op>(h.redop)));
  if (kind == collective::send_recv) {
    return s + ", tag " + std::to_string(h.root) + ") as message " + std::to_string(h.op_seq) +
           " of the pair";
  }
  if (h.root != no_root) s += ", root " + std::to_string(h.root);
  return s + ", " + std::string(to_string(static_cast<algo>(h.algorithm))) + ") as op " +
         std::to_string(h.op_seq);
}

/// Whether two headers name the same call: every operation-wide field but the number.
inline bool same_call(const frame_header& a, const frame_header& b) {
  return a.count == b.count && a.kind == b.kind && a.dtype == b.dtype && a.redop == b.redop &&
         a.algorithm == b.algorithm && a.root == b.root;
}

/// errc::mismatch between this rank's call `mine` and `peer`'s call `theirs`, raised in
/// operation `op` of kind `kind`; `why`, where given, ends the sentence.
inline error mismatch_error(int self, const frame_header& mine, int peer, const frame_header& theirs,
                            std::uint64_t op, collective kind, const std::string& why = {}) {
  return error(errc::mismatch,
               "mismatched collectives: rank " + std::to_string(self) + " called " + describe_call(mine) +
                   " but rank " + std::to_string(peer) + " called " + describe_call(theirs) + why,
               {self, peer}, op, std::string(to_string(kind)));
}

/// The fingerprints of this rank's last collectives, so that a frame left over from an
/// earlier operation is described against what this rank called then. Where two ranks
/// disagree on a root, each may finish its own call without reading the other's frames
/// (every rank believes it received what its tree sends it); the leftover frame surfaces at
/// the next call that reads from its sender, and the error names both calls, not only the
/// number they no longer share.
class call_history {
 public:
  void record(const op_fingerprint& f) {
    if (!check_fingerprints || f.kind == collective::send_recv) return;  // numbered per pair, not per communicator
    calls_[f.op_seq % calls_.size()] = make_header(f, 0, 0, 0);
  }
  /// This rank's call numbered `op_seq`, if it is among the last few.
  const frame_header* find(std::uint64_t op_seq) const {
    const std::size_t i = op_seq % calls_.size();
    return calls_[i].magic == frame_magic && calls_[i].op_seq == op_seq ? &calls_[i] : nullptr;
  }

 private:
  std::array<frame_header, 64> calls_{};  // magic 0: never written
};

/// The header of an abort frame, whose `length` bytes of text follow it. Where the sender
/// failed in a collective, the header also names that call (`call`, as its frames carry it):
/// its kind moves to `step`, since `kind` says frame_abort, and `slice` is 1.
inline frame_header abort_header(std::uint32_t text_length, const frame_header* call) {
  frame_header h = call != nullptr ? *call : frame_header{};
  h.magic = frame_magic;
  h.length = text_length;
  h.step = call != nullptr ? call->kind : 0;
  h.slice = call != nullptr ? 1 : 0;
  h.kind = frame_abort;
  return h;
}

/// The header of a check frame (frame_check) for this rank's call `call` (as its frames
/// carry it): an abort header's, without text, of the other kind.
inline frame_header check_header_of(const frame_header& call) {
  frame_header h = abort_header(0, &call);
  h.kind = frame_check;
  return h;
}

/// The call an abort or check frame `h` names, its kind back in place.
inline frame_header call_named_by(const frame_header& h) {
  frame_header call = h;
  call.kind = static_cast<std::uint8_t>(h.step);
  return call;
}

/// Reads `peer`'s check frame `h` against this rank's own call of that number (`mine`): a
/// different call is errc::mismatch naming both. A call this rank has not made yet, or no
/// longer remembers, says nothing: the peer checks again later, and so does this rank once
/// it waits in that call. Throws errc::protocol for a check frame with a payload.
inline void read_check(const frame_header& h, int peer, int self, const call_history* mine) {
  if (h.length != 0 || h.step >= static_cast<std::uint32_t>(collective::send_recv)) {
    throw error(errc::protocol, "rank " + std::to_string(peer) + " sent a malformed check frame", {peer},
                std::nullopt, "recv");
  }
  // all_to_allv's frames carry a count per block, which its calls do not share.
  if (h.step == static_cast<std::uint32_t>(collective::all_to_allv)) return;
  const frame_header* own = check_fingerprints && mine != nullptr ? mine->find(h.op_seq) : nullptr;
  if (own == nullptr) return;
  const frame_header theirs = call_named_by(h);
  if (!same_call(theirs, *own)) {
    throw mismatch_error(self, *own, peer, theirs, h.op_seq, static_cast<collective>(own->kind),
                         " (rank " + std::to_string(peer) + " waits for this rank in it)");
  }
}

/// The error a peer's abort frame (header `h`, text `text`) raises: errc::remote_error,
/// unless the call the peer failed in is not this rank's call of that number (`mine`, where
/// given), which is a mismatch, and then the error names both calls. A rank that believes it
/// is a root may wait for a frame its peer's tree never sends, while the peer finishes and
/// moves on; the waiting rank fails, and its abort is the only word the peer gets of its call.
inline error peer_failed(int peer, int self, const frame_header& h, const std::string& text,
                         const call_history* mine) {
  const frame_header* own = h.slice == 1 && mine != nullptr && h.step < static_cast<std::uint32_t>(collective::send_recv)
                                ? mine->find(h.op_seq)
                                : nullptr;
  if (own != nullptr) {
    const frame_header theirs = call_named_by(h);
    if (!same_call(theirs, *own)) {
      return mismatch_error(self, *own, peer, theirs, h.op_seq, static_cast<collective>(own->kind),
                            " (rank " + std::to_string(peer) + " failed: " + text + ")");
    }
  }
  return error(errc::remote_error, "rank " + std::to_string(peer) + " failed: " + text, {peer}, std::nullopt,
               "recv");
}

/// Checks a received header against the one this rank expects. Throws errc::protocol for
/// bytes that are not a chorus frame, errc::remote_error for an abort frame (the caller reads
/// its payload first and passes it as `abort_text`) and errc::mismatch for a frame of a
/// different operation. `earlier`, where given, describes a frame of an earlier collective
/// against this rank's own call of that number.
inline void check_header(const frame_header& got, const frame_header& want, int peer,
                         int self, const call_history* earlier = nullptr) {
  if (got.magic != frame_magic) {
    throw error(errc::protocol,
                "rank " + std::to_string(peer) + " sent a frame with bad magic 0x" +
                    [&] {
                      char buf[16];
                      std::snprintf(buf, sizeof buf, "%08x", got.magic);
                      return std::string(buf);
                    }(),
                {peer}, std::nullopt, "recv");  // the executor adds the running operation
  }
  if (check_fingerprints && (got.op_seq != want.op_seq || !same_call(got, want))) {
    const auto kind = static_cast<collective>(want.kind);
    const frame_header* then = earlier != nullptr && got.op_seq < want.op_seq && kind != collective::send_recv &&
                                       static_cast<collective>(got.kind) != collective::send_recv
                                   ? earlier->find(got.op_seq)
                                   : nullptr;
    if (then != nullptr) {
      throw mismatch_error(self, *then, peer, got, want.op_seq, kind,
                           " (its frame was still unread when op " + std::to_string(want.op_seq) + " began)");
    }
    throw mismatch_error(self, want, peer, got, want.op_seq, kind);
  }
  // Step numbers are each rank's own (a rank folded in by recursive doubling has fewer
  // steps), so they are carried for debugging only; slice and length must agree.
  if (got.slice != want.slice || got.length != want.length) {
    throw error(errc::protocol,
                "rank " + std::to_string(peer) + " sent slice " + std::to_string(got.slice) +
                    " (" + std::to_string(got.length) + " bytes) where slice " +
                    std::to_string(want.slice) + " (" + std::to_string(want.length) +
                    " bytes) was due",
                {peer}, want.op_seq, std::string(to_string(static_cast<collective>(want.kind))));
  }
}

}  // namespace chorus::detail
