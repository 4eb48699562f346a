// Device kernels of the Level Zero backend plugin, in OpenCL C 1.2. Compiled at
// build time to SPIR-V (clang-14 -target spir64, then llvm-spirv-14) twice:
// with -DTUTTI_ZE_FP64=1 for devices with fp64 (every kernel), and without for
// devices lacking it (no float64 reduce, no pack1bit scale kernel, no gemm:
// the plugin answers ncclInvalidArgument for those and tutti runs them on the
// host). Both SPIR-V modules are embedded in libtutti-backend-ze.so.
//
// Contract: the arithmetic of include/tutti/backend_plugin.h, whose definition
// is tutti's CPU reference (backends/cpu). This file reimplements it the way
// backends/cuda/kernel_ops.h does, in integer bit operations wherever a
// conversion is involved, so the result does not depend on the device's
// conversion instructions:
// - Narrow floats (binary16, bfloat16, OCP FP8 E4M3fn / E5M2) decode exactly
//   and encode with round to nearest even, gradual underflow, overflow to
//   +-inf (E4M3: saturate to +-448), NaN kept (payload top bits, or the quiet
//   NaN; E4M3: 0x7f / 0xff).
// - Every float operation is one IEEE operation rounded to nearest even: no
//   contraction (FP_CONTRACT OFF below, and -ffp-contract=off at compile time).
//   Denormals must not be flushed (the module is built without
//   -cl-denorms-are-zero; a device that flushes fp32 denormals would differ
//   from the reference on denormal inputs).
// - Integers wrap (arithmetic on the unsigned type).
// - The PREMULSUM scalar is converted exactly as the reference does (through
//   double), emulated with integer operations, so no fp64 is needed for it.
// Kernel signatures are mirrored by backends/ze/launch_plan.h; change both.
// Every kernel is a grid-stride loop over its items, and each output element is
// computed by one work-item in a fixed order: results do not depend on the
// launch shape.

#pragma OPENCL FP_CONTRACT OFF
#ifdef TUTTI_ZE_FP64
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
#endif

// The SPIR-V is emitted from unoptimised IR (-O0: LLVM's optimiser creates
// integer widths such as i5 that SPIR-V cannot express; the device compiler
// optimises anyway). Helpers are always_inline so that no calls remain.
#define TUTTI_INLINE inline __attribute__((always_inline))
#define GID() ((ulong)get_global_id(0))
#define GSIZE() ((ulong)get_global_size(0))

// ---- narrow floating formats -------------------------------------------------------

// fp32 -> 1 / E / M minifloat bits, round to nearest even. IEEE: the all-ones
// exponent holds inf and NaN (binary16, E5M2); otherwise (E4M3fn) only the
// all-ones pattern is NaN and overflow saturates.
TUTTI_INLINE uint encodeNarrow(float f, int kExp, int kMan, bool kIeee) {
  const int kBias = (1 << (kExp - 1)) - 1;
  const int kMinExp = 1 - kBias;
  const int kDrop = 23 - kMan;
  const uint kManMask = (1u << kMan) - 1u;
  const uint kInfBits = ((1u << kExp) - 1u) << kMan;
  const uint kNanBits = kInfBits | kManMask;
  const uint kMaxBits = kIeee ? kInfBits - 1u : kNanBits - 1u;
  const uint x = as_uint(f);
  const uint sign = (x >> 31) << (kExp + kMan);
  const uint mag = x & 0x7fffffffu;
  if (mag > 0x7f800000u) {
    if (!kIeee) return sign | kNanBits;
    uint payload = (mag >> kDrop) & kManMask;
    if (payload == 0u) payload = 1u << (kMan - 1);
    return sign | kInfBits | payload;
  }
  if (mag == 0x7f800000u) return sign | (kIeee ? kInfBits : kMaxBits);
  const int e = (int)(mag >> 23) - 127;
  uint r;
  if (e >= kMinExp) {
    const uint low = mag & ((1u << kDrop) - 1u);
    const uint halfUlp = 1u << (kDrop - 1);
    r = ((uint)(e + kBias) << kMan) | ((mag & 0x7fffffu) >> kDrop);
    if (low > halfUlp || (low == halfUlp && (r & 1u))) ++r;
  } else {
    const int shift = kDrop + kMinExp - e;
    if (shift > 24) return sign;
    const uint m = (mag & 0x7fffffu) | 0x800000u;
    r = m >> shift;
    const uint low = m & ((1u << shift) - 1u);
    const uint halfUlp = 1u << (shift - 1);
    if (low > halfUlp || (low == halfUlp && (r & 1u))) ++r;
  }
  if (r > kMaxBits) r = kIeee ? kInfBits : kMaxBits;
  return sign | r;
}

