// How each kernel call of the Level Zero plugin becomes launches of the
// kernels in backends/ze/kernels.cl: kernel name, argument values in order,
// group size and group count. Shared by the plugin (which sets the arguments
// with zeKernelSetArgumentValue) and by tests/device/ze_spirv_pocl_test.cc
// (which runs the same SPIR-V under OpenCL with clSetKernelArg), so the test
// exercises the plugin's own argument marshalling.
//
// Contract: pure functions on host values, no device access, thread-safe.
// Each plan* validates its arguments like the ABI asks and returns
// ncclSuccess with a plan (nLaunches == 0: nothing to do), or
// ncclInvalidArgument with a reason in `why` (tutti then uses its host
// fallback). Pointer arguments are recorded as addresses (KernelArg::pointer);
// an absent optional pointer is replaced by another pointer of the same call
// and ignored by the kernel. Pointers must be aligned to their element size.
// `fp64` says whether the device module has fp64 (the kernels needing it:
// float64 reduce, pack1bit, gemm); without it those plans fail with
// ncclInvalidArgument. Needs only the public plugin header.
#pragma once

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "tutti/backend_plugin.h"

namespace tutti_ze {

// ncclDataType_t values.
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
enum Op : int { kSum = 0, kProd = 1, kMax = 2, kMin = 3, kAvg = 4, kPreMulSum = 5, kNumOps = 6 };

// Sources one reduce launch takes (kernel arguments s0..s7). More sources give
// ncclInvalidArgument: chaining launches would round narrow types twice.
constexpr int kMaxReduceSrcs = 8;
constexpr int kMaxArgs = 20;
constexpr uint32_t kGroup1d = 256;      // work-items per group, 1-D kernels
constexpr uint32_t kGroupPack = 64;     // tutti_pack1bit_scale (one item per 512 elements)
constexpr uint32_t kGroupGemm = 8;      // 8 x 8 groups for tutti_gemm
constexpr uint32_t kMaxGroups = 65535;  // per dimension; kernels are grid-stride loops
constexpr uint64_t kSignBlock = TUTTI_PLUGIN_SIGN_BLOCK;
constexpr uint64_t kSignBlockBytes = 4 + kSignBlock / 8;

struct KernelArg {
  uint32_t size;   // bytes of the value (pointers: sizeof(void*))
  bool pointer;    // value is a device address
  uint64_t value;  // little-endian bits of the value, in the low `size` bytes
};

struct Launch {
  const char* kernel;  // name in kernels.cl
  int dims;            // 1 or 2
  uint32_t groupSize[2];
  uint32_t groupCount[2];
  int nArgs;
  KernelArg args[kMaxArgs];
};

// Launches run in order on one queue (the plugin appends a barrier between them).
struct Plan {
  int nLaunches = 0;
  Launch launches[2];
};

// Every kernel name any plan may use, for creating the kernels up front.
// *fp64Only says the kernel exists only in the fp64 module.
constexpr int kNumKernels = 20;
inline const char* kernelName(int i, bool* fp64Only) {
  static const char* const kNames[kNumKernels] = {
      "tutti_reduce_i8",      "tutti_reduce_u8",     "tutti_reduce_i32",   "tutti_reduce_u32",
      "tutti_reduce_i64",     "tutti_reduce_u64",    "tutti_reduce_f16",   "tutti_reduce_f32",
      "tutti_reduce_f64",     "tutti_reduce_bf16",   "tutti_reduce_e4m3",  "tutti_reduce_e5m2",
      "tutti_cast_f32_f16",   "tutti_cast_f32_bf16", "tutti_cast_f16_f32", "tutti_cast_bf16_f32",
      "tutti_pack1bit_scale", "tutti_pack1bit_bits", "tutti_unpack1bit",   "tutti_gemm"};
  const char* n = kNames[i];
  if (fp64Only != nullptr)
    *fp64Only = strcmp(n, "tutti_reduce_f64") == 0 || strcmp(n, "tutti_pack1bit_scale") == 0 ||
                strcmp(n, "tutti_gemm") == 0;
  return n;
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

namespace plan_detail {

inline ncclResult_t invalid(char* why, size_t whyLen, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));
inline ncclResult_t invalid(char* why, size_t whyLen, const char* fmt, ...) {
  if (why != nullptr && whyLen > 0) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, whyLen, fmt, ap);
    va_end(ap);
  }
  return ncclInvalidArgument;
}

inline bool aligned(const void* p, int bytes) {
  return reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(bytes) == 0;
}

inline uint32_t groupsFor(uint64_t items, uint32_t group) {
  uint64_t g = (items + group - 1) / group;
  if (g == 0) g = 1;
  return static_cast<uint32_t>(g < kMaxGroups ? g : kMaxGroups);
}

