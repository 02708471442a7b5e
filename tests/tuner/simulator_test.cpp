// SPDX-License-Identifier: Apache-2.0
// The simulator: every schedule runs to completion, and its times obey the cost model.
#include <doctest/doctest.h>

#include <chorus/tuner/simulator.hpp>

#include <cmath>
#include <string>
#include <vector>

using namespace chorus;

namespace {

/// A network of `n` ranks with one node each (or `node_of`), priced by the arguments.
sim_network network_of(std::vector<int> node_of, double latency, double s_per_byte,
                       double reduce = 0) {
  sim_network net;
  net.node_of = std::move(node_of);
  net.intra = {latency, s_per_byte / 2, s_per_byte / 2};
  net.inter = {latency, s_per_byte, s_per_byte};
  net.inter_on_cpu = false;
  net.reduce_s_per_byte = reduce;
  net.copy_s_per_byte = 0;
  return net;
}

std::vector<int> one_per_node(int n) { return sim_network::nodes_of(n, 1); }

bool close(double a, double b, double rel) { return std::abs(a - b) <= rel * std::max(std::abs(a), std::abs(b)); }

}  // namespace

TEST_CASE("the simulator runs every algorithm of every collective to completion, 1 to 24 ranks") {
#if defined(__OPTIMIZE__)
  constexpr int max_ranks = 24;
#else
  constexpr int max_ranks = 12;  // unoptimized sanitizer builds are ~50x slower
#endif
  int runs = 0;
  for (int n = 1; n <= max_ranks; ++n) {
    for (int per_node : {1, 2, 4}) {
      sim_network net = network_of(sim_network::nodes_of(n, per_node), 2e-6, 1e-10, 5e-11);
      net.inter_on_cpu = per_node == 2;  // both ways of pricing inter-node transfers
      net.nodes_per_leaf = per_node == 4 ? 2 : 0;
      net.oversubscription = 2;
      for (int k = 0; k < collective_count; ++k) {
        const auto c = static_cast<collective>(k);
        if (c == collective::all_to_allv || (c == collective::send_recv && n < 2)) continue;
        for (algo a : algorithms_for(c)) {
          for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{1000}, std::size_t{300000}}) {
            CAPTURE(n);
            CAPTURE(per_node);
            CAPTURE(std::string(to_string(c)));
            CAPTURE(std::string(to_string(a)));
            CAPTURE(count);
            const sim_result r = simulate(net, {.kind = c, .algorithm = a, .count = count, .root = n / 2});
            CHECK(r.seconds >= 0);
            CHECK(std::isfinite(r.seconds));
            if (n > 1 && c != collective::barrier && count > 0) CHECK(r.bytes > 0);
            ++runs;
          }
        }
      }
    }
  }
  CHECK(runs > 1000);
}

TEST_CASE("with free bytes, a ring all_reduce takes 2(P-1) latencies and recursive doubling log2(P)") {
  for (int n : {2, 4, 8, 16}) {
    const sim_network net = network_of(one_per_node(n), 1e-6, 0.0);
    const double ring = simulate(net, {.kind = collective::all_reduce, .algorithm = algo::ring, .count = 64}).seconds;
    const double rd = simulate(net, {.kind = collective::all_reduce, .algorithm = algo::recursive_doubling, .count = 64}).seconds;
    const double barrier = simulate(net, {.kind = collective::barrier, .algorithm = algo::dissemination}).seconds;
    CAPTURE(n);
    CHECK(close(ring, 2.0 * (n - 1) * 1e-6, 1e-9));
    CHECK(close(rd, std::log2(n) * 1e-6, 1e-9));
    CHECK(close(barrier, std::log2(n) * 1e-6, 1e-9));
  }
}

TEST_CASE("with no latency, a ring all_reduce is bound by the bytes each NIC sends: 2(P-1)/P of the buffer") {
  for (int n : {2, 4, 8}) {
    const double s_per_byte = 1e-9;
    const std::size_t count = std::size_t{1} << 22;  // 16 MiB of float
    const sim_network net = network_of(one_per_node(n), 0.0, s_per_byte);
    const double t = simulate(net, {.kind = collective::all_reduce, .algorithm = algo::ring, .count = count}).seconds;
    const double wire = 2.0 * (n - 1) / n * static_cast<double>(count * 4) * s_per_byte;
    CAPTURE(n);
    CHECK(t >= wire * (1 - 1e-9));
    CHECK(t <= wire * 1.05);  // slices pipeline: only the first slice's time is not overlapped
  }
}

