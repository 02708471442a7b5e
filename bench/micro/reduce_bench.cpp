// SPDX-License-Identifier: Apache-2.0
// Throughput of the reduction kernels for every dtype, next to memcpy of the same sizes.
//
// Bytes convention: bytes_per_second counts every byte a kernel moves through memory. A
// reduction of S-byte buffers reads both operands and writes the result: 3 S per call. memcpy
// reads S and writes S: 2 S per call. So equal bytes_per_second means the kernel is exactly as
// memory-bound as memcpy. (DESIGN.md's "a += b ~21 GB/s of operand" counts S only, once.)
//
// Run: reduce_bench --benchmark_min_time=0.05
#include <benchmark/benchmark.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "chorus/reduce/reduce.hpp"

namespace {

constexpr std::size_t sizes[] = {4u << 10, 256u << 10, 64u << 20};
constexpr std::size_t largest = 64u << 20;

// Three buffers of the largest size, allocated and touched once: a fresh 64 MiB costs ~200 ms
// of page faults here, which would otherwise dominate every benchmark's set-up.
struct arena {
  std::vector<std::byte> a = std::vector<std::byte>(largest);
  std::vector<std::byte> b = std::vector<std::byte>(largest);
  std::vector<std::byte> dst = std::vector<std::byte>(largest);
};

arena& buffers() {
  static arena instance;
  return instance;
}

// Fills with the value 1 (sums stay small, products stay 1): no NaN, infinity or subnormal
// slow paths, just the arithmetic every training step does.
void fill_with_ones(chorus::dtype t, std::byte* p, std::size_t bytes) {
  // One element's bytes, worked out once, then copied into every slot.
  const std::size_t es = chorus::size_of(t);
  std::byte one[8] = {};
  auto set = [&](auto v) { std::memcpy(one, &v, sizeof v); };
  switch (t) {
    case chorus::dtype::float32: set(1.0f); break;
    case chorus::dtype::float64: set(1.0); break;
    case chorus::dtype::float16: set(chorus::to_half(1.0f)); break;
    case chorus::dtype::bfloat16: set(chorus::to_bfloat16(1.0f)); break;
    default: one[0] = std::byte{1}; break;  // little-endian integer 1
  }
  for (std::size_t at = 0; at + es <= bytes; at += es) std::memcpy(p + at, one, es);
}

void bench_memcpy(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  arena& m = buffers();
  for (auto _ : state) {
    std::memcpy(m.dst.data(), m.a.data(), bytes);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) *
                          static_cast<std::int64_t>(2 * bytes));
}

void bench_reduce(benchmark::State& state, chorus::dtype t, chorus::reduce_op op, bool in_place) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  const std::size_t count = bytes / chorus::size_of(t);
  arena& m = buffers();
  fill_with_ones(t, m.a.data(), bytes);
  fill_with_ones(t, m.b.data(), bytes);
  std::byte* dst = in_place ? m.a.data() : m.dst.data();
  const chorus::reduce_fn kernel = chorus::reduce_function(t, op);
  for (auto _ : state) {
    kernel(dst, m.a.data(), m.b.data(), count);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) *
                          static_cast<std::int64_t>(3 * bytes));
}

// divide_by reads and writes each element once: 2 S per call, like memcpy.
void bench_divide(benchmark::State& state, chorus::dtype t) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  arena& m = buffers();
  fill_with_ones(t, m.a.data(), bytes);
  for (auto _ : state) {
    chorus::divide_by(t, m.a.data(), bytes / chorus::size_of(t), 1);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) *
                          static_cast<std::int64_t>(2 * bytes));
}

template <class B>
void with_sizes(B* b) {
  for (const std::size_t s : sizes) b->Arg(static_cast<std::int64_t>(s));
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  buffers();  // allocate before any timing

  with_sizes(benchmark::RegisterBenchmark("memcpy", bench_memcpy));
  for (const auto op : {chorus::sum, chorus::prod, chorus::min, chorus::max}) {
    const std::string name = "reduce/float/" + std::string(chorus::to_string(op));
    with_sizes(benchmark::RegisterBenchmark(name.c_str(), bench_reduce, chorus::dtype::float32, op,
                                            false));
  }
  with_sizes(benchmark::RegisterBenchmark("reduce/float/sum/in_place", bench_reduce,
                                          chorus::dtype::float32, chorus::sum, true));
  for (int i = 1; i < chorus::dtype_count; ++i) {
    const auto t = static_cast<chorus::dtype>(i);
    const std::string name = "reduce/" + std::string(chorus::to_string(t)) + "/sum";
    with_sizes(benchmark::RegisterBenchmark(name.c_str(), bench_reduce, t, chorus::sum, false));
  }
  with_sizes(benchmark::RegisterBenchmark("divide_by/float", bench_divide, chorus::dtype::float32));
  with_sizes(benchmark::RegisterBenchmark("divide_by/half", bench_divide, chorus::dtype::float16));

  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
