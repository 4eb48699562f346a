// The shared-memory transport: same-host peers exchange bytes through two SPSC
// rings in one POSIX shm segment.
//
// Contract
// - connect(): the lower rank creates "/tutti-<commHash>-<rank>-<peer>-<channel>-
//   <random>" in /dev/shm (O_EXCL, mode 0600, space reserved with
//   posix_fallocate), sends its name through ctx.control (tag tagBase+0); the
//   higher rank maps it, records its pid, unlinks the name and acks (tag
//   tagBase+1). The creator unlinks the name as soon as the ack arrives or the
//   wait fails, so no name outlives a handshake. Waits poll the deadline and
//   the abort flag every 10 ms.
// - A ShmConnection owns its mapping; destroying or aborting it marks its side
//   closed in the segment, so the peer gets a RemoteError (after draining what
//   was already sent) instead of waiting forever.
// - trySend/tryRecv/peek/consume never block. One sending thread and one
//   receiving thread at a time; abort()/checkAlive() may come from any thread.
// - waitHint() is -1: callers spin, then back off. With ctx.peerBell (the
//   peer's doorbell in the node arena), every call that moved bytes rings it
//   (doorbell.h: a fence and a load when the peer does not sleep), so a peer
//   asleep on its doorbell wakes for the data or the freed space.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <memory>
#include <string>

#include "transports/shm/doorbell.h"
#include "transports/shm/shm_ring.h"
#include "transports/transport.h"

namespace tutti::transport::shm {

class ShmConnection final : public Connection {
 public:
  // Takes ownership of the mapping [base, base+mapBytes).
  ShmConnection(void* base, size_t mapBytes, int side, int rank, int peer, int channel);
  ~ShmConnection() override;
  ShmConnection(const ShmConnection&) = delete;
  ShmConnection& operator=(const ShmConnection&) = delete;

  Result<size_t> trySend(const void* data, size_t bytes) override;
  Result<size_t> tryRecv(void* data, size_t bytes) override;
  const void* peek(size_t* avail) override;
  void consume(size_t bytes) override;
  bool supportsPeek() const override { return true; }
  Status checkAlive() override;
  void abort() override;
  const char* name() const override { return "shm"; }

  SegmentHeader* header() { return hdr_; }
  // The peer's doorbell (ConnectContext::peerBell), rung after bytes moved.
  void setPeerBell(Doorbell* bell) { peerBell_ = bell; }

 private:
  Status closedError() const;
  Status abortedError() const;
  bool peerClosed() const;

  void* base_;
  size_t mapBytes_;
  SegmentHeader* hdr_;
  int side_;  // 0: lower rank (sends on ring 0), 1: higher rank
  int rank_;
  int peer_;
  int channel_;
  SpscRing send_;
  SpscRing recv_;
  Doorbell* peerBell_ = nullptr;
  std::atomic<bool> aborted_{false};
};

class ShmTransport final : public Transport {
 public:
  const char* name() const override { return "shm"; }
  Result<std::unique_ptr<Connection>> connect(const ConnectContext& ctx) override;
};

}  // namespace tutti::transport::shm
