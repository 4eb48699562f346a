/*
 * Deliberately broken device backend plugins, for the tests of tutti's plugin
 * loading errors (plugin_load_errors_test.cc) and of tutti-conformance's exit
 * codes (tests/device/CMakeLists.txt). Each is the working template plugin
 * (backends/template/template_backend.c) with one thing wrong, chosen by
 * exactly one -D flag:
 *
 *   BROKEN_NULL_MEMALLOC    the table's memAlloc is NULL
 *   BROKEN_NULL_EVENT_SYNC  the table's eventSynchronize (the last required one) is NULL
 *   BROKEN_ENTRY_NULL       tuttiBackendPluginInit returns NULL
 *   BROKEN_ABI_VERSION      the table says abiVersion 99
 *   BROKEN_SHORT_TABLE      structSize covers only the first 16 bytes
 *   BROKEN_NO_NAME          the table's name is NULL
 *   BROKEN_NO_ENTRY         tuttiBackendPluginInit is not exported at all
 *   BROKEN_INIT_FAILS       init() fails as on a machine without the device
 *   BROKEN_WRONG_REDUCE     loads fine, but its reduce kernel writes zeros
 *   BROKEN_OLD_TABLE        not broken: a table from before setDevice and the host
 *                           events were appended (structSize ends before them); the
 *                           bytes after it hold garbage pointers tutti must never read
 *   BROKEN_PRE_PCI_TABLE    not broken: a table from before devicePciBusId was appended
 *                           (structSize ends before it, garbage pointers follow, for it
 *                           and for launchHostFunc)
 */
/* The template's entry point is renamed so that this file can wrap it. */
#define tuttiBackendPluginInit templateEntry
#include "backends/template/template_backend.c"
#undef tuttiBackendPluginInit

#if defined(BROKEN_INIT_FAILS)
static ncclResult_t brokenInit(const tuttiBackendHost_v1* host, void** ctx) {
  (void)host;
  *ctx = NULL;
  return setError(ncclUnhandledCudaError, "no device found (deliberately)");
}
#endif

#if defined(BROKEN_WRONG_REDUCE)
static ncclResult_t brokenReduce(void* ctx, const tuttiPluginReduceArgs_v1* args,
                                 tuttiPluginQueue_t queue) {
  (void)ctx;
  (void)queue;
  if (args->count) memset(args->dst, 0, (size_t)args->count); /* wrong: zeros, and too few */
  return ncclSuccess;
}
#endif

/* A pointer tutti must never call: it lies beyond the table's structSize. */
#define BROKEN_GARBAGE_HOST_FUNC \
  ((ncclResult_t(*)(void*, tuttiPluginQueue_t, void (*)(void*), void*))(uintptr_t)0x5a5a5a5a5a)

#if !defined(BROKEN_NO_ENTRY)
TUTTI_PLUGIN_EXPORT const tuttiBackendPlugin_v1* tuttiBackendPluginInit(uint32_t hostAbiVersion);

TUTTI_PLUGIN_EXPORT const tuttiBackendPlugin_v1* tuttiBackendPluginInit(uint32_t hostAbiVersion) {
  static tuttiBackendPlugin_v1 table;
  const tuttiBackendPlugin_v1* base = templateEntry(hostAbiVersion);
  if (!base) return NULL;
  table = *base;
  table.name = "broken";
#if defined(BROKEN_NULL_MEMALLOC)
  table.memAlloc = NULL;
#elif defined(BROKEN_NULL_EVENT_SYNC)
  table.eventSynchronize = NULL;
#elif defined(BROKEN_ENTRY_NULL)
  return NULL;
#elif defined(BROKEN_ABI_VERSION)
  table.abiVersion = 99;
#elif defined(BROKEN_SHORT_TABLE)
  table.structSize = 16;
#elif defined(BROKEN_NO_NAME)
  table.name = NULL;
#elif defined(BROKEN_INIT_FAILS)
  table.init = brokenInit;
#elif defined(BROKEN_WRONG_REDUCE)
  table.reduce = brokenReduce;
#elif defined(BROKEN_OLD_TABLE)
  table.structSize = (uint32_t)offsetof(tuttiBackendPlugin_v1, setDevice);
  table.setDevice = (ncclResult_t(*)(void*, int32_t))(uintptr_t)0x5a5a5a5a;
  table.hostEventCreate = (ncclResult_t(*)(void*, int32_t, tuttiPluginEvent_t*))(uintptr_t)0x5a5a;
  table.hostEventSignal = (ncclResult_t(*)(void*, tuttiPluginEvent_t))(uintptr_t)0x5a;
  table.devicePciBusId = (ncclResult_t(*)(void*, int32_t, char*, uint64_t))(uintptr_t)0x5a5a5a;
  table.launchHostFunc = BROKEN_GARBAGE_HOST_FUNC;
#elif defined(BROKEN_PRE_PCI_TABLE)
  table.structSize = (uint32_t)offsetof(tuttiBackendPlugin_v1, devicePciBusId);
  table.devicePciBusId = (ncclResult_t(*)(void*, int32_t, char*, uint64_t))(uintptr_t)0x5a5a5a;
  table.launchHostFunc = BROKEN_GARBAGE_HOST_FUNC;
#else
#error "choose what is broken with one BROKEN_* flag"
#endif
  return &table;
}
#endif
