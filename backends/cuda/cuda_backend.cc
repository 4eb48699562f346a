// The CUDA device backend plugin (include/tutti/backend_plugin.h, ABI v1):
// libtutti-backend-cuda.so, built against the public header only.
//
// Contract (beyond the ABI's):
// - Links the CUDA runtime statically, so the library needs only the driver
//   (libcuda.so.1) at run time. Without a driver or device, init() returns
//   ncclUnhandledCudaError with lastError "no CUDA driver: ..." or "no CUDA
//   device: ..."; nothing crashes and the entry point itself never touches the
//   device.
// - Queues are cudaStream_t (NULL: the legacy default stream of the current
//   device), events are cudaEvent_t created with cudaEventDisableTiming. Work
//   is launched with the queue's device made current for the call (and the
//   caller's device restored); so are allocations on an explicit device.
// - IPC uses cudaIpcGetMemHandle / cudaIpcOpenMemHandle (lazy peer access):
//   data[] holds the 64-byte cudaIpcMemHandle_t of the whole allocation, offset
//   locates the pointer in it, fd is -1. Importing the same allocation twice in
//   one process maps it once (reference counted). Memory must come from
//   cudaMalloc (not the VMM/cuMemCreate or stream-ordered allocators).
// - Kernels: reduce (every datatype and op, up to kMaxReduceSrcs = 64 sources;
//   more -> ncclInvalidArgument, tutti falls back to the host), castScaled (the
//   four fp32 <-> fp16/bf16 pairs), pack1bit/unpack1bit, gemm. orthogonalize is
//   NULL: tutti runs its host reference (PowerSGD's orthogonalisation is a
//   small rows x rank matrix; a device version is future work).
// - Linked with -z nodelete: once loaded the library stays mapped (dlclose is a
//   no-op), as the static CUDA runtime cannot be unloaded safely.
// - Runtime errors that are not sticky are cleared (cudaGetLastError) so that a
//   failed call does not poison later ones. lastError is per thread.
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include <map>
#include <mutex>
#include <new>
#include <string>

#include "backends/cuda/cuda_kernels.h"
#include "backends/cuda/kernel_ops.h"
#include "tutti/backend_plugin.h"

