// backends/cpu/codec_kernels.h on every instruction-set variant: wire sizes,
// encode/decode against float_formats.h (itself tested against an independent
// reference), error feedback, idempotence, the composite calls against their
// compositions, sizes and alignments, special values, and bit-identical
// results across variants.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backends/cpu/codec_kernels.h"
#include "backends/cpu/float_formats.h"
#include "backends/cpu/kernel_dispatch.h"

namespace tutti::cpu {
namespace {

constexpr WireFormat kFormats[] = {WireFormat::kHalf, WireFormat::kBf16, WireFormat::kSign};
constexpr size_t kSizes[] = {0, 1, 7, 511, 512, 513, 1000, 4099};
constexpr float kInf = std::numeric_limits<float>::infinity();

const char* formatName(WireFormat f) {
  switch (f) {
    case WireFormat::kHalf:
      return "half";
    case WireFormat::kBf16:
      return "bf16";
    case WireFormat::kSign:
      return "sign";
  }
  return "?";
}

uint32_t bitsOf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
float fromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
bool sameBits(float a, float b) { return bitsOf(a) == bitsOf(b); }

// Products and sums through volatile, so the test's own reference arithmetic is
// rounded once per operation whatever the compiler's contraction settings.
float mul(float a, float b) {
  volatile float r = a * b;
  return r;
}
float add(float a, float b) {
  volatile float r = a + b;
  return r;
}
float sub(float a, float b) {
  volatile float r = a - b;
  return r;
}

// Distance to the next float away from zero: an upper bound for the ulp of any
// value that rounds to x.
double ulpUp(float x) {
  const float a = std::fabs(x);
  return static_cast<double>(std::nextafter(a, kInf)) - a;
}

// Reference conversions (float_formats.h).
uint16_t narrowRef(WireFormat f, float x) {
  return f == WireFormat::kHalf ? floatToHalf(x) : floatToBf16(x);
}
float widenRef(WireFormat f, uint16_t w) {
  return f == WireFormat::kHalf ? halfToFloat(w) : bf16ToFloat(w);
}

// Random floats: random sign, binade uniform in [lo, hi), uniform mantissa;
// with zeros of both signs sprinkled in when `zeros`.
std::vector<float> randomValues(size_t n, uint64_t seed, int lo, int hi, bool zeros = true) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> binade(lo, hi - 1);
  std::uniform_real_distribution<float> mant(1.0f, 2.0f);
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    const uint64_t r = rng();
    if (zeros && r % 61 == 0) {
      v[i] = (r & 64) ? -0.0f : 0.0f;
      continue;
    }
    const float x = std::ldexp(mant(rng), binade(rng));
    v[i] = (r & 1) ? -x : x;
  }
  return v;
}

// n floats placed `off` floats into a buffer framed by guard words, so tests
// can pass unaligned pointers and check that nothing outside was written.
class Floats {
 public:
  static constexpr size_t kGuard = 8;
  static constexpr uint32_t kGuardBits = 0x7fa5a5a5u;

  Floats(size_t n, size_t off) : n_(n), off_(off), store_(n + off + 2 * kGuard) {
    for (float& x : store_) x = fromBits(kGuardBits);
  }
  Floats(const std::vector<float>& v, size_t off) : Floats(v.size(), off) { assign(v); }

  void assign(const std::vector<float>& v) {
    if (!v.empty()) std::memcpy(data(), v.data(), v.size() * sizeof(float));
  }
  float* data() { return store_.data() + kGuard + off_; }
  const float* data() const { return store_.data() + kGuard + off_; }
  float operator[](size_t i) const { return data()[i]; }
  std::vector<float> values() const { return std::vector<float>(data(), data() + n_); }
  bool guardsIntact() const {
    for (size_t i = 0; i < store_.size(); ++i) {
      const bool inside = i >= kGuard + off_ && i < kGuard + off_ + n_;
      if (!inside && bitsOf(store_[i]) != kGuardBits) return false;
    }
    return true;
  }

 private:
  size_t n_;
  size_t off_;
  std::vector<float> store_;
};

