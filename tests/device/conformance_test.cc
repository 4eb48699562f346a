// Backend conformance: one suite any device backend runs against, by name.
// Every kernel is compared with the CPU reference (the built-in backend) on
// awkward sizes, every datatype and operator; copies, pointer queries and
// queue/event ordering are checked on the backend's own memory, which the
// test never touches directly (xpu_emu's is inaccessible to the host).
//
// Backends: TUTTI_CONFORMANCE_BACKENDS (comma-separated names or paths),
// default the ones built here (TUTTI_CONFORMANCE_DEFAULT). A backend that
// cannot start on this machine (cuda without a GPU, or a plugin whose entry
// point declines) is reported skipped. The installed tool tutti-conformance
// (conformance_main.cc) runs these same tests on the plugin it is given.
//
// Exactness: reduce, castScaled and the 1-bit codec are specified bit for bit
// (include/tutti/backend_plugin.h), so results must be identical; NaNs match
// when both are NaN (payloads are unspecified). gemm and orthogonalize leave
// the summation order free: tolerances are given where they are checked.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "backends/cpu/codec_kernels.h"
#include "backends/cpu/float_formats.h"
#include "base/types.h"
#include "core/backend.h"
#include "tests/device/conformance_checks.h"
#include "tests/device/element_data.h"
#include "topology/topology.h"

