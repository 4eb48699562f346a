// dense_kernels.h: the scalar definition of every function, the AVX2+FMA variants of the three
// products (bit-identical: per output element they issue the same fused multiply-adds on the
// same operands in the same order), and the choice between them.
#include "backends/cpu/dense_kernels.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <utility>

#include "backends/cpu/kernel_dispatch.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define TUTTI_DENSE_X86 1
#else
#define TUTTI_DENSE_X86 0
#endif

// Nothing in this file may be contracted into an FMA behind our back: the products' fused
// operations are all explicit (std::fma / _mm256_fmadd_ps), and fillGaussian's polynomials
// must round every + and * separately to give the same bits everywhere (assuming, as on x86-64
// and AArch64, that double arithmetic is evaluated in double: FLT_EVAL_METHOD == 0).
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#if defined(__GNUC__)
#define TUTTI_DENSE_INLINE inline __attribute__((always_inline))
#else
#define TUTTI_DENSE_INLINE inline
#endif

namespace tutti::cpu {
namespace {

// Largest rank the AVX2 variants handle (their per-block state lives on the stack: at most
// 128 x 8 floats = 4 KiB); larger ranks take the scalar code.
constexpr size_t kMaxVecRank = 128;

// ---- scalar definition ------------------------------------------------------------------------
// Always inlined so that the AVX2 variants, which use these for leftover rows, get them compiled
// with hardware FMA instead of calls to fmaf.

// Rows [0, rows) of powerProject.
TUTTI_DENSE_INLINE void projectScalar(const float* M, float* E, size_t rows, size_t cols,
                                      const float* Q, size_t r, float* P) {
  for (size_t i = 0; i < rows; ++i) {
    const float* m = M + i * cols;
    float* e = E != nullptr ? E + i * cols : nullptr;
    float* p = P + i * r;
    for (size_t k = 0; k < r; ++k) p[k] = 0.0f;
    for (size_t j = 0; j < cols; ++j) {
      float v = m[j];
      if (e != nullptr) {
        v = v + e[j];
        e[j] = v;
      }
      const float* q = Q + j * r;
      for (size_t k = 0; k < r; ++k) p[k] = std::fma(v, q[k], p[k]);
    }
  }
}

// Adds rows [0, rows) of Mp^T P into Q (Q must hold the chains so far; +0 to start).
TUTTI_DENSE_INLINE void backScalar(const float* Mp, size_t rows, size_t cols, const float* P,
                                   size_t r, float* Q) {
  for (size_t i = 0; i < rows; ++i) {
    const float* m = Mp + i * cols;
    const float* p = P + i * r;
    for (size_t j = 0; j < cols; ++j) {
      const float v = m[j];
      float* q = Q + j * r;
      for (size_t k = 0; k < r; ++k) q[k] = std::fma(v, p[k], q[k]);
    }
  }
}

// Rows [0, rows) of powerApprox.
TUTTI_DENSE_INLINE void approxScalar(const float* P, const float* Q, size_t rows, size_t cols,
                                     size_t r, float* out, float* E, float outScale) {
  for (size_t i = 0; i < rows; ++i) {
    const float* p = P + i * r;
    float* o = out + i * cols;
    float* e = E != nullptr ? E + i * cols : nullptr;
    for (size_t j = 0; j < cols; ++j) {
      const float* q = Q + j * r;
      float acc = 0.0f;
      for (size_t k = 0; k < r; ++k) acc = std::fma(p[k], q[k], acc);
      o[j] = outScale == 1.0f ? acc : outScale * acc;
      if (e != nullptr) e[j] = e[j] - acc;
    }
  }
}

void powerProjectGeneric(const float* M, float* E, size_t rows, size_t cols, const float* Q,
                         size_t r, float* P) {
  projectScalar(M, E, rows, cols, Q, r, P);
}

void powerBackGeneric(const float* Mp, size_t rows, size_t cols, const float* P, size_t r,
                      float* Q) {
  if (cols * r != 0) std::memset(Q, 0, cols * r * sizeof(float));
  backScalar(Mp, rows, cols, P, r, Q);
}

void powerApproxGeneric(const float* P, const float* Q, size_t rows, size_t cols, size_t r,
                        float* out, float* E, float outScale) {
  approxScalar(P, Q, rows, cols, r, out, E, outScale);
}

// ---- AVX2 + FMA -------------------------------------------------------------------------------
#if TUTTI_DENSE_X86
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#endif

// Blocks of 8 rows are handled in column chunks, each in two passes: a transposing pass that
// touches the 8 rows at once (project: reads M' to run the chains; approx: writes out), and a
// row-by-row elementwise pass (project, before: E = M + E; approx, after: E = E - out). Keeping
// the passes apart matters with power-of-two row pitches: rows then share every 4 KiB offset,
// and a load just after a store to the same offset of another row stalls (4K aliasing), while
// row by row the streams are contiguous (a whole 8-row block is one run of memory when the
// chunk spans the row). A chunk of 8 rows x 8192 floats (256 KiB) stays in L2 between passes,
// so memory still sees one pass.
constexpr size_t kChunkCols = 8192;

TUTTI_DENSE_INLINE __m256 loadPair(const float* lo, const float* hi) {
  return _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_loadu_ps(lo)), _mm_loadu_ps(hi), 1);
}