TUTTI_INLINE float decodeNarrow(uint v, int kExp, int kMan, bool kIeee) {
  const int kBias = (1 << (kExp - 1)) - 1;
  const uint kManMask = (1u << kMan) - 1u;
  const uint kExpAll = (1u << kExp) - 1u;
  const uint sign = ((v >> (kExp + kMan)) & 1u) << 31;
  // The exponent field is compared in place (not shifted down): a shifted
  // 5-bit field makes LLVM's optimiser emit i5 switches, which SPIR-V lacks.
  const uint exField = v & (kExpAll << kMan);
  const uint ex = exField >> kMan;
  const uint man = v & kManMask;
  if (exField == (kExpAll << kMan) && (kIeee || man == kManMask)) {
    if (!kIeee) return as_float(sign | 0x7fc00000u);
    return as_float(sign | 0x7f800000u | (man << (23 - kMan)));
  }
  if (exField == 0u) {
    if (man == 0u) return as_float(sign);
    int e = 1 - kBias - kMan;
    uint m = man;
    while ((m & 0x800000u) == 0u) {
      m <<= 1;
      --e;
    }
    return as_float(sign | ((uint)(e + 23 + 127) << 23) | (m & 0x7fffffu));
  }
  return as_float(sign | ((ex + 127u - (uint)kBias) << 23) | (man << (23 - kMan)));
}

TUTTI_INLINE ushort f32ToF16(float f) { return (ushort)encodeNarrow(f, 5, 10, true); }
TUTTI_INLINE float f16ToF32(ushort h) { return decodeNarrow(h, 5, 10, true); }
TUTTI_INLINE ushort f32ToBf16(float f) {
  const uint x = as_uint(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) {
    uint r = x >> 16;
    if ((r & 0x7fu) == 0u) r |= 0x40u;
    return (ushort)r;
  }
  return (ushort)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}
TUTTI_INLINE float bf16ToF32(ushort b) { return as_float((uint)b << 16); }
TUTTI_INLINE uchar f32ToE4M3(float f) { return (uchar)encodeNarrow(f, 4, 3, false); }
TUTTI_INLINE float e4m3ToF32(uchar v) { return decodeNarrow(v, 4, 3, false); }
TUTTI_INLINE uchar f32ToE5M2(float f) { return (uchar)encodeNarrow(f, 5, 2, true); }
TUTTI_INLINE float e5m2ToF32(uchar v) { return decodeNarrow(v, 5, 2, true); }

// ---- PREMULSUM scalar of 64-bit integers -------------------------------------------
// The reference takes the scalar as a double (int64/uint64 rounded to nearest
// even) and truncates it back to int64, saturating (uint64: [2^63, 2^64) taken
// directly, >= 2^64 saturates). Emulated here on integers: round the magnitude
// to 53 significant bits.

