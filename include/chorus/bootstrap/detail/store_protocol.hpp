// SPDX-License-Identifier: Apache-2.0
// The rendezvous store's wire format: length-prefixed binary frames and their limits.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace chorus::detail {

// Every frame, request or reply, is a 24-byte header followed by key_len bytes of key and
// value_len bytes of value. Integers are little-endian whatever the host, so that a mixed
// cluster agrees.
//
//   offset 0  u8  op        store_op; a reply echoes its request's op
//   offset 1  u8  status    store_status; 0 in requests
//   offset 2  u16 reserved  0
//   offset 4  u32 key_len   <= max_store_key (4 KiB)
//   offset 8  u64 value_len <= max_store_value (64 MiB) in requests
//   offset 16 i64 arg       op-specific: wait in ms (get, get_many), delta / result (add),
//                           errc (error replies)
//
// Conversation: the client's first frame is hello {magic, version, rank, size} (value of 16
// bytes); the server answers ok or error. Then strict request/reply, one at a time.
//   set      key, value             -> ok
//   get      key, arg = wait ms     -> ok + value | timeout
//   add      key, arg = delta       -> ok, arg = new value | error (not a counter, overflow)
//   get_many value = u32 n, n x (u32 owner, u32 len, key bytes), arg = wait ms
//            -> ok + value = n x (u64 len, value bytes)
//             | timeout + value = u32 m, m x u32 index of a key still missing
//             | left + value = u32 m, m x u32 index of a key still missing whose owner left
//   A key's owner is the rank that will set it (store_any_owner: any rank). Once an owner
//   that said hello has disconnected, its missing keys can never arrive, so the server
//   answers `left` at once instead of letting the wait run to its deadline.
//   departed -> ok + value = u32 m, m x u32 rank: the ranks that said hello and then
//            disconnected, ascending (m may be 0). Set-up steps that wait outside the
//            store (a TCP dial or accept) ask, so that a peer gone mid-set-up ends them.
inline constexpr std::size_t store_header_bytes = 24;
inline constexpr std::size_t max_store_key = 4096;
inline constexpr std::size_t max_store_value = std::size_t{64} << 20;

/// The most keys one get_many waits for in a world of `world` ranks: a round's (one key per
/// rank), and at least 65,536. The server keeps a wait's keys as strings while it waits; 6.1 M
/// keys of 3 bytes in one 64 MiB list took it about 350 MB and 9 s, serving nobody else.
inline std::size_t store_max_wait_keys(std::size_t world) {
  return std::max<std::size_t>(world, std::size_t{1} << 16);
}
inline constexpr std::size_t max_store_error_text = 65536;
inline constexpr std::uint32_t store_magic = 0x53524843;  // "CHRS" as little-endian bytes
inline constexpr std::uint32_t store_version = 2;  // 2: get_many keys name their owners
inline constexpr std::size_t store_hello_bytes = 16;
// Longest a server-side wait may be asked to last; a larger request is clamped.
inline constexpr std::int64_t max_store_wait_ms = std::int64_t{7} * 24 * 3600 * 1000;

enum class store_op : std::uint8_t {
  hello = 1,
  set = 2,
  get = 3,
  add = 4,
  get_many = 5,
  departed = 6
};
enum class store_status : std::uint8_t { ok = 0, timeout = 1, error = 2, left = 3 };
/// The owner of a key that any rank may set.
inline constexpr std::uint32_t store_any_owner = 0xffffffff;

inline const char* to_string(store_op op) noexcept {
  switch (op) {
    case store_op::hello:
      return "hello";
    case store_op::set:
      return "set";
    case store_op::get:
      return "get";
    case store_op::add:
      return "add";
    case store_op::get_many:
      return "get_many";
    case store_op::departed:
      return "departed";
  }
  return "unknown";
}

struct store_frame_header {
  std::uint8_t op = 0;
  std::uint8_t status = 0;
  std::uint16_t reserved = 0;
  std::uint32_t key_len = 0;
  std::uint64_t value_len = 0;
  std::int64_t arg = 0;
};

inline void store_put_le(std::byte* out, std::uint64_t v, std::size_t bytes) noexcept {
  for (std::size_t i = 0; i < bytes; ++i) out[i] = static_cast<std::byte>((v >> (8 * i)) & 0xff);
}

inline std::uint64_t store_get_le(const std::byte* in, std::size_t bytes) noexcept {
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < bytes; ++i)
    v |= std::uint64_t{std::to_integer<std::uint8_t>(in[i])} << (8 * i);
  return v;
}

inline std::array<std::byte, store_header_bytes> store_encode_header(
    const store_frame_header& h) noexcept {
  std::array<std::byte, store_header_bytes> out{};
  store_put_le(out.data() + 0, h.op, 1);
  store_put_le(out.data() + 1, h.status, 1);
  store_put_le(out.data() + 2, h.reserved, 2);
  store_put_le(out.data() + 4, h.key_len, 4);
  store_put_le(out.data() + 8, h.value_len, 8);
  store_put_le(out.data() + 16, static_cast<std::uint64_t>(h.arg), 8);
  return out;
}

