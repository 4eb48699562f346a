// The one-shot path for small collectives on one host (core/oneshot.h):
// slot reuse under every collective, groups that mix it with ring schedules,
// one thread driving every rank, mismatches and departed peers reported
// instead of garbage or a hang. The collective matrix itself runs in
// collectives_test.cc (with and without the arena).
#include <chrono>
#include <cstdlib>
#include <numeric>

#include "harness.h"

namespace tutti::test {
namespace {

class OneShotEnv : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("TUTTI_ONESHOT_MAX", "4K", 1);
    setenv("NCCL_SHM_DISABLE", "0", 1);
  }
  void TearDown() override {
    unsetenv("TUTTI_ONESHOT_MAX");
    unsetenv("NCCL_SHM_DISABLE");
    unsetenv("TUTTI_TIMEOUT");
  }
};

// Thousands of back-to-back operations of every kind with values that change
// every iteration: a slot overwritten before a peer read it shows up as a
// wrong value. Broadcast and reduce matter most: their roots never wait.
TEST_F(OneShotEnv, SlotReuseUnderEveryCollective) {
  for (int n : {2, 3, 5}) {
    runRanks(n, [n](int r, ncclComm_t comm) {
      const size_t count = 37;  // odd: not a multiple of any vector width
      std::vector<int32_t> send(count * n), recv(count * n);
      for (int it = 0; it < 1500; ++it) {
        const int kind = it % 5, root = (it / 5) % n;
        for (size_t i = 0; i < send.size(); ++i) send[i] = it * 1000 + r * 100 + static_cast<int>(i);
        std::fill(recv.begin(), recv.end(), -1);
        ncclResult_t rc = ncclSuccess;
        switch (kind) {
          case 0:
            rc = ncclAllReduce(send.data(), recv.data(), count, ncclInt32, ncclSum, comm, nullptr);
            break;
          case 1:
            rc = ncclBroadcast(send.data(), recv.data(), count, ncclInt32, root, comm, nullptr);
            break;
          case 2:
            rc = ncclReduce(send.data(), recv.data(), count, ncclInt32, ncclMax, root, comm,
                            nullptr);
            break;
          case 3:
            rc = ncclAllGather(send.data(), recv.data(), count, ncclInt32, comm, nullptr);
            break;
          case 4:
            rc = ncclReduceScatter(send.data(), recv.data(), count, ncclInt32, ncclSum, comm,
                                   nullptr);
            break;
        }
        ASSERT_EQ(rc, ncclSuccess) << ncclGetLastError(comm);
        for (size_t i = 0; i < count; ++i) {
          int32_t want = -1;
          const int base = it * 1000 + static_cast<int>(i);
          switch (kind) {
            case 0:
              want = n * base + 100 * (n * (n - 1) / 2);
              break;
            case 1:
              want = base + root * 100;
              break;
            case 2:
              want = r == root ? base + (n - 1) * 100 : -1;
              break;
            case 3:
              for (int q = 0; q < n; ++q)
                ASSERT_EQ(recv[q * count + i], base + q * 100) << "it " << it << " rank " << r;
              continue;
            case 4:
              want = n * (base + r * static_cast<int>(count)) + 100 * (n * (n - 1) / 2);
              break;
          }
          ASSERT_EQ(recv[i], want) << "it " << it << " kind " << kind << " rank " << r << " i " << i;
        }
      }
    });
  }
}

// A group may hold one-shot operations and ring schedules together, and one
// rank may group what another issues one by one: the arena keeps its own
// order, so both finish with exact results.
TEST_F(OneShotEnv, GroupsMixWithRingAndWithUngroupedPeers) {
  const int n = 3;
  runRanks(n, [n](int r, ncclComm_t comm) {
    const size_t small = 16, large = 20000;  // 64 B one-shot, 80 KB ring
    std::vector<float> a(large, 1.0f + r), b(large, 0), c(small, 2.0f * r), d(small, 0),
        g(small * n, 0);
    auto issue = [&] {
      EXPECT_EQ(ncclAllReduce(a.data(), b.data(), large, ncclFloat, ncclSum, comm, nullptr),
                ncclSuccess);
      EXPECT_EQ(ncclAllReduce(c.data(), d.data(), small, ncclFloat, ncclSum, comm, nullptr),
                ncclSuccess);
      EXPECT_EQ(ncclAllGather(c.data(), g.data(), small, ncclFloat, comm, nullptr), ncclSuccess);
    };
    if (r == 1) {
      issue();  // one by one
    } else {
      ASSERT_EQ(ncclGroupStart(), ncclSuccess);
      issue();
      ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(comm);
    }
    for (size_t i = 0; i < large; ++i) ASSERT_EQ(b[i], 6.0f) << i;
    for (size_t i = 0; i < small; ++i) ASSERT_EQ(d[i], 6.0f) << i;
    for (int q = 0; q < n; ++q)
      for (size_t i = 0; i < small; ++i) ASSERT_EQ(g[q * small + i], 2.0f * q);
  });
}

