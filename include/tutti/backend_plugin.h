/*
 * tutti/backend_plugin.h -- the device backend plugin ABI, version 1.
 *
 * Contract
 * --------
 * A device backend outside libtutti.so (a vendor accelerator, an emulator) is a
 * shared library installed under <prefix>/lib/tutti/ (or named by
 * TUTTI_BACKEND_PLUGIN) that exports one C function:
 *
 *     const tuttiBackendPlugin_v1* tuttiBackendPluginInit(uint32_t hostAbiVersion);
 *
 * tutti dlopen()s the library, calls the entry once with the newest plugin ABI
 * it understands, and reads the returned table. The table is owned by the
 * plugin and must stay valid and unchanged until the library is unloaded.
 * Returning NULL means "no usable device here": tutti logs it and moves on.
 *
 * Versioning. The table starts with `abiVersion` and `structSize`; those two
 * fields never move. Fields are only ever appended: tutti uses a field only if
 * the plugin's structSize covers it, so a plugin built against an older header
 * keeps working. A plugin must set abiVersion to the value it was written for
 * (TUTTI_BACKEND_PLUGIN_ABI_VERSION of its header) and structSize to
 * sizeof(its table). Argument structs passed by tutti carry structSize too.
 *
 * Types. Everything crossing this boundary is plain data: fixed-width integers,
 * pointers and function pointers; enumerations are passed as int32_t so that
 * compiler flags such as -fshort-enums cannot change a layout. Datatype and
 * reduction values are NCCL's (ncclDataType_t, and tuttiPluginRedOp_t below).
 *
 * Errors. Every function returns ncclResult_t: ncclSuccess, or
 *   ncclUnhandledCudaError  the device runtime failed (tutti calls lastError()),
 *   ncclSystemError         out of memory / a system call failed,
 *   ncclInvalidArgument     a value this backend cannot handle (e.g. a datatype
 *                           a kernel does not support) -- tutti then uses its
 *                           host fallback where one exists.
 * Functions never throw, never call exit/abort, and never print on their own
 * (use the host log callback).
 *
 * Threads. All functions may be called from any thread, concurrently, except
 * init/finalize. Functions marked "async" only enqueue work on a queue and
 * return; memory they touch must stay valid until the queue has passed the
 * work (tutti tracks that with events). Functions marked "blocking" may wait;
 * tutti never calls them while it holds a lock that the progress engine needs
 * and prefers polling eventQuery where a communicator may be aborted.
 *
 * Queues and events. A queue is the backend's native stream object
 * (for CUDA: a cudaStream_t), so the stream a user passes to ncclAllReduce is
 * used as a queue directly. The NULL queue is the backend's default queue on
 * the current device. Work on one queue runs in order. Host events
 * (hostEventCreate, optional) are completed by the host instead of by a queue,
 * so that a queue can be held until tutti has finished an operation.
 *
 * Kernels that are NULL in the table are done by tutti on the host: it waits
 * for the queue, copies the operands into pinned host memory, runs the CPU
 * reference kernel and copies the result back (correct but slow; logged once
 * at INFO). Every backend's kernels are checked against that reference by the
 * conformance suite (tests/device/).
 */
#ifndef TUTTI_BACKEND_PLUGIN_H_
#define TUTTI_BACKEND_PLUGIN_H_

#include <stddef.h>
#include <stdint.h>

#include "../nccl.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TUTTI_BACKEND_PLUGIN_ABI_VERSION 1u
/* Name of the entry point a plugin exports (for dlsym). */
#define TUTTI_BACKEND_PLUGIN_INIT_SYMBOL "tuttiBackendPluginInit"
/* For plugin authors: marks the entry point exported. */
#if defined(__GNUC__) || defined(__clang__)
#define TUTTI_PLUGIN_EXPORT __attribute__((visibility("default")))
#else
#define TUTTI_PLUGIN_EXPORT
#endif

/* ---- Opaque handles (backend-native objects) ----------------------------- */
typedef struct tuttiPluginQueue_st* tuttiPluginQueue_t; /* a stream; NULL = default queue */
typedef struct tuttiPluginEvent_st* tuttiPluginEvent_t;

