#include "core/staging.h"

#include <algorithm>
#include <cstdint>

#include "base/log.h"

namespace tutti::core {

using algo::Collective;

void ioBytes(Collective coll, size_t count, size_t elemSize, int rank, int nranks, int rootRank,
             size_t* sendBytes, size_t* recvBytes) {
  const size_t blk = count * elemSize, all = blk * static_cast<size_t>(nranks);
  const bool root = rank == rootRank;
  size_t s = blk, r = blk;
  switch (coll) {
    case Collective::kAllReduce:
      break;
    case Collective::kBroadcast:
      s = root ? blk : 0;
      break;
    case Collective::kReduce:
      r = root ? blk : 0;
      break;
    case Collective::kAllGather:
      r = all;
      break;
    case Collective::kReduceScatter:
      s = all;
      break;
    case Collective::kAllToAll:
      s = r = all;
      break;
    case Collective::kGather:
      r = root ? all : 0;
      break;
    case Collective::kScatter:
      s = root ? all : 0;
      break;
    case Collective::kSend:
      r = 0;
      break;
    case Collective::kRecv:
      s = 0;
      break;
    default:
      break;
  }
  *sendBytes = s;
  *recvBytes = r;
}

namespace {

struct Range {
  uintptr_t lo, hi;
  bool overlaps(const Range& o) const { return lo < o.hi && o.lo < hi; }
};

// A staged range: device [lo, hi) lives at host offset `off` of the buffer.
struct Staged {
  Range dev;
  size_t off;
};

}  // namespace

Status DeviceStaging::stageIn(std::vector<StageOp>& ops, PinnedBuffer* pinned) {
  if (be_->hostOnly()) return Status::ok();
  auto addStream = [&](Queue q) {
    if (std::find(streams_.begin(), streams_.end(), q) == streams_.end()) streams_.push_back(q);
  };
  // 1. Which ranges are device memory, and where each goes in the buffer.
  struct Plan {
    StageOp* op;
    size_t sendBytes, recvBytes;
    bool sendDev, recvDev;
    std::vector<Staged> ranges;
  };
  std::vector<Plan> plans;
  size_t total = 0;
  for (StageOp& o : ops) {
    Plan p{&o, 0, 0, false, false, {}};
    ioBytes(o.coll, o.count, o.elemSize, o.rank, o.nranks, o.root, &p.sendBytes, &p.recvBytes);
    p.sendDev = p.sendBytes && *o.send && be_->isDevice(*o.send);
    p.recvDev = p.recvBytes && *o.recv && be_->isDevice(*o.recv);
    if (o.stream) addStream(o.stream);
    if (!p.sendDev && !p.recvDev) continue;
    addStream(o.stream);
    Range s{reinterpret_cast<uintptr_t>(*o.send),
            reinterpret_cast<uintptr_t>(*o.send) + p.sendBytes};
    Range r{reinterpret_cast<uintptr_t>(*o.recv),
            reinterpret_cast<uintptr_t>(*o.recv) + p.recvBytes};
    auto add = [&](Range d) {
      p.ranges.push_back({d, total});
      total += (d.hi - d.lo + 63) / 64 * 64;
    };
    if (p.sendDev && p.recvDev && s.overlaps(r))
      add({std::min(s.lo, r.lo), std::max(s.hi, r.hi)});
    else {
      if (p.sendDev) add(s);
      if (p.recvDev) add(r);
    }
    plans.push_back(std::move(p));
  }
  if (plans.empty()) {
    // Host buffers only: earlier device work on the streams may still write them.
    for (Queue q : streams_) TUTTI_RETURN_IF_ERROR(be_->sync(q));
    streams_.clear();
    return Status::ok();
  }
  // 2. The pinned buffer.
  if (pinned->cap < total) {
    if (pinned->ptr) TUTTI_RETURN_IF_ERROR(be_->hostFree(pinned->ptr));
    pinned->ptr = nullptr;
    pinned->cap = 0;
    TUTTI_ASSIGN_OR_RETURN(void* p, be_->hostAlloc(total));
    pinned->ptr = p;
    pinned->cap = total;
    TUTTI_INFO(log::kAlloc, "staging device buffers through {} bytes of pinned host memory", total);
  }
  auto* base = static_cast<uint8_t*>(pinned->ptr);
  // 3. Copy inputs in on each operation's stream; rewrite the pointers.
  for (Plan& p : plans) {
    StageOp& o = *p.op;
    auto hostOf = [&](const void* d) -> uint8_t* {
      auto a = reinterpret_cast<uintptr_t>(d);
      for (const Staged& s : p.ranges)
        if (a >= s.dev.lo && a < s.dev.hi) return base + s.off + (a - s.dev.lo);
      return nullptr;
    };
    if (p.sendDev)
      TUTTI_RETURN_IF_ERROR(be_->copyAsync(hostOf(*o.send), *o.send, p.sendBytes, o.stream));
    if (p.recvDev) out_.push_back({*o.recv, hostOf(*o.recv), p.recvBytes, o.stream});
    // Either pointer may also fall in the other's staged range without being
    // used by this rank (ncclBcast's buff on a non-root): map it too, so
    // in-place detection sees the same relation as the caller's pointers.
    if (*o.send)
      if (uint8_t* h = hostOf(*o.send)) *o.send = h;
    if (*o.recv)
      if (uint8_t* h = hostOf(*o.recv)) *o.recv = h;
  }
  for (Queue q : streams_) TUTTI_RETURN_IF_ERROR(be_->sync(q));
  return Status::ok();
}

Status DeviceStaging::stageOut(bool copyBack) {
  Status st;
  for (const CopyOut& c : out_) {
    if (!copyBack) break;
    st = be_->copyAsync(c.dst, c.src, c.bytes, c.stream);
    if (!st) break;
  }
  // Drain every stream even after a failure: the staging memory is reused.
  for (Queue q : streams_) {
    Status s = be_->sync(q);
    if (st && !s) st = s;
  }
  out_.clear();
  streams_.clear();
  return st;
}

void freePinned(Backend* backend, PinnedBuffer* pinned) {
  if (pinned->ptr && backend) {
    Status st = backend->hostFree(pinned->ptr);
    if (!st) TUTTI_WARN("freeing staging memory: {}", st.message());
  }
  pinned->ptr = nullptr;
  pinned->cap = 0;
}

}  // namespace tutti::core
