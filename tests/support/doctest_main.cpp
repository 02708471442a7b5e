// SPDX-License-Identifier: Apache-2.0
// The one doctest main shared by every test binary.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <chorus/bootstrap/auth.hpp>

#include <cstdlib>

int main(int argc, char** argv) {
  // Every store and transport needs the job's secret, as in production; the test's ranks
  // (threads or forked children) share this one unless the test sets its own.
  if (!chorus::job_secret::chosen_in_env()) {
    ::setenv("CHORUS_SECRET", chorus::job_secret::generate_text().c_str(), 1);
  }
  return doctest::Context(argc, argv).run();
}
