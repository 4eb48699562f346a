// dense_kernels.h: the scalar definition of every function, the AVX2+FMA variants of the three
// products and an AVX-512 powerBack (bit-identical: per output element they issue the same
// fused multiply-adds on the same operands in the same order), and the choice between them.
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
// 2 x 128 x 8 floats = 8 KiB for powerProject, a 16 KiB panel for the other two); larger ranks
// take the scalar code.
constexpr size_t kMaxVecRank = 128;

// ---- scalar definition ------------------------------------------------------------------------
// Always inlined so that the AVX2 variants, which use these for leftover rows, get them compiled
// with hardware FMA instead of calls to fmaf.

// Rows [0, rows) of powerProject.
// The chain of pending's approximation at row i, column j (as approxScalar's).
TUTTI_DENSE_INLINE float pendingChain(const PendingApprox& pa, size_t i, size_t j) {
  const float* q = pa.Qb + (j / 8) * 8 * pa.r + j % 8;
  float acc = 0.0f;
  for (size_t k = 0; k < pa.r; ++k) acc = std::fma(pa.P[i * pa.r + k], q[k * 8], acc);
  return acc;
}

// Rows [0, rows) of powerProject (pending's P at the same first row as M).
TUTTI_DENSE_INLINE void projectScalar(const float* M, float* E, size_t rows, size_t cols,
                                      const float* Q, size_t r, float* P,
                                      const PendingApprox* pending) {
  for (size_t i = 0; i < rows; ++i) {
    const float* m = M + i * cols;
    float* e = E != nullptr ? E + i * cols : nullptr;
    float* p = P + i * r;
    for (size_t k = 0; k < r; ++k) p[k] = 0.0f;
    for (size_t j = 0; j < cols; ++j) {
      float v = m[j];
      if (e != nullptr) {
        v = pending != nullptr ? v + (e[j] - pendingChain(*pending, i, j)) : v + e[j];
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
                         size_t r, float* P, const PendingApprox* pending) {
  projectScalar(M, E, rows, cols, Q, r, P, pending);
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

// ---- column panels (powerBack, powerApprox) ----------------------------------------------------
// powerBack and powerApprox work on column panels: Q's rows j0..j1 held transposed on the stack
// (qt[k * w + jj] = Q[j0 + jj][k], w = j1 - j0, a multiple of 8 but for the last panel), so
// that 8 consecutive columns j of one row of M are one vector against one broadcast of P[i][k].
// Every row of M, out and E is then read or written as runs of w floats, and no transposing
// shuffles are needed. kPanelFloats bounds the panel: 16 KiB on the stack, so it stays in L1
// (w = 1024 at r = 4).
constexpr size_t kPanelFloats = 4096;

size_t panelWidth(size_t cols, size_t r) {
  return std::min(cols, std::max<size_t>(8, (kPanelFloats / r) & ~size_t{7}));
}

// ---- AVX2 + FMA -------------------------------------------------------------------------------
#if TUTTI_DENSE_X86
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#endif

// powerProject: blocks of 16 (or 8) rows are handled in column chunks, each in two passes: a
// row-by-row elementwise pass (E = M + E) and a transposing pass that touches the block's rows
// at once to run the chains (lanes are rows, since each chain runs along a row). Keeping the
// passes apart matters with power-of-two row pitches: rows then share every 4 KiB offset, and
// a load just after a store to the same offset of another row stalls (4K aliasing), while row
// by row the streams are contiguous. A chunk of 16 rows x 8192 floats (512 KiB) stays in L2
// between passes, so memory still sees one pass.
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

// e[x] = m[x] + (e[x] - a[x]) for x < n on each of NR rows (m, e at the first row, pitch
// cols; p at the first row's pending P, pitch r), a[x] the chain over k of p[k] * Q[x][k] with
// Q in packPendingQ's blocks from qb (powerProject's M' with the pending residual update; the
// lanes are columns, as in powerApprox, and each chain starts from +0 and runs over k in
// order). R > 0 fixes the rank at compile time. Each block of qb is loaded once for the NR
// rows, which divides the stream of packed Q through L2 (as large as M' for r = 4) by NR.
// projectRows uses NR = 4 (4096 x 4096, r = 4, on Zen 5: 8.9 ms against 10.3 for NR = 1 or 2
// and 9.7 for 8). The rows' loads come before their stores, so no load follows a store to the
// same 4 KiB offset of another row.
template <int R, int NR>
TUTTI_DENSE_INLINE void addPendingIntoRows(const float* m, float* e, size_t cols,
                                           const float* p, const float* qb, size_t r, size_t n) {
  const size_t rank = R > 0 ? R : r;
  size_t x = 0;
  for (; x + 8 <= n; x += 8) {
    const float* q = qb + x * rank;
    __m256 a[NR];
#pragma GCC unroll 8
    for (int row = 0; row < NR; ++row) a[row] = _mm256_setzero_ps();
#pragma GCC unroll 8
    for (size_t k = 0; k < rank; ++k) {
      const __m256 qv = _mm256_loadu_ps(q + k * 8);
#pragma GCC unroll 8
      for (int row = 0; row < NR; ++row)
        a[row] = _mm256_fmadd_ps(_mm256_broadcast_ss(p + row * rank + k), qv, a[row]);
    }
    __m256 d[NR];
#pragma GCC unroll 8
    for (int row = 0; row < NR; ++row) {
      const size_t o = row * cols + x;
      const __m256 diff = _mm256_sub_ps(_mm256_loadu_ps(e + o), a[row]);
      d[row] = _mm256_add_ps(_mm256_loadu_ps(m + o), diff);
    }
#pragma GCC unroll 8
    for (int row = 0; row < NR; ++row) _mm256_storeu_ps(e + row * cols + x, d[row]);
  }
  for (int row = 0; row < NR; ++row) {  // the columns after the last multiple of 8
    const float* pr = p + row * rank;
    for (size_t xx = x; xx < n; ++xx) {
      const float* q = qb + (xx / 8) * 8 * rank + xx % 8;
      float a = 0.0f;
      for (size_t k = 0; k < rank; ++k) a = std::fma(pr[k], q[k * 8], a);
      const size_t o = row * cols + xx;
      e[o] = m[o] + (e[o] - a);
    }
  }
}

// Adds columns j..j+7 of 8 * G rows at src (pitch cols) to the chains s[g][kk] (lane a = row
// 8g + a) of ranks k0..k0+KC-1: for b = 0..7 in order,
// s[g][kk] = fma(M'[8g + a][j + b], Q[j + b][k0 + kk], s[g][kk]).
template <int KC, int G>
TUTTI_DENSE_INLINE void projectColumns8(const float* src, size_t cols, size_t j, const float* Q,
                                        size_t r, size_t k0, __m256 s[G][KC]) {
  // Fully unrolled (the pragmas), so that c and s live in registers: GCC at -O2 otherwise keeps
  // them in stack arrays and every fma makes a round trip through memory.
#pragma GCC unroll 2
  for (size_t h = 0; h < 8; h += 4) {
    __m256 c[G][4];  // c[g][b] lane a = src[8g + a][j + h + b]
#pragma GCC unroll 2
    for (int g = 0; g < G; ++g) {
      const float* rows = src + static_cast<size_t>(g) * 8 * cols + j + h;
#pragma GCC unroll 4
      for (size_t a = 0; a < 4; ++a) c[g][a] = loadPair(rows + a * cols, rows + (a + 4) * cols);
      transpose4InHalves(c[g][0], c[g][1], c[g][2], c[g][3]);
    }
#pragma GCC unroll 4
    for (size_t b = 0; b < 4; ++b) {
      const float* q = Q + (j + h + b) * r + k0;
#pragma GCC unroll 4
      for (int kk = 0; kk < KC; ++kk) {
        const __m256 qv = _mm256_broadcast_ss(q + kk);
#pragma GCC unroll 2
        for (int g = 0; g < G; ++g) s[g][kk] = _mm256_fmadd_ps(c[g][b], qv, s[g][kk]);
      }
    }
  }
}

// powerProject's chains for 8 * G rows (src at the first row; M' already formed), columns
// [j0, j1), ranks [k0, k0 + KC). acc[(g * r + k) * 8 + a] is the running chain of P[8g + a][k];
// each chain gets its fmas in increasing j, as in projectScalar. G = 2 keeps 8 independent
// chains in flight for r >= 4 (an FMA's latency is ~4 cycles and two issue per cycle).
template <int KC, int G>
void projectSpan(const float* src, size_t cols, size_t j0, size_t j1, const float* Q, size_t r,
                 size_t k0, float* acc) {
  __m256 s[G][KC];
  for (int g = 0; g < G; ++g) {
    for (int kk = 0; kk < KC; ++kk) s[g][kk] = _mm256_load_ps(acc + (g * r + k0 + kk) * 8);
  }
  size_t j = j0;
  for (; j + 8 <= j1; j += 8) projectColumns8<KC, G>(src, cols, j, Q, r, k0, s);
  for (; j < j1; ++j) {  // the columns after the last multiple of 8
    const float* q = Q + j * r + k0;
    for (int g = 0; g < G; ++g) {
      alignas(32) float col[8];
      for (size_t a = 0; a < 8; ++a) col[a] = src[(g * 8 + a) * cols + j];
      const __m256 c = _mm256_load_ps(col);
      for (int kk = 0; kk < KC; ++kk) {
        s[g][kk] = _mm256_fmadd_ps(c, _mm256_broadcast_ss(q + kk), s[g][kk]);
      }
    }
  }
  for (int g = 0; g < G; ++g) {
    for (int kk = 0; kk < KC; ++kk) _mm256_store_ps(acc + (g * r + k0 + kk) * 8, s[g][kk]);
  }
}

// powerProject on 8 * G rows (M, E, P at the first row), chunk by chunk: M' = M + E into E row
// by row, then the chains over the chunk, 4 ranks at a time (ranks above 4 re-read the chunk
// from cache).
// With pending (its P at the block's first row), M' also takes the pending residual update.
template <int G>
void projectRows(const float* M, float* E, size_t cols, const float* Q, size_t r, float* P,
                 const PendingApprox* pending) {
  alignas(32) float acc[G * kMaxVecRank * 8];
  std::memset(acc, 0, G * r * 8 * sizeof(float));
  const float* src = E != nullptr ? E : M;
  for (size_t j0 = 0; j0 < cols; j0 += kChunkCols) {
    const size_t j1 = std::min(cols, j0 + kChunkCols);
    if (E != nullptr && pending != nullptr) {
      const size_t pr = pending->r;
      for (size_t a = 0; a < 8 * G; a += 4) {
        const float* pa = pending->P + a * pr;
        const float* qb = pending->Qb + j0 * pr;  // j0 is a multiple of 8
        if (pr == 4) {
          addPendingIntoRows<4, 4>(M + a * cols + j0, E + a * cols + j0, cols, pa, qb, pr,
                                   j1 - j0);
        } else {
          addPendingIntoRows<0, 4>(M + a * cols + j0, E + a * cols + j0, cols, pa, qb, pr,
                                   j1 - j0);
        }
      }
    } else if (E != nullptr) {
      for (size_t a = 0; a < 8 * G; ++a) addInto(M + a * cols + j0, E + a * cols + j0, j1 - j0);
    }
    for (size_t k0 = 0; k0 < r; k0 += 4) {
      switch (std::min<size_t>(4, r - k0)) {
        case 1:
          projectSpan<1, G>(src, cols, j0, j1, Q, r, k0, acc);
          break;
        case 2:
          projectSpan<2, G>(src, cols, j0, j1, Q, r, k0, acc);
          break;
        case 3:
          projectSpan<3, G>(src, cols, j0, j1, Q, r, k0, acc);
          break;
        default:
          projectSpan<4, G>(src, cols, j0, j1, Q, r, k0, acc);
          break;
      }
    }
  }
  for (int g = 0; g < G; ++g) {
    for (size_t a = 0; a < 8; ++a) {
      for (size_t k = 0; k < r; ++k) P[(g * 8 + a) * r + k] = acc[(g * r + k) * 8 + a];
    }
  }
}

void powerProjectAvx2(const float* M, float* E, size_t rows, size_t cols, const float* Q, size_t r,
                      float* P, const PendingApprox* pending) {
  if (r == 0 || r > kMaxVecRank) {
    projectScalar(M, E, rows, cols, Q, r, P, pending);
    return;
  }
  // The pending update of rows from i on: its P advanced to row i.
  auto from = [&](size_t i, PendingApprox* at) -> const PendingApprox* {
    if (pending == nullptr) return nullptr;
    *at = {pending->P + i * pending->r, pending->Qb, pending->r};
    return at;
  };
  PendingApprox at{};
  size_t i = 0;
  for (; i + 16 <= rows; i += 16) {
    projectRows<2>(M + i * cols, E != nullptr ? E + i * cols : nullptr, cols, Q, r, P + i * r,
                   from(i, &at));
  }
  for (; i + 8 <= rows; i += 8) {
    projectRows<1>(M + i * cols, E != nullptr ? E + i * cols : nullptr, cols, Q, r, P + i * r,
                   from(i, &at));
  }
  if (i < rows) {
    projectScalar(M + i * cols, E != nullptr ? E + i * cols : nullptr, rows - i, cols, Q, r,
                  P + i * r, from(i, &at));
  }
}

// Adds rows [i0, i0 + NR) of Mp^T P into the panel qt (columns j0 .. j0 + w of Q, transposed):
// for each element the rows are applied in increasing i, as in backScalar.
template <int NR>
void backPanelRows(const float* Mp, size_t cols, size_t i0, size_t j0, size_t w, const float* P,
                   size_t r, float* qt) {
  const float* m = Mp + i0 * cols + j0;
  const float* p = P + i0 * r;
  size_t jj = 0;
  for (; jj + 8 <= w; jj += 8) {
    __m256 mv[NR];
#pragma GCC unroll 4
    for (int a = 0; a < NR; ++a) mv[a] = _mm256_loadu_ps(m + a * cols + jj);
    for (size_t k = 0; k < r; ++k) {
      float* q = qt + k * w + jj;
      __m256 v = _mm256_loadu_ps(q);
#pragma GCC unroll 4
      for (int a = 0; a < NR; ++a) v = _mm256_fmadd_ps(mv[a], _mm256_broadcast_ss(p + a * r + k), v);
      _mm256_storeu_ps(q, v);
    }
  }
  for (; jj < w; ++jj) {
    for (size_t k = 0; k < r; ++k) {
      float* q = qt + k * w + jj;
      for (int a = 0; a < NR; ++a) *q = std::fma(m[a * cols + jj], p[a * r + k], *q);
    }
  }
}

// The chain of one powerApprox element (column jj of the panel): as approxScalar.
TUTTI_DENSE_INLINE float approxChain(const float* pi, const float* qt, size_t w, size_t rank,
                                     size_t jj) {
  float acc = 0.0f;
  for (size_t k = 0; k < rank; ++k) acc = std::fma(pi[k], qt[k * w + jj], acc);
  return acc;
}

// powerApprox on one row segment (out, E at column j0 of row i; pi = P's row i), against the
// panel qt of width w: the chain over k per element, then the residual and the scaling in
// registers (E and out each touched once). With kStream, out is written with non-temporal
// stores (no read for ownership: out is written whole and not read here); the elements before
// the first 32-byte boundary of out are computed one at a time.
template <int R, bool kStream>
TUTTI_DENSE_INLINE void approxPanelRow(const float* pi, const float* qt, size_t w, size_t r,
                                       float* out, float* E, float outScale) {
  const size_t rank = R > 0 ? R : r;
  const bool scaled = outScale != 1.0f;
  const __m256 sv = _mm256_set1_ps(outScale);
  auto one = [&](size_t jj) {
    const float acc = approxChain(pi, qt, w, rank, jj);
    if (E != nullptr) E[jj] = E[jj] - acc;
    out[jj] = scaled ? outScale * acc : acc;
  };
  size_t jj = 0;
  if (kStream) {
    const size_t misaligned = (reinterpret_cast<uintptr_t>(out) / sizeof(float)) & 7;
    for (const size_t head = std::min(w, (8 - misaligned) & 7); jj < head; ++jj) one(jj);
  }
  for (; jj + 8 <= w; jj += 8) {
    __m256 o = _mm256_setzero_ps();
#pragma GCC unroll 8
    for (size_t k = 0; k < rank; ++k) {
      o = _mm256_fmadd_ps(_mm256_broadcast_ss(pi + k), _mm256_loadu_ps(qt + k * w + jj), o);
    }
    if (E != nullptr) _mm256_storeu_ps(E + jj, _mm256_sub_ps(_mm256_loadu_ps(E + jj), o));
    if (scaled) o = _mm256_mul_ps(sv, o);
    if (kStream) {
      _mm256_stream_ps(out + jj, o);
    } else {
      _mm256_storeu_ps(out + jj, o);
    }
  }
  for (; jj < w; ++jj) one(jj);
}

template <int R, bool kStream>
void approxPanel(const float* P, const float* qt, size_t rows, size_t cols, size_t j0, size_t w,
                 size_t r, float* out, float* E, float outScale) {
  for (size_t i = 0; i < rows; ++i) {
    approxPanelRow<R, kStream>(P + i * r, qt, w, r, out + i * cols + j0,
                               E != nullptr ? E + i * cols + j0 : nullptr, outScale);
  }
}

// Outputs at least this large are written with non-temporal stores: they do not fit the
// caches, and skipping the read for ownership saves a third of powerApprox's memory traffic.
// Smaller ones are likely read again soon from cache.
constexpr size_t kStreamBytes = size_t{8} << 20;

using ApproxPanelFn = void (*)(const float*, const float*, size_t, size_t, size_t, size_t, size_t,
                               float*, float*, float);

template <bool kStream>
ApproxPanelFn approxPanelFor(size_t r) {
  switch (r) {
    case 1:
      return approxPanel<1, kStream>;
    case 2:
      return approxPanel<2, kStream>;
    case 4:
      return approxPanel<4, kStream>;
    case 8:
      return approxPanel<8, kStream>;
    default:
      return approxPanel<0, kStream>;
  }
}

void powerApproxAvx2(const float* P, const float* Q, size_t rows, size_t cols, size_t r, float* out,
                     float* E, float outScale) {
  if (r == 0 || r > kMaxVecRank) {
    approxScalar(P, Q, rows, cols, r, out, E, outScale);
    return;
  }
  // (A float pointer that is not 4-byte aligned never reaches a 32-byte boundary: plain stores.)
  const bool stream = rows * cols * sizeof(float) >= kStreamBytes &&
                      reinterpret_cast<uintptr_t>(out) % sizeof(float) == 0;
  const auto panel = stream ? approxPanelFor<true>(r) : approxPanelFor<false>(r);
  alignas(32) float qt[kPanelFloats];
  const size_t width = panelWidth(cols, r);
  for (size_t j0 = 0; j0 < cols; j0 += width) {
    const size_t w = std::min(width, cols - j0);
    for (size_t jj = 0; jj < w; ++jj) {
      for (size_t k = 0; k < r; ++k) qt[k * w + jj] = Q[(j0 + jj) * r + k];
    }
    panel(P, qt, rows, cols, j0, w, r, out, E, outScale);
  }
  // Non-temporal stores are weakly ordered: make them visible before out is handed to another
  // thread or process (a transport, a peer reading shared memory).
  if (stream) _mm_sfence();
}

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

// ---- AVX-512 ----------------------------------------------------------------------------------
// powerBack is bound by FMA throughput (every element of M meets r fused multiply-adds): 16 lanes
// per instruction instead of 8. The same operations per element, so the same bits.
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx2,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx2,fma")
#endif

// backPanelRows with 16 columns per vector.
template <int NR>
void backPanelRows512(const float* Mp, size_t cols, size_t i0, size_t j0, size_t w, const float* P,
                      size_t r, float* qt) {
  const float* m = Mp + i0 * cols + j0;
  const float* p = P + i0 * r;
  size_t jj = 0;
  for (; jj + 16 <= w; jj += 16) {
    __m512 mv[NR];
#pragma GCC unroll 4
    for (int a = 0; a < NR; ++a) mv[a] = _mm512_loadu_ps(m + a * cols + jj);
    for (size_t k = 0; k < r; ++k) {
      float* q = qt + k * w + jj;
      __m512 v = _mm512_loadu_ps(q);
#pragma GCC unroll 4
      for (int a = 0; a < NR; ++a) v = _mm512_fmadd_ps(mv[a], _mm512_set1_ps(p[a * r + k]), v);
      _mm512_storeu_ps(q, v);
    }
  }
  for (; jj < w; ++jj) {
    for (size_t k = 0; k < r; ++k) {
      float* q = qt + k * w + jj;
      for (int a = 0; a < NR; ++a) *q = std::fma(m[a * cols + jj], p[a * r + k], *q);
    }
  }
}

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

// powerBack over column panels with the given row kernels (4 rows and 1 row at a time).
using BackRowsFn = void (*)(const float*, size_t, size_t, size_t, size_t, const float*, size_t,
                            float*);

void backPanels(const float* Mp, size_t rows, size_t cols, const float* P, size_t r, float* Q,
                BackRowsFn rows4, BackRowsFn rows1) {
  alignas(64) float qt[kPanelFloats];
  const size_t width = panelWidth(cols, r);
  for (size_t j0 = 0; j0 < cols; j0 += width) {
    const size_t w = std::min(width, cols - j0);
    std::memset(qt, 0, r * w * sizeof(float));
    size_t i = 0;
    for (; i + 4 <= rows; i += 4) rows4(Mp, cols, i, j0, w, P, r, qt);
    for (; i < rows; ++i) rows1(Mp, cols, i, j0, w, P, r, qt);
    for (size_t jj = 0; jj < w; ++jj) {
      for (size_t k = 0; k < r; ++k) Q[(j0 + jj) * r + k] = qt[k * w + jj];
    }
  }
}
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

bool useAvx512() {
#if TUTTI_DENSE_X86
  static const bool kAvx512 = __builtin_cpu_supports("avx512f");
  return kAvx512 && useAvx2() && activeIsa() == KernelIsa::kAvx512;
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

size_t pendingQFloats(size_t cols, size_t r) { return (cols + 7) / 8 * 8 * r; }

void packPendingQ(const float* Q, size_t cols, size_t r, float* Qb) {
  std::memset(Qb, 0, pendingQFloats(cols, r) * sizeof(float));
  for (size_t j = 0; j < cols; ++j) {
    for (size_t k = 0; k < r; ++k) Qb[(j / 8) * 8 * r + k * 8 + j % 8] = Q[j * r + k];
  }
}

void applyPending(float* E, size_t rows, size_t cols, const PendingApprox& pending) {
  for (size_t i = 0; i < rows; ++i) {
    float* e = E + i * cols;
    for (size_t j = 0; j < cols; ++j) e[j] = e[j] - pendingChain(pending, i, j);
  }
}

void powerProject(const float* M, float* E, size_t rows, size_t cols, const float* Q, size_t r,
                  float* P, const PendingApprox* pending) {
  if (rows == 0) return;
  if (E == nullptr) pending = nullptr;  // contract: pending needs E; without it, nothing to update
#if TUTTI_DENSE_X86
  if (useAvx2()) return powerProjectAvx2(M, E, rows, cols, Q, r, P, pending);
#endif
  powerProjectGeneric(M, E, rows, cols, Q, r, P, pending);
}

void powerBack(const float* Mp, size_t rows, size_t cols, const float* P, size_t r, float* Q) {
  if (cols == 0 || r == 0) return;
#if TUTTI_DENSE_X86
  if (r <= kMaxVecRank && useAvx512()) {
    return backPanels(Mp, rows, cols, P, r, Q, backPanelRows512<4>, backPanelRows512<1>);
  }
  if (r <= kMaxVecRank && useAvx2()) {
    return backPanels(Mp, rows, cols, P, r, Q, backPanelRows<4>, backPanelRows<1>);
  }
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
