// The NCCL C API on top of tutti::core. Every function: validate, call into
// C++, map errors (errors.h). Host-memory semantics: see docs/api.md.
#include <dlfcn.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <type_traits>

#include "algo/cost_model.h"
#include "algo/schedule.h"
#include "backends/cpu/codec_kernels.h"
#include "backends/cpu/cpu_backend.h"
#include "base/log.h"
#include "base/params.h"
#include "capi/errors.h"
#include "capi/export.h"
#include "capi/handle.h"
#include "capi/ops.h"
#include "compress/wire.h"
#include "core/backend.h"
#include "core/bootstrap.h"
#include "core/executor.h"
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

struct PendingOp {
  ncclComm* comm;
  Collective coll;
  const void* send;
  void* recv;
  size_t count;
  int dt;  // raw values as passed (see rawEnum), validated
  int op;
  int root;  // root, or peer for send/recv
  // Compressed all-reduce (float32): the wire format, and where its state
  // (residuals) and counters live. fp16 with needsScale: the scale exponent is
  // agreed by all ranks when the group runs (agreeScales).
  algo::WireSpec wire{};
  bool needsScale = false;
  float* state = nullptr;
  uint64_t* wireBytes = nullptr;
  core::Queue stream = nullptr;  // the caller's stream: the backend queue to order with
};

