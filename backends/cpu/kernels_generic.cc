// Kernel variant: baseline x86-64 / any architecture: plain C++, auto-vectorised for the baseline
// ISA. The bodies live in kernel_loops.inc; this file only fixes the instruction set and the
// optimisation flags.
#include <cstring>
#include <type_traits>

#include "backends/cpu/kernel_dispatch.h"
#include "base/types.h"

// O3-level vectorisation (GCC 12's -O2 uses the very-cheap cost model, which
// skips loops of unknown trip count); no FMA contraction so that every variant
// rounds identically.
#pragma GCC push_options
#pragma GCC optimize("O3", "fp-contract=off")

#define TUTTI_CPU_ISA_NS isa_generic
#define TUTTI_CPU_F16C 0
#define TUTTI_CPU_VEC 0
#include "backends/cpu/float_formats_inl.h"
#include "backends/cpu/kernel_loops.inc"
#undef TUTTI_CPU_ISA_NS
#undef TUTTI_CPU_F16C
#undef TUTTI_CPU_VEC

#pragma GCC pop_options
