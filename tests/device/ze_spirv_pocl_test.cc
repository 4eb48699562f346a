// The Level Zero plugin's kernels, run on the CPU through OpenCL (PoCL), bit
// for bit against tutti's CPU reference (backends/cpu/cpu_backend.h's table).
//
// What runs: the SPIR-V the plugin embeds (tutti_ze_spirv, the same object
// files), both variants (fp64 and no-fp64), with the plugin's own argument
// marshalling (backends/ze/launch_plan.h). How it is loaded depends on the
// OpenCL implementation:
//   1. clCreateProgramWithIL with the embedded SPIR-V, when the device accepts
//      SPIR-V (OpenCL 2.1+ / cl_khr_il_program);
//   2. otherwise the SPIR 1.2 bitcode that llvm-spirv-14 -r translated back
//      from the same .spv file at build time, with clCreateProgramWithBinary
//      (Debian's PoCL 3.1 has no SPIR-V input but takes SPIR bitcode).
// The mode used is printed and recorded (property "load_mode"). Without an
// OpenCL platform the tests skip with the reason.
//
// Comparison: bytes equal, except that two NaNs of a floating type are equal.
#define CL_TARGET_OPENCL_VERSION 300
#include <CL/cl.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/float_formats.h"
#include "backends/ze/launch_plan.h"
#include "backends/ze/ze_spirv.h"
#include "tests/device/element_data.h"

