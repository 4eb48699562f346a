#include "core/group.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "algo/cost_model.h"
#include "backends/cpu/codec_kernels.h"
#include "backends/cpu/cpu_backend.h"
#include "base/log.h"
#include "base/thread.h"
#include "base/types.h"
#include "compress/wire.h"
#include "core/comm.h"
#include "core/device_ipc.h"
#include "core/engine.h"
#include "core/executor.h"
#include "core/staging.h"
#include "nccl.h"

namespace tutti::core {

using algo::Collective;

namespace {

const char* typeName(int t) { return dataTypeName(static_cast<DataType>(t)); }
size_t elemSize(int dt) { return dataTypeSize(static_cast<DataType>(dt)); }

// `q`: the operation's queue, where a scalar in device memory is read (on the
// engine its own: a sync on the default queue could wait for the caller's
// stream, which the engine holds).
algo::ReduceSpec makeSpec(Comm& comm, int dt, int op, Queue q) {
  algo::ReduceSpec s;
  s.dt = static_cast<DataType>(dt);
  if (op == ncclAvg) {
    if (isFloating(s.dt)) {
      s.op = RedOp::kPreMulSum;
      s.scalar = 1.0 / comm.nranks();
    } else {
      s.op = RedOp::kSum;
      s.divisor = comm.nranks();
    }
  } else if (op < ncclNumOps) {
    s.op = static_cast<RedOp>(op);
  } else {
    const UserRedOp& u = comm.userOps()[op - ncclNumOps];
    s.op = RedOp::kPreMulSum;
    if (u.residence == ncclScalarHostImmediate) {
      s.scalar = u.value;
    } else if (comm.backend().isDevice(u.ptr)) {
      // A scalar in device memory: read through the backend at each use.
      uint64_t raw = 0;
      Status st = comm.backend().copyAsync(&raw, u.ptr, dataTypeSize(s.dt), q);
      if (st) st = comm.backend().sync(q);
      if (!st) TUTTI_WARN("reading the PreMulSum scalar: {} (using 0)", st.message());
      s.scalar = cpu::scalarValue(&raw, u.dt);
    } else {
      s.scalar = cpu::scalarValue(u.ptr, u.dt);
    }
  }
  return s;
}

// How an operation's values combine: the reduction for reducing
// collectives, plain data movement otherwise; always with its datatype.
algo::ReduceSpec specOf(const Op& o) {
  algo::ReduceSpec s =
      isReducing(o.coll) ? makeSpec(*o.comm, o.dt, o.op, o.stream) : algo::ReduceSpec{};
  s.dt = static_cast<DataType>(o.dt);
  return s;
}

// The operation as a one-shot collective, when the communicator's arena
// takes it (same answer on every rank: it depends on collective, count and
// datatype only).
bool oneShotOp(const Op& o, OneShotOp* out) {
  OneShot* os = o.comm->oneShot();
  // Compressed operations and counted ones (a compressor's exact calls) need
  // the executor: the arena has no wire format and sends no messages.
  if (!os || o.count == 0 || o.wire.format != algo::Wire::kRaw || o.wireBytes) return false;
  const size_t es = elemSize(o.dt);
  bool direct = false;
  if (!os->takes(o.coll, o.count, es, &direct)) return false;
  out->direct = direct;
  out->coll = o.coll;
  out->send = static_cast<const uint8_t*>(o.send);
  out->recv = static_cast<uint8_t*>(o.recv);
  out->count = o.count;
  out->elemSize = es;
  out->spec = specOf(o);
  out->root = o.root;
  out->redop = o.op;
  return true;
}

bool inPlaceOf(const Op& o, size_t es) {
  auto s = reinterpret_cast<uintptr_t>(o.send), d = reinterpret_cast<uintptr_t>(o.recv);
  const size_t blk = o.count * es;
  const int r = o.comm->rank();
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
void logAlgorithm(const Op& o, const algo::Schedule& s) {
  // NCCL_ALGO is honoured when it names what runs (a two-level algorithm on
  // one node runs as the ring).
  const Comm& comm = *o.comm;
  const std::string& algoEnv = comm.algoEnv();
  const auto forcedAlgo = comm.forcedAlgo();
  const bool forced = forcedAlgo != algo::CollArgs::Algo::kAuto &&
                      (o.coll == Collective::kAllReduce || o.coll == Collective::kAllGather ||
                       o.coll == Collective::kReduceScatter) &&
                      s.algorithm == algo::algoName(forcedAlgo);
  TUTTI_INFO(log::kTuning, "{} count {} {} on {} ranks: algorithm {}{}{}{}",
             algo::collectiveName(o.coll), o.count, typeName(o.dt), comm.nranks(), s.algorithm,
             algoEnv.empty() ? "" : " (NCCL_ALGO=", algoEnv,
             algoEnv.empty() ? "" : (forced ? ")" : " not applicable)"));
}

// Builds the work of one communicator for the operations of a group.
Status buildWork(Comm& comm, const std::vector<const Op*>& ops, Work* w) {
  w->comm = &comm;
  const size_t chunk = comm.chunkBytes();
  // Instance 0 holds every point-to-point operation of the group (absolute
  // addresses); collectives follow in call order, so both sides of any pair
  // agree on instance numbers whatever the interleaving.
  algo::Schedule p2p;
  p2p.spec.dt = DataType::kUint8;
  p2p.algorithm = "p2p";
  std::map<int, uint64_t> sendK, recvK;
  std::vector<const Op*> selfSends, selfRecvs;
  w->schedules.push_back(algo::Schedule());
  w->buffers.push_back({nullptr, nullptr, nullptr, nullptr, nullptr});
  w->descriptions.push_back("p2p");
  w->wireBytes.push_back(nullptr);
  std::vector<size_t> scratchOff;
  size_t scratchTotal = 0;
  for (const Op* o : ops) {
    const size_t es = elemSize(o->dt);
    const size_t bytes = o->count * es;
    if (o->coll == Collective::kSend || o->coll == Collective::kRecv) {
      if (bytes == 0) continue;
      const int peer = o->root;
      if (peer == comm.rank()) {
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
    OneShotOp small;
    if (oneShotOp(*o, &small)) {
      TUTTI_INFO(log::kTuning, "{} count {} {} on {} ranks: algorithm {}",
                 algo::collectiveName(o->coll), o->count, typeName(o->dt), comm.nranks(),
                 small.direct ? "single-copy" : "one-shot");
      w->small.push_back(small);
      continue;
    }
    algo::CollArgs a;
    a.coll = o->coll;
    a.rank = comm.rank();
    a.nranks = comm.nranks();
    a.count = o->count;
    a.elemSize = es;
    a.spec = specOf(*o);
    a.root = o->root;
    a.inPlace = inPlaceOf(*o, es);
    a.chunkBytes = chunk;
    a.rdMaxBytes = comm.rdMaxBytes();
    a.nodes = &comm.nodeMap();
    a.sharedMemory = comm.sharedMemory();
    a.cost = &comm.costModel();
    if (o->coll == Collective::kAllReduce || o->coll == Collective::kAllGather ||
        o->coll == Collective::kReduceScatter)
      a.algo = comm.forcedAlgo();
    algo::Schedule s;
    if (o->wire.format == algo::Wire::kSign) {
      s = compress::signAllReduce(a);
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
        compress::applyWire(&s, a, o->wire);
        s.algorithm += o->wire.format == algo::Wire::kHalf ? "+fp16" : "+bf16";
      }
    }
    logAlgorithm(*o, s);
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
    return invalidUsage(fmt::format("group has {} send(s) to self but {} receive(s) from self",
                                    selfSends.size(), selfRecvs.size()));
  for (size_t i = 0; i < selfSends.size(); ++i) {
    const size_t sb = selfSends[i]->count * elemSize(selfSends[i]->dt);
    const size_t rb = selfRecvs[i]->count * elemSize(selfRecvs[i]->dt);
    if (sb != rb)
      return invalidUsage(
          fmt::format("send to self of {} bytes matched with a receive of {} bytes", sb, rb));
    p2p.local.push_back({algo::LocalKind::kCopy,
                         {algo::Buf::kAbs, reinterpret_cast<uintptr_t>(selfRecvs[i]->recv)},
                         {algo::Buf::kAbs, reinterpret_cast<uintptr_t>(selfSends[i]->send)},
                         sb});
  }
  w->schedules[0] = std::move(p2p);
  if (scratchTotal) {
    TUTTI_ASSIGN_OR_RETURN(uint8_t * base, comm.scratch(scratchTotal));
    for (size_t i = 1; i < w->schedules.size(); ++i) w->buffers[i][2] = base + scratchOff[i - 1];
  }
  return Status::ok();
}

// A group's execution failed: the error of the communicator it belongs to.
RunResult ofGroup(const Status& st, const std::vector<Comm*>& comms) {
  for (Comm* c : comms)
    if (!c->error().isOk()) return {c->error(), c};
  return {st, comms[0]};
}

// fp16 compression scales by a power of two chosen from the largest
// magnitude over all ranks: one small max all-reduce (all the group's
// compressed operations of a communicator in one vector) before the group
// runs. bf16 has float32's range and needs none.
Status agreeScales(const std::vector<Comm*>& comms, std::map<Comm*, std::vector<Op*>>& byComm) {
  std::vector<std::vector<float>> maxima(comms.size());
  std::vector<std::vector<Op*>> scaled(comms.size());
  for (size_t i = 0; i < comms.size(); ++i) {
    for (Op* o : byComm[comms[i]]) {
      if (!o->needsScale) continue;
      scaled[i].push_back(o);
      maxima[i].push_back(cpu::maxAbs(static_cast<const float*>(o->send), o->count));
    }
  }
  std::vector<Work> works;
  works.reserve(comms.size());
  for (size_t i = 0; i < comms.size(); ++i) {
    if (maxima[i].empty()) continue;
    Op probe;
    probe.comm = comms[i];
    probe.coll = Collective::kAllReduce;
    probe.send = probe.recv = maxima[i].data();
    probe.count = maxima[i].size();
    probe.dt = ncclFloat32;
    probe.op = ncclMax;
    works.emplace_back();
    TUTTI_RETURN_IF_ERROR(buildWork(*comms[i], {&probe}, &works.back()));
  }
  if (works.empty()) return Status::ok();
  std::vector<Work*> ptrs;
  for (auto& w : works) ptrs.push_back(&w);
  TUTTI_RETURN_IF_ERROR(execute(ptrs));
  for (size_t i = 0; i < comms.size(); ++i) {
    for (size_t k = 0; k < scaled[i].size(); ++k) {
      Op* op = scaled[i][k];
      // Sum: partial results reach n times the largest input; avg's 1/n is
      // applied to each contribution before it is sent.
      const double factor = op->op == ncclAvg ? 1.0 : comms[i]->nranks();
      op->wire.exp = compress::halfScaleExp(maxima[i][k], factor);
      op->needsScale = false;
      TUTTI_INFO(log::kTuning, "fp16 compression: max |x| {} over {} ranks, scale 2^{}",
                 maxima[i][k], comms[i]->nranks(), op->wire.exp);
    }
  }
  return Status::ok();
}

// The operation as device_ipc.h takes it.
IpcOp ipcOpOf(const Op& o) {
  IpcOp x{o.coll, o.send, o.recv, o.count, o.dt, elemSize(o.dt), o.root};
  x.stream = o.stream;
  if (isReducing(o.coll)) {
    if (o.op < ncclNumOps) {
      x.reduceOp = o.op;  // ncclSum..ncclAvg equal TUTTI_PLUGIN_OP_SUM..AVG
    } else {
      // PreMulSum: each rank scales its own contribution, then they are summed.
      const UserRedOp& u = o.comm->userOps()[o.op - ncclNumOps];
      x.reduceOp = TUTTI_PLUGIN_OP_SUM;
      if (u.residence == ncclScalarHostImmediate) {
        x.scalar = &u.raw;
      } else {
        x.scalar = u.ptr;  // read when the copy runs (on the device, or here)
        x.scalarOnDevice = o.comm->backend().isDevice(u.ptr);
      }
    }
  }
  return x;
}

Status runIpcOps(Comm& c, const std::vector<Op*>& ops) {
  log::setThreadRank(c.rank());
  for (const Op* o : ops) {
    TUTTI_INFO(log::kTuning, "{} count {} {} on {} ranks: algorithm device-ipc",
               algo::collectiveName(o->coll), o->count, typeName(o->dt), c.nranks());
    TUTTI_RETURN_IF_ERROR(c.deviceIpc()->run(ipcOpOf(*o)));
  }
  return Status::ok();
}

// Small all-reduces of a group, fused (NCCL's aggregation): those of one
// communicator with the same datatype and reduction, each of at most
// kFuseMaxBytes, travel as one all-reduce over a packed buffer, so a group of
// 64 all-reduces of 1 KiB costs about what one of 64 KiB does (one message
// per peer and step instead of 64). Every rank packs the same operations in
// the same order (the group's call order), so all agree; the fused
// all-reduce may take another algorithm than each alone would (its size
// decides), so the sum's rounding may differ from separate calls, but every
// rank gets the same bits.
constexpr size_t kFuseMaxBytes = 64 << 10;

struct Fused {
  Op op;  // the all-reduce over `packed`
  std::vector<const Op*> parts;
  std::vector<size_t> offsets;  // of each part in `packed`
  std::vector<uint8_t> packed;
};

bool sameSpec(const algo::ReduceSpec& a, const algo::ReduceSpec& b) {
  return a.dt == b.dt && a.op == b.op && a.scalar == b.scalar && a.divisor == b.divisor;
}

// Replaces, in `ops` (one communicator's, host buffers), each set of two or
// more fusable all-reduces with one operation on a packed copy of their
// inputs, placed where the set's first member was; `fused` keeps the sets.
void fuseSmallAllReduces(std::vector<Op*>& ops, std::vector<std::unique_ptr<Fused>>* fused) {
  std::vector<std::unique_ptr<Fused>> sets;
  std::vector<algo::ReduceSpec> specs;
  std::vector<int> setOf(ops.size(), -1);
  for (size_t i = 0; i < ops.size(); ++i) {
    const Op& o = *ops[i];
    const size_t bytes = o.count * elemSize(o.dt);
    if (o.coll != Collective::kAllReduce || !o.raw() || bytes == 0 || bytes > kFuseMaxBytes)
      continue;
    const algo::ReduceSpec spec = specOf(o);
    size_t k = 0;
    while (k < sets.size() && !sameSpec(specs[k], spec)) ++k;
    if (k == sets.size()) {
      sets.push_back(std::make_unique<Fused>());
      specs.push_back(spec);
    }
    sets[k]->parts.push_back(&o);
    setOf[i] = static_cast<int>(k);
  }
  std::vector<Op*> out;
  std::vector<bool> placed(sets.size(), false);
  for (size_t i = 0; i < ops.size(); ++i) {
    const int k = setOf[i];
    if (k < 0 || sets[k]->parts.size() < 2) {
      out.push_back(ops[i]);
      continue;
    }
    if (placed[k]) continue;
    placed[k] = true;
    Fused& f = *sets[k];
    const size_t es = elemSize(f.parts[0]->dt);
    size_t total = 0;
    for (const Op* p : f.parts) {
      f.offsets.push_back(total);
      total += p->count * es;
    }
    f.packed.resize(total);
    for (size_t j = 0; j < f.parts.size(); ++j)
      std::memcpy(f.packed.data() + f.offsets[j], f.parts[j]->send, f.parts[j]->count * es);
    f.op = *f.parts[0];
    f.op.send = f.op.recv = f.packed.data();
    f.op.count = total / es;
    TUTTI_INFO(log::kTuning, "group: {} all-reduces of {} fused into one of {} bytes",
               f.parts.size(), typeName(f.op.dt), total);
    out.push_back(&f.op);
  }
  for (auto& f : sets)
    if (f->parts.size() >= 2) fused->push_back(std::move(f));
  ops = std::move(out);
}

// After the fused all-reduces ran: each part's result to its receive buffer.
void unpackFused(const std::vector<std::unique_ptr<Fused>>& fused) {
  for (const auto& f : fused) {
    const size_t es = elemSize(f->op.dt);
    for (size_t j = 0; j < f->parts.size(); ++j)
      std::memcpy(f->parts[j]->recv, f->packed.data() + f->offsets[j], f->parts[j]->count * es);
  }
}

// The group's operations that run on host memory through the executor (with
// device buffers staged through pinned host memory), for `comms` (locked).
RunResult runStaged(const std::vector<Comm*>& comms, std::map<Comm*, std::vector<Op*>>& byComm) {
  // Device buffers: staged through pinned host memory, in stream order.
  std::vector<DeviceStaging> stagings;
  auto unstage = [&](Status st) {
    for (auto& s : stagings) {
      Status o = s.stageOut(st.isOk());
      if (st && !o) st = o;
    }
    return st;
  };
  Status st;
  for (Comm* c : comms) {
    if (c->backend().hostOnly()) continue;
    std::vector<StageOp> sops;
    for (Op* o : byComm[c])
      sops.push_back({o->coll, &o->send, &o->recv, o->count, elemSize(o->dt), c->rank(),
                      c->nranks(), o->root, o->stream});
    stagings.emplace_back(&c->backend());
    st = stagings.back().stageIn(sops, c->pinnedStaging());
    if (!st) return {unstage(st), c};
  }
  st = agreeScales(comms, byComm);
  if (!st) return ofGroup(unstage(st), comms);
  std::vector<Work> works(comms.size());
  std::vector<Work*> ptrs;
  std::vector<std::unique_ptr<Fused>> fused;
  for (size_t i = 0; i < comms.size(); ++i) {
    log::setThreadRank(comms[i]->rank());
    std::vector<Op*>& mine = byComm[comms[i]];
    if (mine.size() > 1) fuseSmallAllReduces(mine, &fused);
    std::vector<const Op*> ops(mine.begin(), mine.end());
    st = buildWork(*comms[i], ops, &works[i]);
    if (!st) return {unstage(st), comms[i]};
    ptrs.push_back(&works[i]);
  }
  st = execute(ptrs);
  if (st) unpackFused(fused);
  st = unstage(st);
  if (!st) return ofGroup(st, comms);
  return {};
}

}  // namespace

// What the last collective run alone on a communicator was built for, and its
// work (buffers aside, a schedule depends only on these and on the
// communicator's settings, which are fixed at init).
struct LoneWork {
  bool valid = false;
  Collective coll{};
  size_t count = 0;
  int dt = 0, op = 0, root = 0;
  bool inPlace = false;
  algo::ReduceSpec spec;
  Work work;
  std::vector<Work*> ptrs;

  bool matches(const Op& o, bool inPlaceNow, const algo::ReduceSpec& specNow) const {
    return valid && o.coll == coll && o.count == count && o.dt == dt && o.op == op &&
           o.root == root && inPlaceNow == inPlace && specNow.dt == spec.dt &&
           specNow.op == spec.op && specNow.scalar == spec.scalar &&
           specNow.divisor == spec.divisor;
  }
};

namespace {

// One collective outside a group on host memory (no compression, no device
// IPC): builds its work as a group would, or, when the communicator's last
// such call had the same shape, reuses that work with this call's buffers, so
// a repeated call builds no schedule and allocates nothing.
RunResult runAlone(const Op& op) {
  Comm& comm = *op.comm;
  std::lock_guard<std::mutex> lk(comm.mutex());
  if (!comm.loneWork()) comm.loneWork() = std::make_shared<LoneWork>();
  LoneWork& last = *comm.loneWork();
  const size_t es = elemSize(op.dt);
  const bool inPlace = inPlaceOf(op, es);
  const algo::ReduceSpec spec = specOf(op);
  if (last.matches(op, inPlace, spec) && last.work.schedules.size() == 2) {
    // Instance 0 is the (empty) point-to-point schedule, 1 the collective.
    auto& b = last.work.buffers[1];
    b[static_cast<int>(algo::Buf::kSend)] = static_cast<uint8_t*>(const_cast<void*>(op.send));
    b[static_cast<int>(algo::Buf::kRecv)] = static_cast<uint8_t*>(op.recv);
    if (const size_t scratch = last.work.schedules[1].scratchBytes) {
      // Another operation may have grown (moved) the communicator's scratch.
      auto base = comm.scratch((scratch + 63) / 64 * 64);
      if (!base) return {base.status(), &comm};
      b[static_cast<int>(algo::Buf::kScratch)] = *base;
    }
    logAlgorithm(op, last.work.schedules[1]);
  } else {
    last.valid = false;
    last.work = Work();
    Status st = buildWork(comm, {&op}, &last.work);
    if (!st) return {st, &comm};
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
  Status st = execute(last.ptrs);
  return st ? RunResult{} : ofGroup(st, {&comm});
}

}  // namespace

algo::Wire envCompression(const Comm& comm, size_t bytes, int dt, int op) {
  if (dt != ncclFloat32 || (op != ncclSum && op != ncclAvg) || comm.nranks() < 2)
    return algo::Wire::kRaw;
  const std::string& mode = comm.compressionEnv();
  if (mode.empty() || bytes < comm.compressionMinBytes()) return algo::Wire::kRaw;
  if (comm.nodeMap().nNodes() < 2) return algo::Wire::kRaw;
  return mode == "fp16" ? algo::Wire::kHalf : algo::Wire::kBf16;
}

RunResult runOne(const Op& op) {
  Comm& comm = *op.comm;
  log::setThreadRank(comm.rank());
  // (Device backends stage buffers in runGroup.)
  if (comm.backend().hostOnly()) {
    OneShotOp small;
    if (oneShotOp(op, &small)) {
      // The latency path: no group bookkeeping, no schedule, no executor.
      std::lock_guard<std::mutex> lk(comm.mutex());
      Status st = comm.oneShot()->run(small);
      return st ? RunResult{} : RunResult{st, &comm};
    }
    // A plain collective on its own: what a group would do for it, without the group.
    if (op.coll != Collective::kSend && op.coll != Collective::kRecv && op.raw() &&
        !comm.deviceIpc())
      return runAlone(op);
  }
  std::vector<Op> one{op};
  return runGroup(one);
}

RunResult runGroup(std::vector<Op>& all) {
  if (all.empty()) return {};
  // Per communicator in first-use order.
  std::vector<Comm*> comms;
  std::map<Comm*, std::vector<Op*>> byComm;
  for (Op& o : all) {
    if (!byComm.count(o.comm)) comms.push_back(o.comm);
    byComm[o.comm].push_back(&o);
  }
  std::vector<Comm*> lockOrder = comms;
  std::sort(lockOrder.begin(), lockOrder.end());
  std::vector<std::unique_lock<std::mutex>> locks;
  for (Comm* c : lockOrder) locks.emplace_back(c->mutex());
  // Device IPC: a communicator's raw collectives of the agreed size run
  // device to device, in call order; everything else as below. One
  // communicator with nothing else to run: on this thread. Otherwise each
  // communicator's on a thread of its own while this thread drives the rest,
  // as the ranks of one group progress together.
  std::vector<std::pair<Comm*, std::vector<Op*>>> ipcWork;
  for (Comm* c : comms) {
    if (!c->deviceIpc()) continue;
    std::vector<Op*> viaIpc, rest;
    for (Op* o : byComm[c]) {
      const bool raw = o->wire.format == algo::Wire::kRaw && !o->wireBytes;
      (c->deviceIpc()->takes(o->coll, o->count, elemSize(o->dt), raw) ? viaIpc : rest).push_back(o);
    }
    if (viaIpc.empty()) continue;
    byComm[c] = std::move(rest);
    ipcWork.emplace_back(c, std::move(viaIpc));
  }
  std::vector<Comm*> staged;
  for (Comm* c : comms)
    if (!byComm[c].empty()) staged.push_back(c);
  std::vector<Status> ipcStatus(ipcWork.size());
  std::vector<std::thread> ipcThreads;
  if (ipcWork.size() == 1 && staged.empty()) {
    ipcStatus[0] = runIpcOps(*ipcWork[0].first, ipcWork[0].second);
  } else {
    for (size_t i = 0; i < ipcWork.size(); ++i) {
      auto t = base::startThread(
          "ipc", "device IPC thread",
          [&, i] { return runIpcOps(*ipcWork[i].first, ipcWork[i].second); },
          [&, i](Status st) { ipcStatus[i] = std::move(st); });
      if (t) {
        ipcThreads.push_back(std::move(t.value()));
      } else {
        // The peers of this communicator wait until their timeout.
        ipcStatus[i] = t.status();
        ipcWork[i].first->setError(ipcStatus[i]);
      }
    }
  }
  RunResult r = staged.empty() ? RunResult{} : runStaged(staged, byComm);
  for (auto& t : ipcThreads) t.join();
  if (!r.status) return r;
  for (size_t i = 0; i < ipcWork.size(); ++i)
    if (!ipcStatus[i]) return {ipcStatus[i], ipcWork[i].first};
  return {};
}

bool runsOnEngine(Comm& comm, Queue stream) {
  return stream && !comm.backend().hostOnly() && comm.backend().hasHostEvents();
}

namespace {

// Operations of one communicator, all for its engine: queued as one job that
// runs them on the engine's queue.
RunResult submitToEngine(std::vector<Op> ops) {
  Comm& comm = *ops[0].comm;
  std::vector<Queue> streams;
  for (const Op& o : ops)
    if (std::find(streams.begin(), streams.end(), o.stream) == streams.end())
      streams.push_back(o.stream);
  Status st = comm.engine().submit(streams, [ops = std::move(ops)](Queue q) mutable {
    for (Op& o : ops) o.stream = q;
    return ops.size() == 1 ? runOne(ops[0]).status : runGroup(ops).status;
  });
  return st ? RunResult{} : RunResult{st, &comm};
}

}  // namespace

RunResult submitOne(const Op& op) {
  if (runsOnEngine(*op.comm, op.stream)) return submitToEngine({op});
  op.comm->drainEngine();  // in call order with what it still runs
  return runOne(op);
}

RunResult submitGroup(std::vector<Op>& ops) {
  if (ops.empty()) return {};
  bool engine = true;
  for (const Op& o : ops) engine &= o.comm == ops[0].comm && runsOnEngine(*o.comm, o.stream);
  if (engine) return submitToEngine(ops);
  // Several communicators progress together on this thread (one thread may
  // drive every rank of a communicator), after what their engines still run.
  for (const Op& o : ops) o.comm->drainEngine();
  return runGroup(ops);
}

}  // namespace tutti::core
