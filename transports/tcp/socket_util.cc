#include "transports/tcp/socket_util.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "core/log.h"
#include "core/params.h"
#include "transports/handshake_util.h"

namespace tutti::transport::tcp {

int preferredFamily() {
  std::string f = params::getStr("NCCL_SOCKET_FAMILY", "");
  if (f == "AF_INET" || f == "4" || f == "inet") return AF_INET;
  if (f == "AF_INET6" || f == "6" || f == "inet6") return AF_INET6;
  if (!f.empty())
    TUTTI_WARN("NCCL_SOCKET_FAMILY={} not understood (AF_INET or AF_INET6); ignored", f);
  return AF_UNSPEC;
}

Result<SockAddr> parseIp(const std::string& literal, uint16_t port) {
  std::string host = literal;
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  addrinfo hints{};
  hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_family = AF_UNSPEC;
  addrinfo* res = nullptr;
  std::string service = std::to_string(port);
  int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &res);
  if (rc != 0 || res == nullptr) {
    return invalidArgument(fmt::format("TCP: '{}' is not a numeric IPv4/IPv6 address ({})", literal,
                                       gai_strerror(rc)));
  }
  SockAddr out;
  std::memcpy(&out.storage, res->ai_addr, res->ai_addrlen);
  out.len = res->ai_addrlen;
  freeaddrinfo(res);
  return out;
}

Result<SockAddr> parseEndpoint(const std::string& endpoint) {
  size_t colon = endpoint.rfind(':');
  if (colon == std::string::npos || colon + 1 >= endpoint.size()) {
    return invalidArgument(fmt::format("TCP: malformed endpoint '{}'", endpoint));
  }
  char* end = nullptr;
  unsigned long port = std::strtoul(endpoint.c_str() + colon + 1, &end, 10);
  if (*end != '\0' || port == 0 || port > 65535) {
    return invalidArgument(fmt::format("TCP: malformed port in endpoint '{}'", endpoint));
  }
  return parseIp(endpoint.substr(0, colon), static_cast<uint16_t>(port));
}

std::string formatEndpoint(const SockAddr& addr) {
  char host[INET6_ADDRSTRLEN + IF_NAMESIZE + 2] = {};
  char serv[16] = {};
  if (getnameinfo(addr.sa(), addr.len, host, sizeof(host), serv, sizeof(serv),
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    return "<unprintable address>";
  }
  if (addr.family() == AF_INET6) return fmt::format("[{}]:{}", host, serv);
  return fmt::format("{}:{}", host, serv);
}

uint16_t portOf(const SockAddr& addr) {
  if (addr.family() == AF_INET6) {
    return ntohs(reinterpret_cast<const sockaddr_in6*>(&addr.storage)->sin6_port);
  }
  return ntohs(reinterpret_cast<const sockaddr_in*>(&addr.storage)->sin_port);
}

SockAddr loopback(int family) {
  SockAddr out;
  if (family == AF_INET6) {
    auto* a = reinterpret_cast<sockaddr_in6*>(&out.storage);
    a->sin6_family = AF_INET6;
    a->sin6_addr = in6addr_loopback;
    out.len = sizeof(sockaddr_in6);
  } else {
    auto* a = reinterpret_cast<sockaddr_in*>(&out.storage);
    a->sin_family = AF_INET;
    a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    out.len = sizeof(sockaddr_in);
  }
  return out;
}

void tuneSocket(int fd) {
  int one = 1;
  if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0) {
    TUTTI_INFO(log::kNet, "TCP: TCP_NODELAY failed: {}", std::strerror(errno));
  }
  const struct {
    const char* env;
    int opt;
  } bufs[] = {{"NCCL_SOCKET_SNDBUF", SO_SNDBUF}, {"NCCL_SOCKET_RCVBUF", SO_RCVBUF}};
  for (const auto& b : bufs) {
    int64_t v = params::getInt(b.env, -1);
    if (v <= 0) continue;  // leave kernel autotuning alone
    int iv = static_cast<int>(std::min<int64_t>(v, INT32_MAX));
    if (setsockopt(fd, SOL_SOCKET, b.opt, &iv, sizeof(iv)) != 0) {
      TUTTI_WARN("TCP: setting {}={} failed: {}", b.env, iv, std::strerror(errno));
    }
  }
}

Result<int> newSocket(int family) {
  int fd = socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return errnoError("TCP: socket", errno);
  return fd;
}

namespace {

// Waits for `events` on fd for one slice; ok when ready or the slice ended.
Status waitSlice(int fd, short events, const ConnectContext& ctx, const char* what) {
  TUTTI_RETURN_IF_ERROR(detail::checkWait(ctx, "TCP", what));
  pollfd p{fd, events, 0};
  int rc = poll(&p, 1, detail::sliceMs(ctx));
  if (rc < 0 && errno != EINTR) return errnoError("TCP: poll", errno);
  return Status::ok();
}

}  // namespace

Status sendAll(int fd, const void* data, size_t bytes, const ConnectContext& ctx,
               const char* what) {
  auto* p = static_cast<const uint8_t*>(data);
  size_t done = 0;
  while (done < bytes) {
    ssize_t n = send(fd, p + done, bytes - done, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      TUTTI_RETURN_IF_ERROR(waitSlice(fd, POLLOUT, ctx, what));
      continue;
    }
    int err = errno;
    if (err == EPIPE || err == ECONNRESET) {
      return remoteError(
          fmt::format("TCP: connection to rank {} closed by peer while {}", ctx.peer, what));
    }
    return errnoError(fmt::format("TCP: send to rank {} while {}", ctx.peer, what), err);
  }
  return Status::ok();
}

Status recvAll(int fd, void* data, size_t bytes, const ConnectContext& ctx, const char* what) {
  auto* p = static_cast<uint8_t*>(data);
  size_t done = 0;
  while (done < bytes) {
    ssize_t n = recv(fd, p + done, bytes - done, MSG_DONTWAIT);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n == 0) {
      return remoteError(
          fmt::format("TCP: connection to rank {} closed by peer while {}", ctx.peer, what));
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      TUTTI_RETURN_IF_ERROR(waitSlice(fd, POLLIN, ctx, what));
      continue;
    }
    int err = errno;
    if (err == ECONNRESET) {
      return remoteError(
          fmt::format("TCP: connection to rank {} closed by peer while {}", ctx.peer, what));
    }
    return errnoError(fmt::format("TCP: recv from rank {} while {}", ctx.peer, what), err);
  }
  return Status::ok();
}

bool constantTimeEqual(const uint8_t* a, const uint8_t* b, size_t n) {
  volatile uint8_t diff = 0;
  for (size_t i = 0; i < n; ++i) diff = diff | static_cast<uint8_t>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace tutti::transport::tcp
