// SPDX-License-Identifier: Apache-2.0
// Who this process is and where rank 0 listens, read from the launcher's environment.
#pragma once

#include <chorus/error.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

namespace chorus {

/// getenv's contract: the value of the named variable, or nullptr when it is unset.
/// Tests pass a lambda over a map; programs use launch_info_from_env().
using getenv_function = std::function<const char*(const char*)>;

/// What the launcher told this process.
struct launch_info {
  int rank = 0;             ///< in [0, size)
  int size = 1;             ///< >= 1
  int local_rank = 0;       ///< in [0, local_size); 0 when the launcher does not say
  int local_size = 1;       ///< ranks on this node, <= size; 1 when the launcher does not say
  std::string master_addr;  ///< host of rank 0's store: a name or IPv4/IPv6 literal
  std::uint16_t master_port = 29500;  ///< in [1, 65535]
  std::string launcher;               ///< "chorus" | "torchrun" | "mpirun" | "srun" | "none"
};

/// Reads the launcher's environment. The first launcher whose rank and size variables are set
/// wins, in this order:
///
///   1. chorus:   CHORUS_RANK, CHORUS_WORLD_SIZE (overrides every launcher below).
///   2. torchrun: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE.
///   3. mpirun:   OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK,
///                OMPI_COMM_WORLD_LOCAL_SIZE (Open MPI).
///   4. srun:     SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, and the tasks on this node from
///                SLURM_NTASKS_PER_NODE, else SLURM_STEP_TASKS_PER_NODE or SLURM_TASKS_PER_NODE
///                ("4(x2),3": the entry of node SLURM_NODEID, else the first number).
///   5. none:     a single process, rank 0 of 1.
///
/// Independently of the launcher, CHORUS_LOCAL_RANK + CHORUS_LOCAL_WORLD_SIZE override the
/// local fields, CHORUS_MASTER_ADDR (else MASTER_ADDR) gives the store's host and
/// CHORUS_MASTER_PORT (else MASTER_PORT, else 29500) its port. A bracketed IPv6 literal
/// ("[::1]") is accepted and unbracketed.
///
/// Variables come in pairs (rank with size, local rank with local size): one without the other
/// is an error naming the missing one, because silently falling back to another launcher
/// would start a job whose ranks disagree about its size. An empty variable counts as unset.
///
/// Throws chorus::error(errc::invalid_argument) naming the variable and its value for text
/// that is not a number, trailing garbage, overflow, a negative rank, a rank not below the
/// size, a port outside [1, 65535], and for size > 1 with no address (size 1 needs none:
/// master_addr is then "127.0.0.1").
///
/// **Example**:
///   // torchrun --nproc-per-node=4 train.py
///   chorus::launch_info me = chorus::launch_info_from_env();  // {rank 2, size 4, "torchrun"}
launch_info launch_info_from_env();
launch_info launch_info_from(const getenv_function& getenv_fn);

/// Parses `value` of variable `name` as a decimal int in [lo, hi]: no sign other than a
/// leading '-', no spaces, no trailing characters. Throws errc::invalid_argument with messages
/// such as "CHORUS_RANK='abc' is not an integer" or "CHORUS_WORLD_SIZE=0 must be at least 1".
int parse_env_int(std::string_view name, std::string_view value, int lo, int hi);

/// Parses `value` of variable `name` as a positive, finite number of seconds, which may be
/// fractional ("2.5"); rounds up to whole milliseconds. At most 10^7 s.
std::chrono::milliseconds parse_env_seconds(std::string_view name, std::string_view value);

/// The int in variable `name`, or `fallback` when it is unset or empty; see parse_env_int.
///
/// **Example**: `int slices = chorus::env_int("CHORUS_SLICES", 4, 1, 64);`
int env_int(const char* name, int fallback, int lo, int hi);
int env_int(const getenv_function& getenv_fn, const char* name, int fallback, int lo, int hi);

/// The duration in seconds in variable `name`, or `fallback` when unset or empty.
///
/// **Example**: `auto t = chorus::env_seconds("CHORUS_BOOTSTRAP_TIMEOUT",
/// std::chrono::seconds(120));`
std::chrono::milliseconds env_seconds(const char* name, std::chrono::milliseconds fallback);
std::chrono::milliseconds env_seconds(const getenv_function& getenv_fn, const char* name,
                                      std::chrono::milliseconds fallback);

}  // namespace chorus

#include <chorus/bootstrap/detail/env_impl.hpp>
