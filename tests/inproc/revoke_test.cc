// ncclCommRevoke (issue 28): every pending and later operation of the
// communicator fails at once, on the revoking rank (whichever thread runs
// it) and on the peers waiting for it, so that no rank is left waiting; the
// communicator is not in error state (ncclCommGetAsyncError: ncclSuccess, as
// NCCL defines it) and may still be split, shrunk and destroyed. Over shared
// memory and TCP.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "tests/inproc/harness.h"

namespace tutti::test {
namespace {

using Clock = std::chrono::steady_clock;

class Revoke : public testing::TestWithParam<const char*> {};

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// A communicator of every rank made from the revoked one (ncclCommShrink
// without exclusions) gives exact sums.
void expectChildWorks(ncclComm_t comm, int r, int n) {
  ncclComm_t child = nullptr;
  ASSERT_EQ(ncclCommShrink(comm, nullptr, 0, &child, nullptr, NCCL_SHRINK_DEFAULT), ncclSuccess)
      << ncclGetLastError(comm);
  const size_t count = 65537;
  std::vector<int32_t> in(count), out(count, -1);
  for (size_t i = 0; i < count; ++i) in[i] = (r + 1) * 100 + static_cast<int32_t>(i % 13);
  ASSERT_EQ(ncclAllReduce(in.data(), out.data(), count, ncclInt32, ncclSum, child, nullptr),
            ncclSuccess)
      << ncclGetLastError(child);
  const int32_t base = 100 * n * (n + 1) / 2;
  for (size_t i = 0; i < count; ++i)
    if (out[i] != base + n * static_cast<int32_t>(i % 13)) {
      ADD_FAILURE() << "element " << i << ": " << out[i];
      break;
    }
  EXPECT_EQ(ncclCommDestroy(child), ncclSuccess);
}

// What a revoked communicator answers on the rank that revoked it.
void expectRevokedHere(ncclComm_t comm) {
  ncclResult_t async = ncclInternalError;
  ASSERT_EQ(ncclCommGetAsyncError(comm, &async), ncclSuccess);
  EXPECT_EQ(async, ncclSuccess);  // revoked, not failed
  float x = 1, y = 0;
  EXPECT_EQ(ncclAllReduce(&x, &y, 1, ncclFloat, ncclSum, comm, nullptr), ncclInvalidUsage);
  EXPECT_NE(std::string(ncclGetLastError(comm)).find("revoked (ncclCommRevoke)"), std::string::npos)
      << ncclGetLastError(comm);
  EXPECT_EQ(ncclCommFinalize(comm), ncclInvalidUsage);
  EXPECT_EQ(ncclCommRevoke(comm, NCCL_REVOKE_DEFAULT), ncclSuccess);  // again: nothing to do
}

// One rank revokes instead of joining an all-reduce: the others, waiting for
// it, fail within seconds (TUTTI_TIMEOUT is 20), saying it revoked; then
// they revoke too, and all of them go on on a child communicator.
TEST_P(Revoke, PeersWaitingOnTheRevokingRankFailFast) {
  Env env({std::make_pair("NCCL_SHM_DISABLE", GetParam()), std::make_pair("TUTTI_TIMEOUT", "20")});
  constexpr int kRanks = 4, kRevoker = 2;
  runRanks(kRanks, [](int r, ncclComm_t comm) {
    if (r == kRevoker) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the others are waiting
      ASSERT_EQ(ncclCommRevoke(comm, NCCL_REVOKE_DEFAULT), ncclSuccess) << ncclGetLastError(comm);
      expectRevokedHere(comm);
    } else {
      std::vector<float> buf(1 << 20, 1.0f);
      const auto t0 = Clock::now();
      ncclResult_t rc =
          ncclAllReduce(buf.data(), buf.data(), buf.size(), ncclFloat, ncclSum, comm, nullptr);
      const double s = since(t0);
      EXPECT_NE(rc, ncclSuccess);
      EXPECT_LT(s, 5.0) << "rank " << r << " waited " << s << " s";
      const std::string err = ncclGetLastError(comm);
      EXPECT_NE(err.find("rank 2 revoked the communicator"), std::string::npos) << err;
      ASSERT_EQ(ncclCommRevoke(comm, NCCL_REVOKE_DEFAULT), ncclSuccess) << ncclGetLastError(comm);
    }
    expectChildWorks(comm, r, kRanks);
  });
}

// A rank's own operation, blocked on another thread, ends when the rank
// revokes: rank 0 waits in an all-reduce rank 1 never calls.
TEST_P(Revoke, EndsThisRanksOperationOnAnotherThread) {
  Env env({std::make_pair("NCCL_SHM_DISABLE", GetParam()), std::make_pair("TUTTI_TIMEOUT", "20")});
  std::atomic<bool> revoked0{false};
  runRanks(2, [&](int r, ncclComm_t comm) {
    if (r == 0) {
      std::thread revoker([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        EXPECT_EQ(ncclCommRevoke(comm, NCCL_REVOKE_DEFAULT), ncclSuccess);
        revoked0 = true;
      });
      std::vector<float> buf(4096, 1.0f);
      const auto t0 = Clock::now();
      ncclResult_t rc =
          ncclAllReduce(buf.data(), buf.data(), buf.size(), ncclFloat, ncclSum, comm, nullptr);
      const double s = since(t0);
      revoker.join();
      EXPECT_EQ(rc, ncclInvalidUsage);
      EXPECT_LT(s, 5.0);
      EXPECT_NE(std::string(ncclGetLastError(comm)).find("revoked"), std::string::npos)
          << ncclGetLastError(comm);
      expectRevokedHere(comm);
    } else {
      while (!revoked0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      ASSERT_EQ(ncclCommRevoke(comm, NCCL_REVOKE_DEFAULT), ncclSuccess);
    }
    expectChildWorks(comm, r, 2);
  });
}

INSTANTIATE_TEST_SUITE_P(Transports, Revoke, testing::Values("0", "1"),
                         [](const testing::TestParamInfo<const char*>& i) {
                           return std::string(i.param[0] == '1' ? "tcp" : "shm");
                         });

TEST(RevokeArguments, AreCheckedWithClearErrors) {
  EXPECT_EQ(ncclCommRevoke(nullptr, NCCL_REVOKE_DEFAULT), ncclInvalidArgument);
  runRanks(2, [](int r, ncclComm_t comm) {
    EXPECT_EQ(ncclCommRevoke(comm, 1), ncclInvalidArgument);
    EXPECT_NE(std::string(ncclGetLastError(comm)).find("invalid revokeFlags 1"), std::string::npos)
        << ncclGetLastError(comm);
    // The refusal left the communicator usable.
    int32_t x = r + 1, y = 0;
    ASSERT_EQ(ncclAllReduce(&x, &y, 1, ncclInt32, ncclSum, comm, nullptr), ncclSuccess);
    EXPECT_EQ(y, 3);
  });
}

}  // namespace
}  // namespace tutti::test
