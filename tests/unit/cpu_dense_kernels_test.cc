// backends/cpu/dense_kernels.h: the PowerSGD products against a double-precision reference with
// a rigorous error bound, against the header's fma-chain definition bit for bit, and across
// every instruction-set variant bit for bit; fillGaussian's statistics, determinism and its
// documented definition; Gram-Schmidt orthonormality; and the low-rank round trip PowerSGD
// relies on.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "backends/cpu/dense_kernels.h"
#include "backends/cpu/kernel_dispatch.h"

namespace tutti::cpu {
namespace {

constexpr double kU = 0x1.0p-24;  // unit roundoff of float

// Uniform values in [-1, 1) from a 64-bit LCG: independent of the code under test.
std::vector<float> uniform(size_t n, uint64_t seed) {
  std::vector<float> v(n);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& f : v) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    f = static_cast<float>(static_cast<double>(x >> 40) / 8388608.0 - 1.0);
  }
  return v;
}

bool sameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// Bound on |fl(chain) - exact| for a chain of n fmas: each fma rounds once, so the classic
// recursive-summation bound gamma_n * sum |a_t b_t| holds (gamma_n = n u / (1 - n u)), plus
// a relative 1e-15 for the double reference itself.
double chainBound(size_t n, double absSum) {
  const double nu = static_cast<double>(n) * kU;
  return nu / (1.0 - nu) * absSum + 1e-15 * absSum + 1e-30;
}

// Restores the instruction-set choice a test changed.
class IsaGuard {
 public:
  IsaGuard() : saved_(activeIsa()) {}
  ~IsaGuard() { setActiveIsa(saved_); }

 private:
  KernelIsa saved_;
};

std::vector<KernelIsa> supportedIsas() {
  std::vector<KernelIsa> out;
  for (KernelIsa isa : {KernelIsa::kGeneric, KernelIsa::kAvx2, KernelIsa::kAvx512}) {
    if (isaSupported(isa)) out.push_back(isa);
  }
  return out;
}

struct Shape {
  size_t rows;
  size_t cols;
  size_t r;
};

std::string shapeName(const Shape& s) {
  return std::to_string(s.rows) + "x" + std::to_string(s.cols) + " r=" + std::to_string(s.r);
}

// rows/cols in {1, 3, 17, 1000} x r in {1, 2, 4, 7}; plus shapes reaching the other code paths
// of the AVX2 variants (8-row blocks with leftover rows, several 8192-column chunks with 8- and
// 1-column tails, r = 8, r not a compile-time constant, r > 128).
std::vector<Shape> shapes() {
  std::vector<Shape> out;
  for (size_t rows : {1, 3, 17, 1000}) {
    for (size_t cols : {1, 3, 17, 1000}) {
      for (size_t r : {1, 2, 4, 7}) out.push_back({rows, cols, r});
    }
  }
  for (Shape s : {Shape{24, 263, 8}, Shape{33, 519, 13}, Shape{16, 8, 5}, Shape{9, 40, 130},
                  Shape{40, 64, 6}, Shape{24, 16403, 3}, Shape{9, 8193, 5},
                  // several column panels for powerBack/powerApprox, the last one ragged
                  Shape{19, 2500, 4}, Shape{17, 1100, 8}}) {
    out.push_back(s);
  }
  return out;
}

struct Outputs {
  std::vector<float> P, Eproj, Q, out, Eapprox, outScaled, EapproxScaled;
};

