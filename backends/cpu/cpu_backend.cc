#include "backends/cpu/cpu_backend.h"

#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "backends/cpu/codec_kernels.h"
#include "backends/cpu/dense_kernels.h"
#include "backends/cpu/float_formats.h"
#include "backends/cpu/kernels.h"

namespace tutti::cpu {
namespace {

thread_local std::string t_lastError;

ncclResult_t failWith(ncclResult_t rc, std::string msg) {
  t_lastError = std::move(msg);
  return rc;
}

bool validType(int32_t dt) { return dt >= ncclInt8 && dt <= ncclFloat8e5m2; }

ncclResult_t cpuInit(const tuttiBackendHost_v1*, void** ctx) {
  *ctx = nullptr;
  return ncclSuccess;
}
ncclResult_t cpuFinalize(void*) { return ncclSuccess; }
const char* cpuLastError(void*) { return t_lastError.c_str(); }
ncclResult_t cpuDeviceCount(void*, int32_t* count) {
  *count = 1;
  return ncclSuccess;
}
ncclResult_t cpuCurrentDevice(void*, int32_t* device) {
  *device = 0;
  return ncclSuccess;
}
ncclResult_t cpuSetDevice(void*, int32_t device) {
  if (device != 0)
    return failWith(ncclInvalidArgument, "setDevice: no device " + std::to_string(device) +
                                             " (the CPU backend has one device, 0)");
  return ncclSuccess;
}
ncclResult_t cpuQueryPointer(void*, const void*, tuttiPluginPointerInfo_v1* info) {
  info->memoryType = TUTTI_PLUGIN_MEM_UNKNOWN;
  info->device = -1;
  info->base = nullptr;
  info->size = 0;
  return ncclSuccess;
}
// What cpuAlloc handed out and not yet freed: so that freeing a pointer it
// did not allocate, or one already freed, is an error, not heap corruption
// (ncclMemFree on a stray pointer; a double free).
struct Allocations {
  std::mutex mu;
  std::unordered_map<void*, uint64_t> bytes;
};
Allocations& allocations() {
  static auto* a = new Allocations();  // never destroyed: frees may come during exit
  return *a;
}

ncclResult_t cpuAlloc(uint64_t size, void** ptr) {
  *ptr = nullptr;
  if (size == 0) return ncclSuccess;
  if (posix_memalign(ptr, 4096, size) != 0 || *ptr == nullptr) {
    *ptr = nullptr;
    return failWith(ncclSystemError, "cannot allocate " + std::to_string(size) + " bytes");
  }
  Allocations& a = allocations();
  std::lock_guard<std::mutex> lk(a.mu);
  a.bytes.emplace(*ptr, size);
  return ncclSuccess;
}
ncclResult_t cpuMemAlloc(void*, int32_t, uint64_t size, void** ptr) { return cpuAlloc(size, ptr); }
ncclResult_t cpuHostAlloc(void*, uint64_t size, void** ptr) { return cpuAlloc(size, ptr); }
ncclResult_t cpuFree(void*, void* ptr) {
  if (!ptr) return ncclSuccess;
  {
    Allocations& a = allocations();
    std::lock_guard<std::mutex> lk(a.mu);
    if (a.bytes.erase(ptr) == 0) {
      char where[32];
      snprintf(where, sizeof(where), "%p", ptr);
      return failWith(ncclInvalidArgument,
                      std::string("free: ") + where +
                          " was not allocated by this backend (ncclMemAlloc), or was freed "
                          "already");
    }
  }
  free(ptr);
  return ncclSuccess;
}
ncclResult_t cpuMemcpy(void*, void* dst, const void* src, uint64_t bytes, tuttiPluginQueue_t) {
  if (bytes) memmove(dst, src, bytes);
  return ncclSuccess;
}

// Queues are tokens: work is complete when its call returns.
struct Token {
  int unused = 0;
};
// Events: a recorded event is complete as soon as it is recorded; a host
// event is a flag that hostEventSignal sets (the condition variable serves
// eventSynchronize on another thread).
struct CpuEvent {
  explicit CpuEvent(bool h) : host(h) {}
  const bool host;
  std::mutex mu;
  std::condition_variable cv;
  bool signalled = false;  // host events only; guarded by mu
  bool isSignalled() {
    std::lock_guard<std::mutex> lock(mu);
    return signalled;
  }
};
CpuEvent* eventOf(tuttiPluginEvent_t e) { return reinterpret_cast<CpuEvent*>(e); }
// A host event not signalled yet (NULL and recorded events: false).
bool hostPending(tuttiPluginEvent_t e) {
  return e != nullptr && eventOf(e)->host && !eventOf(e)->isSignalled();
}
ncclResult_t cpuQueueCreate(void*, int32_t, tuttiPluginQueue_t* q) {
  *q = reinterpret_cast<tuttiPluginQueue_t>(new Token);
  return ncclSuccess;
}
ncclResult_t cpuQueueDestroy(void*, tuttiPluginQueue_t q) {
  delete reinterpret_cast<Token*>(q);
  return ncclSuccess;
}
ncclResult_t cpuQueueSync(void*, tuttiPluginQueue_t) { return ncclSuccess; }
ncclResult_t cpuEventCreate(void*, int32_t, tuttiPluginEvent_t* e) {
  *e = reinterpret_cast<tuttiPluginEvent_t>(new CpuEvent(false));
  return ncclSuccess;
}
ncclResult_t cpuHostEventCreate(void*, int32_t device, tuttiPluginEvent_t* e) {
  if (device != 0)
    return failWith(ncclInvalidArgument, "hostEventCreate: no device " + std::to_string(device));
  *e = reinterpret_cast<tuttiPluginEvent_t>(new CpuEvent(true));
  return ncclSuccess;
}
// No queue ever waits on an event here (see cpuEventWait), so destroying one
// releases nothing.
ncclResult_t cpuEventDestroy(void*, tuttiPluginEvent_t e) {
  delete eventOf(e);
  return ncclSuccess;
}
ncclResult_t cpuEventRecord(void*, tuttiPluginEvent_t e, tuttiPluginQueue_t) {
  if (e != nullptr && eventOf(e)->host)
    return failWith(ncclInvalidArgument,
                    "eventRecord: a host event is completed by hostEventSignal, not by a queue");
  return ncclSuccess;
}
// Later work on a queue of this backend is the caller's own next call, which
// runs to completion before it returns: it could wait for a host event only by
// blocking the caller, and the thread that will signal may be that caller. So
// a wait on a host event not signalled yet is refused (nothing is enqueued);
// once signalled there is nothing to wait for.
ncclResult_t cpuEventWait(void*, tuttiPluginQueue_t, tuttiPluginEvent_t e) {
  if (hostPending(e))
    return failWith(ncclInvalidArgument,
                    "eventWait: the host event is not signalled and the CPU backend's queues are "
                    "synchronous (work completes before its call returns), so later work could "
                    "wait only by blocking this thread; signal it first");
  return ncclSuccess;
}
ncclResult_t cpuEventQuery(void*, tuttiPluginEvent_t e, int32_t* done) {
  *done = hostPending(e) ? 0 : 1;
  return ncclSuccess;
}
ncclResult_t cpuEventSync(void*, tuttiPluginEvent_t e) {
  if (e == nullptr || !eventOf(e)->host) return ncclSuccess;
  CpuEvent* ev = eventOf(e);
  std::unique_lock<std::mutex> lock(ev->mu);
  ev->cv.wait(lock, [ev] { return ev->signalled; });
  return ncclSuccess;
}
ncclResult_t cpuHostEventSignal(void*, tuttiPluginEvent_t e) {
  if (e == nullptr || !eventOf(e)->host)
    return failWith(ncclInvalidArgument, "hostEventSignal: not a host event");
  CpuEvent* ev = eventOf(e);
  std::lock_guard<std::mutex> lock(ev->mu);
  ev->signalled = true;
  ev->cv.notify_all();
  return ncclSuccess;
}
// Everything enqueued before has completed: fn runs now, on the caller.
ncclResult_t cpuLaunchHostFunc(void*, tuttiPluginQueue_t, void (*fn)(void*), void* arg) {
  if (fn == nullptr) return failWith(ncclInvalidArgument, "launchHostFunc: fn is NULL");
  fn(arg);
  return ncclSuccess;
}

ncclResult_t cpuReduce(void*, const tuttiPluginReduceArgs_v1* a, tuttiPluginQueue_t) {
  if (!validType(a->datatype))
    return failWith(ncclInvalidArgument, "reduce: unknown datatype " + std::to_string(a->datatype));
  if (a->op < TUTTI_PLUGIN_OP_SUM || a->op > TUTTI_PLUGIN_OP_PREMULSUM)
    return failWith(ncclInvalidArgument, "reduce: unknown operator " + std::to_string(a->op));
  if (a->nSrcs < 1 || a->srcs == nullptr)
    return failWith(ncclInvalidArgument, "reduce: needs at least one source");
  if (a->op == TUTTI_PLUGIN_OP_PREMULSUM && a->scalar == nullptr)
    return failWith(ncclInvalidArgument, "reduce: PREMULSUM without a scalar");
  if (a->op == TUTTI_PLUGIN_OP_AVG && a->avgDivisor < 1)
    return failWith(ncclInvalidArgument, "reduce: AVG with divisor 0");
  if (a->count == 0) return ncclSuccess;
  const auto dt = static_cast<DataType>(a->datatype);
  const size_t bytes = a->count * dataTypeSize(dt);
  // The reference loops let dst alias the first source only: a dst that is a
  // later source is computed aside and copied.
  bool aliasLater = false;
  for (int k = 1; k < a->nSrcs; ++k) aliasLater |= a->srcs[k] == a->dst;
  std::vector<unsigned char> aside;
  void* out = a->dst;
  if (aliasLater) {
    aside.resize(bytes);
    out = aside.data();
  }
  const int n = a->nSrcs;
  const void* const* srcs = a->srcs;
  if (a->op == TUTTI_PLUGIN_OP_PREMULSUM) {
    const double s = scalarValue(a->scalar, a->datatype);
    scale(out, srcs[0], a->count, dt, s);
    for (int k = 1; k < n; ++k) preMulReduce(out, out, srcs[k], a->count, dt, s);
  } else {
    const RedOp op = a->op == TUTTI_PLUGIN_OP_AVG ? RedOp::kSum : static_cast<RedOp>(a->op);
    reduceN(out, srcs, n, a->count, dt, op);
    if (a->op == TUTTI_PLUGIN_OP_AVG) {
      if (isFloating(dt))
        scale(out, out, a->count, dt, 1.0 / static_cast<double>(a->avgDivisor));
      else
        divide(out, out, a->count, dt, a->avgDivisor);
    }
  }
  if (aliasLater) memcpy(a->dst, out, bytes);
  return ncclSuccess;
}

ncclResult_t cpuCastScaled(void*, void* dst, int32_t dstType, const void* src, int32_t srcType,
                           uint64_t count, float scale, tuttiPluginQueue_t) {
  if (srcType == ncclFloat32 && (dstType == ncclFloat16 || dstType == ncclBfloat16)) {
    const float* s = static_cast<const float*>(src);
    uint16_t* d = static_cast<uint16_t*>(dst);
    for (uint64_t i = 0; i < count; ++i) {
      const float v = s[i] * scale;
      d[i] = dstType == ncclFloat16 ? floatToHalf(v) : floatToBf16(v);
    }
    return ncclSuccess;
  }
  if (dstType == ncclFloat32 && (srcType == ncclFloat16 || srcType == ncclBfloat16)) {
    const uint16_t* s = static_cast<const uint16_t*>(src);
    float* d = static_cast<float*>(dst);
    for (uint64_t i = 0; i < count; ++i)
      d[i] = (srcType == ncclFloat16 ? halfToFloat(s[i]) : bf16ToFloat(s[i])) * scale;
    return ncclSuccess;
  }
  return failWith(ncclInvalidArgument, "castScaled: unsupported type pair " +
                                           std::to_string(srcType) + " -> " +
                                           std::to_string(dstType));
}

static_assert(TUTTI_PLUGIN_SIGN_BLOCK == kSignBlock, "the plugin ABI's 1-bit block is tutti's");

ncclResult_t cpuPack1bit(void*, const float* src, float* error, void* wire, uint64_t count,
                         tuttiPluginQueue_t) {
  encode(WireFormat::kSign, 0, src, error, count, wire);
  return ncclSuccess;
}

ncclResult_t cpuUnpack1bit(void*, float* dst, const void* wire, uint64_t count, int32_t accumulate,
                           tuttiPluginQueue_t) {
  if (accumulate)
    decodeAdd(WireFormat::kSign, 0, wire, count, dst, 1.0f, dst);
  else
    decode(WireFormat::kSign, 0, wire, count, dst);
  return ncclSuccess;
}

ncclResult_t cpuGemm(void*, int32_t transA, int32_t transB, int64_t m, int64_t n, int64_t k,
                     float alpha, const float* A, int64_t lda, const float* B, int64_t ldb,
                     float beta, float* C, int64_t ldc, tuttiPluginQueue_t) {
  if (m < 0 || n < 0 || k < 0) return failWith(ncclInvalidArgument, "gemm: negative dimension");
  std::vector<float> row(static_cast<size_t>(n));
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0;
      for (int64_t p = 0; p < k; ++p) {
        const float a = transA ? A[p * lda + i] : A[i * lda + p];
        const float b = transB ? B[j * ldb + p] : B[p * ldb + j];
        acc += static_cast<double>(a) * b;
      }
      const float prod = alpha * static_cast<float>(acc);
      row[j] = beta == 0.0f ? prod : prod + beta * C[i * ldc + j];
    }
    for (int64_t j = 0; j < n; ++j) C[i * ldc + j] = row[j];
  }
  return ncclSuccess;
}

