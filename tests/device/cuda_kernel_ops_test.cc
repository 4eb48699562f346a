// The CUDA plugin's per-element arithmetic (backends/cuda/kernel_ops.h),
// compiled for the host by g++, against tutti's CPU reference bit for bit:
// the narrow-float conversions against backends/cpu/float_formats.h (every
// encoding, and a dense sweep of fp32 inputs), and reduce / castScaled /
// pack1bit / unpack1bit / gemm against the CPU backend's plugin table
// (backends/cpu/cpu_backend.h, the definition the plugin ABI names), over every
// datatype x op, awkward sizes, in-place use and special values.
//
// Runs without a GPU: this checks what the device kernels compute, since they
// run the same functions (tests/device/cuda_plugin_check.cc compares the GPU's
// output with these host loops on a machine that has one).
//
// Comparison rule: bytes must be equal, except that two NaNs of a floating type
// count as equal (NaN payloads and signs coming out of arithmetic are
// unspecified; the GPU produces its canonical NaN).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/float_formats.h"
#include "backends/cuda/kernel_ops.h"
#include "tests/device/element_data.h"

namespace {

namespace kops = tutti_cuda;
using namespace tutti::devtest;  // element data and comparisons

const tuttiBackendPlugin_v1* cpu() { return tutti::cpu::backendPlugin(); }

float floatOf(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
bool sameFloat(float a, float b) {
  return (std::isnan(a) && std::isnan(b)) || bitsOf(a) == bitsOf(b);
}

// ---- conversions ----------------------------------------------------------------------------

TEST(CudaKernelOps, DecodersMatchEveryEncoding) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint16_t w = static_cast<uint16_t>(h);
    ASSERT_EQ(bitsOf(kops::halfToFloat(w)), bitsOf(tutti::cpu::halfToFloat(w))) << "half " << h;
    ASSERT_EQ(bitsOf(kops::bf16ToFloat(w)), bitsOf(tutti::cpu::bf16ToFloat(w))) << "bf16 " << h;
  }
  for (uint32_t b = 0; b < 256; ++b) {
    const uint8_t v = static_cast<uint8_t>(b);
    ASSERT_EQ(bitsOf(kops::e4m3ToFloat(v)), bitsOf(tutti::cpu::fp8E4M3ToFloat(v))) << "e4m3 " << b;
    ASSERT_EQ(bitsOf(kops::e5m2ToFloat(v)), bitsOf(tutti::cpu::fp8E5M2ToFloat(v))) << "e5m2 " << b;
  }
}

void checkEncoders(float f) {
  ASSERT_EQ(kops::floatToHalf(f), tutti::cpu::floatToHalf(f))
      << "half of 0x" << std::hex << bitsOf(f);
  ASSERT_EQ(kops::floatToBf16(f), tutti::cpu::floatToBf16(f))
      << "bf16 of 0x" << std::hex << bitsOf(f);
  ASSERT_EQ(kops::floatToE4M3(f), tutti::cpu::floatToFp8E4M3(f))
      << "e4m3 of 0x" << std::hex << bitsOf(f);
  ASSERT_EQ(kops::floatToE5M2(f), tutti::cpu::floatToFp8E5M2(f))
      << "e5m2 of 0x" << std::hex << bitsOf(f);
}

TEST(CudaKernelOps, EncodersMatchOnASweepOfFloats) {
  // Every 257th fp32 pattern (all exponents, signs, NaN payloads), ...
  for (uint64_t u = 0; u <= 0xffffffffull; u += 257)
    checkEncoders(floatOf(static_cast<uint32_t>(u)));
  // ... and every narrow value's neighbourhood: the value, the midpoints to its
  // neighbours (ties) and one fp32 ulp either side of them.
  auto around = [](float lo, float hi) {
    const float mid = lo + (hi - lo) / 2;  // exact for these formats
    for (float f : {lo, mid, std::nextafter(mid, -INFINITY), std::nextafter(mid, INFINITY)}) {
      checkEncoders(f);
      checkEncoders(-f);
    }
  };
  for (uint32_t h = 0; h < 0x7c00; ++h)
    around(tutti::cpu::halfToFloat(h), tutti::cpu::halfToFloat(h + 1));
  for (uint32_t h = 0; h < 0x7f80; ++h)
    around(tutti::cpu::bf16ToFloat(h), tutti::cpu::bf16ToFloat(h + 1));
  for (uint32_t b = 0; b < 0x7e; ++b)
    around(tutti::cpu::fp8E4M3ToFloat(b), tutti::cpu::fp8E4M3ToFloat(b + 1));
  around(448.0f, 480.0f);  // e4m3: beyond the largest finite value saturates
  for (uint32_t b = 0; b < 0x7c; ++b)
    around(tutti::cpu::fp8E5M2ToFloat(b), tutti::cpu::fp8E5M2ToFloat(b + 1));
  for (float f :
       {INFINITY, -INFINITY, 1e30f, 65520.0f, 65519.996f, 57344.0f, 61440.0f, 464.0f, 449.0f})
    checkEncoders(f);
}