namespace {

namespace zp = tutti_ze;
using namespace tutti::devtest;  // element data and comparisons

const tuttiBackendPlugin_v1* cpu() { return tutti::cpu::backendPlugin(); }

std::vector<unsigned char> readFile(const char* path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<unsigned char>((std::istreambuf_iterator<char>(f)),
                                    std::istreambuf_iterator<char>());
}

// ---- OpenCL environment (one per process) -----------------------------------------------

struct ClEnv {
  bool ok = false;
  std::string why;  // reason to skip
  std::string mode[2];
  cl_platform_id platform = nullptr;
  cl_device_id device = nullptr;
  cl_context context = nullptr;
  cl_command_queue queue = nullptr;
  cl_program program[2] = {nullptr, nullptr};  // [0] fp64, [1] no-fp64
  std::map<std::string, cl_kernel> kernels[2];
};

cl_program loadProgram(ClEnv& e, bool fp64, std::string* mode, std::string* err) {
  const unsigned char* spv = fp64 ? zp::kSpirvFp64 : zp::kSpirvNoFp64;
  const size_t spvSize = fp64 ? zp::kSpirvFp64Size : zp::kSpirvNoFp64Size;
  cl_int rc = CL_SUCCESS;
  char ilVersion[256] = "";
  clGetDeviceInfo(e.device, CL_DEVICE_IL_VERSION, sizeof ilVersion, ilVersion, nullptr);
  cl_program p = nullptr;
  if (strstr(ilVersion, "SPIR-V") != nullptr) {
    p = clCreateProgramWithIL(e.context, spv, spvSize, &rc);
    if (rc == CL_SUCCESS) *mode = "SPIR-V (clCreateProgramWithIL)";
  }
  if (p == nullptr) {
    const std::vector<unsigned char> bc =
        readFile(fp64 ? TUTTI_ZE_SPIR_BC_FP64 : TUTTI_ZE_SPIR_BC_NOFP64);
    if (bc.empty()) {
      *err = "SPIR bitcode missing";
      return nullptr;
    }
    const unsigned char* bin = bc.data();
    const size_t n = bc.size();
    cl_int status = CL_SUCCESS;
    p = clCreateProgramWithBinary(e.context, 1, &e.device, &n, &bin, &status, &rc);
    if (rc != CL_SUCCESS) {
      *err = "clCreateProgramWithBinary(SPIR) failed: " + std::to_string(rc);
      return nullptr;
    }
    *mode =
        "SPIR 1.2 bitcode translated back from the embedded SPIR-V (llvm-spirv-14 -r), "
        "clCreateProgramWithBinary: this OpenCL device takes no SPIR-V (IL version '" +
        std::string(ilVersion) + "')";
  }
  rc = clBuildProgram(p, 1, &e.device, "", nullptr, nullptr);
  if (rc != CL_SUCCESS) {
    std::string log(16384, '\0');
    clGetProgramBuildInfo(p, e.device, CL_PROGRAM_BUILD_LOG, log.size(), &log[0], nullptr);
    *err = "clBuildProgram failed (" + std::to_string(rc) + "): " + log.c_str();
    clReleaseProgram(p);
    return nullptr;
  }
  return p;
}

ClEnv& env() {
  static ClEnv* e = [] {
    ClEnv* x = new ClEnv;
    cl_uint n = 0;
    if (clGetPlatformIDs(0, nullptr, &n) != CL_SUCCESS || n == 0) {
      x->why = "no OpenCL platform (install pocl-opencl-icd)";
      return x;
    }
    std::vector<cl_platform_id> ps(n);
    clGetPlatformIDs(n, ps.data(), nullptr);
    for (cl_platform_id p : ps) {
      cl_uint nd = 0;
      if (clGetDeviceIDs(p, CL_DEVICE_TYPE_ALL, 1, &x->device, &nd) == CL_SUCCESS && nd > 0) {
        x->platform = p;
        break;
      }
    }
    if (x->platform == nullptr) {
      x->why = "no OpenCL device";
      return x;
    }
    cl_device_fp_config fp64 = 0;
    clGetDeviceInfo(x->device, CL_DEVICE_DOUBLE_FP_CONFIG, sizeof fp64, &fp64, nullptr);
    if (fp64 == 0) {
      x->why = "the OpenCL device has no fp64 (the fp64 module cannot run)";
      return x;
    }
    cl_int rc = CL_SUCCESS;
    x->context = clCreateContext(nullptr, 1, &x->device, nullptr, nullptr, &rc);
    if (rc != CL_SUCCESS) {
      x->why = "clCreateContext failed: " + std::to_string(rc);
      return x;
    }
    x->queue = clCreateCommandQueueWithProperties(x->context, x->device, nullptr, &rc);
    if (rc != CL_SUCCESS) {
      x->why = "clCreateCommandQueue failed: " + std::to_string(rc);
      return x;
    }
    for (int v = 0; v < 2; ++v) {
      std::string err;
      x->program[v] = loadProgram(*x, v == 0, &x->mode[v], &err);
      if (x->program[v] == nullptr) {
        x->why = err;  // a build failure is a test failure, see Environment
        return x;
      }
      for (int k = 0; k < zp::kNumKernels; ++k) {
        bool fp64Only = false;
        const char* name = zp::kernelName(k, &fp64Only);
        if (fp64Only && v == 1) continue;
        cl_kernel kern = clCreateKernel(x->program[v], name, &rc);
        if (rc != CL_SUCCESS) {
          x->why = std::string("clCreateKernel(") + name + ") failed: " + std::to_string(rc);
          x->program[v] = nullptr;
          return x;
        }
        x->kernels[v][name] = kern;
      }
    }
    x->ok = true;
    return x;
  }();
  return *e;
}

// Skips without OpenCL; fails when OpenCL is there but the kernels do not load.
#define REQUIRE_CL()                                                                   \
  do {                                                                                 \
    ClEnv& e_ = env();                                                                 \
    if (!e_.ok && e_.platform == nullptr) GTEST_SKIP() << e_.why;                      \
    if (!e_.ok && e_.why.find("no fp64") != std::string::npos) GTEST_SKIP() << e_.why; \
    ASSERT_TRUE(e_.ok) << e_.why;                                                      \
  } while (0)

// ---- device buffers behind fake addresses ---------------------------------------------------
// Plans carry pointers; here a pointer is a made-up, 4 KiB-aligned address
// naming a cl_mem.

class Device {
 public:
  ~Device() {
    for (auto& kv : bufs_) clReleaseMemObject(kv.second.mem);
  }
  void* alloc(size_t bytes) {
    cl_int rc = CL_SUCCESS;
    Buf b;
    b.bytes = bytes;
    b.mem = clCreateBuffer(env().context, CL_MEM_READ_WRITE, bytes < 16 ? 16 : bytes, nullptr, &rc);
    EXPECT_EQ(rc, CL_SUCCESS);
    void* p = reinterpret_cast<void*>(next_);
    next_ += ((bytes + 4095) / 4096 + 1) * 4096;
    bufs_[reinterpret_cast<uintptr_t>(p)] = b;
    return p;
  }
  void* upload(const std::vector<unsigned char>& v) {
    void* p = alloc(v.size());
    if (!v.empty()) {
      EXPECT_EQ(clEnqueueWriteBuffer(env().queue, mem(p), CL_TRUE, 0, v.size(), v.data(), 0,
                                     nullptr, nullptr),
                CL_SUCCESS);
    }
    return p;
  }
  std::vector<unsigned char> download(void* p, size_t bytes) {
    std::vector<unsigned char> v(bytes);
    if (bytes > 0) {
      EXPECT_EQ(clEnqueueReadBuffer(env().queue, mem(p), CL_TRUE, 0, bytes, v.data(), 0, nullptr,
                                    nullptr),
                CL_SUCCESS);
    }
    return v;
  }
  cl_mem mem(const void* p) {
    auto it = bufs_.find(reinterpret_cast<uintptr_t>(p));
    return it == bufs_.end() ? nullptr : it->second.mem;
  }
  // Runs every launch of a plan with the given module, like the plugin does.
  ::testing::AssertionResult run(const zp::Plan& plan, bool fp64Module) {
    ClEnv& e = env();
    for (int li = 0; li < plan.nLaunches; ++li) {
      const zp::Launch& l = plan.launches[li];
      auto it = e.kernels[fp64Module ? 0 : 1].find(l.kernel);
      if (it == e.kernels[fp64Module ? 0 : 1].end())
        return ::testing::AssertionFailure() << "no kernel " << l.kernel;
      cl_kernel k = it->second;
      for (int a = 0; a < l.nArgs; ++a) {
        const zp::KernelArg& arg = l.args[a];
        cl_int rc;
        if (arg.pointer) {
          cl_mem m = mem(reinterpret_cast<const void*>(static_cast<uintptr_t>(arg.value)));
          if (m == nullptr)
            return ::testing::AssertionFailure() << l.kernel << " arg " << a << ": unknown pointer";
          rc = clSetKernelArg(k, static_cast<cl_uint>(a), sizeof m, &m);
        } else {
          uint64_t v = arg.value;  // little-endian: the low `size` bytes
          rc = clSetKernelArg(k, static_cast<cl_uint>(a), arg.size, &v);
        }
        if (rc != CL_SUCCESS)
          return ::testing::AssertionFailure()
                 << l.kernel << " clSetKernelArg(" << a << ") = " << rc;
      }
      size_t global[2] = {size_t{l.groupSize[0]} * l.groupCount[0],
                          size_t{l.groupSize[1]} * l.groupCount[1]};
      size_t local[2] = {l.groupSize[0], l.groupSize[1]};
      const cl_int rc = clEnqueueNDRangeKernel(e.queue, k, static_cast<cl_uint>(l.dims), nullptr,
                                               global, local, 0, nullptr, nullptr);
      if (rc != CL_SUCCESS) return ::testing::AssertionFailure() << l.kernel << " launch = " << rc;
    }
    if (clFinish(e.queue) != CL_SUCCESS) return ::testing::AssertionFailure() << "clFinish";
    return ::testing::AssertionSuccess();
  }

