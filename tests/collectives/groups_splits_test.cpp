// SPDX-License-Identifier: Apache-2.0
// broadcast, reduce, gather, scatter and all_to_all(v) inside groups mixed with sends and
// receives, and in split sub-communicators running beside their parent.
#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "collectives/checks.hpp"
#include "collectives/values.hpp"
#include "support/multirank.hpp"

using namespace chorus;
using chorus::test::run_ranks;
using namespace chorus::test;

namespace {

/// Every buffer of one group's calls, filled so that any rank can tell what it must end with.
struct group_calls {
  int r, n;
  int bcast_root, reduce_root, gather_root, scatter_root;
  std::vector<std::int32_t> bcast, red_in, red_out, gat_in, gat_out, sca_in, sca_out;
  std::vector<std::int32_t> a2a_in, a2a_out, a2av_in, a2av_out;
  std::vector<std::size_t> a2av_send, a2av_recv;
  std::vector<std::int32_t> to_right, from_left, to_left, from_right;

  group_calls(int rank, int size, std::size_t count)
      : r(rank), n(size), bcast_root(0), reduce_root(size - 1), gather_root(size / 2), scatter_root(1 % size) {
    const auto un = static_cast<std::size_t>(n);
    bcast.assign(count, r == bcast_root ? 42 : -1);
    red_in.assign(count, r + 1);
    red_out.assign(r == reduce_root ? count : 0, -1);
    gat_in.assign(count, r * 3);
    gat_out.assign(r == gather_root ? un * count : 0, -1);
    sca_in.assign(r == scatter_root ? un * count : 0, 0);
    for (std::size_t i = 0; i < sca_in.size(); ++i) sca_in[i] = static_cast<std::int32_t>(i / count) * 5;
    sca_out.assign(count, -1);
    a2a_in.assign(un * count, 0);
    for (std::size_t i = 0; i < a2a_in.size(); ++i) a2a_in[i] = r * 1000 + static_cast<std::int32_t>(i / count);
    a2a_out.assign(un * count, -1);
    for (int p = 0; p < n; ++p) {
      a2av_send.push_back(pair_count(r, p, count, 77));
      a2av_recv.push_back(pair_count(p, r, count, 77));
      for (std::size_t i = 0; i < a2av_send.back(); ++i) a2av_in.push_back(pair_value<std::int32_t>(r, p, i, 77));
    }
    std::size_t total = 0;
    for (std::size_t c : a2av_recv) total += c;
    a2av_out.assign(total, -1);
    to_right.assign(count, r * 7 + 1);
    to_left.assign(count, r * 7 + 2);
    from_left.assign(count, -1);
    from_right.assign(count, -1);
  }

  int left() const { return (r + n - 1) % n; }
  int right() const { return (r + 1) % n; }

  /// The collectives, in the one order every rank issues them.
  void issue_collectives(communicator& comm, algo flow, algo blocks, std::vector<request>& reqs) {
    reqs.push_back(comm.broadcast_async(std::span(bcast), bcast_root, {.algorithm = flow}));
    reqs.push_back(comm.reduce_async(std::span<const std::int32_t>(red_in), std::span(red_out), reduce_root,
                                     {.op = sum, .algorithm = flow}));
    reqs.push_back(comm.gather_async(std::span<const std::int32_t>(gat_in), std::span(gat_out), gather_root,
                                     {.algorithm = blocks}));
    reqs.push_back(comm.scatter_async(std::span<const std::int32_t>(sca_in), std::span(sca_out), scatter_root,
                                      {.algorithm = blocks}));
    reqs.push_back(comm.all_to_all_async(std::span<const std::int32_t>(a2a_in), std::span(a2a_out)));
    reqs.push_back(comm.all_to_allv_async(std::span<const std::int32_t>(a2av_in), std::span<const std::size_t>(a2av_send),
                                          std::span(a2av_out), std::span<const std::size_t>(a2av_recv)));
  }
  /// The sends and receives around the ring, both ways (n > 1).
  void issue_p2p(communicator& comm, std::vector<request>& reqs) {
    reqs.push_back(comm.send_async(std::span<const std::int32_t>(to_right), right()));
    reqs.push_back(comm.recv_async(std::span(from_left), left(), {.tag = 0}));
    reqs.push_back(comm.send_async(std::span<const std::int32_t>(to_left), left(), {.tag = 9}));
    reqs.push_back(comm.recv_async(std::span(from_right), right(), {.tag = 9}));
  }

