// SPDX-License-Identifier: Apache-2.0
// The shared-memory transport: segments never outlive the job, dead and failed peers are
// noticed, tiny rings still carry large operations.
#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chorus/transport/shm.hpp>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "collectives/shared_counters.hpp"
#include "support/multirank.hpp"

using namespace chorus;
using chorus::test::run_ranks;

namespace {

/// Names in /dev/shm that a chorus job made.
std::set<std::string> chorus_segments() {
  std::set<std::string> names;
  if (DIR* d = ::opendir("/dev/shm")) {
    while (const dirent* e = ::readdir(d)) {
      if (std::string(e->d_name).rfind("chorus-", 0) == 0) names.insert(e->d_name);
    }
    ::closedir(d);
  }
  return names;
}

const std::map<std::string, std::string> shm_env = {{"CHORUS_TRANSPORT", "shm"},
                                                    {"CHORUS_TIMEOUT", "20"}};

/// The chorus::error `f` throws; the test fails, saying `never`, where it throws none.
template <class F>
error error_of(F&& f, const char* never) {
  try {
    f();
  } catch (const error& e) {
    return e;
  }
  FAIL(never);
  return error(errc::aborted, never);
}

}  // namespace

TEST_CASE("the segment is gone from /dev/shm once the job has started, and after it ends") {
  const auto before = chorus_segments();
  run_ranks(4, [&](communicator& comm) {
    RANK_CHECK(comm.transport_name() == "shm");
    std::vector<int> v(1000, comm.rank());
    comm.all_reduce(std::span(v));
    RANK_CHECK(v[999] == 6);
    // Every rank has left connect() (the creator unlinks the name before it returns), so
    // the name is gone while the job still runs on the memory.
    RANK_CHECK(chorus_segments() == before);
  }, {.env = shm_env});
  CHECK(chorus_segments() == before);
}

TEST_CASE("a rank killed with SIGKILL mid-job fails every survivor naming it, and leaves no segment") {
  const auto before = chorus_segments();
  const auto t0 = std::chrono::steady_clock::now();
  const auto status = run_ranks(4, [](communicator& comm) {
    std::vector<float> v(1 << 20, 1.0f);
    if (comm.rank() == 2) {
      comm.all_reduce(std::span(v));
      ::raise(SIGKILL);
    }
    try {
      // Rank 2 finishing the first call does not mean its peers did: they may still be
      // reading its last frames when it dies, so every call of theirs may be the one that fails.
      for (int i = 0; i < 101; ++i) comm.all_reduce(std::span(v));
      RANK_CHECK(false);
    } catch (const error& e) {
      std::fprintf(stderr, "[rank %d] %s\n", comm.rank(), e.what());
      // The neighbours of rank 2 see it die; the others hear from them (their report, then
      // their abort flags) and name it too.
      RANK_CHECK((e.code() == errc::connection_lost || e.code() == errc::peer_failed));
      RANK_CHECK(e.ranks() == std::vector<int>{2});
      RANK_CHECK(std::string(e.what()).find("rank 2") != std::string::npos);
    }
  }, {.env = shm_env, .expect_killed = {2}});
  CHECK(WIFSIGNALED(status[2]));
  // Well inside the 20 s operation timeout: the death itself was noticed.
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10));
  CHECK(chorus_segments() == before);
}

TEST_CASE("a peer's failure reaches the others through its abort flag at once") {
  run_ranks(3, [](communicator& comm) {
    std::vector<int> v(64, 1);
    try {
      if (comm.rank() == 1) {
        std::vector<double> d(64, 1.0);  // a different dtype: rank 1's peers see a mismatch
        comm.all_reduce(std::span(d));
      } else {
        comm.all_reduce(std::span(v));
      }
      RANK_CHECK(false);
    } catch (const error& e) {
      std::fprintf(stderr, "[rank %d] %s\n", comm.rank(), e.what());
      RANK_CHECK((e.code() == errc::mismatch || e.code() == errc::remote_error));
    }
  }, {.env = shm_env});
}

