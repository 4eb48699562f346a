// Cost model and algorithm selection for all-reduce.
//
// Contract: predictions are closed-form latency/bandwidth estimates (an
// alpha-beta model per link class, CostModel in schedule.h), cheap enough to
// evaluate on every call. They rank algorithms; they are not meant to be
// accurate to the microsecond (bench/sim simulates whole schedules for that).
// Pure functions, no state, no I/O.
#pragma once

#include <string>
#include <vector>

#include "algo/schedule.h"

namespace tutti::algo {

// Predicted time in microseconds of an all-reduce of `a` with `algo` (not
// kAuto). Returns a huge value for an algorithm that does not apply (two-level
// algorithms on one node, recursive doubling above a.rdMaxBytes).
double predictAllReduceUs(const CollArgs& a, CollArgs::Algo algo);

// The algorithm makeSchedule runs for an all-reduce of `a` (a.algo honoured
// when it applies; a two-level algorithm forced on one node becomes the ring).
CollArgs::Algo chooseAllReduce(const CollArgs& a);

// All-gather and reduce-scatter: whether the two-level algorithm runs
// (uniform nodes of more than one rank, more than one node; forced by
// a.algo == kHierarchical, ruled out by kRing, else when predicted faster).
bool useTwoLevelGather(const CollArgs& a);

// The algorithms worth measuring for `a` (all-reduce, all-gather or
// reduce-scatter; a.algo kAuto) at run time (core/tuner.h): the one the
// model chooses first, then every other that applies and that the model
// predicts at most `within` times slower (all-reduce: ring, Rabenseifner's,
// hierarchical, 2D-ring, recursive doubling; only those a live balanced plan
// covers while it is live; all-gather and reduce-scatter: the ring and the
// two-level algorithm where it applies, as kRing and kHierarchical). One
// element: nothing to choose.
std::vector<CollArgs::Algo> algorithmCandidates(const CollArgs& a, double within);

const char* algoName(CollArgs::Algo algo);
// "ring", "tree", "2dring", "hierarchical", "rabenseifner" (case-insensitive; NCCL_ALGO may
// list several separated by commas: the first one known is taken); kAuto for
// anything else.
CollArgs::Algo parseAlgo(const std::string& value);

}  // namespace tutti::algo
