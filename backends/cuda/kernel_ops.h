// Per-element arithmetic of the CUDA backend plugin's kernels, shared by the
// device code (nvcc: every function is __host__ __device__) and by host code
// compiled with g++ (plain inline C++, no CUDA header needed), so the device
// kernels and their host-side check compute the same bits from the same code.
//
// Contract: the semantics are those of include/tutti/backend_plugin.h, which
// names tutti's CPU reference (backends/cpu) as the definition; this file
// reimplements it (it includes nothing of tutti) and tests/device/
// cuda_kernel_ops_test.cc checks it against that reference bit for bit.
// - Narrow floats (binary16, bfloat16, OCP FP8 E4M3fn / E5M2): decoding is
//   exact; encoding rounds to nearest even with gradual underflow; overflow
//   gives +-inf except E4M3, which saturates to +-448 (inf too); NaN stays NaN
//   (binary16/bfloat16/E5M2 keep the leading payload bits, a payload that would
//   vanish becomes the quiet NaN; E4M3 has one NaN per sign, 0x7f / 0xff).
// - Every float operation is one IEEE operation rounded to nearest even: no
//   fused multiply-add (device code calls __fadd_rn & co., which nvcc never
//   contracts; host code must be compiled with -ffp-contract=off). Denormals
//   are not flushed (do not build with --use_fast_math / -ftz=true).
// - Integers wrap (arithmetic on the unsigned type); max/min compare with the
//   element's signedness.
// - NaN payloads (and the sign of a NaN) that come out of arithmetic are
//   unspecified: GPUs produce the canonical NaN, x86 the operand's payload.
// Pure functions, no state: safe from any thread.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include <cstring>
#include <type_traits>

#if defined(__CUDACC__)
#define TUTTI_HD __host__ __device__ __forceinline__
#else
#define TUTTI_HD inline
#endif