// wireBytes(f, n) bytes placed `off` bytes into a guarded buffer.
class Wire {
 public:
  static constexpr size_t kGuard = 16;
  Wire(WireFormat f, size_t n, size_t off)
      : size_(wireBytes(f, n)), off_(off), store_(size_ + off + 2 * kGuard, 0xa5) {}

  uint8_t* data() { return store_.data() + kGuard + off_; }
  const uint8_t* data() const { return store_.data() + kGuard + off_; }
  size_t size() const { return size_; }
  std::vector<uint8_t> bytes() const { return std::vector<uint8_t>(data(), data() + size_); }
  uint16_t word(size_t i) const {
    uint16_t w;
    std::memcpy(&w, data() + 2 * i, sizeof w);
    return w;
  }
  // kSign: the scale of block b and the sign bit of element i.
  float signScale(size_t b) const {
    float s;
    std::memcpy(&s, data() + b * (4 + kSignBlock / 8), sizeof s);
    return s;
  }
  bool signBit(size_t i) const {
    const size_t b = i / kSignBlock, j = i % kSignBlock;
    return (data()[b * (4 + kSignBlock / 8) + 4 + j / 8] >> (j % 8)) & 1;
  }
  bool guardsIntact() const {
    for (size_t i = 0; i < store_.size(); ++i) {
      const bool inside = i >= kGuard + off_ && i < kGuard + off_ + size_;
      if (!inside && store_[i] != 0xa5) return false;
    }
    return true;
  }

 private:
  size_t size_;
  size_t off_;
  std::vector<uint8_t> store_;
};

TEST(CpuCodecWire, WireBytes) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{512}, size_t{4099}}) {
    EXPECT_EQ(wireBytes(WireFormat::kHalf, n), 2 * n);
    EXPECT_EQ(wireBytes(WireFormat::kBf16, n), 2 * n);
  }
  // Full blocks are 4 + 64 bytes; the last block 4 + ceil(len / 8).
  const std::pair<size_t, size_t> sign[] = {{0, 0},      {1, 5},      {7, 5},     {8, 5},
                                            {9, 6},      {511, 68},   {512, 68},  {513, 73},
                                            {1000, 133}, {1024, 136}, {4099, 549}};
  for (const auto& [n, bytes] : sign) EXPECT_EQ(wireBytes(WireFormat::kSign, n), bytes) << n;
  EXPECT_EQ(wireBytes(static_cast<WireFormat>(0), 10), 0u);
}

TEST(CpuCodecWire, CountZeroTouchesNothing) {
  for (WireFormat f : kFormats) {
    EXPECT_EQ(maxAbs(nullptr, 0), 0.0f);
    encode(f, 3, nullptr, nullptr, 0, nullptr);
    decode(f, 3, nullptr, 0, nullptr);
    decodeAdd(f, 3, nullptr, 0, nullptr, 2.0f, nullptr);
    quantize(f, 3, nullptr, 2.0f, nullptr, 0, nullptr);
  }
}

// ---- properties, on each instruction-set variant -----------------------------------

class CpuCodecTest : public ::testing::TestWithParam<KernelIsa> {
 protected:
  void SetUp() override {
    if (!isaSupported(GetParam())) GTEST_SKIP() << isaName(GetParam()) << " not supported";
    ASSERT_TRUE(setActiveIsa(GetParam()));
  }
  std::string where(WireFormat f, size_t n, size_t off) const {
    return std::string(formatName(f)) + " [" + isaName(GetParam()) + "] n=" + std::to_string(n) +
           " offset=" + std::to_string(off);
  }
};

