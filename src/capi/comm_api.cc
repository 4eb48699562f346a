// The NCCL C API, communicators: creation (ncclCommInit*, ncclCommSplit),
// destruction and queries.
#include <algorithm>
#include <cstring>
#include <mutex>
#include <vector>

#include "base/log.h"
#include "capi/errors.h"
#include "capi/export.h"
#include "capi/handle.h"
#include "capi/ops.h"
#include "core/backend.h"
#include "core/bootstrap.h"

namespace core = tutti::core;
namespace capi = tutti::capi;
using tutti::capi::checkComm;
using tutti::capi::fail;
using tutti::capi::fromStatus;
using tutti::capi::guard;
using tutti::capi::logVersionOnce;

namespace tutti::capi {

ncclResult_t initResult(ncclComm* c, const char* fn) {
  const tutti::Code st = c->init.state();
  if (st == tutti::Code::kInProgress) return ncclInProgress;
  if (st == tutti::Code::kOk) return ncclSuccess;
  // The core logged the error when it happened; here it becomes the last error.
  return record(
      static_cast<ncclResult_t>(st),
      std::string(fn) + ": communicator initialisation failed: " + c->init.status().message(), c);
}

ncclResult_t initRank(const char* fn, ncclComm_t* out, int nranks, const ncclUniqueId& id, int rank,
                      const ncclConfig_t* config, int device, const SplitFrom* split) {
  logVersionOnce();
  if (!out) return fail(ncclInvalidArgument, std::string(fn) + ": comm pointer is NULL");
  *out = nullptr;
  core::InitArgs args;
  if (!split) {  // a split's child learns these from the exchange
    if (nranks < 1)
      return fail(ncclInvalidArgument, fmt::format("{}: invalid nranks {}", fn, nranks));
    if (rank < 0 || rank >= nranks)
      return fail(ncclInvalidArgument,
                  fmt::format("{}: invalid rank {} (nranks is {})", fn, rank, nranks));
    auto parsed = core::parseUniqueId(reinterpret_cast<const uint8_t*>(id.internal));
    if (!parsed) return fromStatus(parsed.status().withContext(fn));
    args.id = parsed.value();
    args.rank = rank;
    args.nranks = nranks;
  }
  auto cfg = core::commConfig(config);
  if (!cfg) return fromStatus(cfg.status().withContext(fn));
  args.config = cfg.value();
  auto backend = core::processBackend();
  if (!backend) return fromStatus(backend.status().withContext(fn));
  auto bound = device < 0 ? backend.value()->currentDevice() : backend.value()->bindDevice(device);
  if (!bound) return fromStatus(bound.status().withContext(fn));
  args.backend = backend.value();
  args.device = bound.value();
  auto* c = new ncclComm(std::move(args));
  tutti::capi::registerComm(c);
  *out = c;
  if (split) {
    c->init.startSplit(*split->parent, split->color, split->key);
  } else if (capi::threadGroup().depth > 0) {
    capi::threadGroup().inits.push_back(c);
    return ncclSuccess;
  } else if (c->blocking()) {
    c->init.run();
  } else {
    c->init.start();
  }
  // Blocking: the result. Else ncclInProgress, or the error of a thread that could not start.
  return initResult(c, fn);
}

void destroyComm(ncclComm* c, bool abort) {
  tutti::capi::unregisterComm(c);             // new calls on this handle fail from now on
  auto& pending = capi::threadGroup().inits;  // created in the open group: not any more
  pending.erase(std::remove(pending.begin(), pending.end(), c), pending.end());
  if (abort) c->init.abort();  // a creation still running ends now, not at its deadline
  c->init.wait();
  if (core::Comm* impl = c->impl()) {
    // ncclCommAbort may come from another thread while an operation runs:
    // raise the flag, then wait until that operation has noticed it (before
    // its next message, core/executor.cc) and released the communicator.
    // Without abort, what the engine still runs ends first (core/engine.h).
    if (abort)
      impl->abort();
    else
      impl->drainEngine();
    std::lock_guard<std::mutex> lk(impl->mutex());
  }
  c->magic = 0;
  delete c;
}

// A split's or shrink's child from its plan (none for NCCL_SPLIT_NOCOLOR), on the parent's device.
ncclResult_t childOf(const char* fn, ncclComm_t comm, tutti::Result<core::Comm::SplitPlan> plan,
                     ncclComm_t* newcomm, ncclConfig_t* config) {
  if (!plan) return fromStatus(plan.status().withContext(fn), comm);
  if (plan->nranks == 0) return ncclSuccess;
  ncclUniqueId id;
  static_assert(sizeof(id.internal) == sizeof(plan->id), "unique id size");
  memcpy(id.internal, plan->id, sizeof(plan->id));
  return initRank(fn, newcomm, plan->nranks, id, plan->rank, config, comm->device());
}
}  // namespace tutti::capi

