#include "core/backend.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <vector>

#include "backends/cpu/codec_kernels.h"
#include "backends/cpu/cpu_backend.h"
#include "base/log.h"
#include "base/params.h"
#include "base/types.h"
#include "core/plugins.h"

namespace tutti::core {
namespace {

void hostLog(int32_t level, const char* msg) {
  if (!msg) return;
  if (level <= TUTTI_PLUGIN_LOG_WARN)
    TUTTI_WARN("backend: {}", msg);
  else if (level <= TUTTI_PLUGIN_LOG_INFO)
    TUTTI_INFO(log::kInit, "backend: {}", msg);
  else
    TUTTI_TRACE(log::kInit, "backend: {}", msg);
}

const tuttiBackendHost_v1 kHost = {TUTTI_BACKEND_PLUGIN_ABI_VERSION, sizeof(tuttiBackendHost_v1),
                                   hostLog};

// The fields every plugin must provide (the kernels and IPC may be NULL).
Status checkTable(const tuttiBackendPlugin_v1* t, const std::string& origin) {
  if (t->abiVersion != TUTTI_BACKEND_PLUGIN_ABI_VERSION)
    return invalidArgument(fmt::format("backend plugin {}: ABI version {}, this tutti speaks {}",
                                       origin, t->abiVersion, TUTTI_BACKEND_PLUGIN_ABI_VERSION));
  const size_t required = offsetof(tuttiBackendPlugin_v1, eventSynchronize) + sizeof(void*);
  if (t->structSize < required)
    return invalidArgument(fmt::format(
        "backend plugin {}: table of {} bytes is shorter than the {} bytes ABI version 1 requires",
        origin, t->structSize, required));
  if (!t->name || !*t->name)
    return invalidArgument(fmt::format("backend plugin {}: table has no name", origin));
  // In table order, so the first NULL one is named.
  const struct {
    const char* name;
    const void* fn;
  } required_fns[] = {
#define TUTTI_REQUIRED_FN(f) {#f, reinterpret_cast<const void*>(t->f)}
      TUTTI_REQUIRED_FN(init),          TUTTI_REQUIRED_FN(finalize),
      TUTTI_REQUIRED_FN(lastError),     TUTTI_REQUIRED_FN(deviceCount),
      TUTTI_REQUIRED_FN(currentDevice), TUTTI_REQUIRED_FN(queryPointer),
      TUTTI_REQUIRED_FN(memAlloc),      TUTTI_REQUIRED_FN(memFree),
      TUTTI_REQUIRED_FN(hostAlloc),     TUTTI_REQUIRED_FN(hostFree),
      TUTTI_REQUIRED_FN(memcpyAsync),   TUTTI_REQUIRED_FN(queueCreate),
      TUTTI_REQUIRED_FN(queueDestroy),  TUTTI_REQUIRED_FN(queueSynchronize),
      TUTTI_REQUIRED_FN(eventCreate),   TUTTI_REQUIRED_FN(eventDestroy),
      TUTTI_REQUIRED_FN(eventRecord),   TUTTI_REQUIRED_FN(eventWait),
      TUTTI_REQUIRED_FN(eventQuery),    TUTTI_REQUIRED_FN(eventSynchronize),
#undef TUTTI_REQUIRED_FN
  };
  for (const auto& r : required_fns)
    if (!r.fn)
      return invalidArgument(
          fmt::format("backend plugin {}: required function '{}' is NULL", origin, r.name));
  return Status::ok();
}

// Bytes of a plugin table with the given structSize that hold whole fields
// of this tutti's table. After the two 4-byte header fields every field is
// pointer-sized, so whole fields end on a multiple of the pointer size.
static_assert(offsetof(tuttiBackendPlugin_v1, name) == 8 &&
                  sizeof(tuttiBackendPlugin_v1) % sizeof(void*) == 0,
              "every field after the header is pointer-sized");
size_t coveredBytes(uint32_t structSize) {
  return std::min<size_t>(structSize, sizeof(tuttiBackendPlugin_v1)) / sizeof(void*) *
         sizeof(void*);
}

enum FallbackKernel : int { kReduce, kCast, kPack, kUnpack, kGemm, kOrtho };

// One operand of a kernel run on the host: [ptr, ptr + bytes).
struct Operand {
  const void* ptr;
  size_t bytes;
  bool in, out;
  void* host = nullptr;
};

}  // namespace

Status Backend::error(ncclResult_t rc, const char* what) const {
  const char* why = t_->lastError ? t_->lastError(ctx_) : nullptr;
  Code code = rc == ncclInvalidArgument ? Code::kInvalidArgument
              : rc == ncclSystemError   ? Code::kSystemError
              : rc == ncclInvalidUsage  ? Code::kInvalidUsage
              : rc == ncclInternalError ? Code::kInternalError
                                        : Code::kUnhandledDeviceError;
  return Status(code, fmt::format("backend {}: {} failed: {}", name_, what,
                                  why && *why ? why : "no reason given"));
}

#define TUTTI_BACKEND_CALL(what, call)               \
  do {                                               \
    ncclResult_t rc_ = (call);                       \
    if (rc_ != ncclSuccess) return error(rc_, what); \
  } while (0)

Result<std::unique_ptr<Backend>> Backend::fromTable(const tuttiBackendPlugin_v1* table,
                                                    const std::string& origin) {
  if (!table) return invalidArgument("backend plugin " + origin + ": no table");
  TUTTI_RETURN_IF_ERROR(checkTable(table, origin));
  std::unique_ptr<Backend> b(new Backend());
  // A copy as long as this tutti's table: fields beyond the plugin's
  // structSize (appended after it was built) read as NULL, and so does a
  // field the structSize covers only in part (only whole fields are copied).
  memcpy(&b->table_, table, coveredBytes(table->structSize));
  b->table_.structSize = sizeof(b->table_);
  b->t_ = &b->table_;
  b->name_ = table->name;
  b->origin_ = origin;
  b->hostOnly_ = table == cpu::backendPlugin();
  ncclResult_t rc = table->init(&kHost, &b->ctx_);
  if (rc != ncclSuccess) {
    const char* why = table->lastError(b->ctx_);
    b->t_ = nullptr;  // nothing to finalize
    return Status(Code::kUnhandledDeviceError,
                  fmt::format("backend {} ({}): init failed: {}", b->name_, origin,
                              why && *why ? why : "no reason given"));
  }
  return b;
}

Result<std::unique_ptr<Backend>> Backend::load(const std::string& nameOrPath) {
  if (nameOrPath.empty() || nameOrPath == "cpu") return fromTable(cpu::backendPlugin(), "built-in");
  TUTTI_ASSIGN_OR_RETURN(std::string path, findPlugin("backend", nameOrPath));
  void* dl = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!dl) {
    const char* why = dlerror();
    return invalidArgument(
        fmt::format("backend plugin {}: dlopen failed: {}", path, why ? why : "unknown error"));
  }
  auto entry =
      reinterpret_cast<tuttiBackendPluginInitFn>(dlsym(dl, TUTTI_BACKEND_PLUGIN_INIT_SYMBOL));
  if (!entry) {
    dlclose(dl);
    return invalidArgument(
        fmt::format("backend plugin {}: no symbol {}", path, TUTTI_BACKEND_PLUGIN_INIT_SYMBOL));
  }
  const tuttiBackendPlugin_v1* table = entry(TUTTI_BACKEND_PLUGIN_ABI_VERSION);
  if (!table) {
    // The plugin declined (the header: "no usable device here"). No device
    // runtime call failed, so this is not ncclUnhandledCudaError: the program
    // is right and the machine cannot serve it, a system error.
    dlclose(dl);
    return systemError(fmt::format(
        "backend plugin {}: {}({}) returned NULL: the plugin declined to run in this process "
        "(no usable device, or it does not support plugin ABI version {})",
        path, TUTTI_BACKEND_PLUGIN_INIT_SYMBOL, TUTTI_BACKEND_PLUGIN_ABI_VERSION,
        TUTTI_BACKEND_PLUGIN_ABI_VERSION));
  }
  auto res = fromTable(table, path);
  if (!res) {
    dlclose(dl);
    return res.status();
  }
  res.value()->dl_ = dl;
  TUTTI_INFO(log::kInit, "backend {} loaded from {}", res.value()->name(), path);
  return res;
}

