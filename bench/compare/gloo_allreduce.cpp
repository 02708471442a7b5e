// SPDX-License-Identifier: Apache-2.0
// Gloo's peer row for bench/compare: float32 sum all-reduce with gloo::AllreduceRingChunked
// over gloo's TCP transport on loopback, timed per operation, printed as RESULT lines.
//
// Usage: gloo_allreduce [-n N] [--sizes 64M,8] [--iters I] [--warmup W] [--store DIR]
//   Ranks come from CHORUS_RANK/CHORUS_WORLD_SIZE (chorus-run); without them the program
//   forks N ranks itself. Ranks meet through a gloo::rendezvous::FileStore in DIR (default:
//   /tmp/gloo-store-$CHORUS_MASTER_PORT, or a fresh temp dir when forking).
// Build: g++ -O2 -std=c++20 gloo_allreduce.cpp -lgloo -pthread
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "measure.hpp"

namespace {

struct options {
  int nranks = 2;
  std::vector<std::size_t> sizes{std::size_t{64} << 20};
  int iters = 20;
  int warmup = 5;
  std::string store;
};

int run_rank(int rank, int size, const options& opt) {
  gloo::transport::tcp::attr attr;
  attr.hostname = "127.0.0.1";
  auto dev = gloo::transport::tcp::CreateDevice(attr);
  gloo::rendezvous::FileStore store(opt.store);
  auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
  context->connectFullMesh(store, dev);

  for (std::size_t bytes : opt.sizes) {
    const int count = static_cast<int>(bytes / sizeof(float));
    // One buffer per size, touched before timing: page faults are not what we measure.
    std::vector<float> data(static_cast<std::size_t>(count), static_cast<float>(rank + 1));
    std::vector<float*> ptrs{data.data()};
    gloo::AllreduceRingChunked<float> algorithm(context, ptrs, count);

    // Correctness once: every element must be 1 + 2 + ... + size.
    algorithm.run();
    const float expected = static_cast<float>(size * (size + 1) / 2);
    long wrong = 0;
    for (float v : data) wrong += v == expected ? 0 : 1;
    // Zeros from here on: repeated in-place sums of zeros stay finite, and cost the same.
    std::fill(data.begin(), data.end(), 0.0f);

    for (int i = 0; i < opt.warmup; ++i) algorithm.run();
    std::vector<double> times;
    times.reserve(static_cast<std::size_t>(opt.iters));
    for (int i = 0; i < opt.iters; ++i) {
      double start = compare::now_us();
      algorithm.run();
      times.push_back(compare::now_us() - start);
    }
    if (rank == 0) {
      compare::print_allreduce("gloo", size, bytes, opt.iters, compare::summarize(times), wrong);
    }
  }
  return 0;
}

int run_rank_guarded(int rank, int size, const options& opt) {
  try {
    return run_rank(rank, size, opt);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gloo_allreduce rank %d: %s\n", rank, e.what());
    return 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  options opt;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "gloo_allreduce: %s needs a value\n", arg.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (arg == "-n") opt.nranks = std::atoi(next().c_str());
    else if (arg == "--sizes") opt.sizes = compare::parse_sizes(next());
    else if (arg == "--iters") opt.iters = std::atoi(next().c_str());
    else if (arg == "--warmup") opt.warmup = std::atoi(next().c_str());
    else if (arg == "--store") opt.store = next();
    else {
      std::fprintf(stderr,
                   "usage: gloo_allreduce [-n N] [--sizes 64M,8] [--iters I] [--warmup W] "
                   "[--store DIR]\n");
      return 2;
    }
  }

  const char* env_rank = std::getenv("CHORUS_RANK");
  const char* env_size = std::getenv("CHORUS_WORLD_SIZE");
  if (env_rank != nullptr && env_size != nullptr) {
    if (opt.store.empty()) {
      const char* port = std::getenv("CHORUS_MASTER_PORT");
      opt.store = std::string("/tmp/gloo-store-") + (port != nullptr ? port : "0");
    }
    ::mkdir(opt.store.c_str(), 0700);  // every rank tries; EEXIST is fine
    return run_rank_guarded(std::atoi(env_rank), std::atoi(env_size), opt);
  }

  // No launcher: fork the ranks ourselves, rank 0 stays in this process.
  bool own_store = opt.store.empty();
  if (own_store) {
    char templ[] = "/tmp/gloo-store-XXXXXX";
    if (::mkdtemp(templ) == nullptr) {
      std::perror("mkdtemp");
      return 1;
    }
    opt.store = templ;
  } else {
    ::mkdir(opt.store.c_str(), 0700);
  }
  std::vector<pid_t> children;
  for (int r = 1; r < opt.nranks; ++r) {
    pid_t pid = ::fork();
    if (pid == 0) {
      std::fflush(stdout);
      ::_exit(run_rank_guarded(r, opt.nranks, opt));
    }
    children.push_back(pid);
  }
  int rc = run_rank_guarded(0, opt.nranks, opt);
  for (pid_t pid : children) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) rc = 1;
  }
  if (own_store) {
    std::string cmd = "rm -rf '" + opt.store + "'";
    [[maybe_unused]] int ignored = std::system(cmd.c_str());
  }
  return rc;
}