namespace tutti_cuda {

// ncclDataType_t values (include/nccl.h), repeated so this header needs nothing.
enum DType : int {
  kInt8 = 0,
  kUint8 = 1,
  kInt32 = 2,
  kUint32 = 3,
  kInt64 = 4,
  kUint64 = 5,
  kFloat16 = 6,
  kFloat32 = 7,
  kFloat64 = 8,
  kBfloat16 = 9,
  kFp8E4M3 = 10,
  kFp8E5M2 = 11,
  kNumDTypes = 12,
};
// TUTTI_PLUGIN_OP_* values.
enum Op : int { kSum = 0, kProd = 1, kMax = 2, kMin = 3, kAvg = 4, kPreMulSum = 5, kNumOps = 6 };

// ---- bit casts and single IEEE operations ------------------------------------------

TUTTI_HD uint32_t bitsOf(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}
TUTTI_HD float floatOf(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

TUTTI_HD float fadd(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
TUTTI_HD float fsub(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
TUTTI_HD float fmul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
TUTTI_HD double dadd(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}
TUTTI_HD double dmul(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}
TUTTI_HD double ddiv(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __ddiv_rn(a, b);
#else
  return a / b;
#endif
}
// |x| by clearing the sign bit (exact, NaN included).
TUTTI_HD float fabsBits(float x) { return floatOf(bitsOf(x) & 0x7fffffffu); }

// ---- narrow floating formats ------------------------------------------------------

// fp32 -> 1 / kExp / kMan minifloat, round to nearest even. kIeee: the all-ones
// exponent holds inf and NaN (binary16, E5M2); otherwise (E4M3fn) only the
// all-ones pattern is NaN and overflow saturates to the largest finite value.
template <int kExp, int kMan, bool kIeee>
TUTTI_HD uint32_t encodeNarrow(float f) {
  constexpr int kBias = (1 << (kExp - 1)) - 1;
  constexpr int kMinExp = 1 - kBias;  // exponent of the smallest normal
  constexpr int kDrop = 23 - kMan;    // mantissa bits dropped from a normal fp32
  constexpr uint32_t kManMask = (1u << kMan) - 1;
  constexpr uint32_t kInfBits = ((1u << kExp) - 1) << kMan;
  constexpr uint32_t kNanBits = kInfBits | kManMask;
  constexpr uint32_t kMaxBits = kIeee ? kInfBits - 1 : kNanBits - 1;
  const uint32_t x = bitsOf(f);
  const uint32_t sign = (x >> 31) << (kExp + kMan);
  const uint32_t mag = x & 0x7fffffffu;
  if (mag > 0x7f800000u) {  // NaN
    if (!kIeee) return sign | kNanBits;
    uint32_t payload = (mag >> kDrop) & kManMask;
    if (payload == 0) payload = 1u << (kMan - 1);
    return sign | kInfBits | payload;
  }
  if (mag == 0x7f800000u) return sign | (kIeee ? kInfBits : kMaxBits);
  const int e = static_cast<int>(mag >> 23) - 127;
  uint32_t r;
  if (e >= kMinExp) {
    const uint32_t low = mag & ((1u << kDrop) - 1);
    constexpr uint32_t kHalfUlp = 1u << (kDrop - 1);
    r = (static_cast<uint32_t>(e + kBias) << kMan) | ((mag & 0x7fffffu) >> kDrop);
    if (low > kHalfUlp || (low == kHalfUlp && (r & 1u))) ++r;  // may carry into the exponent
  } else {
    // A subnormal result: the unit is 2^(kMinExp - kMan); fp32 subnormal inputs
    // (e == -127) lie far below half of it for every format here.
    const int shift = kDrop + kMinExp - e;
    if (shift > 24) return sign;
    const uint32_t m = (mag & 0x7fffffu) | 0x800000u;
    r = m >> shift;
    const uint32_t low = m & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (low > half || (low == half && (r & 1u))) ++r;  // may become the smallest normal
  }
  if (r > kMaxBits) r = kIeee ? kInfBits : kMaxBits;
  return sign | r;
}

// Exact 1 / kExp / kMan minifloat -> fp32.
template <int kExp, int kMan, bool kIeee>
TUTTI_HD float decodeNarrow(uint32_t v) {
  constexpr int kBias = (1 << (kExp - 1)) - 1;
  constexpr uint32_t kManMask = (1u << kMan) - 1;
  constexpr uint32_t kExpAll = (1u << kExp) - 1;
  const uint32_t sign = ((v >> (kExp + kMan)) & 1u) << 31;
  const uint32_t ex = (v >> kMan) & kExpAll;
  const uint32_t man = v & kManMask;
  if (ex == kExpAll && (kIeee || man == kManMask)) {
    if (!kIeee) return floatOf(sign | 0x7fc00000u);
    return floatOf(sign | 0x7f800000u | (man << (23 - kMan)));
  }
  if (ex == 0) {
    if (man == 0) return floatOf(sign);
    // man * 2^(1 - bias - kMan): normalise the mantissa into an fp32 normal.
    int e = 1 - kBias - kMan;
    uint32_t m = man;
    while ((m & 0x800000u) == 0) {
      m <<= 1;
      --e;
    }
    return floatOf(sign | (static_cast<uint32_t>(e + 23 + 127) << 23) | (m & 0x7fffffu));
  }
  return floatOf(sign | ((ex + 127 - kBias) << 23) | (man << (23 - kMan)));
}

TUTTI_HD uint16_t floatToHalf(float f) {
  return static_cast<uint16_t>(encodeNarrow<5, 10, true>(f));
}
TUTTI_HD float halfToFloat(uint16_t h) { return decodeNarrow<5, 10, true>(h); }

// bfloat16 is the top half of an fp32: RNE on the low 16 bits (overflow carries
// into inf); NaN keeps its top payload bits, or becomes the quiet NaN.
TUTTI_HD uint16_t floatToBf16(float f) {
  const uint32_t x = bitsOf(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) {
    uint32_t r = x >> 16;
    if ((r & 0x7fu) == 0) r |= 0x40u;
    return static_cast<uint16_t>(r);
  }
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}
TUTTI_HD float bf16ToFloat(uint16_t b) { return floatOf(static_cast<uint32_t>(b) << 16); }

TUTTI_HD uint8_t floatToE4M3(float f) { return static_cast<uint8_t>(encodeNarrow<4, 3, false>(f)); }
TUTTI_HD float e4m3ToFloat(uint8_t v) { return decodeNarrow<4, 3, false>(v); }
TUTTI_HD uint8_t floatToE5M2(float f) { return static_cast<uint8_t>(encodeNarrow<5, 2, true>(f)); }
TUTTI_HD float e5m2ToFloat(uint8_t v) { return decodeNarrow<5, 2, true>(v); }

// ---- element types ------------------------------------------------------------------
// Elem<DT>: S is the storage type, C the type the arithmetic runs in; load/store
// convert between them (exact, or RNE for the narrow formats).

template <class T>
struct IdentityElem {
  using S = T;
  using C = T;
  static constexpr bool kNarrow = false;
  static TUTTI_HD C load(S s) { return s; }
  static TUTTI_HD S store(C c) { return c; }
};

template <int DT>
struct Elem;
template <>
struct Elem<kInt8> : IdentityElem<int8_t> {};
template <>
struct Elem<kUint8> : IdentityElem<uint8_t> {};
template <>
struct Elem<kInt32> : IdentityElem<int32_t> {};
template <>
struct Elem<kUint32> : IdentityElem<uint32_t> {};
template <>
struct Elem<kInt64> : IdentityElem<int64_t> {};
template <>
struct Elem<kUint64> : IdentityElem<uint64_t> {};
template <>
struct Elem<kFloat32> : IdentityElem<float> {};
template <>
struct Elem<kFloat64> : IdentityElem<double> {};
template <>
struct Elem<kFloat16> {
  using S = uint16_t;
  using C = float;
  static constexpr bool kNarrow = true;
  static TUTTI_HD C load(S s) { return halfToFloat(s); }
  static TUTTI_HD S store(C c) { return floatToHalf(c); }
};
template <>
struct Elem<kBfloat16> {
  using S = uint16_t;
  using C = float;
  static constexpr bool kNarrow = true;
  static TUTTI_HD C load(S s) { return bf16ToFloat(s); }
  static TUTTI_HD S store(C c) { return floatToBf16(c); }
};
template <>
struct Elem<kFp8E4M3> {
  using S = uint8_t;
  using C = float;
  static constexpr bool kNarrow = true;
  static TUTTI_HD C load(S s) { return e4m3ToFloat(s); }
  static TUTTI_HD S store(C c) { return floatToE4M3(c); }
};
template <>
struct Elem<kFp8E5M2> {
  using S = uint8_t;
  using C = float;
  static constexpr bool kNarrow = true;
  static TUTTI_HD C load(S s) { return e5m2ToFloat(s); }
  static TUTTI_HD S store(C c) { return floatToE5M2(c); }
};

// ---- arithmetic on the compute types -----------------------------------------------

template <class T>
TUTTI_HD T add(T a, T b) {
  if constexpr (std::is_integral<T>::value) {
    using U = typename std::make_unsigned<T>::type;
    return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
  } else if constexpr (std::is_same<T, float>::value) {
    return fadd(a, b);
  } else {
    return dadd(a, b);
  }
}
template <class T>
TUTTI_HD T mul(T a, T b) {
  if constexpr (std::is_integral<T>::value) {
    using U = typename std::make_unsigned<T>::type;
    // uint8 promotes to int: 255 * 255 cannot overflow it.
    return static_cast<T>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
  } else if constexpr (std::is_same<T, float>::value) {
    return fmul(a, b);
  } else {
    return dmul(a, b);
  }
}
// NaN if either operand is NaN, else (a > b ? a : b): on equal operands (+0 vs
// -0) the second one, b, is returned.
template <class T>
TUTTI_HD T maxOf(T a, T b) {
  T r = a > b ? a : b;  // b when b is NaN
  if constexpr (!std::is_integral<T>::value) r = (a != a) ? a : r;
  return r;
}
template <class T>
TUTTI_HD T minOf(T a, T b) {
  T r = a < b ? a : b;
  if constexpr (!std::is_integral<T>::value) r = (a != a) ? a : r;
  return r;
}

// ---- PREMULSUM scalar ------------------------------------------------------------------
// The scalar arrives as one element of the datatype. It is taken as a double
// (int64/uint64: rounded to nearest even, like a C++ conversion), then converted
// once: floats to float (double for float64); integers truncated toward zero to
// int64, saturating at its range, NaN -> 0 (uint64: values in [2^63, 2^64) are
// taken directly, >= 2^64 saturate), then wrapped to the element width.

template <int DT>
TUTTI_HD double scalarAsDouble(typename Elem<DT>::S s) {
  if constexpr (Elem<DT>::kNarrow) {
    return static_cast<double>(Elem<DT>::load(s));
  } else if constexpr (DT == kInt64) {
#if defined(__CUDA_ARCH__)
    return __ll2double_rn(s);
#else
    return static_cast<double>(s);
#endif
  } else if constexpr (DT == kUint64) {
#if defined(__CUDA_ARCH__)
    return __ull2double_rn(s);
#else
    return static_cast<double>(s);
#endif
  } else {
    return static_cast<double>(s);  // exact
  }
}

template <int DT>
TUTTI_HD typename Elem<DT>::C scalarFromDouble(double s) {
  using C = typename Elem<DT>::C;
  if constexpr (std::is_integral<C>::value) {
    constexpr double kTwo63 = 9223372036854775808.0;
    if (s != s) return 0;
    if constexpr (DT == kUint64) {
      if (s >= 2 * kTwo63) return ~static_cast<uint64_t>(0);
      if (s >= kTwo63) return static_cast<uint64_t>(s);
    }
    int64_t v;
    if (s >= kTwo63) {
      v = INT64_MAX;
    } else if (s < -kTwo63) {
      v = INT64_MIN;
    } else {
      v = static_cast<int64_t>(s);  // truncation toward zero
    }
    return static_cast<C>(v);  // wraps to the width (two's complement)
  } else {
    return static_cast<C>(s);  // double -> float rounds to nearest even
  }
}

template <int DT>
TUTTI_HD typename Elem<DT>::C scalarOf(typename Elem<DT>::S s) {
  return scalarFromDouble<DT>(scalarAsDouble<DT>(s));
}

// ---- reduce ------------------------------------------------------------------

// Sources one reduce() takes on the device (their pointers travel by value in
// the kernel parameters); more give ncclInvalidArgument (host fallback).
constexpr int kMaxReduceSrcs = 64;

// What AVG needs besides the sum, prepared on the host: the divisor for
// integers, 1/divisor for floats (as a float, and as a double for float64).
struct AvgParams {
  uint64_t divisor;  // >= 1
  float invF;        // (float)(1.0 / divisor)
  double invD;       // 1.0 / divisor
};
TUTTI_HD AvgParams makeAvgParams(uint32_t divisor) {
  AvgParams a;
  a.divisor = divisor < 1 ? 1 : divisor;
  a.invD = 1.0 / static_cast<double>(a.divisor);
  a.invF = static_cast<float>(a.invD);
  return a;
}

// Element i of reduce() is
//   acc = first(x_0); acc = next(acc, x_k) for k = 1..n-1; result = finish(acc)
// SUM/PROD/MAX/MIN/AVG accumulate in C (fp32 for narrow formats, rounded once in
// finish); PREMULSUM rounds every step to the element type; AVG: integers divide
// the wrapped sum (truncating), floats round the sum to the element type and
// multiply it by 1/divisor (then round again).
template <int DT, int OP>
struct Reducer {
  using E = Elem<DT>;
  using S = typename E::S;
  using C = typename E::C;
  C scalar;  // PREMULSUM only
  AvgParams avg;

  TUTTI_HD C first(S x) const {
    if constexpr (OP == kPreMulSum) return E::load(E::store(mul(scalar, E::load(x))));
    return E::load(x);
  }
  TUTTI_HD C next(C acc, S xs) const {
    const C x = E::load(xs);
    if constexpr (OP == kSum || OP == kAvg) return add(acc, x);
    if constexpr (OP == kProd) return mul(acc, x);
    if constexpr (OP == kMax) return maxOf(acc, x);
    if constexpr (OP == kMin) return minOf(acc, x);
    if constexpr (OP == kPreMulSum) return E::load(E::store(add(acc, mul(scalar, x))));
    return acc;
  }
  TUTTI_HD S finish(C acc) const {
    if constexpr (OP == kAvg) {
      if constexpr (std::is_integral<C>::value) {
        if constexpr (std::is_signed<C>::value) {
          return static_cast<S>(static_cast<int64_t>(acc) / static_cast<int64_t>(avg.divisor));
        } else {
          return static_cast<S>(static_cast<uint64_t>(acc) / avg.divisor);
        }
      } else if constexpr (std::is_same<C, double>::value) {
        return dmul(avg.invD, acc);
      } else {
        return E::store(fmul(avg.invF, E::load(E::store(acc))));
      }
    } else {
      return E::store(acc);
    }
  }
};

// ---- castScaled -----------------------------------------------------------------------
// fp32 -> narrow: narrow(src * scale); narrow -> fp32: float(src) * scale.

template <int DT>
TUTTI_HD typename Elem<DT>::S castToNarrow(float x, float scale) {
  return Elem<DT>::store(fmul(x, scale));
}
template <int DT>
TUTTI_HD float castFromNarrow(typename Elem<DT>::S x, float scale) {
  return fmul(Elem<DT>::load(x), scale);
}

// ---- 1-bit codec (tutti's kSign wire format) ---------------------------------------------
// Blocks of kSignBlock elements: [fp32 scale, little-endian][ceil(len/8) bytes of
// bits, LSB first, 1 when c < 0]. scale = mean |c| over the block: |c[i]| summed
// in double into p[i % 8] in increasing i, combined as
// ((p0 + p4) + (p2 + p6)) + ((p1 + p5) + (p3 + p7)), divided by len in double,
// rounded once to float; a NaN mean stores 0x7fc00000.

constexpr uint32_t kSignBlock = 512;
constexpr uint32_t kSignBlockBytes = 4 + kSignBlock / 8;

TUTTI_HD uint64_t signWireBytes(uint64_t count) {
  const uint64_t rest = count % kSignBlock;
  return count / kSignBlock * kSignBlockBytes + (rest != 0 ? 4 + (rest + 7) / 8 : 0);
}
TUTTI_HD double signCombine(const double p[8]) {
  return dadd(dadd(dadd(p[0], p[4]), dadd(p[2], p[6])), dadd(dadd(p[1], p[5]), dadd(p[3], p[7])));
}
TUTTI_HD float signScale(double sum, uint32_t len) {
  const double mean = ddiv(sum, static_cast<double>(len));
  if (mean != mean) return floatOf(0x7fc00000u);
  return static_cast<float>(mean);
}
// c = src + err (err may be absent).
TUTTI_HD float signInput(float src, const float* err, uint64_t i) {
  return err != nullptr ? fadd(src, err[i]) : src;
}
// The decoded value of a bit.
TUTTI_HD float signValue(bool neg, float scale) { return neg ? -scale : scale; }

// ---- gemm --------------------------------------------------------------------------------
// C[i][j] = alpha * float(acc) (+ beta * C[i][j] when beta != 0), where
// acc = sum over t = 0..k-1 of double(opA[i][t]) * double(opB[t][j]), added in
// double in increasing t from +0 (each product is exact in double). One fp32
// multiply for alpha, then one fp32 multiply and one add for beta.

TUTTI_HD double gemmStep(double acc, float a, float b) {
  return dadd(acc, dmul(static_cast<double>(a), static_cast<double>(b)));
}
TUTTI_HD float gemmFinish(double acc, float alpha, float beta, float cOld) {
  const float prod = fmul(alpha, static_cast<float>(acc));
  return beta == 0.0f ? prod : fadd(prod, fmul(beta, cOld));
}

// ---- host-side reference loops (what the device kernels compute) -------------------------
#if !defined(__CUDA_ARCH__)

template <int DT, int OP>
inline void hostReduceTyped(void* dst, const void* const* srcs, int n, uint64_t count,
                            const void* scalar, uint32_t avgDivisor) {
  using R = Reducer<DT, OP>;
  using S = typename R::S;
  R r{};
  if constexpr (OP == kPreMulSum) {
    S s;
    std::memcpy(&s, scalar, sizeof s);
    r.scalar = scalarOf<DT>(s);
  }
  r.avg = makeAvgParams(avgDivisor);
  for (uint64_t i = 0; i < count; ++i) {
    S x;
    std::memcpy(&x, static_cast<const char*>(srcs[0]) + i * sizeof(S), sizeof x);
    typename R::C acc = r.first(x);
    for (int k = 1; k < n; ++k) {
      std::memcpy(&x, static_cast<const char*>(srcs[k]) + i * sizeof(S), sizeof x);
      acc = r.next(acc, x);
    }
    const S out = r.finish(acc);
    std::memcpy(static_cast<char*>(dst) + i * sizeof(S), &out, sizeof out);
  }
}

template <int DT>
inline bool hostReduceOp(int op, void* dst, const void* const* srcs, int n, uint64_t count,
                         const void* scalar, uint32_t avgDivisor) {
  switch (op) {
    case kSum:
      return hostReduceTyped<DT, kSum>(dst, srcs, n, count, scalar, avgDivisor), true;
    case kProd:
      return hostReduceTyped<DT, kProd>(dst, srcs, n, count, scalar, avgDivisor), true;
    case kMax:
      return hostReduceTyped<DT, kMax>(dst, srcs, n, count, scalar, avgDivisor), true;
    case kMin:
      return hostReduceTyped<DT, kMin>(dst, srcs, n, count, scalar, avgDivisor), true;
    case kAvg:
      return hostReduceTyped<DT, kAvg>(dst, srcs, n, count, scalar, avgDivisor), true;
    case kPreMulSum:
      return hostReduceTyped<DT, kPreMulSum>(dst, srcs, n, count, scalar, avgDivisor), true;
  }
  return false;
}

// reduce() on host memory. dst may equal srcs[0] only (element i of every
// source is read before dst[i] is written, so dst == srcs[k] also works).
// Returns false for an unknown datatype or op.
inline bool hostReduce(int dt, int op, void* dst, const void* const* srcs, int n, uint64_t count,
                       const void* scalar, uint32_t avgDivisor) {
  if (n < 1 || (op == kPreMulSum && scalar == nullptr)) return false;
  switch (dt) {
    case kInt8:
      return hostReduceOp<kInt8>(op, dst, srcs, n, count, scalar, avgDivisor);
    case kUint8:
      return hostReduceOp<kUint8>(op, dst, srcs, n, count, scalar, avgDivisor);
    case kInt32:
      return hostReduceOp<kInt32>(op, dst, srcs, n, count, scalar, avgDivisor);
    case kUint32:
      return hostReduceOp<kUint32>(op, dst, srcs, n, count, scalar, avgDivisor);
    case kInt64:
      return hostReduceOp<kInt64>(op, dst, srcs, n, count, scalar, avgDivisor);
    case kUint64:
      return hostReduceOp<kUint64>(op, dst, srcs, n, count, scalar, avgDivisor);
    case kFloat16:
      return hostReduceOp<kFloat16>(op, dst, srcs, n, count, scalar, avgDivisor);
    case kFloat32:
      return hostReduceOp<kFloat32>(op, dst, srcs, n, count, scalar, avgDivisor);
    case kFloat64:
      return hostReduceOp<kFloat64>(op, dst, srcs, n, count, scalar, avgDivisor);
    case kBfloat16:
      return hostReduceOp<kBfloat16>(op, dst, srcs, n, count, scalar, avgDivisor);
    case kFp8E4M3:
      return hostReduceOp<kFp8E4M3>(op, dst, srcs, n, count, scalar, avgDivisor);
    case kFp8E5M2:
      return hostReduceOp<kFp8E5M2>(op, dst, srcs, n, count, scalar, avgDivisor);
  }
  return false;
}

inline int dtypeSize(int dt) {
  switch (dt) {
    case kInt8:
    case kUint8:
    case kFp8E4M3:
    case kFp8E5M2:
      return 1;
    case kFloat16:
    case kBfloat16:
      return 2;
    case kInt32:
    case kUint32:
    case kFloat32:
      return 4;
    case kInt64:
    case kUint64:
    case kFloat64:
      return 8;
  }
  return 0;
}

// castScaled() on host memory: the four pairs fp32 <-> fp16 / bf16. Returns
// false for any other pair.
inline bool hostCastScaled(void* dst, int dstType, const void* src, int srcType, uint64_t count,
                           float scale) {
  if (srcType == kFloat32 && (dstType == kFloat16 || dstType == kBfloat16)) {
    const float* s = static_cast<const float*>(src);
    uint16_t* d = static_cast<uint16_t*>(dst);
    for (uint64_t i = 0; i < count; ++i)
      d[i] = dstType == kFloat16 ? castToNarrow<kFloat16>(s[i], scale)
                                 : castToNarrow<kBfloat16>(s[i], scale);
    return true;
  }
  if (dstType == kFloat32 && (srcType == kFloat16 || srcType == kBfloat16)) {
    const uint16_t* s = static_cast<const uint16_t*>(src);
    float* d = static_cast<float*>(dst);
    for (uint64_t i = 0; i < count; ++i)
      d[i] = srcType == kFloat16 ? castFromNarrow<kFloat16>(s[i], scale)
                                 : castFromNarrow<kBfloat16>(s[i], scale);
    return true;
  }
  return false;
}

// pack1bit() on host memory (err may be null).
inline void hostPack1bit(const float* src, float* err, void* wire, uint64_t count) {
  unsigned char* w = static_cast<unsigned char*>(wire);
  for (uint64_t base = 0; base < count; base += kSignBlock) {
    const uint32_t len =
        static_cast<uint32_t>(count - base < kSignBlock ? count - base : kSignBlock);
    unsigned char* blk = w + base / kSignBlock * kSignBlockBytes;
    float c[kSignBlock];
    double p[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (uint32_t i = 0; i < len; ++i) {
      c[i] = signInput(src[base + i], err != nullptr ? err + base : nullptr, i);
      p[i & 7] = dadd(p[i & 7], static_cast<double>(fabsBits(c[i])));
    }
    const float scale = signScale(signCombine(p), len);
    const uint32_t sb = bitsOf(scale);
    for (int b = 0; b < 4; ++b) blk[b] = static_cast<unsigned char>(sb >> (8 * b));
    for (uint32_t g = 0; g < (len + 7) / 8; ++g) blk[4 + g] = 0;
    for (uint32_t i = 0; i < len; ++i) {
      const bool neg = c[i] < 0.0f;
      blk[4 + i / 8] = static_cast<unsigned char>(blk[4 + i / 8] | (neg ? 1u << (i % 8) : 0u));
      if (err != nullptr) err[base + i] = fsub(c[i], signValue(neg, scale));
    }
  }
}

// unpack1bit() on host memory.
inline void hostUnpack1bit(float* dst, const void* wire, uint64_t count, bool accumulate) {
  const unsigned char* w = static_cast<const unsigned char*>(wire);
  for (uint64_t i = 0; i < count; ++i) {
    const unsigned char* blk = w + i / kSignBlock * kSignBlockBytes;
    const uint32_t sb = static_cast<uint32_t>(blk[0]) | static_cast<uint32_t>(blk[1]) << 8 |
                        static_cast<uint32_t>(blk[2]) << 16 | static_cast<uint32_t>(blk[3]) << 24;
    const uint32_t j = static_cast<uint32_t>(i % kSignBlock);
    const float d = signValue((blk[4 + j / 8] >> (j % 8)) & 1u, floatOf(sb));
    dst[i] = accumulate ? fadd(dst[i], d) : d;
  }
}

// gemm() on host memory.
inline void hostGemm(bool transA, bool transB, int64_t m, int64_t n, int64_t k, float alpha,
                     const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
                     int64_t ldc) {
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0;
      for (int64_t t = 0; t < k; ++t)
        acc = gemmStep(acc, transA ? A[t * lda + i] : A[i * lda + t],
                       transB ? B[j * ldb + t] : B[t * ldb + j]);
      C[i * ldc + j] = gemmFinish(acc, alpha, beta, beta == 0.0f ? 0.0f : C[i * ldc + j]);
    }
  }
}

#endif  // !__CUDA_ARCH__

}  // namespace tutti_cuda
