// The NCCL C API on top of tutti::core. Every function: validate, call into
// the core, map errors (errors.h). Host-memory semantics: see docs/api.md.
#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <type_traits>

#include "backends/cpu/cpu_backend.h"
#include "base/log.h"
#include "base/params.h"
#include "capi/errors.h"
#include "capi/export.h"
#include "capi/handle.h"
#include "capi/ops.h"
#include "core/backend.h"
#include "core/bootstrap.h"
#include "core/group.h"
#include "core/staging.h"
#include "tutti/tutti.h"

using tutti::Status;
using tutti::algo::Collective;
namespace core = tutti::core;
namespace algo = tutti::algo;
using tutti::capi::fail;
using tutti::capi::fromStatus;
using tutti::capi::guard;

namespace {

// The integer a caller passed for an enum parameter. A C caller may pass any
// int; loading an out-of-range value as the C++ enum is undefined, so the
// bytes are copied instead.
template <typename E>
int rawEnum(const E& e) {
  std::underlying_type_t<E> v;
  static_assert(sizeof(v) == sizeof(E), "enum representation");
  memcpy(&v, &e, sizeof(v));
  return static_cast<int>(v);
}

// ---- groups ------------------------------------------------------------------

// The calling thread's ncclGroupStart/End: communicators to initialise and
// operations to run when the outermost ncclGroupEnd comes (core/group.h plans
// and runs them), with the handle each operation was called on.
struct GroupState {
  int depth = 0;
  std::vector<ncclComm*> inits;
  std::vector<core::Op> ops;
  std::vector<ncclComm*> handles;       // of ops[i]
  ncclResult_t deferred = ncclSuccess;  // first error seen inside the group
};
thread_local GroupState t_group;

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

}  // namespace

ncclResult_t tutti::capi::checkComm(ncclComm_t comm, const char* fn, bool needReady) {
  if (!comm) return fail(ncclInvalidArgument, std::string(fn) + ": comm is NULL");
  if (!tutti::capi::isLiveComm(comm))
    return fail(
        ncclInvalidArgument,
        std::string(fn) + ": comm is not a valid communicator (destroyed or never created)");
  if (!needReady) return ncclSuccess;
  int st = comm->initState.load();
  if (st == ncclInProgress)
    return fail(ncclInvalidUsage,
                std::string(fn) +
                    ": communicator initialisation has not completed (call "
                    "ncclGroupEnd, or poll ncclCommGetAsyncError)",
                comm);
  if (st != ncclSuccess)
    return fail(static_cast<ncclResult_t>(st),
                std::string(fn) + ": communicator initialisation failed", comm);
  if (comm->finalized)
    return fail(ncclInvalidUsage, std::string(fn) + ": communicator was finalized", comm);
  if (comm->impl->asyncErrorCode() != 0) {
    Status err = comm->impl->error();
    return fail(static_cast<ncclResult_t>(err.code()),
                std::string(fn) + ": communicator is in error state after: " + err.message(), comm);
  }
  if (comm->impl->aborted())
    return fail(ncclInvalidUsage, std::string(fn) + ": communicator was aborted", comm);
  return ncclSuccess;
}

