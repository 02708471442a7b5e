// SPDX-License-Identifier: Apache-2.0
// alltoall_perf: nccl-tests style sweep of all_to_all (block j of rank i's buffer goes to
// block i of rank j's).
//
// Run: chorus-run -n 4 ./alltoall_perf -b 8 -e 64M -f 2     (-h for every flag)
#include "perf_common.hpp"

int main(int argc, char** argv) { return perf::run(perf::collective::all_to_all, argc, argv); }
