// Scalar conversions between fp32 and the narrow floating formats tutti moves
// over the wire and reduces: IEEE binary16, bfloat16, OCP FP8 E4M3 and E5M2.
//
// Contract:
// - Encoders (float -> narrow) round to nearest, ties to even, with gradual
//   underflow (subnormals of the target are produced, never flushed).
// - Overflow: binary16, bfloat16 and E5M2 return +-inf; E4M3 ("fn" variant, no
//   infinities) SATURATES: every finite value that rounds beyond 448 and +-inf
//   itself become +-448 (0x7e / 0xfe), like CUDA's __NV_SATFINITE mode.
// - NaN stays NaN with its sign. binary16/bfloat16/E5M2 keep the leading
//   payload bits that fit (no quieting), so decode-then-encode returns the same
//   bits for every one of the 65536 / 256 encodings; a payload that would
//   truncate to zero becomes the quiet NaN. E4M3 has one NaN per sign (0x7f,
//   0xff); every float NaN maps there.
// - Decoders (narrow -> float) are exact (every narrow value is an fp32 value);
//   NaN payloads are carried into the top mantissa bits of the float.
// - Pure functions: thread-safe, no allocation, no global state.
#pragma once

#include <cstdint>

namespace tutti::cpu {

// IEEE 754 binary16 (1/5/10, bias 15). Overflow -> inf.
uint16_t floatToHalf(float f);
float halfToFloat(uint16_t h);

// bfloat16 (1/8/7, the top half of an fp32). Overflow -> inf.
uint16_t floatToBf16(float f);
float bf16ToFloat(uint16_t b);

// OCP 8-bit E4M3 "fn" (1/4/3, bias 7): no inf, max finite 448, NaN = 0x7f/0xff.
// Overflow (and +-inf) saturates to +-448.
uint8_t floatToFp8E4M3(float f);
float fp8E4M3ToFloat(uint8_t v);

// OCP 8-bit E5M2 (1/5/2, bias 15): IEEE-like, inf = 0x7c, NaN = 0x7d..0x7f.
// Overflow -> inf; max finite 57344.
uint8_t floatToFp8E5M2(float f);
float fp8E5M2ToFloat(uint8_t v);

}  // namespace tutti::cpu
