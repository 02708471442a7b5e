// SPDX-License-Identifier: Apache-2.0
// Definitions behind chorus/bootstrap/auth.hpp.
#pragma once

#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chorus/bootstrap/auth.hpp>
#include <chorus/error.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <system_error>
#include <utility>

namespace chorus {
namespace detail {

[[noreturn]] inline void secret_error(const std::string& what) {
  throw error(errc::invalid_argument, what, {}, std::nullopt, "job_secret");
}

/// The bytes of the secret file at `path`, checked as job_secret's contract says.
inline std::vector<unsigned char> read_secret_file(const std::string& path) {
  const std::string name = "CHORUS_SECRET_FILE='" + path + "'";
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) secret_error(name + " cannot be opened: " + std::generic_category().message(errno));
  struct closer {
    int fd;
    ~closer() { ::close(fd); }
  } close_it{fd};
  struct stat st{};
  if (::fstat(fd, &st) != 0) secret_error(name + ": fstat: " + std::generic_category().message(errno));
  if (!S_ISREG(st.st_mode)) secret_error(name + " is not a regular file");
  if ((st.st_mode & 077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    secret_error(name + " is readable or writable by group or others (mode " + mode +
                 "); make it private: chmod 600 '" + path + "'");
  }
  std::vector<unsigned char> bytes(job_secret::max_bytes + 3);
  std::size_t have = 0;
  while (have < bytes.size()) {
    ssize_t n = ::read(fd, bytes.data() + have, bytes.size() - have);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      secret_error(name + ": read: " + std::generic_category().message(errno));
    }
    have += static_cast<std::size_t>(n);
  }
  bytes.resize(have);
  // One trailing newline (as echo and editors leave it) is not part of the secret.
  if (!bytes.empty() && bytes.back() == '\n') bytes.pop_back();
  if (!bytes.empty() && bytes.back() == '\r') bytes.pop_back();
  return bytes;
}

}  // namespace detail

inline job_secret job_secret::from_env() {
  return from([](const char* name) { return std::getenv(name); });
}

inline job_secret job_secret::from(const getenv_function& getenv_fn) {
  auto value = [&](const char* name) -> std::string_view {
    const char* v = getenv_fn(name);
    return v != nullptr ? std::string_view(v) : std::string_view();
  };
  const std::string_view secret = value("CHORUS_SECRET");
  const std::string_view file = value("CHORUS_SECRET_FILE");
  const std::string_view mode = value("CHORUS_AUTH");
  if (!mode.empty() && mode != "hmac" && mode != "none") {
    detail::secret_error("CHORUS_AUTH='" + std::string(mode) + "' is neither 'hmac' nor 'none'");
  }
  if (!secret.empty() && !file.empty()) {
    detail::secret_error("both CHORUS_SECRET and CHORUS_SECRET_FILE are set; set one");
  }
  if (mode == "none") {
    if (!secret.empty() || !file.empty()) {
      detail::secret_error("CHORUS_AUTH=none but a secret is set (CHORUS_SECRET or "
                           "CHORUS_SECRET_FILE); unset one of them");
    }
    // Logged once per process: running open to the network must never go unnoticed.
    static std::atomic<bool> logged{false};
    if (!logged.exchange(true)) {
      std::fputs("chorus: CHORUS_AUTH=none: connections are NOT authenticated; anyone who can "
                 "reach this job's ports can join it or send it data\n",
                 stderr);
    }
    return none();
  }
  if (!secret.empty()) return from_bytes(std::as_bytes(std::span(secret)), "CHORUS_SECRET");
  if (!file.empty()) {
    auto bytes = detail::read_secret_file(std::string(file));
    job_secret s = from_bytes(std::as_bytes(std::span(bytes)),
                              "CHORUS_SECRET_FILE='" + std::string(file) + "'");
    OPENSSL_cleanse(bytes.data(), bytes.size());
    return s;
  }
  detail::secret_error(
      "no job secret: chorus authenticates every connection with a secret shared by the ranks "
      "of a job. Set CHORUS_SECRET to the same value on every rank (e.g. export "
      "CHORUS_SECRET=$(openssl rand -hex 32)) or CHORUS_SECRET_FILE to a private file holding "
      "it; chorus-run sets one per job. CHORUS_AUTH=none runs without authentication");
}

inline job_secret job_secret::from_bytes(std::span<const std::byte> bytes, std::string_view source) {
  if (bytes.size() < min_bytes || bytes.size() > max_bytes) {
    detail::secret_error(std::string(source) + " has " + std::to_string(bytes.size()) +
                         " bytes; a secret needs 16 to 4096 (e.g. openssl rand -hex 32)");
  }
  job_secret s;
  s.key_.resize(bytes.size());
  std::memcpy(s.key_.data(), bytes.data(), bytes.size());
  s.authenticated_ = true;
  return s;
}

inline std::string job_secret::generate_text() {
  unsigned char raw[32];
  if (RAND_bytes(raw, sizeof raw) != 1) {
    throw error(errc::system, "RAND_bytes could not make a job secret", {}, std::nullopt,
                "RAND_bytes");
  }
  static constexpr char digits[] = "0123456789abcdef";
  std::string text;
  for (unsigned char b : raw) {
    text += digits[b >> 4];
    text += digits[b & 15];
  }
  OPENSSL_cleanse(raw, sizeof raw);
  return text;
}

inline bool job_secret::chosen_in_env() {
  for (const char* name : {"CHORUS_SECRET", "CHORUS_SECRET_FILE", "CHORUS_AUTH"}) {
    const char* v = std::getenv(name);
    if (v != nullptr && *v != '\0') return true;
  }
  return false;
}

inline job_secret& job_secret::operator=(const job_secret& other) {
  if (this != &other) {
    erase();
    key_ = other.key_;
    authenticated_ = other.authenticated_;
  }
  return *this;
}

inline job_secret::job_secret(job_secret&& other) noexcept
    : key_(std::move(other.key_)), authenticated_(other.authenticated_) {
  other.key_.clear();
}

inline job_secret& job_secret::operator=(job_secret&& other) noexcept {
  if (this != &other) {
    erase();
    key_ = std::move(other.key_);
    authenticated_ = other.authenticated_;
    other.key_.clear();
  }
  return *this;
}

inline job_secret::~job_secret() { erase(); }

inline void job_secret::erase() noexcept {
  if (!key_.empty()) OPENSSL_cleanse(key_.data(), key_.size());
  key_.clear();
}

}  // namespace chorus
