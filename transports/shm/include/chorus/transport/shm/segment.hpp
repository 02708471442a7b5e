// SPDX-License-Identifier: Apache-2.0
// The shared-memory segment of one node: its layout, creation, attachment and removal.
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <utility>

#include <chorus/detail/frame.hpp>
#include <chorus/error.hpp>

namespace chorus::detail {

// Layout, in order, every part 64-byte aligned so that no two writers share a cache line:
//
//   shm_header                           written once by the creator
//   shm_member[n]                        one per local rank: its doorbell, pid, failure text
//   shm_ring_ctl[n * n]                  ring i -> j at i * n + j (the diagonal is unused)
//   ring data[n * n][ring_bytes]         page aligned, same indexing
//
// Only rings that carry traffic are ever touched, so unused pairs cost address space, not
// memory (tmpfs allocates pages on first write).

inline constexpr std::uint32_t shm_magic = 0x4d534843;  // "CHSM"
inline constexpr std::uint32_t shm_version = 4;
inline constexpr std::size_t shm_abort_text = 960;

struct alignas(64) shm_header {
  std::uint32_t magic;
  std::uint32_t version;
  std::uint32_t members;
  std::uint32_t reserved;
  std::uint64_t ring_bytes;
  std::uint64_t total_bytes;
  std::uint64_t salt;  ///< random per segment; mixed into frame tags (channel.hpp)
};

struct alignas(64) shm_member {
  /// Futex word. Whoever changes something this rank may sleep on (data in a ring it reads,
  /// room in a ring it writes, a failure) bumps it and wakes the rank, but only while
  /// `sleeping` is set, so a rank that spins costs its peers no system call.
  std::atomic<std::uint32_t> bell;
  std::atomic<std::uint32_t> sleeping;
  std::atomic<std::uint32_t> failed;  ///< set after abort_text is written
  std::atomic<std::int32_t> pid;
  std::uint64_t pid_ns;                ///< inode of the rank's pid namespace
  /// Where, in the rank's own memory, a peer finds the word shm_probe_word() names: a peer
  /// that reads it there with process_vm_readv may read the rank's sends in place.
  std::uint64_t probe_at;
  std::uint32_t abort_len;
  frame_header abort_call;  ///< the call the rank failed in, as abort_header() writes it
  char abort_text[shm_abort_text];
};

/// One single-producer single-consumer byte ring. Both counters only grow; a byte at
/// position p lives at data[p % ring_bytes]. head: bytes written (producer's line);
/// tail: bytes the consumer has given back (consumer's line). Besides bytes, the ring carries
/// pull frames, which name a payload in the producer's memory that the consumer reads in
/// place (channel.hpp): `pulled` counts those it has finished reading, and `can_pull`, set
/// once at connection, says the consumer can read the producer's memory at all (its own
/// line: both are the consumer's).
struct shm_ring_ctl {
  alignas(64) std::atomic<std::uint64_t> head;
  alignas(64) std::atomic<std::uint64_t> tail;
  alignas(64) std::atomic<std::uint64_t> pulled;
  std::atomic<std::uint32_t> can_pull;
};

static_assert(std::atomic<std::uint32_t>::is_always_lock_free &&
                  std::atomic<std::uint64_t>::is_always_lock_free,
              "chorus: shared-memory rings need lock-free atomics");

constexpr std::size_t shm_round_up(std::size_t n, std::size_t a) { return (n + a - 1) / a * a; }

struct shm_layout {
  std::size_t members = 1;
  std::size_t ring_bytes = 0;

  std::size_t member_offset() const { return sizeof(shm_header); }
  std::size_t ring_ctl_offset() const { return member_offset() + members * sizeof(shm_member); }
  std::size_t data_offset() const {
    return shm_round_up(ring_ctl_offset() + members * members * sizeof(shm_ring_ctl), 4096);
  }
  std::size_t total() const { return data_offset() + members * members * ring_bytes; }
};

inline void futex_wake_all(std::atomic<std::uint32_t>* word) {
  // Not FUTEX_PRIVATE: the word lives in memory shared between processes.
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), FUTEX_WAKE, INT32_MAX, nullptr,
            nullptr, 0);
}

/// Sleeps while *word == seen, at most `timeout`. Spurious returns are fine: callers re-check.
inline void futex_wait(std::atomic<std::uint32_t>* word, std::uint32_t seen,
                       std::chrono::nanoseconds timeout) {
  timespec ts{static_cast<time_t>(timeout.count() / 1000000000),
              static_cast<long>(timeout.count() % 1000000000)};
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), FUTEX_WAIT, seen, &ts, nullptr,
            0);
}

