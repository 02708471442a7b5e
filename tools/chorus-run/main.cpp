// SPDX-License-Identifier: Apache-2.0
// chorus-run: starts N local ranks of a program with the CHORUS_* environment, prefixes their
// output with the rank, and stops every rank as soon as one fails (unless --keep-going: for
// programs that shrink() their communicator and go on without a killed rank). With --nodes it spreads
// the ranks over emulated nodes: network namespaces on a bridge, optionally rate-capped.
//
// Usage: chorus-run -n N [--port P] [--timeout SECONDS] [--no-prefix] [--keep-going] [--bind] PROGRAM [ARGS...]
//        chorus-run --nodes K -n M | --nodes M1,M2,... [--link-rate RATE] [--net-stats] ...
//
//   $ chorus-run -n 2 sh -c 'echo hi $CHORUS_RANK'
//   [0] hi 0
//   [1] hi 1
//
//   $ chorus-run --nodes 2 -n 1 --net-stats sh -c 'echo $CHORUS_MASTER_ADDR'   # root, pid 4242
//   [0] 10.16.146.1
//   [1] 10.16.146.1
//   chorus-run: node 0 link tx 0 B rx 0 B
//   chorus-run: node 1 link tx 0 B rx 0 B
//   chorus-run: total link tx 0 B rx 0 B
//
// Exit status: 0 when every rank exits 0; 1 when a rank exits non-zero; 128+sig when a rank is
// killed by a signal (or chorus-run is interrupted by one); 124 on --timeout; 2 on bad usage or
// when the program cannot be started. With --keep-going, ranks killed by SIGKILL or SIGTERM are
// reported and do not count, so the status is 0 when every other rank exits 0 (and one at
// least does); a rank that crashes (SIGSEGV, SIGABRT, ...) still fails the run.
//
// How it works: one process per rank, each the leader of its own process group so that a
// signal reaches the rank and everything it started; what a rank leaves running when it
// ends is stopped when the job ends (SIGTERM once every rank has exited, SIGKILL on the way
// out), and chorus-run is its subreaper meanwhile. stdout and stderr come back through
// pipes; a single poll() loop reads them, cuts whole lines and queues each batch of lines for
// chorus-run's own stdout or stderr, so lines from different ranks never interleave; a thread
// writes the queue, so a reader that stops never stops the loop. A watcher
// process stops the ranks' groups if chorus-run itself is killed. Signals (SIGCHLD, SIGINT,
// SIGTERM, SIGHUP) are turned into bytes on a self-pipe that the same poll() watches, so the
// loop never busy-waits and never races a signal.
//
// With --nodes, the network (emulated_network.hpp) is built before the first rank starts and
// deleted after the last one is reaped, whatever ended the run: a failing rank, --timeout or
// a signal all lead out of the same loop. A rank's child enters its node's namespace between
// fork and exec, so everything else about starting and stopping ranks stays as it is. What a
// SIGKILLed chorus-run leaves behind, the next run removes at its start.

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <unistd.h>
#if defined(__linux__)
#include <sys/prctl.h>
#endif

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <vector>

#include <chorus/bootstrap/auth.hpp>

#include "command.hpp"
#include "emulated_network.hpp"

extern char** environ;

namespace {

using clock_type = std::chrono::steady_clock;
using namespace std::chrono_literals;

constexpr int max_ranks = 1024;
// The rendezvous port with --nodes. Node 0's namespace is new and runs nothing but our ranks,
// so a fixed port is always free there; it is torchrun's default too.
constexpr int nodes_default_port = 29500;
// How long ranks get between SIGTERM and SIGKILL.
constexpr auto kill_grace = 3s;
// How long to keep reading pipes after the last rank exited: a rank may have left a
// background process holding the pipe open, and we must not wait for it forever.
constexpr auto drain_grace = 1s;
// A line longer than this is written out in pieces; the bound keeps a program that writes
// binary data without newlines from growing our memory without limit.
constexpr std::size_t max_line = std::size_t{1} << 20;
// Output queued for a reader that does not keep up, beyond which the ranks' streams to it are
// not read until it takes some.
constexpr std::size_t max_queued = std::size_t{4} << 20;

constexpr std::string_view usage_text =
    "usage: chorus-run -n N [--port P] [--timeout SECONDS] [--no-prefix] [--keep-going] [--bind] PROGRAM [ARGS...]\n"
    "       chorus-run --nodes K -n M [--link-rate RATE] [--net-stats] [...] PROGRAM [ARGS...]\n"
    "       chorus-run --nodes M1,M2,... [--link-rate RATE] [--net-stats] [...] PROGRAM [ARGS...]\n"
    "  -n N               number of ranks to start (1..1024); with --nodes K, ranks per node\n"
    "  --port P           CHORUS_MASTER_PORT (default: a free port on 127.0.0.1; 29500 with\n"
    "                     --nodes)\n"
    "  --timeout SECONDS  kill every rank after SECONDS and exit 124\n"
    "  --no-prefix        do not prefix output lines with \"[rank] \"\n"
    "  --keep-going       a rank killed by SIGKILL or SIGTERM does not stop the others, which\n"
    "                     may go on without it (communicator::shrink()); it is reported, and\n"
    "                     the exit status is the other ranks' (a crash still fails the run)\n"
    "  --bind             pin each rank to one CPU of those chorus-run may use, in blocks: rank\n"
    "                     r of N gets CPU r*C/N of the C, so consecutive ranks share a CPU when\n"
    "                     ranks outnumber CPUs (placement then no longer changes between runs)\n"
    "  --nodes K          run the ranks on K (1..64) emulated nodes of -n M ranks each\n"
    "  --nodes M1,M2,...  run M1 ranks on node 0, M2 on node 1, ... (-n, if given, must be the\n"
    "                     sum). Each node is a network namespace joined to the others by a\n"
    "                     bridge; needs root and the ip command\n"
    "  --link-rate RATE   cap each node's link at RATE each way, in tc units: 500mbit, 2gbit,\n"
    "                     100mbps (= megabytes/s), from 8kbit to 10tbit; needs the tc command\n"
    "  --net-stats        at the end, print the bytes each node's link sent and received\n"
    "Each rank gets CHORUS_RANK, CHORUS_WORLD_SIZE, CHORUS_LOCAL_RANK, CHORUS_LOCAL_WORLD_SIZE,\n"
    "CHORUS_MASTER_ADDR=127.0.0.1 and CHORUS_MASTER_PORT; stdin is /dev/null. With --nodes,\n"
    "ranks are numbered node by node, the local variables count within the node,\n"
    "CHORUS_MASTER_ADDR is node 0's address and CHORUS_SOCKET_IFNAME the node's interface.\n"
    "Unless CHORUS_SECRET, CHORUS_SECRET_FILE or CHORUS_AUTH is set, every rank also gets\n"
    "CHORUS_SECRET: a fresh random secret for this job, which its connections prove they know.\n";

void write_all(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        // A non-blocking stdout (shared with whoever set it so): wait until it takes more,
        // rather than drop the rest of the output.
        pollfd p{fd, POLLOUT, 0};
        ::poll(&p, 1, -1);
        continue;
      }
      return;  // stdout closed (EPIPE, SIGPIPE is ignored): drop the output, keep supervising.
    }
    data.remove_prefix(static_cast<std::size_t>(n));
  }
}

