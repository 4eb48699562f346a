// The one-shot path for small collectives on one host (core/oneshot.h):
// slot reuse under every collective, groups that mix it with ring schedules,
// one thread driving every rank, mismatches and departed peers reported
// instead of garbage or a hang; single-copy all-gather and broadcast
// (TUTTI_CMA=1). The collective matrix itself runs in collectives_test.cc
// (with and without the arena).
#include <hwloc.h>
#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <thread>

#include "capi/handle.h"
#include "core/oneshot.h"
#include "topology/topology.h"
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
// A rank that waits on the one-shot path for a late peer sleeps on its
// doorbell (core/oneshot.h, "Waiting"), woken by the peer's publication,
// instead of napping on a timer: over a 500 ms wait it blocks at most about
// 500 times (sleeps of at most 1 ms; 403 measured) where 50 us naps blocked
// 2,447 times (each nap takes about 200 us with the timer's slack). Counted
// as the waiting thread's voluntary context switches (getrusage
// RUSAGE_THREAD; the yield phase's switches are involuntary). The bound,
// 1,000, leaves room for a slow machine and still fails napping.
TEST_F(OneShotEnv, WaitForALatePeerSleepsOnTheDoorbell) {
  runRanks(2, [](int r, ncclComm_t comm) {
    int32_t v = r + 1, out = 0;
    ASSERT_EQ(ncclAllReduce(&v, &out, 1, ncclInt32, ncclSum, comm, nullptr), ncclSuccess);
    ASSERT_EQ(out, 3);
    if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(500));
    v = 10 * (r + 1);
    rusage before{}, after{};
    ASSERT_EQ(getrusage(RUSAGE_THREAD, &before), 0);
    const auto t0 = std::chrono::steady_clock::now();
    ASSERT_EQ(ncclAllReduce(&v, &out, 1, ncclInt32, ncclSum, comm, nullptr), ncclSuccess);
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    ASSERT_EQ(getrusage(RUSAGE_THREAD, &after), 0);
    EXPECT_EQ(out, 30);
    if (r != 0) return;
    const long blocked = after.ru_nvcsw - before.ru_nvcsw;
    printf("[ one-shot ] waited %.0f ms for the late peer, blocked %ld times\n", ms, blocked);
    EXPECT_GT(ms, 300.0) << "rank 0 did not wait for rank 1: the test measured nothing";
    EXPECT_LT(blocked, 1000) << "the wait napped on a timer instead of sleeping on the doorbell";
  });
}

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