namespace tutti {
namespace conformance {
namespace {
std::vector<std::string>* g_backends = nullptr;  // set by setBackends
}  // namespace

void setBackends(std::vector<std::string> namesOrPaths) {
  delete g_backends;
  g_backends = new std::vector<std::string>(std::move(namesOrPaths));
}

}  // namespace conformance

namespace {

using core::Backend;
using devtest::firstMismatch;

std::vector<std::string> backendNames() {
  if (conformance::g_backends) return *conformance::g_backends;
  const char* env = getenv("TUTTI_CONFORMANCE_BACKENDS");
  std::string list = env && *env ? env : TUTTI_CONFORMANCE_DEFAULT;
  std::vector<std::string> out;
  std::stringstream ss(list);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

// Device memory of the backend under test, filled and read only through it.
class DevBuf {
 public:
  DevBuf(Backend* b, size_t bytes) : b_(b), bytes_(bytes) {
    auto p = b->alloc(0, bytes ? bytes : 1);
    EXPECT_TRUE(p.isOk()) << p.status().message();
    if (p) ptr_ = p.value();
  }
  ~DevBuf() {
    if (ptr_) {
      EXPECT_TRUE(b_->free(ptr_).isOk());
    }
  }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  void* get() const { return ptr_; }
  template <typename T = void>
  T* at(size_t byteOffset) const {
    return reinterpret_cast<T*>(static_cast<uint8_t*>(ptr_) + byteOffset);
  }
  void upload(const void* host, size_t bytes, size_t off = 0) {
    ASSERT_TRUE(b_->copy(at(off), host, bytes).isOk());
  }
  std::vector<uint8_t> download(size_t bytes, size_t off = 0) {
    std::vector<uint8_t> out(bytes);
    Status st = b_->copy(out.data(), at(off), bytes);
    EXPECT_TRUE(st.isOk()) << st.message();
    return out;
  }

 private:
  Backend* b_;
  size_t bytes_;
  void* ptr_ = nullptr;
};

// What the queue-ordering tests copy and where to: a device buffer holding a
// known byte pattern (byte i = i * mul + add) and zeroed pinned host memory
// of `hostBytes` (freed at the end of the scope), so a copy queued behind a
// held point shows whether it has run.
struct OrderingBuffers {
  OrderingBuffers(Backend* b, size_t bytes, size_t hostBytes, uint8_t mul, uint8_t add)
      : be(b), pattern(bytes), src(b, bytes) {
    for (size_t i = 0; i < bytes; ++i) pattern[i] = static_cast<uint8_t>(i * mul + add);
    src.upload(pattern.data(), bytes);
    auto mem = b->hostAlloc(hostBytes);
    EXPECT_TRUE(mem.isOk()) << mem.status().message();
    if (mem) host = static_cast<uint8_t*>(mem.value());
    if (host) memset(host, 0, hostBytes);
  }
  ~OrderingBuffers() {
    if (host) {
      EXPECT_TRUE(be->hostFree(host).isOk());
    }
  }
  OrderingBuffers(const OrderingBuffers&) = delete;
  OrderingBuffers& operator=(const OrderingBuffers&) = delete;
  Backend* be;
  std::vector<uint8_t> pattern;
  DevBuf src;
  uint8_t* host = nullptr;
};

// Random elements of a datatype, with special values sprinkled in (floats:
// +-0, +-inf, NaN, subnormals, values near the narrow formats' limits).
std::vector<uint8_t> randomData(int dt, size_t count, std::mt19937_64& rng, bool specials) {
  const size_t es = dataTypeSize(static_cast<DataType>(dt));
  std::vector<uint8_t> out(count * es);
  std::uniform_real_distribution<double> u(-4, 4);
  for (size_t i = 0; i < count; ++i) {
    uint8_t* p = &out[i * es];
    const bool special = specials && rng() % 16 == 0;
    double v = u(rng);
    if (special) {
      const double pick[] = {0.0,   -0.0,  INFINITY, -INFINITY, NAN,  1e-6,
                             -6e-8, 448.0, 500.0,    65504.0,   1e30, -3e38};
      v = pick[rng() % 12];
    }
    switch (dt) {
      case ncclInt8:
      case ncclUint8:
      case ncclInt32:
      case ncclUint32:
      case ncclInt64:
      case ncclUint64: {
        uint64_t r = rng();
        if (special) r = (rng() & 1) ? ~0ull : (1ull << (es * 8 - 1));  // -1 / INT_MIN patterns
        memcpy(p, &r, es);
        break;
      }
      case ncclFloat16: {
        uint16_t h = cpu::floatToHalf(static_cast<float>(v));
        memcpy(p, &h, 2);
        break;
      }
      case ncclBfloat16: {
        uint16_t h = cpu::floatToBf16(static_cast<float>(v));
        memcpy(p, &h, 2);
        break;
      }
      case ncclFloat32: {
        float f = static_cast<float>(v);
        memcpy(p, &f, 4);
        break;
      }
      case ncclFloat64:
        memcpy(p, &v, 8);
        break;
      case ncclFloat8e4m3:
        *p = cpu::floatToFp8E4M3(static_cast<float>(v));
        break;
      case ncclFloat8e5m2:
        *p = cpu::floatToFp8E5M2(static_cast<float>(v));
        break;
    }
  }
  return out;
}

class Conformance : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    auto b = Backend::load(GetParam());
    if (!b) {
      // Only a backend that declines at run time may skip: init() failed (no
      // device; kUnhandledDeviceError) or the entry point returned NULL
      // (kSystemError). One that is missing or malformed fails.
      if (b.status().code() == Code::kUnhandledDeviceError ||
          b.status().code() == Code::kSystemError)
        GTEST_SKIP() << "backend " << GetParam() << " cannot run here: " << b.status().message();
      FAIL() << b.status().message();
    }
    be_ = std::move(b.value());
    auto r = Backend::load("cpu");
    ASSERT_TRUE(r.isOk());
    ref_ = std::move(r.value());
  }
  std::unique_ptr<Backend> be_, ref_;
};

const size_t kCounts[] = {0, 1, 7, 33, 1000, 4099};

TEST_P(Conformance, CopiesBetweenEveryKindOfMemory) {
  std::mt19937_64 rng(1);
  for (size_t bytes : {size_t{1}, size_t{3}, size_t{4097}, size_t{1} << 20}) {
    std::vector<uint8_t> src(bytes);
    for (auto& x : src) x = static_cast<uint8_t>(rng());
    DevBuf a(be_.get(), bytes + 64), b(be_.get(), bytes + 64);
    a.upload(src.data(), bytes, 5);                          // H2D at an odd offset
    ASSERT_TRUE(be_->copy(b.at(3), a.at(5), bytes).isOk());  // D2D
    auto pinned = be_->hostAlloc(bytes);                     // D2 pinned
    ASSERT_TRUE(pinned.isOk()) << pinned.status().message();
    ASSERT_TRUE(be_->copy(pinned.value(), b.at(3), bytes).isOk());
    EXPECT_EQ(memcmp(pinned.value(), src.data(), bytes), 0) << bytes << " bytes";
    EXPECT_EQ(b.download(bytes, 3), src) << bytes << " bytes";  // D2H pageable
    ASSERT_TRUE(be_->hostFree(pinned.value()).isOk());
  }
}

TEST_P(Conformance, PointerQuery) {
  DevBuf d(be_.get(), 4096);
  int onStack = 0;
  EXPECT_EQ(be_->query(&onStack).kind, core::MemKind::kHost);
  if (be_->hostOnly()) return;  // the CPU backend calls everything host memory
  core::MemInfo m = be_->query(d.at(100));
  EXPECT_EQ(m.kind, core::MemKind::kDevice);
  EXPECT_EQ(m.device, 0);
  EXPECT_EQ(m.base, d.get());
  EXPECT_GE(m.size, 4096u);
}

TEST_P(Conformance, ReduceEveryTypeAndOperator) {
  std::mt19937_64 rng(7);
  const int ops[] = {TUTTI_PLUGIN_OP_SUM, TUTTI_PLUGIN_OP_PROD, TUTTI_PLUGIN_OP_MAX,
                     TUTTI_PLUGIN_OP_MIN, TUTTI_PLUGIN_OP_AVG,  TUTTI_PLUGIN_OP_PREMULSUM};
  const size_t maxCount = 4099, maxSrcs = 5;
  DevBuf dev(be_.get(), (maxCount * 8 + 128) * (maxSrcs + 1));
  DevBuf devScalar(be_.get(), 8);
  int checked = 0;
  for (int dt = ncclInt8; dt <= ncclFloat8e5m2; ++dt) {
    const size_t es = dataTypeSize(static_cast<DataType>(dt));
    for (int op : ops) {
      for (int nSrcs : {1, 2, 3, 5}) {
        for (size_t count : kCounts) {
          // Variants: out of place; in place on the first source; in place on the last.
          for (int variant = 0; variant < 3; ++variant) {
            if (variant == 2 && nSrcs == 1) continue;
            const bool deviceScalar = variant == 1;
            SCOPED_TRACE(::testing::Message()
                         << "datatype " << dt << " op " << op << " nSrcs " << nSrcs << " count "
                         << count << " variant " << variant);
            const size_t bytes = count * es, stride = (bytes + 63) / 64 * 64 + 1;  // unaligned
            std::vector<std::vector<uint8_t>> host(nSrcs);
            std::vector<const void*> devSrcs, refSrcs;
            for (int k = 0; k < nSrcs; ++k) {
              host[k] = randomData(dt, count, rng, true);
              dev.upload(host[k].data(), bytes, k * stride);
              devSrcs.push_back(dev.at(k * stride));
              refSrcs.push_back(host[k].data());
            }
            std::vector<uint8_t> scalar = randomData(dt, 1, rng, false);
            devScalar.upload(scalar.data(), es);
            void* devDst = variant == 0   ? dev.at(nSrcs * stride)
                           : variant == 1 ? const_cast<void*>(devSrcs[0])
                                          : const_cast<void*>(devSrcs[nSrcs - 1]);
            std::vector<uint8_t> want(bytes);
            void* refDst = variant == 0   ? want.data()
                           : variant == 1 ? const_cast<void*>(refSrcs[0])
                                          : const_cast<void*>(refSrcs[nSrcs - 1]);
            tuttiPluginReduceArgs_v1 a{};
            a.structSize = sizeof(a);
            a.datatype = dt;
            a.op = op;
            a.nSrcs = nSrcs;
            a.count = count;
            a.avgDivisor = static_cast<uint32_t>(nSrcs + 1);
            a.scalarResidence = ncclScalarHostImmediate;
            tuttiPluginReduceArgs_v1 r = a;
            a.dst = devDst;
            a.srcs = devSrcs.data();
            r.dst = refDst;
            r.srcs = refSrcs.data();
            if (op == TUTTI_PLUGIN_OP_PREMULSUM) {
              r.scalar = scalar.data();
              a.scalar = deviceScalar ? devScalar.get() : scalar.data();
              a.scalarResidence = deviceScalar ? ncclScalarDevice : ncclScalarHostImmediate;
            }
            Status st = be_->reduce(a, nullptr);
            ASSERT_TRUE(st.isOk()) << st.message();
            ASSERT_TRUE(ref_->reduce(r, nullptr).isOk());
            if (variant != 0)
              want.assign(static_cast<uint8_t*>(refDst), static_cast<uint8_t*>(refDst) + bytes);
            ASSERT_TRUE(be_->sync(nullptr).isOk());
            const size_t off = static_cast<uint8_t*>(devDst) - dev.at<uint8_t>(0);
            std::vector<uint8_t> got = dev.download(bytes, off);
            long bad = firstMismatch(dt, got, want, want.size() / es);
            ASSERT_EQ(bad, -1) << "first differing element " << bad;
            ++checked;
          }
        }
      }
    }
  }
  EXPECT_GT(checked, 12 * 6 * 4 * 6);
}

TEST_P(Conformance, CastScaled) {
  std::mt19937_64 rng(11);
  const int narrow[] = {ncclFloat16, ncclBfloat16};
  DevBuf src(be_.get(), 4099 * 4 + 8), dst(be_.get(), 4099 * 4 + 8);
  for (int t : narrow) {
    for (float scale : {1.0f, 0x1p-10f, 3.5f, 0x1p20f}) {
      for (size_t count : kCounts) {
        SCOPED_TRACE(::testing::Message()
                     << "type " << t << " scale " << scale << " count " << count);
        // fp32 -> narrow
        std::vector<uint8_t> in = randomData(ncclFloat32, count, rng, true);
        src.upload(in.data(), count * 4, 4);  // misaligned by one element
        ASSERT_TRUE(
            be_->castScaled(dst.at(2), t, src.at(4), ncclFloat32, count, scale, nullptr).isOk());
        std::vector<uint8_t> want(count * 2);
        ASSERT_TRUE(
            ref_->castScaled(want.data(), t, in.data(), ncclFloat32, count, scale, nullptr).isOk());
        ASSERT_TRUE(be_->sync(nullptr).isOk());
        ASSERT_EQ(firstMismatch(t, dst.download(count * 2, 2), want, want.size() / 2), -1);
        // narrow -> fp32
        std::vector<uint8_t> nin = randomData(t, count, rng, true);
        src.upload(nin.data(), count * 2, 2);
        ASSERT_TRUE(
            be_->castScaled(dst.at(4), ncclFloat32, src.at(2), t, count, scale, nullptr).isOk());
        std::vector<uint8_t> wantF(count * 4);
        ASSERT_TRUE(
            ref_->castScaled(wantF.data(), ncclFloat32, nin.data(), t, count, scale, nullptr)
                .isOk());
        ASSERT_TRUE(be_->sync(nullptr).isOk());
        ASSERT_EQ(firstMismatch(ncclFloat32, dst.download(count * 4, 4), wantF, wantF.size() / 4),
                  -1);
      }
    }
  }
}

TEST_P(Conformance, OneBitPackAndUnpack) {
  std::mt19937_64 rng(13);
  for (size_t count :
       {size_t{1}, size_t{7}, size_t{511}, size_t{512}, size_t{513}, size_t{2000}, size_t{4099}}) {
    for (bool feedback : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "count " << count << " feedback " << feedback);
      const size_t wb = cpu::wireBytes(cpu::WireFormat::kSign, count);
      std::vector<uint8_t> in = randomData(ncclFloat32, count, rng, false);
      std::vector<uint8_t> err = randomData(ncclFloat32, count, rng, false);
      DevBuf dIn(be_.get(), count * 4), dErr(be_.get(), count * 4), dWire(be_.get(), wb),
          dOut(be_.get(), count * 4);
      dIn.upload(in.data(), count * 4);
      dErr.upload(err.data(), count * 4);
      ASSERT_TRUE(be_->pack1bit(dIn.at<float>(0), feedback ? dErr.at<float>(0) : nullptr,
                                dWire.get(), count, nullptr)
                      .isOk());
      std::vector<uint8_t> wantWire(wb), wantErr = err;
      ASSERT_TRUE(ref_->pack1bit(reinterpret_cast<float*>(in.data()),
                                 feedback ? reinterpret_cast<float*>(wantErr.data()) : nullptr,
                                 wantWire.data(), count, nullptr)
                      .isOk());
      ASSERT_TRUE(be_->sync(nullptr).isOk());
      ASSERT_EQ(dWire.download(wb), wantWire);
      ASSERT_EQ(firstMismatch(ncclFloat32, dErr.download(count * 4), wantErr, wantErr.size() / 4),
                -1);
      // Unpack, plain and accumulating onto the input.
      for (bool acc : {false, true}) {
        dOut.upload(in.data(), count * 4);
        ASSERT_TRUE(be_->unpack1bit(dOut.at<float>(0), dWire.get(), count, acc, nullptr).isOk());
        std::vector<uint8_t> want = in;
        ASSERT_TRUE(ref_->unpack1bit(reinterpret_cast<float*>(want.data()), wantWire.data(), count,
                                     acc, nullptr)
                        .isOk());
        ASSERT_TRUE(be_->sync(nullptr).isOk());
        ASSERT_EQ(firstMismatch(ncclFloat32, dOut.download(count * 4), want, want.size() / 4), -1)
            << acc;
      }
    }
  }
}

