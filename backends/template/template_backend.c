/*
 * template_backend.c -- a minimal, complete tutti device backend plugin to
 * start a vendor backend from (docs/backends.md, "Writing a plugin").
 *
 * It implements every REQUIRED function of tuttiBackendPlugin_v1
 * (include/tutti/backend_plugin.h) on plain host memory, so it builds and
 * passes tutti-conformance as it is. Every place where a real accelerator's
 * runtime call goes is marked TODO(vendor). The optional parts are left NULL:
 *   - IPC (ipcExport/ipcImport/ipcClose): peers then exchange data through
 *     pinned host memory;
 *   - the kernels (reduce, castScaled, pack1bit, unpack1bit, gemm,
 *     orthogonalize): tutti then runs its CPU reference kernels on staged
 *     copies (correct, slow, logged once at INFO). Add them one at a time and
 *     re-run tutti-conformance: it checks each against the reference;
 *   - host events (hostEventCreate, hostEventSignal): tutti then keeps the
 *     caller inside each operation on a device queue until it has completed.
 *     They need queues that can hold back work while the host goes on, which
 *     this template's synchronous queues cannot do; with a real runtime,
 *     implement them as the header describes (a host-signalled event or a
 *     flag in host memory the device waits on) and tutti-conformance's
 *     HostEventOrdersAQueue checks them.
 * setDevice is implemented (one device: only device 0 can be made current).
 *
 * "Device" memory here is host memory from posix_memalign; the allocation
 * list below exists only so that queryPointer can answer DEVICE with the
 * allocation's base and size (a real runtime answers that itself, e.g.
 * cuPointerGetAttributes / zeMemGetAllocProperties). Queues and events are
 * trivial because every operation completes before it returns.
 *
 * Rules the plugin ABI sets (see the header): never print, never abort or
 * exit, never let an exception escape; return an ncclResult_t and keep the
 * reason for lastError (per thread); log through host->log.
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tutti/backend_plugin.h>

/* TODO(vendor): your backend's short lowercase name; the build passes it
 * (CMake variable PLUGIN_NAME, which also names the file
 * libtutti-backend-<name>.so). */
#ifndef PLUGIN_NAME
#define PLUGIN_NAME "template"
#endif

/* ---- errors: the reason of the last failure, per thread ------------------- */

static _Thread_local char t_lastError[256];

static ncclResult_t setError(ncclResult_t code, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = snprintf(t_lastError, sizeof(t_lastError), "%s: ", PLUGIN_NAME);
  if (n < 0 || (size_t)n >= sizeof(t_lastError)) n = 0;
  vsnprintf(t_lastError + n, sizeof(t_lastError) - (size_t)n, fmt, ap);
  va_end(ap);
  return code;
}

/* ---- the context init() creates ----------------------------------------- */

typedef struct Allocation {
  void* base;
  uint64_t size;
  int32_t memoryType; /* TUTTI_PLUGIN_MEM_DEVICE or TUTTI_PLUGIN_MEM_HOST_PINNED */
  struct Allocation* next;
} Allocation;

typedef struct Context {
  const tuttiBackendHost_v1* host;
  pthread_mutex_t mu; /* guards allocations */
  Allocation* allocations;
  /* TODO(vendor): your runtime's handles (driver, context, device list). */
} Context;

/* Queues and events are real objects so that handles are distinct and
 * queueDestroy/eventDestroy can free them. */
typedef struct Queue {
  int32_t device; /* TODO(vendor): your runtime's stream / command queue */
} Queue;
typedef struct Event {
  int32_t device; /* TODO(vendor): your runtime's event */
} Event;

static void logLine(Context* c, int32_t level, const char* msg) {
  if (c->host && c->host->log) c->host->log(level, msg);
}

static ncclResult_t track(Context* c, void* base, uint64_t size, int32_t memoryType) {
  Allocation* a = (Allocation*)malloc(sizeof(*a));
  if (!a) return setError(ncclSystemError, "out of host memory");
  a->base = base;
  a->size = size;
  a->memoryType = memoryType;
  pthread_mutex_lock(&c->mu);
  a->next = c->allocations;
  c->allocations = a;
  pthread_mutex_unlock(&c->mu);
  return ncclSuccess;
}

/* Removes ptr's record; 0 if ptr was not allocated as memoryType. */
static int untrack(Context* c, void* ptr, int32_t memoryType) {
  int found = 0;
  pthread_mutex_lock(&c->mu);
  for (Allocation** p = &c->allocations; *p; p = &(*p)->next) {
    if ((*p)->base == ptr && (*p)->memoryType == memoryType) {
      Allocation* a = *p;
      *p = a->next;
      free(a);
      found = 1;
      break;
    }
  }
  pthread_mutex_unlock(&c->mu);
  return found;
}

/* ---- life cycle ---------------------------------------------------------- */