// What chorus-run writes to its own stdout or stderr while the ranks run: queued in order
// and written by a thread of its own. A write blocks as long as its reader makes it (a full
// pipe, a terminal that stopped, a stalled ssh); only that thread waits, never the poll()
// loop that supervises the ranks. stdout and stderr have one each, or share one when they are
// the same file (2>&1), which keeps what goes there in the order it was made. The loop stops
// reading the ranks' streams to an output while more than max_queued bytes wait for it, so
// a reader that lags slows the ranks, not chorus-run's memory; the thread wakes the loop when
// its queue is short again.
class output_writer {
 public:
  // `wake_fd`: where one byte (0) says the queue has room again.
  void start(int wake_fd) {
    wake_fd_ = wake_fd;
    // The signals stay with the loop's thread, whose handlers feed the self-pipe.
    sigset_t all, old;
    sigfillset(&all);
    ::pthread_sigmask(SIG_BLOCK, &all, &old);
    thread_ = std::thread([this] { run(); });
    ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
  }
  bool running() const { return thread_.joinable(); }
  void post(int fd, std::string data) {
    {
      std::lock_guard lk(m_);
      bytes_ += data.size();
      queue_.emplace_back(fd, std::move(data));
      over_ = over_ || bytes_ > max_queued;
    }
    cv_.notify_one();
  }
  std::size_t queued() {
    std::lock_guard lk(m_);
    return bytes_;
  }
  // Writes everything queued, however long its readers take, then ends the thread.
  void finish() {
    if (!running()) return;
    {
      std::lock_guard lk(m_);
      done_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }

 private:
  void run() {
    std::unique_lock lk(m_);
    for (;;) {
      cv_.wait(lk, [&] { return done_ || !queue_.empty(); });
      if (queue_.empty()) return;
      auto [fd, bytes] = std::move(queue_.front());
      queue_.pop_front();
      lk.unlock();
      write_all(fd, bytes);
      lk.lock();
      bytes_ -= bytes.size();
      if (over_ && bytes_ <= max_queued) {
        over_ = false;
        const char room = 0;
        [[maybe_unused]] ssize_t n = ::write(wake_fd_, &room, 1);
      }
    }
  }

  std::mutex m_;
  std::condition_variable cv_;
  std::deque<std::pair<int, std::string>> queue_;
  std::size_t bytes_ = 0;  // queued, not yet written
  bool over_ = false;      // bytes_ went over max_queued: the loop waits to be woken
  bool done_ = false;
  int wake_fd_ = -1;
  std::thread thread_;
};

output_writer stdout_writer, stderr_writer;
bool outputs_shared = false;  // stdout and stderr are one file: stdout_writer writes both

output_writer& writer_for(int fd) {
  return fd == STDERR_FILENO && !outputs_shared ? stderr_writer : stdout_writer;
}

// Starts the writers; `wake_fd` as output_writer::start.
void start_writers(int wake_fd) {
  struct stat out{}, err{};
  outputs_shared = ::fstat(STDOUT_FILENO, &out) == 0 && ::fstat(STDERR_FILENO, &err) == 0 &&
                   out.st_dev == err.st_dev && out.st_ino == err.st_ino;
  stdout_writer.start(wake_fd);
  if (!outputs_shared) stderr_writer.start(wake_fd);
}

// Writes what is queued, however long the readers take, and ends the writers.
void finish_writers() {
  stdout_writer.finish();
  stderr_writer.finish();
}

// Writes `data` to our stdout or stderr: queued while the writers run, else at once.
void post(int fd, std::string data) {
  output_writer& w = writer_for(fd);
  if (w.running()) {
    w.post(fd, std::move(data));
  } else {
    write_all(fd, data);
  }
}

void say(std::string_view message) {
  std::string line = "chorus-run: ";
  line += message;
  line += '\n';
  post(STDERR_FILENO, std::move(line));
}

[[noreturn]] void usage_error(std::string_view message) {
  say(message);
  write_all(STDERR_FILENO, usage_text);
  std::exit(2);
}

std::string signal_name(int sig) {
  struct entry {
    int sig;
    const char* name;
  };
  static constexpr entry names[] = {
      {SIGHUP, "SIGHUP"},   {SIGINT, "SIGINT"},   {SIGQUIT, "SIGQUIT"}, {SIGILL, "SIGILL"},
      {SIGTRAP, "SIGTRAP"}, {SIGABRT, "SIGABRT"}, {SIGBUS, "SIGBUS"},   {SIGFPE, "SIGFPE"},
      {SIGKILL, "SIGKILL"}, {SIGUSR1, "SIGUSR1"}, {SIGSEGV, "SIGSEGV"}, {SIGUSR2, "SIGUSR2"},
      {SIGPIPE, "SIGPIPE"}, {SIGALRM, "SIGALRM"}, {SIGTERM, "SIGTERM"}, {SIGXCPU, "SIGXCPU"},
  };
  for (const auto& e : names) {
    if (e.sig == sig) return e.name;
  }
  return "signal " + std::to_string(sig);
}

template <typename T>
std::optional<T> parse_number(std::string_view text) {
  T value{};
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc{} || end != text.data() + text.size()) return std::nullopt;
  return value;
}