using tutti::capi::destroyComm;
using tutti::capi::initRank;

// ---- communicators -----------------------------------------------------------

TUTTI_API ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId,
                                        int rank) {
  return guard("ncclCommInitRank",
               [&] { return initRank("ncclCommInitRank", comm, nranks, commId, rank, nullptr); });
}
TUTTI_PNCCL(ncclCommInitRank)

TUTTI_API ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId,
                                              int rank, ncclConfig_t* config) {
  return guard("ncclCommInitRankConfig", [&] {
    return initRank("ncclCommInitRankConfig", comm, nranks, commId, rank, config);
  });
}
TUTTI_PNCCL(ncclCommInitRankConfig)

TUTTI_API ncclResult_t ncclCommInitRankScalable(ncclComm_t* newcomm, int nranks, int myrank,
                                                int nId, ncclUniqueId* commIds,
                                                ncclConfig_t* config) {
  return guard("ncclCommInitRankScalable", [&] {
    if (nId < 1 || !commIds)
      return fail(ncclInvalidArgument, "ncclCommInitRankScalable: need nId >= 1 and commIds");
    // Every rank registers with the first root; the others stay unused.
    return initRank("ncclCommInitRankScalable", newcomm, nranks, commIds[0], myrank, config);
  });
}
TUTTI_PNCCL(ncclCommInitRankScalable)

TUTTI_API ncclResult_t ncclCommInitAll(ncclComm_t* comms, int ndev, const int* devlist) {
  return guard("ncclCommInitAll", [&] {
    if (!comms) return fail(ncclInvalidArgument, "ncclCommInitAll: comms is NULL");
    if (ndev < 1)
      return fail(ncclInvalidArgument, fmt::format("ncclCommInitAll: invalid ndev {}", ndev));
    auto bound = core::bindDevices(devlist, ndev);
    if (!bound) return fromStatus(bound.status().withContext("ncclCommInitAll"));
    const std::vector<int>& devices = bound.value();
    ncclUniqueId id;
    ncclResult_t rc = ncclGetUniqueId(&id);
    if (rc != ncclSuccess) return rc;
    rc = ncclGroupStart();
    if (rc != ncclSuccess) return rc;
    for (int i = 0; i < ndev; ++i) {
      rc = initRank("ncclCommInitAll", &comms[i], ndev, id, i, nullptr, devices[i]);
      if (rc != ncclSuccess) capi::threadGroup().deferred = rc;
    }
    rc = ncclGroupEnd();
    if (rc != ncclSuccess) {
      for (int i = 0; i < ndev; ++i)
        if (comms[i]) {
          destroyComm(comms[i], true);
          comms[i] = nullptr;
        }
    }
    return rc;
  });
}
TUTTI_PNCCL(ncclCommInitAll)