// Runs the three products on fixed inputs for one shape with the active instruction set.
Outputs runAll(const Shape& s, bool withE) {
  const size_t n = s.rows * s.cols;
  const auto M = uniform(n, 1 + s.rows * 31 + s.cols);
  const auto Q = uniform(s.cols * s.r, 2 + s.r);
  const auto P2 = uniform(s.rows * s.r, 3 + s.rows);
  Outputs o;
  o.Eproj = withE ? uniform(n, 4) : std::vector<float>();
  o.P.assign(s.rows * s.r, -7.0f);
  powerProject(M.data(), withE ? o.Eproj.data() : nullptr, s.rows, s.cols, Q.data(), s.r,
               o.P.data());
  o.Q.assign(s.cols * s.r, -7.0f);
  powerBack(M.data(), s.rows, s.cols, P2.data(), s.r, o.Q.data());
  o.out.assign(n, -7.0f);
  o.Eapprox = withE ? uniform(n, 5) : std::vector<float>();
  powerApprox(P2.data(), Q.data(), s.rows, s.cols, s.r, o.out.data(),
              withE ? o.Eapprox.data() : nullptr);
  // A sum all-reduce's call: out scaled by the rank count in the same pass.
  o.outScaled.assign(n, -7.0f);
  o.EapproxScaled = withE ? uniform(n, 5) : std::vector<float>();
  powerApprox(P2.data(), Q.data(), s.rows, s.cols, s.r, o.outScaled.data(),
              withE ? o.EapproxScaled.data() : nullptr, 3.0f);
  return o;
}

// ---- the products against double precision and against the definition ----------------------

TEST(CpuDenseKernels, ProductsMatchDoubleReferenceAndDefinition) {
  for (const Shape& s : shapes()) {
    SCOPED_TRACE(shapeName(s));
    const size_t rows = s.rows, cols = s.cols, r = s.r;
    const auto M = uniform(rows * cols, 11 + rows);
    const auto E0 = uniform(rows * cols, 12 + cols);
    const auto Q = uniform(cols * r, 13 + r);

    // powerProject with error feedback.
    std::vector<float> E = E0, P(rows * r, -7.0f);
    powerProject(M.data(), E.data(), rows, cols, Q.data(), r, P.data());
    std::vector<float> Mp(rows * cols);
    for (size_t x = 0; x < rows * cols; ++x) Mp[x] = M[x] + E0[x];
    ASSERT_TRUE(sameBits(E, Mp)) << "E must hold M + E (float add)";
    for (size_t i = 0; i < rows; ++i) {
      for (size_t k = 0; k < r; ++k) {
        double exact = 0, absSum = 0;
        float chain = 0.0f;
        for (size_t j = 0; j < cols; ++j) {
          exact += static_cast<double>(Mp[i * cols + j]) * Q[j * r + k];
          absSum += std::fabs(static_cast<double>(Mp[i * cols + j]) * Q[j * r + k]);
          chain = std::fma(Mp[i * cols + j], Q[j * r + k], chain);
        }
        const float got = P[i * r + k];
        ASSERT_LE(std::fabs(got - exact), chainBound(cols, absSum)) << "P " << i << "," << k;
        ASSERT_EQ(std::memcmp(&got, &chain, 4), 0) << "P " << i << "," << k << " not the chain";
      }
    }
    // Without feedback: the same P, M untouched.
    std::vector<float> P0(rows * r, -7.0f);
    powerProject(Mp.data(), nullptr, rows, cols, Q.data(), r, P0.data());
    ASSERT_TRUE(sameBits(P0, P));

    // powerBack.
    std::vector<float> Qb(cols * r, -7.0f);
    powerBack(Mp.data(), rows, cols, P.data(), r, Qb.data());
    for (size_t j = 0; j < cols; ++j) {
      for (size_t k = 0; k < r; ++k) {
        double exact = 0, absSum = 0;
        float chain = 0.0f;
        for (size_t i = 0; i < rows; ++i) {
          exact += static_cast<double>(Mp[i * cols + j]) * P[i * r + k];
          absSum += std::fabs(static_cast<double>(Mp[i * cols + j]) * P[i * r + k]);
          chain = std::fma(Mp[i * cols + j], P[i * r + k], chain);
        }
        const float got = Qb[j * r + k];
        ASSERT_LE(std::fabs(got - exact), chainBound(rows, absSum)) << "Q " << j << "," << k;
        ASSERT_EQ(std::memcmp(&got, &chain, 4), 0) << "Q " << j << "," << k << " not the chain";
      }
    }

    // powerApprox with the residual update.
    std::vector<float> out(rows * cols, -7.0f), Ea = Mp;
    powerApprox(P.data(), Qb.data(), rows, cols, r, out.data(), Ea.data());
    for (size_t i = 0; i < rows; ++i) {
      for (size_t j = 0; j < cols; ++j) {
        double exact = 0, absSum = 0;
        float chain = 0.0f;
        for (size_t k = 0; k < r; ++k) {
          exact += static_cast<double>(P[i * r + k]) * Qb[j * r + k];
          absSum += std::fabs(static_cast<double>(P[i * r + k]) * Qb[j * r + k]);
          chain = std::fma(P[i * r + k], Qb[j * r + k], chain);
        }
        const float got = out[i * cols + j];
        ASSERT_LE(std::fabs(got - exact), chainBound(r, absSum)) << "out " << i << "," << j;
        ASSERT_EQ(std::memcmp(&got, &chain, 4), 0) << "out " << i << "," << j;
        const float residual = Mp[i * cols + j] - got;
        ASSERT_EQ(std::memcmp(&Ea[i * cols + j], &residual, 4), 0) << "E " << i << "," << j;
      }
    }
    std::vector<float> out2(rows * cols, -7.0f);
    powerApprox(P.data(), Qb.data(), rows, cols, r, out2.data(), nullptr);
    ASSERT_TRUE(sameBits(out2, out));

    // outScale: out = s * chain (one float multiply), the residual still against the chain.
    for (float scale : {1.0f, 3.0f, 0.375f}) {
      SCOPED_TRACE(scale);
      std::vector<float> outS(rows * cols, -7.0f), Es = Mp, outN(rows * cols, -7.0f);
      powerApprox(P.data(), Qb.data(), rows, cols, r, outS.data(), Es.data(), scale);
      ASSERT_TRUE(sameBits(Es, Ea)) << "the residual must not depend on outScale";
      powerApprox(P.data(), Qb.data(), rows, cols, r, outN.data(), nullptr, scale);
      ASSERT_TRUE(sameBits(outN, outS));
      std::vector<float> want(rows * cols);
      for (size_t x = 0; x < rows * cols; ++x) want[x] = scale * out[x];
      ASSERT_TRUE(sameBits(outS, want));
    }
  }
}

