// Ranks as threads: each thread owns a real communicator over real shared
// memory or TCP (NCCL_SHM_DISABLE=1), created through the public C API.
#pragma once

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "backends/cpu/float_formats.h"
#include "base/types.h"
#include "nccl.h"

namespace tutti::test {

// Sets environment variables for its lifetime (unset afterwards): the
// library reads them when communicators are created.
struct Env {
  explicit Env(std::vector<std::pair<const char*, const char*>> vars) {
    for (auto& [k, v] : vars) {
      setenv(k, v, 1);
      names.push_back(k);
    }
  }
  ~Env() {
    for (auto* k : names) unsetenv(k);
  }
  Env(const Env&) = delete;
  Env& operator=(const Env&) = delete;
  std::vector<const char*> names;
};

// A blocking TCP connection to 127.0.0.1:port, or -1 (probes of tutti's
// listeners in the bootstrap tests).
inline int connectLoopback(uint16_t port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  if (fd >= 0 && connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) return fd;
  if (fd >= 0) close(fd);
  return -1;
}

// Runs fn(rank, comm) on n threads; communicators are created and destroyed here.
inline void runRanks(int n, const std::function<void(int, ncclComm_t)>& fn) {
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      ncclComm_t comm = nullptr;
      ncclResult_t rc = ncclCommInitRank(&comm, n, id, r);
      if (rc != ncclSuccess) {
        ADD_FAILURE() << "rank " << r << " init: " << ncclGetLastError(nullptr);
        failures++;
        return;
      }
      fn(r, comm);
      EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_EQ(failures.load(), 0);
}

// Value <-> bytes for every NCCL datatype (floating types via double).
inline void storeValue(void* p, ncclDataType_t dt, double v) {
  switch (dt) {
    case ncclInt8: {
      int8_t x = static_cast<int8_t>(v);
      memcpy(p, &x, 1);
      break;
    }
    case ncclUint8: {
      uint8_t x = static_cast<uint8_t>(v);
      memcpy(p, &x, 1);
      break;
    }
    case ncclInt32: {
      int32_t x = static_cast<int32_t>(v);
      memcpy(p, &x, 4);
      break;
    }
    case ncclUint32: {
      uint32_t x = static_cast<uint32_t>(v);
      memcpy(p, &x, 4);
      break;
    }
    case ncclInt64: {
      int64_t x = static_cast<int64_t>(v);
      memcpy(p, &x, 8);
      break;
    }
    case ncclUint64: {
      uint64_t x = static_cast<uint64_t>(v);
      memcpy(p, &x, 8);
      break;
    }
    case ncclFloat16: {
      uint16_t x = cpu::floatToHalf(static_cast<float>(v));
      memcpy(p, &x, 2);
      break;
    }
    case ncclFloat32: {
      float x = static_cast<float>(v);
      memcpy(p, &x, 4);
      break;
    }
    case ncclFloat64:
      memcpy(p, &v, 8);
      break;
    case ncclBfloat16: {
      uint16_t x = cpu::floatToBf16(static_cast<float>(v));
      memcpy(p, &x, 2);
      break;
    }
    case ncclFloat8e4m3: {
      uint8_t x = cpu::floatToFp8E4M3(static_cast<float>(v));
      memcpy(p, &x, 1);
      break;
    }
    case ncclFloat8e5m2: {
      uint8_t x = cpu::floatToFp8E5M2(static_cast<float>(v));
      memcpy(p, &x, 1);
      break;
    }
    default:
      break;
  }
}

inline double loadValue(const void* p, ncclDataType_t dt) {
  switch (dt) {
    case ncclInt8: {
      int8_t x;
      memcpy(&x, p, 1);
      return x;
    }
    case ncclUint8: {
      uint8_t x;
      memcpy(&x, p, 1);
      return x;
    }
    case ncclInt32: {
      int32_t x;
      memcpy(&x, p, 4);
      return x;
    }
    case ncclUint32: {
      uint32_t x;
      memcpy(&x, p, 4);
      return x;
    }
    case ncclInt64: {
      int64_t x;
      memcpy(&x, p, 8);
      return static_cast<double>(x);
    }
    case ncclUint64: {
      uint64_t x;
      memcpy(&x, p, 8);
      return static_cast<double>(x);
    }
    case ncclFloat16: {
      uint16_t x;
      memcpy(&x, p, 2);
      return cpu::halfToFloat(x);
    }
    case ncclFloat32: {
      float x;
      memcpy(&x, p, 4);
      return x;
    }
    case ncclFloat64: {
      double x;
      memcpy(&x, p, 8);
      return x;
    }
    case ncclBfloat16: {
      uint16_t x;
      memcpy(&x, p, 2);
      return cpu::bf16ToFloat(x);
    }
    case ncclFloat8e4m3: {
      uint8_t x;
      memcpy(&x, p, 1);
      return cpu::fp8E4M3ToFloat(x);
    }
    case ncclFloat8e5m2: {
      uint8_t x;
      memcpy(&x, p, 1);
      return cpu::fp8E5M2ToFloat(x);
    }
    default:
      return 0;
  }
}

// The library's own tables (base/types.h), through NCCL's enum.
inline size_t typeSize(ncclDataType_t dt) { return dataTypeSize(static_cast<DataType>(dt)); }
inline bool isFloat(ncclDataType_t dt) { return isFloating(static_cast<DataType>(dt)); }
inline bool isUnsigned(ncclDataType_t dt) {
  return dt == ncclUint8 || dt == ncclUint32 || dt == ncclUint64;
}
inline bool isFp8(ncclDataType_t dt) { return dt == ncclFloat8e4m3 || dt == ncclFloat8e5m2; }

// Input of rank r at element i for a reduction `op`, chosen so that every
// partial result of any reduction order is exactly representable in `dt`
// (so results can be compared exactly even for fp8).
inline double inputValue(ncclDataType_t dt, ncclRedOp_t op, int r, size_t i) {
  uint64_t h = (static_cast<uint64_t>(r) * 2654435761u) ^ (i * 40503u + 17);
  h ^= h >> 13;
  if (op == ncclProd) {
    if ((i + r) % 7 == 0) return 2;
    if (!isUnsigned(dt) && (i * 3 + r) % 5 == 1) return -1;
    return 1;
  }
  if (op == ncclMax || op == ncclMin) {
    int range = isFp8(dt) ? 8 : 50;
    int v = static_cast<int>(h % (2 * range + 1)) - range;
    return isUnsigned(dt) ? std::abs(v) : v;
  }
  // sum, avg, premulsum
  if (isFp8(dt)) return (i + r) % 3 == 0 ? 1 : 0;
  if (isUnsigned(dt)) return static_cast<double>(h % 4);
  return static_cast<double>(h % 5) - 1;
}

}  // namespace tutti::test
