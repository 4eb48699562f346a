// The communicator: one rank's view of a group of ranks.
//
// Contract
// - Created collectively (every rank calls create() with the same id and
//   nranks); returns once every rank has joined and this rank's ring
//   neighbours are connected on every channel, or with an error naming the
//   rank(s) that did not show up within TUTTI_INIT_TIMEOUT. Across nodes,
//   init also measures the link between rank 0 and its ring predecessor for
//   the cost model (TUTTI_LINK_PROBE, core/link_probe.h): tens of ms at most
//   on a 1 Gbit/s link, a few on faster ones.
// - Connections are made per (peer, channel) on first need, in a global
//   order of rank pairs, so ranks that connect lazily never deadlock.
// - API calls on one communicator are serialised by its mutex; abort() may be
//   called from any thread at any time and every wait notices it.
// - After an error during a collective the communicator is broken: its async
//   error is set and every later operation fails fast with that error.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "algo/balance.h"
#include "algo/schedule.h"
#include "base/status.h"
#include "core/backend.h"
#include "core/bootstrap.h"
#include "core/flight_recorder.h"
#include "core/link_probe.h"
#include "core/oneshot.h"
#include "core/op.h"
#include "core/staging.h"
#include "core/telemetry.h"
#include "core/tuner.h"
#include "core/wire_header.h"
#include "transports/transport.h"

namespace tutti::topo {
struct Topology;
}  // namespace tutti::topo
namespace tutti::transport {
struct TokenBucket;
}  // namespace tutti::transport

namespace tutti::core {

class DeviceIpc;
class Engine;
struct LoneWork;

struct CommConfig {
  bool blocking = true;
  std::string name;
  int minChannels = -1;
  int maxChannels = -1;
};

// Per-connection receive state that outlives one collective: a header read
// for a later collective stays parked here until that collective runs.
struct RecvState {
  MsgHeader hdr{};
  size_t hdrGot = 0;
  bool haveHeader = false;
};

struct Channel {
  std::unique_ptr<transport::Connection> conn;
  RecvState rx;
  std::vector<uint8_t> staging;  // incoming payload of a reducing receive
  uint64_t messagesSent = 0;     // statistics: chunks this channel carried
  uint64_t bytesSent = 0;
};

class Comm {
 public:
  // `backend` (the process backend) and `device` (the device this rank is
  // bound to): where its buffers live. Ranks on one host negotiate device IPC
  // here (core/device_ipc.h).
  // `abortFlag`: this communicator's abort flag, owned by its creation
  // (core/init.h) so that ncclCommAbort reaches the creation while it runs;
  // it outlives the communicator.
  static Result<std::unique_ptr<Comm>> create(const UniqueIdData& id, int rank, int nranks,
                                              const CommConfig& config, Backend* backend,
                                              int device, std::atomic<bool>* abortFlag);
  ~Comm();

  int rank() const { return rank_; }
  int nranks() const { return nranks_; }
  int nChannels() const { return nChannels_; }
  const CommConfig& config() const { return config_; }
  Bootstrap& bootstrap() { return *bootstrap_; }
  const PeerInfo& peer(int r) const { return bootstrap_->peers()[r]; }
  bool sameHost(int r) const { return peer(r).hostId == peer(rank_).hostId; }
  // Every rank shares this rank's host identity (memory the host can map is
  // reachable by all; TUTTI_TEST_NODES does not change this answer).
  bool allOnOneHost() const {
    for (int r = 0; r < nranks(); ++r)
      if (!sameHost(r)) return false;
    return true;
  }
  // Every peer is reached through shared memory: one host, NCCL_SHM_DISABLE
  // unset (rank 0's answer, agreed at init: it picks algorithms).
  bool sharedMemory() const { return sharedMemory_; }
  uint64_t commHash() const { return bootstrap_->id().nonce; }
  std::string describePeer(int r) const;

