// SPDX-License-Identifier: Apache-2.0
// sendrecv_perf: nccl-tests style sweep of sendrecv (rank r sends its buffer to r+1 and
// receives the one of r-1, at once).
//
// Run: chorus-run -n 4 ./sendrecv_perf -b 8 -e 64M -f 2     (-h for every flag)
#include "perf_common.hpp"

int main(int argc, char** argv) { return perf::run(perf::collective::send_recv, argc, argv); }