struct GroupState {
  int depth = 0;
  std::vector<ncclComm*> inits;
  std::vector<PendingOp> ops;
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

ncclResult_t checkComm(ncclComm_t comm, const char* fn, bool needReady = true) {
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

ncclResult_t checkDtype(int dt, const char* fn, ncclComm_t comm) {
  if (dt < 0 || dt >= ncclNumTypes)
    return fail(ncclInvalidArgument, std::string(fn) + ": invalid datatype " + std::to_string(dt),
                comm);
  return ncclSuccess;
}

ncclResult_t checkOp(int op, int dt, const char* fn, ncclComm_t comm) {
  int v = op;
  if (v >= 0 && v < ncclNumOps) return ncclSuccess;
  size_t idx = static_cast<size_t>(v) - ncclNumOps;
  if (v < 0 || idx >= comm->userOps.size() || !comm->userOps[idx].live)
    return fail(ncclInvalidArgument,
                std::string(fn) + ": invalid reduction op " + std::to_string(v) +
                    " (not built-in and not created on this communicator)",
                comm);
  if (comm->userOps[idx].dt != dt)
    return fail(ncclInvalidArgument,
                fmt::format("{}: reduction op {} was created for datatype {} but the call uses {}",
                            fn, v, typeName(comm->userOps[idx].dt), typeName(dt)),
                comm);
  return ncclSuccess;
}

algo::ReduceSpec makeSpec(ncclComm* comm, int dt, int op) {
  algo::ReduceSpec s;
  s.dt = static_cast<tutti::DataType>(dt);
  int v = op;
  if (v == ncclAvg) {
    if (tutti::isFloating(s.dt)) {
      s.op = tutti::RedOp::kPreMulSum;
      s.scalar = 1.0 / comm->nranks;
    } else {
      s.op = tutti::RedOp::kSum;
      s.divisor = comm->nranks;
    }
  } else if (v < ncclNumOps) {
    s.op = static_cast<tutti::RedOp>(v);
  } else {
    const auto& u = comm->userOps[v - ncclNumOps];
    s.op = tutti::RedOp::kPreMulSum;
    if (u.residence == ncclScalarHostImmediate) {
      s.scalar = u.value;
    } else if (comm->backend->isDevice(u.ptr)) {
      // A scalar in device memory: read through the backend at each use.
      uint64_t raw = 0;
      Status st = comm->backend->copy(&raw, u.ptr, tutti::dataTypeSize(s.dt));
      if (!st) TUTTI_WARN("reading the PreMulSum scalar: {} (using 0)", st.message());
      s.scalar = tutti::cpu::scalarValue(&raw, u.dt);
    } else {
      s.scalar = tutti::cpu::scalarValue(u.ptr, u.dt);
    }
  }
  return s;
}

bool isReducing(Collective c) {
  return c == Collective::kAllReduce || c == Collective::kReduce || c == Collective::kReduceScatter;
}

// How an operation's values combine: the reduction for reducing
// collectives, plain data movement otherwise; always with its datatype.
algo::ReduceSpec specOf(ncclComm* comm, const PendingOp& o) {
  algo::ReduceSpec s = isReducing(o.coll) ? makeSpec(comm, o.dt, o.op) : algo::ReduceSpec{};
  s.dt = static_cast<tutti::DataType>(o.dt);
  return s;
}

// The operation as a one-shot collective, when the communicator's arena
// takes it (same answer on every rank: it depends on collective, count and
// datatype only).
bool oneShotOp(ncclComm* comm, const PendingOp& o, core::OneShotOp* out) {
  core::OneShot* os = comm->impl->oneShot();
  // Compressed operations and counted ones (a compressor's exact calls) need
  // the executor: the arena has no wire format and sends no messages.
  if (!os || o.count == 0 || o.wire.format != algo::Wire::kRaw || o.wireBytes) return false;
  size_t es = tutti::dataTypeSize(static_cast<tutti::DataType>(o.dt));
  bool direct = false;
  if (!os->takes(o.coll, o.count, es, &direct)) return false;
  out->direct = direct;
  out->coll = o.coll;
  out->send = static_cast<const uint8_t*>(o.send);
  out->recv = static_cast<uint8_t*>(o.recv);
  out->count = o.count;
  out->elemSize = es;
  out->spec = specOf(comm, o);
  out->root = o.root;
  out->redop = o.op;
  return true;
}

// Validates and records one operation; runs it unless inside a group.
ncclResult_t enqueue(const char* fn, PendingOp op);
ncclResult_t groupEndImpl();

// What TUTTI_COMPRESSION asks of a plain ncclAllReduce on `comm` (float32
// sum/avg of at least TUTTI_COMPRESSION_MIN_BYTES, communicator spanning
// several nodes): fp16 or bf16 on the wire, or nothing.
algo::Wire envCompression(ncclComm* comm, size_t bytes, int dt, int op) {
  if (dt != ncclFloat32 || (op != ncclSum && op != ncclAvg) || comm->nranks < 2)
    return algo::Wire::kRaw;
  const std::string& mode = comm->impl->compressionEnv();
  if (mode.empty() || bytes < comm->impl->compressionMinBytes()) return algo::Wire::kRaw;
  if (comm->impl->nodeMap().nNodes() < 2) return algo::Wire::kRaw;
  return mode == "fp16" ? algo::Wire::kHalf : algo::Wire::kBf16;
}

ncclResult_t collective(const char* fn, Collective coll, const void* send, void* recv, size_t count,
                        int dt, int op, int root, ncclComm_t comm, cudaStream_t stream,
                        const tutti::capi::Compressed* compressed = nullptr) {
  ncclResult_t rc = checkComm(comm, fn);
  if (rc != ncclSuccess) return rc;
  if ((rc = checkDtype(dt, fn, comm)) != ncclSuccess) return rc;
  if (isReducing(coll) && (rc = checkOp(op, dt, fn, comm)) != ncclSuccess) return rc;
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
    tutti::capi::ioBytes(coll, count, es, r, n, root, &sendBytes, &recvBytes);
    if (sendBytes && !send)
      return fail(ncclInvalidArgument, std::string(fn) + ": sendbuff is NULL", comm);
    if (recvBytes && !recv)
      return fail(ncclInvalidArgument, std::string(fn) + ": recvbuff is NULL", comm);
  }
  TUTTI_INFO(tutti::log::kColl,
             "{}: sendbuff {} recvbuff {} count {} datatype {} op {} root {} comm {} [nranks={}]",
             fn, send, static_cast<void*>(recv), count, typeName(dt), op, root,
             static_cast<void*>(comm), n);
  PendingOp pending{comm, coll, send, recv, count, dt, op, root};
  pending.stream = reinterpret_cast<core::Queue>(stream);
  if (compressed) {
    pending.wire = compressed->wire;
    pending.needsScale = compressed->wire.format == algo::Wire::kHalf;
    pending.state = compressed->state;
    pending.wireBytes = compressed->wireBytes;
  } else if (coll == Collective::kAllReduce && count > 0) {
    pending.wire.format = envCompression(comm, count * es, dt, op);
    pending.needsScale = pending.wire.format == algo::Wire::kHalf;
  }
  return enqueue(fn, pending);
}

ncclResult_t runAlone(const PendingOp& op);
ncclResult_t fromStatusOfGroup(const Status& st, const std::vector<ncclComm*>& comms);

ncclResult_t enqueue(const char*, PendingOp op) {
  core::OneShotOp small;
  // (Device backends stage buffers in groupEndImpl first.)
  if (t_group.depth == 0 && op.comm->backend->hostOnly()) {
    if (oneShotOp(op.comm, op, &small)) {
      // The latency path: no group bookkeeping, no schedule, no executor.
      tutti::log::setThreadRank(op.comm->rank);
      std::lock_guard<std::mutex> lk(op.comm->impl->mutex());
      Status st = op.comm->impl->oneShot()->run(small);
      return st ? ncclSuccess : fromStatus(st, op.comm);
    }
    // A plain collective on its own: what ncclGroupEnd would do for it, without the group.
    const bool plain = op.coll != Collective::kSend && op.coll != Collective::kRecv &&
                       op.wire.format == algo::Wire::kRaw && !op.needsScale && !op.state &&
                       !op.wireBytes && !op.comm->ipc;
    if (plain) return runAlone(op);
  }
  t_group.ops.push_back(op);
  if (t_group.depth > 0) return ncclSuccess;
  return groupEndImpl();
}

bool inPlaceOf(const PendingOp& o, size_t es) {
  auto s = reinterpret_cast<uintptr_t>(o.send), d = reinterpret_cast<uintptr_t>(o.recv);
  size_t blk = o.count * es;
  int r = o.comm->rank;
  switch (o.coll) {
    case Collective::kAllGather:
      return s == d + r * blk;
    case Collective::kReduceScatter:
      return d == s + r * blk;
    case Collective::kGather:
      return s == d + r * blk;
    case Collective::kScatter:
      return d == s + r * blk;
    default:
      return s == d;
  }
}

// The INFO line that says which algorithm runs an operation.
void logAlgorithm(ncclComm* comm, const PendingOp& o, const algo::Schedule& s) {
  // NCCL_ALGO is honoured when it names what runs (a two-level algorithm on
  // one node runs as the ring).
  const std::string& algoEnv = comm->impl->algoEnv();
  const auto forcedAlgo = comm->impl->forcedAlgo();
  const bool forced = forcedAlgo != algo::CollArgs::Algo::kAuto &&
                      (o.coll == Collective::kAllReduce || o.coll == Collective::kAllGather ||
                       o.coll == Collective::kReduceScatter) &&
                      s.algorithm == algo::algoName(forcedAlgo);
  TUTTI_INFO(tutti::log::kTuning, "{} count {} {} on {} ranks: algorithm {}{}{}{}",
             algo::collectiveName(o.coll), o.count, typeName(o.dt), comm->nranks, s.algorithm,
             algoEnv.empty() ? "" : " (NCCL_ALGO=", algoEnv,
             algoEnv.empty() ? "" : (forced ? ")" : " not applicable)"));
}

// Builds the work of one communicator for the operations of a group.
Status buildWork(ncclComm* comm, const std::vector<const PendingOp*>& ops, core::Work* w) {
  w->comm = comm->impl.get();
  const size_t chunk = comm->impl->chunkBytes();
  // Instance 0 holds every point-to-point operation of the group (absolute
  // addresses); collectives follow in call order, so both sides of any pair
  // agree on instance numbers whatever the interleaving.
  algo::Schedule p2p;
  p2p.spec.dt = tutti::DataType::kUint8;
  p2p.algorithm = "p2p";
  std::map<int, uint64_t> sendK, recvK;
  std::vector<const PendingOp*> selfSends, selfRecvs;
  w->schedules.push_back(algo::Schedule());
  w->buffers.push_back({nullptr, nullptr, nullptr, nullptr, nullptr});
  w->descriptions.push_back("p2p");
  w->wireBytes.push_back(nullptr);
  std::vector<size_t> scratchOff;
  size_t scratchTotal = 0;
  for (const PendingOp* o : ops) {
    size_t es = tutti::dataTypeSize(static_cast<tutti::DataType>(o->dt));
    size_t bytes = o->count * es;
    if (o->coll == Collective::kSend || o->coll == Collective::kRecv) {
      if (bytes == 0) continue;
      int peer = o->root;
      if (peer == comm->rank) {
        (o->coll == Collective::kSend ? selfSends : selfRecvs).push_back(o);
        continue;
      }
      if (o->coll == Collective::kSend)
        algo::appendSend(&p2p, peer, sendK[peer]++ << 32,
                         {algo::Buf::kAbs, reinterpret_cast<uintptr_t>(o->send)}, bytes, chunk);
      else
        algo::appendRecv(&p2p, peer, recvK[peer]++ << 32,
                         {algo::Buf::kAbs, reinterpret_cast<uintptr_t>(o->recv)}, bytes, chunk);
      continue;
    }
    if (o->count == 0) continue;
    core::OneShotOp small;
    if (oneShotOp(comm, *o, &small)) {
      TUTTI_INFO(tutti::log::kTuning, "{} count {} {} on {} ranks: algorithm {}",
                 algo::collectiveName(o->coll), o->count, typeName(o->dt), comm->nranks,
                 small.direct ? "single-copy" : "one-shot");
      w->small.push_back(small);
      continue;
    }
    algo::CollArgs a;
    a.coll = o->coll;
    a.rank = comm->rank;
    a.nranks = comm->nranks;
    a.count = o->count;
    a.elemSize = es;
    a.spec = specOf(comm, *o);
    a.root = o->root;
    a.inPlace = inPlaceOf(*o, es);
    a.chunkBytes = chunk;
    a.rdMaxBytes = comm->impl->rdMaxBytes();
    a.nodes = &comm->impl->nodeMap();
    a.sharedMemory = comm->impl->sharedMemory();
    a.cost = &comm->impl->costModel();
    if (o->coll == Collective::kAllReduce || o->coll == Collective::kAllGather ||
        o->coll == Collective::kReduceScatter)
      a.algo = comm->impl->forcedAlgo();
    algo::Schedule s;
    if (o->wire.format == algo::Wire::kSign) {
      s = tutti::compress::signAllReduce(a);
    } else {
      if (o->wire.format != algo::Wire::kRaw) {
        // Recursive doubling rounds each pair's sum from two different
        // halves (each side's own input exact, the other's encoded), so the
        // ranks would not end bit-identical: rings and two-level only.
        a.rdMaxBytes = 0;
        const auto chosen = algo::chooseAllReduce(a);
        if (chosen == algo::CollArgs::Algo::kRecursiveDoubling ||
            chosen == algo::CollArgs::Algo::kRabenseifner)
          a.algo = algo::CollArgs::Algo::kRing;
      }
      s = algo::makeSchedule(a);
      if (o->wire.format != algo::Wire::kRaw) {
        tutti::compress::applyWire(&s, a, o->wire);
        s.algorithm += o->wire.format == algo::Wire::kHalf ? "+fp16" : "+bf16";
      }
    }
    logAlgorithm(comm, *o, s);
    scratchOff.push_back(scratchTotal);
    scratchTotal += (s.scratchBytes + 63) / 64 * 64;
    w->schedules.push_back(std::move(s));
    w->buffers.push_back({static_cast<uint8_t*>(const_cast<void*>(o->send)),
                          static_cast<uint8_t*>(o->recv), nullptr, nullptr,
                          reinterpret_cast<uint8_t*>(o->state)});
    w->descriptions.push_back(algo::collectiveName(o->coll));
    w->wireBytes.push_back(o->wireBytes);
  }
  if (selfSends.size() != selfRecvs.size())
    return tutti::invalidUsage(
        fmt::format("group has {} send(s) to self but {} receive(s) from self", selfSends.size(),
                    selfRecvs.size()));
  for (size_t i = 0; i < selfSends.size(); ++i) {
    size_t sb =
        selfSends[i]->count * tutti::dataTypeSize(static_cast<tutti::DataType>(selfSends[i]->dt));
    size_t rb =
        selfRecvs[i]->count * tutti::dataTypeSize(static_cast<tutti::DataType>(selfRecvs[i]->dt));
    if (sb != rb)
      return tutti::invalidUsage(
          fmt::format("send to self of {} bytes matched with a receive of {} bytes", sb, rb));
    p2p.local.push_back({algo::LocalKind::kCopy,
                         {algo::Buf::kAbs, reinterpret_cast<uintptr_t>(selfRecvs[i]->recv)},
                         {algo::Buf::kAbs, reinterpret_cast<uintptr_t>(selfSends[i]->send)},
                         sb});
  }
  w->schedules[0] = std::move(p2p);
  if (scratchTotal) {
    TUTTI_ASSIGN_OR_RETURN(uint8_t * base, comm->impl->scratch(scratchTotal));
    for (size_t i = 1; i < w->schedules.size(); ++i) w->buffers[i][2] = base + scratchOff[i - 1];
  }
  return Status::ok();
}

}  // namespace

