#include "transports/tcp/tcp_transport.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "base/auth.h"
#include "base/gate.h"
#include "base/log.h"
#include "transports/handshake_util.h"
#include "transports/tcp/socket_util.h"

namespace tutti::transport::tcp {
namespace {

constexpr const char* kName = "TCP";
constexpr uint64_t kTagEndpoint = 0;

// Closes an fd on scope exit unless released.
class FdGuard {
 public:
  explicit FdGuard(int fd = -1) : fd_(fd) {}
  ~FdGuard() { reset(); }
  FdGuard(FdGuard&& o) noexcept : fd_(o.release()) {}
  FdGuard& operator=(FdGuard&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = o.release();
    }
    return *this;
  }
  int get() const { return fd_; }
  int release() {
    int f = fd_;
    fd_ = -1;
    return f;
  }
  void reset() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }

 private:
  int fd_;
};

Result<SockAddr> listenAddress(const ConnectContext& ctx) {
  const int fam = net::preferredFamily();
  if (ctx.peerSameHost || ctx.localIfAddr.empty()) return net::loopbackAddr(fam);
  TUTTI_ASSIGN_OR_RETURN(SockAddr a, net::parseIp(ctx.localIfAddr, 0));
  if (fam != AF_UNSPEC && a.family() != fam) {
    TUTTI_WARN("TCP: NCCL_SOCKET_FAMILY asks for {} but the local address {} is not; using it",
               fam == AF_INET ? "AF_INET" : "AF_INET6", ctx.localIfAddr);
  }
  return a;
}

auth::Key keyOf(const ConnectContext& ctx) {
  auth::Key k;
  std::memcpy(k.bytes.data(), ctx.secret, k.bytes.size());
  return k;
}

Result<std::unique_ptr<Connection>> connectLower(const ConnectContext& ctx) {
  TUTTI_ASSIGN_OR_RETURN(SockAddr addr, listenAddress(ctx));
  TUTTI_ASSIGN_OR_RETURN(int lfdRaw, newSocket(addr.family()));
  FdGuard lfd(lfdRaw);
  tuneSocket(lfd.get());  // accepted sockets inherit the buffer sizes
  if (bind(lfd.get(), addr.sa(), addr.len) != 0) {
    return errnoError(fmt::format("TCP: bind to {} for rank {}", addr.str(), ctx.peer), errno);
  }
  if (listen(lfd.get(), 16) != 0) return errnoError("TCP: listen", errno);
  SockAddr bound;
  bound.len = sizeof(bound.ss);
  if (getsockname(lfd.get(), bound.sa(), &bound.len) != 0) {
    return errnoError("TCP: getsockname", errno);
  }
  const std::string endpoint = bound.str();
  TUTTI_RETURN_IF_ERROR(detail::controlSend(ctx, kTagEndpoint, endpoint.data(), endpoint.size(),
                                            kName, "sending listen address"));
  TUTTI_INFO(log::kNet, "TCP: rank {} channel {} listening on {} for rank {}", ctx.rank,
             ctx.channel, endpoint, ctx.peer);

  // Only the peer, on this channel, with the communicator's key gets in
  // (net::Gate: anything else is closed within 2 s and never read from).
  net::Gate gate(
      keyOf(ctx), auth::Purpose::kTcpData, {ctx.rank, ctx.channel}, {ctx.peer, ctx.channel},
      fmt::format("TCP: rank {} channel {} listening on {}", ctx.rank, ctx.channel, endpoint));
  gate.watch(lfd.get());
  std::vector<pollfd> pfds;
  for (;;) {
    TUTTI_RETURN_IF_ERROR(detail::checkWait(
        ctx, kName,
        fmt::format("waiting for rank {} to connect to {}", ctx.peer, endpoint).c_str()));
    pfds.clear();
    int timeoutMs = detail::sliceMs(ctx);
    gate.collect(&pfds, &timeoutMs);
    int rc = poll(pfds.data(), pfds.size(), timeoutMs);
    if (rc < 0 && errno != EINTR) return errnoError("TCP: poll", errno);
    auto admitted = gate.step();
    if (admitted.empty()) continue;
    int fd = admitted.front().sock.release();
    tuneSocket(fd);
    TUTTI_INFO(log::kNet, "TCP: rank {} channel {} accepted rank {} from {}", ctx.rank, ctx.channel,
               ctx.peer, admitted.front().from);
    return std::unique_ptr<Connection>(std::make_unique<TcpConnection>(fd, ctx.peer, ctx.channel));
  }
}

