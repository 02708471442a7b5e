// SPDX-License-Identifier: Apache-2.0
// The raw shared-memory baselines for bench/compare: what N processes on this machine get
// from only moving a ring all-reduce's bytes, nothing reduced and no step waiting on another.
//
// Usage: shm_raw ring [--ranks N] [--bytes 64M] [--ring 1M] [--iters I] [--warmup W]
//          N processes in a ring of shared-memory rings (one per neighbour pair, RING bytes
//          each, chorus's default): each copies 2(N-1)/N * BYTES from a private buffer into
//          the ring to the next while it copies as much out of the ring from the previous
//          into another private buffer. Two copies per byte, as between private buffers
//          through shared memory. Waits spin 50 µs, then sleep on a futex.
//        shm_raw pull [--ranks N] [--bytes 64M] [--chunk 1M] [--iters I] [--warmup W]
//          each process reads the same bytes straight out of the previous one's private
//          buffer with process_vm_readv, CHUNK bytes per call: one (kernel) copy per byte, the
//          single-copy path (CMA) a transport could take instead, with no process ever
//          waiting for another.
// busbw = bytes per rank / time, the nccl-tests busbw of an all-reduce of BYTES. For 2 ranks
// each is the most an all-reduce moving its bytes that way can reach here (it must also
// reduce, and wait for its peers); with more ranks than cores, `ring`'s plain waits may
// lose to a tuned spin, so only `pull` bounds what a collective can reach. The program forks
// its peers and prints one RESULT line. Build: g++ -O2 -std=c++20 shm_raw.cpp
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include "measure.hpp"

namespace {

[[noreturn]] void die(const char* what) {
  std::fprintf(stderr, "shm_raw: %s: %s\n", what, std::strerror(errno));
  std::exit(1);
}

constexpr std::size_t line = 64;
constexpr std::size_t publish = 64 * 1024;  // progress is published this often, as chorus does

void futex_wait(std::atomic<std::uint32_t>* word, std::uint32_t seen) {
  timespec nap{0, 1000 * 1000};  // 1 ms: a lost wake-up costs at most this
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), FUTEX_WAIT, seen, &nap, nullptr, 0);
}
void futex_wake(std::atomic<std::uint32_t>* word) {
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), FUTEX_WAKE, 1 << 30, nullptr, nullptr, 0);
}

// What one rank shares: the ring it writes (to the next rank), its doorbell, and, for the
// pull mode, where its source buffer lies in its address space.
struct alignas(line) rank_area {
  alignas(line) std::atomic<std::uint64_t> head{0};  // bytes written into this rank's ring
  alignas(line) std::atomic<std::uint64_t> tail{0};  // bytes the next rank has copied out
  alignas(line) std::atomic<std::uint32_t> bell{0};
  std::atomic<std::uint32_t> sleeping{0};
  std::atomic<std::uintptr_t> source{0};
  std::atomic<int> pid{0};
};

struct shared_state {
  alignas(line) std::atomic<std::uint32_t> arrived{0};
  std::atomic<std::uint32_t> generation{0};
};

// Rings `who` if it sleeps (the fence pairs with the one before its sleep: either it sees our
// update, or we see it sleeping).
void ring_bell(rank_area& who) {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (who.sleeping.load(std::memory_order_relaxed) != 0) {
    who.bell.fetch_add(1, std::memory_order_release);
    futex_wake(&who.bell);
  }
}

