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
// - start() and progress(): a collective in rounds of at most one chunk per
//   rank, as a step kind of the executor (core/executor.h: Work::ipc), which
//   progresses it beside the communicator's other operations and those of
//   the other communicators of a group, on one thread. In a round a rank
//   copies its contribution into its own buffer (on the caller's stream,
//   pre-multiplied for PreMulSum), all ranks meet at a barrier, then each
//   reads what it needs from the peers' buffers with the backend's copy and
//   reduce kernels (an all-reduce reduces its slice of the round in place and
//   meets the others once more before everyone gathers the slices). Barriers
//   run through a node arena of the communicator's own (core/oneshot.h), so a
//   dead, aborted or stuck peer ends the wait with an error, and each carries
//   every rank's status: a rank whose kernel failed makes all fail the same
//   operation. Round k writes buffer k % 2, which nobody reads after the
//   barrier of round k + 1; one more barrier ends the operation, so no rank
//   frees or reuses a buffer a peer still reads. Beside other work nothing
//   blocks: each step's device work is followed by an event on the op's
//   stream that progress() polls (a blocking drain only where the plugin
//   cannot record one), and each barrier is an arena operation progressed
//   like the one-shot path's. Alone (nothing else for the executor's thread
//   to progress) a step drains its stream and waits at its barrier blocking,
//   sleeping rather than polling: polling cost 1.5-2.5x for operations up
//   to 2 MiB on xpu_emu, whose queue threads need the cores the poller
//   held. The operation is done when the caller's stream has drained it.
// - Used under the communicator's mutex, by one thread at a time.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
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
  // What the caller called, for the fingerprint the barriers carry: the
  // ncclRedOp_t as called and the collective call number (Op::call).
  int redop = 0;
  uint64_t call = 0;
};

// One device-IPC collective in progress (DeviceIpc::start, progress): the
// steps of its rounds. A step runs device work on the op's stream (none for
// some), waits until the stream has done it, and, when `barrier`, meets every
// rank with this rank's status (an error of a step without a barrier is
// carried to the next one).
struct IpcRun {
  struct Step {
    std::function<Status()> work;  // null: no device work (and no wait)
    bool barrier = false;
  };
  enum class Phase : uint8_t { kStep, kDevice, kBarrier };
  IpcOp op;
  std::vector<Step> steps;
  size_t next = 0;  // the step in progress
  Phase phase = Phase::kStep;
  Status local;  // this rank's status, carried by the next barrier
  int64_t mine = 0;
  std::vector<int64_t> all;  // the barrier's answer: every rank's status
  OneShotOp meet;
  bool done = false;
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
  // Prepares `run` for `op` (its steps; the round numbers it uses are taken
  // now, so operations start in call order, the same on every rank).
  Status start(const IpcOp& op, IpcRun* run);
  // Advances `run` as far as it can without waiting; sets *moved when
  // anything happened. An error is the same on every rank where a barrier
  // carried it. `block`: nothing else waits for this thread (the executor
  // runs this operation alone), so the device work is drained and the
  // barriers waited for blocking (sleeping, not polling): the whole
  // operation runs before this returns.
  Status progress(IpcRun& run, bool* moved, bool block);
  // Ok while waiting is still reasonable (a barrier's peers: OneShot::check).
  Status check(const IpcRun& run, std::chrono::steady_clock::duration idle) const;
  // The operation stops here (an error, an abort): waits until device work
  // it queued has run, so none outlives the call that owns its buffers.
  void quiesce(IpcRun& run);

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
  // Posts the barrier that carries run.local to every rank.
  void postBarrier(IpcRun& run);
  // The barrier's answer: run.local, else the first rank's error.
  // A mismatch the barrier's arena found, told as one of the device path.
  Status meetError(const IpcRun& run, const Status& st) const;
  Status barrierResult(const IpcRun& run) const;
  // After the current step's device work: its barrier, or the next step.
  void endStep(IpcRun& run);
  // This rank's (peer == rank) or a peer's buffer of round `round`.
  uint8_t* buf(int peer, uint64_t round) const {
    return static_cast<uint8_t*>(bufs_[peer]) + (round & 1) * chunk_;
  }
  // Copies `bytes` from src into this rank's buffer at `off` (pre-multiplied
  // for PreMulSum), async on the op's stream.
  Status copyIn(const IpcOp& op, uint8_t* dst, const uint8_t* src, size_t elems);
  // dst = the op's reduction of srcs[q] + off over every rank q of round's buffers.
  Status reduceFrom(const IpcOp& op, void* dst, uint64_t round, size_t off, size_t elems);

  Comm* comm_;
  Backend* be_;
  int device_;
  size_t chunk_, minBytes_;
  void* mine_ = nullptr;     // 2 * chunk_ bytes of device memory
  std::vector<void*> bufs_;  // per rank: mine_ or the imported mapping
  std::unique_ptr<OneShot> control_;
  Event event_ = nullptr;  // recorded after each step's device work (null: drain blocking)
  uint64_t round_ = 0;  // rounds run, the same on every rank
  uint64_t ops_ = 0;
  std::vector<const void*> srcs_;
};

}  // namespace tutti::core
