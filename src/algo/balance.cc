// Balanced ring shares (balance.h): the linear programme and its rounding.
#include "algo/balance.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "algo/schedule_util.h"

namespace tutti::algo {
namespace {

// The programme, with the vector as the unit and rates scaled to the fastest:
//   minimise T  over s_0..s_{n-1} >= 0, T >= 0
//   subject to  s_p + s_{p+1} + r_p T >= 2   (link p carries 2 - s_p - s_{p+1})
//               s_0 + ... + s_{n-1} <= 1     (equality at the optimum: more
//                                             share only unloads links)
// It is solved through its dual, whose origin is feasible (no first phase):
//   maximise 2 (y_0 + ... + y_{n-1}) - z  over y, z >= 0
//   subject to  y_{v-1} + y_v - z <= 0      (one row per s_v)
//               r_0 y_0 + ... + r_{n-1} y_{n-1} <= 1   (the row of T)
// by the tableau simplex with Bland's rule (the zero right-hand sides make
// it degenerate; Bland's rule cannot cycle). At the optimum the reduced cost
// of row i's slack is the primal variable of row i: s_v, then T.
bool solve(const std::vector<double>& r, std::vector<double>* shares, double* time) {
  const int n = static_cast<int>(r.size());
  const int nv = n + 1, m = n + 1, cols = nv + m + 1;  // variables, slacks, right-hand side
  std::vector<std::vector<double>> t(m + 1, std::vector<double>(cols, 0.0));
  auto y = [](int p) { return p; };
  const int z = n;
  for (int v = 0; v < n; ++v) {
    t[v][y(mod(v - 1, n))] += 1;
    t[v][y(v)] += 1;
    t[v][z] = -1;
    t[v][nv + v] = 1;
  }
  for (int p = 0; p < n; ++p) t[n][y(p)] = r[p];
  t[n][nv + n] = 1;
  t[n][cols - 1] = 1;
  std::vector<double>& obj = t[m];  // reduced costs: -c to start
  for (int p = 0; p < n; ++p) obj[y(p)] = -2;
  obj[z] = 1;
  std::vector<int> basis(m);
  for (int i = 0; i < m; ++i) basis[i] = nv + i;
  constexpr double kEps = 1e-12;
  for (int iter = 0; iter < 50 * (nv + m); ++iter) {
    int enter = -1;
    for (int j = 0; j < nv + m; ++j)
      if (obj[j] < -kEps) {
        enter = j;
        break;
      }
    if (enter < 0) {
      shares->assign(n, 0.0);
      for (int v = 0; v < n; ++v) (*shares)[v] = std::max(0.0, obj[nv + v]);
      *time = obj[nv + n];
      return true;
    }
    int leave = -1;
    double best = 0;
    for (int i = 0; i < m; ++i) {
      if (t[i][enter] <= kEps) continue;
      const double ratio = t[i][cols - 1] / t[i][enter];
      if (leave < 0 || ratio < best - kEps || (ratio <= best + kEps && basis[i] < basis[leave]))
        leave = i, best = ratio;
    }
    if (leave < 0) return false;  // unbounded: the primal is infeasible (it is not)
    const double piv = t[leave][enter];
    for (double& v : t[leave]) v /= piv;
    for (int i = 0; i <= m; ++i) {
      if (i == leave || t[i][enter] == 0) continue;
      const double f = t[i][enter];
      for (int j = 0; j < cols; ++j) t[i][j] -= f * t[leave][j];
    }
    basis[leave] = enter;
  }
  return false;
}

}  // namespace

double ringTime(const std::vector<double>& shares, const std::vector<double>& rate) {
  const int n = static_cast<int>(rate.size());
  double worst = 0;
  for (int p = 0; p < n; ++p) {
    const double load = std::max(0.0, 2 - shares[p] - shares[(p + 1) % n]);
    worst = std::max(worst, load / rate[p]);
  }
  return worst;
}

BalancePlan balanceShares(const std::vector<double>& rate) {
  const int n = static_cast<int>(rate.size());
  BalancePlan plan;
  const std::vector<double> equal(n, 1.0 / n);
  plan.shares = equal;
  plan.rates = rate;
  plan.timeEqual = plan.timeBalanced = plan.timeOptimal = ringTime(equal, rate);
  if (n < 2 || n > kMaxPlanLinks) return plan;
  const double top = *std::max_element(rate.begin(), rate.end());
  if (!(top > 0) || std::any_of(rate.begin(), rate.end(), [](double r) { return !(r > 0); }))
    return plan;
  std::vector<double> scaled(rate), best;
  for (double& r : scaled) r /= top;
  double t = 0;
  if (!solve(scaled, &best, &t)) return plan;
  double sum = 0;
  for (double s : best) sum += s;
  if (!(sum > 0)) return plan;
  for (double& s : best) s /= sum;
  plan.timeOptimal = std::min(plan.timeEqual, ringTime(best, rate));
  if (plan.timeEqual <= kMinGain * plan.timeOptimal) return plan;
  // The point nearest equal shares on the way to the optimum that is within
  // kNearOptimal of it (the time is convex along the line).
  auto at = [&](double lambda) {
    std::vector<double> s(n);
    for (int i = 0; i < n; ++i) s[i] = equal[i] + lambda * (best[i] - equal[i]);
    return s;
  };
  const double target = kNearOptimal * plan.timeOptimal;
  double lo = 0, hi = 1;
  for (int i = 0; i < 60; ++i) {
    const double mid = (lo + hi) / 2;
    (ringTime(at(mid), rate) <= target ? hi : lo) = mid;
  }
  plan.shares = at(hi);
  plan.timeBalanced = ringTime(plan.shares, rate);
  plan.balanced = true;
  return plan;
}

std::vector<uint32_t> toWeights(const std::vector<double>& shares) {
  const size_t n = shares.size();
  std::vector<uint32_t> w(n);
  std::vector<std::pair<double, size_t>> rest(n);
  uint64_t given = 0;
  for (size_t i = 0; i < n; ++i) {
    const double exact = std::max(0.0, shares[i]) * kWeightTotal;
    w[i] = static_cast<uint32_t>(std::min<double>(std::floor(exact), kWeightTotal));
    given += w[i];
    rest[i] = {exact - w[i], i};
  }
  std::stable_sort(rest.begin(), rest.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  for (size_t k = 0; given < kWeightTotal; k = (k + 1) % n, ++given) ++w[rest[k].second];
  for (; given > kWeightTotal; --given) {  // shares summing above 1
    size_t i = 0;
    for (size_t j = 1; j < n; ++j)
      if (w[j] > w[i]) i = j;
    --w[i];
  }
  return w;
}

std::vector<uint32_t> rankWeights(const std::vector<int>& ring, const std::vector<double>& shares) {
  const std::vector<uint32_t> byPos = toWeights(shares);
  std::vector<uint32_t> w(ring.size(), 0);
  for (size_t p = 0; p < ring.size(); ++p) w[ring[p]] = byPos[p];
  return w;
}

namespace {

// The network ring's rates: the flat ring's link leaving each node.
std::vector<double> netRates(const NodeMap& nm, const std::vector<double>& ringRate) {
  const std::vector<int> ring = nm.ringOrder();
  const int n = static_cast<int>(ring.size());
  std::vector<double> net(nm.nNodes(), 0);
  for (int p = 0; p < n; ++p) {
    const int from = nm.nodeOf[ring[p]], to = nm.nodeOf[ring[(p + 1) % n]];
    if (from != to) net[from] = ringRate[p];
  }
  return net;
}

}  // namespace

Balance planBalance(const NodeMap& nm, const std::vector<double>& ringRate) {
  Balance b;
  b.ring = balanceShares(ringRate);
  if (b.ring.balanced) b.ranks = rankWeights(nm.ringOrder(), b.ring.shares);
  b.net = balanceShares(netRates(nm, ringRate));
  if (b.net.balanced) b.nodes = toWeights(b.net.shares);
  return b;
}

std::vector<double> ringRates(const NodeMap& nm, const std::vector<double>& nodeRate,
                              double intra) {
  const std::vector<int> ring = nm.ringOrder();
  const int n = static_cast<int>(ring.size());
  std::vector<double> rate(n, intra);
  for (int p = 0; p < n; ++p) {
    const int from = nm.nodeOf[ring[p]], to = nm.nodeOf[ring[(p + 1) % n]];
    if (from != to) rate[p] = nodeRate[from];
  }
  return rate;
}

std::string describeBalance(const NodeMap& nm, const Balance& b) {
  auto one = [](const BalancePlan& p, const std::vector<int>& who, const char* by) {
    char buf[96];
    if (!p.balanced) {
      std::snprintf(buf, sizeof buf, "equal shares (within %.0f%% of the best plan)",
                    100 * (kMinGain - 1));
      return std::string(buf);
    }
    std::snprintf(buf, sizeof buf, "%.2fx faster than equal shares in the model (shares by %s:",
                  p.timeEqual / p.timeBalanced, by);
    std::string out = buf;
    // Shares of 1% or more when there are many (the others: "rest").
    double rest = 0;
    for (size_t i = 0; i < p.shares.size(); ++i) {
      if (p.shares.size() > 8 && p.shares[i] < 0.01) {
        rest += p.shares[i];
        continue;
      }
      std::snprintf(buf, sizeof buf, " %d:%.1f%%", who[i], 100 * p.shares[i]);
      out += buf;
    }
    if (rest > 0) {
      std::snprintf(buf, sizeof buf, " rest:%.1f%%", 100 * rest);
      out += buf;
    }
    return out + ")";
  };
  std::vector<int> nodes(nm.nNodes());
  for (int k = 0; k < nm.nNodes(); ++k) nodes[k] = k;
  return "ring: " + one(b.ring, nm.ringOrder(), "rank") +
         "; network ring of the two-level algorithms: " + one(b.net, nodes, "node");
}

RateUpdate updateRate(double* rateGBs, const LinkLoad& load, double ceilingGBs, bool* judged) {
  *judged = false;
  if (load.bytes == 0 || load.opUs == 0) return RateUpdate::kNone;
  const double bytes = static_cast<double>(load.bytes);
  if (static_cast<double>(load.busyUs) >= kLinkSaturated * static_cast<double>(load.opUs) &&
      load.busyUs >= kJudgeBusyUs) {
    *judged = true;
    const double measured = bytes / static_cast<double>(load.busyUs) / 1000;  // bytes/us = MB/s
    const double was = *rateGBs;
    *rateGBs = !(was > 0) || measured > 1.5 * was || measured * 1.5 < was ? measured
                                                                          : (was + measured) / 2;
    return RateUpdate::kMeasured;
  }
  *judged = load.opUs >= kJudgeOpUs;
  double shown = bytes / static_cast<double>(load.opUs) / 1000;
  if (load.busyUs > 0)
    shown = std::max(shown, std::min(bytes / static_cast<double>(load.busyUs) / 1000, ceilingGBs));
  if (!(shown > *rateGBs)) return RateUpdate::kKept;
  *rateGBs = shown;
  return RateUpdate::kRaised;
}

Balance replan(const NodeMap& nm, const Balance& current, const std::vector<double>& ringRate,
               bool* changed) {
  const Balance fresh = planBalance(nm, ringRate);
  Balance out = current;
  *changed = false;
  // One ring's plan (see the header).
  auto choose = [&](const BalancePlan& now, const BalancePlan& next, std::vector<uint32_t>* w,
                    const std::vector<uint32_t>& nextWeights, const std::vector<double>& r) {
    const std::vector<double> equal(r.size(), 1.0 / static_cast<double>(r.size()));
    const double t = ringTime(now.balanced ? now.shares : equal, r);
    bool drifted = now.rates.size() != r.size();
    for (size_t i = 0; !drifted && i < r.size(); ++i)
      drifted = !(r[i] <= kReplanDrift * now.rates[i] && now.rates[i] <= kReplanDrift * r[i]);
    if (!drifted) return now;
    BalancePlan kept = now;
    kept.timeEqual = ringTime(equal, r);
    kept.timeBalanced = t;
    kept.rates = r;
    if (now.balanced == next.balanced && now.shares == next.shares) return kept;
    if ((next.balanced && t > kReplanGain * next.timeBalanced) ||
        (!next.balanced && now.balanced && t > next.timeEqual)) {
      *w = nextWeights;
      *changed = true;
      return next;
    }
    return kept;
  };
  out.ring = choose(current.ring, fresh.ring, &out.ranks, fresh.ranks, ringRate);
  out.net = choose(current.net, fresh.net, &out.nodes, fresh.nodes, netRates(nm, ringRate));
  return out;
}

const std::vector<uint32_t>* ringWeights(const CollArgs& a) {
  return a.balance && a.balance->ranks.size() == static_cast<size_t>(a.nranks) ? &a.balance->ranks
                                                                               : nullptr;
}

const std::vector<uint32_t>* netWeights(const CollArgs& a) {
  return a.balance && a.nodes && a.balance->nodes.size() == static_cast<size_t>(a.nodes->nNodes())
             ? &a.balance->nodes
             : nullptr;
}

uint32_t weightsKey(const std::vector<uint32_t>& weights) {
  uint32_t h = 2166136261u;
  for (uint32_t w : weights)
    for (int b = 0; b < 4; ++b) h = (h ^ ((w >> (8 * b)) & 0xff)) * 16777619u;
  return h;
}

std::pair<size_t, size_t> segmentOf(size_t count, const std::vector<uint32_t>* weights, int n,
                                    int x) {
  if (!weights) return segment(count, n, x);
  unsigned __int128 before = 0;
  for (int i = 0; i < x; ++i) before += (*weights)[i];
  const unsigned __int128 after = before + (*weights)[x];
  const auto start = static_cast<size_t>(before * count / kWeightTotal);
  const auto end = static_cast<size_t>(after * count / kWeightTotal);
  return {start, end - start};
}

}  // namespace tutti::algo