ncclResult_t cpuOrthogonalize(void*, float* M, int64_t rows, int64_t cols, int64_t ld, float eps,
                              tuttiPluginQueue_t) {
  if (rows < 0 || cols < 0 || ld < cols)
    return failWith(ncclInvalidArgument, "orthogonalize: bad shape");
  if (ld == cols) {
    orthonormalizeColumns(M, static_cast<size_t>(rows), static_cast<size_t>(cols), eps);
    return ncclSuccess;
  }
  std::vector<float> packed(static_cast<size_t>(rows * cols));
  for (int64_t i = 0; i < rows; ++i)
    memcpy(&packed[i * cols], M + i * ld, static_cast<size_t>(cols) * sizeof(float));
  orthonormalizeColumns(packed.data(), static_cast<size_t>(rows), static_cast<size_t>(cols), eps);
  for (int64_t i = 0; i < rows; ++i)
    memcpy(M + i * ld, &packed[i * cols], static_cast<size_t>(cols) * sizeof(float));
  return ncclSuccess;
}

tuttiBackendPlugin_v1 makeTable() {
  tuttiBackendPlugin_v1 t{};
  t.abiVersion = TUTTI_BACKEND_PLUGIN_ABI_VERSION;
  t.structSize = sizeof(tuttiBackendPlugin_v1);
  t.name = "cpu";
  t.capabilities = TUTTI_PLUGIN_CAP_HOST_MAPPED;
  t.init = cpuInit;
  t.finalize = cpuFinalize;
  t.lastError = cpuLastError;
  t.deviceCount = cpuDeviceCount;
  t.currentDevice = cpuCurrentDevice;
  t.queryPointer = cpuQueryPointer;
  t.memAlloc = cpuMemAlloc;
  t.memFree = cpuFree;
  t.hostAlloc = cpuHostAlloc;
  t.hostFree = cpuFree;
  t.memcpyAsync = cpuMemcpy;
  t.queueCreate = cpuQueueCreate;
  t.queueDestroy = cpuQueueDestroy;
  t.queueSynchronize = cpuQueueSync;
  t.eventCreate = cpuEventCreate;
  t.eventDestroy = cpuEventDestroy;
  t.eventRecord = cpuEventRecord;
  t.eventWait = cpuEventWait;
  t.eventQuery = cpuEventQuery;
  t.eventSynchronize = cpuEventSync;
  t.reduce = cpuReduce;
  t.castScaled = cpuCastScaled;
  t.pack1bit = cpuPack1bit;
  t.unpack1bit = cpuUnpack1bit;
  t.gemm = cpuGemm;
  t.orthogonalize = cpuOrthogonalize;
  t.setDevice = cpuSetDevice;
  t.hostEventCreate = cpuHostEventCreate;
  t.hostEventSignal = cpuHostEventSignal;
  t.launchHostFunc = cpuLaunchHostFunc;
  return t;
}

}  // namespace

