// SPDX-License-Identifier: Apache-2.0
// The tuner: it picks what the simulator predicts fastest, its overrides parse strictly, and
// every rank of a communicator measures the same costs and makes the same picks.
#include <doctest/doctest.h>

#include <chorus/tuner/tuner.hpp>
#include <chorus/tuner/detail/probe.hpp>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "support/multirank.hpp"

using namespace chorus;
using chorus::test::run_ranks;

namespace {

/// Costs like this machine's shared memory, its loopback TCP, and a cluster's network.
std::vector<cost_model> cost_models() {
  cost_model shm;
  shm.intra = {0.5e-6, 0.5 / 6e9, 0.5 / 6e9};
  cost_model tcp;
  tcp.intra = {15e-6, 0.5 / 1.8e9, 0.5 / 1.8e9};
  cost_model cluster;
  cluster.intra = {1e-6, 0.5 / 20e9, 0.5 / 20e9};
  cluster.inter = {5e-6, 0.5 / 12e9, 0.5 / 12e9};
  return {shm, tcp, cluster};
}

}  // namespace

TEST_CASE("the tuner picks the algorithm the simulator predicts fastest, for every collective, size and shape") {
  int checked = 0, differ = 0;
  for (const cost_model& costs : cost_models()) {
    for (const std::vector<int>& sizes : {std::vector<int>{2}, {3}, {4}, {5}, {8}, {2, 2}, {4, 4}, {1, 2, 3}}) {
      int n = 0;
      for (int m : sizes) n += m;
      const topology topo = topology::from_sizes(0, sizes);
      const tuner t(topo, costs, {}, executor_options{});
      for (collective c : {collective::all_reduce, collective::reduce_scatter, collective::all_gather,
                           collective::broadcast, collective::reduce, collective::gather, collective::scatter}) {
        algo first_pick = algo::automatic;
        for (std::size_t bytes = 8; bytes <= (std::size_t{64} << 20); bytes *= 32) {
          const std::size_t count = std::max<std::size_t>(1, bytes / 4);
          algo best = algo::automatic;
          double best_s = std::numeric_limits<double>::infinity();
          for (algo a : t.candidates(c)) {
            const double s = simulate(t.network(), {.kind = c, .algorithm = a, .count = count, .elem_size = 4}).seconds;
            if (tuner::beats(s, best_s)) {
              best_s = s;
              best = a;
            }
          }
          CAPTURE(n);
          CAPTURE(std::string(to_string(c)));
          CAPTURE(bytes);
          const algo pick = t.choose(c, count, 4);
          CHECK(pick == best);
          CHECK(t.choose(c, count, 4) == pick);  // remembered, and the same
          if (first_pick == algo::automatic) first_pick = pick;
          differ += pick != first_pick;
          ++checked;
        }
      }
    }
  }
  CHECK(checked > 400);
  CHECK(differ > 20);  // the picks depend on size: it is not one algorithm everywhere
}

TEST_CASE("on 8 ranks the tuner takes a latency algorithm for small all_reduce and a bandwidth one for large") {
  cost_model tcp;
  tcp.intra = {15e-6, 0.5 / 1.8e9, 0.5 / 1.8e9};
  const tuner t(topology::single_node(0, 8), tcp, {}, executor_options{});
  const algo small = t.choose(collective::all_reduce, 2, 4);
  const algo large = t.choose(collective::all_reduce, std::size_t{1} << 24, 4);
  CHECK(small != algo::ring);
  CHECK((large == algo::ring || large == algo::hierarchical || large == algo::tree || large == algo::direct));
}

