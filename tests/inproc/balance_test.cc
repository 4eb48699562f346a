// The balanced ring at init (Comm::planBalance, algo/balance.h): four ranks
// as threads over TCP, each a node of its own (TUTTI_TEST_NODES), on an
// emulated network (TUTTI_TEST_LINK_MBPS token buckets) that the link probe
// measures. A node whose links run at a quarter of the others' rate both
// ways gets (almost) the whole vector on every rank alike, and large ring
// all-reduces stay exact, with counts that leave segments empty or odd; an
// even network and TUTTI_BALANCE=0 keep equal segments.
#include "algo/balance.h"

#include "capi/handle.h"
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

// Rank 2's links run at 10 MB/s both ways, the others at 40: the plan gives
// rank 2 at least 90% of the vector (the model's bound: it receives and
// sends the vector once), the same on every rank.
TEST(Balance, ASlowNodeOwnsTheVector) {
  const auto w = weightsAfterInit("*:*:40,2:*:10,*:2:10", "1");
  ASSERT_EQ(w[0].size(), size_t{kRanks}) << "no plan on rank 0";
  for (int r = 1; r < kRanks; ++r) EXPECT_EQ(w[r], w[0]) << "rank " << r;
  EXPECT_GT(w[0][2], algo::kWeightTotal * 9 / 10);
}

// Every link at one rate: equal segments, no plan.
TEST(Balance, AnEvenNetworkKeepsEqualSegments) {
  const auto w = weightsAfterInit("*:*:40", "1");
  for (int r = 0; r < kRanks; ++r) EXPECT_TRUE(w[r].empty()) << "rank " << r;
}

// TUTTI_BALANCE=0: the static ring, slow node or not.
TEST(Balance, OffKeepsEqualSegments) {
  const auto w = weightsAfterInit("*:*:40,2:*:10,*:2:10", "0");
  for (int r = 0; r < kRanks; ++r) EXPECT_TRUE(w[r].empty()) << "rank " << r;
}

}  // namespace
}  // namespace tutti::test