TEST_CASE("rings much smaller than the data carry large in-place operations exactly") {
  // 64 KiB rings: slices of 16 KiB, lent payloads and copied ones interleave, rings wrap
  // thousands of times, and frames straddle the ring's end.
  auto env = shm_env;
  env["CHORUS_SHM_RING_BYTES"] = "65536";
  for (int n : {2, 3, 5}) {
    CAPTURE(n);
    run_ranks(n, [](communicator& comm) {
      const std::size_t count = 1000003;  // prime: chunks and slices are uneven
      std::vector<std::int64_t> v(count);
      for (std::size_t i = 0; i < count; ++i) v[i] = static_cast<std::int64_t>(i) * (comm.rank() + 1);
      comm.all_reduce(std::span(v));
      const auto ranks = static_cast<std::int64_t>(comm.size());
      const std::int64_t factor = ranks * (ranks + 1) / 2;
      std::size_t wrong = 0;
      for (std::size_t i = 0; i < count; ++i) wrong += v[i] != static_cast<std::int64_t>(i) * factor;
      RANK_CHECK(wrong == 0);

      std::vector<std::int64_t> gathered(count * static_cast<std::size_t>(comm.size()));
      std::vector<std::int64_t> mine(count, comm.rank());
      comm.all_gather(std::span<const std::int64_t>(mine), std::span(gathered));
      for (std::size_t i = 0; i < gathered.size(); ++i) {
        wrong += gathered[i] != static_cast<std::int64_t>(i / count);
      }
      RANK_CHECK(wrong == 0);
    }, {.env = env});
  }
}

TEST_CASE("CHORUS_SHM_RING_BYTES must be a power of two, and CHORUS_SHM_SINGLE_COPY 0 or 1") {
  run_ranks(1, [](communicator&) {
    for (const auto& [name, value] : {std::pair{"CHORUS_SHM_RING_BYTES", "100000"}, {"CHORUS_SHM_RING_BYTES", "abc"},
                                      {"CHORUS_SHM_SINGLE_COPY", "2"}, {"CHORUS_SHM_SINGLE_COPY", "yes"}}) {
      ::setenv(name, value, 1);
      RANK_CHECK_THROWS_CODE((void)shm_options::from_env(), errc::invalid_argument);
      ::unsetenv(name);
    }
  }, {.env = shm_env});
}

TEST_CASE("only segments of our own pid namespace whose creator is gone are removed as stale") {
  // A pid that names no process now: a child's, once reaped.
  const pid_t gone = ::fork();
  if (gone == 0) ::_exit(0);
  REQUIRE(::waitpid(gone, nullptr, 0) == gone);
  const std::uint64_t ns = detail::pid_namespace_id();
  REQUIRE(ns != 0);
  auto make = [](const std::string& name) {
    const int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    REQUIRE(fd >= 0);
    ::close(fd);
  };
  const std::string pid = std::to_string(gone);
  const std::string ours = "/chorus-" + pid + "-ns" + std::to_string(ns) + "-test-stale";
  const std::string theirs = "/chorus-" + pid + "-ns" + std::to_string(ns + 1) + "-test-live";
  const std::string live = "/chorus-" + std::to_string(::getpid()) + "-ns" + std::to_string(ns) + "-test-live";
  for (const auto& n : {ours, theirs, live}) make(n);
  detail::remove_stale_segments(ns);
  const auto left = chorus_segments();
  CHECK(left.count(ours.substr(1)) == 0);    // its creator is gone
  CHECK(left.count(theirs.substr(1)) == 1);  // another namespace's pid says nothing here
  CHECK(left.count(live.substr(1)) == 1);    // its creator lives
  detail::remove_stale_segments(0);          // an unknown namespace judges none
  CHECK(chorus_segments().count(theirs.substr(1)) == 1);
  for (const auto& n : {ours, theirs, live}) ::shm_unlink(n.c_str());
  CHECK_FALSE(detail::same_pid_namespace(0, 0));
  CHECK(detail::same_pid_namespace(ns, ns));
}

