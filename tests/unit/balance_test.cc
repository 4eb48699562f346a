// The balanced ring's plan (algo/balance.h): the linear programme's optimum
// checked against the bound it should reach and against random shares, the
// rule that keeps equal shares when balancing gains little, and the integer
// weights and segments every rank derives from the shares.
#include "algo/balance.h"

#include <gtest/gtest.h>

#include <random>

namespace tutti::algo {
namespace {

double sum(const std::vector<double>& v) {
  double t = 0;
  for (double x : v) t += x;
  return t;
}

TEST(Balance, EqualRatesKeepEqualShares) {
  for (int n = 2; n <= 9; ++n) {
    const BalancePlan p = balanceShares(std::vector<double>(n, 3.5));
    EXPECT_FALSE(p.balanced) << n;
    for (double s : p.shares) EXPECT_DOUBLE_EQ(s, 1.0 / n);
    EXPECT_DOUBLE_EQ(p.timeBalanced, p.timeEqual);
  }
}

// The case: 4 nodes, node 2's link a quarter of the others' rate
// both ways. Equal shares: 1.5 vectors at a quarter rate (6); the bound is
// node 2 receiving and sending its vector once (4), reached by node 2
// owning (almost) everything.
TEST(Balance, ASlowNodeOwnsTheVector) {
  const std::vector<double> rate = {1, 0.25, 0.25, 1};  // links 1->2 and 2->3 slow
  const BalancePlan p = balanceShares(rate);
  ASSERT_TRUE(p.balanced);
  EXPECT_NEAR(p.timeEqual, 6, 1e-9);
  EXPECT_NEAR(p.timeOptimal, 4, 1e-9);
  EXPECT_LE(p.timeBalanced, kNearOptimal * 4 + 1e-9);
  EXPECT_GT(p.shares[2], 0.9);
  EXPECT_NEAR(sum(p.shares), 1, 1e-12);
  for (double s : p.shares) EXPECT_GE(s, 0);
}

// One slow link (1 -> 2 at a fifth): ranks 1 and 2 own the vector between
// them, so that link carries it once (time 5, against 7.5 with equal shares).
TEST(Balance, ASlowLinkIsFlankedByTheOwners) {
  const BalancePlan p = balanceShares({1, 0.2, 1, 1});
  ASSERT_TRUE(p.balanced);
  EXPECT_NEAR(p.timeEqual, 7.5, 1e-9);
  EXPECT_NEAR(p.timeOptimal, 5, 1e-9);
  EXPECT_GT(p.shares[1] + p.shares[2], 0.95);
}

// A little unevenness (under kMinGain) keeps equal shares.
TEST(Balance, SmallGainsKeepEqualShares) {
  const BalancePlan p = balanceShares({1, 0.95, 1, 1, 0.97});
  EXPECT_FALSE(p.balanced);
  EXPECT_LE(p.timeEqual, kMinGain * p.timeOptimal);
}

// The optimum really is one: no random point of the simplex does better,
// and the plan's time is what it claims, over random rates of 2 to 12 links.
TEST(Balance, NoRandomSharesBeatTheOptimum) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<double> u(0.05, 1.0);
  for (int trial = 0; trial < 200; ++trial) {
    const int n = 2 + trial % 11;
    std::vector<double> rate(n);
    for (double& r : rate) r = u(rng) * (trial % 3 == 0 ? 10 : 1);
    const BalancePlan p = balanceShares(rate);
    ASSERT_NEAR(sum(p.shares), 1, 1e-9);
    EXPECT_NEAR(ringTime(p.shares, rate), p.timeBalanced, 1e-9);
    EXPECT_LE(p.timeOptimal, p.timeEqual + 1e-12);
    EXPECT_LE(p.timeBalanced, std::max(p.timeEqual, kNearOptimal * p.timeOptimal) * (1 + 1e-9));
    std::exponential_distribution<double> e(1.0);
    for (int k = 0; k < 300; ++k) {
      std::vector<double> s(n);
      for (double& x : s) x = e(rng);
      const double t = sum(s);
      for (double& x : s) x /= t;
      ASSERT_GE(ringTime(s, rate), p.timeOptimal * (1 - 1e-9)) << "trial " << trial;
    }
  }
}

// A bad rate (0, negative, NaN) gives equal shares, never a crash.
TEST(Balance, BadRatesGiveEqualShares) {
  for (double bad : {0.0, -1.0, std::nan("")}) {
    const BalancePlan p = balanceShares({1, bad, 1});
    EXPECT_FALSE(p.balanced);
    for (double s : p.shares) EXPECT_DOUBLE_EQ(s, 1.0 / 3);
  }
}

// Beyond kMaxPlanLinks nothing is planned, however slow a link; at the
// limit the slow link still is.
TEST(Balance, RingsBeyondTheLimitKeepEqualShares) {
  std::vector<double> rate(kMaxPlanLinks + 1, 1.0);
  rate[7] = 0.1;
  EXPECT_FALSE(balanceShares(rate).balanced);
  rate.pop_back();
  const BalancePlan p = balanceShares(rate);
  ASSERT_TRUE(p.balanced);
  EXPECT_GT(p.shares[7] + p.shares[8], 0.9);
}

// The layout's plans: one slow node of four, two ranks each. The network
// ring gives the slow node (almost) everything; the flat ring can only
// share between the ranks on either side of its two links.
TEST(Balance, PlansTheRingAndTheNetworkRingOfALayout) {
  const NodeMap nm = NodeMap::fromHostIds({0, 0, 1, 1, 2, 2, 3, 3});
  // Ring positions = ranks here; links 3->4 and 5->6 enter and leave node 2.
  std::vector<double> rate = {5, 1, 5, 0.25, 5, 0.25, 5, 1};
  const Balance b = planBalance(nm, rate);
  ASSERT_EQ(b.nodes.size(), 4u);
  EXPECT_GT(b.nodes[2], kWeightTotal * 9 / 10);
  EXPECT_NEAR(b.netGain(), 1.5, 0.05);
  // Each slow link is flanked by shares of half the vector (the best the
  // flat ring can do: 1.5 vectors on each, against 1.75 with equal shares).
  ASSERT_EQ(b.ranks.size(), 8u);
  EXPECT_GT(b.ranks[3] + b.ranks[4], kWeightTotal * 45 / 100);
  EXPECT_GT(b.ranks[5] + b.ranks[6], kWeightTotal * 45 / 100);
  EXPECT_NEAR(b.ringGain(), 7.0 / (6 * kNearOptimal), 0.02);
}

TEST(Balance, WeightsSumExactlyAndSegmentsTile) {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 500; ++trial) {
    const int n = 1 + trial % 9;
    std::vector<double> s(n);
    for (double& x : s)
      x = trial % 4 == 0 && rng() % 2 ? 0.0 : std::uniform_real_distribution<>(0, 1)(rng);
    if (sum(s) == 0) s[0] = 1;
    const double t = sum(s);
    for (double& x : s) x /= t;
    const std::vector<uint32_t> w = toWeights(s);
    uint64_t total = 0;
    for (uint32_t x : w) total += x;
    ASSERT_EQ(total, kWeightTotal);
    for (int i = 0; i < n; ++i)
      EXPECT_NEAR(w[i], s[i] * kWeightTotal, 1.0) << "trial " << trial << " rank " << i;
    for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{1000003}, size_t{1} << 40}) {
      size_t at = 0;
      for (int x = 0; x < n; ++x) {
        const auto [start, len] = segmentOf(count, &w, n, x);
        ASSERT_EQ(start, at) << "segment " << x;
        at += len;
      }
      ASSERT_EQ(at, count);
    }
  }
}

