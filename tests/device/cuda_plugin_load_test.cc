// The built CUDA backend plugin (libtutti-backend-cuda.so, path compiled in as
// TUTTI_CUDA_PLUGIN_PATH, or $TUTTI_CUDA_PLUGIN when set) loaded the way tutti loads it: dlopen,
// the one exported entry point, the table's header fields and required functions; then init().
// Without a GPU (or driver) init() must fail cleanly with a reason, and the GPU parts skip with
// that reason. With a GPU, a short smoke test of memory, queues, events, pointer queries and one
// reduce.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "tutti/backend_plugin.h"

namespace {

class CudaPlugin : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const char* path = getenv("TUTTI_CUDA_PLUGIN");  // a packed copy (run_on_gpu.sh)
    handle_ =
        dlopen(path != nullptr && *path ? path : TUTTI_CUDA_PLUGIN_PATH, RTLD_NOW | RTLD_LOCAL);
    if (handle_ == nullptr) return;
    auto entry = reinterpret_cast<tuttiBackendPluginInitFn>(
        dlsym(handle_, TUTTI_BACKEND_PLUGIN_INIT_SYMBOL));
    if (entry != nullptr) table_ = entry(TUTTI_BACKEND_PLUGIN_ABI_VERSION);
  }
  static void TearDownTestSuite() {
    if (ctx_ != nullptr) table_->finalize(ctx_);
    ctx_ = nullptr;
  }
  // The plugin stays loaded: the static CUDA runtime registers exit handlers.

  // init() once for the whole suite; the reason when it failed.
  static bool initOnce(std::string* why) {
    static bool done = false, ok = false;
    static std::string reason;
    if (!done) {
      done = true;
      const ncclResult_t rc = table_->init(&host_, &ctx_);
      ok = rc == ncclSuccess;
      if (!ok) reason = table_->lastError(nullptr);
    }
    *why = reason;
    return ok;
  }

  static void* handle_;
  static const tuttiBackendPlugin_v1* table_;
  static void* ctx_;
  static tuttiBackendHost_v1 host_;
};

void* CudaPlugin::handle_ = nullptr;
const tuttiBackendPlugin_v1* CudaPlugin::table_ = nullptr;
void* CudaPlugin::ctx_ = nullptr;
tuttiBackendHost_v1 CudaPlugin::host_ = {TUTTI_BACKEND_PLUGIN_ABI_VERSION,
                                         sizeof(tuttiBackendHost_v1), [](int32_t, const char*) {}};

#define REQUIRE_GPU()                                         \
  do {                                                        \
    std::string why_;                                         \
    if (!initOnce(&why_)) GTEST_SKIP() << "no GPU: " << why_; \
  } while (0)

TEST_F(CudaPlugin, LoadsAndExportsOneEntryPoint) {
  ASSERT_NE(handle_, nullptr) << dlerror();
  ASSERT_NE(table_, nullptr) << "tuttiBackendPluginInit missing or returned NULL";
  EXPECT_EQ(table_->abiVersion, TUTTI_BACKEND_PLUGIN_ABI_VERSION);
  EXPECT_EQ(table_->structSize, sizeof(tuttiBackendPlugin_v1));
  ASSERT_NE(table_->name, nullptr);
  EXPECT_STREQ(table_->name, "cuda");
  // A symbol of the static CUDA runtime must not leak out.
  EXPECT_EQ(dlsym(handle_, "cudaMalloc"), nullptr);
}