inline store_frame_header store_decode_header(const std::byte* in) noexcept {
  store_frame_header h;
  h.op = static_cast<std::uint8_t>(store_get_le(in + 0, 1));
  h.status = static_cast<std::uint8_t>(store_get_le(in + 1, 1));
  h.reserved = static_cast<std::uint16_t>(store_get_le(in + 2, 2));
  h.key_len = static_cast<std::uint32_t>(store_get_le(in + 4, 4));
  h.value_len = store_get_le(in + 8, 8);
  h.arg = static_cast<std::int64_t>(store_get_le(in + 16, 8));
  return h;
}

/// Why a request header is unacceptable, or nullopt when it is fine. Checked before a byte of
/// body is allocated, so a hostile length cannot make the server allocate.
/// `said_hello`: before hello only a hello frame of exactly 16 bytes is accepted.
inline std::optional<std::string> store_check_request(const store_frame_header& h,
                                                      bool said_hello) {
  auto op = static_cast<store_op>(h.op);
  if (!said_hello) {
    if (op != store_op::hello)
      return "the first frame (op " + std::to_string(h.op) + ") is not hello";
    if (h.key_len != 0 || h.value_len != store_hello_bytes) return "malformed hello";
  }
  if (h.status != 0 || h.reserved != 0) return "nonzero status or reserved bits in a request";
  if (!said_hello) return std::nullopt;
  auto key_ok = [&] { return h.key_len >= 1 && h.key_len <= max_store_key; };
  switch (op) {
    case store_op::hello:
      return "hello sent twice";
    case store_op::set:
      if (!key_ok()) return "key of " + std::to_string(h.key_len) + " bytes (limit 4096)";
      if (h.value_len > max_store_value) {
        return "value of " + std::to_string(h.value_len) + " bytes (limit 64 MiB)";
      }
      return std::nullopt;
    case store_op::get:
    case store_op::add:
      if (!key_ok()) return "key of " + std::to_string(h.key_len) + " bytes (limit 4096)";
      if (h.value_len != 0) return std::string(to_string(op)) + " with a value";
      return std::nullopt;
    case store_op::get_many:
      if (h.key_len != 0) return "get_many with a key";
      if (h.value_len < 4 || h.value_len > max_store_value) {
        return "get_many list of " + std::to_string(h.value_len) + " bytes";
      }
      return std::nullopt;
    case store_op::departed:
      if (h.key_len != 0 || h.value_len != 0) return "departed with a key or value";
      return std::nullopt;
  }
  return "unknown op " + std::to_string(h.op);
}

/// A key that `keys` names twice, if any. A get_many may not: its reply carries each named
/// key's value, so a key named again and again would let a few bytes of request ask for a
/// reply thousands of times larger than anything stored (6500 names of one 32 KiB value:
/// 213 MB).
template <class Key>
std::optional<std::string_view> store_key_named_twice(std::span<const Key> keys) {
  std::vector<std::string_view> sorted(keys.begin(), keys.end());
  std::sort(sorted.begin(), sorted.end());
  auto twice = std::adjacent_find(sorted.begin(), sorted.end());
  if (twice == sorted.end()) return std::nullopt;
  return *twice;
}

/// What a get_many waits for: keys[i], which rank owners[i] sets (or store_any_owner).
struct store_wait_list {
  std::vector<std::string> keys;
  std::vector<std::uint32_t> owners;
};

/// Encodes a list of keys for get_many; `owners` is empty (any rank sets each key) or names
/// the owner of every key.
inline std::vector<std::byte> store_encode_keys(std::span<const std::string> keys,
                                                std::span<const std::uint32_t> owners = {}) {
  std::size_t total = 4;
  for (const auto& k : keys) total += 8 + k.size();
  std::vector<std::byte> out(total);
  std::byte* p = out.data();
  store_put_le(p, keys.size(), 4);
  p += 4;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    store_put_le(p, owners.empty() ? store_any_owner : owners[i], 4);
    store_put_le(p + 4, keys[i].size(), 4);
    p += 8;
    for (char c : keys[i]) *p++ = static_cast<std::byte>(c);
  }
  return out;
}

