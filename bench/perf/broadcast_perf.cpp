// SPDX-License-Identifier: Apache-2.0
// broadcast_perf: nccl-tests style sweep of broadcast (every rank gets the root's buffer).
//
// Run: chorus-run -n 4 ./broadcast_perf -b 8 -e 64M -f 2     (-h for every flag)
#include "perf_common.hpp"

int main(int argc, char** argv) { return perf::run(perf::collective::broadcast, argc, argv); }
