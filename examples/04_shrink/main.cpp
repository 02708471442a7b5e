// SPDX-License-Identifier: Apache-2.0
// Elastic training: the logistic regression of 02_data_parallel on N ranks, one of which is
// SIGKILLed mid-run. The survivors' all_reduce fails naming it; they shrink() to a
// communicator of their own, take up the training where their new rank 0 stands, and
// finish. At the end rank 0 trains alone on whole batches and checks that the loss curves
// are the same: losing a rank changes who computes each shard of a batch, not the result.
//
// Run: chorus-run -n 4 --keep-going ./04_shrink [KILLED_RANK [EPOCH]]
//      (default: rank N-1 dies at the 11th batch of epoch 5; --keep-going lets the others
//      go on when it does)
// Expected output (rank 0 only, then the new rank 0; the killed rank is reported by
// chorus-run; exit status 0):
//   [0] elastic logistic regression on 4 ranks: rank 3 will be SIGKILLed in epoch 5
//   [0] epoch  loss (data-parallel)  ranks
//   [0]     1            0.42653101      4
//   ...
//   [0]     4            0.31280997      4
//   chorus-run: rank 3 killed by signal SIGKILL; the other ranks go on (--keep-going)
//   [0] epoch 5, batch 11: rank 3 failed (reported by rank 2); 3 ranks go on after a 11 ms shrink
//   [0]     5            0.31015255      3
//   ...
//   [0]    20            0.30809479      3
//   [0] max relative |delta loss| against 1 process 5.4e-16: loss curves match; model identical on all 3 ranks
// A curve that differs by more than 1e-5 (relative) prints MISMATCH and every rank exits 1.
//
// How it works. A step all-reduces the gradient sums of every rank's shard of the global
// batch (02_data_parallel's header says how shards are cut). When a rank dies, a step fails
// on the survivors, perhaps after some of them completed it: after shrink() every survivor
// takes the new rank 0's progress (model, epoch, batch, loss so far) by broadcast, so all
// go on from the same state, and the batch that failed is done again by the survivors.
#include <signal.h>

#include <chorus/chorus.hpp>
#include <chorus/transport/auto.hpp>

#include "../common/logistic.hpp"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <string>
#include <vector>

namespace {

using namespace example;

/// Where training stands, as rank 0 hands it to the survivors after a shrink.
struct progress {
  model m = model(features + 1, 0.0);
  int epoch = 1;
  std::size_t start = 0;        // the first sample of the next global batch
  double loss = 0, seen = 0;    // this epoch's, so far
  std::vector<double> curve;    // the finished epochs' mean losses