TEST_CASE("a /dev/shm without room for the rings fails the ranks naming it, not with SIGBUS") {
  // A child makes a mount namespace of its own with a 4 MiB /dev/shm (Docker's default is 64),
  // and runs 4 ranks there whose rings take 2 MiB each way: the first pair of rings fills it.
  // Each rank exits 3 where its error names /dev/shm, 4 where it failed otherwise (its peers
  // learn of the failure from it), 5 where its all_reduce returned.
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t holder = ::fork();
  if (holder == 0) {
    if (::unshare(CLONE_NEWNS) != 0 || ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
        ::mount("tmpfs", "/dev/shm", "tmpfs", 0, "size=4m") != 0) {
      ::_exit(77);  // not allowed to mount here (no root)
    }
    auto env = shm_env;
    env["CHORUS_SHM_RING_BYTES"] = std::to_string(2 << 20);
    const auto status = chorus::test::run_processes(4, [](int) {
      int code = 5;
      try {
        auto comm = communicator::from_env<auto_transport>();
        std::vector<int> v(1 << 20, comm.rank());
        comm.all_reduce(std::span(v), {.algorithm = algo::ring});
      } catch (const error& e) {
        const bool names = e.code() == errc::system && std::strstr(e.what(), "no room in /dev/shm") != nullptr;
        std::fprintf(stderr, "%s\n", e.what());
        code = names ? 3 : 4;
      }
      std::fflush(stderr);
      ::_exit(code);
    }, {.deadline = std::chrono::seconds(60), .env = env});
    bool named = false, exited = true;
    for (int st : status) {
      exited = exited && WIFEXITED(st) && (WEXITSTATUS(st) == 3 || WEXITSTATUS(st) == 4);
      named = named || (WIFEXITED(st) && WEXITSTATUS(st) == 3);
    }
    ::_exit(exited && named ? 0 : 1);
  }
  int st = 0;
  REQUIRE(::waitpid(holder, &st, 0) == holder);
  REQUIRE(WIFEXITED(st));
  if (WEXITSTATUS(st) == 77) {
    MESSAGE("skipped: this process may not mount a tmpfs of its own (needs root)");
    return;
  }
  CHECK_MESSAGE(WEXITSTATUS(st) == 0, "a rank was killed, or none named /dev/shm (their errors are above)");
}

TEST_CASE("large rings and 2 MiB slices at 8 ranks on 2 cores give exact results") {
  // The shape in which a tail that moved back (published past a parsed header, then back to
  // the frame's start when the frame was lent) let a producer overrun the ring; all_reduce_perf
  // hung in about 4 of 10 runs of it. This test did not reproduce that hang reliably; it
  // stays as a stress test of lending with frames larger than the copy chunk.
  auto env = shm_env;
  env["CHORUS_SHM_RING_BYTES"] = std::to_string(16 << 20);
  run_ranks(8, [](communicator& comm) {
    const std::size_t count = std::size_t{16} << 20;  // 64 MiB of float
    std::vector<float> in(count), out(count);
    for (std::size_t i = 0; i < count; ++i) in[i] = static_cast<float>((i % 1024) + static_cast<std::size_t>(comm.rank()));
    for (int rep = 0; rep < 3; ++rep) {
      comm.all_reduce(std::span<const float>(in), std::span(out));
      std::size_t wrong = 0;
      for (std::size_t i = 0; i < count; ++i) {
        wrong += out[i] != static_cast<float>(8 * (i % 1024) + 28);
      }
      RANK_CHECK(wrong == 0);
    }
  }, {.deadline = std::chrono::seconds(120), .env = env});
}

TEST_CASE("a ring head over a ring ahead of our tail is a protocol error, not a read past the ring") {
  // Shared memory is written by another process: a head it corrupted must not be trusted. Here
  // a 4096-byte ring (the smallest shm_options allows) holds one frame header, and the head
  // claims 10000 bytes more: copying them would read past the ring's end.
  std::vector<std::byte> ring(4096);
  detail::shm_ring_ctl ctl{};
  detail::shm_member writer{};
  detail::shm_receiver rx(&ctl, {ring.data(), ring.size()}, &writer, 0, 0, 1);
  std::vector<std::byte> payload(16000);
  transfer x;
  x.header = detail::make_header({7, 4000}, 0, 0, 16000);
  x.data = payload.data();
  x.length = payload.size();
  const std::uint64_t tag = detail::shm_tag(0, 0);
  std::memcpy(ring.data(), &tag, sizeof tag);
  std::memcpy(ring.data() + detail::shm_tag_bytes, &x.header, sizeof x.header);
  ctl.head.store(64 + 10000);
  rx.post(&x);
  const error e = error_of([&] { rx.pump(); }, "a corrupt head was trusted");
  CHECK(e.code() == errc::protocol);
  CHECK(std::string(e.what()).find("ring from rank 1 is corrupt") != std::string::npos);
  CHECK(!x.done);
}

