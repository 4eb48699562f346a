// The balanced ring at init (Comm::planBalance, algo/balance.h): four ranks
// as threads over TCP, each a node of its own (TUTTI_TEST_NODES), on an
// emulated network (TUTTI_TEST_LINK_MBPS token buckets) that the link probe
// measures. A node whose links run at a quarter of the others' rate both
// ways gets (almost) the whole vector on every rank alike, and large ring
// all-reduces stay exact, with counts that leave segments empty or odd; an
// even network and TUTTI_BALANCE=0 keep equal segments.
#include "algo/balance.h"

#include <string>

#include "capi/handle.h"
#include "core/comm.h"
#include "harness.h"

namespace tutti::test {
namespace {

constexpr int kRanks = 4;

// A ring all-reduce of `count` int32 on rank r, checked element by element.
void allReduce(int r, ncclComm_t comm, size_t count, int round, bool inPlace) {
  std::vector<int32_t> in(count), out(count, -1);
  for (size_t i = 0; i < count; ++i) in[i] = static_cast<int32_t>(r * 1000 + round + i % 977);
  int32_t* dst = inPlace ? in.data() : out.data();
  ASSERT_EQ(ncclAllReduce(in.data(), dst, count, ncclInt32, ncclSum, comm, nullptr), ncclSuccess)
      << ncclGetLastError(comm);
  for (size_t i = 0; i < count; ++i)
    ASSERT_EQ(dst[i], static_cast<int32_t>(6000 + kRanks * (round + i % 977)))
        << "rank " << r << " element " << i;
}

std::vector<std::vector<uint32_t>> weightsAfterInit(const char* rates, const char* balance) {
  Env env({{"NCCL_SHM_DISABLE", "1"},
           {"TUTTI_TEST_NODES", "1,1,1,1"},
           {"NCCL_ALGO", "ring"},
           {"TUTTI_BALANCE", balance},
           {"TUTTI_TEST_LINK_MBPS", rates}});
  std::vector<std::vector<uint32_t>> weights(kRanks);
  runRanks(kRanks, [&](int r, ncclComm_t comm) {
    weights[r] = comm->impl()->balance().ranks;
    // One rank per node: the two-level algorithms' network ring is the ring.
    EXPECT_EQ(comm->impl()->balance().nodes, weights[r]) << "rank " << r;
    // Above algo::kBalanceMinBytes (1 MiB): balanced when there is a plan.
    int round = 0;
    for (size_t count : {size_t{(1 << 18) + 3}, size_t{(1 << 19) + 1}})
      for (bool inPlace : {false, true}) allReduce(r, comm, count, round++, inPlace);
    allReduce(r, comm, 1000, round++, false);  // below: the plain ring
  });
  return weights;
}

// Rank 2's links run at 2.5 MB/s both ways, the others at 10: the plan gives
// rank 2 at least 90% of the vector (the model's bound: it receives and
// sends the vector once), the same on every rank.
TEST(Balance, ASlowNodeOwnsTheVector) {
  const auto w = weightsAfterInit("*:*:10,2:*:2.5,*:2:2.5", "1");
  ASSERT_EQ(w[0].size(), size_t{kRanks}) << "no plan on rank 0";
  for (int r = 1; r < kRanks; ++r) EXPECT_EQ(w[r], w[0]) << "rank " << r;
  EXPECT_GT(w[0][2], algo::kWeightTotal * 9 / 10);
}

// Every link at one rate: equal segments, no plan.
TEST(Balance, AnEvenNetworkKeepsEqualSegments) {
  const auto w = weightsAfterInit("*:*:10", "1");
  for (int r = 0; r < kRanks; ++r) EXPECT_TRUE(w[r].empty()) << "rank " << r;
}

// TUTTI_BALANCE=0: the static ring, slow node or not.
TEST(Balance, OffKeepsEqualSegments) {
  const auto w = weightsAfterInit("*:*:10,2:*:2.5,*:2:2.5", "0");
  for (int r = 0; r < kRanks; ++r) EXPECT_TRUE(w[r].empty()) << "rank " << r;
}

// Re-planning at run time (Comm::replanBalance): an even network, then
// rank 2's links slowed to a quarter both ways between two calls, then
// restored. Every rank's plan after each call: the same on every rank; the
// slow rank owns most of the vector within kFollow calls of the change and
// the plan then holds, each link carrying what the plan gives it; equal
// shares again within kFollow calls of the restoration, and they hold.
// Values exact throughout.
TEST(Balance, ThePlanFollowsASlowNodeAndComesBack) {
  // Links this slow keep the emulated link's burst (10 ms, 64 KiB at
  // least) small beside the link probe's 2 MiB, so that the probe reads an
  // even network evenly under ThreadSanitizer's scheduling too (at 40-80
  // MB/s a refilled burst put one link 20-30% above the others there).
  constexpr double kFast = 10, kSlow = 2.5;  // MB/s
  constexpr int kEven = 2, kSlowFrom = kEven, kBackAt = kSlowFrom + 7, kCalls = kBackAt + 8;
  constexpr int kFollow = 3;
  constexpr size_t kCount = 1 << 18;  // 1 MiB of int32 (balanced): one re-plan per call
  const std::string every = std::to_string(kCount * 4);
  Env env({{"NCCL_SHM_DISABLE", "1"},
           {"TUTTI_TEST_NODES", "1,1,1,1"},
           {"NCCL_ALGO", "ring"},
           {"TUTTI_REPLAN_BYTES", every.c_str()},
           {"TUTTI_TEST_LINK_MBPS", "*:*:10"}});
  std::vector<std::vector<std::vector<uint32_t>>> plans(kRanks);  // [rank][call]
  std::vector<uint64_t> carried(kRanks, 0);  // by the link r -> r + 1 in the last slow call
  runRanks(kRanks, [&](int r, ncclComm_t comm) {
    core::Comm& c = *comm->impl();
    // The emulated link's own counters (every channel reports the link's).
    auto acked = [&] {
      transport::Connection::LinkCounters lc;
      EXPECT_TRUE(c.channel((r + 1) % kRanks, 0).conn->linkCounters(&lc));
      return lc.bytesAcked;
    };
    plans[r].push_back(c.balance().ranks);
    for (int k = 0; k < kCalls; ++k) {
      // Rank 2's links: 1 -> 2 and 2 -> 3 (the ring 0 1 2 3).
      if (k == kSlowFrom || k == kBackAt) {
        const double mbps = k == kSlowFrom ? kSlow : kFast;
        if (r == 1) {
          ASSERT_TRUE(c.setTestLinkRate(2, mbps));
        }
        if (r == 2) {
          ASSERT_TRUE(c.setTestLinkRate(3, mbps));
        }
      }
      const uint64_t before = acked();
      allReduce(r, comm, kCount, k, k % 2 == 1);
      if (k == kBackAt - 1) carried[r] = acked() - before;
      plans[r].push_back(c.balance().ranks);
    }
  });
  // plans[r][k + 1]: after call k.
  for (int r = 1; r < kRanks; ++r)
    for (int k = 0; k <= kCalls; ++k) ASSERT_EQ(plans[r][k], plans[0][k]) << "rank " << r;
  const auto& p = plans[0];
  auto share2 = [&](int after) {
    return p[after + 1].empty() ? 0.25 : double(p[after + 1][2]) / algo::kWeightTotal;
  };
  EXPECT_TRUE(p[0].empty()) << "an even network at init: equal shares";
  for (int k = 0; k < kSlowFrom; ++k) EXPECT_TRUE(p[k + 1].empty()) << "after call " << k;
  int followed = -1;
  for (int k = kSlowFrom; k < kBackAt && followed < 0; ++k)
    if (share2(k) >= 0.8) followed = k;
  ASSERT_GE(followed, 0) << "rank 2 never owned 80% of the vector while slow";
  EXPECT_LT(followed - kSlowFrom, kFollow) << "the plan followed after call " << followed;
  for (int k = followed + 1; k < kBackAt; ++k)
    EXPECT_EQ(p[k + 1], p[followed + 1]) << "the plan changed again after call " << k;
  // The traffic follows the plan: in the last slow call each link r -> r+1
  // carried (2 - s_r - s_r+1) vectors (algo/balance.h) within 10% (the
  // messages' headers add well under 1%): about one vector over each of
  // rank 2's slow links, about two over the fast ones.
  const std::vector<uint32_t>& w = p[kBackAt - 1];  // the plan the call ran
  ASSERT_EQ(w.size(), size_t{kRanks});
  for (int r = 0; r < kRanks; ++r) {
    const double s = double(w[r]) / algo::kWeightTotal,
                 t = double(w[(r + 1) % kRanks]) / algo::kWeightTotal;
    const double want = (2 - s - t) * kCount * 4;
    EXPECT_NEAR(double(carried[r]), want, 0.1 * want) << "link " << r << " -> " << (r + 1) % kRanks;
  }
  int back = -1;
  for (int k = kBackAt; k < kCalls && back < 0; ++k)
    if (p[k + 1].empty()) back = k;
  ASSERT_GE(back, 0) << "equal shares never came back; rank 2 owns " << share2(kCalls - 1);
  EXPECT_LT(back - kBackAt, kFollow) << "equal shares came back after call " << back;
  for (int k = back + 1; k < kCalls; ++k)
    EXPECT_TRUE(p[k + 1].empty()) << "the plan changed again after call " << k;
}

// TUTTI_REPLAN_BYTES=0: the plan made at init holds, whatever the links do.
TEST(Balance, ReplanOffKeepsThePlanOfInit) {
  Env env({{"NCCL_SHM_DISABLE", "1"},
           {"TUTTI_TEST_NODES", "1,1,1,1"},
           {"NCCL_ALGO", "ring"},
           {"TUTTI_REPLAN_BYTES", "0"},
           {"TUTTI_TEST_LINK_MBPS", "*:*:10"}});
  std::vector<int> equal(kRanks, 0);  // (not vector<bool>: ranks write their own)
  runRanks(kRanks, [&](int r, ncclComm_t comm) {
    core::Comm& c = *comm->impl();
    if (r == 1) {
      ASSERT_TRUE(c.setTestLinkRate(2, 2.5));
    }
    if (r == 2) {
      ASSERT_TRUE(c.setTestLinkRate(3, 2.5));
    }
    for (int k = 0; k < 3; ++k) allReduce(r, comm, 1 << 18, k, false);
    equal[r] = c.balance().ranks.empty() && c.nodeRates().empty();
  });
  for (int r = 0; r < kRanks; ++r) EXPECT_TRUE(equal[r]) << "rank " << r;
}

}  // namespace
}  // namespace tutti::test