TEST_F(CudaPlugin, RequiredFunctionsArePresent) {
  ASSERT_NE(table_, nullptr);
  const void* required[] = {
      reinterpret_cast<const void*>(table_->init),
      reinterpret_cast<const void*>(table_->finalize),
      reinterpret_cast<const void*>(table_->lastError),
      reinterpret_cast<const void*>(table_->deviceCount),
      reinterpret_cast<const void*>(table_->currentDevice),
      reinterpret_cast<const void*>(table_->queryPointer),
      reinterpret_cast<const void*>(table_->memAlloc),
      reinterpret_cast<const void*>(table_->memFree),
      reinterpret_cast<const void*>(table_->hostAlloc),
      reinterpret_cast<const void*>(table_->hostFree),
      reinterpret_cast<const void*>(table_->memcpyAsync),
      reinterpret_cast<const void*>(table_->queueCreate),
      reinterpret_cast<const void*>(table_->queueDestroy),
      reinterpret_cast<const void*>(table_->queueSynchronize),
      reinterpret_cast<const void*>(table_->eventCreate),
      reinterpret_cast<const void*>(table_->eventDestroy),
      reinterpret_cast<const void*>(table_->eventRecord),
      reinterpret_cast<const void*>(table_->eventWait),
      reinterpret_cast<const void*>(table_->eventQuery),
      reinterpret_cast<const void*>(table_->eventSynchronize),
      // Offered by this plugin (optional in the ABI).
      reinterpret_cast<const void*>(table_->ipcExport),
      reinterpret_cast<const void*>(table_->ipcImport),
      reinterpret_cast<const void*>(table_->ipcClose),
      reinterpret_cast<const void*>(table_->reduce),
      reinterpret_cast<const void*>(table_->castScaled),
      reinterpret_cast<const void*>(table_->pack1bit),
      reinterpret_cast<const void*>(table_->unpack1bit),
      reinterpret_cast<const void*>(table_->gemm),
      reinterpret_cast<const void*>(table_->setDevice),
      reinterpret_cast<const void*>(table_->hostEventCreate),
      reinterpret_cast<const void*>(table_->hostEventSignal),
      reinterpret_cast<const void*>(table_->devicePciBusId),
  };
  for (size_t i = 0; i < sizeof required / sizeof required[0]; ++i)
    EXPECT_NE(required[i], nullptr) << "function #" << i;
  EXPECT_EQ(table_->orthogonalize, nullptr) << "documented as host fallback";
  EXPECT_NE(table_->capabilities & TUTTI_PLUGIN_CAP_HOST_MAPPED, 0u);
  EXPECT_EQ(table_->capabilities & TUTTI_PLUGIN_CAP_IPC_NEEDS_FD, 0u);
}

TEST_F(CudaPlugin, InitSucceedsOrFailsCleanly) {
  ASSERT_NE(table_, nullptr);
  std::string why;
  if (!initOnce(&why)) {
    // No GPU here: the failure must carry a reason; the device parts skip.
    EXPECT_FALSE(why.empty());
    EXPECT_TRUE(why.find("no CUDA driver") != std::string::npos ||
                why.find("no CUDA device") != std::string::npos)
        << why;
    // lastError is per thread and stable until the next call on it.
    EXPECT_STREQ(table_->lastError(nullptr), why.c_str());
    GTEST_SKIP() << "no GPU: " << why;
  }
  int32_t n = 0;
  ASSERT_EQ(table_->deviceCount(ctx_, &n), ncclSuccess);
  EXPECT_GE(n, 1);
}

