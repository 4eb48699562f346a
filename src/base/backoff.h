// How a thread waits for a peer without a file descriptor to sleep on
// (shared memory): spin, then yield the core, then nap.
//
// Contract: idle() is called after a pass that moved nothing, progress()
// after one that moved something. The spin phase lasts about kSpin when this
// host has a core for every local rank and only 32 pauses when it does not
// (oversubscribed: a spinning rank would steal the core its peer needs); the
// yield phase lasts until kYieldFor of idleness; after that each idle() sleeps
// kNap. Never blocks longer than kNap.
#pragma once

#include <sched.h>

#include <chrono>
#include <cstdint>
#include <thread>

namespace tutti::base {

// CPUs this process may run on (its affinity mask), at least 1.
int usableCpus();

class Backoff {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr std::chrono::microseconds kSpin{20};
  static constexpr std::chrono::milliseconds kYieldFor{5};
  static constexpr std::chrono::microseconds kNap{50};

  // The spin phase counts pauses rather than reading the clock (a clock read
  // costs as much as a cache-line transfer on some virtual machines).
  explicit Backoff(bool oversubscribed) : spinIters_(oversubscribed ? 32 : spinItersFor(kSpin)) {}

  void progress() {
    iters_ = 0;
    phase_ = kSpinning;
  }
  void idle() {
    ++iters_;
    switch (phase_) {
      case kSpinning:
        relax();
        if (iters_ >= spinIters_) {
          phase_ = kYielding;
          since_ = Clock::now();
        }
        return;
      case kYielding:
        sched_yield();
        if ((iters_ & 15) == 0 && Clock::now() - since_ >= kYieldFor) phase_ = kNapping;
        return;
      case kNapping:
        std::this_thread::sleep_for(kNap);
        return;
    }
  }
  // Iterations of the current idle stretch, and whether it is past spinning
  // (only then is idleFor() worth a clock read).
  uint64_t idleIters() const { return iters_; }
  bool pastSpin() const { return phase_ != kSpinning; }
  // Past the yield phase: idle() naps now (a caller with something better to
  // sleep on, a doorbell, may do that instead).
  bool napping() const { return phase_ == kNapping; }
  // Time since the spin phase ended (0 while spinning).
  Clock::duration idleFor() const {
    return phase_ == kSpinning ? Clock::duration(0) : Clock::now() - since_;
  }

 private:
  // Pauses that take about `d` (measured once per process).
  static uint64_t spinItersFor(std::chrono::microseconds d);
  static void relax() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield" ::: "memory");
#endif
  }

  enum Phase { kSpinning, kYielding, kNapping };
  uint64_t spinIters_;
  Phase phase_ = kSpinning;
  uint64_t iters_ = 0;
  Clock::time_point since_{};
};

}  // namespace tutti::base
