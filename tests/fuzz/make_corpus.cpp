// SPDX-License-Identifier: Apache-2.0
// Writes the fuzz targets' seed corpora: small valid and near-valid inputs, built with the
// library's own encoders so that they follow the wire formats when those change.
// Usage: fuzz_make_corpus tests/fuzz/corpus    (writes <dir>/<target>/<seed>; see README.md)
#include <chorus/bootstrap/detail/handshake.hpp>
#include <chorus/bootstrap/detail/store_protocol.hpp>
#include <chorus/detail/frame.hpp>
#include <chorus/transport/shm/channel.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace {

namespace fs = std::filesystem;
using namespace chorus::detail;
using bytes = std::vector<std::byte>;

fs::path root;
int written = 0;

void seed(const char* target, const char* name, const bytes& content) {
  const fs::path dir = root / target;
  fs::create_directories(dir);
  std::ofstream out(dir / name, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(content.data()),
            static_cast<std::streamsize>(content.size()));
  ++written;
}

void append(bytes& to, std::span<const std::byte> b) { to.insert(to.end(), b.begin(), b.end()); }
void append(bytes& to, std::string_view s) { append(to, std::as_bytes(std::span(s))); }

bytes pattern(std::size_t n) {
  bytes b(n);
  for (std::size_t i = 0; i < n; ++i) b[i] = static_cast<std::byte>(i * 7 + 1);
  return b;
}

// ---- frame: a control byte, then the peer's stream (frame.cpp describes the format) ----

constexpr unsigned one_at_a_time = 4;
constexpr unsigned skew_count = 5 << 3;
constexpr unsigned skew_slice = 6 << 3;
constexpr unsigned skew_length = 7 << 3;

const op_fingerprint fingerprint{7,
                                 3,
                                 chorus::collective::all_reduce,
                                 chorus::dtype::float32,
                                 chorus::reduce_op::sum,
                                 chorus::algo::ring};

bytes frame(std::uint64_t slice, const bytes& payload, std::uint32_t magic = frame_magic) {
  frame_header h = make_header(fingerprint, static_cast<std::uint32_t>(slice), slice,
                               static_cast<std::uint32_t>(payload.size()));
  h.magic = magic;
  bytes out;
  append(out, std::as_bytes(std::span(&h, 1)));
  append(out, payload);
  return out;
}

bytes abort_frame(std::string_view text) {
  frame_header h{};
  h.magic = frame_magic;
  h.kind = frame_abort;
  h.length = static_cast<std::uint32_t>(text.size());
  bytes out;
  append(out, std::as_bytes(std::span(&h, 1)));
  append(out, text);
  return out;
}

/// A check frame (frame_check) for the fingerprint's call; `length` bytes it must not have.
bytes check_frame(std::uint32_t length = 0) {
  frame_header h = check_header_of(make_header(fingerprint, 0, 0, 0));
  h.length = length;
  bytes out;
  append(out, std::as_bytes(std::span(&h, 1)));
  return out;
}

bytes stream(unsigned control, std::initializer_list<bytes> frames) {
  bytes out{static_cast<std::byte>(control)};
  for (const auto& f : frames) append(out, f);
  return out;
}

void frame_seeds() {
  seed("frame", "one_frame", stream(0, {frame(0, pattern(12))}));
  seed("frame", "three_frames_one_at_a_time",
       stream(2 | one_at_a_time, {frame(0, pattern(12)), frame(1, {}), frame(2, pattern(100))}));
  seed("frame", "four_frames_at_once",
       stream(3, {frame(0, pattern(4)), frame(1, pattern(8)), frame(2, pattern(16)),
                  frame(3, pattern(32))}));
  // Over tcp_small_payload: read straight into place instead of through the buffer.
  seed("frame", "large_payload", stream(0, {frame(0, pattern(20000))}));
  seed("frame", "large_then_small", stream(1, {frame(0, pattern(20000)), frame(1, pattern(8))}));
  seed("frame", "abort_frame", stream(0, {abort_frame("out of memory")}));
  seed("frame", "frame_then_abort",
       stream(1, {frame(0, pattern(12)), abort_frame("recv from rank 2 timed out")}));
  seed("frame", "check_then_frame", stream(1, {check_frame(), frame(0, pattern(12))}));
  seed("frame", "check_with_a_length", stream(0, {check_frame(12), frame(0, pattern(12))}));
  seed("frame", "bad_magic", stream(0, {frame(0, pattern(12), 0x12345678)}));
  seed("frame", "mismatched_count", stream(skew_count, {frame(0, pattern(12))}));
  seed("frame", "mismatched_slice",
       stream(1 | skew_slice, {frame(0, pattern(12)), frame(1, pattern(12))}));
  seed("frame", "shorter_than_posted", stream(skew_length, {frame(0, pattern(12))}));
  bytes cut = stream(0, {frame(0, pattern(100))});
  cut.resize(cut.size() - 50);
  seed("frame", "truncated_payload", cut);
  cut.resize(1 + 20);
  seed("frame", "truncated_header", cut);
}

