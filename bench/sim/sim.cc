// tutti-sim engine: schedule matching, dependency checks and a discrete-event
// simulation of the messages (see sim.h for the model).
#include "sim.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <tuple>
#include <utility>

namespace tutti::sim {
namespace {

constexpr uint32_t kNone = UINT32_MAX;
constexpr uint32_t kMaxIds = 1u << 28;  // ids share an event word with the event kind
constexpr size_t kMaxReported = 8;      // problems spelled out per error

struct Msg {
  int32_t src;
  int32_t dst;
  uint32_t recv;      // the matched receive (global id), kNone until matched
  uint32_t waitRecv;  // global id of the receive this send waits on, kNone: none
  uint64_t bytes;
  uint64_t tag;
};

enum : uint8_t { kArrived = 1, kStarted = 2, kDone = 4 };

struct Recv {
  int32_t rank;
  uint32_t after;  // global id, kNone: none
  uint32_t msg;    // the matched send (global id), kNone until matched
  uint8_t reduce;
  uint8_t finalize;
  uint8_t state;
};

struct Key {
  int32_t src;
  int32_t dst;
  uint64_t tag;
  bool operator==(const Key& o) const { return src == o.src && dst == o.dst && tag == o.tag; }
};
struct Pending {
  uint32_t id;
  bool isSend;
  uint64_t bytes;
};

// Unmatched sends and receives by (src, dst, tag): open addressing with
// linear probing and backward-shift deletion (no tombstones, no allocation
// per entry). It holds only what is not matched yet: with ranks folded in in
// order, mostly the messages between a rank and the peers still to come.
class PendingMap {
 public:
  PendingMap() { slots_.resize(1024); }
  size_t size() const { return size_; }
  // The entry for `k`, or null.
  Pending* find(const Key& k) {
    for (size_t i = hash(k) & mask();; i = (i + 1) & mask()) {
      Slot& s = slots_[i];
      if (!s.used) return nullptr;
      if (s.key == k) return &s.val;
    }
  }
  void insert(const Key& k, const Pending& v) {
    if ((size_ + 1) * 2 > slots_.size()) grow();
    place(k, v);
    ++size_;
  }
  void erase(const Key& k) {
    size_t i = hash(k) & mask();
    while (!(slots_[i].key == k)) i = (i + 1) & mask();
    // Shift later entries of the run back over the hole.
    for (size_t j = (i + 1) & mask();; j = (j + 1) & mask()) {
      Slot& s = slots_[j];
      if (!s.used) break;
      const size_t home = hash(s.key) & mask();
      // s may move to i if its home is not in (i, j] (cyclically).
      if (((j - home) & mask()) >= ((j - i) & mask())) {
        slots_[i] = s;
        i = j;
      }
    }
    slots_[i].used = false;
    --size_;
  }
  template <typename F>
  void forEach(F f) const {
    for (const Slot& s : slots_)
      if (s.used) f(s.key, s.val);
  }

 private:
  struct Slot {
    Key key{};
    Pending val{};
    bool used = false;
  };
  static size_t hash(const Key& k) {
    uint64_t h = k.tag ^ (static_cast<uint64_t>(static_cast<uint32_t>(k.src)) << 32 |
                          static_cast<uint32_t>(k.dst)) *
                             0x9E3779B97F4A7C15ull;
    h ^= h >> 31;  // splitmix64's finalizer
    h *= 0xBF58476D1CE4E5B9ull;
    h ^= h >> 27;
    h *= 0x94D049BB133111EBull;
    return static_cast<size_t>(h ^ (h >> 31));
  }
  size_t mask() const { return slots_.size() - 1; }
  void place(const Key& k, const Pending& v) {
    size_t i = hash(k) & mask();
    while (slots_[i].used) i = (i + 1) & mask();
    slots_[i] = {k, v, true};
  }
  void grow() {
    std::vector<Slot> old(slots_.size() * 2);
    old.swap(slots_);
    for (const Slot& s : old)
      if (s.used) place(s.key, s.val);
  }
  std::vector<Slot> slots_;
  size_t size_ = 0;
};

enum Kind : uint32_t { kStage1 = 0, kStage2 = 1, kArrive = 2, kRecvDone = 3, kLocalDone = 4 };

struct Event {
  double t;
  uint64_t seq;
  uint32_t code;  // kind << 28 | id
};
struct Later {
  bool operator()(const Event& a, const Event& b) const {
    return a.t > b.t || (a.t == b.t && a.seq > b.seq);
  }
};

class Engine {
 public:
  Engine(int nranks, const algo::NodeMap* nodes, const SimConfig& cfg) : n_(nranks), cfg_(cfg) {
    nodeOf_.assign(n_, 0);
    if (nodes) nodeOf_ = nodes->nodeOf;
    nNodes_ = 1;
    for (int v : nodeOf_) nNodes_ = std::max(nNodes_, v + 1);
    added_.assign(n_, 0);
    sendBegin_.assign(n_, 0);
    sendEnd_.assign(n_, 0);
    localBytes_.assign(n_, 0);
  }

