#include "base/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <thread>
#include <vector>

#include "base/log.h"
#include "base/params.h"

namespace tutti::net {

uint16_t SockAddr::port() const {
  if (family() == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(&ss)->sin_port);
  if (family() == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6*>(&ss)->sin6_port);
  return 0;
}

void SockAddr::setPort(uint16_t port) {
  if (family() == AF_INET) reinterpret_cast<sockaddr_in*>(&ss)->sin_port = htons(port);
  if (family() == AF_INET6) reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port = htons(port);
}

std::string SockAddr::str() const {
  char host[INET6_ADDRSTRLEN] = "?";
  if (family() == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&ss)->sin_addr, host, sizeof(host));
    return std::string(host) + ":" + std::to_string(port());
  }
  if (family() == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&ss)->sin6_addr, host, sizeof(host));
    return "[" + std::string(host) + "]:" + std::to_string(port());
  }
  return "<unset>";
}

bool SockAddr::isLoopback() const {
  if (family() == AF_INET)
    return (ntohl(reinterpret_cast<const sockaddr_in*>(&ss)->sin_addr.s_addr) >> 24) == 127;
  if (family() == AF_INET6)
    return IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<const sockaddr_in6*>(&ss)->sin6_addr);
  return false;
}

Result<SockAddr> parseAddr(const std::string& hostPort) {
  std::string host, port;
  if (!hostPort.empty() && hostPort[0] == '[') {
    auto close = hostPort.find(']');
    if (close == std::string::npos || close + 1 >= hostPort.size() || hostPort[close + 1] != ':')
      return invalidArgument("malformed address '" + hostPort + "' (expected [v6]:port)");
    host = hostPort.substr(1, close - 1);
    port = hostPort.substr(close + 2);
  } else {
    auto colon = hostPort.rfind(':');
    if (colon == std::string::npos)
      return invalidArgument("malformed address '" + hostPort + "' (expected host:port)");
    host = hostPort.substr(0, colon);
    port = hostPort.substr(colon + 1);
  }
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_family = AF_UNSPEC;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &res);
  if (rc != 0 || !res)
    return invalidArgument("cannot resolve '" + hostPort + "': " + gai_strerror(rc));
  SockAddr a;
  memcpy(&a.ss, res->ai_addr, res->ai_addrlen);
  a.len = res->ai_addrlen;
  freeaddrinfo(res);
  return a;
}

Result<SockAddr> parseIp(const std::string& literal, uint16_t port) {
  std::string host = literal;
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  addrinfo hints{};
  hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_family = AF_UNSPEC;
  addrinfo* res = nullptr;
  std::string service = std::to_string(port);
  int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &res);
  if (rc != 0 || res == nullptr)
    return invalidArgument(
        fmt::format("'{}' is not a numeric IPv4/IPv6 address ({})", literal, gai_strerror(rc)));
  SockAddr out;
  memcpy(&out.ss, res->ai_addr, res->ai_addrlen);
  out.len = res->ai_addrlen;
  freeaddrinfo(res);
  return out;
}

Result<SockAddr> parseNumericAddr(const std::string& endpoint) {
  size_t colon = endpoint.rfind(':');
  if (colon == std::string::npos || colon + 1 >= endpoint.size())
    return invalidArgument(fmt::format("malformed endpoint '{}' (expected ip:port)", endpoint));
  char* end = nullptr;
  unsigned long port = std::strtoul(endpoint.c_str() + colon + 1, &end, 10);
  if (*end != '\0' || port == 0 || port > 65535)
    return invalidArgument(fmt::format("malformed port in endpoint '{}'", endpoint));
  return parseIp(endpoint.substr(0, colon), static_cast<uint16_t>(port));
}

namespace {

SockAddr fixedAddr(int family, const in6_addr& v6, uint32_t v4) {
  SockAddr a;
  if (family == AF_INET6) {
    auto* s6 = reinterpret_cast<sockaddr_in6*>(&a.ss);
    s6->sin6_family = AF_INET6;
    s6->sin6_addr = v6;
    a.len = sizeof(sockaddr_in6);
  } else {
    auto* s4 = reinterpret_cast<sockaddr_in*>(&a.ss);
    s4->sin_family = AF_INET;
    s4->sin_addr.s_addr = htonl(v4);
    a.len = sizeof(sockaddr_in);
  }
  return a;
}

}  // namespace

SockAddr loopbackAddr(int family) { return fixedAddr(family, in6addr_loopback, INADDR_LOOPBACK); }
SockAddr wildcardAddr(int family) { return fixedAddr(family, in6addr_any, INADDR_ANY); }

