// backends/cpu/float_formats.h against an independent reference: a decoder
// built from the bit fields with ldexp, and an encoder that searches the sorted
// list of representable values with exact double arithmetic.
#include <gtest/gtest.h>

#include "backends/cpu/float_formats.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace tutti::cpu {
namespace {

struct Format {
  const char* name;
  int expBits;
  int manBits;
  bool ieee;  // all-ones exponent = inf/NaN; otherwise only all-ones bits = NaN, saturate
  uint32_t (*encode)(float);
  float (*decode)(uint32_t);
};

const Format kFormats[] = {
    {"float16", 5, 10, true, [](float f) -> uint32_t { return floatToHalf(f); },
     [](uint32_t v) { return halfToFloat(static_cast<uint16_t>(v)); }},
    {"bfloat16", 8, 7, true, [](float f) -> uint32_t { return floatToBf16(f); },
     [](uint32_t v) { return bf16ToFloat(static_cast<uint16_t>(v)); }},
    {"e4m3", 4, 3, false, [](float f) -> uint32_t { return floatToFp8E4M3(f); },
     [](uint32_t v) { return fp8E4M3ToFloat(static_cast<uint8_t>(v)); }},
    {"e5m2", 5, 2, true, [](float f) -> uint32_t { return floatToFp8E5M2(f); },
     [](uint32_t v) { return fp8E5M2ToFloat(static_cast<uint8_t>(v)); }},
};

int bitsOf(const Format& f) { return 1 + f.expBits + f.manBits; }
int biasOf(const Format& f) { return (1 << (f.expBits - 1)) - 1; }

float fromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint32_t toBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Reference decoder: fields -> value with ldexp.
double refDecode(const Format& f, uint32_t v) {
  const int sign = (v >> (f.expBits + f.manBits)) & 1;
  const int e = (v >> f.manBits) & ((1 << f.expBits) - 1);
  const int m = v & ((1 << f.manBits) - 1);
  const int eMax = (1 << f.expBits) - 1;
  double mag;
  if (f.ieee && e == eMax) {
    mag =
        m != 0 ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  } else if (!f.ieee && e == eMax && m == (1 << f.manBits) - 1) {
    mag = std::numeric_limits<double>::quiet_NaN();
  } else if (e == 0) {
    mag = std::ldexp(m, 1 - biasOf(f) - f.manBits);
  } else {
    mag = std::ldexp(m + (1 << f.manBits), e - biasOf(f) - f.manBits);
  }
  return sign ? -mag : mag;
}

// Reference encoder: nearest representable by exact comparison, ties to the
// even encoding; overflow by the spec's rule (inf, or saturation for e4m3).
class RefEncoder {
 public:
  explicit RefEncoder(const Format& f) : f_(f) {
    for (uint32_t v = 0; v < (1u << (bitsOf(f) - 1)); ++v) {
      const double d = refDecode(f, v);
      if (std::isfinite(d)) values_.push_back({d, v});
    }
    std::sort(values_.begin(), values_.end());
    maxFinite_ = values_.back().first;
    maxBits_ = values_.back().second;
    // Spacing of the top binade: the next value up would be maxFinite + ulp.
    const int eTop = static_cast<int>(maxBits_ >> f.manBits) - biasOf(f);
    topUlp_ = std::ldexp(1.0, eTop - f.manBits);
  }