namespace {

using tutti::capi::checkComm;

ncclResult_t checkDtype(int dt, const char* fn, ncclComm_t comm) {
  if (dt < 0 || dt >= ncclNumTypes)
    return fail(ncclInvalidArgument, std::string(fn) + ": invalid datatype " + std::to_string(dt),
                comm);
  return ncclSuccess;
}

ncclResult_t checkOp(int op, int dt, const char* fn, ncclComm_t comm) {
  int v = op;
  if (v >= 0 && v < ncclNumOps) return ncclSuccess;
  const auto& userOps = comm->impl->userOps();
  size_t idx = static_cast<size_t>(v) - ncclNumOps;
  if (v < 0 || idx >= userOps.size() || !userOps[idx].live)
    return fail(ncclInvalidArgument,
                std::string(fn) + ": invalid reduction op " + std::to_string(v) +
                    " (not built-in and not created on this communicator)",
                comm);
  if (userOps[idx].dt != dt)
    return fail(ncclInvalidArgument,
                fmt::format("{}: reduction op {} was created for datatype {} but the call uses {}",
                            fn, v, typeName(userOps[idx].dt), typeName(dt)),
                comm);
  return ncclSuccess;
}

// The handle of `impl` among `handles` (where a core error is recorded).
ncclComm* handleOf(const core::Comm* impl, const std::vector<ncclComm*>& handles) {
  for (ncclComm* h : handles)
    if (h->impl.get() == impl) return h;
  return handles.empty() ? nullptr : handles[0];
}

ncclResult_t groupEndImpl();

ncclResult_t collective(const char* fn, Collective coll, const void* send, void* recv, size_t count,
                        int dt, int op, int root, ncclComm_t comm, cudaStream_t stream,
                        const core::Compressed* compressed = nullptr) {
  ncclResult_t rc = checkComm(comm, fn);
  if (rc != ncclSuccess) return rc;
  if ((rc = checkDtype(dt, fn, comm)) != ncclSuccess) return rc;
  if (core::isReducing(coll) && (rc = checkOp(op, dt, fn, comm)) != ncclSuccess) return rc;
  const int n = comm->nranks, r = comm->rank;
  bool rooted = coll == Collective::kBroadcast || coll == Collective::kReduce ||
                coll == Collective::kGather || coll == Collective::kScatter;
  bool p2p = coll == Collective::kSend || coll == Collective::kRecv;
  if ((rooted || p2p) && (root < 0 || root >= n))
    return fail(ncclInvalidArgument,
                fmt::format("{}: invalid {} {} (communicator has {} ranks)", fn,
                            p2p ? "peer" : "root", root, n),
                comm);
  size_t es = tutti::dataTypeSize(static_cast<tutti::DataType>(dt));
  size_t factor =
      (coll == Collective::kAllGather || coll == Collective::kReduceScatter ||
       coll == Collective::kAllToAll || coll == Collective::kGather || coll == Collective::kScatter)
          ? static_cast<size_t>(n)
          : 1;
  if (count > 0 && count > SIZE_MAX / es / factor)
    return fail(ncclInvalidArgument,
                fmt::format("{}: count {} overflows the address space", fn, count), comm);
  if (count > 0) {
    // The buffers this rank uses (a broadcast's non-root sends nothing, ...).
    size_t sendBytes = 0, recvBytes = 0;
    core::ioBytes(coll, count, es, r, n, root, &sendBytes, &recvBytes);
    if (sendBytes && !send)
      return fail(ncclInvalidArgument, std::string(fn) + ": sendbuff is NULL", comm);
    if (recvBytes && !recv)
      return fail(ncclInvalidArgument, std::string(fn) + ": recvbuff is NULL", comm);
  }
  TUTTI_INFO(tutti::log::kColl,
             "{}: sendbuff {} recvbuff {} count {} datatype {} op {} root {} comm {} [nranks={}]",
             fn, send, static_cast<void*>(recv), count, typeName(dt), op, root,
             static_cast<void*>(comm), n);
  core::Op o;
  o.comm = comm->impl.get();
  o.coll = coll;
  o.send = send;
  o.recv = recv;
  o.count = count;
  o.dt = dt;
  o.op = op;
  o.root = root;
  o.stream = reinterpret_cast<core::Queue>(stream);
  if (compressed) {
    o.compress(*compressed);
  } else if (coll == Collective::kAllReduce && count > 0) {
    o.wire.format = core::envCompression(*o.comm, count * es, dt, op);
    o.needsScale = o.wire.format == algo::Wire::kHalf;
  }
  if (t_group.depth > 0) {
    t_group.ops.push_back(o);
    t_group.handles.push_back(comm);
    return ncclSuccess;
  }
  const core::RunResult res = core::runOne(o);
  return res.status ? ncclSuccess : fromStatus(res.status, comm);
}

void runInit(ncclComm* c) {
  tutti::log::setThreadRank(c->rank);
  auto res = core::Comm::create(c->id, c->rank, c->nranks, c->config, c->backend, c->device);
  if (!res) {
    fail(static_cast<ncclResult_t>(res.status().code()),
         fmt::format("ncclCommInitRank: rank {} of {}: {}", c->rank, c->nranks,
                     res.status().message()),
         c);
    c->initState.store(static_cast<int>(res.status().code()));
    return;
  }
  c->impl = std::move(res.value());
  c->initState.store(ncclSuccess);
}

// runInit on a thread of its own: nothing it throws escapes (an error of the
// communicator instead).
void runInitCaught(ncclComm* c) {
  try {
    runInit(c);
  } catch (const std::exception& e) {
    fail(ncclInternalError, fmt::format("ncclCommInitRank: rank {}: {}", c->rank, e.what()), c);
    c->initState.store(ncclInternalError);
  }
}

ncclResult_t groupEndImpl() {
  GroupState g = std::move(t_group);
  t_group = GroupState();
  ncclResult_t result = g.deferred;
  // 1. Initialisations, concurrently (one thread may init every rank).
  if (g.inits.size() == 1) {
    runInit(g.inits[0]);
  } else if (g.inits.size() > 1) {
    std::vector<std::thread> threads;
    for (ncclComm* c : g.inits) {
      try {
        threads.emplace_back(runInitCaught, c);
      } catch (const std::system_error& e) {
        fail(ncclSystemError,
             fmt::format("ncclGroupEnd: cannot start the init thread of rank {}: {}", c->rank,
                         e.what()),
             c);
        c->initState.store(ncclSystemError);
      }
    }
    for (auto& t : threads) t.join();
  }
  for (ncclComm* c : g.inits)
    if (c->initState.load() != ncclSuccess && result == ncclSuccess)
      result = static_cast<ncclResult_t>(c->initState.load());
  if (g.ops.empty()) return result;
  if (result != ncclSuccess) return result;
  // 2. Operations: every communicator still usable, then the core runs them.
  for (ncclComm* c : g.handles) {
    ncclResult_t rc = checkComm(c, "ncclGroupEnd");
    if (rc != ncclSuccess) return rc;
  }
  const core::RunResult res = core::runGroup(g.ops);
  return res.status ? ncclSuccess : fromStatus(res.status, handleOf(res.comm, g.handles));
}

// `device`: the device the communicator is bound to; -1: the calling thread's
// current device (the CPU backend's is always 0).
ncclResult_t initRank(const char* fn, ncclComm_t* out, int nranks, const ncclUniqueId& id, int rank,
                      const ncclConfig_t* config, int device = -1) {
  logVersionOnce();
  if (!out) return fail(ncclInvalidArgument, std::string(fn) + ": comm pointer is NULL");
  *out = nullptr;
  if (nranks < 1)
    return fail(ncclInvalidArgument, fmt::format("{}: invalid nranks {}", fn, nranks));
  if (rank < 0 || rank >= nranks)
    return fail(ncclInvalidArgument,
                fmt::format("{}: invalid rank {} (nranks is {})", fn, rank, nranks));
  auto parsed = core::parseUniqueId(reinterpret_cast<const uint8_t*>(id.internal));
  if (!parsed) return fail(ncclInvalidArgument, std::string(fn) + ": " + parsed.status().message());
  core::CommConfig cfg;
  if (config) {
    if (config->magic != 0xcafebeef || config->size < offsetof(ncclConfig_t, cgaClusterSize))
      return fail(ncclInvalidArgument,
                  std::string(fn) + ": config was not initialised with NCCL_CONFIG_INITIALIZER");
    if (config->blocking != NCCL_CONFIG_UNDEF_INT) {
      if (config->blocking != 0 && config->blocking != 1)
        return fail(ncclInvalidArgument,
                    fmt::format("{}: config blocking={} (must be 0 or 1)", fn, config->blocking));
      cfg.blocking = config->blocking == 1;
    }
    if (config->commName) cfg.name = config->commName;
    if (config->minCTAs != NCCL_CONFIG_UNDEF_INT) cfg.minChannels = config->minCTAs;
    if (config->maxCTAs != NCCL_CONFIG_UNDEF_INT) cfg.maxChannels = config->maxCTAs;
  }
  auto backend = core::processBackend();
  if (!backend)
    return fail(static_cast<ncclResult_t>(backend.status().code()),
                std::string(fn) + ": " + backend.status().message());
  if (device < 0) {
    auto current = backend.value()->currentDevice();
    if (!current)
      return fail(static_cast<ncclResult_t>(current.status().code()),
                  std::string(fn) + ": " + current.status().message());
    device = current.value();
  }
  auto* c = new ncclComm();
  c->backend = backend.value();
  c->device = device;
  c->nranks = nranks;
  c->rank = rank;
  c->id = parsed.value();
  c->config = cfg;
  tutti::capi::registerComm(c);
  *out = c;
  if (t_group.depth > 0) {
    t_group.inits.push_back(c);
    return ncclSuccess;
  }
  if (!cfg.blocking) {
    try {
      c->initThread = std::thread(runInitCaught, c);
    } catch (const std::system_error& e) {
      c->initState.store(ncclSystemError);
      return fail(ncclSystemError,
                  fmt::format("{}: cannot start the init thread: {}", fn, e.what()), c);
    }
    return ncclInProgress;
  }
  runInit(c);
  return static_cast<ncclResult_t>(c->initState.load());
}

void destroyComm(ncclComm* c, bool abort) {
  tutti::capi::unregisterComm(c);  // new calls on this handle fail from now on
  if (c->initThread.joinable()) c->initThread.join();
  if (c->impl) {
    // ncclCommAbort may come from another thread while an operation runs:
    // raise the flag, then wait until that operation has noticed it (within
    // one stall check, 100 ms) and released the communicator.
    if (abort) c->impl->abort();
    std::lock_guard<std::mutex> lk(c->impl->mutex());
  }
  c->impl.reset();
  c->magic = 0;
  delete c;
}

}  // namespace

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
    auto backend = core::processBackend();
    if (!backend) return fromStatus(backend.status().withContext("tuttiMemcpy"), nullptr);
    Status st = backend.value()->copy(dst, src, bytes);
    return st ? ncclSuccess : fromStatus(st.withContext("tuttiMemcpy"), nullptr);
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
  switch (result) {
    case ncclSuccess:
      return "no error";
    case ncclUnhandledCudaError:
      return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError:
      return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError:
      return "internal error - please report this issue to the tutti developers";
    case ncclInvalidArgument:
      return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage:
      return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError:
      return "remote process exited or there was a network error";
    case ncclInProgress:
      return "NCCL operation in progress";
    default:
      return "unknown result code";
  }
}
TUTTI_PNCCL(ncclGetErrorString)