  // Connects to `peers` on every channel (no-op for those already connected).
  Status ensureConnected(const std::vector<int>& peers);
  // A receive from any source (Op::kAnySource), under mutex() where the
  // communicator's operations run: waits for the first peer whose next
  // operation towards this rank is point-to-point (its message header read
  // and left for the receive that follows) and returns it. Connects to a
  // peer that starts connecting to this rank meanwhile. Fails on abort,
  // revoke, a peer's failure, TUTTI_TIMEOUT, or when no peer is left.
  Result<int> awaitAnySource();
  Channel& channel(int peer, int ch) { return channels_[peer][ch]; }
  const char* transportName(int peer) const;
  // Operation numbers per peer and direction: the k-th operation that sends
  // to a peer is matched with that peer's k-th operation that receives from
  // this rank, as NCCL matches sends with receives (in order, per pair and
  // direction). One shared count would tie the two directions together, and
  // a send followed by a receive (outside a group) on both ranks would then
  // mismatch.
  uint64_t nextSendSeq(int peer) { return sendSeq_[peer]++; }
  uint64_t nextRecvSeq(int peer) { return recvSeq_[peer]++; }
  // Numbers the collective calls (Op::call): every rank calls the same
  // collectives in the same order, so equal numbers name the same call.
  uint64_t nextCollectiveCall() { return calls_.fetch_add(1, std::memory_order_relaxed); }

  // Which node each rank is on (by host id, or TUTTI_TEST_NODES) and the
  // cost model the algorithm selection uses.
  const algo::NodeMap& nodeMap() const { return nodeMap_; }
  const algo::CostModel& costModel() const { return costModel_; }
  // NCCL_ALGO as read at init, and the algorithm it forces for all-reduce,
  // all-gather and reduce-scatter (kAuto: none it names exists).
  const std::string& algoEnv() const { return algoEnv_; }
  algo::CollArgs::Algo forcedAlgo() const { return forcedAlgo_; }
  // TUTTI_COMPRESSION ("fp16", "bf16" or "": off) and the smallest
  // all-reduce it applies to (TUTTI_COMPRESSION_MIN_BYTES), rank 0's values.
  const std::string& compressionEnv() const { return compressionEnv_; }
  size_t compressionMinBytes() const { return compressionMinBytes_; }

  // The one-shot path for small collectives on one host; null when unused.
  OneShot* oneShot() { return oneShot_.get(); }
  // More ranks of this communicator on this machine (same hostname, whatever
  // their node identity) than CPUs this process may use.
  bool oversubscribed() const { return oversubscribed_; }
  // The NUMA node this rank's memory goes to (topo::homeNumaNode at init);
  // -1: first touch decides.
  int homeNuma() const { return homeNuma_; }
  // The NUMA node nearest to this rank's device (its PCI bus id, from the
  // backend, found in the topology read at init); -1 when not known (a
  // host-only backend, a plugin without devicePciBusId, a device the
  // topology lacks). The engine thread is bound near it. topology(): what
  // was read at init (never null after create), kept so that nothing re-reads it.
  int deviceNuma() const { return deviceNuma_; }
  // A host-memory communicator whose traffic goes over TCP: the NUMA node of
  // the NIC it leaves through (-1 when unknown, or when shared memory carries it).
  int nicNuma() const { return nicNuma_; }
  const topo::Topology& topology() const { return *topology_; }

  // The device side: the backend buffers are checked against, the device
  // this rank is bound to, the pinned host memory device buffers are staged
  // through (core/staging.h; used under mutex()), and device-to-device
  // collectives between the processes of one host (null when not used).
  Backend& backend() const { return *backend_; }
  // The kernels host buffers are reduced and encoded with (the backend's).
  const HostKernels& kernels() const { return backend_->hostKernels(); }
  int device() const { return device_; }
  PinnedBuffer* pinnedStaging() { return &pinned_; }
  DeviceIpc* deviceIpc() const { return ipc_.get(); }

