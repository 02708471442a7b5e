// SPDX-License-Identifier: Apache-2.0
// Data-parallel training: N ranks train one logistic regression, each on its shard of every
// global batch, by all-reducing gradient sums; rank 0 also trains alone on whole batches and
// checks that the two loss curves are the same.
//
// Run: chorus-run -n 4 ./02_data_parallel
// Expected output (rank 0 only; exit status 0). The |difference| column is rounding, about
// 1e-16; it changes with the number of ranks and the all_reduce algorithm, the losses do not:
//   [0] data-parallel logistic regression on 4 ranks: 8192 samples x 32 features, 20 epochs
//   [0] global batch 256, shards of 64 samples
//   [0] epoch  loss (4 ranks)  loss (1 process)  |difference|
//   [0]     1      0.42653101        0.42653101       1.1e-16
//   [0]     2      0.33144679        0.33144679       5.6e-17
//   ...
//   [0]    20      0.30809479        0.30809479             0
//   [0] accuracy 0.9359 (4 ranks), 0.9359 (1 process); model identical on all 4 ranks
//   [0] max |delta loss| 1.1e-16, max relative 3.6e-16: loss curves match
// A curve that differs by more than 1e-5 (relative) prints MISMATCH and every rank exits 1.
//
// How it works. The data set is generated in the program from a fixed seed, identically on
// every rank: standard normal features and labels from a fixed linear rule with 5% of them
// flipped. Every epoch visits the samples in an order shuffled by a seed all ranks share.
// Rank r takes samples [b*r/N, b*(r+1)/N) of each global batch of b samples, so shards differ
// by at most one sample when N does not divide b. Each rank all-reduces the SUM of its
// per-sample gradients together with its loss sum and sample count; dividing the summed
// gradient by the summed count gives the mean gradient of the global batch, whatever
// the shard sizes. Everything is float64, and every rank applies the same update to the same
// reduced gradient, so replicas stay bit-identical and the curve differs from the single
// process only by the order in which the all_reduce adds the shard sums.
#include <chorus/chorus.hpp>
#include <chorus/transport/auto.hpp>

#include "../common/logistic.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <span>
#include <vector>

namespace {

using namespace example;

int train(chorus::communicator& comm) {
  const int rank = comm.rank();
  const int nranks = comm.size();
  const auto r = static_cast<std::size_t>(rank);
  const auto n = static_cast<std::size_t>(nranks);
  const bool reference = rank == 0;  // rank 0 also trains alone, as the check
  const data_set d = make_data();

  model dp(features + 1, 0.0);   // the data-parallel replica, the same on every rank
  model ref(features + 1, 0.0);  // rank 0's single-process model
  // One message per step: gradient sums [0, features], then the loss sum, then the count.
  std::vector<double> reduced(features + 3);
  std::vector<double> ref_grad(features + 1);
  std::vector<double> dp_curve;
  std::vector<double> ref_curve;

  if (reference) {
    const char* ranks = nranks == 1 ? "rank" : "ranks";
    std::printf("data-parallel logistic regression on %d %s: %zu samples x %zu features, "
                "%d epochs\n", nranks, ranks, samples, features, epochs);
    if (global_batch % n == 0) {
      std::printf("global batch %zu, shards of %zu samples\n", global_batch, global_batch / n);
    } else {
      std::printf("global batch %zu, shards of %zu or %zu samples\n", global_batch,
                  global_batch / n, global_batch / n + 1);
    }
    std::printf("epoch  loss (%d %s)  loss (1 process)  |difference|\n", nranks, ranks);
  }
  for (int epoch = 1; epoch <= epochs; ++epoch) {
    const std::vector<std::size_t> order = epoch_order(epoch);
    double dp_loss = 0, dp_seen = 0, ref_loss = 0;
    for (std::size_t start = 0; start < samples; start += global_batch) {
      const std::size_t b = std::min(global_batch, samples - start);
      const std::span<const std::size_t> batch(order.data() + start, b);

      // This rank's shard: floor(b*r/N) .. floor(b*(r+1)/N).
      std::fill(reduced.begin(), reduced.end(), 0.0);
      double loss = 0;
      const std::size_t lo = b * r / n;
      const std::size_t hi = b * (r + 1) / n;
      for (std::size_t i = lo; i < hi; ++i) loss += add_gradient(dp, d, batch[i], reduced);
      reduced[features + 1] = loss;
      reduced[features + 2] = static_cast<double>(hi - lo);
      comm.all_reduce(std::span<double>(reduced));  // sum over ranks, in place
      sgd_step(dp, reduced, reduced[features + 2]);
      dp_loss += reduced[features + 1];
      dp_seen += reduced[features + 2];

      if (reference) {  // the same step on the whole batch in one process
        std::fill(ref_grad.begin(), ref_grad.end(), 0.0);
        double batch_loss = 0;  // summed per batch, as the ranks do, so 1 rank matches exactly
        for (std::size_t i = 0; i < b; ++i) batch_loss += add_gradient(ref, d, batch[i], ref_grad);
        sgd_step(ref, ref_grad, static_cast<double>(b));
        ref_loss += batch_loss;
      }
    }
    dp_curve.push_back(dp_loss / dp_seen);
    ref_curve.push_back(ref_loss / static_cast<double>(samples));
    if (reference) {
      std::printf("%5d  %14.8f  %16.8f  %12.2g\n", epoch, dp_curve.back(), ref_curve.back(),
                  std::abs(dp_curve.back() - ref_curve.back()));
    }
  }

  // Evaluation is data-parallel too: each rank counts its slice of the data set.
  double right = static_cast<double>(correct(dp, d, samples * r / n, samples * (r + 1) / n));
  comm.all_reduce(std::span<double>(&right, 1));

  // Every replica must hold the same bits: compare each weight with the minimum and maximum
  // over ranks.
  model lowest = dp, highest = dp;
  comm.all_reduce(std::span<double>(lowest), {.op = chorus::min});
  comm.all_reduce(std::span<double>(highest), {.op = chorus::max});
  double diverged = lowest == dp && highest == dp ? 0.0 : 1.0;
  comm.all_reduce(std::span<double>(&diverged, 1), {.op = chorus::max});

  double failed = diverged;
  if (reference) {
    double max_abs = 0, max_rel = 0;
    for (std::size_t e = 0; e < dp_curve.size(); ++e) {
      const double diff = std::abs(dp_curve[e] - ref_curve[e]);
      max_abs = std::max(max_abs, diff);
      max_rel = std::max(max_rel, diff / std::abs(ref_curve[e]));
    }
    const bool match = max_rel < tolerance;  // also false for NaN
    std::printf("accuracy %.4f (%d %s), %.4f (1 process); model %s on all %d %s\n",
                right / static_cast<double>(samples), nranks, nranks == 1 ? "rank" : "ranks",
                static_cast<double>(correct(ref, d, 0, samples)) / static_cast<double>(samples),
                diverged == 0 ? "identical" : "DIFFERS", nranks, nranks == 1 ? "rank" : "ranks");
    std::printf("max |delta loss| %.2g, max relative %.2g: %s\n", max_abs, max_rel,
                match ? "loss curves match" : "MISMATCH");
    if (!match) failed = 1;
  }
  // Every rank exits with rank 0's verdict.
  comm.all_reduce(std::span<double>(&failed, 1), {.op = chorus::max});
  return failed == 0 ? 0 : 1;
}

}  // namespace

int main() {
  try {
    chorus::communicator comm = chorus::communicator::from_env<chorus::auto_transport>();
    return train(comm);
  } catch (const chorus::error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
