// The NCCL C API, collectives, point-to-point and groups: validated here,
// planned and run by the core (core/group.h).
#include <vector>

#include "base/log.h"
#include "capi/errors.h"
#include "capi/export.h"
#include "capi/handle.h"
#include "capi/ops.h"
#include "core/group.h"
#include "core/staging.h"

using tutti::algo::Collective;
namespace core = tutti::core;
namespace capi = tutti::capi;
using tutti::capi::checkComm;
using tutti::capi::checkDtype;
using tutti::capi::fail;
using tutti::capi::fromStatus;
using tutti::capi::guard;
using tutti::capi::rawEnum;
using tutti::capi::typeName;

namespace {

// The handle of `impl` among `handles` (where a core error is recorded).
ncclComm* handleOf(const core::Comm* impl, const std::vector<ncclComm*>& handles) {
  for (ncclComm* h : handles)
    if (h->impl() == impl) return h;
  return handles.empty() ? nullptr : handles[0];
}

ncclResult_t checkAndRun(const char* fn, Collective coll, const void* send, void* recv,
                         size_t count, int dt, int op, int root, ncclComm_t comm,
                         cudaStream_t stream, int* source = nullptr) {
  ncclResult_t rc = checkComm(comm, fn);
  if (rc != ncclSuccess) return rc;
  if ((rc = checkDtype(dt, fn, comm)) != ncclSuccess) return rc;
  if (core::isReducing(coll) &&
      (rc = fromStatus(comm->impl()->checkRedOp(op, dt).withContext(fn), comm)) != ncclSuccess)
    return rc;
  if ((rc = fromStatus(
           core::checkCall(*comm->impl(), coll, send, recv, count, dt, root).withContext(fn),
           comm)) != ncclSuccess)
    return rc;
  if (root == core::Op::kAnySource) {
    if (!source) return fail(ncclInvalidArgument, std::string(fn) + ": peer is NULL", comm);
    if (!count)
      return fail(ncclInvalidArgument,
                  std::string(fn) + ": count 0 (a zero-length send carries no message)", comm);
    if (capi::threadGroup().depth > 0)
      return fail(ncclInvalidUsage,
                  std::string(fn) + ": not inside a group (its peer is known only when it runs)",
                  comm);
  }
  TUTTI_INFO(tutti::log::kColl,
             "{}: sendbuff {} recvbuff {} count {} datatype {} op {} root {} comm {} [nranks={}]",
             fn, send, static_cast<void*>(recv), count, typeName(dt), op, root,
             static_cast<void*>(comm), comm->nranks());
  core::Op o = core::apiOp(*comm->impl(), coll, send, recv, count, dt, op, root,
                           reinterpret_cast<core::Queue>(stream));
  o.source = source;
  capi::GroupState& group = capi::threadGroup();
  if (group.depth > 0) {
    group.ops.push_back(o);
    group.handles.push_back(comm);
    return ncclSuccess;
  }
  const core::RunResult res = core::submitOne(o);
  if (!res.status) return fromStatus(res.status, comm);
  return res.inProgress ? ncclInProgress : ncclSuccess;
}

// A call refused inside a group fails the whole group (groupEndImpl).
ncclResult_t collective(const char* fn, Collective coll, const void* send, void* recv, size_t count,
                        int dt, int op, int root, ncclComm_t comm, cudaStream_t stream,
                        int* source = nullptr) {
  ncclResult_t rc = checkAndRun(fn, coll, send, recv, count, dt, op, root, comm, stream, source);
  capi::GroupState& g = capi::threadGroup();
  if (rc == ncclSuccess || rc == ncclInProgress || g.depth == 0) return rc;
  if (g.refusedWhy.empty()) g.refusedWhy = capi::lastError(nullptr);
  if (g.deferred == ncclSuccess) g.deferred = rc;
  if (capi::isLiveComm(comm) && comm->init.state() == tutti::Code::kOk)
    g.refused.push_back(comm->impl());
  return rc;
}

ncclResult_t groupEndImpl() {
  // The group's contents, emptied when this returns; the vectors keep their
  // capacity for the next group (a group of 64 small operations would
  // otherwise regrow them every time). Nothing below adds to them: depth is
  // 0 already, so any call made meanwhile would not be deferred.
  capi::GroupState& g = capi::threadGroup();
  struct Clear {
    capi::GroupState& g;
    ~Clear() {
      g.inits.clear();
      g.ops.clear();
      g.handles.clear();
      g.refused.clear();
      g.refusedWhy.clear();
      g.deferred = ncclSuccess;
    }
  } clear{g};
  ncclResult_t result = g.deferred;
  // 1. Initialisations, concurrently (one thread may init every rank).
  std::vector<core::CommInit*> inits;
  for (ncclComm* c : g.inits) inits.push_back(&c->init);
  core::CommInit::runAll(inits);
  for (ncclComm* c : g.inits) {
    ncclResult_t rc = capi::initResult(c, "ncclGroupEnd");
    if (rc != ncclSuccess && result == ncclSuccess) result = rc;
  }
  if (!g.refusedWhy.empty()) {  // nothing runs; the peers are told
    for (ncclComm* c : g.handles) g.refused.push_back(c->impl());
    const tutti::Status why(static_cast<tutti::Code>(result), g.refusedWhy);
    return fail(result, "ncclGroupEnd: " + core::failRefusedGroup(g.refused, why).message(),
                g.handles.empty() ? nullptr : g.handles[0]);
  }
  if (g.ops.empty()) return result;
  if (result != ncclSuccess) return result;
  // 2. Operations: every communicator still usable, then the core runs them.
  for (ncclComm* c : g.handles) {
    ncclResult_t rc = checkComm(c, "ncclGroupEnd");
    if (rc != ncclSuccess) return rc;
  }
  const core::RunResult res = core::submitGroup(g.ops);
  if (!res.status) return fromStatus(res.status, handleOf(res.comm, g.handles));
  return res.inProgress ? ncclInProgress : ncclSuccess;
}

}  // namespace

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

TUTTI_API ncclResult_t tuttiRecvAny(void* recvbuff, size_t count, ncclDataType_t datatype,
                                    int* peer, ncclComm_t comm, cudaStream_t stream) {
  return guard("tuttiRecvAny", [&] {
    return collective("tuttiRecvAny", Collective::kRecv, nullptr, recvbuff, count,
                      rawEnum(datatype), ncclSum, core::Op::kAnySource, comm, stream, peer);
  });
}

TUTTI_API ncclResult_t ncclGroupStart() {
  capi::threadGroup().depth++;
  return ncclSuccess;
}
TUTTI_PNCCL(ncclGroupStart)

TUTTI_API ncclResult_t ncclGroupEnd() {
  return guard("ncclGroupEnd", [&] {
    if (capi::threadGroup().depth <= 0)
      return fail(ncclInvalidUsage, "ncclGroupEnd called without a matching ncclGroupStart");
    if (--capi::threadGroup().depth > 0) return ncclSuccess;
    return groupEndImpl();
  });
}
TUTTI_PNCCL(ncclGroupEnd)
