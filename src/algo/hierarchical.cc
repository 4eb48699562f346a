// Two-level all-reduce: hierarchical and 2D-ring. See schedule.h for the
// contract and schedule_util.h for tags.
//
// The buffer is cut into M segments, M = the most ranks any node has, each
// segment into slices (chunkBytes), and each slice into N pieces, N = nodes.
// Node-local rank l of a node with k ranks owns segments s with s % k == l.
//   1. Node reduce-scatter: slice (s, j) travels the node's ring from the
//      owner's successor to the owner, each rank adding its contribution.
//   2. 2D-ring only: the owner hands its node's sum to the node leader
//      (local rank 0). The slice's "holder" is then the leader; in the
//      hierarchical algorithm the holder is the owner itself.
//   3. Network all-reduce: the holders of slice (s, j), one per node, run a
//      ring all-reduce over its N pieces (reduce-scatter then all-gather).
//      In the hierarchical algorithm the holders of different segments are
//      different ranks, so every rank of a node drives the network in
//      parallel; in the 2D-ring only the leaders do.
//   4. Node all-gather: each final piece travels the node's ring from the
//      holder to every other rank.
// Unequal nodes work unchanged: a node with fewer ranks gives each of them
// more segments, and a node of one rank skips steps 1, 2 and 4.
//
// Every message of steps 3 and 4 depends on exactly one receive of the step
// before (pieces nest in slices), so slices and pieces pipeline freely. A
// receive that reduces into a value produced by a receive from another peer
// names it in `after`. Premulsum scales every input once up front (into the
// receive buffer) and sums from then on, so the network step's combines are
// plain sums of partials.
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
    for (size_t j = 0; j < sl.size(); ++j) {
      const size_t off = segStart * es + sl[j].off, bytes = sl[j].bytes;
      const Ref input{inputBuf, off}, acc{Buf::kRecv, off};

      // 1. Node reduce-scatter to the owner: `value` is where the node's sum
      // lies once receive `ready` (-1: at once) has completed.
      Ref value = input;
      int32_t ready = -1;
      if (k > 1) {
        const uint64_t tag = tagOf(kPhaseNodeRs, seg, j);
        if (l == (ownerL + 1) % k) {
          s->sends.push_back({nodeNext, tag, input, bytes, -1});
        } else {
          int32_t ri = addRecv(s, {nodePrev, tag, bytes, RecvAction::kReduce, acc, input});
          if (r != owner)
            s->sends.push_back({nodeNext, tag, acc, bytes, ri});
          else
            value = acc, ready = ri;
        }
      }
      // 2. 2D-ring: the owner hands the node's sum to the leader.
      if (owner != holder) {
        const uint64_t tag = tagOf(kPhaseToLeader, seg, j);
        addPeers(s, {r == owner ? holder : owner}, r);
        if (r == owner) s->sends.push_back({holder, tag, value, bytes, ready});
        if (r == holder) {
          ready = addRecv(s, {owner, tag, bytes, RecvAction::kCopy, acc, {}});
          value = acc;
        }
      }

      // 3. Network all-reduce of the slice's pieces among the holders; done[y]
      // is the receive after which piece y is final at this holder.
      std::vector<int32_t> done(nNodes, -1);
      const size_t sliceCount = bytes / es;
      if (r == holder) {
        for (int y = 0; y < nNodes; ++y) {
          const auto [pStart, pLen] = segment(sliceCount, nNodes, y);
          if (pLen == 0) continue;
          const size_t pOff = pStart * es, pBytes = pLen * es;
          const Ref pAcc{Buf::kRecv, off + pOff}, pValue{value.buf, value.off + pOff};
          const uint64_t x = j * static_cast<uint64_t>(nNodes) + y;
          const uint64_t rsTag = tagOf(kPhaseNetRs, seg, x), agTag = tagOf(kPhaseNetAg, seg, x);
          if (node == (y + 1) % nNodes) {
            s->sends.push_back({netNext, rsTag, pValue, pBytes, ready});
          } else {
            RecvStep rs{netPrev, rsTag, pBytes, RecvAction::kReduce, pAcc, pValue};
            rs.after = ready;
            rs.finalize = node == y && divides;
            int32_t ri = addRecv(s, rs);
            if (node != y) {
              s->sends.push_back({netNext, rsTag, pAcc, pBytes, ri});
            } else {
              s->sends.push_back({netNext, agTag, pAcc, pBytes, ri});
              done[y] = ri;
            }
          }
          if (node != y) {
            done[y] = addRecv(s, {netPrev, agTag, pBytes, RecvAction::kCopy, pAcc, {}});
            if ((node + 1) % nNodes != y) s->sends.push_back({netNext, agTag, pAcc, pBytes, done[y]});
          }
        }
      }

      // 4. Node all-gather of each final piece from the holder.
      if (k == 1) continue;
      const int holderL = nm.localOf[holder];
      for (int y = 0; y < nNodes; ++y) {
        const auto [pStart, pLen] = segment(sliceCount, nNodes, y);
        if (pLen == 0) continue;
        const Ref pAcc{Buf::kRecv, off + pStart * es};
        const size_t pBytes = pLen * es;
        const uint64_t tag = tagOf(kPhaseNodeAg, seg, j * static_cast<uint64_t>(nNodes) + y);
        if (r == holder) {
          s->sends.push_back({nodeNext, tag, pAcc, pBytes, done[y]});
        } else {
          int32_t ri = addRecv(s, {nodePrev, tag, pBytes, RecvAction::kCopy, pAcc, {}});
          if ((l + 1) % k != holderL) s->sends.push_back({nodeNext, tag, pAcc, pBytes, ri});
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