Backend::~Backend() {
  if (t_) t_->finalize(ctx_);
  if (dl_) dlclose(dl_);
}

Result<int> Backend::deviceCount() {
  int32_t n = 0;
  TUTTI_BACKEND_CALL("deviceCount", t_->deviceCount(ctx_, &n));
  return static_cast<int>(n);
}

Result<int> Backend::currentDevice() {
  int32_t d = 0;
  TUTTI_BACKEND_CALL("currentDevice", t_->currentDevice(ctx_, &d));
  return static_cast<int>(d);
}

Status Backend::checkDevice(int device) {
  TUTTI_ASSIGN_OR_RETURN(const int n, deviceCount());
  if (device < 0 || device >= n)
    return invalidArgument(
        fmt::format("device {} does not exist (backend {} has {} device(s))", device, name_, n));
  return Status::ok();
}

Result<int> Backend::bindDevice(int device) {
  if (hostOnly_) return 0;
  TUTTI_RETURN_IF_ERROR(checkDevice(device));
  return device;
}

// A field the plugin's structSize does not wholly cover is NULL in table_
// (fromTable copies whole fields only), so NULL says both "not offered" and
// "beyond its table".
bool Backend::hasHostEvents() const { return t_->hostEventCreate && t_->hostEventSignal; }