TUTTI_API const char* ncclGetLastError(ncclComm_t comm) { return tutti::capi::lastError(comm); }
TUTTI_PNCCL(ncclGetLastError)

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
    // Rank i is bound to devlist[i] (or device i); the CPU backend has one
    // "device" that every rank shares, so any ids are accepted there.
    auto backend = core::processBackend();
    if (!backend)
      return fail(static_cast<ncclResult_t>(backend.status().code()),
                  "ncclCommInitAll: " + backend.status().message());
    if (!backend.value()->hostOnly()) {
      auto n = backend.value()->deviceCount();
      if (!n)
        return fail(static_cast<ncclResult_t>(n.status().code()),
                    "ncclCommInitAll: " + n.status().message());
      for (int i = 0; i < ndev; ++i) {
        int d = devlist ? devlist[i] : i;
        if (d < 0 || d >= n.value())
          return fail(ncclInvalidArgument,
                      fmt::format("ncclCommInitAll: device {} of rank {} does not exist "
                                  "(backend {} has {} device(s))",
                                  d, i, backend.value()->name(), n.value()));
      }
    }
    ncclUniqueId id;
    ncclResult_t rc = ncclGetUniqueId(&id);
    if (rc != ncclSuccess) return rc;
    rc = ncclGroupStart();
    if (rc != ncclSuccess) return rc;
    for (int i = 0; i < ndev; ++i) {
      const int device = backend.value()->hostOnly() ? 0 : devlist ? devlist[i] : i;
      rc = initRank("ncclCommInitAll", &comms[i], ndev, id, i, nullptr, device);
      if (rc != ncclSuccess) t_group.deferred = rc;
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
    ncclResult_t rc = checkComm(comm, "ncclCommSplit");
    if (rc != ncclSuccess) return rc;
    if (!newcomm) return fail(ncclInvalidArgument, "ncclCommSplit: newcomm is NULL", comm);
    if (color < 0 && color != NCCL_SPLIT_NOCOLOR)
      return fail(ncclInvalidArgument, fmt::format("ncclCommSplit: invalid color {}", color), comm);
    *newcomm = nullptr;
    std::unique_lock<std::mutex> lk(comm->impl->mutex());
    core::Bootstrap& bs = comm->impl->bootstrap();
    const int n = comm->nranks;
    struct Entry {
      int32_t color, key, rank, pad;
    };
    std::vector<Entry> all(n);
    all[comm->rank] = {color, key, comm->rank, 0};
    Status st = bs.allGather(all.data(), sizeof(Entry));
    if (!st) return fromStatus(st.withContext("ncclCommSplit"), comm);
    uint64_t seq = comm->impl->nextSplitSeq();
    if (color == NCCL_SPLIT_NOCOLOR) return ncclSuccess;
    std::vector<Entry> mine;
    for (auto& e : all)
      if (e.color == color) mine.push_back(e);
    std::stable_sort(mine.begin(), mine.end(), [](const Entry& a, const Entry& b) {
      return a.key != b.key ? a.key < b.key : a.rank < b.rank;
    });
    int newRank = 0;
    for (size_t i = 0; i < mine.size(); ++i)
      if (mine[i].rank == comm->rank) newRank = static_cast<int>(i);
    uint64_t tag = (3ull << 60) | (seq << 20);
    ncclUniqueId id;
    if (newRank == 0) {
      st = core::createUniqueId(reinterpret_cast<uint8_t*>(id.internal));
      if (!st) return fromStatus(st.withContext("ncclCommSplit"), comm);
      for (size_t i = 1; i < mine.size(); ++i) {
        st = bs.send(mine[i].rank, tag, &id, sizeof(id));
        if (!st) return fromStatus(st.withContext("ncclCommSplit"), comm);
      }
    } else {
      auto got = bs.recv(mine[0].rank, tag);
      if (!got) return fromStatus(got.status().withContext("ncclCommSplit"), comm);
      if (got->size() != sizeof(id)) return fail(ncclInternalError, "ncclCommSplit: bad id", comm);
      memcpy(&id, got->data(), sizeof(id));
    }
    lk.unlock();
    ncclConfig_t inherit = NCCL_CONFIG_INITIALIZER;
    inherit.blocking = comm->config.blocking ? 1 : 0;
    // Children keep the parent's device.
    return initRank("ncclCommSplit", newcomm, static_cast<int>(mine.size()), id, newRank,
                    config ? config : &inherit, comm->device);
  });
}
TUTTI_PNCCL(ncclCommSplit)