// Counts that put the ranks' calls in different slot classes (64 bytes: a
// small slot; 4000 bytes: a large one) are reported on both ranks, promptly,
// not after TUTTI_TIMEOUT.
TEST_F(OneShotEnv, SlotClassMismatchIsReported) {
  setenv("TUTTI_TIMEOUT", "20", 1);
  runRanks(2, [](int r, ncclComm_t comm) {
    const size_t count = r == 0 ? 16 : 1000;
    std::vector<int32_t> in(count, 1), out(count, 0);
    auto t0 = std::chrono::steady_clock::now();
    ncclResult_t rc =
        ncclAllReduce(in.data(), out.data(), count, ncclInt32, ncclSum, comm, nullptr);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(rc, ncclInvalidUsage);
    std::string err = ncclGetLastError(comm);
    EXPECT_NE(err.find("collective mismatch"), std::string::npos) << err;
    EXPECT_NE(err.find(r == 0 ? "of 1000 x" : "of 16 x"), std::string::npos) << err;
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

// NUMA placement: with a topology file of two nodes (CPUs 0-7 and 8-15) and
// every rank's thread on one CPU of node 0, each rank's home node is 0 and its
// own arena slots are bound there (on this machine's node 0); the collectives
// still give exact sums.
TEST_F(OneShotEnv, PlacesEachRanksSlotsOnItsNumaNode) {
  if (!topo::hwlocReadsAnyXml())
    GTEST_SKIP() << "hwloc cannot read the hand-written fixture here: its libxml2 reader (Debian "
                    "package libhwloc-plugins) is not installed or HWLOC_LIBXML=0";
  std::string fixture = __FILE__;
  fixture = fixture.substr(0, fixture.find_last_of('/')) + "/../unit/data/topo_2numa_gpu_nic.xml";
  Env env(std::vector<std::pair<const char*, const char*>>{{"TUTTI_TOPO_FILE", fixture.c_str()}});
  cpu_set_t allowed;
  ASSERT_EQ(sched_getaffinity(0, sizeof(allowed), &allowed), 0);
  int cpu = 0;
  while (cpu < 8 && !CPU_ISSET(cpu, &allowed)) ++cpu;
  if (cpu == 8) GTEST_SKIP() << "no CPU among 0-7 is usable here (the fixture's node 0)";
  hwloc_topology_t h = nullptr;
  ASSERT_EQ(hwloc_topology_init(&h), 0);
  ASSERT_EQ(hwloc_topology_load(h), 0);
  std::thread([&] {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    ASSERT_EQ(pthread_setaffinity_np(pthread_self(), sizeof(one), &one), 0);
    runRanks(3, [&](int r, ncclComm_t comm) {  // rank threads inherit the mask
      EXPECT_EQ(comm->impl()->homeNuma(), 0) << "rank " << r;
      core::OneShot* os = comm->impl()->oneShot();
      ASSERT_NE(os, nullptr);
      auto [mine, bytes] = os->arena().ownSlots();
      EXPECT_EQ(reinterpret_cast<uintptr_t>(mine) % 4096, 0u);
      hwloc_bitmap_t set = hwloc_bitmap_alloc();
      hwloc_membind_policy_t policy;
      if (hwloc_get_area_membind(h, mine, bytes, set, &policy, HWLOC_MEMBIND_BYNODESET) == 0) {
        EXPECT_EQ(policy, HWLOC_MEMBIND_BIND) << "rank " << r;
        EXPECT_TRUE(hwloc_bitmap_isset(set, 0)) << "rank " << r;
      }
      hwloc_bitmap_free(set);
      std::vector<int32_t> send(1001), recv(1001, -1);
      for (int it = 0; it < 20; ++it) {
        for (size_t i = 0; i < send.size(); ++i) send[i] = it * 100 + r + static_cast<int>(i);
        ASSERT_EQ(ncclAllReduce(send.data(), recv.data(), send.size(), ncclInt32, ncclSum, comm,
                                nullptr),
                  ncclSuccess);
        for (size_t i = 0; i < recv.size(); ++i)
          ASSERT_EQ(recv[i], 3 * (it * 100 + static_cast<int>(i)) + 3) << i;
      }
    });
  }).join();
  hwloc_topology_destroy(h);
}

// Single-copy all-gather and broadcast (TUTTI_CMA=1; ranks as threads read
// each other's buffers with memcpy, processes with process_vm_readv: see
// tests/mp/perf_smoke.sh). Every iteration changes the values and rewrites
// the send buffer as soon as the call returns, so an owner that returned
// before its readers finished shows up as a wrong value; byte counts are odd
// and buffers start at odd addresses; in place and out of place; a broadcast
// root that moves around.
TEST_F(OneShotEnv, SingleCopyAllGatherAndBroadcast) {
  Env env({{"TUTTI_CMA", "1"}, {"TUTTI_CMA_MIN_BYTES", "0"}});
  for (int n : {2, 3, 5}) {
    runRanks(n, [n](int r, ncclComm_t comm) {
      core::OneShot* os = comm->impl()->oneShot();
      ASSERT_NE(os, nullptr);
      ASSERT_TRUE(os->singleCopy());
      const uint64_t before = os->directOps();
      uint64_t expected = 0;
      for (size_t count : {size_t{4097}, size_t{70001}}) {  // bytes (int8): above 4K
        std::vector<int8_t> sendBuf(count + 1), recvBuf(count * n + 1);
        int8_t* send = sendBuf.data() + 1;  // odd addresses
        int8_t* recv = recvBuf.data() + 1;
        auto value = [](int it, int q, size_t i) {
          return static_cast<int8_t>((it * 7 + q * 31 + static_cast<int>(i % 97)) & 0x7f);
        };
        for (int it = 0; it < 60; ++it) {
          const bool inPlace = it % 4 >= 2;
          const int root = (it / 2) % n;
          ++expected;
          std::memset(recvBuf.data(), -1, recvBuf.size());
          if (it % 2 == 0) {  // all-gather
            int8_t* in = inPlace ? recv + r * count : send;
            for (size_t i = 0; i < count; ++i) in[i] = value(it, r, i);
            ASSERT_EQ(ncclAllGather(in, recv, count, ncclInt8, comm, nullptr), ncclSuccess)
                << ncclGetLastError(comm);
            for (size_t i = 0; i < count; ++i) in[i] = -2;  // a late reader would see this
            for (int q = 0; q < n; ++q) {
              if (q == r && inPlace) continue;  // overwritten above, on purpose
              for (size_t i = 0; i < count; ++i)
                ASSERT_EQ(recv[q * count + i], value(it, q, i))
                    << "n " << n << " count " << count << " it " << it << " from " << q;
            }
          } else {  // broadcast
            int8_t* in = inPlace ? recv : send;
            if (r == root)
              for (size_t i = 0; i < count; ++i) in[i] = value(it, root, i);
            ASSERT_EQ(ncclBroadcast(in, recv, count, ncclInt8, root, comm, nullptr), ncclSuccess)
                << ncclGetLastError(comm);
            if (r == root) {
              for (size_t i = 0; i < count; ++i) in[i] = -2;
              continue;
            }
            for (size_t i = 0; i < count; ++i)
              ASSERT_EQ(recv[i], value(it, root, i))
                  << "n " << n << " count " << count << " it " << it << " root " << root;
          }
        }
      }
      EXPECT_EQ(os->directOps() - before, expected);
    });
  }
}

// Without TUTTI_CMA, or at or below the one-shot size, or below
// TUTTI_CMA_MIN_BYTES, the same calls take the slots or the rings.
TEST_F(OneShotEnv, SingleCopyOnlyWhereAsked) {
  for (const char* cma : {"0", "1"}) {
    Env env({{"TUTTI_CMA", cma}, {"TUTTI_CMA_MIN_BYTES", "64K"}});
    runRanks(3, [cma](int r, ncclComm_t comm) {
      core::OneShot* os = comm->impl()->oneShot();
      ASSERT_NE(os, nullptr);
      EXPECT_EQ(os->singleCopy(), cma[0] == '1');
      std::vector<int32_t> in(40000), out(40000 * 3);
      for (size_t count : {size_t{1000}, size_t{10000}, size_t{40000}}) {  // 4000, 40000, 160000 B
        std::iota(in.begin(), in.begin() + count, r * 100000);
        ASSERT_EQ(ncclAllGather(in.data(), out.data(), count, ncclInt32, comm, nullptr),
                  ncclSuccess);
        for (int q = 0; q < 3; ++q)
          for (size_t i = 0; i < count; ++i)
            ASSERT_EQ(out[q * count + i], static_cast<int32_t>(q * 100000 + i));
      }
      EXPECT_EQ(os->directOps(), cma[0] == '1' ? 1u : 0u);  // 160000 B only
    });
  }
}

// Ranks whose single-copy calls differ in count are told so, on every rank,
// instead of reading past a buffer.
TEST_F(OneShotEnv, SingleCopyCountMismatchIsReported) {
  Env env({{"TUTTI_CMA", "1"}, {"TUTTI_TIMEOUT", "20"}});
  runRanks(2, [](int r, ncclComm_t comm) {
    std::vector<int32_t> in(5000, r), out(10002, -1);
    ncclResult_t rc = ncclAllGather(in.data(), out.data(), 5000 + r, ncclInt32, comm, nullptr);
    EXPECT_EQ(rc, ncclInvalidUsage);
    std::string err = ncclGetLastError(comm);
    EXPECT_NE(err.find("collective mismatch"), std::string::npos) << err;
    EXPECT_NE(err.find(r == 0 ? "5001" : "5000"), std::string::npos) << err;
  });
}

}  // namespace
}  // namespace tutti::test
