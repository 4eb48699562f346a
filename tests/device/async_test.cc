// Operations on device streams return as soon as they are queued (the
// communicator's engine, core/engine.h), whatever the peers are doing, and
// produce their data in stream order. Run on xpu_emu, whose queues run on
// their own threads like a real device's: a synchronous implementation (the
// caller blocked until the collective ends) fails AsyncReturn. Two ranks as
// threads; rank 1 calls kLateMs late.
#include <dirent.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "core/backend.h"
#include "inproc/harness.h"
#include "nccl.h"
#include "tutti/tutti.h"

namespace tutti::test {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int kLateMs = 500;
constexpr size_t kCount = 1 << 20;  // 4 MiB of float

double msSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

int threadCount() {
  int n = 0;
  if (DIR* d = opendir("/proc/self/task")) {
    while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
    closedir(d);
  }
  return n;
}

// Voluntary context switches (the times a thread blocked) of this process's
// engine threads (named "tutti-engine", base/thread.cc), summed; -1 when
// there is none.
long engineBlocks() {
  long sum = -1;
  DIR* d = opendir("/proc/self/task");
  if (d == nullptr) return -1;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    const std::string task = std::string("/proc/self/task/") + e->d_name;
    char name[32] = {};
    if (FILE* f = fopen((task + "/comm").c_str(), "r")) {
      if (!fgets(name, sizeof name, f)) name[0] = 0;
      fclose(f);
    }
    if (strcmp(name, "tutti-engine\n") != 0) continue;
    if (FILE* f = fopen((task + "/status").c_str(), "r")) {
      char line[256];
      long n = 0;
      while (fgets(line, sizeof line, f))
        if (sscanf(line, "voluntary_ctxt_switches: %ld", &n) == 1) sum = (sum < 0 ? 0 : sum) + n;
      fclose(f);
    }
  }
  closedir(d);
  return sum;
}

// One rank's device side: a queue and device buffers from the backend.
struct Rank {
  core::Backend* be = nullptr;
  core::Queue q = nullptr;
  std::vector<void*> bufs;
  Rank() {
    auto b = core::processBackend();
    EXPECT_TRUE(b.isOk()) << b.status().message();
    be = b.value();
    auto queue = be->queueCreate(0);
    EXPECT_TRUE(queue.isOk()) << queue.status().message();
    q = queue.value();
  }
  ~Rank() {
    for (void* p : bufs) EXPECT_EQ(ncclMemFree(p), ncclSuccess);
    EXPECT_TRUE(be->queueDestroy(q).isOk());
  }
  float* alloc(size_t count) {
    void* p = nullptr;
    EXPECT_EQ(ncclMemAlloc(&p, count * sizeof(float)), ncclSuccess) << ncclGetLastError(nullptr);
    bufs.push_back(p);
    return static_cast<float*>(p);
  }
  cudaStream_t stream() const { return reinterpret_cast<cudaStream_t>(q); }
  // Written on the queue right before the call, as a kernel would.
  void put(float* dst, const std::vector<float>& v) {
    ASSERT_TRUE(be->copyAsync(dst, v.data(), v.size() * sizeof(float), q).isOk());
  }
  std::vector<float> get(const float* src, size_t count) {
    std::vector<float> v(count);
    EXPECT_TRUE(be->copyAsync(v.data(), src, count * sizeof(float), q).isOk());
    EXPECT_TRUE(be->sync(q).isOk());
    return v;
  }
};

// Integer-valued, small enough that fp16 and every sum of two ranks are exact.
float value(int rank, size_t i) { return static_cast<float>((i % 251) + 300 * rank); }
std::vector<float> data(int rank, size_t count) {
  std::vector<float> v(count);
  for (size_t i = 0; i < count; ++i) v[i] = value(rank, i);
  return v;
}

enum class Kind { kAllReduce, kAllGather, kBroadcast, kSendRecv, kCompressed };
const char* kindName(Kind k) {
  switch (k) {
    case Kind::kAllReduce:
      return "AllReduceInPlace";
    case Kind::kAllGather:
      return "AllGather";
    case Kind::kBroadcast:
      return "Broadcast";
    case Kind::kSendRecv:
      return "GroupedSendRecv";
    case Kind::kCompressed:
      return "CompressedAllReduce";
  }
  return "?";
}