double scalarValue(const void* p, int32_t dt) {
  switch (dt) {
    case ncclInt8:
      return *static_cast<const int8_t*>(p);
    case ncclUint8:
      return *static_cast<const uint8_t*>(p);
    case ncclInt32:
      return *static_cast<const int32_t*>(p);
    case ncclUint32:
      return *static_cast<const uint32_t*>(p);
    case ncclInt64:
      return static_cast<double>(*static_cast<const int64_t*>(p));
    case ncclUint64:
      return static_cast<double>(*static_cast<const uint64_t*>(p));
    case ncclFloat16:
      return halfToFloat(*static_cast<const uint16_t*>(p));
    case ncclFloat32:
      return *static_cast<const float*>(p);
    case ncclFloat64:
      return *static_cast<const double*>(p);
    case ncclBfloat16:
      return bf16ToFloat(*static_cast<const uint16_t*>(p));
    case ncclFloat8e4m3:
      return fp8E4M3ToFloat(*static_cast<const uint8_t*>(p));
    case ncclFloat8e5m2:
      return fp8E5M2ToFloat(*static_cast<const uint8_t*>(p));
    default:
      return 0;
  }
}

const tuttiBackendPlugin_v1* backendPlugin() {
  static const tuttiBackendPlugin_v1 table = makeTable();
  return &table;
}

}  // namespace tutti::cpu
