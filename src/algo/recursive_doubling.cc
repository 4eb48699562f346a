// Recursive-doubling all-reduce: the latency algorithm for small buffers.
//
// With p2 the largest power of two <= n, ranks p2..n-1 ("extras") first hand
// their contribution to rank r - p2, which folds it into its own. The p2
// ranks then run log2(p2) steps; at step k rank r exchanges its whole partial
// with r ^ 2^k and combines the two. Each step writes a fresh scratch region,
// so no receive overwrites what a pending send still reads, and partners
// combine the same two operands (commutative ops), so every rank ends with a
// bit-identical result. Finally rank r < n - p2 sends the result to r + p2.
// Buffers are sliced by chunkBytes; slice j of step k depends only on slice
// j of step k-1 (RecvStep::after), so slices pipeline.
#include "algo/schedule_util.h"

namespace tutti::algo {

void recursiveDoublingAllReduce(Schedule* s, const CollArgs& a) {
  const int n = a.nranks, r = a.rank;
  const int p2 = floorPow2(n);
  const int extras = n - p2;
  const size_t es = a.elemSize, bytes = a.count * es;
  const size_t stride = (bytes + 63) / 64 * 64;
  const auto sl = slices(bytes, es, a.chunkBytes);
  int regions = 0;
  auto region = [&] { return Ref{Buf::kScratch, static_cast<size_t>(regions++) * stride}; };
  auto at = [](Ref ref, size_t off) { return Ref{ref.buf, ref.off + off}; };

  // This rank's contribution. Premulsum scales it once here; every later
  // combine is then a plain sum of partials.
  Ref acc{Buf::kSend, 0};
  if (a.spec.op == RedOp::kPreMulSum) {
    acc = region();
    s->local.push_back({LocalKind::kScale, acc, {Buf::kSend, 0}, bytes});
    s->spec.op = RedOp::kSum;
  } else if (a.inPlace) {
    acc = region();  // the result lands in recv == send while sends may still read it
    s->local.push_back({LocalKind::kCopy, acc, {Buf::kSend, 0}, bytes});
  }
  const bool divides = a.spec.divisor > 1;

  if (r >= p2) {
    const int partner = r - p2;
    addPeers(s, {partner}, r);
    for (size_t j = 0; j < sl.size(); ++j) {
      s->sends.push_back({partner, tagOf(kPhaseRdPre, 0, j), at(acc, sl[j].off), sl[j].bytes, -1});
      addRecv(s, {partner, tagOf(kPhaseRdPost, 0, j), sl[j].bytes, RecvAction::kCopy,
                  {Buf::kRecv, sl[j].off}, {}});
    }
    s->scratchBytes = static_cast<size_t>(regions) * stride;
    return;
  }

  std::vector<int32_t> last(sl.size(), -1);  // per slice: the receive that produced acc
  if (r < extras) {
    const int partner = r + p2;
    addPeers(s, {partner}, r);
    Ref dst = region();
    for (size_t j = 0; j < sl.size(); ++j)
      last[j] = addRecv(s, {partner, tagOf(kPhaseRdPre, 0, j), sl[j].bytes, RecvAction::kReduce,
                            at(dst, sl[j].off), at(acc, sl[j].off)});
    acc = dst;
  }
  int steps = 0;
  while ((1 << steps) < p2) ++steps;
  for (int k = 0; k < steps; ++k) {
    const int partner = r ^ (1 << k);
    const bool final = k == steps - 1;
    addPeers(s, {partner}, r);
    Ref dst = final ? Ref{Buf::kRecv, 0} : region();
    for (size_t j = 0; j < sl.size(); ++j) {
      s->sends.push_back(
          {partner, tagOf(kPhaseRd, k, j), at(acc, sl[j].off), sl[j].bytes, last[j]});
      RecvStep rs{partner, tagOf(kPhaseRd, k, j), sl[j].bytes, RecvAction::kReduce,
                  at(dst, sl[j].off), at(acc, sl[j].off)};
      rs.finalize = final && divides;
      rs.after = last[j];
      last[j] = addRecv(s, rs);
    }
    acc = dst;
  }
  if (r < extras) {
    const int partner = r + p2;
    for (size_t j = 0; j < sl.size(); ++j)
      s->sends.push_back({partner, tagOf(kPhaseRdPost, 0, j), {Buf::kRecv, sl[j].off},
                          sl[j].bytes, last[j]});
  }
  s->scratchBytes = static_cast<size_t>(regions) * stride;
}

}  // namespace tutti::algo
