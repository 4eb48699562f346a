// Balanced ring all-reduce: how much of the vector each rank owns, chosen
// from the measured rate of every link of the ring.
//
// Contract
// - In a ring all-reduce (ring.cc) rank x owns segment x: the segment's
//   reduce-scatter starts at the rank after x and ends at x, its all-gather
//   starts at x and ends at the rank before x. So the link u -> next(u)
//   carries every segment twice except u's (not sent in the reduce-scatter)
//   and next(u)'s (not sent in the all-gather): with shares s (fractions of
//   the vector, summing to 1) it carries (2 - s_u - s_next(u)) of the vector.
//   Slices of different segments and phases are independent messages, so a
//   link carries its load without waiting for the others' phases: the
//   operation takes about max over the links of load / rate (the cost model
//   here; latency and the pipeline's fill are left out).
// - balanceShares minimises that maximum over the shares (a linear
//   programme, solved exactly), then takes, on the straight line from equal
//   shares to that optimum, the point nearest equal shares whose time is
//   within kNearOptimal of the optimum (the plan changes the reduction order
//   of as few elements as it can). When equal shares are within kMinGain of
//   the optimum, the shares are equal (no plan).
// - Example: 4 nodes, node 2's link 4x slower both ways. Equal shares load
//   node 2's links with 1.5 vectors each at a quarter of the rate (6 vector
//   times at the fast rate); node 2 owning the whole vector loads them with
//   one vector each (4), the bound: node 2 must receive and send its vector
//   once. The chain that results (reduce towards node 2, broadcast from it)
//   is the ring with every other segment empty.
// - Weights: shares as integers summing to kWeightTotal, the form every rank
//   agrees on and the schedule uses (segmentOf); no weights (null) give the
//   unbalanced ring's near-equal segments.
// - Re-planning at run time (Comm::replanBalance): every rank measures what
//   its links to the next node carried (LinkLoad), the ranks gather the
//   figures at the same operation boundary, and each updates the rate of
//   every node's outgoing link alike (updateRate) and re-plans (replan):
//   a plan is re-examined only when a link's rate moved beyond
//   kReplanDrift from the rates it was made for, so figures that wobble do
//   not flip the plan back and forth.
// - Pure functions: every rank computes the same plan from the same figures.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "algo/schedule.h"