// The premise of every test here: a device backend whose queues can be held
// by host events (else the operations run synchronously, by design).
void requireEngineBackend() {
  auto b = core::processBackend();
  ASSERT_TRUE(b.isOk()) << b.status().message();
  ASSERT_FALSE(b.value()->hostOnly()) << "run with TUTTI_BACKEND_PLUGIN=xpu_emu";
  ASSERT_TRUE(b.value()->hasHostEvents()) << b.value()->name() << " has no host events";
}

class AsyncReturn : public ::testing::TestWithParam<Kind> {
 protected:
  void SetUp() override { requireEngineBackend(); }
};

// The input, written on the queue right before the call (not timed: a copy
// from pageable memory may wait for the queue to read it).
void prepare(Kind k, int r, Rank& d, float* in) {
  d.put(in, data(r, k == Kind::kAllGather ? kCount / 2 : kCount));
}

// The call on each rank.
ncclResult_t call(Kind k, int r, ncclComm_t comm, Rank& d, float* in, float* out,
                  tuttiCompressor_t z) {
  const int peer = 1 - r;
  switch (k) {
    case Kind::kAllReduce:
      return ncclAllReduce(in, in, kCount, ncclFloat32, ncclSum, comm, d.stream());
    case Kind::kAllGather:
      return ncclAllGather(in, out, kCount / 2, ncclFloat32, comm, d.stream());
    case Kind::kBroadcast:
      return ncclBroadcast(in, out, kCount, ncclFloat32, 1, comm, d.stream());
    case Kind::kSendRecv: {
      ncclResult_t rc = ncclGroupStart();
      if (rc == ncclSuccess) rc = ncclSend(in, kCount, ncclFloat32, peer, comm, d.stream());
      if (rc == ncclSuccess) rc = ncclRecv(out, kCount, ncclFloat32, peer, comm, d.stream());
      ncclResult_t end = ncclGroupEnd();
      return rc != ncclSuccess ? rc : end;
    }
    case Kind::kCompressed:
      return tuttiAllReduceCompressed(in, out, kCount, ncclFloat32, ncclSum, z, 7, 0, 0,
                                      d.stream());
  }
  return ncclInternalError;
}

void check(Kind k, int r, Rank& d, float* in, float* out) {
  const int peer = 1 - r;
  switch (k) {
    case Kind::kAllReduce:
    case Kind::kCompressed: {
      auto got = d.get(k == Kind::kAllReduce ? in : out, kCount);
      for (size_t i = 0; i < kCount; ++i)
        ASSERT_EQ(got[i], value(0, i) + value(1, i)) << "rank " << r << " element " << i;
      break;
    }
    case Kind::kAllGather: {
      auto got = d.get(out, kCount);
      for (size_t i = 0; i < kCount; ++i)
        ASSERT_EQ(got[i], value(static_cast<int>(i / (kCount / 2)), i % (kCount / 2)))
            << "rank " << r << " element " << i;
      break;
    }
    case Kind::kBroadcast: {
      auto got = d.get(out, kCount);
      for (size_t i = 0; i < kCount; ++i)
        ASSERT_EQ(got[i], value(1, i)) << "rank " << r << " element " << i;
      break;
    }
    case Kind::kSendRecv: {
      auto got = d.get(out, kCount);
      for (size_t i = 0; i < kCount; ++i)
        ASSERT_EQ(got[i], value(peer, i)) << "rank " << r << " element " << i;
      break;
    }
  }
}