// ---------------------------------------------------------------------------------------
// Single copy: exposable sends read in place (process_vm_readv) by their receiver.

namespace {

/// One ring in this process, both ends, the sender's memory read by "pid" (ours).
struct ring_pair {
  std::vector<std::byte> ring = std::vector<std::byte>(4096);
  detail::shm_ring_ctl ctl{};
  detail::shm_member writer{}, reader{};
  detail::shm_sender tx{&ctl, {ring.data(), ring.size()}, &reader, 0, 0, true};  // rank 1 to rank 0
  detail::shm_receiver rx;
  explicit ring_pair(int reader_pid) : rx(&ctl, {ring.data(), ring.size()}, &writer, 0, 0, 1, reader_pid) {}
};

transfer make_transfer(std::vector<std::byte>& data, bool exposable) {
  transfer x;
  x.header = detail::make_header({7, data.size(), collective::all_gather, dtype::uint8, reduce_op::sum, algo::direct}, 0, 0,
                                 static_cast<std::uint32_t>(data.size()));
  x.data = data.data();
  x.length = data.size();
  x.exposable = exposable;
  return x;
}

}  // namespace

TEST_CASE("an exposable send goes as one line and completes only once its receiver has read it in place") {
  ring_pair r(::getpid());
  std::vector<std::byte> sent(256 * 1024), got(sent.size());
  for (std::size_t i = 0; i < sent.size(); ++i) sent[i] = static_cast<std::byte>(i * 7 + 3);
  transfer out = make_transfer(sent, true);
  transfer in = make_transfer(got, false);
  r.tx.post(&out);
  r.tx.flush();
  CHECK(r.ctl.head.load() == detail::shm_line);  // the payload did not go through the ring
  CHECK(!out.done);
  CHECK(r.tx.busy());
  r.rx.post(&in);
  r.rx.pump();
  CHECK(in.done);
  CHECK(!in.lent);
  CHECK(got == sent);
  CHECK(!out.done);  // the sender learns it at its next look
  CHECK(r.tx.room_changed());
  r.tx.flush();
  CHECK(out.done);
  CHECK(!r.tx.busy());
}

TEST_CASE("check frames take one line each, are passed over where they name our own call, and are a mismatch where they do not") {
  ring_pair r(0);
  std::vector<std::byte> sent(100, std::byte{9}), got(sent.size());
  transfer out = make_transfer(sent, false);
  transfer in = make_transfer(got, false);
  detail::call_history mine;
  mine.record({7, 100, collective::all_gather, dtype::uint8, reduce_op::sum, algo::direct});
  r.rx.remember(&mine);
  // Our own call, then data: the receiver, with nothing posted, reads the check alone.
  r.tx.post_check(detail::check_header_of(in.header));
  r.tx.post_check(detail::check_header_of(in.header));  // still queued: nothing more to say
  r.tx.post(&out);
  r.tx.flush();
  CHECK(r.ctl.head.load() == detail::shm_line + detail::shm_frame_bytes(sent.size()));
  CHECK(r.rx.skim_checks());
  CHECK(!r.rx.skim_checks());  // the data frame is not a check: left for its receive
  r.rx.post(&in);
  r.rx.pump();
  CHECK(in.done);
  CHECK(got == sent);
  // Another call of that number: a mismatch naming both, read by a posted receive too.
  transfer again = make_transfer(got, false);
  detail::frame_header other = in.header;
  other.count = 50;
  r.tx.post_check(detail::check_header_of(other));
  r.tx.flush();
  r.rx.post(&again);
  const error e = error_of([&] { r.rx.pump(); }, "a check frame of another call was passed over");
  CHECK(e.code() == errc::mismatch);
  CHECK(std::string(e.what()).find("count=50") != std::string::npos);
  CHECK(std::string(e.what()).find("count=100") != std::string::npos);
  CHECK(!again.done);
}