// kHalf / kBf16: values that are narrow values times 2^-exp travel exactly.
TEST_P(CpuCodecTest, NarrowRoundTripIsExactOnRepresentableValues) {
  std::mt19937 rng(7);
  for (WireFormat f : {WireFormat::kHalf, WireFormat::kBf16}) {
    for (int exp : {0, 9, -9, 100, -100}) {
      for (size_t n : kSizes) {
        for (size_t off : {0, 1}) {
          // Finite wire words; bf16 limited to binades [-20, 20] so that
          // w * 2^-exp stays inside the fp32 range.
          std::vector<uint16_t> words(n);
          std::vector<float> vals(n);
          for (size_t i = 0; i < n; ++i) {
            uint16_t w;
            do {
              w = static_cast<uint16_t>(rng());
              if (f == WireFormat::kBf16) w = (w & 0x807f) | ((107 + rng() % 41) << 7);
            } while (!std::isfinite(widenRef(f, w)));
            words[i] = w;
            vals[i] = std::ldexp(widenRef(f, w), -exp);
          }
          const Floats src(vals, off);
          Wire wire(f, n, off);
          encode(f, exp, src.data(), nullptr, n, wire.data());
          Floats dst(n, 1 - off);
          decode(f, exp, wire.data(), n, dst.data());
          ASSERT_TRUE(wire.guardsIntact() && dst.guardsIntact()) << where(f, n, off);
          for (size_t i = 0; i < n; ++i) {
            ASSERT_EQ(wire.word(i), words[i]) << where(f, n, off) << " exp=" << exp << " i=" << i;
            ASSERT_TRUE(sameBits(dst[i], vals[i])) << where(f, n, off) << " i=" << i;
          }
        }
      }
    }
  }
}

// Encode with error feedback against float_formats.h, and the exactness of the
// feedback. kHalf / kBf16: d = narrow-rounded c, so d and c agree in sign and
// d/2 <= c <= 2d (or d == 0, then err = c): c - d is exact (Sterbenz), hence
// d + err == c in exact (fp64) arithmetic. kSign: err = fl(c - d) is a correct
// rounding, so |err - (c - d)| <= ulp(err) / 2, where c - d is exact in fp64
// because the data keep |c| >= 2^-9 and |d| < 2^9 (exponents within 29).
TEST_P(CpuCodecTest, EncodeWithErrorFeedback) {
  for (WireFormat f : kFormats) {
    const int exp = f == WireFormat::kHalf ? 5 : 0;
    const float up = std::ldexp(1.0f, exp), down = std::ldexp(1.0f, -exp);
    for (size_t n : kSizes) {
      for (size_t off : {0, 1}) {
        const std::vector<float> s = randomValues(n, 11 + n, -8, 8, false);
        const std::vector<float> e0 = randomValues(n, 12 + n, -20, -10);
        const Floats src(s, off);
        Floats err(e0, 1 - off);
        Wire wire(f, n, off);
        encode(f, exp, src.data(), err.data(), n, wire.data());
        Floats dec(n, off);
        decode(f, exp, wire.data(), n, dec.data());
        ASSERT_TRUE(wire.guardsIntact() && err.guardsIntact()) << where(f, n, off);
        for (size_t i = 0; i < n; ++i) {
          const float c = add(s[i], e0[i]);
          const float d = dec[i];
          SCOPED_TRACE(where(f, n, off) + " i=" + std::to_string(i));
          ASSERT_TRUE(sameBits(src[i], s[i])) << "src modified";
          if (f == WireFormat::kSign) {
            ASSERT_EQ(wire.signBit(i), c < 0.0f);
            ASSERT_TRUE(sameBits(
                d, c < 0.0f ? -wire.signScale(i / kSignBlock) : wire.signScale(i / kSignBlock)));
            const double exact = static_cast<double>(c) - d;
            ASSERT_LE(std::fabs(exact - err[i]), ulpUp(err[i]) / 2);
          } else {
            const uint16_t w = narrowRef(f, mul(c, up));
            ASSERT_EQ(wire.word(i), w);
            ASSERT_TRUE(sameBits(d, mul(widenRef(f, w), down)));
            ASSERT_TRUE(sameBits(err[i], sub(c, d)));
            ASSERT_EQ(static_cast<double>(d) + err[i], static_cast<double>(c));
          }
        }
        if (f == WireFormat::kSign) {
          // scale = mean |c| in double rounded to float: within one ulp of a
          // long double mean (the order of the double sum is the codec's own).
          for (size_t b = 0; b * kSignBlock < n; ++b) {
            const size_t len = std::min(kSignBlock, n - b * kSignBlock);
            long double sum = 0;
            for (size_t i = b * kSignBlock; i < b * kSignBlock + len; ++i)
              sum += std::fabs(add(s[i], e0[i]));
            const float scale = wire.signScale(b);
            EXPECT_LE(std::fabs(static_cast<double>(sum / len) - scale), ulpUp(scale))
                << where(f, n, off) << " block " << b;
          }
        }
      }
    }
  }
}

