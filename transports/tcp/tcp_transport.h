// The TCP transport: one stream socket per (pair, channel).
//
// Contract
// - connect(): the lower rank listens on an ephemeral port (127.0.0.1 / ::1
//   when ctx.peerSameHost or ctx.localIfAddr is empty, else ctx.localIfAddr)
//   and sends "addr:port" through ctx.control (tag tagBase+0). The higher rank
//   dials it, retrying refused connections until the deadline, and sends a
//   Hello {magic, 32-byte secret, rank, channel}. The listener serves every
//   pending connection concurrently, verifies the hello (constant-time
//   secret compare, expected rank and channel), closes any that fail, keeps
//   accepting until the deadline, and answers the good one with an ack.
//   Nothing but the hello is read from a connection before it is verified.
// - Every wait polls in slices of at most 10 ms, checking ctx.deadline and
//   *ctx.abortFlag; errors name the peer rank.
// - A TcpConnection owns its socket (non-blocking, TCP_NODELAY, MSG_NOSIGNAL
//   sends). A peer that closes or resets yields RemoteError "connection to
//   rank N closed by peer". abort() shuts the socket down (the peer sees a
//   close); the descriptor is closed by the destructor only.
// - waitHint() returns the socket: poll it for POLLIN/POLLOUT.
// - Reads ahead: a receive of fewer than kAheadBytes asks the socket for up
//   to kAheadBytes, so a message header and a small payload (and whatever
//   follows) arrive in one system call; buffered() says how many bytes are
//   held, which a poll on the socket no longer shows. Larger receives go
//   straight into the caller's memory once the held bytes are used up.
#pragma once

#include <atomic>
#include <memory>

#include "transports/transport.h"

namespace tutti::transport::tcp {

// The kernel's TCP_INFO for socket `fd` as Connection::LinkCounters: bytes
// acknowledged, and the time busy sending less the time the receive window
// was the limit (tcp_info.cc).
bool tcpLinkCounters(int fd, Connection::LinkCounters* out);

class TcpConnection final : public Connection {
 public:
  TcpConnection(int fd, int peer, int channel) : fd_(fd), peer_(peer), channel_(channel) {}
  ~TcpConnection() override;
  TcpConnection(const TcpConnection&) = delete;
  TcpConnection& operator=(const TcpConnection&) = delete;

  Result<size_t> trySend(const void* data, size_t bytes) override;
  Result<size_t> tryRecv(void* data, size_t bytes) override;
  Result<size_t> trySend2(const void* a, size_t na, const void* b, size_t nb) override;
  int waitHint() const override { return fd_; }
  size_t buffered() const override { return aheadLen_ - aheadOff_; }
  Status checkAlive() override;
  void abort() override;
  const char* name() const override { return "tcp"; }
  bool linkCounters(LinkCounters* out) const override { return tcpLinkCounters(fd_, out); }

 private:
  Status ioError(int err, const char* op) const;
  Status abortedError() const;
  Result<size_t> recvSome(void* data, size_t bytes);

  static constexpr size_t kAheadBytes = 4096;

  int fd_;
  int peer_;
  int channel_;
  std::atomic<bool> aborted_{false};
  std::unique_ptr<uint8_t[]> ahead_;  // read-ahead bytes [aheadOff_, aheadLen_)
  size_t aheadOff_ = 0, aheadLen_ = 0;
};

class TcpTransport final : public Transport {
 public:
  const char* name() const override { return "tcp"; }
  Result<std::unique_ptr<Connection>> connect(const ConnectContext& ctx) override;
};

}  // namespace tutti::transport::tcp
