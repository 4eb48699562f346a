// xpu_emu: scalar conversions between fp32 and the narrow floating formats the
// emulated device computes with (IEEE binary16, bfloat16, OCP FP8 E4M3 "fn" and
// E5M2). Written for this plugin; it shares no code with tutti.
//
// Contract:
// - Encoders (fp32 -> narrow) round to nearest, ties to even, with gradual
//   underflow (target subnormals are produced, never flushed).
// - Overflow: binary16, bfloat16, E5M2 give +-inf. E4M3 has no infinity and
//   SATURATES: anything that rounds beyond 448, and +-inf, becomes +-448.
// - NaN keeps its sign. binary16 / bfloat16 / E5M2 keep the leading payload bits
//   that fit; a payload that would become zero turns into the quiet NaN. E4M3
//   has one NaN per sign (0x7f / 0xff).
// - Decoders (narrow -> fp32) are exact; NaN payloads go to the top mantissa
//   bits (E4M3's NaN decodes to the quiet fp32 NaN with its sign).
// - Pure, header-only, thread-safe.
#pragma once

#include <cstdint>
#include <cstring>

namespace xpu_emu {

inline uint32_t bitsOf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

inline float floatOf(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// fp32 -> a 1 / kExpBits / kManBits minifloat. kHasInf: the all-ones exponent
// holds inf and NaN (IEEE style); otherwise only all-ones is NaN and overflow
// saturates to the largest finite value.
template <int kExpBits, int kManBits, bool kHasInf>
uint32_t encodeNarrow(float f) {
  constexpr int kBias = (1 << (kExpBits - 1)) - 1;
  constexpr int kMinNormalExp = 1 - kBias;
  constexpr int kDrop = 23 - kManBits;  // fp32 mantissa bits that do not fit
  constexpr uint32_t kManMask = (1u << kManBits) - 1;
  constexpr uint32_t kExpField = ((1u << kExpBits) - 1) << kManBits;
  constexpr uint32_t kLargest = kHasInf ? kExpField - 1 : (kExpField | kManMask) - 1;
  const uint32_t u = bitsOf(f);
  const uint32_t sign = (u >> 31) << (kExpBits + kManBits);
  const uint32_t mag = u & 0x7fffffffu;
  if (mag > 0x7f800000u) {  // NaN
    if (!kHasInf) return sign | kExpField | kManMask;
    uint32_t payload = (mag >> kDrop) & kManMask;
    if (payload == 0) payload = 1u << (kManBits - 1);
    return sign | kExpField | payload;
  }
  if (mag == 0x7f800000u) return sign | (kHasInf ? kExpField : kLargest);
  const int exp = static_cast<int>(mag >> 23) - 127;
  uint32_t out;
  if (exp >= kMinNormalExp) {
    // Normal in the target: keep the top mantissa bits, round the rest. A carry
    // out of the mantissa correctly bumps the exponent (or reaches overflow).
    const uint32_t frac = mag & 0x7fffffu;
    out = (static_cast<uint32_t>(exp + kBias) << kManBits) | (frac >> kDrop);
    const uint32_t rest = frac & ((1u << kDrop) - 1);
    const uint32_t half = 1u << (kDrop - 1);
    if (rest > half || (rest == half && (out & 1u) != 0)) ++out;
  } else {
    // Subnormal in the target: the significand (with its hidden bit) shifted
    // so that one unit is the target's smallest subnormal.
    const int shift = kDrop + (kMinNormalExp - exp);
    if (shift > 24) return sign;  // under half the smallest subnormal: +-0
    const uint32_t sig = (mag & 0x7fffffu) | 0x800000u;
    out = sig >> shift;
    const uint32_t rest = sig & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rest > half || (rest == half && (out & 1u) != 0)) ++out;
  }
  if (out > kLargest) out = kHasInf ? kExpField : kLargest;
  return sign | out;
}

// Exact decode of a 1 / kExpBits / kManBits minifloat.
template <int kExpBits, int kManBits, bool kHasInf>
float decodeNarrow(uint32_t v) {
  constexpr int kBias = (1 << (kExpBits - 1)) - 1;
  constexpr uint32_t kManMask = (1u << kManBits) - 1;
  constexpr uint32_t kExpMax = (1u << kExpBits) - 1;
  const uint32_t sign = ((v >> (kExpBits + kManBits)) & 1u) << 31;
  const uint32_t e = (v >> kManBits) & kExpMax;
  const uint32_t m = v & kManMask;
  if (e == kExpMax && (kHasInf || m == kManMask)) {
    if (!kHasInf) return floatOf(sign | 0x7fc00000u);
    return floatOf(sign | 0x7f800000u | (m << (23 - kManBits)));
  }
  if (e == 0) {
    // m * 2^(1 - bias - kManBits): exact (m has at most 10 bits).
    const float unit = 1.0f / static_cast<float>(1ull << (kBias - 1 + kManBits));
    return floatOf(bitsOf(static_cast<float>(m) * unit) | sign);
  }
  return floatOf(sign | ((e - kBias + 127) << 23) | (m << (23 - kManBits)));
}

inline uint16_t halfFromFloat(float f) {
  return static_cast<uint16_t>(encodeNarrow<5, 10, true>(f));
}
inline float floatFromHalf(uint16_t h) { return decodeNarrow<5, 10, true>(h); }

inline uint16_t bf16FromFloat(float f) {
  const uint32_t u = bitsOf(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) {  // NaN: keep the top payload bits
    uint32_t top = u >> 16;
    if ((top & 0x7fu) == 0) top |= 0x40u;
    return static_cast<uint16_t>(top);
  }
  // Round to nearest even on the low half; a carry walks into the exponent and
  // turns the largest values into inf, as it should.
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
inline float floatFromBf16(uint16_t b) { return floatOf(static_cast<uint32_t>(b) << 16); }

inline uint8_t e4m3FromFloat(float f) { return static_cast<uint8_t>(encodeNarrow<4, 3, false>(f)); }
inline float floatFromE4m3(uint8_t v) { return decodeNarrow<4, 3, false>(v); }

inline uint8_t e5m2FromFloat(float f) { return static_cast<uint8_t>(encodeNarrow<5, 2, true>(f)); }
inline float floatFromE5m2(uint8_t v) { return decodeNarrow<5, 2, true>(v); }

}  // namespace xpu_emu