TEST(CudaKernelOps, SpotChecks) {
  EXPECT_EQ(kops::floatToE4M3(1000.0f), 0x7e);    // saturates to 448
  EXPECT_EQ(kops::floatToE4M3(-INFINITY), 0xfe);  // -448
  EXPECT_EQ(kops::floatToE5M2(INFINITY), 0x7c);
  EXPECT_EQ(kops::floatToHalf(65520.0f), 0x7c00);                       // rounds to inf
  EXPECT_EQ(kops::floatToBf16(floatOf(0x7fffffffu)) & 0x7fff, 0x7fff);  // GPU NaN stays NaN
  EXPECT_EQ(kops::add<int8_t>(127, 1), -128);
  EXPECT_EQ(kops::mul<uint8_t>(255, 255), 1);
  EXPECT_EQ(bitsOf(kops::maxOf(0.0f, -0.0f)), 0x80000000u);  // equal: the second
  EXPECT_TRUE(std::isnan(kops::minOf(NAN, 1.0f)));
  EXPECT_TRUE(std::isnan(kops::minOf(1.0f, NAN)));
  EXPECT_EQ(kops::scalarOf<kops::kInt8>(-3), -3);
  EXPECT_EQ(kops::scalarFromDouble<kops::kInt32>(2.9), 2);
  EXPECT_EQ(kops::scalarFromDouble<kops::kInt32>(-2.9), -2);
  EXPECT_EQ(kops::scalarFromDouble<kops::kInt64>(1e300), INT64_MAX);
  EXPECT_EQ(kops::scalarFromDouble<kops::kUint64>(1e300), UINT64_MAX);
  EXPECT_EQ(kops::scalarFromDouble<kops::kInt32>(NAN), 0);
  EXPECT_EQ(kops::scalarOf<kops::kInt64>(INT64_MAX), INT64_MAX);  // 2^63 saturates back
}

// ---- reduce ---------------------------------------------------------------------------------

// The PREMULSUM scalars tried per datatype (raw elements).
std::vector<uint64_t> scalarsFor(int dt) {
  switch (dt) {
    case kops::kInt8:
    case kops::kUint8:
      return {0, 1, 3, 0xff, 0x80};
    case kops::kInt32:
    case kops::kUint32:
      return {0, 1, 7, 0xffffffffu, 0x80000000u};
    case kops::kInt64:
    case kops::kUint64:  // the last two are not exact in double
      return {1, 0xfffffffffffffffdull, 0x7fffffffffffffffull, 0xffffffffffffffffull,
              (1ull << 53) + 1};
    case kops::kFloat16:
      return {0x3c00, 0x3800, 0xc200, 0x3555, 0x7c00, 0x7e00, 0x0001};
    case kops::kBfloat16:
      return {0x3f80, 0x3f00, 0xc040, 0x3eab, 0x7f80, 0x0001};
    case kops::kFloat32:
      return {0x3f800000, 0x3eaaaaab, 0xc0400000, 0x7f800000, 0x00000001, 0x7fc00000};
    case kops::kFloat64:
      return {0x3ff0000000000000ull, 0x3fd5555555555555ull, 0xc008000000000000ull,
              0x7ff0000000000000ull};
    case kops::kFp8E4M3:
      return {0x38, 0x30, 0xc4, 0x7e, 0x01};
    case kops::kFp8E5M2:
      return {0x3c, 0x38, 0xc2, 0x7c, 0x01};
  }
  return {0};
}

