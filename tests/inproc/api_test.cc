// Groups, point-to-point, split, dynamic channel balancing, timeouts and bad
// arguments, through the public C API with ranks as threads.
#include <chrono>
#include <numeric>

#include "capi/handle.h"
#include "harness.h"
#include "tutti/tutti.h"

namespace tutti::test {
namespace {

void fillInts(std::vector<int32_t>& v, int r) {
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int32_t>(r * 1000 + i % 997);
}

TEST(Groups, OneThreadInitialisesAndDrivesEveryRank) {
  for (int n : {1, 3, 4}) {
    ncclUniqueId id;
    ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
    std::vector<ncclComm_t> comms(n, nullptr);
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    for (int r = 0; r < n; ++r) ASSERT_EQ(ncclCommInitRank(&comms[r], n, id, r), ncclSuccess);
    ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
    const size_t count = 70001;
    std::vector<std::vector<int32_t>> in(n, std::vector<int32_t>(count)), out = in;
    for (int r = 0; r < n; ++r) fillInts(in[r], r);
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    for (int r = 0; r < n; ++r)
      ASSERT_EQ(
          ncclAllReduce(in[r].data(), out[r].data(), count, ncclInt32, ncclSum, comms[r], nullptr),
          ncclSuccess);
    ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
    for (int r = 0; r < n; ++r)
      for (size_t i = 0; i < count; i += 101) {
        int64_t want = 0;
        for (int q = 0; q < n; ++q) want += in[q][i];
        ASSERT_EQ(out[r][i], want) << "n=" << n << " rank " << r << " i=" << i;
      }
    for (auto c : comms) ASSERT_EQ(ncclCommDestroy(c), ncclSuccess);
  }
}

// Direct exchanges need connections made on first use; one thread driving
// every rank must not wait for a peer it has yet to drive.
TEST(Groups, OneThreadDrivesAllToAllAndPointToPoint) {
  const int n = 3;
  std::vector<ncclComm_t> comms(n);
  ASSERT_EQ(ncclCommInitAll(comms.data(), n, nullptr), ncclSuccess);
  const size_t count = 5000;
  std::vector<std::vector<int32_t>> in(n, std::vector<int32_t>(count * n)), out = in, p2p = in;
  for (int r = 0; r < n; ++r)
    for (size_t i = 0; i < count * n; ++i) in[r][i] = static_cast<int32_t>(r * 100000 + i);
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(ncclAlltoAll(in[r].data(), out[r].data(), count, ncclInt32, comms[r], nullptr),
              ncclSuccess);
    int to = (r + 2) % n, from = (r + n - 2) % n;
    ASSERT_EQ(ncclSend(in[r].data(), count, ncclInt32, to, comms[r], nullptr), ncclSuccess);
    ASSERT_EQ(ncclRecv(p2p[r].data(), count, ncclInt32, from, comms[r], nullptr), ncclSuccess);
  }
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
  for (int r = 0; r < n; ++r) {
    int from = (r + n - 2) % n;
    for (int q = 0; q < n; ++q)
      for (size_t i = 0; i < count; ++i)
        ASSERT_EQ(out[r][q * count + i], in[q][r * count + i]) << r << " " << q << " " << i;
    for (size_t i = 0; i < count; ++i) ASSERT_EQ(p2p[r][i], in[from][i]);
  }
  for (auto c : comms) ASSERT_EQ(ncclCommDestroy(c), ncclSuccess);
}

TEST(Groups, CommInitAll) {
  const int n = 3;
  std::vector<ncclComm_t> comms(n);
  ASSERT_EQ(ncclCommInitAll(comms.data(), n, nullptr), ncclSuccess);
  for (int r = 0; r < n; ++r) {
    int rank = -1, count = -1;
    ASSERT_EQ(ncclCommUserRank(comms[r], &rank), ncclSuccess);
    ASSERT_EQ(ncclCommCount(comms[r], &count), ncclSuccess);
    EXPECT_EQ(rank, r);
    EXPECT_EQ(count, n);
  }
  for (auto c : comms) ASSERT_EQ(ncclCommDestroy(c), ncclSuccess);
}

// A communicator created inside a group and destroyed (or aborted) before
// the group ends is not created at ncclGroupEnd; the group's other
// communicators are, and work. (The group used to keep the freed handle and
// create it at ncclGroupEnd: a use after free.)
TEST(Groups, CommunicatorDestroyedBeforeItsGroupEndsIsNotCreated) {
  for (const bool abort : {false, true}) {
    ncclUniqueId ids[3];
    for (auto& id : ids) ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
    ncclComm_t comms[3] = {nullptr, nullptr, nullptr};
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    for (int i = 0; i < 3; ++i) ASSERT_EQ(ncclCommInitRank(&comms[i], 1, ids[i], 0), ncclSuccess);
    ASSERT_EQ(abort ? ncclCommAbort(comms[1]) : ncclCommDestroy(comms[1]), ncclSuccess);
    ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
    for (int i : {0, 2}) {
      int32_t in[3] = {7, -8, 9}, out[3] = {0, 0, 0};
      ASSERT_EQ(ncclAllReduce(in, out, 3, ncclInt32, ncclSum, comms[i], nullptr), ncclSuccess)
          << ncclGetLastError(comms[i]);
      EXPECT_EQ(out[0], 7);
      EXPECT_EQ(out[1], -8);
      EXPECT_EQ(out[2], 9);
      ASSERT_EQ(ncclCommDestroy(comms[i]), ncclSuccess);
    }
  }
}

TEST(Groups, ManyOperationsInOneGroup) {
  const int n = 5;
  runRanks(n, [&](int r, ncclComm_t comm) {
    const size_t count = 3001;
    std::vector<int32_t> a(count), ar(count), ag(count * n), bc(count), sendv(count), recvv(count),
        self(count);
    fillInts(a, r);
    bc.assign(count, r == 2 ? 7 : -1);
    fillInts(sendv, r + 100);
    const int next = (r + 1) % n, prev = (r + n - 1) % n;
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    ASSERT_EQ(ncclAllReduce(a.data(), ar.data(), count, ncclInt32, ncclMax, comm, nullptr),
              ncclSuccess);
    ASSERT_EQ(ncclSend(sendv.data(), count, ncclInt32, next, comm, nullptr), ncclSuccess);
    ASSERT_EQ(ncclAllGather(a.data(), ag.data(), count, ncclInt32, comm, nullptr), ncclSuccess);
    ASSERT_EQ(ncclRecv(recvv.data(), count, ncclInt32, prev, comm, nullptr), ncclSuccess);
    ASSERT_EQ(ncclBcast(bc.data(), count, ncclInt32, 2, comm, nullptr), ncclSuccess);
    ASSERT_EQ(ncclSend(a.data(), count, ncclInt32, r, comm, nullptr), ncclSuccess);
    ASSERT_EQ(ncclRecv(self.data(), count, ncclInt32, r, comm, nullptr), ncclSuccess);
    ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(comm);
    std::vector<int32_t> expectRecv(count), other(count);
    fillInts(expectRecv, prev + 100);
    for (size_t i = 0; i < count; ++i) {
      ASSERT_EQ(ar[i], static_cast<int32_t>((n - 1) * 1000 + i % 997));
      for (int q = 0; q < n; ++q)
        ASSERT_EQ(ag[q * count + i], static_cast<int32_t>(q * 1000 + i % 997));
      ASSERT_EQ(bc[i], 7);
      ASSERT_EQ(recvv[i], expectRecv[i]);
      ASSERT_EQ(self[i], a[i]);
    }
  });
}

uint64_t messages(ncclComm_t comm) {
  uint64_t n = 0;
  for (uint64_t m : comm->impl()->channelMessages()) n += m;
  return n;
}

// A group of many small all-reduces is planned as one unit (core/group.cc,
// fuseSmallAllReduces): values exact for every operation, several datatypes
// and operators (each its own fused set) beside point-to-point operations, on
// three ranks over TCP, one thread driving two communicators per rank pair; and
// 64 all-reduces of 1 KiB put no more messages on the wire than one of 64 KiB.
TEST(Groups, SmallAllReducesTravelAsOne) {
  Env env({std::make_pair("NCCL_SHM_DISABLE", "1")});
  const int n = 3;
  constexpr int kOps = 64;
  constexpr size_t kCount = 256;  // 1 KiB of int32
  std::vector<uint64_t> fusedMsgs(n), oneMsgs(n);
  runRanks(n, [&](int r, ncclComm_t comm) {
    // A second communicator of the same ranks, driven in the same groups.
    ncclComm_t other = nullptr;
    ASSERT_EQ(ncclCommSplit(comm, 0, r, &other, nullptr), ncclSuccess) << ncclGetLastError(comm);
    std::vector<std::vector<int32_t>> in(kOps, std::vector<int32_t>(kCount)), out = in;
    std::vector<std::vector<float>> fin(8, std::vector<float>(kCount)), fout = fin;
    std::vector<int32_t> sendBuf(kCount, r), recvBuf(kCount, -1);
    for (int k = 0; k < kOps; ++k)
      for (size_t i = 0; i < kCount; ++i) in[k][i] = static_cast<int32_t>(r * 7 + k * 1000 + i);
    for (int k = 0; k < 8; ++k)
      for (size_t i = 0; i < kCount; ++i) fin[k][i] = static_cast<float>(r + k + i % 13);
    // Warm up the connections (their handshakes are not messages of a group).
    int32_t one = 1, sum = 0;
    ASSERT_EQ(ncclAllReduce(&one, &sum, 1, ncclInt32, ncclSum, comm, nullptr), ncclSuccess);
    ASSERT_EQ(ncclAllReduce(&one, &sum, 1, ncclInt32, ncclSum, other, nullptr), ncclSuccess);
    const uint64_t before = messages(comm);
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    for (int k = 0; k < kOps; ++k)
      ASSERT_EQ(ncclAllReduce(in[k].data(), k % 2 ? in[k].data() : out[k].data(), kCount, ncclInt32,
                              ncclSum, comm, nullptr),
                ncclSuccess);
    for (int k = 0; k < 8; ++k)
      ASSERT_EQ(ncclAllReduce(fin[k].data(), fout[k].data(), kCount, ncclFloat32, ncclMax, other,
                              nullptr),
                ncclSuccess);
    ASSERT_EQ(ncclSend(sendBuf.data(), kCount, ncclInt32, (r + 1) % n, other, nullptr),
              ncclSuccess);
    ASSERT_EQ(ncclRecv(recvBuf.data(), kCount, ncclInt32, (r + n - 1) % n, other, nullptr),
              ncclSuccess);
    ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(comm);
    fusedMsgs[r] = messages(comm) - before;
    for (int k = 0; k < kOps; ++k) {
      const auto& got = k % 2 ? in[k] : out[k];
      for (size_t i = 0; i < kCount; ++i)
        ASSERT_EQ(got[i], static_cast<int32_t>(7 * (0 + 1 + 2) + n * (k * 1000 + i)))
            << "rank " << r << " op " << k << " element " << i;
    }
    for (int k = 0; k < 8; ++k)
      for (size_t i = 0; i < kCount; ++i)
        ASSERT_EQ(fout[k][i], static_cast<float>(n - 1 + k + i % 13)) << "rank " << r;
    for (size_t i = 0; i < kCount; ++i) ASSERT_EQ(recvBuf[i], (r + n - 1) % n);
    // One all-reduce of the same total size, for comparison.
    std::vector<int32_t> big(kOps * kCount, r), bigOut(kOps * kCount);
    const uint64_t before2 = messages(comm);
    ASSERT_EQ(
        ncclAllReduce(big.data(), bigOut.data(), big.size(), ncclInt32, ncclSum, comm, nullptr),
        ncclSuccess);
    oneMsgs[r] = messages(comm) - before2;
    EXPECT_EQ(bigOut[0], 0 + 1 + 2);
    EXPECT_EQ(ncclCommDestroy(other), ncclSuccess);
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_GT(fusedMsgs[r], 0u);
    EXPECT_LE(fusedMsgs[r], oneMsgs[r]) << "rank " << r << ": 64 x 1 KiB took " << fusedMsgs[r]
                                        << " messages, one 64 KiB all-reduce " << oneMsgs[r];
  }
}

TEST(PointToPoint, AllPairsWithUnalignedBuffers) {
  const int n = 4;
  runRanks(n, [&](int r, ncclComm_t comm) {
    const size_t count = 20011;
    std::vector<uint8_t> send(count * 2 + 3), recv(n * count * 2 + 3, 0xEE);
    for (size_t i = 0; i < count * 2; ++i) send[1 + i] = static_cast<uint8_t>(r * 31 + i);
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    for (int p = 0; p < n; ++p) {
      ASSERT_EQ(ncclSend(send.data() + 1, count, ncclFloat16, p, comm, nullptr), ncclSuccess);
      ASSERT_EQ(ncclRecv(recv.data() + 1 + p * count * 2, count, ncclFloat16, p, comm, nullptr),
                ncclSuccess);
    }
    ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(comm);
    for (int p = 0; p < n; ++p)
      for (size_t i = 0; i < count * 2; ++i)
        ASSERT_EQ(recv[1 + p * count * 2 + i], static_cast<uint8_t>(p * 31 + i));
  });
}

// Outside a group, both ranks of a pair send first and then receive (small
// messages, so each send completes into the transport's buffers on its own),
// with collectives in between: sends and receives are matched per direction,
// so each receive gets the peer's send of the same round.
void exchangeThenReceive() {
  runRanks(2, [&](int r, ncclComm_t comm) {
    const int peer = 1 - r;
    const size_t count = 1000;
    std::vector<int32_t> send(count), recv(count), sum(4);
    for (int round = 0; round < 5; ++round) {
      for (size_t i = 0; i < count; ++i)
        send[i] = static_cast<int32_t>(r * 100000 + round * 1000 + i);
      ASSERT_EQ(ncclSend(send.data(), count, ncclInt32, peer, comm, nullptr), ncclSuccess)
          << ncclGetLastError(comm);
      ASSERT_EQ(ncclRecv(recv.data(), count, ncclInt32, peer, comm, nullptr), ncclSuccess)
          << ncclGetLastError(comm);
      for (size_t i = 0; i < count; ++i)
        ASSERT_EQ(recv[i], static_cast<int32_t>(peer * 100000 + round * 1000 + i)) << round;
      std::vector<int32_t> mine(4, r + round);
      ASSERT_EQ(ncclAllReduce(mine.data(), sum.data(), 4, ncclInt32, ncclSum, comm, nullptr),
                ncclSuccess);
      ASSERT_EQ(sum[3], 1 + 2 * round);
    }
  });
}

TEST(PointToPoint, BothSendThenReceiveOutsideAGroup) { exchangeThenReceive(); }

TEST(PointToPoint, BothSendThenReceiveOutsideAGroupOverTcp) {
  Env env({std::make_pair("NCCL_SHM_DISABLE", "1")});
  exchangeThenReceive();
}

TEST(Split, ByParityWithReversedKeys) {
  const int n = 7;
  runRanks(n, [&](int r, ncclComm_t comm) {
    ncclComm_t sub = nullptr;
    int color = r == 6 ? NCCL_SPLIT_NOCOLOR : r % 2;
    ASSERT_EQ(ncclCommSplit(comm, color, -r, &sub, nullptr), ncclSuccess) << ncclGetLastError(comm);
    if (color == NCCL_SPLIT_NOCOLOR) {
      EXPECT_EQ(sub, nullptr);
      return;
    }
    int members = color == 0 ? 3 : 3;  // evens 0,2,4 ; odds 1,3,5 (6 opted out)
    int count = 0, rank = 0;
    ASSERT_EQ(ncclCommCount(sub, &count), ncclSuccess);
    ASSERT_EQ(ncclCommUserRank(sub, &rank), ncclSuccess);
    EXPECT_EQ(count, members);
    // Keys are -r: the highest parent rank comes first.
    int expectRank = (color == 0 ? (4 - r) : (5 - r)) / 2;
    EXPECT_EQ(rank, expectRank);
    int64_t v = r, sum = 0;
    ASSERT_EQ(ncclAllReduce(&v, &sum, 1, ncclInt64, ncclSum, sub, nullptr), ncclSuccess);
    EXPECT_EQ(sum, color == 0 ? 0 + 2 + 4 : 1 + 3 + 5);
    ASSERT_EQ(ncclCommDestroy(sub), ncclSuccess);
  });
}

// A channel that may start a message only every 2 ms carries fewer chunks than
// an unthrottled one, because channels pull chunks from a shared queue.
TEST(Channels, SlowChannelCarriesFewerChunks) {
  setenv("TUTTI_NCHANNELS", "2", 1);
  setenv("TUTTI_TEST_THROTTLE", "1:2000", 1);
  setenv("TUTTI_CHUNK_SIZE", "16384", 1);
  const int n = 3;
  std::vector<std::vector<uint64_t>> stats(n);
  runRanks(n, [&](int r, ncclComm_t comm) {
    const size_t count = 1 << 20;  // 4 MiB of int32 -> hundreds of chunks per rank
    std::vector<int32_t> in(count), out(count);
    fillInts(in, r);
    ASSERT_EQ(ncclAllReduce(in.data(), out.data(), count, ncclInt32, ncclSum, comm, nullptr),
              ncclSuccess);
    for (size_t i = 0; i < count; ++i) {
      int32_t want = 0;
      for (int q = 0; q < n; ++q) want += static_cast<int32_t>(q * 1000 + i % 997);
      ASSERT_EQ(out[i], want);
    }
    stats[r] = comm->impl()->channelMessages();
  });
  unsetenv("TUTTI_TEST_THROTTLE");
  unsetenv("TUTTI_NCHANNELS");
  unsetenv("TUTTI_CHUNK_SIZE");
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(stats[r].size(), 2u);
    EXPECT_GT(stats[r][0], 2 * stats[r][1]) << "rank " << r << ": channel 0 carried " << stats[r][0]
                                            << ", throttled channel 1 " << stats[r][1];
  }
}

TEST(Faults, MissingRankIsNamedAtInit) {
  setenv("TUTTI_INIT_TIMEOUT", "2", 1);
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  std::vector<std::thread> ts;
  std::vector<std::string> errs(2);
  std::vector<ncclResult_t> rcs(2);
  for (int r = 0; r < 2; ++r)
    ts.emplace_back([&, r] {
      ncclComm_t c = nullptr;
      rcs[r] = ncclCommInitRank(&c, 3, id, r);
      errs[r] = ncclGetLastError(nullptr);
      if (c) ncclCommDestroy(c);
    });
  for (auto& t : ts) t.join();
  unsetenv("TUTTI_INIT_TIMEOUT");
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(rcs[r], ncclSuccess);
    EXPECT_NE(errs[r].find("missing rank(s) 2"), std::string::npos) << errs[r];
  }
}

