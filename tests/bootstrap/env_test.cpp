// SPDX-License-Identifier: Apache-2.0
// Tests for chorus/bootstrap/env.hpp: every launcher's variables, precedence and bad values.
#include <doctest/doctest.h>

#include <chorus/bootstrap/env.hpp>
#include <chrono>
#include <map>
#include <string>

namespace {

using env_map = std::map<std::string, std::string>;

chorus::launch_info from(const env_map& env) {
  return chorus::launch_info_from([&env](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

// The message of the invalid_argument error that reading `env` throws.
std::string error_of(const env_map& env) {
  try {
    from(env);
  } catch (const chorus::error& e) {
    CHECK(e.code() == chorus::errc::invalid_argument);
    return e.what();
  }
  FAIL("no error thrown");
  return {};
}

}  // namespace

TEST_CASE("no launcher at all means a single process, rank 0 of 1, on loopback") {
  auto info = from({});
  CHECK(info.rank == 0);
  CHECK(info.size == 1);
  CHECK(info.local_rank == 0);
  CHECK(info.local_size == 1);
  CHECK(info.master_addr == "127.0.0.1");
  CHECK(info.master_port == 29500);
  CHECK(info.launcher == "none");
}

TEST_CASE("CHORUS_ variables give rank, size, local rank, local size, address and port") {
  auto info = from({{"CHORUS_RANK", "3"},
                    {"CHORUS_WORLD_SIZE", "8"},
                    {"CHORUS_LOCAL_RANK", "1"},
                    {"CHORUS_LOCAL_WORLD_SIZE", "2"},
                    {"CHORUS_MASTER_ADDR", "node0"},
                    {"CHORUS_MASTER_PORT", "1234"}});
  CHECK(info.rank == 3);
  CHECK(info.size == 8);
  CHECK(info.local_rank == 1);
  CHECK(info.local_size == 2);
  CHECK(info.master_addr == "node0");
  CHECK(info.master_port == 1234);
  CHECK(info.launcher == "chorus");
}

TEST_CASE("torchrun's variables are read, MASTER_PORT defaulting to 29500") {
  auto info = from({{"RANK", "5"},
                    {"WORLD_SIZE", "6"},
                    {"LOCAL_RANK", "1"},
                    {"LOCAL_WORLD_SIZE", "3"},
                    {"MASTER_ADDR", "10.0.0.1"}});
  CHECK(info.rank == 5);
  CHECK(info.size == 6);
  CHECK(info.local_rank == 1);
  CHECK(info.local_size == 3);
  CHECK(info.master_addr == "10.0.0.1");
  CHECK(info.master_port == 29500);
  CHECK(info.launcher == "torchrun");
}

TEST_CASE("Open MPI's variables are read and the address comes from MASTER_ADDR") {
  auto info = from({{"OMPI_COMM_WORLD_RANK", "2"},
                    {"OMPI_COMM_WORLD_SIZE", "4"},
                    {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                    {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                    {"MASTER_ADDR", "::1"},
                    {"MASTER_PORT", "4000"}});
  CHECK(info.rank == 2);
  CHECK(info.size == 4);
  CHECK(info.local_rank == 0);
  CHECK(info.local_size == 2);
  CHECK(info.master_addr == "::1");
  CHECK(info.master_port == 4000);
  CHECK(info.launcher == "mpirun");
}

TEST_CASE("Slurm's variables are read, tasks per node from SLURM_NTASKS_PER_NODE") {
  auto info = from({{"SLURM_PROCID", "7"},
                    {"SLURM_NTASKS", "8"},
                    {"SLURM_LOCALID", "3"},
                    {"SLURM_NTASKS_PER_NODE", "4"},
                    {"CHORUS_MASTER_ADDR", "head"}});
  CHECK(info.rank == 7);
  CHECK(info.size == 8);
  CHECK(info.local_rank == 3);
  CHECK(info.local_size == 4);
  CHECK(info.master_addr == "head");
  CHECK(info.launcher == "srun");
}

TEST_CASE("Slurm's task list gives this node's entry, or the first number without SLURM_NODEID") {
  env_map env{{"SLURM_PROCID", "9"},
              {"SLURM_NTASKS", "11"},
              {"SLURM_LOCALID", "0"},
              {"SLURM_TASKS_PER_NODE", "4(x2),3"},
              {"MASTER_ADDR", "head"}};
  CHECK(from(env).local_size == 4);
  env["SLURM_NODEID"] = "2";
  CHECK(from(env).local_size == 3);
  env["SLURM_STEP_TASKS_PER_NODE"] = "2(x3),5";
  CHECK(from(env).local_size == 2);
}

TEST_CASE("CHORUS_ variables override torchrun, Open MPI and Slurm") {
  auto info = from({{"CHORUS_RANK", "1"},
                    {"CHORUS_WORLD_SIZE", "2"},
                    {"CHORUS_MASTER_ADDR", "chorus-host"},
                    {"CHORUS_MASTER_PORT", "7000"},
                    {"RANK", "5"},
                    {"WORLD_SIZE", "6"},
                    {"MASTER_ADDR", "torch-host"},
                    {"MASTER_PORT", "8000"},
                    {"OMPI_COMM_WORLD_RANK", "3"},
                    {"OMPI_COMM_WORLD_SIZE", "4"},
                    {"SLURM_PROCID", "0"},
                    {"SLURM_NTASKS", "9"}});
  CHECK(info.rank == 1);
  CHECK(info.size == 2);
  CHECK(info.master_addr == "chorus-host");
  CHECK(info.master_port == 7000);
  CHECK(info.launcher == "chorus");
}

TEST_CASE("torchrun wins over Open MPI, and Open MPI over Slurm") {
  env_map env{{"RANK", "1"},
              {"WORLD_SIZE", "2"},
              {"OMPI_COMM_WORLD_RANK", "3"},
              {"OMPI_COMM_WORLD_SIZE", "4"},
              {"SLURM_PROCID", "5"},
              {"SLURM_NTASKS", "6"},
              {"MASTER_ADDR", "h"}};
  CHECK(from(env).launcher == "torchrun");
  env.erase("RANK");
  env.erase("WORLD_SIZE");
  CHECK(from(env).launcher == "mpirun");
  CHECK(from(env).rank == 3);
  env.erase("OMPI_COMM_WORLD_RANK");
  env.erase("OMPI_COMM_WORLD_SIZE");
  CHECK(from(env).launcher == "srun");
  CHECK(from(env).rank == 5);
}

TEST_CASE("CHORUS_LOCAL_ variables override the launcher's local rank and size") {
  auto info = from({{"RANK", "3"},
                    {"WORLD_SIZE", "4"},
                    {"LOCAL_RANK", "1"},
                    {"LOCAL_WORLD_SIZE", "2"},
                    {"CHORUS_LOCAL_RANK", "3"},
                    {"CHORUS_LOCAL_WORLD_SIZE", "4"},
                    {"MASTER_ADDR", "h"}});
  CHECK(info.local_rank == 3);
  CHECK(info.local_size == 4);
}

TEST_CASE("CHORUS_MASTER_ADDR and CHORUS_MASTER_PORT override MASTER_ADDR and MASTER_PORT") {
  auto info = from({{"RANK", "0"},
                    {"WORLD_SIZE", "2"},
                    {"MASTER_ADDR", "a"},
                    {"MASTER_PORT", "1000"},
                    {"CHORUS_MASTER_ADDR", "b"},
                    {"CHORUS_MASTER_PORT", "2000"}});
  CHECK(info.master_addr == "b");
  CHECK(info.master_port == 2000);
}

TEST_CASE("a bracketed IPv6 address is unbracketed") {
  auto info =
      from({{"CHORUS_RANK", "0"}, {"CHORUS_WORLD_SIZE", "2"}, {"CHORUS_MASTER_ADDR", "[::1]"}});
  CHECK(info.master_addr == "::1");
}

TEST_CASE("an empty variable counts as unset") {
  auto info = from({{"CHORUS_RANK", ""}, {"CHORUS_WORLD_SIZE", ""}, {"MASTER_PORT", ""}});
  CHECK(info.launcher == "none");
  CHECK(info.master_port == 29500);
}

TEST_CASE("a rank without its size, or a size without its rank, names the missing variable") {
  CHECK(error_of({{"CHORUS_RANK", "1"}}) ==
        "chorus: CHORUS_RANK is set but CHORUS_WORLD_SIZE is not; set both or neither");
  CHECK(error_of({{"CHORUS_WORLD_SIZE", "2"}}) ==
        "chorus: CHORUS_WORLD_SIZE is set but CHORUS_RANK is not; set both or neither");
  CHECK(error_of({{"CHORUS_RANK", "0"}, {"CHORUS_WORLD_SIZE", "1"}, {"CHORUS_LOCAL_RANK", "0"}}) ==
        "chorus: CHORUS_LOCAL_RANK is set but CHORUS_LOCAL_WORLD_SIZE is not; set both or neither");
  CHECK(error_of({{"RANK", "0"}}) ==
        "chorus: RANK is set but WORLD_SIZE is not; set both or neither");
  CHECK(error_of({{"OMPI_COMM_WORLD_SIZE", "2"}}) ==
        "chorus: OMPI_COMM_WORLD_SIZE is set but OMPI_COMM_WORLD_RANK is not; set both or neither");
}

TEST_CASE("a value that is not an integer is named with its text") {
  CHECK(error_of({{"CHORUS_RANK", "abc"}, {"CHORUS_WORLD_SIZE", "4"}}) ==
        "chorus: CHORUS_RANK='abc' is not an integer");
  CHECK(error_of({{"CHORUS_RANK", "3x"}, {"CHORUS_WORLD_SIZE", "4"}}) ==
        "chorus: CHORUS_RANK='3x' is not an integer");
  CHECK(error_of({{"CHORUS_RANK", " 3"}, {"CHORUS_WORLD_SIZE", "4"}}) ==
        "chorus: CHORUS_RANK=' 3' is not an integer");
  CHECK(error_of({{"CHORUS_RANK", "1.0"}, {"CHORUS_WORLD_SIZE", "4"}}) ==
        "chorus: CHORUS_RANK='1.0' is not an integer");
  CHECK(error_of({{"RANK", "0"}, {"WORLD_SIZE", "+2"}}) ==
        "chorus: WORLD_SIZE='+2' is not an integer");
}

TEST_CASE("negative, overflowing and out-of-range values are named with their text") {
  CHECK(error_of({{"CHORUS_RANK", "-1"}, {"CHORUS_WORLD_SIZE", "4"}}) ==
        "chorus: CHORUS_RANK=-1 is negative");
  CHECK(error_of({{"CHORUS_RANK", "0"}, {"CHORUS_WORLD_SIZE", "0"}}) ==
        "chorus: CHORUS_WORLD_SIZE=0 must be at least 1");
  CHECK(error_of({{"CHORUS_RANK", "99999999999999999999"}, {"CHORUS_WORLD_SIZE", "4"}}) ==
        "chorus: CHORUS_RANK='99999999999999999999' is out of range");
  CHECK(error_of({{"CHORUS_RANK", "0"}, {"CHORUS_WORLD_SIZE", "4294967296"}}) ==
        "chorus: CHORUS_WORLD_SIZE=4294967296 must be at most 2147483647");
}

TEST_CASE("a rank not below the size is named with both variables") {
  CHECK(error_of({{"CHORUS_RANK", "5"}, {"CHORUS_WORLD_SIZE", "4"}}) ==
        "chorus: CHORUS_RANK=5 is not below CHORUS_WORLD_SIZE=4");
  CHECK(error_of({{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}}) ==
        "chorus: RANK=2 is not below WORLD_SIZE=2");
  CHECK(error_of({{"OMPI_COMM_WORLD_RANK", "0"},
                  {"OMPI_COMM_WORLD_SIZE", "4"},
                  {"OMPI_COMM_WORLD_LOCAL_RANK", "2"},
                  {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                  {"MASTER_ADDR", "h"}}) ==
        "chorus: OMPI_COMM_WORLD_LOCAL_RANK=2 is not below OMPI_COMM_WORLD_LOCAL_SIZE=2");
  CHECK(error_of({{"CHORUS_RANK", "0"},
                  {"CHORUS_WORLD_SIZE", "2"},
                  {"CHORUS_LOCAL_RANK", "0"},
                  {"CHORUS_LOCAL_WORLD_SIZE", "3"},
                  {"MASTER_ADDR", "h"}}) ==
        "chorus: CHORUS_LOCAL_WORLD_SIZE=3 exceeds CHORUS_WORLD_SIZE=2");
}

TEST_CASE("a port of 0 or above 65535 is named with its variable") {
  CHECK(error_of({{"CHORUS_MASTER_PORT", "0"}}) ==
        "chorus: CHORUS_MASTER_PORT=0 must be at least 1");
  CHECK(error_of({{"MASTER_PORT", "65536"}}) == "chorus: MASTER_PORT=65536 must be at most 65535");
  CHECK(error_of({{"MASTER_PORT", "http"}}) == "chorus: MASTER_PORT='http' is not an integer");
  CHECK(from({{"MASTER_PORT", "65535"}}).master_port == 65535);
}

TEST_CASE("several ranks without an address name the variables to set") {
  CHECK(error_of({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}}) ==
        "chorus: no rendezvous address: 2 ranks were launched by mpirun but neither "
        "CHORUS_MASTER_ADDR nor MASTER_ADDR is set; set CHORUS_MASTER_ADDR to the host of rank 0 "
        "(and CHORUS_MASTER_PORT, default 29500)");
  CHECK(
      error_of({{"CHORUS_RANK", "0"}, {"CHORUS_WORLD_SIZE", "2"}, {"CHORUS_MASTER_ADDR", "a b"}}) ==
      "chorus: CHORUS_MASTER_ADDR='a b' is not a host name or IP address");
}

TEST_CASE("a malformed Slurm task list is named with its text") {
  CHECK(error_of({{"SLURM_PROCID", "0"},
                  {"SLURM_NTASKS", "2"},
                  {"SLURM_LOCALID", "0"},
                  {"SLURM_TASKS_PER_NODE", "2(x"},
                  {"MASTER_ADDR", "h"}}) ==
        "chorus: SLURM_TASKS_PER_NODE='2(x' is not a Slurm task list such as '4(x2),3'");
  CHECK(error_of({{"SLURM_PROCID", "0"},
                  {"SLURM_NTASKS", "2"},
                  {"SLURM_LOCALID", "0"},
                  {"MASTER_ADDR", "h"}}) ==
        "chorus: SLURM_LOCALID is set but none of SLURM_NTASKS_PER_NODE, "
        "SLURM_STEP_TASKS_PER_NODE, SLURM_TASKS_PER_NODE is");
}

TEST_CASE("env_int returns the fallback when unset and checks bounds when set") {
  env_map env{{"N", "12"}, {"BAD", "12a"}};
  auto get = [&env](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  };
  CHECK(chorus::env_int(get, "UNSET", 7, 0, 10) == 7);
  CHECK(chorus::env_int(get, "N", 7, 0, 20) == 12);
  CHECK_THROWS_WITH_AS(chorus::env_int(get, "N", 7, 0, 10), "chorus: N=12 must be at most 10",
                       chorus::error);
  CHECK_THROWS_WITH_AS(chorus::env_int(get, "BAD", 7, 0, 10), "chorus: BAD='12a' is not an integer",
                       chorus::error);
}

TEST_CASE("durations are positive seconds, possibly fractional, rounded up to milliseconds") {
  using std::chrono::milliseconds;
  CHECK(chorus::parse_env_seconds("T", "2") == milliseconds(2000));
  CHECK(chorus::parse_env_seconds("T", "0.25") == milliseconds(250));
  CHECK(chorus::parse_env_seconds("T", "0.0001") == milliseconds(1));
  CHECK_THROWS_WITH_AS(chorus::parse_env_seconds("CHORUS_BOOTSTRAP_TIMEOUT", "soon"),
                       "chorus: CHORUS_BOOTSTRAP_TIMEOUT='soon' is not a number of seconds",
                       chorus::error);
  CHECK_THROWS_WITH_AS(chorus::parse_env_seconds("T", "1s"),
                       "chorus: T='1s' is not a number of seconds", chorus::error);
  CHECK_THROWS_WITH_AS(chorus::parse_env_seconds("T", "0"),
                       "chorus: T=0 must be a positive number of seconds", chorus::error);
  CHECK_THROWS_WITH_AS(chorus::parse_env_seconds("T", "-3"),
                       "chorus: T=-3 must be a positive number of seconds", chorus::error);
  CHECK_THROWS_WITH_AS(chorus::parse_env_seconds("T", "1e999"),
                       "chorus: T='1e999' is not a number of seconds", chorus::error);
  CHECK_THROWS_WITH_AS(chorus::parse_env_seconds("T", "inf"),
                       "chorus: T='inf' is not a number of seconds", chorus::error);
  CHECK_THROWS_WITH_AS(chorus::parse_env_seconds("T", "99999999"),
                       "chorus: T=99999999 must be at most 10000000 seconds", chorus::error);
  env_map env{{"T", "1.5"}};
  auto get = [&env](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  };
  CHECK(chorus::env_seconds(get, "T", milliseconds(5)) == milliseconds(1500));
  CHECK(chorus::env_seconds(get, "UNSET", milliseconds(5)) == milliseconds(5));
}