/// What a rank's probe word holds: a peer that reads this value at the rank's `probe_at`
/// reads the right process (pids are recycled) of the right segment.
inline std::uint64_t shm_probe_word(std::uint64_t salt, std::size_t member) {
  return salt ^ (0x9e3779b97f4a7c15ull * (member + 1));
}

/// The inode of this process's pid namespace (0: unknown, no /proc); two processes may
/// compare pids only in one namespace (same_pid_namespace).
inline std::uint64_t pid_namespace_id() {
  struct stat st{};
  return ::stat("/proc/self/ns/pid", &st) == 0 ? static_cast<std::uint64_t>(st.st_ino) : 0;
}

/// Whether pid namespaces `a` and `b` (pid_namespace_id) are known to be one: two processes
/// that cannot tell theirs are taken to be in different ones, since a pid of another
/// namespace names some other process, or none (a live peer then looked dead).
inline bool same_pid_namespace(std::uint64_t a, std::uint64_t b) { return a != 0 && a == b; }

/// A mapped segment. The name is unlinked as soon as every member has attached (see
/// shm_transport::connect), so a segment outlives no process, however they end.
class shm_segment {
 public:
  shm_segment() = default;
  shm_segment(shm_segment&& o) noexcept
      : base_(std::exchange(o.base_, nullptr)), bytes_(std::exchange(o.bytes_, 0)),
        fd_(std::exchange(o.fd_, -1)), layout_(o.layout_) {}
  shm_segment& operator=(shm_segment&& o) noexcept {
    if (this != &o) {
      unmap();
      base_ = std::exchange(o.base_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
      fd_ = std::exchange(o.fd_, -1);
      layout_ = o.layout_;
    }
    return *this;
  }
  shm_segment(const shm_segment&) = delete;
  shm_segment& operator=(const shm_segment&) = delete;
  ~shm_segment() { unmap(); }

  /// A fresh, unique name for a segment created by this process, in pid namespace `ns`:
  /// "/chorus-<pid>-ns<ns>-<random>". The pid and its namespace let a later job remove what a
  /// crashed one left (remove_stale_segments).
  static std::string unique_name(std::uint64_t ns) {
    std::random_device rd;
    const std::uint64_t r = (std::uint64_t{rd()} << 32) ^ rd();
    char buf[96];
    std::snprintf(buf, sizeof buf, "/chorus-%d-ns%llu-%016llx", static_cast<int>(::getpid()),
                  static_cast<unsigned long long>(ns), static_cast<unsigned long long>(r));
    return buf;
  }

  static shm_segment create(const std::string& name, shm_layout layout) {
    const int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) throw sys_error("shm_open(" + name + ")");
    if (::ftruncate(fd, static_cast<off_t>(layout.total())) != 0) {
      const int err = errno;
      ::close(fd);
      ::shm_unlink(name.c_str());
      throw sys_error("ftruncate(" + name + ", " + std::to_string(layout.total()) +
                          " bytes): is /dev/shm large enough?",
                      err);
    }
    shm_segment s = map(fd, name, layout);
    try {
      s.reserve(0, layout.data_offset(), "the segment's header");
    } catch (...) {
      ::shm_unlink(name.c_str());
      throw;
    }
    auto* h = new (s.base_) shm_header{};
    h->members = static_cast<std::uint32_t>(layout.members);
    h->ring_bytes = layout.ring_bytes;
    h->total_bytes = layout.total();
    std::random_device rd;
    h->salt = (std::uint64_t{rd()} << 32) ^ rd();
    h->version = shm_version;
    for (std::size_t i = 0; i < layout.members; ++i) new (&s.member(i)) shm_member{};
    for (std::size_t i = 0; i < layout.members * layout.members; ++i) {
      new (s.base_ + layout.ring_ctl_offset() + i * sizeof(shm_ring_ctl)) shm_ring_ctl{};
    }
    // Publish the magic last: a member that sees it sees an initialised segment.
    std::atomic_ref<std::uint32_t>(h->magic).store(shm_magic, std::memory_order_release);
    return s;
  }

  /// Attaches to a segment another member created; checks that it is what we expect.
  static shm_segment open(const std::string& name, shm_layout layout) {
    const int fd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
    if (fd < 0) throw sys_error("shm_open(" + name + ")");
    struct stat st{};
    if (::fstat(fd, &st) != 0 || static_cast<std::size_t>(st.st_size) != layout.total()) {
      ::close(fd);
      throw error(errc::bootstrap, "shared-memory segment " + name + " has size " +
                                       std::to_string(st.st_size) + ", expected " +
                                       std::to_string(layout.total()));
    }
    shm_segment s = map(fd, name, layout);
    auto* h = reinterpret_cast<shm_header*>(s.base_);
    const auto magic = std::atomic_ref<std::uint32_t>(h->magic).load(std::memory_order_acquire);
    if (magic != shm_magic || h->version != shm_version || h->members != layout.members ||
        h->ring_bytes != layout.ring_bytes) {
      throw error(errc::bootstrap, "shared-memory segment " + name +
                                       " was made by another job or version");
    }
    return s;
  }

