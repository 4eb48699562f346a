// Device kernels of the CUDA backend plugin and their launchers (cuda_kernels.h).
// The per-element arithmetic lives in kernel_ops.h, shared with the host-side
// checks; this file only arranges it over threads.
//
// Contract: see cuda_kernels.h. Determinism: every kernel computes each output
// with a fixed order of operations that does not depend on the launch shape,
// so results are bit-identical run to run and equal kernel_ops.h's host loops.
// Compiled with -fmad=false as a second guard against contraction (kernel_ops.h
// already uses the __f*_rn intrinsics, which are never fused).
#include <stdint.h>
#include <string.h>

#include "backends/cuda/cuda_kernels.h"
#include "backends/cuda/kernel_ops.h"

namespace tutti_cuda {
namespace {

constexpr int kThreads = 256;
constexpr uint64_t kMaxBlocks = 1u << 20;

unsigned blocksFor(uint64_t items, int threads = kThreads) {
  uint64_t b = (items + threads - 1) / threads;
  if (b == 0) b = 1;
  return static_cast<unsigned>(b < kMaxBlocks ? b : kMaxBlocks);
}

__device__ __forceinline__ uint64_t globalThread() {
  return static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ uint64_t gridThreads() {
  return static_cast<uint64_t>(gridDim.x) * blockDim.x;
}

// ---- reduce --------------------------------------------------------------------------
// Thread t handles 16-byte vectors t, t + gridThreads, ... when every pointer is
// 16-byte aligned (vec), then single elements of the tail (or of everything).
// Element i of every source is read by the thread that writes dst[i], before it
// writes it, so dst may be any of the sources.

template <int DT, int OP>
__global__ void __launch_bounds__(kThreads)
    reduceKernel(const __grid_constant__ ReduceLaunch p, AvgParams avg, bool vec) {
  using R = Reducer<DT, OP>;
  using S = typename R::S;
  using C = typename R::C;
  R r{};
  r.avg = avg;
  if constexpr (OP == kPreMulSum) {
    S s;
    if (p.scalarDev != nullptr) {
      s = *static_cast<const S*>(p.scalarDev);
    } else {
      memcpy(&s, &p.scalarBits, sizeof s);
    }
    r.scalar = scalarOf<DT>(s);
  }
  constexpr int kV = 16 / sizeof(S);
  const uint64_t nVec = vec ? p.count / kV : 0;
  const uint64_t stride = gridThreads();
  const uint64_t tid = globalThread();
  union Vec {
    uint4 u;
    S e[kV];
  };
  for (uint64_t v = tid; v < nVec; v += stride) {
    Vec in;
    C acc[kV];
    in.u = static_cast<const uint4*>(p.srcs[0])[v];
#pragma unroll
    for (int j = 0; j < kV; ++j) acc[j] = r.first(in.e[j]);
    for (int k = 1; k < p.nSrcs; ++k) {
      in.u = static_cast<const uint4*>(p.srcs[k])[v];
#pragma unroll
      for (int j = 0; j < kV; ++j) acc[j] = r.next(acc[j], in.e[j]);
    }
    Vec out;
#pragma unroll
    for (int j = 0; j < kV; ++j) out.e[j] = r.finish(acc[j]);
    static_cast<uint4*>(p.dst)[v] = out.u;
  }
  for (uint64_t i = nVec * kV + tid; i < p.count; i += stride) {
    C acc = r.first(static_cast<const S*>(p.srcs[0])[i]);
    for (int k = 1; k < p.nSrcs; ++k) acc = r.next(acc, static_cast<const S*>(p.srcs[k])[i]);
    static_cast<S*>(p.dst)[i] = r.finish(acc);
  }
}

template <int DT, int OP>
cudaError_t reduceGo(const ReduceLaunch& a, cudaStream_t stream) {
  using S = typename Elem<DT>::S;
  constexpr int kV = 16 / sizeof(S);
  bool vec = (reinterpret_cast<uintptr_t>(a.dst) % 16) == 0;
  for (int k = 0; k < a.nSrcs; ++k) vec = vec && (reinterpret_cast<uintptr_t>(a.srcs[k]) % 16) == 0;
  const uint64_t items = vec ? a.count / kV + a.count % kV : a.count;
  reduceKernel<DT, OP>
      <<<blocksFor(items), kThreads, 0, stream>>>(a, makeAvgParams(a.avgDivisor), vec);
  return cudaGetLastError();
}

template <int DT>
cudaError_t reduceDT(const ReduceLaunch& a, cudaStream_t stream) {
  switch (a.op) {
    case kSum:
      return reduceGo<DT, kSum>(a, stream);
    case kProd:
      return reduceGo<DT, kProd>(a, stream);
    case kMax:
      return reduceGo<DT, kMax>(a, stream);
    case kMin:
      return reduceGo<DT, kMin>(a, stream);
    case kAvg:
      return reduceGo<DT, kAvg>(a, stream);
    case kPreMulSum:
      return reduceGo<DT, kPreMulSum>(a, stream);
  }
  return cudaErrorInvalidValue;
}

// ---- castScaled ------------------------------------------------------------------------

template <int DT>
__global__ void toNarrowKernel(typename Elem<DT>::S* dst, const float* src, uint64_t count,
                               float scale) {
  for (uint64_t i = globalThread(); i < count; i += gridThreads())
    dst[i] = castToNarrow<DT>(src[i], scale);
}
template <int DT>
__global__ void fromNarrowKernel(float* dst, const typename Elem<DT>::S* src, uint64_t count,
                                 float scale) {
  for (uint64_t i = globalThread(); i < count; i += gridThreads())
    dst[i] = castFromNarrow<DT>(src[i], scale);
}

template <int DT>
cudaError_t castGo(void* dst, const void* src, bool toNarrow, uint64_t count, float scale,
                   cudaStream_t stream) {
  using S = typename Elem<DT>::S;
  if (toNarrow) {
    toNarrowKernel<DT><<<blocksFor(count), kThreads, 0, stream>>>(
        static_cast<S*>(dst), static_cast<const float*>(src), count, scale);
  } else {
    fromNarrowKernel<DT><<<blocksFor(count), kThreads, 0, stream>>>(
        static_cast<float*>(dst), static_cast<const S*>(src), count, scale);
  }
  return cudaGetLastError();
}

// ---- 1-bit codec ---------------------------------------------------------------------------
// One warp per sign block (kSignBlock = 512 elements, 16 per lane): the lanes
// form c and the bit words (ballot), keep c in shared memory, lanes 0..7 sum
// |c| for their residue class i % 8 in increasing i (kernel_ops.h's order), every
// lane combines the eight partials identically, then errors are written.

constexpr int kPackWarps = 8;
static_assert(kSignBlock == 16 * 32, "one warp covers a sign block in 16 steps");

__global__ void __launch_bounds__(kPackWarps * 32)
    pack1bitKernel(const float* src, float* err, unsigned char* wire, uint64_t count) {
  __shared__ float cs[kPackWarps][kSignBlock];
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  float* c = cs[warp];
  const uint64_t nBlocks = (count + kSignBlock - 1) / kSignBlock;
  for (uint64_t blk = static_cast<uint64_t>(blockIdx.x) * kPackWarps + warp; blk < nBlocks;
       blk += static_cast<uint64_t>(gridDim.x) * kPackWarps) {
    const uint64_t base = blk * kSignBlock;
    const uint32_t len =
        static_cast<uint32_t>(count - base < kSignBlock ? count - base : kSignBlock);
    unsigned char* out = wire + blk * kSignBlockBytes;
    for (uint32_t r = 0; r < kSignBlock / 32; ++r) {
      const uint32_t i = r * 32 + lane;
      bool neg = false;
      if (i < len) {
        const float v = signInput(src[base + i], err != nullptr ? err + base : nullptr, i);
        c[i] = v;
        neg = v < 0.0f;
      }
      const uint32_t word = __ballot_sync(0xffffffffu, neg);
      // Bytes of this word that exist: ceil((len - 32r) / 8), at most 4.
      if (r * 32 < len && lane < 4 && lane * 8 < len - r * 32)
        out[4 + r * 4 + lane] = static_cast<unsigned char>(word >> (8 * lane));
    }
    __syncwarp();
    double p = 0.0;
    if (lane < 8)
      for (uint32_t i = lane; i < len; i += 8) p = dadd(p, static_cast<double>(fabsBits(c[i])));
    double parts[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) parts[j] = __shfl_sync(0xffffffffu, p, j);
    const float scale = signScale(signCombine(parts), len);
    if (lane < 4) out[lane] = static_cast<unsigned char>(bitsOf(scale) >> (8 * lane));
    if (err != nullptr) {
      for (uint32_t i = lane; i < len; i += 32) {
        const float v = c[i];
        err[base + i] = fsub(v, signValue(v < 0.0f, scale));
      }
    }
    __syncwarp();  // c is rewritten by the next block of this warp
  }
}

__global__ void unpack1bitKernel(float* dst, const unsigned char* wire, uint64_t count,
                                 bool accumulate) {
  for (uint64_t i = globalThread(); i < count; i += gridThreads()) {
    const unsigned char* blk = wire + i / kSignBlock * kSignBlockBytes;
    const uint32_t sb = static_cast<uint32_t>(blk[0]) | static_cast<uint32_t>(blk[1]) << 8 |
                        static_cast<uint32_t>(blk[2]) << 16 | static_cast<uint32_t>(blk[3]) << 24;
    const uint32_t j = static_cast<uint32_t>(i % kSignBlock);
    const float d = signValue((blk[4 + j / 8] >> (j % 8)) & 1u, floatOf(sb));
    dst[i] = accumulate ? fadd(dst[i], d) : d;
  }
}

// ---- gemm -----------------------------------------------------------------------------------
// 16 x 16 output tiles; each thread owns one C element and runs its dot product
// in increasing t through shared-memory tiles of op(A) and op(B).

constexpr int kTile = 16;

__global__ void __launch_bounds__(kTile* kTile)
    gemmKernel(bool transA, bool transB, int64_t m, int64_t n, int64_t k, float alpha,
               const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
               int64_t ldc) {
  __shared__ float as[kTile][kTile + 1];
  __shared__ float bs[kTile][kTile + 1];
  const int tx = threadIdx.x;
  const int ty = threadIdx.y;
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kTile + tx;
  for (int64_t tileRow = blockIdx.y; tileRow * kTile < m; tileRow += gridDim.y) {
    const int64_t row = tileRow * kTile + ty;
    double acc = 0.0;
    for (int64_t t0 = 0; t0 < k; t0 += kTile) {
      const int64_t ta = t0 + tx;  // as[ty][tx] = op(A)[row][ta]
      as[ty][tx] = (row < m && ta < k) ? (transA ? A[ta * lda + row] : A[row * lda + ta]) : 0.0f;
      const int64_t tb = t0 + ty;  // bs[ty][tx] = op(B)[tb][col]
      bs[ty][tx] = (tb < k && col < n) ? (transB ? B[col * ldb + tb] : B[tb * ldb + col]) : 0.0f;
      __syncthreads();
      const int lim = k - t0 < kTile ? static_cast<int>(k - t0) : kTile;
      for (int t = 0; t < lim; ++t) acc = gemmStep(acc, as[ty][t], bs[t][tx]);
      __syncthreads();
    }
    if (row < m && col < n) {
      float* c = C + row * ldc + col;
      *c = gemmFinish(acc, alpha, beta, beta == 0.0f ? 0.0f : *c);
    }
  }
}

}  // namespace

cudaError_t launchReduce(const ReduceLaunch& a, cudaStream_t stream) {
  switch (a.dtype) {
    case kInt8:
      return reduceDT<kInt8>(a, stream);
    case kUint8:
      return reduceDT<kUint8>(a, stream);
    case kInt32:
      return reduceDT<kInt32>(a, stream);
    case kUint32:
      return reduceDT<kUint32>(a, stream);
    case kInt64:
      return reduceDT<kInt64>(a, stream);
    case kUint64:
      return reduceDT<kUint64>(a, stream);
    case kFloat16:
      return reduceDT<kFloat16>(a, stream);
    case kFloat32:
      return reduceDT<kFloat32>(a, stream);
    case kFloat64:
      return reduceDT<kFloat64>(a, stream);
    case kBfloat16:
      return reduceDT<kBfloat16>(a, stream);
    case kFp8E4M3:
      return reduceDT<kFp8E4M3>(a, stream);
    case kFp8E5M2:
      return reduceDT<kFp8E5M2>(a, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t launchCastScaled(void* dst, const void* src, int narrowType, bool toNarrow,
                             uint64_t count, float scale, cudaStream_t stream) {
  if (narrowType == kFloat16) return castGo<kFloat16>(dst, src, toNarrow, count, scale, stream);
  if (narrowType == kBfloat16) return castGo<kBfloat16>(dst, src, toNarrow, count, scale, stream);
  return cudaErrorInvalidValue;
}

cudaError_t launchPack1bit(const float* src, float* err, void* wire, uint64_t count,
                           cudaStream_t stream) {
  const uint64_t nBlocks = (count + kSignBlock - 1) / kSignBlock;
  pack1bitKernel<<<blocksFor(nBlocks, kPackWarps), kPackWarps * 32, 0, stream>>>(
      src, err, static_cast<unsigned char*>(wire), count);
  return cudaGetLastError();
}

cudaError_t launchUnpack1bit(float* dst, const void* wire, uint64_t count, bool accumulate,
                             cudaStream_t stream) {
  unpack1bitKernel<<<blocksFor(count), kThreads, 0, stream>>>(
      dst, static_cast<const unsigned char*>(wire), count, accumulate);
  return cudaGetLastError();
}

cudaError_t launchGemm(bool transA, bool transB, int64_t m, int64_t n, int64_t k, float alpha,
                       const float* A, int64_t lda, const float* B, int64_t ldb, float beta,
                       float* C, int64_t ldc, cudaStream_t stream) {
  const uint64_t tilesN = (static_cast<uint64_t>(n) + kTile - 1) / kTile;
  const uint64_t tilesM = (static_cast<uint64_t>(m) + kTile - 1) / kTile;
  if (tilesN > 0x7fffffffu) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(tilesN),
                  static_cast<unsigned>(tilesM < 65535 ? tilesM : 65535));
  gemmKernel<<<grid, dim3(kTile, kTile), 0, stream>>>(transA, transB, m, n, k, alpha, A, lda, B,
                                                      ldb, beta, C, ldc);
  return cudaGetLastError();
}

}  // namespace tutti_cuda
