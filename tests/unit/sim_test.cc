// tutti-sim's engine (bench/sim): predicted times against closed forms of
// the model, deadlock and mismatch reports on hand-made schedules, and every
// generator's schedules for small rank counts simulated to completion (a
// consistency check of src/algo).
#include "bench/sim/sim.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

namespace tutti::sim {
namespace {

using algo::Buf;
using algo::CollArgs;
using algo::Collective;
using algo::RecvAction;
using algo::Schedule;

// Latency-free links: times are pure bandwidth.
SimConfig bandwidthOnly(double intraGBs, double interGBs) {
  SimConfig c;
  c.cost.intra = {0.0, intraGBs};
  c.cost.inter = {0.0, interGBs};
  return c;
}

CollArgs args(Collective coll, int n, size_t count, size_t chunk,
              CollArgs::Algo algo = CollArgs::Algo::kRing, const algo::NodeMap* nodes = nullptr) {
  CollArgs a{};
  a.coll = coll;
  a.nranks = n;
  a.count = count;
  a.elemSize = 4;
  a.chunkBytes = chunk;
  a.rdMaxBytes = 64 << 10;
  a.algo = algo;
  a.nodes = nodes;
  return a;
}

// Ring all-reduce on one node, latency 0: every rank's send port must carry
// 2(n-1)/n * S bytes, so T >= 2(n-1)/n * S / B (a hard lower bound of the
// model). The ring keeps every port busy except while the pipeline fills and
// drains, about n chunk-times: n * c / B against 2(n-1)/n * S / B is at most
// 8 * 64K / (1.75 * 64M) = 0.5% here, so 2% is a safe upper tolerance.
TEST(Sim, RingAllReduceOneNodeIsBandwidthBound) {
  const double B = 10.0;  // GB/s
  const size_t S = size_t{64} << 20;
  for (int n : {2, 3, 5, 8}) {
    SCOPED_TRACE(n);
    auto r = simulate(args(Collective::kAllReduce, n, S / 4, 64 << 10), bandwidthOnly(B, 1.0));
    ASSERT_TRUE(r) << r.status().message();
    const double expect = 2.0 * (n - 1) / n * static_cast<double>(S) / (B * 1e3);
    EXPECT_GE(r->timeUs, expect * (1 - 1e-9));
    EXPECT_LE(r->timeUs, expect * 1.02);
    EXPECT_NEAR(r->busBwGBs, B, B * 0.02);
    EXPECT_EQ(r->sizeBytes, S);
    EXPECT_EQ(r->interNodeBytes, 0u);
    EXPECT_EQ(r->algorithm, "ring");
  }
}

// Two nodes, one rank each, ring all-reduce over a slow network. Each rank
// sends S/2 of reduce-scatter slices (ready at once) and then S/2 of
// all-gather slices, each ready when the peer's matching slice arrives, i.e.
// at latency + (j+1) c / B, long before the uplink gets to it. So each uplink
// is busy without a gap for S/B and the last slice lands one latency later:
// T = S / B_inter + lat_inter exactly (as long as lat + c/B <= S/(2B)).
TEST(Sim, TwoNodesOneRankEachIsNetworkBound) {
  const size_t S = size_t{16} << 20;
  const algo::NodeMap nodes = makeNodeMap({1, 1});
  SimConfig cfg;
  cfg.cost.intra = {1.0, 100.0};
  cfg.cost.inter = {50.0, 1.0};  // 50 us, 1 GB/s (8 Gbit/s)
  auto r = simulate(
      args(Collective::kAllReduce, 2, S / 4, 256 << 10, CollArgs::Algo::kRing, &nodes), cfg);
  ASSERT_TRUE(r) << r.status().message();
  const double expect = static_cast<double>(S) / 1e3 + 50.0;
  EXPECT_NEAR(r->timeUs, expect, expect * 1e-9);
  EXPECT_EQ(r->interNodeBytes, 2 * S);  // each rank sends S/2 twice
  EXPECT_EQ(r->messageBytes, 2 * S);
}

// 2 nodes x 4 ranks, ring: the ring crosses nodes at 3->4 and 7->0, and each
// of those ranks sends 2(n-1)/n * S over its node's uplink. Intra links are
// 100x faster, so T is that volume over B_inter plus a pipeline tail (as
// above, < 1% with 64 KiB chunks).
TEST(Sim, TwoNodesRingIsBoundByTheUplink) {
  const size_t S = size_t{32} << 20;
  const algo::NodeMap nodes = makeNodeMap({4, 4});
  auto r = simulate(args(Collective::kAllReduce, 8, S / 4, 64 << 10, CollArgs::Algo::kRing, &nodes),
                    bandwidthOnly(100.0, 1.0));
  ASSERT_TRUE(r) << r.status().message();
  const double expect = 2.0 * 7 / 8 * static_cast<double>(S) / 1e3;
  EXPECT_GE(r->timeUs, expect * (1 - 1e-9));
  EXPECT_LE(r->timeUs, expect * 1.02);
  EXPECT_EQ(r->interNodeBytes, 2 * (2 * 7 * (S / 8)));
}

// The NIC is shared by a node's ranks: four ranks on node 1 gathering to rank
// 0 on node 0 push 4 blocks through one uplink and one downlink, FIFO:
// T = 4 b / B + lat (one rank alone would take b / B + lat).
TEST(Sim, NodeUplinkIsSharedByItsRanks) {
  const size_t b = size_t{1} << 20;
  const algo::NodeMap nodes = makeNodeMap({1, 4});
  SimConfig cfg;
  cfg.cost.intra = {1.0, 100.0};
  cfg.cost.inter = {20.0, 2.0};
  CollArgs a = args(Collective::kGather, 5, b / 4, 128 << 10, CollArgs::Algo::kAuto, &nodes);
  auto r = simulate(a, cfg);
  ASSERT_TRUE(r) << r.status().message();
  const double expect = 4.0 * static_cast<double>(b) / 2e3 + 20.0;
  EXPECT_NEAR(r->timeUs, expect, expect * 1e-9);
  EXPECT_EQ(r->interNodeBytes, 4 * b);
}

// Recursive doubling on 8 ranks, one slice: three exchange steps, each a
// message of S between disjoint pairs (no port is shared), each starting when
// the previous one has arrived: T = 3 (lat + S/B) exactly. With 5 ranks the
// extra rank adds a fold-in before and a hand-back after, but those overlap
// the steps of the other pairs; the critical path is 3 hops, plus at most one
// more S/B where rank 0's receive port takes the fold-in and step 0 at once.
TEST(Sim, RecursiveDoublingIsLatencyBound) {
  const size_t S = 4096;
  SimConfig cfg;
  cfg.cost.intra = {5.0, 2.0};
  const double hop = 5.0 + S / 2e3;
  auto r8 = simulate(
      args(Collective::kAllReduce, 8, S / 4, 64 << 10, CollArgs::Algo::kRecursiveDoubling), cfg);
  ASSERT_TRUE(r8) << r8.status().message();
  EXPECT_NEAR(r8->timeUs, 3 * hop, 1e-9);
  EXPECT_EQ(r8->algorithm, "recursive-doubling");
  auto r5 = simulate(args(Collective::kAllReduce, 5, S / 4, 64 << 10, CollArgs::Algo::kAuto), cfg);
  ASSERT_TRUE(r5) << r5.status().message();
  EXPECT_EQ(r5->algorithm, "recursive-doubling");  // 4 KiB <= rdMaxBytes
  EXPECT_GE(r5->timeUs, 3 * hop - 1e-9);
  EXPECT_LE(r5->timeUs, 3 * hop + S / 2e3 + 1e-9);
}

// Local steps run first on the rank's CPU at computeGBs: one rank's
// out-of-place all-reduce is one copy.
TEST(Sim, ComputeCostOfLocalSteps) {
  SimConfig cfg;
  cfg.computeGBs = 1.0;
  auto r = simulate(args(Collective::kAllReduce, 1, 1000, 512 << 10), cfg);
  ASSERT_TRUE(r) << r.status().message();
  EXPECT_NEAR(r->timeUs, 4.0, 1e-12);  // 4000 bytes at 1 GB/s
}

// ---- broken schedules ----------------------------------------------------------

algo::RecvStep recv(int peer, uint64_t tag, size_t bytes, int32_t after = -1) {
  algo::RecvStep r{peer, tag, bytes, RecvAction::kCopy, {Buf::kRecv, 0}, {}};
  r.after = after;
  return r;
}
algo::SendStep send(int peer, uint64_t tag, size_t bytes, int32_t waitRecv = -1) {
  return {peer, tag, {Buf::kSend, 0}, bytes, waitRecv};
}

std::string failure(const std::vector<Schedule>& s) {
  auto r = simulateSchedules(s, nullptr, SimConfig{});
  EXPECT_FALSE(r) << "expected an error";
  return r ? "" : r.status().message();
}

TEST(Sim, ReportsACycleOfSendsWaitingOnReceives) {
  // Each rank sends only after it has received from the other.
  std::vector<Schedule> s(2);
  for (int r = 0; r < 2; ++r) {
    s[r].recvs.push_back(recv(1 - r, 7, 64));
    s[r].sends.push_back(send(1 - r, 7, 64, 0));
  }
  std::string m = failure(s);
  EXPECT_NE(m.find("deadlock: 2 of 2 receives never complete"), std::string::npos) << m;
  EXPECT_NE(m.find("rank 0's receive from rank 1 (tag 0x7"), std::string::npos) << m;
  EXPECT_NE(m.find("rank 1 sends it after rank 1's receive from rank 0"), std::string::npos) << m;
  EXPECT_NE(m.find("a cycle"), std::string::npos) << m;
}

TEST(Sim, ReportsACycleThroughAfter) {
  // Rank 0 processes X (from 1) only after Y (from 2); rank 2 sends Y after
  // receiving Z from 0; rank 0 sends Z after X.
  std::vector<Schedule> s(3);
  s[0].recvs.push_back(recv(2, 2, 8));     // 0: Y
  s[0].recvs.push_back(recv(1, 1, 8, 0));  // 1: X, after Y
  s[0].sends.push_back(send(2, 3, 8, 1));  // Z after X
  s[1].sends.push_back(send(0, 1, 8));     // X
  s[2].recvs.push_back(recv(0, 3, 8));     // Z
  s[2].sends.push_back(send(0, 2, 8, 0));  // Y after Z
  std::string m = failure(s);
  EXPECT_NE(m.find("deadlock: 3 of 3 receives never complete"), std::string::npos) << m;
  EXPECT_NE(m.find("arrives but waits (after) for rank 0's receive from rank 2"), std::string::npos)
      << m;
  EXPECT_NE(m.find("a cycle"), std::string::npos) << m;
}

TEST(Sim, ReportsAReceiveWithoutASender) {
  std::vector<Schedule> s(2);
  s[1].recvs.push_back(recv(0, 5, 16));
  std::string m = failure(s);
  EXPECT_NE(m.find("rank 1's receive from rank 0 (tag 0x5"), std::string::npos) << m;
  EXPECT_NE(m.find("has no matching send"), std::string::npos) << m;
}

TEST(Sim, ReportsATagMismatch) {
  std::vector<Schedule> s(2);
  s[0].sends.push_back(send(1, 1, 16));
  s[1].recvs.push_back(recv(0, 2, 16));
  std::string m = failure(s);
  EXPECT_NE(m.find("2 problems"), std::string::npos) << m;
  EXPECT_NE(m.find("rank 0's send to rank 1 (tag 0x1"), std::string::npos) << m;
  EXPECT_NE(m.find("has no matching receive"), std::string::npos) << m;
  EXPECT_NE(m.find("rank 1's receive from rank 0 (tag 0x2"), std::string::npos) << m;
}

TEST(Sim, ReportsSizeMismatchDuplicatesAndBadIndexes) {
  {
    std::vector<Schedule> s(2);
    s[0].sends.push_back(send(1, 1, 16));
    s[1].recvs.push_back(recv(0, 1, 32));
    std::string m = failure(s);
    EXPECT_NE(m.find("expects 32 bytes; the send carries 16"), std::string::npos) << m;
  }
  {
    std::vector<Schedule> s(2);
    s[0].sends.push_back(send(1, 1, 16));
    s[0].sends.push_back(send(1, 1, 16));
    s[1].recvs.push_back(recv(0, 1, 16));
    std::string m = failure(s);
    EXPECT_NE(m.find("rank 0 has two sends to rank 1"), std::string::npos) << m;
  }
  {
    std::vector<Schedule> s(2);
    s[0].sends.push_back(send(1, 1, 16, 3));  // no receive 3
    s[1].recvs.push_back(recv(0, 1, 16));
    std::string m = failure(s);
    EXPECT_NE(m.find("waits on receive 3 of 0"), std::string::npos) << m;
  }
  {
    std::vector<Schedule> s(2);
    s[0].sends.push_back(send(5, 1, 16));  // no rank 5
    std::string m = failure(s);
    EXPECT_NE(m.find("names peer 5"), std::string::npos) << m;
  }
}

// schedule.h: `after` must name a receive from a different peer.
TEST(Sim, ReportsAfterOnTheSamePeer) {
  std::vector<Schedule> s(2);
  s[0].sends.push_back(send(1, 1, 16));
  s[0].sends.push_back(send(1, 2, 16));
  s[1].recvs.push_back(recv(0, 1, 16));
  s[1].recvs.push_back(recv(0, 2, 16, 0));
  std::string m = failure(s);
  EXPECT_NE(m.find("same peer"), std::string::npos) << m;
}

// ---- generator consistency -----------------------------------------------------

// Layouts for n ranks: one node (null map), two halves, nodes of 2, and a
// lone rank on node 0 with the rest on node 1.
std::vector<std::vector<int>> layoutsFor(int n) {
  std::vector<std::vector<int>> out{{n}};
  if (n >= 2) out.push_back({(n + 1) / 2, n / 2});
  if (n >= 3) {
    std::vector<int> twos(n / 2, 2);
    if (n % 2) twos.push_back(1);
    out.push_back(twos);
    out.push_back({1, n - 1});
  }
  return out;
}

// Every collective the generators make, for 1..9 ranks, empty / one element /
// odd sizes below and above rdMaxBytes, in and out of place, each root kind,
// every algorithm and several node layouts: each must simulate to completion
// (every send matched, every receive completes, no `after` on the same peer).
TEST(Sim, EveryGeneratedScheduleCompletes) {
  const Collective colls[] = {Collective::kAllReduce, Collective::kReduceScatter,
                              Collective::kAllGather, Collective::kBroadcast,
                              Collective::kReduce,    Collective::kAllToAll,
                              Collective::kGather,    Collective::kScatter};
  const CollArgs::Algo algos[] = {CollArgs::Algo::kAuto, CollArgs::Algo::kRing,
                                  CollArgs::Algo::kRecursiveDoubling, CollArgs::Algo::k2DRing,
                                  CollArgs::Algo::kHierarchical};
  const SimConfig cfg;  // defaults: latencies make ties rare, exercising ordering
  int runs = 0;
  for (int n = 1; n <= 9; ++n) {
    for (const auto& layout : layoutsFor(n)) {
      const algo::NodeMap nodes = makeNodeMap(layout);
      for (Collective coll : colls) {
        const bool rooted = coll == Collective::kBroadcast || coll == Collective::kReduce ||
                            coll == Collective::kGather || coll == Collective::kScatter;
        for (size_t count : {size_t{0}, size_t{1}, size_t{1001}, size_t{20001}}) {
          for (CollArgs::Algo al : algos) {
            // Only all-reduce has algorithm choices today; sweep the others
            // once per layout in each mode so the sweep stays fast.
            if (coll != Collective::kAllReduce && al != CollArgs::Algo::kAuto &&
                al != CollArgs::Algo::k2DRing && al != CollArgs::Algo::kHierarchical)
              continue;
            for (bool inPlace : {false, true}) {
              for (int root : {0, n - 1}) {
                if (!rooted && root != 0) continue;
                if (rooted && n == 1 && root != 0) continue;
                CollArgs a = args(coll, n, count, count > 2000 ? 16 << 10 : 1024, al,
                                  layout.size() > 1 ? &nodes : nullptr);
                a.inPlace = inPlace;
                a.root = root;
                auto r = simulate(a, cfg);
                ++runs;
                ASSERT_TRUE(r) << algo::collectiveName(coll) << " n=" << n
                               << " nodes=" << layout.size() << " count=" << count
                               << " algo=" << static_cast<int>(al) << " inPlace=" << inPlace
                               << " root=" << root << ": " << r.status().message();
                EXPECT_GE(r->timeUs, 0.0);
                if (count == 0 && n > 1) {
                  EXPECT_EQ(r->messages, 0u);
                }
              }
            }
          }
        }
      }
    }
  }
  EXPECT_GT(runs, 1000);
}

// A larger layout the generators are meant for (16 nodes x 8), each
// two-level algorithm: completes, and no faster than the network allows for
// the volume that must leave a node (the ring's boundary ranks).
TEST(Sim, SixteenNodesOfEight) {
  const algo::NodeMap nodes = makeNodeMap(std::vector<int>(16, 8));
  SimConfig cfg;
  cfg.cost.intra = {1.0, 20.0};
  cfg.cost.inter = {10.0, 3.125};  // 25 Gbit/s
  const size_t S = size_t{8} << 20;
  for (CollArgs::Algo al : {CollArgs::Algo::kRing, CollArgs::Algo::k2DRing,
                            CollArgs::Algo::kHierarchical, CollArgs::Algo::kAuto}) {
    auto r = simulate(args(Collective::kAllReduce, 128, S / 4, 512 << 10, al, &nodes), cfg);
    ASSERT_TRUE(r) << static_cast<int>(al) << ": " << r.status().message();
    // Every node must send at least 2(N-1)/N of S over its uplink (N nodes)
    // for every rank to end with the full sum: the all-reduce lower bound.
    const double floor = 2.0 * 15 / 16 * static_cast<double>(S) / 3.125e3;
    EXPECT_GE(r->timeUs, floor * (1 - 1e-9)) << static_cast<int>(al);
    EXPECT_GT(r->interNodeBytes, 0u);
  }
}

}  // namespace
}  // namespace tutti::sim
