// Socket helpers for the TCP transport: addresses, options, deadline-bounded I/O.
//
// Contract
// - Addresses are numeric literals only (IPv4 or IPv6, optional %scope); no
//   name resolution ever happens here. Endpoints travel as "a.b.c.d:port" or
//   "[v6]:port".
// - Every socket made here is non-blocking and close-on-exec. The *All()
//   helpers wait in slices of at most 10 ms, checking ctx.deadline and
//   *ctx.abortFlag, so they return within one slice of either.
// - Socket buffer sizes come from NCCL_SOCKET_SNDBUF / NCCL_SOCKET_RCVBUF
//   (unset or <= 0: kernel autotuning); the family preference from
//   NCCL_SOCKET_FAMILY (AF_INET / AF_INET6; unset: either).
#pragma once

#include <sys/socket.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "base/socket.h"
#include "base/status.h"
#include "transports/transport.h"

namespace tutti::transport::tcp {

// Addresses are the control plane's (base/socket.h): one type, one parser.
using SockAddr = net::SockAddr;

void tuneSocket(int fd);
// New non-blocking, close-on-exec stream socket of the family.
Result<int> newSocket(int family);

// Sends/receives exactly `bytes`, bounded by ctx's deadline and abort flag.
// recvAll returns a RemoteError when the peer closes first.
Status sendAll(int fd, const void* data, size_t bytes, const ConnectContext& ctx, const char* what);
Status recvAll(int fd, void* data, size_t bytes, const ConnectContext& ctx, const char* what);


}  // namespace tutti::transport::tcp