// Over many steps with error feedback, what was decoded plus what is still in
// err equals what was fed in. Per element and step, c_k = fl(src_k + err_{k-1})
// = src_k + err_{k-1} + a_k with |a_k| <= ulp(c_k)/2, and d_k + err_k = c_k + b_k
// with b_k = 0 (kHalf / kBf16, see above) or |b_k| <= ulp(err_k)/2 (kSign).
// Summing, sum d_k + err_K = sum src_k + sum (a_k + b_k): the tolerance is the
// sum of those bounds, plus the fp64 rounding of the test's own sums (each of
// the K additions errs by at most 2^-53 of the running sum's magnitude).
TEST_P(CpuCodecTest, ErrorFeedbackTelescopes) {
  constexpr int kSteps = 100;
  constexpr size_t n = 1000;  // one full kSign block and a partial one
  for (WireFormat f : kFormats) {
    const int exp = f == WireFormat::kHalf ? 10 : 0;
    std::vector<double> sumSrc(n), sumDec(n), bound(n), mag(n);
    Floats err(std::vector<float>(n, 0.0f), 1);
    Wire wire(f, n, 1);
    Floats dec(n, 0);
    for (int k = 0; k < kSteps; ++k) {
      const std::vector<float> s = randomValues(n, 100 + k, -4, 4);
      const std::vector<float> errOld = err.values();
      encode(f, exp, s.data(), err.data(), n, wire.data());
      decode(f, exp, wire.data(), n, dec.data());
      for (size_t i = 0; i < n; ++i) {
        sumSrc[i] += s[i];
        sumDec[i] += dec[i];
        mag[i] += std::fabs(s[i]) + std::fabs(dec[i]);
        bound[i] += ulpUp(add(s[i], errOld[i])) / 2;
        if (f == WireFormat::kSign) bound[i] += ulpUp(err[i]) / 2;
      }
    }
    double worst = 0;
    for (size_t i = 0; i < n; ++i) {
      const double drift = std::fabs(sumDec[i] + err[i] - sumSrc[i]);
      const double tol = bound[i] + 4 * kSteps * std::ldexp(mag[i] + std::fabs(err[i]), -53);
      ASSERT_LE(drift, tol) << formatName(f) << " [" << isaName(GetParam()) << "] i=" << i;
      worst = std::max(worst, drift);
    }
    // Without feedback the drift would be the steps' rounding errors summed
    // (~1e-2 for kHalf / kBf16 here, far more for kSign); with it, a few ulps.
    EXPECT_LT(worst, f == WireFormat::kSign ? 1e-3 : 1e-4) << formatName(f);
  }
}

// Decoded values re-encode to the same bytes (and so decode to the same floats).
TEST_P(CpuCodecTest, ReencodingDecodedValuesIsIdempotent) {
  for (WireFormat f : kFormats) {
    for (int exp : {0, 12, -20, 100, -100}) {
      for (size_t n : kSizes) {
        for (size_t off : {0, 1}) {
          // Binades [-40, 10): halves overflow, go subnormal and underflow.
          const Floats src(randomValues(n, 21 + n + exp, -40, 10), off);
          Wire w1(f, n, off), w2(f, n, 1 - off);
          encode(f, exp, src.data(), nullptr, n, w1.data());
          Floats d1(n, 1 - off), d2(n, off);
          decode(f, exp, w1.data(), n, d1.data());
          encode(f, exp, d1.data(), nullptr, n, w2.data());
          decode(f, exp, w2.data(), n, d2.data());
          ASSERT_EQ(w1.bytes(), w2.bytes()) << where(f, n, off) << " exp=" << exp;
          ASSERT_EQ(std::memcmp(d1.data(), d2.data(), n * sizeof(float)), 0) << where(f, n, off);
          ASSERT_TRUE(w1.guardsIntact() && w2.guardsIntact() && d1.guardsIntact());
        }
      }
    }
  }
}

