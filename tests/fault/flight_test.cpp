// SPDX-License-Identifier: Apache-2.0
// The flight recorder and tools/chorus-flight: after a mismatched or a missing call, the
// dumps every rank writes (CHORUS_FLIGHT_RECORDER_DIR) name the first operation the ranks
// diverge on, the calls each made, and the ranks that never reached it.
#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "support/multirank.hpp"

using namespace chorus;

namespace {

struct tool_result {
  int exit_code = -1;
  std::string out;
};

tool_result chorus_flight(const std::string& dir) {
  const std::string cmd = std::string("python3 '") + CHORUS_FLIGHT_PATH + "' '" + dir + "' 2>&1";
  tool_result r;
  if (std::FILE* p = ::popen(cmd.c_str(), "r")) {
    char buf[4096];
    while (std::size_t n = std::fread(buf, 1, sizeof buf, p)) r.out.append(buf, n);
    const int st = ::pclose(p);
    r.exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  }
  return r;
}

std::string fresh_dir() {
  char tmpl[] = "/tmp/chorus-flight-test-XXXXXX";
  REQUIRE(::mkdtemp(tmpl) != nullptr);
  return tmpl;
}

std::int64_t system_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// The integers that follow each `key` in `text`, in order.
std::vector<std::int64_t> numbers_after(const std::string& text, const std::string& key) {
  std::vector<std::int64_t> out;
  for (auto at = text.find(key); at != std::string::npos; at = text.find(key, at + 1)) {
    out.push_back(std::strtoll(text.c_str() + at + key.size(), nullptr, 10));
  }
  return out;
}

}  // namespace

TEST_CASE("a mismatched count: the merged records name the op, both calls and the ranks") {
  const std::string dir = fresh_dir();
  test::run_options o;
  o.env = {{"CHORUS_FLIGHT_RECORDER_DIR", dir}, {"CHORUS_ALGO", "ring"}};
  test::run_ranks(
      4,
      [](communicator& comm) {
        std::vector<float> v(20, 1.0f);
        // Every rank fails: the ranks that compare the counts with errc::mismatch, the others
        // with their abort (possibly in the call before, which a peer's abort overtook).
        try {
          for (int i = 0; i < 5; ++i) comm.all_reduce(std::span(v));
          comm.all_reduce(std::span(v).first(comm.rank() == 3 ? 20 : 10));
          RANK_CHECK(false);
        } catch (const error&) {
        }
      },
      o);
  const auto r = chorus_flight(dir);
  INFO(r.out);
  CHECK(r.exit_code == 1);
  CHECK(r.out.find("diverges") != std::string::npos);
  CHECK(r.out.find("rank 3 called all_reduce(count=20, float, sum)") != std::string::npos);
  // Ranks 0 and 1 may still be in the call before when the abort reaches them: they are
  // then named as never reaching it, and rank 2 alone as calling count=10.
  CHECK(r.out.find(" called all_reduce(count=10, float, sum)") != std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST_CASE("a call one rank never makes: the merged records name it and that rank") {
  const std::string dir = fresh_dir();
  test::run_options o;
  o.env = {{"CHORUS_FLIGHT_RECORDER_DIR", dir}, {"CHORUS_TIMEOUT", "10"}};
  test::run_ranks(
      4,
      [&](communicator& comm) {
        std::vector<int> v(100, 1);
        for (int i = 0; i < 3; ++i) comm.all_reduce(std::span(v));
        if (comm.rank() == 2) {
          // Leaves without the barrier, its record written on request first.
          std::ofstream(dir + "/chorus-flight-world-rank2.json") << comm.flight_record();
          std::this_thread::sleep_for(std::chrono::milliseconds(200));
          return;
        }
        try {
          comm.barrier();
          RANK_CHECK(false);
        } catch (const error&) {
        }
      },
      o);
  const auto r = chorus_flight(dir);
  INFO(r.out);
  CHECK(r.exit_code == 1);
  CHECK(r.out.find("(barrier): rank 2 never reached it") != std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST_CASE("a record on request holds the last operations, oldest first, as JSON") {
  test::run_options o;
  o.env = {{"CHORUS_FLIGHT_RECORDER_SIZE", "4"}};
  test::run_ranks(
      2,
      [](communicator& comm) {
        std::vector<double> v(7, 1.0);
        const std::int64_t before = system_us();
        for (int i = 0; i < 6; ++i) comm.all_reduce(std::span(v), {.op = max});
        comm.broadcast(std::span(v), 1);
        const std::string j = comm.flight_record();
        const std::int64_t after = system_us();
        // Every time is system-clock microseconds within the calls, in order per entry.
        const auto q = numbers_after(j, "\"queued_us\": "), s = numbers_after(j, "\"started_us\": "),
                   e = numbers_after(j, "\"ended_us\": ");
        RANK_CHECK(q.size() == 4 && s.size() == 4 && e.size() == 4);
        for (std::size_t k = 0; k < q.size() && k < s.size() && k < e.size(); ++k) {
          RANK_CHECK(before <= q[k] && q[k] <= s[k] && s[k] <= e[k] && e[k] <= after);
          if (k > 0) RANK_CHECK(e[k - 1] <= q[k]);
        }
        RANK_CHECK(j.find("\"rank\": " + std::to_string(comm.rank())) != std::string::npos);
        RANK_CHECK(j.find("\"communicator\": \"world\"") != std::string::npos);
        // 4 entries kept: three all_reduces, then the broadcast, all done.
        std::size_t n = 0;
        for (auto at = j.find("\"seq\""); at != std::string::npos; at = j.find("\"seq\"", at + 1)) ++n;
        RANK_CHECK(n == 4);
        RANK_CHECK(j.rfind("\"kind\": \"broadcast\"") > j.rfind("\"kind\": \"all_reduce\""));
        RANK_CHECK(j.find("\"state\": \"done\"") != std::string::npos);
        RANK_CHECK(j.find("\"dtype\": \"double\"") != std::string::npos);
      },
      o);
}