struct options {
  int nranks = 0;
  int port = 0;            // 0: pick a free one
  double timeout_s = 0.0;  // 0: none
  bool prefix = true;
  bool keep_going = false;  // --keep-going: a rank killed by a signal does not stop the rest
  bool bind = false;        // --bind: each rank pinned to one CPU, in blocks
  std::vector<int> node_sizes;  // --nodes: ranks on each emulated node; empty: no emulation
  std::optional<std::uint64_t> link_rate_bits;  // --link-rate, in bit/s; needs --nodes
  bool net_stats = false;                       // --net-stats; needs --nodes
  std::vector<std::string> command;
};

// What --nodes said: K nodes of -n ranks each, or one node per listed rank count.
struct node_spec {
  int count = 0;           // K, when given as a single number
  std::vector<int> sizes;  // M1,M2,..., when given as a list
};

// Parses "K" or "M1,M2,...". A single number is a count of nodes, never a list of one: one
// node of 3 ranks is "--nodes 1 -n 3".
node_spec parse_node_spec(std::string_view text) {
  const std::string shown = "'" + std::string(text) + "'";
  node_spec spec;
  if (text.find(',') == std::string_view::npos) {
    auto k = parse_number<int>(text);
    if (!k || *k < 1 || *k > chorus_run::max_nodes) {
      usage_error("--nodes K wants 1.." + std::to_string(chorus_run::max_nodes) + " nodes, got " +
                  shown);
    }
    spec.count = *k;
    return spec;
  }
  for (std::size_t start = 0;;) {
    std::size_t comma = text.find(',', start);
    std::string_view item = text.substr(start, comma - start);
    auto m = parse_number<int>(item);
    if (!m || *m < 1 || *m > max_ranks) {
      usage_error("--nodes wants a count of 1.." + std::to_string(max_ranks) +
                  " ranks per node between the commas, got " + shown);
    }
    spec.sizes.push_back(*m);
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  if (spec.sizes.size() > static_cast<std::size_t>(chorus_run::max_nodes)) {
    usage_error("--nodes lists " + std::to_string(spec.sizes.size()) + " nodes; at most " +
                std::to_string(chorus_run::max_nodes) + " are supported");
  }
  return spec;
}

options parse_options(int argc, char** argv) {
  options opt;
  bool have_n = false;
  std::optional<node_spec> nodes;
  int i = 1;
  // Takes the value of an option given as "--opt VALUE" or "--opt=VALUE".
  auto value_of = [&](std::string_view arg, std::string_view name) -> std::optional<std::string> {
    if (arg == name) {
      if (i + 1 >= argc) usage_error(std::string(name) + " needs a value");
      return std::string(argv[++i]);
    }
    if (arg.size() > name.size() && arg.substr(0, name.size()) == name &&
        arg[name.size()] == '=') {
      return std::string(arg.substr(name.size() + 1));
    }
    return std::nullopt;
  };
  for (; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg.empty() || arg[0] != '-') break;  // the program: everything after it is its own
    if (arg == "-h" || arg == "--help") {
      write_all(STDOUT_FILENO, usage_text);
      std::exit(0);
    }
    if (arg == "--no-prefix") {
      opt.prefix = false;
    } else if (arg == "--bind") {
      opt.bind = true;
    } else if (arg == "--keep-going") {
      opt.keep_going = true;
    } else if (arg == "--net-stats") {
      opt.net_stats = true;
    } else if (auto k = value_of(arg, "--nodes")) {
      nodes = parse_node_spec(*k);
    } else if (auto rate = value_of(arg, "--link-rate")) {
      opt.link_rate_bits = chorus_run::parse_link_rate(*rate);
      if (!opt.link_rate_bits) {
        usage_error("--link-rate wants a rate of 8kbit..10tbit with a tc unit, like 500mbit, "
                    "2gbit or 100mbps; got '" + *rate + "'");
      }
    } else if (auto n = value_of(arg, "-n")) {
      auto v = parse_number<int>(*n);
      if (!v) usage_error("-n wants a number of ranks, got '" + *n + "'");
      if (*v < 1 || *v > max_ranks) {
        usage_error("-n must be between 1 and " + std::to_string(max_ranks) + ", got " + *n);
      }
      opt.nranks = *v;
      have_n = true;
    } else if (auto p = value_of(arg, "--port")) {
      auto v = parse_number<int>(*p);
      if (!v || *v < 1 || *v > 65535) usage_error("--port must be 1..65535, got '" + *p + "'");
      opt.port = *v;
    } else if (auto t = value_of(arg, "--timeout")) {
      auto v = parse_number<double>(*t);
      if (!v || !(*v > 0.0) || *v > 1e9) {
        usage_error("--timeout wants a positive number of seconds, got '" + *t + "'");
      }
      opt.timeout_s = *v;
    } else {
      usage_error("unknown option '" + std::string(arg) + "'");
    }
  }
  if (!nodes) {
    if (!have_n) usage_error("-n N is required");
    if (opt.link_rate_bits) usage_error("--link-rate needs --nodes");
    if (opt.net_stats) usage_error("--net-stats needs --nodes");
  } else if (nodes->count > 0) {
    if (!have_n) {
      usage_error("--nodes " + std::to_string(nodes->count) + " needs -n M, the ranks per node");
    }
    if (nodes->count * opt.nranks > max_ranks) {
      usage_error("--nodes " + std::to_string(nodes->count) + " -n " + std::to_string(opt.nranks) +
                  " makes more than " + std::to_string(max_ranks) + " ranks");
    }
    opt.node_sizes.assign(static_cast<std::size_t>(nodes->count), opt.nranks);
    opt.nranks *= nodes->count;
  } else {
    int sum = 0;
    for (int m : nodes->sizes) sum += m;
    if (sum > max_ranks) {
      usage_error("--nodes makes " + std::to_string(sum) + " ranks; at most " +
                  std::to_string(max_ranks) + " are supported");
    }
    if (have_n && opt.nranks != sum) {
      usage_error("-n " + std::to_string(opt.nranks) + " does not match --nodes, which lists " +
                  std::to_string(sum) + " ranks; leave -n out");
    }
    opt.node_sizes = nodes->sizes;
    opt.nranks = sum;
  }
  if (i >= argc) usage_error("no program to run");
  for (; i < argc; ++i) opt.command.emplace_back(argv[i]);
  return opt;
}

