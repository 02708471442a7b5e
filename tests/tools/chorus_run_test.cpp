// SPDX-License-Identifier: Apache-2.0
// Tests of chorus-run, the local launcher: environment, output prefixes, failure and timeout
// handling and usage errors, each by running the built binary on small shell commands.
#include <doctest/doctest.h>

#include <sched.h>
#include <signal.h>

#include <chrono>
#include <regex>
#include <string>
#include <vector>

#include "chorus_run_support.hpp"

using namespace chorus::test;

TEST_CASE("every rank runs the program with its rank and the world in CHORUS_* variables") {
  auto r = run(
      "-n 3 sh -c 'echo $CHORUS_RANK $CHORUS_WORLD_SIZE $CHORUS_LOCAL_RANK "
      "$CHORUS_LOCAL_WORLD_SIZE $CHORUS_MASTER_ADDR $CHORUS_MASTER_PORT'");
  CHECK(r.exit_code == 0);
  auto lines = lines_of(r.out);
  REQUIRE(lines.size() == 3);
  std::regex line_re(R"(\[(\d)\] (\d) 3 (\d) 3 127\.0\.0\.1 (\d+))");
  std::string port;
  std::vector<bool> seen(3, false);
  for (const auto& line : lines) {
    std::smatch m;
    REQUIRE(std::regex_match(line, m, line_re));
    CHECK(m[1] == m[2]);  // the prefix names the rank that printed the line
    CHECK(m[2] == m[3]);  // one node: local rank == rank
    int port_number = std::stoi(m[4]);
    CHECK(port_number > 0);
    CHECK(port_number < 65536);
    if (port.empty()) port = m[4];
    CHECK(m[4] == port);  // every rank is told the same rendezvous port
    seen[static_cast<std::size_t>(std::stoi(m[1]))] = true;
  }
  CHECK(seen == std::vector<bool>{true, true, true});
}

TEST_CASE("chorus-run replaces inherited CHORUS_* variables and keeps the rest") {
  auto r = run_shell(std::string("CHORUS_RANK=77 KEEP_ME=yes '") + CHORUS_RUN_PATH +
                     "' -n 1 sh -c 'echo $CHORUS_RANK $KEEP_ME'");
  CHECK(r.exit_code == 0);
  CHECK(r.out == "[0] 0 yes\n");
}

TEST_CASE("chorus-run gives every rank of a job one fresh secret, unless the user chose") {
  // This test process has a secret of its own (tests/support/doctest_main.cpp): drop it.
  const std::string launch = std::string("env -u CHORUS_SECRET -u CHORUS_SECRET_FILE -u CHORUS_AUTH '") +
                             CHORUS_RUN_PATH + "' -n 2 sh -c 'echo $CHORUS_SECRET'";
  auto first = run_shell(launch);
  auto second = run_shell(launch);
  REQUIRE(first.exit_code == 0);
  auto lines = lines_of(first.out);
  REQUIRE(lines.size() == 2);
  std::regex secret_re(R"(\[\d\] ([0-9a-f]{64}))");
  std::smatch a, b;
  REQUIRE(std::regex_match(lines[0], a, secret_re));
  REQUIRE(std::regex_match(lines[1], b, secret_re));
  CHECK(a[1] == b[1]);                                  // one secret per job
  CHECK(second.out.find(a[1].str()) == std::string::npos);  // a new one for the next job
  CHECK(first.err.find(a[1].str()) == std::string::npos);   // never printed by chorus-run

  auto theirs = run_shell(std::string("CHORUS_SECRET=mine-mine-mine-mine '") + CHORUS_RUN_PATH +
                          "' -n 1 sh -c 'echo $CHORUS_SECRET'");
  CHECK(theirs.out == "[0] mine-mine-mine-mine\n");
  auto none = run_shell(std::string("env -u CHORUS_SECRET CHORUS_AUTH=none '") + CHORUS_RUN_PATH +
                        "' -n 1 sh -c 'echo \"[$CHORUS_SECRET]\"'");
  CHECK(none.out == "[0] []\n");
}

