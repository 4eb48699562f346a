// Two-level all-reduce: hierarchical and 2D-ring. See schedule.h for the
// contract and schedule_util.h for tags.
//
// The buffer is cut into M segments, M = the most ranks any node has, and
// each segment into slices (chunkBytes). Node-local rank l of a node with k
// ranks owns segments s with s % k == l.
//   1. Node reduce-scatter: slice (s, j) travels the node's ring from the
//      owner's successor to the owner, each rank adding its contribution.
//   2. 2D-ring only: the owner hands its node's sum to the node leader
//      (local rank 0). The segment's "holder" is then the leader; in the
//      hierarchical algorithm the holder is the owner itself.
//   3. Network all-reduce: the holders of segment s, one per node, run a ring
//      all-reduce over it: N pieces (N = nodes), reduce-scattered then
//      all-gathered around the nodes. A piece goes in messages cut at the
//      slice boundaries, so each depends on exactly one slice of step 1 and
//      a segment takes about N + slices messages, not N x slices. In the
//      hierarchical algorithm different segments have different holders, so
//      every rank of a node drives the network in parallel; in the 2D-ring
//      only the leaders do.
//   4. Node all-gather: each final message travels the node's ring from the
//      holder to every other rank.
// Balanced (CollArgs::balance, algo/balance.h), piece y of every segment is
// sized by node y's share instead of 1/N.
// Unequal nodes work unchanged: a node with fewer ranks gives each of them
// more segments, and a node of one rank skips steps 1, 2 and 4.
//
// Messages of steps 3 and 4 depend on one receive of the step before, so the
// steps pipeline. A receive that reduces into a value produced by a receive
// from another peer names it in `after`. Premulsum scales every input once up
// front (into the receive buffer) and sums from then on, so the network
// step's combines are plain sums of partials.
#include "algo/balance.h"
#include "algo/schedule_util.h"