Result<std::unique_ptr<Connection>> connectHigher(const ConnectContext& ctx) {
  TUTTI_ASSIGN_OR_RETURN(auto msg,
                         detail::controlRecv(ctx, kTagEndpoint, kName, "waiting for the address"));
  const std::string endpoint(msg.begin(), msg.end());
  auto parsed = net::parseNumericAddr(endpoint);
  if (!parsed.isOk()) {
    return parsed.status().withContext(fmt::format("TCP: address from rank {}", ctx.peer));
  }
  const SockAddr addr = parsed.value();
  const std::string what = fmt::format("connecting to rank {} at {}", ctx.peer, endpoint);

  FdGuard fd;
  for (;;) {
    TUTTI_RETURN_IF_ERROR(detail::checkWait(ctx, kName, what.c_str()));
    TUTTI_ASSIGN_OR_RETURN(int raw, newSocket(addr.family()));
    fd = FdGuard(raw);
    tuneSocket(fd.get());
    int err = 0;
    if (::connect(fd.get(), addr.sa(), addr.len) != 0) {
      err = errno;
      if (err == EINPROGRESS || err == EINTR) {
        for (;;) {
          TUTTI_RETURN_IF_ERROR(detail::checkWait(ctx, kName, what.c_str()));
          pollfd p{fd.get(), POLLOUT, 0};
          int rc = poll(&p, 1, detail::sliceMs(ctx));
          if (rc < 0 && errno != EINTR) return errnoError("TCP: poll", errno);
          if (rc > 0) break;
        }
        socklen_t len = sizeof(err);
        if (getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
      }
    }
    if (err == ECONNREFUSED || err == ETIMEDOUT || err == EAGAIN || err == ECONNRESET) {
      // Not listening (yet / any more) or the backlog is full: retry until the deadline.
      fd.reset();
      std::this_thread::sleep_for(std::chrono::milliseconds(detail::sliceMs(ctx)));
      continue;
    }
    if (err != 0) return errnoError(fmt::format("TCP: {}", what), err);
    auth::Handshake hs(auth::Handshake::Role::kInitiator, keyOf(ctx), auth::Purpose::kTcpData,
                       {ctx.rank, ctx.channel}, {ctx.peer, ctx.channel});
    Status st = auth::runHandshake(hs, fd.get(), ctx.deadline, ctx.abortFlag,
                                   fmt::format("rank {} at {}", ctx.peer, endpoint));
    if (st.isOk()) break;
    TUTTI_RETURN_IF_ERROR(detail::checkWait(ctx, kName, what.c_str()));
    if (!hs.closedEarly()) return st.withContext(kName);
    // The listener closed us before answering: it was busy turning strangers
    // away (net::Gate). Connect again.
    TUTTI_INFO(log::kNet, "TCP: {}; connecting again", st.message());
    fd.reset();
    std::this_thread::sleep_for(std::chrono::milliseconds(detail::sliceMs(ctx)));
  }
  TUTTI_INFO(log::kNet, "TCP: rank {} channel {} connected to rank {} at {}", ctx.rank, ctx.channel,
             ctx.peer, endpoint);
  return std::unique_ptr<Connection>(
      std::make_unique<TcpConnection>(fd.release(), ctx.peer, ctx.channel));
}

}  // namespace

TcpConnection::~TcpConnection() {
  if (fd_ >= 0) close(fd_);
}

Status TcpConnection::abortedError() const {
  return internalError(
      fmt::format("TCP: connection to rank {} (channel {}) was aborted", peer_, channel_));
}

Status TcpConnection::ioError(int err, const char* op) const {
  if (err == EPIPE || err == ECONNRESET || err == ENOTCONN || err == ESHUTDOWN) {
    return remoteError(
        fmt::format("TCP: connection to rank {} (channel {}) closed by peer", peer_, channel_));
  }
  return errnoError(
      fmt::format("TCP: {} on connection to rank {} (channel {})", op, peer_, channel_), err);
}