struct ReduceCase {
  int dt, op, n;
  uint64_t count;
  int alias;  // -1: separate dst; k: dst == srcs[k]
  uint64_t scalar;
  uint32_t divisor;
};

void runReduceCase(const ReduceCase& c, std::mt19937_64& rng) {
  const int es = kops::dtypeSize(c.dt);
  std::vector<std::vector<unsigned char>> srcs;
  for (int k = 0; k < c.n; ++k) srcs.push_back(makeData(c.dt, c.count, rng));
  // The reference and the candidate each get their own copy (aliasing writes).
  auto refSrcs = srcs;
  auto gotSrcs = srcs;
  std::vector<unsigned char> refDst(c.count * es, 0xcd), gotDst(c.count * es, 0xcd);
  std::vector<const void*> rp(c.n), gp(c.n);
  for (int k = 0; k < c.n; ++k) {
    rp[k] = refSrcs[k].data();
    gp[k] = gotSrcs[k].data();
  }
  void* rd = c.alias >= 0 ? refSrcs[c.alias].data() : refDst.data();
  void* gd = c.alias >= 0 ? gotSrcs[c.alias].data() : gotDst.data();

  tuttiPluginReduceArgs_v1 a{};
  a.structSize = sizeof a;
  a.datatype = c.dt;
  a.op = c.op;
  a.nSrcs = c.n;
  a.count = c.count;
  a.dst = rd;
  a.srcs = rp.data();
  a.scalar = c.op == kops::kPreMulSum ? &c.scalar : nullptr;  // little-endian: low bytes
  a.scalarResidence = ncclScalarHostImmediate;
  a.avgDivisor = c.divisor;
  ASSERT_EQ(cpu()->reduce(nullptr, &a, nullptr), ncclSuccess) << cpu()->lastError(nullptr);
  ASSERT_TRUE(kops::hostReduce(c.dt, c.op, gd, gp.data(), c.n, c.count, a.scalar, c.divisor));

  const auto& ref = c.alias >= 0 ? refSrcs[c.alias] : refDst;
  const auto& got = c.alias >= 0 ? gotSrcs[c.alias] : gotDst;
  const int64_t bad = firstMismatch(c.dt, ref, got, c.count);
  if (bad >= 0) {
    std::string inputs;
    for (int k = 0; k < c.n; ++k) inputs += " " + hexElem(c.dt, srcs[k], bad);
    FAIL() << kTypeNames[c.dt] << " " << kOpNames[c.op] << " n=" << c.n << " count=" << c.count
           << " alias=" << c.alias << " scalar=0x" << std::hex << c.scalar << std::dec
           << " divisor=" << c.divisor << ": element " << bad << " inputs" << inputs
           << " reference " << hexElem(c.dt, ref, bad) << " got " << hexElem(c.dt, got, bad);
  }
}

TEST(CudaKernelOps, ReduceMatchesCpuReferenceForEveryTypeAndOp) {
  std::mt19937_64 rng(42);
  const uint64_t counts[] = {0, 1, 3, 16, 33, 257, 1000};
  const int ns[] = {1, 2, 3, 8};
  int cases = 0;
  for (int dt = 0; dt < kops::kNumDTypes; ++dt) {
    for (int op = 0; op < kops::kNumOps; ++op) {
      const std::vector<uint64_t> scalars =
          op == kops::kPreMulSum ? scalarsFor(dt) : std::vector<uint64_t>{0};
      for (uint64_t scalar : scalars) {
        for (int n : ns) {
          for (uint64_t count : counts) {
            for (int alias : {-1, 0, n - 1}) {
              if (alias > 0 && count != 1000) continue;  // aliasing: one size is enough
              const uint32_t divisor = op == kops::kAvg ? static_cast<uint32_t>(n + count % 5) : 1;
              runReduceCase({dt, op, n, count, alias, scalar, divisor}, rng);
              if (HasFatalFailure()) return;
              ++cases;
            }
          }
        }
      }
    }
  }
  EXPECT_GT(cases, 1000);
}