TEST_F(CudaPlugin, MemoryQueuesEventsAndOneReduce) {
  ASSERT_NE(table_, nullptr);
  REQUIRE_GPU();
  int32_t dev = -1;
  ASSERT_EQ(table_->currentDevice(ctx_, &dev), ncclSuccess);
  tuttiPluginQueue_t q = nullptr;
  ASSERT_EQ(table_->queueCreate(ctx_, dev, &q), ncclSuccess) << table_->lastError(ctx_);
  const size_t n = 1000;
  void *a = nullptr, *b = nullptr, *h = nullptr;
  ASSERT_EQ(table_->memAlloc(ctx_, dev, n * 4, &a), ncclSuccess);
  ASSERT_EQ(table_->memAlloc(ctx_, dev, n * 4, &b), ncclSuccess);
  ASSERT_EQ(table_->hostAlloc(ctx_, n * 4, &h), ncclSuccess);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % 256, 0u);

  tuttiPluginPointerInfo_v1 info{};
  info.structSize = sizeof info;
  ASSERT_EQ(table_->queryPointer(ctx_, static_cast<char*>(a) + 40, &info), ncclSuccess);
  EXPECT_EQ(info.memoryType, TUTTI_PLUGIN_MEM_DEVICE);
  EXPECT_EQ(info.device, dev);
  EXPECT_EQ(info.base, a);
  EXPECT_GE(info.size, n * 4);
  ASSERT_EQ(table_->queryPointer(ctx_, h, &info), ncclSuccess);
  EXPECT_EQ(info.memoryType, TUTTI_PLUGIN_MEM_HOST_PINNED);
  int stackVar = 0;
  ASSERT_EQ(table_->queryPointer(ctx_, &stackVar, &info), ncclSuccess);
  EXPECT_EQ(info.memoryType, TUTTI_PLUGIN_MEM_UNKNOWN);
  ASSERT_EQ(table_->queryPointer(ctx_, reinterpret_cast<void*>(0x10), &info), ncclSuccess);
  EXPECT_EQ(info.memoryType, TUTTI_PLUGIN_MEM_UNKNOWN);

  std::vector<float> x(n), y(n), out(n);
  for (size_t i = 0; i < n; ++i) {
    x[i] = static_cast<float>(i);
    y[i] = 0.5f;
  }
  ASSERT_EQ(table_->memcpyAsync(ctx_, a, x.data(), n * 4, q), ncclSuccess);
  ASSERT_EQ(table_->memcpyAsync(ctx_, b, y.data(), n * 4, q), ncclSuccess);
  const void* srcs[] = {a, b};
  tuttiPluginReduceArgs_v1 args{};
  args.structSize = sizeof args;
  args.datatype = ncclFloat32;
  args.op = TUTTI_PLUGIN_OP_SUM;
  args.nSrcs = 2;
  args.count = n;
  args.dst = a;
  args.srcs = srcs;
  ASSERT_EQ(table_->reduce(ctx_, &args, q), ncclSuccess) << table_->lastError(ctx_);
  tuttiPluginEvent_t ev = nullptr;
  ASSERT_EQ(table_->eventCreate(ctx_, dev, &ev), ncclSuccess);
  ASSERT_EQ(table_->memcpyAsync(ctx_, out.data(), a, n * 4, q), ncclSuccess);
  ASSERT_EQ(table_->eventRecord(ctx_, ev, q), ncclSuccess);
  ASSERT_EQ(table_->eventSynchronize(ctx_, ev), ncclSuccess);
  int32_t done = 0;
  ASSERT_EQ(table_->eventQuery(ctx_, ev, &done), ncclSuccess);
  EXPECT_EQ(done, 1);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(out[i], static_cast<float>(i) + 0.5f) << i;

  // A bad argument fails with a reason and leaves the runtime usable.
  args.datatype = 99;
  EXPECT_EQ(table_->reduce(ctx_, &args, q), ncclInvalidArgument);
  EXPECT_NE(std::string(table_->lastError(ctx_)), "");
  ASSERT_EQ(table_->queueSynchronize(ctx_, q), ncclSuccess);

  EXPECT_EQ(table_->eventDestroy(ctx_, ev), ncclSuccess);
  EXPECT_EQ(table_->memFree(ctx_, a), ncclSuccess);
  EXPECT_EQ(table_->memFree(ctx_, b), ncclSuccess);
  EXPECT_EQ(table_->hostFree(ctx_, h), ncclSuccess);
  EXPECT_EQ(table_->queueDestroy(ctx_, q), ncclSuccess);
}

