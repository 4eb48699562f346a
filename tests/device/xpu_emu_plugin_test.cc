// The xpu_emu plugin on its own, through its C ABI only: the test dlopen()s
// the plugin file (XPU_EMU_PLUGIN_PATH, the build's output) exactly as tutti
// does and links nothing of tutti. Covered: the table and entry point, device
// count/env, pointer queries, that host access to device memory faults,
// copies in every direction, queue order, events across queues, IPC between
// two processes (the fd passed with SCM_RIGHTS), rejection of garbage handles
// and bad arguments, and every kernel on small cases whose results are known
// exactly here (bit-for-bit agreement with tutti's CPU reference over many
// inputs is the conformance suite's job, tests/device/conformance_test.cc).
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "nccl.h"
#include "tutti/backend_plugin.h"

#ifndef XPU_EMU_PLUGIN_PATH
#error "XPU_EMU_PLUGIN_PATH must name the plugin file"
#endif

namespace {

const tuttiBackendPlugin_v1* table() {
  static const tuttiBackendPlugin_v1* t = [] {
    void* dl = dlopen(XPU_EMU_PLUGIN_PATH, RTLD_NOW | RTLD_LOCAL);
    if (dl == nullptr) return static_cast<const tuttiBackendPlugin_v1*>(nullptr);
    auto init =
        reinterpret_cast<tuttiBackendPluginInitFn>(dlsym(dl, TUTTI_BACKEND_PLUGIN_INIT_SYMBOL));
    return init ? init(TUTTI_BACKEND_PLUGIN_ABI_VERSION) : nullptr;
  }();
  return t;
}

void hostLog(int32_t, const char*) {}
const tuttiBackendHost_v1 kHost = {TUTTI_BACKEND_PLUGIN_ABI_VERSION, sizeof(tuttiBackendHost_v1),
                                   hostLog};

// ---- exact narrow-float helpers for the expectations (exactly representable values) ----

struct Fmt {
  int expBits, manBits;
};
Fmt fmtOf(int dt) {
  switch (dt) {
    case ncclFloat16:
      return {5, 10};
    case ncclBfloat16:
      return {8, 7};
    case ncclFloat8e4m3:
      return {4, 3};
    default:
      return {5, 2};  // e5m2
  }
}

// Encodes v, which must be 0 or a normal number exactly representable in dt.
uint32_t encodeExact(double v, int dt) {
  const Fmt f = fmtOf(dt);
  const int bias = (1 << (f.expBits - 1)) - 1;
  uint32_t sign = v < 0 ? 1u << (f.expBits + f.manBits) : 0u;
  const double a = std::fabs(v);
  if (a == 0) return sign;
  int e = 0;
  const double m = std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  const double man = (m * 2 - 1) * std::ldexp(1.0, f.manBits);
  EXPECT_EQ(man, std::floor(man)) << v << " is not exact in datatype " << dt;
  EXPECT_GE(e - 1 + bias, 1) << v;
  return sign | (static_cast<uint32_t>(e - 1 + bias) << f.manBits) | static_cast<uint32_t>(man);
}

double decodeNarrow(uint32_t bits, int dt) {
  const Fmt f = fmtOf(dt);
  const int bias = (1 << (f.expBits - 1)) - 1;
  const bool neg = (bits >> (f.expBits + f.manBits)) & 1u;
  const uint32_t e = (bits >> f.manBits) & ((1u << f.expBits) - 1);
  const uint32_t m = bits & ((1u << f.manBits) - 1);
  double v;
  if (dt == ncclFloat8e4m3 && e == 15 && m == 7) {
    v = std::numeric_limits<double>::quiet_NaN();
  } else if (dt != ncclFloat8e4m3 && e == (1u << f.expBits) - 1) {
    v = m ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  } else if (e == 0) {
    v = std::ldexp(static_cast<double>(m), 1 - bias - f.manBits);
  } else {
    v = std::ldexp(1.0 + std::ldexp(static_cast<double>(m), -f.manBits),
                   static_cast<int>(e) - bias);
  }
  return neg ? -v : v;
}

size_t typeSize(int dt) {
  switch (dt) {
    case ncclInt8:
    case ncclUint8:
    case ncclFloat8e4m3:
    case ncclFloat8e5m2:
      return 1;
    case ncclFloat16:
    case ncclBfloat16:
      return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
      return 4;
    default:
      return 8;
  }
}

bool isSigned(int dt) { return dt != ncclUint8 && dt != ncclUint32 && dt != ncclUint64; }
bool isInteger(int dt) { return dt <= ncclUint64; }

// Stores the (exactly representable) value v as element i of a dt array.
void putValue(std::vector<unsigned char>* buf, size_t i, double v, int dt) {
  unsigned char* p = buf->data() + i * typeSize(dt);
  auto put = [p](auto x) { std::memcpy(p, &x, sizeof x); };
  switch (dt) {
    case ncclInt8:
      return put(static_cast<int8_t>(v));
    case ncclUint8:
      return put(static_cast<uint8_t>(v));
    case ncclInt32:
      return put(static_cast<int32_t>(v));
    case ncclUint32:
      return put(static_cast<uint32_t>(v));
    case ncclInt64:
      return put(static_cast<int64_t>(v));
    case ncclUint64:
      return put(static_cast<uint64_t>(v));
    case ncclFloat32:
      return put(static_cast<float>(v));
    case ncclFloat64:
      return put(v);
    case ncclFloat16:
    case ncclBfloat16:
      return put(static_cast<uint16_t>(encodeExact(v, dt)));
    default:
      return put(static_cast<uint8_t>(encodeExact(v, dt)));
  }
}

double getValue(const std::vector<unsigned char>& buf, size_t i, int dt) {
  const unsigned char* p = buf.data() + i * typeSize(dt);
  auto get = [p](auto x) {
    std::memcpy(&x, p, sizeof x);
    return x;
  };
  switch (dt) {
    case ncclInt8:
      return get(int8_t{});
    case ncclUint8:
      return get(uint8_t{});
    case ncclInt32:
      return get(int32_t{});
    case ncclUint32:
      return get(uint32_t{});
    case ncclInt64:
      return static_cast<double>(get(int64_t{}));
    case ncclUint64:
      return static_cast<double>(get(uint64_t{}));
    case ncclFloat32:
      return get(float{});
    case ncclFloat64:
      return get(double{});
    case ncclFloat16:
    case ncclBfloat16:
      return decodeNarrow(get(uint16_t{}), dt);
    default:
      return decodeNarrow(get(uint8_t{}), dt);
  }
}

// ---- fixture --------------------------------------------------------------------------

class XpuEmu : public ::testing::Test {
 protected:
  void SetUp() override {
    t_ = table();
    ASSERT_NE(t_, nullptr) << "cannot load " << XPU_EMU_PLUGIN_PATH << ": " << dlerror();
    ASSERT_EQ(t_->init(&kHost, &ctx_), ncclSuccess) << t_->lastError(nullptr);
  }
  void TearDown() override {
    if (ctx_) {
      EXPECT_EQ(t_->finalize(ctx_), ncclSuccess);
    }
  }

  void* devAlloc(uint64_t bytes, int device = 0) {
    void* p = nullptr;
    EXPECT_EQ(t_->memAlloc(ctx_, device, bytes, &p), ncclSuccess) << err();
    return p;
  }
  void devFree(void* p) { EXPECT_EQ(t_->memFree(ctx_, p), ncclSuccess) << err(); }
  void toDev(void* d, const void* h, uint64_t n, tuttiPluginQueue_t q = nullptr) {
    ASSERT_EQ(t_->memcpyAsync(ctx_, d, h, n, q), ncclSuccess) << err();
    ASSERT_EQ(t_->queueSynchronize(ctx_, q), ncclSuccess) << err();
  }
  void toHost(void* h, const void* d, uint64_t n, tuttiPluginQueue_t q = nullptr) {
    ASSERT_EQ(t_->memcpyAsync(ctx_, h, d, n, q), ncclSuccess) << err();
    ASSERT_EQ(t_->queueSynchronize(ctx_, q), ncclSuccess) << err();
  }
  std::string err() const { return t_->lastError(ctx_); }

  // Runs reduce over host inputs (copied to device memory), returns dst's bytes.
  ncclResult_t reduceHost(int dt, int op, const std::vector<std::vector<unsigned char>>& in,
                          uint64_t count, std::vector<unsigned char>* out,
                          const void* scalar = nullptr, uint32_t avgDivisor = 1, int inPlace = -1) {
    const uint64_t bytes = count * typeSize(dt);
    std::vector<void*> dev;
    for (const auto& h : in) {
      dev.push_back(devAlloc(bytes + 3));
      toDev(static_cast<char*>(dev.back()) + 3, h.data(), bytes);  // odd offset
    }
    std::vector<const void*> srcs;
    for (void* d : dev) srcs.push_back(static_cast<char*>(d) + 3);
    void* dst = inPlace >= 0 ? const_cast<void*>(srcs[inPlace]) : devAlloc(bytes + 1);
    tuttiPluginReduceArgs_v1 a{};
    a.structSize = sizeof a;
    a.datatype = dt;
    a.op = op;
    a.nSrcs = static_cast<int32_t>(srcs.size());
    a.count = count;
    a.dst = dst;
    a.srcs = srcs.data();
    a.scalar = scalar;
    a.scalarResidence = ncclScalarHostImmediate;
    a.avgDivisor = avgDivisor;
    ncclResult_t r = t_->reduce(ctx_, &a, nullptr);
    if (r == ncclSuccess) {
      out->assign(bytes, 0);
      toHost(out->data(), dst, bytes);
    }
    for (void* d : dev) devFree(d);
    if (inPlace < 0) devFree(dst);
    return r;
  }

