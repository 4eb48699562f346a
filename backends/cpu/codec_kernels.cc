// Wire-codec kernels (codec_kernels.h): a scalar reference for every loop and
// AVX2 + F16C versions of the hot ones, chosen per call through
// kernel_dispatch.h's activeIsa(): kAvx2 and kAvx512 run the AVX2 loops (the
// codecs are bound by memory bandwidth, wider vectors would buy little), and
// kGeneric, or a CPU without AVX2/F16C, the scalar ones.
//
// Why the variants agree bit for bit: both perform, per element, the same IEEE
// operations on the same operands in the same order (no FMA contraction; see
// the pragma below), and every conversion is exact or RNE with identical rules
// (argued at each AVX2 helper). The one reduction, the kSign block scale, is
// summed in double in a fixed order that both variants follow (signAccumulate).
//
// Details the header leaves open, fixed here:
// - Unknown WireFormat values: wireBytes returns 0, the other calls do nothing.
// - exp outside [-100, 100] is clamped to that range.
// - kSign: unused high bits of a block's last bits byte are written as 0 and
//   ignored by decoding; the scale is stored in host byte order. A block whose
//   scale is NaN stores the default quiet NaN (0x7fc00000), whatever payloads
//   its elements carry, so the scale bytes do not depend on summation order.
// - Scaling by 2^exp is exact only inside the fp32 range: an overflowing
//   c * 2^exp (or a value beyond binary16's range) is sent as inf and leaves
//   err = c - (+-inf) = -+inf; for exp < 0, c * 2^exp may round in fp32's
//   subnormal range before the narrow rounding.
// - Where re-encoding decoded values does not give the same bytes: a kSign
//   block with a NaN scale (its elements decode to +-NaN, and NaN < 0 is
//   false, so the bits come back 0) and a block whose scale rounds to 0 while
//   some c < 0 (all |c| below ~2^-140; -0.0 < 0 is false). Neither is finite,
//   representable data; everything else round-trips.
// - When two NaNs meet in one float operation (src + err, decoded + local),
//   which payload the result carries is unspecified, as in kernels.h.
#include "backends/cpu/codec_kernels.h"

#include <cmath>
#include <cstring>

#include "backends/cpu/float_formats_inl.h"
#include "backends/cpu/kernel_dispatch.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define TUTTI_CODEC_AVX2 1
#else
#define TUTTI_CODEC_AVX2 0
#endif

// O3-level vectorisation for the scalar reference too (it is what CPUs without
// AVX2 run), and no FMA contraction in any variant: a + s*b is two roundings.
#pragma GCC push_options
#pragma GCC optimize("O3", "fp-contract=off")