TEST(CpuDenseKernels, IsaVariantsBitIdenticalToGeneric) {
  IsaGuard guard;
  const auto isas = supportedIsas();
  if (isas.size() < 2) GTEST_SKIP() << "only the generic variant runs on this CPU";
  for (const Shape& s : shapes()) {
    for (bool withE : {false, true}) {
      SCOPED_TRACE(shapeName(s) + (withE ? " with E" : " no E"));
      ASSERT_TRUE(setActiveIsa(KernelIsa::kGeneric));
      const Outputs want = runAll(s, withE);
      for (KernelIsa isa : isas) {
        if (isa == KernelIsa::kGeneric) continue;
        SCOPED_TRACE(isaName(isa));
        ASSERT_TRUE(setActiveIsa(isa));
        const Outputs got = runAll(s, withE);
        EXPECT_TRUE(sameBits(got.P, want.P));
        EXPECT_TRUE(sameBits(got.Eproj, want.Eproj));
        EXPECT_TRUE(sameBits(got.Q, want.Q));
        EXPECT_TRUE(sameBits(got.out, want.out));
        EXPECT_TRUE(sameBits(got.Eapprox, want.Eapprox));
        EXPECT_TRUE(sameBits(got.outScaled, want.outScaled));
        EXPECT_TRUE(sameBits(got.EapproxScaled, want.EapproxScaled));
      }
    }
  }
}