 private:
  struct Buf {
    cl_mem mem = nullptr;
    size_t bytes = 0;
  };
  std::map<uintptr_t, Buf> bufs_;
  uintptr_t next_ = 0x10000000;
};

// ---- data and comparison ---------------------------------------------------------------------

// Scalars for PREMULSUM, as raw elements (64-bit ones exercise the rounding
// through double and the saturation).
std::vector<uint64_t> scalars(int dt) {
  switch (dt) {
    case zp::kInt8:
    case zp::kUint8:
      return {3, 0xfd};
    case zp::kInt32:
    case zp::kUint32:
      return {7, 0xfffffff9u};
    case zp::kInt64:
    case zp::kUint64:
      return {5,
              0xfffffffffffffffbull,
              0x7fffffffffffffffull,
              0x8000000000000001ull,
              0x0020000000000003ull,
              0xfffffffffffffc01ull};
    case zp::kFloat16:
      return {0x3800, 0xc500};
    case zp::kBfloat16:
      return {0x3f00, 0xc0a0};
    case zp::kFloat32:
      return {0x3eaaaaab, 0xc0a00000};
    case zp::kFloat64:
      return {0x3fd5555555555555ull, 0xc014000000000000ull};
    case zp::kFp8E4M3:
      return {0x30, 0xc4};
    case zp::kFp8E5M2:
      return {0x38, 0xc2};
  }
  return {0};
}

// ---- reduce ----------------------------------------------------------------------------------

enum class Place { kOut, kInFirst, kInLast };

::testing::AssertionResult checkReduce(bool fp64Module, int dt, int op, int nSrcs, uint64_t count,
                                       Place place, bool devScalar, uint64_t scalarRaw,
                                       uint32_t divisor, std::mt19937_64& rng) {
  const int es = zp::dtypeSize(dt);
  std::vector<std::vector<unsigned char>> srcs;
  for (int k = 0; k < nSrcs; ++k) srcs.push_back(makeData(dt, count, rng));
  unsigned char scalar[8] = {};
  std::memcpy(scalar, &scalarRaw, es);

  // Reference.
  std::vector<unsigned char> want(count * es + 1);
  std::vector<const void*> hs;
  for (auto& s : srcs) hs.push_back(s.data());
  tuttiPluginReduceArgs_v1 ra = {};
  ra.structSize = sizeof ra;
  ra.datatype = dt;
  ra.op = op;
  ra.nSrcs = nSrcs;
  ra.count = count;
  ra.dst = want.data();
  ra.srcs = hs.data();
  ra.scalar = op == zp::kPreMulSum ? scalar : nullptr;
  ra.scalarResidence = ncclScalarHostImmediate;
  ra.avgDivisor = divisor;
  if (cpu()->reduce(nullptr, &ra, nullptr) != ncclSuccess)
    return ::testing::AssertionFailure() << "CPU reduce failed: " << cpu()->lastError(nullptr);

  // Device.
  Device dev;
  std::vector<void*> ds;
  for (auto& s : srcs) ds.push_back(dev.upload(s));
  void* dst = place == Place::kOut       ? dev.alloc(count * es)
              : place == Place::kInFirst ? ds.front()
                                         : ds.back();
  std::vector<const void*> dsc(ds.begin(), ds.end());
  void* dscalar = dev.upload(std::vector<unsigned char>(scalar, scalar + es));
  tuttiPluginReduceArgs_v1 da = ra;
  da.dst = dst;
  da.srcs = dsc.data();
  if (op == zp::kPreMulSum && devScalar) {
    da.scalar = dscalar;
    da.scalarResidence = ncclScalarDevice;
  }
  zp::Plan plan;
  char why[256] = "";
  if (zp::planReduce(&da, fp64Module, &plan, why, sizeof why) != ncclSuccess)
    return ::testing::AssertionFailure() << "planReduce: " << why;
  auto ran = dev.run(plan, fp64Module);
  if (!ran) return ran;
  const std::vector<unsigned char> got = dev.download(dst, count * es);
  const int64_t bad = firstMismatch(dt, got, want, count);
  if (bad >= 0) {
    auto f = ::testing::AssertionFailure();
    f << kTypeNames[dt] << " " << kOpNames[op] << " n=" << nSrcs << " count=" << count
      << " place=" << static_cast<int>(place) << " devScalar=" << devScalar << ": element " << bad
      << " got " << hexElem(dt, got, bad) << " want " << hexElem(dt, want, bad) << " inputs";
    for (auto& s : srcs) f << " " << hexElem(dt, s, bad);
    return f;
  }
  return ::testing::AssertionSuccess();
}

class ZeSpirvPocl : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ClEnv& e = env();
    if (e.ok) {
      printf("[ ze ] OpenCL load mode (fp64 module): %s\n", e.mode[0].c_str());
      printf("[ ze ] OpenCL load mode (no-fp64 module): %s\n", e.mode[1].c_str());
    }
  }
  void SetUp() override {
    ClEnv& e = env();
    if (e.ok) RecordProperty("load_mode", e.mode[0]);
  }
};

