// Orderings that ThreadSanitizer cannot see by itself. Ranks that are threads
// of one process synchronise through shared memory that each maps at its own
// address, or through sockets: when one of them then reads another's buffer
// directly (a memcpy instead of a cross-memory read), ThreadSanitizer would
// take the owner's writes and the reader's copy for a race. The owner calls
// tsanRelease(buf) before it publishes buf and tsanAcquire(buf) once the
// readers are known to be done; a reader calls tsanAcquire(buf) before it
// reads and tsanRelease(buf) after. Keyed by the buffer's address (the same
// in every thread). No-ops in other builds.
#pragma once

#if defined(__SANITIZE_THREAD__)
#define TUTTI_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define TUTTI_TSAN 1
#endif
#endif
#ifdef TUTTI_TSAN
extern "C" void __tsan_acquire(void* addr);
extern "C" void __tsan_release(void* addr);
#endif

namespace tutti::base {

inline void tsanRelease(const void* buf) {
#ifdef TUTTI_TSAN
  __tsan_release(const_cast<void*>(buf));
#else
  (void)buf;
#endif
}

inline void tsanAcquire(const void* buf) {
#ifdef TUTTI_TSAN
  __tsan_acquire(const_cast<void*>(buf));
#else
  (void)buf;
#endif
}

}  // namespace tutti::base