namespace tutti::algo {

inline constexpr uint32_t kWeightTotal = 1u << 20;
inline constexpr double kMinGain = 1.10;      // balance only for 10% or more
inline constexpr double kNearOptimal = 1.01;  // of the optimum's time
// Rings of more links are not planned (equal shares): the dense simplex
// takes about 90 ms at 512 links and grows with the cube.
inline constexpr int kMaxPlanLinks = 512;
// A ring all-reduce this large or larger runs balanced (smaller ones are
// latency-bound: shares change little there).
inline constexpr size_t kBalanceMinBytes = 1 << 20;

struct BalancePlan {
  std::vector<double> shares;  // per ring position, summing to 1
  double timeEqual = 0;        // max load / rate with equal shares (vector / rate unit)
  double timeBalanced = 0;     // the same with `shares`
  double timeOptimal = 0;      // the linear programme's optimum
  bool balanced = false;       // shares differ from equal ones
  std::vector<double> rates;   // the rates it was planned (or last re-examined) for
};

// `rate[p]`: the rate of the link from ring position p to position p + 1
// (mod n), any unit, every one > 0. n >= 2 (above kMaxPlanLinks: equal
// shares, not balanced).
BalancePlan balanceShares(const std::vector<double>& rate);

// The time of shares over rates, in the same unit (max over links of load / rate).
double ringTime(const std::vector<double>& shares, const std::vector<double>& rate);

// Shares -> integer weights summing to kWeightTotal (largest remainders).
std::vector<uint32_t> toWeights(const std::vector<double>& shares);
// Shares per ring position -> weights per rank (CollArgs::weights); `ring`:
// position -> rank (NodeMap::ringOrder).
std::vector<uint32_t> rankWeights(const std::vector<int>& ring, const std::vector<double>& shares);

// Segment x of `count` elements split by `weights` (null: equal split, as
// segment() in schedule_util.h): (offset, length) in elements.
std::pair<size_t, size_t> segmentOf(size_t count, const std::vector<uint32_t>* weights, int n,
                                    int x);

// A fingerprint of weights (FNV-1a), for the operation's fingerprint: ranks
// that planned different shares never exchange a message.
uint32_t weightsKey(const std::vector<uint32_t>& weights);

// The plans of a layout (CollArgs::balance): the flat ring's, shares per
// rank, and the network ring's of the two-level algorithms (hierarchical.cc:
// piece y of every segment is owned by node y), shares per node, each from
// the rates of the links it crosses. Empty weights: equal shares (not worth
// it, see balanceShares).
struct Balance {
  BalancePlan ring, net;
  std::vector<uint32_t> ranks, nodes;
  // Re-planned at run time (Comm::replanBalance): the cost model keeps the
  // all-reduces it covers on the algorithms it balances and measures (the
  // ring and the two-level ones; not recursive doubling or Rabenseifner's,
  // whose traffic to every node the re-plan cannot read, so a node that
  // turns slow under them would never be planned around).
  bool live = false;
  double ringGain() const { return ring.timeEqual / ring.timeBalanced; }
  double netGain() const { return net.timeEqual / net.timeBalanced; }
};
// `ringRate[p]`: the rate of the ring link from position p of
// nm.ringOrder() to p + 1 (a link inside a node at the intra-node rate).
// The network ring's link from node k to k + 1 is the flat ring's link
// leaving node k.
Balance planBalance(const NodeMap& nm, const std::vector<double>& ringRate);

// The rates of the flat ring's links (ringRate above) from the rate of
// each node's link to the next node (`nodeRate`, indexed by node) and the
// rate inside a node (`intra`).
std::vector<double> ringRates(const NodeMap& nm, const std::vector<double>& nodeRate, double intra);

// A plan in one line: "ring: ...; network ring of the two-level algorithms:
// ..." with each plan's gain over equal shares and the shares of 1% or more.
std::string describeBalance(const NodeMap& nm, const Balance& b);

// What a node's links to the next node carried over some operations: the
// bytes (acknowledged), how long the link was busy sending them (the
// longest of its connections: they are busy together), and how long the
// operations that sent them took (the longest of the node's ranks).
struct LinkLoad {
  uint64_t bytes = 0, busyUs = 0, opUs = 0;
};
// A link busy this share of its operations' time or more was their
// bottleneck: its bytes over its busy time are its rate. A link busy less
// waited on the others. It is at least bytes / opUs fast, and its bytes
// over its busy time say how fast it went while it sent, but that reads
// high (a rate limiter's burst lets a lightly used link's bytes leave at
// the wire's speed: 5x on the emulated networks of bench/balance), so it
// only raises the link's rate, and to `ceiling` at most (the fastest link
// measured at init). Nothing unsaturated lowers a rate: a link that does
// not hold the others up needs no plan around it.
inline constexpr double kLinkSaturated = 0.6;
// A saturated link's rate is judged from kJudgeBusyUs of busy time or more
// (the kernel counts busy time in ticks of up to 4 ms). *judged: the
// figures were used up (a rate measured, or kJudgeOpUs of operations
// seen); else they carry over and add up.
inline constexpr uint64_t kJudgeBusyUs = 40000, kJudgeOpUs = 400000;
enum class RateUpdate {
  kNone,      // nothing carried
  kMeasured,  // saturated: the rate measured (a step beyond 1.5x at once, else half-way)
  kRaised,    // not saturated, and faster than believed
  kKept,      // not saturated, and no faster than believed
};
RateUpdate updateRate(double* rateGBs, const LinkLoad& load, double ceilingGBs, bool* judged);

// Re-planning, per ring (the flat one, the network one): a plan is
// re-examined only when some link's rate moved beyond kReplanDrift either
// way from the rates it was planned for (single figures wobble by up to
// 20% on the emulated links; updateRate halves that). Then the plan for
// the new rates replaces it when it is kReplanGain faster under them (or
// when it is equal shares and those beat the current plan); else the
// current plan stays, anchored to the new rates, with its times under them
// (its gain, which the cost model weighs). A plan not re-examined is left
// as it is, times included. Leaving equal shares still takes kMinGain
// (balanceShares).
inline constexpr double kReplanDrift = 1.25, kReplanGain = 1.02;
// *changed: whether any plan's shares changed.
Balance replan(const NodeMap& nm, const Balance& current, const std::vector<double>& ringRate,
               bool* changed);

}  // namespace tutti::algo
