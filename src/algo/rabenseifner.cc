// Rabenseifner's all-reduce: reduce-scatter by recursive halving, then
// all-gather by recursive doubling. It moves what the ring moves, 2(n-1)/n of
// the buffer per rank, in 2 log2(n) steps instead of 2(n-1).
//
// With p2 the largest power of two <= n, ranks p2..n-1 ("extras") first hand
// their buffer to rank r - p2, which folds it into its own, and get the result
// back at the end (as recursive doubling does). The buffer is cut into p2
// blocks; halving step k (mask = p2 >> (k+1)) pairs r with r ^ mask: of the
// blocks r still reduces, it sends the half whose index has the mask bit
// unlike its own and reduces the partner's copy of the other half into recv.
// After log2(p2) steps rank r holds block r, reduced once, by itself: every
// rank then receives the same bits. Doubling step k (mask = 1 << k) swaps the
// blocks each side has complete.
//
// Every block is sliced by chunkBytes and a (block, slice) unit keeps its
// slicing through all steps, so each unit's next step depends on exactly one
// receive and slices pipeline across steps.
//
// Hazards: partials accumulate in recv (or in a scaled copy for premulsum);
// a block's sent partial is read before its final value can come back, since
// that value needs the partial (the ring's causality argument). In place,
// the first step reads send == recv blocks that only final values overwrite.
#include "algo/schedule_util.h"

namespace tutti::algo {

void rabenseifnerAllReduce(Schedule* s, const CollArgs& a) {
  const int n = a.nranks, r = a.rank;
  const int p2 = floorPow2(n);
  const int extras = n - p2;
  const size_t es = a.elemSize, bytes = a.count * es;

  // The units: block b's slices, at byte offsets of the whole buffer.
  struct Unit {
    size_t off, bytes;
  };
  std::vector<std::vector<Unit>> units(p2);
  for (int b = 0; b < p2; ++b) {
    auto [start, len] = segment(a.count, p2, b);
    for (const Slice& sl : slices(len * es, es, a.chunkBytes))
      units[b].push_back({start * es + sl.off, sl.bytes});
  }
  auto at = [](Ref ref, size_t off) { return Ref{ref.buf, ref.off + off}; };

  // This rank's contribution; premulsum scales it once and sums after that.
  Ref in{Buf::kSend, 0};
  if (a.spec.op == RedOp::kPreMulSum) {
    in = {Buf::kScratch, 0};
    s->local.push_back({LocalKind::kScale, in, {Buf::kSend, 0}, bytes});
    s->spec.op = RedOp::kSum;
    s->scratchBytes = bytes;
  }
  const Ref out{Buf::kRecv, 0};
  const bool divides = a.spec.divisor > 1;

  if (r >= p2) {
    const int partner = r - p2;
    addPeers(s, {partner}, r);
    for (int b = 0; b < p2; ++b)
      for (size_t j = 0; j < units[b].size(); ++j) {
        const Unit& u = units[b][j];
        s->sends.push_back({partner, tagOf(kPhaseRabPre, b, j), at(in, u.off), u.bytes, -1});
        addRecv(s, {partner, tagOf(kPhaseRabPost, b, j), u.bytes, RecvAction::kCopy,
                    at(out, u.off), {}});
      }
    return;
  }

  // Per unit: the receive that produced its value (-1: none yet). Its value
  // lives in `in` until a receive, in `out` after.
  std::vector<std::vector<int32_t>> by(p2);
  for (int b = 0; b < p2; ++b) by[b].assign(units[b].size(), -1);
  auto val = [&](int b, size_t j) { return at(by[b][j] < 0 ? in : out, units[b][j].off); };
  if (r < extras) {
    const int partner = r + p2;
    addPeers(s, {partner}, r);
    for (int b = 0; b < p2; ++b)
      for (size_t j = 0; j < units[b].size(); ++j) {
        const Unit& u = units[b][j];
        by[b][j] = addRecv(s, {partner, tagOf(kPhaseRabPre, b, j), u.bytes, RecvAction::kReduce,
                               at(out, u.off), val(b, j)});
      }
  }

  // Halving: [lo, lo + 2 * mask) are the blocks this rank still reduces.
  int lo = 0;
  for (int mask = p2 / 2; mask >= 1; mask /= 2) {
    const int partner = r ^ mask;
    addPeers(s, {partner}, r);
    const int keep = (r & mask) ? lo + mask : lo;
    const int give = (r & mask) ? lo : lo + mask;
    for (int b = give; b < give + mask; ++b)
      for (size_t j = 0; j < units[b].size(); ++j)
        s->sends.push_back({partner, tagOf(kPhaseRab, b, j), val(b, j), units[b][j].bytes,
                            by[b][j]});
    for (int b = keep; b < keep + mask; ++b)
      for (size_t j = 0; j < units[b].size(); ++j) {
        const Unit& u = units[b][j];
        RecvStep rs{partner, tagOf(kPhaseRab, b, j), u.bytes, RecvAction::kReduce,
                    at(out, u.off), val(b, j)};
        rs.after = by[b][j];
        rs.finalize = mask == 1 && divides;  // block r is complete
        by[b][j] = addRecv(s, rs);
      }
    lo = keep;
  }

  // Doubling: this rank holds blocks [base, base + mask) complete.
  for (int mask = 1; mask < p2; mask *= 2) {
    const int partner = r ^ mask;
    const int base = r & ~(mask - 1);
    for (int b = base; b < base + mask; ++b)
      for (size_t j = 0; j < units[b].size(); ++j)
        s->sends.push_back({partner, tagOf(kPhaseRabAg, b, j), at(out, units[b][j].off),
                            units[b][j].bytes, by[b][j]});
    const int theirs = base ^ mask;
    for (int b = theirs; b < theirs + mask; ++b)
      for (size_t j = 0; j < units[b].size(); ++j) {
        const Unit& u = units[b][j];
        by[b][j] = addRecv(s, {partner, tagOf(kPhaseRabAg, b, j), u.bytes, RecvAction::kCopy,
                               at(out, u.off), {}});
      }
  }

  if (r < extras) {
    const int partner = r + p2;
    for (int b = 0; b < p2; ++b)
      for (size_t j = 0; j < units[b].size(); ++j)
        s->sends.push_back({partner, tagOf(kPhaseRabPost, b, j), at(out, units[b][j].off),
                            units[b][j].bytes, by[b][j]});
  }
}

}  // namespace tutti::algo