// Binds port 0 on 127.0.0.1 and returns the port the kernel chose. The socket is closed
// before the ranks start, so another process could take the port in between; rank 0 binds
// it within milliseconds, which makes that unlikely, and --port exists for the rest.
int pick_free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = 0;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  int port = -1;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  ::close(fd);
  return port;
}

// The self-pipe: the handler only writes the signal number; the poll() loop does the work.
int signal_pipe_write = -1;
// The first signal asking us to stop, for the network build, which runs before the loop.
volatile sig_atomic_t stop_signal = 0;

extern "C" void on_signal(int sig) {
  int saved = errno;
  auto byte = static_cast<unsigned char>(sig);
  [[maybe_unused]] ssize_t n = ::write(signal_pipe_write, &byte, 1);
  if (sig != SIGCHLD && stop_signal == 0) stop_signal = sig;
  errno = saved;
}

using chorus_run::handled_signals;

// A child that outlives a SIGKILLed chorus-run to stop its ranks' process groups: the kernel
// takes each rank's first process with us (PR_SET_PDEATHSIG), and what that started would run
// on. It learns each group as a rank starts, and forgets it once the group is found empty
// (its id may then be reused by strangers), over a pipe whose end of file is our death; it
// does nothing when the job's groups were stopped here (release()).
class group_watcher {
 public:
  // Forks the watcher. Before anything else is open: it keeps only its pipe.
  void start() {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) return;  // no watcher: PDEATHSIG alone, as before
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::close(fds[1]);
      watch(fds[0]);
    }
    ::close(fds[0]);
    if (pid < 0) {
      ::close(fds[1]);
      return;
    }
    fd_ = fds[1];
  }
  // A rank's process group (the rank's pid) to stop if we die.
  void add(pid_t group) { tell(group); }
  // A group found empty: not to be signalled.
  void forget(pid_t group) { tell(-group); }
  // The job's groups were stopped here: the watcher exits without signalling anyone.
  void release() {
    if (fd_ < 0) return;
    tell(0);
    ::close(fd_);
    fd_ = -1;
  }

 private:
  // One message: a group (> 0), a group to forget (< 0), or release (0).
  void tell(pid_t message) {
    if (fd_ >= 0) write_all(fd_, std::string_view(reinterpret_cast<const char*>(&message), sizeof message));
  }

  [[noreturn]] static void watch(int fd) {
    // The signals a terminal or scheduler sends to our whole process group are chorus-run's
    // to handle; this process must outlive it.
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE}) ::signal(sig, SIG_IGN);
    ::dup2(fd, 3);
    ::close_range(4, ~0u, 0);
    const int devnull = ::open("/dev/null", O_RDWR);
    for (int std_fd : {STDIN_FILENO, STDOUT_FILENO, STDERR_FILENO}) {
      if (devnull >= 0) ::dup2(devnull, std_fd);
    }
    if (devnull > 3) ::close(devnull);
    std::vector<pid_t> groups;
    std::string bytes;
    char buf[4096];
    for (;;) {
      ssize_t n = ::read(3, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      bytes.append(buf, static_cast<std::size_t>(n));
      for (; bytes.size() >= sizeof(pid_t); bytes.erase(0, sizeof(pid_t))) {
        pid_t g = 0;
        std::memcpy(&g, bytes.data(), sizeof g);
        if (g == 0) ::_exit(0);  // released
        if (g > 0) {
          groups.push_back(g);
        } else {
          groups.erase(std::remove(groups.begin(), groups.end(), -g), groups.end());
        }
      }
    }
    for (pid_t g : groups) ::kill(-g, SIGKILL);
    ::_exit(0);
  }

  int fd_ = -1;  // our end; -1 without a watcher
};

struct stream {
  int fd = -1;    // read end of the rank's pipe; -1 once at EOF
  int dest = -1;  // STDOUT_FILENO or STDERR_FILENO
  std::string pending;  // bytes after the last newline
};

struct rank_process {
  pid_t pid = -1;
  bool running = false;
  // Its process group (id: pid) may still hold what the rank started after the rank itself
  // was reaped; false once a signal to it found nobody.
  bool group_left = true;
  stream out, err;
};

// Where a rank sits: its node and its place there. Without --nodes, everything is node 0.
struct rank_place {
  int node = 0;
  int local_rank = 0;
  int local_size = 0;
};

// What a rank's child reports through the exec-status pipe when it cannot start.
struct start_failure {
  chorus_run::enter_step step = chorus_run::enter_step::none;  // none: exec (or the bind) failed
  bool bind = false;  // sched_setaffinity failed
  int err = 0;
};