class ArgWriter {
 public:
  explicit ArgWriter(Launch* l) : l_(l) { l_->nArgs = 0; }
  void ptr(const void* p) {
    add(sizeof(void*), true, static_cast<uint64_t>(reinterpret_cast<uintptr_t>(p)));
  }
  void i32(int32_t v) { add(4, false, static_cast<uint32_t>(v)); }
  void u64(uint64_t v) { add(8, false, v); }
  void i64(int64_t v) { add(8, false, static_cast<uint64_t>(v)); }
  void f32(float v) {
    uint32_t b;
    memcpy(&b, &v, sizeof b);
    add(4, false, b);
  }

 private:
  void add(uint32_t size, bool pointer, uint64_t value) {
    KernelArg& a = l_->args[l_->nArgs++];
    a.size = size;
    a.pointer = pointer;
    a.value = value;
  }
  Launch* l_;
};

inline void oneD(Launch* l, const char* kernel, uint64_t items, uint32_t group) {
  l->kernel = kernel;
  l->dims = 1;
  l->groupSize[0] = group;
  l->groupSize[1] = 1;
  l->groupCount[0] = groupsFor(items, group);
  l->groupCount[1] = 1;
}

// Exact minifloat -> fp32 (as kernels.cl's decodeNarrow).
inline float decodeNarrowHost(uint32_t v, int kExp, int kMan, bool kIeee) {
  const int kBias = (1 << (kExp - 1)) - 1;
  const uint32_t kManMask = (1u << kMan) - 1u;
  const uint32_t kExpAll = (1u << kExp) - 1u;
  const uint32_t sign = ((v >> (kExp + kMan)) & 1u) << 31;
  const uint32_t ex = (v >> kMan) & kExpAll;
  const uint32_t man = v & kManMask;
  uint32_t bits;
  if (ex == kExpAll && (kIeee || man == kManMask)) {
    bits = kIeee ? (sign | 0x7f800000u | (man << (23 - kMan))) : (sign | 0x7fc00000u);
  } else if (ex == 0) {
    bits = sign;
    if (man != 0) {
      int e = 1 - kBias - kMan;
      uint32_t m = man;
      while ((m & 0x800000u) == 0) {
        m <<= 1;
        --e;
      }
      bits = sign | (static_cast<uint32_t>(e + 23 + 127) << 23) | (m & 0x7fffffu);
    }
  } else {
    bits = sign | ((ex + 127u - static_cast<uint32_t>(kBias)) << 23) | (man << (23 - kMan));
  }
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

// A host-resident PREMULSUM scalar converted once as the reference does, as
// the bits of the kernel's compute type (the scalarBits argument): integers
// truncated through double to int64 (saturating, NaN -> 0) and wrapped; fp32
// and fp64 as they are; the narrow formats decoded to fp32. (A device-resident
// scalar is converted by the kernel itself, with the same results.)
inline uint64_t hostScalarBits(int dt, const void* p) {
  constexpr double kTwo63 = 9223372036854775808.0;
  uint64_t raw = 0;
  memcpy(&raw, p, static_cast<size_t>(dtypeSize(dt)));  // little-endian: low bytes
  auto f32Bits = [](float f) {
    uint32_t b;
    memcpy(&b, &f, sizeof b);
    return static_cast<uint64_t>(b);
  };
  switch (dt) {
    case kInt8:
    case kUint8:
    case kInt32:
    case kUint32:
    case kFloat32:
    case kFloat64:
      return raw;  // the conversion through double is exact for these
    case kInt64: {
      const double s = static_cast<double>(static_cast<int64_t>(raw));
      if (s >= kTwo63) return static_cast<uint64_t>(INT64_MAX);
      return static_cast<uint64_t>(static_cast<int64_t>(s));  // s >= -2^63 always
    }
    case kUint64: {
      const double s = static_cast<double>(raw);
      if (s >= 2 * kTwo63) return ~static_cast<uint64_t>(0);
      return static_cast<uint64_t>(s);
    }
    case kFloat16:
      return f32Bits(decodeNarrowHost(static_cast<uint32_t>(raw), 5, 10, true));
    case kBfloat16:
      return static_cast<uint64_t>(static_cast<uint32_t>(raw) << 16);
    case kFp8E4M3:
      return f32Bits(decodeNarrowHost(static_cast<uint32_t>(raw), 4, 3, false));
    case kFp8E5M2:
      return f32Bits(decodeNarrowHost(static_cast<uint32_t>(raw), 5, 2, true));
  }
  return 0;
}

}  // namespace plan_detail

