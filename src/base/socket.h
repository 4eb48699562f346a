// Blocking-with-deadline socket helpers for the control plane (bootstrap).
//
// Contract: every call that can wait takes a deadline and an optional abort
// flag (polled at least every 50 ms) and returns an error naming what it was
// waiting for instead of hanging. Addresses are IPv4 or IPv6 (NCCL_SOCKET_FAMILY).
// The data plane has its own non-blocking sockets in transports/tcp.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <string>

#include "base/status.h"

namespace tutti::net {

using Clock = std::chrono::steady_clock;

struct SockAddr {
  sockaddr_storage ss{};
  socklen_t len = 0;
  int family() const { return ss.ss_family; }
  const sockaddr* sa() const { return reinterpret_cast<const sockaddr*>(&ss); }
  sockaddr* sa() { return reinterpret_cast<sockaddr*>(&ss); }
  uint16_t port() const;
  void setPort(uint16_t port);
  std::string str() const;  // "1.2.3.4:5" or "[::1]:5"
  bool isLoopback() const;
};
static_assert(sizeof(sockaddr_storage) == 128, "unexpected sockaddr_storage");

// "host:port", "[v6]:port", "1.2.3.4:port" (name resolution through getaddrinfo).
Result<SockAddr> parseAddr(const std::string& hostPort);
// Numeric only (no name resolution: endpoints that peers send are never
// looked up): "1.2.3.4:5", "[::1]:5"; the port must be 1..65535.
Result<SockAddr> parseNumericAddr(const std::string& endpoint);
// A numeric IPv4/IPv6 literal (brackets allowed) with a port.
Result<SockAddr> parseIp(const std::string& literal, uint16_t port);
// Loopback / wildcard of the given family (AF_INET6, else IPv4).
SockAddr loopbackAddr(int family);
SockAddr wildcardAddr(int family);
// NCCL_SOCKET_FAMILY: AF_INET, AF_INET6 or AF_UNSPEC (unset; unknown values
// are warned about and ignored).
int preferredFamily();
// The address this process uses towards other hosts: NCCL_SOCKET_IFNAME
// (prefix list, "^" excludes, "=" exact) and NCCL_SOCKET_FAMILY honoured; by
// default the first up, non-loopback, non-docker interface, else loopback.
// `ifName` receives the interface name.
Result<SockAddr> selectInterface(std::string* ifName);
// The local address (port 0) and interface the system would use to reach
// `dest`: what a rank listens on when NCCL_SOCKET_IFNAME does not say (the
// interface that reaches the root). Nothing is sent.
Result<SockAddr> routeTo(const SockAddr& dest, std::string* ifName);
// True when NCCL_SOCKET_IFNAME is set (the user pinned the interface).
bool interfacePinned();

class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  Socket(Socket&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Socket& operator=(Socket&& o) noexcept;
  ~Socket() { close(); }
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;

  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  void close();
  // Gives up ownership of the descriptor.
  int release() {
    int f = fd_;
    fd_ = -1;
    return f;
  }

  // Listens on `addr` (port 0: ephemeral); `bound` receives the actual address.
  static Result<Socket> listen(const SockAddr& addr, SockAddr* bound);
  // Connects, retrying refused connections until the deadline.
  static Result<Socket> connect(const SockAddr& addr, Clock::time_point deadline,
                                const std::atomic<bool>* abortFlag, const std::string& what);
  // Waits for one connection.
  Result<Socket> accept(Clock::time_point deadline, const std::atomic<bool>* abortFlag,
                        const std::string& what);

  Status sendAll(const void* data, size_t n, Clock::time_point deadline,
                 const std::atomic<bool>* abortFlag, const std::string& what);
  Status recvAll(void* data, size_t n, Clock::time_point deadline,
                 const std::atomic<bool>* abortFlag, const std::string& what);

 private:
  int fd_ = -1;
};

// A deadline `seconds` from now (clamped so overflow cannot happen).
Clock::time_point deadlineIn(double seconds);

}  // namespace tutti::net