  void check() const {
    const std::size_t count = bcast.size();
    auto all = [](const std::vector<std::int32_t>& v, auto&& want) {
      for (std::size_t i = 0; i < v.size(); ++i) {
        if (v[i] != want(i)) return false;
      }
      return true;
    };
    RANK_CHECK(all(bcast, [](std::size_t) { return 42; }));
    if (r == reduce_root) RANK_CHECK(all(red_out, [&](std::size_t) { return n * (n + 1) / 2; }));
    RANK_CHECK(all(red_in, [&](std::size_t) { return r + 1; }));
    if (r == gather_root) RANK_CHECK(all(gat_out, [&](std::size_t i) { return static_cast<std::int32_t>(i / count) * 3; }));
    RANK_CHECK(all(sca_out, [&](std::size_t) { return r * 5; }));
    RANK_CHECK(all(a2a_out, [&](std::size_t i) { return static_cast<std::int32_t>(i / count) * 1000 + r; }));
    std::size_t at = 0;
    bool a2av_ok = true;
    for (int p = 0; p < n; ++p) {
      for (std::size_t i = 0; i < a2av_recv[static_cast<std::size_t>(p)]; ++i) {
        a2av_ok = a2av_ok && a2av_out[at++] == pair_value<std::int32_t>(p, r, i, 77);
      }
    }
    RANK_CHECK(a2av_ok);
    if (n > 1) {
      RANK_CHECK(all(from_left, [&](std::size_t) { return left() * 7 + 1; }));
      RANK_CHECK(all(from_right, [&](std::size_t) { return right() * 7 + 2; }));
    }
  }
};

}  // namespace

TEST_CASE("a group of every rooted collective and all_to_all(v), interleaved differently with sends and receives on each rank, completes all of them") {
  for (int n : {2, 3, 5}) {
    CAPTURE(n);
    run_ranks(n, [](communicator& comm) {
      for (std::size_t k = 0; k < algorithms_for(collective::broadcast).size(); ++k) {
        const algo flow = algorithms_for(collective::broadcast)[k];
        const algo blocks = algorithms_for(collective::gather)[k % algorithms_for(collective::gather).size()];
        group_calls g(comm.rank(), comm.size(), 1000 + k);
        std::vector<request> reqs;
        comm.group_start();
        // Even ranks issue their sends and receives first, odd ranks between and after
        // the collectives: the group runs the collectives first on every rank.
        if (comm.rank() % 2 == 0) g.issue_p2p(comm, reqs);
        g.issue_collectives(comm, flow, blocks, reqs);
        if (comm.rank() % 2 == 1) g.issue_p2p(comm, reqs);
        reqs.push_back(comm.barrier_async());
        auto all = comm.group_end();
        all.wait();
        for (auto& q : reqs) RANK_CHECK(q.test());
        g.check();
      }
    });
  }
}

TEST_CASE("a group of large broadcasts, reduces and ring exchanges progresses them together without deadlock") {
  run_ranks(4, [](communicator& comm) {
    // 4 MiB each way: more than the socket buffers hold, so nothing finishes alone.
    group_calls g(comm.rank(), comm.size(), std::size_t{1} << 20);
    std::vector<request> reqs;
    comm.group_start();
    g.issue_p2p(comm, reqs);
    g.issue_collectives(comm, algo::chain, algo::binomial, reqs);
    comm.group_end().wait();
    g.check();
  }, {.env = {{"CHORUS_TCP_BUFFER", "65536"}}});
}

TEST_CASE("a nested group starts its calls only at the outermost group_end") {
  run_ranks(3, [](communicator& comm) {
    group_calls g(comm.rank(), comm.size(), 64);
    std::vector<request> reqs;
    comm.group_start();
    g.issue_p2p(comm, reqs);
    comm.group_start();
    g.issue_collectives(comm, algo::binomial, algo::direct, reqs);
    auto inner = comm.group_end();
    comm.group_end().wait();
    inner.wait();
    g.check();
  });
}