// The CPUs this process may run on, in order (what --bind deals out).
std::vector<int> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (::sched_getaffinity(0, sizeof set, &set) != 0) return cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(static_cast<std::size_t>(c), &set)) cpus.push_back(c);
  }
  return cpus;
}

class launcher {
 public:
  explicit launcher(options opt) : opt_(std::move(opt)) {
    std::vector<int> sizes = opt_.node_sizes;
    if (sizes.empty()) sizes.push_back(opt_.nranks);
    for (std::size_t node = 0; node < sizes.size(); ++node) {
      for (int l = 0; l < sizes[node]; ++l) {
        places_.push_back({static_cast<int>(node), l, sizes[node]});
      }
    }
    if (opt_.bind) {
      cpus_ = allowed_cpus();
      if (cpus_.empty()) usage_error(std::string("--bind: cannot read this process's CPUs: ") + std::strerror(errno));
    }
  }

  int run() {
    watcher_.start();
    setup();
    if (!opt_.node_sizes.empty()) {
      if (auto failed = build_network()) return *failed;
    }
    start_clock();
    spawn_all();
    loop();
    if (network_) finish_network();
    // The job is over: what is left is written whatever it takes, as any program's output,
    // and a signal now takes its default action (nothing is left to forward it to).
    for (int sig : handled_signals) ::signal(sig, SIG_DFL);
    finish_writers();
    return exit_code_;
  }