namespace tutti::cpu {
namespace {

using detail::bitsToFloat;
using detail::floatBits;

// Bytes of one full kSign block on the wire: the float scale, then the bits.
constexpr size_t kSignBlockBytes = sizeof(float) + kSignBlock / 8;
static_assert(kSignBlock % 8 == 0, "sign blocks must hold whole bytes of bits");

// Unaligned element access (the contract requires no alignment).
inline float ldf(const float* p, size_t i) {
  float v;
  std::memcpy(&v, reinterpret_cast<const char*>(p) + i * sizeof(float), sizeof v);
  return v;
}
inline void stf(float* p, size_t i, float v) {
  std::memcpy(reinterpret_cast<char*>(p) + i * sizeof(float), &v, sizeof v);
}
inline uint16_t ldw(const uint8_t* p, size_t i) {
  uint16_t v;
  std::memcpy(&v, p + 2 * i, sizeof v);
  return v;
}
inline void stw(uint8_t* p, size_t i, uint16_t v) { std::memcpy(p + 2 * i, &v, sizeof v); }

// 2^e as a float; e is clamped to [-100, 100], well inside the normal range.
float pow2(int e) {
  e = e < -100 ? -100 : (e > 100 ? 100 : e);
  return bitsToFloat(static_cast<uint32_t>(127 + e) << 23);
}

// ---- kSign block scale: one summation order for every variant ------------------
//
// |c[i]| (exact in double) is added into partial sum p[i % 8], in increasing i,
// each p starting at +0.0; then the partials are combined as
//   ((p0 + p4) + (p2 + p6)) + ((p1 + p5) + (p3 + p7)),
// the sum divided by the block length in double and rounded once to float.
// The AVX2 loop keeps p0..p3 and p4..p7 in the lanes of two double vectors
// (elements 8k..8k+3 and 8k+4..8k+7), so it performs exactly these additions.

// Elements [begin, len) of a block: c[i] = src[i] (* srcScale when scaled)
// (+ err[i] when err), stored to c and accumulated into p.
void signAccumulate(const float* src, float srcScale, bool scaled, const float* err, size_t begin,
                    size_t len, float* c, double p[8]) {
  for (size_t i = begin; i < len; ++i) {
    float v = ldf(src, i);
    if (scaled) v = v * srcScale;
    if (err != nullptr) v = v + ldf(err, i);
    c[i] = v;
    p[i & 7] += static_cast<double>(std::fabs(v));
  }
}

double signCombine(const double p[8]) {
  return ((p[0] + p[4]) + (p[2] + p[6])) + ((p[1] + p[5]) + (p[3] + p[7]));
}

// -scale, hidden from the optimiser. Otherwise GCC may rewrite c - (-scale) as
// c + scale, or (-scale) + l as l - scale: equal for numbers, but a NaN scale
// then comes out with the other sign than in the AVX2 loops, which compute
// exactly the operations written.
float negated(float scale) {
  volatile float neg = -scale;
  return neg;
}

float signScale(double sum, size_t len) {
  const double mean = sum / static_cast<double>(len);
  if (mean != mean) return bitsToFloat(0x7fc00000u);  // see the file comment
  return static_cast<float>(mean);
}

// ---- scalar reference ------------------------------------------------------------

namespace scalar {

struct Half {
  static uint16_t narrow(float x) { return detail::floatToHalfBits(x); }
  static float widen(uint16_t w) { return detail::halfBitsToFloat(w); }
};
struct Bf16 {
  static uint16_t narrow(float x) { return detail::floatToBf16Bits(x); }
  static float widen(uint16_t w) { return detail::bf16BitsToFloat(w); }
};

// The scaled-narrow round trip behind encode and quantize, per element:
//   c = src[i] (* srcScale when scaled) (+ err[i] when err)
//   w = narrow(c * up);  d = widen(w) * down
//   wire[i] = w (when wire), dst[i] = d (when dst), err[i] = c - d (when err).
template <class F>
void narrowRoundTrip(const float* src, float srcScale, bool scaled, float* err, size_t n, float up,
                     float down, uint8_t* wire, float* dst) {
  for (size_t i = 0; i < n; ++i) {
    float c = ldf(src, i);
    if (scaled) c = c * srcScale;
    if (err != nullptr) c = c + ldf(err, i);
    const uint16_t w = F::narrow(c * up);
    if (wire != nullptr) stw(wire, i, w);
    if (dst == nullptr && err == nullptr) continue;
    const float d = F::widen(w) * down;
    if (dst != nullptr) stf(dst, i, d);
    if (err != nullptr) stf(err, i, c - d);
  }
}

// dst[i] = widen(wire[i]) * down, plus (localScale *) local[i] when local.
template <class F>
void narrowDecode(const uint8_t* wire, size_t n, float down, const float* local, float localScale,
                  float* dst) {
  const bool scaled = localScale != 1.0f;
  for (size_t i = 0; i < n; ++i) {
    float d = F::widen(ldw(wire, i)) * down;
    if (local != nullptr) d = d + (scaled ? localScale * ldf(local, i) : ldf(local, i));
    stf(dst, i, d);
  }
}

float maxAbs(const float* x, size_t n) {
  // On |x| bit patterns unsigned order is numeric order, and NaNs sort above
  // inf, so the largest pattern is the answer (a NaN when there is one).
  uint32_t m = 0;
  for (size_t i = 0; i < n; ++i) {
    const uint32_t a = floatBits(ldf(x, i)) & 0x7fffffffu;
    m = a > m ? a : m;
  }
  return bitsToFloat(m);
}

// Fills c[0, len) (see signAccumulate) and returns the block's |c| sum.
double signPrepare(const float* src, float srcScale, bool scaled, const float* err, size_t len,
                   float* c) {
  double p[8] = {};
  signAccumulate(src, srcScale, scaled, err, 0, len, c, p);
  return signCombine(p);
}

// From a block's c[0, len) and its scale: bits (LSB first, 1 when c < 0; whole
// bytes, unused high bits 0), decoded values d = +-scale into dst, and
// err = c - d, each when its pointer is non-null.
void signFinish(const float* c, size_t len, float scale, float* err, uint8_t* bits, float* dst) {
  const float negScale = negated(scale);
  for (size_t g = 0; g < len; g += 8) {  // one bits byte per group of 8
    const size_t m = len - g < 8 ? len - g : 8;
    unsigned byte = 0;
    for (size_t j = 0; j < m; ++j) {
      const size_t i = g + j;
      const bool neg = c[i] < 0.0f;
      byte |= static_cast<unsigned>(neg) << j;
      const float d = neg ? negScale : scale;
      if (dst != nullptr) stf(dst, i, d);
      if (err != nullptr) stf(err, i, c[i] - d);
    }
    if (bits != nullptr) bits[g / 8] = static_cast<uint8_t>(byte);
  }
}

// dst[i] = +-scale per bit, plus (localScale *) local[i] when local.
void signDecode(const uint8_t* bits, size_t len, float scale, const float* local, float localScale,
                float* dst) {
  const bool scaled = localScale != 1.0f;
  const float negScale = negated(scale);
  for (size_t g = 0; g < len; g += 8) {
    const size_t m = len - g < 8 ? len - g : 8;
    const unsigned byte = bits[g / 8];
    for (size_t j = 0; j < m; ++j) {
      const size_t i = g + j;
      float d = (byte >> j) & 1u ? negScale : scale;
      if (local != nullptr) d = d + (scaled ? localScale * ldf(local, i) : ldf(local, i));
      stf(dst, i, d);
    }
  }
}

}  // namespace scalar

// ---- AVX2 + F16C -------------------------------------------------------------------

#if TUTTI_CODEC_AVX2
#pragma GCC push_options
#pragma GCC target("avx2,f16c")

namespace avx2 {

constexpr size_t kW = 8;  // floats per vector

// Narrow formats on 8 lanes: narrow() equals the scalar encoder lane by lane,
// widen() the scalar decoder; Words is the register form of 8 wire words.
struct Half {
  using Scalar = scalar::Half;
  using Words = __m128i;
  // F16C rounds to nearest even with gradual underflow and overflow to inf,
  // exactly as floatToHalfBits (default MXCSR). NaN: F16C sets the quiet bit,
  // floatToHalfBits keeps the payload as it is; they differ for a signalling
  // NaN only. None should arrive (y comes out of a multiply, which quiets
  // NaNs), but NaN lanes take the scalar encoder anyway (a rare branch), so
  // the equality does not rest on that argument.
  static Words narrow(__m256 y) {
    Words h = _mm256_cvtps_ph(y, _MM_FROUND_TO_NEAREST_INT);
    if (__builtin_expect(_mm256_movemask_ps(_mm256_cmp_ps(y, y, _CMP_UNORD_Q)) != 0, 0)) {
      alignas(32) float in[kW];
      alignas(16) uint16_t out[kW];
      _mm256_store_ps(in, y);
      for (size_t j = 0; j < kW; ++j) out[j] = Scalar::narrow(in[j]);
      h = _mm_load_si128(reinterpret_cast<const __m128i*>(out));
    }
    return h;
  }
  // Exact, like halfBitsToFloat, except that a signalling NaN comes out quiet;
  // every caller multiplies the result next, which quiets it in both variants.
  static __m256 widen(Words h) { return _mm256_cvtph_ps(h); }
  static Words load(const uint8_t* p) {
    return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  }
  static void store(uint8_t* p, Words h) { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), h); }
};

struct Bf16 {
  using Scalar = scalar::Bf16;
  using Words = __m256i;  // one bfloat16 per 32-bit lane, in the low half
  // floatToBf16Bits: RNE on the low 16 bits; NaN lanes (rare branch) take the
  // scalar encoder, which keeps the payload instead of rounding it.
  static Words narrow(__m256 y) {
    const __m256i x = _mm256_castps_si256(y);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(
        _mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7fff)), lsb), 16);
    if (__builtin_expect(_mm256_movemask_ps(_mm256_cmp_ps(y, y, _CMP_UNORD_Q)) != 0, 0)) {
      alignas(32) float in[kW];
      alignas(32) uint32_t out[kW];
      _mm256_store_ps(in, y);
      for (size_t j = 0; j < kW; ++j) out[j] = Scalar::narrow(in[j]);
      r = _mm256_load_si256(reinterpret_cast<const __m256i*>(out));
    }
    return r;
  }
  static __m256 widen(Words w) { return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)); }
  static Words load(const uint8_t* p) {
    return _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static void store(uint8_t* p, Words w) {
    const __m128i packed =
        _mm_packus_epi32(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), packed);
  }
};

