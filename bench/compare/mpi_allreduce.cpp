// SPDX-License-Identifier: Apache-2.0
// MPI's peer row for bench/compare: float32 sum MPI_Allreduce (in place), timed per operation,
// printed as RESULT lines.
//
// Usage: mpirun -np N [--mca btl tcp,self ...] mpi_allreduce [--sizes 64M,8] [--iters I]
//        [--warmup W] [--label NAME]
// Build: mpicxx -O2 -std=c++20 mpi_allreduce.cpp
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "measure.hpp"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  int size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);

  std::vector<std::size_t> sizes{std::size_t{64} << 20};
  int iters = 20;
  int warmup = 5;
  std::string label = "mpi";
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    bool has_value = i + 1 < argc;
    if (arg == "--sizes" && has_value) sizes = compare::parse_sizes(argv[++i]);
    else if (arg == "--iters" && has_value) iters = std::atoi(argv[++i]);
    else if (arg == "--warmup" && has_value) warmup = std::atoi(argv[++i]);
    else if (arg == "--label" && has_value) label = argv[++i];
    else {
      if (rank == 0) {
        std::fprintf(stderr, "usage: mpi_allreduce [--sizes 64M,8] [--iters I] [--warmup W] "
                             "[--label NAME]\n");
      }
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
  }

  for (std::size_t bytes : sizes) {
    const int count = static_cast<int>(bytes / sizeof(float));
    // Touched before timing: page faults in our buffer are not what we measure. (Scratch
    // buffers MPI allocates per call are part of MPI's cost, and are measured.)
    std::vector<float> data(static_cast<std::size_t>(count), static_cast<float>(rank + 1));

    MPI_Allreduce(MPI_IN_PLACE, data.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    const float expected = static_cast<float>(size * (size + 1) / 2);
    long wrong = 0;
    for (float v : data) wrong += v == expected ? 0 : 1;
    std::fill(data.begin(), data.end(), 0.0f);

    for (int i = 0; i < warmup; ++i) {
      MPI_Allreduce(MPI_IN_PLACE, data.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    }
    std::vector<double> times;
    times.reserve(static_cast<std::size_t>(iters));
    for (int i = 0; i < iters; ++i) {
      double start = compare::now_us();
      MPI_Allreduce(MPI_IN_PLACE, data.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      times.push_back(compare::now_us() - start);
    }
    if (rank == 0) {
      compare::print_allreduce(label.c_str(), size, bytes, iters, compare::summarize(times),
                               wrong);
    }
  }
  MPI_Finalize();
  return 0;
}