TEST_CASE("a sendrecv (every rank to the next) takes one message's time at any P: its latency, or its bytes") {
  const std::size_t count = std::size_t{1} << 22;  // 16 MiB of float
  for (int n : {2, 3, 8}) {
    CAPTURE(n);
    const sim_call call{.kind = collective::send_recv, .algorithm = algo::direct, .count = count};
    const sim_result free_bytes = simulate(network_of(one_per_node(n), 1e-6, 0.0), call);
    CHECK(close(free_bytes.seconds, 1e-6, 1e-9));  // one slice of 2 MiB, one latency
    const double s_per_byte = 1e-9;
    const sim_result r = simulate(network_of(one_per_node(n), 0.0, s_per_byte), call);
    const double wire = static_cast<double>(count * 4) * s_per_byte;  // each NIC sends and receives it
    CHECK(r.seconds >= wire * (1 - 1e-9));
    CHECK(r.seconds <= wire * 1.05);
    CHECK(r.bytes == static_cast<std::uint64_t>(n) * count * 4);
  }
  CHECK_THROWS_WITH_AS(simulate(network_of(one_per_node(1), 1e-6, 0.0),
                                {.kind = collective::send_recv, .algorithm = algo::direct, .count = 1}),
                       doctest::Contains("send_recv needs 2 or more ranks"), error);
}

TEST_CASE("the start of a message takes longer in flight: small_s_per_byte for each of its first 2 KiB") {
  const double latency = 1e-6, per_byte = 1e-9;
  for (bool inside : {true, false}) {
    CAPTURE(inside);
    sim_network net = network_of(inside ? std::vector<int>{0, 0} : one_per_node(2), latency, 0.0);
    (inside ? net.intra : net.inter).small_s_per_byte = per_byte;
    auto time_of = [&](std::size_t floats) {
      return simulate(net, {.kind = collective::send_recv, .algorithm = algo::direct, .count = floats}).seconds;
    };
    CHECK(close(time_of(64), latency + 256 * per_byte, 1e-9));            // 256 B: all of it
    CHECK(close(time_of(1024), latency + 2048 * per_byte, 1e-9));          // 4 KiB: its first 2
    CHECK(close(time_of(std::size_t{1} << 20), latency + 2048 * per_byte, 1e-9));  // slices in flight at once
  }
}

TEST_CASE("ranks that share a NIC share its bandwidth, and ranks on the cores do not") {
  // A ring over 4 ranks where every edge crosses nodes: with two ranks per node, each NIC
  // carries two streams at once.
  const std::size_t count = std::size_t{1} << 22;
  auto time_of = [&](std::vector<int> node_of, bool on_cpu) {
    sim_network net = network_of(std::move(node_of), 0.0, 1e-9);
    net.inter_on_cpu = on_cpu;
    return simulate(net, {.kind = collective::all_gather, .algorithm = algo::ring, .count = count}).seconds;
  };
  const double alone = time_of({0, 1, 2, 3}, false);
  const double shared = time_of({0, 1, 0, 1}, false);
  CHECK(close(shared, 2 * alone, 0.05));
  // Priced on the cores, each rank keeps its own port (and pays for both ends there).
  CHECK(close(time_of({0, 1, 0, 1}, true), time_of({0, 1, 2, 3}, true), 1e-9));
}

TEST_CASE("ranks that outnumber their node's cores share them: a ring on 4 ranks and 2 cores takes twice as long") {
  // One node, every byte copied by the cores: 4 ranks of a ring all busy at once.
  const std::size_t count = std::size_t{1} << 22;
  auto time_of = [&](int cores) {
    sim_network net = network_of(std::vector<int>(4, 0), 0.0, 1e-9);
    net.cores_per_node = cores;
    return simulate(net, {.kind = collective::all_gather, .algorithm = algo::ring, .count = count}).seconds;
  };
  const double own = time_of(0);
  CHECK(close(time_of(4), own, 1e-9));  // as many cores as ranks: as if each had its own
  CHECK(close(time_of(2), 2 * own, 0.05));
  CHECK(close(time_of(1), 4 * own, 0.05));
}