TEST_F(ZeSpirvPocl, EmbeddedBytesAreTheBuiltSpirv) {
  // The plugin embeds what the build compiled; PoCL runs the bitcode translated
  // back from these same files.
  const std::vector<unsigned char> fp64 = readFile(TUTTI_ZE_SPV_FP64);
  const std::vector<unsigned char> nofp64 = readFile(TUTTI_ZE_SPV_NOFP64);
  ASSERT_EQ(fp64.size(), zp::kSpirvFp64Size);
  ASSERT_EQ(nofp64.size(), zp::kSpirvNoFp64Size);
  EXPECT_EQ(0, memcmp(fp64.data(), zp::kSpirvFp64, fp64.size()));
  EXPECT_EQ(0, memcmp(nofp64.data(), zp::kSpirvNoFp64, nofp64.size()));
  ASSERT_GE(fp64.size(), 4u);
  EXPECT_EQ(0x07230203u, static_cast<uint32_t>(fp64[0]) | fp64[1] << 8 | fp64[2] << 16 |
                             static_cast<uint32_t>(fp64[3]) << 24);  // SPIR-V magic
}

TEST_F(ZeSpirvPocl, ReduceEveryTypeOpAndSourceCount) {
  REQUIRE_CL();
  std::mt19937_64 rng(12345);
  const uint64_t counts[] = {1, 3, 257, 4099};
  const int nSrcsList[] = {1, 2, 3, 5, 8};
  for (int dt = 0; dt < zp::kNumDTypes; ++dt) {
    for (int op = 0; op < zp::kNumOps; ++op) {
      const uint64_t s = scalars(dt)[0];
      for (int n : nSrcsList) {
        for (uint64_t c : counts) {
          ASSERT_TRUE(checkReduce(true, dt, op, n, c, Place::kOut, false, s, 3, rng));
        }
      }
    }
  }
}