// |v| rounded to 53 significant bits, nearest even; *overflow when it reached 2^64.
TUTTI_INLINE ulong roundTo53(ulong u, bool* overflow) {
  *overflow = false;
  if (u < (1ul << 53)) return u;
  const int shift = 64 - (int)clz(u) - 53;  // 1..11
  const ulong low = u & ((1ul << shift) - 1ul);
  const ulong halfUlp = 1ul << (shift - 1);
  ulong r = u >> shift;
  if (low > halfUlp || (low == halfUlp && (r & 1ul))) ++r;
  if (r == (1ul << 53) && shift == 11) {
    *overflow = true;
    return 0;
  }
  return r << shift;
}
TUTTI_INLINE long scalarI64(long v) {
  bool ovf;
  if (v >= 0) {
    const ulong r = roundTo53((ulong)v, &ovf);
    return r >= (1ul << 63) ? 0x7fffffffffffffffl : (long)r;  // 2^63 saturates
  }
  const ulong r = roundTo53(-(ulong)v, &ovf);  // <= 2^63
  return (long)(0ul - r);
}
TUTTI_INLINE ulong scalarU64(ulong v) {
  bool ovf;
  const ulong r = roundTo53(v, &ovf);
  return ovf ? ~0ul : r;
}

// ---- reduce ------------------------------------------------------------------------
// One kernel per datatype: tutti_reduce_<t>(dst, s0..s7, nSrcs, op, count,
// scalarBits, scalarPtr, scalarOnDevice, avgDivisor, invF, invDBits).
// s<k> for k >= nSrcs are ignored (the plugin repeats s0). scalarBits holds the
// already converted scalar in the compute type's bits (low bytes) when the
// scalar is host-resident; with scalarOnDevice the element at scalarPtr is read
// and converted here. Ops: 0 sum, 1 prod, 2 max, 3 min, 4 avg, 5 premulsum.

#define TUTTI_MAXF(a, b) (isnan(a) ? (a) : ((a) > (b) ? (a) : (b)))
#define TUTTI_MINF(a, b) (isnan(a) ? (a) : ((a) < (b) ? (a) : (b)))
#define TUTTI_MAXI(a, b) ((a) > (b) ? (a) : (b))
#define TUTTI_MINI(a, b) ((a) < (b) ? (a) : (b))

// NAME: suffix; S: storage type; C: compute type; U: unsigned type for wrapping
// integer arithmetic (C itself for floats); LOAD/STORE: S <-> C; MAXOP/MINOP;
// SCALAR_DEV(s): converted scalar from one stored element; SCALAR_HOST(bits):
// from scalarBits; AVG(acc): the AVG finish.
#define TUTTI_DEFINE_REDUCE(NAME, S, C, U, LOAD, STORE, MAXOP, MINOP, SCALAR_DEV, SCALAR_HOST, \
                            AVG)                                                               \
  __kernel void tutti_reduce_##NAME(                                                           \
      __global S* dst, __global const S* s0, __global const S* s1, __global const S* s2,       \
      __global const S* s3, __global const S* s4, __global const S* s5, __global const S* s6,  \
      __global const S* s7, int nSrcs, int op, ulong count, ulong scalarBits,                  \
      __global const S* scalarPtr, int scalarOnDevice, ulong avgDivisor, float invF,           \
      ulong invDBits) {                                                                        \
    __global const S* src[8] = {s0, s1, s2, s3, s4, s5, s6, s7};                               \
    C scalar = (C)0;                                                                           \
    if (op == 5) scalar = scalarOnDevice ? SCALAR_DEV(scalarPtr[0]) : SCALAR_HOST(scalarBits); \
    (void)invF;                                                                                \
    (void)invDBits;                                                                            \
    (void)avgDivisor;                                                                          \
    for (ulong i = GID(); i < count; i += GSIZE()) {                                           \
      C acc = LOAD(src[0][i]);                                                                 \
      if (op == 5) acc = LOAD(STORE((C)((U)scalar * (U)acc)));                                 \
      for (int k = 1; k < nSrcs; ++k) {                                                        \
        const C x = LOAD(src[k][i]);                                                           \
        switch (op) {                                                                          \
          case 0:                                                                              \
          case 4:                                                                              \
            acc = (C)((U)acc + (U)x);                                                          \
            break;                                                                             \
          case 1:                                                                              \
            acc = (C)((U)acc * (U)x);                                                          \
            break;                                                                             \
          case 2:                                                                              \
            acc = MAXOP(acc, x);                                                               \
            break;                                                                             \
          case 3:                                                                              \
            acc = MINOP(acc, x);                                                               \
            break;                                                                             \
          default:                                                                             \
            acc = LOAD(STORE((C)((U)acc + (U)((U)scalar * (U)x))));                            \
            break;                                                                             \
        }                                                                                      \
      }                                                                                        \
      dst[i] = op == 4 ? AVG(acc) : STORE(acc);                                                \
    }                                                                                          \
  }

