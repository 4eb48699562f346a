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
// - setDevice is cudaSetDevice (per thread, as CUDA's current device is).
// - devicePciBusId is the driver's cuDeviceGet + cuDeviceGetPCIBusId
//   (resolved with cudaGetDriverEntryPointByVersion at init, e.g.
//   "0000:17:00.0"); "" when the driver lacks them.
// - Host events: a 32-bit slot in pinned host memory mapped into the device
//   (cudaHostAlloc portable + mapped, cudaHostGetDevicePointer) and a target
//   value; the event is signalled once the slot holds the target, which
//   hostEventSignal stores from the host. eventWait enqueues
//   cuStreamWaitValue32(slot >= target, cyclic) (resolved with
//   cudaGetDriverEntryPointByVersion) on devices that can use stream memory
//   operations (CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1 and
//   cudaDevAttrCanMapHostMemory; GEQ, so ..._WAIT_VALUE_NOR is not needed),
//   else, or when the driver answers CUDA_ERROR_NOT_SUPPORTED, a host function
//   (cudaLaunchHostFunc) that waits on a condition variable until the slot
//   holds the target; that blocks CUDA's callback thread, so other host
//   functions of the process wait too. Slots live in slabs of kSlabSlots that
//   are freed only by finalize (cudaFreeHost may synchronise the device, which
//   must not happen while a stream waits for a signal). A destroyed event is
//   signalled first, and its slot's next event takes a higher target: a wait
//   still queued for the old one is satisfied by the old value, so a slot is
//   reused at once, without knowing when streams have passed their waits.
//   finalize signals every live host event and waits for pending host
//   functions before freeing the slabs.
// - launchHostFunc: cudaLaunchHostFunc, refused (ncclInvalidArgument) while
//   any device's host events use the blocking host-function wait.
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include <atomic>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <unordered_map>
#include <vector>

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
using StreamWaitValue32Fn = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
using DeviceGetFn = CUresult (*)(CUdevice*, int);
using DeviceGetAttributeFn = CUresult (*)(int*, CUdevice_attribute, CUdevice);
using DeviceGetPciBusIdFn = CUresult (*)(char*, int, CUdevice);

// One host event (see the contract): its slot and the value that signals it.
struct HostEvent {
  uint32_t* slot = nullptr;  // host address
  CUdeviceptr devSlot = 0;   // the same word as the device sees it
  uint32_t target = 0;
};