// ---- shm_frame: control, payload lengths, records (shm_frame.cpp describes the format) ----

bytes le16(std::size_t v) {
  return {static_cast<std::byte>(v & 0xff), static_cast<std::byte>((v >> 8) & 0xff)};
}

/// A frame as a producer lays it in the ring at `pos`: tag, header, payload, padding.
bytes ring_frame(std::uint64_t pos, std::uint64_t slice, std::size_t length,
                 std::uint32_t magic = frame_magic) {
  bytes out(shm_tag_bytes);
  store_put_le(out.data(), shm_tag(pos, 0), shm_tag_bytes);
  append(out, frame(slice, pattern(length), magic));
  out.resize(shm_frame_bytes(length));
  return out;
}

/// A pull frame at ring position `pos`: the receiver reads `length` bytes at `address` of the
/// sender's memory (shm_frame.cpp maps 64 KiB of it at 0x600000000000).
bytes pull_frame(std::uint64_t pos, std::uint64_t slice, std::size_t length, std::uint64_t address) {
  bytes out(shm_tag_bytes);
  store_put_le(out.data(), shm_tag(pos, 0), shm_tag_bytes);
  bytes h = frame(slice, pattern(0), shm_pull_magic);
  store_put_le(h.data() + 4, length, 4);  // the header's length: the payload's, not the frame's
  h.resize(sizeof(frame_header));
  append(out, h);
  bytes d(sizeof(shm_pull_desc));
  store_put_le(d.data(), address, 8);
  store_put_le(d.data() + 8, length, 8);
  append(out, d);
  out.resize(shm_line);
  return out;
}

/// Records that write `b` in chunks of at most `chunk` bytes, pumping after each.
bytes writes(const bytes& b, std::size_t chunk = 65535) {
  bytes out;
  for (std::size_t at = 0; at < b.size(); at += chunk) {
    const std::size_t n = std::min(chunk, b.size() - at);
    out.push_back(std::byte{0});
    append(out, le16(n));
    append(out, std::span(b).subspan(at, n));
  }
  return out;
}

bytes lying_head(std::int64_t ahead) {
  bytes out{std::byte{1}};
  append(out, le16(static_cast<std::size_t>(ahead + 32768)));
  return out;
}

const bytes release_record = {std::byte{2}, std::byte{0}, std::byte{0}};

bytes ring_input(unsigned control, std::initializer_list<std::size_t> lengths,
                 std::initializer_list<bytes> records) {
  bytes out{static_cast<std::byte>(control)};
  for (std::size_t l : lengths) append(out, le16(l));
  for (const auto& r : records) append(out, r);
  return out;
}

