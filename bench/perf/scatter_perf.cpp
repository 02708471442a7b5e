// SPDX-License-Identifier: Apache-2.0
// scatter_perf: nccl-tests style sweep of scatter (rank r gets block r of the root's buffer).
//
// Run: chorus-run -n 4 ./scatter_perf -b 8 -e 64M -f 2     (-h for every flag)
#include "perf_common.hpp"

int main(int argc, char** argv) { return perf::run(perf::collective::scatter, argc, argv); }
