// libtutti-backend-ze.so as tutti loads it: dlopen, the entry point, the
// table's fields, and init() on this machine. Without a Level Zero driver or
// device (CI, this project's build machines) init() must fail cleanly with
// ncclUnhandledCudaError and a readable lastError; the device tests are then
// skipped with that reason. With a driver they run a small smoke test.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "tutti/backend_plugin.h"

namespace {

struct Loaded {
  void* lib = nullptr;
  const tuttiBackendPlugin_v1* t = nullptr;
  std::string error;
};

Loaded& plugin() {
  static Loaded* l = [] {
    Loaded* x = new Loaded;
    x->lib = dlopen(TUTTI_ZE_PLUGIN_PATH, RTLD_NOW | RTLD_LOCAL);
    if (x->lib == nullptr) {
      x->error = dlerror();
      return x;
    }
    auto init =
        reinterpret_cast<tuttiBackendPluginInitFn>(dlsym(x->lib, TUTTI_BACKEND_PLUGIN_INIT_SYMBOL));
    if (init == nullptr) {
      x->error = "no tuttiBackendPluginInit";
      return x;
    }
    x->t = init(TUTTI_BACKEND_PLUGIN_ABI_VERSION);
    if (x->t == nullptr) x->error = "tuttiBackendPluginInit returned NULL";
    return x;
  }();
  return *l;
}

TEST(ZePluginLoad, TableFields) {
  Loaded& p = plugin();
  ASSERT_NE(p.t, nullptr) << p.error;
  const tuttiBackendPlugin_v1* t = p.t;
  EXPECT_EQ(t->abiVersion, TUTTI_BACKEND_PLUGIN_ABI_VERSION);
  EXPECT_EQ(t->structSize, sizeof(tuttiBackendPlugin_v1));
  ASSERT_NE(t->name, nullptr);
  EXPECT_STREQ(t->name, "ze");
  EXPECT_NE(t->capabilities & TUTTI_PLUGIN_CAP_IPC_NEEDS_FD, 0u);
  EXPECT_NE(t->capabilities & TUTTI_PLUGIN_CAP_HOST_MAPPED, 0u);
  EXPECT_EQ(t->capabilities & TUTTI_PLUGIN_CAP_RDMA_DEVICE_MEMORY, 0u);
  const void* required[] = {
      reinterpret_cast<const void*>(t->init),
      reinterpret_cast<const void*>(t->finalize),
      reinterpret_cast<const void*>(t->lastError),
      reinterpret_cast<const void*>(t->deviceCount),
      reinterpret_cast<const void*>(t->currentDevice),
      reinterpret_cast<const void*>(t->queryPointer),
      reinterpret_cast<const void*>(t->memAlloc),
      reinterpret_cast<const void*>(t->memFree),
      reinterpret_cast<const void*>(t->hostAlloc),
      reinterpret_cast<const void*>(t->hostFree),
      reinterpret_cast<const void*>(t->memcpyAsync),
      reinterpret_cast<const void*>(t->queueCreate),
      reinterpret_cast<const void*>(t->queueDestroy),
      reinterpret_cast<const void*>(t->queueSynchronize),
      reinterpret_cast<const void*>(t->eventCreate),
      reinterpret_cast<const void*>(t->eventDestroy),
      reinterpret_cast<const void*>(t->eventRecord),
      reinterpret_cast<const void*>(t->eventWait),
      reinterpret_cast<const void*>(t->eventQuery),
      reinterpret_cast<const void*>(t->eventSynchronize),
      reinterpret_cast<const void*>(t->ipcExport),
      reinterpret_cast<const void*>(t->ipcImport),
      reinterpret_cast<const void*>(t->ipcClose),
      reinterpret_cast<const void*>(t->reduce),
      reinterpret_cast<const void*>(t->castScaled),
      reinterpret_cast<const void*>(t->pack1bit),
      reinterpret_cast<const void*>(t->unpack1bit),
      reinterpret_cast<const void*>(t->gemm),
      reinterpret_cast<const void*>(t->setDevice),
      reinterpret_cast<const void*>(t->hostEventCreate),
      reinterpret_cast<const void*>(t->hostEventSignal),
      reinterpret_cast<const void*>(t->devicePciBusId),
  };
  for (size_t i = 0; i < sizeof required / sizeof required[0]; ++i)
    EXPECT_NE(required[i], nullptr) << "field " << i;
  EXPECT_EQ(t->orthogonalize, nullptr);  // host fallback
  ASSERT_NE(t->lastError(nullptr), nullptr);
}

TEST(ZePluginLoad, OnlyTheEntryPointIsExported) {
  Loaded& p = plugin();
  ASSERT_NE(p.lib, nullptr) << p.error;
  EXPECT_EQ(dlsym(p.lib, "zeInit"), nullptr);  // the loader is not linked
  EXPECT_EQ(dlsym(p.lib, "_ZN8tutti_ze10kSpirvFp64E"), nullptr);
}

TEST(ZePluginLoad, RejectsAbiZero) {
  Loaded& p = plugin();
  ASSERT_NE(p.lib, nullptr) << p.error;
  auto init =
      reinterpret_cast<tuttiBackendPluginInitFn>(dlsym(p.lib, TUTTI_BACKEND_PLUGIN_INIT_SYMBOL));
  ASSERT_NE(init, nullptr);
  EXPECT_EQ(init(0), nullptr);
}

// Calls that must not crash before init() succeeded (a NULL context).
TEST(ZePluginLoad, NullContextIsAnErrorNotACrash) {
  Loaded& p = plugin();
  ASSERT_NE(p.t, nullptr) << p.error;
  const tuttiBackendPlugin_v1* t = p.t;
  tuttiPluginPointerInfo_v1 info;
  memset(&info, 0x5a, sizeof info);
  info.structSize = sizeof info;
  int x = 0;
  EXPECT_EQ(t->queryPointer(nullptr, &x, &info), ncclSuccess);
  EXPECT_EQ(info.memoryType, TUTTI_PLUGIN_MEM_UNKNOWN);
  EXPECT_EQ(info.device, -1);
  EXPECT_EQ(info.base, nullptr);
  int32_t n = -1;
  EXPECT_EQ(t->deviceCount(nullptr, &n), ncclSuccess);
  EXPECT_EQ(n, 0);
  void* ptr = &x;
  EXPECT_NE(t->memAlloc(nullptr, 0, 64, &ptr), ncclSuccess);
  EXPECT_NE(t->memcpyAsync(nullptr, &x, &n, 4, nullptr), ncclSuccess);
  EXPECT_NE(t->unpack1bit(nullptr, nullptr, nullptr, 4, 0, nullptr), ncclSuccess);
  EXPECT_NE(t->setDevice(nullptr, 0), ncclSuccess);
  tuttiPluginEvent_t e = nullptr;
  EXPECT_NE(t->hostEventCreate(nullptr, 0, &e), ncclSuccess);
  EXPECT_NE(t->hostEventSignal(nullptr, nullptr), ncclSuccess);
  char busId[TUTTI_PLUGIN_PCI_BUS_ID_BYTES];
  EXPECT_EQ(t->devicePciBusId(nullptr, 0, busId, sizeof busId), ncclInvalidArgument);
  EXPECT_STRNE(t->lastError(nullptr), "");
  EXPECT_EQ(t->finalize(nullptr), ncclSuccess);
}

std::vector<std::string>& logLines() {
  static std::vector<std::string> v;
  return v;
}
void logToVector(int32_t, const char* msg) { logLines().push_back(msg); }

TEST(ZePluginLoad, InitWithoutDriverFailsCleanly) {
  Loaded& p = plugin();
  ASSERT_NE(p.t, nullptr) << p.error;
  const tuttiBackendPlugin_v1* t = p.t;
  tuttiBackendHost_v1 host = {TUTTI_BACKEND_PLUGIN_ABI_VERSION, sizeof host, logToVector};
  void* ctx = reinterpret_cast<void*>(0x1);
  const ncclResult_t rc = t->init(&host, &ctx);
  if (rc != ncclSuccess) {
    EXPECT_EQ(rc, ncclUnhandledCudaError);
    EXPECT_EQ(ctx, nullptr);
    const std::string why = t->lastError(nullptr);
    EXPECT_NE(why.find("Level Zero"), std::string::npos) << why;
    // A second attempt behaves the same (nothing half-initialised is left).
    void* ctx2 = nullptr;
    EXPECT_EQ(t->init(&host, &ctx2), rc);
    GTEST_SKIP() << "no Level Zero device here, plugin declined as it should: " << why;
  }
  // A machine with a Level Zero driver and device: a small smoke test.
  int32_t n = 0;
  ASSERT_EQ(t->deviceCount(ctx, &n), ncclSuccess);
  ASSERT_GE(n, 1);
  int32_t dev = -1;
  ASSERT_EQ(t->currentDevice(ctx, &dev), ncclSuccess);
  const uint64_t count = 1000;
  void* d = nullptr;
  ASSERT_EQ(t->memAlloc(ctx, dev, count * 4, &d), ncclSuccess) << t->lastError(ctx);
  tuttiPluginPointerInfo_v1 info = {};
  info.structSize = sizeof info;
  ASSERT_EQ(t->queryPointer(ctx, static_cast<char*>(d) + 8, &info), ncclSuccess);
  EXPECT_EQ(info.memoryType, TUTTI_PLUGIN_MEM_DEVICE);
  EXPECT_EQ(info.base, d);
  std::vector<float> a(count), out(count);
  for (uint64_t i = 0; i < count; ++i) a[i] = static_cast<float>(i) * 0.5f;
  ASSERT_EQ(t->memcpyAsync(ctx, d, a.data(), count * 4, nullptr), ncclSuccess);
  const void* srcs[2] = {d, d};
  tuttiPluginReduceArgs_v1 r = {};
  r.structSize = sizeof r;
  r.datatype = ncclFloat32;
  r.op = TUTTI_PLUGIN_OP_SUM;
  r.nSrcs = 2;
  r.count = count;
  r.dst = d;
  r.srcs = srcs;
  r.avgDivisor = 1;
  ASSERT_EQ(t->reduce(ctx, &r, nullptr), ncclSuccess) << t->lastError(ctx);
  ASSERT_EQ(t->memcpyAsync(ctx, out.data(), d, count * 4, nullptr), ncclSuccess);
  ASSERT_EQ(t->queueSynchronize(ctx, nullptr), ncclSuccess);
  for (uint64_t i = 0; i < count; ++i) ASSERT_EQ(out[i], a[i] * 2) << i;
  EXPECT_EQ(t->memFree(ctx, d), ncclSuccess);
  EXPECT_EQ(t->finalize(ctx), ncclSuccess);
}

}  // namespace