// One thread drives every rank through a group: the executor progresses the
// arena operations of all communicators together, so nobody waits for a rank
// this very thread has yet to run.
TEST_F(OneShotEnv, OneThreadDrivesEveryRank) {
  const int n = 4;
  std::vector<ncclComm_t> comms(n);
  ASSERT_EQ(ncclCommInitAll(comms.data(), n, nullptr), ncclSuccess);
  std::vector<std::vector<int64_t>> in(n), out(n);
  for (int it = 0; it < 50; ++it) {
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    for (int r = 0; r < n; ++r) {
      in[r].assign(9, it + r);
      out[r].assign(9, -1);
      ASSERT_EQ(ncclAllReduce(in[r].data(), out[r].data(), 9, ncclInt64, ncclSum, comms[r], nullptr),
                ncclSuccess);
    }
    ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
    for (int r = 0; r < n; ++r)
      for (int64_t v : out[r]) ASSERT_EQ(v, 4 * it + 6);
  }
  for (auto c : comms) EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
}

// Ranks that disagree on the root are told so, promptly, on every rank.
TEST_F(OneShotEnv, RootMismatchIsReported) {
  setenv("TUTTI_TIMEOUT", "20", 1);
  runRanks(2, [](int r, ncclComm_t comm) {
    std::vector<int32_t> buf(10, r);
    auto t0 = std::chrono::steady_clock::now();
    // Each rank believes the other is the root: both wait for the other's data.
    ncclResult_t rc = ncclBroadcast(buf.data(), buf.data(), 10, ncclInt32, 1 - r, comm, nullptr);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(rc, ncclInvalidUsage);
    std::string err = ncclGetLastError(comm);
    EXPECT_NE(err.find("collective mismatch"), std::string::npos) << err;
    EXPECT_NE(err.find("root"), std::string::npos) << err;
    EXPECT_LT(s, 5.0);
  });
}

// A rank that destroys its communicator while a peer waits for it in the
// arena: the peer fails fast, naming it, instead of waiting for the timeout.
TEST_F(OneShotEnv, PeerThatLeftIsNamed) {
  setenv("TUTTI_TIMEOUT", "60", 1);
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  std::thread leaver([&] {
    ncclComm_t comm;
    ASSERT_EQ(ncclCommInitRank(&comm, 2, id, 1), ncclSuccess);
    EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
  });
  ncclComm_t comm;
  ASSERT_EQ(ncclCommInitRank(&comm, 2, id, 0), ncclSuccess);
  leaver.join();
  std::vector<float> buf(4, 1.0f);
  auto t0 = std::chrono::steady_clock::now();
  ncclResult_t rc = ncclAllReduce(buf.data(), buf.data(), 4, ncclFloat, ncclSum, comm, nullptr);
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(rc, ncclSuccess);
  std::string err = ncclGetLastError(comm);
  EXPECT_NE(err.find("rank 1"), std::string::npos) << err;
  EXPECT_NE(err.find("destroyed its communicator"), std::string::npos) << err;
  EXPECT_LT(s, 5.0);
  // The communicator is broken now; later calls fail fast with the cause.
  EXPECT_NE(ncclAllReduce(buf.data(), buf.data(), 4, ncclFloat, ncclSum, comm, nullptr),
            ncclSuccess);
  EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
}

// Every rank's all-reduce result is bit-identical, also for floating-point
// data whose sum depends on the order of additions.
TEST_F(OneShotEnv, FloatResultsAreBitIdenticalAcrossRanks) {
  const int n = 5;
  const size_t count = 257;
  std::vector<std::vector<float>> results(n);
  runRanks(n, [&](int r, ncclComm_t comm) {
    std::vector<float> in(count), out(count);
    for (size_t i = 0; i < count; ++i) in[i] = 1.0f / (1 + r + 3 * i) * (i % 2 ? 1e7f : 1e-3f);
    ASSERT_EQ(ncclAllReduce(in.data(), out.data(), count, ncclFloat, ncclSum, comm, nullptr),
              ncclSuccess);
    results[r] = out;
  });
  for (int r = 1; r < n; ++r)
    ASSERT_EQ(0, memcmp(results[0].data(), results[r].data(), count * sizeof(float))) << r;
}

}  // namespace
}  // namespace tutti::test