TEST_CASE("--bind pins rank r of n to CPU r*C/n of chorus-run's C, and without it ranks may run anywhere") {
  cpu_set_t set;
  CPU_ZERO(&set);
  REQUIRE(::sched_getaffinity(0, sizeof set, &set) == 0);
  std::vector<std::string> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(static_cast<std::size_t>(c), &set)) cpus.push_back(std::to_string(c));
  }
  const std::size_t n = 5;  // more ranks than this machine's cores, where blocks share one
  auto r = run("-n 5 --bind sh -c 'grep Cpus_allowed_list /proc/self/status'");
  CHECK(r.exit_code == 0);
  auto lines = lines_of(r.out);
  for (std::size_t k = 0; k < n; ++k) {
    const std::string want = cpus[k * cpus.size() / n];
    CAPTURE(k);
    CHECK(contains(lines, "[" + std::to_string(k) + "] Cpus_allowed_list:\t" + want));
  }
  if (cpus.size() > 1) {
    auto free_run = run("-n 1 sh -c 'grep Cpus_allowed_list /proc/self/status'");
    CHECK(free_run.out.find("Cpus_allowed_list:\t" + cpus.front() + "\n") == std::string::npos);
  }
}

TEST_CASE("--port sets CHORUS_MASTER_PORT for every rank") {
  auto r = run("-n 2 --port 29511 sh -c 'echo $CHORUS_MASTER_PORT'");
  CHECK(r.exit_code == 0);
  auto lines = lines_of(r.out);
  CHECK(contains(lines, "[0] 29511"));
  CHECK(contains(lines, "[1] 29511"));
}

TEST_CASE("output lines carry their rank's prefix and never interleave") {
  auto r = run(
      "-n 4 sh -c 'i=0; while [ $i -lt 3000 ]; do "
      "echo \"rank-$CHORUS_RANK-line-$i-abcdefghijklmnopqrstuvwxyz0123456789\"; "
      "i=$((i+1)); done'");
  CHECK(r.exit_code == 0);
  auto lines = lines_of(r.out);
  CHECK(lines.size() == 4 * 3000);
  std::regex line_re(R"(\[([0-3])\] rank-\1-line-\d+-abcdefghijklmnopqrstuvwxyz0123456789)");
  int bad = 0;
  for (const auto& line : lines) bad += std::regex_match(line, line_re) ? 0 : 1;
  CHECK(bad == 0);
}

TEST_CASE("stderr comes back on stderr with the same prefix") {
  auto r = run("-n 2 sh -c 'echo out $CHORUS_RANK; echo err $CHORUS_RANK >&2'");
  CHECK(r.exit_code == 0);
  auto out = lines_of(r.out);
  auto err = lines_of(r.err);
  CHECK(contains(out, "[0] out 0"));
  CHECK(contains(out, "[1] out 1"));
  CHECK(contains(err, "[0] err 0"));
  CHECK(contains(err, "[1] err 1"));
  CHECK(out.size() == 2);
}

TEST_CASE("a partial last line is flushed as a whole line when the rank exits") {
  auto r = run("-n 2 sh -c 'printf \"no newline $CHORUS_RANK\"'");
  CHECK(r.exit_code == 0);
  auto lines = lines_of(r.out);
  CHECK(contains(lines, "[0] no newline 0"));
  CHECK(contains(lines, "[1] no newline 1"));
  CHECK(r.out.back() == '\n');
}

TEST_CASE("--no-prefix prints whole lines without the rank prefix") {
  auto r = run("-n 2 --no-prefix sh -c 'echo plain $CHORUS_RANK'");
  CHECK(r.exit_code == 0);
  auto lines = lines_of(r.out);
  CHECK(contains(lines, "plain 0"));
  CHECK(contains(lines, "plain 1"));
}

