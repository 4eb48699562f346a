// xpu_emu: an emulated accelerator, written as a third-party tutti device
// backend plugin (plugin ABI v1, include/tutti/backend_plugin.h). It uses only
// the public headers and exports only tuttiBackendPluginInit.
//
// What it emulates:
// - Devices: XPU_EMU_DEVICES of them (1..8, default 2; 0 emulates a machine
//   without a device: init fails). Each thread's current device is
//   XPU_EMU_DEVICE (default 0, read once at init) until it calls setDevice,
//   which changes it for that thread only (as cudaSetDevice does).
// - Memory the host cannot touch: memAlloc returns a PROT_NONE view of a memfd
//   (emu_memory.h); copies and kernels use a private read/write view.
//   queryPointer: DEVICE inside memAlloc or ipcImport memory, HOST_PINNED
//   inside hostAlloc memory, UNKNOWN elsewhere.
// - Queues: one worker thread each, FIFO (emu_queue.h). The NULL queue is the
//   default queue of the calling thread's current device, created on first
//   use; queueCreate'd queues do not synchronise with it.
// - Host events (hostEventCreate/hostEventSignal): eventWait on one enqueues
//   a command that blocks that queue's worker (a condition variable) until
//   the host signals, so later work on the queue runs only after the signal
//   and the caller returns at once. queueDestroy does not wait: a destroyed
//   queue's remaining work runs once its host events are signalled.
//   eventDestroy signals a host event that is not signalled yet (the waiting
//   queue goes on), and finalize signals every host event still alive before
//   it joins the workers, so neither hangs.
// - launchHostFunc: a command that calls fn on the queue's worker thread.
// - memcpyAsync: any mix of device, pinned and pageable memory. A pageable
//   SOURCE is read before the call returns: up to kStageLimit bytes are copied
//   into a temporary buffer (the call stays asynchronous), larger ones are
//   copied by the queue while the call waits for that copy. A pageable
//   DESTINATION is written when the command runs.
// - Kernels (emu_kernels.h) accept device memory (own or imported) and pinned
//   host memory (TUTTI_PLUGIN_CAP_HOST_MAPPED); pageable memory is
//   ncclInvalidArgument (tutti then uses its host fallback). Pointers are
//   checked and translated when the work is enqueued; a PREMULSUM scalar with
//   ncclScalarDevice residence is read when the kernel runs.
// - IPC (TUTTI_PLUGIN_CAP_IPC_NEEDS_FD): the handle carries a dup of the
//   allocation's memfd (format in emu_memory.cc); importerPids are not needed.
// - PCI bus ids (devicePciBusId): XPU_EMU_PCI_BUS_IDS, read once at init, is
//   a comma-separated list whose i-th entry is device i's bus id, e.g.
//   "0000:17:00.0,0000:65:00.0" (at most XPU_EMU_DEVICES entries; an empty
//   entry, a missing one or the variable unset: "" for that device, address
//   unknown). Entries are hex digits, ':' and '.' only, as hwloc writes them;
//   anything else fails init with ncclInvalidArgument naming the variable.
//   tutti matches them against its topology (TUTTI_TOPO_FILE in tests) to
//   place the engine thread near the "device".
// - Fault injection, for tests of what tutti does when IPC set-up fails on
//   some ranks: with XPU_EMU_FAIL_IPC_EXPORT=K (XPU_EMU_FAIL_IPC_IMPORT=K),
//   every K-th ipcExport (ipcImport) call of the process fails with
//   ncclSystemError; 0 or unset: never.
//
// Errors: every failure sets the thread's lastError; C++ exceptions are caught
// at this boundary (bad_alloc, thread creation) and become ncclSystemError.
// Nothing prints; init/finalize log through the host callback. finalize drains
// and joins every queue worker and unmaps all memory.
#include <sys/mman.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <system_error>
#include <vector>

#include "emu_common.h"
#include "emu_kernels.h"
#include "emu_memory.h"
#include "emu_queue.h"
#include "nccl.h"
#include "tutti/backend_plugin.h"

namespace xpu_emu {

// ---- errors ----------------------------------------------------------------------------

namespace {
thread_local std::string t_lastError;
}  // namespace

ncclResult_t setError(ncclResult_t code, const std::string& msg) {
  try {
    t_lastError = "xpu_emu: " + msg;
  } catch (...) {
    t_lastError.clear();
  }
  return code;
}

ncclResult_t setSystemError(const std::string& what) {
  const int err = errno;
  return setError(ncclSystemError, what + ": " + std::strerror(err));
}

const char* lastErrorText() { return t_lastError.c_str(); }

namespace {

constexpr int kMaxDevices = 8;
constexpr uint64_t kStageLimit = 4ull << 20;  // pageable sources up to this are staged

std::atomic<uint64_t> g_contexts{0};  // numbers the contexts init() makes

struct Context {
  void (*log)(int32_t, const char*) = nullptr;
  const uint64_t id = ++g_contexts;  // tells this context's setDevice apart (see currentOf)
  int nDevices = 0;
  int current = 0;                  // every thread's current device until it calls setDevice
  std::vector<std::string> busIds;  // XPU_EMU_PCI_BUS_IDS, per device ("" unknown)
  MemoryRegistry mem;
  // Fault injection (see the top of this file): every failEvery[i]-th call
  // fails, 0 never; calls[i] counts them. [0] ipcExport, [1] ipcImport.
  int failEvery[2] = {0, 0};
  std::atomic<uint64_t> calls[2] = {0, 0};
  // ncclSystemError when this call of `what` (0 export, 1 import) is one to fail.
  ncclResult_t injectedFault(int what) {
    if (failEvery[what] == 0) return ncclSuccess;
    const uint64_t k = calls[what].fetch_add(1) + 1;
    if (k % static_cast<uint64_t>(failEvery[what]) != 0) return ncclSuccess;
    const char* name = what == 0 ? "ipcExport" : "ipcImport";
    return setError(ncclSystemError, std::string(name) + ": injected fault (call " +
                                         std::to_string(k) + ", XPU_EMU_FAIL_IPC_" +
                                         (what == 0 ? "EXPORT" : "IMPORT") + "=" +
                                         std::to_string(failEvery[what]) + ")");
  }