// powerProject with a pending residual update gives, bit for bit and on every instruction set,
// what powerApprox's immediate update followed by a plain powerProject gives: E and P both; and
// applyPending alone gives that update's E. The pending rank equals the projection's (as PowerSGD
// uses it) and also differs from it.
TEST(CpuDenseKernels, PendingUpdateEqualsImmediateUpdate) {
  IsaGuard guard;
  for (const Shape& s : shapes()) {
    for (size_t pr : {s.r, s.r + 3}) {
      SCOPED_TRACE(shapeName(s) + " pending r=" + std::to_string(pr));
      const size_t n = s.rows * s.cols;
      const auto M = uniform(n, 41 + s.rows), E0 = uniform(n, 42 + s.cols);
      const auto Q = uniform(s.cols * s.r, 43), Pp = uniform(s.rows * pr, 44 + pr);
      const auto Qp = uniform(s.cols * pr, 45 + pr);
      std::vector<float> Qpb(pendingQFloats(s.cols, pr), -7.0f);
      packPendingQ(Qp.data(), s.cols, pr, Qpb.data());
      for (size_t j = 0; j < s.cols; ++j) {
        for (size_t k = 0; k < pr; ++k) {
          ASSERT_EQ(Qpb[(j / 8) * 8 * pr + k * 8 + j % 8], Qp[j * pr + k]) << "packPendingQ";
        }
      }
      // The reference: the generic code, the update at once.
      ASSERT_TRUE(setActiveIsa(KernelIsa::kGeneric));
      std::vector<float> wantE = E0, wantP(s.rows * s.r, -7.0f), scratch(n);
      powerApprox(Pp.data(), Qp.data(), s.rows, s.cols, pr, scratch.data(), wantE.data());
      // The update alone (what reading a residual applies) is the immediate update's E.
      std::vector<float> alone = E0;
      applyPending(alone.data(), s.rows, s.cols, {Pp.data(), Qpb.data(), pr});
      ASSERT_TRUE(sameBits(alone, wantE)) << "applyPending";
      powerProject(M.data(), wantE.data(), s.rows, s.cols, Q.data(), s.r, wantP.data());
      for (KernelIsa isa : supportedIsas()) {
        SCOPED_TRACE(isaName(isa));
        ASSERT_TRUE(setActiveIsa(isa));
        std::vector<float> E = E0, P(s.rows * s.r, -7.0f);
        const PendingApprox pending{Pp.data(), Qpb.data(), pr};
        powerProject(M.data(), E.data(), s.rows, s.cols, Q.data(), s.r, P.data(), &pending);
        EXPECT_TRUE(sameBits(E, wantE));
        EXPECT_TRUE(sameBits(P, wantP));
      }
    }
  }
}

// Non-finite and signed-zero inputs take the same path everywhere.
TEST(CpuDenseKernels, IsaVariantsBitIdenticalOnSpecialValues) {
  IsaGuard guard;
  const size_t rows = 19, cols = 21, r = 3;
  auto M = uniform(rows * cols, 21);
  M[5] = INFINITY;
  M[40] = -0.0f;
  M[100] = NAN;
  M[200] = 1e-40f;  // subnormal
  auto Q = uniform(cols * r, 22);
  Q[7] = -0.0f;
  auto P = uniform(rows * r, 23);
  P[4] = -INFINITY;
  auto run = [&](KernelIsa isa) {
    EXPECT_TRUE(setActiveIsa(isa));
    std::vector<float> res(rows * r + cols * r + rows * cols);
    powerProject(M.data(), nullptr, rows, cols, Q.data(), r, res.data());
    powerBack(M.data(), rows, cols, P.data(), r, res.data() + rows * r);
    powerApprox(P.data(), Q.data(), rows, cols, r, res.data() + rows * r + cols * r, nullptr);
    return res;
  };
  const auto want = run(KernelIsa::kGeneric);
  for (KernelIsa isa : supportedIsas()) {
    SCOPED_TRACE(isaName(isa));
    EXPECT_TRUE(sameBits(run(isa), want));
  }
}

