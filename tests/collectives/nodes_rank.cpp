// SPDX-License-Identifier: Apache-2.0
// A rank program for the emulated-node tests: runs every collective on exact integer data
// (and floats whose sums are exact), checks every element, and exits 1 on any difference.
//
// Usage: nodes_rank COUNT [REPEAT]   (CHORUS_ALGO and CHORUS_TRANSPORT as for any program)
#include <chorus/chorus.hpp>
#include <chorus/transport/auto.hpp>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: nodes_rank COUNT [REPEAT]\n");
    return 2;
  }
  const auto count = static_cast<std::size_t>(std::strtoull(argv[1], nullptr, 10));
  const int repeat = argc > 2 ? std::atoi(argv[2]) : 1;
  try {
    auto comm = chorus::communicator::from_env<chorus::auto_transport>();
    const auto r = static_cast<std::int64_t>(comm.rank());
    const auto n = static_cast<std::int64_t>(comm.size());
    const auto nn = static_cast<std::size_t>(n);
    std::size_t wrong = 0;
    for (int rep = 0; rep < repeat; ++rep) {
      // all_reduce, out of place and in place: element i sums to i * n + n(n-1)/2.
      std::vector<std::int64_t> in(count), out(count);
      for (std::size_t i = 0; i < count; ++i) in[i] = static_cast<std::int64_t>(i) + r;
      comm.all_reduce(std::span<const std::int64_t>(in), std::span(out));
      comm.all_reduce(std::span(in));
      for (std::size_t i = 0; i < count; ++i) {
        const std::int64_t want = static_cast<std::int64_t>(i) * n + n * (n - 1) / 2;
        wrong += static_cast<std::size_t>(out[i] != want) + static_cast<std::size_t>(in[i] != want);
      }
      std::vector<float> f(count, static_cast<float>(r + 1));
      comm.all_reduce(std::span(f), {.op = chorus::max});
      for (float v : f) wrong += v != static_cast<float>(n);

      // reduce_scatter: block b of rank q holds b * 1000 + q; we get block r summed.
      std::vector<std::int64_t> blocks(count * nn), mine(count);
      for (std::size_t b = 0; b < nn; ++b) {
        for (std::size_t i = 0; i < count; ++i) blocks[b * count + i] = static_cast<std::int64_t>(b * 1000 + i) + r;
      }
      comm.reduce_scatter(std::span<const std::int64_t>(blocks), std::span(mine));
      for (std::size_t i = 0; i < count; ++i) {
        wrong += mine[i] != (r * 1000 + static_cast<std::int64_t>(i)) * n + n * (n - 1) / 2;
      }

      // all_gather: rank q contributes q * 7 + i.
      std::vector<std::int64_t> own(count), all(count * nn);
      for (std::size_t i = 0; i < count; ++i) own[i] = r * 7 + static_cast<std::int64_t>(i);
      comm.all_gather(std::span<const std::int64_t>(own), std::span(all));
      for (std::size_t q = 0; q < nn; ++q) {
        for (std::size_t i = 0; i < count; ++i) {
          wrong += all[q * count + i] != static_cast<std::int64_t>(q * 7 + i);
        }
      }
    }
    if (comm.rank() == 0) {
      std::printf("nodes_rank: %s, %d nodes, count %zu: %zu wrong\n", comm.describe().c_str(),
                  comm.nodes(), count, wrong);
    }
    return wrong == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "nodes_rank: %s\n", e.what());
    return 1;
  }
}