/* ---- Capability flags (tuttiBackendPlugin_v1.capabilities) --------------- */
/* Device memory can be registered with an RDMA NIC (GPUDirect-style, dma-buf). */
#define TUTTI_PLUGIN_CAP_RDMA_DEVICE_MEMORY (1ull << 0)
/* Pinned host memory from hostAlloc is directly addressable by kernels. */
#define TUTTI_PLUGIN_CAP_HOST_MAPPED (1ull << 1)
/* ipcExport returns handles needing an fd passed between processes. */
#define TUTTI_PLUGIN_CAP_IPC_NEEDS_FD (1ull << 2)

/* ---- Log levels for the host log callback (same meaning as NCCL_DEBUG) ---- */
#define TUTTI_PLUGIN_LOG_WARN 2
#define TUTTI_PLUGIN_LOG_INFO 3
#define TUTTI_PLUGIN_LOG_TRACE 5

/* Services tutti offers the plugin, passed to init(). Valid until finalize(). */
typedef struct tuttiBackendHost_v1 {
  uint32_t abiVersion; /* TUTTI_BACKEND_PLUGIN_ABI_VERSION of libtutti */
  uint32_t structSize; /* sizeof(tuttiBackendHost_v1) as libtutti was built */
  /* Writes one line to tutti's log (NCCL_DEBUG rules apply). Thread-safe,
   * never blocks for long; msg needs no trailing newline. */
  void (*log)(int32_t level, const char* msg);
} tuttiBackendHost_v1;

/* ---- Pointer query ------------------------------------------------------- */
#define TUTTI_PLUGIN_MEM_UNKNOWN 0     /* not this backend's: treat as pageable host memory */
#define TUTTI_PLUGIN_MEM_DEVICE 1      /* device memory */
#define TUTTI_PLUGIN_MEM_HOST_PINNED 2 /* host memory allocated/registered with the backend */
#define TUTTI_PLUGIN_MEM_MANAGED 3     /* unified memory, accessible from host and device */

typedef struct tuttiPluginPointerInfo_v1 {
  uint32_t structSize; /* set by tutti: sizeof as tutti was built */
  int32_t memoryType;  /* TUTTI_PLUGIN_MEM_* */
  int32_t device;      /* device ordinal for DEVICE/MANAGED memory, -1 otherwise */
  int32_t reserved0;   /* zero */
  void* base;          /* start of the allocation containing the pointer; NULL if unknown */
  uint64_t size;       /* size of that allocation in bytes; 0 if unknown */
} tuttiPluginPointerInfo_v1;

/* ---- IPC ----------------------------------------------------------------- */
#define TUTTI_PLUGIN_IPC_HANDLE_BYTES 64

/* A description of exported memory that tutti ships to same-node peers. */
typedef struct tuttiPluginIpcHandle_v1 {
  uint32_t structSize; /* sizeof(tuttiPluginIpcHandle_v1) */
  uint32_t dataSize;   /* bytes of data[] in use, <= TUTTI_PLUGIN_IPC_HANDLE_BYTES */
  int32_t fd;          /* a file descriptor that goes with the handle, or -1 */
  int32_t reserved0;   /* zero */
  uint64_t offset;     /* offset of the exported pointer inside the exported allocation */
  unsigned char data[TUTTI_PLUGIN_IPC_HANDLE_BYTES]; /* backend-defined bytes */
} tuttiPluginIpcHandle_v1;

/* ---- Devices ------------------------------------------------------------- */
/* Size of the buffer tutti passes to devicePciBusId (NUL included). */
#define TUTTI_PLUGIN_PCI_BUS_ID_BYTES 32

/* ---- Reduction ----------------------------------------------------------- */
/* Operators of the reduce kernel. Values 0..4 equal ncclSum..ncclAvg; dynamic
 * NCCL operators (ncclRedOpCreatePreMulSum) arrive as PREMULSUM + scalar. */
#define TUTTI_PLUGIN_OP_SUM 0
#define TUTTI_PLUGIN_OP_PROD 1
#define TUTTI_PLUGIN_OP_MAX 2
#define TUTTI_PLUGIN_OP_MIN 3
#define TUTTI_PLUGIN_OP_AVG 4
#define TUTTI_PLUGIN_OP_PREMULSUM 5
typedef int32_t tuttiPluginRedOp_t;