// powerApprox writes outputs of 8 MiB and more with non-temporal stores, peeling the elements
// before the first 32-byte boundary of each row: aligned and misaligned outputs, with and
// without the residual and the scaling, give the generic code's bits.
TEST(CpuDenseKernels, LargeOutputsBitIdenticalToGeneric) {
  IsaGuard guard;
  const size_t rows = 515, cols = 4099, r = 4, n = rows * cols;  // 8.05 MiB
  const auto P = uniform(rows * r, 31), Q = uniform(cols * r, 32), E0 = uniform(n, 33);
  auto run = [&](KernelIsa isa, size_t offset, bool withE, float scale) {
    EXPECT_TRUE(setActiveIsa(isa));
    std::vector<float> buf(n + 8, -7.0f), E = E0;
    float* out = buf.data() + offset;
    powerApprox(P.data(), Q.data(), rows, cols, r, out, withE ? E.data() : nullptr, scale);
    std::vector<float> res(out, out + n);
    if (withE) res.insert(res.end(), E.begin(), E.end());
    for (size_t x = 0; x < offset; ++x) EXPECT_EQ(buf[x], -7.0f) << "wrote before out";
    for (size_t x = offset + n; x < buf.size(); ++x) EXPECT_EQ(buf[x], -7.0f) << "wrote past out";
    return res;
  };
  for (size_t offset : {0, 1, 3}) {
    for (bool withE : {false, true}) {
      const float scale = withE ? 1.0f : 4.0f;
      SCOPED_TRACE("offset " + std::to_string(offset) + (withE ? " with E" : " scaled"));
      const auto want = run(KernelIsa::kGeneric, offset, withE, scale);
      for (KernelIsa isa : supportedIsas()) {
        SCOPED_TRACE(isaName(isa));
        EXPECT_TRUE(sameBits(run(isa, offset, withE, scale), want));
      }
    }
  }
}

TEST(CpuDenseKernels, ZeroDimensions) {
  std::vector<float> M = uniform(12, 1), E = uniform(12, 2), Q = uniform(12, 3), P(12, -7.0f);
  // cols == 0: P is a sum of no terms.
  powerProject(M.data(), E.data(), 3, 0, Q.data(), 4, P.data());
  for (size_t x = 0; x < 12; ++x) EXPECT_EQ(P[x], 0.0f);
  // rows == 0: Q is a sum of no terms.
  std::vector<float> Qb(12, -7.0f);
  powerBack(M.data(), 0, 3, P.data(), 4, Qb.data());
  for (float v : Qb) EXPECT_EQ(v, 0.0f);
  // r == 0: out = 0 and E unchanged; project still forms M' in E.
  std::vector<float> out(12, -7.0f), E2 = E;
  powerApprox(P.data(), Q.data(), 3, 4, 0, out.data(), E2.data());
  for (float v : out) EXPECT_EQ(v, 0.0f);
  EXPECT_TRUE(sameBits(E2, E));
  powerProject(M.data(), E2.data(), 3, 4, Q.data(), 0, P.data());
  for (size_t x = 0; x < 12; ++x) EXPECT_EQ(E2[x], M[x] + E[x]);
}

TEST(CpuDenseKernels, ErrorFeedbackMayAliasM) {
  const size_t rows = 17, cols = 9, r = 2;
  const auto M = uniform(rows * cols, 31);
  const auto Q = uniform(cols * r, 32);
  std::vector<float> inPlace = M, P(rows * r), twice(rows * cols), Pw(rows * r);
  powerProject(inPlace.data(), inPlace.data(), rows, cols, Q.data(), r, P.data());
  for (size_t x = 0; x < rows * cols; ++x) twice[x] = M[x] + M[x];
  EXPECT_TRUE(sameBits(inPlace, twice));
  powerProject(twice.data(), nullptr, rows, cols, Q.data(), r, Pw.data());
  EXPECT_TRUE(sameBits(P, Pw));
}