// What the last collective run alone on a communicator was built for, and its
// work (buffers aside, a schedule depends only on these and on the
// communicator's settings, which are fixed at init).
struct ncclComm::LastWork {
  bool valid = false;
  Collective coll{};
  size_t count = 0;
  int dt = 0, op = 0, root = 0;
  bool inPlace = false;
  algo::ReduceSpec spec;
  tutti::core::Work work;
  std::vector<tutti::core::Work*> ptrs;

  bool matches(const PendingOp& o, bool inPlaceNow, const algo::ReduceSpec& specNow) const {
    return valid && o.coll == coll && o.count == count && o.dt == dt && o.op == op &&
           o.root == root && inPlaceNow == inPlace && specNow.dt == spec.dt &&
           specNow.op == spec.op && specNow.scalar == spec.scalar &&
           specNow.divisor == spec.divisor;
  }
};

namespace {

// One collective outside a group on host memory (no compression, no device
// IPC): builds its work as ncclGroupEnd would, or, when the communicator's
// last such call had the same shape, reuses that work with this call's
// buffers, so a repeated call builds no schedule and allocates nothing.
ncclResult_t runAlone(const PendingOp& op) {
  ncclComm* comm = op.comm;
  tutti::log::setThreadRank(comm->rank);
  std::lock_guard<std::mutex> lk(comm->impl->mutex());
  if (!comm->lastWork) comm->lastWork = std::make_shared<ncclComm::LastWork>();
  ncclComm::LastWork& last = *comm->lastWork;
  const size_t es = tutti::dataTypeSize(static_cast<tutti::DataType>(op.dt));
  const bool inPlace = inPlaceOf(op, es);
  const algo::ReduceSpec spec = specOf(comm, op);
  Status st;
  if (last.matches(op, inPlace, spec) && last.work.schedules.size() == 2) {
    // Instance 0 is the (empty) point-to-point schedule, 1 the collective.
    auto& b = last.work.buffers[1];
    b[static_cast<int>(algo::Buf::kSend)] = static_cast<uint8_t*>(const_cast<void*>(op.send));
    b[static_cast<int>(algo::Buf::kRecv)] = static_cast<uint8_t*>(op.recv);
    if (const size_t scratch = last.work.schedules[1].scratchBytes) {
      // Another operation may have grown (moved) the communicator's scratch.
      auto base = comm->impl->scratch((scratch + 63) / 64 * 64);
      if (!base) return fromStatus(base.status(), comm);
      b[static_cast<int>(algo::Buf::kScratch)] = *base;
    }
    logAlgorithm(comm, op, last.work.schedules[1]);
  } else {
    last.valid = false;
    last.work = tutti::core::Work();
    st = buildWork(comm, {&op}, &last.work);
    if (!st) return fromStatus(st, comm);
    last.coll = op.coll;
    last.count = op.count;
    last.dt = op.dt;
    last.op = op.op;
    last.root = op.root;
    last.inPlace = inPlace;
    last.spec = spec;
    last.ptrs.assign(1, &last.work);
    last.valid = true;
  }
  st = tutti::core::execute(last.ptrs);
  return st ? ncclSuccess : fromStatusOfGroup(st, {comm});
}

// A group's execution failed: the error of the communicator it belongs to.
ncclResult_t fromStatusOfGroup(const Status& st, const std::vector<ncclComm*>& comms) {
  for (ncclComm* c : comms)
    if (!c->impl->error().isOk()) return fromStatus(c->impl->error(), c);
  return fromStatus(st, comms[0]);
}

// fp16 compression scales by a power of two chosen from the largest
// magnitude over all ranks: one small max all-reduce (all the group's
// compressed operations of a communicator in one vector) before the group
// runs. bf16 has float32's range and needs none.
Status agreeScales(const std::vector<ncclComm*>& comms,
                   std::map<ncclComm*, std::vector<const PendingOp*>>& byComm) {
  std::vector<std::vector<float>> maxima(comms.size());
  std::vector<std::vector<PendingOp*>> scaled(comms.size());
  for (size_t i = 0; i < comms.size(); ++i) {
    for (const PendingOp* o : byComm[comms[i]]) {
      if (!o->needsScale) continue;
      auto* op = const_cast<PendingOp*>(o);
      scaled[i].push_back(op);
      maxima[i].push_back(tutti::cpu::maxAbs(static_cast<const float*>(o->send), o->count));
    }
  }
  std::vector<core::Work> works;
  works.reserve(comms.size());
  for (size_t i = 0; i < comms.size(); ++i) {
    if (maxima[i].empty()) continue;
    PendingOp probe{comms[i],         Collective::kAllReduce,
                    maxima[i].data(), maxima[i].data(),
                    maxima[i].size(), ncclFloat32,
                    ncclMax,          0};
    works.emplace_back();
    TUTTI_RETURN_IF_ERROR(buildWork(comms[i], {&probe}, &works.back()));
  }
  if (works.empty()) return Status::ok();
  std::vector<core::Work*> ptrs;
  for (auto& w : works) ptrs.push_back(&w);
  TUTTI_RETURN_IF_ERROR(core::execute(ptrs));
  for (size_t i = 0; i < comms.size(); ++i) {
    for (size_t k = 0; k < scaled[i].size(); ++k) {
      PendingOp* op = scaled[i][k];
      // Sum: partial results reach n times the largest input; avg's 1/n is
      // applied to each contribution before it is sent.
      const double factor = op->op == ncclAvg ? 1.0 : comms[i]->nranks;
      op->wire.exp = tutti::compress::halfScaleExp(maxima[i][k], factor);
      op->needsScale = false;
      TUTTI_INFO(tutti::log::kTuning, "fp16 compression: max |x| {} over {} ranks, scale 2^{}",
                 maxima[i][k], comms[i]->nranks, op->wire.exp);
    }
  }
  return Status::ok();
}

void runInit(ncclComm* c) {
  tutti::log::setThreadRank(c->rank);
  auto res = core::Comm::create(c->id, c->rank, c->nranks, c->config);
  if (!res) {
    fail(static_cast<ncclResult_t>(res.status().code()),
         fmt::format("ncclCommInitRank: rank {} of {}: {}", c->rank, c->nranks,
                     res.status().message()),
         c);
    c->initState.store(static_cast<int>(res.status().code()));
    return;
  }
  c->impl = std::move(res.value());
  if (c->nranks >= 2 && c->impl->allOnOneHost()) {
    auto ipc = tutti::capi::DeviceIpc::negotiate(c->impl.get(), c->backend, c->device);
    if (!ipc) {
      fail(static_cast<ncclResult_t>(ipc.status().code()),
           fmt::format("ncclCommInitRank: rank {} of {}: device IPC set-up: {}", c->rank, c->nranks,
                       ipc.status().message()),
           c);
      c->impl.reset();
      c->initState.store(static_cast<int>(ipc.status().code()));
      return;
    }
    c->ipc = std::move(ipc.value());
  }
  c->initState.store(ncclSuccess);
}

ncclResult_t runStaged(const std::vector<ncclComm*>& comms,
                       std::map<ncclComm*, std::vector<const PendingOp*>>& byComm);

// The operation as device_ipc.h takes it.
tutti::capi::IpcOp ipcOpOf(ncclComm* c, const PendingOp& o) {
  tutti::capi::IpcOp x{o.coll,  o.send, o.recv,
                       o.count, o.dt,   tutti::dataTypeSize(static_cast<tutti::DataType>(o.dt)),
                       o.root};
  x.stream = o.stream;
  if (isReducing(o.coll)) {
    if (o.op < ncclNumOps) {
      x.reduceOp = o.op;  // ncclSum..ncclAvg equal TUTTI_PLUGIN_OP_SUM..AVG
    } else {
      // PreMulSum: each rank scales its own contribution, then they are summed.
      const auto& u = c->userOps[o.op - ncclNumOps];
      x.reduceOp = TUTTI_PLUGIN_OP_SUM;
      if (u.residence == ncclScalarHostImmediate) {
        x.scalar = &u.raw;
      } else {
        x.scalar = u.ptr;  // read when the copy runs (on the device, or here)
        x.scalarOnDevice = c->backend->isDevice(u.ptr);
      }
    }
  }
  return x;
}

Status runIpcOps(ncclComm* c, const std::vector<const PendingOp*>& ops) {
  tutti::log::setThreadRank(c->rank);
  for (const PendingOp* o : ops) {
    TUTTI_INFO(tutti::log::kTuning, "{} count {} {} on {} ranks: algorithm device-ipc",
               algo::collectiveName(o->coll), o->count, typeName(o->dt), c->nranks);
    Status st = c->ipc->run(ipcOpOf(c, *o));
    if (!st) return st;
  }
  return Status();
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
    for (ncclComm* c : g.inits) threads.emplace_back(runInit, c);
    for (auto& t : threads) t.join();
  }
  for (ncclComm* c : g.inits)
    if (c->initState.load() != ncclSuccess && result == ncclSuccess)
      result = static_cast<ncclResult_t>(c->initState.load());
  if (g.ops.empty()) return result;
  if (result != ncclSuccess) return result;
  // 2. Operations, per communicator in first-use order.
  std::vector<ncclComm*> comms;
  std::map<ncclComm*, std::vector<const PendingOp*>> byComm;
  for (const auto& o : g.ops) {
    if (!byComm.count(o.comm)) comms.push_back(o.comm);
    byComm[o.comm].push_back(&o);
  }
  for (ncclComm* c : comms) {
    ncclResult_t rc = checkComm(c, "ncclGroupEnd");
    if (rc != ncclSuccess) return rc;
  }
  std::vector<ncclComm*> lockOrder = comms;
  std::sort(lockOrder.begin(), lockOrder.end());
  std::vector<std::unique_lock<std::mutex>> locks;
  for (ncclComm* c : lockOrder) locks.emplace_back(c->impl->mutex());
  // Device IPC: a communicator's raw collectives of the agreed size run
  // device to device (capi/device_ipc.h), in call order; everything else as
  // below. One communicator with nothing else to run: on this thread.
  // Otherwise each communicator's on a thread of its own while this thread
  // drives the rest, as the ranks of one group progress together (one thread
  // may drive every rank of a communicator).
  std::vector<std::pair<ncclComm*, std::vector<const PendingOp*>>> ipcWork;
  for (ncclComm* c : comms) {
    if (!c->ipc) continue;
    std::vector<const PendingOp*> viaIpc, rest;
    for (const PendingOp* o : byComm[c]) {
      const bool raw = o->wire.format == algo::Wire::kRaw && !o->wireBytes;
      size_t es = tutti::dataTypeSize(static_cast<tutti::DataType>(o->dt));
      (c->ipc->takes(o->coll, o->count, es, raw) ? viaIpc : rest).push_back(o);
    }
    if (viaIpc.empty()) continue;
    byComm[c] = std::move(rest);
    ipcWork.emplace_back(c, std::move(viaIpc));
  }
  std::vector<ncclComm*> staged;
  for (ncclComm* c : comms)
    if (!byComm[c].empty()) staged.push_back(c);
  std::vector<Status> ipcStatus(ipcWork.size());
  std::vector<std::thread> ipcThreads;
  if (ipcWork.size() == 1 && staged.empty()) {
    ipcStatus[0] = runIpcOps(ipcWork[0].first, ipcWork[0].second);
  } else {
    for (size_t i = 0; i < ipcWork.size(); ++i)
      ipcThreads.emplace_back(
          [&, i] { ipcStatus[i] = runIpcOps(ipcWork[i].first, ipcWork[i].second); });
  }
  ncclResult_t rc = staged.empty() ? ncclSuccess : runStaged(staged, byComm);
  for (auto& t : ipcThreads) t.join();
  if (rc != ncclSuccess) return rc;
  for (size_t i = 0; i < ipcWork.size(); ++i)
    if (!ipcStatus[i]) return fromStatus(ipcStatus[i], ipcWork[i].first);
  return ncclSuccess;
}