  // PreMulSum operators created on this communicator; op value
  // ncclNumOps + i is userOps()[i] (its `live` says whether it still exists).
  // Operations queued on the engine read the table: the two calls that change
  // it drain the engine first. createPreMulSum: a new operator on `dt` whose
  // scalar lives at `scalar` (ncclScalarDevice: read at each use) or is
  // copied now (ncclScalarHostImmediate); its op value, a freed slot reused.
  // destroyUserOp: false when `op` is no live operator of this communicator.
  // checkRedOp: `op` is built-in, or a live operator of this communicator
  // created for `dt` (a valid datatype); kInvalidArgument saying which not.
  const std::vector<UserRedOp>& userOps() const { return userOps_; }
  Status checkRedOp(int op, int dt) const;
  int createPreMulSum(const void* scalar, int dt, int residence);
  bool destroyUserOp(int op);
  // ncclCommRegister's records: the handle is the record's address.
  void* registerRange(void* base, size_t bytes);
  bool deregister(void* handle);
  // ncclCommSplit's collective part: every rank's (color, key) exchanged,
  // then, for this rank's color, its new rank (by key, ties by old rank), the
  // new size and the unique id the new communicator is created from (made by
  // its rank 0, sent to the others over the bootstrap). color < 0 (no color):
  // takes part, nranks 0. Drains the engine, then takes mutex().
  struct SplitPlan {
    int rank = -1, nranks = 0;
    uint8_t id[kUniqueIdBytes] = {};
  };
  Result<SplitPlan> split(int color, int key);
  // The members of a split or shrink (ranks of this communicator) on this
  // host but this rank, for the new communicator's init (expectMembers).
  std::vector<JoinMember> localMembers(const std::vector<int>& ranks) const;
  // bootstrap recv from `from` that ends, naming it, when `from` is on this
  // host and its process is gone (a split's or shrink's member that died).
  Result<std::vector<uint8_t>> recvWhileAlive(int from, uint64_t tag);
  // split() without blocking the caller: the exchange runs as a job on the
  // engine, in call order with the operations queued there, and hands its
  // plan (or error) to `then` on the engine thread. `then` is called exactly
  // once: a job that never runs (this communicator failed or was aborted
  // first, or queueing it failed) hands it that error instead.
  void splitQueued(int color, int key, std::function<void(Result<SplitPlan>)> then);
  // ncclCommShrink's part: the ranks not in `exclude` (`count` of them; this
  // rank must not be one) build a new communicator without any exchange
  // among all ranks (an excluded rank may be dead): new ranks in old order,
  // and the unique id made by the lowest survivor, sent to the others over
  // the bootstrap. `flags` NCCL_SHRINK_ABORT: this communicator fails first,
  // so that what its engine still holds ends at once; NCCL_SHRINK_DEFAULT:
  // that work runs to its end. Works on a communicator in error state.
  Result<SplitPlan> shrink(const int* exclude, int count, int flags);
  // ncclCommRevoke: every operation of this communicator, running (on any
  // thread), queued on the engine or called later, fails at once with
  // "revoked"; the peers are told (a failure notice, and the node arena's
  // state), so that none of them is left waiting on this rank. Returns when
  // the engine is idle. What may follow: destroy, abort, split, shrink.
  // Not an error state: ncclCommGetAsyncError answers ncclSuccess once the
  // engine is idle (NCCL's contract), unless an error came first. `flags`
  // must be NCCL_REVOKE_DEFAULT.
  Status revoke(int flags);
  bool revoked() const { return revoked_.load(std::memory_order_relaxed); }