// A host event holds a stream (cuStreamWaitValue32 on the mapped slot, or
// the host-function fallback) until the host signals it; destroying one
// releases the stream; setDevice refuses a device that does not exist.
TEST_F(CudaPlugin, HostEventHoldsAStream) {
  ASSERT_NE(table_, nullptr);
  REQUIRE_GPU();
  int32_t dev = -1, n = 0;
  ASSERT_EQ(table_->currentDevice(ctx_, &dev), ncclSuccess);
  ASSERT_EQ(table_->deviceCount(ctx_, &n), ncclSuccess);
  EXPECT_EQ(table_->setDevice(ctx_, n), ncclInvalidArgument);
  EXPECT_NE(std::string(table_->lastError(ctx_)).find("no device"), std::string::npos);
  ASSERT_EQ(table_->setDevice(ctx_, dev), ncclSuccess);
  // The device's PCI address (cuDeviceGetPCIBusId): "dddd:bb:dd.f" or "".
  char busId[TUTTI_PLUGIN_PCI_BUS_ID_BYTES] = {};
  ASSERT_EQ(table_->devicePciBusId(ctx_, dev, busId, sizeof busId), ncclSuccess)
      << table_->lastError(ctx_);
  EXPECT_TRUE(busId[0] == '\0' || strchr(busId, ':') != nullptr) << busId;
  EXPECT_EQ(table_->devicePciBusId(ctx_, n, busId, sizeof busId), ncclInvalidArgument);
  tuttiPluginQueue_t q = nullptr;
  ASSERT_EQ(table_->queueCreate(ctx_, dev, &q), ncclSuccess) << table_->lastError(ctx_);
  const size_t bytes = 1 << 20;
  void *d = nullptr, *h = nullptr;
  ASSERT_EQ(table_->memAlloc(ctx_, dev, bytes, &d), ncclSuccess);
  ASSERT_EQ(table_->hostAlloc(ctx_, bytes, &h), ncclSuccess);
  std::vector<unsigned char> pattern(bytes, 0xa5);
  ASSERT_EQ(table_->memcpyAsync(ctx_, d, pattern.data(), bytes, q), ncclSuccess);
  ASSERT_EQ(table_->queueSynchronize(ctx_, q), ncclSuccess);
  for (int round = 0; round < 2; ++round) {  // 0: signalled, 1: destroyed while waited on
    SCOPED_TRACE(round == 0 ? "signal" : "destroy");
    memset(h, 0, bytes);
    tuttiPluginEvent_t he = nullptr;
    ASSERT_EQ(table_->hostEventCreate(ctx_, dev, &he), ncclSuccess) << table_->lastError(ctx_);
    EXPECT_EQ(table_->eventRecord(ctx_, he, q), ncclInvalidArgument);
    ASSERT_EQ(table_->eventWait(ctx_, q, he), ncclSuccess) << table_->lastError(ctx_);
    ASSERT_EQ(table_->memcpyAsync(ctx_, h, d, bytes, q), ncclSuccess);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_EQ(static_cast<unsigned char*>(h)[bytes - 1], 0) << "the copy ran before the signal";
    int32_t done = -1;
    ASSERT_EQ(table_->eventQuery(ctx_, he, &done), ncclSuccess);
    EXPECT_EQ(done, 0);
    if (round == 0) {
      ASSERT_EQ(table_->hostEventSignal(ctx_, he), ncclSuccess);
      ASSERT_EQ(table_->hostEventSignal(ctx_, he), ncclSuccess);  // idempotent
      ASSERT_EQ(table_->eventSynchronize(ctx_, he), ncclSuccess);
      ASSERT_EQ(table_->eventQuery(ctx_, he, &done), ncclSuccess);
      EXPECT_EQ(done, 1);
    }
    ASSERT_EQ(table_->eventDestroy(ctx_, he), ncclSuccess);
    ASSERT_EQ(table_->queueSynchronize(ctx_, q), ncclSuccess);
    EXPECT_EQ(memcmp(h, pattern.data(), bytes), 0);
  }
  EXPECT_EQ(table_->memFree(ctx_, d), ncclSuccess);
  EXPECT_EQ(table_->hostFree(ctx_, h), ncclSuccess);
  EXPECT_EQ(table_->queueDestroy(ctx_, q), ncclSuccess);
}

}  // namespace
