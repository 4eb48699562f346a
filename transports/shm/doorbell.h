// A doorbell: a futex word in memory that the processes of one host share
// (a line per rank in the node arena, shm_arena.h), so that a rank with
// nothing to do sleeps until a peer has moved bytes for it instead of
// napping on a timer.
//
// Contract
// - ring(b): called by whoever just made work for b's owner visible (bytes
//   written into a ring it reads, or space freed in a ring it writes): wakes
//   the owner if it sleeps. Costs a full fence and a load when nobody
//   sleeps.
// - sleep(b, max, stillIdle): the owner announces that it sleeps, calls
//   stillIdle() to look for work once more (the announcement comes first,
//   so a ring after that look is never missed), and, if it finds none,
//   sleeps until a ring or `max`. Returns whether it slept. Dekker's
//   protocol: the writer's data store and its load of `sleepers` are
//   separated by a seq_cst fence, as are the owner's increment and its look.
// - Any process may ring; only the owner sleeps (one thread at a time).
// - The futex is process-shared (no FUTEX_PRIVATE_FLAG): the arena is a
//   MAP_SHARED mapping of one file, so every process's view is one futex.
#pragma once

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <cstdint>
#include <ctime>

namespace tutti::transport::shm {

struct Doorbell {
  std::atomic<uint32_t> seq;       // bumped by each ring that finds a sleeper
  std::atomic<uint32_t> sleepers;  // the owner while it sleeps (0 or 1)
};
static_assert(std::atomic<uint32_t>::is_always_lock_free, "futex words are plain 32-bit words");

// ring() without its fence: for a writer that rings several doorbells after
// one store (one std::atomic_thread_fence(seq_cst) first, then this for each).
inline void ringFenced(Doorbell* b) {
  if (b->sleepers.load(std::memory_order_relaxed) == 0) return;
  b->seq.fetch_add(1, std::memory_order_release);
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&b->seq), FUTEX_WAKE, INT_MAX, nullptr, nullptr,
          0);
}

inline void ring(Doorbell* b) {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  ringFenced(b);
}

template <typename F>
bool sleep(Doorbell* b, std::chrono::microseconds max, F&& stillIdle) {
  b->sleepers.fetch_add(1, std::memory_order_seq_cst);
  std::atomic_thread_fence(std::memory_order_seq_cst);  // the look comes after the announcement
  const uint32_t seen = b->seq.load(std::memory_order_acquire);
  bool slept = false;
  if (stillIdle()) {
    timespec ts{static_cast<time_t>(max.count() / 1000000),
                static_cast<long>(max.count() % 1000000) * 1000};
    // EAGAIN: rung between the look and here; EINTR, ETIMEDOUT: look again.
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(&b->seq), FUTEX_WAIT, seen, &ts, nullptr, 0);
    slept = true;
  }
  b->sleepers.fetch_sub(1, std::memory_order_relaxed);
  return slept;
}

}  // namespace tutti::transport::shm