  // The last operations given to this communicator (core/flight_recorder.h),
  // dumped once, at its first failure or at an abort with one pending.
  // Operations are recorded in core::apiOp and marked ended by the path that
  // ran them while it holds mutex() (core/group.cc: after that, an abort
  // from another thread may free this communicator).
  FlightRecorder& recorder() { return recorder_; }
  void dumpFlightRecorder(const std::string& reason);
  // Late ranks and slow links, measured by the executor on every message
  // (core/telemetry.h).
  Telemetry& telemetry() { return *telemetry_; }
  // The inter-node bandwidth in MB/s when the link probe measured it or the
  // topology file gave it (rank 0's, as every rank agreed at init); 0 when
  // the cost model has only its default.
  double knownInterMBps() const { return knownInterMBps_; }
  // The balanced plans (algo/balance.h), agreed at init from the measured
  // link rates (empty weights: equal shares). An all-reduce of
  // algo::kBalanceMinBytes or more on the ring or a two-level algorithm
  // uses them.
  const algo::Balance& balance() const { return balance_; }
  // Re-planning at run time (algo/balance.h; core/group.cc agreeBalance),
  // under mutex(): `bytes` of plain all-reduce ran; whether the ranks now
  // gather their link figures (TUTTI_REPLAN_BYTES of them since the last
  // time; never when nothing was planned at init or re-planning is off).
  bool replanDue(uint64_t bytes);
  // Every rank's figure (`all`, by rank: what its links to the next node
  // carried since its figure was last taken, Telemetry::nextNodeLoad),
  // gathered after collective call `call`: updates each node's link rate,
  // re-plans, and takes this rank's figure when its node's was judged. Whether the plans or their
  // gains changed (schedules built on them are stale: the shares, or the algorithm the cost model
  // would choose); *sharesMoved (when given): whether a plan's shares changed.
  bool replanBalance(const std::vector<algo::LinkLoad>& all, uint64_t call,
                     bool* sharesMoved = nullptr);
  // The rate of each node's link to the next node the plans stand on (GB/s;
  // empty: no re-planning).
  const std::vector<double>& nodeRates() const { return nodeRateGBs_; }
  // TUTTI_TEST_LINK_MBPS only: this rank's emulated link to `peer` runs at
  // `mbps` from now (tests change a link's rate between calls; false: no
  // emulated link to that peer).
  bool setTestLinkRate(int peer, double mbps);
  // Run-time tuning of large collectives (core/tuner.h), set up at init from
  // rank 0's TUTTI_TUNE and TUTTI_TUNE_MIN_BYTES; used under mutex() by the
  // thread that runs operations (core/group.cc).
  Tuner& tuner() { return tuner_; }
  // The progress engine (core/engine.h), started on first use, and a wait
  // for whatever it still runs (no-op without one).
  Engine& engine();
  void drainEngine();
  // Operations are queued or running on the engine (false without one).
  bool engineBusy() const;
  // The planner's cache of the last collective run alone (core/group.cc).
  std::shared_ptr<LoneWork>& loneWork() { return loneWork_; }

  // Per-operation scratch memory owned by the communicator (grown on demand).
  Result<uint8_t*> scratch(size_t bytes);
  // The executor's state for this communicator's operations (core/executor.cc), kept from one
  // operation to the next so that a repeated one reuses its containers instead of allocating
  // them again. Used only under mutex().
  std::shared_ptr<void>& executorCache() { return executorCache_; }

  std::mutex& mutex() { return mu_; }
  void abort();
  bool aborted() const { return abort_->load(std::memory_order_relaxed); }
  const std::atomic<bool>* abortFlag() const { return abort_; }
  // Records the first error; later operations fail fast with it.
  void setError(const Status& st);
  Status error() const;
  // Ok while operations may run: not in error state, not aborted, not revoked.
  Status usable() const;
  // The error of every operation of a revoked communicator.
  static Status revokedError();
  int asyncErrorCode() const { return asyncError_.load(); }

  size_t chunkBytes() const { return chunkBytes_; }
  // All-reduce up to this size uses recursive doubling (TUTTI_RD_MAX).
  size_t rdMaxBytes() const { return rdMaxBytes_; }
  size_t bufferBytes() const { return bufferBytes_; }
  double timeoutSec() const { return timeoutSec_; }
  // Testing: channel `throttledChannel_` may start a message at most every
  // `throttleUs_` microseconds (TUTTI_TEST_THROTTLE="channel:us").
  int throttledChannel() const { return throttledChannel_; }
  int throttleUs() const { return throttleUs_; }