  static constexpr std::size_t packed = features + 1 + 5 + epochs;
  std::vector<double> pack() const {
    std::vector<double> v(m);
    v.insert(v.end(), {double(epoch), double(start), loss, seen, double(curve.size())});
    v.insert(v.end(), curve.begin(), curve.end());
    v.resize(packed, 0.0);
    return v;
  }
  static progress unpack(const std::vector<double>& v) {
    progress p;
    p.m.assign(v.begin(), v.begin() + features + 1);
    const double* tail = v.data() + features + 1;
    p.epoch = static_cast<int>(tail[0]);
    p.start = static_cast<std::size_t>(tail[1]);
    p.loss = tail[2];
    p.seen = tail[3];
    p.curve.assign(tail + 5, tail + 5 + static_cast<std::ptrdiff_t>(tail[4]));
    return p;
  }
};

/// One step on this rank's shard of the global batch at p.start.
void step(chorus::communicator& comm, const data_set& d, const std::vector<std::size_t>& order, progress& p) {
  const auto r = static_cast<std::size_t>(comm.rank());
  const auto n = static_cast<std::size_t>(comm.size());
  const std::size_t b = std::min(global_batch, samples - p.start);
  std::vector<double> reduced(features + 3, 0.0);  // gradient sums, loss sum, count
  double loss = 0;
  for (std::size_t i = b * r / n; i < b * (r + 1) / n; ++i) {
    loss += add_gradient(p.m, d, order[p.start + i], reduced);
  }
  reduced[features + 1] = loss;
  reduced[features + 2] = static_cast<double>(b * (r + 1) / n - b * r / n);
  comm.all_reduce(std::span<double>(reduced));
  sgd_step(p.m, reduced, reduced[features + 2]);
  p.loss += reduced[features + 1];
  p.seen += reduced[features + 2];
  p.start += global_batch;
}

/// The loss curve of one process training on whole batches.
std::vector<double> single_process_curve(const data_set& d) {
  model m(features + 1, 0.0);
  std::vector<double> curve, grad(features + 1);
  for (int epoch = 1; epoch <= epochs; ++epoch) {
    const std::vector<std::size_t> order = epoch_order(epoch);
    double total = 0;
    for (std::size_t start = 0; start < samples; start += global_batch) {
      const std::size_t b = std::min(global_batch, samples - start);
      std::fill(grad.begin(), grad.end(), 0.0);
      double batch_loss = 0;
      for (std::size_t i = 0; i < b; ++i) batch_loss += add_gradient(m, d, order[start + i], grad);
      sgd_step(m, grad, static_cast<double>(b));
      total += batch_loss;
    }
    curve.push_back(total / static_cast<double>(samples));
  }
  return curve;
}

bool recoverable(const chorus::error& e) {
  return e.code() == chorus::errc::peer_failed || e.code() == chorus::errc::connection_lost ||
         e.code() == chorus::errc::remote_error;
}

int train(chorus::communicator& comm, int killed, int kill_epoch) {
  const data_set d = make_data();
  const int first_rank = comm.rank();
  progress p;
  if (comm.rank() == 0) {
    std::printf("elastic logistic regression on %d ranks: rank %d will be SIGKILLed in epoch %d\n",
                comm.size(), killed, kill_epoch);
    std::printf("epoch  loss (data-parallel)  ranks\n");
  }
  while (p.epoch <= epochs) {
    try {
      const std::vector<std::size_t> order = epoch_order(p.epoch);
      while (p.start < samples) {
        if (first_rank == killed && p.epoch == kill_epoch && p.start == 10 * global_batch) ::raise(SIGKILL);
        step(comm, d, order, p);
      }
      p.curve.push_back(p.loss / p.seen);
      if (comm.rank() == 0) std::printf("%5d  %20.8f  %5d\n", p.epoch, p.curve.back(), comm.size());
      ++p.epoch;
      p.start = 0;
      p.loss = p.seen = 0;
    } catch (const chorus::error& e) {
      if (!recoverable(e)) throw;
      const auto t0 = std::chrono::steady_clock::now();
      chorus::communicator next = comm.shrink();
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      std::string lost;
      for (const auto& [r, why] : comm.failed_ranks()) {
        lost += (lost.empty() ? "rank " : ", rank ") + std::to_string(r) + " failed (" + why + ")";
      }
      comm = std::move(next);
      std::vector<double> state = p.pack();
      comm.broadcast(std::span(state), 0);
      const progress at = progress::unpack(state);
      if (comm.rank() == 0) {
        std::printf("epoch %d, batch %zu: %s; %d ranks go on after a %.0f ms shrink\n", at.epoch,
                    at.start / global_batch + 1, lost.c_str(), comm.size(), ms);
      }
      p = at;
    }
  }

  // Every replica must hold the same bits.
  model lowest = p.m, highest = p.m;
  comm.all_reduce(std::span<double>(lowest), {.op = chorus::min});
  comm.all_reduce(std::span<double>(highest), {.op = chorus::max});
  double failed = lowest == p.m && highest == p.m ? 0.0 : 1.0;
  if (comm.rank() == 0) {
    const std::vector<double> ref = single_process_curve(d);
    double max_rel = 0;
    for (std::size_t e = 0; e < ref.size(); ++e) {
      max_rel = std::max(max_rel, std::abs(p.curve[e] - ref[e]) / std::abs(ref[e]));
    }
    const bool match = p.curve.size() == ref.size() && max_rel < tolerance;  // false for NaN too
    std::printf("max relative |delta loss| against 1 process %.2g: %s; model %s on all %d ranks\n", max_rel,
                match ? "loss curves match" : "MISMATCH", failed == 0 ? "identical" : "DIFFERS", comm.size());
    if (!match) failed = 1;
  }
  comm.all_reduce(std::span<double>(&failed, 1), {.op = chorus::max});
  return failed == 0 ? 0 : 1;
}

int argument(int argc, char** argv, int i, int fallback, int lo, int hi, const char* what) {
  if (argc <= i) return fallback;
  char* end = nullptr;
  const long v = std::strtol(argv[i], &end, 10);
  if (end == argv[i] || *end != '\0' || v < lo || v > hi) {
    std::fprintf(stderr, "04_shrink: %s must be %d..%d, got '%s'\n", what, lo, hi, argv[i]);
    std::exit(2);
  }
  return static_cast<int>(v);
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // each line as it comes, around chorus-run's report
  try {
    chorus::communicator comm = chorus::communicator::from_env<chorus::auto_transport>();
    if (comm.size() < 2) {
      std::fprintf(stderr, "04_shrink: needs 2 ranks or more (one of them dies)\n");
      return 2;
    }
    const int killed = argument(argc, argv, 1, comm.size() - 1, 0, comm.size() - 1, "KILLED_RANK");
    const int epoch = argument(argc, argv, 2, 5, 1, epochs, "EPOCH");
    return train(comm, killed, epoch);
  } catch (const chorus::error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
