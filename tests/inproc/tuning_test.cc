// Run-time tuning (core/tuner.h) on real communicators: four ranks as
// threads over TCP on one node, where the cost model picks Rabenseifner's
// all-reduce, on an emulated network (TUTTI_TEST_LINK_MBPS token buckets)
// that makes either it or the ring the slow one. The tuner must measure
// its way to the faster algorithm on every rank alike; values stay exact
// through the trials; a tuned channel count is what the messages use; and
// TUTTI_TUNE=0 or NCCL_ALGO leave the choice to the cost model or the user.
#include <cstring>
#include <string>
#include <vector>

#include "algo/schedule.h"
#include "capi/handle.h"
#include "core/comm.h"
#include "harness.h"

namespace tutti::test {
namespace {

using Algo = algo::CollArgs::Algo;
using algo::Collective;
constexpr int kRanks = 4;
constexpr size_t kCount = 1 << 20;  // 4 MiB of int32
constexpr size_t kBytes = kCount * 4;

// An all-reduce of int32 on rank r, checked element by element.
void allReduce(int r, ncclComm_t comm, int round) {
  std::vector<int32_t> in(kCount), out(kCount, -1);
  for (size_t i = 0; i < kCount; ++i) in[i] = static_cast<int32_t>(r * 1000 + round + i % 977);
  ASSERT_EQ(ncclAllReduce(in.data(), out.data(), kCount, ncclInt32, ncclSum, comm, nullptr),
            ncclSuccess)
      << ncclGetLastError(comm);
  for (size_t i = 0; i < kCount; ++i)
    ASSERT_EQ(out[i], static_cast<int32_t>(6000 + kRanks * (round + i % 977)))
        << "rank " << r << " round " << round << " element " << i;
}

// The algorithm every rank settled on for kBytes all-reduces after `calls`
// calls under `env` (-2: some rank had not settled; -1: the cost model's).
int settledAlgorithm(const std::vector<std::pair<const char*, const char*>>& vars, int calls) {
  Env env(vars);
  std::vector<int> got(kRanks, -3);
  runRanks(kRanks, [&](int r, ncclComm_t comm) {
    for (int k = 0; k < calls; ++k) allReduce(r, comm, k);
    auto s = comm->impl()->tuner().settled(Collective::kAllReduce, kBytes);
    got[r] = s ? s->algo : -2;
  });
  for (int r = 1; r < kRanks; ++r) EXPECT_EQ(got[r], got[0]) << "rank " << r;
  return got[0];
}

// Rabenseifner's exchanges with ranks r^1 and r^2; the ring with r+-1. Links
// 0-2 and 1-3 slowed (both ways) slow only Rabenseifner's; links 1-2 and 3-0
// only the ring's. Unlisted links are not limited. 2 candidates, kTrials
// each: settled after 2 kTrials calls.
constexpr const char* kSlowFarPairs = "0:2:10,2:0:10,1:3:10,3:1:10";
constexpr const char* kSlowRingEdges = "1:2:10,2:1:10,3:0:10,0:3:10";

TEST(Tuning, TheAlgorithmFollowsTheMeasuredNetwork) {
  // The model's choice on one node over sockets for 4 ranks.
  const int rab = static_cast<int>(Algo::kRabenseifner), ring = static_cast<int>(Algo::kRing);
  EXPECT_EQ(settledAlgorithm({{"NCCL_SHM_DISABLE", "1"},
                              {"TUTTI_TUNE", "algo"},
                              {"TUTTI_TEST_LINK_MBPS", kSlowFarPairs}},
                             2 * core::Tuner::kTrials),
            ring)
      << "Rabenseifner's crosses the slow links: the ring must win";
  EXPECT_EQ(settledAlgorithm({{"NCCL_SHM_DISABLE", "1"},
                              {"TUTTI_TUNE", "algo"},
                              {"TUTTI_TEST_LINK_MBPS", kSlowRingEdges}},
                             2 * core::Tuner::kTrials),
            rab)
      << "the ring crosses the slow links: Rabenseifner's must stay";
}

// TUTTI_TUNE=0 tunes nothing; NCCL_ALGO fixes the algorithm, so with only
// the algorithm to tune nothing tunes either: no class is ever seen.
TEST(Tuning, OffOrForcedLeavesTheChoiceAlone) {
  for (const char* algoEnv : {"", "ring"}) {
    Env env({{"NCCL_SHM_DISABLE", "1"},
             {"TUTTI_TUNE", *algoEnv ? "algo" : "0"},
             {"NCCL_ALGO", algoEnv},
             {"TUTTI_TEST_LINK_MBPS", kSlowFarPairs}});
    if (!*algoEnv) unsetenv("NCCL_ALGO");
    runRanks(kRanks, [&](int r, ncclComm_t comm) {
      for (int k = 0; k < 5; ++k) allReduce(r, comm, k);
      EXPECT_FALSE(comm->impl()->tuner().settled(Collective::kAllReduce, kBytes))
          << "NCCL_ALGO=" << algoEnv;
      EXPECT_FALSE(comm->impl()->tuner().tunes(Collective::kAllReduce, kBytes));
    });
  }
}

// Only the channels tune (2, then 1, in turn, kTrials times): the calls that
// try one channel send nothing on channel 1, those that try two use it, and
// every call stays exact. Then the class runs what it settled on. Channel 0
// may start a message only every 5 ms (TUTTI_TEST_THROTTLE), so that a
// call with two channels cannot leave channel 1 idle (over loopback TCP
// channel 0 alone would often keep up).
TEST(Tuning, ATunedChannelCountIsWhatTheMessagesUse) {
  Env env(
      {{"NCCL_SHM_DISABLE", "1"}, {"TUTTI_TUNE", "channels"}, {"TUTTI_TEST_THROTTLE", "0:5000"}});
  constexpr int kTrialCalls = 2 * core::Tuner::kTrials, kCalls = kTrialCalls + 4;
  std::vector<std::vector<uint64_t>> onChannel1(kRanks);  // per call
  std::vector<int> settled(kRanks, -1);
  runRanks(kRanks, [&](int r, ncclComm_t comm) {
    core::Comm& c = *comm->impl();
    ASSERT_EQ(c.nChannels(), 2);
    for (int k = 0; k < kCalls; ++k) {
      const uint64_t before = c.channelMessages()[1];
      allReduce(r, comm, k);
      onChannel1[r].push_back(c.channelMessages()[1] - before);
    }
    auto s = c.tuner().settled(Collective::kAllReduce, kBytes);
    ASSERT_TRUE(s) << "rank " << r;
    settled[r] = s->channels;
  });
  uint64_t twoChannelCalls = 0;
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(settled[r], settled[0]) << "rank " << r;
    for (int k = 1; k < kTrialCalls; k += 2)
      EXPECT_EQ(onChannel1[r][k], 0u) << "rank " << r << ": call " << k << " tried one channel";
    for (int k = 0; k < kTrialCalls; k += 2) twoChannelCalls += onChannel1[r][k];
    for (int k = kTrialCalls; k < kCalls && settled[0] == 1; ++k)
      EXPECT_EQ(onChannel1[r][k], 0u) << "rank " << r << " call " << k;
  }
  EXPECT_GT(twoChannelCalls, 0u) << "the calls that tried two channels never used channel 1";
}

// Two nodes of two ranks (TUTTI_TEST_NODES): all-gather and reduce-scatter
// choose between the flat ring and the two-level algorithm, the all-reduce
// among its algorithms too, and every knob tunes in turn. Each class
// settles alike on every rank, with exact values throughout. (No balanced
// ring: over unthrottled loopback a busy machine's noise may move its
// shares, which starts tuning again.)
TEST(Tuning, EveryKnobAndCollectiveSettlesAlikeWithExactValues) {
  Env env({{"NCCL_SHM_DISABLE", "1"}, {"TUTTI_TEST_NODES", "2,2"}, {"TUTTI_BALANCE", "0"}});
  // More than any class needs: at most 4 algorithms, 2 channel counts and 3 chunks.
  constexpr int kCalls = (4 + 2 + 3) * core::Tuner::kTrials + 1;
  constexpr size_t kBlock = 256 << 10;  // int32 per rank: 1 MiB blocks, 4 MiB vectors
  std::vector<std::vector<core::Tuning>> settled(kRanks);
  runRanks(kRanks, [&](int r, ncclComm_t comm) {
    std::vector<int32_t> mine(kBlock), all(kBlock * kRanks), red(kBlock);
    for (int k = 0; k < kCalls; ++k) {
      for (size_t i = 0; i < kBlock; ++i) mine[i] = static_cast<int32_t>(r * 7919 + k + i);
      ASSERT_EQ(ncclAllGather(mine.data(), all.data(), kBlock, ncclInt32, comm, nullptr),
                ncclSuccess)
          << ncclGetLastError(comm);
      for (int q = 0; q < kRanks; ++q)
        for (size_t i = 0; i < kBlock; i += 4093)
          ASSERT_EQ(all[q * kBlock + i], static_cast<int32_t>(q * 7919 + k + i))
              << "all-gather, rank " << r << " call " << k << " block " << q;
      for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int32_t>(r + k + i % 1013);
      ASSERT_EQ(
          ncclReduceScatter(all.data(), red.data(), kBlock, ncclInt32, ncclSum, comm, nullptr),
          ncclSuccess)
          << ncclGetLastError(comm);
      for (size_t i = 0; i < kBlock; ++i)
        ASSERT_EQ(red[i], static_cast<int32_t>(6 + kRanks * (k + (r * kBlock + i) % 1013)))
            << "reduce-scatter, rank " << r << " call " << k << " element " << i;
      allReduce(r, comm, k);
    }
    for (Collective coll :
         {Collective::kAllGather, Collective::kReduceScatter, Collective::kAllReduce}) {
      auto s = comm->impl()->tuner().settled(coll, kBytes);
      ASSERT_TRUE(s) << algo::collectiveName(coll) << " on rank " << r;
      settled[r].push_back(*s);
    }
  });
  for (int r = 1; r < kRanks; ++r)
    for (size_t i = 0; i < settled[0].size(); ++i)
      EXPECT_TRUE(settled[r][i].sameRun(settled[0][i])) << "rank " << r << " class " << i;
}

// The contract's numerics: the channels and the chunk size never change a
// result. Only those two tune here (the algorithm is the cost model's, the
// same every call); a float32 sum of values whose rounding depends on the
// order of the additions must come out bit for bit the same in every call,
// trials and settled alike, on every rank.
TEST(Tuning, ChannelsAndChunksLeaveFloatSumsBitIdentical) {
  Env env({{"NCCL_SHM_DISABLE", "1"}, {"TUTTI_TUNE", "channels,chunk"}});
  constexpr int kCalls = (2 + 3) * core::Tuner::kTrials + 2;
  std::vector<std::vector<float>> first(kRanks);
  runRanks(kRanks, [&](int r, ncclComm_t comm) {
    std::vector<float> in(kCount), out(kCount);
    for (size_t i = 0; i < kCount; ++i)
      in[i] = static_cast<float>((r + 1) * 1.0e7 / static_cast<double>(i % 9973 + 1)) +
              static_cast<float>(i % 7) * 0.1f;
    for (int k = 0; k < kCalls; ++k) {
      ASSERT_EQ(ncclAllReduce(in.data(), out.data(), kCount, ncclFloat32, ncclSum, comm, nullptr),
                ncclSuccess)
          << ncclGetLastError(comm);
      if (k == 0) {
        first[r] = out;
        continue;
      }
      ASSERT_EQ(std::memcmp(out.data(), first[r].data(), kCount * sizeof(float)), 0)
          << "rank " << r << ": call " << k << " differs from call 0";
    }
    EXPECT_TRUE(comm->impl()->tuner().settled(Collective::kAllReduce, kBytes)) << "rank " << r;
  });
  for (int r = 1; r < kRanks; ++r)
    EXPECT_EQ(std::memcmp(first[r].data(), first[0].data(), kCount * sizeof(float)), 0)
        << "rank " << r;
}

}  // namespace
}  // namespace tutti::test
