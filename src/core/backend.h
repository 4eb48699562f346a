// The device backend seen from inside tutti: one plugin table
// (include/tutti/backend_plugin.h) behind a C++ face that returns Status.
//
// Contract
// - One backend serves the whole process (processBackend()): chosen at first
//   use from TUTTI_BACKEND_PLUGIN ("cpu" or empty: the built-in CPU backend; a
//   name: libtutti-backend-<name>.so in the plugin folders; a path). When the
//   variable is unset and a CUDA plugin is installed beside libtutti.so, that
//   plugin is tried and the CPU backend used if it finds no device (INFO line).
//   A plugin named explicitly that fails to load is an error, never a silent
//   fallback. The process backend lives until exit (never unloaded).
// - Backend::load() opens further instances (tests, the conformance suite);
//   each owns its plugin context and finalizes it when destroyed.
// - hostOnly(): every pointer is host memory and every queue is synchronous
//   (the CPU backend). Callers skip pointer queries and staging then, so the
//   host path pays nothing for the seam.
// - Kernels whose table entry is NULL, or that answer ncclInvalidArgument, run
//   on the host: the queue is drained, operands are copied into pinned host
//   memory, the CPU reference kernel runs, results are copied back (logged
//   once per kernel at INFO). All calls are thread-safe; those named "sync"
//   block until the queue has drained.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "base/status.h"
#include "core/host_kernels.h"
#include "tutti/backend_plugin.h"

namespace tutti::core {

enum class MemKind { kHost, kDevice, kPinned, kManaged };

struct MemInfo {
  MemKind kind = MemKind::kHost;
  int device = -1;
  void* base = nullptr;  // start of the allocation, when known
  size_t size = 0;       // its size, when known
};

using Queue = tuttiPluginQueue_t;
using Event = tuttiPluginEvent_t;

class Backend {
 public:
  // Loads a plugin by name or path (see the contract) and initialises it.
  static Result<std::unique_ptr<Backend>> load(const std::string& nameOrPath);
  // Wraps a table already in memory (the built-in CPU backend).
  static Result<std::unique_ptr<Backend>> fromTable(const tuttiBackendPlugin_v1* table,
                                                    const std::string& origin);
  ~Backend();
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;

  const std::string& name() const { return name_; }
  const std::string& origin() const { return origin_; }  // "built-in" or the file loaded
  bool hostOnly() const { return hostOnly_; }
  uint64_t capabilities() const { return t_->capabilities; }
  bool hasIpc() const { return t_->ipcExport && t_->ipcImport && t_->ipcClose; }
  // hostEventCreate and hostEventSignal are both in the plugin's table (its
  // structSize covers them and they are not NULL): an operation on a device
  // queue can hold the queue with a host event instead of blocking the caller.
  bool hasHostEvents() const;
  const tuttiBackendPlugin_v1& table() const { return *t_; }
  void* context() const { return ctx_; }

  Result<int> deviceCount();
  Result<int> currentDevice();
  // kInvalidArgument naming the device unless 0 <= device < deviceCount().
  Status checkDevice(int device);
  // The device a communicator asked for `device` binds to: that one when it
  // exists (checkDevice). A hostOnly backend has one device that every rank
  // shares: any id is 0 there (tuttiSetDevice, which changes the current
  // device, still refuses one that does not exist).
  Result<int> bindDevice(int device);
  // Makes `device` the calling thread's current device. Without the plugin's
  // setDevice: succeeds when device is already current, else kInvalidUsage.
  Status setDevice(int device);
  // The plugin offers devicePciBusId (its structSize covers it, not NULL).
  bool hasPciBusId() const { return t_->devicePciBusId != nullptr; }
  // The PCI bus id of `device` as the plugin writes it ("0000:17:00.0"); ""
  // when the plugin does not offer the query (hostOnly backends, plugins
  // built before it was appended) or does not know the address. An error is
  // the plugin's (a device out of range).
  Result<std::string> pciBusId(int device);
  // Never fails: a failing query is logged and the pointer treated as host memory.
  MemInfo query(const void* p);
  bool isDevice(const void* p) { return !hostOnly_ && query(p).kind == MemKind::kDevice; }

  Result<void*> alloc(int device, size_t bytes);
  Status free(void* p);
  Result<void*> hostAlloc(size_t bytes);
  Status hostFree(void* p);
  Status copyAsync(void* dst, const void* src, size_t bytes, Queue q);
  // Sync: copies in order on the default queue and waits.
  Status copy(void* dst, const void* src, size_t bytes);
  Status sync(Queue q);  // sync

