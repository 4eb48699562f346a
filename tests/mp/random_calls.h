// Random collective calls whose results are checked exactly, and the clock
// and detection bound, for the multi-process fault and soak tests
// (death_shrink.cc, soak.cc).
//
// Every rank derives the same sequence of calls from a seed and the call's
// number (callOf); inputs are small integers (valueOf: at most 30, so a sum
// over 8 ranks fits uint8 and is exact in every type), and issue() /
// check() run a call and compare every element of its result with what the
// collective's definition gives. issue() only calls: inside a group the
// results are checked after ncclGroupEnd.
#pragma once

#include <time.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "nccl.h"

namespace tutti::test {

// How long a survivor may take to see a rank's death. Under a sanitizer
// (scripts/sanitize.sh: 8 instrumented processes on the machine's cores
// beside other tests) the point is no hang, no crash, no wrong data and the
// right rank named; the 5 s bound is the normal build's (issue 28).
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
constexpr double kDetectLimitS = 15.0;
#else
constexpr double kDetectLimitS = 5.0;
#endif

// CLOCK_MONOTONIC in seconds: comparable between the processes of a host.
inline double now() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

enum Kind { kAllReduce, kBroadcast, kReduceScatter, kAllGather, kReduce, kKinds };

inline const char* kindName(int k) {
  static const char* names[] = {"all_reduce", "broadcast", "reduce_scatter", "all_gather",
                                "reduce"};
  return names[k];
}

// The value rank r puts at element i of call `it`.
inline int64_t valueOf(int r, int it, size_t i) {
  return (r + 1) * 3 + static_cast<int64_t>((i + static_cast<size_t>(it)) % 7);
}

struct Call {
  int kind = kAllReduce;
  ncclDataType_t type = ncclFloat;
  ncclRedOp_t op = ncclSum;
  size_t count = 0;  // per rank (reduce-scatter: received; all-gather: sent)
  int root = 0;
};

inline size_t sizeOf(ncclDataType_t t) {
  switch (t) {
    case ncclUint8:
      return 1;
    case ncclInt64:
    case ncclFloat64:
      return 8;
    default:
      return 4;
  }
}

// The same call on every rank: a function of (seed, it, n). Buffers of at
// most maxBytes; `allTypes`: float32, float64, int32, int64 and uint8 with
// sum, max or min (else float32 or int32 with sum).
inline Call callOf(uint64_t seed, int it, int n, size_t maxBytes, bool allTypes) {
  std::mt19937_64 rng(seed * 1000003u + static_cast<uint64_t>(it));
  Call c;
  c.kind = static_cast<int>(rng() % kKinds);
  if (allTypes) {
    static const ncclDataType_t types[] = {ncclFloat, ncclFloat64, ncclInt32, ncclInt64,
                                           ncclUint8};
    static const ncclRedOp_t ops[] = {ncclSum, ncclMax, ncclMin};
    c.type = types[rng() % 5];
    c.op = ops[rng() % 3];
  } else {
    c.type = (rng() % 2) ? ncclFloat : ncclInt32;
    c.op = ncclSum;
  }
  size_t maxCount = std::max<size_t>(1, maxBytes / sizeOf(c.type));
  if (c.kind == kReduceScatter || c.kind == kAllGather)
    maxCount = std::max<size_t>(1, maxCount / static_cast<size_t>(n));
  // Log-uniform from 1 element to maxCount.
  const double e = std::uniform_real_distribution<double>(0, std::log2(double(maxCount)))(rng);
  c.count = std::max<size_t>(1, static_cast<size_t>(std::exp2(e)));
  c.root = static_cast<int>(rng() % static_cast<uint64_t>(n));
  return c;
}

// The buffers of one call on one rank.
struct Buffers {
  std::vector<uint8_t> send, recv;
};

inline void store(ncclDataType_t t, uint8_t* p, size_t i, int64_t v) {
  switch (t) {
    case ncclUint8:
      p[i] = static_cast<uint8_t>(v);
      break;
    case ncclInt32: {
      int32_t x = static_cast<int32_t>(v);
      memcpy(p + i * 4, &x, 4);
      break;
    }
    case ncclInt64:
      memcpy(p + i * 8, &v, 8);
      break;
    case ncclFloat64: {
      double x = static_cast<double>(v);
      memcpy(p + i * 8, &x, 8);
      break;
    }
    default: {
      float x = static_cast<float>(v);
      memcpy(p + i * 4, &x, 4);
      break;
    }
  }
}

// The element as an integer; false when it is not one exactly.
inline bool load(ncclDataType_t t, const uint8_t* p, size_t i, int64_t* v) {
  switch (t) {
    case ncclUint8:
      *v = p[i];
      return true;
    case ncclInt32: {
      int32_t x;
      memcpy(&x, p + i * 4, 4);
      *v = x;
      return true;
    }
    case ncclInt64:
      memcpy(v, p + i * 8, 8);
      return true;
    case ncclFloat64: {
      double x;
      memcpy(&x, p + i * 8, 8);
      *v = static_cast<int64_t>(x);
      return x == static_cast<double>(*v);
    }
    default: {
      float x;
      memcpy(&x, p + i * 4, 4);
      *v = static_cast<int64_t>(x);
      return x == static_cast<float>(*v);
    }
  }
}

inline size_t sendCount(const Call& c, int n) {
  return c.kind == kReduceScatter ? c.count * static_cast<size_t>(n) : c.count;
}
inline size_t recvCount(const Call& c, int n) {
  return c.kind == kAllGather ? c.count * static_cast<size_t>(n) : c.count;
}

// Starts call `c` (number `it`) as rank r of n: fills `b` and calls NCCL.
inline ncclResult_t issue(ncclComm_t comm, int r, int n, int it, const Call& c, Buffers* b) {
  const size_t es = sizeOf(c.type);
  b->send.assign(sendCount(c, n) * es, 0);
  b->recv.assign(recvCount(c, n) * es, 0xa5);  // no integer pattern a result could have
  for (size_t i = 0; i < sendCount(c, n); ++i) store(c.type, b->send.data(), i, valueOf(r, it, i));
  const void* s = b->send.data();
  void* d = b->recv.data();
  switch (c.kind) {
    case kAllReduce:
      return ncclAllReduce(s, d, c.count, c.type, c.op, comm, nullptr);
    case kBroadcast:
      return ncclBroadcast(s, d, c.count, c.type, c.root, comm, nullptr);
    case kReduceScatter:
      return ncclReduceScatter(s, d, c.count, c.type, c.op, comm, nullptr);
    case kReduce:
      return ncclReduce(s, d, c.count, c.type, c.op, c.root, comm, nullptr);
    default:
      return ncclAllGather(s, d, c.count, c.type, comm, nullptr);
  }
}

// Whether the result of call `c` (number `it`, run as rank r of n) in `b`
// is exactly right; *why says where it is not.
inline bool check(int r, int n, int it, const Call& c, const Buffers& b, std::string* why) {
  if (c.kind == kReduce && r != c.root) return true;  // only the root receives
  auto reduce = [&](size_t idx) {
    int64_t acc = valueOf(0, it, idx);
    for (int q = 1; q < n; ++q) {
      const int64_t v = valueOf(q, it, idx);
      acc = c.op == ncclSum ? acc + v : c.op == ncclMax ? std::max(acc, v) : std::min(acc, v);
    }
    return acc;
  };
  for (size_t i = 0; i < recvCount(c, n); ++i) {
    int64_t want = 0;
    switch (c.kind) {
      case kAllReduce:
      case kReduce:
        want = reduce(i);
        break;
      case kBroadcast:
        want = valueOf(c.root, it, i);
        break;
      case kReduceScatter:
        want = reduce(static_cast<size_t>(r) * c.count + i);
        break;
      default:
        want = valueOf(static_cast<int>(i / c.count), it, i % c.count);
        break;
    }
    int64_t got = 0;
    if (!load(c.type, b.recv.data(), i, &got) || got != want) {
      *why = std::string(kindName(c.kind)) + " of " + std::to_string(c.count) + " (call " +
             std::to_string(it) + "): element " + std::to_string(i) + " is " +
             std::to_string(got) + ", not " + std::to_string(want);
      return false;
    }
  }
  return true;
}

}  // namespace tutti::test