TEST(CudaKernelOps, ReduceRejectsUnknownTypesAndOps) {
  float x = 1;
  const void* s[] = {&x};
  EXPECT_FALSE(kops::hostReduce(12, kops::kSum, &x, s, 1, 1, nullptr, 1));
  EXPECT_FALSE(kops::hostReduce(kops::kFloat32, 6, &x, s, 1, 1, nullptr, 1));
  EXPECT_FALSE(kops::hostReduce(kops::kFloat32, kops::kPreMulSum, &x, s, 1, 1, nullptr, 1));
}

// ---- castScaled -------------------------------------------------------------------------------

TEST(CudaKernelOps, CastScaledMatchesCpuReference) {
  std::mt19937_64 rng(7);
  const float scales[] = {1.0f, 0.5f, 3.0f, 1e-3f, 131072.0f, -2.0f, 1e30f, 0.0f, 1e-30f};
  for (int narrow : {kops::kFloat16, kops::kBfloat16}) {
    for (uint64_t count : {0ull, 1ull, 5ull, 4097ull}) {
      for (float scale : scales) {
        // fp32 -> narrow
        std::vector<unsigned char> src = makeData(kops::kFloat32, count, rng);
        std::vector<unsigned char> ref(count * 2, 0xcd), got(count * 2, 0xcd);
        ASSERT_EQ(cpu()->castScaled(nullptr, ref.data(), narrow, src.data(), kops::kFloat32, count,
                                    scale, nullptr),
                  ncclSuccess);
        ASSERT_TRUE(
            kops::hostCastScaled(got.data(), narrow, src.data(), kops::kFloat32, count, scale));
        ASSERT_EQ(firstMismatch(narrow, ref, got, count), -1)
            << "fp32 -> " << kTypeNames[narrow] << " scale " << scale;
        // narrow -> fp32
        std::vector<unsigned char> nsrc = makeData(narrow, count, rng);
        std::vector<unsigned char> ref32(count * 4, 0xcd), got32(count * 4, 0xcd);
        ASSERT_EQ(cpu()->castScaled(nullptr, ref32.data(), kops::kFloat32, nsrc.data(), narrow,
                                    count, scale, nullptr),
                  ncclSuccess);
        ASSERT_TRUE(
            kops::hostCastScaled(got32.data(), kops::kFloat32, nsrc.data(), narrow, count, scale));
        ASSERT_EQ(firstMismatch(kops::kFloat32, ref32, got32, count), -1)
            << kTypeNames[narrow] << " -> fp32 scale " << scale;
      }
    }
  }
  float f = 0;
  uint8_t b = 0;
  EXPECT_FALSE(kops::hostCastScaled(&b, kops::kFp8E4M3, &f, kops::kFloat32, 1, 1.0f));
  EXPECT_NE(cpu()->castScaled(nullptr, &b, kops::kFp8E4M3, &f, kops::kFloat32, 1, 1.0f, nullptr),
            ncclSuccess);
}

// ---- 1-bit codec ------------------------------------------------------------------------------

std::vector<float> signData(uint64_t count, std::mt19937_64& rng, int flavour) {
  std::vector<float> v(count);
  std::normal_distribution<float> d(0.0f, 1.0f);
  for (uint64_t i = 0; i < count; ++i) {
    v[i] = d(rng);
    if (flavour == 1 && rng() % 16 == 0) {  // specials
      const float sp[] = {0.0f, -0.0f, 1e-40f, -1e-40f, 3e38f, -3e38f};
      v[i] = sp[rng() % 6];
    }
    if (flavour == 2) v[i] = -std::fabs(v[i]);  // all negative
  }
  if (flavour == 1 && count > 700) {
    v[600] = NAN;                          // block 1 gets a NaN scale
    if (count > 1100) v[1100] = INFINITY;  // block 2 an infinite one
  }
  return v;
}