TEST_CASE("shared cores are dealt out over short collectives and pooled over long ones") {
  // 3 ranks of a ring on 2 cores: dealt out, ranks 0 and 2 share a core and the ring goes at
  // their pace; pooled, the three share both cores' time.
  auto time_of = [&](int ranks, std::size_t count, double pool_after_s) {
    sim_network net = network_of(std::vector<int>(static_cast<std::size_t>(ranks), 0), 1e-6, 1e-9, 1e-9);
    net.cores_per_node = 2;
    net.pool_after_s = pool_after_s;
    return simulate(net, {.kind = collective::all_reduce, .algorithm = algo::ring, .count = count}).seconds;
  };
  const double never = 0, always = 1e-12;  // dealt out only; pooled only
  const std::size_t large = std::size_t{1} << 26;
  const double dealt = time_of(3, large, never), pooled = time_of(3, large, always);
  CHECK(pooled < 0.85 * dealt);
  const double blended = time_of(3, large, 0.02);
  CHECK(blended > pooled);
  CHECK(blended < dealt);
  // The longer a collective, the more of the pooled time it takes.
  const double w = (dealt - blended) / (dealt - pooled);
  CHECK(close(w, pooled / (pooled + 0.02), 1e-9));
  // A small one is priced as dealt out, within its weight (under 0.1% here).
  CHECK(close(time_of(3, 8, 0.02), time_of(3, 8, never), 1e-3));
  // Ranks that each have a core of their own are priced alike either way.
  CHECK(time_of(2, large, always) == time_of(2, large, never));
  // A node with fewer ranks than cores beside one with more: its ranks may take any of its
  // cores, dealt to a rank or not.
  sim_network net = network_of({0, 0, 0, 0, 0, 1, 1}, 1e-6, 1e-9, 1e-9);
  net.cores_per_node = 4;
  const sim_call call{.kind = collective::all_reduce, .algorithm = algo::ring, .count = large};
  net.pool_after_s = never;
  const double uneven_dealt = simulate(net, call).seconds;
  net.pool_after_s = always;
  const double uneven_pooled = simulate(net, call).seconds;
  CHECK(uneven_pooled > 0);
  CHECK(uneven_pooled <= uneven_dealt);
}

TEST_CASE("bytes beyond the caches cost each core their memory time, as the share of buffers the caches miss") {
  // One node of 2 ranks, every byte through the cores at 1 ns each end. A ring all_reduce of
  // S bytes a rank: each rank's buffers are 2S (input and output), the node's 4S.
  const std::size_t count = std::size_t{1} << 22;  // floats: S = 16 MiB
  const double s = 4.0 * static_cast<double>(count);
  auto time_of = [&](double memory_s_per_byte, std::size_t cache, bool in_place = false) {
    sim_network net = network_of(std::vector<int>(2, 0), 0.0, 2e-9);
    net.memory_s_per_byte = memory_s_per_byte;
    net.cache_bytes = cache;
    return simulate(net, {.kind = collective::all_reduce, .algorithm = algo::ring, .count = count, .in_place = in_place})
        .seconds;
  };
  const double cached = time_of(0, 0);
  CHECK(close(time_of(1e-9, static_cast<std::size_t>(4 * s)), cached, 1e-9));  // the caches hold it all
  // Nothing cached: a rank sends S/2 and receives S/2 twice, all on its core. Every byte sent
  // is read from its buffer (m), every byte received written to it (2m), and the
  // reduce-scatter's received bytes also read from its own input to reduce (m): 7m per byte
  // of S/2.
  const double m = 0.5e-9;
  CHECK(close(time_of(m, 0) - cached, 7 * 0.5 * s * m, 0.02));
  // A quarter of the node's buffers cached: three quarters of that. In place, half of them.
  CHECK(close(time_of(m, static_cast<std::size_t>(s)) - cached, 0.75 * (time_of(m, 0) - cached), 0.02));
  CHECK(close(time_of(m, static_cast<std::size_t>(s), true) - cached, 0.5 * (time_of(m, 0) - cached), 0.02));
}

TEST_CASE("oversubscribed fat-tree uplinks slow down the traffic that crosses leaves") {
  // Four nodes, two per leaf; a ring's edges 1->2 and 3->0 cross leaves. Uplinks of 2 NICs'
  // worth over 4:1 carry half a NIC: those edges, and so the ring, run at half speed.
  const std::size_t count = std::size_t{1} << 22;
  sim_network net = network_of(one_per_node(4), 0.0, 1e-9);
  const double full = simulate(net, {.kind = collective::all_gather, .algorithm = algo::ring, .count = count}).seconds;
  net.nodes_per_leaf = 2;
  net.oversubscription = 1;
  const double one_to_one = simulate(net, {.kind = collective::all_gather, .algorithm = algo::ring, .count = count}).seconds;
  net.oversubscription = 4;
  const double four_to_one = simulate(net, {.kind = collective::all_gather, .algorithm = algo::ring, .count = count}).seconds;
  CHECK(close(one_to_one, full, 0.01));
  CHECK(close(four_to_one, 2 * full, 0.05));
}

