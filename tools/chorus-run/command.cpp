// SPDX-License-Identifier: Apache-2.0
// Starts chorus-run's children: the shared fork, and helper commands (ip, tc) run to completion
// with a deadline.
#include "command.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string_view>

namespace chorus_run {

std::string display(const std::vector<std::string>& argv) {
  std::string line;
  for (std::size_t k = 0; k < argv.size(); ++k) {
    std::string_view word = argv[k];
    if (k == 0) word = word.substr(word.rfind('/') + 1);  // npos + 1 == 0: no slash
    if (k > 0) line += ' ';
    line += word;
  }
  return line;
}

namespace {

// The output a command may leave in its error message; `ip` says what went wrong in one line.
constexpr std::size_t max_output = 4096;

std::string trimmed(std::string text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text;
}

}  // namespace

pid_t fork_for_exec() {
  sigset_t all, old;
  sigfillset(&all);
  ::sigprocmask(SIG_BLOCK, &all, &old);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::setpgid(0, 0);
    for (int sig : handled_signals) ::signal(sig, SIG_DFL);
    ::signal(SIGPIPE, SIG_DFL);
    ::sigprocmask(SIG_SETMASK, &old, nullptr);
    return 0;
  }
  int fork_errno = errno;
  if (pid > 0) ::setpgid(pid, pid);
  ::sigprocmask(SIG_SETMASK, &old, nullptr);
  errno = fork_errno;
  return pid;
}

command_result run_command(const std::vector<std::string>& argv, std::chrono::seconds limit) {
  command_result result;
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);

  int out[2];
  if (::pipe2(out, O_CLOEXEC) != 0) {
    result.verdict = std::string("pipe: ") + std::strerror(errno);
    return result;
  }
  int devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  pid_t pid = fork_for_exec();
  if (pid == 0) {
    if (devnull >= 0) ::dup2(devnull, STDIN_FILENO);
    ::dup2(out[1], STDOUT_FILENO);
    ::dup2(out[1], STDERR_FILENO);
    ::execv(args[0], args.data());
    const char* why = std::strerror(errno);
    [[maybe_unused]] ssize_t n = ::write(STDERR_FILENO, why, std::strlen(why));
    ::_exit(127);
  }
  int fork_errno = errno;
  if (devnull >= 0) ::close(devnull);
  ::close(out[1]);
  if (pid < 0) {
    ::close(out[0]);
    result.verdict = std::string("fork: ") + std::strerror(fork_errno);
    return result;
  }

  // Read until EOF or the deadline; the command's exit closes the pipe.
  auto deadline = std::chrono::steady_clock::now() + limit;
  bool timed_out = false;
  char buf[4096];
  for (;;) {
    auto left =
        std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      timed_out = true;
      break;
    }
    pollfd p{out[0], POLLIN, 0};
    int ready = ::poll(&p, 1, static_cast<int>(std::min<long long>(left.count(), 1 << 30)));
    if (ready < 0 && errno == EINTR) continue;  // our SIGCHLD, most likely
    if (ready == 0) continue;                   // the loop re-checks the deadline
    if (ready < 0) break;
    ssize_t n = ::read(out[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    if (result.output.size() < max_output) result.output.append(buf, static_cast<std::size_t>(n));
  }
  ::close(out[0]);
  if (timed_out) ::kill(-pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  result.output = trimmed(std::move(result.output));
  if (timed_out) {
    result.verdict = "timed out after " + std::to_string(limit.count()) + " s";
  } else if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
    result.ok = true;
  } else if (WIFEXITED(status)) {
    result.verdict = "exit status " + std::to_string(WEXITSTATUS(status));
  } else if (WIFSIGNALED(status)) {
    result.verdict = "killed by signal " + std::to_string(WTERMSIG(status));
  }
  return result;
}

void run_checked(const std::vector<std::string>& argv) {
  command_result r = run_command(argv);
  if (r.ok) return;
  std::string message = "command '" + display(argv) + "' failed (" + r.verdict + ")";
  if (!r.output.empty()) message += ": " + r.output;
  throw std::runtime_error(message);
}

}  // namespace chorus_run