/* Elements per block of the 1-bit codec (pack1bit/unpack1bit). */
#define TUTTI_PLUGIN_SIGN_BLOCK 512

/* Arguments of reduce(). Element i of the result is, with x_k = srcs[k][i]:
 *   SUM/PROD/MAX/MIN:  x_0 op x_1 op ... op x_{n-1}, left to right, computed in the
 *                      element type; fp16/bf16/fp8 accumulate in fp32 and round once
 *                      at the end (round to nearest even; e4m3 saturates to +-448)
 *   AVG:               integers: the (wrapped) SUM divided by avgDivisor, truncating
 *                      (signed or unsigned per type); floats: the SUM rounded to the
 *                      element type, then multiplied by 1/avgDivisor (a float; a
 *                      double for float64) and rounded again
 *   PREMULSUM:         d = scalar * x_0, then d = d + scalar * x_k for k = 1..n-1,
 *                      every step rounded to the element type (fp32 arithmetic for
 *                      fp16/bf16/fp8, no fused multiply-add); the scalar is
 *                      converted once: to float (double for float64), or for
 *                      integers truncated to int64 (saturating; NaN -> 0) and wrapped
 * Integers wrap (two's complement). MAX/MIN: NaN if either operand is NaN, else
 * (a > b ? a : b) / (a < b ? a : b), so on equal operands (+0 vs -0) the later
 * one wins. dst may equal any srcs[k] (in place); otherwise ranges must not
 * overlap. tutti's CPU reference (backends/cpu/kernels.h) is the definition. */
typedef struct tuttiPluginReduceArgs_v1 {
  uint32_t structSize;     /* sizeof(tuttiPluginReduceArgs_v1) as tutti was built */
  int32_t datatype;        /* ncclDataType_t value, any of ncclInt8..ncclFloat8e5m2 */
  tuttiPluginRedOp_t op;   /* TUTTI_PLUGIN_OP_* */
  int32_t nSrcs;           /* >= 1 */
  uint64_t count;          /* elements */
  void* dst;               /* device memory (or host-mapped) */
  const void* const* srcs; /* host array of nSrcs pointers, read before reduce() returns */
  const void* scalar;      /* PREMULSUM: one element of datatype; NULL otherwise */
  int32_t scalarResidence; /* ncclScalarDevice: scalar is device memory, read when the
                              kernel runs; ncclScalarHostImmediate: host memory, read
                              before reduce() returns */
  uint32_t avgDivisor;     /* AVG: the number of contributions (nranks), >= 1 */
} tuttiPluginReduceArgs_v1;

