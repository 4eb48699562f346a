// Waiting for a late peer over shared memory sleeps on a real wake-up (the
// rank's doorbell in the node arena, transports/shm/doorbell.h), not on a
// timer: the waiting thread is switched out a few hundred times at most in
// 400 ms, where 50 us naps would switch it out thousands of times. And the
// ring wakes it: the results are exact, every rank count from 2 to 4.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <chrono>
#include <thread>
#include <vector>

#include "harness.h"
#include "nccl.h"

namespace tutti::test {
namespace {

long voluntarySwitches() {
  rusage u{};
  getrusage(RUSAGE_THREAD, &u);
  return u.ru_nvcsw;
}

TEST(Wakeup, WaitingForALatePeerSleepsOnTheDoorbell) {
  Env env({std::make_pair("NCCL_SHM_DISABLE", "0")});
  for (int n : {2, 3, 4}) {
    SCOPED_TRACE("nranks " + std::to_string(n));
    // 1 MiB: past the one-shot arena's slots (TUTTI_ONESHOT_MAX), so the
    // executor waits on the shared-memory rings.
    const size_t count = 1 << 18;
    std::vector<long> switches(n, 0);
    runRanks(n, [&](int r, ncclComm_t comm) {
      std::vector<int32_t> buf(count);
      for (size_t i = 0; i < count; ++i) buf[i] = static_cast<int32_t>(i % 1000) + r;
      // A first call connects every ring outside the measured one.
      ASSERT_EQ(ncclAllReduce(buf.data(), buf.data(), count, ncclInt32, ncclSum, comm, nullptr),
                ncclSuccess);
      for (size_t i = 0; i < count; ++i) buf[i] = static_cast<int32_t>(i % 1000) + r;
      if (r == n - 1) std::this_thread::sleep_for(std::chrono::milliseconds(400));
      const long before = voluntarySwitches();
      ASSERT_EQ(ncclAllReduce(buf.data(), buf.data(), count, ncclInt32, ncclSum, comm, nullptr),
                ncclSuccess)
          << ncclGetLastError(comm);
      switches[r] = voluntarySwitches() - before;
      const int32_t rankSum = n * (n - 1) / 2;
      for (size_t i = 0; i < count; ++i)
        ASSERT_EQ(buf[i], static_cast<int32_t>(i % 1000) * n + rankSum) << "element " << i;
    });
    // Rank 0 waited about 400 ms: 5 ms of yielding, then sleeps of at most
    // 1 ms each (kBellSleep) ended by a ring or the timeout. Naps of 50 us
    // would be about 7,900 switches.
    EXPECT_LT(switches[0], 1500) << "rank 0 was switched out " << switches[0]
                                 << " times while it waited: it napped instead of sleeping";
    printf("[  wakeup  ] %d ranks: rank 0 was switched out %ld times in a 400 ms wait\n", n,
           switches[0]);
  }
}

}  // namespace
}  // namespace tutti::test