inline ncclResult_t planReduce(const tuttiPluginReduceArgs_v1* a, bool fp64, Plan* plan, char* why,
                               size_t whyLen) {
  using plan_detail::invalid;
  plan->nLaunches = 0;
  if (a == nullptr) return invalid(why, whyLen, "reduce: args is NULL");
  if (a->structSize < offsetof(tuttiPluginReduceArgs_v1, avgDivisor) + sizeof(a->avgDivisor))
    return invalid(why, whyLen, "reduce: args structSize %u too small", a->structSize);
  if (a->datatype < kInt8 || a->datatype >= kNumDTypes)
    return invalid(why, whyLen, "reduce: unknown datatype %d", a->datatype);
  if (a->op < kSum || a->op >= kNumOps)
    return invalid(why, whyLen, "reduce: unknown operator %d", a->op);
  if (a->nSrcs < 1 || a->srcs == nullptr)
    return invalid(why, whyLen, "reduce: needs at least one source");
  if (a->nSrcs > kMaxReduceSrcs)
    return invalid(why, whyLen, "reduce: %d sources, the Level Zero kernel takes at most %d",
                   a->nSrcs, kMaxReduceSrcs);
  if (a->op == kPreMulSum && a->scalar == nullptr)
    return invalid(why, whyLen, "reduce: PREMULSUM without a scalar");
  if (a->op == kAvg && a->avgDivisor < 1) return invalid(why, whyLen, "reduce: AVG with divisor 0");
  if (a->datatype == kFloat64 && !fp64)
    return invalid(why, whyLen, "reduce: float64 needs a device with fp64");
  if (a->count == 0) return ncclSuccess;
  const int es = dtypeSize(a->datatype);
  if (!plan_detail::aligned(a->dst, es))
    return invalid(why, whyLen, "reduce: dst %p not aligned to %d bytes", a->dst, es);
  for (int k = 0; k < a->nSrcs; ++k) {
    if (a->srcs[k] == nullptr || !plan_detail::aligned(a->srcs[k], es))
      return invalid(why, whyLen, "reduce: source %d (%p) NULL or not aligned to %d bytes", k,
                     a->srcs[k], es);
  }
  const bool devScalar = a->op == kPreMulSum && a->scalarResidence == ncclScalarDevice;
  if (devScalar && !plan_detail::aligned(a->scalar, es))
    return invalid(why, whyLen, "reduce: device scalar %p not aligned", a->scalar);
  static const char* const kNames[kNumDTypes] = {
      "tutti_reduce_i8",  "tutti_reduce_u8",   "tutti_reduce_i32",  "tutti_reduce_u32",
      "tutti_reduce_i64", "tutti_reduce_u64",  "tutti_reduce_f16",  "tutti_reduce_f32",
      "tutti_reduce_f64", "tutti_reduce_bf16", "tutti_reduce_e4m3", "tutti_reduce_e5m2"};
  const uint64_t scalarBits =
      a->op == kPreMulSum && !devScalar ? plan_detail::hostScalarBits(a->datatype, a->scalar) : 0;
  const uint64_t divisor = a->avgDivisor < 1 ? 1 : a->avgDivisor;
  const double invD = 1.0 / static_cast<double>(divisor);
  const float invF = static_cast<float>(invD);
  uint64_t invDBits;
  memcpy(&invDBits, &invD, sizeof invDBits);

  Launch& l = plan->launches[0];
  plan_detail::oneD(&l, kNames[a->datatype], a->count, kGroup1d);
  plan_detail::ArgWriter w(&l);
  w.ptr(a->dst);
  for (int k = 0; k < kMaxReduceSrcs; ++k) w.ptr(a->srcs[k < a->nSrcs ? k : 0]);
  w.i32(a->nSrcs);
  w.i32(a->op);
  w.u64(a->count);
  w.u64(scalarBits);
  w.ptr(devScalar ? a->scalar : a->dst);
  w.i32(devScalar ? 1 : 0);
  w.u64(divisor);
  w.f32(invF);
  w.u64(invDBits);
  plan->nLaunches = 1;
  return ncclSuccess;
}

inline ncclResult_t planCastScaled(void* dst, int32_t dstType, const void* src, int32_t srcType,
                                   uint64_t count, float scale, Plan* plan, char* why,
                                   size_t whyLen) {
  using plan_detail::invalid;
  plan->nLaunches = 0;
  const char* kernel = nullptr;
  if (srcType == kFloat32 && dstType == kFloat16) kernel = "tutti_cast_f32_f16";
  if (srcType == kFloat32 && dstType == kBfloat16) kernel = "tutti_cast_f32_bf16";
  if (srcType == kFloat16 && dstType == kFloat32) kernel = "tutti_cast_f16_f32";
  if (srcType == kBfloat16 && dstType == kFloat32) kernel = "tutti_cast_bf16_f32";
  if (kernel == nullptr)
    return invalid(why, whyLen, "castScaled: unsupported type pair %d -> %d", srcType, dstType);
  if (count == 0) return ncclSuccess;
  if (dst == nullptr || src == nullptr || !plan_detail::aligned(dst, dtypeSize(dstType)) ||
      !plan_detail::aligned(src, dtypeSize(srcType)))
    return invalid(why, whyLen, "castScaled: NULL or misaligned pointer");
  Launch& l = plan->launches[0];
  plan_detail::oneD(&l, kernel, count, kGroup1d);
  plan_detail::ArgWriter w(&l);
  w.ptr(dst);
  w.ptr(src);
  w.u64(count);
  w.f32(scale);
  plan->nLaunches = 1;
  return ncclSuccess;
}

