// Reference dense linear algebra for PowerSGD (src/compress) on host memory:
// the low-rank projection M ~ P Q^T with error feedback, the Gram-Schmidt step
// and the Gaussian start for Q. Other backends implement the same operations
// and are checked against these.
//
// Contract (all functions):
// - Matrices are row-major float32, densely packed (row pitch = column count):
//   M, E, out are rows x cols; P is rows x r; Q is cols x r.
// - Pointers need no alignment. Outputs must not overlap inputs unless a
//   function says otherwise. Synchronous, thread-safe, never allocate (the
//   AVX2 variants use at most ~17 KiB of stack).
// - A zero dimension is allowed; outputs that are sums of no terms are +0.
// - NaN and inf propagate as IEEE arithmetic says; NaN payloads are unspecified.
//
// Arithmetic (powerProject, powerBack, powerApprox): every element of a
// product is ONE chain of fused multiply-adds over the summed index, in
// increasing index order, starting from +0.0f:
//     acc = +0.0f;  for t = 0, 1, ...: acc = fmaf(a[t], b[t], acc)
// (fmaf: the exact product plus acc, rounded once, IEEE round to nearest even).
// Elementwise updates are single float adds/subtracts. No other contraction or
// reassociation happens, so results are bit-identical on every instruction set
// (the scalar code calls std::fma, the AVX2 code issues _mm256_fmadd_ps on the
// same operands in the same order per element) and any backend can reproduce
// them exactly (CUDA: __fmaf_rn, __fadd_rn, __fsub_rn). The accuracy is that of
// a plain float dot product: |error| <= ~n * 2^-24 * sum |a[t] b[t]| (n terms),
// typically ~sqrt(n) * 2^-24 relative.
//
// Instruction sets: the generic (scalar) code is the definition; the AVX2+FMA
// variants of the three products run when kernel_dispatch.h's activeIsa() is
// avx2 or avx512 and the CPU has FMA; with avx512, powerBack (bound by FMA
// throughput) runs 16 lanes wide.
// Ranks above 128 always take the scalar code. powerApprox writes outputs of
// 8 MiB and more with non-temporal stores (and fences them before returning).
#pragma once

#include <cstddef>
#include <cstdint>