struct Context {
  const tuttiBackendHost_v1* host = nullptr;
  int devices = 0;
  GetAddressRangeFn getAddressRange = nullptr;      // cuMemGetAddressRange, when the driver has it
  StreamWaitValue32Fn streamWaitValue32 = nullptr;  // cuStreamWaitValue32, when the driver has it
  DeviceGetFn deviceGet = nullptr;                  // cuDeviceGet, when the driver has it
  DeviceGetPciBusIdFn getPciBusId = nullptr;        // cuDeviceGetPCIBusId, likewise
  // Per device: host-event waits use cuStreamWaitValue32 (cleared if the
  // driver refuses one at run time).
  std::unique_ptr<std::atomic<bool>[]> memOpsWait;
  // Host events. hostMu guards the members below; hostCv wakes host-function
  // waits and eventSynchronize when a slot changes, and finalize when a
  // host-function wait ends.
  static constexpr size_t kSlabSlots = 1024;
  std::mutex hostMu;
  std::condition_variable hostCv;
  std::vector<void*> slabs;  // cudaHostAlloc'd, freed by finalize
  struct Slot {
    uint32_t* host;
    CUdeviceptr dev;
  };
  std::vector<Slot> freeSlots;
  std::unordered_map<tuttiPluginEvent_t, std::unique_ptr<HostEvent>> hostEvents;  // live
  int hostFuncWaits = 0;  // host functions enqueued and not finished
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

// ---- host events (see the contract) ------------------------------------------------------

// The slot holds the target or a later value (cyclic, as cuStreamWaitValue32's GEQ).
bool reached(const uint32_t* slot, uint32_t target) {
  return static_cast<int32_t>(__atomic_load_n(slot, __ATOMIC_ACQUIRE) - target) >= 0;
}

// Stores e's target (the GPU's waits read it from the mapped word) and wakes
// host-side waiters. Caller holds c->hostMu.
void signalLocked(Context* c, const HostEvent& e) {
  __atomic_store_n(e.slot, e.target, __ATOMIC_RELEASE);
  c->hostCv.notify_all();
}

// A copy of the host event behind `event`; false for a cudaEvent_t.
bool findHostEvent(Context* c, tuttiPluginEvent_t event, HostEvent* out) {
  if (c == nullptr || event == nullptr) return false;
  std::lock_guard<std::mutex> lk(c->hostMu);
  auto it = c->hostEvents.find(event);
  if (it == c->hostEvents.end()) return false;
  *out = *it->second;
  return true;
}

// A host function that holds its stream until the slot reaches the target.
struct HostFuncWait {
  Context* c;
  const uint32_t* slot;
  uint32_t target;
};

void CUDART_CB waitOnHost(void* arg) {
  const std::unique_ptr<HostFuncWait> w(static_cast<HostFuncWait*>(arg));
  Context* c = w->c;
  std::unique_lock<std::mutex> lk(c->hostMu);
  c->hostCv.wait(lk, [&] { return reached(w->slot, w->target); });
  --c->hostFuncWaits;
  c->hostCv.notify_all();  // finalize may be waiting for the last one
}

// Makes later work on `stream` wait for e (the current device is the stream's).
ncclResult_t waitForHostEvent(Context* c, cudaStream_t stream, const HostEvent& e) {
  if (reached(e.slot, e.target)) return ncclSuccess;  // signalled: nothing to wait for
  int device = 0;
  TUTTI_CUDA_TRY(cudaGetDevice(&device), "eventWait: cudaGetDevice");
  if (device >= 0 && device < c->devices && c->memOpsWait[device].load()) {
    const CUresult r = c->streamWaitValue32(reinterpret_cast<CUstream>(stream), e.devSlot, e.target,
                                            CU_STREAM_WAIT_VALUE_GEQ);
    if (r == CUDA_SUCCESS) return ncclSuccess;
    if (r != CUDA_ERROR_NOT_SUPPORTED)
      return fail(ncclUnhandledCudaError, "eventWait: cuStreamWaitValue32 failed (CUresult %d)",
                  static_cast<int>(r));
    c->memOpsWait[device].store(false);
    logLine(c, TUTTI_PLUGIN_LOG_INFO,
            "CUDA backend: device %d refuses cuStreamWaitValue32; host events wait with a host "
            "function there",
            device);
  }
  HostFuncWait* w = new (std::nothrow) HostFuncWait{c, e.slot, e.target};
  if (w == nullptr) return fail(ncclSystemError, "eventWait: out of memory");
  {
    std::lock_guard<std::mutex> lk(c->hostMu);
    ++c->hostFuncWaits;
  }
  const cudaError_t err = cudaLaunchHostFunc(stream, waitOnHost, w);
  if (err != cudaSuccess) {
    {
      std::lock_guard<std::mutex> lk(c->hostMu);
      --c->hostFuncWaits;
    }
    delete w;
    return cudaFail(err, "eventWait: cudaLaunchHostFunc");
  }
  return ncclSuccess;
}

// A free slot, allocating a slab when none is left (outside the lock: the
// allocation may take long and must not hold up hostEventSignal).
ncclResult_t takeSlot(Context* c, int device, Context::Slot* out) {
  {
    std::lock_guard<std::mutex> lk(c->hostMu);
    if (!c->freeSlots.empty()) {
      *out = c->freeSlots.back();
      c->freeSlots.pop_back();
      return ncclSuccess;
    }
  }
  DeviceGuard g;
  TUTTI_CUDA_TRY(g.set(device), "hostEventCreate: cudaSetDevice");
  void* slab = nullptr;
  const size_t bytes = Context::kSlabSlots * sizeof(uint32_t);
  TUTTI_CUDA_TRY(cudaHostAlloc(&slab, bytes, cudaHostAllocPortable | cudaHostAllocMapped),
                 "hostEventCreate: cudaHostAlloc");
  memset(slab, 0, bytes);
  void* dev = nullptr;
  const cudaError_t e = cudaHostGetDevicePointer(&dev, slab, 0);
  if (e != cudaSuccess) {
    cudaFreeHost(slab);
    return cudaFail(e, "hostEventCreate: cudaHostGetDevicePointer");
  }
  std::lock_guard<std::mutex> lk(c->hostMu);
  try {
    c->slabs.push_back(slab);
    for (size_t i = Context::kSlabSlots; i-- > 1;)
      c->freeSlots.push_back({static_cast<uint32_t*>(slab) + i,
                              reinterpret_cast<CUdeviceptr>(dev) + i * sizeof(uint32_t)});
  } catch (const std::bad_alloc&) {
    return fail(ncclSystemError, "hostEventCreate: out of memory");
  }
  *out = {static_cast<uint32_t*>(slab), reinterpret_cast<CUdeviceptr>(dev)};
  return ncclSuccess;
}

// ---- life cycle ---------------------------------------------------------------------------

// A driver function by name, in its CUDA 12.0 ABI; NULL when the driver lacks it.
void* driverEntry(const char* name) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
  const bool ok =
      cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &q) == cudaSuccess &&
      q == cudaDriverEntryPointSuccess;
  cudaGetLastError();
  return ok ? fn : nullptr;
}

