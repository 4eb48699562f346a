// Kernel variant: AVX2 + F16C (256-bit vectors). The bodies live in kernel_loops.inc;
// this file only fixes the instruction set and the optimisation flags.
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#include <cstring>
#include <type_traits>

#include "backends/cpu/kernel_dispatch.h"
#include "base/types.h"

// O3-level vectorisation (GCC 12's -O2 uses the very-cheap cost model, which
// skips loops of unknown trip count); no FMA contraction so that every variant
// rounds identically.
#pragma GCC push_options
#pragma GCC target("avx2,f16c")
#pragma GCC optimize("O3", "fp-contract=off")

#define TUTTI_CPU_ISA_NS isa_avx2
#define TUTTI_CPU_F16C 1
#define TUTTI_CPU_VEC 256
#include "backends/cpu/float_formats_inl.h"
#include "backends/cpu/kernel_loops.inc"
#undef TUTTI_CPU_ISA_NS
#undef TUTTI_CPU_F16C
#undef TUTTI_CPU_VEC

#pragma GCC pop_options

#else  // not x86: this variant is never selected; the generic table stands in.

#include "backends/cpu/kernel_dispatch.h"

namespace tutti::cpu::isa_avx2 {
const KernelTable& kernelTable() { return isa_generic::kernelTable(); }
}  // namespace tutti::cpu::isa_avx2

#endif
