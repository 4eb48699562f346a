#include "backends/cpu/float_formats.h"

#include <array>

#include "backends/cpu/float_formats_inl.h"

namespace tutti::cpu {

namespace detail {
namespace {

template <int kExp, int kMan, bool kIeee>
std::array<float, 256> makeTable() {
  std::array<float, 256> t{};
  for (uint32_t v = 0; v < 256; ++v) t[v] = decodeMinifloat<kExp, kMan, kIeee>(v);
  return t;
}

}  // namespace

// Function-local statics: safe to use from other translation units' static
// initialisers.
const float* fp8E4M3Table() {
  static const std::array<float, 256> table = makeTable<4, 3, false>();
  return table.data();
}
const float* fp8E5M2Table() {
  static const std::array<float, 256> table = makeTable<5, 2, true>();
  return table.data();
}

}  // namespace detail

uint16_t floatToHalf(float f) { return detail::floatToHalfBits(f); }
float halfToFloat(uint16_t h) { return detail::halfBitsToFloat(h); }
uint16_t floatToBf16(float f) { return detail::floatToBf16Bits(f); }
float bf16ToFloat(uint16_t b) { return detail::bf16BitsToFloat(b); }
uint8_t floatToFp8E4M3(float f) { return detail::floatToE4M3Bits(f); }
float fp8E4M3ToFloat(uint8_t v) { return detail::decodeMinifloat<4, 3, false>(v); }
uint8_t floatToFp8E5M2(float f) { return detail::floatToE5M2Bits(f); }
float fp8E5M2ToFloat(uint8_t v) { return detail::decodeMinifloat<5, 2, true>(v); }

}  // namespace tutti::cpu
