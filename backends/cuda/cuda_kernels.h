// Launchers of the CUDA backend plugin's kernels (cuda_kernels.cu), called by
// cuda_backend.cc. Internal to backends/cuda.
//
// Contract: every launcher only enqueues work on `stream` (which must belong to
// the current device) and returns the launch status; arguments have been
// validated by the caller (datatype/op in range, counts > 0). Pointers are
// device-accessible (device, managed or mapped pinned host memory). Nothing
// here synchronises, allocates or keeps state, so calls are thread-safe.
#pragma once

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "backends/cuda/kernel_ops.h"

namespace tutti_cuda {

struct ReduceLaunch {
  int dtype;  // tutti_cuda::DType
  int op;     // tutti_cuda::Op
  int nSrcs;  // 1..kMaxReduceSrcs
  uint64_t count;
  void* dst;
  const void* srcs[kMaxReduceSrcs];
  // PREMULSUM: the scalar element either in device memory (scalarDev), read when
  // the kernel runs, or by value (scalarBits, the element's bytes, low first).
  const void* scalarDev;
  uint64_t scalarBits;
  uint32_t avgDivisor;  // AVG, >= 1
};

cudaError_t launchReduce(const ReduceLaunch& args, cudaStream_t stream);

// fp32 -> fp16/bf16 (toNarrow) or fp16/bf16 -> fp32; narrowType is kFloat16 or kBfloat16.
cudaError_t launchCastScaled(void* dst, const void* src, int narrowType, bool toNarrow,
                             uint64_t count, float scale, cudaStream_t stream);

// tutti's 1-bit codec (kernel_ops.h); err may be null.
cudaError_t launchPack1bit(const float* src, float* err, void* wire, uint64_t count,
                           cudaStream_t stream);
cudaError_t launchUnpack1bit(float* dst, const void* wire, uint64_t count, bool accumulate,
                             cudaStream_t stream);

cudaError_t launchGemm(bool transA, bool transB, int64_t m, int64_t n, int64_t k, float alpha,
                       const float* A, int64_t lda, const float* B, int64_t ldb, float beta,
                       float* C, int64_t ldc, cudaStream_t stream);

}  // namespace tutti_cuda