// ---- fillGaussian ------------------------------------------------------------------------------

// The header's definition, evaluated with the C library's log/sin/cos: fillGaussian's own
// polynomials must agree to within the float rounding of a value whose double differs by a
// few ulps (so at most 1 float ulp).
std::vector<float> gaussianByDefinition(size_t n, uint64_t seed, uint64_t stream) {
  auto mix = [](uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  };
  const uint64_t g = 0x9E3779B97F4A7C15ull;
  const uint64_t key =
      mix(mix(seed + g) ^ (stream * 0xD1B54A32D192ED03ull + 0x632BE59BD9B4E019ull));
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) {
    const uint64_t p = i / 2;
    const double u1 = static_cast<double>((mix(key + (2 * p + 1) * g) >> 11) + 1) * 0x1.0p-53;
    const double u2 = static_cast<double>(mix(key + (2 * p + 2) * g) >> 11) * 0x1.0p-53;
    const double radius = std::sqrt(-2.0 * std::log(u1));
    const double angle = 2.0 * M_PI * u2;
    x[i] = static_cast<float>(i % 2 == 0 ? radius * std::cos(angle) : radius * std::sin(angle));
  }
  return x;
}

TEST(CpuDenseKernels, GaussianFollowsItsDefinition) {
  const size_t n = 200001;
  std::vector<float> x(n);
  fillGaussian(x.data(), n, 42, 7);
  const auto want = gaussianByDefinition(n, 42, 7);
  size_t differ = 0;
  for (size_t i = 0; i < n; ++i) {
    // 2 pi u2 rounds once in the definition above (|angle| < 6.3, error < 4.5e-16 absolute),
    // so compare with one float ulp of slack plus that.
    const double tol =
        std::ldexp(1.0, std::ilogb(std::max(std::fabs(want[i]), 1e-30f)) - 23) + 1e-14;
    ASSERT_LE(std::fabs(static_cast<double>(x[i]) - want[i]), tol) << i;
    differ += x[i] != want[i];
  }
  EXPECT_LT(differ, n / 1000) << "own polynomials should almost always round like libm";
}

TEST(CpuDenseKernels, GaussianStatistics) {
  // N = 1e6 standard normal samples. Standard errors: mean 1/sqrt(N) = 1e-3; variance
  // sqrt(2/N) = 1.41e-3; fourth moment sqrt((105 - 9)/N) = 9.8e-3; P(|x| < 1) = 0.682689 with
  // sqrt(p(1-p)/N) = 4.7e-4; count of |x| > 3 (p = 0.0026998) ~ 2700 +- 52. Bounds are 5
  // standard errors: a correct generator fails one with probability < 1e-6 (and the sample is
  // fixed, so the outcome is deterministic).
  const size_t n = 1000000;
  std::vector<float> x(n);
  fillGaussian(x.data(), n, 12345, 0);
  double sum = 0, sum2 = 0, sum4 = 0, maxAbs = 0;
  size_t within1 = 0, beyond3 = 0;
  for (float v : x) {
    ASSERT_TRUE(std::isfinite(v));
    const double d = v;
    sum += d;
    sum2 += d * d;
    sum4 += d * d * d * d;
    maxAbs = std::max(maxAbs, std::fabs(d));
    within1 += std::fabs(d) < 1.0;
    beyond3 += std::fabs(d) > 3.0;
  }
  const double mean = sum / n;
  const double var = sum2 / n - mean * mean;
  EXPECT_LT(std::fabs(mean), 5e-3);
  EXPECT_LT(std::fabs(var - 1.0), 7.1e-3);
  EXPECT_LT(std::fabs(sum4 / n - 3.0), 0.049);
  EXPECT_LT(std::fabs(static_cast<double>(within1) / n - 0.682689), 2.4e-3);
  EXPECT_LT(std::fabs(static_cast<double>(beyond3) - 2699.8), 260.0);
  EXPECT_LT(maxAbs, 8.6);  // sqrt(-2 ln 2^-53) = 8.57
}