#define TUTTI_ID(x) (x)
#define TUTTI_AVG_S(acc) ((long)(acc) / (long)avgDivisor)
#define TUTTI_AVG_U(acc) ((ulong)(acc) / avgDivisor)

TUTTI_DEFINE_REDUCE(i8, char, char, uchar, TUTTI_ID, TUTTI_ID, TUTTI_MAXI, TUTTI_MINI, TUTTI_ID,
                    (char), TUTTI_AVG_S)
TUTTI_DEFINE_REDUCE(u8, uchar, uchar, uchar, TUTTI_ID, TUTTI_ID, TUTTI_MAXI, TUTTI_MINI, TUTTI_ID,
                    (uchar), TUTTI_AVG_U)
TUTTI_DEFINE_REDUCE(i32, int, int, uint, TUTTI_ID, TUTTI_ID, TUTTI_MAXI, TUTTI_MINI, TUTTI_ID,
                    (int), TUTTI_AVG_S)
TUTTI_DEFINE_REDUCE(u32, uint, uint, uint, TUTTI_ID, TUTTI_ID, TUTTI_MAXI, TUTTI_MINI, TUTTI_ID,
                    (uint), TUTTI_AVG_U)
TUTTI_DEFINE_REDUCE(i64, long, long, ulong, TUTTI_ID, TUTTI_ID, TUTTI_MAXI, TUTTI_MINI, scalarI64,
                    (long), TUTTI_AVG_S)
TUTTI_DEFINE_REDUCE(u64, ulong, ulong, ulong, TUTTI_ID, TUTTI_ID, TUTTI_MAXI, TUTTI_MINI, scalarU64,
                    (ulong), TUTTI_AVG_U)

#define TUTTI_AVG_F32(acc) ((acc)*invF)
#define TUTTI_F32_BITS(b) as_float((uint)(b))
TUTTI_DEFINE_REDUCE(f32, float, float, float, TUTTI_ID, TUTTI_ID, TUTTI_MAXF, TUTTI_MINF, TUTTI_ID,
                    TUTTI_F32_BITS, TUTTI_AVG_F32)