// gemm: the summation order is free, so each element is checked against the
// double-precision reference within the classic dot-product bound
// |err| <= gamma_k * sum |a_p b_p| (gamma_k ~ k * 2^-24, doubled for the
// alpha/beta roundings) plus one rounding of the result.
TEST_P(Conformance, Gemm) {
  std::mt19937_64 rng(17);
  std::uniform_real_distribution<float> u(-1, 1);
  struct Shape {
    int64_t m, n, k;
    bool tA, tB;
    float alpha, beta;
  };
  const Shape shapes[] = {{1, 1, 1, false, false, 1, 0},   {7, 5, 3, false, false, 1, 0},
                          {64, 4, 300, true, false, 1, 0}, {33, 17, 9, false, true, 0.5f, 2},
                          {4, 4, 1000, true, true, -1, 1}, {0, 3, 3, false, false, 1, 0}};
  for (const Shape& s : shapes) {
    SCOPED_TRACE(::testing::Message()
                 << s.m << "x" << s.n << "x" << s.k << " tA " << s.tA << " tB " << s.tB);
    const int64_t aRows = s.tA ? s.k : s.m, aCols = s.tA ? s.m : s.k;
    const int64_t bRows = s.tB ? s.n : s.k, bCols = s.tB ? s.k : s.n;
    const int64_t lda = aCols + 3, ldb = bCols + 1, ldc = s.n + 2;  // padded rows
    std::vector<float> A(aRows * lda), B(bRows * ldb), C(std::max<int64_t>(s.m, 1) * ldc);
    for (auto& x : A) x = u(rng);
    for (auto& x : B) x = u(rng);
    for (auto& x : C) x = u(rng);
    DevBuf dA(be_.get(), A.size() * 4), dB(be_.get(), B.size() * 4), dC(be_.get(), C.size() * 4);
    dA.upload(A.data(), A.size() * 4);
    dB.upload(B.data(), B.size() * 4);
    dC.upload(C.data(), C.size() * 4);
    ASSERT_TRUE(be_->gemm(s.tA, s.tB, s.m, s.n, s.k, s.alpha, dA.at<float>(0), lda, dB.at<float>(0),
                          ldb, s.beta, dC.at<float>(0), ldc, nullptr)
                    .isOk());
    ASSERT_TRUE(be_->sync(nullptr).isOk());
    std::vector<uint8_t> raw = dC.download(C.size() * 4);
    const float* got = reinterpret_cast<const float*>(raw.data());
    for (int64_t i = 0; i < s.m; ++i)
      for (int64_t j = 0; j < s.n; ++j) {
        double exact = 0, mag = 0;
        for (int64_t p = 0; p < s.k; ++p) {
          const double a = s.tA ? A[p * lda + i] : A[i * lda + p];
          const double b = s.tB ? B[j * ldb + p] : B[p * ldb + j];
          exact += a * b;
          mag += std::fabs(a * b);
        }
        const double want = s.alpha * exact + s.beta * C[i * ldc + j];
        const double bound = 2.0 * (s.k + 2) * 0x1p-24 *
                                 (std::fabs(s.alpha) * mag + std::fabs(s.beta * C[i * ldc + j])) +
                             0x1p-24 * std::fabs(want) + 1e-30;
        ASSERT_NEAR(got[i * ldc + j], want, bound) << "element " << i << "," << j;
      }
    // Padding between rows is untouched.
    for (int64_t i = 0; i < s.m; ++i)
      for (int64_t j = s.n; j < ldc; ++j) ASSERT_EQ(got[i * ldc + j], C[i * ldc + j]);
  }
}

