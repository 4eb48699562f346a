#include "core/group.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "algo/balance.h"
#include "algo/cost_model.h"
#include "base/log.h"
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

// An operation's arguments as a call passes them (what apiOp and partOp add
// to them is theirs).
Op argsOp(Comm& comm, Collective coll, const void* send, void* recv, size_t count, int dt, int op) {
  Op o;
  o.comm = &comm;
  o.coll = coll;
  o.send = send;
  o.recv = recv;
  o.count = count;
  o.dt = dt;
  o.op = op;
  return o;
}
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
      s.scalar = comm.kernels().scalarValue(&raw, u.dt);
    } else {
      s.scalar = comm.kernels().scalarValue(u.ptr, u.dt);
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
  out->call = o.call;
  out->part = o.part;
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

static_assert(static_cast<uint8_t>(Collective::kSend) == 8, "p2pSig() in core/wire_header.h");

// The fingerprint of `o` run as `s` (core/wire_header.h).
OpSig sigOf(const Op& o, const algo::Schedule& s) {
  OpSig g;
  g.count = o.count;
  g.call = static_cast<uint32_t>(o.call);
  g.root = algo::isRooted(o.coll) ? o.root : -1;
  g.plan = algoHash(s.algorithm.c_str()) ^ s.planKey;
  g.coll = static_cast<uint8_t>(o.coll);
  g.dt = static_cast<uint8_t>(o.dt);
  if (isReducing(o.coll)) g.op = static_cast<uint8_t>(std::min(o.op, static_cast<int>(ncclNumOps)));
  return g;
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
                      (s.algorithm == algo::algoName(forcedAlgo) ||
                       s.algorithm == std::string("balanced ") + algo::algoName(forcedAlgo));
  TUTTI_INFO(log::kTuning, "{} count {} {} on {} ranks: algorithm {}{}{}{}{}",
             algo::collectiveName(o.coll), o.count, typeName(o.dt), comm.nranks(), s.algorithm,
             algoEnv.empty() ? "" : " (NCCL_ALGO=", algoEnv,
             algoEnv.empty() ? "" : (forced ? ")" : " not applicable)"),
             o.tune.trial >= 0 ? " (run-time tuning: a trial)"
             : o.tune.cls >= 0 ? " (run-time tuning: settled)"
                               : "");
}

// The cost model's view of collective `o` on `comm` (what buildWork plans
// it with before the tuner's setting).
algo::CollArgs argsOf(Comm& comm, const Op& o) {
  const size_t es = elemSize(o.dt);
  algo::CollArgs a;
  a.coll = o.coll;
  a.rank = comm.rank();
  a.nranks = comm.nranks();
  a.count = o.count;
  a.elemSize = es;
  a.spec = specOf(o);
  a.root = o.root;
  a.inPlace = inPlaceOf(o, es);
  a.chunkBytes = comm.chunkBytes();
  a.rdMaxBytes = comm.rdMaxBytes();
  a.nodes = &comm.nodeMap();
  a.sharedMemory = comm.sharedMemory();
  a.cost = &comm.costModel();
  if (o.coll == Collective::kAllReduce || o.coll == Collective::kAllGather ||
      o.coll == Collective::kReduceScatter)
    a.algo = comm.forcedAlgo();
  // The balanced plans (algo/balance.h) for large plain all-reduces: a
  // compressed one (compress/wire.cc) keeps equal segments.
  if (o.coll == Collective::kAllReduce && o.wire.format == algo::Wire::kRaw &&
      o.count * es >= algo::kBalanceMinBytes)
    a.balance = &comm.balance();
  return a;
}

// Run-time tuning (core/tuner.h): the setting `o` runs with, when it is a
// plain collective of a tuned class that runs as a schedule (the one-shot
// path has nothing to tune). Called in call order by the thread that runs
// the communicator's operations, under its mutex, for every operation that
// reaches the executor, grouped or not: every rank assigns the same.
// Algorithms the model predicts this much slower than its choice are not tried.
constexpr double kTryWithin = 2.5;

void assignTuning(Comm& comm, Op& o) {
  o.tune = Tuning();
  if (!o.raw() || o.count == 0) return;
  Tuner& tuner = comm.tuner();
  const size_t bytes = Tuner::vectorBytes(o.coll, o.count, elemSize(o.dt), comm.nranks());
  if (!tuner.tunes(o.coll, bytes)) return;
  OneShotOp small;
  if (oneShotOp(o, &small)) return;
  o.tune = tuner.next(o.coll, bytes,
                      [&] { return algo::algorithmCandidates(argsOf(comm, o), kTryWithin); });
}

// Builds the work of one communicator for the operations of a group.
// Where the buffers of a built Work come from, so that a plan built once runs
// on the buffers of each later call (bindPlan). An operation is named by its
// index in the communicator's list of the group (>= 0), or as a fused set
// (-1 - its index in Plan::fused).
struct Binding {
  std::vector<int32_t> source;     // per schedule: whose buffers (0: point-to-point, unused)
  std::vector<size_t> scratchOff;  // per schedule: offset in the plan's scratch
  size_t scratchBytes = 0;
  // Point-to-point steps address the operations' buffers directly (kAbs):
  // which step, which operation's send (src) or receive (dst) buffer, and
  // the step's offset from that buffer's start.
  enum class At : uint8_t { kSendSrc, kRecvDst, kLocalDst, kLocalSrc };
  struct Abs {
    At at;
    uint32_t step;
    int32_t op;
    size_t delta;
  };
  std::vector<Abs> abs;
  std::vector<int32_t> small;  // per one-shot operation (Work::small)
};

// Builds the work of one communicator for the operations of a group. With
// `bind`, also records where each buffer comes from (origin[k] names ops[k]
// as Binding does) and leaves the scratch unassigned: bindPlan assigns it.
Status buildWork(Comm& comm, const std::vector<const Op*>& ops, Work* w, Binding* bind = nullptr,
                 const std::vector<int32_t>* origin = nullptr) {
  w->comm = &comm;
  const size_t chunk = comm.chunkBytes();
  auto from = [&](size_t k) { return origin ? (*origin)[k] : static_cast<int32_t>(k); };
  // Instance 0 holds every point-to-point operation of the group (absolute
  // addresses); collectives follow in call order, so both sides of any pair
  // agree on instance numbers whatever the interleaving.
  algo::Schedule p2p;
  p2p.spec.dt = DataType::kUint8;
  p2p.algorithm = "p2p";
  std::map<int, uint64_t> sendK, recvK;
  std::vector<size_t> selfSends, selfRecvs;  // indices into ops
  w->schedules.push_back(algo::Schedule());
  w->buffers.push_back({nullptr, nullptr, nullptr, nullptr, nullptr});
  w->descriptions.push_back("p2p");
  w->wireBytes.push_back(nullptr);
  w->sigs.push_back(p2pSig());
  if (bind) {
    bind->source.assign(1, 0);
    bind->scratchOff.assign(1, 0);
  }
  std::vector<size_t> scratchOff;
  size_t scratchTotal = 0;
  // The channels the work's messages leave on: every one unless each
  // operation's tuned setting names fewer (the most any of them names).
  int channels = -1;
  for (size_t k = 0; k < ops.size(); ++k) {
    const Op* o = ops[k];
    const size_t es = elemSize(o->dt);
    const size_t bytes = o->count * es;
    const int mine = o->tune.channels;
    channels = channels < 0 ? mine : channels == 0 || mine == 0 ? 0 : std::max(channels, mine);
    if (o->coll == Collective::kSend || o->coll == Collective::kRecv) {
      if (bytes == 0) continue;
      const int peer = o->root;
      if (peer == comm.rank()) {
        (o->coll == Collective::kSend ? selfSends : selfRecvs).push_back(k);
        continue;
      }
      const bool isSend = o->coll == Collective::kSend;
      const uintptr_t base = reinterpret_cast<uintptr_t>(isSend ? o->send : o->recv);
      const size_t first = isSend ? p2p.sends.size() : p2p.recvs.size();
      if (isSend)
        algo::appendSend(&p2p, peer, sendK[peer]++ << 32, {algo::Buf::kAbs, base}, bytes, chunk);
      else
        algo::appendRecv(&p2p, peer, recvK[peer]++ << 32, {algo::Buf::kAbs, base}, bytes, chunk);
      if (bind) {
        const size_t last = isSend ? p2p.sends.size() : p2p.recvs.size();
        for (size_t s = first; s < last; ++s)
          bind->abs.push_back({isSend ? Binding::At::kSendSrc : Binding::At::kRecvDst,
                               static_cast<uint32_t>(s), from(k),
                               (isSend ? p2p.sends[s].src.off : p2p.recvs[s].dst.off) - base});
      }
      continue;
    }
    if (o->count == 0) continue;
    OneShotOp small;
    if (oneShotOp(*o, &small)) {
      TUTTI_INFO(log::kTuning, "{} count {} {} on {} ranks: algorithm {}",
                 algo::collectiveName(o->coll), o->count, typeName(o->dt), comm.nranks(),
                 small.direct ? "single-copy" : "one-shot");
      w->small.push_back(small);
      if (bind) bind->small.push_back(from(k));
      continue;
    }
    algo::CollArgs a = argsOf(comm, *o);
    if (o->tune.algo >= 0) a.algo = static_cast<algo::CollArgs::Algo>(o->tune.algo);
    if (o->tune.chunkBytes) a.chunkBytes = o->tune.chunkBytes;
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
    if (bind) {
      bind->source.push_back(from(k));
      bind->scratchOff.push_back(scratchTotal);
    }
    scratchTotal += (s.scratchBytes + 63) / 64 * 64;
    w->schedules.push_back(std::move(s));
    w->buffers.push_back({static_cast<uint8_t*>(const_cast<void*>(o->send)),
                          static_cast<uint8_t*>(o->recv), nullptr, nullptr,
                          reinterpret_cast<uint8_t*>(o->state)});
    w->descriptions.push_back(algo::collectiveName(o->coll));
    w->wireBytes.push_back(o->wireBytes);
    w->sigs.push_back(sigOf(*o, w->schedules.back()));
  }
  if (selfSends.size() != selfRecvs.size())
    return invalidUsage(fmt::format("group has {} send(s) to self but {} receive(s) from self",
                                    selfSends.size(), selfRecvs.size()));
  for (size_t i = 0; i < selfSends.size(); ++i) {
    const Op& snd = *ops[selfSends[i]];
    const Op& rcv = *ops[selfRecvs[i]];
    const size_t sb = snd.count * elemSize(snd.dt);
    const size_t rb = rcv.count * elemSize(rcv.dt);
    if (sb != rb)
      return invalidUsage(
          fmt::format("send to self of {} bytes matched with a receive of {} bytes", sb, rb));
    if (bind) {
      const auto step = static_cast<uint32_t>(p2p.local.size());
      bind->abs.push_back({Binding::At::kLocalDst, step, from(selfRecvs[i]), 0});
      bind->abs.push_back({Binding::At::kLocalSrc, step, from(selfSends[i]), 0});
    }
    p2p.local.push_back({algo::LocalKind::kCopy,
                         {algo::Buf::kAbs, reinterpret_cast<uintptr_t>(rcv.recv)},
                         {algo::Buf::kAbs, reinterpret_cast<uintptr_t>(snd.send)},
                         sb});
  }
  w->schedules[0] = std::move(p2p);
  w->channels = std::max(channels, 0);
  if (bind) {
    bind->scratchBytes = scratchTotal;
  } else if (scratchTotal) {
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

// A small collective tutti runs itself between the caller's operations (the
// fp16 scale probe, the balance gather, the tuning sums): part of call
// `call` on `comm`, so that its fingerprint names that call on every rank.
Op partOp(Comm& comm, Collective coll, const void* send, void* recv, size_t count, int dt, int op,
          uint64_t call) {
  Op o = argsOp(comm, coll, send, recv, count, dt, op);
  o.call = call;
  o.part = true;
  return o;
}

// fp16 compression scales by a power of two chosen from the largest
// magnitude over all ranks: one small max all-reduce (all the group's
// compressed operations of a communicator in one vector) before the group
// runs. bf16 has float32's range and needs none.
Status agreeScales(const std::vector<Comm*>& comms, std::map<Comm*, std::vector<Op*>>& byComm) {
  bool any = false;
  for (Comm* c : comms)
    for (const Op* o : byComm[c]) any |= o->needsScale;
  if (!any) return Status::ok();
  std::vector<std::vector<float>> maxima(comms.size());
  std::vector<std::vector<Op*>> scaled(comms.size());
  for (size_t i = 0; i < comms.size(); ++i) {
    for (Op* o : byComm[comms[i]]) {
      if (!o->needsScale) continue;
      scaled[i].push_back(o);
      maxima[i].push_back(
          comms[i]->kernels().maxAbs(static_cast<const float*>(o->send), o->count));
    }
  }
  std::vector<Work> works;
  works.reserve(comms.size());
  for (size_t i = 0; i < comms.size(); ++i) {
    if (maxima[i].empty()) continue;
    // Every rank agrees the scales of the same calls.
    const Op probe = partOp(*comms[i], Collective::kAllReduce, maxima[i].data(), maxima[i].data(),
                            maxima[i].size(), ncclFloat32, ncclMax, scaled[i][0]->call);
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

// The balance re-plan (algo/balance.h, Comm::replanBalance). After a call's
// operations ran, a communicator whose plain all-reduces reached
// TUTTI_REPLAN_BYTES since it last did (every rank counts the same calls'
// bytes, so all reach it at the same call) gathers every rank's figure of
// its links to the next node in one small all-gather, which the telemetry
// does not measure, and re-plans from them (every rank computes the same
// plans from the same figures). Plans built on old shares are dropped.
void dropPlans(Comm& comm);  // the kept plans (LoneWork, below)

bool replanCount(Comm& comm, const Op* const* ops, size_t n) {
  uint64_t bytes = 0;
  for (size_t i = 0; i < n; ++i)
    if (ops[i]->coll == Collective::kAllReduce && ops[i]->wire.format == algo::Wire::kRaw)
      bytes += ops[i]->count * elemSize(ops[i]->dt);
  return bytes > 0 && comm.replanDue(bytes);
}

// `due`: the communicators (locked) to gather and re-plan, each after its
// collective call `calls[i]`.
Status agreeBalance(const std::vector<Comm*>& due, const std::vector<uint64_t>& calls) {
  if (due.empty()) return Status::ok();
  std::vector<algo::LinkLoad> mine(due.size());
  std::vector<std::vector<algo::LinkLoad>> all(due.size());
  std::vector<Work> works(due.size());
  std::vector<Work*> ptrs;
  static_assert(sizeof(algo::LinkLoad) == 3 * sizeof(uint64_t), "gathered as 3 uint64");
  for (size_t i = 0; i < due.size(); ++i) {
    mine[i] = due[i]->telemetry().nextNodeLoad();
    all[i].resize(due[i]->nranks());
    const Op gather = partOp(*due[i], Collective::kAllGather, &mine[i], all[i].data(), 3,
                             ncclUint64, 0, calls[i]);
    TUTTI_RETURN_IF_ERROR(buildWork(*due[i], {&gather}, &works[i]));
    works[i].measured = false;
    ptrs.push_back(&works[i]);
  }
  TUTTI_RETURN_IF_ERROR(execute(ptrs));
  for (size_t i = 0; i < due.size(); ++i) {
    bool sharesMoved = false;
    if (due[i]->replanBalance(all[i], calls[i], &sharesMoved)) dropPlans(*due[i]);
    // A node turned slow or recovered: the settings tuned before may no
    // longer be the fastest (a rate or gain that moved alone does not count).
    if (sharesMoved) due[i]->tuner().restart();
  }
  return Status::ok();
}

// Run-time tuning's agreement (core/tuner.h). After a call whose operations
// ended a stage of their class (Tuning::last), every rank's figures for
// those stages, one vector per communicator in call order (every rank's
// has the same layout), are summed over the ranks in one small all-reduce,
// which the telemetry does not measure; every rank then takes the same
// decision from the same sums. `ended`: per communicator (locked), its
// operations that ended a stage.
Status agreeTuning(const std::vector<Comm*>& comms,
                   const std::vector<std::vector<const Op*>>& ended) {
  std::vector<std::vector<double>> sums(comms.size());
  std::vector<Work> works(comms.size());
  std::vector<Work*> ptrs;
  for (size_t i = 0; i < comms.size(); ++i) {
    if (ended[i].empty()) continue;
    for (const Op* o : ended[i]) {
      const std::vector<double> f = comms[i]->tuner().figures(o->tune);
      sums[i].insert(sums[i].end(), f.begin(), f.end());
    }
    if (sums[i].empty()) continue;
    const Op sum = partOp(*comms[i], Collective::kAllReduce, sums[i].data(), sums[i].data(),
                          sums[i].size(), ncclFloat64, ncclSum, ended[i].back()->call);
    TUTTI_RETURN_IF_ERROR(buildWork(*comms[i], {&sum}, &works[i]));
    works[i].measured = false;
    ptrs.push_back(&works[i]);
  }
  if (ptrs.empty()) return Status::ok();
  TUTTI_RETURN_IF_ERROR(execute(ptrs));
  for (size_t i = 0; i < comms.size(); ++i) {
    size_t at = 0;
    for (const Op* o : ended[i]) {
      Tuner& tuner = comms[i]->tuner();
      const size_t n = tuner.figures(o->tune).size();
      const std::vector<double> stage(sums[i].begin() + at, sums[i].begin() + at + n);
      at += n;
      const std::string decided = tuner.decide(o->tune, stage);
      if (comms[i]->rank() == 0 && !decided.empty()) TUTTI_INFO(log::kTuning, "{}", decided);
    }
  }
  return Status::ok();
}

// After a call ran: the tuning stages it ended, then the balance re-plan,
// for each of `comms` (locked; `ops`: each one's operations of the call).
// `measuredUs`: this rank's time for the call when it was one tuned
// operation on one communicator (< 0: not measured).
Status afterCall(const std::vector<Comm*>& comms, const std::vector<const std::vector<Op*>*>& ops,
                 double measuredUs) {
  std::vector<std::vector<const Op*>> ended(comms.size());
  bool anyEnded = false;
  std::vector<Comm*> due;
  std::vector<uint64_t> calls;
  for (size_t i = 0; i < comms.size(); ++i) {
    const std::vector<Op*>& mine = *ops[i];
    if (measuredUs >= 0 && mine.size() == 1) comms[i]->tuner().record(mine[0]->tune, measuredUs);
    for (const Op* o : mine)
      if (o->tune.last) ended[i].push_back(o), anyEnded = true;
    if (replanCount(*comms[i], mine.data(), mine.size())) {
      due.push_back(comms[i]);
      uint64_t call = 0;
      for (const Op* o : mine) call = std::max(call, o->call);
      calls.push_back(call);
    }
  }
  if (anyEnded) TUTTI_RETURN_IF_ERROR(agreeTuning(comms, ended));
  return agreeBalance(due, calls);
}

// The operation as device_ipc.h takes it.
IpcOp ipcOpOf(const Op& o) {
  IpcOp x{o.coll, o.send, o.recv, o.count, o.dt, elemSize(o.dt), o.root};
  x.stream = o.stream;
  x.redop = o.op;
  x.call = o.call;
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

// A communicator's device-IPC collectives as executor work (Work::ipc).
Work ipcWorkOf(Comm& c, const std::vector<Op*>& ops) {
  Work w;
  w.comm = &c;
  for (const Op* o : ops) {
    TUTTI_INFO(log::kTuning, "{} count {} {} on {} ranks: algorithm device-ipc",
               algo::collectiveName(o->coll), o->count, typeName(o->dt), c.nranks());
    w.ipc.push_back(ipcOpOf(*o));
  }
  return w;
}

// Small collectives of a group, fused (NCCL's aggregation): those of one
// communicator that can travel together, each of at most kFuseMaxBytes per
// rank, run as one collective over a packed buffer, so a group of 64
// all-reduces of 1 KiB costs one all-reduce of 64 KiB plus the packing and
// unpacking of 64 KiB (one message per peer and step instead of 64; measured
// in docs/performance.md, "Groups of small operations"). What fuses: all-reduces with the same
// datatype and reduction; reduce-scatters likewise (each rank's block of the
// packed input is the parts' blocks side by side, its block of the result
// theirs); all-gathers of any datatypes (as bytes: a rank's block holds its
// contributions side by side); broadcasts with the same root (as bytes).
// Every rank packs the same operations in the same order (the group's call
// order), so all agree. Data movement is exact; a fused all-reduce may take
// another algorithm than each alone would (its size decides), so a floating
// sum's rounding may differ from separate calls, but every rank gets the same
// bits (a reduce-scatter's reduction order, likewise, may differ).
constexpr size_t kFuseMaxBytes = 64 << 10;

bool sameSpec(const algo::ReduceSpec& a, const algo::ReduceSpec& b) {
  return a.dt == b.dt && a.op == b.op && a.scalar == b.scalar && a.divisor == b.divisor;
}

// What a plan depends on, per operation: a group's plan is a function of
// these, in call order, and of the communicator's settings (fixed at init);
// the buffers are bound at each call.
struct OpShape {
  Collective coll{};
  size_t count = 0;
  int dt = 0, op = 0, root = 0;
  bool inPlace = false;
  algo::ReduceSpec spec;
  Tuning tune;  // what it runs with (Tuning::sameRun)
  bool operator==(const OpShape& o) const {
    return coll == o.coll && count == o.count && dt == o.dt && op == o.op && root == o.root &&
           inPlace == o.inPlace && sameSpec(spec, o.spec) && tune.sameRun(o.tune);
  }
};

OpShape shapeOf(const Op& o) {
  OpShape s;
  s.coll = o.coll;
  s.count = o.count;
  s.dt = o.dt;
  s.op = o.op;
  s.root = o.root;
  s.inPlace =
      o.coll != Collective::kSend && o.coll != Collective::kRecv && inPlaceOf(o, elemSize(o.dt));
  s.spec = specOf(o);
  s.tune = o.tune;
  return s;
}

// shapeOf(o) == s, without computing what it need not: a built-in
// reduction's spec follows from the datatype and the operator (on one
// communicator); a PreMulSum operator's scalar may change between calls.
bool hasShape(const Op& o, const OpShape& s) {
  if (o.coll != s.coll || o.count != s.count || o.dt != s.dt || o.op != s.op || o.root != s.root ||
      !o.tune.sameRun(s.tune))
    return false;
  if (o.coll != Collective::kSend && o.coll != Collective::kRecv &&
      inPlaceOf(o, elemSize(o.dt)) != s.inPlace)
    return false;
  return !isReducing(o.coll) || o.op < ncclNumOps || sameSpec(specOf(o), s.spec);
}

bool fusable(const Op& o) {
  if (!o.raw()) return false;
  if (o.coll != Collective::kAllReduce && o.coll != Collective::kReduceScatter &&
      o.coll != Collective::kAllGather && o.coll != Collective::kBroadcast)
    return false;
  const size_t bytes = o.count * elemSize(o.dt);
  return bytes > 0 && bytes <= kFuseMaxBytes;
}

// Whether two fusable operations travel in one fused collective.
bool sameSet(const OpShape& a, const OpShape& b) {
  if (a.coll != b.coll) return false;
  switch (a.coll) {
    case Collective::kAllReduce:
    case Collective::kReduceScatter:
      return sameSpec(a.spec, b.spec);
    case Collective::kBroadcast:
      return a.root == b.root;
    default:
      return true;  // all-gathers: bytes
  }
}

// Operations fused into one (two or more), over a packed buffer in the
// communicator's scratch. A block is one rank's share: all-reduce and
// broadcast pack one block, all-gather and reduce-scatter one per rank.
struct FusedSet {
  std::vector<uint32_t> parts;  // indices in the group's list
  std::vector<size_t> offsets;  // of each part in a block, in bytes
  std::vector<size_t> bytes;    // of each part in a block
  size_t block = 0;             // bytes of a block
  size_t at = 0;                // offset of the packed buffer in the plan's memory
  Op op;                        // the fused operation (buffers set by place())
  // An all-reduce between ranks runs out of place, its input and its result
  // side by side: in place, the latency algorithm would first copy the whole
  // input aside (recursive doubling sends from it while results land), a
  // third pass over the packed bytes after packing and before unpacking.
  bool outOfPlace(int nranks) const { return op.coll == Collective::kAllReduce && nranks > 1; }
  static size_t aligned(size_t b) { return (b + 63) / 64 * 64; }
  size_t packedBytes(int nranks) const {
    const bool perRank = op.coll == Collective::kAllGather || op.coll == Collective::kReduceScatter;
    if (outOfPlace(nranks)) return aligned(block) + block;
    return (perRank ? nranks * block : block);
  }
  // The fused operation's buffers in the packed buffer at `base`.
  void place(uint8_t* base, int rank, int nranks) {
    op.send = op.recv = base;
    if (outOfPlace(nranks)) op.recv = base + aligned(block);
    if (op.coll == Collective::kAllGather) op.send = base + rank * block;
    if (op.coll == Collective::kReduceScatter) op.recv = base + rank * block;
  }
  // Each part's input into the packed buffer (before the run).
  void pack(const Op* const* ops, int rank, int nranks) const {
    auto* base = static_cast<uint8_t*>(const_cast<void*>(op.send));
    for (size_t j = 0; j < parts.size(); ++j) {
      const auto* in = static_cast<const uint8_t*>(ops[parts[j]]->send);
      switch (op.coll) {
        case Collective::kBroadcast:
          if (rank != op.root) break;  // only the root's input is read
          [[fallthrough]];
        case Collective::kAllReduce:
        case Collective::kAllGather:  // send: this rank's block
          std::memcpy(base + offsets[j], in, bytes[j]);
          break;
        case Collective::kReduceScatter:
          for (int q = 0; q < nranks; ++q)
            std::memcpy(base + q * block + offsets[j], in + q * bytes[j], bytes[j]);
          break;
        default:
          break;
      }
    }
  }
  // Each part's result out of the packed buffer (after the run).
  void unpack(const Op* const* ops, int nranks) const {
    const auto* base = static_cast<const uint8_t*>(op.recv);
    for (size_t j = 0; j < parts.size(); ++j) {
      auto* out = static_cast<uint8_t*>(ops[parts[j]]->recv);
      if (op.coll == Collective::kAllGather) {
        for (int q = 0; q < nranks; ++q)
          std::memcpy(out + q * bytes[j], base + q * block + offsets[j], bytes[j]);
      } else {  // recv: the result's block
        std::memcpy(out, base + offsets[j], bytes[j]);
      }
    }
  }
};

// A communicator's plan for the operations of a group (its part of them) or
// of a lone collective: the built work, what was fused, and where each buffer
// comes from. Built once per shape; each call binds its buffers.
struct Plan {
  std::vector<OpShape> shape;
  std::vector<FusedSet> fused;
  size_t packedBytes = 0;  // the fused sets' buffers, at the start of the plan's memory
  Work work;
  Binding bind;
  std::vector<Work*> ptrs;  // {&work}, for execute()

  const Op& opAt(const Op* const* ops, int32_t k) const {
    return k >= 0 ? *ops[k] : fused[-1 - k].op;
  }
};

// Points the plan's work at this call's buffers (its memory, the fused sets'
// packed buffers and the schedules' scratch, in the communicator's scratch,
// which another operation may have moved) and packs the fused inputs.
Status bindPlan(Comm& comm, Plan& p, const Op* const* ops) {
  uint8_t* mem = nullptr;
  if (const size_t total = p.packedBytes + p.bind.scratchBytes) {
    TUTTI_ASSIGN_OR_RETURN(mem, comm.scratch(total));
  }
  const int rank = comm.rank(), nranks = comm.nranks();
  for (FusedSet& f : p.fused) {
    f.op.stream = ops[f.parts[0]]->stream;  // where a device scalar is read
    f.op.call = ops[f.parts[0]]->call;      // its fingerprint's call number
    f.place(mem + f.at, rank, nranks);
    f.pack(ops, rank, nranks);
  }
  Work& w = p.work;
  for (size_t i = 1; i < w.schedules.size(); ++i) {
    const Op& o = p.opAt(ops, p.bind.source[i]);
    w.buffers[i] = {static_cast<uint8_t*>(const_cast<void*>(o.send)), static_cast<uint8_t*>(o.recv),
                    mem ? mem + p.packedBytes + p.bind.scratchOff[i] : nullptr, nullptr,
                    reinterpret_cast<uint8_t*>(o.state)};
    w.wireBytes[i] = o.wireBytes;
    w.sigs[i].call = static_cast<uint32_t>(o.call);
  }
  algo::Schedule& p2p = w.schedules[0];
  for (const Binding::Abs& a : p.bind.abs) {
    const Op& o = *ops[a.op];  // point-to-point operations are never fused
    const bool src = a.at == Binding::At::kSendSrc || a.at == Binding::At::kLocalSrc;
    const uintptr_t off = reinterpret_cast<uintptr_t>(src ? o.send : o.recv) + a.delta;
    switch (a.at) {
      case Binding::At::kSendSrc:
        p2p.sends[a.step].src.off = off;
        break;
      case Binding::At::kRecvDst:
        p2p.recvs[a.step].dst.off = off;
        break;
      case Binding::At::kLocalDst:
        p2p.local[a.step].dst.off = off;
        break;
      case Binding::At::kLocalSrc:
        p2p.local[a.step].src.off = off;
        break;
    }
  }
  for (size_t k = 0; k < w.small.size(); ++k) {
    w.small[k] = OneShotOp();  // not yet posted
    if (!oneShotOp(p.opAt(ops, p.bind.small[k]), &w.small[k]))
      return internalError("a kept one-shot operation no longer takes the one-shot path");
  }
  return Status::ok();
}

// After the plan's work ran: the fused sets' results to their parts.
void unpackPlan(const Plan& p, const Op* const* ops, int nranks) {
  for (const FusedSet& f : p.fused) f.unpack(ops, nranks);
}

// Builds the plan for `n` operations of `comm` with these shapes: fuses what
// travels together (kFuseMaxBytes), then builds the work with its binding.
Result<std::unique_ptr<Plan>> buildPlan(Comm& comm, const Op* const* ops, size_t n,
                                        const std::vector<OpShape>& shape) {
  auto p = std::make_unique<Plan>();
  p->shape = shape;
  // Candidate sets, in the order of their first member.
  std::vector<std::vector<uint32_t>> sets;
  std::vector<int> setOf(n, -1);
  for (size_t i = 0; n > 1 && i < n; ++i) {
    if (!fusable(*ops[i])) continue;
    size_t k = 0;
    while (k < sets.size() && !sameSet(shape[sets[k][0]], shape[i])) ++k;
    if (k == sets.size()) sets.emplace_back();
    sets[k].push_back(static_cast<uint32_t>(i));
    setOf[i] = static_cast<int>(k);
  }
  std::vector<int> fusedOf(sets.size(), -1);  // candidate set -> index in p->fused
  for (size_t k = 0; k < sets.size(); ++k) {
    if (sets[k].size() < 2) continue;
    fusedOf[k] = static_cast<int>(p->fused.size());
    FusedSet& f = p->fused.emplace_back();
    f.parts = std::move(sets[k]);
    f.op = *ops[f.parts[0]];
    const bool bytewise =
        f.op.coll == Collective::kAllGather || f.op.coll == Collective::kBroadcast;
    for (uint32_t j : f.parts) {
      f.offsets.push_back(f.block);
      f.bytes.push_back(ops[j]->count * elemSize(ops[j]->dt));
      f.block += f.bytes.back();
    }
    if (bytewise) f.op.dt = ncclUint8;
    f.op.count = f.block / elemSize(f.op.dt);
    f.at = p->packedBytes;
    p->packedBytes += FusedSet::aligned(f.packedBytes(comm.nranks()));
    TUTTI_INFO(log::kTuning, "group: {} {}s fused into one of {} bytes per rank", f.parts.size(),
               algo::collectiveName(f.op.coll), f.block);
  }
  // The fused operations' buffers must exist while the work is built (whether
  // they are in place decides the schedule); bindPlan places them again.
  if (p->packedBytes) {
    TUTTI_ASSIGN_OR_RETURN(uint8_t * mem, comm.scratch(p->packedBytes));
    for (FusedSet& f : p->fused) f.place(mem + f.at, comm.rank(), comm.nranks());
  }
  // Each fused set runs where its first member was called.
  std::vector<const Op*> items;
  std::vector<int32_t> origin;
  std::vector<bool> placed(p->fused.size(), false);
  for (size_t i = 0; i < n; ++i) {
    const int f = setOf[i] < 0 ? -1 : fusedOf[setOf[i]];
    if (f < 0) {
      items.push_back(ops[i]);
      origin.push_back(static_cast<int32_t>(i));
    } else if (!placed[f]) {
      placed[f] = true;
      items.push_back(&p->fused[f].op);
      origin.push_back(-1 - f);
    }
  }
  TUTTI_RETURN_IF_ERROR(buildWork(comm, items, &p->work, &p->bind, &origin));
  p->ptrs.assign(1, &p->work);
  return p;
}

// On a cached plan: the INFO lines a build writes, which algorithm runs each
// operation.
void logPlan(const Plan& p, const Op* const* ops) {
  if (!log::enabled(log::Level::kInfo, log::kTuning)) return;
  for (size_t i = 1; i < p.work.schedules.size(); ++i)
    logAlgorithm(p.opAt(ops, p.bind.source[i]), p.work.schedules[i]);
  for (size_t k = 0; k < p.work.small.size(); ++k) {
    const Op& o = p.opAt(ops, p.bind.small[k]);
    TUTTI_INFO(log::kTuning, "{} count {} {} on {} ranks: algorithm {}",
               algo::collectiveName(o.coll), o.count, typeName(o.dt), o.comm->nranks(),
               p.work.small[k].direct ? "single-copy" : "one-shot");
  }
}

}  // namespace

// A communicator's plans (Comm::loneWork(), named for the lone collective's
// work it once held alone): the last kPlansKept plans built for lone
// collectives and for its part of groups, most recently used first. A call
// whose operations have the shapes of a kept plan (OpShape, in call order)
// reuses it with its own buffers, so a repeated call or group builds no
// schedule and allocates nothing. Compressed operations (their scale is
// agreed per call) and counted ones are planned afresh each time.
struct LoneWork {
  static constexpr size_t kPlansKept = 4;
  std::vector<std::unique_ptr<Plan>> plans;
  std::vector<OpShape> probe;  // a new plan's shapes (kept for its memory)
  uint64_t built = 0;          // plans built (tests)
};

namespace {
void dropPlans(Comm& comm) {
  if (comm.loneWork()) comm.loneWork()->plans.clear();
}
}  // namespace

uint64_t plansBuilt(Comm& comm) {
  std::lock_guard<std::mutex> lk(comm.mutex());
  return comm.loneWork() ? comm.loneWork()->built : 0;
}

namespace {

// The plan for `ops` (n of them, all of `comm`, which is locked), bound to
// their buffers, the fused inputs packed: a kept one when the shapes match,
// else a new one (kept unless `uncached` must hold it).
Result<Plan*> preparePlan(Comm& comm, const Op* const* ops, size_t n,
                          std::unique_ptr<Plan>* uncached) {
  if (!comm.loneWork()) comm.loneWork() = std::make_shared<LoneWork>();
  LoneWork& cache = *comm.loneWork();
  bool cacheable = true;
  for (size_t i = 0; i < n; ++i) cacheable &= ops[i]->raw();
  Plan* plan = nullptr;
  for (size_t k = 0; cacheable && k < cache.plans.size(); ++k) {
    const std::vector<OpShape>& shape = cache.plans[k]->shape;
    if (shape.size() != n) continue;
    size_t i = 0;
    while (i < n && hasShape(*ops[i], shape[i])) ++i;
    if (i < n) continue;
    std::rotate(cache.plans.begin(), cache.plans.begin() + k, cache.plans.begin() + k + 1);
    plan = cache.plans[0].get();
    logPlan(*plan, ops);
    break;
  }
  if (!plan) {
    cache.probe.resize(n);
    for (size_t i = 0; i < n; ++i) cache.probe[i] = shapeOf(*ops[i]);
    TUTTI_ASSIGN_OR_RETURN(std::unique_ptr<Plan> built, buildPlan(comm, ops, n, cache.probe));
    ++cache.built;
    plan = built.get();
    if (cacheable) {
      cache.plans.insert(cache.plans.begin(), std::move(built));
      if (cache.plans.size() > LoneWork::kPlansKept) cache.plans.pop_back();
    } else {
      *uncached = std::move(built);
    }
  }
  TUTTI_RETURN_IF_ERROR(bindPlan(comm, *plan, ops));
  return plan;
}

// The group's operations that run on host memory through the executor (with
// device buffers staged through pinned host memory), for `comms` (locked),
// executed together with `ipc` (the device-IPC work of the group's
// communicators, also locked).
RunResult runStaged(const std::vector<Comm*>& comms, std::map<Comm*, std::vector<Op*>>& byComm,
                    std::vector<Work>& ipc) {
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
  std::vector<Plan*> plans(comms.size());
  std::vector<std::unique_ptr<Plan>> uncached(comms.size());
  std::vector<Work*> ptrs;
  for (Work& w : ipc) ptrs.push_back(&w);
  std::vector<const std::vector<Op*>*> opsOf;
  for (size_t i = 0; i < comms.size(); ++i) {
    log::setThreadRank(comms[i]->rank());
    const std::vector<Op*>& mine = byComm[comms[i]];
    for (Op* o : mine) assignTuning(*comms[i], *o);
    auto plan = preparePlan(*comms[i], mine.data(), mine.size(), &uncached[i]);
    if (!plan) return {unstage(plan.status()), comms[i]};
    plans[i] = *plan;
    ptrs.push_back(&plans[i]->work);
    opsOf.push_back(&mine);
  }
  // One operation on one communicator: its time is the call's (a trial of
  // run-time tuning is measured).
  const bool alone = comms.size() == 1 && opsOf[0]->size() == 1 && ipc.empty();
  const auto t0 = std::chrono::steady_clock::now();
  st = execute(ptrs);
  const double us =
      alone
          ? std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count()
          : -1;
  if (st) {
    for (size_t i = 0; i < comms.size(); ++i)
      unpackPlan(*plans[i], opsOf[i]->data(), comms[i]->nranks());
    st = afterCall(comms, opsOf, us);
  }
  st = unstage(st);
  if (!st) return ofGroup(st, comms);
  return {};
}

// One collective outside a group on host memory (no compression, no device
// IPC): its plan, as a group of one would have it (a repeated call reuses the
// kept one with this call's buffers), run.
RunResult runAlone(const Op& called) {
  Comm& comm = *called.comm;
  std::lock_guard<std::mutex> lk(comm.mutex());
  Op op = called;
  assignTuning(comm, op);
  Op* ops[1] = {&op};
  std::unique_ptr<Plan> uncached;
  auto plan = preparePlan(comm, ops, 1, &uncached);
  if (!plan) {
    comm.recorder().ended(op.rec, false);
    return {plan.status(), &comm};
  }
  const auto t0 = std::chrono::steady_clock::now();
  Status st = execute((*plan)->ptrs);
  if (st && op.tune.trial >= 0)
    comm.tuner().record(
        op.tune,
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  if (st && op.tune.last) st = agreeTuning({&comm}, {{&op}});
  if (st && replanCount(comm, ops, 1)) st = agreeBalance({&comm}, {op.call});
  comm.recorder().ended(op.rec, st.isOk());  // under the mutex (runOne)
  return st ? RunResult{} : ofGroup(st, {&comm});
}

}  // namespace

namespace {

algo::Wire envCompression(const Comm& comm, size_t bytes, int dt, int op) {
  if (dt != ncclFloat32 || (op != ncclSum && op != ncclAvg) || comm.nranks() < 2)
    return algo::Wire::kRaw;
  const std::string& mode = comm.compressionEnv();
  if (mode.empty() || bytes < comm.compressionMinBytes()) return algo::Wire::kRaw;
  if (comm.nodeMap().nNodes() < 2) return algo::Wire::kRaw;
  return mode == "fp16" ? algo::Wire::kHalf : algo::Wire::kBf16;
}

}  // namespace

Op apiOp(Comm& comm, Collective coll, const void* send, void* recv, size_t count, int dt, int op,
         int root, Queue stream) {
  Op o = argsOp(comm, coll, send, recv, count, dt, op);
  o.root = root;
  o.stream = stream;
  if (coll != Collective::kSend && coll != Collective::kRecv) o.call = comm.nextCollectiveCall();
  o.rec = comm.recorder().record(o);
  if (coll == Collective::kAllReduce && count > 0) {
    o.wire.format = envCompression(comm, count * dataTypeSize(static_cast<DataType>(dt)), dt, op);
    o.needsScale = o.wire.format == algo::Wire::kHalf;
  }
  return o;
}

Status checkCall(const Comm& comm, Collective coll, const void* send, const void* recv,
                 size_t count, int dt, int root) {
  const int n = comm.nranks(), r = comm.rank();
  const bool p2p = coll == Collective::kSend || coll == Collective::kRecv;
  const bool any = coll == Collective::kRecv && root == Op::kAnySource;
  if ((algo::isRooted(coll) || p2p) && !any && (root < 0 || root >= n))
    return invalidArgument(
        fmt::format("invalid {} {} (communicator has {} ranks)", p2p ? "peer" : "root", root, n));
  if (any && n == 1)
    return invalidUsage(
        "a receive from any source on a communicator of one rank: no rank can send");
  const size_t es = dataTypeSize(static_cast<DataType>(dt));
  const size_t factor =
      (coll == Collective::kAllGather || coll == Collective::kReduceScatter ||
       coll == Collective::kAllToAll || coll == Collective::kGather || coll == Collective::kScatter)
          ? static_cast<size_t>(n)
          : 1;
  // (Multiplications, not divisions: two 64-bit divisions were a third of
  // the API's time in a group of small calls.)
  size_t unitBytes = 0, totalBytes = 0;
  if (__builtin_mul_overflow(es, factor, &unitBytes) ||
      __builtin_mul_overflow(count, unitBytes, &totalBytes))
    return invalidArgument(fmt::format("count {} overflows the address space", count));
  if (count == 0) return Status::ok();
  // The buffers this rank uses (a broadcast's non-root sends nothing, ...).
  size_t sendBytes = 0, recvBytes = 0;
  ioBytes(coll, count, es, r, n, root, &sendBytes, &recvBytes);
  if (sendBytes && !send) return invalidArgument("sendbuff is NULL");
  if (recvBytes && !recv) return invalidArgument("recvbuff is NULL");
  return Status::ok();
}

// Each path marks its operations ended in the flight recorder while it holds
// the communicator's mutex: once it is released, an ncclCommAbort from
// another thread may free the communicator (capi's destroyComm waits for
// that mutex, not for this call to return).
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
      comm.recorder().ended(op.rec, st.isOk());
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
    std::vector<Op*>& mine = byComm[o.comm];
    if (mine.empty()) {
      comms.push_back(o.comm);
      mine.reserve(all.size());
    }
    mine.push_back(&o);
  }
  std::vector<Comm*> lockOrder = comms;
  std::sort(lockOrder.begin(), lockOrder.end());
  std::vector<std::unique_lock<std::mutex>> locks;
  for (Comm* c : lockOrder) locks.emplace_back(c->mutex());
  // Declared after the locks, so run before they are released (runOne).
  RunResult result;
  struct MarkEnded {
    std::vector<Op>& all;
    const RunResult& r;
    ~MarkEnded() {
      for (const Op& o : all) o.comm->recorder().ended(o.rec, r.status.isOk());
    }
  } mark{all, result};
  // A receive from any source becomes a receive from the peer whose
  // point-to-point message comes first, before anything is planned (in
  // call order: this runs where the communicator's operations run). Alone
  // (the API refuses it in a group).
  for (Op& o : all) {
    if (o.coll != Collective::kRecv || o.root != Op::kAnySource) continue;
    auto src = o.comm->awaitAnySource();
    if (!src) {
      o.comm->setError(src.status());
      o.comm->noticeFailure(src.status());
      return result = ofGroup(src.status(), comms);
    }
    o.root = *src;
    if (o.source) *o.source = *src;
  }
  // Device IPC: a communicator's raw collectives of the agreed size run
  // device to device, in call order, as executor work beside everything
  // else (one thread progresses them all, as the ranks of one group must
  // progress together).
  std::vector<Work> ipcWork;
  for (Comm* c : comms) {
    if (!c->deviceIpc()) continue;
    std::vector<Op*> viaIpc, rest;
    for (Op* o : byComm[c]) {
      const bool raw = o->wire.format == algo::Wire::kRaw && !o->wireBytes;
      (c->deviceIpc()->takes(o->coll, o->count, elemSize(o->dt), raw) ? viaIpc : rest).push_back(o);
    }
    if (viaIpc.empty()) continue;
    byComm[c] = std::move(rest);
    ipcWork.push_back(ipcWorkOf(*c, viaIpc));
  }
  std::vector<Comm*> staged;
  for (Comm* c : comms)
    if (!byComm[c].empty()) staged.push_back(c);
  if (!staged.empty()) return result = runStaged(staged, byComm, ipcWork);
  std::vector<Work*> ptrs;
  for (Work& w : ipcWork) ptrs.push_back(&w);
  Status st = ptrs.empty() ? Status::ok() : execute(ptrs);
  if (!st) return result = ofGroup(st, comms);
  return result;
}

bool runsOnEngine(Comm& comm, Queue stream) {
  return stream && !comm.backend().hostOnly() && comm.backend().hasHostEvents();
}

namespace {

// Operations of one communicator, all for its engine: queued as one job that
// runs them on the engine's queue. `hold`: every operation is on a stream the
// engine holds until the job ends (runsOnEngine); otherwise (a non-blocking
// communicator) the engine still waits for the device streams' earlier work.
RunResult submitToEngine(std::vector<Op> ops, bool hold) {
  Comm& comm = *ops[0].comm;
  const bool device = !comm.backend().hostOnly();
  std::vector<Queue> streams;
  for (const Op& o : ops)
    if (device && o.stream && std::find(streams.begin(), streams.end(), o.stream) == streams.end())
      streams.push_back(o.stream);
  Status st = comm.engine().submit(
      streams,
      [ops = std::move(ops)](Queue q) mutable {
        for (Op& o : ops) o.stream = q;
        return ops.size() == 1 ? runOne(ops[0]).status : runGroup(ops).status;
      },
      hold);
  if (!st) return RunResult{st, &comm};
  RunResult queued;
  queued.inProgress = !hold;
  return queued;
}

}  // namespace

RunResult submitOne(const Op& op) {
  if (runsOnEngine(*op.comm, op.stream)) return submitToEngine({op}, true);
  if (!op.comm->config().blocking) return submitToEngine({op}, false);
  op.comm->drainEngine();  // in call order with what it still runs
  return runOne(op);
}

Status failRefusedGroup(const std::vector<Comm*>& comms, const Status& why) {
  std::vector<Comm*> seen;
  for (Comm* c : comms) {
    if (!c || std::find(seen.begin(), seen.end(), c) != seen.end()) continue;
    seen.push_back(c);
    const Status st(why.code(), fmt::format("rank {}'s group did not run: one of its calls was "
                                            "refused: {}",
                                            c->rank(), why.message()));
    c->setError(st);
    c->noticeFailure(st);
  }
  return Status(why.code(), "the group did not run (" + why.message() +
                                "); its communicators have failed and their peers were told");
}

RunResult submitGroup(std::vector<Op>& ops) {
  if (ops.empty()) return {};
  bool one = true, held = true;
  for (const Op& o : ops) {
    one &= o.comm == ops[0].comm;
    held &= runsOnEngine(*o.comm, o.stream);
  }
  if (one && held) return submitToEngine(ops, true);
  if (one && !ops[0].comm->config().blocking) return submitToEngine(ops, false);
  // Several communicators progress together on this thread (one thread may
  // drive every rank of a communicator), after what their engines still run.
  for (const Op& o : ops) o.comm->drainEngine();
  return runGroup(ops);
}

}  // namespace tutti::core
