// SPDX-License-Identifier: Apache-2.0
// gather_perf: nccl-tests style sweep of gather (the root gets every rank's block, in rank order).
//
// Run: chorus-run -n 4 ./gather_perf -b 8 -e 64M -f 2     (-h for every flag)
#include "perf_common.hpp"

int main(int argc, char** argv) { return perf::run(perf::collective::gather, argc, argv); }