TEST_CASE("a rank that exits 3 makes chorus-run fail at once and stops the sleeping ranks") {
  scratch_dir dir;
  // Rank 1 waits until the others have written their pids, then fails; the
  // others become `sleep 100` (exec keeps the pid) and also start a background sleeper, so
  // the test sees that the whole process group of each rank is stopped.
  auto r = run("-n 3 sh -c 'if [ $CHORUS_RANK = 1 ]; then "
               "while [ ! -s " + dir.path + "/pid.0 ] || [ ! -s " + dir.path + "/pid.2 ]; "
               "do sleep 0.05; done; echo failing; exit 3; fi; "
               "sleep 100 & echo $! > " + dir.path + "/child.$CHORUS_RANK; "
               "echo $$ > " + dir.path + "/pid.$CHORUS_RANK; exec sleep 100'");
  CHECK(r.exit_code == 1);
  CHECK(r.seconds < 3.0);  // the sleepers obey SIGTERM: no need to wait for SIGKILL
  CHECK(r.err.find("chorus-run: rank 1 exited with status 3") != std::string::npos);
  CHECK(contains(lines_of(r.out), "[1] failing"));
  for (const char* rank : {"0", "2"}) {
    for (const char* what : {"pid.", "child."}) {
      std::string text = read_file(dir.path + "/" + what + rank);
      REQUIRE_MESSAGE(!text.empty(), what << rank << " was not written");
      auto pid = static_cast<pid_t>(std::stol(text));
      CHECK_MESSAGE(gone_within(pid, std::chrono::milliseconds(2000)),
                    what << rank << " (pid " << pid << ") still runs");
    }
  }
}

TEST_CASE("a rank killed by a signal is reported by name and chorus-run exits 128+signal") {
  auto r = run("-n 2 sh -c 'if [ $CHORUS_RANK = 0 ]; then kill -KILL $$; fi; exec sleep 100'");
  CHECK(r.exit_code == 128 + SIGKILL);
  CHECK(r.seconds < 3.0);
  CHECK(r.err.find("chorus-run: rank 0 killed by signal SIGKILL") != std::string::npos);
}

TEST_CASE("--keep-going: a killed rank is reported and the others finish; their status is the run's") {
  auto r = run("-n 3 --keep-going sh -c 'if [ $CHORUS_RANK = 1 ]; then kill -KILL $$; fi; sleep 0.3; echo done'");
  CHECK(r.exit_code == 0);
  CHECK(r.err.find("chorus-run: rank 1 killed by signal SIGKILL; the other ranks go on (--keep-going)") !=
        std::string::npos);
  CHECK(r.out.find("[0] done") != std::string::npos);
  CHECK(r.out.find("[2] done") != std::string::npos);
  // A survivor that fails still fails the run, and stops the rest.
  r = run("-n 3 --keep-going sh -c 'if [ $CHORUS_RANK = 1 ]; then kill -KILL $$; fi; "
          "if [ $CHORUS_RANK = 2 ]; then sleep 0.3; exit 3; fi; exec sleep 100'");
  CHECK(r.exit_code == 1);
  CHECK(r.seconds < 5.0);
  // A crash is a failure of the program, not a lost rank.
  r = run("-n 2 --keep-going sh -c 'if [ $CHORUS_RANK = 1 ]; then kill -SEGV $$; fi; exec sleep 100'");
  CHECK(r.exit_code == 128 + SIGSEGV);
  CHECK(r.seconds < 5.0);
  // Every rank killed: nothing went on.
  r = run("-n 2 --keep-going sh -c 'kill -KILL $$'");
  CHECK(r.exit_code == 128 + SIGKILL);
}

TEST_CASE("a rank that ignores SIGTERM is killed with SIGKILL after the grace period") {
  auto r = run("-n 2 sh -c 'if [ $CHORUS_RANK = 0 ]; then sleep 0.2; exit 1; fi; "
               "trap \"\" TERM; while :; do sleep 0.1; done'");
  CHECK(r.exit_code == 1);
  CHECK(r.seconds > 2.5);
  CHECK(r.seconds < 10.0);
  CHECK(r.err.find("SIGKILL") != std::string::npos);
}

TEST_CASE("--timeout stops every rank and exits 124") {
  auto r = run("-n 2 --timeout 0.5 sleep 100");
  CHECK(r.exit_code == 124);
  CHECK(r.seconds < 3.0);
  CHECK(r.err.find("timeout") != std::string::npos);
}

TEST_CASE("ranks that finish before the timeout succeed") {
  auto r = run("-n 2 --timeout 30 true");
  CHECK(r.exit_code == 0);
  CHECK(r.seconds < 5.0);
}