TEST(CudaKernelOps, Pack1bitMatchesCpuReference) {
  std::mt19937_64 rng(3);
  for (uint64_t count : {0ull, 1ull, 7ull, 8ull, 9ull, 511ull, 512ull, 513ull, 1025ull, 3000ull}) {
    for (int flavour = 0; flavour < 3; ++flavour) {
      for (int errMode = 0; errMode < 3; ++errMode) {  // no error / separate / error == src
        const std::vector<float> src = signData(count, rng, flavour);
        const std::vector<float> err0 = signData(count, rng, 0);
        std::vector<float> refSrc = src, gotSrc = src;
        std::vector<float> refErr = errMode == 2 ? src : err0, gotErr = refErr;
        const uint64_t wb = kops::signWireBytes(count);
        std::vector<unsigned char> refWire(wb + 8, 0xcd), gotWire(wb + 8, 0xcd);
        float* re = errMode == 0 ? nullptr : (errMode == 2 ? refSrc.data() : refErr.data());
        float* ge = errMode == 0 ? nullptr : (errMode == 2 ? gotSrc.data() : gotErr.data());
        ASSERT_EQ(cpu()->pack1bit(nullptr, refSrc.data(), re, refWire.data(), count, nullptr),
                  ncclSuccess);
        kops::hostPack1bit(gotSrc.data(), ge, gotWire.data(), count);
        ASSERT_EQ(refWire, gotWire)
            << "wire, count " << count << " flavour " << flavour << " errMode " << errMode;
        const auto& rE = errMode == 2 ? refSrc : refErr;
        const auto& gE = errMode == 2 ? gotSrc : gotErr;
        for (uint64_t i = 0; i < count; ++i)
          ASSERT_TRUE(sameFloat(rE[i], gE[i])) << "error " << i << " count " << count;
        // Decoding, plain and accumulating.
        for (int acc = 0; acc < 2; ++acc) {
          std::vector<float> rd = signData(count, rng, 0), gd = rd;
          ASSERT_EQ(cpu()->unpack1bit(nullptr, rd.data(), refWire.data(), count, acc, nullptr),
                    ncclSuccess);
          kops::hostUnpack1bit(gd.data(), gotWire.data(), count, acc != 0);
          for (uint64_t i = 0; i < count; ++i)
            ASSERT_TRUE(sameFloat(rd[i], gd[i])) << "unpack " << i << " acc " << acc;
        }
      }
    }
  }
}

// ---- gemm -------------------------------------------------------------------------------------

TEST(CudaKernelOps, GemmMatchesCpuReference) {
  std::mt19937_64 rng(11);
  std::normal_distribution<float> d(0.0f, 1.0f);
  struct Shape {
    int64_t m, n, k;
  };
  const Shape shapes[] = {{0, 3, 4},    {3, 0, 4},    {3, 4, 0},    {1, 1, 1},   {5, 7, 3},
                          {17, 16, 33}, {64, 4, 100}, {4, 64, 257}, {33, 31, 17}};
  for (const Shape& s : shapes) {
    for (int tA = 0; tA < 2; ++tA) {
      for (int tB = 0; tB < 2; ++tB) {
        for (float beta : {0.0f, 1.0f, -0.5f}) {
          const float alpha = tA ? 1.0f : 0.75f;
          // op(A) is m x k: stored k x m when transposed; pad the row strides.
          const int64_t lda = (tA ? s.m : s.k) + 3, ldb = (tB ? s.k : s.n) + 1, ldc = s.n + 2;
          const int64_t aRows = tA ? s.k : s.m, bRows = tB ? s.n : s.k;
          std::vector<float> A(static_cast<size_t>(aRows * lda + 1)),
              B(static_cast<size_t>(bRows * ldb + 1));
          for (float& x : A) x = d(rng);
          for (float& x : B) x = d(rng);
          std::vector<float> C(static_cast<size_t>(s.m * ldc + 1));
          for (float& x : C) x = beta == 0.0f ? NAN : d(rng);  // beta 0 ignores NaN
          std::vector<float> ref = C, got = C;
          ASSERT_EQ(cpu()->gemm(nullptr, tA, tB, s.m, s.n, s.k, alpha, A.data(), lda, B.data(), ldb,
                                beta, ref.data(), ldc, nullptr),
                    ncclSuccess);
          kops::hostGemm(tA, tB, s.m, s.n, s.k, alpha, A.data(), lda, B.data(), ldb, beta,
                         got.data(), ldc);
          for (size_t i = 0; i < ref.size(); ++i)
            ASSERT_TRUE(sameFloat(ref[i], got[i]))
                << "gemm m" << s.m << " n" << s.n << " k" << s.k << " tA" << tA << " tB" << tB
                << " beta " << beta << " at " << i << ": " << ref[i] << " vs " << got[i];
        }
      }
    }
  }
}

}  // namespace