// decodeAdd == decode, then (localScale *) local added, bit for bit; in place too.
TEST_P(CpuCodecTest, DecodeAddIsDecodePlusScaledLocal) {
  for (WireFormat f : kFormats) {
    for (float ls : {1.0f, 0.5f, -3.0f, 0.1f}) {
      for (size_t n : kSizes) {
        for (size_t off : {0, 1}) {
          const Floats src(randomValues(n, 31 + n, -8, 8), off);
          const std::vector<float> loc = randomValues(n, 32 + n, -12, 4);
          Wire wire(f, n, 1 - off);
          encode(f, -3, src.data(), nullptr, n, wire.data());
          Floats dec(n, off);
          decode(f, -3, wire.data(), n, dec.data());
          Floats local(loc, 1 - off), out(n, off);
          decodeAdd(f, -3, wire.data(), n, local.data(), ls, out.data());
          decodeAdd(f, -3, wire.data(), n, local.data(), ls, local.data());  // in place
          ASSERT_TRUE(out.guardsIntact() && local.guardsIntact()) << where(f, n, off);
          for (size_t i = 0; i < n; ++i) {
            const float want = add(dec[i], ls == 1.0f ? loc[i] : mul(ls, loc[i]));
            ASSERT_TRUE(sameBits(out[i], want)) << where(f, n, off) << " ls=" << ls << " i=" << i;
            ASSERT_TRUE(sameBits(local[i], want)) << where(f, n, off) << " in place, i=" << i;
          }
        }
      }
    }
  }
}

// quantize == encode(src * srcScale, err) then decode, bit for bit (dst and
// err); with dst == src too.
TEST_P(CpuCodecTest, QuantizeIsEncodeThenDecode) {
  for (WireFormat f : kFormats) {
    for (float srcScale : {1.0f, 0.25f, -1.7f}) {
      for (bool withErr : {false, true}) {
        for (size_t n : kSizes) {
          for (size_t off : {0, 1}) {
            const std::vector<float> s = randomValues(n, 41 + n, -10, 6);
            const std::vector<float> e0 = randomValues(n, 42 + n, -20, -8);
            std::vector<float> c(n);
            for (size_t i = 0; i < n; ++i) c[i] = srcScale == 1.0f ? s[i] : mul(s[i], srcScale);
            // Reference: encode + decode.
            Floats refErr(e0, 0), refDst(n, 0);
            Wire wire(f, n, 0);
            encode(f, 4, c.data(), withErr ? refErr.data() : nullptr, n, wire.data());
            decode(f, 4, wire.data(), n, refDst.data());
            // Out of place, then in place.
            for (bool inPlace : {false, true}) {
              Floats src(s, off), dst(n, 1 - off), err(e0, 1 - off);
              float* out = inPlace ? src.data() : dst.data();
              quantize(f, 4, src.data(), srcScale, withErr ? err.data() : nullptr, n, out);
              const std::string at = where(f, n, off) + " srcScale=" + std::to_string(srcScale) +
                                     (withErr ? " err" : "") + (inPlace ? " in place" : "");
              ASSERT_TRUE(src.guardsIntact() && dst.guardsIntact() && err.guardsIntact()) << at;
              ASSERT_EQ(std::memcmp(out, refDst.data(), n * sizeof(float)), 0) << at;
              ASSERT_EQ(std::memcmp(err.data(), refErr.data(), n * sizeof(float)), 0) << at;
              if (!inPlace) {
                ASSERT_EQ(src.values(), s) << at << ": src modified";
              }
            }
          }
        }
      }
    }
  }
}

// maxAbs: the largest magnitude, NaN and inf as documented, -0 as +0.
TEST_P(CpuCodecTest, MaxAbs) {
  for (size_t n : kSizes) {
    if (n == 0) continue;
    for (size_t off : {0, 1}) {
      std::vector<float> v = randomValues(n, 51 + n, -20, 20);
      float want = 0;
      for (float x : v) want = std::max(want, std::fabs(x));
      Floats x(v, off);
      EXPECT_TRUE(sameBits(maxAbs(x.data(), n), want)) << n;
      v[n / 2] = -kInf;
      x.assign(v);
      EXPECT_EQ(maxAbs(x.data(), n), kInf) << n;
      v[n - 1] = -std::nanf("");
      x.assign(v);
      EXPECT_TRUE(std::isnan(maxAbs(x.data(), n))) << n;
    }
  }
  const float zeros[] = {-0.0f, 0.0f, -0.0f};
  EXPECT_TRUE(sameBits(maxAbs(zeros, 3), 0.0f));
  const float neg[] = {-5.0f, 4.0f};
  EXPECT_EQ(maxAbs(neg, 2), 5.0f);
}