TEST(Balance, NoWeightsIsTheEqualSplit) {
  EXPECT_EQ(segmentOf(10, nullptr, 3, 0), std::make_pair(size_t{0}, size_t{4}));
  EXPECT_EQ(segmentOf(10, nullptr, 3, 2), std::make_pair(size_t{7}, size_t{3}));
}

TEST(Balance, WeightsKeyTellsPlansApart) {
  EXPECT_NE(weightsKey({1, 2, 3}), weightsKey({1, 3, 2}));
  EXPECT_EQ(weightsKey({1, 2, 3}), weightsKey({1, 2, 3}));
}

// updateRate (re-planning at run time): a saturated link's rate is what it
// carried over its busy time; an unsaturated one only raises a rate, to
// what it showed, the ceiling at most; too short a look carries over.
TEST(Balance, ASaturatedLinkIsMeasured) {
  bool judged = false;
  double rate = 0.1;  // GB/s
  // 10 MB over 400 ms busy of 500 ms: 25 MB/s, a step: taken at once.
  EXPECT_EQ(updateRate(&rate, {10'000'000, 400'000, 500'000}, 0.1, &judged), RateUpdate::kMeasured);
  EXPECT_TRUE(judged);
  EXPECT_DOUBLE_EQ(rate, 0.025);
  // 0.03 GB/s is within 1.5x: half-way.
  EXPECT_EQ(updateRate(&rate, {12'000'000, 400'000, 500'000}, 0.1, &judged), RateUpdate::kMeasured);
  EXPECT_DOUBLE_EQ(rate, 0.0275);
  // Saturated but under kJudgeBusyUs of busy time: not measured, not judged
  // (its figures add up); what it carried in the time shows no more than
  // is believed.
  EXPECT_EQ(updateRate(&rate, {600'000, 30'000, 30'000}, 0.1, &judged), RateUpdate::kKept);
  EXPECT_FALSE(judged);
  EXPECT_DOUBLE_EQ(rate, 0.0275);
  EXPECT_EQ(updateRate(&rate, {}, 0.1, &judged), RateUpdate::kNone);
  EXPECT_FALSE(judged);
}

TEST(Balance, AnUnsaturatedLinkOnlyRaisesItsRate) {
  bool judged = false;
  double rate = 0.03;
  // 20 MB over 100 ms busy of 500 ms: 200 MB/s while sending, capped at the
  // 0.12 GB/s ceiling; at least 40 MB/s (bytes / operation time).
  EXPECT_EQ(updateRate(&rate, {20'000'000, 100'000, 500'000}, 0.12, &judged), RateUpdate::kRaised);
  EXPECT_TRUE(judged);  // kJudgeOpUs of operations seen
  EXPECT_DOUBLE_EQ(rate, 0.12);
  // Slower than believed, but not the bottleneck: kept.
  rate = 0.12;
  EXPECT_EQ(updateRate(&rate, {2'000'000, 100'000, 500'000}, 0.12, &judged), RateUpdate::kKept);
  EXPECT_DOUBLE_EQ(rate, 0.12);
  // No busy time read (under the kernel's tick): only bytes / operation time.
  rate = 0.01;
  EXPECT_EQ(updateRate(&rate, {4'000'000, 0, 200'000}, 0.12, &judged), RateUpdate::kRaised);
  EXPECT_FALSE(judged);  // under kJudgeOpUs: carried over
  EXPECT_DOUBLE_EQ(rate, 0.02);
}

// replan: a plan is re-examined only when a rate moved beyond kReplanDrift,
// so figures that wobble keep it; a real change moves it, and back.
TEST(Balance, ReplanKeepsThePlanThroughNoise) {
  const NodeMap nm = NodeMap::fromHostIds({0, 1, 2, 3});
  const Balance even = planBalance(nm, {1, 1, 1, 1});
  ASSERT_FALSE(even.ring.balanced);
  bool changed = true;
  // One link 15% slow: equal shares stay (the optimum gains under 10%).
  Balance b = replan(nm, even, {1, 0.85, 1, 1}, &changed);
  EXPECT_FALSE(changed);
  EXPECT_TRUE(b.ranks.empty());
  // Node 2's links at a quarter: it owns the vector.
  b = replan(nm, even, {1, 0.25, 0.25, 1}, &changed);
  ASSERT_TRUE(changed);
  ASSERT_EQ(b.ranks.size(), size_t{4});
  EXPECT_GT(b.ranks[2], kWeightTotal * 9 / 10);
  // The slow links measured 20% faster: the plan is still within kMinGain
  // of the best for them.
  const Balance slow = b;
  b = replan(nm, slow, {1, 0.3, 0.3, 1}, &changed);
  EXPECT_FALSE(changed);
  EXPECT_EQ(b.ranks, slow.ranks);
  // ... nor its gain (the cost model's): within the drift, nothing moves.
  EXPECT_DOUBLE_EQ(b.ring.timeBalanced, slow.ring.timeBalanced);
  EXPECT_DOUBLE_EQ(b.ring.timeEqual, slow.ring.timeEqual);
  // Beyond it (the slow links at 0.4) the plan is re-examined: kept, within
  // kReplanGain of the best, with its gain under the new rates.
  b = replan(nm, slow, {1, 0.4, 0.4, 1}, &changed);
  EXPECT_FALSE(changed);
  EXPECT_EQ(b.ranks, slow.ranks);
  EXPECT_DOUBLE_EQ(b.ring.timeBalanced, ringTime(slow.ring.shares, {1, 0.4, 0.4, 1}));
  EXPECT_DOUBLE_EQ(b.ring.timeEqual, 1.5 / 0.4);
  // Back to even: equal shares again.
  b = replan(nm, slow, {1, 1, 1, 1}, &changed);
  EXPECT_TRUE(changed);
  EXPECT_TRUE(b.ranks.empty());
  EXPECT_FALSE(b.ring.balanced);
}

// A plan that has become slower than equal shares gives way to them even
// when equal shares gain less than kMinGain over it.
TEST(Balance, ReplanDropsAPlanSlowerThanEqualShares) {
  const NodeMap nm = NodeMap::fromHostIds({0, 1, 2, 3});
  bool changed = false;
  const Balance mild = replan(nm, planBalance(nm, {1, 1, 1, 1}), {1, 0.75, 1, 1}, &changed);
  ASSERT_TRUE(changed);
  ASSERT_TRUE(mild.ring.balanced);
  // Every link near the same rate again (one moved beyond kReplanDrift).
  const std::vector<double> now{1.1, 1, 1.1, 1.1};
  const double t = ringTime(mild.ring.shares, now), equal = 1.5 / 1.0;
  ASSERT_GT(t, equal);             // slower than equal shares ...
  ASSERT_LT(t, kMinGain * equal);  // ... by less than kMinGain
  const Balance b = replan(nm, mild, now, &changed);
  EXPECT_TRUE(changed);
  EXPECT_FALSE(b.ring.balanced);
  EXPECT_TRUE(b.ranks.empty());
}

// A first re-plan from a figure that straddled the change (a link at half
// speed, say) is refined when the next figure drifts on, even when the
// refinement gains less than kMinGain.
TEST(Balance, ReplanRefinesAPartialPlan) {
  const NodeMap nm = NodeMap::fromHostIds({0, 1, 2, 3});
  bool changed = false;
  const Balance half = replan(nm, planBalance(nm, {1, 1, 1, 1}), {1, 0.55, 0.55, 1}, &changed);
  ASSERT_TRUE(changed);
  const std::vector<double> now{1, 0.25, 0.25, 1};
  const Balance best = planBalance(nm, now);
  ASSERT_LT(ringTime(half.ring.shares, now), kMinGain * best.ring.timeBalanced);
  ASSERT_GT(ringTime(half.ring.shares, now), kReplanGain * best.ring.timeBalanced);
  const Balance b = replan(nm, half, now, &changed);
  EXPECT_TRUE(changed);
  EXPECT_EQ(b.ranks, best.ranks);
  // The same figures again: nothing moves.
  replan(nm, b, now, &changed);
  EXPECT_FALSE(changed);
}

TEST(Balance, RingRatesPutNodeLinksOnTheRing) {
  const NodeMap nm = NodeMap::fromHostIds({7, 7, 9, 9, 9});
  // Ring 0 1 | 2 3 4 |: links 1->2 (node 0's) and 4->0 (node 1's) cross.
  EXPECT_EQ(ringRates(nm, {0.5, 0.25}, 9), (std::vector<double>{9, 0.5, 9, 9, 0.25}));
}

}  // namespace
}  // namespace tutti::algo