  std::mutex mu;  // guards the maps below
  std::map<Queue*, std::unique_ptr<Queue>> queues;
  std::vector<std::unique_ptr<Queue>> retired;   // destroyed, draining; joined later
  std::vector<std::unique_ptr<Queue>> defaults;  // per device, created on first use
  std::map<Event*, std::shared_ptr<Event>> events;

  void info(const std::string& msg) const {
    if (log) log(TUTTI_PLUGIN_LOG_INFO, ("xpu_emu: " + msg).c_str());
  }
};

// Runs fn, turning escaping exceptions into ncclSystemError.
template <class Fn>
ncclResult_t guarded(const char* what, Fn&& fn) noexcept {
  try {
    return fn();
  } catch (const std::bad_alloc&) {
    return setError(ncclSystemError, std::string(what) + ": out of host memory");
  } catch (const std::exception& e) {
    return setError(ncclSystemError, std::string(what) + ": " + e.what());
  } catch (...) {
    return setError(ncclSystemError, std::string(what) + ": unexpected failure");
  }
}

// The calling thread's setDevice choice, for the context numbered ctxId
// (a later context at the same address does not inherit it).
struct ThreadDevice {
  uint64_t ctxId = 0;
  int device = 0;
};
thread_local ThreadDevice t_device;

int currentOf(const Context* c) { return t_device.ctxId == c->id ? t_device.device : c->current; }

ncclResult_t getContext(void* ctx, const char* what, Context** out) {
  if (ctx == nullptr) return setError(ncclInvalidArgument, std::string(what) + ": ctx is NULL");
  *out = static_cast<Context*>(ctx);
  return ncclSuccess;
}

ncclResult_t checkDevice(const Context* c, int32_t device, const char* what) {
  if (device < 0 || device >= c->nDevices)
    return setError(ncclInvalidArgument, std::string(what) + ": device " + std::to_string(device) +
                                             " does not exist (" + std::to_string(c->nDevices) +
                                             " devices)");
  return ncclSuccess;
}

// Joins queues whose workers have left after queueDestroy. Caller holds c->mu.
void reapRetiredLocked(Context* c) {
  for (size_t i = 0; i < c->retired.size();) {
    if (c->retired[i]->exited()) {
      c->retired[i]->join();
      c->retired.erase(c->retired.begin() + static_cast<std::ptrdiff_t>(i));
    } else {
      ++i;
    }
  }
}

ncclResult_t getQueue(Context* c, tuttiPluginQueue_t handle, const char* what, Queue** out) {
  std::lock_guard<std::mutex> lock(c->mu);
  if (handle == nullptr) {
    const int device = currentOf(c);
    auto& q = c->defaults[static_cast<size_t>(device)];
    if (!q) q = std::make_unique<Queue>(device);
    *out = q.get();
    return ncclSuccess;
  }
  auto it = c->queues.find(reinterpret_cast<Queue*>(handle));
  if (it == c->queues.end())
    return setError(ncclInvalidArgument, std::string(what) + ": unknown queue handle");
  *out = it->second.get();
  return ncclSuccess;
}

ncclResult_t getEvent(Context* c, tuttiPluginEvent_t handle, const char* what,
                      std::shared_ptr<Event>* out) {
  std::lock_guard<std::mutex> lock(c->mu);
  auto it = c->events.find(reinterpret_cast<Event*>(handle));
  if (it == c->events.end())
    return setError(ncclInvalidArgument, std::string(what) + ": unknown event handle");
  *out = it->second;
  return ncclSuccess;
}

// A range a kernel works on: device (own or imported) or pinned host memory.
ncclResult_t kernelSpan(Context* c, const void* ptr, uint64_t bytes, const char* what, char** out) {
  if (ptr == nullptr) return setError(ncclInvalidArgument, std::string(what) + " is NULL");
  Span s;
  ncclResult_t r = c->mem.translate(ptr, bytes, what, &s);
  if (r != ncclSuccess) return r;
  if (s.kind == MemKind::kPageable)
    return setError(ncclInvalidArgument,
                    std::string(what) +
                        " is pageable host memory; xpu_emu kernels address device memory "
                        "and hostAlloc memory only");
  *out = s.addr;
  return ncclSuccess;
}

bool overlaps(const char* a, uint64_t aBytes, const char* b, uint64_t bBytes) {
  return a < b + bBytes && b < a + aBytes;
}

// Multiplies without overflow; false when a * b does not fit.
bool mulFits(uint64_t a, uint64_t b, uint64_t* out) {
  if (a != 0 && b > UINT64_MAX / a) return false;
  *out = a * b;
  return true;
}

// Elements spanned by a row-major rows x cols matrix with row stride ld.
bool matrixBytes(int64_t rows, int64_t cols, int64_t ld, uint64_t* bytes) {
  if (rows == 0 || cols == 0) {
    *bytes = 0;
    return true;
  }
  uint64_t elems = 0;
  if (!mulFits(static_cast<uint64_t>(rows - 1), static_cast<uint64_t>(ld), &elems)) return false;
  elems += static_cast<uint64_t>(cols);
  return mulFits(elems, sizeof(float), bytes);
}

// ---- life cycle ------------------------------------------------------------------------

ncclResult_t parseCountEnv(const char* name, int def, int lo, int hi, int* out) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') {
    *out = def;
    return ncclSuccess;
  }
  char* end = nullptr;
  errno = 0;
  const long n = std::strtol(v, &end, 10);
  if (errno != 0 || end == v || *end != '\0' || n < lo || n > hi)
    return setError(ncclInvalidArgument, std::string(name) + "='" + v + "' is not a number in " +
                                             std::to_string(lo) + ".." + std::to_string(hi));
  *out = static_cast<int>(n);
  return ncclSuccess;
}