// Narrow formats: fp32 accumulation, rounded once; AVG rounds the sum to the
// format, multiplies by invF in fp32, rounds again. The multiply is
// invF * value, as the reference computes it (commutative, bit-identical).
#define TUTTI_DEFINE_NARROW(NAME, S, LOAD, STORE)                                                \
  TUTTI_INLINE S avg_##NAME(float acc, float invF) { return STORE(invF * LOAD(STORE(acc))); }    \
  TUTTI_INLINE float scalar_##NAME(S s) { return LOAD(s); }                                      \
  TUTTI_DEFINE_REDUCE(NAME, S, float, float, LOAD, STORE, TUTTI_MAXF, TUTTI_MINF, scalar_##NAME, \
                      TUTTI_F32_BITS, TUTTI_AVG_##NAME)
#define TUTTI_AVG_f16(acc) avg_f16(acc, invF)
#define TUTTI_AVG_bf16(acc) avg_bf16(acc, invF)
#define TUTTI_AVG_e4m3(acc) avg_e4m3(acc, invF)
#define TUTTI_AVG_e5m2(acc) avg_e5m2(acc, invF)
TUTTI_DEFINE_NARROW(f16, ushort, f16ToF32, f32ToF16)
TUTTI_DEFINE_NARROW(bf16, ushort, bf16ToF32, f32ToBf16)
TUTTI_DEFINE_NARROW(e4m3, uchar, e4m3ToF32, f32ToE4M3)
TUTTI_DEFINE_NARROW(e5m2, uchar, e5m2ToF32, f32ToE5M2)

#ifdef TUTTI_ZE_FP64
#define TUTTI_AVG_F64(acc) (as_double(invDBits) * (acc))
TUTTI_DEFINE_REDUCE(f64, double, double, double, TUTTI_ID, TUTTI_ID, TUTTI_MAXF, TUTTI_MINF,
                    TUTTI_ID, as_double, TUTTI_AVG_F64)
#endif

// ---- castScaled ------------------------------------------------------------------------

__kernel void tutti_cast_f32_f16(__global ushort* dst, __global const float* src, ulong count,
                                 float scale) {
  for (ulong i = GID(); i < count; i += GSIZE()) dst[i] = f32ToF16(src[i] * scale);
}
__kernel void tutti_cast_f32_bf16(__global ushort* dst, __global const float* src, ulong count,
                                  float scale) {
  for (ulong i = GID(); i < count; i += GSIZE()) dst[i] = f32ToBf16(src[i] * scale);
}
__kernel void tutti_cast_f16_f32(__global float* dst, __global const ushort* src, ulong count,
                                 float scale) {
  for (ulong i = GID(); i < count; i += GSIZE()) dst[i] = f16ToF32(src[i]) * scale;
}
__kernel void tutti_cast_bf16_f32(__global float* dst, __global const ushort* src, ulong count,
                                  float scale) {
  for (ulong i = GID(); i < count; i += GSIZE()) dst[i] = bf16ToF32(src[i]) * scale;
}

// ---- 1-bit codec -------------------------------------------------------------------------
// Blocks of 512 elements: [fp32 scale, little-endian][ceil(len/8) bytes of bits,
// LSB first, 1 when c < 0], c = src + err (err absent when hasErr == 0; the
// plugin then passes src again). Two kernels in queue order:
//   tutti_pack1bit_scale: one item per block; sums |c| in double into eight
//     partials p[i % 8] in increasing i, combines them as the header says,
//     divides by len in double, rounds once to float (NaN -> 0x7fc00000) and
//     writes the 4 scale bytes.
//   tutti_pack1bit_bits: one item per 8 elements; recomputes c (same float
//     add, same bits), writes the bit byte and, with hasErr, the new errors.
//     Each element is read before it is written by the same item, so src and
//     err may be the same buffer.

#define TUTTI_SIGN_BLOCK 512ul
#define TUTTI_SIGN_BLOCK_BYTES (4ul + TUTTI_SIGN_BLOCK / 8ul)

#ifdef TUTTI_ZE_FP64
__kernel void tutti_pack1bit_scale(__global const float* src, __global const float* err, int hasErr,
                                   __global uchar* wire, ulong count) {
  const ulong nBlocks = (count + TUTTI_SIGN_BLOCK - 1ul) / TUTTI_SIGN_BLOCK;
  for (ulong blk = GID(); blk < nBlocks; blk += GSIZE()) {
    const ulong base = blk * TUTTI_SIGN_BLOCK;
    const uint len = (uint)(count - base < TUTTI_SIGN_BLOCK ? count - base : TUTTI_SIGN_BLOCK);
    double p[8] = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0};
    for (uint i = 0; i < len; ++i) {
      const float c = hasErr ? src[base + i] + err[base + i] : src[base + i];
      p[i & 7u] = p[i & 7u] + (double)as_float(as_uint(c) & 0x7fffffffu);
    }
    const double sum = ((p[0] + p[4]) + (p[2] + p[6])) + ((p[1] + p[5]) + (p[3] + p[7]));
    const double mean = sum / (double)len;
    const uint sb = isnan(mean) ? 0x7fc00000u : as_uint((float)mean);
    __global uchar* out = wire + blk * TUTTI_SIGN_BLOCK_BYTES;
    out[0] = (uchar)sb;
    out[1] = (uchar)(sb >> 8);
    out[2] = (uchar)(sb >> 16);
    out[3] = (uchar)(sb >> 24);
  }
}
#endif

