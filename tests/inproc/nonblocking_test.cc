// Non-blocking communicators (config.blocking = 0): every operation is queued
// on the communicator's engine and its call returns ncclInProgress at once,
// whatever the peers are doing; ncclCommGetAsyncError answers ncclInProgress
// until what is queued has run, then ncclSuccess or the error
// (docs/api.md, "Non-blocking communicators").
//
// Ranks are threads of this process over shared memory or TCP
// (NCCL_SHM_DISABLE=1), on host memory with the NULL stream.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "harness.h"
#include "nccl.h"
#include "tutti/tutti.h"

namespace tutti::test {
namespace {

using Clock = std::chrono::steady_clock;

// Polls until the communicator's operations are no longer in progress.
ncclResult_t settle(ncclComm_t comm) {
  ncclResult_t st = ncclInProgress;
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  while (st == ncclInProgress) {
    ncclResult_t rc = ncclCommGetAsyncError(comm, &st);
    if (rc != ncclSuccess) return rc;
    if (Clock::now() > deadline) return ncclInternalError;  // a hang, reported as such
    std::this_thread::yield();
  }
  return st;
}

ncclComm_t initNonBlocking(int n, const ncclUniqueId& id, int r) {
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  ncclComm_t c = nullptr;
  ncclResult_t rc = ncclCommInitRankConfig(&c, n, id, r, &cfg);
  EXPECT_TRUE(rc == ncclInProgress || rc == ncclSuccess) << ncclGetLastError(nullptr);
  EXPECT_EQ(settle(c), ncclSuccess) << "rank " << r << ": " << ncclGetLastError(c);
  return c;
}

// The two ranks of a non-blocking communicator, created on two threads.
void initNonBlockingPair(ncclComm_t comms[2]) {
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  std::thread peer([&] { comms[1] = initNonBlocking(2, id, 1); });
  comms[0] = initNonBlocking(2, id, 0);
  peer.join();
}

// Runs fn(rank, comm) on n threads with non-blocking communicators; each
// is finalized (polled to the end) and destroyed here.
void runNonBlocking(int n, const std::function<void(int, ncclComm_t)>& fn) {
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r)
    ts.emplace_back([&, r] {
      ncclComm_t c = initNonBlocking(n, id, r);
      if (!c) return;
      fn(r, c);
      ncclResult_t rc = ncclCommFinalize(c);
      EXPECT_TRUE(rc == ncclSuccess || rc == ncclInProgress) << ncclGetLastError(c);
      EXPECT_EQ(settle(c), ncclSuccess) << ncclGetLastError(c);
      EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
    });
  for (auto& t : ts) t.join();
}

class NonBlocking : public ::testing::TestWithParam<const char*> {
 protected:
  // "shm" or "tcp".
  Env env_{{{"NCCL_SHM_DISABLE", std::string(GetParam()) == "tcp" ? "1" : "0"}}};
};

// The call returns before the peer has made its own: rank 1 calls only once
// rank 0's call has returned (or after 20 s, when the test has failed). A
// synchronous implementation cannot return first: it waits for rank 1.
TEST_P(NonBlocking, CallReturnsBeforeThePeerHasCalled) {
  const size_t count = 1 << 16;  // 256 KiB of int32: the ring, not the one-shot arena
  std::atomic<bool> returned{false}, peerCalled{false};
  std::atomic<bool> returnedFirst{false};
  runNonBlocking(2, [&](int r, ncclComm_t comm) {
    std::vector<int32_t> send(count), recv(count, -1);
    for (size_t i = 0; i < count; ++i) send[i] = static_cast<int32_t>(i % 1000) * (r + 1);
    if (r == 1) {
      const auto until = Clock::now() + std::chrono::seconds(20);
      while (!returned.load() && Clock::now() < until)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      peerCalled = true;
    }
    ncclResult_t rc =
        ncclAllReduce(send.data(), recv.data(), count, ncclInt32, ncclSum, comm, nullptr);
    if (r == 0) {
      returnedFirst = !peerCalled.load();
      returned = true;
    }
    EXPECT_EQ(rc, ncclInProgress) << "rank " << r << ": " << ncclGetLastError(comm);
    ASSERT_EQ(settle(comm), ncclSuccess) << ncclGetLastError(comm);
    for (size_t i = 0; i < count; ++i)
      ASSERT_EQ(recv[i], static_cast<int32_t>(i % 1000) * 3) << "rank " << r << " element " << i;
  });
  EXPECT_TRUE(returnedFirst.load()) << "rank 0's all-reduce returned only after rank 1 had called";
}

// Several operations queued back to back run in call order; every rank count
// from 1 to 5, sizes from zero to odd and unaligned, values exact.
TEST_P(NonBlocking, QueuedOperationsRunInOrderWithExactResults) {
  for (int n : {1, 2, 3, 4, 5}) {
    SCOPED_TRACE("nranks " + std::to_string(n));
    runNonBlocking(n, [&](int r, ncclComm_t comm) {
      const std::vector<size_t> counts = {0, 1, 7, 1001, 40000};
      // One byte of offset: unaligned buffers.
      std::vector<std::vector<char>> sendRaw, recvRaw;
      std::vector<int32_t*> send, recv;
      for (size_t count : counts) {
        sendRaw.emplace_back(count * 4 + 1);
        recvRaw.emplace_back(count * 4 * n + 1);
        send.push_back(reinterpret_cast<int32_t*>(sendRaw.back().data() + 1));
        recv.push_back(reinterpret_cast<int32_t*>(recvRaw.back().data() + 1));
        for (size_t i = 0; i < count; ++i) {
          int32_t v = static_cast<int32_t>(i % 97) + 10 * r;
          memcpy(send.back() + i, &v, 4);
        }
      }
      // An all-reduce of each size, then a broadcast that overwrites one of
      // their outputs and an all-gather that reads another: the results
      // tell whether they ran in call order.
      for (size_t k = 0; k < counts.size(); ++k) {
        ncclResult_t rc =
            ncclAllReduce(send[k], recv[k], counts[k], ncclInt32, ncclSum, comm, nullptr);
        ASSERT_EQ(rc, ncclInProgress) << ncclGetLastError(comm);
      }
      ASSERT_EQ(ncclBroadcast(send[3], recv[3], counts[3], ncclInt32, n - 1, comm, nullptr),
                ncclInProgress);
      std::vector<int32_t> gathered(counts[2] * n);
      ASSERT_EQ(ncclAllGather(recv[2], gathered.data(), counts[2], ncclInt32, comm, nullptr),
                ncclInProgress);
      ASSERT_EQ(settle(comm), ncclSuccess) << ncclGetLastError(comm);
      const int32_t rankSum = 10 * n * (n - 1) / 2;
      for (size_t k = 0; k < counts.size(); ++k)
        for (size_t i = 0; i < counts[k]; ++i) {
          int32_t got;
          memcpy(&got, recv[k] + i, 4);
          const int32_t want = k == 3 ? static_cast<int32_t>(i % 97) + 10 * (n - 1)  // broadcast
                                      : static_cast<int32_t>(i % 97) * n + rankSum;
          ASSERT_EQ(got, want) << "rank " << r << " count " << counts[k] << " element " << i;
        }
      for (int p = 0; p < n; ++p)
        for (size_t i = 0; i < counts[2]; ++i)
          ASSERT_EQ(gathered[p * counts[2] + i], static_cast<int32_t>(i % 97) * n + rankSum);
    });
  }
}

// A group (send/receive around a ring plus an all-reduce) is queued as one:
// ncclGroupEnd returns ncclInProgress.
TEST_P(NonBlocking, GroupEndReturnsInProgress) {
  const int n = 3;
  const size_t count = 5000;
  runNonBlocking(n, [&](int r, ncclComm_t comm) {
    std::vector<int64_t> out(count), in(count, -1), sum(count, -1);
    for (size_t i = 0; i < count; ++i) out[i] = static_cast<int64_t>(i) * 100 + r;
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    ASSERT_EQ(ncclSend(out.data(), count, ncclInt64, (r + 1) % n, comm, nullptr), ncclSuccess);
    ASSERT_EQ(ncclRecv(in.data(), count, ncclInt64, (r + n - 1) % n, comm, nullptr), ncclSuccess);
    ASSERT_EQ(ncclAllReduce(out.data(), sum.data(), count, ncclInt64, ncclSum, comm, nullptr),
              ncclSuccess);
    ASSERT_EQ(ncclGroupEnd(), ncclInProgress) << ncclGetLastError(comm);
    ASSERT_EQ(settle(comm), ncclSuccess) << ncclGetLastError(comm);
    const int from = (r + n - 1) % n;
    for (size_t i = 0; i < count; ++i) {
      ASSERT_EQ(in[i], static_cast<int64_t>(i) * 100 + from) << "element " << i;
      ASSERT_EQ(sum[i], static_cast<int64_t>(i) * 100 * n + n * (n - 1) / 2) << "element " << i;
    }
  });
}

// The compressed all-reduce is queued like any operation.
TEST_P(NonBlocking, CompressedAllReduceReturnsInProgress) {
  const int n = 2;
  const size_t count = 4096;
  runNonBlocking(n, [&](int r, ncclComm_t comm) {
    tuttiCompressionConfig_t cfg = TUTTI_COMPRESSION_CONFIG_INITIALIZER;
    cfg.kind = tuttiCompressFp16;
    tuttiCompressor_t c = nullptr;
    ASSERT_EQ(tuttiCompressorCreate(comm, &cfg, &c), ncclSuccess) << ncclGetLastError(comm);
    // Small integers: exact in binary16 and in their sum.
    std::vector<float> data(count);
    for (size_t i = 0; i < count; ++i) data[i] = static_cast<float>(i % 64) + r;
    ASSERT_EQ(tuttiAllReduceCompressed(data.data(), data.data(), count, ncclFloat32, ncclSum, c, 7,
                                       0, 0, nullptr),
              ncclInProgress)
        << ncclGetLastError(comm);
    ASSERT_EQ(settle(comm), ncclSuccess) << ncclGetLastError(comm);
    for (size_t i = 0; i < count; ++i)
      ASSERT_EQ(data[i], static_cast<float>(i % 64) * n + 1) << "element " << i;
    EXPECT_EQ(tuttiCompressorDestroy(c), ncclSuccess);
  });
}

// An operation that fails after its call returned is reported by
// ncclCommGetAsyncError (not ncclInProgress forever), with the reason in
// ncclGetLastError; later calls fail with it.
TEST_P(NonBlocking, ErrorAfterReturnIsReportedByGetAsyncError) {
  ncclComm_t comms[2] = {nullptr, nullptr};
  initNonBlockingPair(comms);
  ASSERT_TRUE(comms[0] && comms[1]);
  std::vector<float> buf(1 << 16, 1.0f);
  // Rank 1 leaves instead of calling: rank 0's queued all-reduce fails.
  ASSERT_EQ(
      ncclAllReduce(buf.data(), buf.data(), buf.size(), ncclFloat32, ncclSum, comms[0], nullptr),
      ncclInProgress);
  ASSERT_EQ(ncclCommAbort(comms[1]), ncclSuccess);
  const ncclResult_t st = settle(comms[0]);
  EXPECT_NE(st, ncclSuccess);
  EXPECT_NE(st, ncclInternalError) << "still in progress after 60 s";
  EXPECT_STRNE(ncclGetLastError(comms[0]), "");
  EXPECT_NE(ncclAllReduce(buf.data(), buf.data(), 1, ncclFloat32, ncclSum, comms[0], nullptr),
            ncclSuccess);
  EXPECT_EQ(ncclCommDestroy(comms[0]), ncclSuccess);
}

// ncclCommSplit of a non-blocking parent into non-blocking children
// returns at once (the exchange is queued on the parent's engine, after the
// all-reduce queued before it), while rank 2 splits 600 ms late; a blocking
// exchange would wait for it. Colours r % 2 with keys -r: {0, 2} in the
// order 2, 0, and {1}; rank 3 takes no colour (no child). The children's
// ranks, sizes and an all-reduce on each are exact, and so is the parent's.
TEST_P(NonBlocking, SplitReturnsBeforeTheLatePeerHasSplit) {
  const int n = 4;
  runNonBlocking(n, [&](int r, ncclComm_t comm) {
    std::vector<int32_t> big(1 << 14, r + 1), bigSum(big.size(), 0);
    ASSERT_EQ(
        ncclAllReduce(big.data(), bigSum.data(), big.size(), ncclInt32, ncclSum, comm, nullptr),
        ncclInProgress);
    if (r == 2) std::this_thread::sleep_for(std::chrono::milliseconds(600));
    const int color = r == 3 ? NCCL_SPLIT_NOCOLOR : r % 2;
    ncclComm_t child = nullptr;
    const auto t0 = Clock::now();
    const ncclResult_t rc = ncclCommSplit(comm, color, -r, &child, nullptr);
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    if (r != 2) {
      EXPECT_LT(ms, 300.0) << "rank " << r << ": ncclCommSplit waited for rank 2";
    }
    if (r == 3) {
      EXPECT_EQ(rc, ncclSuccess) << ncclGetLastError(comm);
      EXPECT_EQ(child, nullptr);
      ASSERT_EQ(settle(comm), ncclSuccess) << ncclGetLastError(comm);  // the exchange ran
      for (int32_t v : bigSum) ASSERT_EQ(v, 10);
      return;
    }
    ASSERT_TRUE(rc == ncclInProgress || rc == ncclSuccess) << ncclGetLastError(comm);
    ASSERT_NE(child, nullptr);
    ASSERT_EQ(settle(child), ncclSuccess) << "rank " << r << ": " << ncclGetLastError(child);
    ASSERT_EQ(settle(comm), ncclSuccess) << ncclGetLastError(comm);
    for (int32_t v : bigSum) ASSERT_EQ(v, 10);  // 1 + 2 + 3 + 4
    int crank = -1, csize = -1;
    ASSERT_EQ(ncclCommUserRank(child, &crank), ncclSuccess);
    ASSERT_EQ(ncclCommCount(child, &csize), ncclSuccess);
    EXPECT_EQ(csize, color == 0 ? 2 : 1);
    EXPECT_EQ(crank, r == 2 ? 0 : r == 0 ? 1 : 0);  // keys -r: rank 2 first
    int32_t v = r + 1, out = 0;
    ASSERT_EQ(ncclAllReduce(&v, &out, 1, ncclInt32, ncclSum, child, nullptr), ncclInProgress);
    ASSERT_EQ(settle(child), ncclSuccess) << ncclGetLastError(child);
    EXPECT_EQ(out, color == 0 ? 1 + 3 : 2);
    EXPECT_EQ(ncclCommDestroy(child), ncclSuccess);
  });
}

INSTANTIATE_TEST_SUITE_P(Transports, NonBlocking, ::testing::Values("shm", "tcp"),
                         [](const auto& info) { return std::string(info.param); });

// A queued split whose parent is aborted before the exchange can finish
// (rank 1 never splits) fails the child's creation instead of leaving it in
// progress, and the child is destroyed cleanly.
TEST(NonBlockingSplit, AbortedParentFailsThePendingChild) {
  ncclComm_t comms[2] = {nullptr, nullptr};
  initNonBlockingPair(comms);
  ASSERT_TRUE(comms[0] && comms[1]);
  ncclComm_t child = nullptr;
  ASSERT_EQ(ncclCommSplit(comms[0], 0, 0, &child, nullptr), ncclInProgress)
      << ncclGetLastError(comms[0]);
  ASSERT_NE(child, nullptr);
  int size = 0;
  EXPECT_EQ(ncclCommCount(child, &size), ncclInProgress) << "the exchange cannot have run";
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ncclResult_t st = ncclSuccess;
  ASSERT_EQ(ncclCommGetAsyncError(child, &st), ncclSuccess);
  EXPECT_EQ(st, ncclInProgress);
  ASSERT_EQ(ncclCommAbort(comms[0]), ncclSuccess);
  const ncclResult_t end = settle(child);
  EXPECT_NE(end, ncclSuccess);
  EXPECT_NE(end, ncclInternalError) << "the child is still in progress 60 s later";
  EXPECT_STRNE(ncclGetLastError(child), "");
  EXPECT_EQ(ncclCommDestroy(child), ncclSuccess);
  EXPECT_EQ(ncclCommDestroy(comms[1]), ncclSuccess);
}

}  // namespace
}  // namespace tutti::test