static ncclResult_t tplInit(const tuttiBackendHost_v1* host, void** ctx) {
  /* TODO(vendor): open your driver here. With no driver or no device, fail
   * (do not crash): return ncclUnhandledCudaError with the reason in
   * lastError, and tutti reports "init failed: <reason>". */
  Context* c = (Context*)calloc(1, sizeof(*c));
  if (!c) return setError(ncclSystemError, "out of host memory");
  c->host = host;
  pthread_mutex_init(&c->mu, NULL);
  *ctx = c;
  logLine(c, TUTTI_PLUGIN_LOG_INFO, PLUGIN_NAME ": 1 device (host memory)");
  return ncclSuccess;
}

static ncclResult_t tplFinalize(void* ctx) {
  Context* c = (Context*)ctx;
  if (!c) return ncclSuccess;
  /* TODO(vendor): release what init created. */
  while (c->allocations) {
    Allocation* a = c->allocations;
    c->allocations = a->next;
    free(a->base);
    free(a);
  }
  pthread_mutex_destroy(&c->mu);
  free(c);
  return ncclSuccess;
}

static const char* tplLastError(void* ctx) {
  (void)ctx;
  return t_lastError;
}

/* ---- devices ------------------------------------------------------------- */

static ncclResult_t tplDeviceCount(void* ctx, int32_t* count) {
  (void)ctx;
  *count = 1; /* TODO(vendor): the number of devices your runtime reports */
  return ncclSuccess;
}

static ncclResult_t tplCurrentDevice(void* ctx, int32_t* device) {
  (void)ctx;
  *device = 0; /* TODO(vendor): the calling thread's current device */
  return ncclSuccess;
}

static ncclResult_t tplSetDevice(void* ctx, int32_t device) {
  (void)ctx;
  /* TODO(vendor): make `device` current for the calling thread only. */
  if (device != 0) return setError(ncclInvalidArgument, "setDevice: no device %d", (int)device);
  return ncclSuccess;
}

/* ---- memory -------------------------------------------------------------- */

static ncclResult_t tplQueryPointer(void* ctx, const void* ptr, tuttiPluginPointerInfo_v1* info) {
  Context* c = (Context*)ctx;
  /* TODO(vendor): ask your runtime; answer UNKNOWN for pointers it does not know. */
  info->memoryType = TUTTI_PLUGIN_MEM_UNKNOWN;
  info->device = -1;
  info->base = NULL;
  info->size = 0;
  const char* p = (const char*)ptr;
  pthread_mutex_lock(&c->mu);
  for (Allocation* a = c->allocations; a; a = a->next) {
    const char* base = (const char*)a->base;
    if (p >= base && p < base + a->size) {
      info->memoryType = a->memoryType;
      info->device = a->memoryType == TUTTI_PLUGIN_MEM_DEVICE ? 0 : -1;
      info->base = a->base;
      info->size = a->size;
      break;
    }
  }
  pthread_mutex_unlock(&c->mu);
  return ncclSuccess;
}

static ncclResult_t allocTracked(Context* c, uint64_t size, int32_t memoryType, void** ptr) {
  *ptr = NULL;
  if (size == 0) return ncclSuccess;
  void* p = NULL;
  int err = posix_memalign(&p, 256, (size_t)size);
  if (err)
    return setError(ncclSystemError, "cannot allocate %llu bytes: %s", (unsigned long long)size,
                    strerror(err));
  ncclResult_t rc = track(c, p, size, memoryType);
  if (rc != ncclSuccess) {
    free(p);
    return rc;
  }
  *ptr = p;
  return ncclSuccess;
}

static ncclResult_t freeTracked(Context* c, void* ptr, int32_t memoryType, const char* what) {
  if (!ptr) return ncclSuccess;
  if (!untrack(c, ptr, memoryType))
    return setError(ncclInvalidArgument, "%s: %p was not allocated by this backend", what, ptr);
  free(ptr);
  return ncclSuccess;
}

static ncclResult_t tplMemAlloc(void* ctx, int32_t device, uint64_t size, void** ptr) {
  if (device != 0) return setError(ncclInvalidArgument, "memAlloc: no device %d", (int)device);
  /* TODO(vendor): device memory from your runtime, aligned to >= 256 bytes. */
  return allocTracked((Context*)ctx, size, TUTTI_PLUGIN_MEM_DEVICE, ptr);
}

static ncclResult_t tplMemFree(void* ctx, void* ptr) {
  return freeTracked((Context*)ctx, ptr, TUTTI_PLUGIN_MEM_DEVICE, "memFree");
}

static ncclResult_t tplHostAlloc(void* ctx, uint64_t size, void** ptr) {
  /* TODO(vendor): page-locked host memory from your runtime. */
  return allocTracked((Context*)ctx, size, TUTTI_PLUGIN_MEM_HOST_PINNED, ptr);
}

static ncclResult_t tplHostFree(void* ctx, void* ptr) {
  return freeTracked((Context*)ctx, ptr, TUTTI_PLUGIN_MEM_HOST_PINNED, "hostFree");
}

static ncclResult_t tplMemcpyAsync(void* ctx, void* dst, const void* src, uint64_t bytes,
                                   tuttiPluginQueue_t queue) {
  (void)ctx;
  (void)queue;
  /* TODO(vendor): enqueue the copy on `queue` (NULL: the default queue); the
   * direction follows from where dst and src live. */
  if (bytes) memmove(dst, src, (size_t)bytes);
  return ncclSuccess;
}