// scalar::narrowRoundTrip, 8 lanes at a time; the flags are template
// parameters so each combination is a branch-free loop. The tail (< 8) runs
// the scalar loop.
template <class F, bool kScaled, bool kErr, bool kWire, bool kDst>
void narrowRoundTripV(const float* src, float srcScale, float* err, size_t n, float up, float down,
                      uint8_t* wire, float* dst) {
  const __m256 vScale = _mm256_set1_ps(srcScale);
  const __m256 vUp = _mm256_set1_ps(up);
  const __m256 vDown = _mm256_set1_ps(down);
  size_t i = 0;
  for (; i + kW <= n; i += kW) {
    __m256 c = _mm256_loadu_ps(src + i);
    if constexpr (kScaled) c = _mm256_mul_ps(c, vScale);
    if constexpr (kErr) c = _mm256_add_ps(c, _mm256_loadu_ps(err + i));
    const typename F::Words w = F::narrow(_mm256_mul_ps(c, vUp));
    if constexpr (kWire) F::store(wire + 2 * i, w);
    if constexpr (kErr || kDst) {
      const __m256 d = _mm256_mul_ps(F::widen(w), vDown);
      if constexpr (kDst) _mm256_storeu_ps(dst + i, d);
      if constexpr (kErr) _mm256_storeu_ps(err + i, _mm256_sub_ps(c, d));
    }
  }
  if (i < n) {
    scalar::narrowRoundTrip<typename F::Scalar>(
        src + i, srcScale, kScaled, kErr ? err + i : nullptr, n - i, up, down,
        kWire ? wire + 2 * i : nullptr, kDst ? dst + i : nullptr);
  }
}