TEST_F(ZeSpirvPocl, ReduceInPlaceScalarsAndDivisors) {
  REQUIRE_CL();
  std::mt19937_64 rng(777);
  for (int dt = 0; dt < zp::kNumDTypes; ++dt) {
    for (int op = 0; op < zp::kNumOps; ++op) {
      ASSERT_TRUE(
          checkReduce(true, dt, op, 3, 1031, Place::kInFirst, false, scalars(dt)[0], 1, rng));
      ASSERT_TRUE(
          checkReduce(true, dt, op, 4, 1031, Place::kInLast, false, scalars(dt)[0], 7, rng));
    }
    for (uint64_t s : scalars(dt)) {
      for (bool devScalar : {false, true}) {
        ASSERT_TRUE(
            checkReduce(true, dt, zp::kPreMulSum, 2, 515, Place::kOut, devScalar, s, 1, rng));
        ASSERT_TRUE(
            checkReduce(true, dt, zp::kPreMulSum, 1, 77, Place::kInFirst, devScalar, s, 1, rng));
      }
    }
    for (uint32_t div : {1u, 2u, 5u, 1000u}) {
      ASSERT_TRUE(checkReduce(true, dt, zp::kAvg, 2, 300, Place::kOut, false, 0, div, rng));
    }
  }
}

