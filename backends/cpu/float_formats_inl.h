// Internal to backends/cpu: the bit-level conversion routines behind
// float_formats.h, as header-only functions with internal linkage so each
// kernel translation unit (compiled for its own instruction set) inlines its
// own copy. Same contract as float_formats.h.
#pragma once

#include <cstdint>
#include <cstring>

namespace tutti::cpu::detail {

static inline uint32_t floatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

static inline float bitsToFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Generic RNE encoder fp32 -> 1/kExp/kMan minifloat. kIeee: the all-ones
// exponent encodes inf/NaN (binary16, E5M2); otherwise (E4M3fn) only the
// all-ones pattern is NaN and overflow saturates to the largest finite value.
template <int kExp, int kMan, bool kIeee>
static inline uint32_t encodeMinifloat(float f) {
  constexpr int kBias = (1 << (kExp - 1)) - 1;
  constexpr int kEmin = 1 - kBias;  // unbiased exponent of the smallest normal
  constexpr uint32_t kManMask = (1u << kMan) - 1;
  constexpr uint32_t kExpOnes = ((1u << kExp) - 1) << kMan;
  constexpr uint32_t kMaxFinite = kIeee ? kExpOnes - 1 : (kExpOnes | kManMask) - 1;
  constexpr uint32_t kNanAll = kExpOnes | kManMask;
  const uint32_t x = floatBits(f);
  const uint32_t sign = (x >> 31) << (kExp + kMan);
  const uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) {  // NaN: keep the leading payload bits
    if (!kIeee) return sign | kNanAll;
    uint32_t payload = (ax >> (23 - kMan)) & kManMask;
    if (payload == 0) payload = 1u << (kMan - 1);
    return sign | kExpOnes | payload;
  }
  if (ax == 0x7f800000u) return sign | (kIeee ? kExpOnes : kMaxFinite);
  const int e = static_cast<int>(ax >> 23) - 127;
  uint32_t r;
  if (e >= kEmin) {
    constexpr int kShift = 23 - kMan;
    const uint32_t mant = ax & 0x7fffffu;
    r = (static_cast<uint32_t>(e + kBias) << kMan) | (mant >> kShift);
    const uint32_t rem = mant & ((1u << kShift) - 1);
    constexpr uint32_t kHalf = 1u << (kShift - 1);
    if (rem > kHalf || (rem == kHalf && (r & 1))) ++r;  // a carry walks into the exponent
  } else {
    // Subnormal target: value = m * 2^(e-23), unit of the result = 2^(kEmin-kMan).
    const int shift = 23 - kMan + kEmin - e;
    if (shift > 24) return sign;  // below half the smallest subnormal (float subnormals too)
    const uint32_t m = (ax & 0x7fffffu) | 0x800000u;
    r = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1))) ++r;  // may become the smallest normal
  }
  if (r > kMaxFinite) r = kIeee ? kExpOnes : kMaxFinite;
  return sign | r;
}

// Generic exact decoder 1/kExp/kMan minifloat -> fp32 (kExp <= 8).
template <int kExp, int kMan, bool kIeee>
static inline float decodeMinifloat(uint32_t v) {
  constexpr int kBias = (1 << (kExp - 1)) - 1;
  constexpr uint32_t kManMask = (1u << kMan) - 1;
  constexpr uint32_t kExpMax = (1u << kExp) - 1;
  const uint32_t sign = ((v >> (kExp + kMan)) & 1u) << 31;
  const uint32_t ex = (v >> kMan) & kExpMax;
  const uint32_t man = v & kManMask;
  if (ex == kExpMax && (kIeee || man == kManMask)) {
    if (!kIeee) return bitsToFloat(sign | 0x7fc00000u);
    return bitsToFloat(sign | 0x7f800000u | (man << (23 - kMan)));
  }
  if (ex == 0) {
    // Subnormal: man * 2^(1-bias-kMan); exact in fp32 for every format here.
    constexpr float kUnit = 1.0f / static_cast<float>(1ull << (kBias - 1 + kMan));
    const float mag = static_cast<float>(man) * kUnit;
    return bitsToFloat(floatBits(mag) | sign);
  }
  return bitsToFloat(sign | ((ex - kBias + 127) << 23) | (man << (23 - kMan)));
}

static inline uint16_t floatToHalfBits(float f) {
  return static_cast<uint16_t>(encodeMinifloat<5, 10, true>(f));
}
static inline float halfBitsToFloat(uint16_t h) { return decodeMinifloat<5, 10, true>(h); }

// bfloat16: RNE on the low 16 bits; overflow carries into inf naturally.
static inline uint16_t floatToBf16Bits(float f) {
  const uint32_t x = floatBits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) {
    uint32_t r = x >> 16;
    if ((r & 0x7f) == 0) r |= 0x40;  // payload would vanish: make it the quiet NaN
    return static_cast<uint16_t>(r);
  }
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}
static inline float bf16BitsToFloat(uint16_t b) {
  return bitsToFloat(static_cast<uint32_t>(b) << 16);
}

static inline uint8_t floatToE4M3Bits(float f) {
  return static_cast<uint8_t>(encodeMinifloat<4, 3, false>(f));
}
static inline uint8_t floatToE5M2Bits(float f) {
  return static_cast<uint8_t>(encodeMinifloat<5, 2, true>(f));
}

// 256-entry decode tables (defined in float_formats.cc, built once).
const float* fp8E4M3Table();
const float* fp8E5M2Table();

}  // namespace tutti::cpu::detail