template <class F>
void narrowRoundTrip(const float* src, float srcScale, bool scaled, float* err, size_t n, float up,
                     float down, uint8_t* wire, float* dst) {
  // The two shapes the public calls produce: encode (wire, no dst, unscaled)
  // and quantize (dst, no wire); err optional in both.
  if (wire != nullptr && dst == nullptr && !scaled) {
    if (err != nullptr) {
      return narrowRoundTripV<F, false, true, true, false>(src, 1.0f, err, n, up, down, wire,
                                                           nullptr);
    }
    return narrowRoundTripV<F, false, false, true, false>(src, 1.0f, nullptr, n, up, down, wire,
                                                          nullptr);
  }
  if (wire == nullptr && dst != nullptr) {
    if (scaled) {
      if (err != nullptr) {
        return narrowRoundTripV<F, true, true, false, true>(src, srcScale, err, n, up, down,
                                                            nullptr, dst);
      }
      return narrowRoundTripV<F, true, false, false, true>(src, srcScale, nullptr, n, up, down,
                                                           nullptr, dst);
    }
    if (err != nullptr) {
      return narrowRoundTripV<F, false, true, false, true>(src, 1.0f, err, n, up, down, nullptr,
                                                           dst);
    }
    return narrowRoundTripV<F, false, false, false, true>(src, 1.0f, nullptr, n, up, down, nullptr,
                                                          dst);
  }
  scalar::narrowRoundTrip<typename F::Scalar>(src, srcScale, scaled, err, n, up, down, wire, dst);
}

