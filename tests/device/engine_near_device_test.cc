// The engine thread runs near its communicator's device (core/engine.h,
// docs/topology.md "Placement"). On xpu_emu with TUTTI_TOPO_FILE naming
// tests/device/data/topo_2numa_2cpu_xpu.xml (NUMA 0 = CPU 0, NUMA 1 = CPU 1,
// accelerator 0000:65:00.0 under NUMA 1): two ranks as threads pinned to CPU
// 0 run an all-reduce on a device stream, which starts each communicator's
// engine thread (named tutti-engine), and the test reads those threads'
// Cpus_allowed_list in /proc/self/task/<tid>/status. (Threads an engine
// starts, such as the xpu_emu worker of the engine's own queue, inherit its
// name and mask, so there are at least two such threads, all alike.)
// - BoundNearTheDevice (ctest device.engine_near.bound: XPU_EMU_PCI_BUS_IDS
//   gives device 0 the bus id 0000:65:00.0): every engine thread is on CPU 1
//   only, though the threads that started them are on CPU 0.
// - KeepsTheCallersMaskWithoutABusId (ctest device.engine_near.unknown: the
//   variable unset, so xpu_emu answers ""): the engine threads keep the mask
//   they inherited, CPU 0.
// - NearTheNicOverTcp (ctest device.engine_near.nic and .nic_shm: the CPU
//   backend, NCCL_SOCKET_IFNAME=lo, which the fixture places on NIC
//   0000:67:00.0 under NUMA 1): two non-blocking communicators on host
//   memory run an all-reduce on their engines. Over TCP (NCCL_SHM_DISABLE=1)
//   every engine thread is on CPU 1 only; over shared memory the NIC carries
//   nothing and they keep the caller's mask, CPU 0.
// All need CPUs 0 and 1 in the process's mask (else skipped).
#include <dirent.h>
#include <gtest/gtest.h>
#include <pthread.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "capi/handle.h"
#include "core/backend.h"
#include "core/comm.h"
#include "core/engine.h"
#include "inproc/harness.h"
#include "nccl.h"
#include "topology/topology.h"

namespace tutti::test {
namespace {

constexpr size_t kCount = 1 << 16;

// "Cpus_allowed_list" of one thread of this process.
std::string cpusAllowed(const std::string& tid) {
  std::ifstream in("/proc/self/task/" + tid + "/status");
  std::string line;
  const std::string key = "Cpus_allowed_list:";
  while (std::getline(in, line))
    if (line.rfind(key, 0) == 0) {
      std::string v = line.substr(key.size());
      v.erase(0, v.find_first_not_of(" \t"));
      return v;
    }
  return "?";
}

// tid -> Cpus_allowed_list of every thread named tutti-engine.
std::vector<std::pair<std::string, std::string>> engineThreads() {
  std::vector<std::pair<std::string, std::string>> out;
  if (DIR* d = opendir("/proc/self/task")) {
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] == '.') continue;
      std::ifstream comm(std::string("/proc/self/task/") + e->d_name + "/comm");
      std::string name;
      std::getline(comm, name);
      if (name == "tutti-engine") out.emplace_back(e->d_name, cpusAllowed(e->d_name));
    }
    closedir(d);
  }
  return out;
}

// Spins until n threads have arrived at this point (reusable per counter).
void meet(std::atomic<int>& count, int n) {
  count.fetch_add(1);
  while (count.load() < n) std::this_thread::yield();
}

// Why this machine cannot run the fixture, "" when it can: CPUs 0 and 1 in
// the process's mask, and an hwloc that reads hand-written XML.
std::string fixtureUnusable() {
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) {
    ADD_FAILURE() << "sched_getaffinity: " << strerror(errno);  // a failure, not a skip
    return "sched_getaffinity failed";
  }
  if (!CPU_ISSET(0, &allowed) || !CPU_ISSET(1, &allowed))
    return "needs CPUs 0 and 1 in the process's mask (the fixture's two NUMA nodes)";
  if (!topo::hwlocReadsAnyXml())
    return "hwloc cannot read the hand-written fixture here: its libxml2 reader (Debian package "
           "libhwloc-plugins) is not installed or HWLOC_LIBXML=0";
  return "";
}

