// ncclCommShrink (issue 28): the ranks that remain build a communicator
// without the excluded ones, with no new unique id and no exchange among all
// ranks, from a healthy communicator or from one in error state after a rank
// left; the new communicator gives exact results. Over shared memory and TCP.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/inproc/harness.h"

namespace tutti::test {
namespace {

class Shrink : public testing::TestWithParam<const char*> {};

// The survivors' all-reduce on the new communicator: each contributes
// (old rank + 1) * 1000 + i, exactly representable.
void expectExactSum(ncclComm_t comm, const std::vector<int>& oldRanks, int oldRank) {
  int n = 0, me = -1;
  ASSERT_EQ(ncclCommCount(comm, &n), ncclSuccess);
  ASSERT_EQ(ncclCommUserRank(comm, &me), ncclSuccess);
  ASSERT_EQ(n, static_cast<int>(oldRanks.size()));
  ASSERT_EQ(oldRanks[me], oldRank);  // new ranks follow the old order
  const size_t count = 100003;       // several pipeline chunks, odd
  std::vector<int32_t> in(count), out(count, -1);
  for (size_t i = 0; i < count; ++i) in[i] = (oldRank + 1) * 1000 + static_cast<int32_t>(i % 1000);
  ASSERT_EQ(ncclAllReduce(in.data(), out.data(), count, ncclInt32, ncclSum, comm, nullptr),
            ncclSuccess)
      << ncclGetLastError(comm);
  int32_t base = 0;
  for (int r : oldRanks) base += (r + 1) * 1000;
  for (size_t i = 0; i < count; ++i)
    if (out[i] != base + static_cast<int32_t>(n * (i % 1000))) {
      ADD_FAILURE() << "element " << i << ": " << out[i];
      break;
    }
}

TEST_P(Shrink, HealthyCommunicatorDropsARank) {
  Env env({std::make_pair("NCCL_SHM_DISABLE", GetParam())});
  runRanks(5, [](int r, ncclComm_t comm) {
    if (r == 1 || r == 3) return;  // excluded: they do not call
    int drop[2] = {3, 1};
    ncclComm_t child = nullptr;
    ASSERT_EQ(ncclCommShrink(comm, drop, 2, &child, nullptr, NCCL_SHRINK_DEFAULT), ncclSuccess)
        << ncclGetLastError(comm);
    expectExactSum(child, {0, 2, 4}, r);
    EXPECT_EQ(ncclCommDestroy(child), ncclSuccess);
  });
}

TEST_P(Shrink, AfterAPeerLeftWithAbort) {
  Env env({std::make_pair("NCCL_SHM_DISABLE", GetParam()), std::make_pair("TUTTI_TIMEOUT", "20")});
  runRanks(4, [](int r, ncclComm_t comm) {
    if (r == 2) return;  // leaves: its communicator is destroyed by the harness
    std::vector<float> buf(1 << 16, 1.0f);
    // Fails once rank 2 is gone (its connections close), naming it.
    ncclResult_t rc =
        ncclAllReduce(buf.data(), buf.data(), buf.size(), ncclFloat32, ncclSum, comm, nullptr);
    EXPECT_NE(rc, ncclSuccess);
    int dead = 2;
    ncclComm_t child = nullptr;
    ASSERT_EQ(ncclCommShrink(comm, &dead, 1, &child, nullptr, NCCL_SHRINK_ABORT), ncclSuccess)
        << ncclGetLastError(comm);
    expectExactSum(child, {0, 1, 3}, r);
    // A second shrink of the new one (no ranks excluded) works as well.
    ncclComm_t same = nullptr;
    ASSERT_EQ(ncclCommShrink(child, nullptr, 0, &same, nullptr, NCCL_SHRINK_DEFAULT), ncclSuccess);
    int n = 0;
    EXPECT_EQ(ncclCommCount(same, &n), ncclSuccess);
    EXPECT_EQ(n, 3);
    EXPECT_EQ(ncclCommDestroy(same), ncclSuccess);
    EXPECT_EQ(ncclCommDestroy(child), ncclSuccess);
  });
}

INSTANTIATE_TEST_SUITE_P(Transports, Shrink, testing::Values("0", "1"),
                         [](const testing::TestParamInfo<const char*>& i) {
                           return std::string(i.param[0] == '1' ? "tcp" : "shm");
                         });

TEST(ShrinkArguments, AreCheckedWithClearErrors) {
  runRanks(2, [](int r, ncclComm_t comm) {
    ncclComm_t child = reinterpret_cast<ncclComm_t>(0x1);
    auto expectRefused = [&](ncclResult_t rc, const char* what) {
      EXPECT_EQ(rc, ncclInvalidArgument) << what;
      EXPECT_EQ(child, nullptr) << what;
      EXPECT_NE(std::string(ncclGetLastError(comm)).find(what), std::string::npos)
          << ncclGetLastError(comm);
      child = reinterpret_cast<ncclComm_t>(0x1);
    };
    int self = r, other = 1 - r, bad = 7, twice[2] = {other, other};
    expectRefused(ncclCommShrink(comm, &self, 1, &child, nullptr, NCCL_SHRINK_DEFAULT),
                  "excludes itself");
    expectRefused(ncclCommShrink(comm, &bad, 1, &child, nullptr, NCCL_SHRINK_DEFAULT),
                  "not a rank of 2");
    expectRefused(ncclCommShrink(comm, twice, 2, &child, nullptr, NCCL_SHRINK_DEFAULT),
                  "excluded twice");
    expectRefused(ncclCommShrink(comm, nullptr, 1, &child, nullptr, NCCL_SHRINK_DEFAULT),
                  "excludeRanksList is NULL");
    expectRefused(ncclCommShrink(comm, &other, 1, &child, nullptr, 5), "invalid shrinkFlags 5");
    EXPECT_EQ(ncclCommShrink(comm, &other, 1, nullptr, nullptr, NCCL_SHRINK_DEFAULT),
              ncclInvalidArgument);
    // The refusals left the communicator usable.
    int32_t x = 1, y = 0;
    ASSERT_EQ(ncclAllReduce(&x, &y, 1, ncclInt32, ncclSum, comm, nullptr), ncclSuccess);
    EXPECT_EQ(y, 2);
  });
}

}  // namespace
}  // namespace tutti::test
