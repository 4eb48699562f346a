/* abi_plugin_header, C half: tutti/backend_plugin.h and tutti/tutti.h compile
 * as strict C99, and a minimal plugin table can be written in C. Reports the
 * C compiler's view of the layouts so the C++ half can compare. */
#include <stddef.h>
#include <stdint.h>

#include "tutti/backend_plugin.h"
#include "tutti/tutti.h"

#define ABI_CHECK(name, cond) typedef char abi_check_##name[(cond) ? 1 : -1]
ABI_CHECK(abi_version_first, offsetof(tuttiBackendPlugin_v1, abiVersion) == 0);
ABI_CHECK(struct_size_second, offsetof(tuttiBackendPlugin_v1, structSize) == 4);
ABI_CHECK(ipc_handle_fits, TUTTI_PLUGIN_IPC_HANDLE_BYTES <= 64);

static ncclResult_t emuInit(const tuttiBackendHost_v1* host, void** ctx) {
  (void)host;
  *ctx = NULL;
  return ncclSuccess;
}

/* Designated initializers: fields not named are NULL / 0 (host fallbacks). */
static const tuttiBackendPlugin_v1 kTable = {
    .abiVersion = TUTTI_BACKEND_PLUGIN_ABI_VERSION,
    .structSize = (uint32_t)sizeof(tuttiBackendPlugin_v1),
    .name = "abi_test",
    .capabilities = 0,
    .init = emuInit,
};

/* The entry point, with exactly the declared type. */
const tuttiBackendPlugin_v1* tuttiBackendPluginInit(uint32_t hostAbiVersion) {
  return hostAbiVersion >= 1u ? &kTable : NULL;
}

/* Layout as seen from C, in a fixed order mirrored by plugin_header_cxx.cc. */
size_t pluginLayoutC(size_t* out, size_t max) {
  size_t n = 0;
#define PUT(x)                       \
  if (n < max) out[n] = (size_t)(x); \
  n++
  PUT(sizeof(tuttiBackendPlugin_v1));
  PUT(offsetof(tuttiBackendPlugin_v1, name));
  PUT(offsetof(tuttiBackendPlugin_v1, capabilities));
  PUT(offsetof(tuttiBackendPlugin_v1, init));
  PUT(offsetof(tuttiBackendPlugin_v1, queryPointer));
  PUT(offsetof(tuttiBackendPlugin_v1, memcpyAsync));
  PUT(offsetof(tuttiBackendPlugin_v1, eventSynchronize));
  PUT(offsetof(tuttiBackendPlugin_v1, ipcExport));
  PUT(offsetof(tuttiBackendPlugin_v1, reduce));
  PUT(offsetof(tuttiBackendPlugin_v1, orthogonalize));
  PUT(offsetof(tuttiBackendPlugin_v1, setDevice));
  PUT(offsetof(tuttiBackendPlugin_v1, hostEventSignal));
  PUT(offsetof(tuttiBackendPlugin_v1, devicePciBusId));
  PUT(offsetof(tuttiBackendPlugin_v1, launchHostFunc));
  PUT(sizeof(tuttiBackendHost_v1));
  PUT(sizeof(tuttiPluginPointerInfo_v1));
  PUT(offsetof(tuttiPluginPointerInfo_v1, base));
  PUT(sizeof(tuttiPluginIpcHandle_v1));
  PUT(offsetof(tuttiPluginIpcHandle_v1, data));
  PUT(sizeof(tuttiPluginReduceArgs_v1));
  PUT(offsetof(tuttiPluginReduceArgs_v1, count));
  PUT(offsetof(tuttiPluginReduceArgs_v1, scalar));
  PUT(offsetof(tuttiPluginReduceArgs_v1, avgDivisor));
#undef PUT
  return n;
}
