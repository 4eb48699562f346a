// The data path on host memory goes through the backend (core/host_kernels.h):
// with counting kernels installed on the process's backend, the executor's
// reductions (shared memory: straight out of the ring; TCP: from staging),
// the average's finish, the one-shot path's reductions, PreMulSum scalars and
// the wire codecs of a compressed all-reduce all reach them, and the results
// stay exact. A path that called backends/cpu directly would count nothing.
#include <atomic>
#include <cstdlib>

#include "core/backend.h"
#include "core/host_kernels.h"
#include "harness.h"
#include "tutti/tutti.h"

namespace tutti::test {
namespace {

// Forwards to the reference kernels and counts each call.
class CountingKernels final : public core::HostKernels {
 public:
  mutable std::atomic<long> reduces{0}, preMuls{0}, scales{0}, divides{0}, reduceNs{0},
      scalars{0}, maxima{0}, encodes{0}, decodes{0}, quantizes{0};
  const core::HostKernels& ref = core::referenceKernels();

  void reduce(void* dst, const void* a, const void* b, size_t count, DataType dt,
              RedOp op) const override {
    ++reduces;
    ref.reduce(dst, a, b, count, dt, op);
  }
  void preMulReduce(void* dst, const void* a, const void* b, size_t count, DataType dt,
                    double scalar) const override {
    ++preMuls;
    ref.preMulReduce(dst, a, b, count, dt, scalar);
  }
  void scale(void* dst, const void* src, size_t count, DataType dt, double scalar) const override {
    ++scales;
    ref.scale(dst, src, count, dt, scalar);
  }
  void divide(void* dst, const void* src, size_t count, DataType dt, int64_t n) const override {
    ++divides;
    ref.divide(dst, src, count, dt, n);
  }
  void reduceN(void* dst, const void* const* srcs, int n, size_t count, DataType dt,
               RedOp op) const override {
    ++reduceNs;
    ref.reduceN(dst, srcs, n, count, dt, op);
  }
  double scalarValue(const void* p, int32_t dt) const override {
    ++scalars;
    return ref.scalarValue(p, dt);
  }
  size_t wireBytes(algo::Wire f, size_t n) const override { return ref.wireBytes(f, n); }
  float maxAbs(const float* x, size_t n) const override {
    ++maxima;
    return ref.maxAbs(x, n);
  }
  void encode(algo::Wire f, int exp, const float* src, float* err, size_t n,
              void* wire) const override {
    ++encodes;
    ref.encode(f, exp, src, err, n, wire);
  }
  void decode(algo::Wire f, int exp, const void* wire, size_t n, float* dst) const override {
    ++decodes;
    ref.decode(f, exp, wire, n, dst);
  }
  void decodeAdd(algo::Wire f, int exp, const void* wire, size_t n, const float* local,
                 float localScale, float* dst) const override {
    ++decodes;
    ref.decodeAdd(f, exp, wire, n, local, localScale, dst);
  }
  void quantize(algo::Wire f, int exp, const float* src, float srcScale, float* err, size_t n,
                float* dst) const override {
    ++quantizes;
    ref.quantize(f, exp, src, srcScale, err, n, dst);
  }
};

class HostKernelsSeam : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    setenv("NCCL_SHM_DISABLE", GetParam(), 1);
    auto b = core::processBackend();
    ASSERT_TRUE(b.isOk()) << b.status().message();
    backend_ = *b;
    ASSERT_TRUE(backend_->hostOnly()) << "these tests run on the CPU backend";
    backend_->setHostKernels(&counting_);
  }
  void TearDown() override {
    if (backend_) backend_->setHostKernels(nullptr);
    unsetenv("NCCL_SHM_DISABLE");
  }
  core::Backend* backend_ = nullptr;
  CountingKernels counting_;
};

// 3 ranks (odd), integer data: every sum exact.
constexpr int kRanks = 3;

TEST_P(HostKernelsSeam, ExecutorReductionsGoThroughTheBackend) {
  const size_t count = (1 << 20) + 3;  // the ring, several chunks, an odd tail
  runRanks(kRanks, [&](int r, ncclComm_t comm) {
    std::vector<int32_t> in(count), out(count, -1);
    for (size_t i = 0; i < count; ++i) in[i] = static_cast<int32_t>((i % 1000) * (r + 1));
    ASSERT_EQ(ncclAllReduce(in.data(), out.data(), count, ncclInt32, ncclSum, comm, nullptr),
              ncclSuccess)
        << ncclGetLastError(comm);
    for (size_t i = 0; i < count; ++i)
      ASSERT_EQ(out[i], static_cast<int32_t>((i % 1000) * 6)) << "element " << i;
    // The average's finish: divides by the rank count (exact for these values).
    std::vector<int32_t> avgIn(count, 3 * (r + 1)), avgOut(count, -1);
    ASSERT_EQ(ncclAllReduce(avgIn.data(), avgOut.data(), count, ncclInt32, ncclAvg, comm, nullptr),
              ncclSuccess);
    for (size_t i = 0; i < count; i += 4099) ASSERT_EQ(avgOut[i], 6) << "element " << i;
  });
  EXPECT_GT(counting_.reduces.load(), 0) << "the executor reduced without the backend's kernels";
  EXPECT_GT(counting_.divides.load(), 0) << "the average finished without the backend's kernels";
}

