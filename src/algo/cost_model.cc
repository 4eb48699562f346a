#include "algo/cost_model.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <sstream>

#include "algo/balance.h"
#include "algo/schedule_util.h"

namespace tutti::algo {

namespace {

constexpr double kNotApplicable = std::numeric_limits<double>::infinity();

// Microseconds to move `bytes` over a link of `bandwidthGBs` (1e9 bytes/s).
double moveUs(double bytes, double bandwidthGBs) { return bytes / (bandwidthGBs * 1e3); }

}  // namespace

double predictAllReduceUs(const CollArgs& a, CollArgs::Algo algo) {
  const CostModel model = a.cost ? *a.cost : CostModel{};
  const double bytes = static_cast<double>(a.count * a.elemSize);
  const int n = a.nranks;
  const int nodes = a.nodes ? a.nodes->nNodes() : 1;
  const int perNode = a.nodes ? a.nodes->maxPerNode() : n;
  const LinkModel& in = model.intra;
  const LinkModel& net = model.inter;
  // The slowest link a flat algorithm crosses.
  const LinkModel& flat = nodes > 1 ? net : in;
  if (n == 1) return 0;
  switch (algo) {
    case CollArgs::Algo::kRing:
      // 2(n-1) steps; with the ring keeping nodes together, each link (a
      // node's uplink included) carries one stream of 2(n-1)/n of the data.
      // Balanced (algo/balance.h), the slowest links carry less.
      return 2.0 * (n - 1) * flat.latencyUs +
             moveUs(2.0 * (n - 1) / n * bytes, flat.bandwidthGBs) /
                 (ringWeights(a) ? std::max(1.0, a.balance->ringGain()) : 1.0);
    case CollArgs::Algo::kRecursiveDoubling: {
      if (bytes > static_cast<double>(a.rdMaxBytes) && a.algo != algo) return kNotApplicable;
      int p2 = 1, steps = 0;
      while (p2 * 2 <= n) p2 *= 2, ++steps;
      if (p2 != n) steps += 2;
      // Every step exchanges the whole buffer; across nodes all of a node's
      // ranks share its link.
      const double share = nodes > 1 ? perNode : 1;
      return steps * (flat.latencyUs + moveUs(bytes * share, flat.bandwidthGBs));
    }
    case CollArgs::Algo::kRabenseifner: {
      // 2 log2(p2) steps moving 2(p2-1)/p2 of the data, plus the fold of
      // the ranks past p2 (their whole buffer there and back). Across nodes
      // the ranks of a node exchange with partners elsewhere at once (when
      // a node's ranks are numbered together, the far steps come first and
      // last): charged as all of a node's ranks sharing its link.
      int p2 = 1, steps = 0;
      while (p2 * 2 <= n) p2 *= 2, ++steps;
      const double share = nodes > 1 ? perNode : 1;
      double us = 2.0 * steps * flat.latencyUs +
                  moveUs(2.0 * (p2 - 1) / p2 * bytes * share, flat.bandwidthGBs);
      if (p2 != n) us += 2 * (flat.latencyUs + moveUs(bytes, flat.bandwidthGBs));
      return us;
    }
    case CollArgs::Algo::kHierarchical:
    case CollArgs::Algo::k2DRing: {
      if (nodes < 2) return kNotApplicable;
      const double k = perNode;
      const double nodeRs = (k - 1) * in.latencyUs + moveUs((k - 1) / k * bytes, in.bandwidthGBs);
      // Across nodes a node's link carries 2(N-1)/N of the data in either
      // algorithm: spread over all its ranks (hierarchical) or one leader.
      const double netAr = 2.0 * (nodes - 1) * net.latencyUs +
                           moveUs(2.0 * (nodes - 1) / nodes * bytes, net.bandwidthGBs) /
                               (netWeights(a) ? std::max(1.0, a.balance->netGain()) : 1.0);
      if (algo == CollArgs::Algo::kHierarchical) return nodeRs + netAr + nodeRs;
      // 2D-ring: the leader also gathers the node's sum, then forwards all of
      // it down the node's chain.
      const double toLeader = in.latencyUs + moveUs((k - 1) / k * bytes, in.bandwidthGBs);
      const double nodeBcast = (k - 1) * in.latencyUs + moveUs(bytes, in.bandwidthGBs);
      return nodeRs + toLeader + netAr + nodeBcast;
    }
    case CollArgs::Algo::kAuto:
      break;
  }
  return kNotApplicable;
}

CollArgs::Algo chooseAllReduce(const CollArgs& a) {
  using Algo = CollArgs::Algo;
  const size_t bytes = a.count * a.elemSize;
  const bool multiNode = a.nodes && a.nodes->nNodes() > 1;
  if (a.algo != Algo::kAuto) {
    if ((a.algo == Algo::k2DRing || a.algo == Algo::kHierarchical) && !multiNode) return Algo::kRing;
    return a.algo;
  }
  // One node: the threshold measured on shared memory (TUTTI_RD_MAX), then
  // Rabenseifner's for powers of two from 4 ranks (2 log2 n steps instead of
  // the ring's 2(n-1), same bytes). Measured side by side on 2 cores, it beat
  // the ring 1.2-1.4x over sockets at 4 and 8 ranks (128 KiB-2 MiB) and
  // 1.1-1.55x on shared memory at 8, but lost 1.1-1.2x to the ring on shared
  // memory at 4 ranks from 2 MiB; at 3 and 6 ranks (folding the ranks past
  // the power of two costs two whole-buffer transfers) it won at some sizes
  // and lost at others.
  if (!multiNode) {
    if (bytes <= a.rdMaxBytes) return Algo::kRecursiveDoubling;
    const int n = a.nranks;
    const bool pow2 = (n & (n - 1)) == 0;
    return pow2 && n >= (a.sharedMemory ? 8 : 4) ? Algo::kRabenseifner : Algo::kRing;
  }
  Algo best = Algo::kRing;
  double bestUs = predictAllReduceUs(a, Algo::kRing);
  // A live balanced plan (algo/balance.h) keeps to the algorithms it covers.
  const bool live = a.balance && a.balance->live;
  for (Algo c : {Algo::kRecursiveDoubling, Algo::kHierarchical, Algo::kRabenseifner}) {
    if (live && c != Algo::kHierarchical) continue;
    const double us = predictAllReduceUs(a, c);
    if (us < bestUs) best = c, bestUs = us;
  }
  return best;
}

bool useTwoLevelGather(const CollArgs& a) {
  if (!a.nodes || a.nodes->nNodes() < 2 || !a.nodes->uniform() || a.nodes->maxPerNode() < 2)
    return false;
  if (a.algo == CollArgs::Algo::kHierarchical) return true;
  if (a.algo != CollArgs::Algo::kAuto) return false;
  const CostModel model = a.cost ? *a.cost : CostModel{};
  const double n = a.nranks, nodes = a.nodes->nNodes(), k = a.nodes->maxPerNode();
  const double out = static_cast<double>(a.count * a.elemSize) * n;  // all blocks
  const LinkModel &in = model.intra, &net = model.inter;
  // A node's link carries (n-1)/n of the blocks on the flat ring, (N-1)/N on
  // the two-level one, which adds a pass around the node.
  const double flat = (n - 1) * net.latencyUs + moveUs((n - 1) / n * out, net.bandwidthGBs);
  const double twoLevel = (nodes - 1) * net.latencyUs +
                          moveUs((nodes - 1) / nodes * out, net.bandwidthGBs) +
                          (k - 1) * in.latencyUs + moveUs((k - 1) / k * out, in.bandwidthGBs);
  return twoLevel < flat;
}

std::vector<CollArgs::Algo> algorithmCandidates(const CollArgs& a, double within) {
  using Algo = CollArgs::Algo;
  const bool multiNode = a.nodes && a.nodes->nNodes() > 1;
  if (a.coll == Collective::kAllGather || a.coll == Collective::kReduceScatter) {
    if (!multiNode || !a.nodes->uniform() || a.nodes->maxPerNode() < 2) return {Algo::kRing};
    if (useTwoLevelGather(a)) return {Algo::kHierarchical, Algo::kRing};
    return {Algo::kRing, Algo::kHierarchical};
  }
  if (a.coll != Collective::kAllReduce) return {};
  const Algo chosen = chooseAllReduce(a);
  std::vector<Algo> out{chosen};
  const double best = predictAllReduceUs(a, chosen);
  const bool live = a.balance && a.balance->live;
  for (Algo c : {Algo::kRing, Algo::kRabenseifner, Algo::kHierarchical, Algo::k2DRing,
                 Algo::kRecursiveDoubling}) {
    if (c == chosen || (live && c != Algo::kRing && c != Algo::kHierarchical)) continue;
    const double us = predictAllReduceUs(a, c);
    if (std::isfinite(us) && us <= within * best) out.push_back(c);
  }
  return out;
}

const char* algoName(CollArgs::Algo algo) {
  switch (algo) {
    case CollArgs::Algo::kAuto:
      return "auto";
    case CollArgs::Algo::kRing:
      return "ring";
    case CollArgs::Algo::kRecursiveDoubling:
      return "recursive-doubling";
    case CollArgs::Algo::k2DRing:
      return "2d-ring";
    case CollArgs::Algo::kHierarchical:
      return "hierarchical";
    case CollArgs::Algo::kRabenseifner:
      return "rabenseifner";
  }
  return "?";
}

CollArgs::Algo parseAlgo(const std::string& value) {
  std::stringstream in(value);
  std::string item;
  while (std::getline(in, item, ',')) {
    std::string v;
    for (char ch : item)
      if (!std::isspace(static_cast<unsigned char>(ch)))
        v += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    if (v == "ring") return CollArgs::Algo::kRing;
    if (v == "tree") return CollArgs::Algo::kRecursiveDoubling;
    if (v == "2dring") return CollArgs::Algo::k2DRing;
    if (v == "hierarchical") return CollArgs::Algo::kHierarchical;
    if (v == "rabenseifner") return CollArgs::Algo::kRabenseifner;
  }
  return CollArgs::Algo::kAuto;
}

}  // namespace tutti::algo
