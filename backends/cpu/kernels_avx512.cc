// Kernel variant: AVX-512 F/BW/VL/DQ + F16C (512-bit vectors). The bodies live in kernel_loops.inc;
// this file only fixes the instruction set and the optimisation flags.
#if defined(__x86_64__) || defined(__i386__)
// GCC 12 false positive from _mm512_undefined_*() inside the intrinsics
// headers at -O3 (GCC PR 105593); placed before the include so it covers them.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstring>
#include <type_traits>

#include "backends/cpu/kernel_dispatch.h"
#include "base/types.h"

// O3-level vectorisation (GCC 12's -O2 uses the very-cheap cost model, which
// skips loops of unknown trip count); no FMA contraction so that every variant
// rounds identically.
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,f16c,prefer-vector-width=512")
#pragma GCC optimize("O3", "fp-contract=off")

#define TUTTI_CPU_ISA_NS isa_avx512
#define TUTTI_CPU_F16C 1
#define TUTTI_CPU_VEC 512
#include "backends/cpu/float_formats_inl.h"
#include "backends/cpu/kernel_loops.inc"
#undef TUTTI_CPU_ISA_NS
#undef TUTTI_CPU_F16C
#undef TUTTI_CPU_VEC

#pragma GCC pop_options
#pragma GCC diagnostic pop

#else  // not x86: this variant is never selected; the generic table stands in.

#include "backends/cpu/kernel_dispatch.h"

namespace tutti::cpu::isa_avx512 {
const KernelTable& kernelTable() { return isa_generic::kernelTable(); }
}  // namespace tutti::cpu::isa_avx512

#endif
