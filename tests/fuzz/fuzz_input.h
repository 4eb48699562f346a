// Helpers shared by the fuzz targets (tests/fuzz/*_fuzz.cc): reading an
// input front to back, and the check that fails a run.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>

namespace tutti::fuzz {

// An invariant of the code under test. A violation prints where and traps,
// which libFuzzer (and the replay driver, as a signal) reports as a crash
// with the input that caused it.
#define FUZZ_CHECK(cond)                                                                       \
  do {                                                                                         \
    if (!(cond)) {                                                                             \
      std::fprintf(stderr, "%s:%d: fuzz invariant violated: %s\n", __FILE__, __LINE__, #cond); \
      __builtin_trap();                                                                        \
    }                                                                                          \
  } while (0)

// The input, consumed from the front. Past its end every read yields zeros
// (and empty pieces), so a short input is still a valid, complete run.
class Input {
 public:
  Input(const uint8_t* data, size_t size) : p_(data), n_(size) {}
  size_t left() const { return n_; }
  bool empty() const { return n_ == 0; }
  uint8_t byte() {
    if (n_ == 0) return 0;
    --n_;
    return *p_++;
  }
  template <typename T>
  T value() {
    T v{};
    const size_t take = n_ < sizeof(T) ? n_ : sizeof(T);
    std::memcpy(&v, p_, take);
    p_ += take;
    n_ -= take;
    return v;
  }
  // Up to `want` bytes; *got says how many there were.
  const uint8_t* take(size_t want, size_t* got) {
    *got = want < n_ ? want : n_;
    const uint8_t* at = p_;
    p_ += *got;
    n_ -= *got;
    return at;
  }

 private:
  const uint8_t* p_;
  size_t n_;
};

}  // namespace tutti::fuzz
