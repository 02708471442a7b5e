// SPDX-License-Identifier: Apache-2.0
// Fuzz target: the shared-memory transport's receive side (shm_receiver), reading a ring that a
// faulty or hostile peer writes: the ring's bytes, the frames' tags and the head counter all
// come from the input.
//
// Input: one control byte, 2 bytes per receive (its payload length, little-endian, up to 16383:
// a frame may be longer than the ring), then records of (u8 op, u16 n little-endian, bytes):
//   op % 4 == 0  the peer writes the n bytes that follow at its write position, then publishes
//                head = that position + n
//   op % 4 == 1  the peer publishes head = its write position + n - 32768 without writing: a
//                head that lies, behind or ahead of the bytes written
//   op % 4 == 2  the oldest payload lent to a receive is read and given back (release)
//   op % 4 == 3  nothing: one more pump
// The receiver is pumped after every record.
//   control bits 0-1  receives to post: 1 to 4
//   bit 2             the receives are lendable (completed in place, in the ring)
//   bit 3             the receiver may read the sender's memory in place (pull frames): the
//                     sender is this process, whose "sent" memory is 64 KiB mapped at
//                     sender_area, filled with bytes i * 7 + 3
//
// The ring is 4096 bytes, the smallest shm_options allows, in a heap block of its own so that
// ASan sees a read past it; the salt is 0, so a frame's tag is its ring position + 1.
//
// What must hold: whatever the head says, pump() and release() stay inside the ring, complete
// receives in order and lend only payloads that lie inside the ring, or throw chorus::error; a
// pull frame fills no more than its receive's payload (ASan sees the payloads' ends), whatever
// address it names.
#include <sys/mman.h>
#include <unistd.h>

#include <chorus/transport/shm/channel.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <memory>
#include <vector>

namespace {

using namespace chorus::detail;

constexpr std::size_t ring_bytes = 4096;

/// Where the sender's memory lies, at a fixed address so that seeds can name it (inside
/// ASan's application range on x86-64), and its size.
constexpr std::uintptr_t sender_area = 0x600000000000;
constexpr std::size_t sender_bytes = 64 * 1024;

/// Maps the sender area once, or says it cannot (the pull frames then read unmapped memory,
/// which must fail cleanly too).
bool map_sender_area() {
  static const bool mapped = [] {
    void* p = ::mmap(reinterpret_cast<void*>(sender_area), sender_bytes, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    if (p != reinterpret_cast<void*>(sender_area)) return false;
    auto* b = static_cast<unsigned char*>(p);
    for (std::size_t i = 0; i < sender_bytes; ++i) b[i] = static_cast<unsigned char>(i * 7 + 3);
    return true;
  }();
  return mapped;
}

[[noreturn]] void fail(const char* why) {
  std::fprintf(stderr, "fuzz shm_frame: %s\n", why);
  std::abort();
}

/// Reads the input front to back; past its end every read gives zeros.
struct reader {
  const std::uint8_t* at;
  const std::uint8_t* end;
  bool empty() const { return at == end; }
  unsigned byte() { return at < end ? *at++ : 0u; }
  unsigned u16() {
    const unsigned lo = byte();
    return lo | byte() << 8;
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  reader in{data, data + size};
  const unsigned control = in.byte();
  const std::size_t receives = 1 + (control & 3u);
  const bool lendable = (control & 4u) != 0;
  const bool pulls = (control & 8u) != 0;
  if (pulls) (void)map_sender_area();

  const op_fingerprint fingerprint{7,
                                   3,
                                   chorus::collective::all_reduce,
                                   chorus::dtype::float32,
                                   chorus::reduce_op::sum,
                                   chorus::algo::ring};
  std::vector<std::vector<std::byte>> payloads(receives);
  std::vector<chorus::transfer> xs(receives);  // never resized: the receiver keeps pointers
  for (std::size_t i = 0; i < receives; ++i) {
    const auto length = static_cast<std::uint32_t>(in.u16() & 0x3fffu);
    payloads[i].resize(length);
    xs[i].header = make_header(fingerprint, static_cast<std::uint32_t>(i), i, length);
    xs[i].data = payloads[i].data();
    xs[i].length = length;
    xs[i].lendable = lendable;
  }

  const std::unique_ptr<std::byte[]> ring(new std::byte[ring_bytes]());
  auto ctl = std::make_unique<shm_ring_ctl>();
  auto writer = std::make_unique<shm_member>();
  shm_receiver receiver(ctl.get(), {ring.get(), ring_bytes}, writer.get(), 0, 0, 1, pulls ? ::getpid() : 0);
  for (auto& x : xs) receiver.post(&x);

  std::deque<chorus::transfer*> lent;
  std::size_t completed = 0;
  // Checks what the receiver completed since the last call: in order, and a lent payload
  // inside the ring.
  auto check_completions = [&] {
    for (; completed < receives && xs[completed].done; ++completed) {
      chorus::transfer& x = xs[completed];
      if (!x.lent) continue;
      if (x.data < ring.get() || x.data > ring.get() + ring_bytes ||
          x.length > static_cast<std::size_t>(ring.get() + ring_bytes - x.data)) {
        fail("a payload was lent from outside the ring");
      }
      lent.push_back(&x);
    }
    for (std::size_t i = completed; i < receives; ++i) {
      if (xs[i].done) fail("a receive completed before the one posted ahead of it");
    }
  };

  std::uint64_t written = 0;  // the peer's write position
  try {
    while (!in.empty()) {
      const unsigned op = in.byte() % 4;
      const unsigned n = in.u16();
      if (op == 0) {
        for (unsigned i = 0; i < n && !in.empty(); ++i, ++written) {
          ring[written & (ring_bytes - 1)] = static_cast<std::byte>(in.byte());
        }
        ctl->head.store(written, std::memory_order_release);
      } else if (op == 1) {
        ctl->head.store(written + n - 32768, std::memory_order_release);
      } else if (op == 2 && !lent.empty()) {
        chorus::transfer* x = lent.front();
        lent.pop_front();
        volatile unsigned sum = 0;  // the executor reduces from a lent payload: read it all
        for (std::size_t i = 0; i < x->length; ++i)
          sum = sum + std::to_integer<unsigned>(x->data[i]);
        receiver.release(x);
      }
      receiver.pump();
      check_completions();
    }
  } catch (const chorus::error&) {
    // The clear error a corrupt ring must end in.
  }
  return 0;
}