TUTTI_DENSE_INLINE void storePair(float* lo, float* hi, __m256 v) {
  _mm_storeu_ps(lo, _mm256_castps256_ps128(v));
  _mm_storeu_ps(hi, _mm256_extractf128_ps(v, 1));
}

// Transposes the 4x4 block in each 128-bit half: afterwards element a of x[b]'s half is what
// element b of x[a]'s half was.
TUTTI_DENSE_INLINE void transpose4InHalves(__m256& x0, __m256& x1, __m256& x2, __m256& x3) {
  const __m256 t0 = _mm256_unpacklo_ps(x0, x1);
  const __m256 t1 = _mm256_unpackhi_ps(x0, x1);
  const __m256 t2 = _mm256_unpacklo_ps(x2, x3);
  const __m256 t3 = _mm256_unpackhi_ps(x2, x3);
  x0 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0));
  x1 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2));
  x2 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0));
  x3 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2));
}

// e[x] = m[x] + e[x] for x < n (powerProject's M' = M + E).
TUTTI_DENSE_INLINE void addInto(const float* m, float* e, size_t n) {
  size_t x = 0;
  for (; x + 8 <= n; x += 8) {
    _mm256_storeu_ps(e + x, _mm256_add_ps(_mm256_loadu_ps(m + x), _mm256_loadu_ps(e + x)));
  }
  for (; x < n; ++x) e[x] = m[x] + e[x];
}

// powerApprox's elementwise tail on x < n, o holding the chains: e[x] = e[x] - o[x] (the new
// residual; skipped when e is null), then o[x] = s * o[x] (skipped when s == 1).
TUTTI_DENSE_INLINE void residualAndScale(float* o, float* e, size_t n, float s) {
  const bool scaled = s != 1.0f;
  const __m256 sv = _mm256_set1_ps(s);
  size_t x = 0;
  if (e != nullptr) {
    for (; x + 8 <= n; x += 8) {
      const __m256 v = _mm256_loadu_ps(o + x);
      _mm256_storeu_ps(e + x, _mm256_sub_ps(_mm256_loadu_ps(e + x), v));
      if (scaled) _mm256_storeu_ps(o + x, _mm256_mul_ps(sv, v));
    }
    for (; x < n; ++x) {
      e[x] = e[x] - o[x];
      if (scaled) o[x] = s * o[x];
    }
  } else if (scaled) {
    for (; x + 8 <= n; x += 8) _mm256_storeu_ps(o + x, _mm256_mul_ps(sv, _mm256_loadu_ps(o + x)));
    for (; x < n; ++x) o[x] = s * o[x];
  }
}

// Adds columns j..j+7 of the 8 rows at src (pitch cols) to the chains s[kk] (lane a = row a) of
// ranks k0..k0+KC-1: for b = 0..7 in order, s[kk] = fma(M'[a][j + b], Q[j + b][k0 + kk], s[kk]).
template <int KC>
TUTTI_DENSE_INLINE void projectColumns8(const float* src, size_t cols, size_t j, const float* Q,
                                        size_t r, size_t k0, __m256 s[KC]) {
  for (size_t h = 0; h < 8; h += 4) {
    __m256 c[4];  // c[b] lane a = src[a][j + h + b]
    for (size_t a = 0; a < 4; ++a) {
      c[a] = loadPair(src + a * cols + j + h, src + (a + 4) * cols + j + h);
    }
    transpose4InHalves(c[0], c[1], c[2], c[3]);
    for (size_t b = 0; b < 4; ++b) {
      const float* q = Q + (j + h + b) * r + k0;
      for (int kk = 0; kk < KC; ++kk) {
        s[kk] = _mm256_fmadd_ps(c[b], _mm256_broadcast_ss(q + kk), s[kk]);
      }
    }
  }
}

