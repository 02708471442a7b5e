// SPDX-License-Identifier: Apache-2.0
// Socket helpers of the TCP transport: socket options (addresses: chorus/detail/address.hpp).
#pragma once

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <chorus/detail/address.hpp>  // sock_addr, resolve, choose_local_address
#include <chorus/detail/socket.hpp>   // unique_fd, wait_fd, send_all, recv_exact
#include <chorus/error.hpp>

namespace chorus::detail {

inline void set_nonblocking(int fd) {
  const int flags = ::fcntl(fd, F_GETFL, 0);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) throw sys_error("fcntl");
}

inline void set_int_option(int fd, int level, int name, int value, const char* what) {
  if (::setsockopt(fd, level, name, &value, sizeof value) != 0) throw sys_error(what);
}

}  // namespace chorus::detail