TUTTI_API ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  return guard("ncclCommFinalize", [&] {
    ncclResult_t rc = checkComm(comm, "ncclCommFinalize", false);
    if (rc != ncclSuccess) return rc;
    // Every operation on the host path has completed when its call returned,
    // so there is nothing left to flush.
    comm->finalized = true;
    return ncclSuccess;
  });
}
TUTTI_PNCCL(ncclCommFinalize)

TUTTI_API ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  return guard("ncclCommDestroy", [&] {
    if (!comm) return ncclSuccess;  // like NCCL: destroying NULL is a no-op
    ncclResult_t rc = checkComm(comm, "ncclCommDestroy", false);
    if (rc != ncclSuccess) return rc;
    destroyComm(comm, false);
    return ncclSuccess;
  });
}
TUTTI_PNCCL(ncclCommDestroy)

TUTTI_API ncclResult_t ncclCommAbort(ncclComm_t comm) {
  return guard("ncclCommAbort", [&] {
    if (!comm) return ncclSuccess;
    ncclResult_t rc = checkComm(comm, "ncclCommAbort", false);
    if (rc != ncclSuccess) return rc;
    destroyComm(comm, true);
    return ncclSuccess;
  });
}
TUTTI_PNCCL(ncclCommAbort)

TUTTI_API ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  return guard("ncclCommGetAsyncError", [&] {
    ncclResult_t rc = checkComm(comm, "ncclCommGetAsyncError", false);
    if (rc != ncclSuccess) return rc;
    if (!asyncError)
      return fail(ncclInvalidArgument, "ncclCommGetAsyncError: asyncError is NULL", comm);
    int st = comm->initState.load();
    if (st != ncclSuccess) {
      if (st != ncclInProgress && comm->initThread.joinable()) comm->initThread.join();
      *asyncError = static_cast<ncclResult_t>(st);
      return ncclSuccess;
    }
    if (comm->initThread.joinable()) comm->initThread.join();
    *asyncError = static_cast<ncclResult_t>(comm->impl->asyncErrorCode());
    return ncclSuccess;
  });
}
TUTTI_PNCCL(ncclCommGetAsyncError)