TEST_P(AsyncReturn, BeforeTheLatePeerCalls) {
  const Kind k = GetParam();
  // When the late rank made its call (its clock: the ranks are threads of
  // one process), for the check that rank 0's result came after it.
  std::atomic<int64_t> peerCalledNs{0};
  runRanks(2, [&](int r, ncclComm_t comm) {
    Rank d;
    float* in = d.alloc(kCount);
    float* out = d.alloc(kCount);
    tuttiCompressor_t z = nullptr;
    if (k == Kind::kCompressed) {
      tuttiCompressionConfig_t cfg = TUTTI_COMPRESSION_CONFIG_INITIALIZER;
      cfg.kind = tuttiCompressFp16;
      ASSERT_EQ(tuttiCompressorCreate(comm, &cfg, &z), ncclSuccess) << ncclGetLastError(comm);
    }
    // A first call of the kind (connections, schedules), both ranks on time.
    prepare(k, r, d, in);
    ASSERT_EQ(call(k, r, comm, d, in, out, z), ncclSuccess) << ncclGetLastError(comm);
    check(k, r, d, in, out);
    prepare(k, r, d, in);
    if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(kLateMs));
    const auto t0 = Clock::now();
    if (r == 1) peerCalledNs = t0.time_since_epoch().count();
    ASSERT_EQ(call(k, r, comm, d, in, out, z), ncclSuccess) << ncclGetLastError(comm);
    const double ms = msSince(t0);
    // Rank 0 returns while rank 1 is still asleep (a synchronous call takes
    // at least kLateMs); generous for a loaded machine, far below kLateMs.
    if (r == 0) {
      EXPECT_LT(ms, kLateMs / 5.0) << kindName(k) << " returned after " << ms << " ms";
      printf("[  async   ] %s returned in %.3f ms (peer %d ms late)\n", kindName(k), ms, kLateMs);
    }
    check(k, r, d, in, out);
    // The result exists only once the peer has called, so by the time rank 0
    // has read it the peer's call has begun. (This was measured from rank 0's
    // own t0, which depended on when each rank left the first call: under
    // ASan rank 0's t0 came 200 ms after rank 1 began its sleep.)
    if (r == 0) {
      EXPECT_NE(peerCalledNs.load(), 0) << "the result came before the peer called";
    }
    ncclResult_t async = ncclInternalError;
    EXPECT_EQ(ncclCommGetAsyncError(comm, &async), ncclSuccess);
    EXPECT_EQ(async, ncclSuccess);
    if (z) {
      EXPECT_EQ(tuttiCompressorDestroy(z), ncclSuccess);
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Kinds, AsyncReturn,
                         ::testing::Values(Kind::kAllReduce, Kind::kAllGather, Kind::kBroadcast,
                                           Kind::kSendRecv, Kind::kCompressed),
                         [](const auto& info) { return std::string(kindName(info.param)); });

// One engine thread per communicator, however many operations it runs.
TEST(AsyncEngine, ThreadCountStaysConstant) {
  requireEngineBackend();
  // The ranks are threads of this process: both count at the same points.
  std::atomic<int> arrived{0};
  auto meet = [&](int round) {
    arrived++;
    while (arrived.load() < 2 * round) std::this_thread::yield();
  };
  std::vector<int> before(2), after(2);
  runRanks(2, [&](int r, ncclComm_t comm) {
    Rank d;
    float* buf = d.alloc(256);
    d.put(buf, data(r, 256));
    ASSERT_EQ(ncclAllReduce(buf, buf, 256, ncclFloat32, ncclSum, comm, d.stream()), ncclSuccess);
    d.get(buf, 256);
    meet(1);
    before[r] = threadCount();
    meet(2);
    for (int i = 0; i < 2000; ++i)
      ASSERT_EQ(ncclAllReduce(buf, buf, 256, ncclFloat32, ncclMax, comm, d.stream()), ncclSuccess);
    d.get(buf, 256);
    meet(3);
    after[r] = threadCount();
    meet(4);
  });
  EXPECT_EQ(after, before);
}

// Abort while an operation waits on the engine for a peer that never calls:
// the abort returns promptly, the stream is released, the peer's abort too.
TEST(AsyncEngine, AbortEndsAQueuedOperation) {
  requireEngineBackend();
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  std::vector<ncclComm_t> comms(2);
  std::vector<std::thread> init;
  for (int r = 0; r < 2; ++r)
    init.emplace_back([&, r] { EXPECT_EQ(ncclCommInitRank(&comms[r], 2, id, r), ncclSuccess); });
  for (auto& t : init) t.join();
  ASSERT_TRUE(comms[0] && comms[1]);
  Rank d;
  float* buf = d.alloc(kCount);
  d.put(buf, data(0, kCount));
  ASSERT_EQ(ncclAllReduce(buf, buf, kCount, ncclFloat32, ncclSum, comms[0], d.stream()),
            ncclSuccess);  // rank 1 never calls
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const auto t0 = Clock::now();
  EXPECT_EQ(ncclCommAbort(comms[0]), ncclSuccess);
  EXPECT_LT(msSince(t0), 1000.0);
  EXPECT_TRUE(d.be->sync(d.q).isOk());  // released, not held forever
  EXPECT_EQ(ncclCommAbort(comms[1]), ncclSuccess);
}

// A one-rank communicator whose stream is busy before a call: the engine
// waits for it (an out-of-place all-reduce of one rank copies its input, so a
// wait that ended early would copy the input's old values).
struct BusyStream {
  static constexpr size_t kN = 1 << 16;
  ncclComm_t comm = nullptr;
  Rank d;
  float *in = nullptr, *out = nullptr, *next = nullptr;
  core::Event hold = nullptr;
  BusyStream() {
    EXPECT_EQ(ncclCommInitAll(&comm, 1, nullptr), ncclSuccess);
    in = d.alloc(kN);
    out = d.alloc(kN);
    next = d.alloc(kN);
    d.put(in, data(0, kN));
    d.put(next, data(1, kN));
    // A first call starts the engine thread.
    EXPECT_EQ(ncclAllReduce(in, out, kN, ncclFloat32, ncclSum, comm, d.stream()), ncclSuccess);
    EXPECT_EQ(d.get(out, kN), data(0, kN));
  }
  // Holds the stream (as a long kernel would), queues the copy that makes
  // the input next's values behind it, then the all-reduce.
  void queueBehindAHeldStream() {
    auto h = d.be->hostEventCreate(0);
    ASSERT_TRUE(h.isOk()) << h.status().message();
    hold = h.value();
    ASSERT_TRUE(d.be->eventWait(d.q, hold).isOk());
    ASSERT_TRUE(d.be->copyAsync(in, next, kN * sizeof(float), d.q).isOk());
    ASSERT_EQ(ncclAllReduce(in, out, kN, ncclFloat32, ncclSum, comm, d.stream()), ncclSuccess)
        << ncclGetLastError(comm);
  }
  void release() {
    if (hold) {
      EXPECT_TRUE(d.be->hostEventSignal(hold).isOk());
    }
  }
  ~BusyStream() {
    release();
    if (hold) {
      EXPECT_TRUE(d.be->eventDestroy(hold).isOk());
    }
    if (comm) {
      EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
    }
  }
};

// While the work queued before an operation runs, the engine sleeps until
// the backend's host function (launchHostFunc) says the stream got there
// (core/engine.h, "Waiting for a stream"): over a 500 ms wait it blocks a
// handful of times (a check of the events every Engine::kRecheck, 100 ms;
// 5 measured on a 2-core machine). Polling blocked about 3,150 times there
// (naps of base::Backoff::kNap, about 160 us each with the timer's slack,
// after yielding the core for kYieldFor).
// Counted as the engine thread's voluntary context switches. The bound, 50,
// leaves room for a slow machine and still fails polling.
TEST(AsyncEngine, WaitForABusyStreamSleepsUntilItArrives) {
  requireEngineBackend();
  ASSERT_TRUE(core::processBackend().value()->hasHostFuncs()) << "xpu_emu offers launchHostFunc";
  BusyStream b;
  ASSERT_NO_FATAL_FAILURE(b.queueBehindAHeldStream());
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the engine reaches its wait
  const long before = engineBlocks();
  std::this_thread::sleep_for(std::chrono::milliseconds(kLateMs));
  const long blocked = engineBlocks() - before;
  ASSERT_GE(before, 0) << "no engine thread: the call did not go through the engine";
  b.release();
  EXPECT_EQ(b.d.get(b.out, BusyStream::kN), data(1, BusyStream::kN))
      << "the all-reduce did not wait for the work queued before it";
  printf("[ engine ] waited %d ms for a busy stream, blocked %ld times\n", kLateMs, blocked);
  EXPECT_LT(blocked, 50) << "the engine polled the stream instead of sleeping until it arrived";
}

// ncclCommAbort while the engine sleeps waiting for a busy stream wakes it
// at once (Engine::interrupt): within 50 ms, where waiting for the next
// check of the events would take until 200 ms after the call (the abort
// comes 120 ms after it). The stream is released, not held forever.
TEST(AsyncEngine, AbortEndsTheWaitForABusyStream) {
  requireEngineBackend();
  BusyStream b;
  ASSERT_NO_FATAL_FAILURE(b.queueBehindAHeldStream());
  std::this_thread::sleep_for(std::chrono::milliseconds(120));
  const auto t0 = Clock::now();
  EXPECT_EQ(ncclCommAbort(b.comm), ncclSuccess);
  const double ms = msSince(t0);
  b.comm = nullptr;
  printf("[ engine ] abort during the wait for a stream took %.1f ms\n", ms);
  EXPECT_LT(ms, 50.0) << "the abort waited for the engine's next check of the stream";
  b.release();
  EXPECT_TRUE(b.d.be->sync(b.d.q).isOk());
}

}  // namespace
}  // namespace tutti::test

