// xpu_emu: the emulated device's kernels. They run on a queue's worker thread
// over the PRIVATE (read/write) views of device memory, or over pinned host
// memory; argument checks and pointer translation happen before a kernel is
// enqueued (xpu_emu.cc), so nothing here can fail.
//
// Arithmetic: the plugin ABI's (backend_plugin.h), which names tutti's CPU
// reference as the definition; every rounding step below is the reference's.
// - reduce, with x_k = srcs[k][i], left to right over the sources:
//   SUM/PROD/MAX/MIN: integers wrap (computed unsigned), MAX/MIN compare with
//   the element's signedness; float32/float64 compute natively;
//   float16/bfloat16/fp8 decode exactly to fp32, accumulate in fp32 and round
//   once at the end (emu_float.h). max(a, b) = a if a is NaN, else
//   (a > b ? a : b) -- NaN propagates and equal operands give b; MIN with <.
//   AVG: integers: the wrapped sum / avgDivisor, C++ truncating division
//   (signed or unsigned per type). Floats: the sum rounded to the element
//   type, times (1 / avgDivisor computed in double, then converted to float --
//   kept double for float64), rounded again.
//   PREMULSUM: the scalar element is read as a double and converted once: to
//   float (double for float64), or for integers truncated toward zero to int64
//   (saturating, NaN -> 0; uint64 takes [2^63, 2^64) directly) and wrapped to
//   the element width. d = s * x_0, then d = d + s * x_k, every step rounded to
//   the element type (fp32 arithmetic for the narrow formats).
// - No FMA contraction anywhere (-ffp-contract=off).
// All functions are synchronous and thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>

#include "tutti/backend_plugin.h"

namespace xpu_emu {

// Bytes per element of an ncclDataType_t value, 0 for an unknown one.
size_t dataTypeBytes(int32_t datatype);

struct ReduceJob {
  int32_t datatype = 0;
  int32_t op = 0;
  uint64_t count = 0;
  char* dst = nullptr;
  int nSrcs = 0;
  const char* const* srcs = nullptr;  // nSrcs device-visible pointers
  unsigned char scalar[8] = {};       // PREMULSUM scalar (one element), if scalarAt is null
  const void* scalarAt = nullptr;     // PREMULSUM scalar read when the kernel runs
  uint32_t avgDivisor = 1;
};
void runReduce(const ReduceJob& job);

// The four conversions of castScaled (see backend_plugin.h); false for any other pair.
bool castPairSupported(int32_t dstType, int32_t srcType);
void runCastScaled(void* dst, int32_t dstType, const void* src, int32_t srcType, uint64_t count,
                   float scale);

// Bytes of the 1-bit wire format for count elements (blocks of
// TUTTI_PLUGIN_SIGN_BLOCK: a float scale, then ceil(len / 8) bytes of bits).
uint64_t signWireBytes(uint64_t count);

// pack1bit / unpack1bit exactly as backend_plugin.h defines them (error may be
// null; src may equal error).
void runPack1bit(const float* src, float* error, unsigned char* wire, uint64_t count);
void runUnpack1bit(float* dst, const unsigned char* wire, uint64_t count, bool accumulate);

// C = alpha * op(A) op(B) + beta * C as tutti's CPU reference computes it: each
// dot product summed in double (exact float products) in increasing t, then
// r = alpha * float(dot) and, when beta != 0, r = r + beta * C (float ops).
// beta == 0 never reads C.
void runGemm(bool transA, bool transB, int64_t m, int64_t n, int64_t k, float alpha, const float* A,
             int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

// Gram-Schmidt as tutti's CPU reference (orthonormalizeColumns) does it, with
// a row stride: per column, two passes of projections on the earlier columns
// (dot in double over the rows in order, each element updated in double and
// rounded once), then division by (norm + eps) in double; a column with
// norm + eps == 0 is left as it is.
void runOrthogonalize(float* M, int64_t rows, int64_t cols, int64_t ld, float eps);

}  // namespace xpu_emu
