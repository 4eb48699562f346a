// Helpers shared by the schedule generators (internal to src/algo).
#pragma once

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <utility>
#include <vector>

#include "algo/schedule.h"

namespace tutti::algo {

// Message tags: (phase, x, j) -> phase in the top byte, x (segment, step or
// block) in bits 32..55, j (slice) below. Phases are unique per generator.
inline constexpr uint64_t kPhaseRs = 0, kPhaseAg = 1, kPhaseBcast = 2, kPhaseReduce = 3,
                          kPhaseDirect = 4, kPhaseRdPre = 5, kPhaseRd = 6, kPhaseRdPost = 7,
                          kPhaseNodeRs = 8, kPhaseToLeader = 9, kPhaseNetRs = 10,
                          kPhaseNetAg = 11, kPhaseNodeAg = 12, kPhaseSignRs = 13,
                          kPhaseSignAg = 14, kPhaseRabPre = 15, kPhaseRab = 16,
                          kPhaseRabAg = 17, kPhaseRabPost = 18, kPhaseCheck = 19;

inline uint64_t tagOf(uint64_t phase, uint64_t x, uint64_t j) {
  return (phase << 56) | (x << 32) | j;
}

inline int mod(int a, int n) { return ((a % n) + n) % n; }

// The largest power of two <= n (n >= 1): the ranks recursive doubling and
// Rabenseifner's pair up; the n - p2 others fold in first.
inline int floorPow2(int n) {
  int p2 = 1;
  while (p2 * 2 <= n) p2 *= 2;
  return p2;
}

struct Slice {
  size_t off;  // bytes, relative to the segment
  size_t bytes;
};

// Splits `bytes` into slices of at most `chunk` bytes, on element boundaries.
inline std::vector<Slice> slices(size_t bytes, size_t elemSize, size_t chunk) {
  std::vector<Slice> out;
  size_t step = std::max(elemSize, chunk / elemSize * elemSize);
  for (size_t off = 0; off < bytes; off += step) out.push_back({off, std::min(step, bytes - off)});
  return out;
}

// The balanced plan's weights of the ring and of the network ring
// (algo/balance.h), or null: equal shares.
const std::vector<uint32_t>* ringWeights(const CollArgs& a);
const std::vector<uint32_t>* netWeights(const CollArgs& a);

// Near-equal split of `count` elements into n segments: (offset, length) in elements.
inline std::pair<size_t, size_t> segment(size_t count, int n, int x) {
  size_t base = count / n, extra = count % n;
  size_t len = base + (static_cast<size_t>(x) < extra ? 1 : 0);
  size_t start = static_cast<size_t>(x) * base + std::min<size_t>(x, extra);
  return {start, len};
}

// A ring through every rank, each node's ranks adjacent (nodes in order,
// ranks ascending within a node), so the ring crosses each node boundary once.
struct RingOrder {
  std::vector<int> rankAt;  // position -> rank
  std::vector<int> posOf;   // rank -> position
  explicit RingOrder(const CollArgs& a) : rankAt(a.nranks), posOf(a.nranks) {
    if (a.nodes) {
      rankAt = a.nodes->ringOrder();
    } else {
      for (int i = 0; i < a.nranks; ++i) rankAt[i] = i;
    }
    for (int i = 0; i < a.nranks; ++i) posOf[rankAt[i]] = i;
  }
  int size() const { return static_cast<int>(rankAt.size()); }
  int at(int pos) const { return rankAt[((pos % size()) + size()) % size()]; }
};

// Local step that turns a rank's own input into what it contributes:
// a scaled copy for premulsum, else nothing (send straight from the input).
inline Ref contribution(Schedule* s, const ReduceSpec& spec, Ref input, Ref scaledAt,
                        size_t bytes) {
  if (spec.op != RedOp::kPreMulSum) return input;
  s->local.push_back({LocalKind::kScale, scaledAt, input, bytes});
  return scaledAt;
}

inline int32_t addRecv(Schedule* s, RecvStep r) {
  s->recvs.push_back(r);
  return static_cast<int32_t>(s->recvs.size() - 1);
}

inline void addPeers(Schedule* s, std::initializer_list<int> peers, int self) {
  for (int p : peers)
    if (p != self && std::find(s->peers.begin(), s->peers.end(), p) == s->peers.end())
      s->peers.push_back(p);
}

// Recursive-doubling all-reduce (recursive_doubling.cc).
void recursiveDoublingAllReduce(Schedule* s, const CollArgs& a);

// Rabenseifner's all-reduce: recursive halving, then doubling (rabenseifner.cc).
void rabenseifnerAllReduce(Schedule* s, const CollArgs& a);

// Two-level all-reduce across nodes (hierarchical.cc): hierarchical
// (`viaLeaders` false) or 2D-ring (true). Needs a.nodes with >= 2 nodes.
void twoLevelAllReduce(Schedule* s, const CollArgs& a, bool viaLeaders);
// Two-level all-gather and reduce-scatter (hierarchical.cc): uniform nodes
// of more than one rank, more than one node.
void twoLevelAllGather(Schedule* s, const CollArgs& a);
void twoLevelReduceScatter(Schedule* s, const CollArgs& a);

}  // namespace tutti::algo