class job {
 public:
  job(int n, std::size_t ring_bytes) : n_(n), ring_bytes_(ring_bytes) {
    const std::size_t header = sizeof(shared_state) + static_cast<std::size_t>(n) * sizeof(rank_area);
    bytes_ = (header + line - 1) / line * line + static_cast<std::size_t>(n) * ring_bytes;
    void* p = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) die("mmap");
    base_ = static_cast<std::byte*>(p);
    new (base_) shared_state;
    for (int r = 0; r < n; ++r) new (&area(r)) rank_area;
  }

  shared_state& state() { return *reinterpret_cast<shared_state*>(base_); }
  rank_area& area(int r) {
    return reinterpret_cast<rank_area*>(base_ + sizeof(shared_state))[r];
  }
  std::byte* ring(int r) {
    const std::size_t header = sizeof(shared_state) + static_cast<std::size_t>(n_) * sizeof(rank_area);
    return base_ + (header + line - 1) / line * line + static_cast<std::size_t>(r) * ring_bytes_;
  }
  int size() const { return n_; }
  std::size_t ring_bytes() const { return ring_bytes_; }

  // Every rank has arrived. Waiting ranks yield: more ranks than cores is the common case.
  void barrier() {
    shared_state& s = state();
    const std::uint32_t gen = s.generation.load(std::memory_order_acquire);
    if (s.arrived.fetch_add(1, std::memory_order_acq_rel) + 1 == static_cast<std::uint32_t>(n_)) {
      s.arrived.store(0, std::memory_order_relaxed);
      s.generation.fetch_add(1, std::memory_order_release);
      return;
    }
    while (s.generation.load(std::memory_order_acquire) == gen) ::sched_yield();
  }

 private:
  int n_;
  std::size_t ring_bytes_, bytes_ = 0;
  std::byte* base_ = nullptr;
};

// Rank `me` streams `send` into its ring while draining the previous rank's ring into
// `recv`, `bytes` each way; spins 50 µs without progress, then sleeps on its doorbell.
void stream(job& j, int me, const std::byte* send, std::byte* recv, std::size_t bytes) {
  const int prev = (me + j.size() - 1) % j.size();
  const int next = (me + 1) % j.size();
  rank_area& out = j.area(me);  // our ring, and our doorbell
  rank_area& in = j.area(prev);
  std::byte* out_ring = j.ring(me);
  const std::byte* in_ring = j.ring(prev);
  const std::size_t cap = j.ring_bytes();
  std::uint64_t head = out.head.load(), rd = in.tail.load();
  const std::uint64_t sent_end = head + bytes, got_end = rd + bytes;
  double idle_since = -1;
  while (head < sent_end || rd < got_end) {
    bool moved = false;
    if (head < sent_end) {
      const std::uint64_t room = cap - (head - out.tail.load(std::memory_order_acquire));
      const std::size_t at = static_cast<std::size_t>(head % cap);
      const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>({room, sent_end - head, publish, cap - at}));
      if (n > 0) {
        std::memcpy(out_ring + at, send + (bytes - (sent_end - head)), n);
        head += n;
        out.head.store(head, std::memory_order_release);
        ring_bell(j.area(next));
        moved = true;
      }
    }
    if (rd < got_end) {
      const std::uint64_t ready = in.head.load(std::memory_order_acquire) - rd;
      const std::size_t at = static_cast<std::size_t>(rd % cap);
      const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>({ready, got_end - rd, publish, cap - at}));
      if (n > 0) {
        std::memcpy(recv + (bytes - (got_end - rd)), in_ring + at, n);
        rd += n;
        in.tail.store(rd, std::memory_order_release);
        ring_bell(j.area(prev));
        moved = true;
      }
    }
    if (moved) {
      idle_since = -1;
      continue;
    }
    const double now = compare::now_us();
    if (idle_since < 0) idle_since = now;
    if (now - idle_since < 50) continue;
    out.sleeping.store(1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    const std::uint32_t seen = out.bell.load(std::memory_order_acquire);
    const bool ready = (head < sent_end && out.tail.load(std::memory_order_acquire) + cap > head) ||
                       (rd < got_end && in.head.load(std::memory_order_acquire) > rd);
    if (!ready) futex_wait(&out.bell, seen);
    out.sleeping.store(0, std::memory_order_relaxed);
    idle_since = -1;
  }
}

// Rank `me` reads `bytes` of the previous rank's source buffer into `recv`, `chunk` per call.
void pull(job& j, int me, std::byte* recv, std::size_t bytes, std::size_t chunk) {
  const rank_area& from = j.area((me + j.size() - 1) % j.size());
  const auto source = from.source.load(std::memory_order_acquire);
  const int pid = from.pid.load(std::memory_order_acquire);
  for (std::size_t off = 0; off < bytes; off += chunk) {
    const std::size_t n = std::min(chunk, bytes - off);
    iovec local{recv + off, n};
    iovec remote{reinterpret_cast<void*>(source + off), n};
    if (::process_vm_readv(pid, &local, 1, &remote, 1, 0) != static_cast<ssize_t>(n)) {
      die("process_vm_readv");
    }
  }
}