Result<std::string> Backend::pciBusId(int device) {
  if (!t_->devicePciBusId) return std::string();
  char id[TUTTI_PLUGIN_PCI_BUS_ID_BYTES] = {};
  TUTTI_BACKEND_CALL("devicePciBusId",
                     t_->devicePciBusId(ctx_, device, id, static_cast<uint64_t>(sizeof id)));
  return std::string(id, strnlen(id, sizeof id));
}

Status Backend::setDevice(int device) {
  if (t_->setDevice) {
    TUTTI_BACKEND_CALL("setDevice", t_->setDevice(ctx_, device));
    return Status::ok();
  }
  TUTTI_ASSIGN_OR_RETURN(int current, currentDevice());
  if (device == current) return Status::ok();
  return invalidUsage(fmt::format(
      "backend {}: cannot make device {} current: the plugin offers no setDevice and its current "
      "device is {}",
      name_, device, current));
}

MemInfo Backend::query(const void* p) {
  MemInfo m;
  if (hostOnly_ || !p) return m;
  tuttiPluginPointerInfo_v1 info{};
  info.structSize = sizeof(info);
  ncclResult_t rc = t_->queryPointer(ctx_, p, &info);
  if (rc != ncclSuccess) {
    TUTTI_WARN("{} (treated as host memory)", error(rc, "queryPointer").message());
    return m;
  }
  switch (info.memoryType) {
    case TUTTI_PLUGIN_MEM_DEVICE:
      m.kind = MemKind::kDevice;
      break;
    case TUTTI_PLUGIN_MEM_HOST_PINNED:
      m.kind = MemKind::kPinned;
      break;
    case TUTTI_PLUGIN_MEM_MANAGED:
      m.kind = MemKind::kManaged;
      break;
    default:
      return m;
  }
  m.device = info.device;
  m.base = info.base;
  m.size = info.size;
  return m;
}

Result<void*> Backend::alloc(int device, size_t bytes) {
  void* p = nullptr;
  TUTTI_BACKEND_CALL("memAlloc", t_->memAlloc(ctx_, device, bytes, &p));
  return p;
}

Status Backend::free(void* p) {
  TUTTI_BACKEND_CALL("memFree", t_->memFree(ctx_, p));
  return Status::ok();
}

Result<void*> Backend::hostAlloc(size_t bytes) {
  void* p = nullptr;
  TUTTI_BACKEND_CALL("hostAlloc", t_->hostAlloc(ctx_, bytes, &p));
  return p;
}

Status Backend::hostFree(void* p) {
  TUTTI_BACKEND_CALL("hostFree", t_->hostFree(ctx_, p));
  return Status::ok();
}

Status Backend::copyAsync(void* dst, const void* src, size_t bytes, Queue q) {
  if (bytes == 0) return Status::ok();
  TUTTI_BACKEND_CALL("memcpyAsync", t_->memcpyAsync(ctx_, dst, src, bytes, q));
  return Status::ok();
}