TEST_CASE("tuning-file rules pin algorithms to sizes and ranks, the first match winning, and costs replace the model's") {
  const tuning_file f = tuning_file::parse(
      "# a comment\n"
      "cost intra 0.5 6   # us, GB/s\n"
      "cost inter 15 1.9 2 0.4   # and overhead, a message's first 2 KiB in us\n"
      "cost reduce 20\n"
      "cost memory 25 16M\n"
      "rule all_reduce 0-32K rd\n"
      "rule allreduce 32K- 2-4 tree\n"
      "rule all_reduce * ring\n"
      "rule broadcast 1M- binomial\n",
      "test.tune");
  REQUIRE(f.intra.has_value());
  CHECK(f.intra->latency_s == doctest::Approx(0.5e-6));
  CHECK(f.intra->send_s_per_byte + f.intra->recv_s_per_byte == doctest::Approx(1e-9 / 6));
  CHECK(f.intra->small_s_per_byte == 0);
  REQUIRE(f.inter.has_value());
  CHECK(f.inter->overhead_s == doctest::Approx(2e-6));
  CHECK(f.inter->small_extra(1e6) == doctest::Approx(0.4e-6));
  cost_model m;
  m.inter = *f.inter;
  CHECK(m.describe().find("inter 15.0 us (o 2.0 us) + 1.90 GB/s (+0.40 us over its first 2 KiB)") !=
        std::string::npos);
  // A latency of 200 digits is cut short in the text, and the start's cost still follows it.
  m.inter = *tuning_file::parse("cost inter 1e200 1.9 2 0.4\n", "huge.tune").inter;
  CHECK(m.describe().find(" (+0.40 us over its first 2 KiB), ") != std::string::npos);
  CHECK(*f.reduce_s_per_byte == doctest::Approx(1e-9 / 20));
  CHECK_FALSE(f.copy_s_per_byte.has_value());
  REQUIRE(f.memory.has_value());
  CHECK(f.memory->first == doctest::Approx(1e-9 / 25));
  CHECK(f.memory->second == std::size_t{16} << 20);
  REQUIRE(f.rules.size() == 4);
  const tuner four(topology::single_node(0, 4), {}, f.rules, executor_options{});
  const tuner eight(topology::single_node(0, 8), {}, f.rules, executor_options{});
  CHECK(four.choose(collective::all_reduce, 8192, 4) == algo::recursive_doubling);  // 32 KiB: first rule
  CHECK(four.choose(collective::all_reduce, 8193, 4) == algo::tree);
  CHECK(eight.choose(collective::all_reduce, 8193, 4) == algo::ring);  // rule 2 is for 2-4 ranks
  CHECK(four.choose(collective::broadcast, 1 << 18, 4) == algo::binomial);
}

TEST_CASE("a bad tuning file is refused with its name, line and what is wrong") {
  const char* bad[] = {"cost intra 0.5\n",         "cost sideways 1 2\n",  "cost reduce -3\n",
                       "rule all_reduce 1M-1K ring\n", "rule nothing * ring\n", "rule all_reduce * tree2\n",
                       "rule all_gather * tree\n",  "rule all_reduce 0-8 0 ring\n", "frobnicate\n",
                       "cost memory 25\n",         "cost memory 25 lots\n", "cost memory 0 16M\n",
                       "cost pull 0.5 8 0.2 0.4\n", "cost intra 0.5 6 0.2 -1\n", "cost\n"};
  for (const char* text : bad) {
    CAPTURE(text);
    try {
      (void)tuning_file::parse(std::string("# fine\n") + text, "my.tune");
      FAIL("accepted");
    } catch (const error& e) {
      CHECK(e.code() == errc::invalid_argument);
      CHECK(std::string(e.what()).find("my.tune:2") != std::string::npos);
    }
  }
  CHECK_THROWS_AS(tuning_file::load("/nonexistent/chorus.tune"), error);
}

TEST_CASE("CHORUS_ALGO takes one algorithm for every collective that has it, or a per-collective list") {
  const algo_table ring = parse_algo_table("ring");
  CHECK(ring[static_cast<std::size_t>(collective::all_reduce)] == algo::ring);
  CHECK(ring[static_cast<std::size_t>(collective::broadcast)] == algo::automatic);  // no ring broadcast
  const algo_table list = parse_algo_table("allreduce:tree;all_gather:bruck,bcast:chain");
  CHECK(list[static_cast<std::size_t>(collective::all_reduce)] == algo::tree);
  CHECK(list[static_cast<std::size_t>(collective::all_gather)] == algo::bruck);
  CHECK(list[static_cast<std::size_t>(collective::broadcast)] == algo::chain);
  CHECK(list[static_cast<std::size_t>(collective::reduce)] == algo::automatic);
  for (const char* bad : {"bogus", "allreduce:bogus", "bogus:ring", "allgather:tree", "allreduce",
                          "allreduce:ring;allreduce:tree", "allreduce:ring;all_reduce:ring"}) {
    CAPTURE(bad);
    CHECK_THROWS_AS(parse_algo_table(bad), error);
  }
  try {
    parse_algo_table("allreduce:ring;bcast:chain;all_reduce:tree");
    FAIL("a collective named twice was taken");
  } catch (const error& e) {
    CHECK(e.code() == errc::invalid_argument);
    CHECK(std::string(e.what()).find("all_reduce is named twice") != std::string::npos);
  }
}