/* ---- The plugin table ---------------------------------------------------- */
typedef struct tuttiBackendPlugin_v1 {
  /* Never move: the plugin's ABI version and sizeof(this table) as built. */
  uint32_t abiVersion;
  uint32_t structSize;
  /* Short lowercase name ("cuda", "ze", "xpu_emu"): selects the backend in
   * TUTTI_BACKEND_PLUGIN and tags log lines. Static storage. */
  const char* name;
  /* TUTTI_PLUGIN_CAP_* bits. */
  uint64_t capabilities;

  /* ---- life cycle ---- */
  /* Opens the backend; stores an opaque context passed to every other call.
   * Called once, before anything else. Blocking (driver initialisation).
   * Must fail (not crash) when no device is present. Required. */
  ncclResult_t (*init)(const tuttiBackendHost_v1* host, void** ctx);
  /* Releases everything init created; ctx is invalid afterwards. Called once,
   * after all other calls returned. Blocking. Required. */
  ncclResult_t (*finalize)(void* ctx);
  /* Reason of the last failure on the calling thread, "" if none. Never NULL;
   * valid until the next call on this thread. Required. */
  const char* (*lastError)(void* ctx);

  /* ---- devices ---- */
  /* Number of devices (>= 1 when init succeeded). Required. */
  ncclResult_t (*deviceCount)(void* ctx, int32_t* count);
  /* The device the calling thread currently uses (CUDA: cudaGetDevice); a
   * communicator binds to it at creation. Required. */
  ncclResult_t (*currentDevice)(void* ctx, int32_t* device);

  /* ---- memory ---- */
  /* Classifies ptr. Must succeed for any pointer value, including ones this
   * backend knows nothing about (answer TUTTI_PLUGIN_MEM_UNKNOWN). info->structSize
   * is set by tutti; the plugin fills the fields it knows. Does not block on
   * queues. Required. */
  ncclResult_t (*queryPointer)(void* ctx, const void* ptr, tuttiPluginPointerInfo_v1* info);
  /* Allocates size bytes of device memory on `device`, aligned to at least 256
   * bytes. size 0 gives NULL. Blocking (may synchronise the device). Required. */
  ncclResult_t (*memAlloc)(void* ctx, int32_t device, uint64_t size, void** ptr);
  /* Frees memory from memAlloc; NULL is a no-op. The caller guarantees no queued
   * work still uses it. Blocking. Required. */
  ncclResult_t (*memFree)(void* ctx, void* ptr);
  /* Allocates page-locked host memory usable for fast copies (and, with
   * TUTTI_PLUGIN_CAP_HOST_MAPPED, by kernels). Blocking. Required. */
  ncclResult_t (*hostAlloc)(void* ctx, uint64_t size, void** ptr);
  /* Frees memory from hostAlloc; NULL is a no-op. Blocking. Required. */
  ncclResult_t (*hostFree)(void* ctx, void* ptr);
  /* Async: copies bytes from src to dst in queue order. Each side may be device,
   * pinned host or pageable host memory; the backend infers the direction.
   * With pageable host memory the call may return only once the source has
   * been read. Required. */
  ncclResult_t (*memcpyAsync)(void* ctx, void* dst, const void* src, uint64_t bytes,
                              tuttiPluginQueue_t queue);

  /* ---- queues ---- */
  /* Creates a queue on `device` that does not synchronise with the default
   * queue. Required. */
  ncclResult_t (*queueCreate)(void* ctx, int32_t device, tuttiPluginQueue_t* queue);
  /* Destroys a queue from queueCreate once its work has finished (it does not
   * wait for it). Required. */
  ncclResult_t (*queueDestroy)(void* ctx, tuttiPluginQueue_t queue);
  /* Blocking: returns when all work enqueued on queue so far has completed.
   * Required. */
  ncclResult_t (*queueSynchronize)(void* ctx, tuttiPluginQueue_t queue);

  /* ---- events ---- */
  /* Creates an event on `device` (no timing). Required. */
  ncclResult_t (*eventCreate)(void* ctx, int32_t device, tuttiPluginEvent_t* event);
  /* Destroys an event; pending records complete normally. Required. */
  ncclResult_t (*eventDestroy)(void* ctx, tuttiPluginEvent_t event);
  /* Async: marks the current end of queue; the event completes when the queue
   * reaches it. Re-recording replaces the previous mark. Required. */
  ncclResult_t (*eventRecord)(void* ctx, tuttiPluginEvent_t event, tuttiPluginQueue_t queue);
  /* Async: later work on queue waits until event has completed (the host does
   * not wait). Required. */
  ncclResult_t (*eventWait)(void* ctx, tuttiPluginQueue_t queue, tuttiPluginEvent_t event);
  /* Non-blocking: *done = 1 if event has completed (or was never recorded),
   * 0 otherwise. Required. */
  ncclResult_t (*eventQuery)(void* ctx, tuttiPluginEvent_t event, int32_t* done);
  /* Blocking: returns when event has completed. Required. */
  ncclResult_t (*eventSynchronize)(void* ctx, tuttiPluginEvent_t event);

  /* ---- IPC between processes of one node (all three NULL: peers exchange
   *      device data through pinned host staging instead) ---- */
  /* Exports [ptr, ptr+size) of device memory (ptr may point inside an
   * allocation; set handle->offset accordingly) for the processes importerPids
   * (nPids entries), so that backends which must grant access per process can
   * do so. handle->structSize is set by tutti. If the backend needs a file
   * descriptor to travel with the handle it stores it in handle->fd and tutti
   * takes ownership of that fd (passes it with SCM_RIGHTS, then closes it);
   * otherwise fd = -1. The export stays valid while the memory is allocated.
   * Blocking. */
  ncclResult_t (*ipcExport)(void* ctx, void* ptr, uint64_t size, const int32_t* importerPids,
                            int32_t nPids, tuttiPluginIpcHandle_v1* handle);
  /* Maps a peer's exported memory on `device`; *ptr points at the exported
   * pointer (offset applied). handle->fd, if not -1, is a descriptor valid in
   * this process that tutti closes after the call: dup() it if needed later.
   * Blocking. */
  ncclResult_t (*ipcImport)(void* ctx, int32_t device, const tuttiPluginIpcHandle_v1* handle,
                            void** ptr);
  /* Unmaps memory from ipcImport (the pointer ipcImport returned). No queued
   * work may still use it. Blocking. */
  ncclResult_t (*ipcClose)(void* ctx, void* ptr);

  /* ---- kernels: async on queue; NULL = host fallback (see top) ---- */
  /* Element-wise reduction of args->nSrcs buffers, see tuttiPluginReduceArgs_v1.
   * args is read before reduce() returns. Must support every datatype and op;
   * ncclInvalidArgument for a combination makes tutti fall back to the host. */
  ncclResult_t (*reduce)(void* ctx, const tuttiPluginReduceArgs_v1* args, tuttiPluginQueue_t queue);
  /* dst[i] = convert(src[i]) scaled: for fp32 -> fp16/bf16, dst = round(src * scale);
   * for fp16/bf16 -> fp32, dst = float(src) * scale. The product is computed in
   * fp32; rounding is to nearest even; overflow gives +-inf, NaN stays NaN.
   * Only those four type pairs are required (others: ncclInvalidArgument).
   * dst and src must not overlap. */
  ncclResult_t (*castScaled)(void* ctx, void* dst, int32_t dstType, const void* src,
                             int32_t srcType, uint64_t count, float scale,
                             tuttiPluginQueue_t queue);
  /* 1-bit quantisation with error feedback over fp32 data, producing exactly
   * the bytes tutti's 1-bit codec puts on the wire. Elements are grouped in
   * blocks of TUTTI_PLUGIN_SIGN_BLOCK (the last one may be shorter):
   *   c[i] = src[i] + error[i]               (float add; c = src when error is NULL)
   *   scale = (sum over the block of |c[i]|, accumulated in double into eight
   *            partial sums p[i % 8] in increasing i, combined as
   *            ((p0 + p4) + (p2 + p6)) + ((p1 + p5) + (p3 + p7))) / len,
   *           divided in double and rounded once to float; a NaN mean gives
   *           the quiet NaN 0x7fc00000
   *   wire block = [scale as 4 bytes, little-endian float][ceil(len/8) bytes]
   *                where bit i % 8 of byte i / 8 (LSB first) is 1 when c[i] < 0;
   *                unused high bits of the last byte are 0
   *   error[i] = c[i] - (bit ? -scale : scale)   (float subtract; when error != NULL)
   * Blocks follow each other without padding: a full block takes
   * 4 + TUTTI_PLUGIN_SIGN_BLOCK / 8 bytes. src and error may be the same buffer;
   * wire must not overlap them. */
  ncclResult_t (*pack1bit)(void* ctx, const float* src, float* error, void* wire, uint64_t count,
                           tuttiPluginQueue_t queue);
  /* Inverse of pack1bit: dst[i] = (accumulate ? dst[i] + d : d) with
   * d = (bit ? -scale : scale) of i's block (one float add when accumulating). */
  ncclResult_t (*unpack1bit)(void* ctx, float* dst, const void* wire, uint64_t count,
                             int32_t accumulate, tuttiPluginQueue_t queue);
  /* fp32 row-major GEMM for PowerSGD: C = alpha * op(A) * op(B) + beta * C, where
   * op(X) is X or its transpose (transA/transB != 0); op(A) is m x k, op(B) k x n,
   * C m x n; lda/ldb/ldc are row strides in elements. beta == 0 ignores C's old
   * contents (NaN included). NULL: host fallback. */
  ncclResult_t (*gemm)(void* ctx, int32_t transA, int32_t transB, int64_t m, int64_t n, int64_t k,
                       float alpha, const float* A, int64_t lda, const float* B, int64_t ldb,
                       float beta, float* C, int64_t ldc, tuttiPluginQueue_t queue);
  /* Orthonormalises the `cols` columns of the fp32 row-major rows x cols matrix
   * M (row stride ld) in place, in column order: from each column the
   * projections on the earlier (already orthonormal) columns are removed, then
   * it is divided by (norm + eps), so a zero column stays zero (eps >= 0; PowerSGD
   * uses 1e-8). Any numerically equivalent method is fine (the conformance
   * suite compares with a tolerance); tutti's host reference removes the
   * projections twice and accumulates in double. NULL: host fallback. */
  ncclResult_t (*orthogonalize)(void* ctx, float* M, int64_t rows, int64_t cols, int64_t ld,
                                float eps, tuttiPluginQueue_t queue);

  /* ---- appended to ABI v1 (tutti 0.1.x): read only when structSize covers
   *      them, so a plugin built against an older header leaves them unread;
   *      NULL = not offered ---- */
  /* Makes `device` the calling thread's current device: what currentDevice
   * answers on this thread from then on, and the device the NULL queue refers
   * to (CUDA: cudaSetDevice). Other threads keep theirs. Blocking (may
   * initialise the device). A device outside 0..deviceCount-1 is
   * ncclInvalidArgument with a lastError naming it. Optional: when NULL, tutti
   * accepts only the device currentDevice already answers and reports any
   * other as an error. */
  ncclResult_t (*setDevice)(void* ctx, int32_t device);
  /* Host events: order a queue after something the host completes, with no
   * host thread blocked. Optional, both or neither (tutti uses them only when
   * both are set): when NULL, tutti keeps the caller inside each operation on
   * a device queue until it has completed (it blocks the caller's thread, as
   * with plugins built before these fields existed).
   *
   * How tutti uses them: for an operation on a user's queue it records an
   * event on that queue and waits until the work queued before the call is
   * done (woken by launchHostFunc where offered, checking eventQuery now and
   * then; else polling eventQuery); before returning to the user it creates
   * a host event and calls eventWait(queue, hostEvent), so later work on the
   * queue waits for the operation; when the operation completes (or fails),
   * a tutti thread calls hostEventSignal, which releases the queue, then
   * eventDestroy.
   *
   * hostEventCreate makes an event on `device` that only the host completes.
   * It starts unsignalled and completes on hostEventSignal. With such an event:
   *   eventWait(queue, e)   async: later work on queue does not start until e
   *                         is signalled; the calling thread returns at once
   *                         (nothing to wait for once signalled);
   *   eventQuery(e)         *done = 0 until signalled, then 1;
   *   eventSynchronize(e)   blocks until signalled;
   *   eventRecord(e, q)     ncclInvalidArgument (no queue completes it);
   *   eventDestroy(e)       signals e first if it is not signalled, so a queue
   *                         still waiting on it is released (never left
   *                         waiting forever), and frees it once no queue can
   *                         still read it (a plugin defers what pending waits
   *                         still need);
   *   finalize              signals every host event not destroyed yet before
   *                         it drains and releases the queues.
   * A queue held by a host event also holds whatever waits for that queue
   * (queueSynchronize on it, events recorded after the wait, and on CUDA
   * device-wide synchronisation such as cudaFree): the thread that is to
   * signal must not make such calls before it has signalled.
   * A backend whose queues are synchronous (every async call has completed
   * when it returns) cannot hold back later work without blocking the caller
   * and leaves these NULL; the built-in CPU backend implements them for
   * completeness and answers ncclInvalidArgument to an eventWait on a host
   * event that is not signalled yet (backends/cpu/cpu_backend.h).
   * hostEventCreate is blocking (it may allocate). */
  ncclResult_t (*hostEventCreate)(void* ctx, int32_t device, tuttiPluginEvent_t* event);
  /* Signals a host event from hostEventCreate: work queued behind an eventWait
   * on it may run. Idempotent (signalling again does nothing). Non-blocking:
   * never waits for a queue. May be called from any thread, concurrently with
   * any call on the same event other than eventDestroy. ncclInvalidArgument
   * for an event that is not a host event, where the backend can tell. */
  ncclResult_t (*hostEventSignal)(void* ctx, tuttiPluginEvent_t event);

  /* The PCI address of `device`, so that tutti can find the device in the
   * machine's topology (hwloc) and run its threads on the NUMA node nearest
   * to it. Writes a NUL-terminated string of the form "dddd:bb:dd.f" (domain,
   * bus, device, function in hexadecimal, as hwloc and sysfs write it; upper
   * or lower case; the domain may have up to 8 digits, e.g. CUDA's
   * "00000000:17:00.0", or be left out) into busId, which holds len bytes
   * (tutti passes TUTTI_PLUGIN_PCI_BUS_ID_BYTES). A device whose address is
   * not known (an emulated device, a driver without the query) is answered
   * with ncclSuccess and "" (an empty string). A device outside
   * 0..deviceCount-1, a NULL busId or a len too short for the answer is
   * ncclInvalidArgument with a lastError naming it. Blocking (may ask the
   * driver); does not touch queues. Optional: NULL means not offered, and
   * tutti then leaves its threads where the caller's mask puts them. */
  ncclResult_t (*devicePciBusId)(void* ctx, int32_t device, char* busId, uint64_t len);

  /* Async: calls fn(arg) once, on a thread of the backend's choosing, when
   * `queue` reaches this point (all work enqueued on it before the call has
   * completed, its memory effects visible to fn); work enqueued after the
   * call starts only once fn has returned (CUDA: cudaLaunchHostFunc). tutti
   * uses it to sleep until a user's queue reaches an operation instead of
   * polling eventQuery; its fn only takes a lock and wakes a thread. fn must
   * not call into the backend and must not block for long. A backend whose
   * queues are synchronous may call fn before launchHostFunc returns. Once
   * the call has succeeded fn runs exactly once, even if the queue is
   * destroyed before reaching this point (queueDestroy lets its work finish)
   * or finalize is called first (it must not drop pending calls); only a
   * device that has failed (a sticky error that its queries report) may drop
   * it. On an error fn is never called. ncclInvalidArgument: not
   * offered for this queue (the CUDA backend where host events block CUDA's
   * callback thread, so that a held queue would hold every callback): tutti
   * polls for that operation instead. Optional: NULL means tutti polls
   * eventQuery (backing off to short naps) while it waits for a queue. */
  ncclResult_t (*launchHostFunc)(void* ctx, tuttiPluginQueue_t queue, void (*fn)(void* arg),
                                 void* arg);

  /* New fields are appended here (abiVersion stays 1 while only appending). */
} tuttiBackendPlugin_v1;

