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

#include "base/log.h"
#include "base/params.h"
#include "transports/handshake_util.h"

namespace tutti::transport::tcp {

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

}  // namespace tutti::transport::tcp
