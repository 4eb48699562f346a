// One-shot collectives for small messages on one host, through the node arena
// (transports/shm/shm_arena.h): the latency path.
//
// Protocol. An operation uses a small slot when its contribution fits one
// (ArenaSegment::kSmallSlotBytes, K = 64 of them per rank) and a large one
// otherwise (K = 8). Operations of each class are numbered 1, 2, ... per
// communicator; every rank runs the same ones in the same order (the choice
// depends only on the call's collective, count and datatype, which all ranks
// share). For operation c of a class, rank r:
//   1. waits until every rank has published c-K+1 of that class (so nobody
//      still reads slot c%K, which r is about to overwrite: its previous use
//      was c-K, and a rank publishes an operation only after it finished
//      every earlier one); a rank may thus run up to K-1 operations of a
//      class ahead (63 small ones: a broadcast root on a host with more ranks
//      than cores hands over many messages per time slice);
//   2. writes its contribution (if the collective has one from r) into its
//      slot c%K and publishes c there (release). It also records, in its
//      own line of the arena, the operation's number among all operations
//      and its signature: a peer that waits for r in one class while r has
//      posted that operation in the other reports the mismatch instead of
//      waiting for the timeout;
//   3. waits for the ranks whose data it needs to publish c, then reads their
//      slots directly: all-reduce, all-gather and reduce-scatter read every
//      slot, broadcast the root's, reduce (root only) every slot.
// Each slot also carries the operation's signature (collective, datatype,
// op, root, count); a rank that reads a slot whose signature differs from its
// own call reports the mismatch instead of computing garbage.
// Reductions combine the slots in rank order with one rounding (cpu::reduceN),
// so every rank's all-reduce result is bit-identical. PreMulSum (and float
// average) scales each contribution as it is written; integer average divides
// the final sum.
//
// Single-copy operations (off unless TUTTI_CMA=1). All-gather and broadcast
// above the slot size (and at least TUTTI_CMA_MIN_BYTES) take the same path
// without copying their data into the arena: the slot carries the address of
// the rank's send buffer and the count, and each reader copies straight from
// the owner's buffer into its own receive buffer with cross-memory attach
// (transports/shm/cma.h; a plain memcpy between ranks of one process). Each
// reader then raises its acknowledgement word to c, and an owner completes c
// only when every rank that reads its buffer acknowledged c, so no rank
// returns (and lets its caller touch the buffer) while a peer still reads it.
// The ranks agree at create() whether every one of them can read every other
// (a probe of a canary value), else none uses the path.
//
// Waiting: progress() never blocks; the caller spins, then yields
// (base/backoff.h), then sleeps on its doorbell in the arena
// (transports/shm/doorbell.h): every publication and acknowledgement rings
// the other ranks' doorbells. It calls check() now and then, which reports a
// peer whose process died, that closed its communicator or failed, an abort,
// or no progress for the communicator's timeout. run() is the blocking loop
// used by a call made outside a group; inside a group the executor drives
// progress() (and sleeps on the same doorbell).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "algo/schedule.h"
#include "base/status.h"
#include "transports/shm/shm_arena.h"

namespace tutti::core {

class Comm;

struct OneShotOp {
  algo::Collective coll = algo::Collective::kAllReduce;
  const uint8_t* send = nullptr;
  uint8_t* recv = nullptr;
  size_t count = 0;  // NCCL's count argument
  size_t elemSize = 0;
  algo::ReduceSpec spec;
  int root = 0;
  int redop = 0;        // ncclRedOp_t as called (checked across ranks with the rest)
  uint64_t call = 0;    // Op::call: its number among the communicator's collective calls
  bool part = false;    // Op::part: a part of that call, not the call itself
  bool direct = false;  // single-copy: peers read this rank's send buffer
  // Progress state.
  uint8_t cls = 0;         // slot class (OneShot::classOf), set when posted
  uint64_t seq = 0;        // 0 until posted; numbered per class
  uint64_t global = 0;     // number among all of the arena's operations
  bool readsDone = false;  // direct: this rank copied what it needs
  bool done = false;
};

class OneShot {
 public:
  // Collective over the communicator's bootstrap (every rank calls it at
  // init). Returns nullptr when the arena is not used: ranks on several
  // hosts, shared memory disabled, both TUTTI_ONESHOT_MAX=0 and TUTTI_CMA=0
  // (each on any rank), or a rank that could not map the segment (logged at
  // INFO; never an error). slotBytes > 0 asks for an arena of that slot size
  // whatever TUTTI_ONESHOT_MAX says and without single-copy operations (a
  // second arena for a protocol's own control messages, such as
  // core/device_ipc.h's barriers).
  static Result<std::unique_ptr<OneShot>> create(Comm* comm, size_t slotBytes = 0);