// Runs two ranks on threads pinned to CPU 0; each runs an all-reduce on a
// device stream (starting its engine), checks the sum, and then, with both
// engines alive, `inspect` sees the engine threads and this rank's comm.
void runPinnedToCpu0(
    const std::function<void(int, core::Comm&,
                             const std::vector<std::pair<std::string, std::string>>&)>& inspect) {
  if (const std::string why = fixtureUnusable(); !why.empty()) GTEST_SKIP() << why;
  const char* topoFile = getenv("TUTTI_TOPO_FILE");
  ASSERT_NE(topoFile, nullptr) << "run through ctest: TUTTI_TOPO_FILE names the fixture";
  ASSERT_NE(std::string(topoFile).find("topo_2numa_2cpu_xpu.xml"), std::string::npos) << topoFile;
  auto be = core::processBackend();
  ASSERT_TRUE(be.isOk()) << be.status().message();
  ASSERT_FALSE(be.value()->hostOnly()) << "run with TUTTI_BACKEND_PLUGIN=xpu_emu";
  ASSERT_TRUE(be.value()->hasHostEvents()) << "the engine needs host events";
  std::atomic<int> ran{0}, seen{0};
  std::thread([&] {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(0, &one);
    ASSERT_EQ(pthread_setaffinity_np(pthread_self(), sizeof one, &one), 0);
    runRanks(2, [&](int r, ncclComm_t comm) {  // rank threads inherit CPU 0
      core::Backend* b = be.value();
      auto q = b->queueCreate(0);
      ASSERT_TRUE(q.isOk()) << q.status().message();
      void* buf = nullptr;
      ASSERT_EQ(ncclMemAlloc(&buf, kCount * sizeof(float)), ncclSuccess);
      std::vector<float> in(kCount, static_cast<float>(r + 1)), out(kCount);
      ASSERT_TRUE(b->copyAsync(buf, in.data(), kCount * sizeof(float), q.value()).isOk());
      ASSERT_EQ(ncclAllReduce(buf, buf, kCount, ncclFloat32, ncclSum, comm,
                              reinterpret_cast<cudaStream_t>(q.value())),
                ncclSuccess)
          << ncclGetLastError(comm);
      ASSERT_TRUE(b->copyAsync(out.data(), buf, kCount * sizeof(float), q.value()).isOk());
      ASSERT_TRUE(b->sync(q.value()).isOk());
      EXPECT_EQ(out[0], 3.0f);
      EXPECT_EQ(out[kCount - 1], 3.0f);
      comm->impl()->drainEngine();  // the stream is released just before the job counts
      EXPECT_GE(comm->impl()->engine().jobsRun(), 1u) << "the all-reduce ran on the engine";
      meet(ran, 2);  // both engines started
      inspect(r, *comm->impl(), engineThreads());
      meet(seen, 2);  // neither communicator is destroyed while the other looks
      EXPECT_EQ(ncclMemFree(buf), ncclSuccess);
      EXPECT_TRUE(b->queueDestroy(q.value()).isOk());
    });
  }).join();
}

TEST(EngineNearDevice, BoundNearTheDevice) {
  const char* ids = getenv("XPU_EMU_PCI_BUS_IDS");
  ASSERT_NE(ids, nullptr) << "run through ctest device.engine_near.bound";
  runPinnedToCpu0([](int r, core::Comm& c, const auto& engines) {
    EXPECT_EQ(c.device(), 0);
    EXPECT_EQ(c.deviceNuma(), 1) << "rank " << r << ": device 0 is 0000:65:00.0, under NUMA 1";
    EXPECT_EQ(c.homeNuma(), 0) << "rank " << r << ": its thread is on CPU 0";
    EXPECT_GE(engines.size(), 2u) << "one engine thread per communicator";
    for (const auto& [tid, cpus] : engines)
      EXPECT_EQ(cpus, "1") << "rank " << r << " sees engine thread " << tid << " allowed on CPUs "
                           << cpus << ", not near the device (CPU 1)";
  });
}