// orthogonalize: the result has orthonormal columns (|Q^T Q - I| <= 1e-5: a
// few float roundings per entry over 200 rows, conditioned matrices) and,
// column by column, equals the reference to 1e-4 (Gram-Schmidt in column
// order fixes each column up to rounding when the input is well conditioned).
TEST_P(Conformance, Orthogonalize) {
  std::mt19937_64 rng(19);
  std::normal_distribution<float> g(0, 1);
  for (int64_t cols : {1, 2, 4, 7}) {
    const int64_t rows = 200, ld = cols + 2;
    std::vector<float> M(rows * ld);
    for (auto& x : M) x = g(rng);
    DevBuf d(be_.get(), M.size() * 4);
    d.upload(M.data(), M.size() * 4);
    ASSERT_TRUE(be_->orthogonalize(d.at<float>(0), rows, cols, ld, 1e-8f, nullptr).isOk());
    std::vector<float> want = M;
    ASSERT_TRUE(ref_->orthogonalize(want.data(), rows, cols, ld, 1e-8f, nullptr).isOk());
    ASSERT_TRUE(be_->sync(nullptr).isOk());
    std::vector<uint8_t> raw = d.download(M.size() * 4);
    const float* got = reinterpret_cast<const float*>(raw.data());
    for (int64_t a = 0; a < cols; ++a)
      for (int64_t b = 0; b < cols; ++b) {
        double dot = 0;
        for (int64_t i = 0; i < rows; ++i) dot += double(got[i * ld + a]) * got[i * ld + b];
        ASSERT_NEAR(dot, a == b ? 1.0 : 0.0, 1e-5) << "columns " << a << "," << b;
      }
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t c = 0; c < cols; ++c) ASSERT_NEAR(got[i * ld + c], want[i * ld + c], 1e-4);
      for (int64_t c = cols; c < ld; ++c) ASSERT_EQ(got[i * ld + c], M[i * ld + c]);  // padding
    }
  }
  // A zero column stays zero.
  std::vector<float> Z(10 * 2, 0.0f);
  for (int i = 0; i < 10; ++i) Z[i * 2] = 1.0f + i;
  DevBuf dz(be_.get(), Z.size() * 4);
  dz.upload(Z.data(), Z.size() * 4);
  ASSERT_TRUE(be_->orthogonalize(dz.at<float>(0), 10, 2, 2, 1e-8f, nullptr).isOk());
  std::vector<uint8_t> raw = dz.download(Z.size() * 4);
  const float* got = reinterpret_cast<const float*>(raw.data());
  for (int i = 0; i < 10; ++i) EXPECT_EQ(got[i * 2 + 1], 0.0f);
}