TEST(CpuDenseKernels, GaussianDeterministicAndStreamsDiffer) {
  const size_t n = 4097;
  std::vector<float> a(n), b(n), prefix(7), otherStream(n), otherSeed(n);
  fillGaussian(a.data(), n, 9, 3);
  fillGaussian(b.data(), n, 9, 3);
  EXPECT_TRUE(sameBits(a, b));
  fillGaussian(prefix.data(), prefix.size(), 9, 3);
  EXPECT_EQ(std::memcmp(prefix.data(), a.data(), prefix.size() * sizeof(float)), 0);
  fillGaussian(otherStream.data(), n, 9, 4);
  fillGaussian(otherSeed.data(), n, 10, 3);
  // Independent sequences: sample correlation ~ N(0, 1/n), |corr| < 5/sqrt(n) = 0.078.
  auto corr = [&](const std::vector<float>& u, const std::vector<float>& v) {
    double uv = 0, uu = 0, vv = 0;
    for (size_t i = 0; i < n; ++i) {
      uv += static_cast<double>(u[i]) * v[i];
      uu += static_cast<double>(u[i]) * u[i];
      vv += static_cast<double>(v[i]) * v[i];
    }
    return uv / std::sqrt(uu * vv);
  };
  size_t same = 0;
  for (size_t i = 0; i < n; ++i) same += a[i] == otherStream[i] || a[i] == otherSeed[i];
  EXPECT_EQ(same, 0u);
  EXPECT_LT(std::fabs(corr(a, otherStream)), 0.078);
  EXPECT_LT(std::fabs(corr(a, otherSeed)), 0.078);
  // Identical on every machine and compiler: the bits are pinned.
  uint64_t h = 1469598103934665603ull;
  for (float v : a) {
    uint32_t bits;
    std::memcpy(&bits, &v, 4);
    h = (h ^ bits) * 1099511628211ull;
  }
  EXPECT_EQ(h, 0xd06c9792b6d4c130ull) << std::hex << h;
  uint32_t first;
  std::memcpy(&first, &a[0], 4);
  EXPECT_EQ(first, 0xbfeeec0du) << std::hex << first;  // -1.866579
}

// ---- orthonormalizeColumns ---------------------------------------------------------------------

// max |(P^T P - I)[c][d]| over the columns, computed in double.
double orthoError(const std::vector<float>& P, size_t rows, size_t r) {
  double worst = 0;
  for (size_t c = 0; c < r; ++c) {
    for (size_t d = 0; d < r; ++d) {
      double dot = 0;
      for (size_t i = 0; i < rows; ++i) dot += static_cast<double>(P[i * r + c]) * P[i * r + d];
      worst = std::max(worst, std::fabs(dot - (c == d ? 1.0 : 0.0)));
    }
  }
  return worst;
}

TEST(CpuDenseKernels, OrthonormalizeGivesOrthonormalColumns) {
  for (size_t rows : {1, 3, 17, 1000, 4096}) {
    for (size_t r : {1, 2, 4, 7}) {
      if (r > rows) continue;  // full column rank needs rows >= r
      SCOPED_TRACE(std::to_string(rows) + "x" + std::to_string(r));
      std::vector<float> P(rows * r);
      fillGaussian(P.data(), P.size(), rows, r);
      orthonormalizeColumns(P.data(), rows, r, 1e-8f);
      EXPECT_LT(orthoError(P, rows, r), 1e-5);
      std::vector<float> again(rows * r);
      fillGaussian(again.data(), again.size(), rows, r);
      orthonormalizeColumns(again.data(), rows, r, 1e-8f);
      EXPECT_TRUE(sameBits(again, P));
    }
  }
}