  const tuttiBackendPlugin_v1* t_ = nullptr;
  void* ctx_ = nullptr;
};

// ---- ABI ------------------------------------------------------------------------------

TEST(XpuEmuAbi, TableAndEntryPoint) {
  const tuttiBackendPlugin_v1* t = table();
  ASSERT_NE(t, nullptr) << dlerror();
  EXPECT_EQ(t->abiVersion, TUTTI_BACKEND_PLUGIN_ABI_VERSION);
  EXPECT_EQ(t->structSize, sizeof(tuttiBackendPlugin_v1));
  EXPECT_STREQ(t->name, "xpu_emu");
  EXPECT_TRUE(t->capabilities & TUTTI_PLUGIN_CAP_IPC_NEEDS_FD);
  EXPECT_TRUE(t->capabilities & TUTTI_PLUGIN_CAP_HOST_MAPPED);
  EXPECT_FALSE(t->capabilities & TUTTI_PLUGIN_CAP_RDMA_DEVICE_MEMORY);
  // Every function of the v1 table is implemented.
  const char* first = reinterpret_cast<const char*>(&t->init);
  const char* end = reinterpret_cast<const char*>(t) + sizeof(tuttiBackendPlugin_v1);
  for (const char* p = first; p < end; p += sizeof(void*)) {
    void* fn;
    std::memcpy(&fn, p, sizeof fn);
    EXPECT_NE(fn, nullptr) << "table slot at offset " << (p - reinterpret_cast<const char*>(t));
  }
  void* dl = dlopen(XPU_EMU_PLUGIN_PATH, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
  ASSERT_NE(dl, nullptr);
  auto init = reinterpret_cast<tuttiBackendPluginInitFn>(dlsym(dl, "tuttiBackendPluginInit"));
  ASSERT_NE(init, nullptr);
  EXPECT_EQ(init(0), nullptr);  // an ABI older than v1: not supported
  EXPECT_EQ(init(7), t);        // newer host: the v1 table
  EXPECT_EQ(dlsym(dl, "_ZN7xpu_emu13lastErrorTextEv"), nullptr);  // internals are hidden
  dlclose(dl);
}

TEST(XpuEmuAbi, DeviceEnvironment) {
  const tuttiBackendPlugin_v1* t = table();
  ASSERT_NE(t, nullptr);
  void* ctx = nullptr;
  int32_t n = 0, cur = -1;
  ASSERT_EQ(t->init(nullptr, &ctx), ncclSuccess);  // a NULL host table is tolerated
  EXPECT_EQ(t->deviceCount(ctx, &n), ncclSuccess);
  EXPECT_EQ(n, 2);
  EXPECT_EQ(t->currentDevice(ctx, &cur), ncclSuccess);
  EXPECT_EQ(cur, 0);
  EXPECT_EQ(t->finalize(ctx), ncclSuccess);

  setenv("XPU_EMU_DEVICES", "4", 1);
  setenv("XPU_EMU_DEVICE", "3", 1);
  ASSERT_EQ(t->init(&kHost, &ctx), ncclSuccess);
  EXPECT_EQ(t->deviceCount(ctx, &n), ncclSuccess);
  EXPECT_EQ(n, 4);
  EXPECT_EQ(t->currentDevice(ctx, &cur), ncclSuccess);
  EXPECT_EQ(cur, 3);
  EXPECT_EQ(t->finalize(ctx), ncclSuccess);

  setenv("XPU_EMU_DEVICE", "4", 1);  // out of range
  EXPECT_EQ(t->init(&kHost, &ctx), ncclInvalidArgument);
  EXPECT_NE(std::string(t->lastError(nullptr)).find("XPU_EMU_DEVICE"), std::string::npos);
  unsetenv("XPU_EMU_DEVICE");
  setenv("XPU_EMU_DEVICES", "9", 1);
  EXPECT_EQ(t->init(&kHost, &ctx), ncclInvalidArgument);
  setenv("XPU_EMU_DEVICES", "0", 1);  // no device: init fails, does not crash
  EXPECT_EQ(t->init(&kHost, &ctx), ncclSystemError);
  EXPECT_NE(std::string(t->lastError(nullptr)).find("no devices"), std::string::npos);
  unsetenv("XPU_EMU_DEVICES");
}

// devicePciBusId: XPU_EMU_PCI_BUS_IDS, read at init, one entry per device;
// unset (or an empty entry): "" for that device.
TEST(XpuEmuAbi, PciBusIdEnvironment) {
  const tuttiBackendPlugin_v1* t = table();
  ASSERT_NE(t, nullptr);
  ASSERT_NE(t->devicePciBusId, nullptr);
  ASSERT_EQ(getenv("XPU_EMU_PCI_BUS_IDS"), nullptr);
  void* ctx = nullptr;
  char id[TUTTI_PLUGIN_PCI_BUS_ID_BYTES];
  ASSERT_EQ(t->init(&kHost, &ctx), ncclSuccess);
  for (int32_t d = 0; d < 2; ++d) {
    std::memset(id, 'x', sizeof id);
    EXPECT_EQ(t->devicePciBusId(ctx, d, id, sizeof id), ncclSuccess) << t->lastError(ctx);
    EXPECT_STREQ(id, "") << "device " << d << ": no variable, no address";
  }
  EXPECT_EQ(t->devicePciBusId(ctx, 2, id, sizeof id), ncclInvalidArgument);
  EXPECT_NE(std::string(t->lastError(ctx)).find("device 2 does not exist"), std::string::npos);
  EXPECT_EQ(t->devicePciBusId(ctx, -1, id, sizeof id), ncclInvalidArgument);
  EXPECT_EQ(t->devicePciBusId(ctx, 0, nullptr, sizeof id), ncclInvalidArgument);
  EXPECT_EQ(t->finalize(ctx), ncclSuccess);

  setenv("XPU_EMU_PCI_BUS_IDS", "0000:17:00.0,0000:65:00.0", 1);
  ASSERT_EQ(t->init(&kHost, &ctx), ncclSuccess);
  EXPECT_EQ(t->devicePciBusId(ctx, 0, id, sizeof id), ncclSuccess) << t->lastError(ctx);
  EXPECT_STREQ(id, "0000:17:00.0");
  EXPECT_EQ(t->devicePciBusId(ctx, 1, id, sizeof id), ncclSuccess) << t->lastError(ctx);
  EXPECT_STREQ(id, "0000:65:00.0");
  EXPECT_EQ(t->devicePciBusId(ctx, 1, id, 12), ncclInvalidArgument);  // no room for the NUL
  EXPECT_NE(std::string(t->lastError(ctx)).find("12 bytes cannot hold '0000:65:00.0'"),
            std::string::npos)
      << t->lastError(ctx);
  EXPECT_EQ(t->devicePciBusId(ctx, 1, id, 13), ncclSuccess);
  EXPECT_STREQ(id, "0000:65:00.0");
  EXPECT_EQ(t->finalize(ctx), ncclSuccess);

  setenv("XPU_EMU_PCI_BUS_IDS", ",65:00.0", 1);  // device 0 unknown, short form kept as given
  ASSERT_EQ(t->init(&kHost, &ctx), ncclSuccess);
  EXPECT_EQ(t->devicePciBusId(ctx, 0, id, sizeof id), ncclSuccess);
  EXPECT_STREQ(id, "");
  EXPECT_EQ(t->devicePciBusId(ctx, 1, id, sizeof id), ncclSuccess);
  EXPECT_STREQ(id, "65:00.0");
  EXPECT_EQ(t->finalize(ctx), ncclSuccess);

  setenv("XPU_EMU_PCI_BUS_IDS", "0000:17:00.0,0000:65:00.0,0000:66:00.0", 1);  // 3 > 2 devices
  EXPECT_EQ(t->init(&kHost, &ctx), ncclInvalidArgument);
  EXPECT_NE(std::string(t->lastError(nullptr)).find("XPU_EMU_PCI_BUS_IDS"), std::string::npos);
  setenv("XPU_EMU_PCI_BUS_IDS", "0000:17:00.0;0000:65:00.0", 1);  // not a bus id
  EXPECT_EQ(t->init(&kHost, &ctx), ncclInvalidArgument);
  EXPECT_NE(std::string(t->lastError(nullptr)).find("is not a PCI bus id"), std::string::npos)
      << t->lastError(nullptr);
  unsetenv("XPU_EMU_PCI_BUS_IDS");
}

// ---- memory ---------------------------------------------------------------------------

TEST_F(XpuEmu, PointerQueries) {
  void* d0 = devAlloc(1000);
  void* d1 = devAlloc(77, 1);
  ASSERT_NE(d0, nullptr);
  ASSERT_NE(d1, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(d0) % 256, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(d1) % 256, 0u);
  void* h = nullptr;
  ASSERT_EQ(t_->hostAlloc(ctx_, 5000, &h), ncclSuccess);

  tuttiPluginPointerInfo_v1 info{};
  info.structSize = sizeof info;
  ASSERT_EQ(t_->queryPointer(ctx_, static_cast<char*>(d0) + 999, &info), ncclSuccess);
  EXPECT_EQ(info.memoryType, TUTTI_PLUGIN_MEM_DEVICE);
  EXPECT_EQ(info.device, 0);
  EXPECT_EQ(info.base, d0);
  EXPECT_EQ(info.size, 1000u);
  ASSERT_EQ(t_->queryPointer(ctx_, static_cast<char*>(d0) + 1000, &info), ncclSuccess);
  EXPECT_EQ(info.memoryType, TUTTI_PLUGIN_MEM_UNKNOWN);  // one past the end
  ASSERT_EQ(t_->queryPointer(ctx_, d1, &info), ncclSuccess);
  EXPECT_EQ(info.memoryType, TUTTI_PLUGIN_MEM_DEVICE);
  EXPECT_EQ(info.device, 1);
  ASSERT_EQ(t_->queryPointer(ctx_, static_cast<char*>(h) + 4999, &info), ncclSuccess);
  EXPECT_EQ(info.memoryType, TUTTI_PLUGIN_MEM_HOST_PINNED);
  EXPECT_EQ(info.base, h);
  EXPECT_EQ(info.size, 5000u);
  int local = 0;
  for (const void* p : {static_cast<const void*>(&local), static_cast<const void*>(nullptr),
                        reinterpret_cast<const void*>(uintptr_t{16})}) {
    ASSERT_EQ(t_->queryPointer(ctx_, p, &info), ncclSuccess);
    EXPECT_EQ(info.memoryType, TUTTI_PLUGIN_MEM_UNKNOWN);
    EXPECT_EQ(info.device, -1);
    EXPECT_EQ(info.base, nullptr);
    EXPECT_EQ(info.size, 0u);
  }

  void* zero = reinterpret_cast<void*>(1);
  EXPECT_EQ(t_->memAlloc(ctx_, 0, 0, &zero), ncclSuccess);
  EXPECT_EQ(zero, nullptr);
  EXPECT_EQ(t_->memAlloc(ctx_, 2, 64, &zero), ncclInvalidArgument);  // 2 devices
  EXPECT_NE(err().find("device 2"), std::string::npos) << err();
  EXPECT_EQ(t_->memFree(ctx_, nullptr), ncclSuccess);
  EXPECT_EQ(t_->memFree(ctx_, static_cast<char*>(d0) + 8), ncclInvalidArgument);
  EXPECT_EQ(t_->memFree(ctx_, h), ncclInvalidArgument);  // pinned memory is hostFree's
  EXPECT_EQ(t_->hostFree(ctx_, d0), ncclInvalidArgument);
  EXPECT_EQ(t_->hostFree(ctx_, h), ncclSuccess);
  devFree(d0);
  devFree(d1);
  ASSERT_EQ(t_->queryPointer(ctx_, d0, &info), ncclSuccess);
  EXPECT_EQ(info.memoryType, TUTTI_PLUGIN_MEM_UNKNOWN);  // freed
}

// A child touches device memory from the host: it must die of SIGSEGV.
void expectHostAccessFaults(void* p, bool write) {
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    signal(SIGSEGV, SIG_DFL);
    volatile char* c = static_cast<volatile char*>(p);
    if (write) {
      c[0] = 1;
    } else {
      (void)c[0];
    }
    _exit(0);  // reached only if the access did not fault
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV)
      << "status " << status << (write ? " (write)" : " (read)");
}

TEST_F(XpuEmu, HostAccessToDeviceMemoryFaults) {
  void* d = devAlloc(4096);
  const char hello[] = "device data";
  toDev(d, hello, sizeof hello);
  expectHostAccessFaults(d, false);
  expectHostAccessFaults(static_cast<char*>(d) + 100, true);
  char back[sizeof hello] = {};
  toHost(back, d, sizeof hello);
  EXPECT_STREQ(back, hello);
  devFree(d);
}

TEST_F(XpuEmu, CopiesInEveryDirection) {
  const size_t n = 100003;  // odd
  std::vector<unsigned char> src(n), back(n);
  for (size_t i = 0; i < n; ++i) src[i] = static_cast<unsigned char>(i * 7 + 3);
  void* a = devAlloc(n + 64);
  void* b = devAlloc(n + 64, 1);
  void* pinned = nullptr;
  ASSERT_EQ(t_->hostAlloc(ctx_, n, &pinned), ncclSuccess);
  tuttiPluginQueue_t q = nullptr;
  ASSERT_EQ(t_->queueCreate(ctx_, 1, &q), ncclSuccess);

  // pageable -> device at an odd offset, device -> device across devices,
  // device -> pinned, pinned -> pageable; all on one queue, one sync at the end.
  ASSERT_EQ(t_->memcpyAsync(ctx_, static_cast<char*>(a) + 5, src.data(), n, q), ncclSuccess);
  ASSERT_EQ(t_->memcpyAsync(ctx_, static_cast<char*>(b) + 63, static_cast<char*>(a) + 5, n, q),
            ncclSuccess);
  ASSERT_EQ(t_->memcpyAsync(ctx_, pinned, static_cast<char*>(b) + 63, n, q), ncclSuccess);
  ASSERT_EQ(t_->memcpyAsync(ctx_, back.data(), pinned, n, q), ncclSuccess);
  ASSERT_EQ(t_->queueSynchronize(ctx_, q), ncclSuccess);
  EXPECT_EQ(back, src);

  // A pageable source is read before memcpyAsync returns: changing it afterwards
  // does not change what lands on the device (staged and large paths).
  for (size_t bytes : {size_t{1}, size_t{3001}, size_t{5} << 20}) {
    std::vector<unsigned char> big(bytes, 0xab), got(bytes);
    void* d = devAlloc(bytes);
    ASSERT_EQ(t_->memcpyAsync(ctx_, d, big.data(), bytes, q), ncclSuccess);
    std::fill(big.begin(), big.end(), 0x11);
    toHost(got.data(), d, bytes, q);
    EXPECT_EQ(got, std::vector<unsigned char>(bytes, 0xab)) << bytes;
    devFree(d);
  }

  // Zero bytes is a no-op; running past an allocation is refused.
  EXPECT_EQ(t_->memcpyAsync(ctx_, a, src.data(), 0, q), ncclSuccess);
  EXPECT_EQ(t_->memcpyAsync(ctx_, static_cast<char*>(a) + 65, src.data(), n, q),
            ncclInvalidArgument);
  EXPECT_NE(err().find("past the end"), std::string::npos) << err();
  EXPECT_EQ(t_->memcpyAsync(ctx_, back.data(), static_cast<char*>(b) + 100, n, q),
            ncclInvalidArgument);
  int notAQueue = 0;
  EXPECT_EQ(
      t_->memcpyAsync(ctx_, a, src.data(), 8, reinterpret_cast<tuttiPluginQueue_t>(&notAQueue)),
      ncclInvalidArgument);
  EXPECT_NE(err().find("unknown queue"), std::string::npos) << err();

  EXPECT_EQ(t_->queueDestroy(ctx_, q), ncclSuccess);
  EXPECT_EQ(t_->hostFree(ctx_, pinned), ncclSuccess);
  devFree(a);
  devFree(b);
}

// ---- queues and events ------------------------------------------------------------------

constexpr size_t kBig = 64ull << 20;  // copies of this size take milliseconds

TEST_F(XpuEmu, QueueRunsInOrder) {
  // A long copy fills x; a kernel on the same queue must see all of it.
  const size_t count = kBig / 4;
  std::vector<int32_t> host(count);
  for (size_t i = 0; i < count; ++i) host[i] = static_cast<int32_t>(i);
  void* x = devAlloc(kBig);
  void* y = devAlloc(kBig);
  tuttiPluginQueue_t q = nullptr;
  ASSERT_EQ(t_->queueCreate(ctx_, 0, &q), ncclSuccess);
  void* pinned = nullptr;
  ASSERT_EQ(t_->hostAlloc(ctx_, kBig, &pinned), ncclSuccess);
  std::memcpy(pinned, host.data(), kBig);
  ASSERT_EQ(t_->memcpyAsync(ctx_, x, pinned, kBig, q), ncclSuccess);
  ASSERT_EQ(t_->memcpyAsync(ctx_, y, x, kBig, q), ncclSuccess);
  const size_t tail = 1000;
  const void* srcs[2] = {static_cast<char*>(x) + kBig - tail * 4,
                         static_cast<char*>(y) + kBig - tail * 4};
  tuttiPluginReduceArgs_v1 a{};
  a.structSize = sizeof a;
  a.datatype = ncclInt32;
  a.op = TUTTI_PLUGIN_OP_SUM;
  a.nSrcs = 2;
  a.count = tail;
  a.dst = x;  // the head of x: in order, after the copies
  a.srcs = srcs;
  ASSERT_EQ(t_->reduce(ctx_, &a, q), ncclSuccess) << err();
  std::vector<int32_t> out(tail);
  toHost(out.data(), x, tail * 4, q);
  for (size_t i = 0; i < tail; ++i) ASSERT_EQ(out[i], 2 * static_cast<int32_t>(count - tail + i));
  EXPECT_EQ(t_->queueDestroy(ctx_, q), ncclSuccess);
  EXPECT_EQ(t_->hostFree(ctx_, pinned), ncclSuccess);
  devFree(x);
  devFree(y);
}

TEST_F(XpuEmu, EventsOrderTwoQueues) {
  void* x = devAlloc(kBig);
  void* y = devAlloc(kBig);
  std::vector<unsigned char> pattern(4096, 0x5a);
  toDev(static_cast<char*>(x) + kBig - 4096, pattern.data(), 4096);
  tuttiPluginQueue_t qa = nullptr, qb = nullptr;
  ASSERT_EQ(t_->queueCreate(ctx_, 0, &qa), ncclSuccess);
  ASSERT_EQ(t_->queueCreate(ctx_, 0, &qb), ncclSuccess);
  tuttiPluginEvent_t e = nullptr, never = nullptr;
  ASSERT_EQ(t_->eventCreate(ctx_, 0, &e), ncclSuccess);
  ASSERT_EQ(t_->eventCreate(ctx_, 1, &never), ncclSuccess);

  int32_t done = -1;
  ASSERT_EQ(t_->eventQuery(ctx_, never, &done), ncclSuccess);
  EXPECT_EQ(done, 1);  // never recorded: complete
  EXPECT_EQ(t_->eventSynchronize(ctx_, never), ncclSuccess);
  EXPECT_EQ(t_->eventWait(ctx_, qb, never), ncclSuccess);  // waits for nothing

  // Queue A: several long copies ending in y; B waits for A's event, then reads y.
  for (int i = 0; i < 8; ++i) ASSERT_EQ(t_->memcpyAsync(ctx_, y, x, kBig, qa), ncclSuccess);
  ASSERT_EQ(t_->eventRecord(ctx_, e, qa), ncclSuccess);
  ASSERT_EQ(t_->eventQuery(ctx_, e, &done), ncclSuccess);
  EXPECT_EQ(done, 0);  // hundreds of MiB are still being copied
  ASSERT_EQ(t_->eventWait(ctx_, qb, e), ncclSuccess);
  std::vector<unsigned char> got(4096);
  ASSERT_EQ(t_->memcpyAsync(ctx_, got.data(), static_cast<char*>(y) + kBig - 4096, 4096, qb),
            ncclSuccess);
  ASSERT_EQ(t_->queueSynchronize(ctx_, qb), ncclSuccess);
  EXPECT_EQ(got, pattern);
  ASSERT_EQ(t_->eventQuery(ctx_, e, &done), ncclSuccess);
  EXPECT_EQ(done, 1);  // B passed the wait, so A reached the mark

  // Re-recording replaces the mark; eventSynchronize waits for the new one.
  for (int i = 0; i < 4; ++i) ASSERT_EQ(t_->memcpyAsync(ctx_, x, y, kBig, qa), ncclSuccess);
  ASSERT_EQ(t_->eventRecord(ctx_, e, qa), ncclSuccess);
  ASSERT_EQ(t_->eventSynchronize(ctx_, e), ncclSuccess);
  ASSERT_EQ(t_->eventQuery(ctx_, e, &done), ncclSuccess);
  EXPECT_EQ(done, 1);

  // A destroyed queue finishes its work; a destroyed event lets records complete.
  for (int i = 0; i < 4; ++i) ASSERT_EQ(t_->memcpyAsync(ctx_, y, x, kBig, qa), ncclSuccess);
  ASSERT_EQ(t_->eventRecord(ctx_, e, qa), ncclSuccess);
  ASSERT_EQ(t_->eventRecord(ctx_, never, qa), ncclSuccess);
  ASSERT_EQ(t_->queueDestroy(ctx_, qa), ncclSuccess);  // does not wait
  ASSERT_EQ(t_->eventDestroy(ctx_, e), ncclSuccess);
  ASSERT_EQ(t_->eventSynchronize(ctx_, never), ncclSuccess);
  EXPECT_EQ(t_->eventQuery(ctx_, e, &done), ncclInvalidArgument);  // destroyed
  EXPECT_EQ(t_->queueSynchronize(ctx_, qa), ncclInvalidArgument);

  EXPECT_EQ(t_->eventDestroy(ctx_, never), ncclSuccess);
  EXPECT_EQ(t_->queueDestroy(ctx_, qb), ncclSuccess);
  devFree(x);
  devFree(y);
}

TEST_F(XpuEmu, FinalizeDrainsPendingWork) {
  void* x = devAlloc(kBig);
  void* y = devAlloc(kBig);
  void* z = devAlloc(kBig);
  tuttiPluginQueue_t q = nullptr;
  ASSERT_EQ(t_->queueCreate(ctx_, 0, &q), ncclSuccess);
  for (int i = 0; i < 4; ++i) ASSERT_EQ(t_->memcpyAsync(ctx_, y, x, kBig, q), ncclSuccess);
  ASSERT_EQ(t_->memcpyAsync(ctx_, z, x, kBig, nullptr), ncclSuccess);  // default queue
  EXPECT_EQ(t_->finalize(ctx_), ncclSuccess);                          // joins, unmaps
  ctx_ = nullptr;
}

// ---- setDevice and host events -----------------------------------------------------------

TEST_F(XpuEmu, SetDeviceIsPerThread) {
  int32_t cur = -1;
  ASSERT_EQ(t_->currentDevice(ctx_, &cur), ncclSuccess);
  EXPECT_EQ(cur, 0);  // XPU_EMU_DEVICE unset
  ASSERT_EQ(t_->setDevice(ctx_, 1), ncclSuccess) << err();
  ASSERT_EQ(t_->currentDevice(ctx_, &cur), ncclSuccess);
  EXPECT_EQ(cur, 1);
  // Another thread keeps its own current device.
  int32_t other = -1;
  std::thread([&] { t_->currentDevice(ctx_, &other); }).join();
  EXPECT_EQ(other, 0);
  // The NULL queue is now device 1's default queue: copies through it work.
  void* d = devAlloc(64, 1);
  const char hello[] = "device one";
  char back[sizeof hello] = {};
  toDev(d, hello, sizeof hello);
  toHost(back, d, sizeof hello);
  EXPECT_STREQ(back, hello);
  devFree(d);
  // Out of range: an error with the reason, the current device unchanged.
  for (int32_t bad : {2, -1}) {
    EXPECT_EQ(t_->setDevice(ctx_, bad), ncclInvalidArgument);
    EXPECT_NE(err().find("setDevice: device " + std::to_string(bad) + " does not exist"),
              std::string::npos)
        << err();
  }
  ASSERT_EQ(t_->currentDevice(ctx_, &cur), ncclSuccess);
  EXPECT_EQ(cur, 1);
  // A second context of the same thread starts from XPU_EMU_DEVICE again.
  void* ctx2 = nullptr;
  ASSERT_EQ(t_->init(&kHost, &ctx2), ncclSuccess);
  ASSERT_EQ(t_->currentDevice(ctx2, &cur), ncclSuccess);
  EXPECT_EQ(cur, 0);
  EXPECT_EQ(t_->finalize(ctx2), ncclSuccess);
}

// Fails the test and ends the process if it is still alive after `limit`:
// for calls that must not hang (a hang would otherwise only show as ctest's
// timeout).
class Watchdog {
 public:
  Watchdog(std::chrono::milliseconds limit, const char* what)
      : thread_([this, limit, what] {
          std::unique_lock<std::mutex> lock(mu_);
          if (!cv_.wait_for(lock, limit, [this] { return done_; })) {
            fprintf(stderr, "FAILED: %s did not return within %lld ms\n", what,
                    static_cast<long long>(limit.count()));
            std::abort();
          }
        }) {}
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

using Clock = std::chrono::steady_clock;
long long msSince(Clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
}

// Device memory holding `pattern`, and zeroed pinned memory to copy it into.
struct HeldCopy {
  std::vector<unsigned char> pattern = std::vector<unsigned char>(1 << 16);
  void* dev = nullptr;
  unsigned char* pinned = nullptr;
  bool landed() const { return std::memcmp(pinned, pattern.data(), pattern.size()) == 0; }
  bool untouched() const {
    for (size_t i = 0; i < pattern.size(); ++i)
      if (pinned[i] != 0) return false;
    return true;
  }
};

TEST_F(XpuEmu, HostEventHoldsOnlyItsQueue) {
  HeldCopy h;
  for (size_t i = 0; i < h.pattern.size(); ++i) h.pattern[i] = static_cast<unsigned char>(i + 1);
  h.dev = devAlloc(h.pattern.size());
  toDev(h.dev, h.pattern.data(), h.pattern.size());
  void* pinned = nullptr;
  ASSERT_EQ(t_->hostAlloc(ctx_, h.pattern.size(), &pinned), ncclSuccess);
  h.pinned = static_cast<unsigned char*>(pinned);
  std::memset(h.pinned, 0, h.pattern.size());
  tuttiPluginQueue_t q = nullptr, q2 = nullptr;
  ASSERT_EQ(t_->queueCreate(ctx_, 0, &q), ncclSuccess);
  ASSERT_EQ(t_->queueCreate(ctx_, 0, &q2), ncclSuccess);
  tuttiPluginEvent_t he = nullptr, plain = nullptr;
  ASSERT_EQ(t_->hostEventCreate(ctx_, 0, &he), ncclSuccess) << err();
  ASSERT_EQ(t_->eventCreate(ctx_, 0, &plain), ncclSuccess);
  int32_t done = -1;
  ASSERT_EQ(t_->eventQuery(ctx_, he, &done), ncclSuccess);
  EXPECT_EQ(done, 0);  // unsignalled from the start
  EXPECT_EQ(t_->eventRecord(ctx_, he, q), ncclInvalidArgument);
  EXPECT_NE(err().find("host event"), std::string::npos) << err();
  EXPECT_EQ(t_->hostEventSignal(ctx_, plain), ncclInvalidArgument);
  tuttiPluginEvent_t bad = nullptr;
  EXPECT_EQ(t_->hostEventCreate(ctx_, 2, &bad), ncclInvalidArgument);

  {
    Watchdog wd(std::chrono::seconds(10), "eventWait on an unsignalled host event");
    const auto t0 = Clock::now();
    ASSERT_EQ(t_->eventWait(ctx_, q, he), ncclSuccess) << err();
    EXPECT_LT(msSince(t0), 50) << "eventWait must return at once; the queue waits, not the host";
  }
  ASSERT_EQ(t_->memcpyAsync(ctx_, h.pinned, h.dev, h.pattern.size(), q), ncclSuccess);
  // Other queues run meanwhile: only q is held.
  std::vector<unsigned char> other(h.pattern.size());
  {
    Watchdog wd(std::chrono::seconds(10), "a queue that does not wait");
    toHost(other.data(), h.dev, other.size(), q2);
    toHost(other.data(), h.dev, other.size(), nullptr);
  }
  EXPECT_EQ(other, h.pattern);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_TRUE(h.untouched()) << "the copy behind the wait ran before the signal";
  ASSERT_EQ(t_->eventQuery(ctx_, he, &done), ncclSuccess);
  EXPECT_EQ(done, 0);

  // Signalled from another thread while this one waits for the queue.
  const auto t0 = Clock::now();
  std::thread signaller([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_EQ(t_->hostEventSignal(ctx_, he), ncclSuccess);
  });
  {
    Watchdog wd(std::chrono::seconds(10), "queueSynchronize after hostEventSignal");
    ASSERT_EQ(t_->queueSynchronize(ctx_, q), ncclSuccess);
  }
  EXPECT_GE(msSince(t0), 45) << "queueSynchronize returned before the signal";
  signaller.join();
  EXPECT_TRUE(h.landed());
  ASSERT_EQ(t_->eventQuery(ctx_, he, &done), ncclSuccess);
  EXPECT_EQ(done, 1);
  EXPECT_EQ(t_->eventSynchronize(ctx_, he), ncclSuccess);
  EXPECT_EQ(t_->hostEventSignal(ctx_, he), ncclSuccess);  // idempotent
  // Once signalled, a wait holds nothing.
  std::memset(h.pinned, 0, h.pattern.size());
  ASSERT_EQ(t_->eventWait(ctx_, q, he), ncclSuccess);
  toHost(h.pinned, h.dev, h.pattern.size(), q);
  EXPECT_TRUE(h.landed());

  EXPECT_EQ(t_->eventDestroy(ctx_, he), ncclSuccess);
  EXPECT_EQ(t_->hostEventSignal(ctx_, he), ncclInvalidArgument);  // destroyed
  EXPECT_EQ(t_->eventDestroy(ctx_, plain), ncclSuccess);
  EXPECT_EQ(t_->queueDestroy(ctx_, q), ncclSuccess);
  EXPECT_EQ(t_->queueDestroy(ctx_, q2), ncclSuccess);
  EXPECT_EQ(t_->hostFree(ctx_, pinned), ncclSuccess);
  devFree(h.dev);
}

// eventSynchronize on a host event waits for the signal.
TEST_F(XpuEmu, HostEventSynchronizeWaitsForTheSignal) {
  tuttiPluginEvent_t he = nullptr;
  ASSERT_EQ(t_->hostEventCreate(ctx_, 1, &he), ncclSuccess);
  const auto t0 = Clock::now();
  std::thread signaller([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    t_->hostEventSignal(ctx_, he);
  });
  {
    Watchdog wd(std::chrono::seconds(10), "eventSynchronize on a host event");
    EXPECT_EQ(t_->eventSynchronize(ctx_, he), ncclSuccess);
  }
  EXPECT_GE(msSince(t0), 45);
  signaller.join();
  EXPECT_EQ(t_->eventDestroy(ctx_, he), ncclSuccess);
}

// Destroying a host event a queue waits on releases the queue: its later work runs.
TEST_F(XpuEmu, DestroyingAWaitedHostEventReleasesTheQueue) {
  HeldCopy h;
  std::fill(h.pattern.begin(), h.pattern.end(), 0x77);
  h.dev = devAlloc(h.pattern.size());
  toDev(h.dev, h.pattern.data(), h.pattern.size());
  void* pinned = nullptr;
  ASSERT_EQ(t_->hostAlloc(ctx_, h.pattern.size(), &pinned), ncclSuccess);
  h.pinned = static_cast<unsigned char*>(pinned);
  std::memset(h.pinned, 0, h.pattern.size());
  tuttiPluginQueue_t q = nullptr;
  ASSERT_EQ(t_->queueCreate(ctx_, 0, &q), ncclSuccess);
  tuttiPluginEvent_t he = nullptr;
  ASSERT_EQ(t_->hostEventCreate(ctx_, 0, &he), ncclSuccess);
  ASSERT_EQ(t_->eventWait(ctx_, q, he), ncclSuccess);
  ASSERT_EQ(t_->memcpyAsync(ctx_, h.pinned, h.dev, h.pattern.size(), q), ncclSuccess);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_TRUE(h.untouched());
  ASSERT_EQ(t_->eventDestroy(ctx_, he), ncclSuccess);
  {
    Watchdog wd(std::chrono::seconds(10), "queueSynchronize after destroying the host event");
    ASSERT_EQ(t_->queueSynchronize(ctx_, q), ncclSuccess);
  }
  EXPECT_TRUE(h.landed());
  EXPECT_EQ(t_->queueDestroy(ctx_, q), ncclSuccess);
  EXPECT_EQ(t_->hostFree(ctx_, pinned), ncclSuccess);
  devFree(h.dev);
}

// queueDestroy does not wait (a destroyed queue's work runs once its host
// event is signalled); finalize with queues, the NULL queue included, held by
// a host event nobody signals returns (it signals the event).
TEST_F(XpuEmu, QueueDestroyAndFinalizeWithAnUnsignalledWaitDoNotHang) {
  HeldCopy h;
  std::fill(h.pattern.begin(), h.pattern.end(), 0x3c);
  h.dev = devAlloc(h.pattern.size());
  toDev(h.dev, h.pattern.data(), h.pattern.size());
  void* pinned = nullptr;
  ASSERT_EQ(t_->hostAlloc(ctx_, h.pattern.size(), &pinned), ncclSuccess);
  h.pinned = static_cast<unsigned char*>(pinned);
  std::memset(h.pinned, 0, h.pattern.size());
  tuttiPluginQueue_t q = nullptr;
  ASSERT_EQ(t_->queueCreate(ctx_, 0, &q), ncclSuccess);
  tuttiPluginEvent_t he = nullptr, never = nullptr;
  ASSERT_EQ(t_->hostEventCreate(ctx_, 0, &he), ncclSuccess);
  ASSERT_EQ(t_->eventWait(ctx_, q, he), ncclSuccess);
  ASSERT_EQ(t_->memcpyAsync(ctx_, h.pinned, h.dev, h.pattern.size(), q), ncclSuccess);
  // Completes after the copy: polling it (not the copy's bytes, which the
  // queue's thread is writing) says when the copy has landed.
  tuttiPluginEvent_t copied = nullptr;
  ASSERT_EQ(t_->eventCreate(ctx_, 0, &copied), ncclSuccess);
  ASSERT_EQ(t_->eventRecord(ctx_, copied, q), ncclSuccess);
  {
    Watchdog wd(std::chrono::seconds(10), "queueDestroy of a queue held by a host event");
    const auto t0 = Clock::now();
    ASSERT_EQ(t_->queueDestroy(ctx_, q), ncclSuccess);
    EXPECT_LT(msSince(t0), 50);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_TRUE(h.untouched()) << "queueDestroy released the wait";
  ASSERT_EQ(t_->hostEventSignal(ctx_, he), ncclSuccess);
  const auto t0 = Clock::now();
  int32_t done = 0;
  while (t_->eventQuery(ctx_, copied, &done) == ncclSuccess && !done && msSince(t0) < 10000)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_TRUE(done && h.landed()) << "the destroyed queue's work did not run after the signal";
  EXPECT_EQ(t_->eventDestroy(ctx_, copied), ncclSuccess);
  EXPECT_EQ(t_->eventDestroy(ctx_, he), ncclSuccess);

  // Held by `never` at finalize: a created queue, a destroyed one, the NULL queue.
  tuttiPluginQueue_t q2 = nullptr, q3 = nullptr;
  ASSERT_EQ(t_->queueCreate(ctx_, 1, &q2), ncclSuccess);
  ASSERT_EQ(t_->queueCreate(ctx_, 0, &q3), ncclSuccess);
  ASSERT_EQ(t_->hostEventCreate(ctx_, 0, &never), ncclSuccess);
  // A destination per queue: the three copies run concurrently once released.
  std::vector<std::vector<unsigned char>> dst(3, std::vector<unsigned char>(h.pattern.size()));
  int k = 0;
  for (tuttiPluginQueue_t held : {q2, q3, static_cast<tuttiPluginQueue_t>(nullptr)}) {
    ASSERT_EQ(t_->eventWait(ctx_, held, never), ncclSuccess);
    ASSERT_EQ(t_->memcpyAsync(ctx_, dst[k++].data(), h.dev, h.pattern.size(), held), ncclSuccess);
  }
  ASSERT_EQ(t_->queueDestroy(ctx_, q3), ncclSuccess);
  {
    Watchdog wd(std::chrono::seconds(10), "finalize with queues held by a host event");
    EXPECT_EQ(t_->finalize(ctx_), ncclSuccess);
  }
  ctx_ = nullptr;
}

// ---- IPC ---------------------------------------------------------------------------------

bool sendHandle(int sock, const tuttiPluginIpcHandle_v1& h) {
  struct iovec iov = {const_cast<tuttiPluginIpcHandle_v1*>(&h), sizeof h};
  char ctrl[CMSG_SPACE(sizeof(int))] = {};
  struct msghdr msg = {};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = ctrl;
  msg.msg_controllen = sizeof ctrl;
  struct cmsghdr* cm = CMSG_FIRSTHDR(&msg);
  cm->cmsg_level = SOL_SOCKET;
  cm->cmsg_type = SCM_RIGHTS;
  cm->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(cm), &h.fd, sizeof(int));
  return sendmsg(sock, &msg, 0) == static_cast<ssize_t>(sizeof h);
}

bool recvHandle(int sock, tuttiPluginIpcHandle_v1* h) {
  struct iovec iov = {h, sizeof *h};
  char ctrl[CMSG_SPACE(sizeof(int))] = {};
  struct msghdr msg = {};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = ctrl;
  msg.msg_controllen = sizeof ctrl;
  if (recvmsg(sock, &msg, 0) != static_cast<ssize_t>(sizeof *h)) return false;
  struct cmsghdr* cm = CMSG_FIRSTHDR(&msg);
  if (cm == nullptr || cm->cmsg_type != SCM_RIGHTS) return false;
  std::memcpy(&h->fd, CMSG_DATA(cm), sizeof(int));
  return true;
}

// The importing process: maps the handle, checks the parent's data through the
// device, writes its own, unmaps. Exit status 0 on success, else the failed step.
int ipcChild(int sock) {
  tuttiPluginIpcHandle_v1 h{};
  if (!recvHandle(sock, &h)) return 10;
  const tuttiBackendPlugin_v1* t = table();
  void* ctx = nullptr;
  if (t == nullptr || t->init(&kHost, &ctx) != ncclSuccess) return 11;
  void* p = nullptr;
  if (t->ipcImport(ctx, 1, &h, &p) != ncclSuccess) return 12;
  close(h.fd);  // tutti closes it after the call; the mapping stays
  tuttiPluginPointerInfo_v1 info{};
  info.structSize = sizeof info;
  if (t->queryPointer(ctx, p, &info) != ncclSuccess || info.memoryType != TUTTI_PLUGIN_MEM_DEVICE ||
      info.device != 1)
    return 13;
  std::vector<unsigned char> got(8192), mine(8192);
  if (t->memcpyAsync(ctx, got.data(), p, got.size(), nullptr) != ncclSuccess) return 14;
  if (t->queueSynchronize(ctx, nullptr) != ncclSuccess) return 15;
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i] != static_cast<unsigned char>(i * 3)) return 16;
  for (size_t i = 0; i < mine.size(); ++i) mine[i] = static_cast<unsigned char>(i * 5 + 1);
  if (t->memcpyAsync(ctx, p, mine.data(), mine.size(), nullptr) != ncclSuccess) return 17;
  if (t->queueSynchronize(ctx, nullptr) != ncclSuccess) return 18;
  if (t->ipcClose(ctx, p) != ncclSuccess) return 19;
  if (t->finalize(ctx) != ncclSuccess) return 20;
  const char ok = 1;
  return write(sock, &ok, 1) == 1 ? 0 : 21;
}