Status Backend::copy(void* dst, const void* src, size_t bytes) {
  TUTTI_RETURN_IF_ERROR(copyAsync(dst, src, bytes, nullptr));
  return sync(nullptr);
}

Status Backend::sync(Queue q) {
  if (hostOnly_) return Status::ok();
  TUTTI_BACKEND_CALL("queueSynchronize", t_->queueSynchronize(ctx_, q));
  return Status::ok();
}

Result<Queue> Backend::queueCreate(int device) {
  Queue q = nullptr;
  TUTTI_BACKEND_CALL("queueCreate", t_->queueCreate(ctx_, device, &q));
  return q;
}

Status Backend::queueDestroy(Queue q) {
  TUTTI_BACKEND_CALL("queueDestroy", t_->queueDestroy(ctx_, q));
  return Status::ok();
}

Result<Event> Backend::eventCreate(int device) {
  Event e = nullptr;
  TUTTI_BACKEND_CALL("eventCreate", t_->eventCreate(ctx_, device, &e));
  return e;
}

Status Backend::eventDestroy(Event e) {
  TUTTI_BACKEND_CALL("eventDestroy", t_->eventDestroy(ctx_, e));
  return Status::ok();
}

Status Backend::eventRecord(Event e, Queue q) {
  TUTTI_BACKEND_CALL("eventRecord", t_->eventRecord(ctx_, e, q));
  return Status::ok();
}

Status Backend::eventWait(Queue q, Event e) {
  TUTTI_BACKEND_CALL("eventWait", t_->eventWait(ctx_, q, e));
  return Status::ok();
}

Result<bool> Backend::eventDone(Event e) {
  int32_t done = 0;
  TUTTI_BACKEND_CALL("eventQuery", t_->eventQuery(ctx_, e, &done));
  return done != 0;
}

Status Backend::noHostEvents() const {
  return invalidUsage("backend " + name_ +
                      " offers no host events (hostEventCreate/hostEventSignal are NULL or beyond "
                      "its table)");
}

Result<Event> Backend::hostEventCreate(int device) {
  if (!hasHostEvents()) return noHostEvents();
  Event e = nullptr;
  TUTTI_BACKEND_CALL("hostEventCreate", t_->hostEventCreate(ctx_, device, &e));
  return e;
}

Status Backend::hostEventSignal(Event e) {
  if (!hasHostEvents()) return noHostEvents();
  TUTTI_BACKEND_CALL("hostEventSignal", t_->hostEventSignal(ctx_, e));
  return Status::ok();
}

Status Backend::launchHostFunc(Queue q, void (*fn)(void*), void* arg) {
  if (!hasHostFuncs())
    return invalidUsage("backend " + name_ +
                        " offers no host functions (launchHostFunc is NULL or beyond its table)");
  TUTTI_BACKEND_CALL("launchHostFunc", t_->launchHostFunc(ctx_, q, fn, arg));
  return Status::ok();
}

void Backend::noteFallback(int kernel, const char* what) {
  const uint32_t bit = 1u << kernel;
  if (fallbackLogged_.fetch_or(bit) & bit) return;
  TUTTI_INFO(log::kInit, "backend {}: {} runs on the host (staged through pinned memory)", name_,
             what);
}