template <class F, bool kLocal, bool kScaled>
void narrowDecodeV(const uint8_t* wire, size_t n, float down, const float* local, float localScale,
                   float* dst) {
  const __m256 vDown = _mm256_set1_ps(down);
  const __m256 vLocal = _mm256_set1_ps(localScale);
  size_t i = 0;
  for (; i + kW <= n; i += kW) {
    __m256 d = _mm256_mul_ps(F::widen(F::load(wire + 2 * i)), vDown);
    if constexpr (kLocal) {
      __m256 l = _mm256_loadu_ps(local + i);
      if constexpr (kScaled) l = _mm256_mul_ps(vLocal, l);
      d = _mm256_add_ps(d, l);
    }
    _mm256_storeu_ps(dst + i, d);
  }
  if (i < n) {
    scalar::narrowDecode<typename F::Scalar>(wire + 2 * i, n - i, down,
                                             kLocal ? local + i : nullptr, localScale, dst + i);
  }
}

template <class F>
void narrowDecode(const uint8_t* wire, size_t n, float down, const float* local, float localScale,
                  float* dst) {
  if (local == nullptr) return narrowDecodeV<F, false, false>(wire, n, down, nullptr, 1.0f, dst);
  if (localScale == 1.0f) return narrowDecodeV<F, true, false>(wire, n, down, local, 1.0f, dst);
  narrowDecodeV<F, true, true>(wire, n, down, local, localScale, dst);
}

// Same unsigned maximum over |x| bit patterns as scalar::maxAbs (max is
// associative, so the lane split cannot change the result).
float maxAbs(const float* x, size_t n) {
  const __m256i mask = _mm256_set1_epi32(0x7fffffff);
  __m256i m0 = _mm256_setzero_si256(), m1 = m0, m2 = m0, m3 = m0;
  const auto ld = [&](size_t i) {
    return _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i)), mask);
  };
  size_t i = 0;
  for (; i + 4 * kW <= n; i += 4 * kW) {
    m0 = _mm256_max_epu32(m0, ld(i));
    m1 = _mm256_max_epu32(m1, ld(i + kW));
    m2 = _mm256_max_epu32(m2, ld(i + 2 * kW));
    m3 = _mm256_max_epu32(m3, ld(i + 3 * kW));
  }
  for (; i + kW <= n; i += kW) m0 = _mm256_max_epu32(m0, ld(i));
  m0 = _mm256_max_epu32(_mm256_max_epu32(m0, m1), _mm256_max_epu32(m2, m3));
  alignas(32) uint32_t lanes[kW];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), m0);
  uint32_t m = floatBits(scalar::maxAbs(x + i, n - i));
  for (uint32_t v : lanes) m = v > m ? v : m;
  return bitsToFloat(m);
}

template <bool kScaled, bool kErr>
double signPrepareV(const float* src, float srcScale, const float* err, size_t len, float* c) {
  const __m256 vScale = _mm256_set1_ps(srcScale);
  const __m256 absMask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256d acc0 = _mm256_setzero_pd();  // p0..p3
  __m256d acc1 = _mm256_setzero_pd();  // p4..p7
  size_t i = 0;
  for (; i + kW <= len; i += kW) {
    __m256 v = _mm256_loadu_ps(src + i);
    if constexpr (kScaled) v = _mm256_mul_ps(v, vScale);
    if constexpr (kErr) v = _mm256_add_ps(v, _mm256_loadu_ps(err + i));
    _mm256_storeu_ps(c + i, v);
    const __m256 a = _mm256_and_ps(v, absMask);
    acc0 = _mm256_add_pd(acc0, _mm256_cvtps_pd(_mm256_castps256_ps128(a)));
    acc1 = _mm256_add_pd(acc1, _mm256_cvtps_pd(_mm256_extractf128_ps(a, 1)));
  }
  double p[8];
  _mm256_storeu_pd(p, acc0);
  _mm256_storeu_pd(p + 4, acc1);
  // i is a multiple of 8 here, so the tail continues each p[i % 8] in order.
  signAccumulate(src, srcScale, kScaled, kErr ? err : nullptr, i, len, c, p);
  return signCombine(p);
}

