// The NCCL C API on top of tutti::core, part 1: what the API files share
// (capi/ops.h), version, ids and errors, reduction operators, memory and
// registration. comm_api.cc: communicators; coll_api.cc: collectives and
// groups. Every function: validate, call into the core, map errors
// (errors.h). Host-memory semantics: see docs/api.md.
#include <dlfcn.h>
#include <unistd.h>

#include <cstring>
#include <mutex>

#include "base/log.h"
#include "capi/errors.h"
#include "capi/export.h"
#include "capi/handle.h"
#include "capi/ops.h"
#include "core/backend.h"
#include "core/bootstrap.h"
#include "tutti/tutti.h"

using tutti::Status;
namespace core = tutti::core;
namespace capi = tutti::capi;
using tutti::capi::checkComm;
using tutti::capi::checkDtype;
using tutti::capi::fail;
using tutti::capi::fromStatus;
using tutti::capi::guard;
using tutti::capi::logVersionOnce;
using tutti::capi::rawEnum;
using tutti::capi::typeName;

namespace tutti::capi {

GroupState& threadGroup() {
  thread_local GroupState g;
  return g;
}

void logVersionOnce() {
  static std::once_flag once;
  std::call_once(once, [] {
    TUTTI_LOG_(tutti::log::Level::kVersion, tutti::log::kInit, "NCCL version {}.{}.{}+tutti{}",
               NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH, TUTTI_VERSION_STRING);
  });
}

const char* typeName(int t) {
  return t >= 0 && t < ncclNumTypes ? tutti::dataTypeName(static_cast<tutti::DataType>(t))
                                    : "invalid";
}

ncclResult_t checkComm(ncclComm_t comm, const char* fn, bool needReady, bool failed) {
  if (!comm) return fail(ncclInvalidArgument, std::string(fn) + ": comm is NULL");
  if (!tutti::capi::isLiveComm(comm))
    return fail(
        ncclInvalidArgument,
        std::string(fn) + ": comm is not a valid communicator (destroyed or never created)");
  if (!needReady) return ncclSuccess;
  const tutti::Code st = comm->init.state();
  if (st == tutti::Code::kInProgress)
    return fail(ncclInvalidUsage,
                std::string(fn) +
                    ": communicator initialisation has not completed (call "
                    "ncclGroupEnd, or poll ncclCommGetAsyncError)",
                comm);
  if (st != tutti::Code::kOk)
    return fail(
        static_cast<ncclResult_t>(st),
        std::string(fn) + ": communicator initialisation failed: " + comm->init.status().message(),
        comm);
  if (comm->finalized)
    return fail(ncclInvalidUsage, std::string(fn) + ": communicator was finalized", comm);
  if (failed && !comm->impl()->aborted()) return ncclSuccess;  // split, shrink: error state too
  return fromStatus(comm->impl()->usable().withContext(fn), comm);  // error state, aborted
}

ncclResult_t checkDtype(int dt, const char* fn, ncclComm_t comm) {
  if (dt < 0 || dt >= ncclNumTypes)
    return fail(ncclInvalidArgument, std::string(fn) + ": invalid datatype " + std::to_string(dt),
                comm);
  return ncclSuccess;
}

}  // namespace tutti::capi

// ---- version, ids, errors ------------------------------------------------------

TUTTI_API ncclResult_t ncclGetVersion(int* version) {
  if (!version) return fail(ncclInvalidArgument, "ncclGetVersion: version is NULL");
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}
TUTTI_PNCCL(ncclGetVersion)

TUTTI_API ncclResult_t tuttiGetVersion(int* version) {
  if (!version) return fail(ncclInvalidArgument, "tuttiGetVersion: version is NULL");
  *version = TUTTI_VERSION_MAJOR * 10000 + TUTTI_VERSION_MINOR * 100 + TUTTI_VERSION_PATCH;
  return ncclSuccess;
}

TUTTI_API const char* tuttiGetVersionString(void) { return TUTTI_VERSION_STRING; }

TUTTI_API const char* tuttiLibraryPath(void) {
  static std::string path = [] {
    Dl_info info{};
    if (dladdr(reinterpret_cast<void*>(&tuttiLibraryPath), &info) && info.dli_fname)
      return std::string(info.dli_fname);
    return std::string();
  }();
  return path.c_str();
}

TUTTI_API const char* tuttiBackendName(void) {
  auto backend = core::processBackend();
  if (!backend) {
    fail(static_cast<ncclResult_t>(backend.status().code()),
         "tuttiBackendName: " + backend.status().message());
    return nullptr;
  }
  return backend.value()->name().c_str();
}

TUTTI_API ncclResult_t tuttiMemcpy(void* dst, const void* src, size_t bytes) {
  return guard("tuttiMemcpy", [&] {
    if (bytes == 0) return ncclSuccess;
    if (!dst || !src)
      return fail(ncclInvalidArgument, fmt::format("tuttiMemcpy: {} is NULL", dst ? "src" : "dst"));
    Status st = core::memCopy(dst, src, bytes);
    return st ? ncclSuccess : fromStatus(st.withContext("tuttiMemcpy"), nullptr);
  });
}

TUTTI_API ncclResult_t tuttiGetDeviceCount(int* count) {
  return guard("tuttiGetDeviceCount", [&] {
    if (!count) return fail(ncclInvalidArgument, "tuttiGetDeviceCount: count is NULL");
    auto n = core::deviceCount();
    if (!n) return fromStatus(n.status().withContext("tuttiGetDeviceCount"), nullptr);
    *count = n.value();
    return ncclSuccess;
  });
}