int preferredFamily() {
  std::string f = params::getStr("NCCL_SOCKET_FAMILY", "");
  if (f == "AF_INET" || f == "4" || f == "inet") return AF_INET;
  if (f == "AF_INET6" || f == "6" || f == "inet6") return AF_INET6;
  if (!f.empty())
    TUTTI_WARN("NCCL_SOCKET_FAMILY={} not understood (AF_INET or AF_INET6); ignored", f);
  return AF_UNSPEC;
}

bool interfacePinned() { return params::get("NCCL_SOCKET_IFNAME").has_value(); }

namespace {

bool matchIf(const std::string& name, const std::string& spec) {
  std::string s = spec;
  bool exclude = false, exact = false;
  if (!s.empty() && s[0] == '^') {
    exclude = true;
    s.erase(0, 1);
  }
  if (!s.empty() && s[0] == '=') {
    exact = true;
    s.erase(0, 1);
  }
  std::stringstream ss(s);
  std::string tok;
  bool hit = false;
  while (std::getline(ss, tok, ',')) {
    if (tok.empty()) continue;
    if (exact ? name == tok : name.compare(0, tok.size(), tok) == 0) hit = true;
  }
  return exclude ? !hit : hit;
}

}  // namespace

Result<SockAddr> selectInterface(std::string* ifName) {
  auto spec = params::get("NCCL_SOCKET_IFNAME");
  int family = preferredFamily();
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return errnoError("getifaddrs", errno);
  std::vector<std::pair<std::string, SockAddr>> found;
  for (ifaddrs* i = list; i; i = i->ifa_next) {
    if (!i->ifa_addr || !(i->ifa_flags & IFF_UP)) continue;
    int fam = i->ifa_addr->sa_family;
    if (fam != AF_INET && fam != AF_INET6) continue;
    if (family != AF_UNSPEC && fam != family) continue;
    std::string name = i->ifa_name;
    if (fam == AF_INET6 &&
        IN6_IS_ADDR_LINKLOCAL(&reinterpret_cast<sockaddr_in6*>(i->ifa_addr)->sin6_addr))
      continue;
    if (spec) {
      if (!matchIf(name, *spec)) continue;
    } else {
      if ((i->ifa_flags & IFF_LOOPBACK) || name.rfind("docker", 0) == 0 ||
          name.rfind("virbr", 0) == 0)
        continue;
    }
    SockAddr a;
    a.len = fam == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
    memcpy(&a.ss, i->ifa_addr, a.len);
    found.emplace_back(name, a);
  }
  freeifaddrs(list);
  // Prefer IPv4 unless the family was forced.
  for (auto& f : found)
    if (f.second.family() == AF_INET || family == AF_INET6) {
      if (ifName) *ifName = f.first;
      return f.second;
    }
  if (!found.empty()) {
    if (ifName) *ifName = found[0].first;
    return found[0].second;
  }
  if (spec)
    return invalidArgument("NCCL_SOCKET_IFNAME='" + *spec + "' matches no usable interface");
  if (ifName) *ifName = "lo";
  return loopbackAddr(family == AF_INET6 ? AF_INET6 : AF_INET);
}

Result<SockAddr> routeTo(const SockAddr& dest, std::string* ifName) {
  // A datagram socket's connect() picks the route and the source address
  // and sends nothing.
  int fd = ::socket(dest.family(), SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return errnoError("socket", errno);
  Socket s(fd);
  SockAddr to = dest;
  if (to.port() == 0) to.setPort(9);
  if (::connect(fd, to.sa(), to.len) != 0) return errnoError("no route to " + dest.str(), errno);
  SockAddr local;
  local.len = sizeof(local.ss);
  if (getsockname(fd, local.sa(), &local.len) != 0) return errnoError("getsockname", errno);
  local.setPort(0);
  std::string name;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) == 0) {
    for (ifaddrs* i = list; i && name.empty(); i = i->ifa_next) {
      if (!i->ifa_addr || i->ifa_addr->sa_family != local.family()) continue;
      const bool same =
          local.family() == AF_INET
              ? reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr ==
                    reinterpret_cast<const sockaddr_in*>(&local.ss)->sin_addr.s_addr
              : memcmp(&reinterpret_cast<sockaddr_in6*>(i->ifa_addr)->sin6_addr,
                       &reinterpret_cast<const sockaddr_in6*>(&local.ss)->sin6_addr, 16) == 0;
      if (same) name = i->ifa_name;
    }
    freeifaddrs(list);
  }
  if (name.empty()) return systemError("no interface holds " + local.str());
  if (ifName) *ifName = name;
  return local;
}

Clock::time_point deadlineIn(double seconds) {
  if (seconds > 1e7) seconds = 1e7;
  if (seconds < 0) seconds = 0;
  return Clock::now() + std::chrono::microseconds(static_cast<int64_t>(seconds * 1e6));
}

