// The CPU reference kernels behind core::HostKernels: the one place of the
// core's data path that names backends/cpu.
#include "core/host_kernels.h"

#include "backends/cpu/codec_kernels.h"
#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/kernels.h"

namespace tutti::core {
namespace {

cpu::WireFormat formatOf(algo::Wire w) { return static_cast<cpu::WireFormat>(w); }
static_assert(static_cast<int>(algo::Wire::kHalf) == static_cast<int>(cpu::WireFormat::kHalf) &&
                  static_cast<int>(algo::Wire::kBf16) == static_cast<int>(cpu::WireFormat::kBf16) &&
                  static_cast<int>(algo::Wire::kSign) == static_cast<int>(cpu::WireFormat::kSign),
              "algo::Wire and cpu::WireFormat name the compressed formats alike");

class CpuKernels final : public HostKernels {
 public:
  void reduce(void* dst, const void* a, const void* b, size_t count, DataType dt,
              RedOp op) const override {
    cpu::reduce(dst, a, b, count, dt, op);
  }
  void preMulReduce(void* dst, const void* a, const void* b, size_t count, DataType dt,
                    double scalar) const override {
    cpu::preMulReduce(dst, a, b, count, dt, scalar);
  }
  void scale(void* dst, const void* src, size_t count, DataType dt, double scalar) const override {
    cpu::scale(dst, src, count, dt, scalar);
  }
  void divide(void* dst, const void* src, size_t count, DataType dt, int64_t n) const override {
    cpu::divide(dst, src, count, dt, n);
  }
  void reduceN(void* dst, const void* const* srcs, int n, size_t count, DataType dt,
               RedOp op) const override {
    cpu::reduceN(dst, srcs, n, count, dt, op);
  }
  double scalarValue(const void* p, int32_t dt) const override { return cpu::scalarValue(p, dt); }
  size_t wireBytes(algo::Wire f, size_t n) const override {
    return cpu::wireBytes(formatOf(f), n);
  }
  float maxAbs(const float* x, size_t n) const override { return cpu::maxAbs(x, n); }
  void encode(algo::Wire f, int exp, const float* src, float* err, size_t n,
              void* wire) const override {
    cpu::encode(formatOf(f), exp, src, err, n, wire);
  }
  void decode(algo::Wire f, int exp, const void* wire, size_t n, float* dst) const override {
    cpu::decode(formatOf(f), exp, wire, n, dst);
  }
  void decodeAdd(algo::Wire f, int exp, const void* wire, size_t n, const float* local,
                 float localScale, float* dst) const override {
    cpu::decodeAdd(formatOf(f), exp, wire, n, local, localScale, dst);
  }
  void quantize(algo::Wire f, int exp, const float* src, float srcScale, float* err, size_t n,
                float* dst) const override {
    cpu::quantize(formatOf(f), exp, src, srcScale, err, n, dst);
  }
};

}  // namespace

const HostKernels& referenceKernels() {
  static const CpuKernels kernels;
  return kernels;
}

}  // namespace tutti::core