namespace tutti_cuda {
namespace {

static_assert(sizeof(cudaIpcMemHandle_t) <= TUTTI_PLUGIN_IPC_HANDLE_BYTES,
              "a CUDA IPC handle fits the plugin handle");

// ---- errors ---------------------------------------------------------------------------

thread_local char t_lastError[512];

ncclResult_t fail(ncclResult_t rc, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
ncclResult_t fail(ncclResult_t rc, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(t_lastError, sizeof t_lastError, fmt, ap);
  va_end(ap);
  return rc;
}

// Records a failed runtime call and clears the (non-sticky) error state.
ncclResult_t cudaFail(cudaError_t e, const char* what) {
  cudaGetLastError();
  return fail(e == cudaErrorMemoryAllocation ? ncclSystemError : ncclUnhandledCudaError,
              "%s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

#define TUTTI_CUDA_TRY(call, what)                    \
  do {                                                \
    const cudaError_t e_ = (call);                    \
    if (e_ != cudaSuccess) return cudaFail(e_, what); \
  } while (0)

// ---- context --------------------------------------------------------------------------

using GetAddressRangeFn = CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr);

struct Context {
  const tuttiBackendHost_v1* host = nullptr;
  int devices = 0;
  GetAddressRangeFn getAddressRange = nullptr;  // cuMemGetAddressRange, when the driver has it
  // IPC imports: handle bytes + device -> mapping; imported pointer -> keys.
  struct Mapping {
    void* base = nullptr;
    int refs = 0;
  };
  std::mutex ipcMu;
  std::map<std::string, Mapping> imports;
  std::multimap<void*, std::string> importedPtrs;
};

void logLine(const Context* c, int level, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));
void logLine(const Context* c, int level, const char* fmt, ...) {
  if (c == nullptr || c->host == nullptr || c->host->log == nullptr) return;
  char line[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  c->host->log(level, line);
}

Context* ctxOf(void* ctx) { return static_cast<Context*>(ctx); }

// Makes `device` current for the guard's lifetime (no-op when it already is).
class DeviceGuard {
 public:
  DeviceGuard() = default;
  ~DeviceGuard() {
    if (switched_) cudaSetDevice(prev_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

  cudaError_t set(int device) {
    cudaError_t e = cudaGetDevice(&prev_);
    if (e != cudaSuccess || prev_ == device) return e;
    e = cudaSetDevice(device);
    switched_ = e == cudaSuccess;
    return e;
  }
  // The device of `stream` (NULL: stay on the current device).
  cudaError_t setForStream(cudaStream_t stream) {
    if (stream == nullptr) return cudaSuccess;
    int device = 0;
    const cudaError_t e = cudaStreamGetDevice(stream, &device);
    return e != cudaSuccess ? e : set(device);
  }

 private:
  int prev_ = 0;
  bool switched_ = false;
};

cudaStream_t streamOf(tuttiPluginQueue_t q) { return reinterpret_cast<cudaStream_t>(q); }
cudaEvent_t eventOf(tuttiPluginEvent_t e) { return reinterpret_cast<cudaEvent_t>(e); }

// ---- life cycle ---------------------------------------------------------------------------

ncclResult_t cuInit(const tuttiBackendHost_v1* host, void** ctx) {
  if (ctx == nullptr) return fail(ncclInvalidArgument, "init: ctx is NULL");
  *ctx = nullptr;
  int driver = 0;
  cudaDriverGetVersion(&driver);  // 0 when libcuda.so.1 cannot be loaded
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count < 1) {
    cudaGetLastError();
    if (driver == 0 || e == cudaErrorInsufficientDriver) {
      return fail(ncclUnhandledCudaError,
                  "no CUDA driver: libcuda.so.1 is missing or too old (driver version %d, "
                  "runtime %d): %s",
                  driver, CUDART_VERSION, cudaGetErrorString(e));
    }
    return fail(ncclUnhandledCudaError, "no CUDA device: %s",
                e == cudaSuccess ? "the driver reports 0 devices" : cudaGetErrorString(e));
  }
  Context* c = new (std::nothrow) Context;
  if (c == nullptr) return fail(ncclSystemError, "init: out of memory");
  c->host =
      host != nullptr && host->structSize >= offsetof(tuttiBackendHost_v1, log) + sizeof(host->log)
          ? host
          : nullptr;
  c->devices = count;
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
  if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000, cudaEnableDefault, &q) ==
          cudaSuccess &&
      q == cudaDriverEntryPointSuccess) {
    c->getAddressRange = reinterpret_cast<GetAddressRangeFn>(fn);
  }
  cudaGetLastError();
  logLine(c, TUTTI_PLUGIN_LOG_INFO, "CUDA backend: %d device(s), driver %d, runtime %d", count,
          driver, CUDART_VERSION);
  *ctx = c;
  return ncclSuccess;
}

ncclResult_t cuFinalize(void* ctx) {
  Context* c = ctxOf(ctx);
  if (c == nullptr) return ncclSuccess;
  {
    std::lock_guard<std::mutex> lk(c->ipcMu);
    for (auto& kv : c->imports) cudaIpcCloseMemHandle(kv.second.base);
  }
  cudaGetLastError();
  delete c;
  return ncclSuccess;
}

const char* cuLastError(void*) { return t_lastError; }

ncclResult_t cuDeviceCount(void* ctx, int32_t* count) {
  if (count == nullptr) return fail(ncclInvalidArgument, "deviceCount: NULL");
  *count = ctxOf(ctx) != nullptr ? ctxOf(ctx)->devices : 0;
  return ncclSuccess;
}

ncclResult_t cuCurrentDevice(void*, int32_t* device) {
  if (device == nullptr) return fail(ncclInvalidArgument, "currentDevice: NULL");
  int d = 0;
  TUTTI_CUDA_TRY(cudaGetDevice(&d), "cudaGetDevice");
  *device = d;
  return ncclSuccess;
}

// ---- memory -------------------------------------------------------------------------------

// The allocation containing ptr (device address space), when the driver knows it.
bool addressRange(const Context* c, const void* ptr, void** base, uint64_t* size) {
  if (c == nullptr || c->getAddressRange == nullptr) return false;
  CUdeviceptr b = 0;
  size_t s = 0;
  if (c->getAddressRange(&b, &s, reinterpret_cast<CUdeviceptr>(ptr)) != CUDA_SUCCESS) return false;
  *base = reinterpret_cast<void*>(b);
  *size = s;
  return true;
}

ncclResult_t cuQueryPointer(void* ctx, const void* ptr, tuttiPluginPointerInfo_v1* info) {
  if (info == nullptr) return fail(ncclInvalidArgument, "queryPointer: info is NULL");
  auto fits = [info](size_t end) { return info->structSize >= end; };
  int32_t type = TUTTI_PLUGIN_MEM_UNKNOWN;
  int32_t device = -1;
  void* base = nullptr;
  uint64_t size = 0;
  cudaPointerAttributes attr;
  if (ptr != nullptr && cudaPointerGetAttributes(&attr, ptr) == cudaSuccess) {
    switch (attr.type) {
      case cudaMemoryTypeDevice:
        type = TUTTI_PLUGIN_MEM_DEVICE;
        device = attr.device;
        break;
      case cudaMemoryTypeManaged:
        type = TUTTI_PLUGIN_MEM_MANAGED;
        device = attr.device;
        break;
      case cudaMemoryTypeHost:
        type = TUTTI_PLUGIN_MEM_HOST_PINNED;
        break;
      default:
        break;
    }
    if (type != TUTTI_PLUGIN_MEM_UNKNOWN) {
      const void* dp = type == TUTTI_PLUGIN_MEM_HOST_PINNED && attr.devicePointer != nullptr
                           ? attr.devicePointer
                           : ptr;
      if (addressRange(ctxOf(ctx), dp, &base, &size) && dp != ptr) {
        // Report the range in the host address the caller used.
        base = static_cast<char*>(const_cast<void*>(ptr)) -
               (static_cast<const char*>(dp) - static_cast<char*>(base));
      }
    }
  }
  cudaGetLastError();  // an unknown pointer must not leave an error behind
  if (fits(offsetof(tuttiPluginPointerInfo_v1, memoryType) + sizeof(int32_t)))
    info->memoryType = type;
  if (fits(offsetof(tuttiPluginPointerInfo_v1, device) + sizeof(int32_t))) info->device = device;
  if (fits(offsetof(tuttiPluginPointerInfo_v1, reserved0) + sizeof(int32_t))) info->reserved0 = 0;
  if (fits(offsetof(tuttiPluginPointerInfo_v1, base) + sizeof(void*))) info->base = base;
  if (fits(offsetof(tuttiPluginPointerInfo_v1, size) + sizeof(uint64_t))) info->size = size;
  return ncclSuccess;
}

ncclResult_t cuMemAlloc(void* ctx, int32_t device, uint64_t size, void** ptr) {
  if (ptr == nullptr) return fail(ncclInvalidArgument, "memAlloc: ptr is NULL");
  *ptr = nullptr;
  if (size == 0) return ncclSuccess;
  if (device < 0 || (ctxOf(ctx) != nullptr && device >= ctxOf(ctx)->devices))
    return fail(ncclInvalidArgument, "memAlloc: no device %d", device);
  DeviceGuard g;
  TUTTI_CUDA_TRY(g.set(device), "memAlloc: cudaSetDevice");
  const cudaError_t e = cudaMalloc(ptr, size);
  if (e != cudaSuccess) {
    *ptr = nullptr;
    cudaGetLastError();
    return fail(e == cudaErrorMemoryAllocation ? ncclSystemError : ncclUnhandledCudaError,
                "cudaMalloc of %llu bytes on device %d: %s", static_cast<unsigned long long>(size),
                device, cudaGetErrorString(e));
  }
  return ncclSuccess;
}

ncclResult_t cuMemFree(void*, void* ptr) {
  if (ptr == nullptr) return ncclSuccess;
  TUTTI_CUDA_TRY(cudaFree(ptr), "cudaFree");
  return ncclSuccess;
}

ncclResult_t cuHostAlloc(void*, uint64_t size, void** ptr) {
  if (ptr == nullptr) return fail(ncclInvalidArgument, "hostAlloc: ptr is NULL");
  *ptr = nullptr;
  if (size == 0) return ncclSuccess;
  const cudaError_t e = cudaHostAlloc(ptr, size, cudaHostAllocPortable | cudaHostAllocMapped);
  if (e != cudaSuccess) {
    *ptr = nullptr;
    cudaGetLastError();
    return fail(e == cudaErrorMemoryAllocation ? ncclSystemError : ncclUnhandledCudaError,
                "cudaHostAlloc of %llu bytes: %s", static_cast<unsigned long long>(size),
                cudaGetErrorString(e));
  }
  return ncclSuccess;
}

ncclResult_t cuHostFree(void*, void* ptr) {
  if (ptr == nullptr) return ncclSuccess;
  TUTTI_CUDA_TRY(cudaFreeHost(ptr), "cudaFreeHost");
  return ncclSuccess;
}

ncclResult_t cuMemcpyAsync(void*, void* dst, const void* src, uint64_t bytes,
                           tuttiPluginQueue_t queue) {
  if (bytes == 0) return ncclSuccess;
  DeviceGuard g;
  TUTTI_CUDA_TRY(g.setForStream(streamOf(queue)), "memcpyAsync: queue device");
  TUTTI_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, streamOf(queue)),
                 "cudaMemcpyAsync");
  return ncclSuccess;
}

// ---- queues and events ----------------------------------------------------------------------

ncclResult_t cuQueueCreate(void*, int32_t device, tuttiPluginQueue_t* queue) {
  if (queue == nullptr) return fail(ncclInvalidArgument, "queueCreate: queue is NULL");
  DeviceGuard g;
  TUTTI_CUDA_TRY(g.set(device), "queueCreate: cudaSetDevice");
  cudaStream_t s = nullptr;
  TUTTI_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  *queue = reinterpret_cast<tuttiPluginQueue_t>(s);
  return ncclSuccess;
}

ncclResult_t cuQueueDestroy(void*, tuttiPluginQueue_t queue) {
  if (queue == nullptr) return ncclSuccess;
  TUTTI_CUDA_TRY(cudaStreamDestroy(streamOf(queue)), "cudaStreamDestroy");
  return ncclSuccess;
}

ncclResult_t cuQueueSynchronize(void*, tuttiPluginQueue_t queue) {
  TUTTI_CUDA_TRY(cudaStreamSynchronize(streamOf(queue)), "cudaStreamSynchronize");
  return ncclSuccess;
}

ncclResult_t cuEventCreate(void*, int32_t device, tuttiPluginEvent_t* event) {
  if (event == nullptr) return fail(ncclInvalidArgument, "eventCreate: event is NULL");
  DeviceGuard g;
  TUTTI_CUDA_TRY(g.set(device), "eventCreate: cudaSetDevice");
  cudaEvent_t e = nullptr;
  TUTTI_CUDA_TRY(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
  *event = reinterpret_cast<tuttiPluginEvent_t>(e);
  return ncclSuccess;
}

ncclResult_t cuEventDestroy(void*, tuttiPluginEvent_t event) {
  if (event == nullptr) return ncclSuccess;
  TUTTI_CUDA_TRY(cudaEventDestroy(eventOf(event)), "cudaEventDestroy");
  return ncclSuccess;
}

ncclResult_t cuEventRecord(void*, tuttiPluginEvent_t event, tuttiPluginQueue_t queue) {
  DeviceGuard g;
  TUTTI_CUDA_TRY(g.setForStream(streamOf(queue)), "eventRecord: queue device");
  TUTTI_CUDA_TRY(cudaEventRecord(eventOf(event), streamOf(queue)), "cudaEventRecord");
  return ncclSuccess;
}

ncclResult_t cuEventWait(void*, tuttiPluginQueue_t queue, tuttiPluginEvent_t event) {
  DeviceGuard g;
  TUTTI_CUDA_TRY(g.setForStream(streamOf(queue)), "eventWait: queue device");
  TUTTI_CUDA_TRY(cudaStreamWaitEvent(streamOf(queue), eventOf(event), 0), "cudaStreamWaitEvent");
  return ncclSuccess;
}

ncclResult_t cuEventQuery(void*, tuttiPluginEvent_t event, int32_t* done) {
  if (done == nullptr) return fail(ncclInvalidArgument, "eventQuery: done is NULL");
  const cudaError_t e = cudaEventQuery(eventOf(event));
  if (e == cudaSuccess || e == cudaErrorNotReady) {
    if (e == cudaErrorNotReady) cudaGetLastError();
    *done = e == cudaSuccess ? 1 : 0;
    return ncclSuccess;
  }
  return cudaFail(e, "cudaEventQuery");
}

ncclResult_t cuEventSynchronize(void*, tuttiPluginEvent_t event) {
  TUTTI_CUDA_TRY(cudaEventSynchronize(eventOf(event)), "cudaEventSynchronize");
  return ncclSuccess;
}

// ---- IPC ---------------------------------------------------------------------------------------

ncclResult_t cuIpcExport(void* ctx, void* ptr, uint64_t, const int32_t*, int32_t,
                         tuttiPluginIpcHandle_v1* handle) {
  if (ptr == nullptr || handle == nullptr) return fail(ncclInvalidArgument, "ipcExport: NULL");
  if (handle->structSize < sizeof(tuttiPluginIpcHandle_v1))
    return fail(ncclInvalidArgument, "ipcExport: handle structSize %u too small",
                handle->structSize);
  void* base = nullptr;
  uint64_t size = 0;
  if (!addressRange(ctxOf(ctx), ptr, &base, &size)) {
    cudaPointerAttributes attr;
    if (cudaPointerGetAttributes(&attr, ptr) != cudaSuccess || attr.type != cudaMemoryTypeDevice) {
      cudaGetLastError();
      return fail(ncclInvalidArgument, "ipcExport: %p is not CUDA device memory", ptr);
    }
    base = ptr;  // no range query: export the pointer as if it started its allocation
  }
  cudaIpcMemHandle_t h;
  TUTTI_CUDA_TRY(cudaIpcGetMemHandle(&h, base), "cudaIpcGetMemHandle");
  memset(handle->data, 0, sizeof handle->data);
  memcpy(handle->data, &h, sizeof h);
  handle->dataSize = sizeof h;
  handle->fd = -1;
  handle->reserved0 = 0;
  handle->offset = static_cast<uint64_t>(static_cast<char*>(ptr) - static_cast<char*>(base));
  return ncclSuccess;
}

ncclResult_t cuIpcImport(void* ctx, int32_t device, const tuttiPluginIpcHandle_v1* handle,
                         void** ptr) {
  Context* c = ctxOf(ctx);
  if (c == nullptr || handle == nullptr || ptr == nullptr)
    return fail(ncclInvalidArgument, "ipcImport: NULL");
  if (handle->dataSize != sizeof(cudaIpcMemHandle_t))
    return fail(ncclInvalidArgument, "ipcImport: handle holds %u bytes, not a CUDA IPC handle",
                handle->dataSize);
  std::string key(reinterpret_cast<const char*>(handle->data), sizeof(cudaIpcMemHandle_t));
  key.append(reinterpret_cast<const char*>(&device), sizeof device);
  std::lock_guard<std::mutex> lk(c->ipcMu);
  auto it = c->imports.find(key);
  if (it == c->imports.end()) {
    cudaIpcMemHandle_t h;
    memcpy(&h, handle->data, sizeof h);
    DeviceGuard g;
    TUTTI_CUDA_TRY(g.set(device), "ipcImport: cudaSetDevice");
    void* base = nullptr;
    TUTTI_CUDA_TRY(cudaIpcOpenMemHandle(&base, h, cudaIpcMemLazyEnablePeerAccess),
                   "cudaIpcOpenMemHandle");
    it = c->imports.emplace(key, Context::Mapping{base, 0}).first;
  }
  ++it->second.refs;
  *ptr = static_cast<char*>(it->second.base) + handle->offset;
  c->importedPtrs.emplace(*ptr, key);
  return ncclSuccess;
}

ncclResult_t cuIpcClose(void* ctx, void* ptr) {
  Context* c = ctxOf(ctx);
  if (c == nullptr || ptr == nullptr) return fail(ncclInvalidArgument, "ipcClose: NULL");
  std::lock_guard<std::mutex> lk(c->ipcMu);
  auto p = c->importedPtrs.find(ptr);
  if (p == c->importedPtrs.end())
    return fail(ncclInvalidArgument, "ipcClose: %p was not returned by ipcImport", ptr);
  auto it = c->imports.find(p->second);
  c->importedPtrs.erase(p);
  if (it == c->imports.end() || --it->second.refs > 0) return ncclSuccess;
  void* base = it->second.base;
  c->imports.erase(it);
  TUTTI_CUDA_TRY(cudaIpcCloseMemHandle(base), "cudaIpcCloseMemHandle");
  return ncclSuccess;
}

// ---- kernels
// -------------------------------------------------------------------------------------

ncclResult_t cuReduce(void*, const tuttiPluginReduceArgs_v1* a, tuttiPluginQueue_t queue) {
  if (a == nullptr) return fail(ncclInvalidArgument, "reduce: args is NULL");
  if (a->structSize < offsetof(tuttiPluginReduceArgs_v1, avgDivisor) + sizeof(a->avgDivisor))
    return fail(ncclInvalidArgument, "reduce: args structSize %u too small", a->structSize);
  if (a->datatype < kInt8 || a->datatype >= kNumDTypes)
    return fail(ncclInvalidArgument, "reduce: unknown datatype %d", a->datatype);
  if (a->op < kSum || a->op >= kNumOps)
    return fail(ncclInvalidArgument, "reduce: unknown operator %d", a->op);
  if (a->nSrcs < 1 || a->srcs == nullptr)
    return fail(ncclInvalidArgument, "reduce: needs at least one source");
  if (a->nSrcs > kMaxReduceSrcs)
    return fail(ncclInvalidArgument, "reduce: %d sources, the CUDA kernel takes at most %d",
                a->nSrcs, kMaxReduceSrcs);
  if (a->op == kPreMulSum && a->scalar == nullptr)
    return fail(ncclInvalidArgument, "reduce: PREMULSUM without a scalar");
  if (a->op == kAvg && a->avgDivisor < 1)
    return fail(ncclInvalidArgument, "reduce: AVG with divisor 0");
  if (a->count == 0) return ncclSuccess;
  ReduceLaunch l{};
  l.dtype = a->datatype;
  l.op = a->op;
  l.nSrcs = a->nSrcs;
  l.count = a->count;
  l.dst = a->dst;
  for (int k = 0; k < a->nSrcs; ++k) l.srcs[k] = a->srcs[k];
  l.avgDivisor = a->avgDivisor;
  if (a->op == kPreMulSum) {
    if (a->scalarResidence == ncclScalarDevice) {
      l.scalarDev = a->scalar;
    } else {
      memcpy(&l.scalarBits, a->scalar, static_cast<size_t>(dtypeSize(a->datatype)));
    }
  }
  DeviceGuard g;
  TUTTI_CUDA_TRY(g.setForStream(streamOf(queue)), "reduce: queue device");
  TUTTI_CUDA_TRY(launchReduce(l, streamOf(queue)), "reduce kernel launch");
  return ncclSuccess;
}

ncclResult_t cuCastScaled(void*, void* dst, int32_t dstType, const void* src, int32_t srcType,
                          uint64_t count, float scale, tuttiPluginQueue_t queue) {
  bool toNarrow;
  int narrow;
  if (srcType == kFloat32 && (dstType == kFloat16 || dstType == kBfloat16)) {
    toNarrow = true;
    narrow = dstType;
  } else if (dstType == kFloat32 && (srcType == kFloat16 || srcType == kBfloat16)) {
    toNarrow = false;
    narrow = srcType;
  } else {
    return fail(ncclInvalidArgument, "castScaled: unsupported type pair %d -> %d", srcType,
                dstType);
  }
  if (count == 0) return ncclSuccess;
  DeviceGuard g;
  TUTTI_CUDA_TRY(g.setForStream(streamOf(queue)), "castScaled: queue device");
  TUTTI_CUDA_TRY(launchCastScaled(dst, src, narrow, toNarrow, count, scale, streamOf(queue)),
                 "castScaled kernel launch");
  return ncclSuccess;
}

ncclResult_t cuPack1bit(void*, const float* src, float* error, void* wire, uint64_t count,
                        tuttiPluginQueue_t queue) {
  if (count == 0) return ncclSuccess;
  DeviceGuard g;
  TUTTI_CUDA_TRY(g.setForStream(streamOf(queue)), "pack1bit: queue device");
  TUTTI_CUDA_TRY(launchPack1bit(src, error, wire, count, streamOf(queue)), "pack1bit launch");
  return ncclSuccess;
}

ncclResult_t cuUnpack1bit(void*, float* dst, const void* wire, uint64_t count, int32_t accumulate,
                          tuttiPluginQueue_t queue) {
  if (count == 0) return ncclSuccess;
  DeviceGuard g;
  TUTTI_CUDA_TRY(g.setForStream(streamOf(queue)), "unpack1bit: queue device");
  TUTTI_CUDA_TRY(launchUnpack1bit(dst, wire, count, accumulate != 0, streamOf(queue)),
                 "unpack1bit launch");
  return ncclSuccess;
}

ncclResult_t cuGemm(void*, int32_t transA, int32_t transB, int64_t m, int64_t n, int64_t k,
                    float alpha, const float* A, int64_t lda, const float* B, int64_t ldb,
                    float beta, float* C, int64_t ldc, tuttiPluginQueue_t queue) {
  if (m < 0 || n < 0 || k < 0) return fail(ncclInvalidArgument, "gemm: negative dimension");
  if (m == 0 || n == 0) return ncclSuccess;
  DeviceGuard g;
  TUTTI_CUDA_TRY(g.setForStream(streamOf(queue)), "gemm: queue device");
  TUTTI_CUDA_TRY(launchGemm(transA != 0, transB != 0, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc,
                            streamOf(queue)),
                 "gemm launch");
  return ncclSuccess;
}

tuttiBackendPlugin_v1 makeTable() {
  tuttiBackendPlugin_v1 t;
  memset(&t, 0, sizeof t);
  t.abiVersion = TUTTI_BACKEND_PLUGIN_ABI_VERSION;
  t.structSize = sizeof(tuttiBackendPlugin_v1);
  t.name = "cuda";
  // GPUDirect RDMA depends on the machine (nvidia-peermem / dma-buf) and the
  // table may not change after the entry point returned, so it is not claimed.
  t.capabilities = TUTTI_PLUGIN_CAP_HOST_MAPPED;
  t.init = cuInit;
  t.finalize = cuFinalize;
  t.lastError = cuLastError;
  t.deviceCount = cuDeviceCount;
  t.currentDevice = cuCurrentDevice;
  t.queryPointer = cuQueryPointer;
  t.memAlloc = cuMemAlloc;
  t.memFree = cuMemFree;
  t.hostAlloc = cuHostAlloc;
  t.hostFree = cuHostFree;
  t.memcpyAsync = cuMemcpyAsync;
  t.queueCreate = cuQueueCreate;
  t.queueDestroy = cuQueueDestroy;
  t.queueSynchronize = cuQueueSynchronize;
  t.eventCreate = cuEventCreate;
  t.eventDestroy = cuEventDestroy;
  t.eventRecord = cuEventRecord;
  t.eventWait = cuEventWait;
  t.eventQuery = cuEventQuery;
  t.eventSynchronize = cuEventSynchronize;
  t.ipcExport = cuIpcExport;
  t.ipcImport = cuIpcImport;
  t.ipcClose = cuIpcClose;
  t.reduce = cuReduce;
  t.castScaled = cuCastScaled;
  t.pack1bit = cuPack1bit;
  t.unpack1bit = cuUnpack1bit;
  t.gemm = cuGemm;
  t.orthogonalize = nullptr;  // host fallback
  return t;
}

}  // namespace
}  // namespace tutti_cuda

extern "C" TUTTI_PLUGIN_EXPORT const tuttiBackendPlugin_v1* tuttiBackendPluginInit(
    uint32_t hostAbiVersion) {
  if (hostAbiVersion < 1) return nullptr;
  static const tuttiBackendPlugin_v1 table = tutti_cuda::makeTable();
  return &table;
}
