// abi_plugin_header, C++ half: the same headers as C++17 (their own
// static_asserts included), layout identical to the C compiler's view, and the
// C-defined plugin entry point callable through the declared pointer type.
#include <cstddef>
#include <cstdio>
#include <type_traits>

#include "tutti/backend_plugin.h"
#include "tutti/tutti.h"

static_assert(offsetof(tuttiBackendPlugin_v1, abiVersion) == 0, "abiVersion first");
static_assert(offsetof(tuttiBackendPlugin_v1, structSize) == 4, "structSize second");
// Fields appended to v1 follow each other in the order they were appended,
// one pointer each, after orthogonalize (the last field of the first v1): a
// field inserted in between would move what older plugins put there.
constexpr size_t kPtr = sizeof(void*);
#define TUTTI_FOLLOWS(field, previous)                                                       \
  static_assert(offsetof(tuttiBackendPlugin_v1, field) ==                                    \
                    offsetof(tuttiBackendPlugin_v1, previous) + kPtr,                        \
                #field " follows " #previous)
TUTTI_FOLLOWS(setDevice, orthogonalize);  // the first appended field
TUTTI_FOLLOWS(hostEventCreate, setDevice);
TUTTI_FOLLOWS(hostEventSignal, hostEventCreate);
TUTTI_FOLLOWS(devicePciBusId, hostEventSignal);
TUTTI_FOLLOWS(launchHostFunc, devicePciBusId);
#undef TUTTI_FOLLOWS
static_assert(sizeof(tuttiBackendPlugin_v1) ==
                  offsetof(tuttiBackendPlugin_v1, launchHostFunc) + kPtr,
              "launchHostFunc is the last field");
static_assert(std::is_trivially_copyable<tuttiBackendPlugin_v1>::value, "plain data");
static_assert(std::is_standard_layout<tuttiBackendPlugin_v1>::value, "plain data");
static_assert(std::is_trivially_copyable<tuttiPluginIpcHandle_v1>::value, "plain data");
static_assert(std::is_trivially_copyable<tuttiPluginReduceArgs_v1>::value, "plain data");
static_assert(std::is_trivially_copyable<tuttiPluginPointerInfo_v1>::value, "plain data");
static_assert(sizeof(tuttiPluginIpcHandle_v1) <= 128, "IPC handle stays small");
static_assert(TUTTI_PLUGIN_OP_SUM == ncclSum && TUTTI_PLUGIN_OP_AVG == ncclAvg,
              "plugin ops share NCCL's values");
static_assert(std::is_same<decltype(&tuttiBackendPluginInit), tuttiBackendPluginInitFn>::value,
              "entry point type");
static_assert(std::is_same<decltype(&tuttiGetVersion), ncclResult_t (*)(int*)>::value,
              "tuttiGetVersion signature");
static_assert(std::is_same<decltype(&tuttiLibraryPath), const char* (*)()>::value,
              "tuttiLibraryPath signature");

extern "C" size_t pluginLayoutC(size_t* out, size_t max);

int main() {
  const size_t cxx[] = {
      sizeof(tuttiBackendPlugin_v1),
      offsetof(tuttiBackendPlugin_v1, name),
      offsetof(tuttiBackendPlugin_v1, capabilities),
      offsetof(tuttiBackendPlugin_v1, init),
      offsetof(tuttiBackendPlugin_v1, queryPointer),
      offsetof(tuttiBackendPlugin_v1, memcpyAsync),
      offsetof(tuttiBackendPlugin_v1, eventSynchronize),
      offsetof(tuttiBackendPlugin_v1, ipcExport),
      offsetof(tuttiBackendPlugin_v1, reduce),
      offsetof(tuttiBackendPlugin_v1, orthogonalize),
      offsetof(tuttiBackendPlugin_v1, setDevice),
      offsetof(tuttiBackendPlugin_v1, hostEventSignal),
      offsetof(tuttiBackendPlugin_v1, devicePciBusId),
      offsetof(tuttiBackendPlugin_v1, launchHostFunc),
      sizeof(tuttiBackendHost_v1),
      sizeof(tuttiPluginPointerInfo_v1),
      offsetof(tuttiPluginPointerInfo_v1, base),
      sizeof(tuttiPluginIpcHandle_v1),
      offsetof(tuttiPluginIpcHandle_v1, data),
      sizeof(tuttiPluginReduceArgs_v1),
      offsetof(tuttiPluginReduceArgs_v1, count),
      offsetof(tuttiPluginReduceArgs_v1, scalar),
      offsetof(tuttiPluginReduceArgs_v1, avgDivisor),
  };
  constexpr size_t kN = sizeof(cxx) / sizeof(cxx[0]);
  size_t c[kN + 1] = {};
  int bad = 0;
  if (pluginLayoutC(c, kN + 1) != kN) {
    std::printf("C and C++ halves list different numbers of facts\n");
    return 1;
  }
  for (size_t i = 0; i < kN; ++i) {
    if (c[i] != cxx[i]) {
      std::printf("layout fact %zu differs: C %zu, C++ %zu\n", i, c[i], cxx[i]);
      ++bad;
    }
  }

  tuttiBackendPluginInitFn entry = &tuttiBackendPluginInit;
  const tuttiBackendPlugin_v1* table = entry(TUTTI_BACKEND_PLUGIN_ABI_VERSION);
  if (table == nullptr || table->abiVersion != 1u ||
      table->structSize != sizeof(tuttiBackendPlugin_v1) || table->init == nullptr ||
      table->reduce != nullptr) {
    std::printf("plugin table written in C reads wrong from C++\n");
    ++bad;
  }
  if (entry(0) != nullptr) {
    std::printf("entry point ignored hostAbiVersion\n");
    ++bad;
  }
  std::printf("plugin ABI v%u: table %zu bytes, %d differences\n", TUTTI_BACKEND_PLUGIN_ABI_VERSION,
              sizeof(tuttiBackendPlugin_v1), bad);
  return bad == 0 ? 0 : 1;
}
