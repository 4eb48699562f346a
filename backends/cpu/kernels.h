// Reference reduction kernels on host memory: the hot loop of every collective
// on the CPU backend, and the definition other backends are checked against.
//
// Contract (all functions):
// - count is in elements; count == 0 does nothing and touches no memory.
// - Pointers need no alignment. dst may alias an input exactly (in place);
//   partial overlap is not allowed. reduceN: dst may alias srcs[0] only.
// - Synchronous, never block, never allocate, thread-safe (no shared state
//   beyond the instruction-set choice made once, see kernel_dispatch.h).
// - Unknown DataType / RedOp values: the call does nothing.
//
// Arithmetic:
// - Integers wrap (two's complement, as if computed unsigned); max/min compare
//   with the element's signedness.
// - float32 / float64 compute natively (IEEE, round to nearest even, no FMA
//   contraction: a + s*b is two roundings).
// - float16, bfloat16, fp8 e4m3/e5m2: each element is decoded exactly to fp32,
//   the op runs in fp32 (IEEE RNE, so a single op equals the exact result
//   rounded to fp32), and the fp32 result is rounded once to the destination
//   format with float_formats.h's rules (e4m3 saturates to +-448). reduceN
//   accumulates all n inputs in fp32 and rounds once at the end.
// - max/min on floating types propagate NaN: max(a,b) = NaN if a or b is NaN,
//   else (a > b ? a : b); min likewise with <. On equal operands (+0 vs -0)
//   the second operand b is returned. NaN payloads in results are unspecified.
// - Floating-point environment: the default one is assumed (round to nearest;
//   the narrow-format encoders rely on it). A caller that enables FTZ/DAZ gets
//   flushed fp32/fp64 arithmetic, as any host code would; the encodings
//   themselves stay exact.
#pragma once

#include <cstddef>
#include <cstdint>

#include "base/types.h"

namespace tutti::cpu {

// dst[i] = a[i] OP b[i] for op in {kSum, kProd, kMax, kMin}. kAvg and
// kPreMulSum are mapped by the caller (to divide / preMulReduce); if passed
// here they act as kSum.
void reduce(void* dst, const void* a, const void* b, size_t count, DataType dt, RedOp op);

// dst[i] = a[i] + scalar * b[i]  (PreMulSum: b is the local contribution, a the
// incoming partial). The scalar is converted once: to float for fp32 and the
// narrow formats, kept as double for fp64, and for integers truncated toward
// zero to int64 (saturating at the int64 range, NaN -> 0; uint64 takes values
// in [2^63, 2^64) directly) and then wrapped to the element width.
void preMulReduce(void* dst, const void* a, const void* b, size_t count, DataType dt,
                  double scalar);

// dst[i] = scalar * src[i]; scalar converted as in preMulReduce. May be in place.
void scale(void* dst, const void* src, size_t count, DataType dt, double scalar);

// Average finish: dst[i] = src[i] / n. Integers: C++ truncating division of the
// element's value (signed or unsigned per type). Floating types: computed in
// fp32 (fp64 for float64) with n converted to that type, rounded once to the
// destination. Requires n >= 1; n < 1 copies src to dst. May be in place.
void divide(void* dst, const void* src, size_t count, DataType dt, int64_t n);

// dst[i] = srcs[0][i] OP srcs[1][i] OP ... OP srcs[n-1][i], left to right,
// n >= 1 (n == 1 copies; n < 1 does nothing). Same op rules as reduce().
void reduceN(void* dst, const void* const* srcs, int n, size_t count, DataType dt, RedOp op);

}  // namespace tutti::cpu
