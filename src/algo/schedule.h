// Schedules: collectives as data.
//
// Contract: an algorithm is a pure function from (collective, sizes, datatype,
// op, rank set) to a Schedule for one rank: local steps to run first, then
// message sends and receives with dependencies. Buffers are symbolic (send,
// recv, scratch + byte offset) so a schedule can be executed, inspected by
// tests, or fed to a simulator. Messages carry a tag unique within the
// schedule for their (sender, receiver) pair; the receiver matches on it, so
// any channel may carry any message (channels pull from a shared queue).
//
// Hazard rules the generators guarantee (the executor relies on them):
// - a send reads its source only after the receive it waits on (if any);
// - a receive whose `local` another receive produces names it in `after`;
// - a receive writes a location no pending send of this rank still reads,
//   except where causality makes that impossible (ring: a region's final value
//   can only return after this rank's partial for it has left).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "base/types.h"

namespace tutti::algo {

// kAbs: `off` is an absolute address (point-to-point operations of a group).
// kState: state kept across calls by a compressed collective (error feedback),
// float32, laid out like the reduced data (offset = element offset * 4).
enum class Buf : uint8_t { kSend = 0, kRecv = 1, kScratch = 2, kAbs = 3, kState = 4 };

struct Ref {
  Buf buf = Buf::kSend;
  size_t off = 0;
};

// How values combine; the executor maps it onto the backend kernels.
struct ReduceSpec {
  DataType dt = DataType::kFloat32;
  RedOp op = RedOp::kSum;  // kSum/kProd/kMax/kMin/kPreMulSum
  double scalar = 1.0;     // kPreMulSum: applied to the local contribution
  int64_t divisor = 0;     // integer average: divide the final value by this
};

// Compressed payload (src/compress): float32 values travel encoded as scaled
// binary16 / bfloat16 or as 1-bit signs (backends/cpu/codec_kernels.h). Only
// steps marked `encoded` use it; a receive of an encoded message decodes and
// then combines in float32.
enum class Wire : uint8_t { kRaw = 0, kHalf = 1, kBf16 = 2, kSign = 3 };
struct WireSpec {
  Wire format = Wire::kRaw;
  int exp = 0;  // kHalf/kBf16: values travel as narrow(v * 2^exp)
};

// kQuantize (compressed schedules): dst = decode(encode(src * scale [+ err]))
// and, with feedback, err = what that rounding dropped.
enum class LocalKind : uint8_t { kCopy, kScale, kDivide, kQuantize };
struct LocalStep {
  LocalKind kind;
  Ref dst;
  Ref src;
  size_t bytes;
  float scale = 1.0f;     // kQuantize
  bool feedback = false;  // kQuantize: `err` holds the error-feedback residual
  Ref err{Buf::kState, 0};
};

struct SendStep {
  int peer;
  uint64_t tag;
  Ref src;
  size_t bytes;
  int32_t waitRecv = -1;  // index into recvs; -1: ready after the local steps
  bool encoded = false;   // goes on the wire in Schedule::wire's format
  // Encodes src + err and keeps in err what the encoding dropped (each
  // element of err must be sent by exactly one step).
  bool feedback = false;
  Ref err{Buf::kState, 0};
};

enum class RecvAction : uint8_t { kCopy, kReduce };
struct RecvStep {
  int peer;
  uint64_t tag;
  size_t bytes;
  RecvAction action;
  Ref dst;
  Ref local;              // kReduce: dst = incoming (op) local
  bool finalize = false;  // apply ReduceSpec::divisor to dst afterwards
  // Index into recvs of a receive that must complete before this one is
  // processed (its dst is this one's `local`); -1: none. It must come from a
  // different peer, so a message held back for it never blocks it.
  int32_t after = -1;
  bool encoded = false;  // the message is in Schedule::wire's format
  // Afterwards dst = decode(encode(dst * postScale [+ err])), with feedback
  // keeping the dropped part in err: the value then is exactly what the wire
  // carries, so every rank that later decodes it holds the same bits.
  bool quantize = false;
  float postScale = 1.0f;
  bool feedback = false;
  Ref err{Buf::kState, 0};
};

enum class Collective : uint8_t {
  kAllReduce,
  kBroadcast,
  kReduce,
  kAllGather,
  kReduceScatter,
  kAllToAll,
  kGather,
  kScatter,
  kSend,
  kRecv,
};
const char* collectiveName(Collective c);
// Collectives with a root: their ranks' parts differ, and some rank's part
// needs nothing from its peers.
inline bool isRooted(Collective c) {
  return c == Collective::kBroadcast || c == Collective::kReduce || c == Collective::kGather ||
         c == Collective::kScatter;
}

struct Schedule {
  ReduceSpec spec;
  WireSpec wire;  // the format of `encoded` steps
  std::vector<LocalStep> local;
  std::vector<SendStep> sends;
  std::vector<RecvStep> recvs;
  size_t scratchBytes = 0;
  std::vector<int> peers;  // every peer this rank exchanges messages with
  std::string algorithm;   // for logs
  uint32_t planKey = 0;    // what else the plan depends on (a balanced plan's weights)
};

// Which node (host) each rank is on. Nodes are numbered in the order of their
// lowest rank; each node lists its ranks ascending ("local ranks" are
// positions in that list). A null NodeMap means every rank on one node.
struct Balance;  // algo/balance.h

struct NodeMap {
  std::vector<int> nodeOf;              // rank -> node index
  std::vector<int> localOf;             // rank -> position within its node
  std::vector<std::vector<int>> nodes;  // node -> its ranks, ascending
  // Ranks with equal ids share a node.
  static NodeMap fromHostIds(const std::vector<uint64_t>& hostIds);
  static NodeMap singleNode(int nranks);
  int nNodes() const { return static_cast<int>(nodes.size()); }
  int maxPerNode() const;
  bool uniform() const;  // every node has the same number of ranks
  // The ranks node after node: the order every ring follows.
  std::vector<int> ringOrder() const;
};

// Latency and bandwidth of one class of link, as the cost model sees it.
struct LinkModel {
  double latencyUs = 1.0;     // per message, one way
  double bandwidthGBs = 5.0;  // one direction, one stream (GB = 1e9 bytes)
};

// The cost model's view of the machine: links inside a node (shared memory)
// and between nodes (the network; `inter.bandwidthGBs` is what one node can
// send, shared by all its ranks, and likewise receive).
struct CostModel {
  LinkModel intra{1.0, 5.0};
  LinkModel inter{20.0, 1.25};
};

struct CollArgs {
  Collective coll;
  int rank;
  int nranks;
  size_t count;  // NCCL's count argument of the call
  size_t elemSize;
  ReduceSpec spec;
  int root = 0;
  bool inPlace = false;  // the call's buffers alias the way NCCL's in-place does
  size_t chunkBytes = 512 << 10;
  // All-reduce: recursive doubling up to this many bytes (latency: log2(n)
  // steps of the whole buffer), ring above. `algo` forces one.
  size_t rdMaxBytes = 0;
  // kRecursiveDoubling is NCCL_ALGO=tree; k2DRing and kHierarchical are the
  // two-level algorithms (need `nodes` with more than one node; kHierarchical
  // also selects the two-level all-gather and reduce-scatter); kRabenseifner
  // (all-reduce: recursive halving, then doubling) is NCCL_ALGO=rabenseifner.
  enum class Algo : uint8_t {
    kAuto,
    kRing,
    kRecursiveDoubling,
    k2DRing,
    kHierarchical,
    kRabenseifner
  } algo = Algo::kAuto;
  // Node layout (null: one node). Rings keep a node's ranks adjacent.
  const NodeMap* nodes = nullptr;
  // Every peer is reached through shared memory (one host, shm not disabled).
  bool sharedMemory = false;
  // For kAuto; null: the defaults of CostModel.
  const CostModel* cost = nullptr;
  // All-reduce: the balanced plans (algo/balance.h) of the ring (shares per
  // rank) and of the two-level algorithms' network ring (per node); null or
  // empty weights: equal shares. The cost model divides each algorithm's
  // transfer time by its plan's gain.
  const Balance* balance = nullptr;
};

// The schedule for one rank: ring / chain / direct (src/algo/ring.cc),
// recursive doubling (src/algo/recursive_doubling.cc), Rabenseifner's
// (src/algo/rabenseifner.cc) or two-level
// (src/algo/hierarchical.cc), chosen by the cost model (src/algo/cost_model.h)
// unless `algo` forces one.
Schedule makeSchedule(const CollArgs& a);

// Point-to-point: the messages of one ncclSend/ncclRecv (chunked).
void appendSend(Schedule* s, int peer, uint64_t tagBase, Ref src, size_t bytes, size_t chunk);
void appendRecv(Schedule* s, int peer, uint64_t tagBase, Ref dst, size_t bytes, size_t chunk);

}  // namespace tutti::algo
