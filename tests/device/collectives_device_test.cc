// Collectives on device memory of the process backend (TUTTI_BACKEND_PLUGIN,
// set per ctest instance: cpu, xpu_emu). Buffers come from ncclMemAlloc and
// are filled and read only through tuttiMemcpy, so with xpu_emu any host
// access tutti made to them would crash the test. Ranks are threads; data are
// integers, so every result is exact.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "capi/handle.h"
#include "core/device_ipc.h"
#include "core/backend.h"
#include "inproc/harness.h"
#include "nccl.h"
#include "tutti/tutti.h"

namespace tutti::test {
namespace {

// n int32 elements of device memory.
struct DevInts {
  explicit DevInts(size_t n) : n(n) {
    EXPECT_EQ(ncclMemAlloc(&p, (n ? n : 1) * 4), ncclSuccess) << ncclGetLastError(nullptr);
  }
  ~DevInts() { EXPECT_EQ(ncclMemFree(p), ncclSuccess); }
  DevInts(const DevInts&) = delete;
  DevInts& operator=(const DevInts&) = delete;
  int32_t* at(size_t i) const { return static_cast<int32_t*>(p) + i; }
  void put(const std::vector<int32_t>& v, size_t off = 0) {
    ASSERT_EQ(tuttiMemcpy(at(off), v.data(), v.size() * 4), ncclSuccess)
        << ncclGetLastError(nullptr);
  }
  std::vector<int32_t> get(size_t count, size_t off = 0) const {
    std::vector<int32_t> v(count);
    EXPECT_EQ(tuttiMemcpy(v.data(), at(off), count * 4), ncclSuccess) << ncclGetLastError(nullptr);
    return v;
  }
  size_t n;
  void* p = nullptr;
};

int32_t val(int rank, size_t i) { return rank * 100003 + static_cast<int32_t>(i % 9973) - 4000; }

std::vector<int32_t> rankData(int rank, size_t count, size_t base = 0) {
  std::vector<int32_t> v(count);
  for (size_t i = 0; i < count; ++i) v[i] = val(rank, base + i);
  return v;
}

const char* backendName() { return tuttiBackendName() ? tuttiBackendName() : "(none)"; }

TEST(DeviceBuffers, MemAllocGivesBackendMemory) {
  ASSERT_NE(tuttiBackendName(), nullptr) << ncclGetLastError(nullptr);
  const char* want = getenv("TUTTI_BACKEND_PLUGIN");
  EXPECT_STREQ(backendName(), want && *want ? want : "cpu");
  void* p = nullptr;
  ASSERT_EQ(ncclMemAlloc(&p, 1000), ncclSuccess);
  auto be = core::processBackend();
  ASSERT_TRUE(be.isOk());
  if (!be.value()->hostOnly()) {
    EXPECT_TRUE(be.value()->isDevice(p));
  }
  std::vector<int32_t> in(250), out(250);
  for (int i = 0; i < 250; ++i) in[i] = i * 7 - 3;
  ASSERT_EQ(tuttiMemcpy(p, in.data(), 1000), ncclSuccess);
  ASSERT_EQ(tuttiMemcpy(out.data(), p, 1000), ncclSuccess);
  EXPECT_EQ(in, out);
  EXPECT_EQ(ncclMemFree(p), ncclSuccess);
  EXPECT_EQ(tuttiMemcpy(nullptr, in.data(), 4), ncclInvalidArgument);
  EXPECT_NE(std::string(ncclGetLastError(nullptr)).find("dst is NULL"), std::string::npos);
}

// Whether a communicator of n ranks (threads of this process) should run its
// collectives device to device (core/device_ipc.h): a backend with IPC, and
// TUTTI_DEVICE_IPC not 0 (ctest runs this suite both ways). Not when xpu_emu
// is told to fail every second IPC export or import: a communicator
// of n >= 2 ranks makes n exports and n (n - 1) imports, so some rank's set-up
// fails in every one of them and all its ranks must fall back to staging
// together (ctest's xpu_emu_ipc_*_fault variants).
bool ipcExpected(int n) {
  auto be = core::processBackend();
  auto set = [](const char* name, const char* value) {
    const char* env = getenv(name);
    return env && std::string(env) == value;
  };
  const bool faults = set("XPU_EMU_FAIL_IPC_EXPORT", "2") || set("XPU_EMU_FAIL_IPC_IMPORT", "2");
  return n >= 2 && be.isOk() && !be.value()->hostOnly() && be.value()->hasIpc() &&
         !set("TUTTI_DEVICE_IPC", "0") && !set("NCCL_SHM_DISABLE", "1") && !faults;
}

// Every collective, in and out of place, on 1, 2, 3 and 5 ranks.
class DeviceCollectives : public ::testing::TestWithParam<int> {};

TEST_P(DeviceCollectives, EveryCollectiveIsExact) {
  const int n = GetParam();
  for (size_t count : {size_t{0}, size_t{1}, size_t{1001}, size_t{70000}}) {
    SCOPED_TRACE(::testing::Message() << backendName() << ", " << n << " ranks, count " << count);
    runRanks(n, [&](int r, ncclComm_t comm) {
      const uint64_t opsBefore = comm->impl()->deviceIpc() ? comm->impl()->deviceIpc()->operations() : 0;
      const size_t all = count * n;
      DevInts send(all), recv(all);
      // all-reduce, out of place and in place (sum)
      send.put(rankData(r, count));
      ASSERT_EQ(ncclAllReduce(send.p, recv.p, count, ncclInt32, ncclSum, comm, nullptr),
                ncclSuccess)
          << ncclGetLastError(comm);
      std::vector<int32_t> got = recv.get(count);
      for (size_t i = 0; i < count; ++i) {
        int64_t want = 0;
        for (int k = 0; k < n; ++k) want += val(k, i);
        ASSERT_EQ(got[i], static_cast<int32_t>(want)) << "all-reduce element " << i;
      }
      ASSERT_EQ(ncclAllReduce(send.p, send.p, count, ncclInt32, ncclMax, comm, nullptr),
                ncclSuccess);
      got = send.get(count);
      for (size_t i = 0; i < count; ++i) ASSERT_EQ(got[i], val(n - 1, i)) << "in-place max " << i;
      // broadcast from the last rank, in place
      send.put(rankData(r, count));
      ASSERT_EQ(ncclBroadcast(send.p, send.p, count, ncclInt32, n - 1, comm, nullptr), ncclSuccess);
      EXPECT_EQ(send.get(count), rankData(n - 1, count)) << "broadcast";
      // reduce (min) to rank 0
      send.put(rankData(r, count));
      ASSERT_EQ(ncclReduce(send.p, recv.p, count, ncclInt32, ncclMin, 0, comm, nullptr),
                ncclSuccess);
      if (r == 0) {
        EXPECT_EQ(recv.get(count), rankData(0, count)) << "reduce";
      }
      // all-gather, out of place and in place
      send.put(rankData(r, count));
      ASSERT_EQ(ncclAllGather(send.p, recv.p, count, ncclInt32, comm, nullptr), ncclSuccess);
      for (int k = 0; k < n; ++k)
        EXPECT_EQ(recv.get(count, k * count), rankData(k, count)) << "all-gather block " << k;
      recv.put(rankData(r, count), r * count);
      ASSERT_EQ(ncclAllGather(recv.at(r * count), recv.p, count, ncclInt32, comm, nullptr),
                ncclSuccess);
      for (int k = 0; k < n; ++k)
        EXPECT_EQ(recv.get(count, k * count), rankData(k, count)) << "in-place all-gather " << k;
      // reduce-scatter (sum), in place
      send.put(rankData(r, all));
      ASSERT_EQ(
          ncclReduceScatter(send.p, send.at(r * count), count, ncclInt32, ncclSum, comm, nullptr),
          ncclSuccess);
      got = send.get(count, r * count);
      for (size_t i = 0; i < count; ++i) {
        int64_t want = 0;
        for (int k = 0; k < n; ++k) want += val(k, r * count + i);
        ASSERT_EQ(got[i], static_cast<int32_t>(want)) << "reduce-scatter element " << i;
      }
      // all-to-all: block k of rank r goes to rank k
      send.put(rankData(r, all));
      ASSERT_EQ(ncclAlltoAll(send.p, recv.p, count, ncclInt32, comm, nullptr), ncclSuccess);
      for (int k = 0; k < n; ++k)
        EXPECT_EQ(recv.get(count, k * count), rankData(k, count, r * count)) << "all-to-all " << k;
      // gather to rank 0, scatter from rank 0
      send.put(rankData(r, count));
      ASSERT_EQ(ncclGather(send.p, recv.p, count, ncclInt32, 0, comm, nullptr), ncclSuccess);
      if (r == 0) {
        for (int k = 0; k < n; ++k)
          EXPECT_EQ(recv.get(count, k * count), rankData(k, count)) << "gather " << k;
      }
      send.put(rankData(r, all));
      ASSERT_EQ(ncclScatter(send.p, recv.p, count, ncclInt32, 0, comm, nullptr), ncclSuccess);
      EXPECT_EQ(recv.get(count), rankData(0, count, r * count)) << "scatter";
      // a ring of sends and receives in one group
      send.put(rankData(r, count));
      ASSERT_EQ(ncclGroupStart(), ncclSuccess);
      ASSERT_EQ(ncclSend(send.p, count, ncclInt32, (r + 1) % n, comm, nullptr), ncclSuccess);
      ASSERT_EQ(ncclRecv(recv.p, count, ncclInt32, (r + n - 1) % n, comm, nullptr), ncclSuccess);
      ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(comm);
      EXPECT_EQ(recv.get(count), rankData((r + n - 1) % n, count)) << "send/recv";
      // a collective and point-to-point in one group (device IPC runs the
      // collective on a thread of its own while the pair is staged)
      DevInts pairSend(count), pairRecv(count);
      send.put(rankData(r, count));
      pairSend.put(rankData(r, count, count));
      ASSERT_EQ(ncclGroupStart(), ncclSuccess);
      ASSERT_EQ(ncclAllReduce(send.p, recv.p, count, ncclInt32, ncclSum, comm, nullptr),
                ncclSuccess);
      ASSERT_EQ(ncclSend(pairSend.p, count, ncclInt32, (r + 1) % n, comm, nullptr), ncclSuccess);
      ASSERT_EQ(ncclRecv(pairRecv.p, count, ncclInt32, (r + n - 1) % n, comm, nullptr),
                ncclSuccess);
      ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(comm);
      got = recv.get(count);
      for (size_t i = 0; i < count; ++i) {
        int64_t want = 0;
        for (int k = 0; k < n; ++k) want += val(k, i);
        ASSERT_EQ(got[i], static_cast<int32_t>(want)) << "grouped all-reduce element " << i;
      }
      EXPECT_EQ(pairRecv.get(count), rankData((r + n - 1) % n, count, count))
          << "grouped send/recv";
      // The path taken: device to device when the backend offers IPC.
      EXPECT_EQ(comm->impl()->deviceIpc() != nullptr, ipcExpected(n));
      // 11 collectives above (none when count is 0; send/recv are staged).
      if (comm->impl()->deviceIpc()) {
        EXPECT_EQ(comm->impl()->deviceIpc()->operations() - opsBefore, count ? 11u : 0u);
      }
    });
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, DeviceCollectives, ::testing::Values(1, 2, 3, 5));

// Calls that do not match between ranks fail on the device-to-device path
// too (issue 28): each of its barriers carries a fingerprint of the call, and
// the first barrier comes before any rank reads a peer's buffer. Here ranks
// disagree on the reduction, on the datatype (of one size) and on the root:
// without the fingerprint the all-reduce returned a mix of sum and max, with
// success on both ranks.
TEST(DeviceBuffers, MismatchedCallsFailOnTheDevicePath) {
  if (!ipcExpected(2)) GTEST_SKIP() << "no device-to-device path with " << backendName();
  Env env({std::make_pair("TUTTI_TIMEOUT", "20")});
  enum { kOp, kType, kRoot };
  for (int c : {kOp, kType, kRoot}) {
    SCOPED_TRACE(c == kOp ? "op" : c == kType ? "datatype" : "root");
    runRanks(2, [&](int r, ncclComm_t comm) {
      const size_t count = 70000;
      DevInts send(count), recv(count);
      send.put(rankData(r, count));
      const uint64_t before = comm->impl()->deviceIpc()->operations();
      ncclResult_t rc = ncclInternalError;
      if (c == kOp)
        rc = ncclAllReduce(send.p, recv.p, count, ncclInt32, r ? ncclMax : ncclSum, comm, nullptr);
      else if (c == kType)
        rc = ncclAllReduce(send.p, recv.p, count, r ? ncclUint32 : ncclInt32, ncclSum, comm,
                           nullptr);
      else
        rc = ncclBroadcast(send.p, recv.p, count, ncclInt32, r, comm, nullptr);
      EXPECT_EQ(rc, ncclInvalidUsage) << "rank " << r;
      EXPECT_NE(std::string(ncclGetLastError(comm)).find("collective mismatch"), std::string::npos)
          << "rank " << r << ": " << ncclGetLastError(comm);
      EXPECT_EQ(comm->impl()->deviceIpc()->operations(), before + 1) << "took another path";
    });
  }
}

// One thread drives every rank (ncclCommInitAll, one group over all the
// communicators): the ranks must progress together, so every communicator's
// device-to-device collectives and its staged operations (here a ring of
// sends and receives) progress in one executor loop on that thread.
TEST(DeviceBuffers, OneThreadDrivesEveryRank) {
  const int n = 3;
  const size_t count = 50001;
  std::vector<ncclComm_t> comms(n);
  auto be = core::processBackend();
  ASSERT_TRUE(be.isOk()) << be.status().message();
  auto devices = be.value()->deviceCount();
  ASSERT_TRUE(devices.isOk() && devices.value() > 0);
  std::vector<int> devlist(n);
  for (int r = 0; r < n; ++r) devlist[r] = r % devices.value();  // ranks may share a device
  ASSERT_EQ(ncclCommInitAll(comms.data(), n, devlist.data()), ncclSuccess)
      << ncclGetLastError(nullptr);
  {
    std::vector<std::unique_ptr<DevInts>> send, recv, ring;
    const size_t ringCount = 1001;
    for (int r = 0; r < n; ++r) {
      send.push_back(std::make_unique<DevInts>(count));
      recv.push_back(std::make_unique<DevInts>(count * n));
      ring.push_back(std::make_unique<DevInts>(ringCount));
      send[r]->put(rankData(r, count));
    }
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    for (int r = 0; r < n; ++r) {
      ASSERT_EQ(ncclAllReduce(send[r]->p, recv[r]->p, count, ncclInt32, ncclSum, comms[r], nullptr),
                ncclSuccess);
      ASSERT_EQ(
          ncclAllGather(send[r]->p, recv[r]->at(count), count / n, ncclInt32, comms[r], nullptr),
          ncclSuccess);
      ASSERT_EQ(ncclSend(send[r]->p, ringCount, ncclInt32, (r + 1) % n, comms[r], nullptr),
                ncclSuccess);
      ASSERT_EQ(ncclRecv(ring[r]->p, ringCount, ncclInt32, (r + n - 1) % n, comms[r], nullptr),
                ncclSuccess);
    }
    ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
    for (int r = 0; r < n; ++r) {
      std::vector<int32_t> got = recv[r]->get(count);
      for (size_t i = 0; i < count; ++i) {
        int64_t want = 0;
        for (int k = 0; k < n; ++k) want += val(k, i);
        ASSERT_EQ(got[i], static_cast<int32_t>(want)) << "rank " << r << " element " << i;
      }
      for (int k = 0; k < n; ++k)
        EXPECT_EQ(recv[r]->get(count / n, count + k * (count / n)), rankData(k, count / n))
            << "rank " << r << " all-gather block " << k;
      EXPECT_EQ(ring[r]->get(ringCount), rankData((r + n - 1) % n, ringCount))
          << "rank " << r << " received from its left neighbour";
      EXPECT_EQ(comms[r]->impl()->deviceIpc() != nullptr, ipcExpected(n));
    }
  }
  for (ncclComm_t c : comms) EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
}

// The stream passed to a collective orders it: work enqueued earlier on that
// queue (here: the copy that fills the input) happens before, work enqueued
// after it (the copy of the result) sees the result, with no synchronisation
// by the caller in between.
TEST(DeviceBuffers, StreamOrdersTheCollective) {
  auto be = core::processBackend();
  ASSERT_TRUE(be.isOk()) << be.status().message();
  core::Backend* b = be.value();
  const int n = 2;
  const size_t count = 1 << 18;
  runRanks(n, [&](int r, ncclComm_t comm) {
    auto q = b->queueCreate(0);
    ASSERT_TRUE(q.isOk()) << q.status().message();
    DevInts buf(count);
    auto pinIn = b->hostAlloc(count * 4), pinOut = b->hostAlloc(count * 4);
    ASSERT_TRUE(pinIn.isOk() && pinOut.isOk());
    std::vector<int32_t> in = rankData(r, count);
    memcpy(pinIn.value(), in.data(), count * 4);
    for (int round = 0; round < 3; ++round) {
      ASSERT_TRUE(b->copyAsync(buf.p, pinIn.value(), count * 4, q.value()).isOk());
      ASSERT_EQ(ncclAllReduce(buf.p, buf.p, count, ncclInt32, ncclSum, comm,
                              reinterpret_cast<cudaStream_t>(q.value())),
                ncclSuccess)
          << ncclGetLastError(comm);
      memset(pinOut.value(), 0xff, count * 4);
      ASSERT_TRUE(b->copyAsync(pinOut.value(), buf.p, count * 4, q.value()).isOk());
      ASSERT_TRUE(b->sync(q.value()).isOk());
      const int32_t* out = static_cast<const int32_t*>(pinOut.value());
      for (size_t i = 0; i < count; i += 997)
        ASSERT_EQ(out[i], val(0, i) + val(1, i)) << "round " << round << " element " << i;
    }
    EXPECT_TRUE(b->hostFree(pinIn.value()).isOk());
    EXPECT_TRUE(b->hostFree(pinOut.value()).isOk());
    EXPECT_TRUE(b->queueDestroy(q.value()).isOk());
  });
}

// The compressed all-reduce honours its stream like any collective: the
// input written on the queue before the call is what is reduced, and a copy
// queued after the call sees the result. fp16 carries these small integers
// exactly; PowerSGD recovers a rank-1 average (every rank's gradient is a
// multiple of one outer product) to float rounding in one step.
TEST(DeviceBuffers, CompressedAllReduceFollowsTheStream) {
  auto be = core::processBackend();
  ASSERT_TRUE(be.isOk()) << be.status().message();
  core::Backend* b = be.value();
  const int n = 2;
  const size_t rows = 64, cols = 48, count = rows * cols;
  for (tuttiCompression_t kind : {tuttiCompressFp16, tuttiCompressPowerSGD}) {
    SCOPED_TRACE(kind == tuttiCompressFp16 ? "fp16" : "PowerSGD");
    runRanks(n, [&](int r, ncclComm_t comm) {
      tuttiCompressionConfig_t cfg = TUTTI_COMPRESSION_CONFIG_INITIALIZER;
      cfg.kind = kind;
      cfg.powerSgdRank = 2;
      tuttiCompressor_t c = nullptr;
      ASSERT_EQ(tuttiCompressorCreate(comm, &cfg, &c), ncclSuccess) << ncclGetLastError(comm);
      auto q = b->queueCreate(0);
      ASSERT_TRUE(q.isOk()) << q.status().message();
      void* buf = nullptr;
      ASSERT_EQ(ncclMemAlloc(&buf, count * 4), ncclSuccess);
      auto pinIn = b->hostAlloc(count * 4), pinOut = b->hostAlloc(count * 4);
      ASSERT_TRUE(pinIn.isOk() && pinOut.isOk());
      auto* in = static_cast<float*>(pinIn.value());
      // rank r: (r + 1) * u v^T with small integers u, v; the sum is 3 u v^T
      auto u = [](size_t i) { return static_cast<float>(i % 7) - 3.0f; };
      auto v = [](size_t j) { return static_cast<float>(j % 5) + 1.0f; };
      for (size_t i = 0; i < rows; ++i)
        for (size_t j = 0; j < cols; ++j)
          in[i * cols + j] = static_cast<float>(r + 1) * u(i) * v(j);
      for (int round = 0; round < 2; ++round) {
        ASSERT_TRUE(b->copyAsync(buf, in, count * 4, q.value()).isOk());
        ASSERT_EQ(tuttiAllReduceCompressed(buf, buf, count, ncclFloat32, ncclSum, c, 7, rows, cols,
                                           reinterpret_cast<cudaStream_t>(q.value())),
                  ncclSuccess)
            << ncclGetLastError(comm);
        memset(pinOut.value(), 0xff, count * 4);
        ASSERT_TRUE(b->copyAsync(pinOut.value(), buf, count * 4, q.value()).isOk());
        ASSERT_TRUE(b->sync(q.value()).isOk());
        const auto* out = static_cast<const float*>(pinOut.value());
        for (size_t i = 0; i < rows; ++i)
          for (size_t j = 0; j < cols; ++j) {
            const float want = 3.0f * u(i) * v(j);
            ASSERT_NEAR(out[i * cols + j], want, kind == tuttiCompressFp16 ? 0.0f : 1e-4f * 45)
                << "round " << round << " element " << i << "," << j;
          }
      }
      EXPECT_TRUE(b->hostFree(pinIn.value()).isOk());
      EXPECT_TRUE(b->hostFree(pinOut.value()).isOk());
      EXPECT_EQ(ncclMemFree(buf), ncclSuccess);
      EXPECT_TRUE(b->queueDestroy(q.value()).isOk());
      EXPECT_EQ(tuttiCompressorDestroy(c), ncclSuccess);
    });
  }
}

// Float average and a PreMulSum operator whose scalar lives in device memory.
TEST(DeviceBuffers, AverageAndDeviceScalarPreMulSum) {
  const int n = 4;  // ncclAvg on floats scales each contribution by 1/n: exact for 4
  const size_t count = 5000;
  runRanks(n, [&](int r, ncclComm_t comm) {
    std::vector<float> in(count);
    for (size_t i = 0; i < count; ++i) in[i] = static_cast<float>((r + 1) * 3 + i % 17);
    void *send = nullptr, *recv = nullptr, *scalar = nullptr;
    ASSERT_EQ(ncclMemAlloc(&send, count * 4), ncclSuccess);
    ASSERT_EQ(ncclMemAlloc(&recv, count * 4), ncclSuccess);
    ASSERT_EQ(ncclMemAlloc(&scalar, 4), ncclSuccess);
    ASSERT_EQ(tuttiMemcpy(send, in.data(), count * 4), ncclSuccess);
    // avg of (r+1)*3 + i%17 over r = 0..3 is 7.5 + i%17: exact in float.
    ASSERT_EQ(ncclAllReduce(send, recv, count, ncclFloat32, ncclAvg, comm, nullptr), ncclSuccess);
    std::vector<float> out(count);
    ASSERT_EQ(tuttiMemcpy(out.data(), recv, count * 4), ncclSuccess);
    for (size_t i = 0; i < count; ++i) ASSERT_EQ(out[i], 7.5f + i % 17) << i;
    const float two = 2.0f;
    ASSERT_EQ(tuttiMemcpy(scalar, &two, 4), ncclSuccess);
    ncclRedOp_t op;
    ASSERT_EQ(ncclRedOpCreatePreMulSum(&op, scalar, ncclFloat32, ncclScalarDevice, comm),
              ncclSuccess)
        << ncclGetLastError(comm);
    ASSERT_EQ(ncclAllReduce(send, recv, count, ncclFloat32, op, comm, nullptr), ncclSuccess);
    ASSERT_EQ(tuttiMemcpy(out.data(), recv, count * 4), ncclSuccess);
    for (size_t i = 0; i < count; ++i) ASSERT_EQ(out[i], 2.0f * (30.0f + 4 * (i % 17))) << i;
    EXPECT_EQ(ncclRedOpDestroy(op, comm), ncclSuccess);
    EXPECT_EQ(ncclMemFree(send), ncclSuccess);
    EXPECT_EQ(ncclMemFree(recv), ncclSuccess);
    EXPECT_EQ(ncclMemFree(scalar), ncclSuccess);
  });
}

}  // namespace
}  // namespace tutti::test