TEST(XpuEmuIpc, TwoProcessesShareDeviceMemory) {
  const tuttiBackendPlugin_v1* t = table();
  ASSERT_NE(t, nullptr);
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  const pid_t pid = fork();  // before any plugin thread exists in this process
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    close(sv[0]);
    _exit(ipcChild(sv[1]));
  }
  close(sv[1]);
  void* ctx = nullptr;
  ASSERT_EQ(t->init(&kHost, &ctx), ncclSuccess);
  void* d = nullptr;
  ASSERT_EQ(t->memAlloc(ctx, 0, 1 << 20, &d), ncclSuccess);
  std::vector<unsigned char> data(8192);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<unsigned char>(i * 3);
  char* exported = static_cast<char*>(d) + 4096 + 17;
  ASSERT_EQ(t->memcpyAsync(ctx, exported, data.data(), data.size(), nullptr), ncclSuccess);
  ASSERT_EQ(t->queueSynchronize(ctx, nullptr), ncclSuccess);
  tuttiPluginIpcHandle_v1 h{};
  h.structSize = sizeof h;
  const int32_t pids[1] = {pid};
  ASSERT_EQ(t->ipcExport(ctx, exported, data.size(), pids, 1, &h), ncclSuccess)
      << t->lastError(ctx);
  EXPECT_GE(h.fd, 0);
  EXPECT_EQ(h.offset, 4096u + 17u);
  EXPECT_GT(h.dataSize, 0u);
  EXPECT_LE(h.dataSize, static_cast<uint32_t>(TUTTI_PLUGIN_IPC_HANDLE_BYTES));
  ASSERT_TRUE(sendHandle(sv[0], h));
  close(h.fd);  // tutti owns the exported fd and closes it after sending
  char ack = 0;
  EXPECT_EQ(read(sv[0], &ack, 1), 1);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 0) << "child failed at step " << WEXITSTATUS(status);
  std::vector<unsigned char> back(8192);
  ASSERT_EQ(t->memcpyAsync(ctx, back.data(), exported, back.size(), nullptr), ncclSuccess);
  ASSERT_EQ(t->queueSynchronize(ctx, nullptr), ncclSuccess);
  for (size_t i = 0; i < back.size(); ++i)
    ASSERT_EQ(back[i], static_cast<unsigned char>(i * 5 + 1)) << i;
  close(sv[0]);
  EXPECT_EQ(t->memFree(ctx, d), ncclSuccess);
  EXPECT_EQ(t->finalize(ctx), ncclSuccess);
}