int run(const std::string& mode, int n, std::size_t bytes, std::size_t ring_bytes,
        std::size_t chunk, int iters, int warmup) {
  job j(n, ring_bytes);
  const std::size_t moved = bytes / static_cast<std::size_t>(n) * 2 * static_cast<std::size_t>(n - 1);
  std::fflush(stdout);
  int me = 0;
  std::vector<pid_t> children;
  for (int r = 1; r < n; ++r) {
    const pid_t pid = ::fork();
    if (pid < 0) die("fork");
    if (pid == 0) {
      me = r;
      children.clear();
      break;
    }
    children.push_back(pid);
  }
  // Each process allocates and touches its own buffers: page faults are not what we measure,
  // and pages shared copy-on-write with the parent would not be private buffers.
  std::vector<std::byte> send(moved, std::byte{1}), recv(moved, std::byte{0});
  j.area(me).source.store(reinterpret_cast<std::uintptr_t>(send.data()), std::memory_order_release);
  j.area(me).pid.store(static_cast<int>(::getpid()), std::memory_order_release);
  std::vector<double> times;
  for (int i = 0; i < warmup + iters; ++i) {
    j.barrier();  // everyone is ready
    const double start = compare::now_us();
    if (mode == "ring") stream(j, me, send.data(), recv.data(), moved);
    else pull(j, me, recv.data(), moved, chunk);
    j.barrier();  // everyone is done
    if (i >= warmup) times.push_back(compare::now_us() - start);
  }
  if (me != 0) std::_Exit(0);
  int failed = 0;
  for (pid_t pid : children) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    failed += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  const auto s = compare::summarize(times);
  std::printf("RESULT impl=shm_raw op=%s ranks=%d size=%zu bytes_per_rank=%zu iters=%d "
              "median_us=%.3f mean_us=%.3f busbw=%.4f\n",
              mode.c_str(), n, bytes, moved, iters, s.median_us, s.mean_us,
              static_cast<double>(moved) / (s.mean_us * 1e-6) / 1e9);
  return failed == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: shm_raw ring [--ranks N] [--bytes 64M] [--ring 1M] [--iters I] [--warmup W]\n"
                         "       shm_raw pull [--ranks N] [--bytes 64M] [--chunk 1M] [--iters I] [--warmup W]\n");
    return 2;
  }
  const std::string mode = argv[1];
  int iters = 10, warmup = 2, ranks = 2;
  std::size_t bytes = std::size_t{64} << 20, ring_bytes = std::size_t{1} << 20, chunk = std::size_t{1} << 20;
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string arg = argv[i];
    if (arg == "--iters") iters = std::atoi(argv[i + 1]);
    else if (arg == "--warmup") warmup = std::atoi(argv[i + 1]);
    else if (arg == "--ranks") ranks = std::atoi(argv[i + 1]);
    else if (arg == "--bytes") bytes = compare::parse_size(argv[i + 1]);
    else if (arg == "--ring") ring_bytes = compare::parse_size(argv[i + 1]);
    else if (arg == "--chunk") chunk = compare::parse_size(argv[i + 1]);
    else {
      std::fprintf(stderr, "shm_raw: unknown option %s\n", arg.c_str());
      return 2;
    }
  }
  if (mode != "ring" && mode != "pull") {
    std::fprintf(stderr, "shm_raw: unknown mode %s\n", mode.c_str());
    return 2;
  }
  if (iters < 1 || warmup < 0 || bytes < 1 || chunk < 1) {
    std::fprintf(stderr, "shm_raw: --iters, --bytes and --chunk must be positive\n");
    return 2;
  }
  if (ring_bytes < 4096 || (ring_bytes & (ring_bytes - 1)) != 0) {
    std::fprintf(stderr, "shm_raw: --ring must be a power of two of at least 4K\n");
    return 2;
  }
  if (ranks < 2 || ranks > 256) {
    std::fprintf(stderr, "shm_raw: --ranks must be in [2, 256]\n");
    return 2;
  }
  return run(mode, ranks, bytes, ring_bytes, chunk, iters, warmup);
}
