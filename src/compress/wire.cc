#include "compress/wire.h"

#include <cmath>

#include "algo/schedule_util.h"

namespace tutti::compress {

using algo::Buf;
using algo::Ref;

int halfScaleExp(double maxAbs, double factor) {
  const double bound = maxAbs * factor;
  if (!(bound > 0) || !std::isfinite(bound)) return 0;
  int e = 0;
  std::frexp(bound, &e);  // bound < 2^e
  return std::clamp(15 - e, -100, 100);
}

void applyWire(algo::Schedule* s, const algo::CollArgs& a, algo::WireSpec wire) {
  s->wire = wire;
  const algo::NodeMap* nm = a.nodes;
  const bool oneNode = !nm || nm->nNodes() <= 1;
  auto crosses = [&](int peer) { return oneNode || nm->nodeOf[peer] != nm->nodeOf[a.rank]; };
  for (auto& sd : s->sends) sd.encoded = crosses(sd.peer);
  for (auto& r : s->recvs) {
    r.encoded = crosses(r.peer);
    // Rounding every reduce result (not only the encoded ones) keeps every
    // value on the codec's grid, whichever rank ends up holding it final.
    r.quantize = r.action == algo::RecvAction::kReduce;
  }
}

namespace {

// Residuals in the state buffer: the worker's for the whole input (element i
// at float i), then the server's for this rank's segment.
Ref workerErr(size_t elem) { return {Buf::kState, elem * sizeof(float)}; }
Ref serverErr(size_t count, size_t elemInSegment) {
  return {Buf::kState, (count + elemInSegment) * sizeof(float)};
}

}  // namespace

size_t signStateFloats(size_t count, int nranks, int rank) {
  return count + algo::segment(count, nranks, rank).second;
}

algo::Schedule signAllReduce(const algo::CollArgs& a) {
  algo::Schedule s;
  s.spec = a.spec;
  s.spec.op = RedOp::kSum;  // avg's 1/n is applied once, at the server
  s.wire = {algo::Wire::kSign, 0};
  s.algorithm = "1-bit";
  const int n = a.nranks, r = a.rank;
  const float post =
      a.spec.op == RedOp::kPreMulSum ? static_cast<float>(a.spec.scalar) : 1.0f;
  constexpr size_t es = sizeof(float);
  for (int p = 0; p < n; ++p)
    if (p != r) s.peers.push_back(p);
  for (int x = 0; x < n; ++x) {
    const auto [segStart, segLen] = algo::segment(a.count, n, x);
    // Slices start on the chunk grid of the segment, so the codec's blocks
    // (kSignBlock elements from each message's start) are the same for the
    // sender and for the local steps below.
    const auto sl = algo::slices(segLen * es, es, a.chunkBytes);
    for (size_t j = 0; j < sl.size(); ++j) {
      const size_t elem = segStart + sl[j].off / es, b = sl[j].bytes;
      const Ref input{Buf::kSend, elem * es}, acc{Buf::kRecv, elem * es};
      if (x != r) {
        // Worker: this rank's share of segment x to its server, with feedback.
        algo::SendStep sd{x, algo::tagOf(algo::kPhaseSignRs, x, j), input, b, -1};
        sd.encoded = sd.feedback = true;
        sd.err = workerErr(elem);
        s.sends.push_back(sd);
        algo::RecvStep back{x, algo::tagOf(algo::kPhaseSignAg, x, j), b, algo::RecvAction::kCopy,
                            acc, {}};
        back.encoded = true;
        algo::addRecv(&s, back);
        continue;
      }
      // Server: its own share goes through the codec like everyone's.
      algo::LocalStep own{algo::LocalKind::kQuantize, acc, input, b};
      own.feedback = true;
      own.err = workerErr(elem);
      s.local.push_back(own);
      const Ref serr = serverErr(a.count, elem - segStart);
      if (n == 1) {
        algo::LocalStep fin{algo::LocalKind::kQuantize, acc, acc, b, post};
        fin.feedback = true;
        fin.err = serr;
        s.local.push_back(fin);
        continue;
      }
      // The others' shares, added in rank order after this one (a fixed
      // order: the sum is the same whatever arrives first).
      int32_t prev = -1;
      for (int k = 1; k < n; ++k) {
        const int p = (r + k) % n;
        algo::RecvStep in{p, algo::tagOf(algo::kPhaseSignRs, x, j), b, algo::RecvAction::kReduce,
                          acc, acc};
        in.after = prev;
        in.encoded = true;
        if (k == n - 1) {
          in.quantize = in.feedback = true;
          in.postScale = post;
          in.err = serr;
        }
        prev = algo::addRecv(&s, in);
      }
      for (int k = 1; k < n; ++k) {
        algo::SendStep sd{(r + k) % n, algo::tagOf(algo::kPhaseSignAg, x, j), acc, b, prev};
        sd.encoded = true;
        s.sends.push_back(sd);
      }
    }
  }
  return s;
}

}  // namespace tutti::compress
