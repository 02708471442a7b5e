// SPDX-License-Identifier: Apache-2.0
// The groups of 3D parallelism on 8 ranks: tensor-parallel pairs, a two-stage pipeline and
// data-parallel replicas, each a sub-communicator made by split(), all working at once; plus
// the world's broadcast of the initial weights, an all_to_all of tokens (as a mixture of
// experts routes them) and a gather of every rank's checksum at rank 0.
//
// Run: chorus-run -n 8 ./03_parallel_groups
// Expected output (rank 0 only; exit status 0):
//   [0] 8 ranks = 2 data-parallel replicas x 2 pipeline stages x 2 tensor-parallel ranks
//   [0] broadcast: every rank has rank 0's weights
//   [0] tensor groups (all_gather): every rank has its pair's whole activation
//   [0] pipeline (send/recv): stage 1 got stage 0's activations, stage 0 got the gradients back
//   [0] data groups (all_reduce avg): replicas agree on the averaged gradient
//   [0] all_to_all: every rank got one block of tokens from every rank
//   [0] gather: checksums of all 8 ranks at rank 0: 1 1 1 1 1 1 1 1
//   [0] all checks passed
// Any wrong value prints which check failed on which rank, and every rank exits 1.
//
// Rank r is replica r / 4, stage (r / 2) % 2 and tensor rank r % 2. The tensor group of r is
// the ranks that differ from it in the tensor rank only, and so on: each split() takes as
// color what the members share and as key the coordinate that orders them.
#include <chorus/chorus.hpp>
#include <chorus/transport/auto.hpp>

#include <cstdio>
#include <span>
#include <string>
#include <vector>

namespace {

int failures = 0;

void check(bool ok, const char* what, int rank) {
  if (!ok) {
    std::fprintf(stderr, "rank %d: %s is wrong\n", rank, what);
    ++failures;
  }
}

}  // namespace

int main() {
  try {
    chorus::communicator world = chorus::communicator::from_env<chorus::auto_transport>();
    const int r = world.rank();
    if (world.size() != 8) {
      if (r == 0) std::fprintf(stderr, "run with 8 ranks: chorus-run -n 8 %s\n", "03_parallel_groups");
      return 1;
    }
    const int replica = r / 4, stage = (r / 2) % 2, tensor = r % 2;
    auto tp = world.split(replica * 2 + stage, tensor);  // 4 pairs
    auto pp = world.split(replica * 2 + tensor, stage);  // 4 pipelines of 2 stages
    auto dp = world.split(stage * 2 + tensor, replica);  // 4 pairs of replicas

    // 1. Rank 0 initialises the weights and broadcasts them.
    std::vector<float> weights(16, 0.0f);
    if (r == 0) {
      for (std::size_t i = 0; i < weights.size(); ++i) weights[i] = 0.5f * static_cast<float>(i);
    }
    world.broadcast(std::span(weights), 0);
    check(weights[15] == 7.5f, "the broadcast weights", r);

    // 2. Each tensor rank computes half of a layer's activation; the pair gathers the whole.
    std::vector<float> half(4), whole(8);
    for (std::size_t i = 0; i < half.size(); ++i) {
      half[i] = weights[static_cast<std::size_t>(tensor) * 4 + i] * static_cast<float>(replica + 1);
    }
    tp->all_gather(std::span<const float>(half), std::span(whole));
    for (std::size_t i = 0; i < whole.size(); ++i) {
      check(whole[i] == weights[i] * static_cast<float>(replica + 1), "the gathered activation", r);
    }

    // 3. Stage 0 sends its activation forward; stage 1 sends a gradient back. The data groups
    //    of step 4 run while this happens on other ranks.
    std::vector<float> grad(8, 0.0f);
    if (stage == 0) {
      pp->send(std::span<const float>(whole), 1);
      pp->recv(std::span(grad), 1);
    } else {
      std::vector<float> from_stage0(8);
      pp->recv(std::span(from_stage0), 0);
      check(from_stage0 == whole, "the activation stage 1 received", r);
      for (std::size_t i = 0; i < grad.size(); ++i) grad[i] = 2.0f * from_stage0[i];
      pp->send(std::span<const float>(grad), 0);
    }
    check(grad[1] == 2.0f * whole[1], "the gradient", r);

    // 4. Replicas average their gradients: (1 + 2) / 2 times the replica-free gradient.
    dp->all_reduce(std::span(grad), {.op = chorus::avg});
    const float expect = 2.0f * weights[1] * (1.0f + 2.0f) / 2.0f;
    check(grad[1] == expect, "the averaged gradient", r);

    // 5. Tokens: block j of this rank's tokens goes to rank j.
    std::vector<int> tokens(8 * 3), routed(8 * 3);
    for (int j = 0; j < 8; ++j) {
      for (int k = 0; k < 3; ++k) tokens[static_cast<std::size_t>(j * 3 + k)] = 100 * r + 10 * j + k;
    }
    world.all_to_all(std::span<const int>(tokens), std::span(routed));
    for (int i = 0; i < 8; ++i) {
      check(routed[static_cast<std::size_t>(i * 3 + 2)] == 100 * i + 10 * r + 2, "the routed tokens", r);
    }

    // 6. Every rank's verdict at rank 0.
    std::vector<int> mine{failures == 0 ? 1 : 0}, all(8);
    world.gather(std::span<const int>(mine), std::span(all), 0);
    std::vector<int> total{failures};
    world.all_reduce(std::span(total));
    if (r == 0) {
      std::printf("8 ranks = 2 data-parallel replicas x 2 pipeline stages x 2 tensor-parallel ranks\n");
      std::printf("broadcast: every rank has rank 0's weights\n");
      std::printf("tensor groups (all_gather): every rank has its pair's whole activation\n");
      std::printf("pipeline (send/recv): stage 1 got stage 0's activations, stage 0 got the gradients back\n");
      std::printf("data groups (all_reduce avg): replicas agree on the averaged gradient\n");
      std::printf("all_to_all: every rank got one block of tokens from every rank\n");
      std::printf("gather: checksums of all 8 ranks at rank 0:");
      for (int v : all) std::printf(" %d", v);
      std::printf("\n%s\n", total[0] == 0 ? "all checks passed" : "SOME CHECKS FAILED");
    }
    return total[0] == 0 ? 0 : 1;
  } catch (const chorus::error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