TUTTI_API ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  return guard("ncclCommCount", [&] {
    ncclResult_t rc = checkComm(comm, "ncclCommCount", false);
    if (rc != ncclSuccess) return rc;
    if (!count) return fail(ncclInvalidArgument, "ncclCommCount: count is NULL", comm);
    *count = comm->nranks;
    return ncclSuccess;
  });
}
TUTTI_PNCCL(ncclCommCount)

TUTTI_API ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  return guard("ncclCommCuDevice", [&] {
    ncclResult_t rc = checkComm(comm, "ncclCommCuDevice", false);
    if (rc != ncclSuccess) return rc;
    if (!device) return fail(ncclInvalidArgument, "ncclCommCuDevice: device is NULL", comm);
    *device = comm->device;  // 0 on the CPU backend (docs/api.md)
    return ncclSuccess;
  });
}
TUTTI_PNCCL(ncclCommCuDevice)

TUTTI_API ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  return guard("ncclCommUserRank", [&] {
    ncclResult_t rc = checkComm(comm, "ncclCommUserRank", false);
    if (rc != ncclSuccess) return rc;
    if (!rank) return fail(ncclInvalidArgument, "ncclCommUserRank: rank is NULL", comm);
    *rank = comm->rank;
    return ncclSuccess;
  });
}
TUTTI_PNCCL(ncclCommUserRank)

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
    core::UserRedOp u;
    u.live = true;
    u.dt = dt;
    u.residence = where;
    u.ptr = scalar;
    if (where == ncclScalarHostImmediate) {
      u.value = tutti::cpu::scalarValue(scalar, dt);
      memcpy(&u.raw, scalar, tutti::dataTypeSize(static_cast<tutti::DataType>(dt)));
    }
    auto& userOps = comm->impl->userOps();
    size_t idx = 0;
    while (idx < userOps.size() && userOps[idx].live) ++idx;
    if (idx == userOps.size())
      userOps.push_back(u);
    else
      userOps[idx] = u;
    *op = static_cast<ncclRedOp_t>(ncclNumOps + static_cast<int>(idx));
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
    if (comm->initState.load() != ncclSuccess)
      return fail(ncclInvalidUsage, "ncclRedOpDestroy: communicator is not initialised", comm);
    auto& userOps = comm->impl->userOps();
    size_t idx = static_cast<size_t>(v) - ncclNumOps;
    if (v < 0 || idx >= userOps.size() || !userOps[idx].live)
      return fail(ncclInvalidArgument,
                  fmt::format("ncclRedOpDestroy: op {} was not created on this communicator", v),
                  comm);
    userOps[idx].live = false;
    return ncclSuccess;
  });
}
TUTTI_PNCCL(ncclRedOpDestroy)