TEST_CASE("the double binary tree beats the ring at small sizes on many ranks, and the ring wins large buffers") {
  const sim_network net = network_of(one_per_node(64), 5e-6, 1.0 / 12.5e9, 1.0 / 20e9);
  auto t = [&](algo a, std::size_t count) {
    return simulate(net, {.kind = collective::all_reduce, .algorithm = a, .count = count}).seconds;
  };
  CHECK(t(algo::tree, 256) < t(algo::ring, 256) / 3);
  CHECK(t(algo::ring, std::size_t{1} << 26) < t(algo::recursive_doubling, std::size_t{1} << 26));
}

TEST_CASE("ranks with equal programs share one: every rank of a ring, each local rank of equal nodes") {
  // Peers counted from the rank and gates in a fixed order make programs comparable; what
  // 16,384-rank simulations need to fit in memory.
  auto programs = [](int n, int per_node, algo a, std::size_t count) {
    std::vector<std::string> ids;
    for (int r = 0; r < n; ++r) ids.push_back(std::to_string(r / per_node));
    topology topo = topology::from_ids(0, ids);
    std::vector<detail::sim_program> out;
    for (int r = 0; r < n; ++r) {
      topo.rank = r;
      const schedule s = build_schedule(topo, {.kind = collective::all_reduce, .algorithm = a, .count = count});
      out.push_back(detail::make_program(s, count, 4, executor_options{}));
    }
    return out;
  };
  const auto ring = programs(64, 8, algo::ring, std::size_t{1} << 25);  // 128 MiB
  for (const auto& p : ring) CHECK(p == ring[0]);
  CHECK(ring[0].steps == 126);
  CHECK(ring[0].runs.size() <= 8);
  const auto hier = programs(64, 8, algo::hierarchical, std::size_t{1} << 22);  // pieces divide evenly
  for (std::size_t r = 0; r < hier.size(); ++r) {
    CHECK(hier[r] == hier[r % 8]);
    if (r < 8 && r > 0) CHECK(hier[r] != hier[0]);
  }
}

TEST_CASE("a simulation is deterministic") {
  const sim_network net = network_of(sim_network::nodes_of(12, 3), 3e-6, 2e-10, 1e-10);
  const sim_call call{.kind = collective::all_reduce, .algorithm = algo::hierarchical, .count = 123457};
  CHECK(simulate(net, call).seconds == simulate(net, call).seconds);
  CHECK(simulate(net, call).events == simulate(net, call).events);
}

TEST_CASE("sends read in place cost their reader alone: a direct all_gather on one node is bound by what each reader reads") {
  // 4 ranks of one node; free two-sided links would make every algorithm free, so pricing
  // them dearly shows which transfers the pull link prices.
  const std::size_t block = std::size_t{1} << 20;  // 4 MiB of float per rank: 16 slices of 256 KiB
  sim_network net = network_of(std::vector<int>(4, 0), 0.0, 1e-8);
  net.exec.max_slice_bytes = 256 * 1024;
  net.pull = {0.0, 0.0, 1e-9, 0.0};
  auto time_of = [&](algo a) {
    return simulate(net, {.kind = collective::all_gather, .algorithm = a, .count = block}).seconds;
  };
  const double two_sided = time_of(algo::direct);
  net.intra_pulls = true;
  const double pulled = time_of(algo::direct);
  const double read = 3.0 * static_cast<double>(block * 4) * 1e-9;  // each rank reads 3 blocks
  CHECK(pulled >= read * (1 - 1e-9));
  CHECK(pulled <= read * 1.05);
  CHECK(pulled < two_sided / 5);
  // A ring's sends are never read in place: its time does not change.
  const double ring = time_of(algo::ring);
  net.intra_pulls = false;
  CHECK(close(time_of(algo::ring), ring, 1e-12));
  // Nor are slices below the transport's threshold.
  net.intra_pulls = true;
  net.pull_min_bytes = std::size_t{1} << 30;
  CHECK(close(time_of(algo::direct), two_sided, 1e-12));
  // The pull's cost is timed beyond the caches, so memory adds nothing for the bytes read in
  // place: with nothing cached, each reader pays its writes of 3 blocks (twice a byte) and
  // its local copy's block (read and written), 9 blocks' memory time.
  net.pull_min_bytes = 64 * 1024;
  net.memory_s_per_byte = 0.5e-9;
  net.cache_bytes = 0;
  CHECK(close(time_of(algo::direct) - pulled, 9.0 * static_cast<double>(block * 4) * 0.5e-9, 0.02));
}