namespace tutti::test {
namespace {

// Two communicators of one process, made together (ranks 0 and 1).
std::vector<ncclComm_t> makePair() {
  ncclUniqueId id;
  EXPECT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  std::vector<ncclComm_t> comms(2, nullptr);
  std::vector<std::thread> init;
  for (int r = 0; r < 2; ++r)
    init.emplace_back([&, r] { EXPECT_EQ(ncclCommInitRank(&comms[r], 2, id, r), ncclSuccess); });
  for (auto& t : init) t.join();
  return comms;
}

// Destroy with operations still queued: they finish first, results exact.
TEST(AsyncEngine, DestroyWaitsForQueuedOperations) {
  requireEngineBackend();
  constexpr int kOps = 20;
  constexpr size_t kN = 1 << 16;
  std::vector<std::vector<float>> got(2);
  std::vector<std::thread> ranks;
  auto comms = makePair();
  ASSERT_TRUE(comms[0] && comms[1]);
  for (int r = 0; r < 2; ++r)
    ranks.emplace_back([&, r] {
      Rank d;
      float* buf = d.alloc(kN);
      d.put(buf, data(r, kN));
      for (int i = 0; i < kOps; ++i)  // in place: doubles after the first sum
        ASSERT_EQ(ncclAllReduce(buf, buf, kN, ncclFloat32, ncclSum, comms[r], d.stream()),
                  ncclSuccess);
      EXPECT_EQ(ncclCommDestroy(comms[r]), ncclSuccess);
      got[r] = d.get(buf, kN);
    });
  for (auto& t : ranks) t.join();
  for (int r = 0; r < 2; ++r)
    for (size_t i = 0; i < kN; ++i)
      ASSERT_EQ(got[r][i], (value(0, i) + value(1, i)) * static_cast<float>(1 << (kOps - 1)))
          << "rank " << r << " element " << i;
}

// An operation that fails on the engine after its call returned: the peer
// aborts instead of calling. The error reaches ncclCommGetAsyncError and the
// next call, and the stream is released.
TEST(AsyncEngine, ErrorAfterReturnIsTheAsyncError) {
  requireEngineBackend();
  auto comms = makePair();
  ASSERT_TRUE(comms[0] && comms[1]);
  Rank d;
  float* buf = d.alloc(kCount);
  d.put(buf, data(0, kCount));
  ASSERT_EQ(ncclAllReduce(buf, buf, kCount, ncclFloat32, ncclSum, comms[0], d.stream()),
            ncclSuccess);
  ncclResult_t async = ncclSuccess;
  ASSERT_EQ(ncclCommGetAsyncError(comms[0], &async), ncclSuccess);
  EXPECT_EQ(async, ncclSuccess);  // still waiting for the peer
  EXPECT_EQ(ncclCommAbort(comms[1]), ncclSuccess);
  const auto t0 = Clock::now();
  while (async == ncclSuccess && msSince(t0) < 30000) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    ASSERT_EQ(ncclCommGetAsyncError(comms[0], &async), ncclSuccess);
  }
  EXPECT_NE(async, ncclSuccess) << "no async error " << msSince(t0) << " ms after the peer left";
  EXPECT_TRUE(d.be->sync(d.q).isOk());  // released
  EXPECT_NE(ncclAllReduce(buf, buf, kCount, ncclFloat32, ncclSum, comms[0], d.stream()),
            ncclSuccess);
  EXPECT_NE(std::string(ncclGetLastError(comms[0])).find("error state"), std::string::npos)
      << ncclGetLastError(comms[0]);
  EXPECT_EQ(ncclCommDestroy(comms[0]), ncclSuccess);
}

// Abort racing with completion: both ranks queue work and abort at once, in
// a loop; every call returns, nothing hangs or crashes, streams are released.
TEST(AsyncEngine, AbortRacingWithCompletion) {
  requireEngineBackend();
  for (int round = 0; round < 10; ++round) {
    auto comms = makePair();
    ASSERT_TRUE(comms[0] && comms[1]);
    std::vector<std::thread> ranks;
    for (int r = 0; r < 2; ++r)
      ranks.emplace_back([&, r] {
        Rank d;
        float* buf = d.alloc(4096);
        d.put(buf, data(r, 4096));
        for (int i = 0; i < 3; ++i)
          (void)ncclAllReduce(buf, buf, 4096, ncclFloat32, ncclSum, comms[r], d.stream());
        if (round % 2) std::this_thread::sleep_for(std::chrono::microseconds(200 * round));
        const auto t0 = Clock::now();
        EXPECT_EQ(ncclCommAbort(comms[r]), ncclSuccess);
        EXPECT_LT(msSince(t0), 2000.0) << "round " << round;
        EXPECT_TRUE(d.be->sync(d.q).isOk());
      });
    for (auto& t : ranks) t.join();
  }
}

// ncclCommSplit while an operation is queued on the engine, waiting for a
// late peer: the split drains the engine first (core::Comm::split), returns
// success, and both the queued all-reduce and the child's first all-reduce
// are exact. Rank 0's queue is held (as a long kernel would hold it) while it
// queues the all-reduce and calls the split, so that operation is still
// waiting for its stream, not yet on the communicator, when the split
// starts; rank 1 calls kLateMs late and splits once its own engine runs the
// all-reduce. A split that does not drain takes rank 0's communicator while
// rank 1's engine holds rank 1's for the all-reduce: each waits for the
// other (the watchdog below fails the test and aborts both).
TEST(AsyncEngine, SplitDrainsAQueuedOperation) {
  requireEngineBackend();
  auto comms = makePair();
  ASSERT_TRUE(comms[0] && comms[1]);
  std::atomic<int> finished{0};
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r)
    ranks.emplace_back([&, r] {
      struct Done {
        std::atomic<int>& n;
        ~Done() { n++; }
      } done{finished};
      Rank d;
      float* buf = d.alloc(kCount);
      float* cbuf = d.alloc(kCount);
      // A first all-reduce, both on time (connections).
      d.put(buf, data(r, kCount));
      ASSERT_EQ(ncclAllReduce(buf, buf, kCount, ncclFloat32, ncclSum, comms[r], d.stream()),
                ncclSuccess)
          << ncclGetLastError(comms[r]);
      d.get(buf, kCount);
      core::Event hold = nullptr;
      if (r == 0) {
        auto h = d.be->hostEventCreate(0);
        ASSERT_TRUE(h.isOk()) << h.status().message();
        hold = h.value();
        ASSERT_TRUE(d.be->eventWait(d.q, hold).isOk());
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(kLateMs));
      }
      d.put(buf, data(r, kCount));
      ASSERT_EQ(ncclAllReduce(buf, buf, kCount, ncclFloat32, ncclSum, comms[r], d.stream()),
                ncclSuccess)
          << ncclGetLastError(comms[r]);
      std::thread release;
      if (r == 0) {
        release = std::thread([&] {
          std::this_thread::sleep_for(std::chrono::milliseconds(200));
          EXPECT_TRUE(d.be->hostEventSignal(hold).isOk());
        });
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));  // its engine runs it
      }
      ncclComm_t child = nullptr;
      EXPECT_EQ(ncclCommSplit(comms[r], 0, r, &child, nullptr), ncclSuccess)
          << ncclGetLastError(comms[r]);
      if (r == 0) {
        release.join();
        EXPECT_TRUE(d.be->eventDestroy(hold).isOk());
      }
      auto got = d.get(buf, kCount);
      for (size_t i = 0; i < kCount; ++i)
        ASSERT_EQ(got[i], value(0, i) + value(1, i)) << "queued, rank " << r << " element " << i;
      ASSERT_NE(child, nullptr);
      int n = 0, me = -1;
      EXPECT_EQ(ncclCommCount(child, &n), ncclSuccess);
      EXPECT_EQ(ncclCommUserRank(child, &me), ncclSuccess);
      EXPECT_EQ(n, 2);
      EXPECT_EQ(me, r);
      d.put(cbuf, data(1 - r, kCount));
      ASSERT_EQ(ncclAllReduce(cbuf, cbuf, kCount, ncclFloat32, ncclMax, child, d.stream()),
                ncclSuccess)
          << ncclGetLastError(child);
      got = d.get(cbuf, kCount);
      for (size_t i = 0; i < kCount; ++i)
        ASSERT_EQ(got[i], value(1, i)) << "child, rank " << r << " element " << i;
      ncclResult_t async = ncclInternalError;
      EXPECT_EQ(ncclCommGetAsyncError(comms[r], &async), ncclSuccess);
      EXPECT_EQ(async, ncclSuccess);
      EXPECT_EQ(ncclCommDestroy(child), ncclSuccess);
    });
  // Bounded: a deadlock fails the test instead of hanging it.
  const auto t0 = Clock::now();
  while (finished.load() < 2 && msSince(t0) < 60000)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  if (finished.load() < 2) {
    ADD_FAILURE() << "ncclCommSplit with an operation queued on the engine did not return in "
                     "60 s (a deadlock): aborting both communicators";
    for (ncclComm_t c : comms) (void)ncclCommAbort(c);
    for (auto& t : ranks) t.join();
    return;
  }
  for (auto& t : ranks) t.join();
  for (ncclComm_t c : comms) EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
}

}  // namespace
}  // namespace tutti::test