namespace tutti::cpu {

// x[i] = a standard normal sample that is a pure function of (seed, stream, i):
// identical on every machine, compiler and instruction set, independent of n
// (a prefix of a longer fill equals a shorter fill) and of how the fill is
// split. Different (seed, stream) pairs give independent-looking sequences.
//
// Definition: SplitMix64 with key K = mix(mix(seed + G) ^ (stream * C + D)),
// word(t) = mix(K + (t + 1) * G) (G = 0x9E3779B97F4A7C15, C = 0xD1B54A32D192ED03,
// D = 0x632BE59BD9B4E019, mix = the SplitMix64 finaliser); pair p = i / 2 uses
// u1 = ((word(2p) >> 11) + 1) * 2^-53 in (0, 1] and u2 = (word(2p+1) >> 11) * 2^-53
// in [0, 1); Box-Muller in double, x[2p] = R cos(2 pi u2), x[2p+1] = R sin(2 pi u2)
// with R = sqrt(-2 ln u1), each rounded once to float. ln, sin and cos are this
// file's own polynomial evaluations (|relative error| < 1e-15) built only from
// IEEE +, -, *, / and sqrt with no contraction, never the C library's, so the
// bits do not depend on the libm. |x[i]| < 8.6 always (u1 >= 2^-53).
void fillGaussian(float* x, size_t n, uint64_t seed, uint64_t stream);

// PowerSGD's first product, with error feedback folded into the same pass:
//   M'[i][j] = M[i][j] + E[i][j]   (float add; stored into E when E != nullptr,
//                                    M' = M when E == nullptr)
//   P[i][k]  = sum_j M'[i][j] * Q[j][k]   (fma chain over j = 0..cols-1)
// M, E: rows x cols; Q: cols x r; P: rows x r (overwritten). E may equal M
// exactly (then M' = 2M); P must not overlap M, E or Q. One pass over memory:
// the AVX2 code forms M' for 16 rows x up to 8192 columns and reads it back
// from cache for the products.
//
// With `pending`, the residual update of the previous call's powerApprox, which that call left
// undone (E == nullptr there), is applied in the same pass (error feedback then costs one pass
// over E per call instead of two):
//   a[i][j]  = sum_k pending->P[i][k] * Qprev[j][k]   (fma chain over k = 0..pending->r-1, as
//                                                     powerApprox's)
//   M'[i][j] = M[i][j] + (E[i][j] - a[i][j])     (float subtract, then float add; into E)
// which is bit for bit powerApprox(pending->P, Qprev, ..., E) followed by powerProject without
// it. pending->P: rows x pending->r; pending->Qb: that call's Q (cols x pending->r) as
// packPendingQ lays it out. Neither may overlap E or P. Ignored when E == nullptr.
struct PendingApprox {
  const float* P;
  const float* Qb;
  size_t r;
};

// Lays Q (cols x r, row-major) out for PendingApprox::Qb, in blocks of 8 columns so that the
// pending update reads one stream: Q[j][k] goes to Qb[(j / 8) * 8 * r + k * 8 + j % 8].
// Qb holds pendingQFloats(cols, r) floats (cols rounded up to a multiple of 8; the padding is
// written as zeros and never read).
size_t pendingQFloats(size_t cols, size_t r);
void packPendingQ(const float* Q, size_t cols, size_t r, float* Qb);

// The pending update alone: E[i][j] = E[i][j] - a[i][j] (a as above), bit for bit what
// powerApprox's residual update would have left. Scalar code (for reading a residual, not a
// hot path).
void applyPending(float* E, size_t rows, size_t cols, const PendingApprox& pending);

void powerProject(const float* M, float* E, size_t rows, size_t cols, const float* Q, size_t r,
                  float* P, const PendingApprox* pending = nullptr);

// PowerSGD's second product: Q[j][k] = sum_i Mp[i][j] * P[i][k] (fma chain over
// i = 0..rows-1). Mp: rows x cols (read once, in order); P: rows x r; Q: cols x r
// (overwritten; used as the accumulator, so it must not overlap Mp or P).
void powerBack(const float* Mp, size_t rows, size_t cols, const float* P, size_t r, float* Q);

// The decompressed approximation and the new residual, in one pass:
//   a         = sum_k P[i][k] * Q[j][k]   (fma chain over k = 0..r-1)
//   E[i][j]   = E[i][j] - a               (float subtract; only when E != nullptr,
//                                          E holding M' from powerProject)
//   out[i][j] = outScale * a              (one float multiply; out = a when outScale
//                                          is 1)
// outScale lets a sum all-reduce (outScale = n) keep the residual against the
// average without a second pass over out. P: rows x r; Q: cols x r; out, E:
// rows x cols. out must not overlap E, P or Q.
void powerApprox(const float* P, const float* Q, size_t rows, size_t cols, size_t r, float* out,
                 float* E, float outScale = 1.0f);

// Gram-Schmidt with reorthogonalisation on the r columns of P (rows x r,
// row-major), in place, column by column: from column c the projections on the
// (already orthonormal) columns 0..c-1 are removed twice over ("twice is
// enough": the second pass removes what rounding left of the first), then it
// is divided by (||c|| + eps). Each projection: dot = (p . c), then c[i] =
// c[i] - dot * p[i], for p = 0..c-1 in order. Norms and dot products
// accumulate in double over i = 0..rows-1 in order; each element update is
// computed in double from the float values and rounded once to float.
// Deterministic (no ISA variants). eps (>= 0; PowerSGD uses 1e-8) keeps zero
// or near-zero columns finite: a zero column stays zero. If ||c|| + eps is 0
// (zero column, eps == 0) the column is left as it is (zeros), not NaN.
// A column that depends on earlier ones comes out as normalised rounding
// noise that is still orthogonal to them (the single pass of the PowerSGD
// paper's implementation leaves it pointing largely along them, so a
// rank-deficient P would no longer project exactly).
void orthonormalizeColumns(float* P, size_t rows, size_t r, float eps);

}  // namespace tutti::cpu