TEST(EngineNearDevice, KeepsTheCallersMaskWithoutABusId) {
  ASSERT_EQ(getenv("XPU_EMU_PCI_BUS_IDS"), nullptr)
      << "run through ctest device.engine_near.unknown";
  runPinnedToCpu0([](int r, core::Comm& c, const auto& engines) {
    EXPECT_EQ(c.deviceNuma(), -1) << "rank " << r << ": xpu_emu gives no bus id";
    const std::string mine = cpusAllowed(std::to_string(syscall(SYS_gettid)));
    EXPECT_EQ(mine, "0");
    EXPECT_GE(engines.size(), 2u) << "one engine thread per communicator";
    for (const auto& [tid, cpus] : engines)
      EXPECT_EQ(cpus, mine) << "rank " << r << " sees engine thread " << tid << " allowed on CPUs "
                            << cpus << ", not the inherited mask";
  });
}

TEST(EngineNearNic, NearTheNicOverTcp) {
  if (const std::string why = fixtureUnusable(); !why.empty()) GTEST_SKIP() << why;
  ASSERT_NE(getenv("TUTTI_TOPO_FILE"), nullptr) << "run through ctest device.engine_near.nic";
  const char* shmOff = getenv("NCCL_SHM_DISABLE");
  const bool tcp = shmOff && std::string(shmOff) == "1";
  auto be = core::processBackend();
  ASSERT_TRUE(be.isOk()) << be.status().message();
  ASSERT_TRUE(be.value()->hostOnly()) << "run with the CPU backend (no TUTTI_BACKEND_PLUGIN)";
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  std::atomic<int> ran{0}, seen{0};
  std::thread([&] {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(0, &one);
    ASSERT_EQ(pthread_setaffinity_np(pthread_self(), sizeof one, &one), 0);
    std::vector<std::thread> ranks;
    for (int r = 0; r < 2; ++r)
      ranks.emplace_back([&, r] {  // inherit CPU 0
        ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
        cfg.blocking = 0;
        ncclComm_t comm = nullptr;
        ASSERT_EQ(ncclCommInitRankConfig(&comm, 2, id, r, &cfg), ncclInProgress);
        auto settle = [&] {
          ncclResult_t st = ncclInProgress;
          while (st == ncclInProgress) EXPECT_EQ(ncclCommGetAsyncError(comm, &st), ncclSuccess);
          return st;
        };
        ASSERT_EQ(settle(), ncclSuccess) << ncclGetLastError(comm);
        std::vector<int32_t> v(kCount, r + 1), out(kCount, 0);
        ASSERT_EQ(ncclAllReduce(v.data(), out.data(), kCount, ncclInt32, ncclSum, comm, nullptr),
                  ncclInProgress);
        ASSERT_EQ(settle(), ncclSuccess) << ncclGetLastError(comm);
        EXPECT_EQ(out[0], 3);
        EXPECT_EQ(out[kCount - 1], 3);
        meet(ran, 2);  // both engines started
        EXPECT_EQ(comm->impl()->nicNuma(), tcp ? 1 : -1)
            << "rank " << r << ": lo is NIC 0000:67:00.0, under NUMA 1";
        const auto engines = engineThreads();
        EXPECT_GE(engines.size(), 2u) << "one engine thread per communicator";
        for (const auto& [tid, cpus] : engines)
          EXPECT_EQ(cpus, tcp ? "1" : "0")
              << "rank " << r << " sees engine thread " << tid << " allowed on CPUs " << cpus;
        meet(seen, 2);
        EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
      });
    for (auto& t : ranks) t.join();
  }).join();
}

}  // namespace
}  // namespace tutti::test