  Result<Queue> queueCreate(int device);
  Status queueDestroy(Queue q);
  Result<Event> eventCreate(int device);
  Status eventDestroy(Event e);
  Status eventRecord(Event e, Queue q);
  Status eventWait(Queue q, Event e);
  Result<bool> eventDone(Event e);
  // Host events (require hasHostEvents(), else kInvalidUsage): an event only
  // the host completes; eventWait(q, e) holds q until hostEventSignal(e),
  // eventDone answers false until then; eventDestroy releases a queue still
  // waiting. See include/tutti/backend_plugin.h.
  Result<Event> hostEventCreate(int device);
  Status hostEventSignal(Event e);  // idempotent, non-blocking, any thread
  // The plugin offers launchHostFunc (its structSize covers it, not NULL).
  bool hasHostFuncs() const { return t_->launchHostFunc != nullptr; }
  // Async: fn(arg) runs once when q reaches this point (see the plugin
  // header); on an error it never runs. kInvalidUsage when not offered; the
  // plugin's kInvalidArgument when not offered for this queue.
  Status launchHostFunc(Queue q, void (*fn)(void*), void* arg);

  // The kernels for host memory (core/host_kernels.h): what the executor,
  // the one-shot path and the planner reduce and encode with, on host buffers
  // and on device buffers staged through pinned host memory. Every backend
  // answers with the CPU reference kernels (referenceKernels()) today.
  const HostKernels& hostKernels() const { return *hostKernels_; }
  // Replaces them (`k` outlives every use; tests install counting kernels).
  // Not synchronised: call it while no communicator of this backend runs.
  void setHostKernels(const HostKernels* k) { hostKernels_ = k ? k : &referenceKernels(); }

  // Kernels, async on q (host fallback as in the contract).
  Status reduce(const tuttiPluginReduceArgs_v1& a, Queue q);
  Status castScaled(void* dst, int dstType, const void* src, int srcType, size_t count, float scale,
                    Queue q);
  Status pack1bit(const float* src, float* error, void* wire, size_t count, Queue q);
  Status unpack1bit(float* dst, const void* wire, size_t count, bool accumulate, Queue q);
  Status gemm(bool transA, bool transB, int64_t m, int64_t n, int64_t k, float alpha,
              const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
              int64_t ldc, Queue q);
  Status orthogonalize(float* M, int64_t rows, int64_t cols, int64_t ld, float eps, Queue q);

  // IPC (requires hasIpc()).
  Status ipcExport(void* p, size_t bytes, const int32_t* pids, int nPids,
                   tuttiPluginIpcHandle_v1* h);
  Result<void*> ipcImport(int device, const tuttiPluginIpcHandle_v1& h);
  Status ipcClose(void* p);

  // A failed call's Status: what it was, the plugin's lastError text.
  Status error(ncclResult_t rc, const char* what) const;

 private:
  Backend() = default;
  void noteFallback(int kernel, const char* what);
  Status noHostEvents() const;  // the kInvalidUsage of a plugin without host events

  tuttiBackendPlugin_v1 table_{};  // whole fields up to the plugin's structSize; the rest NULL
  const tuttiBackendPlugin_v1* t_ = nullptr;  // &table_ once initialised
  void* ctx_ = nullptr;
  void* dl_ = nullptr;  // dlopen handle, null for built-in tables
  std::string name_, origin_;
  const HostKernels* hostKernels_ = &referenceKernels();
  bool hostOnly_ = false;
  std::atomic<uint32_t> fallbackLogged_{0};
};

// The process's backend (see the contract). The error names the variable and
// what failed; it is returned again on every later call.
Result<Backend*> processBackend();

// ncclMemAlloc / ncclMemFree: `bytes` (> 0) of the process backend's memory
// on the calling thread's current device (page-aligned host memory on the CPU
// backend), and its release (a pointer the backend did not hand out, or
// freed already, is an error, not a crash).
Result<void*> memAlloc(size_t bytes);
Status memFree(void* p);
// tuttiMemcpy, tuttiGetDeviceCount, tuttiSetDevice on the process backend.
Status memCopy(void* dst, const void* src, size_t bytes);
Result<int> deviceCount();
Status selectDevice(int device);  // checked first: a device the backend lacks is an error
// ncclCommInitAll: the devices of ranks 0..n-1, devlist[i] (or i) bound by
// the backend (the CPU backend has one "device" that every rank shares, so
// any ids are accepted there); the error names the rank.
Result<std::vector<int>> bindDevices(const int* devlist, int n);

}  // namespace tutti::core