namespace tutti::algo {

void twoLevelAllReduce(Schedule* s, const CollArgs& a, bool viaLeaders) {
  const NodeMap& nm = *a.nodes;
  const int r = a.rank, node = nm.nodeOf[r], nNodes = nm.nNodes();
  const std::vector<int>& mine = nm.nodes[node];
  const int k = static_cast<int>(mine.size()), l = nm.localOf[r], segs = nm.maxPerNode();
  const int nodeNext = mine[(l + 1) % k], nodePrev = mine[(l + k - 1) % k];
  const size_t es = a.elemSize;
  const bool divides = a.spec.divisor > 1;
  // Slice grid, in elements (as slices() cuts it).
  const size_t sliceElems = std::max(es, a.chunkBytes / es * es) / es;

  Buf inputBuf = Buf::kSend;
  if (a.spec.op == RedOp::kPreMulSum) {
    s->local.push_back({LocalKind::kScale, {Buf::kRecv, 0}, {Buf::kSend, 0}, a.count * es});
    s->spec.op = RedOp::kSum;
    inputBuf = Buf::kRecv;
  }
  // The rank of node `nd` that takes segment `seg` to the network.
  auto holderOf = [&](int nd, int seg) {
    const std::vector<int>& ranks = nm.nodes[nd];
    return viaLeaders ? ranks[0] : ranks[seg % ranks.size()];
  };

  for (int seg = 0; seg < segs; ++seg) {
    const auto [segStart, segLen] = segment(a.count, segs, seg);
    const int ownerL = seg % k, owner = mine[ownerL], holder = holderOf(node, seg);
    const int netNext = holderOf((node + 1) % nNodes, seg);
    const int netPrev = holderOf((node + nNodes - 1) % nNodes, seg);
    if (r == holder) addPeers(s, {netNext, netPrev}, r);
    if (k > 1) addPeers(s, {nodeNext, nodePrev}, r);
    const auto sl = slices(segLen * es, es, a.chunkBytes);

    // Steps 1 and 2, per slice: the node's sum lies in `value` once receive
    // ready[j] (-1: at once) has completed.
    Buf valueBuf = k > 1 ? Buf::kRecv : inputBuf;
    std::vector<int32_t> ready(sl.size(), -1);
    for (size_t j = 0; j < sl.size(); ++j) {
      const size_t off = segStart * es + sl[j].off, bytes = sl[j].bytes;
      const Ref input{inputBuf, off}, acc{Buf::kRecv, off};
      if (k > 1) {
        const uint64_t tag = tagOf(kPhaseNodeRs, seg, j);
        if (l == (ownerL + 1) % k) {
          s->sends.push_back({nodeNext, tag, input, bytes, -1});
        } else {
          int32_t ri = addRecv(s, {nodePrev, tag, bytes, RecvAction::kReduce, acc, input});
          if (r != owner)
            s->sends.push_back({nodeNext, tag, acc, bytes, ri});
          else
            ready[j] = ri;
        }
      }
      if (owner != holder) {  // 2D-ring: the owner hands the node's sum to the leader
        const uint64_t tag = tagOf(kPhaseToLeader, seg, j);
        addPeers(s, {r == owner ? holder : owner}, r);
        if (r == owner) s->sends.push_back({holder, tag, acc, bytes, ready[j]});
        if (r == holder) ready[j] = addRecv(s, {owner, tag, bytes, RecvAction::kCopy, acc, {}});
      }
    }

    // Steps 3 and 4, per message: piece y of the segment cut at the slice
    // grid. (j, y) names a message; the tag index j * N + y is unique.
    for (int y = 0; y < nNodes; ++y) {
      const auto [pStart, pLen] = segmentOf(segLen, netWeights(a), nNodes, y);
      if (pLen == 0) continue;
      for (size_t e = pStart; e < pStart + pLen;) {
        const size_t j = e / sliceElems;
        const size_t end = std::min(pStart + pLen, (j + 1) * sliceElems);
        const size_t off = (segStart + e) * es, bytes = (end - e) * es;
        e = end;
        const Ref at{Buf::kRecv, off}, value{valueBuf, off};
        const uint64_t x = j * static_cast<uint64_t>(nNodes) + y;
        int32_t done = -1;  // the receive after which this message is final here
        if (r == holder) {
          const uint64_t rsTag = tagOf(kPhaseNetRs, seg, x), agTag = tagOf(kPhaseNetAg, seg, x);
          if (node == (y + 1) % nNodes) {
            s->sends.push_back({netNext, rsTag, value, bytes, ready[j]});
          } else {
            RecvStep rs{netPrev, rsTag, bytes, RecvAction::kReduce, at, value};
            rs.after = ready[j];
            rs.finalize = node == y && divides;
            int32_t ri = addRecv(s, rs);
            if (node != y) {
              s->sends.push_back({netNext, rsTag, at, bytes, ri});
            } else {
              s->sends.push_back({netNext, agTag, at, bytes, ri});
              done = ri;
            }
          }
          if (node != y) {
            done = addRecv(s, {netPrev, agTag, bytes, RecvAction::kCopy, at, {}});
            if ((node + 1) % nNodes != y) s->sends.push_back({netNext, agTag, at, bytes, done});
          }
        }
        if (k == 1) continue;
        const uint64_t tag = tagOf(kPhaseNodeAg, seg, x);  // 4. around the node
        if (r == holder) {
          s->sends.push_back({nodeNext, tag, at, bytes, done});
        } else {
          int32_t ri = addRecv(s, {nodePrev, tag, bytes, RecvAction::kCopy, at, {}});
          if ((l + 1) % k != nm.localOf[holder]) s->sends.push_back({nodeNext, tag, at, bytes, ri});
        }
      }
    }
  }
}

}  // namespace tutti::algo

