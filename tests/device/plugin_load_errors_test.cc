// A device backend plugin that cannot be used is an error with a message that
// names the plugin and what is wrong with it, and the right ncclResult_t:
//
//   a required function is NULL      ncclInvalidArgument, names the function
//   ABI version / table size / name  ncclInvalidArgument
//   no entry symbol, not found       ncclInvalidArgument
//   the entry point returns NULL     ncclSystemError (the plugin declined: no
//                                    device runtime call failed, so never
//                                    ncclUnhandledCudaError, "unhandled cuda error")
//   init() fails                     ncclUnhandledCudaError with the plugin's lastError
//
// First through tutti's loader in this process (core::Backend::load), then as
// an NCCL program sees it: plugin_error_probe, linked against libtutti.so, run
// with TUTTI_BACKEND_PLUGIN=<plugin> and NCCL_DEBUG=WARN, prints the codes,
// ncclGetErrorString and ncclGetLastError of ncclMemAlloc and
// ncclCommInitRank; the WARN log line must carry the same message.
// The plugins are tests/device/broken_plugin.c built once per BROKEN_* flag.
// PluginTableSize: tables shorter than this tutti's (a plugin built before
// fields were appended) load and read the missing fields as NULL.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <string>

#include "backends/cpu/cpu_backend.h"
#include "core/backend.h"