  shm_member& member(std::size_t i) const {
    return *reinterpret_cast<shm_member*>(base_ + layout_.member_offset() + i * sizeof(shm_member));
  }
  shm_ring_ctl& ring_ctl(std::size_t from, std::size_t to) const {
    return *reinterpret_cast<shm_ring_ctl*>(base_ + layout_.ring_ctl_offset() +
                                            (from * layout_.members + to) * sizeof(shm_ring_ctl));
  }
  std::byte* ring_data(std::size_t from, std::size_t to) const { return base_ + ring_offset(from, to); }
  /// Where the ring from member `from` to member `to` starts in the segment.
  std::size_t ring_offset(std::size_t from, std::size_t to) const {
    return layout_.data_offset() + (from * layout_.members + to) * layout_.ring_bytes;
  }
  const shm_layout& layout() const { return layout_; }
  std::uint64_t salt() const { return reinterpret_cast<const shm_header*>(base_)->salt; }

  /// Allocates the segment's pages in [offset, offset + bytes) now, for `what`. tmpfs gives a
  /// segment its pages as they are first touched, and a page it has no room for kills the
  /// process touching it with SIGBUS, with no word said: a /dev/shm too small for the rings
  /// (Docker's default is 64 MiB) killed every rank in its first collective. Here that is an
  /// error naming /dev/shm. A file system that cannot allocate ahead is left as it was.
  void reserve(std::size_t offset, std::size_t bytes, const std::string& what) const {
    int err = 0;
    do {
      err = ::fallocate(fd_, 0, static_cast<off_t>(offset), static_cast<off_t>(bytes)) == 0 ? 0 : errno;
    } while (err == EINTR);
    if (err == 0 || err == EOPNOTSUPP) return;
    throw error(errc::system,
                "shared memory: no room in /dev/shm for " + what + " (" + std::to_string(bytes >> 10) +
                    " KiB more): " + std::strerror(err) +
                    "; give /dev/shm more room (e.g. docker run --shm-size=1g), lower "
                    "CHORUS_SHM_RING_BYTES, or use CHORUS_TRANSPORT=tcp",
                {}, std::nullopt, "fallocate");
  }

 private:
  static shm_segment map(int fd, const std::string& name, shm_layout layout) {
    void* p = ::mmap(nullptr, layout.total(), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      throw sys_error("mmap(" + name + ")", err);
    }
    shm_segment s;
    s.base_ = static_cast<std::byte*>(p);
    s.bytes_ = layout.total();
    s.fd_ = fd;  // kept for reserve(); the mapping alone would keep the memory
    s.layout_ = layout;
    return s;
  }
  void unmap() noexcept {
    if (base_ != nullptr) ::munmap(base_, bytes_);
    base_ = nullptr;
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

  std::byte* base_ = nullptr;
  std::size_t bytes_ = 0;
  int fd_ = -1;
  shm_layout layout_{};
};

/// Removes /dev/shm/chorus-<pid>-ns<ns>-* segments whose creating process no longer exists:
/// a job killed between creating its segment and unlinking it (a few milliseconds of set-up,
/// or as long as its ranks take to arrive) leaves one behind, and the next job on the node
/// cleans it up. Only segments made in our pid namespace `ns` are judged: containers that
/// share /dev/shm but not pids (a Kubernetes pod's) see each other's creators as gone, and
/// removed live jobs' segments before their ranks had attached.
inline void remove_stale_segments(std::uint64_t ns) noexcept {
  if (ns == 0) return;
  DIR* d = ::opendir("/dev/shm");
  if (d == nullptr) return;
  while (const dirent* e = ::readdir(d)) {
    int pid = 0;
    unsigned long long theirs = 0;
    char rest[64];
    if (std::sscanf(e->d_name, "chorus-%d-ns%llu-%63s", &pid, &theirs, rest) != 3 || pid <= 0) continue;
    if (theirs != ns) continue;
    if (::kill(pid, 0) != 0 && errno == ESRCH) ::shm_unlink(("/" + std::string(e->d_name)).c_str());
  }
  ::closedir(d);
}

}  // namespace chorus::detail