TEST_F(XpuEmu, IpcWithinOneProcessAndGarbageHandles) {
  void* d = devAlloc(10000);
  std::vector<unsigned char> data(100, 0x42);
  toDev(static_cast<char*>(d) + 9900, data.data(), 100);
  tuttiPluginIpcHandle_v1 h{};
  h.structSize = sizeof h;
  ASSERT_EQ(t_->ipcExport(ctx_, static_cast<char*>(d) + 9900, 100, nullptr, 0, &h), ncclSuccess);
  EXPECT_EQ(t_->ipcExport(ctx_, static_cast<char*>(d) + 9900, 101, nullptr, 0, &h),
            ncclInvalidArgument);  // past the end
  int local = 0;
  tuttiPluginIpcHandle_v1 other = h;
  EXPECT_EQ(t_->ipcExport(ctx_, &local, 4, nullptr, 0, &other), ncclInvalidArgument);

  // The same process may import its own export (a second mapping of the memory).
  void* p = nullptr;
  ASSERT_EQ(t_->ipcImport(ctx_, 0, &h, &p), ncclSuccess) << err();
  std::vector<unsigned char> got(100);
  toHost(got.data(), p, 100);
  EXPECT_EQ(got, data);

  // Garbage: each must fail with ncclInvalidArgument and say why.
  auto expectRejected = [&](tuttiPluginIpcHandle_v1 bad, const char* what) {
    void* q = reinterpret_cast<void*>(1);
    EXPECT_EQ(t_->ipcImport(ctx_, 0, &bad, &q), ncclInvalidArgument) << what;
    EXPECT_FALSE(err().empty()) << what;
  };
  tuttiPluginIpcHandle_v1 bad{};
  bad.structSize = sizeof bad;
  bad.fd = -1;
  expectRejected(bad, "all zero");
  bad = h;
  bad.data[0] ^= 0xff;
  expectRejected(bad, "bad magic");
  bad = h;
  bad.data[9] ^= 0x01;
  expectRejected(bad, "corrupt size");
  bad = h;
  bad.dataSize = 3;
  expectRejected(bad, "data size");
  bad = h;
  bad.offset = 10000;
  expectRejected(bad, "offset beyond the allocation");
  bad = h;
  bad.fd = -1;
  expectRejected(bad, "no fd");
  bad = h;
  bad.structSize = 8;
  expectRejected(bad, "struct size");
  int pipefd[2];
  ASSERT_EQ(pipe(pipefd), 0);
  bad = h;
  bad.fd = pipefd[0];
  expectRejected(bad, "an fd that is not memory");
  close(pipefd[0]);
  close(pipefd[1]);
  for (size_t i = 0; i < sizeof bad.data; ++i) bad.data[i] = static_cast<unsigned char>(i * 37);
  bad.fd = h.fd;
  bad.dataSize = h.dataSize;
  expectRejected(bad, "random bytes");
  EXPECT_EQ(t_->ipcImport(ctx_, 5, &h, &p), ncclInvalidArgument);  // no such device

  EXPECT_EQ(t_->ipcClose(ctx_, d), ncclInvalidArgument);  // not an import
  EXPECT_EQ(t_->memFree(ctx_, p), ncclInvalidArgument);   // imports are ipcClose's
  EXPECT_EQ(t_->ipcClose(ctx_, p), ncclSuccess);
  close(h.fd);
  devFree(d);
}