TEST_CASE("SIGTERM to chorus-run is forwarded to the ranks") {
  auto r = run_shell(std::string("'") + CHORUS_RUN_PATH +
                     "' -n 2 sh -c 'trap \"echo got TERM; exit 0\" TERM; sleep 100 & wait' & "
                     "p=$!; sleep 0.5; kill -TERM $p; wait $p");
  CHECK(r.exit_code == 128 + SIGTERM);
  CHECK(r.seconds < 3.0);
  auto lines = lines_of(r.out);
  CHECK(contains(lines, "[0] got TERM"));
  CHECK(contains(lines, "[1] got TERM"));
}

TEST_CASE("what a rank started and left behind is stopped when the job ends, however it ends") {
  // A background process of a rank that already exited: once only the rank's own process
  // was stopped, and these ran on (with --nodes, holding their node's namespaces).
  for (const std::string how : {"exits 0", "exits 3", "times out"}) {
    CAPTURE(how);
    scratch_dir dir;
    const std::string leave = "sleep 100 & echo $! > " + dir.path + "/left; ";
    run_result r;
    if (how == "exits 0") {
      r = run("-n 2 sh -c '" + leave + "echo done'");
      CHECK(r.exit_code == 0);
    } else if (how == "exits 3") {
      r = run("-n 2 sh -c 'if [ $CHORUS_RANK = 0 ]; then " + leave + "exit 3; fi; exec sleep 100'");
      CHECK(r.exit_code == 1);
    } else {
      // The one left behind ignores SIGTERM: SIGKILL reaches it.
      r = run("-n 1 --timeout 0.5 sh -c '(trap \"\" TERM; exec sleep 100) & echo $! > " + dir.path +
              "/left; wait'");
      CHECK(r.exit_code == 124);
    }
    const std::string text = read_file(dir.path + "/left");
    REQUIRE_MESSAGE(!text.empty(), "the rank did not say what it left");
    const auto pid = static_cast<pid_t>(std::stol(text));
    CHECK_MESSAGE(gone_within(pid, std::chrono::milliseconds(5000)), "pid " << pid << " still runs");
  }
}

TEST_CASE("a reader that stops reading holds up the ranks' output, never the timeout") {
  // The reader takes nothing for 6 s while the ranks write megabytes, then reads it all.
  // chorus-run once blocked writing to it, and its timeout, signals and verdicts waited too.
  scratch_dir dir;
  const std::string d = dir.path;
  auto r = run_shell("{ " + chorus_run() + " -n 2 --timeout 1 sh -c 'yes | head -c 8000000; exec sleep 100' 2>" +
                     d + "/err; echo $? > " + d + "/rc; } | { sleep 6; cp " + d + "/err " + d +
                     "/early; cat > /dev/null; }");
  CHECK(read_file(d + "/rc") == "124\n");
  CHECK(read_file(d + "/early").find("chorus-run: timeout after 1 s, stopping all ranks") != std::string::npos);
}

TEST_CASE("with stdout and stderr on one slow pipe, everything arrives in the order it was made") {
  // Rank 0 writes 300,000 lines and fails; rank 1 says goodbye 2 s after its SIGTERM. The
  // reader starts after 1 s, while the job still runs, and reads 512 bytes at a time. Written
  // as each output could take it, the verdict on stderr landed among rank 0's lines, even
  // inside one (3 of 3 runs of that version).
  auto r = run_shell(chorus_run() + " -n 2 sh -c 'if [ $CHORUS_RANK = 0 ]; then yes abcdefghij | head -n 300000; "
                     "exit 3; fi; trap \"sleep 2; echo bye; exit 0\" TERM; sleep 100 & wait' 2>&1 | "
                     "{ sleep 1; dd bs=512 status=none; }");
  const auto lines = lines_of(r.out);
  REQUIRE(lines.size() >= 300000 + 3);
  std::size_t whole = 0;
  for (std::size_t i = 0; i < 300000; ++i) whole += lines[i] == "[0] abcdefghij" ? 1u : 0u;
  CHECK(whole == 300000);
  CHECK(lines[300000] == "chorus-run: rank 0 exited with status 3");
  CHECK(lines[300001] == "chorus-run: stopping the other 1 rank(s)");
  CHECK(lines.back() == "[1] bye");
}

