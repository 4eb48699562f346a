// Export helpers for the C API. Every public function is defined once as
// `ncclX` with TUTTI_API and gets its profiling twin `pncclX` through
// TUTTI_PNCCL(ncclX), an alias of the same code (NVIDIA's library exports both).
#pragma once

#define TUTTI_API extern "C" __attribute__((visibility("default")))
#define TUTTI_PNCCL(fn) \
  extern "C" __attribute__((visibility("default"))) decltype(fn) p##fn __attribute__((alias(#fn)));