// ---- kernels -----------------------------------------------------------------------------

const int kAllTypes[] = {ncclInt8,    ncclUint8,    ncclInt32,      ncclUint32,
                         ncclInt64,   ncclUint64,   ncclFloat16,    ncclFloat32,
                         ncclFloat64, ncclBfloat16, ncclFloat8e4m3, ncclFloat8e5m2};
const int kAllOps[] = {TUTTI_PLUGIN_OP_SUM, TUTTI_PLUGIN_OP_PROD, TUTTI_PLUGIN_OP_MAX,
                       TUTTI_PLUGIN_OP_MIN, TUTTI_PLUGIN_OP_AVG,  TUTTI_PLUGIN_OP_PREMULSUM};

// Small integer values, chosen so that every intermediate result is exact in
// every datatype (e5m2 has two mantissa bits): the expectation is plain math.
TEST_F(XpuEmu, ReduceEveryTypeAndOp) {
  for (int dt : kAllTypes) {
    for (int op : kAllOps) {
      for (int nSrcs : {1, 2, 3}) {
        for (uint64_t count : {uint64_t{1}, uint64_t{7}, uint64_t{300}}) {
          std::vector<std::vector<unsigned char>> in(
              static_cast<size_t>(nSrcs), std::vector<unsigned char>(count * typeSize(dt)));
          std::vector<std::vector<double>> vals(static_cast<size_t>(nSrcs));
          for (int k = 0; k < nSrcs; ++k) {
            for (uint64_t i = 0; i < count; ++i) {
              const int r = static_cast<int>((i * 7 + static_cast<uint64_t>(k) * 3 + 1) % 5);
              const double v = isSigned(dt) ? r - 2 : r;  // [-2, 2] or [0, 4]
              vals[k].push_back(v);
              putValue(&in[k], i, v, dt);
            }
          }
          // Floats average by a power of two (exact); integers by 3 (truncation).
          const uint32_t divisor = isInteger(dt) ? 3 : 2;
          std::vector<unsigned char> scalar(8);
          putValue(&scalar, 0, 2.0, dt);
          std::vector<unsigned char> out;
          for (int inPlace : {-1, nSrcs - 1}) {
            SCOPED_TRACE(::testing::Message() << "dt " << dt << " op " << op << " nSrcs " << nSrcs
                                              << " count " << count << " inPlace " << inPlace);
            ASSERT_EQ(reduceHost(dt, op, in, count, &out, scalar.data(), divisor, inPlace),
                      ncclSuccess)
                << err();
            for (uint64_t i = 0; i < count; ++i) {
              double e = vals[0][i];
              if (op == TUTTI_PLUGIN_OP_PREMULSUM) e *= 2;
              for (int k = 1; k < nSrcs; ++k) {
                const double x = vals[k][i];
                switch (op) {
                  case TUTTI_PLUGIN_OP_PROD:
                    e *= x;
                    break;
                  case TUTTI_PLUGIN_OP_MAX:
                    e = std::max(e, x);
                    break;
                  case TUTTI_PLUGIN_OP_MIN:
                    e = std::min(e, x);
                    break;
                  case TUTTI_PLUGIN_OP_PREMULSUM:
                    e += 2 * x;
                    break;
                  default:
                    e += x;
                }
              }
              if (op == TUTTI_PLUGIN_OP_AVG) e = isInteger(dt) ? std::trunc(e / divisor) : e / 2;
              ASSERT_EQ(getValue(out, i, dt), e) << "element " << i;
            }
          }
        }
      }
    }
  }
}

