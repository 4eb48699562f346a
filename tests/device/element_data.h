// Test data and comparisons over raw elements of every NCCL datatype, shared by
// the device tests that check a backend's kernels against the CPU reference
// (conformance_test, cuda_kernel_ops_test, ze_spirv_pocl_test). Datatypes are
// ncclDataType_t values (ncclInt8 .. ncclFloat8e5m2); buffers are bytes.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/float_formats.h"
#include "nccl.h"

namespace tutti::devtest {

inline uint32_t bitsOf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

inline const char* const kTypeNames[] = {"int8",    "uint8",    "int32",   "uint32",
                                         "int64",   "uint64",   "float16", "float32",
                                         "float64", "bfloat16", "fp8e4m3", "fp8e5m2"};
inline const char* const kOpNames[] = {"sum", "prod", "max", "min", "avg", "premulsum"};

inline int elemSize(int dt) {
  static const int kSizes[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
  return dt >= ncclInt8 && dt <= ncclFloat8e5m2 ? kSizes[dt] : 0;
}

// Whether the element at p of datatype dt is a NaN (integers never are).
inline bool isNanElem(int dt, const unsigned char* p) {
  switch (dt) {
    case ncclFloat16:
    case ncclBfloat16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return dt == ncclFloat16 ? (h & 0x7fff) > 0x7c00 : (h & 0x7fff) > 0x7f80;
    }
    case ncclFloat32: {
      float f;
      std::memcpy(&f, p, 4);
      return std::isnan(f);
    }
    case ncclFloat64: {
      double d;
      std::memcpy(&d, p, 8);
      return std::isnan(d);
    }
    case ncclFloat8e4m3:
      return (p[0] & 0x7f) == 0x7f;
    case ncclFloat8e5m2:
      return (p[0] & 0x7f) > 0x7c;
  }
  return false;
}

// Index of the first of `count` elements that differ (two NaNs match: their
// payloads are unspecified), or -1. A buffer shorter than count elements
// differs at 0.
inline int64_t firstMismatch(int dt, const std::vector<unsigned char>& a,
                             const std::vector<unsigned char>& b, uint64_t count) {
  const size_t es = static_cast<size_t>(elemSize(dt));
  if (a.size() < count * es || b.size() < count * es) return 0;
  for (uint64_t i = 0; i < count; ++i) {
    const unsigned char* x = &a[i * es];
    const unsigned char* y = &b[i * es];
    if (std::memcmp(x, y, es) == 0) continue;
    if (isNanElem(dt, x) && isNanElem(dt, y)) continue;
    return static_cast<int64_t>(i);
  }
  return -1;
}

// Element i as hex, most significant byte first.
inline std::string hexElem(int dt, const std::vector<unsigned char>& v, uint64_t i) {
  const int es = elemSize(dt);
  std::string s = "0x";
  static const char* kHex = "0123456789abcdef";
  for (int b = es - 1; b >= 0; --b) {
    s += kHex[v[i * es + b] >> 4];
    s += kHex[v[i * es + b] & 15];
  }
  return s;
}

// A pool of awkward values of a datatype, as raw elements: integer extremes;
// for floats +-0, +-inf, NaNs, the largest finite values, the smallest normal,
// subnormals, 1, -2.5 and a few ordinary ones.
inline std::vector<uint64_t> specials(int dt) {
  switch (dt) {
    case ncclInt8:
    case ncclUint8:
      return {0, 1, 2, 0x7f, 0x80, 0x81, 0xff, 0xfe, 3, 0x40};
    case ncclInt32:
    case ncclUint32:
      return {0, 1, 2, 0x7fffffff, 0x80000000u, 0x80000001u, 0xffffffffu, 0xfffffffeu, 0x10000, 3};
    case ncclInt64:
    case ncclUint64:
      return {0,
              1,
              2,
              0x7fffffffffffffffull,
              0x8000000000000000ull,
              0x8000000000000001ull,
              0xffffffffffffffffull,
              0xfffffffffffffffeull,
              1ull << 32,
              3};
    case ncclFloat16:
      return {0x0000, 0x8000, 0x7c00, 0xfc00, 0x7e00, 0xfd01, 0x7bff, 0xfbff,
              0x0400, 0x0001, 0x8001, 0x03ff, 0x3c00, 0xc100, 0x7800, 0x3555};
    case ncclBfloat16:
      return {0x0000, 0x8000, 0x7f80, 0xff80, 0x7fc0, 0xff81, 0x7f7f, 0xff7f,
              0x0080, 0x0001, 0x8001, 0x007f, 0x3f80, 0xc020, 0x7f00, 0x3eab};
    case ncclFloat32:
      return {0x00000000, 0x80000000, 0x7f800000, 0xff800000, 0x7fc00000, 0xffc00001,
              0x7f7fffff, 0xff7fffff, 0x00800000, 0x00000001, 0x80000001, 0x007fffff,
              0x3f800000, 0xc0200000, 0x7f000000, 0x3eaaaaab};
    case ncclFloat64:
      return {0x0000000000000000ull, 0x8000000000000000ull, 0x7ff0000000000000ull,
              0xfff0000000000000ull, 0x7ff8000000000000ull, 0x7fefffffffffffffull,
              0x0000000000000001ull, 0x8000000000000001ull, 0x3ff0000000000000ull,
              0xc004000000000000ull, 0x7fe0000000000000ull, 0x3fd5555555555555ull};
    case ncclFloat8e4m3:
      return {0x00, 0x80, 0x7f, 0xff, 0x7e, 0xfe, 0x08, 0x01, 0x81, 0x07, 0x38, 0xc2, 0x70, 0x35};
    case ncclFloat8e5m2:
      return {0x00, 0x80, 0x7c, 0xfc, 0x7e, 0xfd, 0x7b, 0xfb,
              0x04, 0x01, 0x81, 0x03, 0x3c, 0xc1, 0x78, 0x35};
  }
  return {};
}

// count elements: mostly ordinary values (small magnitudes, so sums and
// products stay finite often enough to be interesting), one in eight a
// special, one in eight any bit pattern.
inline std::vector<unsigned char> makeData(int dt, uint64_t count, std::mt19937_64& rng) {
  const int es = elemSize(dt);
  std::vector<unsigned char> out(count * es);
  const std::vector<uint64_t> sp = specials(dt);
  std::uniform_real_distribution<double> d(-8.0, 8.0);
  for (uint64_t i = 0; i < count; ++i) {
    uint64_t v;
    const unsigned pick = rng() % 8;
    if (pick == 0) {
      v = sp[rng() % sp.size()];
    } else if (pick == 1) {
      v = rng();
    } else {
      const double x = d(rng);
      switch (dt) {
        case ncclFloat16:
          v = cpu::floatToHalf(static_cast<float>(x));
          break;
        case ncclBfloat16:
          v = cpu::floatToBf16(static_cast<float>(x));
          break;
        case ncclFloat8e4m3:
          v = cpu::floatToFp8E4M3(static_cast<float>(x));
          break;
        case ncclFloat8e5m2:
          v = cpu::floatToFp8E5M2(static_cast<float>(x));
          break;
        case ncclFloat32:
          v = bitsOf(static_cast<float>(x));
          break;
        case ncclFloat64:
          std::memcpy(&v, &x, 8);
          break;
        default:
          v = static_cast<uint64_t>(static_cast<int64_t>(x * 16));  // small signed integers
      }
    }
    std::memcpy(&out[i * es], &v, es);  // little-endian: the low bytes
  }
  return out;
}

}  // namespace tutti::devtest
