// The transport seam: how bytes move between two ranks.
//
// Contract
// - A Connection is a bidirectional, reliable, in-order byte pipe between this
//   rank and one peer, for one channel. Message framing is the executor's job.
// - trySend/tryRecv never block: they move as many bytes as fit now (possibly
//   0) and return that count. An error means the connection is unusable (peer
//   gone, protocol violation); the message names the peer.
// - waitHint() lets a progress loop sleep instead of spin: a pollable fd (TCP)
//   or -1 (shared memory: the caller spins, then backs off with short sleeps).
// - Connections are created by a Transport through connect(), which runs the
//   transport's own handshake over the bootstrap's point-to-point messages.
//   connect() blocks until ctx.deadline at most and gives up early when
//   *ctx.abortFlag becomes true. Both peers call connect() for the pair; the
//   role (who listens, who dials) follows from ctx.isLower.
// - Everything is owned by the communicator; destroying a Connection closes it
//   and releases its memory/sockets. abort() may be called from another thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"

namespace tutti::transport {

using Clock = std::chrono::steady_clock;

class Connection {
 public:
  virtual ~Connection() = default;
  virtual Result<size_t> trySend(const void* data, size_t bytes) = 0;
  virtual Result<size_t> tryRecv(void* data, size_t bytes) = 0;
  // Sends a then b as one stream, in as few system calls as the transport
  // can (a message header and its payload). Returns the bytes taken from the
  // concatenation; never blocks.
  virtual Result<size_t> trySend2(const void* a, size_t na, const void* b, size_t nb) {
    auto n = trySend(a, na);
    if (!n || *n < na || nb == 0) return n;
    auto m = trySend(b, nb);
    if (!m) return m;
    return na + *m;
  }
  // Read-side zero-copy (optional): a pointer to up to *avail contiguous bytes
  // already received, valid until consume(). Returns nullptr when nothing is
  // available or the transport does not support it.
  virtual const void* peek(size_t* avail) {
    *avail = 0;
    return nullptr;
  }
  virtual void consume(size_t /*bytes*/) {}
  virtual bool supportsPeek() const { return false; }
  // -1 when there is nothing to poll (spin/sleep instead).
  virtual int waitHint() const { return -1; }
  // Bytes already taken off the wait handle and held by the connection
  // (read ahead): tryRecv returns them although waitHint() may not poll
  // readable.
  virtual size_t buffered() const { return 0; }
  // A connection that moves bytes only when called (net plugins, through
  // net_stream.h) says so once; its executor then calls progress() every
  // pass while it has sends in flight, also while waiting on other peers,
  // and counts an operation done only once progress() returns true (nothing
  // left to send). Shared memory and TCP hand bytes to the peer or the
  // kernel in trySend and need neither.
  virtual bool needsProgress() const { return false; }
  virtual Result<bool> progress() { return true; }
  // Cheap liveness check used when a wait has made no progress for a while.
  virtual Status checkAlive() { return Status::ok(); }
  // What the network below a connection says of its sending side, counted
  // since it was opened (optional: false when the transport cannot tell):
  // bytes the peer acknowledged, and microseconds during which data was on
  // its way and the network, not the receiver's window, set the pace. Their
  // ratio is the link's rate while busy (core/telemetry.h). `wholeLink`:
  // the figures are those of the link this connection is one channel of
  // (every channel reports the same), not this connection's own.
  struct LinkCounters {
    uint64_t bytesAcked = 0;
    uint64_t busyUs = 0;
    bool wholeLink = false;
  };
  virtual bool linkCounters(LinkCounters* out) const {
    (void)out;
    return false;
  }
  virtual void abort() {}
  virtual const char* name() const = 0;
};

// Point-to-point control messages between ranks of a communicator, provided
// by the bootstrap. Tags separate concurrent handshakes.
class ControlChannel {
 public:
  virtual ~ControlChannel() = default;
  virtual Status send(int peer, uint64_t tag, const void* data, size_t bytes) = 0;
  virtual Result<std::vector<uint8_t>> recv(int peer, uint64_t tag) = 0;
  // Like recv(), but waits until `deadline` at most and gives up early once
  // *abortFlag (may be null) is true, returning an error. Transports use it so
  // that connect() honours ctx.deadline/abortFlag while the peer is absent.
  // (Added after the first version; the default forwards to recv(), which may
  // block past the deadline, so bootstraps should override it.)
  virtual Result<std::vector<uint8_t>> recvUntil(int peer, uint64_t tag, Clock::time_point deadline,
                                                 const std::atomic<bool>* abortFlag) {
    (void)deadline;
    (void)abortFlag;
    return recv(peer, tag);
  }
  // An error when `peer` has said it gave up after an error of its own, or
  // is a process of this host that no longer exists (it will take part in
  // no handshake: waiting for it is pointless), else ok.
  // Handshake waits ask it every slice (handshake_util.h: checkWait).
  virtual Status gaveUp(int peer) {
    (void)peer;
    return Status::ok();
  }
};

namespace shm {
struct Doorbell;
}  // namespace shm

struct ConnectContext {
  int rank = -1;
  int peer = -1;
  int channel = 0;
  bool isLower = false;             // rank < peer: this side creates/listens
  bool peerSameHost = false;        // peers share a host identity
  uint64_t commHash = 0;            // unique per communicator (names shm segments)
  const uint8_t* secret = nullptr;  // 32 bytes; proven by every data connection
  size_t bufferBytes = 4 << 20;     // NCCL_BUFFSIZE-like ring size per direction
  ControlChannel* control = nullptr;
  Clock::time_point deadline;
  const std::atomic<bool>* abortFlag = nullptr;
  uint64_t tagBase = 0;     // unique per (pair, channel) handshake
  std::string localIfAddr;  // TCP: address to listen on / advertise
  // Asks that [p, p+bytes) live near this rank (its NUMA node), for memory
  // this side of the pair reads most; best effort, never fails. Empty: leave
  // pages where first touch put them. Shared memory calls it on the ring this
  // rank receives from; TCP's buffers are this process's own, touched first
  // by the thread that uses them, so it has nothing to place.
  std::function<void(void* p, size_t bytes)> placeNear;
  // Shared memory: the peer's doorbell in the node arena (shm/doorbell.h),
  // rung after this side moved bytes the peer may be sleeping for (data
  // sent, ring space freed). Null: the peer is not woken (it naps instead).
  shm::Doorbell* peerBell = nullptr;
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual const char* name() const = 0;
  virtual Result<std::unique_ptr<Connection>> connect(const ConnectContext& ctx) = 0;
};

std::unique_ptr<Transport> makeShmTransport();
std::unique_ptr<Transport> makeTcpTransport();

}  // namespace tutti::transport