template <class T>
std::vector<unsigned char> bytesOf(std::initializer_list<T> v) {
  std::vector<unsigned char> b(v.size() * sizeof(T));
  std::memcpy(b.data(), v.begin(), b.size());
  return b;
}

template <class T>
std::vector<T> as(const std::vector<unsigned char>& b) {
  std::vector<T> v(b.size() / sizeof(T));
  std::memcpy(v.data(), b.data(), b.size());
  return v;
}

TEST_F(XpuEmu, ReduceIntegerEdges) {
  std::vector<unsigned char> out;
  // Wrap-around.
  ASSERT_EQ(reduceHost(ncclInt8, TUTTI_PLUGIN_OP_SUM,
                       {bytesOf<int8_t>({127, -128, 100}), bytesOf<int8_t>({1, -1, 100})}, 3, &out),
            ncclSuccess);
  EXPECT_EQ(as<int8_t>(out), (std::vector<int8_t>{-128, 127, -56}));
  ASSERT_EQ(reduceHost(ncclUint8, TUTTI_PLUGIN_OP_PROD,
                       {bytesOf<uint8_t>({200, 16}), bytesOf<uint8_t>({2, 16})}, 2, &out),
            ncclSuccess);
  EXPECT_EQ(as<uint8_t>(out), (std::vector<uint8_t>{144, 0}));
  ASSERT_EQ(reduceHost(ncclUint64, TUTTI_PLUGIN_OP_SUM,
                       {bytesOf<uint64_t>({~0ull}), bytesOf<uint64_t>({2})}, 1, &out),
            ncclSuccess);
  EXPECT_EQ(as<uint64_t>(out), (std::vector<uint64_t>{1}));
  // Signedness of MAX/MIN.
  ASSERT_EQ(reduceHost(ncclUint8, TUTTI_PLUGIN_OP_MAX,
                       {bytesOf<uint8_t>({200, 3}), bytesOf<uint8_t>({100, 250})}, 2, &out),
            ncclSuccess);
  EXPECT_EQ(as<uint8_t>(out), (std::vector<uint8_t>{200, 250}));
  ASSERT_EQ(
      reduceHost(ncclInt32, TUTTI_PLUGIN_OP_MIN,
                 {bytesOf<int32_t>({-5, 7}), bytesOf<int32_t>({3, -2147483647 - 1})}, 2, &out),
      ncclSuccess);
  EXPECT_EQ(as<int32_t>(out), (std::vector<int32_t>{-5, -2147483647 - 1}));
  // AVG: truncating division of the wrapped sum.
  ASSERT_EQ(reduceHost(ncclInt32, TUTTI_PLUGIN_OP_AVG,
                       {bytesOf<int32_t>({-7, 7, 2147483647}), bytesOf<int32_t>({0, 0, 1})}, 3,
                       &out, nullptr, 2),
            ncclSuccess);
  EXPECT_EQ(as<int32_t>(out), (std::vector<int32_t>{-3, 3, -1073741824}));
  ASSERT_EQ(
      reduceHost(ncclUint32, TUTTI_PLUGIN_OP_AVG,
                 {bytesOf<uint32_t>({4294967295u}), bytesOf<uint32_t>({2})}, 1, &out, nullptr, 2),
      ncclSuccess);
  EXPECT_EQ(as<uint32_t>(out), (std::vector<uint32_t>{0}));  // (2^32 - 1 + 2) wraps to 1; 1/2 = 0
  // PREMULSUM with a negative scalar, and a uint64 scalar above 2^63.
  const int8_t minus3 = -3;
  ASSERT_EQ(reduceHost(ncclInt8, TUTTI_PLUGIN_OP_PREMULSUM,
                       {bytesOf<int8_t>({1, 50}), bytesOf<int8_t>({2, 50})}, 2, &out, &minus3),
            ncclSuccess);
  EXPECT_EQ(as<int8_t>(out), (std::vector<int8_t>{-9, static_cast<int8_t>(-300)}));
  const uint64_t big = 1ull << 63;
  ASSERT_EQ(reduceHost(ncclUint64, TUTTI_PLUGIN_OP_PREMULSUM,
                       {bytesOf<uint64_t>({1, 2}), bytesOf<uint64_t>({2, 2})}, 2, &out, &big),
            ncclSuccess);
  EXPECT_EQ(as<uint64_t>(out), (std::vector<uint64_t>{big, 0}));  // 3 * 2^63 and 4 * 2^63 wrap
}

