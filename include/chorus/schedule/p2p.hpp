// SPDX-License-Identifier: Apache-2.0
// Point-to-point send and receive, as one-step schedules.
//
// send_recv: 1 step, S bytes from the sender to the receiver. Messages between one pair of
// ranks match in the order each side posts them (schedule.hpp, promise 1); the tag both sides
// name travels in every frame header and must agree.
#pragma once

#include <cstddef>

#include "chorus/schedule/schedule.hpp"

namespace chorus {

/// The sender's side: `count` elements of the input go to `peer`.
inline schedule send_schedule(int rank, int nranks, int peer, std::size_t count) {
  schedule s = new_schedule(collective::send_recv, algo::direct, rank, nranks, peer);
  s.steps.push_back(step{.send_peer = peer, .send_from = {buffer_id::input, 0, count}});
  return s;
}

/// The receiver's side: `count` elements from `peer` land in the output.
inline schedule recv_schedule(int rank, int nranks, int peer, std::size_t count) {
  schedule s = new_schedule(collective::send_recv, algo::direct, rank, nranks, peer);
  s.steps.push_back(step{.recv_peer = peer, .action = recv_action::store,
                         .recv_into = {buffer_id::output, 0, count}});
  return s;
}

}  // namespace chorus