TUTTI_API ncclResult_t ncclMemAlloc(void** ptr, size_t size) {
  return guard("ncclMemAlloc", [&] {
    if (!ptr) return fail(ncclInvalidArgument, "ncclMemAlloc: ptr is NULL");
    *ptr = nullptr;
    if (size == 0) return ncclSuccess;
    // Through the process backend: device memory of the calling thread's
    // current device, or page-aligned host memory on the CPU backend.
    auto backend = core::processBackend();
    if (!backend) return fromStatus(backend.status().withContext("ncclMemAlloc"), nullptr);
    auto device = backend.value()->currentDevice();  // the CPU backend's is always 0
    if (!device) return fromStatus(device.status().withContext("ncclMemAlloc"), nullptr);
    auto p = backend.value()->alloc(device.value(), size);
    if (!p)
      return fromStatus(p.status().withContext(fmt::format("ncclMemAlloc of {} bytes", size)),
                        nullptr);
    *ptr = p.value();
    return ncclSuccess;
  });
}
TUTTI_PNCCL(ncclMemAlloc)

TUTTI_API ncclResult_t ncclMemFree(void* ptr) {
  return guard("ncclMemFree", [&] {
    if (!ptr) return ncclSuccess;
    auto backend = core::processBackend();
    if (!backend) return fromStatus(backend.status().withContext("ncclMemFree"), nullptr);
    Status st = backend.value()->free(ptr);
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
    *handle = comm->impl->registerRange(buff, size);
    return ncclSuccess;
  });
}
TUTTI_PNCCL(ncclCommRegister)

