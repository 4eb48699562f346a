// Ring, chain and direct schedules, and makeSchedule. See schedule.h for the
// contract. Rings and chains follow RingOrder (a node's ranks adjacent).
//
// Ring all-reduce, per segment x (one per rank) and slice j of it:
//   reduce-scatter: the slice starts at rank x+1 and travels x+1 -> x+2 -> ...
//   -> x, each rank adding its own contribution; at x it is final.
//   all-gather: the final slice travels x -> x+1 -> ... -> x-1.
// Messages are tagged (phase, x, j), so every slice is independent: channels
// take whichever slice is ready, and a slow slice never blocks a fast one.
// Segments are near-equal, or sized by the balanced plan (CollArgs::balance,
// algo/balance.h): an element's reduction order is the ring's from the rank
// after its segment's owner, so shares change which order an element gets,
// never that every rank ends with the owner's bits.
#include <algorithm>

#include "algo/balance.h"
#include "algo/cost_model.h"
#include "algo/schedule.h"
#include "algo/schedule_util.h"

namespace tutti::algo {
namespace {

void singleRank(Schedule* s, const CollArgs& a, size_t bytes) {
  s->algorithm = "local";
  if (bytes == 0) return;
  Ref src{Buf::kSend, 0}, dst{Buf::kRecv, 0};
  bool reduces = a.coll == Collective::kAllReduce || a.coll == Collective::kReduce ||
                 a.coll == Collective::kReduceScatter;
  if (reduces && a.spec.op == RedOp::kPreMulSum)
    s->local.push_back({LocalKind::kScale, dst, src, bytes});
  else if (!a.inPlace)
    s->local.push_back({LocalKind::kCopy, dst, src, bytes});
  if (reduces && a.spec.divisor > 1) s->local.push_back({LocalKind::kDivide, dst, dst, bytes});
}

// Ring reduce-scatter (+ all-gather when `allReduce`) along `order`. Segment
// x is owned by rank x (for reduce-scatter: its output block); its slices
// start at the position after x's and end at x, final there.
void ringReduce(Schedule* s, const CollArgs& a, bool allReduce) {
  const RingOrder order(a);
  const int n = a.nranks, r = a.rank, p = order.posOf[r];
  const int next = order.at(p + 1), prev = order.at(p - 1);
  const size_t es = a.elemSize;
  addPeers(s, {next, prev}, r);
  for (int x = 0; x < n; ++x) {
    size_t segStart, segLen;
    if (allReduce) {
      auto sg = segmentOf(a.count, ringWeights(a), n, x);
      segStart = sg.first * es;
      segLen = sg.second * es;
    } else {
      segStart = static_cast<size_t>(x) * a.count * es;
      segLen = a.count * es;
    }
    const int origin = order.at(order.posOf[x] + 1);
    auto sl = slices(segLen, es, a.chunkBytes);
    for (size_t j = 0; j < sl.size(); ++j) {
      const size_t off = segStart + sl[j].off, b = sl[j].bytes;
      Ref input{Buf::kSend, off};
      // Where this rank keeps its partial of (x, j) and, at x, the final value.
      Ref acc = allReduce ? Ref{Buf::kRecv, off}
                          : (x == r ? Ref{Buf::kRecv, sl[j].off} : Ref{Buf::kScratch, off});
      if (r == origin) {
        Ref src = contribution(s, a.spec, input, acc, b);
        s->sends.push_back({next, tagOf(kPhaseRs, x, j), src, b, -1});
      } else {
        RecvStep rs{prev, tagOf(kPhaseRs, x, j), b, RecvAction::kReduce, acc, input};
        rs.finalize = (x == r) && a.spec.divisor > 1;
        int32_t ri = addRecv(s, rs);
        if (x != r) {
          s->sends.push_back({next, tagOf(kPhaseRs, x, j), acc, b, ri});
        } else if (allReduce && n > 1) {
          s->sends.push_back({next, tagOf(kPhaseAg, x, j), acc, b, ri});
        }
      }
      if (allReduce && x != r) {
        int32_t ri = addRecv(s, {prev, tagOf(kPhaseAg, x, j), b, RecvAction::kCopy, acc, {}});
        if (next != x) s->sends.push_back({next, tagOf(kPhaseAg, x, j), acc, b, ri});
      }
    }
  }
  if (!allReduce) s->scratchBytes = static_cast<size_t>(n) * a.count * es;
}

void ringAllGather(Schedule* s, const CollArgs& a) {
  const RingOrder order(a);
  const int n = a.nranks, r = a.rank, p = order.posOf[r];
  const int next = order.at(p + 1), prev = order.at(p - 1);
  const size_t segLen = a.count * a.elemSize;
  addPeers(s, {next, prev}, r);
  if (!a.inPlace && segLen)
    s->local.push_back({LocalKind::kCopy, {Buf::kRecv, r * segLen}, {Buf::kSend, 0}, segLen});
  auto sl = slices(segLen, a.elemSize, a.chunkBytes);
  for (int x = 0; x < n; ++x) {
    for (size_t j = 0; j < sl.size(); ++j) {
      const size_t b = sl[j].bytes;
      Ref at{Buf::kRecv, x * segLen + sl[j].off};
      if (x == r) {
        s->sends.push_back({next, tagOf(kPhaseAg, x, j), {Buf::kSend, sl[j].off}, b, -1});
      } else {
        int32_t ri = addRecv(s, {prev, tagOf(kPhaseAg, x, j), b, RecvAction::kCopy, at, {}});
        if (next != x) s->sends.push_back({next, tagOf(kPhaseAg, x, j), at, b, ri});
      }
    }
  }
}

// Pipelined chain from the root along the ring order.
void ringBroadcast(Schedule* s, const CollArgs& a) {
  const RingOrder order(a);
  const int r = a.rank, p = order.posOf[r];
  const int next = order.at(p + 1), prev = order.at(p - 1);
  const size_t bytes = a.count * a.elemSize;
  addPeers(s, {next, prev}, r);
  auto sl = slices(bytes, a.elemSize, a.chunkBytes);
  if (r == a.root && !a.inPlace && bytes)
    s->local.push_back({LocalKind::kCopy, {Buf::kRecv, 0}, {Buf::kSend, 0}, bytes});
  for (size_t j = 0; j < sl.size(); ++j) {
    Ref at{Buf::kRecv, sl[j].off};
    if (r == a.root) {
      s->sends.push_back(
          {next, tagOf(kPhaseBcast, 0, j), {Buf::kSend, sl[j].off}, sl[j].bytes, -1});
    } else {
      int32_t ri =
          addRecv(s, {prev, tagOf(kPhaseBcast, 0, j), sl[j].bytes, RecvAction::kCopy, at, {}});
      if (next != a.root) s->sends.push_back({next, tagOf(kPhaseBcast, 0, j), at, sl[j].bytes, ri});
    }
  }
}

// Pipelined chain to the root along the ring order, starting after it.
void chainReduce(Schedule* s, const CollArgs& a) {
  const RingOrder order(a);
  const int r = a.rank, p = order.posOf[r];
  const int next = order.at(p + 1), prev = order.at(p - 1);
  const size_t bytes = a.count * a.elemSize;
  addPeers(s, {next, prev}, r);
  auto sl = slices(bytes, a.elemSize, a.chunkBytes);
  const int origin = order.at(order.posOf[a.root] + 1);
  for (size_t j = 0; j < sl.size(); ++j) {
    const size_t off = sl[j].off, b = sl[j].bytes;
    Ref input{Buf::kSend, off};
    Ref acc = r == a.root ? Ref{Buf::kRecv, off} : Ref{Buf::kScratch, off};
    if (r == origin) {
      Ref src = contribution(s, a.spec, input, acc, b);
      s->sends.push_back({next, tagOf(kPhaseReduce, 0, j), src, b, -1});
    } else {
      RecvStep rs{prev, tagOf(kPhaseReduce, 0, j), b, RecvAction::kReduce, acc, input};
      rs.finalize = r == a.root && a.spec.divisor > 1;
      int32_t ri = addRecv(s, rs);
      if (r != a.root) s->sends.push_back({next, tagOf(kPhaseReduce, 0, j), acc, b, ri});
    }
  }
  s->scratchBytes = r == a.root ? 0 : bytes;
}

// Rooted collectives: a rank's part may need nothing from its peers (a
// broadcast's root, a reduce's first rank, a gather's non-roots, a scatter's
// root), and ranks that disagree on the root may each wait for the other
// (two ranks that each take the other for the root). So each rank also sends
// its ring successor an empty message as it starts and waits for its
// predecessor's: in every call, every rank hears at least one peer's
// fingerprint (core/wire_header.h), and every rank sends something.
void addNeighbourCheck(Schedule* s, const CollArgs& a) {
  const RingOrder order(a);
  const int p = order.posOf[a.rank];
  const int next = order.at(p + 1), prev = order.at(p - 1);
  addPeers(s, {next, prev}, a.rank);
  s->sends.push_back({next, tagOf(kPhaseCheck, 0, 0), {Buf::kSend, 0}, 0, -1});
  addRecv(s, {prev, tagOf(kPhaseCheck, 0, 0), 0, RecvAction::kCopy, {Buf::kRecv, 0}, {}});
}

// Direct exchanges: alltoall, gather, scatter.
void directBlocks(Schedule* s, const CollArgs& a) {
  const int n = a.nranks, r = a.rank;
  const size_t blk = a.count * a.elemSize;
  auto sl = slices(blk, a.elemSize, a.chunkBytes);
  auto sendBlock = [&](int peer, Ref src) {
    addPeers(s, {peer}, r);
    for (size_t j = 0; j < sl.size(); ++j)
      s->sends.push_back(
          {peer, tagOf(kPhaseDirect, r, j), {src.buf, src.off + sl[j].off}, sl[j].bytes, -1});
  };
  auto recvBlock = [&](int peer, Ref dst) {
    addPeers(s, {peer}, r);
    for (size_t j = 0; j < sl.size(); ++j)
      addRecv(s, {peer,
                  tagOf(kPhaseDirect, peer, j),
                  sl[j].bytes,
                  RecvAction::kCopy,
                  {dst.buf, dst.off + sl[j].off},
                  {}});
  };
  switch (a.coll) {
    case Collective::kAllToAll: {
      // In place, a block may be overwritten before it was sent: send from a snapshot.
      Buf from = Buf::kSend;
      if (a.inPlace && blk) {
        s->local.push_back({LocalKind::kCopy, {Buf::kScratch, 0}, {Buf::kSend, 0}, blk * n});
        s->scratchBytes = blk * n;
        from = Buf::kScratch;
      }
      if (blk) s->local.push_back({LocalKind::kCopy, {Buf::kRecv, r * blk}, {from, r * blk}, blk});
      for (int k = 1; k < n; ++k) {
        int to = mod(r + k, n), fromPeer = mod(r - k, n);
        sendBlock(to, {from, to * blk});
        recvBlock(fromPeer, {Buf::kRecv, fromPeer * blk});
      }
      break;
    }
    case Collective::kGather:
      if (r == a.root) {
        if (!a.inPlace && blk)
          s->local.push_back({LocalKind::kCopy, {Buf::kRecv, r * blk}, {Buf::kSend, 0}, blk});
        for (int p = 0; p < n; ++p)
          if (p != r) recvBlock(p, {Buf::kRecv, p * blk});
      } else {
        sendBlock(a.root, {Buf::kSend, 0});
      }
      break;
    case Collective::kScatter:
      if (r == a.root) {
        if (!a.inPlace && blk)
          s->local.push_back({LocalKind::kCopy, {Buf::kRecv, 0}, {Buf::kSend, r * blk}, blk});
        for (int p = 0; p < n; ++p)
          if (p != r) sendBlock(p, {Buf::kSend, p * blk});
      } else {
        recvBlock(a.root, {Buf::kRecv, 0});
      }
      break;
    default:
      break;
  }
  s->algorithm = "direct";
}

}  // namespace

const char* collectiveName(Collective c) {
  switch (c) {
    case Collective::kAllReduce:
      return "AllReduce";
    case Collective::kBroadcast:
      return "Broadcast";
    case Collective::kReduce:
      return "Reduce";
    case Collective::kAllGather:
      return "AllGather";
    case Collective::kReduceScatter:
      return "ReduceScatter";
    case Collective::kAllToAll:
      return "AllToAll";
    case Collective::kGather:
      return "Gather";
    case Collective::kScatter:
      return "Scatter";
    case Collective::kSend:
      return "Send";
    case Collective::kRecv:
      return "Recv";
  }
  return "?";
}

Schedule makeSchedule(const CollArgs& a) {
  Schedule s;
  s.spec = a.spec;
  size_t bytes = a.count * a.elemSize;
  if (a.nranks == 1) {
    singleRank(&s, a, bytes);
    return s;
  }
  switch (a.coll) {
    case Collective::kAllReduce: {
      const CollArgs::Algo algo = chooseAllReduce(a);
      if (algo == CollArgs::Algo::kRecursiveDoubling)
        recursiveDoublingAllReduce(&s, a);
      else if (algo == CollArgs::Algo::kRabenseifner)
        rabenseifnerAllReduce(&s, a);
      else if (algo == CollArgs::Algo::kHierarchical || algo == CollArgs::Algo::k2DRing)
        twoLevelAllReduce(&s, a, algo == CollArgs::Algo::k2DRing);
      else
        ringReduce(&s, a, true);
      s.algorithm = algoName(algo);
      const std::vector<uint32_t>* w =
          algo == CollArgs::Algo::kRing ? ringWeights(a)
          : algo == CollArgs::Algo::kHierarchical || algo == CollArgs::Algo::k2DRing ? netWeights(a)
                                                                                     : nullptr;
      if (w) {
        s.algorithm = "balanced " + s.algorithm;
        s.planKey = weightsKey(*w);
      }
      break;
    }
    case Collective::kReduceScatter:
      if (useTwoLevelGather(a)) {
        twoLevelReduceScatter(&s, a);
        s.algorithm = "hierarchical";
      } else {
        ringReduce(&s, a, false);
        s.algorithm = "ring";
      }
      break;
    case Collective::kAllGather:
      if (useTwoLevelGather(a)) {
        twoLevelAllGather(&s, a);
        s.algorithm = "hierarchical";
      } else {
        ringAllGather(&s, a);
        s.algorithm = "ring";
      }
      break;
    case Collective::kBroadcast:
      ringBroadcast(&s, a);
      s.algorithm = "chain";
      break;
    case Collective::kReduce:
      chainReduce(&s, a);
      s.algorithm = "chain";
      break;
    case Collective::kAllToAll:
    case Collective::kGather:
    case Collective::kScatter:
      directBlocks(&s, a);
      break;
    default:
      break;
  }
  if (isRooted(a.coll) && bytes) addNeighbourCheck(&s, a);  // (a call of count 0 exchanges nothing)
  return s;
}

void appendSend(Schedule* s, int peer, uint64_t tagBase, Ref src, size_t bytes, size_t chunk) {
  if (std::find(s->peers.begin(), s->peers.end(), peer) == s->peers.end()) s->peers.push_back(peer);
  auto sl = slices(bytes, 1, chunk);
  for (size_t j = 0; j < sl.size(); ++j)
    s->sends.push_back({peer, tagBase + j, {src.buf, src.off + sl[j].off}, sl[j].bytes, -1});
}

void appendRecv(Schedule* s, int peer, uint64_t tagBase, Ref dst, size_t bytes, size_t chunk) {
  if (std::find(s->peers.begin(), s->peers.end(), peer) == s->peers.end()) s->peers.push_back(peer);
  auto sl = slices(bytes, 1, chunk);
  for (size_t j = 0; j < sl.size(); ++j)
    s->recvs.push_back(
        {peer, tagBase + j, sl[j].bytes, RecvAction::kCopy, {dst.buf, dst.off + sl[j].off}, {}});
}

}  // namespace tutti::algo
