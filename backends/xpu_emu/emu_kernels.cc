// xpu_emu: kernel bodies. See emu_kernels.h for the arithmetic contract.
#include "emu_kernels.h"

#include <cmath>
#include <cstring>
#include <type_traits>

#include "emu_float.h"

namespace xpu_emu {
namespace {

// ---- element formats: storage type, accumulation type, load/store ---------------

template <class T>
struct NativeFmt {
  using Storage = T;
  using Acc = T;
  static Acc load(const char* p, size_t i) {
    T v;
    std::memcpy(&v, p + i * sizeof(T), sizeof(T));
    return v;
  }
  static void store(char* p, size_t i, Acc v) { std::memcpy(p + i * sizeof(T), &v, sizeof(T)); }
  static Acc round(Acc v) { return v; }  // already in the element type
};

template <class S, float (*kDecode)(S), S (*kEncode)(float)>
struct NarrowFmt {
  using Storage = S;
  using Acc = float;
  static Acc load(const char* p, size_t i) {
    S v;
    std::memcpy(&v, p + i * sizeof(S), sizeof(S));
    return kDecode(v);
  }
  static void store(char* p, size_t i, Acc v) {
    const S s = kEncode(v);
    std::memcpy(p + i * sizeof(S), &s, sizeof(S));
  }
  static Acc round(Acc v) { return kDecode(kEncode(v)); }  // to the element type and back
};

using HalfFmt = NarrowFmt<uint16_t, floatFromHalf, halfFromFloat>;
using Bf16Fmt = NarrowFmt<uint16_t, floatFromBf16, bf16FromFloat>;
using E4m3Fmt = NarrowFmt<uint8_t, floatFromE4m3, e4m3FromFloat>;
using E5m2Fmt = NarrowFmt<uint8_t, floatFromE5m2, e5m2FromFloat>;

// ---- arithmetic on the accumulation type -------------------------------------------

template <class V>
V add(V a, V b) {
  if constexpr (std::is_integral_v<V>) {
    using U = std::make_unsigned_t<V>;
    return static_cast<V>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
  } else {
    return a + b;
  }
}

template <class V>
V mul(V a, V b) {
  if constexpr (std::is_integral_v<V>) {
    // Widen to at least unsigned int so that 8-bit operands cannot overflow int.
    using U = std::common_type_t<std::make_unsigned_t<V>, unsigned>;
    return static_cast<V>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
  } else {
    return a * b;
  }
}

template <class V>
bool isNan(V v) {
  if constexpr (std::is_integral_v<V>) {
    return false;
  } else {
    return v != v;
  }
}

template <class V>
V maxOf(V a, V b) {
  if (isNan(a)) return a;
  return a > b ? a : b;  // b when b is NaN or the operands are equal
}

template <class V>
V minOf(V a, V b) {
  if (isNan(a)) return a;
  return a < b ? a : b;
}

// The PREMULSUM scalar element as a double (the reference reads it that way).
double scalarAsDouble(const unsigned char* p, int32_t datatype) {
  switch (datatype) {
    case ncclInt8:
      return NativeFmt<int8_t>::load(reinterpret_cast<const char*>(p), 0);
    case ncclUint8:
      return NativeFmt<uint8_t>::load(reinterpret_cast<const char*>(p), 0);
    case ncclInt32:
      return NativeFmt<int32_t>::load(reinterpret_cast<const char*>(p), 0);
    case ncclUint32:
      return NativeFmt<uint32_t>::load(reinterpret_cast<const char*>(p), 0);
    case ncclInt64:
      return static_cast<double>(NativeFmt<int64_t>::load(reinterpret_cast<const char*>(p), 0));
    case ncclUint64:
      return static_cast<double>(NativeFmt<uint64_t>::load(reinterpret_cast<const char*>(p), 0));
    case ncclFloat16:
      return HalfFmt::load(reinterpret_cast<const char*>(p), 0);
    case ncclFloat32:
      return NativeFmt<float>::load(reinterpret_cast<const char*>(p), 0);
    case ncclFloat64:
      return NativeFmt<double>::load(reinterpret_cast<const char*>(p), 0);
    case ncclBfloat16:
      return Bf16Fmt::load(reinterpret_cast<const char*>(p), 0);
    case ncclFloat8e4m3:
      return E4m3Fmt::load(reinterpret_cast<const char*>(p), 0);
    case ncclFloat8e5m2:
      return E5m2Fmt::load(reinterpret_cast<const char*>(p), 0);
    default:
      return 0.0;
  }
}

// A double scalar in the accumulation type V: floats convert; integers are
// truncated toward zero into int64 (saturating, NaN -> 0; uint64 keeps
// [2^63, 2^64) as is) and then wrapped to V.
template <class V>
V scalarTo(double s) {
  if constexpr (std::is_integral_v<V>) {
    constexpr double kTwo63 = 9223372036854775808.0;
    if (std::isnan(s)) return 0;
    if constexpr (std::is_same_v<V, uint64_t>) {
      if (s >= 2.0 * kTwo63) return UINT64_MAX;
      if (s >= kTwo63) return static_cast<uint64_t>(s);
    }
    int64_t wide;
    if (s >= kTwo63) {
      wide = INT64_MAX;
    } else if (s < -kTwo63) {
      wide = INT64_MIN;
    } else {
      wide = static_cast<int64_t>(s);
    }
    return static_cast<V>(wide);  // modular conversion (two's complement)
  } else {
    return static_cast<V>(s);
  }
}

template <class V>
V integerAverage(V sum, uint32_t divisor) {
  if constexpr (std::is_signed_v<V>) {
    return static_cast<V>(static_cast<int64_t>(sum) / static_cast<int64_t>(divisor));
  } else {
    return static_cast<V>(static_cast<uint64_t>(sum) / static_cast<uint64_t>(divisor));
  }
}

// ---- reduce ----------------------------------------------------------------------------

constexpr size_t kBlock = 256;

template <class F>
void reduceTyped(const ReduceJob& job) {
  using Acc = typename F::Acc;
  constexpr size_t kSize = sizeof(typename F::Storage);
  Acc scalar{};
  if (job.op == TUTTI_PLUGIN_OP_PREMULSUM) {
    unsigned char raw[8] = {};
    std::memcpy(raw, job.scalarAt ? job.scalarAt : job.scalar, kSize);
    scalar = scalarTo<Acc>(scalarAsDouble(raw, job.datatype));
  }
  Acc avgScale{};
  if constexpr (!std::is_integral_v<Acc>)
    avgScale = static_cast<Acc>(1.0 / static_cast<double>(job.avgDivisor));
  Acc acc[kBlock];
  for (uint64_t off = 0; off < job.count; off += kBlock) {
    const size_t m = static_cast<size_t>(job.count - off < kBlock ? job.count - off : kBlock);
    const size_t byteOff = static_cast<size_t>(off) * kSize;
    const char* first = job.srcs[0] + byteOff;
    // Every source block is read before the destination block is written, so
    // dst may be any of the sources.
    switch (job.op) {
      case TUTTI_PLUGIN_OP_SUM:
      case TUTTI_PLUGIN_OP_AVG:
        for (size_t j = 0; j < m; ++j) acc[j] = F::load(first, j);
        for (int k = 1; k < job.nSrcs; ++k) {
          const char* s = job.srcs[k] + byteOff;
          for (size_t j = 0; j < m; ++j) acc[j] = add(acc[j], F::load(s, j));
        }
        if (job.op == TUTTI_PLUGIN_OP_AVG) {
          if constexpr (std::is_integral_v<Acc>) {
            for (size_t j = 0; j < m; ++j) acc[j] = integerAverage(acc[j], job.avgDivisor);
          } else {
            for (size_t j = 0; j < m; ++j) acc[j] = F::round(acc[j]) * avgScale;
          }
        }
        break;
      case TUTTI_PLUGIN_OP_PROD:
        for (size_t j = 0; j < m; ++j) acc[j] = F::load(first, j);
        for (int k = 1; k < job.nSrcs; ++k) {
          const char* s = job.srcs[k] + byteOff;
          for (size_t j = 0; j < m; ++j) acc[j] = mul(acc[j], F::load(s, j));
        }
        break;
      case TUTTI_PLUGIN_OP_MAX:
        for (size_t j = 0; j < m; ++j) acc[j] = F::load(first, j);
        for (int k = 1; k < job.nSrcs; ++k) {
          const char* s = job.srcs[k] + byteOff;
          for (size_t j = 0; j < m; ++j) acc[j] = maxOf(acc[j], F::load(s, j));
        }
        break;
      case TUTTI_PLUGIN_OP_MIN:
        for (size_t j = 0; j < m; ++j) acc[j] = F::load(first, j);
        for (int k = 1; k < job.nSrcs; ++k) {
          const char* s = job.srcs[k] + byteOff;
          for (size_t j = 0; j < m; ++j) acc[j] = minOf(acc[j], F::load(s, j));
        }
        break;
      case TUTTI_PLUGIN_OP_PREMULSUM:
        for (size_t j = 0; j < m; ++j) acc[j] = F::round(mul(scalar, F::load(first, j)));
        for (int k = 1; k < job.nSrcs; ++k) {
          const char* s = job.srcs[k] + byteOff;
          for (size_t j = 0; j < m; ++j) acc[j] = F::round(add(acc[j], mul(scalar, F::load(s, j))));
        }
        break;
      default:
        return;  // rejected before enqueueing
    }
    char* d = job.dst + byteOff;
    for (size_t j = 0; j < m; ++j) F::store(d, j, acc[j]);
  }
}

}  // namespace

size_t dataTypeBytes(int32_t datatype) {
  switch (datatype) {
    case ncclInt8:
    case ncclUint8:
    case ncclFloat8e4m3:
    case ncclFloat8e5m2:
      return 1;
    case ncclFloat16:
    case ncclBfloat16:
      return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
      return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64:
      return 8;
    default:
      return 0;
  }
}

void runReduce(const ReduceJob& job) {
  switch (job.datatype) {
    case ncclInt8:
      return reduceTyped<NativeFmt<int8_t>>(job);
    case ncclUint8:
      return reduceTyped<NativeFmt<uint8_t>>(job);
    case ncclInt32:
      return reduceTyped<NativeFmt<int32_t>>(job);
    case ncclUint32:
      return reduceTyped<NativeFmt<uint32_t>>(job);
    case ncclInt64:
      return reduceTyped<NativeFmt<int64_t>>(job);
    case ncclUint64:
      return reduceTyped<NativeFmt<uint64_t>>(job);
    case ncclFloat16:
      return reduceTyped<HalfFmt>(job);
    case ncclFloat32:
      return reduceTyped<NativeFmt<float>>(job);
    case ncclFloat64:
      return reduceTyped<NativeFmt<double>>(job);
    case ncclBfloat16:
      return reduceTyped<Bf16Fmt>(job);
    case ncclFloat8e4m3:
      return reduceTyped<E4m3Fmt>(job);
    case ncclFloat8e5m2:
      return reduceTyped<E5m2Fmt>(job);
    default:
      return;
  }
}

// ---- castScaled ------------------------------------------------------------------------

bool castPairSupported(int32_t dstType, int32_t srcType) {
  if (srcType == ncclFloat32) return dstType == ncclFloat16 || dstType == ncclBfloat16;
  if (dstType == ncclFloat32) return srcType == ncclFloat16 || srcType == ncclBfloat16;
  return false;
}

void runCastScaled(void* dst, int32_t dstType, const void* src, int32_t srcType, uint64_t count,
                   float scale) {
  char* d = static_cast<char*>(dst);
  const char* s = static_cast<const char*>(src);
  if (srcType == ncclFloat32) {
    for (uint64_t i = 0; i < count; ++i) {
      const float v = NativeFmt<float>::load(s, i) * scale;
      if (dstType == ncclFloat16) {
        HalfFmt::store(d, i, v);
      } else {
        Bf16Fmt::store(d, i, v);
      }
    }
  } else {
    for (uint64_t i = 0; i < count; ++i) {
      const float v = srcType == ncclFloat16 ? HalfFmt::load(s, i) : Bf16Fmt::load(s, i);
      NativeFmt<float>::store(d, i, v * scale);
    }
  }
}

// ---- 1-bit codec -----------------------------------------------------------------------

namespace {

constexpr uint64_t kSignBlock = TUTTI_PLUGIN_SIGN_BLOCK;
constexpr uint64_t kSignBlockBytes = sizeof(float) + kSignBlock / 8;
static_assert(kSignBlock % 8 == 0, "a sign block holds whole bytes of bits");

// -scale through a volatile, so the compiler cannot turn c - (-scale) into
// c + scale (which differs in the sign of a NaN result).
float negatedScale(float scale) {
  volatile float neg = -scale;
  return neg;
}

}  // namespace

uint64_t signWireBytes(uint64_t count) {
  const uint64_t rest = count % kSignBlock;
  return count / kSignBlock * kSignBlockBytes + (rest ? sizeof(float) + (rest + 7) / 8 : 0);
}

void runPack1bit(const float* src, float* error, unsigned char* wire, uint64_t count) {
  float c[kSignBlock];
  for (uint64_t off = 0; off < count; off += kSignBlock) {
    const size_t len = static_cast<size_t>(count - off < kSignBlock ? count - off : kSignBlock);
    // c = src + error for the whole block first (src may be error), summing
    // |c| into eight partial sums by index modulo 8.
    double part[8] = {};
    for (size_t i = 0; i < len; ++i) {
      float v = src[off + i];
      if (error != nullptr) v = v + error[off + i];
      c[i] = v;
      part[i % 8] += static_cast<double>(std::fabs(v));
    }
    const double sum =
        ((part[0] + part[4]) + (part[2] + part[6])) + ((part[1] + part[5]) + (part[3] + part[7]));
    const double mean = sum / static_cast<double>(len);
    const float scale = std::isnan(mean) ? floatOf(0x7fc00000u) : static_cast<float>(mean);
    const float negScale = negatedScale(scale);
    unsigned char* block = wire + off / kSignBlock * kSignBlockBytes;
    std::memcpy(block, &scale, sizeof scale);
    unsigned char* bits = block + sizeof scale;
    for (size_t g = 0; g < len; g += 8) {
      unsigned byte = 0;
      for (size_t j = 0; j < 8 && g + j < len; ++j) {
        const size_t i = g + j;
        const bool negative = c[i] < 0.0f;
        byte |= static_cast<unsigned>(negative) << j;
        if (error != nullptr) error[off + i] = c[i] - (negative ? negScale : scale);
      }
      bits[g / 8] = static_cast<unsigned char>(byte);
    }
  }
}

void runUnpack1bit(float* dst, const unsigned char* wire, uint64_t count, bool accumulate) {
  for (uint64_t off = 0; off < count; off += kSignBlock) {
    const size_t len = static_cast<size_t>(count - off < kSignBlock ? count - off : kSignBlock);
    const unsigned char* block = wire + off / kSignBlock * kSignBlockBytes;
    float scale;
    std::memcpy(&scale, block, sizeof scale);
    const float negScale = negatedScale(scale);
    const unsigned char* bits = block + sizeof scale;
    for (size_t i = 0; i < len; ++i) {
      float d = (bits[i / 8] >> (i % 8)) & 1u ? negScale : scale;
      if (accumulate) d = d + dst[off + i];
      dst[off + i] = d;
    }
  }
}

// ---- dense algebra ------------------------------------------------------------------

void runGemm(bool transA, bool transB, int64_t m, int64_t n, int64_t k, float alpha, const float* A,
             int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double dot = 0.0;
      for (int64_t t = 0; t < k; ++t) {
        const float a = transA ? A[t * lda + i] : A[i * lda + t];
        const float b = transB ? B[j * ldb + t] : B[t * ldb + j];
        dot += static_cast<double>(a) * static_cast<double>(b);  // exact product
      }
      float r = alpha * static_cast<float>(dot);
      if (beta != 0.0f) r = r + beta * C[i * ldc + j];
      C[i * ldc + j] = r;
    }
  }
}

void runOrthogonalize(float* M, int64_t rows, int64_t cols, int64_t ld, float eps) {
  for (int64_t c = 0; c < cols; ++c) {
    for (int pass = 0; pass < 2; ++pass) {
      for (int64_t p = 0; p < c; ++p) {
        double dot = 0.0;
        for (int64_t i = 0; i < rows; ++i)
          dot += static_cast<double>(M[i * ld + p]) * static_cast<double>(M[i * ld + c]);
        for (int64_t i = 0; i < rows; ++i)
          M[i * ld + c] = static_cast<float>(static_cast<double>(M[i * ld + c]) -
                                             dot * static_cast<double>(M[i * ld + p]));
      }
    }
    double sumSq = 0.0;
    for (int64_t i = 0; i < rows; ++i) {
      const double v = M[i * ld + c];
      sumSq += v * v;
    }
    const double divisor = std::sqrt(sumSq) + static_cast<double>(eps);
    if (divisor != 0.0)
      for (int64_t i = 0; i < rows; ++i)
        M[i * ld + c] = static_cast<float>(static_cast<double>(M[i * ld + c]) / divisor);
  }
}

}  // namespace xpu_emu
