// SPDX-License-Identifier: Apache-2.0
// Definitions behind chorus/bootstrap/env.hpp: number parsing and launcher detection.
#pragma once

#include <charconv>
#include <chorus/bootstrap/env.hpp>
#include <chorus/error.hpp>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

namespace chorus {
namespace detail {

[[noreturn]] inline void launch_env_error(std::string message) {
  throw error(errc::invalid_argument, std::move(message), {}, std::nullopt, "environment");
}

// A variable's value, or nullopt when it is unset or empty. Empty counts as unset because
// shells and job templates commonly export VAR= to mean "not given".
inline std::optional<std::string_view> launch_env_value(const getenv_function& getenv_fn,
                                                        const char* name) {
  const char* value = getenv_fn(name);
  if (value == nullptr || *value == '\0') return std::nullopt;
  return std::string_view(value);
}

struct launch_env_var {
  const char* name;
  int value;
};

// Reads a (rank, size)-like pair: both set, or neither. One without the other is an error
// naming the missing one.
inline std::optional<std::pair<launch_env_var, launch_env_var>> launch_env_pair(
    const getenv_function& getenv_fn, const char* first, int first_min, const char* second,
    int second_min) {
  auto a = launch_env_value(getenv_fn, first);
  auto b = launch_env_value(getenv_fn, second);
  if (!a && !b) return std::nullopt;
  if (!b) {
    launch_env_error(std::string(first) + " is set but " + second + " is not; set both or neither");
  }
  if (!a) {
    launch_env_error(std::string(second) + " is set but " + first + " is not; set both or neither");
  }
  constexpr int int_max = std::numeric_limits<int>::max();
  return std::pair{launch_env_var{first, parse_env_int(first, *a, first_min, int_max)},
                   launch_env_var{second, parse_env_int(second, *b, second_min, int_max)}};
}

// The tasks on this node from a Slurm task list such as "4(x2),3": entry `node` when given and
// in range, else the first.
inline int slurm_tasks_on_node(std::string_view name, std::string_view list,
                               std::optional<int> node) {
  auto bad = [&]() -> int {
    launch_env_error(std::string(name) + "='" + std::string(list) +
                     "' is not a Slurm task list such as '4(x2),3'");
  };
  std::vector<std::pair<int, int>> runs;  // (tasks, repeat)
  std::string_view rest = list;
  while (!rest.empty()) {
    std::size_t comma = rest.find(',');
    std::string_view item = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
    if (comma != std::string_view::npos && rest.empty()) bad();
    int tasks = 0;
    int repeat = 1;
    const char* end = item.data() + item.size();
    auto [p, ec] = std::from_chars(item.data(), end, tasks);
    if (ec != std::errc{} || p == item.data() || tasks < 1) bad();
    if (p != end) {
      std::string_view tail(p, static_cast<std::size_t>(end - p));
      if (tail.size() < 4 || tail.substr(0, 2) != "(x" || tail.back() != ')') bad();
      const char* rb = tail.data() + 2;
      const char* re = tail.data() + tail.size() - 1;
      auto [q, ec2] = std::from_chars(rb, re, repeat);
      if (ec2 != std::errc{} || q != re || repeat < 1) bad();
    }
    runs.emplace_back(tasks, repeat);
  }
  if (runs.empty()) bad();
  if (node) {
    long long index = *node;
    for (auto [tasks, repeat] : runs) {
      if (index < repeat) return tasks;
      index -= repeat;
    }
  }
  return runs.front().first;
}

}  // namespace detail

inline int parse_env_int(std::string_view name, std::string_view value, int lo, int hi) {
  std::string shown = std::string(name) + "='" + std::string(value) + "'";
  long long parsed = 0;
  const char* end = value.data() + value.size();
  auto [p, ec] = std::from_chars(value.data(), end, parsed);
  if (ec == std::errc::result_out_of_range) {
    detail::launch_env_error(shown + " is out of range");
  }
  if (ec != std::errc{} || p != end || value.empty()) {
    detail::launch_env_error(shown + " is not an integer");
  }
  std::string plain = std::string(name) + "=" + std::string(value);
  if (parsed < lo) {
    if (lo == 0) detail::launch_env_error(plain + " is negative");
    detail::launch_env_error(plain + " must be at least " + std::to_string(lo));
  }
  if (parsed > hi) {
    detail::launch_env_error(plain + " must be at most " + std::to_string(hi));
  }
  return static_cast<int>(parsed);
}

inline std::chrono::milliseconds parse_env_seconds(std::string_view name, std::string_view value) {
  std::string shown = std::string(name) + "='" + std::string(value) + "'";
  double seconds = 0;
  const char* end = value.data() + value.size();
  auto [p, ec] = std::from_chars(value.data(), end, seconds, std::chars_format::fixed);
  if (ec == std::errc::result_out_of_range) {
    detail::launch_env_error(shown + " is out of range");
  }
  if (ec != std::errc{} || p != end || value.empty() || !std::isfinite(seconds)) {
    detail::launch_env_error(shown + " is not a number of seconds");
  }
  std::string plain = std::string(name) + "=" + std::string(value);
  if (seconds <= 0) detail::launch_env_error(plain + " must be a positive number of seconds");
  constexpr double max_seconds = 1e7;
  if (seconds > max_seconds) {
    detail::launch_env_error(plain + " must be at most 10000000 seconds");
  }
  return std::chrono::milliseconds(static_cast<std::int64_t>(std::ceil(seconds * 1000.0)));
}

inline int env_int(const getenv_function& getenv_fn, const char* name, int fallback, int lo,
                   int hi) {
  auto value = detail::launch_env_value(getenv_fn, name);
  return value ? parse_env_int(name, *value, lo, hi) : fallback;
}

inline int env_int(const char* name, int fallback, int lo, int hi) {
  return env_int([](const char* n) { return std::getenv(n); }, name, fallback, lo, hi);
}

inline std::chrono::milliseconds env_seconds(const getenv_function& getenv_fn, const char* name,
                                             std::chrono::milliseconds fallback) {
  auto value = detail::launch_env_value(getenv_fn, name);
  return value ? parse_env_seconds(name, *value) : fallback;
}

inline std::chrono::milliseconds env_seconds(const char* name, std::chrono::milliseconds fallback) {
  return env_seconds([](const char* n) { return std::getenv(n); }, name, fallback);
}

inline launch_info launch_info_from(const getenv_function& getenv_fn) {
  launch_info info;
  info.launcher = "none";
  std::string rank_name = "rank";
  std::string size_name = "size";
  std::string local_rank_name = "local rank";
  std::string local_size_name = "local size";
  bool have_local = false;

  auto take_global = [&](const char* launcher, const auto& pair) {
    info.launcher = launcher;
    info.rank = pair.first.value;
    info.size = pair.second.value;
    rank_name = pair.first.name;
    size_name = pair.second.name;
  };
  auto take_local = [&](const auto& pair) {
    have_local = true;
    info.local_rank = pair.first.value;
    info.local_size = pair.second.value;
    local_rank_name = pair.first.name;
    local_size_name = pair.second.name;
  };

  // Rank and size: the first launcher whose pair is set wins.
  if (auto p = detail::launch_env_pair(getenv_fn, "CHORUS_RANK", 0, "CHORUS_WORLD_SIZE", 1)) {
    take_global("chorus", *p);
  } else if (auto t = detail::launch_env_pair(getenv_fn, "RANK", 0, "WORLD_SIZE", 1)) {
    take_global("torchrun", *t);
    if (auto l = detail::launch_env_pair(getenv_fn, "LOCAL_RANK", 0, "LOCAL_WORLD_SIZE", 1)) {
      take_local(*l);
    }
  } else if (auto m = detail::launch_env_pair(getenv_fn, "OMPI_COMM_WORLD_RANK", 0,
                                              "OMPI_COMM_WORLD_SIZE", 1)) {
    take_global("mpirun", *m);
    if (auto l = detail::launch_env_pair(getenv_fn, "OMPI_COMM_WORLD_LOCAL_RANK", 0,
                                         "OMPI_COMM_WORLD_LOCAL_SIZE", 1)) {
      take_local(*l);
    }
  } else if (auto s = detail::launch_env_pair(getenv_fn, "SLURM_PROCID", 0, "SLURM_NTASKS", 1)) {
    take_global("srun", *s);
    constexpr int int_max = std::numeric_limits<int>::max();
    if (auto local_id = detail::launch_env_value(getenv_fn, "SLURM_LOCALID")) {
      have_local = true;
      info.local_rank = parse_env_int("SLURM_LOCALID", *local_id, 0, int_max);
      local_rank_name = "SLURM_LOCALID";
      if (auto per_node = detail::launch_env_value(getenv_fn, "SLURM_NTASKS_PER_NODE")) {
        info.local_size = parse_env_int("SLURM_NTASKS_PER_NODE", *per_node, 1, int_max);
        local_size_name = "SLURM_NTASKS_PER_NODE";
      } else {
        std::optional<int> node;
        if (auto id = detail::launch_env_value(getenv_fn, "SLURM_NODEID")) {
          node = parse_env_int("SLURM_NODEID", *id, 0, int_max);
        }
        for (const char* name : {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"}) {
          if (auto list = detail::launch_env_value(getenv_fn, name)) {
            info.local_size = detail::slurm_tasks_on_node(name, *list, node);
            local_size_name = name;
            break;
          }
        }
        if (local_size_name == "local size") {
          detail::launch_env_error(
              "SLURM_LOCALID is set but none of SLURM_NTASKS_PER_NODE, "
              "SLURM_STEP_TASKS_PER_NODE, SLURM_TASKS_PER_NODE is");
        }
      }
    }
  }

  // The CHORUS_ local pair overrides whatever the launcher said about the node.
  if (auto l = detail::launch_env_pair(getenv_fn, "CHORUS_LOCAL_RANK", 0, "CHORUS_LOCAL_WORLD_SIZE",
                                       1)) {
    take_local(*l);
  }

  auto below = [](const std::string& a, int av, const std::string& b, int bv) {
    detail::launch_env_error(a + "=" + std::to_string(av) + " is not below " + b + "=" +
                             std::to_string(bv));
  };
  if (info.rank >= info.size) below(rank_name, info.rank, size_name, info.size);
  if (have_local) {
    if (info.local_rank >= info.local_size) {
      below(local_rank_name, info.local_rank, local_size_name, info.local_size);
    }
    if (info.local_size > info.size) {
      detail::launch_env_error(local_size_name + "=" + std::to_string(info.local_size) +
                               " exceeds " + size_name + "=" + std::to_string(info.size));
    }
  }

  // Where rank 0's store listens.
  const char* addr_name = "CHORUS_MASTER_ADDR";
  auto addr = detail::launch_env_value(getenv_fn, addr_name);
  if (!addr) addr = detail::launch_env_value(getenv_fn, addr_name = "MASTER_ADDR");
  const char* port_name = "CHORUS_MASTER_PORT";
  auto port = detail::launch_env_value(getenv_fn, port_name);
  if (!port) port = detail::launch_env_value(getenv_fn, port_name = "MASTER_PORT");
  if (port)
    info.master_port = static_cast<std::uint16_t>(parse_env_int(port_name, *port, 1, 65535));

  if (addr) {
    std::string_view host = *addr;
    if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
      host = host.substr(1, host.size() - 2);
    }
    if (host.empty() || host.find_first_of(" \t\r\n[]/") != std::string_view::npos) {
      detail::launch_env_error(std::string(addr_name) + "='" + std::string(*addr) +
                               "' is not a host name or IP address");
    }
    info.master_addr = std::string(host);
  } else if (info.size == 1) {
    info.master_addr = "127.0.0.1";
  } else {
    detail::launch_env_error(
        "no rendezvous address: " + std::to_string(info.size) + " ranks were launched by " +
        info.launcher +
        " but neither CHORUS_MASTER_ADDR nor MASTER_ADDR is set; set CHORUS_MASTER_ADDR to "
        "the host of rank 0 (and CHORUS_MASTER_PORT, default 29500)");
  }
  return info;
}

inline launch_info launch_info_from_env() {
  return launch_info_from([](const char* name) { return std::getenv(name); });
}

}  // namespace chorus
