// Schedules checked by value without transports: every rank's schedule runs
// in one interpreter that executes enabled steps in a random order (many
// seeds), snapshotting a send's source only when it runs. A generator that
// breaks a hazard rule (a receive overwriting data a pending send still
// reads, a missing `after`) then gives wrong values for some order, and one
// that never matches a message is reported as stuck.
#include "algo/schedule.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <random>
#include <tuple>

#include "algo/balance.h"
#include "algo/cost_model.h"
#include "backends/cpu/kernels.h"

namespace tutti::algo {
namespace {

// One rank's memory. `sendAt`/`recvAt` point into `mem` where NCCL's layout
// puts them: disjoint, or aliased the way in-place calls alias them.
struct RankState {
  Schedule s;
  std::vector<uint8_t> mem, scratch;
  uint8_t* sendAt = nullptr;
  uint8_t* recvAt = nullptr;
  std::vector<bool> sent, recvd;
  // Separate buffers, or (inPlace) one buffer of max(sendBytes, recvBytes)
  // with the smaller of the two at byte `shift` of it.
  void layout(size_t sendBytes, size_t recvBytes, bool inPlace, size_t shift) {
    if (!inPlace) {
      mem.assign(sendBytes + recvBytes, 0xEE);
      sendAt = mem.data();
      recvAt = mem.data() + sendBytes;
      return;
    }
    mem.assign(std::max(sendBytes, recvBytes), 0xEE);
    sendAt = mem.data() + (sendBytes < recvBytes ? shift : 0);
    recvAt = mem.data() + (recvBytes < sendBytes ? shift : 0);
  }
  uint8_t* at(Ref ref) {
    switch (ref.buf) {
      case Buf::kSend:
        return sendAt + ref.off;
      case Buf::kRecv:
        return recvAt + ref.off;
      case Buf::kScratch:
        return scratch.data() + ref.off;
      default:
        return nullptr;
    }
  }
};

// Runs the schedules of every rank; returns false (with a message) when stuck.
bool interpret(std::vector<RankState>& ranks, uint32_t seed, std::string* why) {
  std::mt19937 rng(seed);
  std::map<std::tuple<int, int, uint64_t>, std::vector<uint8_t>> wire;  // (from, to, tag)
  for (auto& st : ranks)
    for (const LocalStep& l : st.s.local) {
      uint8_t* dst = st.at(l.dst);
      const uint8_t* src = st.at(l.src);
      const size_t es = dataTypeSize(st.s.spec.dt);
      if (l.kind == LocalKind::kCopy) memmove(dst, src, l.bytes);
      if (l.kind == LocalKind::kScale)
        cpu::scale(dst, src, l.bytes / es, st.s.spec.dt, st.s.spec.scalar);
      if (l.kind == LocalKind::kDivide)
        cpu::divide(dst, src, l.bytes / es, st.s.spec.dt, st.s.spec.divisor);
    }
  for (;;) {
    // Enabled steps: (rank, isRecv, index).
    std::vector<std::tuple<int, bool, size_t>> enabled;
    size_t pending = 0;
    for (int r = 0; r < static_cast<int>(ranks.size()); ++r) {
      RankState& st = ranks[r];
      for (size_t i = 0; i < st.s.sends.size(); ++i) {
        if (st.sent[i]) continue;
        ++pending;
        const int32_t w = st.s.sends[i].waitRecv;
        if (w < 0 || st.recvd[w]) enabled.emplace_back(r, false, i);
      }
      for (size_t i = 0; i < st.s.recvs.size(); ++i) {
        if (st.recvd[i]) continue;
        ++pending;
        const RecvStep& rs = st.s.recvs[i];
        if (rs.after >= 0 && !st.recvd[rs.after]) continue;
        if (wire.count({rs.peer, r, rs.tag})) enabled.emplace_back(r, true, i);
      }
    }
    if (pending == 0) return true;
    if (enabled.empty()) {
      for (int r = 0; r < static_cast<int>(ranks.size()) && why->empty(); ++r)
        for (size_t i = 0; i < ranks[r].s.recvs.size(); ++i)
          if (!ranks[r].recvd[i]) {
            *why = "rank " + std::to_string(r) + " waits for tag " +
                   std::to_string(ranks[r].s.recvs[i].tag) + " from " +
                   std::to_string(ranks[r].s.recvs[i].peer);
            break;
          }
      return false;
    }
    auto [r, isRecv, i] = enabled[rng() % enabled.size()];
    RankState& st = ranks[r];
    if (!isRecv) {
      const SendStep& sd = st.s.sends[i];
      const uint8_t* src = st.at(sd.src);
      auto key = std::make_tuple(r, sd.peer, sd.tag);
      if (wire.count(key)) {
        *why = "duplicate tag " + std::to_string(sd.tag) + " from " + std::to_string(r);
        return false;
      }
      wire[key].assign(src, src + sd.bytes);
      st.sent[i] = true;
    } else {
      const RecvStep& rs = st.s.recvs[i];
      auto node = wire.extract({rs.peer, r, rs.tag});
      std::vector<uint8_t>& in = node.mapped();
      if (in.size() != rs.bytes) {
        *why = "size mismatch on tag " + std::to_string(rs.tag);
        return false;
      }
      uint8_t* dst = st.at(rs.dst);
      const ReduceSpec& spec = st.s.spec;
      const size_t es = dataTypeSize(spec.dt), count = rs.bytes / es;
      if (rs.action == RecvAction::kCopy) {
        memcpy(dst, in.data(), rs.bytes);
      } else if (spec.op == RedOp::kPreMulSum) {
        cpu::preMulReduce(dst, in.data(), st.at(rs.local), count, spec.dt, spec.scalar);
      } else {
        cpu::reduce(dst, in.data(), st.at(rs.local), count, spec.dt, spec.op);
      }
      if (rs.finalize) cpu::divide(dst, dst, count, spec.dt, spec.divisor);
      st.recvd[i] = true;
    }
  }
}

struct Layout {
  std::vector<int> perNode;  // ranks per node, nodes listed in rank order...
  bool interleaved = false;  // ...or ranks dealt round-robin over the nodes
};

NodeMap mapOf(const Layout& l) {
  std::vector<uint64_t> host;
  if (!l.interleaved) {
    for (size_t nd = 0; nd < l.perNode.size(); ++nd)
      for (int i = 0; i < l.perNode[nd]; ++i) host.push_back(nd);
  } else {
    std::vector<int> left = l.perNode;
    for (bool any = true; any;) {
      any = false;
      for (size_t nd = 0; nd < left.size(); ++nd)
        if (left[nd]-- > 0) host.push_back(nd), any = true;
    }
  }
  return NodeMap::fromHostIds(host);
}

// One rank's arguments for an int32 collective over the layout `nm`.
CollArgs int32Args(Collective coll, int r, const NodeMap& nm, size_t count, RedOp op,
                   int64_t divisor, bool inPlace, size_t chunk, CollArgs::Algo algo) {
  CollArgs a;
  a.coll = coll;
  a.rank = r;
  a.nranks = static_cast<int>(nm.nodeOf.size());
  a.count = count;
  a.elemSize = 4;
  a.spec.dt = DataType::kInt32;
  a.spec.op = op;
  a.spec.divisor = divisor;
  a.spec.scalar = 2.0;
  a.inPlace = inPlace;
  a.chunkBytes = chunk;
  a.rdMaxBytes = 64 << 10;
  a.algo = algo;
  a.nodes = &nm;
  return a;
}

// Generates rank a.rank's schedule and memory (see RankState::layout); send
// element i holds (rank+1)*1000 + i % 997.
void prepare(RankState* st, const CollArgs& a, size_t sendBytes, size_t recvBytes, size_t shift) {
  st->s = makeSchedule(a);
  st->layout(sendBytes, recvBytes, a.inPlace, shift);
  st->scratch.resize(st->s.scratchBytes);
  st->sent.assign(st->s.sends.size(), false);
  st->recvd.assign(st->s.recvs.size(), false);
  auto* v = reinterpret_cast<int32_t*>(st->sendAt);
  for (size_t i = 0; i < sendBytes / 4; ++i)
    v[i] = (a.rank + 1) * 1000 + static_cast<int32_t>(i % 997);
}

// All-reduce of int32 data, value of element i on rank r = (r+1)*1000 + i % 997
// (exact in int32 for these rank counts), checked on every rank.
// `balance`: balanced shares (algo/balance.h).
void checkAllReduce(const Layout& layout, CollArgs::Algo algo, size_t count, RedOp op,
                    int64_t divisor, bool inPlace, size_t chunk, const Balance* balance = nullptr) {
  const NodeMap nm = mapOf(layout);
  const int n = static_cast<int>(nm.nodeOf.size());
  SCOPED_TRACE(testing::Message() << "ranks " << n << " nodes " << nm.nNodes() << " algo "
                                  << algoName(algo) << " count " << count << " inPlace "
                                  << inPlace << " chunk " << chunk << " divisor " << divisor);
  for (uint32_t seed = 1; seed <= 3; ++seed) {
    std::vector<RankState> ranks(n);
    for (int r = 0; r < n; ++r) {
      RankState& st = ranks[r];
      CollArgs a =
          int32Args(Collective::kAllReduce, r, nm, count, op, divisor, inPlace, chunk, algo);
      a.balance = balance;
      prepare(&st, a, count * 4, count * 4, 0);
      // (two-level algorithms on one node run as the ring)
      if (algo != CollArgs::Algo::kAuto &&
          (nm.nNodes() > 1 ||
           (algo != CollArgs::Algo::kHierarchical && algo != CollArgs::Algo::k2DRing))) {
        const bool balanced =
            balance && (algo == CollArgs::Algo::kRing ? !balance->ranks.empty()
                                                      : (algo == CollArgs::Algo::kHierarchical ||
                                                         algo == CollArgs::Algo::k2DRing) &&
                                                            !balance->nodes.empty());
        EXPECT_EQ(st.s.algorithm, (balanced ? "balanced " : "") + std::string(algoName(algo)));
      }
    }
    std::string why;
    ASSERT_TRUE(interpret(ranks, seed, &why)) << why;
    for (int r = 0; r < n; ++r) {
      const auto* got = reinterpret_cast<const int32_t*>(ranks[r].recvAt);
      for (size_t i = 0; i < count; ++i) {
        int64_t sum = 0;
        for (int q = 0; q < n; ++q) sum += (q + 1) * 1000 + static_cast<int64_t>(i % 997);
        if (op == RedOp::kPreMulSum) sum *= 2;
        if (divisor > 1) sum /= divisor;
        ASSERT_EQ(got[i], sum) << "rank " << r << " element " << i << " seed " << seed;
      }
    }
  }
}

using Algo = CollArgs::Algo;

TEST(TwoLevelAllReduce, EveryLayoutAndSize) {
  const std::vector<Layout> layouts = {
      {{2, 2}},    {{2, 2, 2}}, {{1, 2, 3}}, {{3, 2, 1}}, {{1, 1}},
      {{4, 1}},    {{1, 1, 1}}, {{3, 3}, true}, {{2, 1, 2}, true}, {{5, 3}},
  };
  for (const Layout& l : layouts)
    for (Algo algo : {Algo::kHierarchical, Algo::k2DRing, Algo::kRing, Algo::kRecursiveDoubling,
                      Algo::kRabenseifner})
      for (size_t count : {size_t{1}, size_t{5}, size_t{37}, size_t{1000}})
        for (bool inPlace : {false, true}) checkAllReduce(l, algo, count, RedOp::kSum, 0, inPlace, 64);
}

// Rabenseifner's all-reduce on one node and across nodes: powers of two and
// the ranks past them (folded in and out), blocks thinner than a slice and
// empty ones (count < ranks), in place and out of place.
TEST(RabenseifnerAllReduce, EveryRankCountAndSize) {
  for (int n = 2; n <= 9; ++n)
    for (size_t count : {size_t{1}, size_t{5}, size_t{37}, size_t{1000}})
      for (bool inPlace : {false, true})
        checkAllReduce({{n}}, Algo::kRabenseifner, count, RedOp::kSum, 0, inPlace, 64);
  checkAllReduce({{2, 2, 2}}, Algo::kRabenseifner, 1000, RedOp::kSum, 0, false, 64);
  checkAllReduce({{1, 2, 3}}, Algo::kRabenseifner, 1001, RedOp::kSum, 0, true, 1 << 20);
  checkAllReduce({{16}}, Algo::kRabenseifner, 4099, RedOp::kSum, 0, true, 256);
  checkAllReduce({{13}}, Algo::kRabenseifner, 4099, RedOp::kSum, 0, false, 256);
}

TEST(RabenseifnerAllReduce, AverageAndPreMulSum) {
  checkAllReduce({{6}}, Algo::kRabenseifner, 101, RedOp::kSum, 6, false, 32);
  checkAllReduce({{8}}, Algo::kRabenseifner, 101, RedOp::kSum, 8, true, 32);
  checkAllReduce({{4}}, Algo::kRabenseifner, 64, RedOp::kPreMulSum, 0, true, 16);
  checkAllReduce({{5}}, Algo::kRabenseifner, 17, RedOp::kPreMulSum, 0, false, 1 << 20);
}

// The balanced ring (algo/balance.h): segments sized by weights, some of
// them empty (every other rank owning nothing, one rank owning everything),
// at every rank count from 2 to 7, counts below and above the rank count,
// slices thinner than a segment; average and premulsum too.
TEST(BalancedRing, ExactForAnyWeights) {
  std::mt19937 rng(7);
  for (int n = 2; n <= 7; ++n) {
    std::vector<std::vector<uint32_t>> plans;
    std::vector<uint32_t> all(n, 0), alternate(n, 0), random(n);
    all[n / 2] = kWeightTotal;
    plans.push_back(all);
    for (int i = 0; i < n; i += 2) alternate[i] = 1;
    uint32_t sum = 0;
    for (int i = 0; i < n; ++i) sum += alternate[i];
    for (auto& w : alternate) w *= kWeightTotal / sum;
    alternate[0] += kWeightTotal - kWeightTotal / sum * sum;
    plans.push_back(alternate);
    std::vector<double> shares(n);
    for (double& x : shares) x = std::uniform_real_distribution<double>(0, 1)(rng);
    double total = 0;
    for (double x : shares) total += x;
    for (double& x : shares) x /= total;
    plans.push_back(toWeights(shares));
    std::vector<Balance> b(plans.size());
    for (size_t i = 0; i < plans.size(); ++i) b[i].ranks = plans[i];
    for (const Balance& w : b)
      for (size_t count : {size_t{1}, size_t{5}, size_t{37}, size_t{1001}})
        for (bool inPlace : {false, true})
          checkAllReduce({{n}}, Algo::kRing, count, RedOp::kSum, 0, inPlace, 64, &w);
    checkAllReduce({std::vector<int>(n, 1)}, Algo::kRing, 999, RedOp::kSum, n, false, 32, &b[2]);
    checkAllReduce({{n}}, Algo::kRing, 101, RedOp::kPreMulSum, 0, true, 16, &b[0]);
  }
}

// Each link of a balanced ring carries (2 - s_u - s_next) of the vector (the
// model balanceShares optimises): counted from the schedules' sends.
TEST(BalancedRing, LinkTrafficFollowsTheShares) {
  const int n = 5;
  const size_t count = 1 << 16;
  const std::vector<double> shares = {0.05, 0.1, 0.6, 0.25, 0.0};
  Balance b;
  b.ranks = toWeights(shares);
  const NodeMap nm = mapOf({std::vector<int>(n, 1)});
  for (int r = 0; r < n; ++r) {
    CollArgs a =
        int32Args(Collective::kAllReduce, r, nm, count, RedOp::kSum, 0, false, 4096, Algo::kRing);
    a.balance = &b;
    const Schedule s = makeSchedule(a);
    size_t bytes = 0;
    for (const SendStep& st : s.sends) {
      EXPECT_EQ(st.peer, (r + 1) % n);
      bytes += st.bytes;
    }
    const double expect = (2 - shares[r] - shares[(r + 1) % n]) * count * 4;
    EXPECT_NEAR(static_cast<double>(bytes), expect, 8.0) << "link " << r << " -> " << (r + 1) % n;
  }
}

// The two-level algorithms balanced: piece y of every segment sized by node
// y's weight (one node owning everything, one owning nothing, random), on
// equal and unequal nodes, ranks numbered node by node and round-robin.
TEST(BalancedTwoLevel, ExactForAnyNodeWeights) {
  std::mt19937 rng(5);
  const std::vector<Layout> layouts = {{{2, 2, 2}}, {{1, 2, 3}}, {{3, 3}, true}, {{2, 1, 2}, true}};
  for (const Layout& l : layouts) {
    const int nodes = static_cast<int>(l.perNode.size());
    std::vector<Balance> plans(3);
    plans[0].nodes.assign(nodes, 0);
    plans[0].nodes[nodes - 1] = kWeightTotal;
    std::vector<double> s(nodes);
    for (double& x : s) x = std::uniform_real_distribution<double>(0, 1)(rng);
    s[0] = 0;
    double t = 0;
    for (double x : s) t += x;
    for (double& x : s) x /= t;
    plans[1].nodes = toWeights(s);
    plans[2].nodes = plans[1].nodes;
    plans[2].ranks.assign(mapOf(l).nodeOf.size(), kWeightTotal / 4);  // unused by two-level
    for (const Balance& b : plans)
      for (Algo algo : {Algo::kHierarchical, Algo::k2DRing})
        for (size_t count : {size_t{1}, size_t{37}, size_t{1000}})
          for (bool inPlace : {false, true})
            checkAllReduce(l, algo, count, RedOp::kSum, 0, inPlace, 64, &b);
    checkAllReduce(l, Algo::kHierarchical, 101, RedOp::kSum, 6, false, 32, &plans[1]);
    checkAllReduce(l, Algo::k2DRing, 64, RedOp::kPreMulSum, 0, true, 16, &plans[0]);
  }
}

TEST(TwoLevelAllReduce, AverageAndPreMulSum) {
  for (Algo algo : {Algo::kHierarchical, Algo::k2DRing}) {
    checkAllReduce({{1, 2, 3}}, algo, 101, RedOp::kSum, 6, false, 32);
    checkAllReduce({{2, 2}}, algo, 64, RedOp::kPreMulSum, 0, true, 16);
    checkAllReduce({{3, 1}}, algo, 17, RedOp::kPreMulSum, 0, false, 1 << 20);
  }
}

// All-gather and reduce-scatter of int32 blocks of `count` elements; rank q's
// send element i is (q+1)*1000 + i % 997. Checked on every rank.
void checkGather(const Layout& layout, Collective coll, CollArgs::Algo algo, size_t count,
                 RedOp op, int64_t divisor, bool inPlace, const char* expectAlgo) {
  const NodeMap nm = mapOf(layout);
  const int n = static_cast<int>(nm.nodeOf.size());
  const bool rs = coll == Collective::kReduceScatter;
  const size_t blk = count * 4, sendBytes = rs ? blk * n : blk, recvBytes = rs ? blk : blk * n;
  SCOPED_TRACE(testing::Message() << (rs ? "reduce-scatter" : "all-gather") << " ranks " << n
                                  << " nodes " << nm.nNodes() << " count " << count
                                  << " inPlace " << inPlace);
  for (uint32_t seed = 1; seed <= 3; ++seed) {
    std::vector<RankState> ranks(n);
    for (int r = 0; r < n; ++r) {
      prepare(&ranks[r], int32Args(coll, r, nm, count, op, divisor, inPlace, 64, algo), sendBytes,
              recvBytes, r * blk);
      EXPECT_EQ(ranks[r].s.algorithm, expectAlgo);
    }
    std::string why;
    ASSERT_TRUE(interpret(ranks, seed, &why)) << why;
    for (int r = 0; r < n; ++r) {
      const auto* got = reinterpret_cast<const int32_t*>(ranks[r].recvAt);
      for (size_t e = 0; e < recvBytes / 4; ++e) {
        int64_t want;
        if (rs) {
          const size_t i = r * count + e;
          want = 0;
          for (int q = 0; q < n; ++q) want += (q + 1) * 1000 + static_cast<int64_t>(i % 997);
          if (op == RedOp::kPreMulSum) want *= 2;
          if (divisor > 1) want /= divisor;
        } else {
          const int q = static_cast<int>(e / count);
          want = (q + 1) * 1000 + static_cast<int64_t>((e % count) % 997);
        }
        ASSERT_EQ(got[e], want) << "rank " << r << " element " << e << " seed " << seed;
      }
    }
  }
}

TEST(TwoLevelGather, UniformLayoutsAndFallbacks) {
  for (Collective coll : {Collective::kAllGather, Collective::kReduceScatter})
    for (size_t count : {size_t{1}, size_t{7}, size_t{40}})
      for (bool inPlace : {false, true}) {
        checkGather({{2, 2}}, coll, Algo::kAuto, count, RedOp::kSum, 0, inPlace, "hierarchical");
        checkGather({{3, 3, 3}}, coll, Algo::kHierarchical, count, RedOp::kSum, 0, inPlace,
                    "hierarchical");
        checkGather({{2, 2, 2}, true}, coll, Algo::kAuto, count, RedOp::kSum, 0, inPlace,
                    "hierarchical");
        checkGather({{1, 2, 3}}, coll, Algo::kHierarchical, count, RedOp::kSum, 0, inPlace, "ring");
        checkGather({{2, 2}}, coll, Algo::kRing, count, RedOp::kSum, 0, inPlace, "ring");
        checkGather({{1, 1, 1}}, coll, Algo::kAuto, count, RedOp::kSum, 0, inPlace, "ring");
      }
  checkGather({{2, 2}}, Collective::kReduceScatter, Algo::kAuto, 9, RedOp::kPreMulSum, 0, false,
              "hierarchical");
  checkGather({{3, 3}}, Collective::kReduceScatter, Algo::kAuto, 9, RedOp::kSum, 6, true,
              "hierarchical");
}

TEST(TwoLevelAllReduce, OneNodeFallsBackToRing) {
  const NodeMap nm = NodeMap::singleNode(3);
  CollArgs a;
  a.coll = Collective::kAllReduce;
  a.rank = 0;
  a.nranks = 3;
  a.count = 1 << 20;
  a.elemSize = 4;
  a.nodes = &nm;
  a.algo = Algo::kHierarchical;
  EXPECT_EQ(chooseAllReduce(a), Algo::kRing);
  checkAllReduce({{3}}, Algo::kHierarchical, 50, RedOp::kSum, 0, false, 64);
}

// Rings keep a node's ranks adjacent. Ranks dealt round-robin over two nodes
// give the ring order 0 2 4 1 3 5, whose only node crossings are 4->1 and
// 5->0. An all-gather block travels the 5 ring edges that do not lead back
// into its origin, so it crosses twice, except the blocks of ranks 1 and 0
// (whose skipped edge is a crossing): 6 x 2 - 2 = 10 crossings in all, where
// the rank-order ring would cross on every one of its 30 hops.
TEST(RingOrder, NodeRanksAdjacent) {
  const NodeMap nm = mapOf({{3, 3}, true});  // ranks 0,2,4 on node 0; 1,3,5 on node 1
  int crossing = 0;
  for (int r = 0; r < 6; ++r) {
    CollArgs a;
    a.coll = Collective::kAllGather;
    a.rank = r;
    a.nranks = 6;
    a.count = 8;
    a.elemSize = 4;
    a.nodes = &nm;
    a.algo = Algo::kRing;  // (auto would take the two-level all-gather here)
    Schedule s = makeSchedule(a);
    for (const SendStep& sd : s.sends) crossing += nm.nodeOf[sd.peer] != nm.nodeOf[r];
  }
  EXPECT_EQ(crossing, 10);
}

TEST(CostModel, PicksHierarchicalForLargeMultiNode) {
  const NodeMap nm = mapOf({{2, 2}});
  CostModel cm;
  cm.intra = {1.0, 5.0};
  cm.inter = {30.0, 0.125};
  CollArgs a;
  a.coll = Collective::kAllReduce;
  a.rank = 0;
  a.nranks = 4;
  a.elemSize = 4;
  a.rdMaxBytes = 64 << 10;
  a.nodes = &nm;
  a.cost = &cm;
  a.count = 16 << 20;
  EXPECT_EQ(chooseAllReduce(a), Algo::kHierarchical);
  // Ring moves 1.5x the bytes of hierarchical over the network here.
  EXPECT_NEAR(predictAllReduceUs(a, Algo::kRing) / predictAllReduceUs(a, Algo::kHierarchical), 1.5,
              0.05);
  a.count = 2;
  EXPECT_EQ(chooseAllReduce(a), Algo::kRecursiveDoubling);
  const NodeMap one = NodeMap::singleNode(4);
  a.nodes = &one;
  a.count = 1 << 20;
  // One node: Rabenseifner's for powers of two from 4 ranks over sockets,
  // from 8 over shared memory; the ring otherwise.
  EXPECT_EQ(chooseAllReduce(a), Algo::kRabenseifner);
  a.sharedMemory = true;
  EXPECT_EQ(chooseAllReduce(a), Algo::kRing);
  const NodeMap eight = NodeMap::singleNode(8);
  a.nodes = &eight;
  a.nranks = 8;
  EXPECT_EQ(chooseAllReduce(a), Algo::kRabenseifner);
  for (int n : {2, 3, 6}) {
    const NodeMap m = NodeMap::singleNode(n);
    a.nodes = &m;
    a.nranks = n;
    for (bool shm : {false, true}) {
      a.sharedMemory = shm;
      EXPECT_EQ(chooseAllReduce(a), Algo::kRing) << n << " ranks, shm " << shm;
    }
  }
}

TEST(CostModel, ParseAlgo) {
  EXPECT_EQ(parseAlgo("ring"), Algo::kRing);
  EXPECT_EQ(parseAlgo("Tree"), Algo::kRecursiveDoubling);
  EXPECT_EQ(parseAlgo("2dring"), Algo::k2DRing);
  EXPECT_EQ(parseAlgo("Rabenseifner"), Algo::kRabenseifner);
  EXPECT_EQ(parseAlgo("HIERARCHICAL"), Algo::kHierarchical);
  EXPECT_EQ(parseAlgo("collnet,ring"), Algo::kRing);
  EXPECT_EQ(parseAlgo("nvls"), Algo::kAuto);
  EXPECT_EQ(parseAlgo(""), Algo::kAuto);
}

TEST(NodeMap, FromHostIds) {
  NodeMap m = NodeMap::fromHostIds({7, 9, 7, 5, 9});
  ASSERT_EQ(m.nNodes(), 3);
  EXPECT_EQ(m.nodes[0], (std::vector<int>{0, 2}));
  EXPECT_EQ(m.nodes[1], (std::vector<int>{1, 4}));
  EXPECT_EQ(m.nodes[2], (std::vector<int>{3}));
  EXPECT_EQ(m.localOf, (std::vector<int>{0, 0, 1, 0, 1}));
  EXPECT_EQ(m.maxPerNode(), 2);
  EXPECT_FALSE(m.uniform());
}

}  // namespace
}  // namespace tutti::algo