  // Bytes of this rank's slot the operation needs (0: not an arena collective).
  static size_t slotBytesFor(algo::Collective coll, size_t count, size_t elemSize, int nranks);
  // Whether the operation runs here: through the slots, or single-copy
  // (*direct). The same answer on every rank: it depends on the collective,
  // count and datatype, and on settings the ranks agreed on.
  bool takes(algo::Collective coll, size_t count, size_t elemSize, bool* direct) const;
  bool singleCopy() const { return cma_; }
  // Single-copy operations this rank completed (tests check the path).
  uint64_t directOps() const { return directOps_; }
  // The shared segment (tests check where its pages were placed).
  transport::shm::ArenaSegment& arena() { return *seg_; }

  // Advances `op` as far as it can without waiting; sets *moved when anything
  // happened. Operations must be progressed to completion in order.
  Status progress(OneShotOp& op, bool* moved);
  // Ok while waiting is still reasonable (see the header comment).
  Status check(const OneShotOp& op, std::chrono::steady_clock::duration idle);
  // Blocks until `op` is done or failed.
  Status run(OneShotOp& op);

  // This rank failed, or its communicator was aborted (any thread): peers
  // waiting on it stop with an error that says which.
  void markFailed() { seg_->markFailed(); }
  void markAborted() { seg_->markAborted(); }
  // Rank r's doorbell (transports/shm/doorbell.h), and a ring of this rank's
  // own (wakes its thread if it sleeps there: an abort).
  transport::shm::Doorbell* bell(int rank) { return seg_->bell(rank); }
  void wake() { transport::shm::ring(seg_->bell(rank_)); }

  OneShot(Comm* comm, std::unique_ptr<transport::shm::ArenaSegment> seg, size_t maxBytes, bool cma,
          size_t cmaMinBytes, std::vector<bool> local);
  // A peer's arena state is failed or closed (the executor asks this of the
  // peers it waits on, so a rank that failed on the one-shot path does not
  // leave a peer in a schedule waiting for its timeout).
  bool peerGone(int rank) const { return seg_->state(rank) != transport::shm::ArenaSegment::kOpen; }
  bool peerAborted(int rank) const {
    return seg_->state(rank) == transport::shm::ArenaSegment::kAborted;
  }
  // Some peer's state is no longer open (a few loads: cheap enough to ask
  // while waiting, between the full checks).
  bool anyPeerGone() const;
  // What `rank` posted here as collective call `call` (low 32 bits, as
  // OpSig carries it), described, or nothing. The executor asks it of the
  // peers a schedule waits on: a peer that took the one-shot path for a call
  // this rank runs as a schedule was given another count (on the other side
  // of TUTTI_ONESHOT_MAX), and neither would ever hear from the other.
  std::optional<std::string> postedAsCall(int rank, uint32_t call);

 private:
  bool published(int rank, int cls, uint64_t seq);
  // Wakes the peers asleep on their doorbells after a publication or an
  // acknowledgement (one fence, then a load per peer when nobody sleeps).
  void ringPeers();
  // Which slots the operation uses: 0 the small ones (up to
  // ArenaSegment::kSmallSlotBytes, and every single-copy record), 1 the
  // large ones. Each class numbers its operations on its own.
  int classOf(const OneShotOp& op) const;
  bool acked(int rank, uint64_t seq);
  Status checkSignature(const OneShotOp& op, int q);
  // The error for rank q having called `theirs` where this rank called op.
  Status mismatch(const OneShotOp& op, int q, const std::string& theirs);
  void complete(OneShotOp& op);
  // Direct operations: copies what this rank needs from its peers' buffers.
  Status readDirect(const OneShotOp& op);
  Status readPeer(int q, const void* remote, void* local, size_t bytes);

  Comm* comm_;
  std::unique_ptr<transport::shm::ArenaSegment> seg_;
  int rank_, nranks_;
  size_t maxBytes_;
  bool cma_;                      // single-copy operations are on
  size_t cmaMinBytes_;            // ... from this many bytes per rank
  std::vector<bool> local_;       // per rank: in this process (memcpy, no system call)
  uint64_t nextSeq_[2] = {1, 1};  // per slot class
  uint64_t nextGlobal_ = 1;       // both classes
  uint64_t directOps_ = 0;
  std::vector<uint64_t> seen_[2];  // per class, the highest sequence number seen per rank
  std::vector<uint64_t> seenAck_;  // highest acknowledgement seen per rank
  std::vector<const void*> srcs_;
};

}  // namespace tutti::core