TEST_CASE("split sub-communicators of 3 and 2 ranks run broadcast, reduce, gather, scatter and all_to_all(v) beside their parent") {
  run_ranks(5, [](communicator& comm) {
    const int r = comm.rank();
    // Ranks 0..2 form one group, 3 and 4 the other, each ranked in reverse.
    auto sub = comm.split(r < 3 ? 0 : 1, -r);
    RANK_CHECK(sub.has_value());
    RANK_CHECK(sub->size() == (r < 3 ? 3 : 2));
    RANK_CHECK(sub->rank() == (r < 3 ? 2 - r : 4 - r));
    // The parent works in the background while the children run their collectives.
    std::vector<float> big(1 << 20, static_cast<float>(r));
    auto parent_reduce = comm.all_reduce_async(std::span(big));
    std::vector<std::int32_t> weights(300000, r == 4 ? 9 : -1);
    auto parent_bcast = comm.broadcast_async(std::span(weights), 4);
    std::uint64_t seed = 9000;
    const int last = sub->size() - 1;
    for (algo a : algorithms_for(collective::broadcast)) {
      check_broadcast<float>(*sub, a, 4099, last, 1, false, seed++);
      check_broadcast<half>(*sub, a, 100000, 0, 0, true, seed++);
    }
    for (algo a : algorithms_for(collective::reduce)) {
      check_reduce<double>(*sub, avg, a, 5003, 0, 3, false, seed++);
      check_reduce<std::int64_t>(*sub, prod, a, 70000, last, 0, true, seed++);
    }
    for (algo a : algorithms_for(collective::gather)) check_gather<std::uint8_t>(*sub, a, 1001, last, 2, true, seed++);
    for (algo a : algorithms_for(collective::scatter)) check_scatter<std::int32_t>(*sub, a, 1001, 0, 5, true, seed++);
    for (algo a : algorithms_for(collective::all_to_all)) check_all_to_all<bfloat16>(*sub, a, 20000, 1, seed++);
    for (algo a : algorithms_for(collective::all_to_allv)) check_all_to_allv<float>(*sub, a, 30000, 4, seed++);
    // And the other way round: the children in the background, the parent blocking.
    std::vector<std::int32_t> sub_data(50000, sub->rank() == 0 ? 5 : 0);
    auto child = sub->broadcast_async(std::span(sub_data), 0, {.algorithm = algo::chain});
    check_reduce<float>(comm, max, algo::binomial, 12345, 2, 0, false, seed++);
    check_all_to_all<std::int32_t>(comm, algo::direct, 777, 3, seed++);
    child.wait();
    RANK_CHECK(sub_data[49999] == 5);
    parent_reduce.wait();
    parent_bcast.wait();
    RANK_CHECK(big[0] == 10.0f && big[(1 << 20) - 1] == 10.0f);
    RANK_CHECK(weights[0] == 9 && weights[299999] == 9);
  });
}