TEST_CASE("small or unexposable sends, and sends to a receiver that cannot read us, go through the ring") {
  struct send_case {
    std::size_t bytes;
    bool exposable, pulls;
  };
  for (const send_case c : {send_case{1000, true, true}, send_case{100000, false, true}, send_case{100000, true, false}}) {
    // (No structured bindings: clang 14 cannot capture them in CAPTURE's lambda.)
    const std::size_t bytes = c.bytes;
    const bool exposable = c.exposable, pulls = c.pulls;
    CAPTURE(bytes);
    CAPTURE(exposable);
    std::vector<std::byte> ring(1 << 20);
    detail::shm_ring_ctl ctl{};
    detail::shm_member writer{}, reader{};
    detail::shm_sender tx(&ctl, {ring.data(), ring.size()}, &reader, 0, 1, pulls);
    detail::shm_receiver rx(&ctl, {ring.data(), ring.size()}, &writer, 0, 1, 0, ::getpid());
    std::vector<std::byte> sent(bytes, std::byte{42}), got(bytes);
    transfer out = make_transfer(sent, exposable);
    transfer in = make_transfer(got, false);
    tx.post(&out);
    tx.flush();
    CHECK(out.done);  // copied into the ring: done at once
    CHECK(ctl.head.load() > bytes);
    rx.post(&in);
    rx.pump();
    CHECK(in.done);
    CHECK(got == sent);
  }
}

TEST_CASE("a pull frame naming memory the sender does not have is a protocol error naming the sender") {
  ring_pair r(::getpid());
  std::vector<std::byte> sent(128 * 1024), got(sent.size());
  transfer out = make_transfer(sent, true);
  transfer in = make_transfer(got, false);
  r.tx.post(&out);
  r.tx.flush();
  // Point the frame's address at a page nobody maps.
  detail::shm_pull_desc d{};
  std::memcpy(&d, r.ring.data() + detail::shm_prefix_bytes, sizeof d);
  d.address = 4096;
  std::memcpy(r.ring.data() + detail::shm_prefix_bytes, &d, sizeof d);
  r.rx.post(&in);
  const error e = error_of([&] { r.rx.pump(); }, "a bad address was read");
  INFO(std::string(e.what()));
  CHECK(e.code() == errc::protocol);
  CHECK(e.ranks() == std::vector<int>{1});
  CHECK(std::string(e.what()).find("rank 1 offered at 0x1000 in place failed") != std::string::npos);
  CHECK(!in.done);
  CHECK(!out.done);
}

TEST_CASE("a pull frame to a receiver that cannot read its sender is a protocol error, not a hang") {
  ring_pair r(0);  // another pid namespace, or CHORUS_SHM_SINGLE_COPY=0 here
  std::vector<std::byte> sent(128 * 1024), got(sent.size());
  transfer out = make_transfer(sent, true);
  transfer in = make_transfer(got, false);
  r.tx.post(&out);
  r.tx.flush();
  r.rx.post(&in);
  const error e = error_of([&] { r.rx.pump(); }, "an unreadable pull frame was accepted");
  CHECK(e.code() == errc::protocol);
  CHECK(std::string(e.what()).find("cannot read") != std::string::npos);
}

TEST_CASE("a receiver does not complete a read in place from a sender that has failed meanwhile") {
  // The sender may have handed its buffer back to its caller after failing: what is read
  // then is not what it sent. The transport's check of its peers then names the failure.
  ring_pair r(::getpid());
  std::vector<std::byte> sent(128 * 1024, std::byte{1}), got(sent.size());
  transfer out = make_transfer(sent, true);
  transfer in = make_transfer(got, false);
  r.tx.post(&out);
  r.tx.flush();
  r.writer.failed.store(1);
  r.rx.post(&in);
  r.rx.pump();
  CHECK(!in.done);
  CHECK(r.ctl.pulled.load() == 0);
  r.rx.pump();
  CHECK(!in.done);
}

