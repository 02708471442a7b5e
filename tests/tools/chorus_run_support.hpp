// SPDX-License-Identifier: Apache-2.0
// Helpers for the chorus-run tests: run the built binary through the shell, capture its
// output, exit code and time, and watch processes it started.
#pragma once

#include <doctest/doctest.h>

#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace chorus::test {

struct run_result {
  int exit_code = -1;  // as a shell reports it: 128+sig when killed by a signal
  std::string out;
  std::string err;
  double seconds = 0;
};

// A scratch directory for one test, removed at the end.
struct scratch_dir {
  std::string path;
  scratch_dir() {
    std::string templ = "/tmp/chorus-run-test-XXXXXX";
    REQUIRE(::mkdtemp(templ.data()) != nullptr);
    path = templ;
  }
  ~scratch_dir() { [[maybe_unused]] int rc = std::system(("rm -rf '" + path + "'").c_str()); }
  scratch_dir(const scratch_dir&) = delete;
  scratch_dir& operator=(const scratch_dir&) = delete;
};

inline std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

inline bool contains(const std::vector<std::string>& lines, const std::string& line) {
  for (const auto& l : lines) {
    if (l == line) return true;
  }
  return false;
}

// Runs a shell command line and captures its stdout and stderr.
inline run_result run_shell(const std::string& script) {
  scratch_dir dir;
  std::string cmd = "( " + script + " ) >'" + dir.path + "/out' 2>'" + dir.path + "/err'";
  auto start = std::chrono::steady_clock::now();
  int status = std::system(cmd.c_str());
  auto stop = std::chrono::steady_clock::now();
  run_result r;
  r.seconds = std::chrono::duration<double>(stop - start).count();
  if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  r.out = read_file(dir.path + "/out");
  r.err = read_file(dir.path + "/err");
  return r;
}

// The chorus-run binary, quoted for the shell.
inline std::string chorus_run() { return std::string("'") + CHORUS_RUN_PATH + "'"; }

// Runs chorus-run with the given arguments (a shell-quoted string).
inline run_result run(const std::string& args) { return run_shell(chorus_run() + " " + args); }

// chorus-run refuses `args` as bad usage: exit 2, its name first, the usage text, and nothing
// started that could print to stdout.
inline void check_usage_error(const char* args) {
  CAPTURE(args);
  auto r = run(args);
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("chorus-run: ") == 0);
  CHECK(r.err.find("usage: chorus-run") != std::string::npos);
  CHECK(r.out.empty());
}

// True once a process no longer runs: gone, or a zombie waiting for its new parent.
inline bool process_gone(pid_t pid) {
  if (::kill(pid, 0) != 0) return true;
  std::string stat = read_file("/proc/" + std::to_string(pid) + "/stat");
  auto close_paren = stat.rfind(')');
  return close_paren != std::string::npos && close_paren + 2 < stat.size() &&
         stat[close_paren + 2] == 'Z';
}

inline bool gone_within(pid_t pid, std::chrono::milliseconds limit) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (!process_gone(pid)) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

// --- emulated nodes (chorus-run --nodes) ---------------------------------------------------

// Shell prefix: `ip` and `tc` live in /usr/sbin, which a root shell's PATH may lack; the
// ranks inherit this PATH too.
inline const std::string with_sbin = "PATH=\"$PATH:/usr/sbin:/sbin\"; export PATH; ";

// Why --nodes cannot work here, or "" when it can; probed once, the way --nodes will work.
inline const std::string& netns_unavailable() {
  static const std::string reason = []() -> std::string {
    if (::geteuid() != 0) return "needs root to create network namespaces";
    if (run_shell(with_sbin + "command -v ip").exit_code != 0) {
      return "needs the ip command (apt-get install iproute2)";
    }
    // Not "chorus-<pid>-...": chorus-run's stale-namespace sweep must not take it. `ip netns
    // exec` enters it and mounts its /sys, as chorus-run does for each rank.
    std::string probe = "chorus-probe-" + std::to_string(::getpid());
    auto r = run_shell(with_sbin + "ip netns add " + probe + " && ip netns exec " + probe +
                       " true; rc=$?; ip netns del " + probe + "; exit $rc");
    if (r.exit_code != 0) return "cannot create or enter a network namespace here: " + r.err;
    return "";
  }();
  return reason;
}

// True, after saying why, when the test cannot run here.
inline bool skip_without_netns(bool need_tc = false) {
  if (!netns_unavailable().empty()) {
    MESSAGE("skipped: " << netns_unavailable());
    return true;
  }
  if (need_tc && run_shell(with_sbin + "command -v tc").exit_code != 0) {
    MESSAGE("skipped: needs the tc command (apt-get install iproute2)");
    return true;
  }
  return false;
}

}  // namespace chorus::test
