// The Level Zero device backend plugin (include/tutti/backend_plugin.h, ABI v1):
// libtutti-backend-ze.so, built against the public headers only (the plugin
// header and level_zero/ze_api.h).
//
// Contract (beyond the ABI's):
// - The Level Zero loader (libze_loader.so.1) is opened with dlopen by init(),
//   not linked, so the library loads anywhere. Without the loader, without a
//   driver (zeInit fails) or without a device, init() returns
//   ncclUnhandledCudaError with a lastError saying which; nothing crashes and
//   the entry point never touches the device.
// - Devices: the root devices of the first Level Zero driver that has any, in
//   zeDeviceGet order, in one context. A thread's current device is
//   TUTTI_ZE_DEVICE (default 0) until it calls setDevice, which changes it for
//   that thread only (Level Zero has no current device; the plugin keeps it).
// - devicePciBusId: zeDevicePciGetPropertiesExt (the loader's optional PCI
//   extension, looked up with dlsym; a loader or driver without it answers
//   "" = address unknown), written as "dddd:bb:dd.f".
// - Memory: memAlloc = zeMemAllocDevice (256-byte aligned), hostAlloc =
//   zeMemAllocHost (usable by kernels: TUTTI_PLUGIN_CAP_HOST_MAPPED).
//   queryPointer maps zeMemGetAllocProperties' device/host/shared to
//   DEVICE/HOST_PINNED/MANAGED, with base/size from zeMemGetAddressRange.
// - Queues: a queue is an immediate command list on the device's first compute
//   queue group, with a barrier appended after every command (Level Zero 1.4
//   gives no in-order flag), and a mutex (command lists are not thread-safe).
//   The NULL queue is the calling thread's current device's default queue,
//   created on first use. A copy from or to memory Level Zero does not know
//   (pageable host memory) waits for completion before memcpyAsync returns.
//   queueDestroy does not wait: a queue whose work has not finished is
//   destroyed later (by a later queueCreate/queueDestroy or by finalize), as
//   immediate command lists must be idle when destroyed.
// - Events come from host-visible event pools (64 per pool); eventRecord
//   appends a reset and a signal, eventWait appends a wait, eventQuery is
//   zeEventQueryStatus. An event never recorded counts as complete.
// - Host events: an event from the same pools that only zeEventHostSignal
//   completes (hostEventSignal). eventWait appends a barrier that waits on it
//   (zeCommandListAppendBarrier, waiting on the host event) and signals a
//   "passed" event of its own, so the plugin knows when no queue can still
//   read the host event. eventDestroy signals a host event first (a waiting
//   queue goes on) and keeps it until every passed event is complete; finalize
//   signals every live host event before it drains the default queues.
// - IPC: zeMemGetIpcHandle / zeMemOpenIpcHandle. On Linux the handle carries a
//   dma-buf file descriptor in its first 4 bytes (the compute-runtime layout),
//   so TUTTI_PLUGIN_CAP_IPC_NEEDS_FD is set: ipcExport hands a dup() of that fd
//   to tutti in handle->fd; ipcImport writes the received fd back into the
//   handle bytes before opening it. data[] holds the whole ze_ipc_mem_handle_t.
// - Kernels: backends/ze/kernels.cl, compiled at build time to two SPIR-V
//   modules embedded here (with and without fp64); each device loads the one
//   its ZE_DEVICE_MODULE_FLAG_FP64 allows, on first kernel use. Argument
//   marshalling: backends/ze/launch_plan.h. reduce takes up to 8 sources
//   (more: ncclInvalidArgument, host fallback); float64 reduce, pack1bit and
//   gemm need fp64 (without it: ncclInvalidArgument, host fallback);
//   orthogonalize is NULL (host fallback). If the module cannot be built on a
//   device every kernel answers ncclInvalidArgument (logged once).
// - Untested on hardware: this machine has no Level Zero driver. The kernels'
//   SPIR-V is checked under PoCL (tests/device/ze_spirv_pocl_test.cc).
#include <dlfcn.h>
#include <level_zero/ze_api.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "backends/ze/launch_plan.h"
#include "backends/ze/ze_spirv.h"
#include "tutti/backend_plugin.h"

