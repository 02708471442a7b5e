// SPDX-License-Identifier: Apache-2.0
// The smallest chorus program: every rank contributes rank + 1 and every rank gets the sum.
//
// Run: chorus-run -n 4 ./01_all_reduce
// Expected output (chorus-run prefixes each line with the rank; lines may come in any order):
//   [0] rank 0 of 4: 10 10 10 10
//   [1] rank 1 of 4: 10 10 10 10
//   [2] rank 2 of 4: 10 10 10 10
//   [3] rank 3 of 4: 10 10 10 10
#include <chorus/chorus.hpp>
#include <chorus/transport/auto.hpp>

#include <cstdio>
#include <span>
#include <vector>

int main() {
  try {
    // Rank, world size and the rendezvous address come from the launcher's environment
    // (chorus-run, torchrun, mpirun, srun); TCP carries the data.
    chorus::communicator comm = chorus::communicator::from_env<chorus::auto_transport>();

    std::vector<float> data(4, static_cast<float>(comm.rank() + 1));
    comm.all_reduce(std::span{data});  // in place; the default op is sum

    std::printf("rank %d of %d:", comm.rank(), comm.size());
    for (float v : data) std::printf(" %g", static_cast<double>(v));
    std::printf("\n");
  } catch (const chorus::error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