TEST_CASE("the probe's calibration recovers the latency and overhead that produced its timings") {
  // Timings the model itself predicts under known multipliers: the fit must find them, on a
  // node whose ranks share cores (where latency and overhead weigh differently) and on one
  // rank per core, for latency-heavy and overhead-heavy machines.
  for (int cores : {0, 2}) {
    for (const std::pair<double, double>& scales : {std::pair{3.0, 6.0}, {2.0, 0.5}, {1.0, 1.0}}) {
      // Plain variables, not a structured binding: clang 14 refuses those in CAPTURE's lambda.
      const double lat = scales.first;
      const double over = scales.second;
      CAPTURE(cores);
      CAPTURE(lat);
      CAPTURE(over);
      cost_model base;
      base.intra = {20e-6, 0.5 / 5e9, 0.5 / 5e9, 4e-6};
      base.cores_per_node = cores;
      const topology topo = topology::single_node(0, 8);
      cost_model truth = base;
      truth.intra.latency_s *= lat;
      truth.intra.overhead_s *= over;
      detail::with_pull_overheads(truth);
      const tuner measured(topo, truth, {}, executor_options{});
      std::vector<detail::calibration_run> runs{
          {collective::barrier, algo::dissemination, 0, 0},
          {collective::all_gather, algo::ring, 8, 0},
          {collective::all_to_all, algo::direct, 8, 0}};
      for (auto& r : runs) r.seconds = measured.predict(r.kind, r.algorithm, r.count, 1);
      const auto [a, b] = detail::fit_latency_overhead(topo, base, executor_options{}, runs);
      CHECK(a == doctest::Approx(lat).epsilon(0.02));
      CHECK(b == doctest::Approx(over).epsilon(0.02));
      // The barrier alone cannot tell the two apart: both scale alike, to predict it.
      const auto [a1, b1] = detail::fit_latency_overhead(topo, base, executor_options{}, {runs[0]});
      CHECK(a1 == b1);
      cost_model scaled = base;
      scaled.intra.latency_s *= a1;
      scaled.intra.overhead_s *= b1;
      detail::with_pull_overheads(scaled);
      CHECK(tuner(topo, scaled, {}, executor_options{}).predict(collective::barrier, algo::dissemination, 0, 1) ==
            doctest::Approx(runs[0].seconds).epsilon(0.001));
    }
  }
  // A timing of nothing says nothing: the costs stay as they are.
  const auto none = detail::fit_latency_overhead(topology::single_node(0, 4), cost_model{}, executor_options{},
                                                 {{collective::barrier, algo::dissemination, 0, 0}});
  CHECK(none == std::pair{1.0, 1.0});
}

TEST_CASE("the probe's reads recover the memory cost and cache size that produced their timings") {
  // Of buffers of W bytes the caches miss 1 - C / W, each byte missed costing m.
  const double cached = 1.0 / 50e9, m = 1.0 / 40e9, mib = 1 << 20;
  auto timed = [&](double cache, double w) { return cached + m * std::max(0.0, 1 - cache / w); };
  for (double cache : {8 * mib, 16 * mib}) {  // below both sizes timed, and the smaller's
    CAPTURE(cache);
    const auto [mem, c] =
        detail::fit_memory(cached, 2 * mib, timed(cache, 16 * mib), 16 * mib, timed(cache, 64 * mib), 64 * mib);
    CHECK(mem == doctest::Approx(m).epsilon(0.001));
    CHECK(static_cast<double>(c) == doctest::Approx(cache).epsilon(0.001));
  }
  // The caches hold both: no cost to see. Nor with one size (a node of one rank).
  CHECK(detail::fit_memory(cached, 2 * mib, cached, 16 * mib, cached * 1.05, 64 * mib) ==
        std::pair<double, std::size_t>{0, 0});
  CHECK(detail::fit_memory(cached, 2 * mib, 2 * cached, 16 * mib, 2 * cached, 16 * mib) ==
        std::pair<double, std::size_t>{0, 0});
  // The larger no slower than the smaller (noise): the caches hold what was read in them, and
  // the rest of the larger cost what it did.
  const auto [mem, c] = detail::fit_memory(cached, 2 * mib, 3 * cached, 16 * mib, 2 * cached, 64 * mib);
  CHECK(c == std::size_t{2} << 20);
  CHECK(mem == doctest::Approx(cached / (1 - 2.0 / 64)));
  // read_through reads every byte: a change anywhere changes what it returns.
  std::vector<std::byte> bytes(4096, std::byte{7});
  const std::uint64_t before = detail::read_through(bytes.data(), bytes.size());
  bytes[4000] = std::byte{8};
  CHECK(detail::read_through(bytes.data(), bytes.size()) != before);
}