double signPrepare(const float* src, float srcScale, bool scaled, const float* err, size_t len,
                   float* c) {
  if (scaled) {
    return err != nullptr ? signPrepareV<true, true>(src, srcScale, err, len, c)
                          : signPrepareV<true, false>(src, srcScale, nullptr, len, c);
  }
  return err != nullptr ? signPrepareV<false, true>(src, 1.0f, err, len, c)
                        : signPrepareV<false, false>(src, 1.0f, nullptr, len, c);
}

// scalar::signFinish. c < 0 is an ordered compare (false for NaN and -0.0);
// the selected lane is -scale (a sign flip, as scalar negation) or scale.
template <bool kErr, bool kBits, bool kDst>
void signFinishV(const float* c, size_t len, float scale, float* err, uint8_t* bits, float* dst) {
  const __m256 pos = _mm256_set1_ps(scale);
  const __m256 neg = _mm256_set1_ps(-scale);
  const __m256 zero = _mm256_setzero_ps();
  size_t i = 0;
  for (; i + kW <= len; i += kW) {
    const __m256 v = _mm256_loadu_ps(c + i);
    const __m256 isNeg = _mm256_cmp_ps(v, zero, _CMP_LT_OQ);
    if constexpr (kBits) bits[i / 8] = static_cast<uint8_t>(_mm256_movemask_ps(isNeg));
    const __m256 d = _mm256_blendv_ps(pos, neg, isNeg);
    if constexpr (kDst) _mm256_storeu_ps(dst + i, d);
    if constexpr (kErr) _mm256_storeu_ps(err + i, _mm256_sub_ps(v, d));
  }
  if (i < len) {
    scalar::signFinish(c + i, len - i, scale, kErr ? err + i : nullptr,
                       kBits ? bits + i / 8 : nullptr, kDst ? dst + i : nullptr);
  }
}

void signFinish(const float* c, size_t len, float scale, float* err, uint8_t* bits, float* dst) {
  if (bits != nullptr && dst == nullptr) {  // encode
    return err != nullptr ? signFinishV<true, true, false>(c, len, scale, err, bits, nullptr)
                          : signFinishV<false, true, false>(c, len, scale, nullptr, bits, nullptr);
  }
  if (bits == nullptr && dst != nullptr) {  // quantize
    return err != nullptr ? signFinishV<true, false, true>(c, len, scale, err, nullptr, dst)
                          : signFinishV<false, false, true>(c, len, scale, nullptr, nullptr, dst);
  }
  scalar::signFinish(c, len, scale, err, bits, dst);
}

template <bool kLocal, bool kScaled>
void signDecodeV(const uint8_t* bits, size_t len, float scale, const float* local, float localScale,
                 float* dst) {
  const __m256 pos = _mm256_set1_ps(scale);
  const __m256 neg = _mm256_set1_ps(-scale);
  const __m256 vLocal = _mm256_set1_ps(localScale);
  const __m256i select = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  size_t i = 0;
  for (; i + kW <= len; i += kW) {
    const __m256i b = _mm256_and_si256(_mm256_set1_epi32(bits[i / 8]), select);
    const __m256 isNeg = _mm256_castsi256_ps(_mm256_cmpeq_epi32(b, select));
    __m256 d = _mm256_blendv_ps(pos, neg, isNeg);
    if constexpr (kLocal) {
      __m256 l = _mm256_loadu_ps(local + i);
      if constexpr (kScaled) l = _mm256_mul_ps(vLocal, l);
      d = _mm256_add_ps(d, l);
    }
    _mm256_storeu_ps(dst + i, d);
  }
  if (i < len) {
    scalar::signDecode(bits + i / 8, len - i, scale, kLocal ? local + i : nullptr, localScale,
                       dst + i);
  }
}

void signDecode(const uint8_t* bits, size_t len, float scale, const float* local, float localScale,
                float* dst) {
  if (local == nullptr) return signDecodeV<false, false>(bits, len, scale, nullptr, 1.0f, dst);
  if (localScale == 1.0f) return signDecodeV<true, false>(bits, len, scale, local, 1.0f, dst);
  signDecodeV<true, true>(bits, len, scale, local, localScale, dst);
}

}  // namespace avx2

#pragma GCC pop_options
#endif  // TUTTI_CODEC_AVX2

