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

#include "core/status.h"
#include "core/transport.h"

namespace tutti::transport::tcp {

struct SockAddr {
  sockaddr_storage storage{};
  socklen_t len = 0;
  int family() const { return storage.ss_family; }
  const sockaddr* sa() const { return reinterpret_cast<const sockaddr*>(&storage); }
  sockaddr* sa() { return reinterpret_cast<sockaddr*>(&storage); }
};

// AF_INET, AF_INET6 or AF_UNSPEC from NCCL_SOCKET_FAMILY.
int preferredFamily();
// Numeric IP literal (brackets allowed around IPv6) plus port.
Result<SockAddr> parseIp(const std::string& literal, uint16_t port);
// "addr:port" / "[addr]:port".
Result<SockAddr> parseEndpoint(const std::string& endpoint);
std::string formatEndpoint(const SockAddr& addr);
uint16_t portOf(const SockAddr& addr);
// The loopback address of the family (AF_UNSPEC: IPv4).
SockAddr loopback(int family);

// TCP_NODELAY and, when configured, SO_SNDBUF/SO_RCVBUF. Errors are logged, not fatal.
void tuneSocket(int fd);
// New non-blocking, close-on-exec stream socket of the family.
Result<int> newSocket(int family);

// Sends/receives exactly `bytes`, bounded by ctx's deadline and abort flag.
// recvAll returns a RemoteError when the peer closes first.
Status sendAll(int fd, const void* data, size_t bytes, const ConnectContext& ctx, const char* what);
Status recvAll(int fd, void* data, size_t bytes, const ConnectContext& ctx, const char* what);

// Constant-time equality of two byte strings of equal length.
bool constantTimeEqual(const uint8_t* a, const uint8_t* b, size_t n);

}  // namespace tutti::transport::tcp
