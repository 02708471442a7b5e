// SPDX-License-Identifier: Apache-2.0
// all_gather_perf: nccl-tests style sweep of all_gather (every rank gets every rank's buffer).
//
// Run: chorus-run -n 4 ./all_gather_perf -b 8 -e 64M -f 2     (-h for every flag)
#include "perf_common.hpp"

int main(int argc, char** argv) { return perf::run(perf::collective::all_gather, argc, argv); }