 private:
  void setup() {
    // 2 pipes per rank plus the self-pipe: 1024 ranks need more than the usual soft limit.
    // The ranks get the limit we were given back (restore_nofile_).
    rlimit lim{};
    if (::getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < lim.rlim_max) {
      restore_nofile_ = lim;
      lim.rlim_cur = lim.rlim_max;
      ::setrlimit(RLIMIT_NOFILE, &lim);
    }
#if defined(__linux__)
    // What a rank starts and leaves behind when it ends becomes our child, not init's: its
    // process group stays pinned while we have not reaped it, so stopping the group at the
    // end reaches it (signal_running).
    ::prctl(PR_SET_CHILD_SUBREAPER, 1);
#endif
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) fail_setup("pipe");
    signal_pipe_read_ = fds[0];
    signal_pipe_write = fds[1];
    struct sigaction sa{};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
    for (int sig : handled_signals) ::sigaction(sig, &sa, nullptr);
    // A closed stdout must not kill the supervisor; write_all() drops the output instead.
    ::signal(SIGPIPE, SIG_IGN);
    // A secret per job, unless the user chose one (or chose none): then theirs passes through.
    if (!chorus::job_secret::chosen_in_env()) {
      secret_ = chorus::job_secret::generate_text();
    }
    if (opt_.port != 0) {
      port_ = opt_.port;
    } else if (!opt_.node_sizes.empty()) {
      port_ = nodes_default_port;
    } else {
      port_ = pick_free_port();
      if (port_ < 0) fail_setup("cannot find a free port on 127.0.0.1");
    }
  }

  // --timeout counts from the first rank's start: building 64 nodes takes a while, and that
  // is not the program's time.
  void start_clock() {
    if (opt_.timeout_s > 0) {
      timeout_at_ = clock_type::now() + std::chrono::duration_cast<clock_type::duration>(
                                            std::chrono::duration<double>(opt_.timeout_s));
    }
  }

  // Builds the emulated nodes. Returns the exit code when the run cannot go on, after
  // removing whatever was built. Signals already reach our handler here: a Ctrl-C during the
  // build stops it between two steps and still cleans up.
  std::optional<int> build_network() {
    if (auto why = chorus_run::why_no_emulated_network(opt_.link_rate_bits.has_value())) {
      say(*why);
      return 2;
    }
    if (int n = chorus_run::remove_stale_namespaces(::getpid()); n > 0) {
      say("removed " + std::to_string(n) +
          " network namespace(s) left behind by chorus-run processes that are gone");
    }
    network_.emplace(::getpid(), static_cast<int>(opt_.node_sizes.size()), opt_.link_rate_bits);
    std::optional<int> failed;
    try {
      if (!network_->build([] { return stop_signal != 0; })) {
        say("got " + signal_name(stop_signal) + " while building the emulated nodes");
        failed = 128 + stop_signal;
      }
    } catch (const std::exception& e) {
      say(std::string("cannot build the emulated nodes: ") + e.what());
      failed = 2;
    }
    if (failed) tear_down_network();
    return failed;
  }

  // Prints --net-stats, then deletes the nodes.
  void finish_network() {
    if (opt_.net_stats) {
      try {
        chorus_run::link_counters total;
        for (std::size_t node = 0; node < opt_.node_sizes.size(); ++node) {
          auto c = network_->counters(static_cast<int>(node));
          say("node " + std::to_string(node) + " link tx " + std::to_string(c.tx_bytes) +
              " B rx " + std::to_string(c.rx_bytes) + " B");
          total.tx_bytes += c.tx_bytes;
          total.rx_bytes += c.rx_bytes;
        }
        say("total link tx " + std::to_string(total.tx_bytes) + " B rx " +
            std::to_string(total.rx_bytes) + " B");
      } catch (const std::exception& e) {
        say(std::string("cannot read the link counters: ") + e.what());
      }
    }
    tear_down_network();
  }

  void tear_down_network() {
    for (const auto& failure : network_->tear_down()) say(failure);
    network_.reset();
  }

  [[noreturn]] void fail_setup(std::string_view what) {
    say(std::string(what) + ": " + std::strerror(errno));
    std::exit(2);
  }

  // The environment of rank r: ours, with the CHORUS_* variables we set replaced.
  std::vector<std::string> environment_for(int r) const {
    const rank_place& place = places_[static_cast<std::size_t>(r)];
    std::vector<std::pair<std::string_view, std::string>> ours = {
        {"CHORUS_RANK", std::to_string(r)},
        {"CHORUS_WORLD_SIZE", std::to_string(opt_.nranks)},
        {"CHORUS_LOCAL_RANK", std::to_string(place.local_rank)},
        {"CHORUS_LOCAL_WORLD_SIZE", std::to_string(place.local_size)},
        {"CHORUS_MASTER_ADDR", network_ ? network_->address(0) : "127.0.0.1"},
        {"CHORUS_MASTER_PORT", std::to_string(port_)},
    };
    // Without --nodes an inherited CHORUS_SOCKET_IFNAME passes through untouched, as before.
    if (network_) ours.emplace_back("CHORUS_SOCKET_IFNAME", chorus_run::node_interface);
    if (!secret_.empty()) ours.emplace_back("CHORUS_SECRET", secret_);
    std::vector<std::string> env;
    for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
      std::string_view var = *e;
      bool replaced = false;
      for (const auto& [name, value] : ours) {
        if (var.size() > name.size() && var.substr(0, name.size()) == name &&
            var[name.size()] == '=') {
          replaced = true;
        }
      }
      if (!replaced) env.emplace_back(var);
    }
    for (const auto& [name, value] : ours) env.push_back(std::string(name) + "=" + value);
    return env;
  }

  void spawn_all() {
    ranks_.resize(static_cast<std::size_t>(opt_.nranks));
    for (int r = 0; r < opt_.nranks && !shutting_down_; ++r) spawn(r);
    note_if_all_exited();
  }

  void spawn(int r) {
    auto& rank = ranks_[static_cast<std::size_t>(r)];
    std::vector<std::string> env_strings = environment_for(r);
    std::vector<char*> envp;
    for (auto& s : env_strings) envp.push_back(s.data());
    envp.push_back(nullptr);
    std::vector<char*> argv;
    for (auto& s : opt_.command) argv.push_back(s.data());
    argv.push_back(nullptr);

    int out[2], err[2], exec_status[2];
    if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0 ||
        ::pipe2(exec_status, O_CLOEXEC) != 0) {
      fail_rank_start(r, std::string("pipe: ") + std::strerror(errno));
      return;
    }
    int devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    const int netns_fd =
        network_ ? network_->namespace_fd(places_[static_cast<std::size_t>(r)].node) : -1;
    // --bind: rank r of n on CPU r * C / n of ours (ranks of every emulated node share them).
    cpu_set_t cpu;
    CPU_ZERO(&cpu);
    if (opt_.bind) {
      const std::size_t c = cpus_.size();
      CPU_SET(static_cast<std::size_t>(cpus_[static_cast<std::size_t>(r) * c / static_cast<std::size_t>(opt_.nranks)]), &cpu);
    }

    pid_t pid = chorus_run::fork_for_exec();
    if (pid == 0) {
      // Child: only async-signal-safe calls from here to exec.
#if defined(__linux__)
      // If chorus-run itself dies (even by SIGKILL), take the rank with it.
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);
#endif
      if (restore_nofile_) ::setrlimit(RLIMIT_NOFILE, &*restore_nofile_);
      if (devnull >= 0) ::dup2(devnull, STDIN_FILENO);
      ::dup2(out[1], STDOUT_FILENO);
      ::dup2(err[1], STDERR_FILENO);
      start_failure failure;
      if (netns_fd >= 0) failure.step = chorus_run::enter_node_namespace(netns_fd);
      if (failure.step == chorus_run::enter_step::none && opt_.bind &&
          ::sched_setaffinity(0, sizeof cpu, &cpu) != 0) {
        failure.bind = true;
      }
      if (failure.step == chorus_run::enter_step::none && !failure.bind) {
        ::execvpe(argv[0], argv.data(), envp.data());
      }
      failure.err = errno;
      [[maybe_unused]] ssize_t n = ::write(exec_status[1], &failure, sizeof failure);
      ::_exit(127);
    }
    int fork_errno = errno;
    if (devnull >= 0) ::close(devnull);
    ::close(out[1]);
    ::close(err[1]);
    ::close(exec_status[1]);
    if (pid < 0) {
      ::close(out[0]);
      ::close(err[0]);
      ::close(exec_status[0]);
      fail_rank_start(r, std::string("fork: ") + std::strerror(fork_errno));
      return;
    }
    rank.pid = pid;
    rank.running = true;
    watcher_.add(pid);
    rank.out = stream{out[0], STDOUT_FILENO, {}};
    rank.err = stream{err[0], STDERR_FILENO, {}};
    ::fcntl(out[0], F_SETFL, O_NONBLOCK);
    ::fcntl(err[0], F_SETFL, O_NONBLOCK);

    // The exec-status pipe closes on a successful exec (O_CLOEXEC) or says what failed.
    start_failure failure;
    ssize_t got;
    do {
      got = ::read(exec_status[0], &failure, sizeof failure);
    } while (got < 0 && errno == EINTR);
    ::close(exec_status[0]);
    if (got == static_cast<ssize_t>(sizeof failure)) {
      int status = 0;
      while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
      rank.running = false;
      forget_group(rank);  // it never ran the program: nothing of it is left
      if (failure.bind) {
        say("rank " + std::to_string(r) + " cannot be bound to its CPU (sched_setaffinity): " +
            std::strerror(failure.err));
      } else if (failure.step == chorus_run::enter_step::none) {
        say("cannot run '" + opt_.command[0] + "': " + std::strerror(failure.err));
      } else {
        say("rank " + std::to_string(r) + " " + chorus_run::describe(failure.step) + ": " +
            std::strerror(failure.err));
      }
      begin_shutdown(2);
    }
  }

  void fail_rank_start(int r, std::string_view why) {
    say("cannot start rank " + std::to_string(r) + ": " + std::string(why));
    begin_shutdown(2);
  }

  bool any_running() const {
    for (const auto& r : ranks_) {
      if (r.running) return true;
    }
    return false;
  }

  // Signals every rank's process group: the rank and everything it started, also what is
  // left of a group whose rank was reaped. Such a group's id stays in use while any member
  // lives (members orphaned are ours to reap, PR_SET_CHILD_SUBREAPER), and a group found
  // empty is never signalled again, so the id of another process's group is never hit.
  void signal_running(int sig) {
    for (auto& r : ranks_) {
      if (r.pid <= 0 || !r.group_left) continue;
      if (::kill(-r.pid, sig) != 0 && errno == ESRCH && !r.running) forget_group(r);
    }
  }

  // A reaped rank's process group found empty: its id is free for others from now on.
  void forget_group(rank_process& r) {
    r.group_left = false;
    watcher_.forget(r.pid);
  }

  // Stops the remaining ranks: SIGTERM now, SIGKILL after kill_grace. The first cause wins
  // the exit code.
  void begin_shutdown(int code, int sig = SIGTERM) {
    if (shutting_down_) return;
    shutting_down_ = true;
    exit_code_ = code;
    signal_running(sig);
    kill_at_ = clock_type::now() + kill_grace;
  }

  void emit(int rank, stream& s, std::string_view data, bool at_eof) {
    // Built by append: GCC 12 -O2 warns falsely (-Wrestrict, GCC bug 105329) on "[" + str.
    std::string prefix;
    if (opt_.prefix) {
      prefix.append("[").append(std::to_string(rank)).append("] ");
    }
    std::string batch;
    s.pending.append(data);
    std::size_t start = 0;
    for (;;) {
      std::size_t nl = s.pending.find('\n', start);
      if (nl == std::string::npos) break;
      batch += prefix;
      batch.append(s.pending, start, nl + 1 - start);
      start = nl + 1;
    }
    s.pending.erase(0, start);
    if (!s.pending.empty() && (at_eof || s.pending.size() >= max_line)) {
      batch += prefix;
      batch += s.pending;
      batch += '\n';
      s.pending.clear();
    }
    if (!batch.empty()) post(s.dest, std::move(batch));
  }

  // Reads what is available on one stream, at most `reads` buffers of it; closes it at EOF.
  // The loop reads once per stream and turn: a rank writing without pause (its pipe refilled
  // as fast as it is read) kept one call here for seconds, and timeouts, signals and other
  // ranks' failures waited for it.
  void read_stream(int rank, stream& s, int reads = 1) {
    char buf[65536];
    for (int k = 0; k < reads;) {
      ssize_t n = ::read(s.fd, buf, sizeof buf);
      if (n > 0) {
        emit(rank, s, std::string_view(buf, static_cast<std::size_t>(n)), false);
        if (static_cast<std::size_t>(n) < sizeof buf) return;
        ++k;
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      emit(rank, s, {}, true);
      ::close(s.fd);
      s.fd = -1;
      return;
    }
  }

  // At the end, once everything the ranks started is killed: what the stream still holds is
  // read (the rank's last output, held back while its reader was slow), then it is closed.
  void close_stream(int rank, stream& s) {
    if (s.fd < 0) return;
    read_stream(rank, s, 64);
    if (s.fd < 0) return;
    emit(rank, s, {}, true);
    ::close(s.fd);
    s.fd = -1;
  }

  void reap() {
    for (;;) {
      int status = 0;
      pid_t pid = ::waitpid(-1, &status, WNOHANG);
      if (pid <= 0) {
        if (pid < 0 && errno == EINTR) continue;
        break;
      }
      for (std::size_t r = 0; r < ranks_.size(); ++r) {
        auto& rank = ranks_[r];
        if (rank.pid != pid || !rank.running) continue;
        rank.running = false;
        if (::kill(-pid, 0) != 0 && errno == ESRCH) forget_group(rank);  // it left nothing
        // Print what the rank wrote before it died ahead of our verdict on it (its pipes hold
        // 64 KiB each; more may come from what it started, read in turn by the loop).
        int ri = static_cast<int>(r);
        if (rank.out.fd >= 0) read_stream(ri, rank.out, 4);
        if (rank.err.fd >= 0) read_stream(ri, rank.err, 4);
        if (shutting_down_) break;
        if (WIFEXITED(status) && WEXITSTATUS(status) != 0) {
          say("rank " + std::to_string(r) + " exited with status " +
              std::to_string(WEXITSTATUS(status)));
          stop_rest(1);
        } else if (WIFSIGNALED(status) && opt_.keep_going &&
                   (WTERMSIG(status) == SIGKILL || WTERMSIG(status) == SIGTERM)) {
          // Killed from outside (the OOM killer, a scheduler, a test): the others may go on.
          // A crash (SIGSEGV, SIGABRT, ...) is a failure of the program, as without the option.
          ++killed_;
          say("rank " + std::to_string(r) + " killed by signal " + signal_name(WTERMSIG(status)) +
              "; the other ranks go on (--keep-going)");
          if (killed_ == opt_.nranks) begin_shutdown(128 + WTERMSIG(status));
        } else if (WIFSIGNALED(status)) {
          say("rank " + std::to_string(r) + " killed by signal " +
              signal_name(WTERMSIG(status)));
          stop_rest(128 + WTERMSIG(status));
        }
        break;
      }
    }
    note_if_all_exited();
  }

  // Starts the drain grace period once, when the last rank is reaped.
  // Then what the ranks started and left behind is stopped: the job ends with its ranks.
  void note_if_all_exited() {
    if (all_exited_ || any_running()) return;
    all_exited_ = true;
    drain_until_ = clock_type::now() + drain_grace;
    signal_running(SIGTERM);
  }

  void stop_rest(int code) {
    int rest = 0;
    for (const auto& r : ranks_) rest += r.running ? 1 : 0;
    if (rest > 0) say("stopping the other " + std::to_string(rest) + " rank(s)");
    begin_shutdown(code);
  }

  void on_our_signal(int sig) {
    if (!shutting_down_) {
      say("got " + signal_name(sig) + ", forwarding it to the ranks");
      begin_shutdown(128 + sig, sig);
    } else if (sig != SIGCHLD) {
      // Asked twice: do not wait for the grace period.
      signal_running(SIGKILL);
    }
  }

  void handle_signal_pipe() {
    unsigned char sigs[64];
    for (;;) {
      ssize_t n = ::read(signal_pipe_read_, sigs, sizeof sigs);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return;
      bool child = false;
      for (ssize_t k = 0; k < n; ++k) {
        if (sigs[k] == 0) continue;  // the output writer has room again: the loop polls anew
        if (sigs[k] == SIGCHLD) {
          child = true;
        } else {
          on_our_signal(sigs[k]);
        }
      }
      if (child) reap();
    }
  }

  void loop() {
    std::vector<pollfd> fds;
    std::vector<std::pair<int, stream*>> owners;
    start_writers(signal_pipe_write);
    for (;;) {
      // A rank may have exited before our SIGCHLD handler saw it (between fork and poll).
      reap();
      bool running = any_running();
      bool open = false;
      for (const auto& r : ranks_) open = open || r.out.fd >= 0 || r.err.fd >= 0;
      auto now = clock_type::now();
      if (!running && (!open || now >= drain_until_)) break;

      // Once every rank has exited, only their output is left to read: no timeout then.
      if (timeout_at_ && now >= *timeout_at_ && !timed_out_ && !shutting_down_ && running) {
        timed_out_ = true;
        std::string secs = std::to_string(opt_.timeout_s);
        secs.erase(secs.find_last_not_of('0') + 1);
        if (!secs.empty() && secs.back() == '.') secs.pop_back();
        say("timeout after " + secs + " s, stopping all ranks");
        begin_shutdown(124);
      }
      if (kill_at_ && now >= *kill_at_) {
        if (running) say("ranks still alive " + std::to_string(kill_grace.count()) +
                         " s after SIGTERM; sending SIGKILL");
        signal_running(SIGKILL);
        kill_at_.reset();
      }

      fds.clear();
      owners.clear();
      fds.push_back({signal_pipe_read_, POLLIN, 0});
      owners.emplace_back(-1, nullptr);
      for (std::size_t r = 0; r < ranks_.size(); ++r) {
        for (stream* s : {&ranks_[r].out, &ranks_[r].err}) {
          // Output its reader has not taken yet holds up the rank's stream (the rank then
          // waits on its own pipe), not the loop, and bounds what is kept here.
          if (s->fd < 0 || writer_for(s->dest).queued() > max_queued) continue;
          fds.push_back({s->fd, POLLIN, 0});
          owners.emplace_back(static_cast<int>(r), s);
        }
      }
      std::optional<clock_type::time_point> wake;
      auto earliest = [&](const std::optional<clock_type::time_point>& t) {
        if (t && (!wake || *t < *wake)) wake = t;
      };
      if (!timed_out_ && !shutting_down_ && running) earliest(timeout_at_);
      earliest(kill_at_);
      if (!running) earliest(drain_until_);
      int timeout_ms = -1;
      if (wake) {
        auto ms = std::chrono::ceil<std::chrono::milliseconds>(*wake - now).count();
        timeout_ms = static_cast<int>(std::clamp<long long>(ms, 0, 1 << 30));
      }
      int ready = ::poll(fds.data(), static_cast<nfds_t>(fds.size()), timeout_ms);
      if (ready < 0) {
        if (errno == EINTR) continue;
        say(std::string("poll: ") + std::strerror(errno));
        begin_shutdown(1, SIGKILL);
        break;
      }
      for (std::size_t k = 1; k < fds.size(); ++k) {
        if (fds[k].revents == 0 || owners[k].second->fd < 0) continue;
        stream& s = *owners[k].second;
        if (writer_for(s.dest).queued() > max_queued) continue;  // it waits for its reader
        read_stream(owners[k].first, s);
      }
      if (fds[0].revents != 0) handle_signal_pipe();
    }
    signal_running(SIGKILL);  // anything the ranks left that outlived the SIGTERM
    reap();
    watcher_.release();
    for (std::size_t r = 0; r < ranks_.size(); ++r) {
      close_stream(static_cast<int>(r), ranks_[r].out);
      close_stream(static_cast<int>(r), ranks_[r].err);
    }
  }

  options opt_;
  group_watcher watcher_;
  std::vector<rank_place> places_;  // by rank
  std::vector<int> cpus_;            // --bind: the CPUs we may use, dealt out in blocks
  std::optional<chorus_run::emulated_network> network_;  // with --nodes, while it exists
  int port_ = 0;
  std::string secret_;  // the job's CHORUS_SECRET when we made it; never printed
  int signal_pipe_read_ = -1;
  std::vector<rank_process> ranks_;
  std::optional<rlimit> restore_nofile_;  // the RLIMIT_NOFILE we were started with, if raised
  bool shutting_down_ = false;
  bool timed_out_ = false;
  bool all_exited_ = false;
  int exit_code_ = 0;
  int killed_ = 0;  // ranks killed by a signal under --keep-going
  std::optional<clock_type::time_point> timeout_at_;
  std::optional<clock_type::time_point> kill_at_;
  clock_type::time_point drain_until_{};
};

}  // namespace

int main(int argc, char** argv) {
  // A closed stdin, stdout or stderr is /dev/null: else the next pipe would take its number,
  // and output meant for stdout would go into it.
  for (int fd : {STDIN_FILENO, STDOUT_FILENO, STDERR_FILENO}) {
    if (::fcntl(fd, F_GETFD) < 0 && errno == EBADF) {
      const int null = ::open("/dev/null", O_RDWR);
      if (null >= 0 && null != fd) {
        ::dup2(null, fd);
        ::close(null);
      }
    }
  }
  options opt = parse_options(argc, argv);
  return launcher(std::move(opt)).run();
}