TEST_F(XpuEmu, ReduceFloatEdges) {
  std::vector<unsigned char> out;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // MAX/MIN propagate NaN from either side; equal operands give the later one.
  ASSERT_EQ(
      reduceHost(ncclFloat32, TUTTI_PLUGIN_OP_MAX,
                 {bytesOf<float>({nan, 1.0f, 0.0f}), bytesOf<float>({1.0f, nan, -0.0f})}, 3, &out),
      ncclSuccess);
  auto f = as<float>(out);
  EXPECT_TRUE(std::isnan(f[0]));
  EXPECT_TRUE(std::isnan(f[1]));
  EXPECT_TRUE(f[2] == 0.0f && std::signbit(f[2]));
  ASSERT_EQ(reduceHost(ncclFloat32, TUTTI_PLUGIN_OP_MIN,
                       {bytesOf<float>({2.0f, nan}), bytesOf<float>({nan, 2.0f})}, 2, &out),
            ncclSuccess);
  f = as<float>(out);
  EXPECT_TRUE(std::isnan(f[0]) && std::isnan(f[1]));
  // fp16: 60000 + 60000 overflows to inf; bf16 1 + 2^-8 is a tie -> 1 (even).
  ASSERT_EQ(reduceHost(ncclFloat16, TUTTI_PLUGIN_OP_SUM,
                       {bytesOf<uint16_t>({0x7b53}), bytesOf<uint16_t>({0x7b53})}, 1, &out),
            ncclSuccess);
  EXPECT_EQ(as<uint16_t>(out)[0], 0x7c00);
  ASSERT_EQ(reduceHost(ncclBfloat16, TUTTI_PLUGIN_OP_SUM,
                       {bytesOf<uint16_t>({0x3f80}), bytesOf<uint16_t>({0x3b80})}, 1, &out),
            ncclSuccess);
  EXPECT_EQ(as<uint16_t>(out)[0], 0x3f80);
  // e4m3: 240 + 240 = 480 saturates to 448 (0x7e), -448 - 448 to 0xfe; NaN is 0x7f.
  ASSERT_EQ(reduceHost(ncclFloat8e4m3, TUTTI_PLUGIN_OP_SUM,
                       {bytesOf<uint8_t>({0x77, 0xfe, 0x7f}), bytesOf<uint8_t>({0x77, 0xfe, 0x38})},
                       3, &out),
            ncclSuccess);
  EXPECT_EQ(as<uint8_t>(out), (std::vector<uint8_t>{0x7e, 0xfe, 0x7f}));
  // e5m2 overflows to inf (0x7c).
  ASSERT_EQ(reduceHost(ncclFloat8e5m2, TUTTI_PLUGIN_OP_SUM,
                       {bytesOf<uint8_t>({0x7b}), bytesOf<uint8_t>({0x7b})}, 1, &out),
            ncclSuccess);
  EXPECT_EQ(as<uint8_t>(out)[0], 0x7c);
  // Narrow formats accumulate in fp32 and round once: fp16 2048 + 1 + 1 = 2050
  // (stepwise rounding would give 2048 + 1 -> 2048, twice).
  ASSERT_EQ(reduceHost(ncclFloat16, TUTTI_PLUGIN_OP_SUM,
                       {bytesOf<uint16_t>({0x6800}), bytesOf<uint16_t>({0x3c00}),
                        bytesOf<uint16_t>({0x3c00})},
                       1, &out),
            ncclSuccess);
  EXPECT_EQ(as<uint16_t>(out)[0], 0x6801);
  // ... but PREMULSUM rounds every step: 2048*1 + 1*1 -> 2048, + 1 -> 2048.
  const uint16_t one = 0x3c00;
  ASSERT_EQ(reduceHost(ncclFloat16, TUTTI_PLUGIN_OP_PREMULSUM,
                       {bytesOf<uint16_t>({0x6800}), bytesOf<uint16_t>({0x3c00}),
                        bytesOf<uint16_t>({0x3c00})},
                       1, &out, &one),
            ncclSuccess);
  EXPECT_EQ(as<uint16_t>(out)[0], 0x6800);
  // AVG of doubles: sum times 1/3.
  ASSERT_EQ(reduceHost(ncclFloat64, TUTTI_PLUGIN_OP_AVG,
                       {bytesOf<double>({1.0}), bytesOf<double>({1.0}), bytesOf<double>({0.0})}, 1,
                       &out, nullptr, 3),
            ncclSuccess);
  EXPECT_EQ(as<double>(out)[0], 2.0 * (1.0 / 3.0));
}

TEST_F(XpuEmu, ReduceScalarOnDeviceAndBadArguments) {
  // A device-resident scalar is read when the kernel runs (after an earlier copy).
  void* s = devAlloc(4);
  void* src = devAlloc(16);
  void* dst = devAlloc(16);
  const int32_t vals[4] = {1, 2, 3, 4};
  toDev(src, vals, 16);
  const int32_t five = 5;
  ASSERT_EQ(t_->memcpyAsync(ctx_, s, &five, 4, nullptr), ncclSuccess);
  const void* srcs[1] = {src};
  tuttiPluginReduceArgs_v1 a{};
  a.structSize = sizeof a;
  a.datatype = ncclInt32;
  a.op = TUTTI_PLUGIN_OP_PREMULSUM;
  a.nSrcs = 1;
  a.count = 4;
  a.dst = dst;
  a.srcs = srcs;
  a.scalar = s;
  a.scalarResidence = ncclScalarDevice;
  ASSERT_EQ(t_->reduce(ctx_, &a, nullptr), ncclSuccess) << err();
  int32_t out[4];
  toHost(out, dst, 16);
  EXPECT_EQ(out[0], 5);
  EXPECT_EQ(out[3], 20);

  auto bad = [&](tuttiPluginReduceArgs_v1 b, const char* what) {
    EXPECT_EQ(t_->reduce(ctx_, &b, nullptr), ncclInvalidArgument) << what;
    EXPECT_FALSE(err().empty());
  };
  tuttiPluginReduceArgs_v1 b = a;
  b.datatype = ncclNumTypes;
  bad(b, "datatype");
  b = a;
  b.op = 6;
  bad(b, "op");
  b = a;
  b.nSrcs = 0;
  bad(b, "nSrcs");
  b = a;
  b.scalar = nullptr;
  bad(b, "scalar");
  b = a;
  b.op = TUTTI_PLUGIN_OP_AVG;
  b.avgDivisor = 0;
  bad(b, "divisor");
  b = a;
  b.count = 5;  // past the end of the allocations
  bad(b, "range");
  b = a;
  b.structSize = 8;
  bad(b, "structSize");
  int32_t pageable[4] = {};
  b = a;
  b.dst = pageable;
  bad(b, "pageable dst");
  EXPECT_NE(err().find("pageable"), std::string::npos) << err();
  b = a;
  b.dst = static_cast<char*>(src) + 4;  // partial overlap with the source
  b.count = 3;
  bad(b, "overlap");
  devFree(s);
  devFree(src);
  devFree(dst);
}