  std::vector<uint64_t> channelMessages() const;

  // Whom the running operation waits for: the peers its stall checks (every
  // 100 ms without progress: the executor's, the one-shot path's) found it
  // still expecting messages from or still sending to, until it ends. Set
  // and cleared by the thread running the operation; read from any thread
  // (tuttiCommWaitingOn: a framework's watchdog names them in its timeout).
  // Ascending.
  void noteWaiting(const std::vector<int>& peers);
  void clearWaiting() {
    if (waitingNoted_.load(std::memory_order_relaxed)) clearWaitingNow();
  }
  std::vector<int> waitingOn() const;

  // Failure explanations between ranks. When an operation fails here, every
  // peer is told why (best effort, within 1 s) before this rank
  // closes its connections; a peer that then sees this rank close looks for
  // that notice (waiting up to `wait`) and reports the root cause, so every
  // survivor of a crash names the rank that died, not the neighbour that
  // gave up first. A peer on this host whose communicator was aborted says
  // so in the node arena (OneShot::markAborted, set by abort()): that is
  // reported at once, without waiting for a notice.
  // Every rank of the communicator is told, connected or not (an operation
  // this rank will never run, or a connection it will never accept, may be
  // what they wait for).
  void noticeFailure(const Status& cause);
  Status explainPeerFailure(int peer, const Status& observed,
                            std::chrono::milliseconds wait = std::chrono::milliseconds(300));
  // The failure notice `peer` sent, if one has arrived (no waiting): the
  // error "<peer> gave up after an error of its own: ...", else ok. The
  // stall checks ask it of the peers a waiting operation needs, so a failure
  // travels from rank to rank over any transport (a peer that failed keeps
  // its connections open until its communicator is destroyed).
  Status noticeFrom(int peer);
  // The one wording of "peer aborted": `detail` says what this rank was doing
  // ("while this rank waited for it in ..."); the arena is read before any
  // notice (an aborted rank's executor may send one that says only
  // "communicator aborted"), so this is the root cause as it stands.
  // kRemoteError unless `code` says otherwise (the code of what this rank
  // observed).
  Status peerAbortedError(int peer, std::string_view detail, Code code = Code::kRemoteError) const;

 private:
  // split()'s collective part, under mutex().
  Result<SplitPlan> splitExchange(int color, int key);
  Comm() = default;
  Status connectPair(int peer);
  // Collective: fills costModel_, rdMaxBytes_ and forcedAlgo_ from rank 0's
  // (after the ring connections, which the link probe uses); t: this
  // process's topology (its recorded link figures).
  Status agreeOnSelection(const topo::Topology& t);
  // What the link probe measured on one link (zero: not measured).
  struct LinkFigures {
    double latencyUs, bandwidthGBs;
  };
  // The link probe at init (core/link_probe.h): every ring link between two
  // nodes, measured by its sending rank; *out: per rank, the link it sends
  // on, gathered on every rank. `needed`: the topology leaves an inter-node
  // figure out.
  Status probeRingLinks(bool needed, std::vector<LinkFigures>* out);
  // balance_ from the gathered figures (TUTTI_BALANCE: `enabled`).
  void planBalance(const std::vector<LinkFigures>& links, bool enabled);
  // Reads TUTTI_COMPRESSION and TUTTI_COMPRESSION_MIN_BYTES (comm.cc).
  Status readCompressionEnv();
  // The network for peers that shared memory does not carry: an NCCL net
  // plugin, or TCP (TUTTI_NET, NCCL_NET, NCCL_NET_PLUGIN; docs/transports.md).
  Status chooseNetwork();
  // Shared memory for peers on this host (unless NCCL_SHM_DISABLE), else the
  // network chooseNetwork() picked.
  transport::Transport* transportFor(int peer) const;