namespace {

// Runs `kernel` (a CPU reference call on host pointers) for operands living in
// the backend's memory: drains q, stages every operand in pinned host memory
// (operands starting at the same address share one buffer, so in-place calls
// stay in place), runs, copies outputs back and drains q again.
template <typename Kernel>
Status runOnHost(Backend* b, std::vector<Operand> ops, Queue q, Kernel&& kernel) {
  TUTTI_RETURN_IF_ERROR(b->sync(q));
  std::vector<Operand> merged;
  for (const Operand& o : ops) {
    auto same = std::find_if(merged.begin(), merged.end(),
                             [&](const Operand& m) { return m.ptr == o.ptr; });
    if (same == merged.end()) {
      merged.push_back(o);
    } else {
      same->bytes = std::max(same->bytes, o.bytes);
      same->in |= o.in;
      same->out |= o.out;
    }
  }
  Status st;
  for (Operand& m : merged) {
    if (m.bytes == 0 || !m.ptr) continue;
    auto h = b->hostAlloc(m.bytes);
    if (!h) {
      st = h.status();
      break;
    }
    m.host = h.value();
    if (m.in) {
      st = b->copyAsync(m.host, m.ptr, m.bytes, q);
      if (!st) break;
    }
  }
  if (st) st = b->sync(q);
  if (st) {
    auto hostOf = [&](const void* p) -> void* {
      for (const Operand& m : merged)
        if (m.ptr == p) return m.host;
      return nullptr;
    };
    ncclResult_t rc = kernel(hostOf);
    if (rc != ncclSuccess)
      st = Status(Code::kInvalidArgument, fmt::format("host reference kernel failed: {}",
                                                      cpu::backendPlugin()->lastError(nullptr)));
  }
  for (Operand& m : merged) {
    if (st && m.out && m.host) st = b->copyAsync(const_cast<void*>(m.ptr), m.host, m.bytes, q);
  }
  if (st) st = b->sync(q);
  for (Operand& m : merged)
    if (m.host) {
      Status f = b->hostFree(m.host);
      if (st && !f) st = f;
    }
  return st;
}

// Bytes spanned by a rows x cols row-major matrix with row stride ld.
size_t matrixBytes(int64_t rows, int64_t cols, int64_t ld) {
  if (rows <= 0 || cols <= 0) return 0;
  return static_cast<size_t>((rows - 1) * ld + cols) * sizeof(float);
}

}  // namespace

Status Backend::reduce(const tuttiPluginReduceArgs_v1& a, Queue q) {
  if (t_->reduce) {
    ncclResult_t rc = t_->reduce(ctx_, &a, q);
    if (rc == ncclSuccess) return Status::ok();
    if (rc != ncclInvalidArgument) return error(rc, "reduce");
  }
  if (a.datatype < ncclInt8 || a.datatype > ncclFloat8e5m2 || a.nSrcs < 1 || !a.srcs)
    return invalidArgument(
        fmt::format("reduce: bad arguments (datatype {}, {} sources)", a.datatype, a.nSrcs));
  noteFallback(kReduce, "reduce");
  const size_t bytes = a.count * dataTypeSize(static_cast<DataType>(a.datatype));
  std::vector<Operand> ops;
  for (int k = 0; k < a.nSrcs; ++k) ops.push_back({a.srcs[k], bytes, true, false});
  ops.push_back({a.dst, bytes, false, true});
  const size_t es = dataTypeSize(static_cast<DataType>(a.datatype));
  uint64_t scalar = 0;  // one element, read before the kernel runs
  if (a.op == TUTTI_PLUGIN_OP_PREMULSUM && a.scalar) {
    if (a.scalarResidence == ncclScalarDevice && isDevice(a.scalar))
      TUTTI_RETURN_IF_ERROR(copy(&scalar, a.scalar, es));
    else
      memcpy(&scalar, a.scalar, es);
  }
  return runOnHost(this, ops, q, [&](auto hostOf) {
    std::vector<const void*> srcs;
    for (int k = 0; k < a.nSrcs; ++k) srcs.push_back(hostOf(a.srcs[k]));
    tuttiPluginReduceArgs_v1 h = a;
    h.dst = hostOf(a.dst);
    h.srcs = srcs.data();
    h.scalar = a.scalar ? &scalar : nullptr;
    h.scalarResidence = ncclScalarHostImmediate;
    return cpu::backendPlugin()->reduce(nullptr, &h, nullptr);
  });
}

Status Backend::castScaled(void* dst, int dstType, const void* src, int srcType, size_t count,
                           float scale, Queue q) {
  if (t_->castScaled) {
    ncclResult_t rc = t_->castScaled(ctx_, dst, dstType, src, srcType, count, scale, q);
    if (rc == ncclSuccess) return Status::ok();
    if (rc != ncclInvalidArgument) return error(rc, "castScaled");
  }
  auto size = [](int t) {
    return t >= ncclInt8 && t <= ncclFloat8e5m2 ? dataTypeSize(static_cast<DataType>(t)) : 0;
  };
  if (!size(dstType) || !size(srcType))
    return invalidArgument(fmt::format("castScaled: bad types {} -> {}", srcType, dstType));
  noteFallback(kCast, "castScaled");
  return runOnHost(
      this, {{src, count * size(srcType), true, false}, {dst, count * size(dstType), false, true}},
      q, [&](auto hostOf) {
        return cpu::backendPlugin()->castScaled(nullptr, hostOf(dst), dstType, hostOf(src), srcType,
                                                count, scale, nullptr);
      });
}