// powerProject's chains for 8 rows (src at the first row; M' already formed), columns [j0, j1),
// ranks [k0, k0 + KC). acc[k * 8 + a] is the running chain of P[a][k]; each chain gets its fmas
// in increasing j, as in projectScalar. Only 8 rows are in flight: rows 2^k floats apart share
// L1 sets, and 16 rows' lines would not stay in a 12-way L1 between uses.
template <int KC>
void projectSpan(const float* src, size_t cols, size_t j0, size_t j1, const float* Q, size_t r,
                 size_t k0, float* acc) {
  __m256 s[KC];
  for (int kk = 0; kk < KC; ++kk) s[kk] = _mm256_load_ps(acc + (k0 + kk) * 8);
  size_t j = j0;
  for (; j + 8 <= j1; j += 8) projectColumns8<KC>(src, cols, j, Q, r, k0, s);
  for (; j < j1; ++j) {  // the columns after the last multiple of 8
    const float* q = Q + j * r + k0;
    alignas(32) float col[8];
    for (size_t a = 0; a < 8; ++a) col[a] = src[a * cols + j];
    const __m256 c = _mm256_load_ps(col);
    for (int kk = 0; kk < KC; ++kk) s[kk] = _mm256_fmadd_ps(c, _mm256_broadcast_ss(q + kk), s[kk]);
  }
  for (int kk = 0; kk < KC; ++kk) _mm256_store_ps(acc + (k0 + kk) * 8, s[kk]);
}

// powerProject on 8 rows (M, E, P at the first row), chunk by chunk: M' = M + E into E row by
// row, then the chains over the chunk, 4 ranks at a time (ranks above 4 re-read the chunk from
// cache).
void projectRows8(const float* M, float* E, size_t cols, const float* Q, size_t r, float* P) {
  alignas(32) float acc[kMaxVecRank * 8];
  std::memset(acc, 0, r * 8 * sizeof(float));
  const float* src = E != nullptr ? E : M;
  for (size_t j0 = 0; j0 < cols; j0 += kChunkCols) {
    const size_t j1 = std::min(cols, j0 + kChunkCols);
    if (E != nullptr) {
      for (size_t a = 0; a < 8; ++a) addInto(M + a * cols + j0, E + a * cols + j0, j1 - j0);
    }
    for (size_t k0 = 0; k0 < r; k0 += 4) {
      switch (std::min<size_t>(4, r - k0)) {
        case 1:
          projectSpan<1>(src, cols, j0, j1, Q, r, k0, acc);
          break;
        case 2:
          projectSpan<2>(src, cols, j0, j1, Q, r, k0, acc);
          break;
        case 3:
          projectSpan<3>(src, cols, j0, j1, Q, r, k0, acc);
          break;
        default:
          projectSpan<4>(src, cols, j0, j1, Q, r, k0, acc);
          break;
      }
    }
  }
  for (size_t a = 0; a < 8; ++a) {
    for (size_t k = 0; k < r; ++k) P[a * r + k] = acc[k * 8 + a];
  }
}

void powerProjectAvx2(const float* M, float* E, size_t rows, size_t cols, const float* Q, size_t r,
                      float* P) {
  if (r == 0 || r > kMaxVecRank) {
    projectScalar(M, E, rows, cols, Q, r, P);
    return;
  }
  size_t i = 0;
  for (; i + 8 <= rows; i += 8) {
    projectRows8(M + i * cols, E != nullptr ? E + i * cols : nullptr, cols, Q, r, P + i * r);
  }
  if (i < rows) {
    projectScalar(M + i * cols, E != nullptr ? E + i * cols : nullptr, rows - i, cols, Q, r,
                  P + i * r);
  }
}