TUTTI_INLINE float wireScale(__global const uchar* blk) {
  return as_float((uint)blk[0] | (uint)blk[1] << 8 | (uint)blk[2] << 16 | (uint)blk[3] << 24);
}

__kernel void tutti_pack1bit_bits(__global const float* src, __global float* err, int hasErr,
                                  __global uchar* wire, ulong count) {
  const ulong nGroups = (count + 7ul) / 8ul;
  for (ulong g = GID(); g < nGroups; g += GSIZE()) {
    const ulong first = g * 8ul;
    const ulong blk = first / TUTTI_SIGN_BLOCK;
    __global uchar* out = wire + blk * TUTTI_SIGN_BLOCK_BYTES;
    const float scale = wireScale(out);
    const ulong end = count - first < 8ul ? count : first + 8ul;
    uint bits = 0u;
    for (ulong i = first; i < end; ++i) {
      const float c = hasErr ? src[i] + err[i] : src[i];
      const bool neg = c < 0.0f;
      if (neg) bits |= 1u << (uint)(i - first);
      if (hasErr) err[i] = c - (neg ? -scale : scale);
    }
    out[4ul + (first % TUTTI_SIGN_BLOCK) / 8ul] = (uchar)bits;
  }
}

__kernel void tutti_unpack1bit(__global float* dst, __global const uchar* wire, ulong count,
                               int accumulate) {
  for (ulong i = GID(); i < count; i += GSIZE()) {
    __global const uchar* blk = wire + i / TUTTI_SIGN_BLOCK * TUTTI_SIGN_BLOCK_BYTES;
    const uint j = (uint)(i % TUTTI_SIGN_BLOCK);
    const float scale = wireScale(blk);
    const float d = ((blk[4u + j / 8u] >> (j % 8u)) & 1u) ? -scale : scale;
    dst[i] = accumulate ? dst[i] + d : d;
  }
}

// ---- gemm ---------------------------------------------------------------------------------
// C[i][j] = alpha * float(acc) (+ beta * C[i][j] when beta != 0), acc = the sum
// over t = 0..k-1 of double(opA[i][t]) * double(opB[t][j]) in increasing t from
// +0 (each product exact in double). Dimension 0 runs over columns j (< n),
// dimension 1 over rows i (< m), both grid-stride.

#ifdef TUTTI_ZE_FP64
__kernel void tutti_gemm(int transA, int transB, long m, long n, long k, float alpha,
                         __global const float* A, long lda, __global const float* B, long ldb,
                         float beta, __global float* C, long ldc) {
  for (long i = (long)get_global_id(1); i < m; i += (long)get_global_size(1)) {
    for (long j = (long)get_global_id(0); j < n; j += (long)get_global_size(0)) {
      double acc = 0.0;
      for (long t = 0; t < k; ++t) {
        const float a = transA ? A[t * lda + i] : A[i * lda + t];
        const float b = transB ? B[j * ldb + t] : B[t * ldb + j];
        acc = acc + (double)a * (double)b;
      }
      const float prod = alpha * (float)acc;
      __global float* c = C + i * ldc + j;
      *c = beta == 0.0f ? prod : prod + beta * *c;
    }
  }
}
#endif
