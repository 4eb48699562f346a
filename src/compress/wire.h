// Compressed all-reduce schedules: the payload's wire format and the schedules
// that carry it (see docs/compression.md for the semantics users get).
//
// Contract:
// - Scaled fp16/bf16 (Wire::kHalf/kBf16) is a transformation of any float32
//   sum/avg all-reduce schedule (ring, recursive doubling, hierarchical,
//   2D-ring): messages between nodes travel encoded (every message when the
//   communicator is one node), and every reduce step accumulates in float32
//   and rounds its result once through the codec. Every value a rank holds is
//   therefore exactly what the wire carries, and all ranks end bit-identical.
// - 1-bit (Wire::kSign) is its own two-phase schedule: each rank adds its
//   worker residual and sends segment x, encoded, to rank x; rank x adds the
//   decoded contributions in a fixed order, applies avg's 1/n, adds its
//   server residual and rounds once more through the codec; the result goes
//   back, encoded, to every rank. Residuals live in the schedule's state
//   buffer (signStateFloats).
// - Pure functions of their arguments (the same on every rank).
#pragma once

#include <cstddef>

#include "algo/schedule.h"

namespace tutti::compress {

// The scale exponent of fp16 for data whose largest magnitude (over all
// ranks) is `maxAbs`, when partial results may reach `factor` times it (the
// rank count for sum, 1 for avg, whose 1/n is applied before sending): the
// largest e with factor * maxAbs * 2^e <= 2^15, so no partial result can
// overflow binary16 (max 65504) while the most of its range is used (values
// below 2^-24 * 2^-e underflow). 0 for zero or non-finite maxAbs.
int halfScaleExp(double maxAbs, double factor);

// Marks the messages of a float32 sum/avg all-reduce schedule (from
// algo::makeSchedule) to travel in `wire` (kHalf or kBf16) as described above.
void applyWire(algo::Schedule* s, const algo::CollArgs& a, algo::WireSpec wire);

// The 1-bit all-reduce with error feedback (float32, op kSum or avg given as
// kPreMulSum with scalar 1/n).
algo::Schedule signAllReduce(const algo::CollArgs& a);
// Float32 residuals a rank keeps for signAllReduce of `count` elements.
size_t signStateFloats(size_t count, int nranks, int rank);

}  // namespace tutti::compress
