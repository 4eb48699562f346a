// The kernels that run on host memory, reached through the communicator's
// backend (Backend::hostKernels): the reductions and wire codecs of the
// executor, the one-shot path and the planner. Those only ever see host
// memory (a device backend's buffers are staged through pinned host memory,
// or moved by device IPC, which calls the plugin's own kernels), so no code
// there names a backend: it asks the backend it was given.
//
// Contract: what backends/cpu/kernels.h and backends/cpu/codec_kernels.h say
// of the functions of the same names (counts in elements, count 0 touches no
// memory, exact in-place aliasing allowed, synchronous, thread-safe, never
// allocate). Every backend answers with the CPU reference kernels today
// (referenceKernels()); a backend with faster host kernels of the same
// results would return its own.
#pragma once

#include <cstddef>
#include <cstdint>

#include "algo/schedule.h"
#include "base/types.h"

namespace tutti::core {

class HostKernels {
 public:
  virtual ~HostKernels() = default;

  // Reductions (backends/cpu/kernels.h).
  // dst = a OP b, OP in {sum, prod, max, min}.
  virtual void reduce(void* dst, const void* a, const void* b, size_t count, DataType dt,
                      RedOp op) const = 0;
  // dst = a + scalar * b (PreMulSum: b is the local contribution).
  virtual void preMulReduce(void* dst, const void* a, const void* b, size_t count, DataType dt,
                            double scalar) const = 0;
  // dst = scalar * src.
  virtual void scale(void* dst, const void* src, size_t count, DataType dt,
                     double scalar) const = 0;
  // dst = src / n (the average's finish).
  virtual void divide(void* dst, const void* src, size_t count, DataType dt,
                      int64_t n) const = 0;
  // dst = srcs[0] OP ... OP srcs[n-1], left to right.
  virtual void reduceN(void* dst, const void* const* srcs, int n, size_t count, DataType dt,
                       RedOp op) const = 0;
  // One element of datatype dt (an ncclDataType_t value) at p as a double:
  // how PreMulSum scalars are read.
  virtual double scalarValue(const void* p, int32_t dt) const = 0;

  // Wire codecs over float32 (backends/cpu/codec_kernels.h), for the
  // compressed formats (never Wire::kRaw).
  virtual size_t wireBytes(algo::Wire f, size_t n) const = 0;
  virtual float maxAbs(const float* x, size_t n) const = 0;
  // wire <- encode(src [+ err]); err updated when non-null.
  virtual void encode(algo::Wire f, int exp, const float* src, float* err, size_t n,
                      void* wire) const = 0;
  virtual void decode(algo::Wire f, int exp, const void* wire, size_t n, float* dst) const = 0;
  // dst = decode(wire) + localScale * local.
  virtual void decodeAdd(algo::Wire f, int exp, const void* wire, size_t n, const float* local,
                         float localScale, float* dst) const = 0;
  // dst = decode(encode(src * srcScale [+ err])); err = what the rounding dropped.
  virtual void quantize(algo::Wire f, int exp, const float* src, float srcScale, float* err,
                        size_t n, float* dst) const = 0;
};

// The CPU reference kernels (backends/cpu), one instance for the process.
const HostKernels& referenceKernels();

}  // namespace tutti::core