TUTTI_API ncclResult_t tuttiSetDevice(int device) {
  return guard("tuttiSetDevice", [&] {
    Status st = core::selectDevice(device);
    return st ? ncclSuccess : fromStatus(st.withContext("tuttiSetDevice"), nullptr);
  });
}

TUTTI_API ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId) {
  return guard("ncclGetUniqueId", [&] {
    logVersionOnce();
    if (!uniqueId) return fail(ncclInvalidArgument, "ncclGetUniqueId: uniqueId is NULL");
    memset(uniqueId, 0, sizeof(*uniqueId));
    return fromStatus(core::createUniqueId(reinterpret_cast<uint8_t*>(uniqueId->internal))
                          .withContext("ncclGetUniqueId"));
  });
}
TUTTI_PNCCL(ncclGetUniqueId)

TUTTI_API const char* ncclGetErrorString(ncclResult_t result) {
  return tutti::codeText(rawEnum(result));
}
TUTTI_PNCCL(ncclGetErrorString)

TUTTI_API const char* ncclGetLastError(ncclComm_t comm) { return tutti::capi::lastError(comm); }
TUTTI_PNCCL(ncclGetLastError)

// ---- reduction ops, memory, registration ----------------------------------------

TUTTI_API ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar,
                                                ncclDataType_t datatype,
                                                ncclScalarResidence_t residence, ncclComm_t comm) {
  return guard("ncclRedOpCreatePreMulSum", [&] {
    ncclResult_t rc = checkComm(comm, "ncclRedOpCreatePreMulSum");
    if (rc != ncclSuccess) return rc;
    if (!op) return fail(ncclInvalidArgument, "ncclRedOpCreatePreMulSum: op is NULL", comm);
    if (!scalar) return fail(ncclInvalidArgument, "ncclRedOpCreatePreMulSum: scalar is NULL", comm);
    const int dt = rawEnum(datatype), where = rawEnum(residence);
    if ((rc = checkDtype(dt, "ncclRedOpCreatePreMulSum", comm)) != ncclSuccess) return rc;
    if (where != ncclScalarDevice && where != ncclScalarHostImmediate)
      return fail(ncclInvalidArgument,
                  fmt::format("ncclRedOpCreatePreMulSum: invalid scalar residence {}", where),
                  comm);
    *op = static_cast<ncclRedOp_t>(comm->impl()->createPreMulSum(scalar, dt, where));
    return ncclSuccess;
  });
}
TUTTI_PNCCL(ncclRedOpCreatePreMulSum)

TUTTI_API ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm) {
  return guard("ncclRedOpDestroy", [&] {
    ncclResult_t rc = checkComm(comm, "ncclRedOpDestroy", false);
    if (rc != ncclSuccess) return rc;
    int v = rawEnum(op);
    if (v >= 0 && v < ncclNumOps)
      return fail(ncclInvalidArgument,
                  fmt::format("ncclRedOpDestroy: op {} is built-in and cannot be destroyed", v),
                  comm);
    if (comm->init.state() != tutti::Code::kOk)
      return fail(ncclInvalidUsage, "ncclRedOpDestroy: communicator is not initialised", comm);
    if (!comm->impl()->destroyUserOp(v))
      return fail(ncclInvalidArgument,
                  fmt::format("ncclRedOpDestroy: op {} was not created on this communicator", v),
                  comm);
    return ncclSuccess;
  });
}
TUTTI_PNCCL(ncclRedOpDestroy)

TUTTI_API ncclResult_t ncclMemAlloc(void** ptr, size_t size) {
  return guard("ncclMemAlloc", [&] {
    if (!ptr) return fail(ncclInvalidArgument, "ncclMemAlloc: ptr is NULL");
    *ptr = nullptr;
    if (size == 0) return ncclSuccess;
    auto p = core::memAlloc(size);
    if (!p) return fromStatus(p.status().withContext("ncclMemAlloc"), nullptr);
    *ptr = p.value();
    return ncclSuccess;
  });
}
TUTTI_PNCCL(ncclMemAlloc)

TUTTI_API ncclResult_t ncclMemFree(void* ptr) {
  return guard("ncclMemFree", [&] {
    if (!ptr) return ncclSuccess;
    Status st = core::memFree(ptr);
    return st ? ncclSuccess : fromStatus(st.withContext("ncclMemFree"), nullptr);
  });
}
TUTTI_PNCCL(ncclMemFree)

TUTTI_API ncclResult_t ncclCommRegister(const ncclComm_t comm, void* buff, size_t size,
                                        void** handle) {
  return guard("ncclCommRegister", [&] {
    ncclResult_t rc = checkComm(comm, "ncclCommRegister");
    if (rc != ncclSuccess) return rc;
    if (!handle) return fail(ncclInvalidArgument, "ncclCommRegister: handle is NULL", comm);
    if (!buff && size) return fail(ncclInvalidArgument, "ncclCommRegister: buff is NULL", comm);
    // Host memory needs no registration for shm/TCP; the handle records the
    // range so later transports (RDMA) can register it.
    *handle = comm->impl()->registerRange(buff, size);
    return ncclSuccess;
  });
}
TUTTI_PNCCL(ncclCommRegister)

TUTTI_API ncclResult_t ncclCommDeregister(const ncclComm_t comm, void* handle) {
  return guard("ncclCommDeregister", [&] {
    ncclResult_t rc = checkComm(comm, "ncclCommDeregister", false);
    if (rc != ncclSuccess) return rc;
    if (comm->init.state() != tutti::Code::kOk || !comm->impl()->deregister(handle))
      return fail(ncclInvalidArgument,
                  "ncclCommDeregister: handle was not returned by ncclCommRegister on this "
                  "communicator (or was already deregistered)",
                  comm);
    return ncclSuccess;
  });
}
TUTTI_PNCCL(ncclCommDeregister)