// Whether host-event waits on `device` can be cuStreamWaitValue32 on a mapped
// host word (see the contract).
bool canWaitOnHostMemory(const Context* c, int device, DeviceGetFn deviceGet,
                         DeviceGetAttributeFn getAttribute) {
  if (c->streamWaitValue32 == nullptr || deviceGet == nullptr || getAttribute == nullptr)
    return false;
  int mapHost = 0, memOps = 0;
  CUdevice dev = 0;
  const bool ok =
      cudaDeviceGetAttribute(&mapHost, cudaDevAttrCanMapHostMemory, device) == cudaSuccess &&
      deviceGet(&dev, device) == CUDA_SUCCESS &&
      getAttribute(&memOps, CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1, dev) == CUDA_SUCCESS;
  cudaGetLastError();
  return ok && mapHost == 1 && memOps == 1;
}

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
  c->getAddressRange = reinterpret_cast<GetAddressRangeFn>(driverEntry("cuMemGetAddressRange"));
  c->streamWaitValue32 = reinterpret_cast<StreamWaitValue32Fn>(driverEntry("cuStreamWaitValue32"));
  const auto deviceGet = reinterpret_cast<DeviceGetFn>(driverEntry("cuDeviceGet"));
  const auto getAttribute =
      reinterpret_cast<DeviceGetAttributeFn>(driverEntry("cuDeviceGetAttribute"));
  c->deviceGet = deviceGet;
  c->getPciBusId = reinterpret_cast<DeviceGetPciBusIdFn>(driverEntry("cuDeviceGetPCIBusId"));
  c->memOpsWait.reset(new (std::nothrow) std::atomic<bool>[static_cast<size_t>(count)]);
  if (!c->memOpsWait) {
    delete c;
    return fail(ncclSystemError, "init: out of memory");
  }
  int memOpsDevices = 0;
  for (int d = 0; d < count; ++d) {
    const bool yes = canWaitOnHostMemory(c, d, deviceGet, getAttribute);
    c->memOpsWait[d].store(yes);
    memOpsDevices += yes ? 1 : 0;
  }
  logLine(c, TUTTI_PLUGIN_LOG_INFO,
          "CUDA backend: %d device(s), driver %d, runtime %d; host events wait with stream "
          "memory operations on %d device(s), with a host function elsewhere",
          count, driver, CUDART_VERSION, memOpsDevices);
  *ctx = c;
  return ncclSuccess;
}