// Adds NR rows of Mp^T P (Mp, P at the first row) into Q. Q's first cols8 = cols & ~7 rows are
// kept as 8-row tiles stored rank-major: tile t (Q + 8t * r) holds [k][8] = Q[8t + l][k], so a
// vector of 8 columns j meets one broadcast P[i][k]. Rows are applied in order per element.
template <int NR>
void backRows(const float* Mp, size_t cols, const float* P, size_t r, float* Q) {
  const size_t cols8 = cols & ~size_t{7};
  for (size_t j = 0; j < cols8; j += 8) {
    __m256 m[NR];
    for (int a = 0; a < NR; ++a) m[a] = _mm256_loadu_ps(Mp + a * cols + j);
    float* tile = Q + j * r;
    for (size_t k = 0; k < r; ++k) {
      __m256 v = _mm256_loadu_ps(tile + k * 8);
      for (int a = 0; a < NR; ++a) {
        v = _mm256_fmadd_ps(m[a], _mm256_broadcast_ss(P + a * r + k), v);
      }
      _mm256_storeu_ps(tile + k * 8, v);
    }
  }
  for (size_t j = cols8; j < cols; ++j) {
    float* q = Q + j * r;
    for (int a = 0; a < NR; ++a) {
      const float v = Mp[a * cols + j];
      const float* p = P + a * r;
      for (size_t k = 0; k < r; ++k) q[k] = std::fma(v, p[k], q[k]);
    }
  }
}

void powerBackAvx2(const float* Mp, size_t rows, size_t cols, const float* P, size_t r, float* Q) {
  if (r == 0 || r > kMaxVecRank) {
    powerBackGeneric(Mp, rows, cols, P, r, Q);
    return;
  }
  std::memset(Q, 0, cols * r * sizeof(float));
  size_t i = 0;
  for (; i + 8 <= rows; i += 8) backRows<8>(Mp + i * cols, cols, P + i * r, r, Q);
  for (; i < rows; ++i) backRows<1>(Mp + i * cols, cols, P + i * r, r, Q);
  // Tiles back to row-major.
  alignas(32) float tmp[kMaxVecRank * 8];
  const size_t cols8 = cols & ~size_t{7};
  for (size_t j = 0; j < cols8; j += 8) {
    float* tile = Q + j * r;
    std::memcpy(tmp, tile, 8 * r * sizeof(float));
    for (size_t l = 0; l < 8; ++l) {
      for (size_t k = 0; k < r; ++k) tile[l * r + k] = tmp[k * 8 + l];
    }
  }
}

// powerApprox on 8 rows (P, out, E at the first row). pt[k] = P[0..7][k] as a vector; the 8
// output columns j..j+7 are 8 independent chains over k, transposed back to rows and stored;
// then, per chunk, E = E - out row by row (see kChunkCols). R > 0 fixes the rank at compile
// time (R == r); R == 0 takes any r <= kMaxVecRank.
template <int R>
void approxRows(const float* P, const float* Q, size_t cols, size_t r, float* out, float* E,
                float outScale) {
  const size_t rank = R > 0 ? R : r;
  alignas(32) float pt[kMaxVecRank * 8];
  for (size_t a = 0; a < 8; ++a) {
    for (size_t k = 0; k < rank; ++k) pt[k * 8 + a] = P[a * r + k];
  }
  for (size_t j0 = 0; j0 < cols; j0 += kChunkCols) {
    const size_t j1 = std::min(cols, j0 + kChunkCols);
    size_t j = j0;
    for (; j + 8 <= j1; j += 8) {
      __m256 o[8];
      for (int b = 0; b < 8; ++b) o[b] = _mm256_setzero_ps();
      const float* q = Q + j * r;
      for (size_t k = 0; k < rank; ++k) {
        const __m256 p = _mm256_load_ps(pt + k * 8);
        for (size_t b = 0; b < 8; ++b) {
          o[b] = _mm256_fmadd_ps(p, _mm256_broadcast_ss(q + b * r + k), o[b]);
        }
      }
      for (size_t h = 0; h < 8; h += 4) {
        transpose4InHalves(o[h], o[h + 1], o[h + 2], o[h + 3]);
        for (size_t a = 0; a < 4; ++a) {
          storePair(out + a * cols + j + h, out + (a + 4) * cols + j + h, o[h + a]);
        }
      }
    }
    for (; j < j1; ++j) {  // the columns after the last multiple of 8
      const float* q = Q + j * r;
      __m256 o = _mm256_setzero_ps();
      for (size_t k = 0; k < rank; ++k) {
        o = _mm256_fmadd_ps(_mm256_load_ps(pt + k * 8), _mm256_broadcast_ss(q + k), o);
      }
      alignas(32) float v[8];
      _mm256_store_ps(v, o);
      for (size_t a = 0; a < 8; ++a) out[a * cols + j] = v[a];
    }
    if (E != nullptr || outScale != 1.0f) {
      for (size_t a = 0; a < 8; ++a) {
        residualAndScale(out + a * cols + j0, E != nullptr ? E + a * cols + j0 : nullptr, j1 - j0,
                         outScale);
      }
    }
  }
}