inline ncclResult_t planPack1bit(const float* src, float* error, void* wire, uint64_t count,
                                 bool fp64, Plan* plan, char* why, size_t whyLen) {
  using plan_detail::invalid;
  plan->nLaunches = 0;
  if (!fp64) return invalid(why, whyLen, "pack1bit: the block sums need a device with fp64");
  if (count == 0) return ncclSuccess;
  if (src == nullptr || wire == nullptr || !plan_detail::aligned(src, 4) ||
      !plan_detail::aligned(error, 4))
    return invalid(why, whyLen, "pack1bit: NULL or misaligned pointer");
  const bool hasErr = error != nullptr;
  const uint64_t nBlocks = (count + kSignBlock - 1) / kSignBlock;
  for (int s = 0; s < 2; ++s) {
    Launch& l = plan->launches[s];
    if (s == 0) {
      plan_detail::oneD(&l, "tutti_pack1bit_scale", nBlocks, kGroupPack);
    } else {
      plan_detail::oneD(&l, "tutti_pack1bit_bits", (count + 7) / 8, kGroup1d);
    }
    plan_detail::ArgWriter w(&l);
    w.ptr(src);
    w.ptr(hasErr ? error : src);
    w.i32(hasErr ? 1 : 0);
    w.ptr(wire);
    w.u64(count);
  }
  plan->nLaunches = 2;
  return ncclSuccess;
}

inline ncclResult_t planUnpack1bit(float* dst, const void* wire, uint64_t count, int32_t accumulate,
                                   Plan* plan, char* why, size_t whyLen) {
  using plan_detail::invalid;
  plan->nLaunches = 0;
  if (count == 0) return ncclSuccess;
  if (dst == nullptr || wire == nullptr || !plan_detail::aligned(dst, 4))
    return invalid(why, whyLen, "unpack1bit: NULL or misaligned pointer");
  Launch& l = plan->launches[0];
  plan_detail::oneD(&l, "tutti_unpack1bit", count, kGroup1d);
  plan_detail::ArgWriter w(&l);
  w.ptr(dst);
  w.ptr(wire);
  w.u64(count);
  w.i32(accumulate != 0 ? 1 : 0);
  plan->nLaunches = 1;
  return ncclSuccess;
}

inline ncclResult_t planGemm(int32_t transA, int32_t transB, int64_t m, int64_t n, int64_t k,
                             float alpha, const float* A, int64_t lda, const float* B, int64_t ldb,
                             float beta, float* C, int64_t ldc, bool fp64, Plan* plan, char* why,
                             size_t whyLen) {
  using plan_detail::invalid;
  plan->nLaunches = 0;
  if (m < 0 || n < 0 || k < 0) return invalid(why, whyLen, "gemm: negative dimension");
  if (!fp64) return invalid(why, whyLen, "gemm: accumulation in double needs a device with fp64");
  if (m == 0 || n == 0) return ncclSuccess;
  if (C == nullptr || (k > 0 && (A == nullptr || B == nullptr)) || !plan_detail::aligned(A, 4) ||
      !plan_detail::aligned(B, 4) || !plan_detail::aligned(C, 4))
    return invalid(why, whyLen, "gemm: NULL or misaligned pointer");
  Launch& l = plan->launches[0];
  l.kernel = "tutti_gemm";
  l.dims = 2;
  l.groupSize[0] = kGroupGemm;
  l.groupSize[1] = kGroupGemm;
  l.groupCount[0] = plan_detail::groupsFor(static_cast<uint64_t>(n), kGroupGemm);
  l.groupCount[1] = plan_detail::groupsFor(static_cast<uint64_t>(m), kGroupGemm);
  plan_detail::ArgWriter w(&l);
  w.i32(transA != 0 ? 1 : 0);
  w.i32(transB != 0 ? 1 : 0);
  w.i64(m);
  w.i64(n);
  w.i64(k);
  w.f32(alpha);
  w.ptr(A != nullptr ? A : C);
  w.i64(lda);
  w.ptr(B != nullptr ? B : C);
  w.i64(ldb);
  w.f32(beta);
  w.ptr(C);
  w.i64(ldc);
  plan->nLaunches = 1;
  return ncclSuccess;
}

}  // namespace tutti_ze