TEST(Faults, PeerThatNeverCallsTimesOutWithItsName) {
  setenv("TUTTI_TIMEOUT", "2", 1);
  runRanks(2, [&](int r, ncclComm_t comm) {
    if (r == 1) {
      std::this_thread::sleep_for(std::chrono::seconds(4));
      return;
    }
    int32_t v = 1, out = 0;
    auto t0 = std::chrono::steady_clock::now();
    ncclResult_t rc = ncclAllReduce(&v, &out, 1, ncclInt32, ncclSum, comm, nullptr);
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(rc, ncclRemoteError);
    std::string err = ncclGetLastError(comm);
    EXPECT_NE(err.find("rank 1"), std::string::npos) << err;
    EXPECT_LT(secs, 3.5);
    // The communicator is broken from now on and says why.
    EXPECT_EQ(ncclAllReduce(&v, &out, 1, ncclInt32, ncclSum, comm, nullptr), ncclRemoteError);
    ncclResult_t async = ncclSuccess;
    EXPECT_EQ(ncclCommGetAsyncError(comm, &async), ncclSuccess);
    EXPECT_EQ(async, ncclRemoteError);
  });
  unsetenv("TUTTI_TIMEOUT");
}

TEST(Faults, AbortFromAnotherThreadUnblocksAWaitingCall) {
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  std::vector<ncclComm_t> comms(2);
  ASSERT_EQ(ncclCommInitAll(comms.data(), 2, nullptr), ncclSuccess);
  std::atomic<bool> returned{false};
  ncclResult_t rc = ncclSuccess;
  double secs = 0;
  std::thread waiter([&] {
    int32_t v = 1, out = 0;
    auto t0 = std::chrono::steady_clock::now();
    rc = ncclAllReduce(&v, &out, 1, ncclInt32, ncclSum, comms[0], nullptr);  // rank 1 never joins
    secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    returned = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_FALSE(returned.load());
  ASSERT_EQ(ncclCommAbort(comms[0]), ncclSuccess);
  waiter.join();
  EXPECT_NE(rc, ncclSuccess);
  EXPECT_LT(secs, 2.0);
  ASSERT_EQ(ncclCommDestroy(comms[1]), ncclSuccess);
}

// Two ranks of this process start a 64 MiB float all-reduce, which keeps
// both busy for tens of milliseconds or more; 5 ms in, this thread aborts
// rank 0. Both calls' results, and how long after the abort was called rank
// 0's call returned; rank 1's communicator is left to the caller.
struct AbortedAllReduce {
  ncclResult_t rc[2] = {ncclSuccess, ncclSuccess};
  double ms = 0;  // rank 0's return, after ncclCommAbort was called
  ncclComm_t peer = nullptr;
};
AbortedAllReduce abortDuringLargeAllReduce() {
  AbortedAllReduce out;
  std::vector<ncclComm_t> comms(2);
  EXPECT_EQ(ncclCommInitAll(comms.data(), 2, nullptr), ncclSuccess);
  constexpr size_t kN = size_t{16} << 20;  // floats
  std::vector<std::vector<float>> bufs(2, std::vector<float>(kN, 1.0f));
  std::atomic<int> started{0};
  std::chrono::steady_clock::time_point ended0;
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r)
    ranks.emplace_back([&, r] {
      started++;
      out.rc[r] = ncclAllReduce(bufs[r].data(), bufs[r].data(), kN, ncclFloat32, ncclSum, comms[r],
                                nullptr);
      if (r == 0) ended0 = std::chrono::steady_clock::now();
    });
  while (started.load() < 2) std::this_thread::yield();
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(ncclCommAbort(comms[0]), ncclSuccess);  // waits for rank 0's call to end
  for (auto& t : ranks) t.join();                   // rank 1's peer left: an error, not a hang
  out.ms = std::chrono::duration<double, std::milli>(ended0 - t0).count();
  out.peer = comms[1];
  return out;
}

// Abort while the operation is moving data (not waiting), over TCP: it ends
// with an error within a pass of the executor, not at its end.
TEST(Faults, AbortEndsAnOperationThatIsMakingProgress) {
  Env env({std::make_pair("NCCL_SHM_DISABLE", "1")});
  const AbortedAllReduce run = abortDuringLargeAllReduce();
  EXPECT_NE(run.rc[0], ncclSuccess) << "the all-reduce ran to its end after ncclCommAbort";
  printf("[  abort   ] rank 0's all-reduce returned %.2f ms after ncclCommAbort\n", run.ms);
  // The bound. Measured 2-12 ms here; an abort noticed only by the
  // executor's idle-time stall check (every 100 ms) took 72-96 ms.
  EXPECT_LT(run.ms, 50.0);
  EXPECT_NE(run.rc[1], ncclSuccess);
  ASSERT_EQ(ncclCommDestroy(run.peer), ncclSuccess);
}

// Over shared memory the peer of an aborted rank is told so (the node arena
// carries it, and is read before the aborted rank's own failure notice),
// whatever it was waiting in when the abort came.
TEST(Faults, PeerOfAnAbortedRankIsToldItWasAborted) {
  Env env({std::make_pair("NCCL_SHM_DISABLE", "0")});
  const AbortedAllReduce run = abortDuringLargeAllReduce();
  if (run.rc[0] == ncclSuccess) {
    ASSERT_EQ(ncclCommDestroy(run.peer), ncclSuccess);
    GTEST_SKIP() << "the all-reduce had ended before the abort";
  }
  EXPECT_NE(run.rc[1], ncclSuccess);
  const std::string why = ncclGetLastError(run.peer);
  EXPECT_NE(why.find("rank 0"), std::string::npos) << why;
  EXPECT_NE(why.find("aborted its communicator"), std::string::npos) << why;
  ASSERT_EQ(ncclCommDestroy(run.peer), ncclSuccess);
}

TEST(Config, NonBlockingInitReportsInProgressThenSuccess) {
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  std::vector<std::thread> ts;
  for (int r = 0; r < 2; ++r)
    ts.emplace_back([&, r] {
      ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
      cfg.blocking = 0;
      ncclComm_t c = nullptr;
      ncclResult_t rc = ncclCommInitRankConfig(&c, 2, id, r, &cfg);
      EXPECT_TRUE(rc == ncclInProgress || rc == ncclSuccess);
      ncclResult_t st = ncclInProgress;
      while (st == ncclInProgress) ASSERT_EQ(ncclCommGetAsyncError(c, &st), ncclSuccess);
      ASSERT_EQ(st, ncclSuccess);
      // Operations follow NCCL's contract too (tests/inproc/nonblocking_test.cc):
      // ncclInProgress, then poll.
      int32_t v = r + 1, out = 0;
      ASSERT_EQ(ncclAllReduce(&v, &out, 1, ncclInt32, ncclSum, c, nullptr), ncclInProgress);
      st = ncclInProgress;
      while (st == ncclInProgress) ASSERT_EQ(ncclCommGetAsyncError(c, &st), ncclSuccess);
      ASSERT_EQ(st, ncclSuccess);
      EXPECT_EQ(out, 3);
      rc = ncclCommFinalize(c);
      EXPECT_TRUE(rc == ncclInProgress || rc == ncclSuccess);
      st = ncclInProgress;
      while (st == ncclInProgress) ASSERT_EQ(ncclCommGetAsyncError(c, &st), ncclSuccess);
      ASSERT_EQ(st, ncclSuccess);
      ASSERT_EQ(ncclCommDestroy(c), ncclSuccess);
    });
  for (auto& t : ts) t.join();
}

// ncclCommAbort of a non-blocking communicator whose creation still waits
// for its peers (rank 2 of 3 never comes) ends the creation at once instead
// of at TUTTI_INIT_TIMEOUT (120 s here), and the rank that joined with it
// is told (its root sees the aborted rank hang up) instead of waiting too.
// The bounds (10 s, 30 s) leave sanitizers room; waiting for the deadline
// would take 120 s.
TEST(Config, AbortEndsANonBlockingInitThatWaitsForItsPeers) {
  Env env({{"TUTTI_INIT_TIMEOUT", "120"}, {"NCCL_SOCKET_IFNAME", "lo"}});
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  ncclComm_t comms[2] = {nullptr, nullptr};
  for (int r = 0; r < 2; ++r) {
    const ncclResult_t rc = ncclCommInitRankConfig(&comms[r], 3, id, r, &cfg);
    ASSERT_EQ(rc, ncclInProgress) << ncclGetLastError(nullptr);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  for (ncclComm_t c : comms) {
    ncclResult_t st = ncclSuccess;
    ASSERT_EQ(ncclCommGetAsyncError(c, &st), ncclSuccess);
    ASSERT_EQ(st, ncclInProgress) << "the creation should still wait for rank 2";
  }
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(ncclCommAbort(comms[0]), ncclSuccess);
  const double abortS =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(abortS, 10.0) << "ncclCommAbort waited for the creation's deadline";
  ncclResult_t st = ncclInProgress;
  while (st == ncclInProgress && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(30)) {
    ASSERT_EQ(ncclCommGetAsyncError(comms[1], &st), ncclSuccess);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_NE(st, ncclInProgress) << "rank 1 still waits 30 s after rank 0 aborted";
  EXPECT_NE(st, ncclSuccess);
  EXPECT_STRNE(ncclGetLastError(comms[1]), "");
  ASSERT_EQ(ncclCommDestroy(comms[1]), ncclSuccess);
}


// A call refused inside a group (rank 1 passes a NULL buffer to the second of
// two all-reduces) fails the whole group on that rank, at ncclGroupEnd, and
// the peers' group fails too, within seconds (not TUTTI_TIMEOUT), naming
// rank 1 and its error. The communicator is failed everywhere afterwards.
void refusedCallFailsTheGroup() {
  Env env({std::make_pair("TUTTI_TIMEOUT", "30")});
  const int n = 3;
  runRanks(n, [&](int r, ncclComm_t comm) {
    std::vector<int32_t> a(1000, r + 1), b(1 << 16, r + 1);
    auto t0 = std::chrono::steady_clock::now();
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    EXPECT_EQ(ncclAllReduce(a.data(), a.data(), a.size(), ncclInt32, ncclSum, comm, nullptr),
              ncclSuccess);
    ncclResult_t second = ncclAllReduce(b.data(), r == 1 ? nullptr : b.data(), b.size(),
                                        ncclInt32, ncclSum, comm, nullptr);
    EXPECT_EQ(second, r == 1 ? ncclInvalidArgument : ncclSuccess);
    ncclResult_t end = ncclGroupEnd();
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const std::string err = ncclGetLastError(comm);
    EXPECT_NE(end, ncclSuccess) << "rank " << r;
    EXPECT_LT(secs, 5.0) << "rank " << r << ": " << err;
    EXPECT_NE(err.find("recvbuff is NULL"), std::string::npos) << "rank " << r << ": " << err;
    if (r == 1) {
      EXPECT_EQ(end, ncclInvalidArgument);
      EXPECT_NE(err.find("the group did not run"), std::string::npos) << err;
    } else {
      EXPECT_NE(err.find("rank 1"), std::string::npos) << "rank " << r << ": " << err;
    }
    // Failed for good: a later call fails at once.
    EXPECT_NE(ncclAllReduce(a.data(), a.data(), a.size(), ncclInt32, ncclSum, comm, nullptr),
              ncclSuccess);
  });
}

TEST(Groups, ARefusedCallFailsTheWholeGroupOnEveryRank) { refusedCallFailsTheGroup(); }
TEST(Groups, ARefusedCallFailsTheWholeGroupOnEveryRankOverTcp) {
  Env env({std::make_pair("NCCL_SHM_DISABLE", "1")});
  refusedCallFailsTheGroup();
}

// tuttiCommWaitingOn names the ranks a stalled operation waits for, from
// another thread, while it runs; none before it stalls and after it ends.
// The last rank joins an all-reduce 1.5 s late. With 2 ranks the other names
// it. With 3, each names the ranks it expects messages from (on a ring,
// rank 1 waits for rank 0, which waits for rank 2): never itself, and
// someone names the late rank. Every path: shared memory one-shot for the
// small size, the executor's ring for the large one, TCP.
void waitingOnTheLateRank(int n, size_t count) {
  const int late = n - 1;
  std::vector<std::vector<int>> seenBy(n);
  runRanks(n, [&](int r, ncclComm_t comm) {
    std::vector<int32_t> v(count, r + 1);
    std::vector<int>& seen = seenBy[r];
    int none = -1;
    int ranks[4] = {-1, -1, -1, -1};
    EXPECT_EQ(tuttiCommWaitingOn(comm, ranks, 4, &none), ncclSuccess);
    EXPECT_EQ(none, 0);
    if (r == late) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    std::atomic<bool> done{false};
    std::thread watcher([&] {
      if (r == late) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(700));
      int k = 0;
      ASSERT_EQ(tuttiCommWaitingOn(comm, ranks, 4, &k), ncclSuccess);
      EXPECT_FALSE(done.load()) << "rank " << r << ": the all-reduce ended before the late rank came";
      seen.assign(ranks, ranks + std::min(k, 4));
    });
    ASSERT_EQ(ncclAllReduce(v.data(), v.data(), count, ncclInt32, ncclSum, comm, nullptr),
              ncclSuccess)
        << ncclGetLastError(comm);
    done = true;
    watcher.join();
    for (size_t i = 0; i < count; ++i) ASSERT_EQ(v[i], n * (n + 1) / 2) << "element " << i;
    int after = -1;
    EXPECT_EQ(tuttiCommWaitingOn(comm, ranks, 4, &after), ncclSuccess);
    EXPECT_EQ(after, 0) << "rank " << r;
  });
  bool named = false;
  for (int r = 0; r < late; ++r) {
    EXPECT_FALSE(seenBy[r].empty()) << "rank " << r << " named nobody";
    for (int q : seenBy[r]) {
      EXPECT_TRUE(q >= 0 && q < n && q != r) << "rank " << r << " named " << q;
      named = named || q == late;
    }
    if (n == 2) {
      EXPECT_EQ(seenBy[r], std::vector<int>{late});
    }
  }
  EXPECT_TRUE(named) << "nobody named the late rank " << late;
}

TEST(WaitingOn, NamesTheLateRank) {
  for (int n : {2, 3})
    for (size_t count : {size_t{16}, size_t{1} << 20}) waitingOnTheLateRank(n, count);
}
TEST(WaitingOn, NamesTheLateRankOverTcp) {
  Env env({std::make_pair("NCCL_SHM_DISABLE", "1")});
  for (int n : {2, 3})
    for (size_t count : {size_t{16}, size_t{1} << 20}) waitingOnTheLateRank(n, count);
}

TEST(WaitingOn, BadArgumentsAreErrors) {
  int count = 0, ranks[2];
  EXPECT_EQ(tuttiCommWaitingOn(nullptr, ranks, 2, &count), ncclInvalidArgument);
  runRanks(1, [&](int, ncclComm_t comm) {
    EXPECT_EQ(tuttiCommWaitingOn(comm, ranks, 2, nullptr), ncclInvalidArgument);
    EXPECT_NE(std::string(ncclGetLastError(comm)).find("count is NULL"), std::string::npos);
    EXPECT_EQ(tuttiCommWaitingOn(comm, nullptr, 2, &count), ncclInvalidArgument);
    EXPECT_EQ(tuttiCommWaitingOn(comm, ranks, -1, &count), ncclInvalidArgument);
    EXPECT_EQ(tuttiCommWaitingOn(comm, nullptr, 0, &count), ncclSuccess);
    EXPECT_EQ(count, 0);
  });
}

}  // namespace
}  // namespace tutti::test