// Zeros, constants, signed zero, huge and tiny magnitudes with a fitting exp.
TEST_P(CpuCodecTest, SpecialFiniteValues) {
  const size_t n = 1000;
  for (WireFormat f : kFormats) {
    SCOPED_TRACE(formatName(f));
    Wire wire(f, n, 0);
    Floats dec(n, 1);
    // Zeros of both signs: sent as zeros (the sign of zero travels in kHalf /
    // kBf16; -0.0 is not < 0 for kSign); with err, nothing is left in err.
    std::vector<float> z(n);
    for (size_t i = 0; i < n; ++i) z[i] = (i % 3 == 0) ? -0.0f : 0.0f;
    encode(f, 7, z.data(), nullptr, n, wire.data());
    decode(f, 7, wire.data(), n, dec.data());
    for (size_t i = 0; i < n; ++i) {
      if (f == WireFormat::kSign) {
        EXPECT_FALSE(wire.signBit(i));
        EXPECT_TRUE(sameBits(dec[i], 0.0f));
      } else {
        EXPECT_TRUE(sameBits(dec[i], z[i])) << i;
      }
    }
    if (f == WireFormat::kSign) {
      EXPECT_TRUE(sameBits(wire.signScale(0), 0.0f));
    }
    Floats err(std::vector<float>(n, 0.0f), 0);
    encode(f, 7, z.data(), err.data(), n, wire.data());
    for (size_t i = 0; i < n; ++i) EXPECT_EQ(err[i], 0.0f);

    // Constants: kSign sends them exactly (scale = |c|).
    for (float k : {3.0f, -0.75f}) {
      const std::vector<float> cst(n, k);
      Floats e(std::vector<float>(n, 0.0f), 1);
      encode(f, 0, cst.data(), e.data(), n, wire.data());
      decode(f, 0, wire.data(), n, dec.data());
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(dec[i], k) << i;
        ASSERT_EQ(e[i], 0.0f) << i;
      }
    }

    // Huge values with a negative exp, tiny ones with a positive exp.
    const double rel = f == WireFormat::kHalf ? 0x1p-11 : f == WireFormat::kBf16 ? 0x1p-8 : 0;
    for (auto [mag, exp] : {std::pair{1e30f, -100}, std::pair{1e-30f, 100}}) {
      std::vector<float> v(n);
      for (size_t i = 0; i < n; ++i) v[i] = (i % 2 ? -mag : mag) * (1.0f + 0.001f * (i % 100));
      Floats e(std::vector<float>(n, 0.0f), 0);
      encode(f, exp, v.data(), e.data(), n, wire.data());
      decode(f, exp, wire.data(), n, dec.data());
      for (size_t i = 0; i < n; ++i) {
        ASSERT_TRUE(std::isfinite(dec[i]) && std::isfinite(e[i])) << mag << " i=" << i;
        if (f == WireFormat::kSign) {
          ASSERT_EQ(std::signbit(dec[i]), v[i] < 0);
          ASSERT_NEAR(std::fabs(dec[i]) / mag, 1.05, 0.05);
        } else {
          ASSERT_LE(std::fabs(static_cast<double>(dec[i]) - v[i]), rel * std::fabs(v[i]));
          ASSERT_EQ(static_cast<double>(dec[i]) + e[i], static_cast<double>(v[i]));
        }
      }
    }
    if (f != WireFormat::kSign) {
      // Tiny values below the scaled format's range are not sent: all in err.
      const std::vector<float> t(n, f == WireFormat::kHalf ? 1e-30f : 1e-44f);
      Floats e(std::vector<float>(n, 0.0f), 0);
      encode(f, f == WireFormat::kHalf ? 0 : -100, t.data(), e.data(), n, wire.data());
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(wire.word(i), 0u);
        ASSERT_EQ(e[i], t[i]);
      }
    }
  }
}