// Work on one queue runs in order; eventWait orders a second queue after the
// first; nothing is synchronised in between except through those.
TEST_P(Conformance, QueueAndEventOrdering) {
  const size_t count = 1 << 20, bytes = count * 4;
  std::vector<int32_t> ones(count, 1), twos(count, 2);
  DevBuf a(be_.get(), bytes), b(be_.get(), bytes), c(be_.get(), bytes);
  a.upload(ones.data(), bytes);
  c.upload(twos.data(), bytes);
  auto q1 = be_->queueCreate(0), q2 = be_->queueCreate(0);
  ASSERT_TRUE(q1.isOk() && q2.isOk());
  auto ev = be_->eventCreate(0);
  ASSERT_TRUE(ev.isOk());
  // An event never recorded is complete.
  auto done = be_->eventDone(ev.value());
  ASSERT_TRUE(done.isOk());
  EXPECT_TRUE(done.value());
  for (int round = 0; round < 3; ++round) {
    // q1: b = a (a large copy), then b = b + c; q2 waits for q1, then copies b out.
    ASSERT_TRUE(be_->copyAsync(b.get(), a.get(), bytes, q1.value()).isOk());
    const void* srcs[2] = {b.get(), c.get()};
    tuttiPluginReduceArgs_v1 r{};
    r.structSize = sizeof(r);
    r.datatype = ncclInt32;
    r.op = TUTTI_PLUGIN_OP_SUM;
    r.nSrcs = 2;
    r.count = count;
    r.dst = b.get();
    r.srcs = srcs;
    ASSERT_TRUE(be_->reduce(r, q1.value()).isOk());
    ASSERT_TRUE(be_->eventRecord(ev.value(), q1.value()).isOk());
    ASSERT_TRUE(be_->eventWait(q2.value(), ev.value()).isOk());
    std::vector<int32_t> out(count, -1);
    auto pinned = be_->hostAlloc(bytes);
    ASSERT_TRUE(pinned.isOk());
    ASSERT_TRUE(be_->copyAsync(pinned.value(), b.get(), bytes, q2.value()).isOk());
    ASSERT_TRUE(be_->sync(q2.value()).isOk());
    memcpy(out.data(), pinned.value(), bytes);
    ASSERT_TRUE(be_->hostFree(pinned.value()).isOk());
    for (size_t i = 0; i < count; i += 4093) ASSERT_EQ(out[i], 3) << "element " << i;
    ASSERT_EQ(out[count - 1], 3);
    done = be_->eventDone(ev.value());
    ASSERT_TRUE(done.isOk());
    EXPECT_TRUE(done.value());
  }
  EXPECT_TRUE(be_->eventDestroy(ev.value()).isOk());
  EXPECT_TRUE(be_->queueDestroy(q1.value()).isOk());
  EXPECT_TRUE(be_->queueDestroy(q2.value()).isOk());
}

// Runs fn on a thread of its own and waits up to `limit` for it; a call that
// hangs fails the check and ends the process (SIGABRT: tutti-conformance's
// row then says the check crashed) rather than hanging the suite.
template <typename Fn>
void mustReturnWithin(std::chrono::seconds limit, const char* what, Fn&& fn) {
  auto done = std::async(std::launch::async, std::forward<Fn>(fn));
  if (done.wait_for(limit) == std::future_status::ready) return done.get();
  ADD_FAILURE() << what << " did not return within " << limit.count() << " s";
  fprintf(stderr, "%s did not return within %lld s\n", what, static_cast<long long>(limit.count()));
  std::abort();
}