// ---- the codec, written once over a variant's loops --------------------------------
//
// V is a namespace-like struct naming one variant's loops. Blocks of kSign are
// staged through c[] on the stack, which also makes in-place calls safe: a
// block's inputs are all read before any of its outputs is written.

template <class V>
struct Codec {
  static void roundTrip(WireFormat f, int exp, const float* src, float srcScale, bool scaled,
                        float* err, size_t n, uint8_t* wire, float* dst) {
    switch (f) {
      case WireFormat::kHalf:
        return V::template narrowRoundTrip<typename V::Half>(src, srcScale, scaled, err, n,
                                                             pow2(exp), pow2(-exp), wire, dst);
      case WireFormat::kBf16:
        return V::template narrowRoundTrip<typename V::Bf16>(src, srcScale, scaled, err, n,
                                                             pow2(exp), pow2(-exp), wire, dst);
      case WireFormat::kSign: {
        alignas(32) float c[kSignBlock];
        for (size_t off = 0; off < n; off += kSignBlock) {
          const size_t len = n - off < kSignBlock ? n - off : kSignBlock;
          float* e = err != nullptr ? err + off : nullptr;
          const double sum = V::signPrepare(src + off, srcScale, scaled, e, len, c);
          const float scale = signScale(sum, len);
          uint8_t* bits = nullptr;
          if (wire != nullptr) {
            uint8_t* block = wire + (off / kSignBlock) * kSignBlockBytes;
            std::memcpy(block, &scale, sizeof scale);
            bits = block + sizeof scale;
          }
          V::signFinish(c, len, scale, e, bits, dst != nullptr ? dst + off : nullptr);
        }
        return;
      }
    }
  }

  static void decode(WireFormat f, int exp, const uint8_t* wire, size_t n, const float* local,
                     float localScale, float* dst) {
    switch (f) {
      case WireFormat::kHalf:
        return V::template narrowDecode<typename V::Half>(wire, n, pow2(-exp), local, localScale,
                                                          dst);
      case WireFormat::kBf16:
        return V::template narrowDecode<typename V::Bf16>(wire, n, pow2(-exp), local, localScale,
                                                          dst);
      case WireFormat::kSign:
        for (size_t off = 0; off < n; off += kSignBlock) {
          const size_t len = n - off < kSignBlock ? n - off : kSignBlock;
          const uint8_t* block = wire + (off / kSignBlock) * kSignBlockBytes;
          float scale;
          std::memcpy(&scale, block, sizeof scale);
          V::signDecode(block + sizeof scale, len, scale, local != nullptr ? local + off : nullptr,
                        localScale, dst + off);
        }
        return;
    }
  }
};

// The variants' loops under one interface for Codec.
struct ScalarLoops {
  using Half = scalar::Half;
  using Bf16 = scalar::Bf16;
  template <class F>
  static void narrowRoundTrip(const float* src, float srcScale, bool scaled, float* err, size_t n,
                              float up, float down, uint8_t* wire, float* dst) {
    scalar::narrowRoundTrip<F>(src, srcScale, scaled, err, n, up, down, wire, dst);
  }
  template <class F>
  static void narrowDecode(const uint8_t* wire, size_t n, float down, const float* local,
                           float localScale, float* dst) {
    scalar::narrowDecode<F>(wire, n, down, local, localScale, dst);
  }
  static double signPrepare(const float* src, float srcScale, bool scaled, const float* err,
                            size_t len, float* c) {
    return scalar::signPrepare(src, srcScale, scaled, err, len, c);
  }
  static void signFinish(const float* c, size_t len, float scale, float* err, uint8_t* bits,
                         float* dst) {
    scalar::signFinish(c, len, scale, err, bits, dst);
  }
  static void signDecode(const uint8_t* bits, size_t len, float scale, const float* local,
                         float localScale, float* dst) {
    scalar::signDecode(bits, len, scale, local, localScale, dst);
  }
};

