// SPDX-License-Identifier: Apache-2.0
// reduce_perf: nccl-tests style sweep of reduce (the root gets the reduced buffer).
//
// Run: chorus-run -n 4 ./reduce_perf -b 8 -e 64M -f 2     (-h for every flag)
#include "perf_common.hpp"

int main(int argc, char** argv) { return perf::run(perf::collective::reduce, argc, argv); }