void powerApproxAvx2(const float* P, const float* Q, size_t rows, size_t cols, size_t r, float* out,
                     float* E, float outScale) {
  if (r > kMaxVecRank) {
    approxScalar(P, Q, rows, cols, r, out, E, outScale);
    return;
  }
  void (*rows8)(const float*, const float*, size_t, size_t, float*, float*, float);
  switch (r) {
    case 1:
      rows8 = approxRows<1>;
      break;
    case 2:
      rows8 = approxRows<2>;
      break;
    case 3:
      rows8 = approxRows<3>;
      break;
    case 4:
      rows8 = approxRows<4>;
      break;
    case 8:
      rows8 = approxRows<8>;
      break;
    default:
      rows8 = approxRows<0>;
      break;
  }
  size_t i = 0;
  for (; i + 8 <= rows; i += 8) {
    rows8(P + i * r, Q, cols, r, out + i * cols, E != nullptr ? E + i * cols : nullptr, outScale);
  }
  if (i < rows) {
    approxScalar(P + i * r, Q, rows - i, cols, r, out + i * cols,
                 E != nullptr ? E + i * cols : nullptr, outScale);
  }
}

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif  // TUTTI_DENSE_X86

bool useAvx2() {
#if TUTTI_DENSE_X86
  static const bool kFma = __builtin_cpu_supports("fma") && __builtin_cpu_supports("avx2");
  const KernelIsa isa = activeIsa();
  return kFma && (isa == KernelIsa::kAvx2 || isa == KernelIsa::kAvx512);
#else
  return false;
#endif
}

// ---- fillGaussian -----------------------------------------------------------------------------

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;

uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

constexpr double kLn2 = 0.69314718055994530942;
constexpr double kHalfPi = 1.57079632679489661923;
constexpr double kSqrtHalf = 0.70710678118654752440;

// (-1)^(n/2) / n!, the coefficient of t^n in the sine (odd n) and cosine (even n) series. Every
// n! used is exact in double (odd part < 2^53) and the compiler rounds each quotient once.
constexpr double signedInvFactorial(int n) {
  double f = 1.0;
  for (int i = 2; i <= n; ++i) f *= i;
  return (n / 2 % 2 == 0 ? 1.0 : -1.0) / f;
}

template <size_t... I>
constexpr std::array<double, sizeof...(I)> factorialTable(std::index_sequence<I...>) {
  return {signedInvFactorial(static_cast<int>(I))...};
}

constexpr std::array<double, 21> kSignedInvFactorial =
    factorialTable(std::make_index_sequence<21>{});

template <size_t... I>
constexpr std::array<double, sizeof...(I)> invOddTable(std::index_sequence<I...>) {
  return {(1.0 / static_cast<double>(2 * I + 1))...};
}

// 1 / (2n + 1), n = 0..11.
constexpr std::array<double, 12> kInvOdd = invOddTable(std::make_index_sequence<12>{});

// ln x for x in [2^-53, 1]: x = m 2^e with m in [sqrt(1/2), sqrt(2)), ln m = 2 atanh(s),
// s = (m - 1) / (m + 1), |s| <= 0.1716, series to s^23 (truncation < 1e-18).
double logUnit(double x) {
  int e = 0;
  double m = std::frexp(x, &e);  // exact
  if (m < kSqrtHalf) {
    m = m * 2.0;
    e -= 1;
  }
  const double s = (m - 1.0) / (m + 1.0);
  const double s2 = s * s;
  double poly = kInvOdd[11];
  for (int n = 10; n >= 0; --n) poly = poly * s2 + kInvOdd[n];
  return static_cast<double>(e) * kLn2 + 2.0 * s * poly;
}

// sin t and cos t for t in [0, pi/4]: Taylor series to t^19 / t^20 (truncation < 1e-17).
void sinCosSmall(double t, double* sn, double* cs) {
  const double t2 = t * t;
  double ps = kSignedInvFactorial[19];
  for (int n = 17; n >= 1; n -= 2) ps = ps * t2 + kSignedInvFactorial[n];
  double pc = kSignedInvFactorial[20];
  for (int n = 18; n >= 0; n -= 2) pc = pc * t2 + kSignedInvFactorial[n];
  *sn = t * ps;
  *cs = pc;
}