TEST_F(XpuEmu, CastScaled) {
  const float in[6] = {
      1.0f, 1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f, 65504.0f, std::numeric_limits<float>::quiet_NaN(),
      -0.0f};
  void* src = devAlloc(sizeof in);
  void* half = devAlloc(12);
  void* back = devAlloc(sizeof in);
  toDev(src, in, sizeof in);
  ASSERT_EQ(t_->castScaled(ctx_, half, ncclFloat16, src, ncclFloat32, 6, 1.0f, nullptr),
            ncclSuccess);
  uint16_t h[6];
  toHost(h, half, 12);
  EXPECT_EQ(h[0], 0x3c00);
  EXPECT_EQ(h[1], 0x3c00);  // tie to even
  EXPECT_EQ(h[2], 0x3c02);  // tie to even (up)
  EXPECT_EQ(h[3], 0x7bff);
  EXPECT_EQ(h[4] & 0x7c00, 0x7c00);
  EXPECT_NE(h[4] & 0x3ff, 0);  // NaN stays NaN
  EXPECT_EQ(h[5], 0x8000);
  ASSERT_EQ(t_->castScaled(ctx_, half, ncclFloat16, src, ncclFloat32, 6, 2.0f, nullptr),
            ncclSuccess);
  toHost(h, half, 12);
  EXPECT_EQ(h[0], 0x4000);
  EXPECT_EQ(h[3], 0x7c00);  // overflow -> inf
  ASSERT_EQ(t_->castScaled(ctx_, back, ncclFloat32, half, ncclFloat16, 6, 0.25f, nullptr),
            ncclSuccess);
  float f[6];
  toHost(f, back, sizeof f);
  EXPECT_EQ(f[0], 0.5f);
  EXPECT_TRUE(std::isinf(f[3]));
  ASSERT_EQ(t_->castScaled(ctx_, half, ncclBfloat16, src, ncclFloat32, 6, 1.0f, nullptr),
            ncclSuccess);
  toHost(h, half, 12);
  EXPECT_EQ(h[0], 0x3f80);
  EXPECT_EQ(h[3], 0x4780);  // 65504 rounds to 65536 in bf16
  ASSERT_EQ(t_->castScaled(ctx_, back, ncclFloat32, half, ncclBfloat16, 6, 1.0f, nullptr),
            ncclSuccess);
  toHost(f, back, sizeof f);
  EXPECT_EQ(f[3], 65536.0f);
  EXPECT_EQ(t_->castScaled(ctx_, back, ncclFloat64, src, ncclFloat32, 6, 1.0f, nullptr),
            ncclInvalidArgument);
  EXPECT_EQ(t_->castScaled(ctx_, static_cast<char*>(src) + 4, ncclFloat16, src, ncclFloat32, 4,
                           1.0f, nullptr),
            ncclInvalidArgument);  // overlap
  devFree(src);
  devFree(half);
  devFree(back);
}

TEST_F(XpuEmu, OneBitCodec) {
  // 600 elements: a full block of 512 and a short one of 88.
  const uint64_t n = 600;
  std::vector<float> src(n), err0(n, 0.5f);
  for (uint64_t i = 0; i < n; ++i) src[i] = (i % 3 == 0) ? -2.0f : 1.0f;  // c: -1.5 or 1.5
  const uint64_t wireBytes = (4 + 64) + (4 + 11);
  void* dSrc = devAlloc(n * 4);
  void* dErr = devAlloc(n * 4);
  void* dWire = devAlloc(wireBytes);
  void* dOut = devAlloc(n * 4);
  toDev(dSrc, src.data(), n * 4);
  toDev(dErr, err0.data(), n * 4);
  ASSERT_EQ(
      t_->pack1bit(ctx_, static_cast<float*>(dSrc), static_cast<float*>(dErr), dWire, n, nullptr),
      ncclSuccess)
      << err();
  std::vector<unsigned char> wire(wireBytes);
  std::vector<float> e(n);
  toHost(wire.data(), dWire, wireBytes);
  toHost(e.data(), dErr, n * 4);
  float scale0, scale1;
  std::memcpy(&scale0, wire.data(), 4);
  std::memcpy(&scale1, wire.data() + 68, 4);
  EXPECT_EQ(scale0, 1.5f);
  EXPECT_EQ(scale1, 1.5f);
  EXPECT_EQ(wire[4], 0x49);   // elements 0, 3, 6 are negative: bits 0, 3, 6
  EXPECT_EQ(wire[72], 0x92);  // second block: elements 513, 516, 519
  EXPECT_EQ(wire[82], 0x24);  // its last byte: elements 594, 597
  for (uint64_t i = 0; i < n; ++i) ASSERT_EQ(e[i], 0.0f) << i;  // +-1.5 is sent exactly
  ASSERT_EQ(t_->unpack1bit(ctx_, static_cast<float*>(dOut), dWire, n, 0, nullptr), ncclSuccess);
  std::vector<float> out(n);
  toHost(out.data(), dOut, n * 4);
  for (uint64_t i = 0; i < n; ++i) ASSERT_EQ(out[i], i % 3 == 0 ? -1.5f : 1.5f) << i;
  ASSERT_EQ(t_->unpack1bit(ctx_, static_cast<float*>(dOut), dWire, n, 1, nullptr), ncclSuccess);
  toHost(out.data(), dOut, n * 4);
  for (uint64_t i = 0; i < n; ++i) ASSERT_EQ(out[i], i % 3 == 0 ? -3.0f : 3.0f) << i;
  // Without error feedback: c = src, mean |c| of the first block.
  ASSERT_EQ(t_->pack1bit(ctx_, static_cast<float*>(dSrc), nullptr, dWire, 5, nullptr), ncclSuccess);
  toHost(wire.data(), dWire, 5);
  std::memcpy(&scale0, wire.data(), 4);
  EXPECT_EQ(scale0, static_cast<float>((2.0 + 1 + 1 + 2 + 1) / 5.0));
  EXPECT_EQ(wire[4], 0x09);
  devFree(dSrc);
  devFree(dErr);
  devFree(dWire);
  devFree(dOut);
}

TEST_F(XpuEmu, GemmAndOrthogonalize) {
  // op(A) 2x3, op(B) 3x2, every transpose combination, with row strides.
  const float A[2][3] = {{1, 2, 3}, {4, 5, 6}};
  const float B[3][2] = {{7, 8}, {9, 10}, {11, 12}};
  const float expect[2][2] = {{58, 64}, {139, 154}};
  for (int tA = 0; tA < 2; ++tA) {
    for (int tB = 0; tB < 2; ++tB) {
      const int64_t lda = 5, ldb = 4, ldc = 3;
      std::vector<float> a(16, 0), b(16, 0), c(8, 100.0f);
      for (int i = 0; i < 2; ++i)
        for (int t = 0; t < 3; ++t) (tA ? a[t * lda + i] : a[i * lda + t]) = A[i][t];
      for (int t = 0; t < 3; ++t)
        for (int j = 0; j < 2; ++j) (tB ? b[j * ldb + t] : b[t * ldb + j]) = B[t][j];
      void* da = devAlloc(64);
      void* db = devAlloc(64);
      void* dc = devAlloc(32);
      toDev(da, a.data(), 64);
      toDev(db, b.data(), 64);
      toDev(dc, c.data(), 32);
      ASSERT_EQ(t_->gemm(ctx_, tA, tB, 2, 2, 3, 2.0f, static_cast<float*>(da), lda,
                         static_cast<float*>(db), ldb, 0.5f, static_cast<float*>(dc), ldc, nullptr),
                ncclSuccess)
          << err();
      toHost(c.data(), dc, 32);
      for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 2; ++j)
          EXPECT_EQ(c[i * ldc + j], 2 * expect[i][j] + 50) << tA << tB << i << j;
      EXPECT_EQ(c[2], 100.0f);  // outside C's rows: untouched
      devFree(da);
      devFree(db);
      devFree(dc);
    }
  }
  // Orthonormalise 3 columns of a 5x3 matrix with row stride 4 (col 3 untouched).
  const int64_t rows = 5, cols = 3, ld = 4;
  std::vector<float> m(rows * ld);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < ld; ++j) m[i * ld + j] = static_cast<float>((i + 1) * (j + 2) % 7 + j);
  void* dm = devAlloc(m.size() * 4);
  toDev(dm, m.data(), m.size() * 4);
  ASSERT_EQ(t_->orthogonalize(ctx_, static_cast<float*>(dm), rows, cols, ld, 1e-8f, nullptr),
            ncclSuccess);
  std::vector<float> q(m.size());
  toHost(q.data(), dm, q.size() * 4);
  for (int64_t x = 0; x < cols; ++x) {
    for (int64_t y = 0; y < cols; ++y) {
      double dot = 0;
      for (int64_t i = 0; i < rows; ++i) dot += double(q[i * ld + x]) * q[i * ld + y];
      EXPECT_NEAR(dot, x == y ? 1.0 : 0.0, 1e-6) << x << "," << y;
    }
  }
  for (int64_t i = 0; i < rows; ++i) EXPECT_EQ(q[i * ld + 3], m[i * ld + 3]);
  EXPECT_EQ(t_->orthogonalize(ctx_, static_cast<float*>(dm), rows, cols, 2, 1e-8f, nullptr),
            ncclInvalidArgument);  // ld < cols
  devFree(dm);
}

TEST_F(XpuEmu, KernelsRefusePageableMemoryAndUnknownHandles) {
  std::vector<float> host(8, 1.0f);
  std::vector<uint16_t> out(8);
  EXPECT_EQ(
      t_->castScaled(ctx_, out.data(), ncclFloat16, host.data(), ncclFloat32, 8, 1.0f, nullptr),
      ncclInvalidArgument);
  EXPECT_NE(err().find("pageable"), std::string::npos) << err();
  // Pinned host memory is addressable by kernels (TUTTI_PLUGIN_CAP_HOST_MAPPED).
  void* pin = nullptr;
  ASSERT_EQ(t_->hostAlloc(ctx_, 64, &pin), ncclSuccess);
  std::memcpy(pin, host.data(), 32);
  ASSERT_EQ(t_->castScaled(ctx_, static_cast<char*>(pin) + 32, ncclFloat16, pin, ncclFloat32, 8,
                           1.0f, nullptr),
            ncclSuccess);
  ASSERT_EQ(t_->queueSynchronize(ctx_, nullptr), ncclSuccess);
  uint16_t h0;
  std::memcpy(&h0, static_cast<char*>(pin) + 32, 2);
  EXPECT_EQ(h0, 0x3c00);
  EXPECT_EQ(t_->hostFree(ctx_, pin), ncclSuccess);
  int dummy = 0;
  EXPECT_EQ(t_->eventRecord(ctx_, reinterpret_cast<tuttiPluginEvent_t>(&dummy), nullptr),
            ncclInvalidArgument);
  EXPECT_EQ(t_->queueDestroy(ctx_, reinterpret_cast<tuttiPluginQueue_t>(&dummy)),
            ncclInvalidArgument);
  EXPECT_EQ(t_->queueCreate(ctx_, 7, nullptr), ncclInvalidArgument);
  EXPECT_EQ(t_->deviceCount(nullptr, nullptr), ncclInvalidArgument);
}

}  // namespace
