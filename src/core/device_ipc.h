// Collectives on device memory between processes of one host, device to
// device through the backend's IPC (no host staging).
//
// Contract
// - Negotiated at communicator init (negotiate(), collective over the
//   bootstrap, every rank of a communicator whose ranks share one host and
//   number at least 2): used when every rank's backend is the same plugin
//   offering IPC, shared memory is allowed (NCCL_SHM_DISABLE, NCCL_P2P_DISABLE
//   unset) and TUTTI_DEVICE_IPC is not 0 on any rank. The chunk size
//   (TUTTI_IPC_CHUNK_BYTES) and the smallest collective taken
//   (TUTTI_IPC_MIN_BYTES) are agreed (smallest chunk, largest minimum), so the
//   choice per operation is the same on every rank.
// - Set-up (also in negotiate()): each rank allocates two device buffers of
//   one chunk (used by alternate rounds) and exports them to its peers; each
//   imports every peer's. Handles travel over the bootstrap; a file descriptor
//   that goes with a handle (TUTTI_PLUGIN_CAP_IPC_NEEDS_FD) travels over an
//   abstract unix socket with SCM_RIGHTS, and the receiver checks the sender's
//   pid (SO_PEERCRED) against the peer's bootstrap record. Any failure on any
//   rank: nobody uses IPC (INFO line), collectives are staged through host
//   memory as before.
// - takes(): raw collectives (not send/recv, not compressed or counted ones)
//   of at least the agreed minimum. The same answer on every rank.
// - run(): a collective in rounds of at most one chunk per rank. In a round a
//   rank copies its contribution into its own buffer (on the caller's stream,
//   pre-multiplied for PreMulSum), all ranks meet at a barrier, then each
//   reads what it needs from the peers' buffers with the backend's copy and
//   reduce kernels (an all-reduce reduces its slice of the round in place and
//   meets the others once more before everyone gathers the slices). Barriers
//   run through a node arena of the communicator's own (core/oneshot.h), so a
//   dead, aborted or stuck peer ends the wait with an error, and each carries
//   every rank's status: a rank whose kernel failed makes all fail the same
//   operation. Round k writes buffer k % 2, which nobody reads after the
//   barrier of round k + 1; one more barrier ends the operation, so no rank
//   frees or reuses a buffer a peer still reads. Blocking: returns when the
//   caller's stream has drained.
// - Used under the communicator's mutex, by one thread at a time.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "algo/schedule.h"
#include "base/status.h"
#include "core/backend.h"
#include "core/comm.h"
#include "core/oneshot.h"

namespace tutti::core {

struct IpcOp {
  algo::Collective coll;
  const void* send;
  void* recv;
  size_t count;  // as passed to the API
  int datatype;  // ncclDataType_t
  size_t elemSize;
  int root;
  // The reduction of the contributions (TUTTI_PLUGIN_OP_*, never PREMULSUM)
  // and, for PreMulSum, the local scalar applied to this rank's contribution
  // as it is copied in (an element of datatype at `scalar`, in host memory or,
  // with scalarOnDevice, device memory read when the copy runs).
  int reduceOp = 0;
  const void* scalar = nullptr;
  bool scalarOnDevice = false;
  Queue stream = nullptr;
};

class DeviceIpc {
 public:
  // Collective over comm's bootstrap (see the contract); nullptr when IPC is
  // not used.
  static Result<std::unique_ptr<DeviceIpc>> negotiate(Comm* comm, Backend* backend, int device);
  ~DeviceIpc();
  DeviceIpc(const DeviceIpc&) = delete;
  DeviceIpc& operator=(const DeviceIpc&) = delete;

  bool takes(algo::Collective coll, size_t count, size_t elemSize, bool raw) const;
  Status run(const IpcOp& op);

  size_t chunkBytes() const { return chunk_; }
  uint64_t operations() const { return ops_; }
  // The communicator was aborted (any thread): peers waiting in this rank's
  // barriers end at once (OneShot::markAborted).
  void markAborted() {
    if (control_) control_->markAborted();
  }
  bool peerAborted(int rank) const { return control_ && control_->peerAborted(rank); }

 private:
  DeviceIpc(Comm* comm, Backend* backend, int device, size_t chunk, size_t minBytes)
      : comm_(comm), be_(backend), device_(device), chunk_(chunk), minBytes_(minBytes) {}
  Status setUp();
  // Everyone's local status; an error if any rank's is (or the wait fails).
  Status barrier(const Status& local);
  // This rank's (peer == rank) or a peer's buffer of round `round`.
  uint8_t* buf(int peer, uint64_t round) const {
    return static_cast<uint8_t*>(bufs_[peer]) + (round & 1) * chunk_;
  }
  // Copies `bytes` from src into this rank's buffer at `off` (pre-multiplied
  // for PreMulSum), async on the op's stream.
  Status copyIn(const IpcOp& op, uint8_t* dst, const uint8_t* src, size_t elems);
  // dst = the op's reduction of srcs[q] + off over every rank q of round's buffers.
  Status reduceFrom(const IpcOp& op, void* dst, uint64_t round, size_t off, size_t elems);
  Status runRounds(const IpcOp& op);

  Comm* comm_;
  Backend* be_;
  int device_;
  size_t chunk_, minBytes_;
  void* mine_ = nullptr;     // 2 * chunk_ bytes of device memory
  std::vector<void*> bufs_;  // per rank: mine_ or the imported mapping
  std::unique_ptr<OneShot> control_;
  uint64_t round_ = 0;  // rounds run, the same on every rank
  uint64_t ops_ = 0;
  std::vector<const void*> srcs_;
};

}  // namespace tutti::core