Status Backend::pack1bit(const float* src, float* error, void* wire, size_t count, Queue q) {
  if (t_->pack1bit) {
    ncclResult_t rc = t_->pack1bit(ctx_, src, error, wire, count, q);
    if (rc == ncclSuccess) return Status::ok();
    if (rc != ncclInvalidArgument) return this->error(rc, "pack1bit");
  }
  noteFallback(kPack, "pack1bit");
  std::vector<Operand> ops = {{src, count * 4, true, false},
                              {wire, cpu::wireBytes(cpu::WireFormat::kSign, count), false, true}};
  if (error) ops.push_back({error, count * 4, true, true});
  return runOnHost(this, ops, q, [&](auto hostOf) {
    return cpu::backendPlugin()->pack1bit(nullptr, static_cast<const float*>(hostOf(src)),
                                          static_cast<float*>(hostOf(error)), hostOf(wire), count,
                                          nullptr);
  });
}

Status Backend::unpack1bit(float* dst, const void* wire, size_t count, bool accumulate, Queue q) {
  if (t_->unpack1bit) {
    ncclResult_t rc = t_->unpack1bit(ctx_, dst, wire, count, accumulate ? 1 : 0, q);
    if (rc == ncclSuccess) return Status::ok();
    if (rc != ncclInvalidArgument) return error(rc, "unpack1bit");
  }
  noteFallback(kUnpack, "unpack1bit");
  return runOnHost(this,
                   {{wire, cpu::wireBytes(cpu::WireFormat::kSign, count), true, false},
                    {dst, count * 4, accumulate, true}},
                   q, [&](auto hostOf) {
                     return cpu::backendPlugin()->unpack1bit(
                         nullptr, static_cast<float*>(hostOf(dst)), hostOf(wire), count,
                         accumulate ? 1 : 0, nullptr);
                   });
}

Status Backend::gemm(bool transA, bool transB, int64_t m, int64_t n, int64_t k, float alpha,
                     const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
                     int64_t ldc, Queue q) {
  if (t_->gemm) {
    ncclResult_t rc =
        t_->gemm(ctx_, transA, transB, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc, q);
    if (rc == ncclSuccess) return Status::ok();
    if (rc != ncclInvalidArgument) return error(rc, "gemm");
  }
  if (m < 0 || n < 0 || k < 0) return invalidArgument("gemm: negative dimension");
  noteFallback(kGemm, "gemm");
  const size_t aBytes = transA ? matrixBytes(k, m, lda) : matrixBytes(m, k, lda);
  const size_t bBytes = transB ? matrixBytes(n, k, ldb) : matrixBytes(k, n, ldb);
  return runOnHost(this,
                   {{A, aBytes, true, false},
                    {B, bBytes, true, false},
                    // Read C even when beta == 0 if rows are padded: the
                    // whole extent is written back, padding included.
                    {C, matrixBytes(m, n, ldc), beta != 0.0f || ldc > n, true}},
                   q, [&](auto hostOf) {
                     return cpu::backendPlugin()->gemm(nullptr, transA, transB, m, n, k, alpha,
                                                       static_cast<const float*>(hostOf(A)), lda,
                                                       static_cast<const float*>(hostOf(B)), ldb,
                                                       beta, static_cast<float*>(hostOf(C)), ldc,
                                                       nullptr);
                   });
}

Status Backend::orthogonalize(float* M, int64_t rows, int64_t cols, int64_t ld, float eps,
                              Queue q) {
  if (t_->orthogonalize) {
    ncclResult_t rc = t_->orthogonalize(ctx_, M, rows, cols, ld, eps, q);
    if (rc == ncclSuccess) return Status::ok();
    if (rc != ncclInvalidArgument) return error(rc, "orthogonalize");
  }
  if (rows < 0 || cols < 0 || ld < cols) return invalidArgument("orthogonalize: bad shape");
  noteFallback(kOrtho, "orthogonalize");
  return runOnHost(this, {{M, matrixBytes(rows, cols, ld), true, true}}, q, [&](auto hostOf) {
    return cpu::backendPlugin()->orthogonalize(nullptr, static_cast<float*>(hostOf(M)), rows, cols,
                                               ld, eps, nullptr);
  });
}