  int rank_ = -1, nranks_ = 0, nChannels_ = 1;
  CommConfig config_;
  Backend* backend_ = nullptr;
  int device_ = 0;
  PinnedBuffer pinned_;
  std::unique_ptr<DeviceIpc> ipc_;
  std::vector<UserRedOp> userOps_;
  struct Registration {
    void* base;
    size_t bytes;
  };
  std::unordered_map<void*, std::unique_ptr<Registration>> registrations_;
  uint64_t splitSeq_ = 0;  // splits so far (the same on every rank)
  std::shared_ptr<LoneWork> loneWork_;
  std::mutex engineMu_;
  std::unique_ptr<Engine> engine_;
  std::atomic<Engine*> engineSeen_{nullptr};  // engine_, for a lock-free check on the hot path
  std::unique_ptr<Bootstrap> bootstrap_;
  std::unique_ptr<transport::Transport> shm_, tcp_;
  std::unique_ptr<transport::Transport> net_;  // over a net plugin; null: TCP
  std::unique_ptr<OneShot> oneShot_;
  algo::NodeMap nodeMap_;
  algo::CostModel costModel_;
  std::string algoEnv_;
  algo::CollArgs::Algo forcedAlgo_ = algo::CollArgs::Algo::kAuto;
  std::string compressionEnv_;
  size_t compressionMinBytes_ = 256 << 10;
  bool sharedMemory_ = false;
  bool oversubscribed_ = false;
  int homeNuma_ = -1;
  int deviceNuma_ = -1;
  int nicNuma_ = -1;
  std::shared_ptr<const topo::Topology> topology_;
  std::vector<std::vector<Channel>> channels_;  // [peer][channel]
  std::vector<uint64_t> sendSeq_, recvSeq_;
  std::atomic<uint64_t> calls_{0};
  std::unique_ptr<uint8_t[]> scratch_;
  size_t scratchCap_ = 0;
  std::shared_ptr<void> executorCache_;
  size_t chunkBytes_ = 512 << 10, bufferBytes_ = 4 << 20, rdMaxBytes_ = 64 << 10;
  double timeoutSec_ = 300;
  int throttledChannel_ = -1, throttleUs_ = 0;
  double knownInterMBps_ = 0;
  algo::Balance balance_;
  std::vector<double> nodeRateGBs_;  // see nodeRates()
  double ceilingGBs_ = 0;            // the fastest of them at init (algo::updateRate)
  uint64_t replanBytes_ = 0;         // TUTTI_REPLAN_BYTES (0: never)
  uint64_t sinceReplan_ = 0;         // plain all-reduce bytes since the last gathering
  Tuner tuner_;
  unsigned tuneKnobs_ = Tuner::kAll;  // TUTTI_TUNE, less what the environment fixes
  uint64_t tuneMinBytes_ = 1 << 20;   // TUTTI_TUNE_MIN_BYTES
  std::vector<double> linkMBps_;  // TUTTI_TEST_LINK_MBPS: per peer, the rate of this rank's link
  std::vector<std::shared_ptr<transport::TokenBucket>> testLinks_;  // its emulated links, per peer
  std::mutex mu_;
  std::atomic<bool>* abort_ = nullptr;  // create()'s abortFlag
  std::atomic<bool> revoked_{false};    // revoke()
  FlightRecorder recorder_;
  std::atomic<bool> dumped_{false};  // dumpFlightRecorder ran
  std::unique_ptr<Telemetry> telemetry_;
  mutable std::mutex errMu_;
  Status error_;
  std::atomic<int> asyncError_{0};
  void clearWaitingNow();
  mutable std::mutex waitingMu_;
  std::vector<int> waitingOn_;
  std::atomic<bool> waitingNoted_{false};
};

}  // namespace tutti::core