// The group's operations that run on host memory through the executor (with
// device buffers staged through pinned host memory), for `comms` (locked).
ncclResult_t runStaged(const std::vector<ncclComm*>& comms,
                       std::map<ncclComm*, std::vector<const PendingOp*>>& byComm) {
  // Device buffers: staged through pinned host memory, in stream order.
  std::vector<tutti::capi::DeviceStaging> stagings;
  auto unstage = [&](Status st) {
    for (auto& s : stagings) {
      Status o = s.stageOut(st.isOk());
      if (st && !o) st = o;
    }
    return st;
  };
  Status st;
  for (ncclComm* c : comms) {
    if (c->backend->hostOnly()) continue;
    std::vector<tutti::capi::StageOp> sops;
    for (const PendingOp* o : byComm[c]) {
      auto* m = const_cast<PendingOp*>(o);
      sops.push_back({m->coll, &m->send, &m->recv, m->count,
                      tutti::dataTypeSize(static_cast<tutti::DataType>(m->dt)), c->rank, c->nranks,
                      m->root, m->stream});
    }
    stagings.emplace_back(c->backend);
    st = stagings.back().stageIn(sops, &c->staging);
    if (!st) return fromStatus(unstage(st), c);
  }
  st = agreeScales(comms, byComm);
  if (!st) return fromStatusOfGroup(unstage(st), comms);
  std::vector<core::Work> works(comms.size());
  std::vector<core::Work*> ptrs;
  for (size_t i = 0; i < comms.size(); ++i) {
    tutti::log::setThreadRank(comms[i]->rank);
    st = buildWork(comms[i], byComm[comms[i]], &works[i]);
    if (!st) return fromStatus(unstage(st), comms[i]);
    ptrs.push_back(&works[i]);
  }
  st = unstage(core::execute(ptrs));
  if (!st) return fromStatusOfGroup(st, comms);
  return ncclSuccess;
}

