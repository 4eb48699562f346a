// The message seam: how network transports move messages between two ranks.
//
// This is the shape RDMA fabrics and NCCL's net plugins have (issue 26): a
// NetComm is a connection to one peer, in both directions, over which whole
// messages travel from registered memory. Today's executor still speaks the
// byte-pipe Connection of transport.h; makeStreamTransport() (net_stream.h)
// runs a NetTransport under it, framing bytes into messages through
// registered bounce buffers. The executor moves onto this seam next, and
// shared memory and TCP after it.
//
// Contract
// - connect() runs the transport's handshake over ctx.control (both sides
//   call it for the pair), waits until ctx.deadline at most and gives up once
//   *ctx.abortFlag is true. Its error names the peer and the transport.
// - registerMemory() makes [p, p+bytes) usable by isend/irecv; the region
//   stays valid until the NetComm is destroyed. Registering a range that lies
//   inside one registered before returns that region (no second call into
//   the fabric).
// - isend()/irecv() never block. They return nullptr when the transport can
//   take no request now (retry later: a fabric's queue is full, a net plugin
//   returned no request). Messages travel in order: the n-th irecv receives
//   the n-th isend, and a message larger than the irecv's capacity is an
//   error. The buffer must lie inside the region passed and stay untouched
//   until test() says the request is done.
// - test() drives progress. true: the request is done and released, *bytes
//   (if not null) says how many bytes it moved. Requests may be tested in any
//   order but complete in posting order per direction.
// - One thread at a time uses a NetComm; different NetComms may be used from
//   different threads. abort() may be called from any thread; afterwards every
//   call returns an error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "base/status.h"
#include "transports/transport.h"

namespace tutti::transport {

enum class MemKind : uint8_t { kHost, kDevice };

// A registered range; what `handles` mean is the transport's business.
struct MemRegion {
  void* base = nullptr;
  size_t bytes = 0;
  MemKind kind = MemKind::kHost;
  void* handles[2] = {nullptr, nullptr};
};

class NetRequest;  // opaque: owned by the transport until test() says done

class NetComm {
 public:
  virtual ~NetComm() = default;
  virtual Result<const MemRegion*> registerMemory(void* p, size_t bytes, MemKind kind) = 0;
  virtual Result<NetRequest*> isend(const void* data, size_t bytes, const MemRegion* mr) = 0;
  virtual Result<NetRequest*> irecv(void* data, size_t capacity, const MemRegion* mr) = 0;
  virtual Result<bool> test(NetRequest* r, size_t* bytes) = 0;
  // The largest message one isend may carry.
  virtual size_t maxMessageBytes() const = 0;
  virtual void abort() = 0;
  virtual const char* name() const = 0;
};

class NetTransport {
 public:
  virtual ~NetTransport() = default;
  // As logged per peer ("rank R -> rank P via <name>").
  virtual const char* name() const = 0;
  // Which memory isend/irecv accept without staging.
  virtual bool supportsDeviceMemory() const = 0;
  virtual Result<std::unique_ptr<NetComm>> connect(const ConnectContext& ctx) = 0;
};

}  // namespace tutti::transport
