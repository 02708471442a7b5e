// SPDX-License-Identifier: Apache-2.0
// reduce_scatter_perf: nccl-tests style sweep of reduce_scatter (rank r gets reduced chunk r).
//
// Run: chorus-run -n 4 ./reduce_scatter_perf -b 8 -e 64M -f 2     (-h for every flag)
#include "perf_common.hpp"

int main(int argc, char** argv) { return perf::run(perf::collective::reduce_scatter, argc, argv); }
