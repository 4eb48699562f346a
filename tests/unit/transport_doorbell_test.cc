// transports/shm/doorbell.h: a sleeper wakes when another process rings (a
// process-shared futex in a MAP_SHARED mapping), not at its timeout; a ring
// with nobody asleep changes nothing; a look that finds work skips the sleep.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "transports/shm/doorbell.h"

namespace tutti::transport::shm {
namespace {

using Clock = std::chrono::steady_clock;

Doorbell* sharedBell() {
  void* p = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  auto* b = static_cast<Doorbell*>(p);
  b->seq.store(0);
  b->sleepers.store(0);
  return b;
}

TEST(Doorbell, AnotherProcessRingWakesTheSleeper) {
  Doorbell* b = sharedBell();
  ASSERT_NE(b, nullptr);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Ring once the parent sleeps (or give up after 5 s: the parent then
    // sleeps to its timeout and the test fails on the time).
    const auto until = Clock::now() + std::chrono::seconds(5);
    while (b->sleepers.load() == 0 && Clock::now() < until) usleep(1000);
    usleep(20000);
    ring(b);
    _exit(0);
  }
  const auto t0 = Clock::now();
  const bool slept = sleep(b, std::chrono::seconds(10), [] { return true; });
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(slept);
  // Woken by the ring (about 20 ms after the sleep began), not by the 10 s
  // timeout: a generous bound for a loaded machine.
  EXPECT_LT(ms, 5000.0) << "the sleeper was not woken by the other process's ring";
  EXPECT_EQ(b->sleepers.load(), 0u);
  EXPECT_EQ(b->seq.load(), 1u);  // one ring that found a sleeper
  munmap(b, 4096);
}

TEST(Doorbell, RingWithoutASleeperChangesNothing) {
  Doorbell* b = sharedBell();
  ASSERT_NE(b, nullptr);
  ring(b);
  ring(b);
  EXPECT_EQ(b->seq.load(), 0u);
  munmap(b, 4096);
}

TEST(Doorbell, WorkFoundAfterTheAnnouncementSkipsTheSleep) {
  Doorbell* b = sharedBell();
  ASSERT_NE(b, nullptr);
  const auto t0 = Clock::now();
  bool looked = false;
  const bool slept = sleep(b, std::chrono::seconds(10), [&] {
    looked = true;
    EXPECT_EQ(b->sleepers.load(), 1u);  // announced before the look
    return false;                       // work found
  });
  EXPECT_TRUE(looked);
  EXPECT_FALSE(slept);
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 5.0);
  EXPECT_EQ(b->sleepers.load(), 0u);
  munmap(b, 4096);
}

TEST(Doorbell, SleepEndsAtItsTimeout) {
  Doorbell* b = sharedBell();
  ASSERT_NE(b, nullptr);
  const auto t0 = Clock::now();
  EXPECT_TRUE(sleep(b, std::chrono::microseconds(20000), [] { return true; }));
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  EXPECT_GE(ms, 15.0);
  EXPECT_LT(ms, 5000.0);
  munmap(b, 4096);
}

}  // namespace
}  // namespace tutti::transport::shm