TEST(CpuDenseKernels, OrthonormalizeZeroAndDependentColumnsStayFinite) {
  const size_t rows = 17, r = 4;
  for (float eps : {1e-8f, 0.0f}) {
    SCOPED_TRACE(eps);
    std::vector<float> P(rows * r);
    fillGaussian(P.data(), P.size(), 5, 5);
    for (size_t i = 0; i < rows; ++i) {
      P[i * r + 1] = 0.0f;                 // zero column
      P[i * r + 3] = 2.0f * P[i * r + 0];  // dependent column
    }
    orthonormalizeColumns(P.data(), rows, r, eps);
    for (float v : P) ASSERT_TRUE(std::isfinite(v));
    for (size_t i = 0; i < rows; ++i) EXPECT_EQ(P[i * r + 1], 0.0f);
    // Columns 0 and 2 are orthonormal.
    double n0 = 0, n2 = 0, d02 = 0;
    for (size_t i = 0; i < rows; ++i) {
      n0 += static_cast<double>(P[i * r]) * P[i * r];
      n2 += static_cast<double>(P[i * r + 2]) * P[i * r + 2];
      d02 += static_cast<double>(P[i * r]) * P[i * r + 2];
    }
    EXPECT_NEAR(n0, 1.0, 1e-6);
    EXPECT_NEAR(n2, 1.0, 1e-6);
    EXPECT_NEAR(d02, 0.0, 1e-6);
  }
}

// ---- the PowerSGD round trip -------------------------------------------------------------------

// M = A B^T has rank r. With Gaussian Q, P = M Q spans M's column space; after Gram-Schmidt
// P P^T is the projector onto it, so P (M^T P)^T = P P^T M = M up to float rounding. The error
// feedback path must agree: after project + approx, E holds M - approx ~ 0.
TEST(CpuDenseKernels, LowRankMatrixIsReproduced) {
  for (const Shape& s : {Shape{1000, 17, 1}, Shape{17, 1000, 2}, Shape{300, 200, 4},
                         Shape{1000, 1000, 7}, Shape{64, 33, 7}, Shape{17, 17, 4}}) {
    SCOPED_TRACE(shapeName(s));
    const size_t rows = s.rows, cols = s.cols, r = s.r;
    std::vector<float> A(rows * r), B(cols * r), M(rows * cols);
    fillGaussian(A.data(), A.size(), 100 + r, 1);
    fillGaussian(B.data(), B.size(), 100 + r, 2);
    double norm2 = 0;
    for (size_t i = 0; i < rows; ++i) {
      for (size_t j = 0; j < cols; ++j) {
        double v = 0;
        for (size_t k = 0; k < r; ++k) v += static_cast<double>(A[i * r + k]) * B[j * r + k];
        M[i * cols + j] = static_cast<float>(v);
        norm2 += static_cast<double>(M[i * cols + j]) * M[i * cols + j];
      }
    }
    std::vector<float> Q(cols * r), P(rows * r), Q2(cols * r), out(rows * cols);
    std::vector<float> E(rows * cols, 0.0f);
    fillGaussian(Q.data(), Q.size(), 7, r);
    powerProject(M.data(), E.data(), rows, cols, Q.data(), r, P.data());
    orthonormalizeColumns(P.data(), rows, r, 1e-8f);
    powerBack(E.data(), rows, cols, P.data(), r, Q2.data());
    powerApprox(P.data(), Q2.data(), rows, cols, r, out.data(), E.data());
    double err2 = 0, res2 = 0;
    for (size_t x = 0; x < rows * cols; ++x) {
      err2 += (static_cast<double>(out[x]) - M[x]) * (static_cast<double>(out[x]) - M[x]);
      res2 += static_cast<double>(E[x]) * E[x];
    }
    EXPECT_LT(std::sqrt(err2 / norm2), 1e-5);
    EXPECT_LT(std::sqrt(res2 / norm2), 1e-5);
  }
}

}  // namespace
}  // namespace tutti::cpu