namespace tutti::algo {

// Two-level all-gather (uniform nodes of k > 1 ranks, N > 1 nodes):
//   1. across nodes, the ranks with the same local index run a ring
//      all-gather of their blocks (k rings in parallel, one per local index),
//   2. inside each node, every block travels the node's ring from the rank
//      that has it (the one with its local index) to the others.
// A node's link then carries (N-1)/N of the output instead of the flat ring's
// (n-1)/n.
void twoLevelAllGather(Schedule* s, const CollArgs& a) {
  const NodeMap& nm = *a.nodes;
  const int r = a.rank, node = nm.nodeOf[r], nNodes = nm.nNodes(), l = nm.localOf[r];
  const std::vector<int>& mine = nm.nodes[node];
  const int k = static_cast<int>(mine.size());
  const int nodeNext = mine[(l + 1) % k], nodePrev = mine[(l + k - 1) % k];
  const int netNext = nm.nodes[(node + 1) % nNodes][l];
  const int netPrev = nm.nodes[(node + nNodes - 1) % nNodes][l];
  const size_t blk = a.count * a.elemSize;
  addPeers(s, {nodeNext, nodePrev, netNext, netPrev}, r);
  if (!a.inPlace && blk)
    s->local.push_back({LocalKind::kCopy, {Buf::kRecv, r * blk}, {Buf::kSend, 0}, blk});
  const auto sl = slices(blk, a.elemSize, a.chunkBytes);
  for (int q = 0; q < a.nranks; ++q) {
    const int qNode = nm.nodeOf[q], qLocal = nm.localOf[q];
    const int holder = mine[qLocal];  // has block q after step 1
    for (size_t j = 0; j < sl.size(); ++j) {
      const size_t b = sl[j].bytes;
      const Ref at{Buf::kRecv, q * blk + sl[j].off};
      const Ref from = q == r ? Ref{Buf::kSend, sl[j].off} : at;
      int32_t have = -1;
      if (qLocal == l) {  // 1. this rank's cross-node ring carries block q
        const uint64_t tag = tagOf(kPhaseNetAg, q, j);
        if (q == r) {
          s->sends.push_back({netNext, tag, from, b, -1});
        } else {
          have = addRecv(s, {netPrev, tag, b, RecvAction::kCopy, at, {}});
          if ((node + 1) % nNodes != qNode) s->sends.push_back({netNext, tag, at, b, have});
        }
      }
      const uint64_t tag = tagOf(kPhaseNodeAg, q, j);  // 2. around the node from the holder
      if (r == holder) {
        s->sends.push_back({nodeNext, tag, from, b, have});
      } else {
        int32_t ri = addRecv(s, {nodePrev, tag, b, RecvAction::kCopy, at, {}});
        if (nodeNext != holder) s->sends.push_back({nodeNext, tag, at, b, ri});
      }
    }
  }
}

// Two-level reduce-scatter (uniform nodes of k > 1 ranks, N > 1 nodes):
//   1. inside each node, block q is reduced around the node's ring to the
//      rank with q's local index (the node's partial sum of block q),
//   2. across nodes, the ranks with that local index reduce the partials of
//      block q around their ring, ending at q.
// Premulsum scales the input once up front (scratch), then everything sums.
void twoLevelReduceScatter(Schedule* s, const CollArgs& a) {
  const NodeMap& nm = *a.nodes;
  const int n = a.nranks, r = a.rank, node = nm.nodeOf[r], nNodes = nm.nNodes(), l = nm.localOf[r];
  const std::vector<int>& mine = nm.nodes[node];
  const int k = static_cast<int>(mine.size());
  const int nodeNext = mine[(l + 1) % k], nodePrev = mine[(l + k - 1) % k];
  const int netNext = nm.nodes[(node + 1) % nNodes][l];
  const int netPrev = nm.nodes[(node + nNodes - 1) % nNodes][l];
  const size_t blk = a.count * a.elemSize, all = blk * n;
  addPeers(s, {nodeNext, nodePrev, netNext, netPrev}, r);
  Buf inputBuf = Buf::kSend;
  size_t inputBase = 0, partialBase = 0;
  if (a.spec.op == RedOp::kPreMulSum) {
    s->local.push_back({LocalKind::kScale, {Buf::kScratch, 0}, {Buf::kSend, 0}, all});
    s->spec.op = RedOp::kSum;
    inputBuf = Buf::kScratch;
    partialBase = all;
  }
  s->scratchBytes = partialBase + all;
  const auto sl = slices(blk, a.elemSize, a.chunkBytes);
  for (int q = 0; q < n; ++q) {
    const int qNode = nm.nodeOf[q], qLocal = nm.localOf[q];
    for (size_t j = 0; j < sl.size(); ++j) {
      const size_t off = q * blk + sl[j].off, b = sl[j].bytes;
      const Ref input{inputBuf, inputBase + off}, partial{Buf::kScratch, partialBase + off};
      // 1. Node ring from the successor of local index qLocal to it.
      const uint64_t tag = tagOf(kPhaseNodeRs, q, j);
      Ref value = partial;
      int32_t ready = -1;
      if (l == (qLocal + 1) % k) {
        s->sends.push_back({nodeNext, tag, input, b, -1});
      } else {
        ready = addRecv(s, {nodePrev, tag, b, RecvAction::kReduce, partial, input});
        if (l != qLocal) s->sends.push_back({nodeNext, tag, partial, b, ready});
      }
      if (l != qLocal) continue;
      // 2. Across nodes, from the node after q's to q's.
      const uint64_t netTag = tagOf(kPhaseNetRs, q, j);
      if (node == (qNode + 1) % nNodes) {
        s->sends.push_back({netNext, netTag, value, b, ready});
      } else {
        const bool final = q == r;
        RecvStep rs{netPrev, netTag, b, RecvAction::kReduce,
                    final ? Ref{Buf::kRecv, sl[j].off} : partial, value};
        rs.after = ready;
        rs.finalize = final && a.spec.divisor > 1;
        int32_t ri = addRecv(s, rs);
        if (!final) s->sends.push_back({netNext, netTag, partial, b, ri});
      }
    }
  }
}

}  // namespace tutti::algo