TEST_CASE("every rank measures the same costs and makes the same picks") {
  for (int n : {2, 3, 4}) {
    CAPTURE(n);
    run_ranks(n, [](communicator& comm) {
      const cost_model& c = comm.tuner().costs();
      RANK_CHECK(c.source == "probe");
      std::vector<double> mine{c.intra.latency_s, c.intra.send_s_per_byte, c.reduce_s_per_byte, c.copy_s_per_byte,
                              c.memory_s_per_byte, static_cast<double>(c.cache_bytes)};
      std::vector<double> all(mine.size() * static_cast<std::size_t>(comm.size()));
      comm.all_gather(std::span<const double>(mine), std::span(all));
      for (int r = 0; r < comm.size(); ++r) {
        RANK_CHECK(std::memcmp(all.data() + static_cast<std::size_t>(r) * mine.size(), mine.data(),
                               mine.size() * sizeof(double)) == 0);
      }
      RANK_CHECK(c.intra.latency_s + c.intra.overhead_s > 0);  // a message costs something
      RANK_CHECK(c.intra.send_s_per_byte > 0);
      std::vector<std::int32_t> picks;
      for (std::size_t count = 1; count < (std::size_t{1} << 24); count *= 16) {
        picks.push_back(static_cast<std::int32_t>(comm.tuner().choose(collective::all_reduce, count, 4)));
      }
      std::vector<std::int32_t> theirs(picks.size() * static_cast<std::size_t>(comm.size()));
      comm.all_gather(std::span<const std::int32_t>(picks), std::span(theirs));
      for (int r = 0; r < comm.size(); ++r) {
        RANK_CHECK(std::equal(picks.begin(), picks.end(), theirs.begin() + r * static_cast<long>(picks.size())));
      }
    });
  }
}

TEST_CASE("a communicator of a shape the job has probed before reuses that probe") {
  run_ranks(4, [](communicator& comm) {
    auto first = comm.split(comm.rank() / 2, comm.rank());  // two pairs, probing
    auto again = comm.split(comm.rank() % 2, comm.rank());  // two more pairs: same shape
    RANK_CHECK(again->tuner().costs().source == "cache");
    std::vector<int> v{1};
    again->all_reduce(std::span(v));
    RANK_CHECK(v[0] == 2);
    (void)first;
  });
}

TEST_CASE("CHORUS_TUNER=fixed skips the probe and CHORUS_TUNING_FILE costs replace it") {
  run_ranks(2, [](communicator& comm) { RANK_CHECK(comm.tuner().costs().source == "defaults"); },
            {.env = {{"CHORUS_TUNER", "fixed"}}});
  const std::string path = "/tmp/chorus_tuner_test_" + std::to_string(::getpid()) + ".tune";
  std::ofstream(path) << "cost intra 2 3\nrule all_reduce * tree\n";
  run_ranks(2, [](communicator& comm) {
    RANK_CHECK(comm.tuner().costs().source == "file");
    RANK_CHECK(comm.tuner().costs().intra.latency_s == 2e-6);
    RANK_CHECK(comm.tuner().choose(collective::all_reduce, 1000, 4) == algo::tree);
    std::vector<float> v(1000, 1.0f);
    comm.all_reduce(std::span(v));
    RANK_CHECK(v[999] == 2.0f);
  }, {.env = {{"CHORUS_TUNING_FILE", path}}});
  std::remove(path.c_str());
}

TEST_CASE("a bad CHORUS_TUNER or CHORUS_TUNING_FILE fails communicator creation with invalid_argument") {
  ::setenv("CHORUS_TUNER", "sometimes", 1);
  CHECK_THROWS_AS((void)communicator_options::from_env(), error);
  ::unsetenv("CHORUS_TUNER");
  // A one-rank communicator of this process (no launcher variables; the test main set a secret).
  ::setenv("CHORUS_TUNING_FILE", "/nonexistent/x.tune", 1);
  try {
    (void)communicator::from_env<auto_transport>();
    FAIL("created");
  } catch (const error& e) {
    CHECK(e.code() == errc::invalid_argument);
    CHECK(std::string(e.what()).find("/nonexistent/x.tune") != std::string::npos);
  }
  ::unsetenv("CHORUS_TUNING_FILE");
}
