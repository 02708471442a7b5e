// SPDX-License-Identifier: Apache-2.0
// The per-job secret that every chorus connection proves it knows (DESIGN.md "Security model").
#pragma once

#include <chorus/bootstrap/env.hpp>
#include <chorus/error.hpp>
#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace chorus {

/// The key of the mutual HMAC-SHA256 challenge that every connection of a job runs before a
/// byte of payload is accepted: the rendezvous store's and every data transport's.
///
/// Contract:
///  1. from_env() reads, in order: CHORUS_SECRET (the secret's bytes), CHORUS_SECRET_FILE (a
///     file holding them; one trailing newline is dropped; the file must not be readable by
///     group or others, as ssh demands of keys). With neither set, CHORUS_AUTH=none is the
///     explicit choice to run unauthenticated, logged once per process; anything else is
///     errc::invalid_argument telling the user what to set. chorus-run makes a secret per job.
///  2. A secret has 16 to 4096 bytes. Errors name the variable and the rule broken, never
///     the secret; nothing in chorus logs or prints it, and it is erased from memory
///     (OPENSSL_cleanse) when the last copy dies.
///  3. Proofs are compared in constant time (CRYPTO_memcmp).
///
/// **Example** (a launcher that is not chorus-run):
///   export CHORUS_SECRET=$(openssl rand -hex 32)   # then start every rank with it
class job_secret {
 public:
  static constexpr std::size_t min_bytes = 16;
  static constexpr std::size_t max_bytes = 4096;

  /// See contract point 1.
  static job_secret from_env();
  static job_secret from(const getenv_function& getenv_fn);
  /// A secret of these bytes; `source` names where they came from in error messages.
  static job_secret from_bytes(std::span<const std::byte> bytes,
                               std::string_view source = "the secret");
  /// No authentication: every proof is computed with an empty key, so anyone can forge it.
  /// Both ends must choose it; a rank with a secret refuses a rank without one.
  static job_secret none() noexcept { return job_secret(); }
  /// A fresh secret for a launcher to hand its ranks: 64 hex digits (256 random bits from
  /// OpenSSL's RAND_bytes).
  static std::string generate_text();
  /// Whether the environment already decides (CHORUS_SECRET, CHORUS_SECRET_FILE or
  /// CHORUS_AUTH is set): a launcher makes a secret only when it does not.
  static bool chosen_in_env();

  /// False only for none().
  bool authenticated() const noexcept { return authenticated_; }
  /// The key bytes; empty for none().
  std::span<const unsigned char> key() const noexcept { return key_; }

  job_secret(const job_secret& other) = default;
  job_secret& operator=(const job_secret& other);
  job_secret(job_secret&& other) noexcept;
  job_secret& operator=(job_secret&& other) noexcept;
  ~job_secret();

 private:
  job_secret() noexcept = default;
  void erase() noexcept;

  std::vector<unsigned char> key_;
  bool authenticated_ = false;
};

}  // namespace chorus

#include <chorus/bootstrap/detail/auth_impl.hpp>