TUTTI_API ncclResult_t ncclCommDeregister(const ncclComm_t comm, void* handle) {
  return guard("ncclCommDeregister", [&] {
    ncclResult_t rc = checkComm(comm, "ncclCommDeregister", false);
    if (rc != ncclSuccess) return rc;
    if (comm->initState.load() != ncclSuccess || !comm->impl->deregister(handle))
      return fail(ncclInvalidArgument,
                  "ncclCommDeregister: handle was not returned by ncclCommRegister on this "
                  "communicator (or was already deregistered)",
                  comm);
    return ncclSuccess;
  });
}
TUTTI_PNCCL(ncclCommDeregister)

// ---- collectives and point-to-point ---------------------------------------------

TUTTI_API ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                                     ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                     cudaStream_t stream) {
  return guard("ncclAllReduce", [&] {
    return collective("ncclAllReduce", Collective::kAllReduce, sendbuff, recvbuff, count,
                      rawEnum(datatype), rawEnum(op), 0, comm, stream);
  });
}
TUTTI_PNCCL(ncclAllReduce)

TUTTI_API ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                                     ncclDataType_t datatype, int root, ncclComm_t comm,
                                     cudaStream_t stream) {
  return guard("ncclBroadcast", [&] {
    return collective("ncclBroadcast", Collective::kBroadcast, sendbuff, recvbuff, count,
                      rawEnum(datatype), ncclSum, root, comm, stream);
  });
}
TUTTI_PNCCL(ncclBroadcast)

TUTTI_API ncclResult_t ncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root,
                                 ncclComm_t comm, cudaStream_t stream) {
  return guard("ncclBcast", [&] {
    return collective("ncclBcast", Collective::kBroadcast, buff, buff, count, rawEnum(datatype),
                      ncclSum, root, comm, stream);
  });
}
TUTTI_PNCCL(ncclBcast)