#if TUTTI_CODEC_AVX2
struct Avx2Loops {
  using Half = avx2::Half;
  using Bf16 = avx2::Bf16;
  template <class F>
  static void narrowRoundTrip(const float* src, float srcScale, bool scaled, float* err, size_t n,
                              float up, float down, uint8_t* wire, float* dst) {
    avx2::narrowRoundTrip<F>(src, srcScale, scaled, err, n, up, down, wire, dst);
  }
  template <class F>
  static void narrowDecode(const uint8_t* wire, size_t n, float down, const float* local,
                           float localScale, float* dst) {
    avx2::narrowDecode<F>(wire, n, down, local, localScale, dst);
  }
  static double signPrepare(const float* src, float srcScale, bool scaled, const float* err,
                            size_t len, float* c) {
    return avx2::signPrepare(src, srcScale, scaled, err, len, c);
  }
  static void signFinish(const float* c, size_t len, float scale, float* err, uint8_t* bits,
                         float* dst) {
    avx2::signFinish(c, len, scale, err, bits, dst);
  }
  static void signDecode(const uint8_t* bits, size_t len, float scale, const float* local,
                         float localScale, float* dst) {
    avx2::signDecode(bits, len, scale, local, localScale, dst);
  }
};
#endif

#if TUTTI_CODEC_AVX2
// The AVX2 loops need AVX2 + F16C, which kAvx2 and kAvx512 both imply
// (kernel_dispatch.h only selects what the CPU supports).
bool useAvx2() {
  const KernelIsa isa = activeIsa();
  return isa == KernelIsa::kAvx2 || isa == KernelIsa::kAvx512;
}
#endif

bool knownFormat(WireFormat f) {
  return f == WireFormat::kHalf || f == WireFormat::kBf16 || f == WireFormat::kSign;
}

void roundTrip(WireFormat f, int exp, const float* src, float srcScale, bool scaled, float* err,
               size_t n, uint8_t* wire, float* dst) {
#if TUTTI_CODEC_AVX2
  if (useAvx2()) {
    return Codec<Avx2Loops>::roundTrip(f, exp, src, srcScale, scaled, err, n, wire, dst);
  }
#endif
  Codec<ScalarLoops>::roundTrip(f, exp, src, srcScale, scaled, err, n, wire, dst);
}

void decodeImpl(WireFormat f, int exp, const uint8_t* wire, size_t n, const float* local,
                float localScale, float* dst) {
#if TUTTI_CODEC_AVX2
  if (useAvx2()) return Codec<Avx2Loops>::decode(f, exp, wire, n, local, localScale, dst);
#endif
  Codec<ScalarLoops>::decode(f, exp, wire, n, local, localScale, dst);
}

}  // namespace

size_t wireBytes(WireFormat f, size_t n) {
  switch (f) {
    case WireFormat::kHalf:
    case WireFormat::kBf16:
      return 2 * n;
    case WireFormat::kSign: {
      const size_t rest = n % kSignBlock;
      return n / kSignBlock * kSignBlockBytes + (rest != 0 ? sizeof(float) + (rest + 7) / 8 : 0);
    }
  }
  return 0;
}

float maxAbs(const float* x, size_t n) {
  if (n == 0) return 0.0f;
#if TUTTI_CODEC_AVX2
  if (useAvx2()) return avx2::maxAbs(x, n);
#endif
  return scalar::maxAbs(x, n);
}

void encode(WireFormat f, int exp, const float* src, float* err, size_t n, void* wire) {
  if (n == 0 || !knownFormat(f)) return;
  roundTrip(f, exp, src, 1.0f, false, err, n, static_cast<uint8_t*>(wire), nullptr);
}

void decode(WireFormat f, int exp, const void* wire, size_t n, float* dst) {
  if (n == 0 || !knownFormat(f)) return;
  decodeImpl(f, exp, static_cast<const uint8_t*>(wire), n, nullptr, 1.0f, dst);
}

void decodeAdd(WireFormat f, int exp, const void* wire, size_t n, const float* local,
               float localScale, float* dst) {
  if (n == 0 || !knownFormat(f)) return;
  decodeImpl(f, exp, static_cast<const uint8_t*>(wire), n, local, localScale, dst);
}

void quantize(WireFormat f, int exp, const float* src, float srcScale, float* err, size_t n,
              float* dst) {
  if (n == 0 || !knownFormat(f)) return;
  roundTrip(f, exp, src, srcScale, srcScale != 1.0f, err, n, nullptr, dst);
}

}  // namespace tutti::cpu

#pragma GCC pop_options