// NaN and inf. kHalf / kBf16: each element on its own (NaN stays NaN, inf
// stays inf, overflow of the scaled value gives inf; err is c - decoded, so
// NaN for those and -inf for an overflowed +c). kSign: the block holding one
// decodes non-finite, other blocks are untouched.
TEST_P(CpuCodecTest, NanAndInfPropagation) {
  const float nan = std::nanf("");
  const size_t n = 1536;  // three kSign blocks
  std::vector<float> v = randomValues(n, 61, -3, 3);
  v[5] = nan;
  v[6] = kInf;
  v[7] = -kInf;
  v[8] = 1e5f;  // above binary16's range at exp 0
  v[600] = -kInf;
  for (WireFormat f : kFormats) {
    SCOPED_TRACE(formatName(f));
    Wire wire(f, n, 1);
    Floats dec(n, 0), err(std::vector<float>(n, 0.0f), 1);
    encode(f, 0, v.data(), err.data(), n, wire.data());
    decode(f, 0, wire.data(), n, dec.data());
    if (f == WireFormat::kSign) {
      EXPECT_EQ(bitsOf(wire.signScale(0)), 0x7fc00000u);  // the default quiet NaN
      EXPECT_EQ(wire.signScale(1), kInf);
      EXPECT_TRUE(std::isfinite(wire.signScale(2)));
      for (size_t i = 0; i < 512; ++i) ASSERT_TRUE(std::isnan(dec[i])) << i;
      for (size_t i = 512; i < 1024; ++i) {
        ASSERT_EQ(dec[i], v[i] < 0 ? -kInf : kInf) << i;
        ASSERT_TRUE(std::isnan(err[i]) || std::isinf(err[i])) << i;
      }
      for (size_t i = 1024; i < n; ++i) ASSERT_TRUE(std::isfinite(dec[i]) && std::isfinite(err[i]));
      continue;
    }
    EXPECT_TRUE(std::isnan(dec[5]));
    EXPECT_TRUE(std::isnan(err[5]));
    EXPECT_EQ(wire.word(6), f == WireFormat::kHalf ? 0x7c00u : 0x7f80u);
    EXPECT_EQ(wire.word(7), f == WireFormat::kHalf ? 0xfc00u : 0xff80u);
    EXPECT_EQ(dec[6], kInf);
    EXPECT_EQ(dec[7], -kInf);
    EXPECT_TRUE(std::isnan(err[6]) && std::isnan(err[7]));  // inf - inf
    if (f == WireFormat::kHalf) {
      EXPECT_EQ(dec[8], kInf);
      EXPECT_EQ(err[8], -kInf);
    } else {
      EXPECT_NEAR(dec[8], 1e5f, 1e5f * 0x1p-8);
    }
    for (size_t i = 9; i < n; ++i) {
      if (i == 600) continue;
      ASSERT_TRUE(std::isfinite(dec[i]) && std::isfinite(err[i])) << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Isa, CpuCodecTest,
                         ::testing::Values(KernelIsa::kGeneric, KernelIsa::kAvx2,
                                           KernelIsa::kAvx512),
                         [](const ::testing::TestParamInfo<KernelIsa>& info) {
                           return std::string(isaName(info.param));
                         });

// ---- every variant against the generic one, byte for byte ----------------------------

// Data with every kind of float: random magnitudes, signed zeros, subnormals,
// huge values, infinities and NaNs with payloads (quiet and signalling).
std::vector<float> nastyValues(size_t n, uint64_t seed) {
  std::vector<float> v = randomValues(n, seed, -30, 30);
  std::mt19937_64 rng(seed ^ 0x9e3779b97f4a7c15ull);
  const float specials[] = {fromBits(0x7fc00000u),
                            fromBits(0xffc12345u),
                            fromBits(0x7f800001u),
                            fromBits(0x7fa00000u),
                            kInf,
                            -kInf,
                            fromBits(0x00000001u),
                            fromBits(0x80400000u),
                            3e38f,
                            -1e-40f,
                            65504.0f,
                            65520.0f};
  for (size_t i = 0; i < n; ++i) {
    if (rng() % 97 == 0) v[i] = specials[rng() % (sizeof specials / sizeof specials[0])];
  }
  return v;
}

struct Results {
  std::vector<uint8_t> wire, wireErr;
  std::vector<float> err, dec, decAdd, decAddScaled, quant, quantErr;
  float maxAbs = 0;
};

Results runAll(WireFormat f, int exp, const std::vector<float>& s, const std::vector<float>& e0,
               const std::vector<float>& loc, size_t off) {
  const size_t n = s.size();
  Results r;
  const Floats src(s, off);
  Wire w(f, n, off), we(f, n, 1 - off);
  Floats err(e0, 1 - off), dec(n, off), da(n, 1 - off), das(n, off), q(n, 1 - off), qe(e0, off);
  const Floats local(loc, off);
  encode(f, exp, src.data(), nullptr, n, w.data());
  encode(f, exp, src.data(), err.data(), n, we.data());
  decode(f, exp, we.data(), n, dec.data());
  decodeAdd(f, exp, we.data(), n, local.data(), 1.0f, da.data());
  decodeAdd(f, exp, we.data(), n, local.data(), 0.37f, das.data());
  quantize(f, exp, src.data(), 0.37f, qe.data(), n, q.data());
  r.wire = w.bytes();
  r.wireErr = we.bytes();
  r.err = err.values();
  r.dec = dec.values();
  r.decAdd = da.values();
  r.decAddScaled = das.values();
  r.quant = q.values();
  r.quantErr = qe.values();
  r.maxAbs = n != 0 ? maxAbs(src.data(), n) : 0.0f;
  return r;
}

bool sameFloats(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

TEST(CpuCodecIsa, EveryVariantMatchesGenericBitForBit) {
  const KernelIsa before = activeIsa();
  for (KernelIsa isa : {KernelIsa::kAvx2, KernelIsa::kAvx512}) {
    if (!isaSupported(isa)) {
      std::cout << "[ skipped  ] " << isaName(isa) << " not supported by this CPU\n";
      continue;
    }
    for (WireFormat f : kFormats) {
      for (int exp : {0, 13, -100, 100}) {
        for (size_t n : kSizes) {
          for (size_t off : {0, 1}) {
            const std::vector<float> s = nastyValues(n, 71 + n);
            const std::vector<float> e0 = randomValues(n, 72 + n, -40, 0);
            // Finite locals: where two NaNs meet, the payload is unspecified.
            const std::vector<float> loc = randomValues(n, 73 + n, -30, 30);
            ASSERT_TRUE(setActiveIsa(KernelIsa::kGeneric));
            const Results g = runAll(f, exp, s, e0, loc, off);
            ASSERT_TRUE(setActiveIsa(isa));
            const Results v = runAll(f, exp, s, e0, loc, off);
            const std::string at = std::string(formatName(f)) + " [" + isaName(isa) +
                                   "] exp=" + std::to_string(exp) + " n=" + std::to_string(n) +
                                   " offset=" + std::to_string(off);
            EXPECT_EQ(v.wire, g.wire) << at << " encode";
            EXPECT_EQ(v.wireErr, g.wireErr) << at << " encode with err";
            EXPECT_TRUE(sameFloats(v.err, g.err)) << at << " err";
            EXPECT_TRUE(sameFloats(v.dec, g.dec)) << at << " decode";
            EXPECT_TRUE(sameFloats(v.decAdd, g.decAdd)) << at << " decodeAdd";
            EXPECT_TRUE(sameFloats(v.decAddScaled, g.decAddScaled)) << at << " decodeAdd scaled";
            EXPECT_TRUE(sameFloats(v.quant, g.quant)) << at << " quantize";
            EXPECT_TRUE(sameFloats(v.quantErr, g.quantErr)) << at << " quantize err";
            EXPECT_TRUE(sameBits(v.maxAbs, g.maxAbs)) << at << " maxAbs";
          }
        }
      }
    }
  }
  setActiveIsa(before);
}

}  // namespace
}  // namespace tutti::cpu
