// Device buffers in collectives: staging through pinned host memory.
//
// Contract: tutti's executor and transports work on host memory. When a
// collective's buffer is device memory of the process backend (its
// queryPointer says so), stageIn() gives the operation a pinned host copy
// instead: inputs are copied in on the caller's stream (so the operation
// starts after earlier work on that stream), the stream is drained, the
// operation runs on the copies, and stageOut() copies the outputs back on the
// same stream and drains it again (so later work on the stream sees the
// result, and the staging memory can be reused). Pointer relations survive:
// overlapping send and receive ranges (in-place operations) share one staged
// range at the same relative offsets. With a host-only backend (CPU) nothing
// is queried or copied. Host buffers passed with a non-NULL stream on a
// device backend wait for that stream too (earlier device work may write
// them). Blocking: the caller returns once the operation has completed.
#pragma once

#include <cstddef>
#include <vector>

#include "algo/schedule.h"
#include "base/status.h"
#include "core/backend.h"

namespace tutti::core {

// One operation's buffers, as the API saw them (rewritten by stageIn).
struct StageOp {
  algo::Collective coll;
  const void** send;
  void** recv;
  size_t count;  // as passed to the API
  size_t elemSize;
  int rank, nranks, root;  // root: root or peer
  Queue stream;
};

// Pinned host memory grown on demand; owned by a communicator.
struct PinnedBuffer {
  void* ptr = nullptr;
  size_t cap = 0;
};

class DeviceStaging {
 public:
  explicit DeviceStaging(Backend* backend) : be_(backend) {}
  // Stages the device buffers of ops (all of one communicator) in *pinned.
  Status stageIn(std::vector<StageOp>& ops, PinnedBuffer* pinned);
  // After the operations ran: copies outputs back (unless copyBack is false:
  // the operations failed, the caller's buffers are left alone) and waits for
  // the streams.
  Status stageOut(bool copyBack = true);
  bool active() const { return !streams_.empty(); }

 private:
  struct CopyOut {
    void* dst;
    const void* src;
    size_t bytes;
    Queue stream;
  };
  Backend* be_;
  std::vector<CopyOut> out_;
  std::vector<Queue> streams_;  // to drain, each once
};

// Bytes of an operation's send and receive buffers that this rank reads and
// writes (0 where the rank does not use the buffer); count as passed to the
// API, root the root or peer.
void ioBytes(algo::Collective coll, size_t count, size_t elemSize, int rank, int nranks, int root,
             size_t* sendBytes, size_t* recvBytes);

// Frees a communicator's pinned staging memory.
void freePinned(Backend* backend, PinnedBuffer* pinned);

}  // namespace tutti::core