Status Backend::ipcExport(void* p, size_t bytes, const int32_t* pids, int nPids,
                          tuttiPluginIpcHandle_v1* h) {
  if (!hasIpc()) return invalidUsage("backend " + name_ + " offers no IPC");
  *h = tuttiPluginIpcHandle_v1{};
  h->structSize = sizeof(*h);
  h->fd = -1;
  TUTTI_BACKEND_CALL("ipcExport", t_->ipcExport(ctx_, p, bytes, pids, nPids, h));
  return Status::ok();
}

Result<void*> Backend::ipcImport(int device, const tuttiPluginIpcHandle_v1& h) {
  if (!hasIpc()) return invalidUsage("backend " + name_ + " offers no IPC");
  void* p = nullptr;
  TUTTI_BACKEND_CALL("ipcImport", t_->ipcImport(ctx_, device, &h, &p));
  return p;
}

Status Backend::ipcClose(void* p) {
  if (!hasIpc()) return invalidUsage("backend " + name_ + " offers no IPC");
  TUTTI_BACKEND_CALL("ipcClose", t_->ipcClose(ctx_, p));
  return Status::ok();
}

Result<void*> memAlloc(size_t bytes) {
  TUTTI_ASSIGN_OR_RETURN(Backend * backend, processBackend());
  TUTTI_ASSIGN_OR_RETURN(int device, backend->currentDevice());  // the CPU backend's is 0
  auto p = backend->alloc(device, bytes);
  if (!p) return p.status().withContext(fmt::format("allocating {} bytes", bytes));
  return p.value();
}

Status memFree(void* p) {
  TUTTI_ASSIGN_OR_RETURN(Backend * backend, processBackend());
  return backend->free(p);
}

Status memCopy(void* dst, const void* src, size_t bytes) {
  TUTTI_ASSIGN_OR_RETURN(Backend * backend, processBackend());
  return backend->copy(dst, src, bytes);
}

Result<int> deviceCount() {
  TUTTI_ASSIGN_OR_RETURN(Backend * backend, processBackend());
  return backend->deviceCount();
}

Result<std::vector<int>> bindDevices(const int* devlist, int n) {
  TUTTI_ASSIGN_OR_RETURN(Backend * backend, processBackend());
  std::vector<int> devices(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    auto d = backend->bindDevice(devlist ? devlist[i] : i);
    if (!d) return d.status().withContext(fmt::format("rank {}", i));
    devices[static_cast<size_t>(i)] = d.value();
  }
  return devices;
}

Status selectDevice(int device) {
  TUTTI_ASSIGN_OR_RETURN(Backend * backend, processBackend());
  TUTTI_RETURN_IF_ERROR(backend->checkDevice(device));
  return backend->setDevice(device);
}

Result<Backend*> processBackend() {
  static std::once_flag once;
  static Backend* backend = nullptr;
  static Status failure;
  std::call_once(once, [] {
    const std::string want = params::getStr("TUTTI_BACKEND_PLUGIN", "");
    if (!want.empty()) {
      auto res = Backend::load(want);
      if (!res) {
        failure = res.status().withContext("TUTTI_BACKEND_PLUGIN=" + want);
        return;
      }
      backend = res.value().release();
    } else {
      // Unset: a CUDA plugin installed beside libtutti.so serves cudaMalloc'd
      // buffers of unmodified NCCL programs; without a GPU it declines.
      if (findPlugin("backend", "cuda")) {
        auto res = Backend::load("cuda");
        if (res)
          backend = res.value().release();
        else
          TUTTI_INFO(log::kInit, "CUDA backend not used: {}", res.status().message());
      }
      if (!backend) backend = Backend::load("cpu").value().release();
    }
    TUTTI_INFO(log::kInit, "device backend: {} ({})", backend->name(), backend->origin());
  });
  if (!backend) return failure;
  return backend;
}

}  // namespace tutti::core