namespace tutti_ze {
namespace {

static_assert(sizeof(ze_ipc_mem_handle_t) <= TUTTI_PLUGIN_IPC_HANDLE_BYTES,
              "a Level Zero IPC handle fits the plugin handle");

// ---- the loader's functions (dlopen) ----------------------------------------------------

#define TUTTI_ZE_FUNCS(X)                   \
  X(zeInit)                                 \
  X(zeDriverGet)                            \
  X(zeDriverGetApiVersion)                  \
  X(zeDeviceGet)                            \
  X(zeDeviceGetProperties)                  \
  X(zeDeviceGetModuleProperties)            \
  X(zeDeviceGetCommandQueueGroupProperties) \
  X(zeContextCreate)                        \
  X(zeContextDestroy)                       \
  X(zeMemAllocDevice)                       \
  X(zeMemAllocHost)                         \
  X(zeMemFree)                              \
  X(zeMemGetAllocProperties)                \
  X(zeMemGetAddressRange)                   \
  X(zeMemGetIpcHandle)                      \
  X(zeMemOpenIpcHandle)                     \
  X(zeMemCloseIpcHandle)                    \
  X(zeCommandListCreateImmediate)           \
  X(zeCommandListDestroy)                   \
  X(zeCommandListAppendMemoryCopy)          \
  X(zeCommandListAppendBarrier)             \
  X(zeCommandListAppendSignalEvent)         \
  X(zeCommandListAppendWaitOnEvents)        \
  X(zeCommandListAppendEventReset)          \
  X(zeCommandListAppendLaunchKernel)        \
  X(zeEventPoolCreate)                      \
  X(zeEventPoolDestroy)                     \
  X(zeEventCreate)                          \
  X(zeEventDestroy)                         \
  X(zeEventHostSynchronize)                 \
  X(zeEventQueryStatus)                     \
  X(zeEventHostReset)                       \
  X(zeEventHostSignal)                      \
  X(zeModuleCreate)                         \
  X(zeModuleDestroy)                        \
  X(zeModuleBuildLogGetString)              \
  X(zeModuleBuildLogDestroy)                \
  X(zeKernelCreate)                         \
  X(zeKernelDestroy)                        \
  X(zeKernelSetGroupSize)                   \
  X(zeKernelSetArgumentValue)

struct ZeApi {
#define TUTTI_ZE_MEMBER(name) decltype(&::name) name = nullptr;
  TUTTI_ZE_FUNCS(TUTTI_ZE_MEMBER)
#undef TUTTI_ZE_MEMBER
};

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

const char* zeResultName(ze_result_t r) {
  switch (r) {
    case ZE_RESULT_SUCCESS:
      return "ZE_RESULT_SUCCESS";
    case ZE_RESULT_NOT_READY:
      return "ZE_RESULT_NOT_READY";
    case ZE_RESULT_ERROR_DEVICE_LOST:
      return "ZE_RESULT_ERROR_DEVICE_LOST";
    case ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY:
      return "ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY";
    case ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY:
      return "ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY";
    case ZE_RESULT_ERROR_MODULE_BUILD_FAILURE:
      return "ZE_RESULT_ERROR_MODULE_BUILD_FAILURE";
    case ZE_RESULT_ERROR_UNINITIALIZED:
      return "ZE_RESULT_ERROR_UNINITIALIZED";
    case ZE_RESULT_ERROR_UNSUPPORTED_VERSION:
      return "ZE_RESULT_ERROR_UNSUPPORTED_VERSION";
    case ZE_RESULT_ERROR_UNSUPPORTED_FEATURE:
      return "ZE_RESULT_ERROR_UNSUPPORTED_FEATURE";
    case ZE_RESULT_ERROR_INVALID_ARGUMENT:
      return "ZE_RESULT_ERROR_INVALID_ARGUMENT";
    case ZE_RESULT_ERROR_INVALID_NULL_HANDLE:
      return "ZE_RESULT_ERROR_INVALID_NULL_HANDLE";
    case ZE_RESULT_ERROR_INVALID_NULL_POINTER:
      return "ZE_RESULT_ERROR_INVALID_NULL_POINTER";
    case ZE_RESULT_ERROR_INVALID_SIZE:
      return "ZE_RESULT_ERROR_INVALID_SIZE";
    case ZE_RESULT_ERROR_UNSUPPORTED_SIZE:
      return "ZE_RESULT_ERROR_UNSUPPORTED_SIZE";
    case ZE_RESULT_ERROR_UNSUPPORTED_ALIGNMENT:
      return "ZE_RESULT_ERROR_UNSUPPORTED_ALIGNMENT";
    case ZE_RESULT_ERROR_INVALID_KERNEL_NAME:
      return "ZE_RESULT_ERROR_INVALID_KERNEL_NAME";
    case ZE_RESULT_ERROR_INVALID_KERNEL_ARGUMENT_INDEX:
      return "ZE_RESULT_ERROR_INVALID_KERNEL_ARGUMENT_INDEX";
    case ZE_RESULT_ERROR_INVALID_KERNEL_ARGUMENT_SIZE:
      return "ZE_RESULT_ERROR_INVALID_KERNEL_ARGUMENT_SIZE";
    case ZE_RESULT_ERROR_INVALID_GROUP_SIZE_DIMENSION:
      return "ZE_RESULT_ERROR_INVALID_GROUP_SIZE_DIMENSION";
    default:
      return "ZE_RESULT_ERROR";
  }
}

ncclResult_t zeFail(ze_result_t r, const char* what) {
  const bool oom =
      r == ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY || r == ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY;
  return fail(oom ? ncclSystemError : ncclUnhandledCudaError, "%s: %s (0x%x)", what,
              zeResultName(r), static_cast<unsigned>(r));
}

#define TUTTI_ZE_TRY(call, what)                          \
  do {                                                    \
    const ze_result_t r_ = (call);                        \
    if (r_ != ZE_RESULT_SUCCESS) return zeFail(r_, what); \
  } while (0)

// ---- context ----------------------------------------------------------------------------

struct Context;

struct Queue {
  Context* ctx = nullptr;
  int device = 0;
  ze_command_list_handle_t list = nullptr;
  ze_event_handle_t syncEvent = nullptr;  // signalled by queueSynchronize
  int syncSlot = -1;
  std::mutex mu;  // guards list
};

struct Event {
  ze_event_handle_t ev = nullptr;
  int slot = -1;
  bool recorded = false;  // host events: true from the start (signalled by the host)
  bool host = false;
  // Host events: one event per eventWait, signalled when the queue has passed
  // the wait; guarded by Context::eventMu.
  std::vector<std::pair<ze_event_handle_t, int>> passes;
};

struct DeviceModule {
  std::once_flag once;
  bool ok = false;
  bool fp64 = false;
  std::string error;  // why kernels are unavailable
  ze_module_handle_t module = nullptr;
  std::map<std::string, ze_kernel_handle_t> kernels;
  std::mutex launchMu;  // kernel arguments are per-kernel state
};

std::atomic<uint64_t> g_contexts{0};  // numbers the contexts init() makes

struct Context {
  const uint64_t id = ++g_contexts;  // tells this context's setDevice apart (see currentOf)
  const tuttiBackendHost_v1* host = nullptr;
  void* lib = nullptr;
  ZeApi api;
  // Optional (not in every loader): NULL when absent.
  decltype(&::zeDevicePciGetPropertiesExt) pciGetProperties = nullptr;
  ze_driver_handle_t driver = nullptr;
  ze_context_handle_t context = nullptr;
  std::vector<ze_device_handle_t> devices;
  std::vector<uint32_t> computeOrdinal;
  std::vector<bool> fp64;
  int current = 0;
  std::unique_ptr<DeviceModule[]> modules;
  // Default queues, created on first use.
  std::mutex defaultMu;
  std::vector<Queue*> defaults;
  // Event slots: pools of kPoolEvents host-visible events.
  static constexpr uint32_t kPoolEvents = 64;
  std::mutex eventMu;
  std::vector<ze_event_pool_handle_t> pools;
  std::vector<int> freeSlots;
  std::set<Event*> hostEvents;       // live host events (under eventMu)
  std::vector<Event*> releasedHost;  // destroyed host events whose waits may not have passed
  std::mutex retiredMu;
  std::vector<Queue*> retiredQueues;  // destroyed with work pending
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

// The calling thread's setDevice choice, for the context numbered ctxId (a
// later context at the same address does not inherit it).
struct ThreadDevice {
  uint64_t ctxId = 0;
  int device = 0;
};
thread_local ThreadDevice t_device;

int currentOf(const Context* c) { return t_device.ctxId == c->id ? t_device.device : c->current; }

// An event from the shared pools (created host-visible, signal/wait scope host).
ncclResult_t takeEvent(Context* c, ze_event_handle_t* ev, int* slot) {
  std::lock_guard<std::mutex> lk(c->eventMu);
  if (c->freeSlots.empty()) {
    ze_event_pool_desc_t pd = {};
    pd.stype = ZE_STRUCTURE_TYPE_EVENT_POOL_DESC;
    pd.flags = ZE_EVENT_POOL_FLAG_HOST_VISIBLE;
    pd.count = Context::kPoolEvents;
    ze_event_pool_handle_t pool = nullptr;
    TUTTI_ZE_TRY(c->api.zeEventPoolCreate(c->context, &pd, static_cast<uint32_t>(c->devices.size()),
                                          c->devices.data(), &pool),
                 "zeEventPoolCreate");
    const int first = static_cast<int>(c->pools.size() * Context::kPoolEvents);
    c->pools.push_back(pool);
    for (int i = static_cast<int>(Context::kPoolEvents) - 1; i >= 0; --i)
      c->freeSlots.push_back(first + i);
  }
  const int s = c->freeSlots.back();
  ze_event_desc_t ed = {};
  ed.stype = ZE_STRUCTURE_TYPE_EVENT_DESC;
  ed.index = static_cast<uint32_t>(s) % Context::kPoolEvents;
  ed.signal = ZE_EVENT_SCOPE_FLAG_HOST;
  ed.wait = ZE_EVENT_SCOPE_FLAG_HOST;
  TUTTI_ZE_TRY(
      c->api.zeEventCreate(c->pools[static_cast<size_t>(s) / Context::kPoolEvents], &ed, ev),
      "zeEventCreate");
  c->freeSlots.pop_back();
  *slot = s;
  return ncclSuccess;
}

void giveEvent(Context* c, ze_event_handle_t ev, int slot) {
  if (ev != nullptr) c->api.zeEventDestroy(ev);
  std::lock_guard<std::mutex> lk(c->eventMu);
  if (slot >= 0) c->freeSlots.push_back(slot);
}

ncclResult_t makeQueue(Context* c, int device, Queue** out) {
  if (device < 0 || device >= static_cast<int>(c->devices.size()))
    return fail(ncclInvalidArgument, "no Level Zero device %d", device);
  std::unique_ptr<Queue> q(new (std::nothrow) Queue);
  if (!q) return fail(ncclSystemError, "queueCreate: out of memory");
  q->ctx = c;
  q->device = device;
  ze_command_queue_desc_t qd = {};
  qd.stype = ZE_STRUCTURE_TYPE_COMMAND_QUEUE_DESC;
  qd.ordinal = c->computeOrdinal[static_cast<size_t>(device)];
  qd.index = 0;
  qd.mode = ZE_COMMAND_QUEUE_MODE_ASYNCHRONOUS;
  qd.priority = ZE_COMMAND_QUEUE_PRIORITY_NORMAL;
  TUTTI_ZE_TRY(c->api.zeCommandListCreateImmediate(
                   c->context, c->devices[static_cast<size_t>(device)], &qd, &q->list),
               "zeCommandListCreateImmediate");
  const ncclResult_t rc = takeEvent(c, &q->syncEvent, &q->syncSlot);
  if (rc != ncclSuccess) {
    c->api.zeCommandListDestroy(q->list);
    return rc;
  }
  *out = q.release();
  return ncclSuccess;
}

void destroyQueue(Queue* q) {
  if (q == nullptr) return;
  if (q->list != nullptr) q->ctx->api.zeCommandListDestroy(q->list);
  giveEvent(q->ctx, q->syncEvent, q->syncSlot);
  delete q;
}

// The queue object behind a plugin queue (NULL: the current device's default).
ncclResult_t queueOf(Context* c, tuttiPluginQueue_t queue, Queue** out) {
  if (c == nullptr) return fail(ncclInvalidArgument, "the Level Zero backend is not initialised");
  if (queue != nullptr) {
    *out = reinterpret_cast<Queue*>(queue);
    return ncclSuccess;
  }
  const int device = currentOf(c);
  std::lock_guard<std::mutex> lk(c->defaultMu);
  Queue*& d = c->defaults[static_cast<size_t>(device)];
  if (d == nullptr) {
    const ncclResult_t rc = makeQueue(c, device, &d);
    if (rc != ncclSuccess) return rc;
  }
  *out = d;
  return ncclSuccess;
}

// Appends a barrier after a command: Level Zero does not order the commands of
// a command list by itself. Caller holds q->mu.
ncclResult_t appendBarrier(Queue* q) {
  TUTTI_ZE_TRY(q->ctx->api.zeCommandListAppendBarrier(q->list, nullptr, 0, nullptr),
               "zeCommandListAppendBarrier");
  return ncclSuccess;
}

// Makes q->syncEvent complete once everything appended to q so far has
// completed. Caller holds q->mu.
ncclResult_t markLocked(Queue* q) {
  const ZeApi& api = q->ctx->api;
  TUTTI_ZE_TRY(api.zeEventHostReset(q->syncEvent), "zeEventHostReset");
  TUTTI_ZE_TRY(api.zeCommandListAppendSignalEvent(q->list, q->syncEvent),
               "zeCommandListAppendSignalEvent");
  return ncclSuccess;
}

// Blocks until everything appended to q so far has completed. Caller holds q->mu.
ncclResult_t syncLocked(Queue* q) {
  const ncclResult_t rc = markLocked(q);
  if (rc != ncclSuccess) return rc;
  TUTTI_ZE_TRY(q->ctx->api.zeEventHostSynchronize(q->syncEvent, UINT64_MAX),
               "zeEventHostSynchronize");
  return ncclSuccess;
}

// Destroys the retired queues that have finished (all of them, waiting, when
// `wait`: finalize, after it signalled every host event).
void reapRetiredQueues(Context* c, bool wait) {
  std::vector<Queue*> done;
  {
    std::lock_guard<std::mutex> lk(c->retiredMu);
    for (size_t i = 0; i < c->retiredQueues.size();) {
      Queue* q = c->retiredQueues[i];
      if (wait) c->api.zeEventHostSynchronize(q->syncEvent, UINT64_MAX);
      if (c->api.zeEventQueryStatus(q->syncEvent) == ZE_RESULT_SUCCESS) {
        done.push_back(q);
        c->retiredQueues.erase(c->retiredQueues.begin() + static_cast<std::ptrdiff_t>(i));
      } else {
        ++i;
      }
    }
  }
  for (Queue* q : done) destroyQueue(q);
}

// Frees the destroyed host events no queue can still read (every passed event
// complete; all of them at finalize, once the queues have drained).
void reapReleasedHostEvents(Context* c, bool all) {
  std::vector<Event*> done;
  {
    std::lock_guard<std::mutex> lk(c->eventMu);
    for (size_t i = 0; i < c->releasedHost.size();) {
      Event* e = c->releasedHost[i];
      bool passed = true;
      for (const auto& p : e->passes)
        passed = passed && (all || c->api.zeEventQueryStatus(p.first) == ZE_RESULT_SUCCESS);
      if (passed) {
        done.push_back(e);
        c->releasedHost.erase(c->releasedHost.begin() + static_cast<std::ptrdiff_t>(i));
      } else {
        ++i;
      }
    }
  }
  for (Event* e : done) {
    for (const auto& p : e->passes) giveEvent(c, p.first, p.second);
    giveEvent(c, e->ev, e->slot);
    delete e;
  }
}

// ---- life cycle --------------------------------------------------------------------------

ncclResult_t plInit(const tuttiBackendHost_v1* host, void** ctx) {
  if (ctx == nullptr) return fail(ncclInvalidArgument, "init: ctx is NULL");
  *ctx = nullptr;
  std::unique_ptr<Context> c(new (std::nothrow) Context);
  if (!c) return fail(ncclSystemError, "init: out of memory");
  c->host =
      host != nullptr && host->structSize >= offsetof(tuttiBackendHost_v1, log) + sizeof(host->log)
          ? host
          : nullptr;
  c->lib = dlopen("libze_loader.so.1", RTLD_NOW | RTLD_LOCAL);
  if (c->lib == nullptr) c->lib = dlopen("libze_loader.so", RTLD_NOW | RTLD_LOCAL);
  if (c->lib == nullptr) {
    const char* e = dlerror();
    return fail(ncclUnhandledCudaError, "no Level Zero loader: libze_loader.so.1: %s",
                e != nullptr ? e : "not found");
  }
  auto closeLib = [&c] {
    dlclose(c->lib);
    c->lib = nullptr;
  };
#define TUTTI_ZE_RESOLVE(name)                                                              \
  c->api.name = reinterpret_cast<decltype(&::name)>(dlsym(c->lib, #name));                  \
  if (c->api.name == nullptr) {                                                             \
    closeLib();                                                                             \
    return fail(ncclUnhandledCudaError, "Level Zero loader too old: %s is missing", #name); \
  }
  TUTTI_ZE_FUNCS(TUTTI_ZE_RESOLVE)
#undef TUTTI_ZE_RESOLVE
  c->pciGetProperties = reinterpret_cast<decltype(&::zeDevicePciGetPropertiesExt)>(
      dlsym(c->lib, "zeDevicePciGetPropertiesExt"));
  const ZeApi& api = c->api;
  ze_result_t r = api.zeInit(ZE_INIT_FLAG_GPU_ONLY);
  if (r != ZE_RESULT_SUCCESS) {
    closeLib();
    return fail(ncclUnhandledCudaError,
                "no Level Zero driver: zeInit(ZE_INIT_FLAG_GPU_ONLY) failed with %s (0x%x); is "
                "a GPU driver (e.g. intel-level-zero-gpu) installed?",
                zeResultName(r), static_cast<unsigned>(r));
  }
  uint32_t nDrivers = 0;
  r = api.zeDriverGet(&nDrivers, nullptr);
  std::vector<ze_driver_handle_t> drivers(nDrivers);
  if (r == ZE_RESULT_SUCCESS && nDrivers > 0) r = api.zeDriverGet(&nDrivers, drivers.data());
  if (r != ZE_RESULT_SUCCESS || nDrivers == 0) {
    closeLib();
    return fail(ncclUnhandledCudaError, "no Level Zero driver: zeDriverGet found %u driver(s) (%s)",
                nDrivers, zeResultName(r));
  }
  for (ze_driver_handle_t d : drivers) {
    uint32_t n = 0;
    if (api.zeDeviceGet(d, &n, nullptr) != ZE_RESULT_SUCCESS || n == 0) continue;
    c->devices.resize(n);
    if (api.zeDeviceGet(d, &n, c->devices.data()) != ZE_RESULT_SUCCESS || n == 0) continue;
    c->devices.resize(n);
    c->driver = d;
    break;
  }
  if (c->driver == nullptr) {
    closeLib();
    return fail(ncclUnhandledCudaError, "no Level Zero device: %u driver(s), none has a device",
                nDrivers);
  }
  const int n = static_cast<int>(c->devices.size());
  for (int i = 0; i < n; ++i) {
    ze_device_handle_t d = c->devices[static_cast<size_t>(i)];
    uint32_t nGroups = 0;
    api.zeDeviceGetCommandQueueGroupProperties(d, &nGroups, nullptr);
    std::vector<ze_command_queue_group_properties_t> groups(nGroups);
    for (auto& g : groups) {
      g = {};
      g.stype = ZE_STRUCTURE_TYPE_COMMAND_QUEUE_GROUP_PROPERTIES;
    }
    uint32_t ordinal = UINT32_MAX;
    if (nGroups > 0 && api.zeDeviceGetCommandQueueGroupProperties(d, &nGroups, groups.data()) ==
                           ZE_RESULT_SUCCESS) {
      for (uint32_t g = 0; g < nGroups && ordinal == UINT32_MAX; ++g)
        if (groups[g].flags & ZE_COMMAND_QUEUE_GROUP_PROPERTY_FLAG_COMPUTE) ordinal = g;
    }
    if (ordinal == UINT32_MAX) {
      closeLib();
      return fail(ncclUnhandledCudaError, "Level Zero device %d has no compute queue group", i);
    }
    c->computeOrdinal.push_back(ordinal);
    ze_device_module_properties_t mp = {};
    mp.stype = ZE_STRUCTURE_TYPE_DEVICE_MODULE_PROPERTIES;
    const bool fp64 = api.zeDeviceGetModuleProperties(d, &mp) == ZE_RESULT_SUCCESS &&
                      (mp.flags & ZE_DEVICE_MODULE_FLAG_FP64) != 0;
    c->fp64.push_back(fp64);
  }
  ze_context_desc_t cd = {};
  cd.stype = ZE_STRUCTURE_TYPE_CONTEXT_DESC;
  r = api.zeContextCreate(c->driver, &cd, &c->context);
  if (r != ZE_RESULT_SUCCESS) {
    closeLib();
    return zeFail(r, "zeContextCreate");
  }
  c->modules.reset(new (std::nothrow) DeviceModule[static_cast<size_t>(n)]);
  if (!c->modules) {
    api.zeContextDestroy(c->context);
    closeLib();
    return fail(ncclSystemError, "init: out of memory");
  }
  c->defaults.assign(static_cast<size_t>(n), nullptr);
  if (const char* e = getenv("TUTTI_ZE_DEVICE")) {
    char* end = nullptr;
    const long v = strtol(e, &end, 10);
    if (end == e || *end != '\0' || v < 0 || v >= n) {
      api.zeContextDestroy(c->context);
      closeLib();
      return fail(ncclInvalidArgument, "TUTTI_ZE_DEVICE=%s: not a device ordinal below %d", e, n);
    }
    c->current = static_cast<int>(v);
  }
  ze_device_properties_t props = {};
  props.stype = ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES;
  api.zeDeviceGetProperties(c->devices[static_cast<size_t>(c->current)], &props);
  ze_api_version_t ver = ZE_API_VERSION_1_0;
  api.zeDriverGetApiVersion(c->driver, &ver);
  logLine(c.get(), TUTTI_PLUGIN_LOG_INFO,
          "Level Zero backend: %d device(s), API %u.%u, device %d is %s (fp64 %s)", n,
          ZE_MAJOR_VERSION(ver), ZE_MINOR_VERSION(ver), c->current, props.name,
          c->fp64[static_cast<size_t>(c->current)] ? "yes" : "no");
  *ctx = c.release();
  return ncclSuccess;
}

ncclResult_t plFinalize(void* ctx) {
  Context* c = ctxOf(ctx);
  if (c == nullptr) return ncclSuccess;
  const ZeApi& api = c->api;
  {
    // No queue may wait on a host event forever.
    std::lock_guard<std::mutex> lk(c->eventMu);
    for (Event* e : c->hostEvents) api.zeEventHostSignal(e->ev);
  }
  for (Queue* q : c->defaults) {
    if (q != nullptr) {
      std::lock_guard<std::mutex> lk(q->mu);
      syncLocked(q);
    }
    destroyQueue(q);
  }
  reapRetiredQueues(c, true);
  {
    std::lock_guard<std::mutex> lk(c->eventMu);
    c->releasedHost.insert(c->releasedHost.end(), c->hostEvents.begin(), c->hostEvents.end());
    c->hostEvents.clear();
  }
  reapReleasedHostEvents(c, true);
  {
    std::lock_guard<std::mutex> lk(c->ipcMu);
    for (auto& kv : c->imports) api.zeMemCloseIpcHandle(c->context, kv.second.base);
  }
  for (size_t i = 0; i < c->devices.size(); ++i) {
    DeviceModule& m = c->modules[i];
    for (auto& kv : m.kernels) api.zeKernelDestroy(kv.second);
    if (m.module != nullptr) api.zeModuleDestroy(m.module);
  }
  for (ze_event_pool_handle_t p : c->pools) api.zeEventPoolDestroy(p);
  api.zeContextDestroy(c->context);
  // The loader stays loaded: drivers may keep threads and exit handlers.
  delete c;
  return ncclSuccess;
}

const char* plLastError(void*) { return t_lastError; }

ncclResult_t plDeviceCount(void* ctx, int32_t* count) {
  if (count == nullptr) return fail(ncclInvalidArgument, "deviceCount: NULL");
  *count = ctxOf(ctx) != nullptr ? static_cast<int32_t>(ctxOf(ctx)->devices.size()) : 0;
  return ncclSuccess;
}

ncclResult_t plCurrentDevice(void* ctx, int32_t* device) {
  if (device == nullptr) return fail(ncclInvalidArgument, "currentDevice: NULL");
  *device = ctxOf(ctx) != nullptr ? currentOf(ctxOf(ctx)) : 0;
  return ncclSuccess;
}

ncclResult_t plSetDevice(void* ctx, int32_t device) {
  const Context* c = ctxOf(ctx);
  if (c == nullptr) return fail(ncclInvalidArgument, "setDevice: not initialised");
  if (device < 0 || device >= static_cast<int32_t>(c->devices.size()))
    return fail(ncclInvalidArgument, "setDevice: no device %d (%zu devices)", device,
                c->devices.size());
  t_device = {c->id, device};
  return ncclSuccess;
}

ncclResult_t plDevicePciBusId(void* ctx, int32_t device, char* busId, uint64_t len) {
  const Context* c = ctxOf(ctx);
  if (c == nullptr) return fail(ncclInvalidArgument, "devicePciBusId: not initialised");
  if (device < 0 || device >= static_cast<int32_t>(c->devices.size()))
    return fail(ncclInvalidArgument, "devicePciBusId: no device %d (%zu devices)", device,
                c->devices.size());
  if (busId == nullptr || len == 0)
    return fail(ncclInvalidArgument, "devicePciBusId: no buffer (busId %p, len %llu)",
                static_cast<void*>(busId), static_cast<unsigned long long>(len));
  busId[0] = '\0';
  if (c->pciGetProperties == nullptr) return ncclSuccess;  // unknown
  ze_pci_ext_properties_t p = {};
  p.stype = ZE_STRUCTURE_TYPE_PCI_EXT_PROPERTIES;
  const ze_result_t r = c->pciGetProperties(c->devices[static_cast<size_t>(device)], &p);
  if (r == ZE_RESULT_ERROR_UNSUPPORTED_FEATURE) return ncclSuccess;  // unknown
  if (r != ZE_RESULT_SUCCESS)
    return fail(ncclUnhandledCudaError, "devicePciBusId: zeDevicePciGetPropertiesExt failed: %s",
                zeResultName(r));
  char id[48];  // 4 x 32-bit fields at most
  const int n = snprintf(id, sizeof id, "%04x:%02x:%02x.%x", p.address.domain, p.address.bus,
                         p.address.device, p.address.function);
  if (n < 0 || static_cast<uint64_t>(n) + 1 > len)
    return fail(ncclInvalidArgument, "devicePciBusId: %llu bytes cannot hold '%s'",
                static_cast<unsigned long long>(len), id);
  memcpy(busId, id, static_cast<size_t>(n) + 1);
  return ncclSuccess;
}

// ---- memory ---------------------------------------------------------------------------------

int deviceIndex(const Context* c, ze_device_handle_t d) {
  for (size_t i = 0; i < c->devices.size(); ++i)
    if (c->devices[i] == d) return static_cast<int>(i);
  return -1;
}

ncclResult_t plQueryPointer(void* ctx, const void* ptr, tuttiPluginPointerInfo_v1* info) {
  if (info == nullptr) return fail(ncclInvalidArgument, "queryPointer: info is NULL");
  Context* c = ctxOf(ctx);
  auto fits = [info](size_t end) { return info->structSize >= end; };
  int32_t type = TUTTI_PLUGIN_MEM_UNKNOWN;
  int32_t device = -1;
  void* base = nullptr;
  uint64_t size = 0;
  if (c != nullptr && ptr != nullptr) {
    ze_memory_allocation_properties_t p = {};
    p.stype = ZE_STRUCTURE_TYPE_MEMORY_ALLOCATION_PROPERTIES;
    ze_device_handle_t dev = nullptr;
    if (c->api.zeMemGetAllocProperties(c->context, ptr, &p, &dev) == ZE_RESULT_SUCCESS) {
      switch (p.type) {
        case ZE_MEMORY_TYPE_DEVICE:
          type = TUTTI_PLUGIN_MEM_DEVICE;
          device = deviceIndex(c, dev);
          break;
        case ZE_MEMORY_TYPE_SHARED:
          type = TUTTI_PLUGIN_MEM_MANAGED;
          device = dev != nullptr ? deviceIndex(c, dev) : -1;
          break;
        case ZE_MEMORY_TYPE_HOST:
          type = TUTTI_PLUGIN_MEM_HOST_PINNED;
          break;
        default:
          break;
      }
      size_t s = 0;
      if (type != TUTTI_PLUGIN_MEM_UNKNOWN &&
          c->api.zeMemGetAddressRange(c->context, ptr, &base, &s) == ZE_RESULT_SUCCESS) {
        size = s;
      } else {
        base = nullptr;
      }
    }
  }
  if (fits(offsetof(tuttiPluginPointerInfo_v1, memoryType) + sizeof(int32_t)))
    info->memoryType = type;
  if (fits(offsetof(tuttiPluginPointerInfo_v1, device) + sizeof(int32_t))) info->device = device;
  if (fits(offsetof(tuttiPluginPointerInfo_v1, reserved0) + sizeof(int32_t))) info->reserved0 = 0;
  if (fits(offsetof(tuttiPluginPointerInfo_v1, base) + sizeof(void*))) info->base = base;
  if (fits(offsetof(tuttiPluginPointerInfo_v1, size) + sizeof(uint64_t))) info->size = size;
  return ncclSuccess;
}

ncclResult_t plMemAlloc(void* ctx, int32_t device, uint64_t size, void** ptr) {
  Context* c = ctxOf(ctx);
  if (ptr == nullptr || c == nullptr) return fail(ncclInvalidArgument, "memAlloc: NULL");
  *ptr = nullptr;
  if (size == 0) return ncclSuccess;
  if (device < 0 || device >= static_cast<int32_t>(c->devices.size()))
    return fail(ncclInvalidArgument, "memAlloc: no device %d", device);
  ze_device_mem_alloc_desc_t d = {};
  d.stype = ZE_STRUCTURE_TYPE_DEVICE_MEM_ALLOC_DESC;
  d.ordinal = 0;
  const ze_result_t r = c->api.zeMemAllocDevice(c->context, &d, size, 256,
                                                c->devices[static_cast<size_t>(device)], ptr);
  if (r != ZE_RESULT_SUCCESS) {
    *ptr = nullptr;
    return zeFail(r, "zeMemAllocDevice");
  }
  return ncclSuccess;
}

ncclResult_t plMemFree(void* ctx, void* ptr) {
  if (ptr == nullptr) return ncclSuccess;
  Context* c = ctxOf(ctx);
  if (c == nullptr) return fail(ncclInvalidArgument, "memFree: not initialised");
  TUTTI_ZE_TRY(c->api.zeMemFree(c->context, ptr), "zeMemFree");
  return ncclSuccess;
}

ncclResult_t plHostAlloc(void* ctx, uint64_t size, void** ptr) {
  Context* c = ctxOf(ctx);
  if (ptr == nullptr || c == nullptr) return fail(ncclInvalidArgument, "hostAlloc: NULL");
  *ptr = nullptr;
  if (size == 0) return ncclSuccess;
  ze_host_mem_alloc_desc_t d = {};
  d.stype = ZE_STRUCTURE_TYPE_HOST_MEM_ALLOC_DESC;
  const ze_result_t r = c->api.zeMemAllocHost(c->context, &d, size, 4096, ptr);
  if (r != ZE_RESULT_SUCCESS) {
    *ptr = nullptr;
    return zeFail(r, "zeMemAllocHost");
  }
  return ncclSuccess;
}

ncclResult_t plHostFree(void* ctx, void* ptr) { return plMemFree(ctx, ptr); }

bool knownToZe(Context* c, const void* p) {
  ze_memory_allocation_properties_t props = {};
  props.stype = ZE_STRUCTURE_TYPE_MEMORY_ALLOCATION_PROPERTIES;
  ze_device_handle_t dev = nullptr;
  return c->api.zeMemGetAllocProperties(c->context, p, &props, &dev) == ZE_RESULT_SUCCESS &&
         props.type != ZE_MEMORY_TYPE_UNKNOWN;
}

ncclResult_t plMemcpyAsync(void* ctx, void* dst, const void* src, uint64_t bytes,
                           tuttiPluginQueue_t queue) {
  if (bytes == 0) return ncclSuccess;
  if (dst == nullptr || src == nullptr) return fail(ncclInvalidArgument, "memcpyAsync: NULL");
  Context* c = ctxOf(ctx);
  Queue* q = nullptr;
  const ncclResult_t rc = queueOf(c, queue, &q);
  if (rc != ncclSuccess) return rc;
  // Pageable host memory: the copy completes before returning (the caller may
  // reuse or free it at once, as with cudaMemcpyAsync from pageable memory).
  const bool pageable = !knownToZe(c, src) || !knownToZe(c, dst);
  std::lock_guard<std::mutex> lk(q->mu);
  TUTTI_ZE_TRY(c->api.zeCommandListAppendMemoryCopy(q->list, dst, src, bytes, nullptr, 0, nullptr),
               "zeCommandListAppendMemoryCopy");
  const ncclResult_t b = appendBarrier(q);
  if (b != ncclSuccess || !pageable) return b;
  return syncLocked(q);
}

// ---- queues and events ---------------------------------------------------------------------

ncclResult_t plQueueCreate(void* ctx, int32_t device, tuttiPluginQueue_t* queue) {
  Context* c = ctxOf(ctx);
  if (queue == nullptr || c == nullptr) return fail(ncclInvalidArgument, "queueCreate: NULL");
  reapRetiredQueues(c, false);
  Queue* q = nullptr;
  const ncclResult_t rc = makeQueue(c, device, &q);
  if (rc != ncclSuccess) return rc;
  *queue = reinterpret_cast<tuttiPluginQueue_t>(q);
  return ncclSuccess;
}

ncclResult_t plQueueDestroy(void*, tuttiPluginQueue_t queue) {
  if (queue == nullptr) return ncclSuccess;
  Queue* q = reinterpret_cast<Queue*>(queue);
  Context* c = q->ctx;
  reapRetiredQueues(c, false);
  // Immediate command lists must be idle when destroyed, and the ABI lets the
  // queue's work finish without waiting for it (it may wait on a host event):
  // a busy queue is destroyed once its work has completed.
  bool idle = false;
  {
    std::lock_guard<std::mutex> lk(q->mu);
    const ncclResult_t rc = markLocked(q);
    if (rc != ncclSuccess) return rc;
    idle = c->api.zeEventQueryStatus(q->syncEvent) == ZE_RESULT_SUCCESS;
  }
  if (idle) {
    destroyQueue(q);
    return ncclSuccess;
  }
  std::lock_guard<std::mutex> lk(c->retiredMu);
  try {
    c->retiredQueues.push_back(q);
  } catch (const std::bad_alloc&) {
    return fail(ncclSystemError, "queueDestroy: out of memory");
  }
  return ncclSuccess;
}

ncclResult_t plQueueSynchronize(void* ctx, tuttiPluginQueue_t queue) {
  Queue* q = nullptr;
  const ncclResult_t rc = queueOf(ctxOf(ctx), queue, &q);
  if (rc != ncclSuccess) return rc;
  std::lock_guard<std::mutex> lk(q->mu);
  return syncLocked(q);
}

// eventCreate and hostEventCreate (`what` names the call).
ncclResult_t newEvent(Context* c, int32_t device, bool host, tuttiPluginEvent_t* event,
                      const char* what) {
  if (event == nullptr || c == nullptr) return fail(ncclInvalidArgument, "%s: NULL", what);
  if (device < 0 || device >= static_cast<int32_t>(c->devices.size()))
    return fail(ncclInvalidArgument, "%s: no device %d", what, device);
  std::unique_ptr<Event> e(new (std::nothrow) Event);
  if (!e) return fail(ncclSystemError, "%s: out of memory", what);
  ncclResult_t rc = takeEvent(c, &e->ev, &e->slot);
  if (rc != ncclSuccess) return rc;
  if (host) {
    e->host = true;
    e->recorded = true;  // waits, queries and synchronisation look at the event itself
    const ze_result_t r = c->api.zeEventHostReset(e->ev);  // a reused slot may be signalled
    if (r != ZE_RESULT_SUCCESS) {
      rc = zeFail(r, "zeEventHostReset");
    } else {
      std::lock_guard<std::mutex> lk(c->eventMu);
      try {
        c->hostEvents.insert(e.get());
      } catch (const std::bad_alloc&) {
        rc = fail(ncclSystemError, "%s: out of memory", what);
      }
    }
    if (rc != ncclSuccess) {
      giveEvent(c, e->ev, e->slot);
      return rc;
    }
  }
  *event = reinterpret_cast<tuttiPluginEvent_t>(e.release());
  return ncclSuccess;
}

ncclResult_t plEventCreate(void* ctx, int32_t device, tuttiPluginEvent_t* event) {
  return newEvent(ctxOf(ctx), device, false, event, "eventCreate");
}

ncclResult_t plHostEventCreate(void* ctx, int32_t device, tuttiPluginEvent_t* event) {
  Context* c = ctxOf(ctx);
  if (c != nullptr) reapReleasedHostEvents(c, false);
  return newEvent(c, device, true, event, "hostEventCreate");
}

ncclResult_t plHostEventSignal(void* ctx, tuttiPluginEvent_t event) {
  Context* c = ctxOf(ctx);
  if (c == nullptr || event == nullptr) return fail(ncclInvalidArgument, "hostEventSignal: NULL");
  Event* e = reinterpret_cast<Event*>(event);
  if (!e->host) return fail(ncclInvalidArgument, "hostEventSignal: not a host event");
  TUTTI_ZE_TRY(c->api.zeEventHostSignal(e->ev), "zeEventHostSignal");
  return ncclSuccess;
}

ncclResult_t plEventDestroy(void* ctx, tuttiPluginEvent_t event) {
  if (event == nullptr) return ncclSuccess;
  Context* c = ctxOf(ctx);
  Event* e = reinterpret_cast<Event*>(event);
  if (e->host) {
    // Release a waiting queue; free the event once no queue can still read it.
    c->api.zeEventHostSignal(e->ev);
    {
      std::lock_guard<std::mutex> lk(c->eventMu);
      c->hostEvents.erase(e);
      try {
        c->releasedHost.push_back(e);
      } catch (const std::bad_alloc&) {
        return fail(ncclSystemError, "eventDestroy: out of memory");
      }
    }
    reapReleasedHostEvents(c, false);
    return ncclSuccess;
  }
  // "Pending records complete normally": let a pending signal land before the
  // event's slot can be reused.
  if (e->recorded) c->api.zeEventHostSynchronize(e->ev, UINT64_MAX);
  giveEvent(c, e->ev, e->slot);
  delete e;
  return ncclSuccess;
}

ncclResult_t plEventRecord(void* ctx, tuttiPluginEvent_t event, tuttiPluginQueue_t queue) {
  if (event == nullptr) return fail(ncclInvalidArgument, "eventRecord: NULL event");
  Event* e = reinterpret_cast<Event*>(event);
  if (e->host)
    return fail(ncclInvalidArgument,
                "eventRecord: a host event is completed by hostEventSignal, not by a queue");
  Context* c = ctxOf(ctx);
  Queue* q = nullptr;
  const ncclResult_t rc = queueOf(c, queue, &q);
  if (rc != ncclSuccess) return rc;
  std::lock_guard<std::mutex> lk(q->mu);
  TUTTI_ZE_TRY(c->api.zeCommandListAppendEventReset(q->list, e->ev),
               "zeCommandListAppendEventReset");
  TUTTI_ZE_TRY(c->api.zeCommandListAppendSignalEvent(q->list, e->ev),
               "zeCommandListAppendSignalEvent");
  e->recorded = true;
  return ncclSuccess;
}

// eventWait on a host event: a barrier on q that waits for it and then
// signals a passed event of its own (see the contract).
ncclResult_t waitForHostEvent(Context* c, Queue* q, Event* e) {
  const ZeApi& api = c->api;
  if (api.zeEventQueryStatus(e->ev) == ZE_RESULT_SUCCESS) return ncclSuccess;  // signalled
  std::pair<ze_event_handle_t, int> pass{nullptr, -1};  // the passed event and its slot
  const ncclResult_t rc = takeEvent(c, &pass.first, &pass.second);
  if (rc != ncclSuccess) return rc;
  // Tracked before the barrier exists, so a failure cannot leave it untracked.
  bool tracked = false;
  {
    std::lock_guard<std::mutex> lk(c->eventMu);
    try {
      e->passes.push_back(pass);
      tracked = true;
    } catch (const std::bad_alloc&) {
    }
  }
  ze_result_t r = tracked ? api.zeEventHostReset(pass.first) : ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
  if (r == ZE_RESULT_SUCCESS) {
    std::lock_guard<std::mutex> lk(q->mu);
    r = api.zeCommandListAppendBarrier(q->list, pass.first, 1, &e->ev);
  }
  if (r == ZE_RESULT_SUCCESS) return ncclSuccess;
  if (tracked) {
    std::lock_guard<std::mutex> lk(c->eventMu);
    for (auto it = e->passes.begin(); it != e->passes.end(); ++it)
      if (*it == pass) {
        e->passes.erase(it);
        break;
      }
  }
  giveEvent(c, pass.first, pass.second);
  return zeFail(r, "eventWait on a host event");
}

ncclResult_t plEventWait(void* ctx, tuttiPluginQueue_t queue, tuttiPluginEvent_t event) {
  if (event == nullptr) return fail(ncclInvalidArgument, "eventWait: NULL event");
  Event* e = reinterpret_cast<Event*>(event);
  if (!e->recorded) return ncclSuccess;
  Context* c = ctxOf(ctx);
  Queue* q = nullptr;
  const ncclResult_t rc = queueOf(c, queue, &q);
  if (rc != ncclSuccess) return rc;
  if (e->host) return waitForHostEvent(c, q, e);
  std::lock_guard<std::mutex> lk(q->mu);
  TUTTI_ZE_TRY(c->api.zeCommandListAppendWaitOnEvents(q->list, 1, &e->ev),
               "zeCommandListAppendWaitOnEvents");
  return ncclSuccess;
}

ncclResult_t plEventQuery(void* ctx, tuttiPluginEvent_t event, int32_t* done) {
  if (event == nullptr || done == nullptr) return fail(ncclInvalidArgument, "eventQuery: NULL");
  Event* e = reinterpret_cast<Event*>(event);
  if (!e->recorded) {
    *done = 1;
    return ncclSuccess;
  }
  const ze_result_t r = ctxOf(ctx)->api.zeEventQueryStatus(e->ev);
  if (r == ZE_RESULT_SUCCESS || r == ZE_RESULT_NOT_READY) {
    *done = r == ZE_RESULT_SUCCESS ? 1 : 0;
    return ncclSuccess;
  }
  return zeFail(r, "zeEventQueryStatus");
}

ncclResult_t plEventSynchronize(void* ctx, tuttiPluginEvent_t event) {
  if (event == nullptr) return fail(ncclInvalidArgument, "eventSynchronize: NULL");
  Event* e = reinterpret_cast<Event*>(event);
  if (!e->recorded) return ncclSuccess;
  TUTTI_ZE_TRY(ctxOf(ctx)->api.zeEventHostSynchronize(e->ev, UINT64_MAX), "zeEventHostSynchronize");
  return ncclSuccess;
}

// ---- IPC -------------------------------------------------------------------------------------

ncclResult_t plIpcExport(void* ctx, void* ptr, uint64_t, const int32_t*, int32_t,
                         tuttiPluginIpcHandle_v1* handle) {
  Context* c = ctxOf(ctx);
  if (c == nullptr || ptr == nullptr || handle == nullptr)
    return fail(ncclInvalidArgument, "ipcExport: NULL");
  if (handle->structSize < sizeof(tuttiPluginIpcHandle_v1))
    return fail(ncclInvalidArgument, "ipcExport: handle structSize %u too small",
                handle->structSize);
  void* base = nullptr;
  size_t size = 0;
  if (!knownToZe(c, ptr) ||
      c->api.zeMemGetAddressRange(c->context, ptr, &base, &size) != ZE_RESULT_SUCCESS)
    return fail(ncclInvalidArgument, "ipcExport: %p is not Level Zero memory", ptr);
  ze_ipc_mem_handle_t h;
  memset(&h, 0, sizeof h);
  TUTTI_ZE_TRY(c->api.zeMemGetIpcHandle(c->context, base, &h), "zeMemGetIpcHandle");
  int fd = -1;
  memcpy(&fd, h.data, sizeof fd);
  const int dupFd = fd >= 0 ? dup(fd) : -1;
  if (dupFd < 0)
    return fail(ncclSystemError, "ipcExport: the IPC handle holds no usable file descriptor (%d)",
                fd);
  memset(handle->data, 0, sizeof handle->data);
  memcpy(handle->data, &h, sizeof h);
  handle->dataSize = sizeof h;
  handle->fd = dupFd;
  handle->reserved0 = 0;
  handle->offset = static_cast<uint64_t>(static_cast<char*>(ptr) - static_cast<char*>(base));
  return ncclSuccess;
}

ncclResult_t plIpcImport(void* ctx, int32_t device, const tuttiPluginIpcHandle_v1* handle,
                         void** ptr) {
  Context* c = ctxOf(ctx);
  if (c == nullptr || handle == nullptr || ptr == nullptr)
    return fail(ncclInvalidArgument, "ipcImport: NULL");
  if (handle->dataSize != sizeof(ze_ipc_mem_handle_t) || handle->fd < 0)
    return fail(ncclInvalidArgument,
                "ipcImport: handle holds %u bytes and fd %d, not a Level Zero IPC handle",
                handle->dataSize, handle->fd);
  if (device < 0 || device >= static_cast<int32_t>(c->devices.size()))
    return fail(ncclInvalidArgument, "ipcImport: no device %d", device);
  // The exporter's bytes (its fd number included) identify the allocation.
  std::string key(reinterpret_cast<const char*>(handle->data), sizeof(ze_ipc_mem_handle_t));
  key.append(reinterpret_cast<const char*>(&device), sizeof device);
  std::lock_guard<std::mutex> lk(c->ipcMu);
  auto it = c->imports.find(key);
  if (it == c->imports.end()) {
    ze_ipc_mem_handle_t h;
    memcpy(&h, handle->data, sizeof h);
    const int fd = dup(handle->fd);  // tutti closes handle->fd after the call
    if (fd < 0) return fail(ncclSystemError, "ipcImport: dup(%d) failed", handle->fd);
    memcpy(h.data, &fd, sizeof fd);
    void* base = nullptr;
    const ze_result_t r =
        c->api.zeMemOpenIpcHandle(c->context, c->devices[static_cast<size_t>(device)], h, 0, &base);
    if (r != ZE_RESULT_SUCCESS) {
      close(fd);
      return zeFail(r, "zeMemOpenIpcHandle");
    }
    it = c->imports.emplace(key, Context::Mapping{base, 0}).first;
  }
  ++it->second.refs;
  *ptr = static_cast<char*>(it->second.base) + handle->offset;
  c->importedPtrs.emplace(*ptr, key);
  return ncclSuccess;
}

ncclResult_t plIpcClose(void* ctx, void* ptr) {
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
  TUTTI_ZE_TRY(c->api.zeMemCloseIpcHandle(c->context, base), "zeMemCloseIpcHandle");
  return ncclSuccess;
}

// ---- kernels -----------------------------------------------------------------------------------

// Builds the device's module (the fp64 SPIR-V when the device has fp64) and
// creates every kernel in it. Once per device; failures are remembered.
void loadModule(Context* c, int device) {
  DeviceModule& m = c->modules[static_cast<size_t>(device)];
  const ZeApi& api = c->api;
  m.fp64 = c->fp64[static_cast<size_t>(device)];
  ze_module_desc_t md = {};
  md.stype = ZE_STRUCTURE_TYPE_MODULE_DESC;
  md.format = ZE_MODULE_FORMAT_IL_SPIRV;
  md.inputSize = m.fp64 ? kSpirvFp64Size : kSpirvNoFp64Size;
  md.pInputModule = m.fp64 ? kSpirvFp64 : kSpirvNoFp64;
  md.pBuildFlags = "";
  ze_module_build_log_handle_t log = nullptr;
  const ze_result_t r =
      api.zeModuleCreate(c->context, c->devices[static_cast<size_t>(device)], &md, &m.module, &log);
  if (r != ZE_RESULT_SUCCESS) {
    std::string text;
    size_t n = 0;
    if (log != nullptr && api.zeModuleBuildLogGetString(log, &n, nullptr) == ZE_RESULT_SUCCESS &&
        n > 0) {
      text.resize(n);
      api.zeModuleBuildLogGetString(log, &n, &text[0]);
      text.resize(strlen(text.c_str()));
    }
    m.error = std::string("zeModuleCreate: ") + zeResultName(r) + (text.empty() ? "" : ": ") +
              text.substr(0, 300);
    m.module = nullptr;
  }
  if (log != nullptr) api.zeModuleBuildLogDestroy(log);
  if (m.module == nullptr) {
    logLine(c, TUTTI_PLUGIN_LOG_WARN,
            "Level Zero device %d: kernels unavailable, tutti runs them on the host (%s)", device,
            m.error.c_str());
    return;
  }
  for (int i = 0; i < kNumKernels; ++i) {
    bool fp64Only = false;
    const char* name = kernelName(i, &fp64Only);
    if (fp64Only && !m.fp64) continue;
    ze_kernel_desc_t kd = {};
    kd.stype = ZE_STRUCTURE_TYPE_KERNEL_DESC;
    kd.pKernelName = name;
    ze_kernel_handle_t k = nullptr;
    const ze_result_t kr = api.zeKernelCreate(m.module, &kd, &k);
    if (kr != ZE_RESULT_SUCCESS) {
      m.error = std::string("zeKernelCreate(") + name + "): " + zeResultName(kr);
      logLine(c, TUTTI_PLUGIN_LOG_WARN, "Level Zero device %d: %s", device, m.error.c_str());
      return;
    }
    m.kernels[name] = k;
  }
  m.ok = true;
  logLine(c, TUTTI_PLUGIN_LOG_INFO, "Level Zero device %d: kernels loaded (%s SPIR-V)", device,
          m.fp64 ? "fp64" : "no-fp64");
}

DeviceModule* moduleFor(Context* c, int device) {
  DeviceModule& m = c->modules[static_cast<size_t>(device)];
  std::call_once(m.once, [c, device] { loadModule(c, device); });
  return &m;
}

// Runs a plan on a queue: its launches, each followed by a barrier.
ncclResult_t runPlan(Context* c, Queue* q, DeviceModule* m, const Plan& plan) {
  const ZeApi& api = c->api;
  std::lock_guard<std::mutex> ql(q->mu);
  std::lock_guard<std::mutex> kl(m->launchMu);
  for (int li = 0; li < plan.nLaunches; ++li) {
    const Launch& l = plan.launches[li];
    auto it = m->kernels.find(l.kernel);
    if (it == m->kernels.end())
      return fail(ncclInvalidArgument, "kernel %s is not in this device's module", l.kernel);
    ze_kernel_handle_t k = it->second;
    TUTTI_ZE_TRY(api.zeKernelSetGroupSize(k, l.groupSize[0], l.dims > 1 ? l.groupSize[1] : 1, 1),
                 "zeKernelSetGroupSize");
    for (int a = 0; a < l.nArgs; ++a) {
      const KernelArg& arg = l.args[a];
      void* p = reinterpret_cast<void*>(static_cast<uintptr_t>(arg.value));
      uint64_t v = arg.value;
      const void* value = arg.pointer ? static_cast<const void*>(&p) : static_cast<const void*>(&v);
      TUTTI_ZE_TRY(api.zeKernelSetArgumentValue(k, static_cast<uint32_t>(a), arg.size, value),
                   "zeKernelSetArgumentValue");
    }
    ze_group_count_t g;
    g.groupCountX = l.groupCount[0];
    g.groupCountY = l.dims > 1 ? l.groupCount[1] : 1;
    g.groupCountZ = 1;
    TUTTI_ZE_TRY(api.zeCommandListAppendLaunchKernel(q->list, k, &g, nullptr, 0, nullptr),
                 "zeCommandListAppendLaunchKernel");
    const ncclResult_t b = appendBarrier(q);
    if (b != ncclSuccess) return b;
  }
  return ncclSuccess;
}

// The queue and module for a kernel call; ncclInvalidArgument (host fallback)
// when the device has no usable module.
ncclResult_t kernelTarget(void* ctx, tuttiPluginQueue_t queue, Queue** q, DeviceModule** m) {
  Context* c = ctxOf(ctx);
  const ncclResult_t rc = queueOf(c, queue, q);
  if (rc != ncclSuccess) return rc;
  *m = moduleFor(c, (*q)->device);
  if (!(*m)->ok)
    return fail(ncclInvalidArgument, "Level Zero kernels unavailable on device %d: %s",
                (*q)->device, (*m)->error.c_str());
  return ncclSuccess;
}

ncclResult_t plReduce(void* ctx, const tuttiPluginReduceArgs_v1* a, tuttiPluginQueue_t queue) {
  Queue* q = nullptr;
  DeviceModule* m = nullptr;
  const ncclResult_t rc = kernelTarget(ctx, queue, &q, &m);
  if (rc != ncclSuccess) return rc;
  Plan plan;
  char why[256] = "";
  const ncclResult_t prc = planReduce(a, m->fp64, &plan, why, sizeof why);
  if (prc != ncclSuccess) return fail(prc, "%s", why);
  return runPlan(ctxOf(ctx), q, m, plan);
}

ncclResult_t plCastScaled(void* ctx, void* dst, int32_t dstType, const void* src, int32_t srcType,
                          uint64_t count, float scale, tuttiPluginQueue_t queue) {
  Queue* q = nullptr;
  DeviceModule* m = nullptr;
  const ncclResult_t rc = kernelTarget(ctx, queue, &q, &m);
  if (rc != ncclSuccess) return rc;
  Plan plan;
  char why[256] = "";
  const ncclResult_t prc =
      planCastScaled(dst, dstType, src, srcType, count, scale, &plan, why, sizeof why);
  if (prc != ncclSuccess) return fail(prc, "%s", why);
  return runPlan(ctxOf(ctx), q, m, plan);
}

ncclResult_t plPack1bit(void* ctx, const float* src, float* error, void* wire, uint64_t count,
                        tuttiPluginQueue_t queue) {
  Queue* q = nullptr;
  DeviceModule* m = nullptr;
  const ncclResult_t rc = kernelTarget(ctx, queue, &q, &m);
  if (rc != ncclSuccess) return rc;
  Plan plan;
  char why[256] = "";
  const ncclResult_t prc = planPack1bit(src, error, wire, count, m->fp64, &plan, why, sizeof why);
  if (prc != ncclSuccess) return fail(prc, "%s", why);
  return runPlan(ctxOf(ctx), q, m, plan);
}

ncclResult_t plUnpack1bit(void* ctx, float* dst, const void* wire, uint64_t count,
                          int32_t accumulate, tuttiPluginQueue_t queue) {
  Queue* q = nullptr;
  DeviceModule* m = nullptr;
  const ncclResult_t rc = kernelTarget(ctx, queue, &q, &m);
  if (rc != ncclSuccess) return rc;
  Plan plan;
  char why[256] = "";
  const ncclResult_t prc = planUnpack1bit(dst, wire, count, accumulate, &plan, why, sizeof why);
  if (prc != ncclSuccess) return fail(prc, "%s", why);
  return runPlan(ctxOf(ctx), q, m, plan);
}

ncclResult_t plGemm(void* ctx, int32_t transA, int32_t transB, int64_t m, int64_t n, int64_t k,
                    float alpha, const float* A, int64_t lda, const float* B, int64_t ldb,
                    float beta, float* C, int64_t ldc, tuttiPluginQueue_t queue) {
  Queue* q = nullptr;
  DeviceModule* mod = nullptr;
  const ncclResult_t rc = kernelTarget(ctx, queue, &q, &mod);
  if (rc != ncclSuccess) return rc;
  Plan plan;
  char why[256] = "";
  const ncclResult_t prc = planGemm(transA, transB, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc,
                                    mod->fp64, &plan, why, sizeof why);
  if (prc != ncclSuccess) return fail(prc, "%s", why);
  return runPlan(ctxOf(ctx), q, mod, plan);
}

tuttiBackendPlugin_v1 makeTable() {
  tuttiBackendPlugin_v1 t;
  memset(&t, 0, sizeof t);
  t.abiVersion = TUTTI_BACKEND_PLUGIN_ABI_VERSION;
  t.structSize = sizeof(tuttiBackendPlugin_v1);
  t.name = "ze";
  t.capabilities = TUTTI_PLUGIN_CAP_HOST_MAPPED | TUTTI_PLUGIN_CAP_IPC_NEEDS_FD;
  t.init = plInit;
  t.finalize = plFinalize;
  t.lastError = plLastError;
  t.deviceCount = plDeviceCount;
  t.currentDevice = plCurrentDevice;
  t.queryPointer = plQueryPointer;
  t.memAlloc = plMemAlloc;
  t.memFree = plMemFree;
  t.hostAlloc = plHostAlloc;
  t.hostFree = plHostFree;
  t.memcpyAsync = plMemcpyAsync;
  t.queueCreate = plQueueCreate;
  t.queueDestroy = plQueueDestroy;
  t.queueSynchronize = plQueueSynchronize;
  t.eventCreate = plEventCreate;
  t.eventDestroy = plEventDestroy;
  t.eventRecord = plEventRecord;
  t.eventWait = plEventWait;
  t.eventQuery = plEventQuery;
  t.eventSynchronize = plEventSynchronize;
  t.ipcExport = plIpcExport;
  t.ipcImport = plIpcImport;
  t.ipcClose = plIpcClose;
  t.reduce = plReduce;
  t.castScaled = plCastScaled;
  t.pack1bit = plPack1bit;
  t.unpack1bit = plUnpack1bit;
  t.gemm = plGemm;
  t.orthogonalize = nullptr;  // host fallback
  t.setDevice = plSetDevice;
  t.hostEventCreate = plHostEventCreate;
  t.hostEventSignal = plHostEventSignal;
  t.devicePciBusId = plDevicePciBusId;
  return t;
}

}  // namespace
}  // namespace tutti_ze

extern "C" TUTTI_PLUGIN_EXPORT const tuttiBackendPlugin_v1* tuttiBackendPluginInit(
    uint32_t hostAbiVersion) {
  if (hostAbiVersion < 1) return nullptr;
  static const tuttiBackendPlugin_v1 table = tutti_ze::makeTable();
  return &table;
}
