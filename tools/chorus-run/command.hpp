// SPDX-License-Identifier: Apache-2.0
// Starts chorus-run's children: the fork every child (rank or helper) goes through, and helper
// commands (ip, tc) run to completion with a deadline, reporting how they failed.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

namespace chorus_run {

// How long one `ip` or `tc` call may take before it is killed. They finish in milliseconds;
// the bound is there so that a wedged helper cannot hang chorus-run (or its cleanup) forever.
inline constexpr std::chrono::seconds command_time_limit{30};

// The signals chorus-run catches, turning each into a byte on its self-pipe.
inline constexpr int handled_signals[] = {SIGCHLD, SIGINT, SIGTERM, SIGHUP};

// fork() for a child that will exec. Every signal stays blocked across the fork, so that no
// handler of ours runs in the child (where it would write into the parent's self-pipe) before
// the child has put handled_signals and SIGPIPE (which chorus-run ignores) back to their
// defaults; then the child gets the caller's signal mask back. Other dispositions are inherited
// as chorus-run got them. The child leads its own process group, set from both sides so that
// the group exists before the parent may signal it. In the child, only async-signal-safe calls
// may follow. Returns what fork() returns, with fork's errno when it fails.
pid_t fork_for_exec();

struct command_result {
  bool ok = false;      // exited 0
  std::string verdict;  // when not ok: "exit status 2", "killed by SIGSEGV", "timed out", ...
  std::string output;   // stdout and stderr together, trailing newlines removed
};

// Runs argv (argv[0] an absolute path) with stdin from /dev/null and its own process group,
// so that a Ctrl-C meant for chorus-run does not kill a cleanup command half-way; we decide.
// Never throws for a failing command; read `ok`.
command_result run_command(const std::vector<std::string>& argv,
                           std::chrono::seconds limit = command_time_limit);

// run_command(), and on failure throws std::runtime_error naming the command, how it failed
// and what it printed:
//   command 'ip -n chorus-812-0 link set eth0 up' failed (exit status 1): Cannot find device
void run_checked(const std::vector<std::string>& argv);

// The command line as a person reads it in a message: program's base name, arguments
// separated by spaces.
std::string display(const std::vector<std::string>& argv);

}  // namespace chorus_run
