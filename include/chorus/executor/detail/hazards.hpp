// SPDX-License-Identifier: Apache-2.0
// Which earlier steps a step must wait for, found from the byte ranges the steps touch.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace chorus::detail {

/// How a step touches memory: it sends from it, writes it (a receive or a copy's
/// destination) or reads it as the local operand of a reduction or the source of a copy.
enum class access_role : std::uint8_t { send, write, local };

/// "Before this step's `mine` may touch these bytes, step `step` must be done with its
/// `theirs` place up to them."
struct gate {
  std::uint32_t step = 0;
  access_role mine = access_role::send;
  access_role theirs = access_role::send;
};

/// Hazards between the steps of a run, by address: two accesses conflict when their byte
/// ranges overlap and at least one writes; the later step then waits for the earlier one,
/// slice by slice. Within one step only a write waits for the step's own send (an in-place
/// exchange must not overwrite bytes before they left).
///
/// Found by sorting the accesses by start address and pairing each with those that start
/// inside it: O(A log A + conflicting pairs) for A accesses, where comparing every pair of
/// steps would be O(steps^2) on every operation.
class hazard_table {
 public:
  void clear() {
    items_.clear();
    pending_.clear();
  }

  /// Records that `step` touches [lo, hi) in role `r` (empty ranges are ignored).
  void add(std::uint32_t step, access_role r, std::uintptr_t lo, std::uintptr_t hi) {
    if (hi > lo) items_.push_back({lo, hi, step, r});
  }

  /// Computes every step's gates: afterwards gates[first[i] .. first[i+1]) are step i's.
  void build(std::size_t nsteps) {
    std::sort(items_.begin(), items_.end(),
              [](const item& a, const item& b) { return a.lo < b.lo; });
    for (std::size_t i = 0; i < items_.size(); ++i) {
      for (std::size_t j = i + 1; j < items_.size() && items_[j].lo < items_[i].hi; ++j) {
        const item& a = items_[i];
        const item& b = items_[j];
        if (a.step == b.step) {
          // One step's write waits for its own send of the same bytes; nothing else.
          const bool a_writes = a.r == access_role::write;
          if ((a_writes ? b.r : a.r) == access_role::send && (a_writes || b.r == access_role::write)) {
            pending_.push_back({a.step, {a.step, access_role::write, access_role::send}});
          }
          continue;
        }
        const item& early = a.step < b.step ? a : b;
        const item& late = a.step < b.step ? b : a;
        if (conflict(early, late)) pending_.push_back({late.step, {early.step, late.r, early.r}});
      }
    }
    first.assign(nsteps + 1, 0);
    for (const auto& p : pending_) ++first[p.owner + 1];
    for (std::size_t i = 0; i < nsteps; ++i) first[i + 1] += first[i];
    gates.resize(pending_.size());
    std::vector<std::uint32_t>& fill = fill_;
    fill.assign(first.begin(), first.end() - 1);
    for (const auto& p : pending_) gates[fill[p.owner]++] = p.g;
  }

  std::vector<gate> gates;
  std::vector<std::uint32_t> first;

 private:
  struct item {
    std::uintptr_t lo, hi;
    std::uint32_t step;
    access_role r;
  };
  struct owned {
    std::uint32_t owner;
    gate g;
  };

  static bool conflict(const item& early, const item& late) {
    if (late.r == access_role::write) return true;  // after any earlier send, write or read
    return early.r == access_role::write;           // a read after an earlier write
  }

  std::vector<item> items_;
  std::vector<owned> pending_;
  std::vector<std::uint32_t> fill_;
};

}  // namespace chorus::detail