void shm_frame_seeds() {
  constexpr unsigned lendable = 4;
  seed("shm_frame", "one_frame", ring_input(0, {12}, {writes(ring_frame(0, 0, 12))}));
  // 16 bytes of payload fill the frame's one line: complete with its tag, head unread.
  bytes second = ring_frame(64, 1, 100);
  seed("shm_frame", "one_line_then_two_chunks",
       ring_input(1, {16, 100}, {writes(ring_frame(0, 0, 16)), writes(second, 64)}));
  seed("shm_frame", "lent_and_released",
       ring_input(lendable, {200}, {writes(ring_frame(0, 0, 200)), release_record}));
  seed("shm_frame", "two_lent_released_in_order",
       ring_input(1 | lendable, {100, 300},
                  {writes(ring_frame(0, 0, 100)), writes(ring_frame(192, 1, 300)), release_record,
                   release_record}));
  // Longer than the 4096-byte ring: copied out as the producer writes it, lap after lap.
  seed("shm_frame", "longer_than_the_ring",
       ring_input(0, {6000}, {writes(ring_frame(0, 0, 6000), 2048)}));
  bytes start = ring_frame(0, 0, 3000);
  start.resize(64);
  seed("shm_frame", "head_ahead_of_the_bytes",
       ring_input(0, {3000}, {writes(start), lying_head(10000)}));
  seed("shm_frame", "head_behind_the_bytes",
       ring_input(0, {3000}, {writes(start), lying_head(-32768)}));
  bytes check(shm_tag_bytes);
  store_put_le(check.data(), shm_tag(0, 0), shm_tag_bytes);
  append(check, check_frame());
  check.resize(shm_line);
  seed("shm_frame", "check_then_frame", ring_input(0, {12}, {writes(check), writes(ring_frame(64, 0, 12))}));
  seed("shm_frame", "bad_magic", ring_input(0, {12}, {writes(ring_frame(0, 0, 12, 0x12345678))}));
  seed("shm_frame", "mismatched_slice", ring_input(0, {12}, {writes(ring_frame(0, 1, 12))}));
  constexpr unsigned pulls = 8;
  constexpr std::uint64_t area = 0x600000000000;
  seed("shm_frame", "pulled_then_copied",
       ring_input(1 | pulls, {3000, 100}, {writes(pull_frame(0, 0, 3000, area + 100)), writes(ring_frame(64, 1, 100))}));
  seed("shm_frame", "pulled_lendable", ring_input(pulls | lendable, {12000}, {writes(pull_frame(0, 0, 12000, area))}));
  seed("shm_frame", "pull_past_the_area", ring_input(pulls, {3000}, {writes(pull_frame(0, 0, 3000, area + 64000))}));
  seed("shm_frame", "pull_from_nowhere", ring_input(pulls, {3000}, {writes(pull_frame(0, 0, 3000, 4096))}));
  seed("shm_frame", "pull_unreadable", ring_input(0, {3000}, {writes(pull_frame(0, 0, 3000, area))}));
}

// ---- store_protocol: a key count byte (count - 1), then the bytes ----

bytes header(store_op op, std::size_t key_len, std::size_t value_len, std::int64_t arg = 0,
             store_status status = store_status::ok) {
  store_frame_header h;
  h.op = static_cast<std::uint8_t>(op);
  h.status = static_cast<std::uint8_t>(status);
  h.key_len = static_cast<std::uint32_t>(key_len);
  h.value_len = value_len;
  h.arg = arg;
  const auto head = store_encode_header(h);
  return {head.begin(), head.end()};
}

bytes keys(std::initializer_list<std::string> list, std::vector<std::uint32_t> owners = {}) {
  const std::vector<std::string> v(list);
  return store_encode_keys(v, owners);
}

bytes le(std::uint64_t v, std::size_t n) {
  bytes b(n);
  store_put_le(b.data(), v, n);
  return b;
}

bytes hello(std::uint32_t rank, std::uint32_t size = 2, std::uint32_t version = store_version) {
  bytes out = header(store_op::hello, 0, store_hello_bytes);
  append(out, le(store_magic, 4));
  append(out, le(version, 4));
  append(out, le(rank, 4));
  append(out, le(size, 4));
  return out;
}

bytes with_count(std::size_t count, const bytes& b) {
  bytes out{static_cast<std::byte>(count - 1)};
  append(out, b);
  return out;
}

void store_protocol_seeds() {
  seed("store_protocol", "hello", with_count(1, hello(0)));
  bytes set = header(store_op::set, 5, 3);
  append(set, std::string_view("key/0abc"));
  seed("store_protocol", "set", with_count(1, set));
  seed("store_protocol", "get_many_header", with_count(1, header(store_op::get_many, 0, 40, 500)));
  seed("store_protocol", "key_list",
       with_count(3, keys({"__chorus/hello/0", "__chorus/hello/1", "k"})));
  bytes values = le(3, 8);
  append(values, std::string_view("abc"));
  append(values, le(0, 8));
  seed("store_protocol", "value_reply", with_count(2, values));
  bytes missing = le(2, 4);
  append(missing, le(1, 4));
  append(missing, le(3, 4));
  seed("store_protocol", "missing_reply", with_count(4, missing));
  seed("store_protocol", "departed_none", with_count(4, le(0, 4)));
}

// ---- handshake: an initiator's hello (and more) to a responder, or a challenge to an initiator ----

bytes handshake_hello(auth_kind kind, std::uint32_t initiator, std::uint32_t responder) {
  auth_hello h;
  h.kind = kind;
  h.initiator = initiator;
  h.responder = responder;
  h.world = 2;
  const auto m1 = auth_encode(h);
  return {m1.begin(), m1.end()};
}

