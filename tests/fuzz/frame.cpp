// SPDX-License-Identifier: Apache-2.0
// Fuzz target: the TCP transport's receive path (tcp_connection::pump), fed a peer's bytes
// through a real socketpair that the peer shuts down after its last byte.
//
// Input: one control byte, then the byte stream the peer sends.
//   bits 0-1  receives to post: 1 to 4
//   bit  2    post each receive only once the previous one completed (later frames then wait
//             in the connection's buffer, as when a peer runs ahead of us)
//   bits 3-5  4: the last receive expects op_seq + 1, 5: count + 1, 6: slice + 1,
//             7: one payload byte less; 0 to 3: every receive expects what the stream holds
//
// The headers the receives expect are read from the stream itself, walked as a chain of frames
// (header, then `length` payload bytes), so that most inputs get past check_header and reach
// the payload paths; the control byte makes the last one disagree.
//
// What must hold: pump() completes every receive or throws chorus::error within a bounded
// number of calls (the stream ends, so waiting for more would be a hang); a receive completes
// only after those posted before it, holding exactly its frame's payload from the stream; and
// ASan and UBSan see nothing.
#include <sys/socket.h>

#include <chorus/transport/tcp.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <vector>

namespace {

using chorus::detail::frame_header;

// Larger than tcp_small_payload, so that payloads take both read paths (through the buffer and
// straight into place); receives the executor posts are never larger than its slices.
constexpr std::uint32_t max_expected_payload = 256 * 1024;

[[noreturn]] void fail(const char* why) {
  std::fprintf(stderr, "fuzz frame: %s\n", why);
  std::abort();
}

struct expected_frame {
  frame_header header;
  std::size_t payload_at = 0;  // where its payload starts in the stream
};

std::vector<expected_frame> expected_frames(std::span<const std::uint8_t> stream,
                                            std::size_t receives, unsigned skew) {
  std::vector<expected_frame> frames;
  std::size_t at = 0;
  for (std::size_t i = 0; i < receives; ++i) {
    frame_header h{};
    if (at <= stream.size() && stream.size() - at >= sizeof h) {
      std::memcpy(&h, stream.data() + at, sizeof h);
    }
    h.magic = chorus::detail::frame_magic;
    h.length = std::min(h.length, max_expected_payload);
    frames.push_back({h, at + sizeof h});
    at += sizeof h + h.length;
  }
  frame_header& last = frames.back().header;
  switch (skew) {
    case 4:
      ++last.op_seq;
      break;
    case 5:
      ++last.count;
      break;
    case 6:
      ++last.slice;
      break;
    case 7:
      last.length = last.length == 0 ? 1 : last.length - 1;
      break;
    default:
      break;
  }
  return frames;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const unsigned control = data[0];
  const std::span<const std::uint8_t> stream(data + 1, size - 1);
  const std::size_t receives = 1 + (control & 3u);
  const bool one_at_a_time = (control & 4u) != 0;
  const auto frames = expected_frames(stream, receives, (control >> 3) & 7u);

  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) != 0) {
    fail("socketpair failed");
  }
  chorus::detail::unique_fd peer(sv[1]);
  chorus::detail::tcp_connection conn{chorus::detail::unique_fd(sv[0]), 0, 1};

  // Payload buffers of exactly the expected size, so that ASan catches a write past one.
  std::vector<std::vector<std::byte>> payloads(receives);
  std::vector<chorus::transfer> xs(receives);  // never resized: the connection keeps pointers
  for (std::size_t i = 0; i < receives; ++i) {
    payloads[i].resize(frames[i].header.length);
    xs[i].header = frames[i].header;
    xs[i].data = payloads[i].data();
    xs[i].length = frames[i].header.length;
  }

  std::size_t sent = 0;
  std::size_t posted = 0;
  bool shut = false;
  try {
    // Every round writes, posts or reads at least one byte until the receives are done or the
    // stream has ended and been read, so this bound is only reached by a pump() that hangs.
    for (std::size_t round = 0; !xs.back().done; ++round) {
      if (round > 64 + 2 * size) fail("pump() stopped making progress on a finished stream");
      while (sent < stream.size()) {
        const ssize_t n = ::send(peer.get(), stream.data() + sent, stream.size() - sent,
                                 MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n <= 0) break;  // the socket is full until pump() reads
        sent += static_cast<std::size_t>(n);
      }
      if (sent == stream.size() && !shut) {
        ::shutdown(peer.get(), SHUT_WR);
        shut = true;
      }
      while (posted < receives && (posted == 0 || !one_at_a_time || xs[posted - 1].done)) {
        conn.post_recv(&xs[posted++]);
      }
      conn.readable = true;  // as edge-triggered epoll reports it
      conn.pump();
    }
  } catch (const chorus::error&) {
    // The clear error a bad stream must end in.
  }

  for (std::size_t i = 0; i < receives; ++i) {
    if (!xs[i].done) continue;
    if (i > 0 && !xs[i - 1].done) fail("a receive completed before the one posted ahead of it");
    const std::size_t at = frames[i].payload_at;
    if (at > stream.size() || stream.size() - at < xs[i].length) {
      fail("a receive completed with more payload than the stream carried");
    }
    if (xs[i].length > 0 &&
        std::memcmp(payloads[i].data(), stream.data() + at, xs[i].length) != 0) {
      fail("a completed receive holds bytes other than its frame's payload");
    }
  }
  return 0;
}