TEST_P(HostKernelsSeam, PreMulSumScalarAndScaleGoThroughTheBackend) {
  const size_t count = 100003;
  runRanks(kRanks, [&](int r, ncclComm_t comm) {
    ncclRedOp_t op;
    int32_t two = 2;
    ASSERT_EQ(ncclRedOpCreatePreMulSum(&op, &two, ncclInt32, ncclScalarHostImmediate, comm),
              ncclSuccess);
    std::vector<int32_t> in(count, r + 1), out(count, -1);
    ASSERT_EQ(ncclAllReduce(in.data(), out.data(), count, ncclInt32, op, comm, nullptr),
              ncclSuccess)
        << ncclGetLastError(comm);
    for (size_t i = 0; i < count; i += 997) ASSERT_EQ(out[i], 12) << "element " << i;
    ASSERT_EQ(ncclRedOpDestroy(op, comm), ncclSuccess);
  });
  EXPECT_GT(counting_.scalars.load(), 0) << "the scalar was read without the backend's kernels";
  EXPECT_GT(counting_.scales.load() + counting_.preMuls.load(), 0)
      << "PreMulSum ran without the backend's kernels";
}

// The one-shot path needs shared memory (the node arena).
class HostKernelsSeamShm : public HostKernelsSeam {};

TEST_P(HostKernelsSeamShm, OneShotReductionsGoThroughTheBackend) {
  runRanks(kRanks, [&](int r, ncclComm_t comm) {
    std::vector<int64_t> in(17, 10 * (r + 1)), out(17, -1);
    ASSERT_EQ(ncclAllReduce(in.data(), out.data(), 17, ncclInt64, ncclSum, comm, nullptr),
              ncclSuccess)
        << ncclGetLastError(comm);
    for (int64_t v : out) ASSERT_EQ(v, 60);
  });
  EXPECT_GT(counting_.reduceNs.load(), 0) << "the one-shot path reduced without the backend";
}

TEST_P(HostKernelsSeam, WireCodecsGoThroughTheBackend) {
  const size_t count = 20011;
  runRanks(kRanks, [&](int r, ncclComm_t comm) {
    tuttiCompressionConfig_t cfg = TUTTI_COMPRESSION_CONFIG_INITIALIZER;
    cfg.kind = tuttiCompressFp16;
    tuttiCompressor_t c = nullptr;
    ASSERT_EQ(tuttiCompressorCreate(comm, &cfg, &c), ncclSuccess) << ncclGetLastError(comm);
    // Small integers: exact in fp16 at any of the scales the ranks agree on.
    std::vector<float> in(count), out(count, -7.0f);
    for (size_t i = 0; i < count; ++i) in[i] = static_cast<float>((i % 7) + r);
    ASSERT_EQ(tuttiAllReduceCompressed(in.data(), out.data(), count, ncclFloat32, ncclSum, c, 1,
                                       count, 1, nullptr),
              ncclSuccess)
        << ncclGetLastError(comm);
    for (size_t i = 0; i < count; ++i)
      ASSERT_EQ(out[i], static_cast<float>(3 * (i % 7) + 3)) << "element " << i;
    EXPECT_EQ(tuttiCompressorDestroy(c), ncclSuccess);
  });
  EXPECT_GT(counting_.maxima.load(), 0) << "the fp16 scale was agreed without the backend";
  EXPECT_GT(counting_.encodes.load() + counting_.quantizes.load(), 0)
      << "fp16 was encoded without the backend's kernels";
  EXPECT_GT(counting_.decodes.load() + counting_.quantizes.load(), 0)
      << "fp16 was decoded without the backend's kernels";
}

INSTANTIATE_TEST_SUITE_P(Transports, HostKernelsSeam, ::testing::Values("0", "1"),
                         [](const auto& info) {
                           return std::string(info.param) == "0" ? "shm" : "tcp";
                         });
INSTANTIATE_TEST_SUITE_P(Transports, HostKernelsSeamShm, ::testing::Values("0"),
                         [](const auto&) { return std::string("shm"); });

}  // namespace
}  // namespace tutti::test