namespace tutti::test {
namespace {

// tuttiSetDevice binds what the thread creates next: a communicator
// (ncclCommCuDevice) and ncclMemAlloc's memory; a device that does not exist
// is an error with a message.
TEST(Devices, SetDeviceBindsTheNextCommunicatorAndAllocation) {
  requireEngineBackend();
  int n = 0;
  ASSERT_EQ(tuttiGetDeviceCount(&n), ncclSuccess) << ncclGetLastError(nullptr);
  ASSERT_GE(n, 2) << "xpu_emu has 2 devices by default";
  EXPECT_EQ(tuttiSetDevice(n), ncclInvalidArgument);
  EXPECT_NE(std::string(ncclGetLastError(nullptr)).find("does not exist"), std::string::npos)
      << ncclGetLastError(nullptr);
  EXPECT_EQ(tuttiGetDeviceCount(nullptr), ncclInvalidArgument);
  std::thread([&] {
    ASSERT_EQ(tuttiSetDevice(1), ncclSuccess) << ncclGetLastError(nullptr);
    ncclUniqueId id;
    ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
    ncclComm_t comm = nullptr;
    ASSERT_EQ(ncclCommInitRank(&comm, 1, id, 0), ncclSuccess) << ncclGetLastError(nullptr);
    int dev = -1;
    EXPECT_EQ(ncclCommCuDevice(comm, &dev), ncclSuccess);
    EXPECT_EQ(dev, 1);
    void* p = nullptr;
    ASSERT_EQ(ncclMemAlloc(&p, 4096), ncclSuccess);
    EXPECT_EQ(core::processBackend().value()->query(p).device, 1);
    EXPECT_EQ(ncclMemFree(p), ncclSuccess);
    EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
  }).join();
}

}  // namespace
}  // namespace tutti::test
