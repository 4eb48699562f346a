// The SPIR-V of backends/ze/kernels.cl, embedded at build time
// (backends/ze/CMakeLists.txt compiles it with clang-14 and llvm-spirv-14 and
// writes the bytes into a generated source, ze_spirv_<variant>.cc).
//
// Contract: two modules from the same source: kSpirvFp64 (compiled with
// -DTUTTI_ZE_FP64=1: every kernel) for devices with ZE_DEVICE_MODULE_FLAG_FP64,
// kSpirvNoFp64 (no fp64 use: no float64 reduce, pack1bit scale or gemm
// kernels) for the others. Read-only data, valid for the life of the library.
#pragma once

#include <stddef.h>

namespace tutti_ze {

extern const unsigned char kSpirvFp64[];
extern const size_t kSpirvFp64Size;
extern const unsigned char kSpirvNoFp64[];
extern const size_t kSpirvNoFp64Size;

}  // namespace tutti_ze