// A host event holds a queue (include/tutti/backend_plugin.h, hostEventCreate):
// after eventWait(q, e) a copy on q does not run until hostEventSignal(e),
// signalled from another thread while this one waits in queueSynchronize,
// and eventWait itself returns at once; destroying an unsignalled host event
// releases a queue waiting on it. The CPU backend's queues are synchronous:
// there the documented answer is checked instead (eventWait on an
// unsignalled host event is refused, nothing waits).
TEST_P(Conformance, HostEventOrdersAQueue) {
  if (!be_->hasHostEvents())
    GTEST_SKIP() << "the plugin offers no host events (hostEventCreate/hostEventSignal NULL or "
                    "beyond its table): tutti blocks the caller instead";
  auto q = be_->queueCreate(0);
  ASSERT_TRUE(q.isOk()) << q.status().message();
  auto he = be_->hostEventCreate(0);
  ASSERT_TRUE(he.isOk()) << he.status().message();
  auto done = be_->eventDone(he.value());
  ASSERT_TRUE(done.isOk());
  EXPECT_FALSE(done.value()) << "a new host event must be unsignalled";
  EXPECT_FALSE(be_->eventRecord(he.value(), q.value()).isOk()) << "eventRecord on a host event";
  const auto& t = be_->table();

  if (be_->hostOnly()) {
    Status st = be_->eventWait(q.value(), he.value());
    EXPECT_FALSE(st.isOk()) << "the CPU backend cannot hold a synchronous queue";
    EXPECT_NE(st.message().find("synchronous"), std::string::npos) << st.message();
    ASSERT_TRUE(be_->hostEventSignal(he.value()).isOk());
    ASSERT_TRUE(be_->hostEventSignal(he.value()).isOk());  // idempotent
    done = be_->eventDone(he.value());
    ASSERT_TRUE(done.isOk());
    EXPECT_TRUE(done.value());
    EXPECT_TRUE(be_->eventWait(q.value(), he.value()).isOk());  // signalled: nothing to wait for
    EXPECT_EQ(t.eventSynchronize(be_->context(), he.value()), ncclSuccess);
    EXPECT_TRUE(be_->eventDestroy(he.value()).isOk());
    EXPECT_TRUE(be_->queueDestroy(q.value()).isOk());
    return;
  }

  const size_t bytes = 1 << 20;
  OrderingBuffers buf(be_.get(), bytes, bytes, 13, 7);
  ASSERT_NE(buf.host, nullptr);
  const std::vector<uint8_t>& pattern = buf.pattern;
  DevBuf& src = buf.src;
  uint8_t* pinned = buf.host;
  auto untouched = [&] {
    for (size_t i = 0; i < bytes; i += 4093)
      if (pinned[i] != 0) return false;
    return pinned[bytes - 1] == 0;
  };

  const auto t0 = std::chrono::steady_clock::now();
  mustReturnWithin(std::chrono::seconds(30), "eventWait on an unsignalled host event",
                   [&] { EXPECT_TRUE(be_->eventWait(q.value(), he.value()).isOk()); });
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1))
      << "eventWait must not wait for the signal: the queue waits, not the host";
  ASSERT_TRUE(be_->copyAsync(pinned, src.get(), bytes, q.value()).isOk());
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_TRUE(untouched()) << "the copy behind eventWait ran before the host event was signalled";
  done = be_->eventDone(he.value());
  ASSERT_TRUE(done.isOk());
  EXPECT_FALSE(done.value());

  std::thread signaller([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_TRUE(be_->hostEventSignal(he.value()).isOk());
    EXPECT_TRUE(be_->hostEventSignal(he.value()).isOk());  // idempotent
  });
  mustReturnWithin(std::chrono::seconds(30), "queueSynchronize after hostEventSignal",
                   [&] { EXPECT_TRUE(be_->sync(q.value()).isOk()); });
  signaller.join();
  EXPECT_EQ(memcmp(pinned, pattern.data(), bytes), 0) << "the copy did not run after the signal";
  done = be_->eventDone(he.value());
  ASSERT_TRUE(done.isOk());
  EXPECT_TRUE(done.value());
  EXPECT_EQ(t.eventSynchronize(be_->context(), he.value()), ncclSuccess);
  EXPECT_TRUE(be_->eventDestroy(he.value()).isOk());

  // Destroying a host event that a queue still waits on releases the queue.
  memset(pinned, 0, bytes);
  auto he2 = be_->hostEventCreate(0);
  ASSERT_TRUE(he2.isOk());
  ASSERT_TRUE(be_->eventWait(q.value(), he2.value()).isOk());
  ASSERT_TRUE(be_->copyAsync(pinned, src.get(), bytes, q.value()).isOk());
  ASSERT_TRUE(be_->eventDestroy(he2.value()).isOk());
  mustReturnWithin(std::chrono::seconds(30), "queueSynchronize after destroying the host event",
                   [&] { EXPECT_TRUE(be_->sync(q.value()).isOk()); });
  EXPECT_EQ(memcmp(pinned, pattern.data(), bytes), 0);

  EXPECT_TRUE(be_->queueDestroy(q.value()).isOk());
}