TEST_CASE("a reducing receive that shared memory lends in place costs its reduction, not a copy") {
  // Recursive doubling on 2 ranks of one node: each sends its 64 KiB (one slice) and reduces
  // the other's. Through a copy each core pays its send, its receive's copy and the
  // reduction; lent, the send and the reduction.
  const std::size_t count = 16384;
  sim_network net = network_of(std::vector<int>(2, 0), 0.0, 2e-9, 0.5e-9);
  net.exec.max_slice_bytes = 256 * 1024;  // a ring of 1 MiB
  auto time_of = [&] {
    const sim_call rd{.kind = collective::all_reduce, .algorithm = algo::recursive_doubling, .count = count};
    return simulate(net, rd).seconds;
  };
  const auto bytes = static_cast<double>(count * 4);
  CHECK(close(time_of(), bytes * 2.5e-9, 1e-9));  // no lending (TCP between the node's ranks)
  net.intra_pulls = true;
  CHECK(close(time_of(), bytes * 1.5e-9, 1e-9));
  // A ring lends a payload only while half of it stays free, and none that would wrap round
  // it: a ring of 64 KiB (slices of 16 KiB) lends some of the four slices, not all.
  net.exec.max_slice_bytes = 16 * 1024;
  const double small_ring = time_of();
  CHECK(small_ring > bytes * 1.5e-9 * 1.05);
  CHECK(small_ring < bytes * 2.5e-9 * 0.99);
}

TEST_CASE("a folded simulation (one node for all) gives exactly what every rank simulated gives") {
  int folded = 0, runs = 0;
  for (int per_node : {4, 8}) {
    for (int leaf : {0, 2}) {
      sim_network net = network_of(sim_network::nodes_of(8 * per_node, per_node), 2e-6, 1e-10, 5e-11);
      net.intra = {0.5e-6, 0.25e-10, 0.25e-10, 0.1e-6};
      net.pull = {0.5e-6, 0, 0.5e-10, 0.1e-6};
      net.intra_pulls = true;  // direct and hierarchical read in place inside a node
      net.nodes_per_leaf = leaf;
      net.oversubscription = 2;
      net.cores_per_node = per_node / 2;  // ranks share cores too
      for (int k = 0; k < collective_count; ++k) {
        const auto c = static_cast<collective>(k);
        if (c == collective::all_to_allv) continue;
        for (algo a : algorithms_for(c)) {
          // Divisible by every rank count here (the pieces of every rank alike) and not.
          for (std::size_t count : {std::size_t{1000}, std::size_t{1} << 20}) {
            CAPTURE(per_node);
            CAPTURE(leaf);
            CAPTURE(std::string(to_string(c)));
            CAPTURE(std::string(to_string(a)));
            CAPTURE(count);
            const sim_call call{.kind = c, .algorithm = a, .count = count, .root = 0};
            net.fold_above = 1 << 30;
            const sim_result all = simulate(net, call);
            net.fold_above = 0;
            const sim_result fold = simulate(net, call);
            CHECK(all.simulated == net.size());
            CHECK(fold.seconds == all.seconds);
            CHECK(fold.messages == all.messages);
            CHECK(fold.bytes == all.bytes);
            CHECK(fold.steps == all.steps);
            if (fold.simulated < net.size()) {
              ++folded;
              CHECK(leaf == 0);  // fat trees never fold
              CHECK(fold.simulated == per_node);
            }
            ++runs;
          }
        }
      }
    }
  }
  // Rings and hierarchical fold where the pieces divide evenly; the trees and recursive
  // doubling never do (a rank's place in them is its own), nor direct exchanges across nodes.
  MESSAGE(folded << " of " << runs << " simulations folded");
  CHECK(folded >= 8);
  // The ones the 16,384-rank tables need.
  sim_network net = network_of(sim_network::nodes_of(64, 8), 2e-6, 1e-10, 5e-11);
  net.fold_above = 0;
  for (algo a : {algo::ring, algo::hierarchical}) {
    CAPTURE(std::string(to_string(a)));
    CHECK(simulate(net, {.kind = collective::all_reduce, .algorithm = a, .count = 1 << 20}).simulated == 8);
  }
}