TEST_F(ZeSpirvPocl, ReduceNoFp64ModuleAndLimits) {
  REQUIRE_CL();
  std::mt19937_64 rng(99);
  for (int dt = 0; dt < zp::kNumDTypes; ++dt) {
    if (dt == zp::kFloat64) continue;
    for (int op = 0; op < zp::kNumOps; ++op) {
      for (bool devScalar : {false, true}) {
        for (uint64_t s : scalars(dt)) {
          ASSERT_TRUE(checkReduce(false, dt, op, 3, 600, Place::kOut, devScalar, s, 3, rng));
          if (op != zp::kPreMulSum) break;
        }
      }
    }
  }
  // What the plans refuse (tutti then runs the host reference).
  const void* srcs[9] = {};
  for (auto& p : srcs) p = reinterpret_cast<void*>(0x1000);
  tuttiPluginReduceArgs_v1 a = {};
  a.structSize = sizeof a;
  a.datatype = zp::kFloat64;
  a.op = zp::kSum;
  a.nSrcs = 2;
  a.count = 10;
  a.dst = reinterpret_cast<void*>(0x2000);
  a.srcs = srcs;
  a.avgDivisor = 1;
  zp::Plan plan;
  char why[256];
  EXPECT_EQ(zp::planReduce(&a, false, &plan, why, sizeof why), ncclInvalidArgument);
  EXPECT_EQ(zp::planReduce(&a, true, &plan, why, sizeof why), ncclSuccess);
  a.nSrcs = 9;
  EXPECT_EQ(zp::planReduce(&a, true, &plan, why, sizeof why), ncclInvalidArgument) << why;
  a.nSrcs = 2;
  a.dst = reinterpret_cast<void*>(0x2004);  // not 8-byte aligned
  EXPECT_EQ(zp::planReduce(&a, true, &plan, why, sizeof why), ncclInvalidArgument);
  a.dst = reinterpret_cast<void*>(0x2000);
  a.count = 0;
  EXPECT_EQ(zp::planReduce(&a, true, &plan, why, sizeof why), ncclSuccess);
  EXPECT_EQ(plan.nLaunches, 0);
  float f = 0;
  EXPECT_EQ(zp::planPack1bit(&f, nullptr, &f, 1, false, &plan, why, sizeof why),
            ncclInvalidArgument);
  EXPECT_EQ(
      zp::planGemm(0, 0, 1, 1, 1, 1.0f, &f, 1, &f, 1, 0.0f, &f, 1, false, &plan, why, sizeof why),
      ncclInvalidArgument);
  EXPECT_EQ(zp::planCastScaled(&f, zp::kFloat64, &f, zp::kFloat32, 1, 1.0f, &plan, why, sizeof why),
            ncclInvalidArgument);
}

// ---- castScaled --------------------------------------------------------------------------------

TEST_F(ZeSpirvPocl, CastScaledFourPairs) {
  REQUIRE_CL();
  std::mt19937_64 rng(4242);
  const int pairs[4][2] = {{zp::kFloat32, zp::kFloat16},
                           {zp::kFloat32, zp::kBfloat16},
                           {zp::kFloat16, zp::kFloat32},
                           {zp::kBfloat16, zp::kFloat32}};
  for (auto& pr : pairs) {
    const int srcT = pr[0];
    const int dstT = pr[1];
    for (float scale : {1.0f, 0.5f, 3.7e-3f, 65536.0f, 1e30f, -1.25f}) {
      for (uint64_t count : {1ull, 5ull, 1000ull, 4099ull}) {
        for (bool allPatterns : {false, true}) {
          std::vector<unsigned char> src = makeData(srcT, count, rng);
          if (allPatterns && srcT != zp::kFloat32) {  // every 16-bit pattern once
            count = 65536;
            src.resize(count * 2);
            for (uint32_t i = 0; i < 65536; ++i) std::memcpy(&src[i * 2], &i, 2);
          }
          std::vector<unsigned char> want(count * zp::dtypeSize(dstT));
          ASSERT_EQ(cpu()->castScaled(nullptr, want.data(), dstT, src.data(), srcT, count, scale,
                                      nullptr),
                    ncclSuccess);
          Device dev;
          void* ds = dev.upload(src);
          void* dd = dev.alloc(want.size());
          zp::Plan plan;
          char why[256];
          ASSERT_EQ(zp::planCastScaled(dd, dstT, ds, srcT, count, scale, &plan, why, sizeof why),
                    ncclSuccess)
              << why;
          ASSERT_TRUE(dev.run(plan, true));
          const auto got = dev.download(dd, want.size());
          const int64_t bad = firstMismatch(dstT, got, want, count);
          ASSERT_LT(bad, 0) << kTypeNames[srcT] << "->" << kTypeNames[dstT] << " scale " << scale
                            << " element " << bad << " got " << hexElem(dstT, got, bad) << " want "
                            << hexElem(dstT, want, bad) << " src " << hexElem(srcT, src, bad);
        }
      }
    }
  }
}

