// tuttiRecvAny: a receive from whichever rank's point-to-point message comes
// first, over shared memory and over TCP. Values are checked against the
// sender the call reports; every rank's messages are received once each, in
// the order it sent them.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "harness.h"
#include "tutti/tutti.h"

namespace tutti::test {
namespace {

class AnySource : public ::testing::TestWithParam<const char*> {};

// A message's k-th element from `rank`, its `m`-th message: distinct per
// sender, message and element, so a mixed-up source, order or offset shows.
int32_t value(int rank, int m, size_t k) {
  return rank * 1000000 + m * 10000 + static_cast<int32_t>(k);
}

// Every rank but 0 sends two messages to rank 0, which takes them with
// tuttiRecvAny: each sender's two, in order, whatever the interleaving.
// Nothing ran before, so no connection exists: the senders connect while
// rank 0 waits (their hello). `collectiveAfter`: every rank then runs an
// all-reduce, which the senders start while rank 0 still receives (their
// collective messages come while it waits, and are not taken for point-to-
// point ones).
void everyRankSendsTwice(int n, size_t count, bool collectiveAfter) {
  runRanks(n, [&](int rank, ncclComm_t comm) {
    if (rank != 0) {
      for (int m = 0; m < 2; ++m) {
        std::vector<int32_t> out(count);
        for (size_t k = 0; k < count; ++k) out[k] = value(rank, m, k);
        ASSERT_EQ(ncclSend(out.data(), count, ncclInt32, 0, comm, nullptr), ncclSuccess)
            << ncclGetLastError(comm);
      }
    } else {
      std::map<int, int> got;  // messages per sender so far
      for (int i = 0; i < 2 * (n - 1); ++i) {
        std::vector<int32_t> in(count, -1);
        int from = -1;
        ASSERT_EQ(tuttiRecvAny(in.data(), count, ncclInt32, &from, comm, nullptr), ncclSuccess)
            << ncclGetLastError(comm);
        ASSERT_GE(from, 1);
        ASSERT_LT(from, n);
        const int m = got[from]++;
        ASSERT_LT(m, 2) << "a third message from rank " << from;
        for (size_t k = 0; k < count; ++k)
          ASSERT_EQ(in[k], value(from, m, k))
              << "from rank " << from << " message " << m << " at " << k;
      }
      EXPECT_EQ(got.size(), static_cast<size_t>(n - 1));
    }
    if (collectiveAfter) {
      int32_t x = rank + 1;
      ASSERT_EQ(ncclAllReduce(&x, &x, 1, ncclInt32, ncclSum, comm, nullptr), ncclSuccess)
          << ncclGetLastError(comm);
      EXPECT_EQ(x, n * (n + 1) / 2);
    }
  });
}

TEST_P(AnySource, EveryRanksMessagesOnceAndInOrder) {
  Env env({std::make_pair("NCCL_SHM_DISABLE", GetParam())});
  for (int n : {2, 3, 5}) everyRankSendsTwice(n, 1000, false);
}

TEST_P(AnySource, LargeMessagesOverEveryChannel) {
  Env env({std::make_pair("NCCL_SHM_DISABLE", GetParam()), std::make_pair("TUTTI_NCHANNELS", "2")});
  everyRankSendsTwice(3, size_t{3} << 20, false);  // 12 MiB each: chunks on both channels
}

TEST_P(AnySource, SendersGoOnToACollectiveMeanwhile) {
  Env env({std::make_pair("NCCL_SHM_DISABLE", GetParam())});
  for (int n : {2, 4}) everyRankSendsTwice(n, 257, true);
}

// Connected peers whose next operation towards rank 0 is a collective are
// passed over: rank 1 sends only after rank 2's all-reduce message to rank 0
// has long arrived (rank 2 is in the all-reduce, rank 0 in tuttiRecvAny).
// The all-reduces are large enough to travel as messages on every
// transport (not on the one-shot path): a ring of 3, in which rank 2 sends
// to rank 0.
TEST_P(AnySource, APeerInACollectiveIsPassedOver) {
  Env env({std::make_pair("NCCL_SHM_DISABLE", GetParam())});
  constexpr size_t kN = size_t{1} << 18;
  runRanks(3, [&](int rank, ncclComm_t comm) {
    std::vector<int32_t> x(kN, rank + 1);
    // Connects every pair first.
    ASSERT_EQ(ncclAllReduce(x.data(), x.data(), kN, ncclInt32, ncclSum, comm, nullptr),
              ncclSuccess);
    int32_t v = 100 + rank;
    if (rank == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      ASSERT_EQ(ncclSend(&v, 1, ncclInt32, 0, comm, nullptr), ncclSuccess);
    } else if (rank == 0) {
      int from = -1;
      ASSERT_EQ(tuttiRecvAny(&v, 1, ncclInt32, &from, comm, nullptr), ncclSuccess)
          << ncclGetLastError(comm);
      EXPECT_EQ(from, 1);
      EXPECT_EQ(v, 101);
    }
    std::fill(x.begin(), x.end(), rank + 1);
    ASSERT_EQ(ncclAllReduce(x.data(), x.data(), kN, ncclInt32, ncclSum, comm, nullptr), ncclSuccess)
        << ncclGetLastError(comm);
    EXPECT_EQ(x, std::vector<int32_t>(kN, 6));
  });
}

// A receive from any source, then one from the other rank: each takes its
// own message (the ordinary receive's message is never the one the first
// took), sizes differing so that a mix-up fails.
TEST_P(AnySource, ThenAnOrdinaryReceiveFromTheOther) {
  Env env({std::make_pair("NCCL_SHM_DISABLE", GetParam())});
  runRanks(3, [&](int rank, ncclComm_t comm) {
    if (rank != 0) {
      std::vector<int32_t> out(10, value(rank, 0, 0));
      ASSERT_EQ(ncclSend(out.data(), out.size(), ncclInt32, 0, comm, nullptr), ncclSuccess);
      return;
    }
    std::vector<int32_t> a(10, -1), b(10, -1);
    int from = -1;
    ASSERT_EQ(tuttiRecvAny(a.data(), a.size(), ncclInt32, &from, comm, nullptr), ncclSuccess)
        << ncclGetLastError(comm);
    ASSERT_TRUE(from == 1 || from == 2) << from;
    const int other = 3 - from;
    ASSERT_EQ(ncclRecv(b.data(), b.size(), ncclInt32, other, comm, nullptr), ncclSuccess);
    EXPECT_EQ(a, std::vector<int32_t>(10, value(from, 0, 0)));
    EXPECT_EQ(b, std::vector<int32_t>(10, value(other, 0, 0)));
  });
}

// A message of another size is an error naming the sender and both sizes,
// not a truncated or overrun buffer.
TEST_P(AnySource, AnotherSizeIsAnError) {
  Env env({std::make_pair("NCCL_SHM_DISABLE", GetParam())});
  runRanks(2, [&](int rank, ncclComm_t comm) {
    std::vector<int32_t> buf(8, -1);
    if (rank == 1) {
      (void)ncclSend(buf.data(), 5, ncclInt32, 0, comm, nullptr);
      return;
    }
    int from = -1;
    EXPECT_EQ(tuttiRecvAny(buf.data(), 4, ncclInt32, &from, comm, nullptr), ncclInvalidUsage);
    const std::string why = ncclGetLastError(comm);
    EXPECT_NE(why.find("size mismatch"), std::string::npos) << why;
    EXPECT_NE(why.find("rank 1"), std::string::npos) << why;
    EXPECT_EQ(buf[4], -1) << "written past the receive";
  });
}

TEST_P(AnySource, RefusedArguments) {
  Env env({std::make_pair("NCCL_SHM_DISABLE", GetParam())});
  runRanks(2, [&](int rank, ncclComm_t comm) {
    int32_t v = 0;
    int from = -1;
    if (rank == 0) {
      EXPECT_EQ(tuttiRecvAny(&v, 1, ncclInt32, nullptr, comm, nullptr), ncclInvalidArgument);
      EXPECT_NE(std::string(ncclGetLastError(comm)).find("peer is NULL"), std::string::npos);
      EXPECT_EQ(tuttiRecvAny(&v, 0, ncclInt32, &from, comm, nullptr), ncclInvalidArgument);
      EXPECT_NE(std::string(ncclGetLastError(comm)).find("count 0"), std::string::npos);
      EXPECT_EQ(tuttiRecvAny(nullptr, 1, ncclInt32, &from, comm, nullptr), ncclInvalidArgument);
      EXPECT_EQ(tuttiRecvAny(&v, 1, ncclInt32, &from, nullptr, nullptr), ncclInvalidArgument);
      EXPECT_EQ(from, -1);
    }
    // The communicator still works.
    int32_t x = 1;
    ASSERT_EQ(ncclAllReduce(&x, &x, 1, ncclInt32, ncclSum, comm, nullptr), ncclSuccess);
    EXPECT_EQ(x, 2);
  });
  runRanks(1, [&](int, ncclComm_t comm) {
    int32_t v = 0;
    int from = -1;
    EXPECT_EQ(tuttiRecvAny(&v, 1, ncclInt32, &from, comm, nullptr), ncclInvalidUsage);
    EXPECT_NE(std::string(ncclGetLastError(comm)).find("one rank"), std::string::npos)
        << ncclGetLastError(comm);
  });
}

// Inside a group its peer would have to be known when the group is planned:
// refused, and (as any call refused in a group) the group fails.
TEST_P(AnySource, RefusedInsideAGroup) {
  Env env({std::make_pair("NCCL_SHM_DISABLE", GetParam())});
  runRanks(2, [&](int rank, ncclComm_t comm) {
    if (rank != 0) return;
    int32_t v = 0;
    int from = -1;
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    EXPECT_EQ(tuttiRecvAny(&v, 1, ncclInt32, &from, comm, nullptr), ncclInvalidUsage);
    EXPECT_NE(std::string(ncclGetLastError(comm)).find("not inside a group"), std::string::npos)
        << ncclGetLastError(comm);
    EXPECT_NE(ncclGroupEnd(), ncclSuccess);
  });
}

// A tuttiRecvAny on `comm` expected to fail: how long it took (s) and why.
struct FailedWait {
  double seconds;
  std::string why;
};
FailedWait failedWait(ncclComm_t comm) {
  int32_t v = 0;
  int from = -1;
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_NE(tuttiRecvAny(&v, 1, ncclInt32, &from, comm, nullptr), ncclSuccess);
  return {std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
          ncclGetLastError(comm)};
}

// No rank sends: TUTTI_TIMEOUT ends the wait with an error that says so.
TEST_P(AnySource, NobodySendsTimesOut) {
  Env env({std::make_pair("NCCL_SHM_DISABLE", GetParam()), std::make_pair("TUTTI_TIMEOUT", "1")});
  std::atomic<bool> done{false};
  runRanks(3, [&](int rank, ncclComm_t comm) {
    if (rank != 0) {
      while (!done.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      return;
    }
    const FailedWait w = failedWait(comm);
    done = true;
    EXPECT_NE(w.why.find("TUTTI_TIMEOUT"), std::string::npos) << w.why;
    EXPECT_NE(w.why.find("any source"), std::string::npos) << w.why;
    EXPECT_GE(w.seconds, 0.9);
    EXPECT_LT(w.seconds, 5.0);
  });
}

// Every other rank destroys its communicator without sending: the wait
// ends with an error saying so, long before TUTTI_TIMEOUT.
TEST_P(AnySource, EveryPeerLeavingEndsTheWait) {
  Env env({std::make_pair("NCCL_SHM_DISABLE", GetParam())});
  runRanks(3, [&](int rank, ncclComm_t comm) {
    if (rank != 0) return;
    const FailedWait w = failedWait(comm);
    EXPECT_NE(w.why.find("every other rank has left"), std::string::npos) << w.why;
    EXPECT_LT(w.seconds, 5.0);
  });
}

// ncclCommAbort from another thread ends the wait within 50 ms.
TEST_P(AnySource, AbortEndsTheWait) {
  Env env({std::make_pair("NCCL_SHM_DISABLE", GetParam())});
  std::vector<ncclComm_t> comms(2);
  ASSERT_EQ(ncclCommInitAll(comms.data(), 2, nullptr), ncclSuccess);
  std::atomic<bool> started{false};
  ncclResult_t rc = ncclSuccess;
  std::chrono::steady_clock::time_point ended;
  std::thread waiter([&] {
    int32_t v = 0;
    int from = -1;
    started = true;
    rc = tuttiRecvAny(&v, 1, ncclInt32, &from, comms[0], nullptr);
    ended = std::chrono::steady_clock::now();
  });
  while (!started.load()) std::this_thread::yield();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(ncclCommAbort(comms[0]), ncclSuccess);
  waiter.join();
  EXPECT_NE(rc, ncclSuccess);
  const double ms = std::chrono::duration<double, std::milli>(ended - t0).count();
  EXPECT_LT(ms, 50.0);
  EXPECT_EQ(ncclCommDestroy(comms[1]), ncclSuccess);
}

INSTANTIATE_TEST_SUITE_P(Transports, AnySource, ::testing::Values("0", "1"), [](const auto& info) {
  return std::string(info.param[0] == '0' ? "Shm" : "Tcp");
});

}  // namespace
}  // namespace tutti::test