/* ---- queues -------------------------------------------------------------- */

static ncclResult_t tplQueueCreate(void* ctx, int32_t device, tuttiPluginQueue_t* queue) {
  (void)ctx;
  if (device != 0) return setError(ncclInvalidArgument, "queueCreate: no device %d", (int)device);
  Queue* q = (Queue*)calloc(1, sizeof(*q)); /* TODO(vendor): create a non-blocking stream */
  if (!q) return setError(ncclSystemError, "out of host memory");
  q->device = device;
  *queue = (tuttiPluginQueue_t)q;
  return ncclSuccess;
}

static ncclResult_t tplQueueDestroy(void* ctx, tuttiPluginQueue_t queue) {
  (void)ctx;
  free(queue); /* TODO(vendor): destroy the stream (without waiting for it) */
  return ncclSuccess;
}

static ncclResult_t tplQueueSynchronize(void* ctx, tuttiPluginQueue_t queue) {
  (void)ctx;
  (void)queue; /* TODO(vendor): wait until the queue has drained */
  return ncclSuccess;
}

/* ---- events -------------------------------------------------------------- */

static ncclResult_t tplEventCreate(void* ctx, int32_t device, tuttiPluginEvent_t* event) {
  (void)ctx;
  if (device != 0) return setError(ncclInvalidArgument, "eventCreate: no device %d", (int)device);
  Event* e = (Event*)calloc(1, sizeof(*e)); /* TODO(vendor): create an event (no timing) */
  if (!e) return setError(ncclSystemError, "out of host memory");
  e->device = device;
  *event = (tuttiPluginEvent_t)e;
  return ncclSuccess;
}

static ncclResult_t tplEventDestroy(void* ctx, tuttiPluginEvent_t event) {
  (void)ctx;
  free(event); /* TODO(vendor): destroy the event */
  return ncclSuccess;
}

static ncclResult_t tplEventRecord(void* ctx, tuttiPluginEvent_t event, tuttiPluginQueue_t queue) {
  (void)ctx;
  (void)event;
  (void)queue; /* TODO(vendor): record the event at the current end of the queue */
  return ncclSuccess;
}

static ncclResult_t tplEventWait(void* ctx, tuttiPluginQueue_t queue, tuttiPluginEvent_t event) {
  (void)ctx;
  (void)queue;
  (void)event; /* TODO(vendor): make later work on the queue wait for the event */
  return ncclSuccess;
}

static ncclResult_t tplEventQuery(void* ctx, tuttiPluginEvent_t event, int32_t* done) {
  (void)ctx;
  (void)event;
  *done = 1; /* TODO(vendor): 1 once the event has completed (or was never recorded) */
  return ncclSuccess;
}

static ncclResult_t tplEventSynchronize(void* ctx, tuttiPluginEvent_t event) {
  (void)ctx;
  (void)event; /* TODO(vendor): wait for the event */
  return ncclSuccess;
}

/* ---- the table ----------------------------------------------------------- */

static const tuttiBackendPlugin_v1 kTable = {
    .abiVersion = TUTTI_BACKEND_PLUGIN_ABI_VERSION,
    .structSize = sizeof(tuttiBackendPlugin_v1),
    .name = PLUGIN_NAME,
    .capabilities = 0, /* TODO(vendor): TUTTI_PLUGIN_CAP_* bits */
    .init = tplInit,
    .finalize = tplFinalize,
    .lastError = tplLastError,
    .deviceCount = tplDeviceCount,
    .currentDevice = tplCurrentDevice,
    .queryPointer = tplQueryPointer,
    .memAlloc = tplMemAlloc,
    .memFree = tplMemFree,
    .hostAlloc = tplHostAlloc,
    .hostFree = tplHostFree,
    .memcpyAsync = tplMemcpyAsync,
    .queueCreate = tplQueueCreate,
    .queueDestroy = tplQueueDestroy,
    .queueSynchronize = tplQueueSynchronize,
    .eventCreate = tplEventCreate,
    .eventDestroy = tplEventDestroy,
    .eventRecord = tplEventRecord,
    .eventWait = tplEventWait,
    .eventQuery = tplEventQuery,
    .eventSynchronize = tplEventSynchronize,
    /* Optional, NULL here (see the top of this file):
     * TODO(vendor): .ipcExport, .ipcImport, .ipcClose (all three or none),
     * .reduce, .castScaled, .pack1bit, .unpack1bit, .gemm, .orthogonalize,
     * .hostEventCreate and .hostEventSignal (both or none). */
    .setDevice = tplSetDevice,
};

/* The one exported symbol. Cheap, touches no device: return NULL only if this
 * plugin cannot run in this process at all (tutti then reports that the
 * plugin declined). */
TUTTI_PLUGIN_EXPORT const tuttiBackendPlugin_v1* tuttiBackendPluginInit(uint32_t hostAbiVersion) {
  if (hostAbiVersion < 1) return NULL; /* this plugin speaks ABI version 1 */
  return &kTable;
}
