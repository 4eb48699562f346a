// Internal to backends/cpu (and its tests/benchmarks): the instruction-set
// variants of kernels.h and the choice between them.
//
// Contract: every variant computes bit-identical results (kernels.h rules); they
// differ only in speed. The best variant the CPU supports is chosen at first use
// unless TUTTI_CPU_ISA=generic|avx2|avx512 names a supported one. setActiveIsa
// is for tests and benchmarks; it is atomic, but callers running kernels
// concurrently may see either variant during the switch.
#pragma once

#include <cstddef>
#include <cstdint>

#include "base/types.h"

namespace tutti::cpu {

enum class KernelIsa : int { kGeneric = 0, kAvx2 = 1, kAvx512 = 2 };

struct KernelTable {
  void (*reduce)(void*, const void*, const void*, size_t, DataType, RedOp);
  void (*preMulReduce)(void*, const void*, const void*, size_t, DataType, double);
  void (*scale)(void*, const void*, size_t, DataType, double);
  void (*divide)(void*, const void*, size_t, DataType, int64_t);
  void (*reduceN)(void*, const void* const*, int, size_t, DataType, RedOp);
};

const char* isaName(KernelIsa isa);
// Compiled in and supported by this CPU (generic always is).
bool isaSupported(KernelIsa isa);
KernelIsa activeIsa();
// Returns false (and changes nothing) when isa is not supported.
bool setActiveIsa(KernelIsa isa);

namespace isa_generic {
const KernelTable& kernelTable();
}
namespace isa_avx2 {
const KernelTable& kernelTable();
}
namespace isa_avx512 {
const KernelTable& kernelTable();
}

}  // namespace tutti::cpu