namespace tutti {
namespace {

using core::Backend;

struct Expect {
  Code code;
  std::string message;  // the exact message of Backend::load
};

void expectLoadFails(const std::string& path, const Expect& want) {
  auto b = Backend::load(path);
  ASSERT_FALSE(b.isOk()) << path << " loaded";
  EXPECT_EQ(static_cast<int>(b.status().code()), static_cast<int>(want.code))
      << b.status().message();
  EXPECT_EQ(b.status().message(), want.message);
}

TEST(PluginLoadErrors, NullRequiredFunctionIsNamed) {
  expectLoadFails(
      BROKEN_NULL_MEMALLOC_PATH,
      {Code::kInvalidArgument, std::string("backend plugin ") + BROKEN_NULL_MEMALLOC_PATH +
                                   ": required function 'memAlloc' is NULL"});
  expectLoadFails(
      BROKEN_NULL_EVENT_SYNC_PATH,
      {Code::kInvalidArgument, std::string("backend plugin ") + BROKEN_NULL_EVENT_SYNC_PATH +
                                   ": required function 'eventSynchronize' is NULL"});
}

TEST(PluginLoadErrors, EntryReturningNullIsASystemErrorNamingThePlugin) {
  expectLoadFails(
      BROKEN_ENTRY_NULL_PATH,
      {Code::kSystemError,
       std::string("backend plugin ") + BROKEN_ENTRY_NULL_PATH +
           ": tuttiBackendPluginInit(1) returned NULL: the plugin declined to run in this "
           "process (no usable device, or it does not support plugin ABI version 1)"});
}

TEST(PluginLoadErrors, TableChecks) {
  expectLoadFails(
      BROKEN_ABI_VERSION_PATH,
      {Code::kInvalidArgument, std::string("backend plugin ") + BROKEN_ABI_VERSION_PATH +
                                   ": ABI version 99, this tutti speaks 1"});
  expectLoadFails(
      BROKEN_SHORT_TABLE_PATH,
      {Code::kInvalidArgument,
       std::string("backend plugin ") + BROKEN_SHORT_TABLE_PATH +
           ": table of 16 bytes is shorter than the " +
           std::to_string(offsetof(tuttiBackendPlugin_v1, eventSynchronize) + sizeof(void*)) +
           " bytes ABI version 1 requires"});
  expectLoadFails(BROKEN_NO_NAME_PATH,
                  {Code::kInvalidArgument,
                   std::string("backend plugin ") + BROKEN_NO_NAME_PATH + ": table has no name"});
  expectLoadFails(BROKEN_NO_ENTRY_PATH,
                  {Code::kInvalidArgument, std::string("backend plugin ") + BROKEN_NO_ENTRY_PATH +
                                               ": no symbol tuttiBackendPluginInit"});
}

TEST(PluginLoadErrors, InitFailureCarriesThePluginsReason) {
  expectLoadFails(
      BROKEN_INIT_FAILS_PATH,
      {Code::kUnhandledDeviceError, std::string("backend broken (") + BROKEN_INIT_FAILS_PATH +
                                        "): init failed: broken: no device found (deliberately)"});
}

TEST(PluginLoadErrors, MissingOrNotALibrary) {
  expectLoadFails("/nonexistent/libtutti-backend-x.so",
                  {Code::kInvalidArgument,
                   "backend plugin '/nonexistent/libtutti-backend-x.so' does not exist or is "
                   "unreadable"});
  const std::string text = ::testing::TempDir() + "libtutti-backend-text.so";
  std::ofstream(text) << "not an ELF file\n";
  auto b = Backend::load(text);
  ASSERT_FALSE(b.isOk());
  EXPECT_EQ(b.status().code(), Code::kInvalidArgument);
  EXPECT_EQ(b.status().message().rfind("backend plugin " + text + ": dlopen failed: ", 0), 0u)
      << b.status().message();
  std::remove(text.c_str());
}

// ---- tables of other sizes (not errors) -------------------------------------

// A plugin built before setDevice and the host events were appended to the
// table (its structSize ends before them, garbage follows) loads; tutti reads
// none of the new fields, and what they would do is answered without them.
TEST(PluginTableSize, TableFromBeforeHostEventsLoads) {
  auto b = Backend::load(BROKEN_OLD_TABLE_PATH);
  ASSERT_TRUE(b.isOk()) << b.status().message();
  Backend& be = *b.value();
  EXPECT_EQ(be.table().setDevice, nullptr);
  EXPECT_EQ(be.table().hostEventCreate, nullptr);
  EXPECT_EQ(be.table().hostEventSignal, nullptr);
  EXPECT_FALSE(be.hasHostEvents());
  EXPECT_TRUE(be.setDevice(0).isOk());  // already the current device
  Status st = be.setDevice(1);
  EXPECT_EQ(st.code(), Code::kInvalidUsage);
  EXPECT_EQ(st.message(),
            "backend broken: cannot make device 1 current: the plugin offers no setDevice and its "
            "current device is 0");
  auto he = be.hostEventCreate(0);
  ASSERT_FALSE(he.isOk());
  EXPECT_EQ(he.status().code(), Code::kInvalidUsage);
  EXPECT_EQ(he.status().message(),
            "backend broken offers no host events (hostEventCreate/hostEventSignal are NULL or "
            "beyond its table)");
  EXPECT_EQ(be.hostEventSignal(nullptr).code(), Code::kInvalidUsage);
  EXPECT_EQ(be.table().devicePciBusId, nullptr);
  EXPECT_FALSE(be.hasPciBusId());
  auto id = be.pciBusId(0);
  ASSERT_TRUE(id.isOk()) << id.status().message();
  EXPECT_EQ(id.value(), "");  // not offered: address unknown
  EXPECT_EQ(be.table().launchHostFunc, nullptr);
  EXPECT_FALSE(be.hasHostFuncs());
  bool ran = false;
  st = be.launchHostFunc(
      nullptr, [](void* p) { *static_cast<bool*>(p) = true; }, &ran);
  EXPECT_EQ(st.code(), Code::kInvalidUsage);
  EXPECT_EQ(st.message(),
            "backend broken offers no host functions (launchHostFunc is NULL or beyond its "
            "table)");
  EXPECT_FALSE(ran);
}

// A plugin built before devicePciBusId was appended (structSize ends right
// before it, garbage follows) loads with the fields before it intact, and
// its devices' bus ids are "not offered": "".
TEST(PluginTableSize, TableFromBeforePciBusIdLoads) {
  auto b = Backend::load(BROKEN_PRE_PCI_TABLE_PATH);
  ASSERT_TRUE(b.isOk()) << b.status().message();
  Backend& be = *b.value();
  EXPECT_NE(be.table().setDevice, nullptr);
  EXPECT_EQ(be.table().devicePciBusId, nullptr);
  EXPECT_FALSE(be.hasPciBusId());
  EXPECT_EQ(be.table().launchHostFunc, nullptr);
  EXPECT_FALSE(be.hasHostFuncs());
  for (int d : {0, 1, 7}) {
    auto id = be.pciBusId(d);
    ASSERT_TRUE(id.isOk()) << id.status().message();
    EXPECT_EQ(id.value(), "") << "device " << d;
  }
}

// Only whole fields are copied: one the structSize covers in part reads as
// NULL (here half of hostEventCreate); with the whole table, all are there.
TEST(PluginTableSize, FieldsPartlyCoveredReadAsNull) {
  tuttiBackendPlugin_v1 t = *cpu::backendPlugin();
  t.structSize = offsetof(tuttiBackendPlugin_v1, hostEventCreate) + 4;
  auto b = Backend::fromTable(&t, "a cut CPU table");
  ASSERT_TRUE(b.isOk()) << b.status().message();
  EXPECT_NE(b.value()->table().setDevice, nullptr);
  EXPECT_EQ(b.value()->table().hostEventCreate, nullptr);
  EXPECT_EQ(b.value()->table().hostEventSignal, nullptr);
  EXPECT_FALSE(b.value()->hasHostEvents());
  EXPECT_TRUE(b.value()->setDevice(0).isOk());
  EXPECT_FALSE(b.value()->setDevice(1).isOk());  // the plugin's own answer
  t.structSize = sizeof t;
  b = Backend::fromTable(&t, "the CPU table");
  ASSERT_TRUE(b.isOk()) << b.status().message();
  EXPECT_TRUE(b.value()->hasHostEvents());
  // The CPU backend offers no bus id (hostOnly); a field half covered reads NULL.
  EXPECT_FALSE(b.value()->hasPciBusId());
  auto id = b.value()->pciBusId(0);
  ASSERT_TRUE(id.isOk());
  EXPECT_EQ(id.value(), "");
  t.devicePciBusId = [](void*, int32_t, char* busId, uint64_t) {
    strcpy(busId, "0000:65:00.0");
    return ncclSuccess;
  };
  t.structSize = offsetof(tuttiBackendPlugin_v1, devicePciBusId) + 4;
  b = Backend::fromTable(&t, "a CPU table cut inside devicePciBusId");
  ASSERT_TRUE(b.isOk()) << b.status().message();
  EXPECT_FALSE(b.value()->hasPciBusId());
  t.structSize = sizeof t;
  b = Backend::fromTable(&t, "a CPU table with a bus id");
  ASSERT_TRUE(b.isOk()) << b.status().message();
  EXPECT_TRUE(b.value()->hasPciBusId());
  id = b.value()->pciBusId(0);
  ASSERT_TRUE(id.isOk());
  EXPECT_EQ(id.value(), "0000:65:00.0");
  // launchHostFunc, the last field: cut inside it reads NULL, whole it is
  // the CPU backend's, which runs fn before it returns (synchronous queues).
  EXPECT_TRUE(b.value()->hasHostFuncs());
  int calls = 0;
  auto count = [](void* p) { ++*static_cast<int*>(p); };
  EXPECT_TRUE(b.value()->launchHostFunc(nullptr, count, &calls).isOk());
  EXPECT_EQ(calls, 1);
  t.structSize = offsetof(tuttiBackendPlugin_v1, launchHostFunc) + 4;
  b = Backend::fromTable(&t, "a CPU table cut inside launchHostFunc");
  ASSERT_TRUE(b.isOk()) << b.status().message();
  EXPECT_FALSE(b.value()->hasHostFuncs());
  EXPECT_EQ(b.value()->launchHostFunc(nullptr, count, &calls).code(), Code::kInvalidUsage);
  EXPECT_EQ(calls, 1);
}

// ---- through the C API of libtutti.so, one process per plugin --------------

// key=value lines of the probe, and every line it printed.
struct ProbeOutput {
  std::map<std::string, std::string> values;
  std::string all;
};

ProbeOutput runProbe(const std::string& plugin) {
  ProbeOutput out;
  const std::string cmd = "env TUTTI_BACKEND_PLUGIN='" + plugin +
                          "' NCCL_DEBUG=WARN NCCL_SOCKET_IFNAME=lo '" PLUGIN_ERROR_PROBE "' 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return out;
  char line[4096];
  while (fgets(line, sizeof(line), p)) {
    std::string l = line;
    out.all += l;
    if (!l.empty() && l.back() == '\n') l.pop_back();
    auto eq = l.find('=');
    if (eq != std::string::npos && l.find(' ') > eq) out.values[l.substr(0, eq)] = l.substr(eq + 1);
  }
  EXPECT_EQ(pclose(p), 0) << out.all;
  return out;
}

bool contains(const std::string& hay, const std::string& needle) {
  return hay.find(needle) != std::string::npos;
}

// Both entry points fail with `code`, ncclGetLastError names the plugin and
// says `what`, and the WARN log line says it too.
void expectProbe(const std::string& plugin, int code, const std::string& what) {
  SCOPED_TRACE(plugin);
  ProbeOutput o = runProbe(plugin);
  for (const char* call : {"memalloc", "init"}) {
    SCOPED_TRACE(call);
    const std::string rc = o.values[std::string(call) + "_rc"];
    const std::string last = o.values[std::string(call) + "_last"];
    const std::string str = o.values[std::string(call) + "_string"];
    EXPECT_EQ(rc, std::to_string(code)) << o.all;
    EXPECT_TRUE(contains(last, "TUTTI_BACKEND_PLUGIN=" + plugin)) << last;
    EXPECT_TRUE(contains(last, "backend plugin " + plugin + ": " + what)) << last;
    EXPECT_FALSE(contains(str, "cuda")) << str;
  }
  EXPECT_TRUE(contains(o.all, "NCCL WARN ncclMemAlloc: TUTTI_BACKEND_PLUGIN=" + plugin +
                                  ": backend plugin " + plugin + ": " + what))
      << o.all;
}

TEST(PluginLoadErrorsThroughNccl, NullRequiredFunction) {
  expectProbe(BROKEN_NULL_MEMALLOC_PATH, ncclInvalidArgument,
              "required function 'memAlloc' is NULL");
}

TEST(PluginLoadErrorsThroughNccl, EntryReturningNullIsNotAnUnhandledCudaError) {
  expectProbe(BROKEN_ENTRY_NULL_PATH, ncclSystemError, "tuttiBackendPluginInit(1) returned NULL");
  ProbeOutput o = runProbe(BROKEN_ENTRY_NULL_PATH);
  EXPECT_EQ(o.values["memalloc_string"],
            "unhandled system error (run with NCCL_DEBUG=INFO for details)");
}

TEST(PluginLoadErrorsThroughNccl, AbiVersionMismatch) {
  expectProbe(BROKEN_ABI_VERSION_PATH, ncclInvalidArgument, "ABI version 99, this tutti speaks 1");
}

}  // namespace
}  // namespace tutti