void handshake_seeds() {
  seed("handshake", "tcp_hello", handshake_hello(auth_kind::tcp, 0, 1));
  bytes with_proof = handshake_hello(auth_kind::tcp, 0, 1);
  append(with_proof, bytes(32, std::byte{0x11}));
  seed("handshake", "tcp_hello_and_proof", with_proof);
  seed("handshake", "store_hello", handshake_hello(auth_kind::store, 1, 0));
  bytes flagged = handshake_hello(auth_kind::tcp, 0, 1);
  flagged[7] = std::byte{auth_flag_encrypt};
  seed("handshake", "encrypting_hello", flagged);
  seed("handshake", "challenge", bytes(auth_challenge_bytes, std::byte{0x22}));
}

// ---- store_server: a client's whole conversation (the server serves a world of 2) ----

bytes request(store_op op, std::string_view key, const bytes& value = {}, std::int64_t arg = 0) {
  bytes out = header(op, key.size(), value.size(), arg);
  append(out, key);
  append(out, value);
  return out;
}

// The first byte: 1 runs the genuine handshake as rank 0 before the frames, 3 as rank 1,
// 0 sends the bytes from the first one on (the handshake parser reads them).
bytes conversation(std::initializer_list<bytes> frames, unsigned mode = 1) {
  bytes out{static_cast<std::byte>(mode)};
  for (const auto& f : frames) append(out, f);
  return out;
}

void store_server_seeds() {
  const bytes abc = {std::byte{'a'}, std::byte{'b'}, std::byte{'c'}};
  seed("store_server", "every_request",
       conversation({hello(0), request(store_op::set, "k", abc), request(store_op::get, "k"),
                     request(store_op::add, "c", {}, 5), request(store_op::add, "c", {}, -2),
                     request(store_op::get_many, "", keys({"k", "c", "__chorus/hello/0"}))}));
  seed("store_server", "waits_that_time_out",
       conversation({hello(1), request(store_op::get_many, "", keys({"absent", "k"})),
                     request(store_op::get, "absent")},
                    3));
  seed("store_server", "waits_on_owned_keys",
       conversation({hello(0), request(store_op::set, "mine", abc),
                     request(store_op::get_many, "", keys({"mine", "theirs"}, {0, 1}), 20)}));
  seed("store_server", "departed_then_one_with_a_key",
       conversation({hello(0), request(store_op::departed, ""), request(store_op::departed, "k")}));
  seed("store_server", "owner_outside_world",
       conversation({hello(0), request(store_op::get_many, "", keys({"k"}, {7}))}));
  seed("store_server", "wait_cut_short_by_hangup",
       conversation({hello(0), request(store_op::get, "absent", {}, 10)}));
  seed("store_server", "add_on_a_value_and_overflow",
       conversation({hello(0), request(store_op::set, "v", abc), request(store_op::add, "v"),
                     request(store_op::add, "n", {}, std::numeric_limits<std::int64_t>::max()),
                     request(store_op::add, "n", {}, 1)}));
  seed("store_server", "hello_other_version", conversation({hello(0, 2, store_version + 1)}));
  seed("store_server", "hello_other_world_size", conversation({hello(0, 3)}));
  seed("store_server", "hello_rank_outside_world", conversation({hello(5)}));
  seed("store_server", "hello_other_rank_than_proved", conversation({hello(1)}));
  seed("store_server", "hello_twice", conversation({hello(0), hello(0)}));
  seed("store_server", "set_before_hello", conversation({request(store_op::set, "k", abc)}));
  seed("store_server", "frames_without_handshake", conversation({hello(0), request(store_op::get, "k")}, 0));
  seed("store_server", "handshake_hello_then_bad_proof",
       conversation({handshake_hello(auth_kind::store, 0, 0), bytes(32, std::byte{0x5a})}, 0));
  seed("store_server", "key_over_limit",
       conversation({hello(0), header(store_op::get, max_store_key + 1, 0)}));
  bytes short_list = le(2, 4);
  append(short_list, le(1, 4));
  append(short_list, std::string_view("k"));
  seed("store_server", "malformed_key_list",
       conversation({hello(0), request(store_op::get_many, "", short_list)}));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR   (tests/fuzz/corpus)\n", argv[0]);
    return 2;
  }
  root = argv[1];
  frame_seeds();
  shm_frame_seeds();
  store_protocol_seeds();
  store_server_seeds();
  handshake_seeds();
  std::printf("wrote %d seeds under %s\n", written, argv[1]);
  return 0;
}