Result<size_t> TcpConnection::trySend(const void* data, size_t bytes) {
  if (aborted_.load(std::memory_order_relaxed)) return abortedError();
  if (bytes == 0) return size_t{0};
  for (;;) {
    ssize_t n = send(fd_, data, bytes, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n >= 0) return static_cast<size_t>(n);
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return size_t{0};
    return ioError(errno, "send");
  }
}

Result<size_t> TcpConnection::trySend2(const void* a, size_t na, const void* b, size_t nb) {
  if (aborted_.load(std::memory_order_relaxed)) return abortedError();
  iovec iov[2] = {{const_cast<void*>(a), na}, {const_cast<void*>(b), nb}};
  msghdr msg{};
  msg.msg_iov = iov;
  msg.msg_iovlen = nb ? 2 : 1;
  for (;;) {
    ssize_t n = sendmsg(fd_, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n >= 0) return static_cast<size_t>(n);
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return size_t{0};
    return ioError(errno, "sendmsg");
  }
}

Result<size_t> TcpConnection::recvSome(void* data, size_t bytes) {
  for (;;) {
    ssize_t n = recv(fd_, data, bytes, MSG_DONTWAIT);
    if (n > 0) return static_cast<size_t>(n);
    if (n == 0) return ioError(ECONNRESET, "recv");
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return size_t{0};
    return ioError(errno, "recv");
  }
}

Result<size_t> TcpConnection::tryRecv(void* data, size_t bytes) {
  if (aborted_.load(std::memory_order_relaxed)) return abortedError();
  auto* out = static_cast<uint8_t*>(data);
  size_t got = 0;
  while (got < bytes) {
    if (aheadOff_ < aheadLen_) {
      size_t n = std::min(bytes - got, aheadLen_ - aheadOff_);
      std::memcpy(out + got, ahead_.get() + aheadOff_, n);
      aheadOff_ += n;
      got += n;
      continue;
    }
    const size_t want = bytes - got;
    // A failure after some bytes were delivered is reported by the next
    // call, which finds nothing held and asks the socket again.
    if (want >= kAheadBytes) {
      auto n = recvSome(out + got, want);
      if (!n) return got ? Result<size_t>(got) : n;
      got += *n;
      if (*n < want) break;  // the socket is drained
      continue;
    }
    if (!ahead_) ahead_ = std::make_unique<uint8_t[]>(kAheadBytes);
    auto n = recvSome(ahead_.get(), kAheadBytes);
    if (!n) return got ? Result<size_t>(got) : n;
    if (*n == 0) break;
    aheadOff_ = 0;
    aheadLen_ = *n;
  }
  return got;
}

Status TcpConnection::checkAlive() {
  if (aborted_.load(std::memory_order_relaxed)) return abortedError();
  int soerr = 0;
  socklen_t len = sizeof(soerr);
  if (getsockopt(fd_, SOL_SOCKET, SO_ERROR, &soerr, &len) == 0 && soerr != 0) {
    return ioError(soerr, "socket");
  }
  char b;
  ssize_t n = recv(fd_, &b, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n == 0) return ioError(ECONNRESET, "recv");
  if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
    return ioError(errno, "recv");
  }
  return Status::ok();
}

void TcpConnection::abort() {
  aborted_.store(true, std::memory_order_relaxed);
  shutdown(fd_, SHUT_RDWR);
}

Result<std::unique_ptr<Connection>> TcpTransport::connect(const ConnectContext& ctx) {
  TUTTI_RETURN_IF_ERROR(detail::checkContext(ctx, kName));
  if (ctx.secret == nullptr) return invalidArgument("TCP: no secret in the connect context");
  auto r = ctx.isLower ? connectLower(ctx) : connectHigher(ctx);
  if (!r.isOk()) TUTTI_INFO(log::kNet, "{}", r.status().message());
  return r;
}

}  // namespace tutti::transport::tcp

namespace tutti::transport {
std::unique_ptr<Transport> makeTcpTransport() { return std::make_unique<tcp::TcpTransport>(); }
}  // namespace tutti::transport