  Status addRank(int rank, const algo::Schedule& s);
  Result<SimResult> run();

 private:
  void problem(std::string m) {
    if (problems_.size() < kMaxReported) problems_.push_back(std::move(m));
    ++nProblems_;
  }
  bool interNode(const Msg& m) const { return nodeOf_[m.src] != nodeOf_[m.dst]; }
  // A message's bandwidth on its node's NIC (inter) or its rank's port.
  double bandwidthGBs(bool inter, int node) const {
    if (inter && static_cast<size_t>(node) < cfg_.nodeInterGBs.size() &&
        cfg_.nodeInterGBs[node] > 0)
      return cfg_.nodeInterGBs[node];
    return inter ? cfg_.cost.inter.bandwidthGBs : cfg_.cost.intra.bandwidthGBs;
  }
  // Resources: send port r, receive port n+r, CPU 2n+r, uplink 3n+k, downlink 3n+N+k.
  size_t cpu(int r) const { return 2 * static_cast<size_t>(n_) + r; }
  void push(double t, Kind k, uint32_t id) {
    heap_.push_back({t, seq_++, static_cast<uint32_t>(k) << 28 | id});
    std::push_heap(heap_.begin(), heap_.end(), Later());
  }
  void sendReady(uint32_t m, double t);
  void stage1(uint32_t m, double t);
  void stage2(uint32_t m, double t);
  void arrive(uint32_t m, double t);
  void tryStart(uint32_t r, double t);
  void recvDone(uint32_t r, double t);
  double recvCost(const Recv& rv) const;
  std::string describeRecv(uint32_t r) const;
  std::string explainStuck(uint32_t r) const;

  const int n_;
  const SimConfig cfg_;
  std::vector<int> nodeOf_;
  int nNodes_ = 1;
  std::vector<char> added_;
  std::vector<uint32_t> sendBegin_, sendEnd_;  // per rank: its sends in msgs_
  std::vector<uint64_t> localBytes_;
  std::vector<Msg> msgs_;
  std::vector<Recv> recvs_;
  PendingMap pending_;
  std::vector<std::string> problems_;
  size_t nProblems_ = 0;
  std::string algorithm_;