TUTTI_API ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                                     ncclConfig_t* config) {
  return guard("ncclCommSplit", [&]() -> ncclResult_t {
    if (ncclResult_t rc = checkComm(comm, "ncclCommSplit", true, true); rc != ncclSuccess)
      return rc;
    if (!newcomm) return fail(ncclInvalidArgument, "ncclCommSplit: newcomm is NULL", comm);
    if (color < 0 && color != NCCL_SPLIT_NOCOLOR)
      return fail(ncclInvalidArgument, fmt::format("ncclCommSplit: invalid color {}", color), comm);
    *newcomm = nullptr;
    ncclConfig_t inherit = NCCL_CONFIG_INITIALIZER;
    inherit.blocking = comm->blocking() ? 1 : 0;
    if (!config) config = &inherit;
    if (!comm->blocking() && config->blocking == 0 && !capi::inGroup()) {
      // Non-blocking parent and child: the exchange is queued on the parent's engine.
      if (color == NCCL_SPLIT_NOCOLOR) {  // takes part in the exchange, creates nothing
        comm->impl()->splitQueued(color, key, [](const auto&) {});
        return ncclSuccess;
      }
      const capi::SplitFrom from{comm->impl(), color, key};
      return initRank("ncclCommSplit", newcomm, 0, {}, -1, config, comm->device(), &from);
    }
    return capi::childOf("ncclCommSplit", comm, comm->impl()->split(color, key), newcomm, config);
  });
}
TUTTI_PNCCL(ncclCommSplit)

TUTTI_API ncclResult_t ncclCommShrink(ncclComm_t comm, int* excludeRanksList, int excludeRanksCount,
                                      ncclComm_t* newcomm, ncclConfig_t* config, int shrinkFlags) {
  return guard("ncclCommShrink", [&]() -> ncclResult_t {
    if (ncclResult_t rc = checkComm(comm, "ncclCommShrink", true, true); rc != ncclSuccess)
      return rc;
    if (!newcomm) return fail(ncclInvalidArgument, "ncclCommShrink: newcomm is NULL", comm);
    *newcomm = nullptr;
    ncclConfig_t inherit = NCCL_CONFIG_INITIALIZER;
    inherit.blocking = comm->blocking() ? 1 : 0;
    return capi::childOf("ncclCommShrink", comm,
                         comm->impl()->shrink(excludeRanksList, excludeRanksCount, shrinkFlags),
                         newcomm, config ? config : &inherit);
  });
}
TUTTI_PNCCL(ncclCommShrink)

TUTTI_API ncclResult_t ncclCommRevoke(ncclComm_t comm, int revokeFlags) {
  return guard("ncclCommRevoke", [&]() -> ncclResult_t {
    if (ncclResult_t rc = checkComm(comm, "ncclCommRevoke", true, true); rc != ncclSuccess)
      return rc;
    return fromStatus(comm->impl()->revoke(revokeFlags).withContext("ncclCommRevoke"), comm);
  });
}
TUTTI_PNCCL(ncclCommRevoke)

TUTTI_API ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  return guard("ncclCommFinalize", [&] {
    ncclResult_t rc = checkComm(comm, "ncclCommFinalize", false);
    if (rc != ncclSuccess) return rc;
    // Engine work (device streams, non-blocking calls) may still run: a
    // blocking communicator waits for it, a non-blocking one answers
    // ncclInProgress until it has ended (ncclCommGetAsyncError).
    core::Comm* impl = comm->impl();
    if (impl && impl->revoked())
      return fromStatus(core::Comm::revokedError().withContext("ncclCommFinalize"), comm);
    comm->finalized = true;
    if (!impl) return ncclSuccess;  // not (yet) created: nothing runs
    if (!comm->blocking()) return impl->engineBusy() ? ncclInProgress : ncclSuccess;
    impl->drainEngine();
    return ncclSuccess;
  });
}
TUTTI_PNCCL(ncclCommFinalize)

namespace {
// Destroy (after the operations in flight) or abort; NULL is a no-op, as in NCCL.
ncclResult_t endComm(const char* fn, ncclComm_t comm, bool abort) {
  return guard(fn, [&] {
    if (!comm) return ncclSuccess;
    ncclResult_t rc = checkComm(comm, fn, false);
    if (rc == ncclSuccess) destroyComm(comm, abort);
    return rc;
  });
}
}  // namespace

TUTTI_API ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  return endComm("ncclCommDestroy", comm, false);
}
TUTTI_PNCCL(ncclCommDestroy)

TUTTI_API ncclResult_t ncclCommAbort(ncclComm_t comm) {
  return endComm("ncclCommAbort", comm, true);
}
TUTTI_PNCCL(ncclCommAbort)