// launchHostFunc calls its function exactly once, when the queue reaches it:
// after the work queued before it (whose results it can read) and before the
// work queued after it; on a queue held by a host event not before the
// signal; and even when the queue is destroyed before it gets there. The CPU
// backend's queues are synchronous: fn has run when the call returns.
namespace hostfunc {
struct Probe {
  std::atomic<int> calls{0};
  const uint8_t* before = nullptr;  // written by a copy queued before fn
  const uint8_t* after = nullptr;   // written by a copy queued after fn
  size_t bytes = 0;
  uint8_t expect0 = 0, expectLast = 0;
  std::atomic<bool> sawBefore{false}, afterUntouched{false};
  static void run(void* arg) {
    auto* p = static_cast<Probe*>(arg);
    if (p->before)
      p->sawBefore = p->before[0] == p->expect0 && p->before[p->bytes - 1] == p->expectLast;
    if (p->after) p->afterUntouched = p->after[0] == 0 && p->after[p->bytes - 1] == 0;
    p->calls.fetch_add(1);
  }
};
bool waitForCalls(const Probe& p, int n, std::chrono::seconds limit) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (p.calls.load() < n && std::chrono::steady_clock::now() < end)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return p.calls.load() >= n;
}
}  // namespace hostfunc

TEST_P(Conformance, HostFuncRunsInQueueOrder) {
  if (!be_->hasHostFuncs())
    GTEST_SKIP() << "the plugin offers no launchHostFunc (NULL or beyond its table): tutti "
                    "polls eventQuery while it waits for a queue";
  using hostfunc::Probe;
  auto q = be_->queueCreate(0);
  ASSERT_TRUE(q.isOk()) << q.status().message();
  EXPECT_FALSE(be_->table().launchHostFunc(be_->context(), q.value(), nullptr, nullptr) ==
               ncclSuccess)
      << "a NULL fn must be refused";
  if (be_->hostOnly()) {
    Probe p;
    ASSERT_TRUE(be_->launchHostFunc(q.value(), &Probe::run, &p).isOk());
    EXPECT_EQ(p.calls.load(), 1) << "synchronous queues: fn has run when the call returns";
    EXPECT_TRUE(be_->sync(q.value()).isOk());
    EXPECT_EQ(p.calls.load(), 1);
    EXPECT_TRUE(be_->queueDestroy(q.value()).isOk());
    return;
  }

  const size_t bytes = 4 << 20;
  OrderingBuffers buf(be_.get(), bytes, 2 * bytes, 29, 3);
  ASSERT_NE(buf.host, nullptr);
  const std::vector<uint8_t>& pattern = buf.pattern;
  DevBuf& src = buf.src;
  uint8_t* before = buf.host;
  uint8_t* after = before + bytes;

  // Between two copies: it sees the first one's bytes and not yet the second's.
  Probe p;
  p.before = before;
  p.after = after;
  p.bytes = bytes;
  p.expect0 = pattern[0];
  p.expectLast = pattern[bytes - 1];
  ASSERT_TRUE(be_->copyAsync(before, src.get(), bytes, q.value()).isOk());
  ASSERT_TRUE(be_->launchHostFunc(q.value(), &Probe::run, &p).isOk());
  ASSERT_TRUE(be_->copyAsync(after, src.get(), bytes, q.value()).isOk());
  mustReturnWithin(std::chrono::seconds(30), "queueSynchronize after launchHostFunc",
                   [&] { EXPECT_TRUE(be_->sync(q.value()).isOk()); });
  EXPECT_EQ(p.calls.load(), 1) << "fn runs exactly once, before queueSynchronize returns";
  EXPECT_TRUE(p.sawBefore.load()) << "fn ran before the copy queued before it had completed";
  EXPECT_TRUE(p.afterUntouched.load()) << "the copy queued after fn ran before fn";
  EXPECT_EQ(memcmp(after, pattern.data(), bytes), 0);

  if (be_->hasHostEvents()) {
    // Held: not before the signal, then once.
    Probe held;
    auto he = be_->hostEventCreate(0);
    ASSERT_TRUE(he.isOk()) << he.status().message();
    ASSERT_TRUE(be_->eventWait(q.value(), he.value()).isOk());
    ASSERT_TRUE(be_->launchHostFunc(q.value(), &Probe::run, &held).isOk());
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_EQ(held.calls.load(), 0) << "fn ran before the queue reached it";
    EXPECT_TRUE(be_->hostEventSignal(he.value()).isOk());
    EXPECT_TRUE(hostfunc::waitForCalls(held, 1, std::chrono::seconds(30)))
        << "fn did not run after the host event was signalled";
    mustReturnWithin(std::chrono::seconds(30), "queueSynchronize after the signal",
                     [&] { EXPECT_TRUE(be_->sync(q.value()).isOk()); });
    EXPECT_EQ(held.calls.load(), 1);
    EXPECT_TRUE(be_->eventDestroy(he.value()).isOk());

    // The queue destroyed before it reaches fn: fn still runs, once.
    Probe orphan;
    auto q2 = be_->queueCreate(0);
    ASSERT_TRUE(q2.isOk()) << q2.status().message();
    auto he2 = be_->hostEventCreate(0);
    ASSERT_TRUE(he2.isOk()) << he2.status().message();
    ASSERT_TRUE(be_->eventWait(q2.value(), he2.value()).isOk());
    ASSERT_TRUE(be_->launchHostFunc(q2.value(), &Probe::run, &orphan).isOk());
    EXPECT_TRUE(be_->queueDestroy(q2.value()).isOk());
    EXPECT_EQ(orphan.calls.load(), 0);
    EXPECT_TRUE(be_->hostEventSignal(he2.value()).isOk());
    EXPECT_TRUE(hostfunc::waitForCalls(orphan, 1, std::chrono::seconds(30)))
        << "fn on a destroyed queue never ran";
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_EQ(orphan.calls.load(), 1);
    EXPECT_TRUE(be_->eventDestroy(he2.value()).isOk());
  }
  EXPECT_TRUE(be_->queueDestroy(q.value()).isOk());
}