  // Returns the encoding; NaN input returns a NaN-marker (caller checks).
  uint32_t encode(float x) const {
    const uint32_t signBit = (toBits(x) >> 31) << (bitsOf(f_) - 1);
    const double v = std::fabs(static_cast<double>(x));
    const uint32_t infBits = ((1u << f_.expBits) - 1) << f_.manBits;
    if (std::isnan(v)) return signBit | infBits | ((1u << f_.manBits) - 1);
    if (v > maxFinite_) {
      if (!f_.ieee) return signBit | maxBits_;
      return signBit | (v >= maxFinite_ + topUlp_ / 2 ? infBits : maxBits_);
    }
    auto it = std::lower_bound(values_.begin(), values_.end(), std::make_pair(v, 0u));
    if (it->first == v) return signBit | it->second;
    const auto lo = *(it - 1);
    const auto hi = *it;
    const double dLo = v - lo.first;  // exact: both are short binary fractions
    const double dHi = hi.first - v;
    if (dLo < dHi) return signBit | lo.second;
    if (dHi < dLo) return signBit | hi.second;
    return signBit | ((lo.second & 1) == 0 ? lo.second : hi.second);
  }

 private:
  const Format& f_;
  std::vector<std::pair<double, uint32_t>> values_;
  double maxFinite_ = 0;
  uint32_t maxBits_ = 0;
  double topUlp_ = 0;
};

bool isNanBits(const Format& f, uint32_t v) { return std::isnan(refDecode(f, v)); }

class FloatFormatTest : public ::testing::TestWithParam<int> {
 protected:
  const Format& fmt() const { return kFormats[GetParam()]; }
};

TEST_P(FloatFormatTest, DecodeAllEncodingsMatchesReference) {
  const Format& f = fmt();
  const uint32_t n = 1u << bitsOf(f);
  for (uint32_t v = 0; v < n; ++v) {
    const double ref = refDecode(f, v);
    const float got = f.decode(v);
    const bool negative = (v >> (bitsOf(f) - 1)) & 1;
    ASSERT_EQ(std::signbit(got), negative) << f.name << " bits 0x" << std::hex << v;
    if (std::isnan(ref)) {
      ASSERT_TRUE(std::isnan(got)) << f.name << " bits 0x" << std::hex << v;
    } else {
      ASSERT_EQ(static_cast<double>(got), ref) << f.name << " bits 0x" << std::hex << v;
    }
  }
}

// Decode then encode returns the same bits for all encodings, NaNs included:
// binary16/bf16/e5m2 keep NaN payloads, e4m3 has a single NaN per sign.
TEST_P(FloatFormatTest, RoundTripAllEncodings) {
  const Format& f = fmt();
  const uint32_t n = 1u << bitsOf(f);
  int nans = 0;
  for (uint32_t v = 0; v < n; ++v) {
    nans += isNanBits(f, v);
    ASSERT_EQ(f.encode(f.decode(v)), v) << f.name << " bits 0x" << std::hex << v;
  }
  EXPECT_GT(nans, 0);
}

void expectEncodes(const Format& f, const RefEncoder& ref, float x) {
  const uint32_t got = f.encode(x);
  const uint32_t want = ref.encode(x);
  if (isNanBits(f, want)) {
    EXPECT_TRUE(isNanBits(f, got)) << f.name << " x=" << x;
    EXPECT_EQ(got >> (bitsOf(f) - 1), want >> (bitsOf(f) - 1)) << f.name << " NaN sign";
  } else {
    EXPECT_EQ(got, want) << f.name << " x=" << x << " (bits 0x" << std::hex << toBits(x) << ")";
  }
}

TEST_P(FloatFormatTest, EncodeEdgeCases) {
  const Format& f = fmt();
  const RefEncoder ref(f);
  const int bias = biasOf(f);
  const double minSub = std::ldexp(1.0, 1 - bias - f.manBits);
  const double minNormal = std::ldexp(1.0, 1 - bias);
  double maxFinite = 0;
  for (uint32_t v = 0; v < (1u << (bitsOf(f) - 1)); ++v) {
    const double d = refDecode(f, v);
    if (std::isfinite(d)) maxFinite = std::max(maxFinite, d);
  }
  const double ulp1 = std::ldexp(1.0, -f.manBits);
  const double topUlp = std::ldexp(1.0, std::ilogb(maxFinite) - f.manBits);
  std::vector<double> cases = {0.0,
                               1.0,
                               1.0 + ulp1 / 2,
                               1.0 + 3 * ulp1 / 2,
                               1.0 + ulp1 / 4,
                               1.0 + 3 * ulp1 / 4,
                               minSub,
                               minSub / 2,
                               minSub * 3 / 4,
                               minSub / 4,
                               minSub * 3 / 2,
                               minSub * 5 / 2,
                               minNormal,
                               minNormal - minSub,
                               minNormal - minSub / 2,
                               minNormal - minSub / 4,
                               maxFinite,
                               maxFinite + topUlp / 4,
                               maxFinite + topUlp / 2,
                               maxFinite + topUlp,
                               maxFinite * 4,
                               1e30,
                               3.4028234663852886e38,
                               std::ldexp(1.0, -149),
                               std::ldexp(1.0, -126),
                               std::numeric_limits<double>::infinity()};
  for (double c : cases) {
    const float x = static_cast<float>(c);
    if (static_cast<double>(x) != c) continue;  // e.g. bf16's max * 4 is beyond fp32
    expectEncodes(f, ref, x);
    expectEncodes(f, ref, -x);
  }
  for (uint32_t nanBits : {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0x7fbfffffu, 0xffffffffu}) {
    const uint32_t got = f.encode(fromBits(nanBits));
    EXPECT_TRUE(isNanBits(f, got)) << f.name << " NaN 0x" << std::hex << nanBits;
    EXPECT_EQ(got >> (bitsOf(f) - 1), nanBits >> 31);
  }
}

TEST(FloatFormatsFixed, KnownBitPatterns) {
  EXPECT_EQ(floatToHalf(65504.0f), 0x7bff);
  EXPECT_EQ(floatToHalf(65519.0f), 0x7bff);
  EXPECT_EQ(floatToHalf(65520.0f), 0x7c00);  // tie to even overflows
  EXPECT_EQ(floatToHalf(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(floatToHalf(std::ldexp(1.0f, -25)), 0x0000);
  EXPECT_EQ(floatToHalf(std::ldexp(3.0f, -26)), 0x0001);
  EXPECT_EQ(floatToHalf(std::ldexp(3.0f, -25)), 0x0002);  // 1.5 ulp: tie to even
  EXPECT_EQ(floatToHalf(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  EXPECT_EQ(floatToHalf(1.0f + std::ldexp(3.0f, -11)), 0x3c02);
  EXPECT_EQ(floatToHalf(-0.0f), 0x8000);
  EXPECT_EQ(floatToBf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  EXPECT_EQ(floatToBf16(1.0f + std::ldexp(3.0f, -8)), 0x3f82);
  EXPECT_EQ(floatToBf16(std::numeric_limits<float>::max()), 0x7f80);
  EXPECT_EQ(floatToBf16(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(floatToFp8E4M3(448.0f), 0x7e);
  EXPECT_EQ(floatToFp8E4M3(464.0f), 0x7e);
  EXPECT_EQ(floatToFp8E4M3(1e9f), 0x7e);
  EXPECT_EQ(floatToFp8E4M3(-1e9f), 0xfe);
  EXPECT_EQ(floatToFp8E4M3(std::numeric_limits<float>::infinity()), 0x7e);
  EXPECT_EQ(floatToFp8E4M3(-std::numeric_limits<float>::infinity()), 0xfe);
  EXPECT_EQ(floatToFp8E4M3(std::nanf("")), 0x7f);
  EXPECT_EQ(floatToFp8E4M3(std::ldexp(1.0f, -9)), 0x01);
  EXPECT_EQ(floatToFp8E4M3(std::ldexp(1.0f, -10)), 0x00);
  EXPECT_EQ(fp8E4M3ToFloat(0x7e), 448.0f);
  EXPECT_TRUE(std::isnan(fp8E4M3ToFloat(0xff)));
  EXPECT_EQ(floatToFp8E5M2(57344.0f), 0x7b);
  EXPECT_EQ(floatToFp8E5M2(61439.0f), 0x7b);
  EXPECT_EQ(floatToFp8E5M2(61440.0f), 0x7c);
  EXPECT_EQ(floatToFp8E5M2(std::ldexp(1.0f, -16)), 0x01);
  EXPECT_TRUE(std::isinf(fp8E5M2ToFloat(0xfc)));
  // NaN payload rules.
  EXPECT_EQ(floatToHalf(fromBits(0x7f802000u)), 0x7c01);  // signalling payload kept
  EXPECT_EQ(floatToHalf(fromBits(0x7f800001u)), 0x7e00);  // payload lost -> quiet NaN
  EXPECT_EQ(floatToBf16(fromBits(0xff800001u)), 0xffc0);
}

// 1e6 values per format: random fp32 bit patterns, values spread over the
// format's exponent range (normal, subnormal, overflow), and exact midpoints.
TEST_P(FloatFormatTest, EncodeRandomMatchesReference) {
  const Format& f = fmt();
  const RefEncoder ref(f);
  std::mt19937_64 rng(0x777u + GetParam());
  const int bias = biasOf(f);
  const int eLo = 1 - bias - f.manBits - 3;
  const int eHi = (1 << f.expBits) - 1 - bias + 2;
  std::vector<double> finite;
  for (uint32_t v = 0; v < (1u << bitsOf(f)); ++v) {
    const double d = refDecode(f, v);
    if (std::isfinite(d)) finite.push_back(d);
  }
  std::sort(finite.begin(), finite.end());
  constexpr int kSamples = 1000000;
  int failures = 0;
  for (int i = 0; i < kSamples && failures < 20; ++i) {
    float x;
    const int kind = static_cast<int>(rng() % 8);
    if (kind == 0) {
      x = fromBits(static_cast<uint32_t>(rng()));
    } else if (kind == 1) {
      const size_t k = rng() % (finite.size() - 1);
      x = static_cast<float>((finite[k] + finite[k + 1]) / 2);  // exact midpoint in fp32
    } else {
      const int e = eLo + static_cast<int>(rng() % (eHi - eLo + 1));
      const uint32_t mant = static_cast<uint32_t>(rng()) & 0x7fffffu;
      const uint32_t sign = static_cast<uint32_t>(rng() & 1) << 31;
      x = fromBits(sign | (static_cast<uint32_t>(e + 127) << 23) | mant);
    }
    const uint32_t got = f.encode(x);
    const uint32_t want = ref.encode(x);
    const bool ok = isNanBits(f, want) ? isNanBits(f, got) : got == want;
    if (!ok) {
      ++failures;
      ADD_FAILURE() << f.name << ": x=" << x << " (0x" << std::hex << toBits(x) << ") got 0x" << got
                    << " want 0x" << want;
    }
  }
  EXPECT_EQ(failures, 0);
}

#if defined(__x86_64__)
__attribute__((target("f16c"))) uint16_t hwHalf(float x) {
  return static_cast<uint16_t>(_cvtss_sh(x, 0));
}

// A third opinion for binary16: the F16C instruction, on 2^24 strided floats.
TEST(FloatFormatsHardware, HalfMatchesF16cInstruction) {
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("f16c")) GTEST_SKIP() << "CPU has no F16C";
  for (uint64_t u = 0; u < (1ull << 32); u += 251) {
    const float x = fromBits(static_cast<uint32_t>(u));
    if (std::isnan(x)) continue;  // F16C quiets signalling NaNs; we keep payloads
    ASSERT_EQ(floatToHalf(x), hwHalf(x)) << "x=" << x << " 0x" << std::hex << u;
  }
}
#endif

INSTANTIATE_TEST_SUITE_P(Formats, FloatFormatTest, ::testing::Range(0, 4),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return std::string(kFormats[info.param].name);
                         });

}  // namespace
}  // namespace tutti::cpu