ncclResult_t cuFinalize(void* ctx) {
  Context* c = ctxOf(ctx);
  if (c == nullptr) return ncclSuccess;
  {
    // Release every stream held by a host event, wait for the host functions
    // still enqueued (they use c), then free the slots.
    std::unique_lock<std::mutex> lk(c->hostMu);
    for (auto& kv : c->hostEvents) signalLocked(c, *kv.second);
    c->hostCv.wait(lk, [c] { return c->hostFuncWaits == 0; });
    c->hostEvents.clear();
    c->freeSlots.clear();
    for (void* slab : c->slabs) cudaFreeHost(slab);
    c->slabs.clear();
  }
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

ncclResult_t cuSetDevice(void* ctx, int32_t device) {
  if (device < 0 || (ctxOf(ctx) != nullptr && device >= ctxOf(ctx)->devices))
    return fail(ncclInvalidArgument, "setDevice: no device %d (%d devices)", device,
                ctxOf(ctx) != nullptr ? ctxOf(ctx)->devices : 0);
  TUTTI_CUDA_TRY(cudaSetDevice(device), "cudaSetDevice");
  return ncclSuccess;
}

ncclResult_t cuDevicePciBusId(void* ctx, int32_t device, char* busId, uint64_t len) {
  const Context* c = ctxOf(ctx);
  if (c == nullptr) return fail(ncclInvalidArgument, "devicePciBusId: not initialised");
  if (device < 0 || device >= c->devices)
    return fail(ncclInvalidArgument, "devicePciBusId: no device %d (%d devices)", device,
                c->devices);
  if (busId == nullptr || len == 0)
    return fail(ncclInvalidArgument, "devicePciBusId: no buffer (busId %p, len %llu)",
                static_cast<void*>(busId), static_cast<unsigned long long>(len));
  busId[0] = '\0';
  if (c->deviceGet == nullptr || c->getPciBusId == nullptr) return ncclSuccess;  // unknown
  CUdevice dev = 0;
  char id[64] = {};
  CUresult r = c->deviceGet(&dev, device);
  if (r == CUDA_SUCCESS) r = c->getPciBusId(id, static_cast<int>(sizeof id), dev);
  if (r != CUDA_SUCCESS)
    return fail(ncclUnhandledCudaError, "devicePciBusId: cuDeviceGetPCIBusId(device %d) failed: %d",
                device, static_cast<int>(r));
  const size_t n = strnlen(id, sizeof id);
  if (n + 1 > len)
    return fail(ncclInvalidArgument, "devicePciBusId: %llu bytes cannot hold '%s'",
                static_cast<unsigned long long>(len), id);
  memcpy(busId, id, n + 1);
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

ncclResult_t cuHostEventCreate(void* ctx, int32_t device, tuttiPluginEvent_t* event) {
  Context* c = ctxOf(ctx);
  if (c == nullptr || event == nullptr) return fail(ncclInvalidArgument, "hostEventCreate: NULL");
  if (device < 0 || device >= c->devices)
    return fail(ncclInvalidArgument, "hostEventCreate: no device %d", device);
  std::unique_ptr<HostEvent> e(new (std::nothrow) HostEvent);
  if (!e) return fail(ncclSystemError, "hostEventCreate: out of memory");
  Context::Slot slot{};
  const ncclResult_t rc = takeSlot(c, device, &slot);
  if (rc != ncclSuccess) return rc;
  e->slot = slot.host;
  e->devSlot = slot.dev;
  e->target = __atomic_load_n(slot.host, __ATOMIC_ACQUIRE) + 1;  // unsignalled
  const auto handle = reinterpret_cast<tuttiPluginEvent_t>(e.get());
  std::lock_guard<std::mutex> lk(c->hostMu);
  try {
    c->hostEvents.emplace(handle, std::move(e));
  } catch (const std::bad_alloc&) {
    c->freeSlots.push_back(slot);
    return fail(ncclSystemError, "hostEventCreate: out of memory");
  }
  *event = handle;
  return ncclSuccess;
}

ncclResult_t cuHostEventSignal(void* ctx, tuttiPluginEvent_t event) {
  Context* c = ctxOf(ctx);
  if (c == nullptr) return fail(ncclInvalidArgument, "hostEventSignal: not initialised");
  std::lock_guard<std::mutex> lk(c->hostMu);
  auto it = c->hostEvents.find(event);
  if (it == c->hostEvents.end())
    return fail(ncclInvalidArgument, "hostEventSignal: %p is not a live host event",
                static_cast<void*>(event));
  signalLocked(c, *it->second);
  return ncclSuccess;
}

ncclResult_t cuEventDestroy(void* ctx, tuttiPluginEvent_t event) {
  if (event == nullptr) return ncclSuccess;
  if (Context* c = ctxOf(ctx)) {
    std::lock_guard<std::mutex> lk(c->hostMu);
    auto it = c->hostEvents.find(event);
    if (it != c->hostEvents.end()) {
      // Released, not left waiting; the slot's next event waits for a higher value.
      signalLocked(c, *it->second);
      c->freeSlots.push_back({it->second->slot, it->second->devSlot});
      c->hostEvents.erase(it);
      return ncclSuccess;
    }
  }
  TUTTI_CUDA_TRY(cudaEventDestroy(eventOf(event)), "cudaEventDestroy");
  return ncclSuccess;
}

ncclResult_t cuEventRecord(void* ctx, tuttiPluginEvent_t event, tuttiPluginQueue_t queue) {
  HostEvent he;
  if (findHostEvent(ctxOf(ctx), event, &he))
    return fail(ncclInvalidArgument,
                "eventRecord: a host event is completed by hostEventSignal, not by a stream");
  DeviceGuard g;
  TUTTI_CUDA_TRY(g.setForStream(streamOf(queue)), "eventRecord: queue device");
  TUTTI_CUDA_TRY(cudaEventRecord(eventOf(event), streamOf(queue)), "cudaEventRecord");
  return ncclSuccess;
}

ncclResult_t cuEventWait(void* ctx, tuttiPluginQueue_t queue, tuttiPluginEvent_t event) {
  DeviceGuard g;
  TUTTI_CUDA_TRY(g.setForStream(streamOf(queue)), "eventWait: queue device");
  HostEvent he;
  if (findHostEvent(ctxOf(ctx), event, &he))
    return waitForHostEvent(ctxOf(ctx), streamOf(queue), he);
  TUTTI_CUDA_TRY(cudaStreamWaitEvent(streamOf(queue), eventOf(event), 0), "cudaStreamWaitEvent");
  return ncclSuccess;
}

// A host function on the stream (CUDA calls fn on its callback thread; fn
// makes no CUDA call). Refused while some device's host events wait with
// blocking host functions: a held stream would then hold fn too, and tutti
// would wait for fn while it holds that stream (it polls instead).
ncclResult_t cuLaunchHostFunc(void* ctx, tuttiPluginQueue_t queue, void (*fn)(void*), void* arg) {
  Context* c = ctxOf(ctx);
  if (c == nullptr) return fail(ncclInvalidArgument, "launchHostFunc: not initialised");
  if (fn == nullptr) return fail(ncclInvalidArgument, "launchHostFunc: fn is NULL");
  for (int d = 0; d < c->devices; ++d)
    if (!c->memOpsWait[d].load())
      return fail(ncclInvalidArgument,
                  "launchHostFunc: not offered: device %d's host events wait with host functions, "
                  "which hold CUDA's callback thread",
                  d);
  DeviceGuard g;
  TUTTI_CUDA_TRY(g.setForStream(streamOf(queue)), "launchHostFunc: queue device");
  TUTTI_CUDA_TRY(cudaLaunchHostFunc(streamOf(queue), fn, arg), "cudaLaunchHostFunc");
  return ncclSuccess;
}

ncclResult_t cuEventQuery(void* ctx, tuttiPluginEvent_t event, int32_t* done) {
  if (done == nullptr) return fail(ncclInvalidArgument, "eventQuery: done is NULL");
  HostEvent he;
  if (findHostEvent(ctxOf(ctx), event, &he)) {
    *done = reached(he.slot, he.target) ? 1 : 0;
    return ncclSuccess;
  }
  const cudaError_t e = cudaEventQuery(eventOf(event));
  if (e == cudaSuccess || e == cudaErrorNotReady) {
    if (e == cudaErrorNotReady) cudaGetLastError();
    *done = e == cudaSuccess ? 1 : 0;
    return ncclSuccess;
  }
  return cudaFail(e, "cudaEventQuery");
}

ncclResult_t cuEventSynchronize(void* ctx, tuttiPluginEvent_t event) {
  HostEvent he;
  if (Context* c = ctxOf(ctx); findHostEvent(c, event, &he)) {
    std::unique_lock<std::mutex> lk(c->hostMu);
    c->hostCv.wait(lk, [&] { return reached(he.slot, he.target); });
    return ncclSuccess;
  }
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
  t.setDevice = cuSetDevice;
  t.hostEventCreate = cuHostEventCreate;
  t.hostEventSignal = cuHostEventSignal;
  t.devicePciBusId = cuDevicePciBusId;
  t.launchHostFunc = cuLaunchHostFunc;
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