// setDevice makes each device current in turn for this thread only; an
// out-of-range device is an error with a reason, not a crash.
TEST_P(Conformance, SetDeviceChangesCurrentDevice) {
  if (be_->table().setDevice == nullptr)
    GTEST_SKIP() << "the plugin offers no setDevice: tutti accepts only the device "
                    "currentDevice answers";
  auto n = be_->deviceCount();
  auto orig = be_->currentDevice();
  ASSERT_TRUE(n.isOk() && orig.isOk());
  // A thread that reads its current device before and after this one switches.
  std::mutex mu;
  std::condition_variable cv;
  int stage = 0;
  int otherBefore = -2, otherAfter = -2;
  auto current = [&] {
    auto d = be_->currentDevice();
    return d ? d.value() : -1;
  };
  std::thread other([&] {
    otherBefore = current();
    std::unique_lock<std::mutex> lock(mu);
    stage = 1;
    cv.notify_all();
    cv.wait(lock, [&] { return stage == 2; });
    otherAfter = current();
  });
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return stage == 1; });
  }
  const char text[] = "on the current device";
  for (int d = n.value() - 1; d >= 0; --d) {
    SCOPED_TRACE("device " + std::to_string(d));
    Status st = be_->setDevice(d);
    ASSERT_TRUE(st.isOk()) << st.message();
    auto cur = be_->currentDevice();
    ASSERT_TRUE(cur.isOk());
    EXPECT_EQ(cur.value(), d);
    // The NULL queue serves this device: a round trip through it.
    auto p = be_->alloc(d, sizeof text);
    ASSERT_TRUE(p.isOk()) << p.status().message();
    char back[sizeof text] = {};
    EXPECT_TRUE(be_->copy(p.value(), text, sizeof text).isOk());
    EXPECT_TRUE(be_->copy(back, p.value(), sizeof text).isOk());
    EXPECT_STREQ(back, text);
    EXPECT_TRUE(be_->free(p.value()).isOk());
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    stage = 2;
  }
  cv.notify_all();
  other.join();
  EXPECT_EQ(otherAfter, otherBefore) << "setDevice changed another thread's current device";
  for (int bad : {n.value(), n.value() + 7, -1}) {
    Status st = be_->setDevice(bad);
    EXPECT_FALSE(st.isOk()) << "setDevice(" << bad << ") of " << n.value() << " devices";
    EXPECT_EQ(st.message().find("no reason given"), std::string::npos) << st.message();
    auto cur = be_->currentDevice();
    ASSERT_TRUE(cur.isOk());
    EXPECT_EQ(cur.value(), 0) << "a failed setDevice changed the current device";
  }
  EXPECT_TRUE(be_->setDevice(orig.value()).isOk());
}

// devicePciBusId answers every device with a PCI address tutti can match
// against the topology ("dddd:bb:dd.f", domain optional) or with "" (not
// known); a device out of range is an error with a reason.
TEST_P(Conformance, PciBusIdIsWellFormed) {
  if (!be_->hasPciBusId())
    GTEST_SKIP() << "the plugin offers no devicePciBusId: tutti leaves its engine thread on the "
                    "caller's CPUs";
  auto n = be_->deviceCount();
  ASSERT_TRUE(n.isOk());
  for (int d = 0; d < n.value(); ++d) {
    auto id = be_->pciBusId(d);
    ASSERT_TRUE(id.isOk()) << "device " << d << ": " << id.status().message();
    if (!id.value().empty()) {
      EXPECT_TRUE(topo::parsePciBusId(id.value()).has_value())
          << "device " << d << ": '" << id.value() << "' is not a PCI bus id";
    }
  }
  for (int bad : {n.value(), -1}) {
    auto id = be_->pciBusId(bad);
    EXPECT_FALSE(id.isOk()) << "devicePciBusId(" << bad << ") of " << n.value() << " devices";
    if (!id.isOk()) {
      EXPECT_EQ(id.status().message().find("no reason given"), std::string::npos)
          << id.status().message();
    }
  }
}

TEST_P(Conformance, BadArgumentsAreErrorsNotCrashes) {
  DevBuf d(be_.get(), 64);
  const void* srcs[1] = {d.get()};
  tuttiPluginReduceArgs_v1 r{};
  r.structSize = sizeof(r);
  r.datatype = 99;
  r.op = TUTTI_PLUGIN_OP_SUM;
  r.nSrcs = 1;
  r.count = 4;
  r.dst = d.get();
  r.srcs = srcs;
  Status st = be_->reduce(r, nullptr);
  EXPECT_FALSE(st.isOk());
  EXPECT_NE(st.message().find("datatype"), std::string::npos) << st.message();
  st = be_->castScaled(d.get(), ncclInt32, d.at(32), ncclFloat32, 4, 1.0f, nullptr);
  EXPECT_FALSE(st.isOk());
}

INSTANTIATE_TEST_SUITE_P(Backends, Conformance, ::testing::ValuesIn(backendNames()),
                         [](const ::testing::TestParamInfo<std::string>& i) {
                           std::string n;
                           for (char c : i.param)
                             n += isalnum(static_cast<unsigned char>(c)) ? c : '_';
                           return n;
                         });

}  // namespace
}  // namespace tutti