// XPU_EMU_PCI_BUS_IDS (see the top of this file) for nDevices devices.
ncclResult_t parseBusIdsEnv(int nDevices, std::vector<std::string>* out) {
  const char* name = "XPU_EMU_PCI_BUS_IDS";
  out->assign(static_cast<size_t>(nDevices), std::string());
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return ncclSuccess;
  const std::string all = v;
  size_t pos = 0;
  for (int i = 0;; ++i) {
    const size_t comma = all.find(',', pos);
    const std::string id =
        all.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    if (i >= nDevices)
      return setError(ncclInvalidArgument, std::string(name) + "='" + all + "' has more than " +
                                               std::to_string(nDevices) + " entries (one per " +
                                               "device, XPU_EMU_DEVICES)");
    if (id.size() >= TUTTI_PLUGIN_PCI_BUS_ID_BYTES ||
        id.find_first_not_of("0123456789abcdefABCDEF:.") != std::string::npos)
      return setError(ncclInvalidArgument, std::string(name) + "='" + all + "': entry " +
                                               std::to_string(i) + " '" + id +
                                               "' is not a PCI bus id such as 0000:17:00.0");
    (*out)[static_cast<size_t>(i)] = id;
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return ncclSuccess;
}

ncclResult_t emuInit(const tuttiBackendHost_v1* host, void** ctx) {
  return guarded("init", [&]() -> ncclResult_t {
    if (ctx == nullptr) return setError(ncclInvalidArgument, "init: ctx is NULL");
    *ctx = nullptr;
    int nDevices = 0, current = 0;
    ncclResult_t r = parseCountEnv("XPU_EMU_DEVICES", 2, 0, kMaxDevices, &nDevices);
    if (r != ncclSuccess) return r;
    if (nDevices == 0) return setError(ncclSystemError, "init: no devices (XPU_EMU_DEVICES=0)");
    r = parseCountEnv("XPU_EMU_DEVICE", 0, 0, nDevices - 1, &current);
    if (r != ncclSuccess) return r;
    int failExport = 0, failImport = 0;
    if ((r = parseCountEnv("XPU_EMU_FAIL_IPC_EXPORT", 0, 0, 1 << 30, &failExport)) != ncclSuccess)
      return r;
    if ((r = parseCountEnv("XPU_EMU_FAIL_IPC_IMPORT", 0, 0, 1 << 30, &failImport)) != ncclSuccess)
      return r;
    std::vector<std::string> busIds;
    if ((r = parseBusIdsEnv(nDevices, &busIds)) != ncclSuccess) return r;
    auto c = std::make_unique<Context>();
    c->busIds = std::move(busIds);
    c->failEvery[0] = failExport;
    c->failEvery[1] = failImport;
    if (host != nullptr &&
        host->structSize >= offsetof(tuttiBackendHost_v1, log) + sizeof(host->log))
      c->log = host->log;
    c->nDevices = nDevices;
    c->current = current;
    c->defaults.resize(static_cast<size_t>(nDevices));
    c->info(std::to_string(nDevices) + " emulated devices, current device " +
            std::to_string(current));
    *ctx = c.release();
    return ncclSuccess;
  });
}

ncclResult_t emuFinalize(void* ctx) {
  Context* c = nullptr;
  ncclResult_t r = getContext(ctx, "finalize", &c);
  if (r != ncclSuccess) return r;
  return guarded("finalize", [&]() -> ncclResult_t {
    // Release every wait on a host event, then drain and join every worker
    // (Queue's destructor), then unmap memory.
    for (auto& kv : c->events) kv.second->signal();
    c->queues.clear();
    c->retired.clear();
    c->defaults.clear();
    c->events.clear();
    c->mem.releaseAll();
    c->info("finalized");
    delete c;
    return ncclSuccess;
  });
}

const char* emuLastError(void*) { return lastErrorText(); }

// ---- devices ---------------------------------------------------------------------------

ncclResult_t emuDeviceCount(void* ctx, int32_t* count) {
  Context* c = nullptr;
  ncclResult_t r = getContext(ctx, "deviceCount", &c);
  if (r != ncclSuccess) return r;
  if (count == nullptr) return setError(ncclInvalidArgument, "deviceCount: count is NULL");
  *count = c->nDevices;
  return ncclSuccess;
}

ncclResult_t emuCurrentDevice(void* ctx, int32_t* device) {
  Context* c = nullptr;
  ncclResult_t r = getContext(ctx, "currentDevice", &c);
  if (r != ncclSuccess) return r;
  if (device == nullptr) return setError(ncclInvalidArgument, "currentDevice: device is NULL");
  *device = currentOf(c);
  return ncclSuccess;
}

ncclResult_t emuSetDevice(void* ctx, int32_t device) {
  Context* c = nullptr;
  ncclResult_t r = getContext(ctx, "setDevice", &c);
  if (r != ncclSuccess) return r;
  if ((r = checkDevice(c, device, "setDevice")) != ncclSuccess) return r;
  t_device = {c->id, device};
  return ncclSuccess;
}

ncclResult_t emuDevicePciBusId(void* ctx, int32_t device, char* busId, uint64_t len) {
  Context* c = nullptr;
  ncclResult_t r = getContext(ctx, "devicePciBusId", &c);
  if (r != ncclSuccess) return r;
  if ((r = checkDevice(c, device, "devicePciBusId")) != ncclSuccess) return r;
  if (busId == nullptr) return setError(ncclInvalidArgument, "devicePciBusId: busId is NULL");
  const std::string& id = c->busIds[static_cast<size_t>(device)];
  if (len < id.size() + 1)
    return setError(ncclInvalidArgument,
                    "devicePciBusId: " + std::to_string(len) + " bytes cannot hold '" + id + "'");
  memcpy(busId, id.c_str(), id.size() + 1);
  return ncclSuccess;
}

// ---- memory ----------------------------------------------------------------------------

ncclResult_t emuQueryPointer(void* ctx, const void* ptr, tuttiPluginPointerInfo_v1* info) {
  Context* c = nullptr;
  ncclResult_t r = getContext(ctx, "queryPointer", &c);
  if (r != ncclSuccess) return r;
  if (info == nullptr) return setError(ncclInvalidArgument, "queryPointer: info is NULL");
  if (info->structSize < sizeof(tuttiPluginPointerInfo_v1))
    return setError(ncclInvalidArgument, "queryPointer: info->structSize " +
                                             std::to_string(info->structSize) + " is too small");
  info->memoryType = TUTTI_PLUGIN_MEM_UNKNOWN;
  info->device = -1;
  info->reserved0 = 0;
  info->base = nullptr;
  info->size = 0;
  Region reg;
  if (ptr == nullptr || !c->mem.find(ptr, &reg)) return ncclSuccess;
  if (reg.kind == MemKind::kHostPinned) {
    info->memoryType = TUTTI_PLUGIN_MEM_HOST_PINNED;
  } else {
    info->memoryType = TUTTI_PLUGIN_MEM_DEVICE;
    info->device = reg.device;
  }
  info->base = reg.user;
  info->size = reg.size;
  return ncclSuccess;
}

ncclResult_t emuMemAlloc(void* ctx, int32_t device, uint64_t size, void** ptr) {
  Context* c = nullptr;
  ncclResult_t r = getContext(ctx, "memAlloc", &c);
  if (r != ncclSuccess) return r;
  if (ptr == nullptr) return setError(ncclInvalidArgument, "memAlloc: ptr is NULL");
  if ((r = checkDevice(c, device, "memAlloc")) != ncclSuccess) return r;
  *ptr = nullptr;
  if (size == 0) return ncclSuccess;
  return c->mem.allocDevice(device, size, ptr);
}

ncclResult_t emuMemFree(void* ctx, void* ptr) {
  Context* c = nullptr;
  ncclResult_t r = getContext(ctx, "memFree", &c);
  if (r != ncclSuccess) return r;
  if (ptr == nullptr) return ncclSuccess;
  return c->mem.freeDevice(ptr);
}

ncclResult_t emuHostAlloc(void* ctx, uint64_t size, void** ptr) {
  Context* c = nullptr;
  ncclResult_t r = getContext(ctx, "hostAlloc", &c);
  if (r != ncclSuccess) return r;
  if (ptr == nullptr) return setError(ncclInvalidArgument, "hostAlloc: ptr is NULL");
  *ptr = nullptr;
  if (size == 0) return ncclSuccess;
  return c->mem.allocHost(size, ptr);
}

ncclResult_t emuHostFree(void* ctx, void* ptr) {
  Context* c = nullptr;
  ncclResult_t r = getContext(ctx, "hostFree", &c);
  if (r != ncclSuccess) return r;
  if (ptr == nullptr) return ncclSuccess;
  return c->mem.freeHost(ptr);
}

ncclResult_t emuMemcpyAsync(void* ctx, void* dst, const void* src, uint64_t bytes,
                            tuttiPluginQueue_t queue) {
  Context* c = nullptr;
  ncclResult_t r = getContext(ctx, "memcpyAsync", &c);
  if (r != ncclSuccess) return r;
  return guarded("memcpyAsync", [&]() -> ncclResult_t {
    Queue* q = nullptr;
    ncclResult_t res = getQueue(c, queue, "memcpyAsync", &q);
    if (res != ncclSuccess) return res;
    if (bytes == 0) return ncclSuccess;
    if (dst == nullptr || src == nullptr)
      return setError(ncclInvalidArgument, "memcpyAsync: NULL pointer with a nonzero size");
    Span d, s;
    if ((res = c->mem.translate(dst, bytes, "memcpyAsync dst", &d)) != ncclSuccess) return res;
    if ((res = c->mem.translate(src, bytes, "memcpyAsync src", &s)) != ncclSuccess) return res;
    char* to = d.addr;
    const size_t n = static_cast<size_t>(bytes);
    if (s.kind == MemKind::kPageable && bytes <= kStageLimit) {
      // Read the pageable source now; the queue copies from the staging buffer.
      std::shared_ptr<char[]> staged(new char[n]);
      std::memcpy(staged.get(), src, n);
      q->submit([to, staged, n] { std::memmove(to, staged.get(), n); });
      return ncclSuccess;
    }
    const char* from = s.addr;
    const uint64_t seq = q->submit([to, from, n] { std::memmove(to, from, n); });
    if (s.kind == MemKind::kPageable) q->waitFor(seq);  // large pageable source: wait for the read
    return ncclSuccess;
  });
}

// ---- queues ----------------------------------------------------------------------------

ncclResult_t emuQueueCreate(void* ctx, int32_t device, tuttiPluginQueue_t* queue) {
  Context* c = nullptr;
  ncclResult_t r = getContext(ctx, "queueCreate", &c);
  if (r != ncclSuccess) return r;
  if (queue == nullptr) return setError(ncclInvalidArgument, "queueCreate: queue is NULL");
  if ((r = checkDevice(c, device, "queueCreate")) != ncclSuccess) return r;
  return guarded("queueCreate", [&]() -> ncclResult_t {
    auto q = std::make_unique<Queue>(device);
    Queue* raw = q.get();
    std::lock_guard<std::mutex> lock(c->mu);
    reapRetiredLocked(c);
    c->queues.emplace(raw, std::move(q));
    *queue = reinterpret_cast<tuttiPluginQueue_t>(raw);
    return ncclSuccess;
  });
}

ncclResult_t emuQueueDestroy(void* ctx, tuttiPluginQueue_t queue) {
  Context* c = nullptr;
  ncclResult_t r = getContext(ctx, "queueDestroy", &c);
  if (r != ncclSuccess) return r;
  return guarded("queueDestroy", [&]() -> ncclResult_t {
    std::lock_guard<std::mutex> lock(c->mu);
    auto it = c->queues.find(reinterpret_cast<Queue*>(queue));
    if (it == c->queues.end())
      return setError(ncclInvalidArgument, "queueDestroy: unknown queue handle");
    reapRetiredLocked(c);
    c->retired.reserve(c->retired.size() + 1);  // the only step that can throw
    it->second->retire();                       // the worker leaves once it has drained
    if (it->second->drained()) {
      it->second->join();  // idle: it leaves at once (no thread outlives its queue needlessly)
    } else {
      c->retired.push_back(std::move(it->second));  // joined by a later call or finalize
    }
    c->queues.erase(it);
    return ncclSuccess;
  });
}

ncclResult_t emuQueueSynchronize(void* ctx, tuttiPluginQueue_t queue) {
  Context* c = nullptr;
  ncclResult_t r = getContext(ctx, "queueSynchronize", &c);
  if (r != ncclSuccess) return r;
  return guarded("queueSynchronize", [&]() -> ncclResult_t {
    Queue* q = nullptr;
    ncclResult_t res = getQueue(c, queue, "queueSynchronize", &q);
    if (res != ncclSuccess) return res;
    q->synchronize();
    return ncclSuccess;
  });
}

// ---- events ----------------------------------------------------------------------------

// eventCreate and hostEventCreate (`what` names the call).
ncclResult_t createEvent(void* ctx, int32_t device, tuttiPluginEvent_t* event, Event::Kind kind,
                         const char* what) {
  Context* c = nullptr;
  ncclResult_t r = getContext(ctx, what, &c);
  if (r != ncclSuccess) return r;
  if (event == nullptr) return setError(ncclInvalidArgument, std::string(what) + ": event is NULL");
  if ((r = checkDevice(c, device, what)) != ncclSuccess) return r;
  return guarded(what, [&]() -> ncclResult_t {
    auto e = std::make_shared<Event>(device, kind);
    std::lock_guard<std::mutex> lock(c->mu);
    c->events.emplace(e.get(), e);
    *event = reinterpret_cast<tuttiPluginEvent_t>(e.get());
    return ncclSuccess;
  });
}

ncclResult_t emuEventCreate(void* ctx, int32_t device, tuttiPluginEvent_t* event) {
  return createEvent(ctx, device, event, Event::Kind::kQueue, "eventCreate");
}

ncclResult_t emuHostEventCreate(void* ctx, int32_t device, tuttiPluginEvent_t* event) {
  return createEvent(ctx, device, event, Event::Kind::kHost, "hostEventCreate");
}

ncclResult_t emuEventDestroy(void* ctx, tuttiPluginEvent_t event) {
  Context* c = nullptr;
  ncclResult_t r = getContext(ctx, "eventDestroy", &c);
  if (r != ncclSuccess) return r;
  std::shared_ptr<Event> keep;  // released outside the lock
  {
    std::lock_guard<std::mutex> lock(c->mu);
    auto it = c->events.find(reinterpret_cast<Event*>(event));
    if (it == c->events.end())
      return setError(ncclInvalidArgument, "eventDestroy: unknown event handle");
    keep = std::move(it->second);
    c->events.erase(it);
  }
  // A queue still waiting on a host event goes on (nothing could signal it
  // any more); the waiting command's reference keeps the object alive.
  keep->signal();
  return ncclSuccess;
}

ncclResult_t emuHostEventSignal(void* ctx, tuttiPluginEvent_t event) {
  Context* c = nullptr;
  ncclResult_t r = getContext(ctx, "hostEventSignal", &c);
  if (r != ncclSuccess) return r;
  std::shared_ptr<Event> e;
  if ((r = getEvent(c, event, "hostEventSignal", &e)) != ncclSuccess) return r;
  if (!e->isHost())
    return setError(ncclInvalidArgument,
                    "hostEventSignal: not a host event (it was made by eventCreate)");
  e->signal();
  return ncclSuccess;
}

ncclResult_t emuEventRecord(void* ctx, tuttiPluginEvent_t event, tuttiPluginQueue_t queue) {
  Context* c = nullptr;
  ncclResult_t r = getContext(ctx, "eventRecord", &c);
  if (r != ncclSuccess) return r;
  return guarded("eventRecord", [&]() -> ncclResult_t {
    std::shared_ptr<Event> e;
    Queue* q = nullptr;
    ncclResult_t res = getEvent(c, event, "eventRecord", &e);
    if (res == ncclSuccess) res = getQueue(c, queue, "eventRecord", &q);
    if (res != ncclSuccess) return res;
    if (e->isHost())
      return setError(ncclInvalidArgument,
                      "eventRecord: a host event is completed by hostEventSignal, not by a queue");
    const uint64_t mark = e->newMark();
    try {
      q->submit([e, mark] { e->complete(mark); });
    } catch (...) {
      e->complete(mark);  // not enqueued: do not leave the mark pending forever
      throw;
    }
    return ncclSuccess;
  });
}

ncclResult_t emuEventWait(void* ctx, tuttiPluginQueue_t queue, tuttiPluginEvent_t event) {
  Context* c = nullptr;
  ncclResult_t r = getContext(ctx, "eventWait", &c);
  if (r != ncclSuccess) return r;
  return guarded("eventWait", [&]() -> ncclResult_t {
    std::shared_ptr<Event> e;
    Queue* q = nullptr;
    ncclResult_t res = getEvent(c, event, "eventWait", &e);
    if (res == ncclSuccess) res = getQueue(c, queue, "eventWait", &q);
    if (res != ncclSuccess) return res;
    const uint64_t mark = e->latestMark();
    if (e->reached(mark)) return ncclSuccess;  // nothing to wait for
    q->submit([e, mark] { e->waitUntil(mark); });
    return ncclSuccess;
  });
}

ncclResult_t emuEventQuery(void* ctx, tuttiPluginEvent_t event, int32_t* done) {
  Context* c = nullptr;
  ncclResult_t r = getContext(ctx, "eventQuery", &c);
  if (r != ncclSuccess) return r;
  if (done == nullptr) return setError(ncclInvalidArgument, "eventQuery: done is NULL");
  return guarded("eventQuery", [&]() -> ncclResult_t {
    std::shared_ptr<Event> e;
    ncclResult_t res = getEvent(c, event, "eventQuery", &e);
    if (res != ncclSuccess) return res;
    *done = e->done() ? 1 : 0;
    return ncclSuccess;
  });
}

ncclResult_t emuEventSynchronize(void* ctx, tuttiPluginEvent_t event) {
  Context* c = nullptr;
  ncclResult_t r = getContext(ctx, "eventSynchronize", &c);
  if (r != ncclSuccess) return r;
  return guarded("eventSynchronize", [&]() -> ncclResult_t {
    std::shared_ptr<Event> e;
    ncclResult_t res = getEvent(c, event, "eventSynchronize", &e);
    if (res != ncclSuccess) return res;
    e->waitUntil(e->latestMark());
    return ncclSuccess;
  });
}

// The queue's worker calls fn when it reaches the command (everything before
// it has run, as on a device's callback thread); the queue's later commands
// wait for it. Destroying the queue or finalize drains it, so fn runs.
ncclResult_t emuLaunchHostFunc(void* ctx, tuttiPluginQueue_t queue, void (*fn)(void*), void* arg) {
  Context* c = nullptr;
  ncclResult_t r = getContext(ctx, "launchHostFunc", &c);
  if (r != ncclSuccess) return r;
  if (fn == nullptr) return setError(ncclInvalidArgument, "launchHostFunc: fn is NULL");
  return guarded("launchHostFunc", [&]() -> ncclResult_t {
    Queue* q = nullptr;
    ncclResult_t res = getQueue(c, queue, "launchHostFunc", &q);
    if (res != ncclSuccess) return res;
    q->submit([fn, arg] { fn(arg); });
    return ncclSuccess;
  });
}

// ---- IPC -------------------------------------------------------------------------------

ncclResult_t emuIpcExport(void* ctx, void* ptr, uint64_t size, const int32_t* /*importerPids*/,
                          int32_t /*nPids*/, tuttiPluginIpcHandle_v1* handle) {
  Context* c = nullptr;
  ncclResult_t r = getContext(ctx, "ipcExport", &c);
  if (r != ncclSuccess) return r;
  if (handle == nullptr) return setError(ncclInvalidArgument, "ipcExport: handle is NULL");
  if (ptr == nullptr) return setError(ncclInvalidArgument, "ipcExport: ptr is NULL");
  if ((r = c->injectedFault(0)) != ncclSuccess) return r;
  return guarded("ipcExport", [&] { return c->mem.exportIpc(ptr, size, handle); });
}

ncclResult_t emuIpcImport(void* ctx, int32_t device, const tuttiPluginIpcHandle_v1* handle,
                          void** ptr) {
  Context* c = nullptr;
  ncclResult_t r = getContext(ctx, "ipcImport", &c);
  if (r != ncclSuccess) return r;
  if (handle == nullptr || ptr == nullptr)
    return setError(ncclInvalidArgument, "ipcImport: handle or ptr is NULL");
  if ((r = checkDevice(c, device, "ipcImport")) != ncclSuccess) return r;
  if ((r = c->injectedFault(1)) != ncclSuccess) return r;
  return guarded("ipcImport", [&] { return c->mem.importIpc(device, handle, ptr); });
}

ncclResult_t emuIpcClose(void* ctx, void* ptr) {
  Context* c = nullptr;
  ncclResult_t r = getContext(ctx, "ipcClose", &c);
  if (r != ncclSuccess) return r;
  return guarded("ipcClose", [&] { return c->mem.closeIpc(ptr); });
}

// ---- kernels ---------------------------------------------------------------------------

ncclResult_t emuReduce(void* ctx, const tuttiPluginReduceArgs_v1* args, tuttiPluginQueue_t queue) {
  Context* c = nullptr;
  ncclResult_t r = getContext(ctx, "reduce", &c);
  if (r != ncclSuccess) return r;
  if (args == nullptr) return setError(ncclInvalidArgument, "reduce: args is NULL");
  if (args->structSize < sizeof(tuttiPluginReduceArgs_v1))
    return setError(ncclInvalidArgument, "reduce: args->structSize " +
                                             std::to_string(args->structSize) + " is too small");
  return guarded("reduce", [&]() -> ncclResult_t {
    const size_t es = dataTypeBytes(args->datatype);
    if (es == 0)
      return setError(ncclInvalidArgument,
                      "reduce: unknown datatype " + std::to_string(args->datatype));
    if (args->op < TUTTI_PLUGIN_OP_SUM || args->op > TUTTI_PLUGIN_OP_PREMULSUM)
      return setError(ncclInvalidArgument, "reduce: unknown op " + std::to_string(args->op));
    if (args->nSrcs < 1 || args->srcs == nullptr)
      return setError(ncclInvalidArgument, "reduce: needs nSrcs >= 1 and a srcs array");
    if (args->op == TUTTI_PLUGIN_OP_AVG && args->avgDivisor < 1)
      return setError(ncclInvalidArgument, "reduce: AVG needs avgDivisor >= 1");
    if (args->op == TUTTI_PLUGIN_OP_PREMULSUM && args->scalar == nullptr)
      return setError(ncclInvalidArgument, "reduce: PREMULSUM needs a scalar");
    Queue* q = nullptr;
    ncclResult_t res = getQueue(c, queue, "reduce", &q);
    if (res != ncclSuccess) return res;
    if (args->count == 0) return ncclSuccess;
    uint64_t bytes = 0;
    if (!mulFits(args->count, es, &bytes))
      return setError(ncclInvalidArgument, "reduce: count overflows");
    auto job = std::make_shared<ReduceJob>();
    job->datatype = args->datatype;
    job->op = args->op;
    job->count = args->count;
    job->nSrcs = args->nSrcs;
    job->avgDivisor = args->avgDivisor;
    if ((res = kernelSpan(c, args->dst, bytes, "reduce dst", &job->dst)) != ncclSuccess) return res;
    auto srcs = std::make_shared<std::vector<const char*>>(static_cast<size_t>(args->nSrcs));
    for (int k = 0; k < args->nSrcs; ++k) {
      const std::string what = "reduce srcs[" + std::to_string(k) + "]";
      char* p = nullptr;
      if ((res = kernelSpan(c, args->srcs[k], bytes, what.c_str(), &p)) != ncclSuccess) return res;
      if (p != job->dst && overlaps(p, bytes, job->dst, bytes))
        return setError(ncclInvalidArgument, what + " partially overlaps dst");
      (*srcs)[static_cast<size_t>(k)] = p;
    }
    job->srcs = srcs->data();
    if (args->op == TUTTI_PLUGIN_OP_PREMULSUM) {
      Span s;
      if ((res = c->mem.translate(args->scalar, es, "reduce scalar", &s)) != ncclSuccess)
        return res;
      if (args->scalarResidence == ncclScalarDevice) {
        if (s.kind == MemKind::kPageable)
          return setError(ncclInvalidArgument,
                          "reduce: a device-resident scalar must be device or hostAlloc memory");
        job->scalarAt = s.addr;  // read when the kernel runs
      } else if (args->scalarResidence == ncclScalarHostImmediate) {
        std::memcpy(job->scalar, s.addr, es);  // read now (device memory via the private view)
      } else {
        return setError(ncclInvalidArgument,
                        "reduce: unknown scalarResidence " + std::to_string(args->scalarResidence));
      }
    }
    q->submit([job, srcs] { runReduce(*job); });
    return ncclSuccess;
  });
}

ncclResult_t emuCastScaled(void* ctx, void* dst, int32_t dstType, const void* src, int32_t srcType,
                           uint64_t count, float scale, tuttiPluginQueue_t queue) {
  Context* c = nullptr;
  ncclResult_t r = getContext(ctx, "castScaled", &c);
  if (r != ncclSuccess) return r;
  return guarded("castScaled", [&]() -> ncclResult_t {
    if (!castPairSupported(dstType, srcType))
      return setError(ncclInvalidArgument, "castScaled: type pair " + std::to_string(srcType) +
                                               " -> " + std::to_string(dstType) +
                                               " is not supported");
    Queue* q = nullptr;
    ncclResult_t res = getQueue(c, queue, "castScaled", &q);
    if (res != ncclSuccess) return res;
    if (count == 0) return ncclSuccess;
    uint64_t dBytes = 0, sBytes = 0;
    if (!mulFits(count, dataTypeBytes(dstType), &dBytes) ||
        !mulFits(count, dataTypeBytes(srcType), &sBytes))
      return setError(ncclInvalidArgument, "castScaled: count overflows");
    char* d = nullptr;
    char* s = nullptr;
    if ((res = kernelSpan(c, dst, dBytes, "castScaled dst", &d)) != ncclSuccess) return res;
    if ((res = kernelSpan(c, src, sBytes, "castScaled src", &s)) != ncclSuccess) return res;
    if (overlaps(d, dBytes, s, sBytes))
      return setError(ncclInvalidArgument, "castScaled: dst and src overlap");
    q->submit([=] { runCastScaled(d, dstType, s, srcType, count, scale); });
    return ncclSuccess;
  });
}

ncclResult_t emuPack1bit(void* ctx, const float* src, float* error, void* wire, uint64_t count,
                         tuttiPluginQueue_t queue) {
  Context* c = nullptr;
  ncclResult_t r = getContext(ctx, "pack1bit", &c);
  if (r != ncclSuccess) return r;
  return guarded("pack1bit", [&]() -> ncclResult_t {
    Queue* q = nullptr;
    ncclResult_t res = getQueue(c, queue, "pack1bit", &q);
    if (res != ncclSuccess) return res;
    if (count == 0) return ncclSuccess;
    uint64_t fBytes = 0;
    if (!mulFits(count, sizeof(float), &fBytes))
      return setError(ncclInvalidArgument, "pack1bit: count overflows");
    const uint64_t wBytes = signWireBytes(count);
    char *s = nullptr, *e = nullptr, *w = nullptr;
    if ((res = kernelSpan(c, src, fBytes, "pack1bit src", &s)) != ncclSuccess) return res;
    if (error != nullptr &&
        (res = kernelSpan(c, error, fBytes, "pack1bit error", &e)) != ncclSuccess)
      return res;
    if ((res = kernelSpan(c, wire, wBytes, "pack1bit wire", &w)) != ncclSuccess) return res;
    if ((e != nullptr && e != s && overlaps(s, fBytes, e, fBytes)) ||
        overlaps(w, wBytes, s, fBytes) || (e != nullptr && overlaps(w, wBytes, e, fBytes)))
      return setError(ncclInvalidArgument, "pack1bit: buffers overlap");
    q->submit([=] {
      runPack1bit(reinterpret_cast<const float*>(s), reinterpret_cast<float*>(e),
                  reinterpret_cast<unsigned char*>(w), count);
    });
    return ncclSuccess;
  });
}

ncclResult_t emuUnpack1bit(void* ctx, float* dst, const void* wire, uint64_t count,
                           int32_t accumulate, tuttiPluginQueue_t queue) {
  Context* c = nullptr;
  ncclResult_t r = getContext(ctx, "unpack1bit", &c);
  if (r != ncclSuccess) return r;
  return guarded("unpack1bit", [&]() -> ncclResult_t {
    Queue* q = nullptr;
    ncclResult_t res = getQueue(c, queue, "unpack1bit", &q);
    if (res != ncclSuccess) return res;
    if (count == 0) return ncclSuccess;
    uint64_t fBytes = 0;
    if (!mulFits(count, sizeof(float), &fBytes))
      return setError(ncclInvalidArgument, "unpack1bit: count overflows");
    const uint64_t wBytes = signWireBytes(count);
    char *d = nullptr, *w = nullptr;
    if ((res = kernelSpan(c, dst, fBytes, "unpack1bit dst", &d)) != ncclSuccess) return res;
    if ((res = kernelSpan(c, wire, wBytes, "unpack1bit wire", &w)) != ncclSuccess) return res;
    if (overlaps(d, fBytes, w, wBytes))
      return setError(ncclInvalidArgument, "unpack1bit: dst overlaps wire");
    const bool acc = accumulate != 0;
    q->submit([=] {
      runUnpack1bit(reinterpret_cast<float*>(d), reinterpret_cast<const unsigned char*>(w), count,
                    acc);
    });
    return ncclSuccess;
  });
}

ncclResult_t emuGemm(void* ctx, int32_t transA, int32_t transB, int64_t m, int64_t n, int64_t k,
                     float alpha, const float* A, int64_t lda, const float* B, int64_t ldb,
                     float beta, float* C, int64_t ldc, tuttiPluginQueue_t queue) {
  Context* c = nullptr;
  ncclResult_t r = getContext(ctx, "gemm", &c);
  if (r != ncclSuccess) return r;
  return guarded("gemm", [&]() -> ncclResult_t {
    if (m < 0 || n < 0 || k < 0) return setError(ncclInvalidArgument, "gemm: negative dimension");
    // Stored shapes: A is m x k (k x m transposed), B is k x n (n x k transposed).
    const int64_t aRows = transA ? k : m, aCols = transA ? m : k;
    const int64_t bRows = transB ? n : k, bCols = transB ? k : n;
    if (lda < aCols || ldb < bCols || ldc < n || lda < 0 || ldb < 0 || ldc < 0)
      return setError(ncclInvalidArgument, "gemm: a leading dimension is smaller than its row");
    Queue* q = nullptr;
    ncclResult_t res = getQueue(c, queue, "gemm", &q);
    if (res != ncclSuccess) return res;
    if (m == 0 || n == 0) return ncclSuccess;
    uint64_t aBytes = 0, bBytes = 0, cBytes = 0;
    if (!matrixBytes(aRows, aCols, lda, &aBytes) || !matrixBytes(bRows, bCols, ldb, &bBytes) ||
        !matrixBytes(m, n, ldc, &cBytes))
      return setError(ncclInvalidArgument, "gemm: matrix size overflows");
    char *a = nullptr, *b = nullptr, *cc = nullptr;
    if ((res = kernelSpan(c, C, cBytes, "gemm C", &cc)) != ncclSuccess) return res;
    if (k > 0) {
      if ((res = kernelSpan(c, A, aBytes, "gemm A", &a)) != ncclSuccess) return res;
      if ((res = kernelSpan(c, B, bBytes, "gemm B", &b)) != ncclSuccess) return res;
      if (overlaps(cc, cBytes, a, aBytes) || overlaps(cc, cBytes, b, bBytes))
        return setError(ncclInvalidArgument, "gemm: C overlaps A or B");
    }
    const bool tA = transA != 0, tB = transB != 0;
    q->submit([=] {
      runGemm(tA, tB, m, n, k, alpha, reinterpret_cast<const float*>(a), lda,
              reinterpret_cast<const float*>(b), ldb, beta, reinterpret_cast<float*>(cc), ldc);
    });
    return ncclSuccess;
  });
}

ncclResult_t emuOrthogonalize(void* ctx, float* M, int64_t rows, int64_t cols, int64_t ld,
                              float eps, tuttiPluginQueue_t queue) {
  Context* c = nullptr;
  ncclResult_t r = getContext(ctx, "orthogonalize", &c);
  if (r != ncclSuccess) return r;
  return guarded("orthogonalize", [&]() -> ncclResult_t {
    if (rows < 0 || cols < 0 || ld < cols)
      return setError(ncclInvalidArgument,
                      "orthogonalize: bad shape (rows, cols >= 0, ld >= cols)");
    Queue* q = nullptr;
    ncclResult_t res = getQueue(c, queue, "orthogonalize", &q);
    if (res != ncclSuccess) return res;
    if (rows == 0 || cols == 0) return ncclSuccess;
    uint64_t bytes = 0;
    if (!matrixBytes(rows, cols, ld, &bytes))
      return setError(ncclInvalidArgument, "orthogonalize: matrix size overflows");
    char* m = nullptr;
    if ((res = kernelSpan(c, M, bytes, "orthogonalize M", &m)) != ncclSuccess) return res;
    q->submit([=] { runOrthogonalize(reinterpret_cast<float*>(m), rows, cols, ld, eps); });
    return ncclSuccess;
  });
}

const tuttiBackendPlugin_v1 kPlugin = {
    TUTTI_BACKEND_PLUGIN_ABI_VERSION,
    sizeof(tuttiBackendPlugin_v1),
    "xpu_emu",
    TUTTI_PLUGIN_CAP_IPC_NEEDS_FD | TUTTI_PLUGIN_CAP_HOST_MAPPED,
    emuInit,
    emuFinalize,
    emuLastError,
    emuDeviceCount,
    emuCurrentDevice,
    emuQueryPointer,
    emuMemAlloc,
    emuMemFree,
    emuHostAlloc,
    emuHostFree,
    emuMemcpyAsync,
    emuQueueCreate,
    emuQueueDestroy,
    emuQueueSynchronize,
    emuEventCreate,
    emuEventDestroy,
    emuEventRecord,
    emuEventWait,
    emuEventQuery,
    emuEventSynchronize,
    emuIpcExport,
    emuIpcImport,
    emuIpcClose,
    emuReduce,
    emuCastScaled,
    emuPack1bit,
    emuUnpack1bit,
    emuGemm,
    emuOrthogonalize,
    emuSetDevice,
    emuHostEventCreate,
    emuHostEventSignal,
    emuDevicePciBusId,
    emuLaunchHostFunc,
};

}  // namespace
}  // namespace xpu_emu

extern "C" TUTTI_PLUGIN_EXPORT const tuttiBackendPlugin_v1* tuttiBackendPluginInit(
    uint32_t hostAbiVersion) {
  if (hostAbiVersion < 1) return nullptr;  // this plugin speaks ABI v1 only
  return &xpu_emu::kPlugin;
}