ncclResult_t initRank(const char* fn, ncclComm_t* out, int nranks, const ncclUniqueId& id, int rank,
                      const ncclConfig_t* config) {
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
  auto device = backend.value()->currentDevice();  // the CPU backend's is always 0
  if (!device)
    return fail(static_cast<ncclResult_t>(device.status().code()),
                std::string(fn) + ": " + device.status().message());
  auto* c = new ncclComm();
  c->backend = backend.value();
  c->device = device.value();
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
    c->initThread = std::thread(runInit, c);
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
  c->ipc.reset();  // before impl: it waits through the communicator's arena
  tutti::capi::freePinned(c->backend, &c->staging);
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
      rc = initRank("ncclCommInitAll", &comms[i], ndev, id, i, nullptr);
      if (rc != ncclSuccess) t_group.deferred = rc;
      if (comms[i] && !backend.value()->hostOnly()) comms[i]->device = devlist ? devlist[i] : i;
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
    uint64_t seq = comm->splitSeq++;
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
    ncclResult_t made = initRank("ncclCommSplit", newcomm, static_cast<int>(mine.size()), id,
                                 newRank, config ? config : &inherit);
    if (*newcomm) (*newcomm)->device = comm->device;  // children keep the parent's device
    return made;
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
    ncclComm::UserOp u{true,
                       dt,
                       where,
                       scalar,
                       where == ncclScalarHostImmediate ? tutti::cpu::scalarValue(scalar, dt) : 0.0,
                       0};
    if (where == ncclScalarHostImmediate)
      memcpy(&u.raw, scalar, tutti::dataTypeSize(static_cast<tutti::DataType>(dt)));
    size_t idx = 0;
    while (idx < comm->userOps.size() && comm->userOps[idx].live) ++idx;
    if (idx == comm->userOps.size())
      comm->userOps.push_back(u);
    else
      comm->userOps[idx] = u;
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
    size_t idx = static_cast<size_t>(v) - ncclNumOps;
    if (v < 0 || idx >= comm->userOps.size() || !comm->userOps[idx].live)
      return fail(ncclInvalidArgument,
                  fmt::format("ncclRedOpDestroy: op {} was not created on this communicator", v),
                  comm);
    comm->userOps[idx].live = false;
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
    auto* h = new std::pair<void*, size_t>(buff, size);
    comm->registrations.insert(h);
    *handle = h;
    return ncclSuccess;
  });
}
TUTTI_PNCCL(ncclCommRegister)

TUTTI_API ncclResult_t ncclCommDeregister(const ncclComm_t comm, void* handle) {
  return guard("ncclCommDeregister", [&] {
    ncclResult_t rc = checkComm(comm, "ncclCommDeregister", false);
    if (rc != ncclSuccess) return rc;
    if (!comm->registrations.erase(handle))
      return fail(ncclInvalidArgument,
                  "ncclCommDeregister: handle was not returned by ncclCommRegister on this "
                  "communicator (or was already deregistered)",
                  comm);
    delete static_cast<std::pair<void*, size_t>*>(handle);
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

ncclResult_t allReduce(const char* fn, const void* send, void* recv, size_t count, int dt, int op,
                       ncclComm_t comm, const Compressed* c, cudaStream_t stream) {
  return collective(fn, Collective::kAllReduce, send, recv, count, dt, op, 0, comm, stream, c);
}

bool inGroup() { return t_group.depth > 0; }

}  // namespace tutti::capi