Socket& Socket::operator=(Socket&& o) noexcept {
  if (this != &o) {
    close();
    fd_ = o.fd_;
    o.fd_ = -1;
  }
  return *this;
}

void Socket::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

namespace {

// Waits for `events` on fd in slices of at most 50 ms so aborts are noticed.
Status waitFd(int fd, short events, Clock::time_point deadline, const std::atomic<bool>* abortFlag,
              const std::string& what) {
  for (;;) {
    if (abortFlag && abortFlag->load(std::memory_order_relaxed))
      return invalidUsage("aborted while " + what);
    auto now = Clock::now();
    if (now >= deadline) return remoteError("timed out " + what);
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count();
    pollfd p{fd, events, 0};
    int rc = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left + 1, 50)));
    if (rc > 0) return Status::ok();
    if (rc < 0 && errno != EINTR) return errnoError("poll while " + what, errno);
  }
}

void setNonBlocking(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

}  // namespace

Result<Socket> Socket::listen(const SockAddr& addr, SockAddr* bound) {
  int fd = ::socket(addr.family(), SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return errnoError("socket", errno);
  Socket s(fd);
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&addr.ss), addr.len) != 0)
    return errnoError("bind to " + addr.str(), errno);
  if (::listen(fd, 1024) != 0) return errnoError("listen on " + addr.str(), errno);
  setNonBlocking(fd);
  if (bound) {
    bound->len = sizeof(bound->ss);
    getsockname(fd, reinterpret_cast<sockaddr*>(&bound->ss), &bound->len);
  }
  return s;
}

Result<Socket> Socket::connect(const SockAddr& addr, Clock::time_point deadline,
                               const std::atomic<bool>* abortFlag, const std::string& what) {
  int delayMs = 1;
  for (;;) {
    int fd = ::socket(addr.family(), SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return errnoError("socket", errno);
    Socket s(fd);
    setNonBlocking(fd);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    int rc = ::connect(fd, reinterpret_cast<const sockaddr*>(&addr.ss), addr.len);
    int err = rc == 0 ? 0 : errno;
    if (err == EINPROGRESS) {
      TUTTI_RETURN_IF_ERROR(waitFd(fd, POLLOUT, deadline, abortFlag, "connecting to " + what));
      socklen_t len = sizeof(err);
      getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    }
    if (err == 0) return s;
    if (err != ECONNREFUSED && err != ETIMEDOUT && err != ECONNRESET && err != EAGAIN)
      return errnoError("connect to " + what + " at " + addr.str(), err);
    if (abortFlag && abortFlag->load()) return invalidUsage("aborted while connecting to " + what);
    if (Clock::now() + std::chrono::milliseconds(delayMs) >= deadline)
      return remoteError("timed out connecting to " + what + " at " + addr.str() +
                         " (connection refused: is it running?)");
    std::this_thread::sleep_for(std::chrono::milliseconds(delayMs));
    delayMs = std::min(delayMs * 2, 100);
  }
}

Result<Socket> Socket::accept(Clock::time_point deadline, const std::atomic<bool>* abortFlag,
                              const std::string& what) {
  for (;;) {
    TUTTI_RETURN_IF_ERROR(waitFd(fd_, POLLIN, deadline, abortFlag, "waiting for " + what));
    int fd = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd >= 0) {
      int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      return Socket(fd);
    }
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED)
      return errnoError("accept", errno);
  }
}

Status Socket::sendAll(const void* data, size_t n, Clock::time_point deadline,
                       const std::atomic<bool>* abortFlag, const std::string& what) {
  auto* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t rc = ::send(fd_, p, n, MSG_NOSIGNAL);
    if (rc > 0) {
      p += rc;
      n -= static_cast<size_t>(rc);
      continue;
    }
    if (rc < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      TUTTI_RETURN_IF_ERROR(waitFd(fd_, POLLOUT, deadline, abortFlag, "sending to " + what));
      continue;
    }
    return remoteError("connection to " + what +
                       " lost while sending: " + (rc < 0 ? strerror(errno) : "closed"));
  }
  return Status::ok();
}

Status Socket::recvAll(void* data, size_t n, Clock::time_point deadline,
                       const std::atomic<bool>* abortFlag, const std::string& what) {
  auto* p = static_cast<char*>(data);
  while (n > 0) {
    ssize_t rc = ::recv(fd_, p, n, 0);
    if (rc > 0) {
      p += rc;
      n -= static_cast<size_t>(rc);
      continue;
    }
    if (rc < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      TUTTI_RETURN_IF_ERROR(waitFd(fd_, POLLIN, deadline, abortFlag, "receiving from " + what));
      continue;
    }
    return remoteError("connection to " + what + " closed by peer" +
                       (rc < 0 ? std::string(": ") + strerror(errno) : std::string()));
  }
  return Status::ok();
}

}  // namespace tutti::net