/* The entry point every plugin exports. hostAbiVersion is the newest plugin ABI
 * this libtutti understands; a plugin supporting several may return the table
 * of the newest one <= hostAbiVersion. Returns NULL if the plugin cannot run
 * here. Called once per process, before init(); must be cheap and not touch
 * the device. */
typedef const tuttiBackendPlugin_v1* (*tuttiBackendPluginInitFn)(uint32_t hostAbiVersion);
TUTTI_PLUGIN_EXPORT const tuttiBackendPlugin_v1* tuttiBackendPluginInit(uint32_t hostAbiVersion);

/* ---- Layout checks (C11 / C++11 and later) ------------------------------- */
#if defined(__cplusplus) && __cplusplus >= 201103L
#define TUTTI_PLUGIN_STATIC_ASSERT_(cond, msg) static_assert(cond, msg)
#elif defined(__STDC_VERSION__) && __STDC_VERSION__ >= 201112L
#define TUTTI_PLUGIN_STATIC_ASSERT_(cond, msg) _Static_assert(cond, msg)
#endif
#ifdef TUTTI_PLUGIN_STATIC_ASSERT_
TUTTI_PLUGIN_STATIC_ASSERT_(offsetof(tuttiBackendPlugin_v1, abiVersion) == 0,
                            "abiVersion must be the first field");
TUTTI_PLUGIN_STATIC_ASSERT_(offsetof(tuttiBackendPlugin_v1, structSize) == 4,
                            "structSize must follow abiVersion");
TUTTI_PLUGIN_STATIC_ASSERT_(offsetof(tuttiBackendHost_v1, structSize) == 4,
                            "host table starts like the plugin table");
TUTTI_PLUGIN_STATIC_ASSERT_(sizeof(tuttiPluginIpcHandle_v1) == 24 + TUTTI_PLUGIN_IPC_HANDLE_BYTES,
                            "IPC handle layout");
#undef TUTTI_PLUGIN_STATIC_ASSERT_
#endif

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* TUTTI_BACKEND_PLUGIN_H_ */