TUTTI_API ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  return guard("ncclCommGetAsyncError", [&] {
    ncclResult_t rc = checkComm(comm, "ncclCommGetAsyncError", false);
    if (rc != ncclSuccess) return rc;
    if (!asyncError)
      return fail(ncclInvalidArgument, "ncclCommGetAsyncError: asyncError is NULL", comm);
    const ncclResult_t init = tutti::capi::initResult(comm, "ncclCommGetAsyncError");
    if (init != ncclInProgress) comm->init.wait();  // the init thread has ended
    if (init != ncclSuccess) {
      *asyncError = init;
      return ncclSuccess;
    }
    // A non-blocking communicator's operations are in progress until its
    // engine has run them (core/group.h, submitOne). Busy is asked first: a
    // job records its error before it counts as finished, so once the engine
    // reads idle the error of everything that ran is visible (read the other
    // way round, a job failing in between was reported as a success).
    const bool busy = !comm->blocking() && comm->impl()->engineBusy();
    *asyncError = static_cast<ncclResult_t>(comm->impl()->asyncErrorCode());
    if (*asyncError != ncclSuccess)  // an operation failed after its call returned
      tutti::capi::record(*asyncError, comm->impl()->error().message(), comm);
    else if (busy)
      *asyncError = ncclInProgress;
    return ncclSuccess;
  });
}
TUTTI_PNCCL(ncclCommGetAsyncError)

namespace {
// The communicator's facts: its rank count and this rank's number wait for
// a split's exchange (ncclInProgress until it has run); the device does not.
template <class Get>
ncclResult_t factOf(const char* fn, ncclComm_t comm, int* out, const char* name, bool afterArgs,
                    Get get) {
  return guard(fn, [&] {
    ncclResult_t rc = checkComm(comm, fn, false);
    if (rc != ncclSuccess) return rc;
    if (!out) return fail(ncclInvalidArgument, fmt::format("{}: {} is NULL", fn, name), comm);
    if (afterArgs && !comm->init.argsKnown()) return ncclInProgress;
    *out = get();
    return ncclSuccess;
  });
}
}  // namespace

TUTTI_API ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  return factOf("ncclCommCount", comm, count, "count", true, [&] { return comm->nranks(); });
}
TUTTI_PNCCL(ncclCommCount)

TUTTI_API ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  // 0 on the CPU backend (docs/api.md).
  return factOf("ncclCommCuDevice", comm, device, "device", false, [&] { return comm->device(); });
}
TUTTI_PNCCL(ncclCommCuDevice)

TUTTI_API ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  return factOf("ncclCommUserRank", comm, rank, "rank", true, [&] { return comm->rank(); });
}
TUTTI_PNCCL(ncclCommUserRank)

namespace {
// tutti.h's lists of what the core knows: the checks, then up to `capacity`
// items (none while the communicator's initialisation has not finished).
template <class T, class List>
ncclResult_t listOf(const char* fn, ncclComm_t comm, T* out, int capacity, int* count, List list) {
  return guard(fn, [&] {
    ncclResult_t rc = checkComm(comm, fn, false);
    if (rc != ncclSuccess) return rc;
    if (!count || capacity < 0 || (capacity > 0 && !out))
      return fail(ncclInvalidArgument,
                  std::string(fn) + ": count is NULL, capacity negative, or the array NULL", comm);
    std::vector<T> v;
    if (comm->init.state() == tutti::Code::kOk) v = list(*comm->impl());
    *count = static_cast<int>(v.size());
    std::copy_n(v.begin(), std::min(capacity, *count), out);
    return ncclSuccess;
  });
}
}  // namespace

TUTTI_API ncclResult_t tuttiCommWaitingOn(ncclComm_t comm, int* ranks, int capacity, int* count) {
  return listOf("tuttiCommWaitingOn", comm, ranks, capacity, count,
                [](core::Comm& c) { return c.waitingOn(); });
}

TUTTI_API ncclResult_t tuttiCommStragglers(ncclComm_t comm, tuttiStraggler_t* rows, int capacity,
                                           int* count) {
  return listOf("tuttiCommStragglers", comm, rows, capacity, count,
                [](core::Comm& c) { return c.telemetry().report(); });
}