TEST_CASE("no line is lost when the reader is slower than the ranks") {
  // 2 x 21,000 lines of 100 bytes: more than chorus-run keeps for a reader that lags (4 MiB),
  // so the ranks' last lines wait in their pipes when they exit; they are read at the end.
  scratch_dir dir;
  const std::string d = dir.path;
  auto r = run_shell(chorus_run() + " -n 2 sh -c 'yes 012345678901234567890123456789012345678901234567890123456789"
                     "012345678901234567890123456789012345678 | head -n 21000' | { sleep 3; cat > " + d + "/out; }");
  CHECK(r.exit_code == 0);
  const auto lines = lines_of(read_file(d + "/out"));
  CHECK(lines.size() == std::size_t{2 * 21000});
  std::size_t whole = 0;
  for (const auto& l : lines) whole += l.size() == 103 ? 1u : 0u;
  CHECK(whole == lines.size());
}

TEST_CASE("a chorus-run killed by SIGKILL takes what its ranks started with it") {
  // The kernel ends each rank's own process with chorus-run (PR_SET_PDEATHSIG); the sleeps
  // the ranks started ran on until chorus-run's watcher stopped their process groups.
  scratch_dir dir;
  const std::string d = dir.path;
  auto r = run_shell(chorus_run() + " -n 2 sh -c 'sleep 100 & echo $! > " + d +
                     "/left$CHORUS_RANK; wait' & p=$!; i=0; while [ ! -s " + d + "/left0 ] || [ ! -s " + d +
                     "/left1 ]; do sleep 0.05; i=$((i+1)); [ $i -gt 400 ] && break; done; kill -KILL $p; wait $p");
  CHECK(r.exit_code == 128 + SIGKILL);
  for (const char* name : {"/left0", "/left1"}) {
    const std::string text = read_file(d + name);
    REQUIRE_MESSAGE(!text.empty(), "a rank did not say what it started");
    const auto pid = static_cast<pid_t>(std::stol(text));
    CHECK_MESSAGE(gone_within(pid, std::chrono::milliseconds(5000)), "pid " << pid << " still runs");
    ::kill(pid, SIGKILL);  // whatever the outcome, nothing of the test runs on
  }
}

TEST_CASE("--timeout no longer applies once every rank has exited") {
  // The ranks succeed at once; what one leaves (ignoring SIGTERM) holds their output open
  // past the timeout. That is not the ranks' timeout: the run succeeds.
  auto r = run("-n 2 --timeout 0.5 sh -c '(trap \"\" TERM; exec sleep 100) & echo ok'");
  CHECK(r.exit_code == 0);
  CHECK(r.err.find("timeout") == std::string::npos);
}

TEST_CASE("ranks get the open-file limit chorus-run was given, not the one it raised for itself") {
  auto r = run_shell("ulimit -Sn 1000 && " + chorus_run() + " -n 1 sh -c 'ulimit -Sn'");
  CHECK(r.exit_code == 0);
  CHECK(contains(lines_of(r.out), "[0] 1000"));
}

TEST_CASE("a program that does not exist is reported and chorus-run exits 2") {
  auto r = run("-n 2 chorus-no-such-program-xyz");
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("chorus-run: cannot run 'chorus-no-such-program-xyz': "
                   "No such file or directory") != std::string::npos);
}

TEST_CASE("bad usage is explained and exits 2") {
  for (const char* args : {"", "true", "-n", "-n 0 true", "-n 1025 true", "-n x true",
                           "-n 2", "-n 2 --port 0 true", "-n 2 --timeout -1 true",
                           "-n 2 --bogus true"}) {
    check_usage_error(args);
  }
}

TEST_CASE("arguments after the program belong to the program") {
  auto r = run("-n 1 sh -c 'printf \"%s\\n\" \"$*\"' sh -n 5 --timeout 1");
  CHECK(r.exit_code == 0);
  CHECK(r.out == "[0] -n 5 --timeout 1\n");
}
