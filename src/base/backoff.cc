#include "base/backoff.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>

namespace tutti::base {

int usableCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int>(n) : 1;
}

uint64_t Backoff::spinItersFor(std::chrono::microseconds d) {
  static const double perPause = [] {
    constexpr int kN = 2000;
    auto t0 = Clock::now();
    for (int i = 0; i < kN; ++i) relax();
    double ns = std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / kN;
    return std::clamp(ns, 1.0, 1000.0);
  }();
  return std::max<uint64_t>(32, static_cast<uint64_t>(d.count() * 1000.0 / perPause));
}

}  // namespace tutti::base
