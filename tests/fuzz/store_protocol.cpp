// SPDX-License-Identifier: Apache-2.0
// Fuzz target: the rendezvous store's wire decoders (store_protocol.hpp), every one fed the
// same bytes: a request header (checked before and after hello), a get_many key list with
// its owners (the server's side) and the replies the client decodes: values, missing keys
// and departed ranks.
//
// Input: one byte, the number of keys the get_many asked for, or of ranks (1 to 256), then
// the bytes.
//
// What must hold: no decoder reads past the bytes it is given, or allocates more than they can
// describe (ASan); whatever a decoder accepts re-encodes to exactly those bytes and keeps the
// limits the server and the client rely on.
#include <chorus/bootstrap/detail/store_protocol.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <string>
#include <vector>

namespace {

using namespace chorus::detail;

[[noreturn]] void fail(const char* why) {
  std::fprintf(stderr, "fuzz store_protocol: %s\n", why);
  std::abort();
}

bool same(std::span<const std::byte> a, std::span<const std::byte> b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin());
}

void request_header(std::span<const std::byte> in) {
  if (in.size() < store_header_bytes) return;
  const store_frame_header h = store_decode_header(in.data());
  if (!same(store_encode_header(h), in.first(store_header_bytes))) {
    fail("a header does not re-encode to its bytes");
  }
  if (!store_check_request(h, false)) {
    if (h.op != static_cast<std::uint8_t>(store_op::hello) || h.key_len != 0 ||
        h.value_len != store_hello_bytes) {
      fail("a first frame other than a 16-byte hello was accepted");
    }
  }
  if (!store_check_request(h, true)) {
    // The server allocates key_len + value_len bytes for the body on the strength of this.
    if (h.key_len > max_store_key || h.value_len > max_store_value) {
      fail("a request over the key or value limit was accepted");
    }
    if (h.op == static_cast<std::uint8_t>(store_op::get_many) && h.value_len < 4) {
      fail("a get_many too short for its key count was accepted");
    }
  }
}

void key_list(std::span<const std::byte> in) {
  std::string why;
  const auto list = store_decode_keys(in, std::size_t{1} << 16, why);
  if (!list) {
    if (why.empty()) fail("a key list was refused without a reason");
    return;
  }
  if (list->owners.size() != list->keys.size()) fail("a key list without an owner per key");
  for (const auto& k : list->keys) {
    if (k.empty() || k.size() > max_store_key) fail("a key list with a bad key was accepted");
  }
  std::vector<std::string> sorted = list->keys;
  std::sort(sorted.begin(), sorted.end());
  if (std::unique(sorted.begin(), sorted.end()) != sorted.end()) {
    fail("a key list naming a key twice was accepted");
  }
  if (!same(store_encode_keys(list->keys, list->owners), in)) {
    fail("a key list does not re-encode to its bytes");
  }
}

void value_reply(std::span<const std::byte> in, std::size_t count) {
  std::vector<std::vector<std::byte>> values;
  if (store_decode_values(in, count, values)) return;
  if (values.size() != count) fail("a value list of the wrong length was accepted");
  std::vector<std::byte> again;
  for (const auto& v : values) {
    std::byte len[8];
    store_put_le(len, v.size(), 8);
    again.insert(again.end(), len, len + 8);
    again.insert(again.end(), v.begin(), v.end());
  }
  if (!same(again, in)) fail("a value list does not re-encode to its bytes");
}

// A list of indices (missing keys, departed ranks): exactly its bytes, each index below
// `count` and above the one before.
void check_indices(std::span<const std::byte> in, std::size_t count,
                   const std::vector<std::size_t>& list, const char* what) {
  if (in.size() != 4 + 4 * list.size()) {
    std::fprintf(stderr, "fuzz store_protocol: %s\n", what);
    fail("a list of the wrong length was accepted");
  }
  for (std::size_t i = 0; i < list.size(); ++i) {
    if (list[i] >= count || (i > 0 && list[i] <= list[i - 1])) {
      std::fprintf(stderr, "fuzz store_protocol: %s\n", what);
      fail("a list with a bad index was accepted");
    }
  }
}

void missing_reply(std::span<const std::byte> in, std::size_t count) {
  std::vector<std::size_t> missing;
  if (store_decode_missing(in, count, missing)) return;
  if (missing.empty()) fail("an empty missing-key list was accepted");
  check_indices(in, count, missing, "missing keys");
}

void departed_reply(std::span<const std::byte> in, std::size_t world) {
  std::vector<std::size_t> ranks;
  if (store_decode_departed(in, world, ranks)) return;
  check_indices(in, world, ranks, "departed ranks");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::size_t count = std::size_t{data[0]} + 1;
  const auto in = std::as_bytes(std::span(data + 1, size - 1));
  request_header(in);
  key_list(in);
  value_reply(in, count);
  missing_reply(in, count);
  departed_reply(in, count);
  return 0;
}