TUTTI_API ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count,
                                  ncclDataType_t datatype, ncclRedOp_t op, int root,
                                  ncclComm_t comm, cudaStream_t stream) {
  return guard("ncclReduce", [&] {
    return collective("ncclReduce", Collective::kReduce, sendbuff, recvbuff, count,
                      rawEnum(datatype), rawEnum(op), root, comm, stream);
  });
}
TUTTI_PNCCL(ncclReduce)

TUTTI_API ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                                     ncclDataType_t datatype, ncclComm_t comm,
                                     cudaStream_t stream) {
  return guard("ncclAllGather", [&] {
    return collective("ncclAllGather", Collective::kAllGather, sendbuff, recvbuff, sendcount,
                      rawEnum(datatype), ncclSum, 0, comm, stream);
  });
}
TUTTI_PNCCL(ncclAllGather)

TUTTI_API ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                         ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                         cudaStream_t stream) {
  return guard("ncclReduceScatter", [&] {
    return collective("ncclReduceScatter", Collective::kReduceScatter, sendbuff, recvbuff,
                      recvcount, rawEnum(datatype), rawEnum(op), 0, comm, stream);
  });
}
TUTTI_PNCCL(ncclReduceScatter)

TUTTI_API ncclResult_t ncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count,
                                    ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  return guard("ncclAlltoAll", [&] {
    return collective("ncclAlltoAll", Collective::kAllToAll, sendbuff, recvbuff, count,
                      rawEnum(datatype), ncclSum, 0, comm, stream);
  });
}
TUTTI_PNCCL(ncclAlltoAll)

TUTTI_API ncclResult_t ncclGather(const void* sendbuff, void* recvbuff, size_t count,
                                  ncclDataType_t datatype, int root, ncclComm_t comm,
                                  cudaStream_t stream) {
  return guard("ncclGather", [&] {
    return collective("ncclGather", Collective::kGather, sendbuff, recvbuff, count,
                      rawEnum(datatype), ncclSum, root, comm, stream);
  });
}
TUTTI_PNCCL(ncclGather)

TUTTI_API ncclResult_t ncclScatter(const void* sendbuff, void* recvbuff, size_t count,
                                   ncclDataType_t datatype, int root, ncclComm_t comm,
                                   cudaStream_t stream) {
  return guard("ncclScatter", [&] {
    return collective("ncclScatter", Collective::kScatter, sendbuff, recvbuff, count,
                      rawEnum(datatype), ncclSum, root, comm, stream);
  });
}
TUTTI_PNCCL(ncclScatter)

TUTTI_API ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype,
                                int peer, ncclComm_t comm, cudaStream_t stream) {
  return guard("ncclSend", [&] {
    return collective("ncclSend", Collective::kSend, sendbuff, nullptr, count, rawEnum(datatype),
                      ncclSum, peer, comm, stream);
  });
}
TUTTI_PNCCL(ncclSend)

TUTTI_API ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                                ncclComm_t comm, cudaStream_t stream) {
  return guard("ncclRecv", [&] {
    return collective("ncclRecv", Collective::kRecv, nullptr, recvbuff, count, rawEnum(datatype),
                      ncclSum, peer, comm, stream);
  });
}
TUTTI_PNCCL(ncclRecv)

TUTTI_API ncclResult_t ncclGroupStart() {
  t_group.depth++;
  return ncclSuccess;
}
TUTTI_PNCCL(ncclGroupStart)

TUTTI_API ncclResult_t ncclGroupEnd() {
  return guard("ncclGroupEnd", [&] {
    if (t_group.depth <= 0)
      return fail(ncclInvalidUsage, "ncclGroupEnd called without a matching ncclGroupStart");
    if (--t_group.depth > 0) return ncclSuccess;
    return groupEndImpl();
  });
}
TUTTI_PNCCL(ncclGroupEnd)

namespace tutti::capi {

bool inGroup() { return t_group.depth > 0; }

}  // namespace tutti::capi