  // Simulation state.
  std::vector<uint32_t> waitersBegin_, waiters_;  // receive -> sends waiting on it
  std::vector<uint32_t> afterBegin_, afterOf_;    // receive -> receives `after` it
  std::vector<double> free_;                      // resource -> time it is free
  std::vector<double> rankTime_;
  std::vector<Event> heap_;
  std::vector<uint32_t> work_;
  uint64_t seq_ = 0;
  size_t nDone_ = 0;
};

Status Engine::addRank(int rank, const algo::Schedule& s) {
  if (rank < 0 || rank >= n_) return invalidArgument(fmt::format("rank {} out of range", rank));
  if (added_[rank]) return invalidArgument(fmt::format("rank {} added twice", rank));
  added_[rank] = 1;
  if (rank == 0 || algorithm_.empty()) algorithm_ = s.algorithm;
  const size_t nr = s.recvs.size();
  if (msgs_.size() + s.sends.size() >= kMaxIds || recvs_.size() + nr >= kMaxIds)
    return invalidArgument("too many messages to simulate (more than 2^28)");
  if (msgs_.empty() && recvs_.empty()) {
    // Most generators give every rank about as many steps: avoid regrowing.
    const size_t cap = size_t{1} << 27;
    msgs_.reserve(std::min(cap, s.sends.size() * static_cast<size_t>(n_) * 9 / 8));
    recvs_.reserve(std::min(cap, nr * static_cast<size_t>(n_) * 9 / 8));
  }
  const uint32_t rbase = static_cast<uint32_t>(recvs_.size());
  sendBegin_[rank] = static_cast<uint32_t>(msgs_.size());
  for (const auto& st : s.local) localBytes_[rank] += st.bytes;

  for (size_t k = 0; k < nr; ++k) {
    const algo::RecvStep& r = s.recvs[k];
    const uint32_t id = rbase + static_cast<uint32_t>(k);
    Recv rv{rank, kNone, kNone, r.action == algo::RecvAction::kReduce, r.finalize, 0};
    recvs_.push_back(rv);
    if (r.peer < 0 || r.peer >= n_ || r.peer == rank) {
      problem(fmt::format("rank {}'s receive {} names peer {} ({} ranks)", rank, k, r.peer, n_));
      continue;
    }
    if (r.after >= 0) {
      if (static_cast<size_t>(r.after) >= nr || static_cast<size_t>(r.after) == k) {
        problem(fmt::format("rank {}'s receive from rank {} (tag {}) has after={} ({} receives)",
                            rank, r.peer, describeTag(r.tag), r.after, nr));
      } else if (s.recvs[r.after].peer == r.peer) {
        problem(fmt::format(
            "rank {}'s receive from rank {} (tag {}) waits (after) on a receive from the same "
            "peer (tag {}): schedule.h requires a different peer, or the executor may hold the "
            "channel that carries it",
            rank, r.peer, describeTag(r.tag), describeTag(s.recvs[r.after].tag)));
      } else {
        recvs_[id].after = rbase + static_cast<uint32_t>(r.after);
      }
    }
    Key key{r.peer, rank, r.tag};
    Pending* p = pending_.find(key);
    if (!p) {
      pending_.insert(key, Pending{id, false, r.bytes});
    } else if (!p->isSend) {
      problem(fmt::format("rank {} has two receives from rank {} with tag {}", rank, r.peer,
                          describeTag(r.tag)));
    } else {
      const uint32_t m = p->id;
      pending_.erase(key);
      if (msgs_[m].bytes != r.bytes)
        problem(
            fmt::format("rank {}'s receive from rank {} (tag {}) expects {} bytes; the send "
                        "carries {}",
                        rank, r.peer, describeTag(r.tag), r.bytes, msgs_[m].bytes));
      msgs_[m].recv = id;
      recvs_[id].msg = m;
    }
  }

  for (size_t k = 0; k < s.sends.size(); ++k) {
    const algo::SendStep& sd = s.sends[k];
    const uint32_t id = static_cast<uint32_t>(msgs_.size());
    msgs_.push_back({rank, sd.peer, kNone, kNone, sd.bytes, sd.tag});
    if (sd.peer < 0 || sd.peer >= n_ || sd.peer == rank) {
      problem(fmt::format("rank {}'s send {} names peer {} ({} ranks)", rank, k, sd.peer, n_));
      msgs_.back().dst = rank;  // keeps the simulation's indexing valid; reported anyway
      continue;
    }
    if (sd.waitRecv >= 0) {
      if (static_cast<size_t>(sd.waitRecv) >= nr)
        problem(fmt::format("rank {}'s send to rank {} (tag {}) waits on receive {} of {}", rank,
                            sd.peer, describeTag(sd.tag), sd.waitRecv, nr));
      else
        msgs_[id].waitRecv = rbase + static_cast<uint32_t>(sd.waitRecv);
    }
    Key key{rank, sd.peer, sd.tag};
    Pending* p = pending_.find(key);
    if (!p) {
      pending_.insert(key, Pending{id, true, sd.bytes});
    } else if (p->isSend) {
      problem(fmt::format("rank {} has two sends to rank {} with tag {}", rank, sd.peer,
                          describeTag(sd.tag)));
    } else {
      const uint32_t r = p->id;
      const uint64_t want = p->bytes;
      pending_.erase(key);
      if (want != sd.bytes)
        problem(
            fmt::format("rank {}'s receive from rank {} (tag {}) expects {} bytes; the send "
                        "carries {}",
                        sd.peer, rank, describeTag(sd.tag), want, sd.bytes));
      msgs_[id].recv = r;
      recvs_[r].msg = id;
    }
  }
  sendEnd_[rank] = static_cast<uint32_t>(msgs_.size());
  return Status::ok();
}

double Engine::recvCost(const Recv& rv) const {
  if (cfg_.computeGBs <= 0) return 0;
  const double b = static_cast<double>(msgs_[rv.msg].bytes);
  return ((rv.reduce ? b : 0) + (rv.finalize ? b : 0)) / (cfg_.computeGBs * 1e3);
}

void Engine::sendReady(uint32_t m, double t) {
  if (cfg_.msgOverheadUs > 0) {
    double& f = free_[cpu(msgs_[m].src)];
    const double s = std::max(t, f) + cfg_.msgOverheadUs;
    f = s;
    push(s, kStage1, m);
    return;
  }
  stage1(m, t);
}

void Engine::stage1(uint32_t m, double t) {
  const Msg& msg = msgs_[m];
  const bool inter = interNode(msg);
  const algo::LinkModel& link = inter ? cfg_.cost.inter : cfg_.cost.intra;
  const size_t res =
      inter ? 3 * static_cast<size_t>(n_) + nodeOf_[msg.src] : static_cast<size_t>(msg.src);
  const double dur = static_cast<double>(msg.bytes) / (bandwidthGBs(inter, nodeOf_[msg.src]) * 1e3);
  const double s = std::max(t, free_[res]);
  free_[res] = s + dur;
  rankTime_[msg.src] = std::max(rankTime_[msg.src], s + dur);
  const double next = s + link.latencyUs;
  if (next > t)
    push(next, kStage2, m);
  else
    stage2(m, t);
}

void Engine::stage2(uint32_t m, double t) {
  const Msg& msg = msgs_[m];
  const bool inter = interNode(msg);
  const size_t res = inter ? 3 * static_cast<size_t>(n_) + nNodes_ + nodeOf_[msg.dst]
                           : static_cast<size_t>(n_) + msg.dst;
  const double dur = static_cast<double>(msg.bytes) / (bandwidthGBs(inter, nodeOf_[msg.dst]) * 1e3);
  const double s = std::max(t, free_[res]);
  free_[res] = s + dur;
  if (s + dur > t)
    push(s + dur, kArrive, m);
  else
    arrive(m, t);
}

void Engine::arrive(uint32_t m, double t) {
  const uint32_t r = msgs_[m].recv;
  Recv& rv = recvs_[r];
  rv.state |= kArrived;
  if (rv.after == kNone || (recvs_[rv.after].state & kDone)) tryStart(r, t);
}

// The message has arrived and `after` is done: process it (reduce or copy).
void Engine::tryStart(uint32_t r, double t) {
  Recv& rv = recvs_[r];
  if (rv.state & kStarted) return;
  rv.state |= kStarted;
  const double c = recvCost(rv);
  if (c > 0) {
    double& f = free_[cpu(rv.rank)];
    f = std::max(t, f) + c;
    push(f, kRecvDone, r);
  } else {
    recvDone(r, t);
  }
}

void Engine::recvDone(uint32_t first, double t) {
  // Iterative: a chain of `after` receives that have all arrived completes at once.
  work_.push_back(first);
  while (!work_.empty()) {
    const uint32_t r = work_.back();
    work_.pop_back();
    Recv& rv = recvs_[r];
    rv.state |= kDone;
    ++nDone_;
    rankTime_[rv.rank] = std::max(rankTime_[rv.rank], t);
    for (uint32_t i = waitersBegin_[r]; i < waitersBegin_[r + 1]; ++i) sendReady(waiters_[i], t);
    for (uint32_t i = afterBegin_[r]; i < afterBegin_[r + 1]; ++i) {
      const uint32_t x = afterOf_[i];
      Recv& xv = recvs_[x];
      if (!(xv.state & kArrived) || (xv.state & kStarted)) continue;
      xv.state |= kStarted;
      const double c = recvCost(xv);
      if (c > 0) {
        double& f = free_[cpu(xv.rank)];
        f = std::max(t, f) + c;
        push(f, kRecvDone, x);
      } else {
        work_.push_back(x);
      }
    }
  }
}

std::string Engine::describeRecv(uint32_t r) const {
  const Recv& rv = recvs_[r];
  return fmt::format("rank {}'s receive from rank {} (tag {})", rv.rank, msgs_[rv.msg].src,
                     describeTag(msgs_[rv.msg].tag));
}

// Follows what a stuck receive waits for until it comes back to itself.
std::string Engine::explainStuck(uint32_t r) const {
  std::string out = describeRecv(r);
  std::vector<uint32_t> seen{r};
  for (int step = 0; step < 32; ++step) {
    const Recv& rv = recvs_[r];
    const Msg& m = msgs_[rv.msg];
    uint32_t next;
    if (!(rv.state & kArrived)) {
      if (m.waitRecv == kNone) return out + " never arrives (simulator bug)";
      next = m.waitRecv;
      out += fmt::format(" is never sent: rank {} sends it after ", m.src);
    } else {
      next = rv.after;
      if (next == kNone) return out + " never completes (simulator bug)";
      out += " arrives but waits (after) for ";
    }
    if (std::find(seen.begin(), seen.end(), next) != seen.end())
      return out + describeRecv(next) + " -- a cycle";
    seen.push_back(next);
    out += describeRecv(next);
    r = next;
  }
  return out + " ...";
}

Result<SimResult> Engine::run() {
  for (int r = 0; r < n_; ++r)
    if (!added_[r]) problem(fmt::format("rank {} has no schedule", r));
  if (pending_.size()) {
    std::vector<std::pair<Key, Pending>> left;
    pending_.forEach([&](const Key& k, const Pending& p) { left.emplace_back(k, p); });
    std::sort(left.begin(), left.end(), [](const auto& a, const auto& b) {
      return std::tie(a.first.src, a.first.dst, a.first.tag) <
             std::tie(b.first.src, b.first.dst, b.first.tag);
    });
    for (const auto& [k, p] : left) {
      if (p.isSend)
        problem(fmt::format("rank {}'s send to rank {} (tag {}, {} bytes) has no matching receive",
                            k.src, k.dst, describeTag(k.tag), p.bytes));
      else
        problem(
            fmt::format("rank {}'s receive from rank {} (tag {}, {} bytes) has no matching send",
                        k.dst, k.src, describeTag(k.tag), p.bytes));
    }
  }
  if (nProblems_) {
    std::string m = fmt::format("inconsistent schedules ({} problem{}): ", nProblems_,
                                nProblems_ == 1 ? "" : "s");
    for (size_t i = 0; i < problems_.size(); ++i) m += (i ? "; " : "") + problems_[i];
    if (nProblems_ > problems_.size()) m += "; ...";
    return internalError(m);
  }

  // Dependency lists (CSR).
  const size_t nm = msgs_.size(), nr = recvs_.size();
  waitersBegin_.assign(nr + 1, 0);
  afterBegin_.assign(nr + 1, 0);
  for (const Msg& m : msgs_)
    if (m.waitRecv != kNone) ++waitersBegin_[m.waitRecv + 1];
  for (const Recv& rv : recvs_)
    if (rv.after != kNone) ++afterBegin_[rv.after + 1];
  for (size_t i = 0; i < nr; ++i) {
    waitersBegin_[i + 1] += waitersBegin_[i];
    afterBegin_[i + 1] += afterBegin_[i];
  }
  waiters_.resize(waitersBegin_[nr]);
  afterOf_.resize(afterBegin_[nr]);
  {
    std::vector<uint32_t> fill(waitersBegin_.begin(), waitersBegin_.end() - 1);
    for (uint32_t m = 0; m < nm; ++m)
      if (msgs_[m].waitRecv != kNone) waiters_[fill[msgs_[m].waitRecv]++] = m;
    fill.assign(afterBegin_.begin(), afterBegin_.end() - 1);
    for (uint32_t r = 0; r < nr; ++r)
      if (recvs_[r].after != kNone) afterOf_[fill[recvs_[r].after]++] = r;
  }

  SimResult res;
  res.algorithm = algorithm_;
  for (const Msg& m : msgs_) {
    ++res.messages;
    res.messageBytes += m.bytes;
    if (interNode(m)) {
      ++res.interNodeMessages;
      res.interNodeBytes += m.bytes;
    }
  }

  free_.assign(3 * static_cast<size_t>(n_) + 2 * static_cast<size_t>(nNodes_), 0.0);
  rankTime_.assign(n_, 0.0);
  heap_.clear();
  heap_.reserve(1024);
  // Local steps first (on the rank's CPU when computeGBs is set), then the
  // sends that wait on nothing.
  std::vector<double> localDone(n_, 0.0);
  for (int r = 0; r < n_; ++r) {
    if (cfg_.computeGBs > 0)
      localDone[r] = static_cast<double>(localBytes_[r]) / (cfg_.computeGBs * 1e3);
    free_[cpu(r)] = rankTime_[r] = localDone[r];
  }
  for (int r = 0; r < n_; ++r) {
    if (localDone[r] > 0) {
      push(localDone[r], kLocalDone, static_cast<uint32_t>(r));
    } else {
      for (uint32_t m = sendBegin_[r]; m < sendEnd_[r]; ++m)
        if (msgs_[m].waitRecv == kNone) sendReady(m, 0);
    }
  }
  while (!heap_.empty()) {
    std::pop_heap(heap_.begin(), heap_.end(), Later());
    const Event ev = heap_.back();
    heap_.pop_back();
    const uint32_t id = ev.code & (kMaxIds - 1);
    switch (static_cast<Kind>(ev.code >> 28)) {
      case kStage1:
        stage1(id, ev.t);
        break;
      case kStage2:
        stage2(id, ev.t);
        break;
      case kArrive:
        arrive(id, ev.t);
        break;
      case kRecvDone:
        recvDone(id, ev.t);
        break;
      case kLocalDone:
        for (uint32_t m = sendBegin_[id]; m < sendEnd_[id]; ++m)
          if (msgs_[m].waitRecv == kNone) sendReady(m, ev.t);
        break;
    }
  }
  if (nDone_ < nr) {
    uint32_t first = 0;
    while (recvs_[first].state & kDone) ++first;
    return internalError(fmt::format("deadlock: {} of {} receives never complete; {}", nr - nDone_,
                                     nr, explainStuck(first)));
  }
  res.rankTimeUs = rankTime_;
  for (double t : rankTime_) res.timeUs = std::max(res.timeUs, t);
  return res;
}

Status checkConfig(const SimConfig& cfg) {
  for (const algo::LinkModel* l : {&cfg.cost.intra, &cfg.cost.inter}) {
    if (!(l->bandwidthGBs > 0) || std::isinf(l->bandwidthGBs))
      return invalidArgument(fmt::format("link bandwidth {} GB/s: must be > 0", l->bandwidthGBs));
    if (!(l->latencyUs >= 0) || std::isinf(l->latencyUs))
      return invalidArgument(fmt::format("link latency {} us: must be >= 0", l->latencyUs));
  }
  for (double gbs : cfg.nodeInterGBs)
    if (std::isnan(gbs) || std::isinf(gbs))
      return invalidArgument(fmt::format("node NIC bandwidth {} GB/s: must be finite", gbs));
  if (!(cfg.computeGBs >= 0) || !(cfg.msgOverheadUs >= 0))
    return invalidArgument("computeGBs and msgOverheadUs must be >= 0");
  return Status::ok();
}

Status checkNodes(const algo::NodeMap* nodes, int nranks) {
  if (!nodes) return Status::ok();
  if (nodes->nodeOf.size() != static_cast<size_t>(nranks))
    return invalidArgument(
        fmt::format("node map covers {} ranks, not {}", nodes->nodeOf.size(), nranks));
  for (int v : nodes->nodeOf)
    if (v < 0 || v >= nranks) return invalidArgument(fmt::format("node index {} out of range", v));
  return Status::ok();
}

}  // namespace

algo::NodeMap makeNodeMap(const std::vector<int>& ranksPerNode) {
  std::vector<uint64_t> hostIds;
  for (size_t node = 0; node < ranksPerNode.size(); ++node)
    hostIds.insert(hostIds.end(), std::max(ranksPerNode[node], 0), node);
  return algo::NodeMap::fromHostIds(hostIds);
}

double busFactor(algo::Collective c, int nranks) {
  const double n = nranks;
  switch (c) {
    case algo::Collective::kAllReduce:
      return 2 * (n - 1) / n;
    case algo::Collective::kAllGather:
    case algo::Collective::kReduceScatter:
    case algo::Collective::kAllToAll:
    case algo::Collective::kGather:
    case algo::Collective::kScatter:
      return (n - 1) / n;
    default:
      return 1;
  }
}

size_t collSizeBytes(const algo::CollArgs& a) {
  const size_t b = a.count * a.elemSize;
  switch (a.coll) {
    case algo::Collective::kAllGather:
    case algo::Collective::kReduceScatter:
    case algo::Collective::kAllToAll:
    case algo::Collective::kGather:
    case algo::Collective::kScatter:
      return b * static_cast<size_t>(a.nranks);
    default:
      return b;
  }
}

std::string describeTag(uint64_t tag) {
  return fmt::format("{:#x} = phase {}, x {}, j {}", tag, tag >> 56, (tag >> 32) & 0xFFFFFF,
                     tag & 0xFFFFFFFFu);
}

Result<SimResult> simulate(const algo::CollArgs& a, const SimConfig& cfg) {
  TUTTI_RETURN_IF_ERROR(checkConfig(cfg));
  if (a.nranks < 1) return invalidArgument(fmt::format("nranks {}: must be >= 1", a.nranks));
  if (a.elemSize < 1) return invalidArgument("elemSize must be >= 1");
  if (a.chunkBytes < 1) return invalidArgument("chunkBytes must be >= 1");
  if (a.root < 0 || a.root >= a.nranks)
    return invalidArgument(fmt::format("root {} out of range ({} ranks)", a.root, a.nranks));
  TUTTI_RETURN_IF_ERROR(checkNodes(a.nodes, a.nranks));
  algo::CollArgs args = a;
  if (!args.cost) args.cost = &cfg.cost;
  Engine e(a.nranks, a.nodes, cfg);
  for (int r = 0; r < a.nranks; ++r) {
    args.rank = r;
    TUTTI_RETURN_IF_ERROR(e.addRank(r, algo::makeSchedule(args)));
  }
  TUTTI_ASSIGN_OR_RETURN(SimResult res, e.run());
  res.sizeBytes = collSizeBytes(a);
  if (res.timeUs > 0) {
    res.algBwGBs = static_cast<double>(res.sizeBytes) / (res.timeUs * 1e3);
    res.busBwGBs = res.algBwGBs * busFactor(a.coll, a.nranks);
  }
  return res;
}

Result<SimResult> simulateSchedules(const std::vector<algo::Schedule>& schedules,
                                    const algo::NodeMap* nodes, const SimConfig& cfg) {
  TUTTI_RETURN_IF_ERROR(checkConfig(cfg));
  const int n = static_cast<int>(schedules.size());
  if (n < 1) return invalidArgument("no schedules");
  TUTTI_RETURN_IF_ERROR(checkNodes(nodes, n));
  Engine e(n, nodes, cfg);
  for (int r = 0; r < n; ++r) TUTTI_RETURN_IF_ERROR(e.addRank(r, schedules[r]));
  return e.run();
}

}  // namespace tutti::sim