TEST_CASE("a group of one call of every algorithm of every collective, each with its own scratch, completes all of them exactly") {
  for (int n : {3, 4, 5}) {
    CAPTURE(n);
    run_ranks(n, [](communicator& comm) {
      const int r = comm.rank();
      const auto nn = static_cast<std::size_t>(comm.size());
      const std::size_t count = 3001;
      struct reduced {
        std::vector<std::int32_t> in, out;
      };
      std::vector<reduced> ar, rs, rd;
      std::vector<std::vector<std::int32_t>> ag, bc, ga, sc;
      const std::vector<std::int32_t> mine(count, r + 1);
      std::vector<std::int32_t> scatter_in(count * nn);
      for (std::size_t i = 0; i < scatter_in.size(); ++i) scatter_in[i] = static_cast<std::int32_t>(i / count) + 100;
      // Reserve first: the group holds pointers into these vectors until it completes.
      const std::size_t most = 8;
      ar.reserve(most), rs.reserve(most), rd.reserve(most), ag.reserve(most), bc.reserve(most), ga.reserve(most), sc.reserve(most);
      comm.group_start();
      for (algo a : algorithms_for(collective::all_reduce)) {
        ar.push_back({mine, std::vector<std::int32_t>(count, -1)});
        comm.all_reduce_async(std::span<const std::int32_t>(ar.back().in), std::span(ar.back().out), {.algorithm = a});
      }
      for (algo a : algorithms_for(collective::reduce_scatter)) {
        rs.push_back({std::vector<std::int32_t>(count * nn, r + 1), std::vector<std::int32_t>(count, -1)});
        comm.reduce_scatter_async(std::span<const std::int32_t>(rs.back().in), std::span(rs.back().out), {.algorithm = a});
      }
      for (algo a : algorithms_for(collective::all_gather)) {
        ag.emplace_back(count * nn, -1);
        comm.all_gather_async(std::span<const std::int32_t>(mine), std::span(ag.back()), {.algorithm = a});
      }
      for (algo a : algorithms_for(collective::reduce)) {
        rd.push_back({mine, std::vector<std::int32_t>(r == 1 ? count : 0, -1)});
        comm.reduce_async(std::span<const std::int32_t>(rd.back().in), std::span(rd.back().out), 1, {.algorithm = a});
      }
      for (algo a : algorithms_for(collective::broadcast)) {
        bc.emplace_back(count, r == 2 ? 77 : -1);
        comm.broadcast_async(std::span(bc.back()), 2, {.algorithm = a});
      }
      for (algo a : algorithms_for(collective::gather)) {
        ga.emplace_back(r == 0 ? count * nn : 0, -1);
        comm.gather_async(std::span<const std::int32_t>(mine), std::span(ga.back()), 0, {.algorithm = a});
      }
      for (algo a : algorithms_for(collective::scatter)) {
        sc.emplace_back(count, -1);
        comm.scatter_async(std::span<const std::int32_t>(scatter_in).first(r == 0 ? count * nn : 0), std::span(sc.back()), 0,
                           {.algorithm = a});
      }
      comm.group_end().wait();
      const int total = comm.size() * (comm.size() + 1) / 2;
      auto every = [](const std::vector<std::int32_t>& v, auto&& want) {
        for (std::size_t i = 0; i < v.size(); ++i) {
          if (v[i] != want(i)) return false;
        }
        return true;
      };
      for (const auto& x : ar) RANK_CHECK(every(x.out, [&](std::size_t) { return total; }));
      for (const auto& x : rs) RANK_CHECK(every(x.out, [&](std::size_t) { return total; }));
      for (const auto& x : ag) RANK_CHECK(every(x, [&](std::size_t i) { return static_cast<std::int32_t>(i / count) + 1; }));
      for (const auto& x : rd) RANK_CHECK(every(x.out, [&](std::size_t) { return total; }));
      for (const auto& x : bc) RANK_CHECK(every(x, [&](std::size_t) { return 77; }));
      for (const auto& x : ga) RANK_CHECK(every(x, [&](std::size_t i) { return static_cast<std::int32_t>(i / count) + 1; }));
      for (const auto& x : sc) RANK_CHECK(every(x, [&](std::size_t) { return r + 100; }));
    });
  }
}

TEST_CASE("a group of broadcasts from every root gives every rank each root's data") {
  for (int n : {2, 5}) {
    CAPTURE(n);
    run_ranks(n, [](communicator& comm) {
      const auto nn = static_cast<std::size_t>(comm.size());
      std::vector<std::vector<float>> from(nn);
      comm.group_start();
      for (std::size_t root = 0; root < nn; ++root) {
        from[root].assign(10000 + root, comm.rank() == static_cast<int>(root) ? static_cast<float>(root) + 0.5f : -1.0f);
        comm.broadcast_async(std::span(from[root]), static_cast<int>(root), {.algorithm = root % 2 == 0 ? algo::chain : algo::binomial});
      }
      comm.group_end().wait();
      for (std::size_t root = 0; root < nn; ++root) {
        RANK_CHECK(from[root].front() == static_cast<float>(root) + 0.5f && from[root].back() == static_cast<float>(root) + 0.5f);
      }
    });
  }
}
