// SPDX-License-Identifier: Apache-2.0
// A rank program for the cut-link tests (run by chorus-run --nodes): every rank runs
// all_reduces until one fails; after CUT_AFTER of them the first rank of the last node cuts
// its node off the network, in its own namespace, the way MODE says:
//   drop    iptables DROP of everything in and out of the node's interface (a blackhole)
//   reject  iptables REJECT of the same (TCP resets, ICMP port unreachable)
//   tcpdrop iptables DROP of TCP only: heartbeats (UDP) still pass, so only the TCP
//           transport's own judgement of its links can find the cut
//   tcpdrop-window  the same, once the last node's ranks have left a 32 MiB all_reduce
//           unread for 1.5 s (the windows toward them closed), and they stay asleep 8 s
//           more: they send nothing, and only unanswered window probes can tell the cut
//           (run it with small socket buffers and the ring, so that the windows close)
//   down    ip link set dev IFACE down
//   tbf     tc tbf on the interface at 8 kbit/s with a 3 KB queue: the link is up, but the
//           node's data and heartbeats mostly drop
// Each rank prints one line: "rank R: CODE ranks A,B after T ms: MESSAGE", T counted from
// the cut (CLOCK_MONOTONIC is shared by every namespace), and exits 0 when it got an error.
//
// Usage: cut_rank MODE [CUT_AFTER]
#include <chorus/chorus.hpp>
#include <chorus/transport/auto.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

namespace {

long long now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int shell(const std::string& cmd) {
  const int rc = std::system(cmd.c_str());
  if (rc != 0) std::fprintf(stderr, "cut_rank: '%s' failed (%d)\n", cmd.c_str(), rc);
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: cut_rank drop|reject|tcpdrop|tcpdrop-window|down|tbf [CUT_AFTER]\n");
    return 2;
  }
  const std::string mode = argv[1];
  const int cut_after = argc > 2 ? std::atoi(argv[2]) : 20;
  const char* ifname = std::getenv("CHORUS_SOCKET_IFNAME");
  if (ifname == nullptr || (mode != "drop" && mode != "reject" && mode != "tcpdrop" && mode != "tcpdrop-window" &&
                             mode != "down" && mode != "tbf")) {
    std::fprintf(stderr, "cut_rank: needs CHORUS_SOCKET_IFNAME (chorus-run --nodes) and a mode\n");
    return 2;
  }
  const std::string dev = ifname;
  try {
    auto comm = chorus::communicator::from_env<chorus::auto_transport>();
    const bool cutter = comm.node() == comm.nodes() - 1 && comm.local_rank() == 0;
    // Every rank prints its own clock; the test subtracts the cutter's.
    const bool window = mode == "tcpdrop-window";
    std::vector<float> v(window ? 1 << 23 : 1 << 14, 1.0f);
    long long cut_at = 0;
    for (int i = 0;; ++i) {
      const bool sleeper = window && i == cut_after && comm.node() == comm.nodes() - 1;
      if (sleeper) std::this_thread::sleep_for(std::chrono::milliseconds(cutter ? 1500 : 1600));
      if (cutter && i == cut_after) {
        cut_at = now_us();
        int rc = 0;
        if (mode == "drop" || mode == "reject") {
          const std::string target = mode == "drop" ? "DROP" : "REJECT";
          rc |= shell("iptables -I INPUT -i " + dev + " -j " + target);
          rc |= shell("iptables -I OUTPUT -o " + dev + " -j " + target);
        } else if (mode == "tcpdrop" || window) {
          rc |= shell("iptables -I INPUT -i " + dev + " -p tcp -j DROP");
          rc |= shell("iptables -I OUTPUT -o " + dev + " -p tcp -j DROP");
        } else if (mode == "tbf") {
          rc |= shell("tc qdisc replace dev " + dev + " root tbf rate 8kbit burst 1600 limit 3000");
        } else {
          rc |= shell("ip link set dev " + dev + " down");
        }
        if (rc != 0) return 3;
        std::printf("cut at %lld\n", cut_at);
        std::fflush(stdout);
      }
      if (sleeper) std::this_thread::sleep_for(std::chrono::seconds(8));
      try {
        comm.all_reduce(std::span(v));
      } catch (const chorus::error& e) {
        std::string ranks;
        for (int r : e.ranks()) ranks += (ranks.empty() ? "" : ",") + std::to_string(r);
        std::printf("rank %d node %d: %s ranks %s at %lld: %s\n", comm.rank(), comm.node(),
                    std::string(chorus::to_string(e.code())).c_str(), ranks.c_str(), now_us(), e.what());
        std::fflush(stdout);
        // The cut-off node's store and sockets cannot say goodbye across the cut: leave
        // without the lingering a normal exit does.
        std::_Exit(0);
      }
      if (i > cut_after + 100000) return 4;  // never reached in a working build
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cut_rank: %s\n", e.what());
    return 1;
  }
}