/// Decodes a get_many key list of at most `max_keys` keys; nullopt, with `why` saying what
/// was wrong, unless every length is in bounds, the list fills the buffer exactly and no key
/// appears twice. Owners are not checked against the world size here: the server, which
/// knows it, does that.
inline std::optional<store_wait_list> store_decode_keys(std::span<const std::byte> in, std::size_t max_keys,
                                                        std::string& why) {
  auto bad = [&](std::string text) {
    why = std::move(text);
    return std::nullopt;
  };
  if (in.size() < 4) return bad("a list of " + std::to_string(in.size()) + " bytes");
  std::uint64_t n = store_get_le(in.data(), 4);
  std::size_t at = 4;
  // Each key takes at least 9 bytes, so a count larger than that allows is a lie.
  if (n == 0 || n > (in.size() - 4) / 9) {
    return bad(std::to_string(n) + " keys in a list of " + std::to_string(in.size()) + " bytes");
  }
  if (n > max_keys) return bad(std::to_string(n) + " keys (at most " + std::to_string(max_keys) + " in one wait)");
  store_wait_list list;
  list.keys.reserve(static_cast<std::size_t>(n));
  list.owners.reserve(static_cast<std::size_t>(n));
  for (std::uint64_t i = 0; i < n; ++i) {
    if (in.size() - at < 8) return bad("key " + std::to_string(i) + " past the list's end");
    list.owners.push_back(static_cast<std::uint32_t>(store_get_le(in.data() + at, 4)));
    auto len = static_cast<std::size_t>(store_get_le(in.data() + at + 4, 4));
    at += 8;
    if (len == 0 || len > max_store_key || in.size() - at < len) {
      return bad("key " + std::to_string(i) + " of " + std::to_string(len) + " bytes (1 to " +
                 std::to_string(max_store_key) + ", within the list)");
    }
    list.keys.emplace_back(reinterpret_cast<const char*>(in.data() + at), len);
    at += len;
  }
  if (at != in.size()) return bad(std::to_string(in.size() - at) + " bytes after the last key");
  if (auto twice = store_key_named_twice(std::span<const std::string>(list.keys))) {
    return bad("key '" + std::string(twice->substr(0, 64)) + "' named twice");
  }
  return list;
}

/// Decodes a get_many ok reply to a list of `count` keys (n x (u64 len, bytes)) into `values`,
/// replacing its contents. Returns why the reply is malformed, or nullopt. Every length is
/// checked against the bytes left before a byte is copied, so a reply cannot make the client
/// read past its end.
inline std::optional<std::string> store_decode_values(std::span<const std::byte> in,
                                                      std::size_t count,
                                                      std::vector<std::vector<std::byte>>& values) {
  values.clear();
  std::size_t at = 0;
  for (std::size_t i = 0; i < count; ++i) {
    if (in.size() - at < 8) return "truncated value list";
    std::uint64_t len = store_get_le(in.data() + at, 8);
    at += 8;
    if (len > in.size() - at) return "value length past the end of the reply";
    auto first = in.begin() + static_cast<std::ptrdiff_t>(at);
    values.emplace_back(first, first + static_cast<std::ptrdiff_t>(len));
    at += static_cast<std::size_t>(len);
  }
  if (at != in.size()) return "trailing bytes after the value list";
  return std::nullopt;
}

/// Encodes a list of u32 indices (u32 m, m x u32): missing keys, departed ranks.
inline std::vector<std::byte> store_encode_indices(const std::vector<std::uint32_t>& indices) {
  std::vector<std::byte> out(4 + 4 * indices.size());
  store_put_le(out.data(), indices.size(), 4);
  for (std::size_t i = 0; i < indices.size(); ++i) store_put_le(out.data() + 4 + 4 * i, indices[i], 4);
  return out;
}

/// Decodes a list of u32 indices below `count`, strictly increasing (u32 m, m x u32), into
/// `out`, replacing its contents; returns why the list is malformed, or nullopt. `allow_empty`:
/// whether m may be 0. A repeated or unsorted index is malformed: the server lists indices
/// in increasing order, and a repeat would name a rank twice in a message.
inline std::optional<std::string> store_decode_indices(std::span<const std::byte> in,
                                                       std::size_t count, bool allow_empty,
                                                       std::vector<std::size_t>& out) {
  if (in.size() < 4) return "truncated list";
  std::uint64_t m = store_get_le(in.data(), 4);
  if ((m == 0 && !allow_empty) || m > count || in.size() != 4 + 4 * m) return "malformed list";
  out.clear();
  for (std::size_t i = 0; i < m; ++i) {
    std::uint64_t index = store_get_le(in.data() + 4 + 4 * i, 4);
    if (index >= count) return "index out of range in a list";
    if (!out.empty() && index <= out.back()) return "indices out of order in a list";
    out.push_back(static_cast<std::size_t>(index));
  }
  return std::nullopt;
}

/// Decodes a get_many timeout or left reply to a list of `count` keys into `missing`: the
/// indices of the keys still missing, at least one.
inline std::optional<std::string> store_decode_missing(std::span<const std::byte> in,
                                                       std::size_t count,
                                                       std::vector<std::size_t>& missing) {
  if (auto bad = store_decode_indices(in, count, false, missing)) return *bad + " of missing keys";
  return std::nullopt;
}

/// Decodes a departed reply in a world of `world` ranks into `ranks` (possibly none).
inline std::optional<std::string> store_decode_departed(std::span<const std::byte> in,
                                                        std::size_t world,
                                                        std::vector<std::size_t>& ranks) {
  if (auto bad = store_decode_indices(in, world, true, ranks)) return *bad + " of departed ranks";
  return std::nullopt;
}

}  // namespace chorus::detail
