#include "core/oneshot.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "base/backoff.h"
#include "base/log.h"
#include "base/params.h"
#include "base/thread.h"
#include "base/tsan.h"
#include "core/comm.h"
#include "topology/topology.h"
#include "transports/shm/cma.h"
#include "transports/shm/doorbell.h"

namespace tutti::core {
namespace {

using algo::Collective;
using transport::shm::ArenaSegment;
using Clock = std::chrono::steady_clock;

// Slots of each class: 0 small, 1 large.
uint64_t slotsIn(int cls) { return cls == 0 ? ArenaSegment::kSmallSlots : ArenaSegment::kSlots; }

// The slot index of operation c of class cls.
int slotOf(int cls, uint64_t c) {
  const int i = static_cast<int>(c % slotsIn(cls));
  return cls == 0 ? i : ArenaSegment::kSmallSlots + i;
}

// Operation c of a class may overwrite its slot once every rank has
// published c - K + 1 of that class (K its slots), and so finished c - K, the
// slot's previous use: a rank posts an operation only after completing every
// earlier one, of either class.
uint64_t reuseBound(int cls, uint64_t c) {
  const uint64_t k = slotsIn(cls);
  return c >= k ? c - k + 1 : 0;
}

// Which ranks' data `rank` reads for `op` (publication is enough for the rest).
bool needs(const OneShotOp& op, int rank, int q) {
  switch (op.coll) {
    case Collective::kBroadcast:
      return rank != op.root && q == op.root;
    case Collective::kReduce:
      return rank == op.root;
    default:
      return true;
  }
}

// Whose slot `rank` waits for and whose signature it checks: those whose
// data it needs, and in a rooted collective also its predecessor (rank - 1):
// a broadcast's root and a reduce's non-roots need no data, yet a rank that
// took itself for the root while its peers did not must find out in this
// call, not return with its buffer untouched.
bool checks(const OneShotOp& op, int rank, int q, int nranks) {
  if (needs(op, rank, q)) return true;
  return algo::isRooted(op.coll) && q != rank && q == (rank + nranks - 1) % nranks;
}

// Where `rank`'s own block starts in its send buffer when only `rank` reduces
// it (a reduce-scatter's own block, a reduce root's whole input), or
// kNoOwnBlock when peers read all of it (or PreMulSum must scale it on the way
// into the arena). Such a block is not published: complete() reads it from
// the send buffer.
constexpr size_t kNoOwnBlock = ~size_t{0};
// The longest sleep on the doorbell in run(): the checks (abort, a peer gone,
// the timeout) run between sleeps.
constexpr std::chrono::microseconds kBellSleep{1000};
size_t ownBlockOffset(const OneShotOp& op, int rank) {
  if (op.spec.op == RedOp::kPreMulSum) return kNoOwnBlock;
  if (op.coll == Collective::kReduceScatter) return rank * op.count * op.elemSize;
  if (op.coll == Collective::kReduce && rank == op.root) return 0;
  return kNoOwnBlock;
}

// Which ranks read `owner`'s buffer in a direct operation.
bool readsFrom(const OneShotOp& op, int reader, int owner) {
  if (reader == owner) return false;
  return op.coll == Collective::kAllGather || owner == op.root;
}

// A direct operation's slot payload: where the owner's data is, and the count
// (which the signature holds only modulo 2^24).
struct DirectRecord {
  uint64_t addr;
  uint64_t count;
};

// coll | dt << 8 | op << 16 | root << 24 | count << 40 (count < 2^24: slots
// are at most 1 MiB; a direct operation's full count is in its record).
uint64_t signatureOf(const OneShotOp& op) {
  return static_cast<uint64_t>(op.coll) | static_cast<uint64_t>(op.spec.dt) << 8 |
         static_cast<uint64_t>(op.redop & 0xff) << 16 |
         static_cast<uint64_t>(op.root & 0xffff) << 24 | static_cast<uint64_t>(op.count) << 40;
}

std::string describeSignature(uint64_t sig, uint64_t count) {
  auto coll = static_cast<Collective>(sig & 0xff);
  auto dt = static_cast<DataType>((sig >> 8) & 0xff);
  std::string s = fmt::format("{} of {} x {}", algo::collectiveName(coll), count, dataTypeName(dt));
  if (coll == Collective::kAllReduce || coll == Collective::kReduce ||
      coll == Collective::kReduceScatter)
    s += fmt::format(" op {}", (sig >> 16) & 0xff);
  if (coll == Collective::kBroadcast || coll == Collective::kReduce)
    s += fmt::format(" root {}", (sig >> 24) & 0xffff);
  return s;
}

}  // namespace

size_t OneShot::slotBytesFor(Collective coll, size_t count, size_t elemSize, int nranks) {
  switch (coll) {
    case Collective::kAllReduce:
    case Collective::kBroadcast:
    case Collective::kReduce:
    case Collective::kAllGather:
      return count * elemSize;
    case Collective::kReduceScatter:
      return count * elemSize * static_cast<size_t>(nranks);
    default:
      return 0;
  }
}

Result<std::unique_ptr<OneShot>> OneShot::create(Comm* comm, size_t fixedSlotBytes) {
  const int rank = comm->rank(), nranks = comm->nranks();
  if (nranks < 2) return std::unique_ptr<OneShot>();
  if (!comm->allOnOneHost()) return std::unique_ptr<OneShot>();  // the same answer on every rank
  // Settings may differ between processes: agree on the smallest slot, on
  // single-copy only if every rank wants it, and on the largest threshold.
  struct Offer {
    int64_t slotBytes;
    int64_t cmaMinBytes;
    int64_t cma;
  };
  static_assert(std::is_trivially_copyable_v<Offer>);
  const bool shmOff = params::getBool("NCCL_SHM_DISABLE", false);
  Offer mine{fixedSlotBytes ? static_cast<int64_t>(fixedSlotBytes)
                            : params::getInt("TUTTI_ONESHOT_MAX", 32 << 10),
             std::max<int64_t>(params::getInt("TUTTI_CMA_MIN_BYTES", 0), 0),
             !fixedSlotBytes && !shmOff && params::getBool("TUTTI_CMA", false)};
  if (shmOff) mine.slotBytes = 0;
  mine.slotBytes = std::clamp<int64_t>(mine.slotBytes, 0, 1 << 20);
  std::vector<Offer> offers(nranks);
  offers[rank] = mine;
  TUTTI_RETURN_IF_ERROR(comm->bootstrap().allGather(offers.data(), sizeof(Offer)));
  int64_t agreed = mine.slotBytes, cmaMin = 0;
  bool cmaWanted = true;
  for (const Offer& o : offers) {
    agreed = std::min(agreed, o.slotBytes);
    cmaMin = std::max(cmaMin, o.cmaMinBytes);
    cmaWanted = cmaWanted && o.cma;
  }
  if (agreed <= 0 && !cmaWanted) return std::unique_ptr<OneShot>();
  // A single-copy operation's slot holds its DirectRecord.
  const size_t slotBytes = std::max<size_t>(static_cast<size_t>(std::max<int64_t>(agreed, 0)),
                                            cmaWanted ? sizeof(DirectRecord) : 0);
  if (cmaWanted) transport::shm::cma::allowPeerReads();

  // Rank 0 creates the segment and publishes its name; the others attach;
  // every rank probes whether it can read every other's memory (a canary
  // that lives until the second exchange); everyone reports; rank 0 unlinks
  // the name. A failed attach: nobody uses the arena. A failed probe: nobody
  // uses single-copy operations.
  struct Record {
    int32_t ok;
    int32_t cmaOk;
    uint64_t canaryAddr;
    uint64_t canaryValue;
    uint64_t token;
    char name[96];
  };
  static_assert(sizeof(Record) == 128 && std::is_trivially_copyable_v<Record>);
  std::vector<Record> recs(nranks);
  const uint64_t canary =
      transport::shm::cma::processToken() ^ reinterpret_cast<uintptr_t>(&recs) ^ comm->commHash();
  recs[rank].canaryAddr = reinterpret_cast<uintptr_t>(&canary);
  recs[rank].canaryValue = canary;
  recs[rank].token = transport::shm::cma::processToken();
  std::unique_ptr<ArenaSegment> seg;
  std::string name;
  if (rank == 0) {
    name = ArenaSegment::makeName(comm->commHash());
    auto s = ArenaSegment::create(name, rank, nranks, slotBytes);
    if (s) {
      seg = std::move(s.value());
      recs[0].ok = 1;
      snprintf(recs[0].name, sizeof(recs[0].name), "%s", name.c_str());
    } else {
      TUTTI_INFO(log::kShm, "one-shot arena not used: {}", s.status().message());
    }
  }
  Status st = comm->bootstrap().allGather(recs.data(), sizeof(Record));
  if (!st) {
    if (rank == 0 && seg) ArenaSegment::unlinkName(name);
    return st;
  }
  if (rank != 0 && recs[0].ok) {
    recs[0].name[sizeof(recs[0].name) - 1] = 0;
    auto s = ArenaSegment::attach(recs[0].name, rank, nranks, slotBytes);
    if (s) {
      seg = std::move(s.value());
      recs[rank].ok = 1;
    } else {
      TUTTI_INFO(log::kShm, "one-shot arena not used: {}", s.status().message());
    }
  }
  std::vector<bool> local(nranks);
  for (int q = 0; q < nranks; ++q) local[q] = recs[q].token == recs[rank].token;
  if (cmaWanted) {
    recs[rank].cmaOk = 1;
    for (int q = 0; q < nranks && recs[rank].cmaOk; ++q) {
      if (q == rank || local[q]) continue;
      uint64_t seen = 0;
      Status probe = transport::shm::cma::read(static_cast<pid_t>(comm->peer(q).pid),
                                               reinterpret_cast<const void*>(recs[q].canaryAddr),
                                               &seen, sizeof(seen));
      if (probe && seen != recs[q].canaryValue)
        probe = remoteError(fmt::format("read a wrong value from {}", comm->describePeer(q)));
      if (!probe) {
        recs[rank].cmaOk = 0;
        TUTTI_INFO(log::kShm, "single-copy collectives not used: {}", probe.message());
      }
    }
  }
  st = comm->bootstrap().allGather(recs.data(), sizeof(Record));
  if (rank == 0 && seg) ArenaSegment::unlinkName(name);
  TUTTI_RETURN_IF_ERROR(st);
  bool cma = cmaWanted;
  for (const Record& r : recs) {
    if (!r.ok) return std::unique_ptr<OneShot>();
    cma = cma && r.cmaOk;
  }
  // Every peer reads a slot once per operation; its writer may fill it again
  // and again while they lag (a broadcast root): near the writer.
  auto [ownSlots, ownBytes] = seg->ownSlots();
  topo::placeOnNode(ownSlots, ownBytes, comm->homeNuma());
  const size_t oneShotMax = static_cast<size_t>(std::max<int64_t>(agreed, 0));
  TUTTI_INFO(
      log::kShm, "one-shot arena: {} ranks, up to {} bytes per rank{}", nranks, oneShotMax,
      cma ? fmt::format("; single-copy all-gather and broadcast above that, from {} bytes", cmaMin)
          : std::string());
  return std::unique_ptr<OneShot>(new OneShot(comm, std::move(seg), oneShotMax, cma,
                                              static_cast<size_t>(cmaMin), std::move(local)));
}

OneShot::OneShot(Comm* comm, std::unique_ptr<ArenaSegment> seg, size_t maxBytes, bool cma,
                 size_t cmaMinBytes, std::vector<bool> local)
    : comm_(comm),
      seg_(std::move(seg)),
      rank_(comm->rank()),
      nranks_(comm->nranks()),
      maxBytes_(maxBytes),
      cma_(cma),
      cmaMinBytes_(cmaMinBytes),
      local_(std::move(local)),
      seen_{std::vector<uint64_t>(comm->nranks(), 0), std::vector<uint64_t>(comm->nranks(), 0)},
      seenAck_(comm->nranks(), 0),
      srcs_(comm->nranks(), nullptr) {}

int OneShot::classOf(const OneShotOp& op) const {
  const size_t b =
      op.direct ? sizeof(DirectRecord) : slotBytesFor(op.coll, op.count, op.elemSize, nranks_);
  return b <= ArenaSegment::kSmallSlotBytes ? 0 : 1;
}

bool OneShot::takes(Collective coll, size_t count, size_t elemSize, bool* direct) const {
  const size_t b = slotBytesFor(coll, count, elemSize, nranks_);
  *direct = false;
  if (b == 0) return false;
  if (b <= maxBytes_) return true;
  *direct = cma_ && b >= cmaMinBytes_ &&
            (coll == Collective::kAllGather || coll == Collective::kBroadcast);
  return *direct;
}

bool OneShot::acked(int q, uint64_t seq) {
  if (seenAck_[q] >= seq) return true;
  seenAck_[q] = seg_->ack(q).load(std::memory_order_acquire);
  return seenAck_[q] >= seq;
}

Status OneShot::readPeer(int q, const void* remote, void* local, size_t bytes) {
  Status st = transport::shm::cma::readPeer(static_cast<pid_t>(comm_->peer(q).pid), local_[q],
                                            remote, 0, local, bytes);
  return st ? st : st.withContext(fmt::format("{} (single-copy path): ", comm_->describePeer(q)));
}

Status OneShot::readDirect(const OneShotOp& op) {
  const int slot = slotOf(op.cls, op.seq);
  const size_t blk = op.count * op.elemSize;
  auto recordOf = [&](int q) {
    DirectRecord d;
    memcpy(&d, seg_->payload(q, slot), sizeof(d));
    return reinterpret_cast<const void*>(d.addr);
  };
  if (op.coll == Collective::kBroadcast) {
    if (rank_ == op.root) {
      if (op.recv != op.send) memmove(op.recv, op.send, blk);
      return Status::ok();
    }
    return readPeer(op.root, recordOf(op.root), op.recv, blk);
  }
  // All-gather: start with the next rank, so the ranks do not all read one
  // owner at once.
  for (int i = 1; i < nranks_; ++i) {
    const int q = (rank_ + i) % nranks_;
    TUTTI_RETURN_IF_ERROR(readPeer(q, recordOf(q), op.recv + q * blk, blk));
  }
  uint8_t* own = op.recv + rank_ * blk;
  if (own != op.send) memmove(own, op.send, blk);
  return Status::ok();
}

void OneShot::ringPeers() {
  std::atomic_thread_fence(std::memory_order_seq_cst);  // the stores above, then the sleepers
  for (int q = 0; q < nranks_; ++q)
    if (q != rank_) transport::shm::ringFenced(seg_->bell(q));
}

bool OneShot::published(int q, int cls, uint64_t seq) {
  uint64_t& seen = seen_[cls][q];
  if (seen >= seq) return true;
  uint64_t v = seg_->seq(q, slotOf(cls, seq)).load(std::memory_order_acquire);
  if (v > seen) seen = v;
  return v >= seq;
}

Status OneShot::progress(OneShotOp& op, bool* moved) {
  if (op.done) return Status::ok();
  const size_t es = op.elemSize;
  if (op.seq == 0) {
    const int cls = classOf(op);
    const uint64_t c = nextSeq_[cls];
    if (const uint64_t bound = reuseBound(cls, c))
      for (int q = 0; q < nranks_; ++q)
        if (!published(q, cls, bound)) return Status::ok();
    const int slot = slotOf(cls, c);
    const size_t bytes = slotBytesFor(op.coll, op.count, es, nranks_);
    if (op.direct) {
      const bool owns = op.coll == Collective::kAllGather || rank_ == op.root;
      if (owns) base::tsanRelease(op.send);
      const DirectRecord d{owns ? reinterpret_cast<uintptr_t>(op.send) : 0, op.count};
      memcpy(seg_->payload(rank_, slot), &d, sizeof(d));
    } else if (op.coll != Collective::kBroadcast || rank_ == op.root) {
      uint8_t* dst = seg_->payload(rank_, slot);
      const size_t own = ownBlockOffset(op, rank_);
      if (op.spec.op == RedOp::kPreMulSum) {
        comm_->kernels().scale(dst, op.send, bytes / es, op.spec.dt, op.spec.scalar);
      } else if (own != kNoOwnBlock) {  // only what the peers read
        const size_t end = own + op.count * es;
        memcpy(dst, op.send, own);
        memcpy(dst + end, op.send + end, bytes - end);
      } else {
        memcpy(dst, op.send, bytes);
      }
    }
    const uint64_t sig = signatureOf(op);
    seg_->signature(rank_, slot) = sig;
    seg_->seq(rank_, slot).store(c, std::memory_order_release);
    op.global = nextGlobal_++;
    seg_->postedSignature(rank_).store(sig, std::memory_order_relaxed);
    seg_->postedCall(rank_).store(op.part ? 0 : op.call + 1, std::memory_order_relaxed);
    seg_->posted(rank_).store(op.global << 1 | static_cast<uint64_t>(cls),
                              std::memory_order_release);
    ringPeers();
    seen_[cls][rank_] = c;
    op.cls = static_cast<uint8_t>(cls);
    op.seq = c;
    ++nextSeq_[cls];
    *moved = true;
  }
  for (int q = 0; q < nranks_; ++q)
    if (checks(op, rank_, q, nranks_) && !published(q, op.cls, op.seq)) return Status::ok();
  if (!op.readsDone) {
    for (int q = 0; q < nranks_; ++q)
      if (checks(op, rank_, q, nranks_)) TUTTI_RETURN_IF_ERROR(checkSignature(op, q));
    if (!op.direct) {
      complete(op);
      op.done = true;
      // Rooted collectives: the senders (a broadcast's root, a reduce's
      // non-roots) wait for no reader (only for their predecessor to post,
      // checks()) and often have written the next small slot already, so
      // fetch its line while the caller returns
      // and calls again (2 ranks, 8 B-2 KiB broadcast: 1.17-1.39x, medians
      // of 5 paired runs). Symmetric collectives gain nothing: the peer's
      // next slot is rarely written yet.
      if (op.cls == 0 && (op.coll == Collective::kBroadcast || op.coll == Collective::kReduce))
        for (int q = 0; q < nranks_; ++q)
          if (q != rank_ && needs(op, rank_, q))
            __builtin_prefetch(seg_->payload(q, slotOf(0, op.seq + 1)));
      *moved = true;
      return Status::ok();
    }
    TUTTI_RETURN_IF_ERROR(readDirect(op));
    seg_->ack(rank_).store(op.seq, std::memory_order_release);
    ringPeers();
    op.readsDone = true;
    *moved = true;
  }
  // Direct: done once nobody reads this rank's buffer any more.
  for (int q = 0; q < nranks_; ++q)
    if (readsFrom(op, q, rank_) && !acked(q, op.seq)) return Status::ok();
  base::tsanAcquire(op.send);  // every reader's copy, before the caller reuses the buffer
  op.done = true;
  ++directOps_;
  *moved = true;
  return Status::ok();
}

Status OneShot::checkSignature(const OneShotOp& op, int q) {
  const int slot = slotOf(op.cls, op.seq);
  const uint64_t theirs = seg_->signature(q, slot);
  const uint64_t mine = signatureOf(op);
  // A direct operation's record holds the full count; the other side of a
  // mismatch may have posted a one-shot one, whose payload is data.
  uint64_t theirCount = theirs >> 40;
  if (op.direct) {
    DirectRecord d;
    memcpy(&d, seg_->payload(q, slot), sizeof(d));
    if (theirs == mine && d.count == op.count) return Status::ok();
    if ((theirs >> 40) == (op.count & 0xffffff)) theirCount = d.count;
  } else if (theirs == mine) {
    return Status::ok();
  }
  return mismatch(op, q, describeSignature(theirs, theirCount));
}

Status OneShot::mismatch(const OneShotOp& op, int q, const std::string& theirs) {
  return invalidUsage(fmt::format(
      "collective mismatch at one-shot operation {}: {} called {} but rank {} called {}: the "
      "ranks called collectives in a different order or with different counts, datatypes, ops "
      "or roots",
      op.global, comm_->describePeer(q), theirs, rank_,
      describeSignature(signatureOf(op), op.count)));
}

void OneShot::complete(OneShotOp& op) {
  const int slot = slotOf(op.cls, op.seq);
  const size_t n = op.count, es = op.elemSize;
  const RedOp red = op.spec.op == RedOp::kPreMulSum ? RedOp::kSum : op.spec.op;
  switch (op.coll) {
    case Collective::kAllReduce:
    case Collective::kReduce:
    case Collective::kReduceScatter: {
      if (op.coll == Collective::kReduce && rank_ != op.root) return;
      const size_t off = op.coll == Collective::kReduceScatter ? rank_ * n * es : 0;
      for (int q = 0; q < nranks_; ++q) srcs_[q] = seg_->payload(q, slot) + off;
      if (ownBlockOffset(op, rank_) != kNoOwnBlock) {
        // Reduced by this rank only, so the order of the sources is free:
        // its own block first, from its send buffer (the one source reduceN
        // lets the output alias: in place, recv is that block).
        std::swap(srcs_[0], srcs_[rank_]);
        srcs_[0] = op.send + off;
      }
      const HostKernels& k = comm_->kernels();
      k.reduceN(op.recv, srcs_.data(), nranks_, n, op.spec.dt, red);
      if (op.spec.divisor > 0) k.divide(op.recv, op.recv, n, op.spec.dt, op.spec.divisor);
      return;
    }
    case Collective::kAllGather:
      for (int q = 0; q < nranks_; ++q)
        memcpy(op.recv + q * n * es, seg_->payload(q, slot), n * es);
      return;
    case Collective::kBroadcast: {
      const uint8_t* src = rank_ == op.root ? op.send : seg_->payload(op.root, slot);
      if (op.recv != src) memmove(op.recv, src, n * es);
      return;
    }
    default:
      return;
  }
}

Status OneShot::check(const OneShotOp& op, Clock::duration idle) {
  if (comm_->aborted()) return invalidUsage("communicator aborted");
  if (comm_->revoked()) return Comm::revokedError();
  // Whom this rank waits for: everyone's progress before posting (slot
  // reuse), then the ranks whose data it needs.
  const int cls = op.seq ? op.cls : classOf(op);
  const uint64_t seq = op.seq ? op.seq : reuseBound(cls, nextSeq_[cls]);
  std::vector<int> waiting;
  for (int q = 0; q < nranks_; ++q) {
    if (q == rank_) continue;
    if (op.readsDone) {  // direct: waiting for the readers of this rank's buffer
      if (readsFrom(op, q, rank_) && !acked(q, seq)) waiting.push_back(q);
      continue;
    }
    if (op.seq && !checks(op, rank_, q, nranks_)) continue;
    if (published(q, cls, seq)) continue;
    if (op.seq) {
      // q has posted this operation (or a later one) in the other class:
      // its call differs from this rank's. (Read before looking again at
      // the slot: q publishes the slot first.)
      const uint64_t p = seg_->posted(q).load(std::memory_order_acquire);
      if (!published(q, cls, seq) && (p >> 1) >= op.global) {
        const uint64_t sig = seg_->postedSignature(q).load(std::memory_order_relaxed);
        return mismatch(op, q,
                        (p >> 1) == op.global ? describeSignature(sig, sig >> 40)
                                              : std::string("a collective of another size"));
      }
    }
    waiting.push_back(q);
  }
  const char* what = algo::collectiveName(op.coll);
  // Whether this rank still waits for q. Asked again once q is seen gone: q
  // may have acked or published (and then left) after the list above was
  // made, and what it wrote before leaving is visible once its state is
  // (the state is read with acquire, written last).
  auto stillWaiting = [&](int q) {
    return op.readsDone ? !acked(q, seq) : !published(q, cls, seq);
  };
  for (int q : waiting) {
    uint32_t state = seg_->state(q);
    if ((state == ArenaSegment::kAborted || state == ArenaSegment::kFailed ||
         state == ArenaSegment::kClosed) &&
        !stillWaiting(q))
      continue;
    if (state == ArenaSegment::kAborted) {
      // No notice follows (the aborted rank sends none): say it now.
      return comm_->peerAbortedError(
          q, fmt::format(" while this rank waited for it in {} (one-shot path, operation {})", what,
                         seq));
    }
    if (state == ArenaSegment::kFailed) {
      return comm_->explainPeerFailure(
          q, remoteError(fmt::format("{} failed while this rank waited for it in {} (one-shot "
                                     "path, operation {})",
                                     comm_->describePeer(q), what, seq)));
    }
    if (state == ArenaSegment::kClosed) {
      return invalidUsage(fmt::format(
          "{} destroyed its communicator while this rank waited for it in {} (one-shot path, "
          "operation {}): the ranks called collectives in a different order or number",
          comm_->describePeer(q), what, seq));
    }
    if (base::processDead(static_cast<pid_t>(comm_->peer(q).pid)) && stillWaiting(q)) {
      return remoteError(
          fmt::format("{} is gone: its process no longer exists (seen from rank {} "
                      "waiting in {}, one-shot path)",
                      comm_->describePeer(q), rank_, what));
    }
  }
  if (!waiting.empty()) comm_->noteWaiting(waiting);
  double secs = std::chrono::duration<double>(idle).count();
  if (waiting.empty() || secs < comm_->timeoutSec()) return Status::ok();
  std::string names;
  for (int q : waiting) names += (names.empty() ? "" : ", ") + comm_->describePeer(q);
  return remoteError(
      fmt::format("no progress for {:.0f} s (TUTTI_TIMEOUT) in {} (one-shot path, "
                  "operation {}) waiting on {}",
                  secs, what, seq, names));
}

std::optional<std::string> OneShot::postedAsCall(int rank, uint32_t call) {
  // The call number is read after the post (release) that follows it, and
  // the signature after it (the same line; written before the post).
  (void)seg_->posted(rank).load(std::memory_order_acquire);
  const uint64_t c = seg_->postedCall(rank).load(std::memory_order_relaxed);
  if (c == 0 || static_cast<uint32_t>(c - 1) != call) return std::nullopt;
  const uint64_t sig = seg_->postedSignature(rank).load(std::memory_order_relaxed);
  return describeSignature(sig, sig >> 40) + fmt::format(" (collective call {}, one-shot path)", c - 1);
}

bool OneShot::anyPeerGone() const {
  for (int q = 0; q < nranks_; ++q)
    if (q != rank_ && peerGone(q)) return true;
  return false;
}

Status OneShot::run(OneShotOp& op) {
  struct ClearWaiting {
    Comm* comm;
    ~ClearWaiting() { comm->clearWaiting(); }
  } clearWaiting{comm_};
  base::Backoff backoff(comm_->oversubscribed());
  auto nextCheck = Clock::duration(std::chrono::milliseconds(100));
  for (;;) {
    bool moved = false;
    Status st = progress(op, &moved);
    if (st && op.done) return st;
    if (st && moved) {
      backoff.progress();
      nextCheck = std::chrono::milliseconds(100);
      continue;
    }
    if (st && backoff.napping()) {
      // Past spinning and yielding: sleep on this rank's doorbell until a
      // peer publishes or acknowledges (progress() rings the others' bells)
      // or kBellSleep passes (the checks below still run), instead of
      // napping on a timer. An abort rings it too (Comm::abort).
      transport::shm::sleep(seg_->bell(rank_), kBellSleep, [&] {
        st = progress(op, &moved);  // the last look, after announcing
        return st && !moved && !op.done;
      });
      if (st && op.done) return st;
      if (st && moved) {
        backoff.progress();
        nextCheck = std::chrono::milliseconds(100);
        continue;
      }
    } else if (st) {
      backoff.idle();
    }
    if (st) {
      if (comm_->aborted()) st = invalidUsage("communicator aborted");
      if (st && comm_->revoked()) st = Comm::revokedError();
      if (st && backoff.pastSpin() && (backoff.napping() || (backoff.idleIters() & 15) == 0)) {
        auto idle = backoff.idleFor();
        // The full check every 100 ms, or at once when a peer's state says
        // it failed, left or was aborted.
        if (idle >= nextCheck || anyPeerGone()) {
          nextCheck = idle + std::chrono::milliseconds(100);
          st = check(op, idle);
        }
      }
    }
    if (!st) {
      comm_->setError(st);
      comm_->noticeFailure(st);
      return st;
    }
  }
}

}  // namespace tutti::core