TEST_CASE("a count of payloads read in place beyond those offered is a protocol error") {
  ring_pair r(::getpid());
  std::vector<std::byte> sent(128 * 1024);
  transfer out = make_transfer(sent, true);
  r.tx.post(&out);
  r.tx.flush();
  r.ctl.pulled.store(5);
  const error e = error_of([&] { r.tx.flush(); }, "a corrupt count was trusted");
  CHECK(e.code() == errc::protocol);
  CHECK(std::string(e.what()).find("ring to rank 0 is corrupt") != std::string::npos);
}

TEST_CASE("ranks of one node read each other's direct sends in place unless CHORUS_SHM_SINGLE_COPY=0, with exact results either way") {
  for (const char* single : {"1", "0"}) {
    CAPTURE(single);
    auto env = shm_env;
    env["CHORUS_SHM_SINGLE_COPY"] = single;
    run_ranks(4, [single](communicator& comm) {
      const std::string d = comm.describe();
      RANK_CHECK(d.find(std::string(single) == "1" ? ", single copy inside" : ", single copy off") != std::string::npos);
      const std::size_t count = (std::size_t{3} << 20) + 7;  // chunks of ~3 MiB, uneven
      std::vector<float> in(count), out(count);
      for (std::size_t i = 0; i < count; ++i) in[i] = static_cast<float>(i % 1000 + static_cast<std::size_t>(comm.rank()));
      for (bool in_place : {false, true}) {
        if (in_place) out = in;
        if (in_place) {
          comm.all_reduce(std::span(out), {.algorithm = algo::direct});
        } else {
          comm.all_reduce(std::span<const float>(in), std::span(out), {.algorithm = algo::direct});
        }
        std::size_t wrong = 0;
        for (std::size_t i = 0; i < count; ++i) wrong += out[i] != static_cast<float>(4 * (i % 1000) + 6);
        RANK_CHECK(wrong == 0);
      }
      // A large point-to-point message read in place only when the sender asks for it.
      std::vector<std::uint8_t> msg(1 << 20, static_cast<std::uint8_t>(comm.rank()));
      std::vector<std::uint8_t> got(msg.size());
      const int right = (comm.rank() + 1) % comm.size(), left = (comm.rank() + 3) % comm.size();
      comm.sendrecv(std::span<const std::uint8_t>(msg), right, std::span(got), left, {.single_copy = true});
      RANK_CHECK(got == std::vector<std::uint8_t>(msg.size(), static_cast<std::uint8_t>(left)));
    }, {.env = env});
  }
}

TEST_CASE("a rank killed while its peers read its sends in place fails every survivor naming it") {
  const auto before = chorus_segments();
  test::shared_counters past_first(1);  // ranks past the first all_reduce
  run_ranks(4, [&](communicator& comm) {
    std::vector<float> v(std::size_t{4} << 20, 1.0f);  // 16 MiB: pulled in 256 KiB slices
    comm.all_reduce(std::span(v), {.algorithm = algo::direct});
    ++past_first[0];
    if (comm.rank() == 3) {
      // Our first all_reduce can end before the others' do, and our death fails every call
      // of theirs in flight (a clean-clone CI run met it: rank 2's first call failed). So
      // once every rank is past it, die as soon as our sends are offered, while the others
      // read them.
      past_first.wait_for(0, 4);
      auto req = comm.all_reduce_async(std::span(v), {.algorithm = algo::direct});
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      ::raise(SIGKILL);
    }
    try {
      for (int i = 0; i < 20; ++i) comm.all_reduce(std::span(v), {.algorithm = algo::direct});
      RANK_CHECK(false);
    } catch (const error& e) {
      std::fprintf(stderr, "[rank %d] %s\n", comm.rank(), e.what());
      RANK_CHECK((e.code() == errc::connection_lost || e.code() == errc::peer_failed));
      RANK_CHECK(e.ranks() == std::vector<int>{3});
    }
  }, {.env = shm_env, .expect_killed = {3}});
  CHECK(chorus_segments() == before);
}