// ---- 1-bit codec -------------------------------------------------------------------------------

std::vector<float> codecData(uint64_t count, std::mt19937_64& rng, bool withNan) {
  std::vector<float> v(count);
  std::normal_distribution<float> d(0.0f, 2.0f);
  for (auto& x : v) x = d(rng);
  if (count > 3) v[count / 3] = 0.0f;
  if (count > 5) v[count / 5] = -0.0f;
  if (withNan && count > 600) v[600] = std::nanf("");
  return v;
}

std::vector<unsigned char> asBytes(const std::vector<float>& v) {
  std::vector<unsigned char> b(v.size() * 4);
  if (!v.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}

uint64_t wireBytes(uint64_t count) {
  const uint64_t rest = count % zp::kSignBlock;
  return count / zp::kSignBlock * zp::kSignBlockBytes + (rest != 0 ? 4 + (rest + 7) / 8 : 0);
}

TEST_F(ZeSpirvPocl, Pack1bitWireAndErrorFeedback) {
  REQUIRE_CL();
  std::mt19937_64 rng(31337);
  for (uint64_t count : {1ull, 7ull, 8ull, 9ull, 511ull, 512ull, 513ull, 1500ull, 4099ull}) {
    for (int errMode = 0; errMode < 3; ++errMode) {  // 0: no error, 1: separate, 2: in place
      const std::vector<float> src = codecData(count, rng, count == 1500);
      std::vector<float> err = codecData(count, rng, false);
      for (auto& e : err) e *= 0.1f;
      // Reference. errMode 2: src and error are one buffer holding src.
      std::vector<float> rsrc = src;
      std::vector<float> rerr = err;
      std::vector<unsigned char> rwire(wireBytes(count));
      float* rerrp = errMode == 0 ? nullptr : (errMode == 2 ? rsrc.data() : rerr.data());
      ASSERT_EQ(cpu()->pack1bit(nullptr, rsrc.data(), rerrp, rwire.data(), count, nullptr),
                ncclSuccess);
      // Device.
      Device dev;
      void* ds = dev.upload(asBytes(src));
      void* de = errMode == 1 ? dev.upload(asBytes(err)) : (errMode == 2 ? ds : nullptr);
      void* dw = dev.alloc(rwire.size());
      zp::Plan plan;
      char why[256];
      ASSERT_EQ(zp::planPack1bit(static_cast<const float*>(ds), static_cast<float*>(de), dw, count,
                                 true, &plan, why, sizeof why),
                ncclSuccess)
          << why;
      ASSERT_TRUE(dev.run(plan, true));
      const auto wire = dev.download(dw, rwire.size());
      ASSERT_EQ(wire, rwire) << "count " << count << " errMode " << errMode;
      if (errMode != 0) {
        const auto gotErr = dev.download(de, count * 4);
        const auto wantErr = asBytes(errMode == 2 ? rsrc : rerr);  // the error buffer
        const int64_t bad = firstMismatch(zp::kFloat32, gotErr, wantErr, count);
        ASSERT_LT(bad, 0) << "count " << count << " errMode " << errMode << " error element "
                          << bad;
      }
    }
  }
}

TEST_F(ZeSpirvPocl, Unpack1bitBothModules) {
  REQUIRE_CL();
  std::mt19937_64 rng(2718);
  for (bool fp64Module : {true, false}) {
    for (uint64_t count : {1ull, 9ull, 512ull, 513ull, 4099ull}) {
      for (int acc = 0; acc < 2; ++acc) {
        const std::vector<float> src = codecData(count, rng, count == 4099);
        std::vector<unsigned char> wire(wireBytes(count));
        ASSERT_EQ(cpu()->pack1bit(nullptr, src.data(), nullptr, wire.data(), count, nullptr),
                  ncclSuccess);
        std::vector<float> dst = codecData(count, rng, false);
        std::vector<float> want = dst;
        ASSERT_EQ(cpu()->unpack1bit(nullptr, want.data(), wire.data(), count, acc, nullptr),
                  ncclSuccess);
        Device dev;
        void* dd = dev.upload(asBytes(dst));
        void* dw = dev.upload(wire);
        zp::Plan plan;
        char why[256];
        ASSERT_EQ(
            zp::planUnpack1bit(static_cast<float*>(dd), dw, count, acc, &plan, why, sizeof why),
            ncclSuccess);
        ASSERT_TRUE(dev.run(plan, fp64Module));
        const auto got = dev.download(dd, count * 4);
        const int64_t bad = firstMismatch(zp::kFloat32, got, asBytes(want), count);
        ASSERT_LT(bad, 0) << "count " << count << " accumulate " << acc << " element " << bad;
      }
    }
  }
}

// ---- gemm
// ----------------------------------------------------------------------------------------

TEST_F(ZeSpirvPocl, GemmShapesAndTransposes) {
  REQUIRE_CL();
  std::mt19937_64 rng(1618);
  std::normal_distribution<float> d(0.0f, 1.0f);
  struct Shape {
    int64_t m, n, k;
  };
  for (Shape s : {Shape{1, 1, 1}, Shape{3, 5, 7}, Shape{17, 9, 33}, Shape{64, 4, 100},
                  Shape{5, 3, 0}, Shape{9, 70, 2}}) {
    for (int tA = 0; tA < 2; ++tA) {
      for (int tB = 0; tB < 2; ++tB) {
        for (float beta : {0.0f, 0.5f}) {
          const int64_t lda = (tA ? s.m : s.k) + 3;
          const int64_t ldb = (tB ? s.k : s.n) + 1;
          const int64_t ldc = s.n + 2;
          std::vector<float> A((tA ? s.k : s.m) * lda + 1), B((tB ? s.n : s.k) * ldb + 1),
              C(s.m * ldc);
          for (auto& x : A) x = d(rng);
          for (auto& x : B) x = d(rng);
          for (auto& x : C) x = beta == 0.0f ? std::nanf("") : d(rng);  // beta 0 ignores NaN
          std::vector<float> want = C;
          const float alpha = 1.5f;
          ASSERT_EQ(cpu()->gemm(nullptr, tA, tB, s.m, s.n, s.k, alpha, A.data(), lda, B.data(), ldb,
                                beta, want.data(), ldc, nullptr),
                    ncclSuccess);
          Device dev;
          void* dA = dev.upload(asBytes(A));
          void* dB = dev.upload(asBytes(B));
          void* dC = dev.upload(asBytes(C));
          zp::Plan plan;
          char why[256];
          ASSERT_EQ(zp::planGemm(tA, tB, s.m, s.n, s.k, alpha, static_cast<const float*>(dA), lda,
                                 static_cast<const float*>(dB), ldb, beta, static_cast<float*>(dC),
                                 ldc, true, &plan, why, sizeof why),
                    ncclSuccess)
              << why;
          ASSERT_TRUE(dev.run(plan, true));
          const auto got = dev.download(dC, C.size() * 4);
          const int64_t bad = firstMismatch(zp::kFloat32, got, asBytes(want), C.size());
          ASSERT_LT(bad, 0) << "m " << s.m << " n " << s.n << " k " << s.k << " tA " << tA << " tB "
                            << tB << " beta " << beta << " element " << bad;
        }
      }
    }
  }
}

}  // namespace