// The pair p of fillGaussian's sequence for key K.
void gaussianPair(uint64_t key, uint64_t p, float* z0, float* z1) {
  const uint64_t w1 = mix64(key + (2 * p + 1) * kGolden);
  const uint64_t w2 = mix64(key + (2 * p + 2) * kGolden);
  const double u1 = static_cast<double>((w1 >> 11) + 1) * 0x1.0p-53;  // (0, 1]
  const double u2 = static_cast<double>(w2 >> 11) * 0x1.0p-53;        // [0, 1)
  const double radius = std::sqrt(-2.0 * logUnit(u1));
  // 2 pi u2 = quadrant * pi/2 + t; 4 u2 and its fraction are exact, and t is folded to
  // [0, pi/4] by sin(pi/2 - t) = cos t.
  const double u4 = u2 * 4.0;
  const int quadrant = static_cast<int>(u4);
  const double f = u4 - quadrant;
  double sn;
  double cs;
  if (f <= 0.5) {
    sinCosSmall(f * kHalfPi, &sn, &cs);
  } else {
    sinCosSmall((1.0 - f) * kHalfPi, &cs, &sn);
  }
  double sinA;
  double cosA;
  switch (quadrant) {
    case 0:
      sinA = sn;
      cosA = cs;
      break;
    case 1:
      sinA = cs;
      cosA = -sn;
      break;
    case 2:
      sinA = -sn;
      cosA = -cs;
      break;
    default:
      sinA = -cs;
      cosA = sn;
      break;
  }
  *z0 = static_cast<float>(radius * cosA);
  *z1 = static_cast<float>(radius * sinA);
}

}  // namespace

void fillGaussian(float* x, size_t n, uint64_t seed, uint64_t stream) {
  if (n == 0) return;
  const uint64_t key =
      mix64(mix64(seed + kGolden) ^ (stream * 0xD1B54A32D192ED03ull + 0x632BE59BD9B4E019ull));
  for (size_t i = 0; i < n; i += 2) {
    float z0;
    float z1;
    gaussianPair(key, i / 2, &z0, &z1);
    x[i] = z0;
    if (i + 1 < n) x[i + 1] = z1;
  }
}

void powerProject(const float* M, float* E, size_t rows, size_t cols, const float* Q, size_t r,
                  float* P) {
  if (rows == 0) return;
#if TUTTI_DENSE_X86
  if (useAvx2()) return powerProjectAvx2(M, E, rows, cols, Q, r, P);
#endif
  powerProjectGeneric(M, E, rows, cols, Q, r, P);
}

void powerBack(const float* Mp, size_t rows, size_t cols, const float* P, size_t r, float* Q) {
  if (cols == 0 || r == 0) return;
#if TUTTI_DENSE_X86
  if (useAvx2()) return powerBackAvx2(Mp, rows, cols, P, r, Q);
#endif
  powerBackGeneric(Mp, rows, cols, P, r, Q);
}

void powerApprox(const float* P, const float* Q, size_t rows, size_t cols, size_t r, float* out,
                 float* E, float outScale) {
  if (rows == 0 || cols == 0) return;
#if TUTTI_DENSE_X86
  if (useAvx2()) return powerApproxAvx2(P, Q, rows, cols, r, out, E, outScale);
#endif
  powerApproxGeneric(P, Q, rows, cols, r, out, E, outScale);
}

void orthonormalizeColumns(float* P, size_t rows, size_t r, float eps) {
  for (size_t c = 0; c < r; ++c) {
    for (int pass = 0; pass < 2; ++pass) {
      for (size_t p = 0; p < c; ++p) {
        double dot = 0.0;
        for (size_t i = 0; i < rows; ++i)
          dot += static_cast<double>(P[i * r + p]) * static_cast<double>(P[i * r + c]);
        for (size_t i = 0; i < rows; ++i)
          P[i * r + c] = static_cast<float>(static_cast<double>(P[i * r + c]) -
                                            dot * static_cast<double>(P[i * r + p]));
      }
    }
    double sumSq = 0.0;
    for (size_t i = 0; i < rows; ++i) {
      const double v = P[i * r + c];
      sumSq += v * v;
    }
    const double divisor = std::sqrt(sumSq) + static_cast<double>(eps);
    if (divisor != 0.0)
      for (size_t i = 0; i < rows; ++i)
        P[i * r + c] = static_cast<float>(static_cast<double>(P[i * r + c]) / divisor);
  }
}

}  // namespace tutti::cpu
