#include "core/executor.h"

#include <poll.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <memory>
#include <string_view>
#include <thread>

#include "base/backoff.h"
#include "base/log.h"
#include "base/thread.h"
#include "transports/shm/doorbell.h"

namespace tutti::core {
namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kHdr = sizeof(MsgHeader);
Status abortedError() { return invalidUsage("communicator aborted"); }
// The longest sleep on a doorbell: stall checks and peer-death checks still
// run (every 100 ms); an abort rings the bell.
constexpr std::chrono::microseconds kBellSleep{1000};
// Messages of at most this many bytes on the wire travel on channel 0 only,
// so that a rank waiting for nothing but small messages from a peer waits on
// one socket (and can spin on its recv instead of on poll; see execute).
// Larger ones take whichever channel is free. 64 KiB, not 4: over loopback,
// 8-64 KiB all-reduces took 1.05-1.2x less time on one socket (2 and 4 ranks,
// docs/comparison.md), and one stream of 64 KiB is no bottleneck for a rank.
// A run lowers it to half the pipeline chunk (TUTTI_CHUNK_SIZE), so that the
// chunks of a pipelined collective still spread over the channels.
constexpr size_t kSmallMessageBytes = 64 << 10;

// A receive as its messages name it (core/wire_header.h).
using Key = RecvKey;

struct Out {
  int64_t send = -1;  // flat send index
  MsgHeader hdr{};
  const uint8_t* payload = nullptr;  // what goes on the wire: the source, or `wire`
  size_t payBytes = 0;
  size_t hdrSent = 0, paySent = 0;
  Clock::time_point nextStart{};  // throttling (tests)
  std::vector<uint8_t> wire;      // an encoded message
};

struct In {
  int64_t recv = -1;  // flat recv index
  size_t payGot = 0, reduced = 0;
  // Zero-copy reduce (transports with peek): an element split across the
  // ring's end is assembled here.
  uint8_t carry[16];
  size_t carryGot = 0;
};

struct PeerRun {
  int peer = -1;
  uint64_t sendSeq = 0;  // stamped on this operation's messages to the peer
  uint64_t recvSeq = 0;  // expected on this operation's messages from the peer
  std::deque<uint32_t> ready;
  size_t recvsLeft = 0, sendsLeft = 0;
  size_t bigRecvsLeft = 0;  // receives not channel0Only: they may come on any channel
  std::vector<Out> out;     // per channel
  std::vector<In> in;       // per channel
  // Channels whose peer closed them between two messages. That is not an
  // error by itself (the peer may have finished and left while its last
  // messages travel on other channels); it is one once no open channel is
  // left and receives are still pending.
  std::vector<uint8_t> closed;
  size_t nClosed = 0;
  // Socket channels receive only when poll() said they can (one poll per
  // pass instead of a failing recv per channel: syscalls are not free), but
  // for a lone socket (below). They send without asking: a socket's buffer
  // almost always has room, so polling for POLLOUT first would cost a system
  // call per message for nothing. Only a send cut short (the buffer full)
  // waits for POLLOUT.
  std::vector<int> fd;           // -1: not pollable (shared memory): always try
  std::vector<uint8_t> canRecv;  // set before each pass
  std::vector<uint8_t> canSend;
  std::vector<uint8_t> sendFull;  // the last send stopped short: wait for POLLOUT
  Status closedStatus;
  bool suspect = false;  // a liveness check failed at suspectSince
  Clock::time_point suspectSince{};

  // Ready for an operation with peer `q` over `channels` channels; keeps the
  // containers' memory (and each channel's encoding buffer) from the last one.
  void reset(int q, int channels) {
    peer = q;
    sendSeq = recvSeq = 0;
    ready.clear();
    recvsLeft = sendsLeft = bigRecvsLeft = 0;
    out.resize(channels);
    for (Out& o : out) {
      std::vector<uint8_t> keep = std::move(o.wire);
      o = Out();
      o.wire = std::move(keep);
    }
    in.assign(channels, In());
    closed.assign(channels, 0);
    nClosed = 0;
    fd.assign(channels, -1);
    canRecv.assign(channels, 1);
    canSend.assign(channels, 1);
    sendFull.assign(channels, 0);
    closedStatus = Status::ok();
    suspect = false;
    suspectSince = {};
  }
};

struct FlatRef {
  uint32_t inst, idx;
};

// One operation's progress over the schedules of one Work. A communicator
// keeps its Run between operations (Comm::executorCache) and reset() reuses
// its containers, so a repeated operation allocates nothing here.
class Run {
 public:
  // Ready for `w`: forgets the last operation's state (but not its memory).
  void reset(Work* w);
  // The peers this run exchanges messages with (they must be connected
  // before start()).
  const std::vector<int>& peerList() const { return peerList_; }
  Status start();
  // One pass over every connection; sets *progress when anything moved.
  // `alone`: this is the only run of its execute(), so a device-IPC
  // collective with nothing else left to do may wait blocking.
  Status pass(bool* progress, bool alone = false);
  bool done() const {
    return sendsLeft_ == 0 && recvsLeft_ == 0 && unsent_ == 0 && smallNext_ == w_->small.size() &&
           ipcNext_ == w_->ipc.size();
  }
  // The peer whose connection failed, when the last error came from one.
  int failedPeer() const { return failedPeer_; }
  // Whom this run waits for (Comm::noteWaiting): the peers it still expects
  // messages from, and those whose connection takes no more bytes. (A send
  // still to come that waits on a receive waits on the receive's peer.)
  void listWaiting(std::vector<int>* peers) const {
    for (const auto& p : peers_) {
      bool blocked = false;
      for (uint8_t full : p.sendFull) blocked = blocked || (p.sendsLeft && full);
      if (p.recvsLeft || blocked) peers->push_back(p.peer);
    }
  }
  // What this run waits for can ring this rank's doorbell: the communicator
  // has a node arena (shared-memory rings and one-shot steps both ring it).
  // (Not while a device-IPC collective runs: its barriers ring another
  // arena's bells, and its device work none.)
  bool sleepsOnBell() const { return c_->oneShot() != nullptr && ipcNext_ == w_->ipc.size(); }
  Status checkStalled(Clock::time_point lastProgress);
  // The run stops unfinished (an error anywhere in its group): device work a
  // device-IPC collective queued has run when this returns.
  void quiesce() {
    if (ipcStarted_) c_->deviceIpc()->quiesce(ipcRun_);
  }
  // Adds the sockets this run waits on; *unpollable when some pending
  // channel has no fd (shared memory) and must be polled by trying; *ready
  // when some channel holds bytes read ahead (poll without waiting).
  void preparePoll(std::vector<pollfd>* fds, std::vector<std::pair<PeerRun*, int>>* owners,
                   bool* unpollable, bool* ready);

 private:
  uint8_t* addr(uint32_t inst, const algo::Ref& r) const {
    if (r.buf == algo::Buf::kAbs) return reinterpret_cast<uint8_t*>(r.off);
    return w_->buffers[inst][static_cast<int>(r.buf)] + r.off;
  }
  Status progressSend(PeerRun& p, int ch, bool* progress);
  Status progressRecv(PeerRun& p, int ch, bool* progress);
  Status completeRecv(PeerRun& p, uint32_t flat);
  // Reduces straight out of the transport's receive buffer (no staging copy).
  Status reduceInPlace(PeerRun& p, Channel& chan, In& in, uint32_t inst,
                       const algo::Schedule& sched, const algo::RecvStep& r, bool* progress);
  Status unexpected(const PeerRun& p, const MsgHeader& h, const char* why);
  // The fingerprint of schedule `inst` (the planner gives every schedule
  // one; work without is taken for point to point).
  OpSig sigOf(uint32_t inst) const {
    return inst < w_->sigs.size() ? w_->sigs[inst] : p2pSig();
  }
  // Whether a message of `bytes` payload travels on channel 0 only
  // (kSmallMessageBytes); sender and receiver decide alike.
  bool channel0Only(const algo::Schedule& s, bool encoded, size_t bytes) const;
  // Records `p` as the peer whose connection failed (the root-cause lookup
  // starts there) and returns `st`, prefixed with `what` and the peer.
  Status peerFailure(const PeerRun& p, const Status& st, const char* what) {
    failedPeer_ = p.peer;
    return what ? st.withContext(what + c_->describePeer(p.peer)) : st;
  }

  Work* w_ = nullptr;
  Comm* c_ = nullptr;
  const HostKernels* k_ = nullptr;  // c_'s, for the reductions and codecs
  size_t smallBytes_ = 0;  // channel0Only's limit
  int sendChannels_ = 1;   // the channels messages leave on (Work::channels)
  std::vector<FlatRef> sends_, recvs_;
  // Per flat recv: the flat sends waiting for it. Sized to the largest
  // operation seen (waiters_[i] for i >= recvs_.size() are empty and unused).
  std::vector<std::vector<uint32_t>> waiters_;
  std::vector<uint8_t> recvDone_;                    // per flat recv
  std::vector<uint32_t> recvBase_;                   // per schedule: its first flat recv
  std::vector<std::pair<Key, uint32_t>> recvIndex_;  // sorted by key: flat recv
  std::vector<int> peerList_;
  std::vector<PeerRun> peers_;
  std::vector<int> slot_;  // rank -> index in peers_
  size_t sendsLeft_ = 0, recvsLeft_ = 0;
  // Connections that move bytes only when called (Connection::needsProgress):
  // (index in peers_, channel), driven every pass; unsent_ of them still
  // had messages in flight after the last pass.
  std::vector<std::pair<uint32_t, int>> driven_;
  size_t unsent_ = 0;
  size_t smallNext_ = 0;  // the one-shot operation in progress
  size_t ipcNext_ = 0;    // the device-IPC collective in progress
  bool ipcStarted_ = false;
  IpcRun ipcRun_;         // its state (DeviceIpc::start builds it afresh)
  int failedPeer_ = -1;
  Telemetry* tel_ = nullptr;  // c_'s, while this run's collective is measured
  std::vector<uint64_t> planned_;  // per peer (as peers_): payload bytes it will be sent
};

// A call as its fingerprint tells it, for errors: "AllReduce of 1024 x float32
// op sum (collective call 7)"; `algorithm`: the planned algorithm, when known
// (this rank's own call).
std::string describeSig(const OpSig& g, const char* algorithm) {
  const auto coll = static_cast<algo::Collective>(g.coll);
  if (coll == algo::Collective::kSend || coll == algo::Collective::kRecv)
    return "point-to-point operations";
  static const char* const kOps[] = {"sum", "prod", "max", "min", "avg", "premulsum"};
  std::string s = fmt::format("{} of {} x {}", algo::collectiveName(coll), g.count,
                              dataTypeName(static_cast<DataType>(g.dt)));
  if (g.op < 6) s += fmt::format(" op {}", kOps[g.op]);
  if (g.root >= 0) s += fmt::format(" root {}", g.root);
  s += fmt::format(" (collective call {}", g.call);
  if (algorithm) s += fmt::format(", {}", algorithm);
  return s + ")";
}

// Bytes a message of `bytes` payload occupies on the wire.
size_t wireSize(const HostKernels& k, const algo::Schedule& s, bool encoded, size_t bytes) {
  return encoded ? k.wireBytes(s.wire.format, bytes / sizeof(float)) : bytes;
}

bool Run::channel0Only(const algo::Schedule& s, bool encoded, size_t bytes) const {
  return wireSize(*k_, s, encoded, bytes) <= smallBytes_;
}

void runLocal(const HostKernels& k, const algo::LocalStep& st, uint8_t* dst, const uint8_t* src,
              uint8_t* err, const algo::Schedule& sched) {
  const algo::ReduceSpec& spec = sched.spec;
  size_t es = dataTypeSize(spec.dt);
  switch (st.kind) {
    case algo::LocalKind::kCopy:
      if (dst != src) memmove(dst, src, st.bytes);
      break;
    case algo::LocalKind::kScale:
      k.scale(dst, src, st.bytes / es, spec.dt, spec.scalar);
      break;
    case algo::LocalKind::kDivide:
      k.divide(dst, src, st.bytes / es, spec.dt, spec.divisor);
      break;
    case algo::LocalKind::kQuantize:
      k.quantize(sched.wire.format, sched.wire.exp, reinterpret_cast<const float*>(src), st.scale,
                 st.feedback ? reinterpret_cast<float*>(err) : nullptr, st.bytes / sizeof(float),
                 reinterpret_cast<float*>(dst));
      break;
  }
}

// dst = incoming (op) local, as the schedule's ReduceSpec says.
void combine(const HostKernels& k, const algo::ReduceSpec& spec, uint8_t* dst,
             const uint8_t* incoming, const uint8_t* local, size_t count) {
  if (spec.op == RedOp::kPreMulSum)
    k.preMulReduce(dst, incoming, local, count, spec.dt, spec.scalar);
  else
    k.reduce(dst, incoming, local, count, spec.dt, spec.op);
}

void Run::reset(Work* w) {
  w_ = w;
  c_ = w->comm;
  k_ = &c_->kernels();
  smallBytes_ = std::min(kSmallMessageBytes, c_->chunkBytes() / 2);
  sendChannels_ = w->channels > 0 ? std::min(w->channels, c_->nChannels()) : c_->nChannels();
  sends_.clear();
  recvs_.clear();
  for (size_t i = 0; i < recvDone_.size() && i < waiters_.size(); ++i) waiters_[i].clear();
  recvDone_.clear();
  recvBase_.clear();
  recvIndex_.clear();
  sendsLeft_ = recvsLeft_ = 0;
  driven_.clear();
  unsent_ = 0;
  smallNext_ = 0;
  ipcNext_ = 0;
  ipcStarted_ = false;
  failedPeer_ = -1;
  // The peers, in order of first appearance.
  slot_.assign(c_->nranks(), -1);
  peerList_.clear();
  for (auto& s : w_->schedules)
    for (int p : s.peers)
      if (slot_[p] < 0) {
        slot_[p] = static_cast<int>(peerList_.size());
        peerList_.push_back(p);
      }
  peers_.resize(peerList_.size());
}

Status Run::start() {
  for (size_t i = 0; i < peers_.size(); ++i) {
    PeerRun& p = peers_[i];
    p.reset(peerList_[i], c_->nChannels());
    for (int ch = 0; ch < c_->nChannels(); ++ch) {
      const auto& conn = c_->channel(p.peer, ch).conn;
      p.fd[ch] = conn->waitHint();
      if (conn->needsProgress()) driven_.emplace_back(static_cast<uint32_t>(i), ch);
    }
  }
  for (uint32_t i = 0; i < w_->schedules.size(); ++i) {
    const auto& s = w_->schedules[i];
    for (uint32_t k = 0; k < s.recvs.size(); ++k) {
      const auto& r = s.recvs[k];
      uint32_t flat = static_cast<uint32_t>(recvs_.size());
      recvs_.push_back({i, k});
      recvIndex_.push_back({Key{r.peer, i, r.tag}, flat});
      peers_[slot_[r.peer]].recvsLeft++;
      if (!channel0Only(s, r.encoded, r.bytes)) peers_[slot_[r.peer]].bigRecvsLeft++;
    }
  }
  std::sort(recvIndex_.begin(), recvIndex_.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  for (size_t i = 1; i < recvIndex_.size(); ++i)
    if (recvIndex_[i].first == recvIndex_[i - 1].first)
      return internalError("schedule has a duplicate receive tag");
  if (waiters_.size() < recvs_.size()) waiters_.resize(recvs_.size());
  recvDone_.assign(recvs_.size(), 0);
  uint32_t base = 0;
  for (auto& s : w_->schedules) {
    recvBase_.push_back(base);
    base += static_cast<uint32_t>(s.recvs.size());
  }
  for (uint32_t i = 0; i < w_->schedules.size(); ++i) {
    const auto& s = w_->schedules[i];
    for (const auto& st : s.local)
      runLocal(*k_, st, addr(i, st.dst), addr(i, st.src), st.feedback ? addr(i, st.err) : nullptr,
               s);
    for (uint32_t k = 0; k < s.sends.size(); ++k) {
      const auto& sd = s.sends[k];
      uint32_t flat = static_cast<uint32_t>(sends_.size());
      sends_.push_back({i, k});
      peers_[slot_[sd.peer]].sendsLeft++;
      if (sd.waitRecv < 0)
        peers_[slot_[sd.peer]].ready.push_back(flat);
      else
        waiters_[recvBase_[i] + sd.waitRecv].push_back(flat);
    }
  }
  sendsLeft_ = sends_.size();
  recvsLeft_ = recvs_.size();
  // Numbered per direction, and only in the directions this operation uses.
  for (auto& p : peers_) {
    if (p.sendsLeft) p.sendSeq = c_->nextSendSeq(p.peer);
    if (p.recvsLeft) p.recvSeq = c_->nextRecvSeq(p.peer);
  }
  // Telemetry measures collectives (schedules past the point-to-point one)
  // that exchange messages; it names the latest call among them.
  tel_ = nullptr;
  if (!peers_.empty() && w_->schedules.size() > 1 && w_->measured) {
    uint32_t call = 0;
    for (size_t i = 1; i < w_->sigs.size(); ++i) call = std::max(call, w_->sigs[i].call);
    tel_ = &c_->telemetry();
    tel_->begin(call, Clock::now());
    planned_.assign(peers_.size(), 0);  // what each link will carry
    for (const FlatRef& f : sends_) {
      const auto& sd = w_->schedules[f.inst].sends[f.idx];
      planned_[slot_[sd.peer]] += sd.bytes;
    }
    for (size_t i = 0; i < peers_.size(); ++i) tel_->willSend(peers_[i].peer, planned_[i]);
  }
  return Status::ok();
}

Status Run::unexpected(const PeerRun& p, const MsgHeader& h, const char* why) {
  // Both calls, when the message is of this operation's sequence and names
  // one of its schedules (else it belongs to no call of ours to compare).
  std::string calls;
  if (h.seq == p.recvSeq && h.inst < w_->schedules.size()) {
    const OpSig& mine = sigOf(h.inst);
    if (h.sig != mine) {
      calls = fmt::format(": {} called {} where rank {} called {}", c_->describePeer(p.peer),
                          describeSig(h.sig, nullptr), c_->rank(),
                          describeSig(mine, w_->schedules[h.inst].algorithm.c_str()));
      if (h.sig.coll == mine.coll && h.sig.count == mine.count && h.sig.dt == mine.dt &&
          h.sig.op == mine.op && h.sig.root == mine.root && h.sig.call == mine.call)
        calls += " (the same call, planned differently: are NCCL_ALGO and the TUTTI_ settings "
                 "the same on every rank?)";
    }
  }
  return invalidUsage(fmt::format(
      "{}{} from {} (message {}:{} of {} bytes){}: the ranks called collectives in a different "
      "order or with different counts, datatypes, ops or roots",
      calls.empty() || std::string_view(why) == "collective mismatch" ? "" : "collective mismatch: ",
      why, c_->describePeer(p.peer), h.inst, h.tag, h.bytes, calls));
}

Status Run::progressSend(PeerRun& p, int ch, bool* progress) {
  Out& o = p.out[ch];
  Channel& chan = c_->channel(p.peer, ch);
  for (;;) {
    if (c_->aborted()) return abortedError();
    if (c_->revoked()) return Comm::revokedError();
    if (o.send < 0) {
      if (p.ready.empty()) return Status::ok();
      if (ch >= sendChannels_) return Status::ok();
      if (ch != 0) {
        const auto& front = sends_[p.ready.front()];
        const auto& fs = w_->schedules[front.inst];
        const auto& fd = fs.sends[front.idx];
        // A small message waits for channel 0, where its receiver looks.
        if (channel0Only(fs, fd.encoded, fd.bytes)) return Status::ok();
      }
      if (ch == c_->throttledChannel()) {
        auto now = Clock::now();
        if (now < o.nextStart) return Status::ok();
        o.nextStart = now + std::chrono::microseconds(c_->throttleUs());
      }
      uint32_t flat = p.ready.front();
      p.ready.pop_front();
      const uint32_t inst = sends_[flat].inst;
      const auto& sched = w_->schedules[inst];
      const auto& sd = sched.sends[sends_[flat].idx];
      o.send = flat;
      o.payload = addr(inst, sd.src);
      o.payBytes = sd.bytes;
      if (sd.encoded) {
        // Encoded when it leaves, so encoding overlaps the other messages'
        // transfers (and error feedback sees the value at that moment).
        o.payBytes = wireSize(*k_, sched, true, sd.bytes);
        if (o.wire.size() < o.payBytes) o.wire.resize(o.payBytes);
        k_->encode(sched.wire.format, sched.wire.exp, reinterpret_cast<const float*>(o.payload),
                   sd.feedback ? reinterpret_cast<float*>(addr(inst, sd.err)) : nullptr,
                   sd.bytes / sizeof(float), o.wire.data());
        o.payload = o.wire.data();
      }
      o.hdr =
          MsgHeader{p.sendSeq, inst, static_cast<uint32_t>(o.payBytes), sd.tag, sigOf(inst), {}};
      if (tel_) o.hdr.gossip = tel_->stamp(Clock::now());
      o.hdrSent = o.paySent = 0;
    }
    if (o.hdrSent < kHdr) {
      // Header and payload together: one system call on sockets.
      auto n = chan.conn->trySend2(reinterpret_cast<const uint8_t*>(&o.hdr) + o.hdrSent,
                                   kHdr - o.hdrSent, o.payload, o.payBytes);
      if (!n) return peerFailure(p, n.status(), "sending to ");
      if (*n) *progress = true;
      size_t h = std::min(*n, kHdr - o.hdrSent);
      o.hdrSent += h;
      o.paySent += *n - h;
      if (o.hdrSent < kHdr || o.paySent < o.payBytes) {
        // Short: the connection took what it could.
        p.sendFull[ch] = 1;
        return Status::ok();
      }
    }
    if (o.paySent < o.payBytes) {
      auto n = chan.conn->trySend(o.payload + o.paySent, o.payBytes - o.paySent);
      if (!n) return peerFailure(p, n.status(), "sending to ");
      if (*n) *progress = true;
      o.paySent += *n;
      if (o.paySent < o.payBytes) {
        p.sendFull[ch] = 1;
        return Status::ok();
      }
    }
    chan.messagesSent++;
    chan.bytesSent += o.payBytes;
    if (tel_) tel_->onSent(p.peer, o.payBytes);
    const uint32_t inst = sends_[o.send].inst;
    if (inst < w_->wireBytes.size() && w_->wireBytes[inst]) *w_->wireBytes[inst] += o.payBytes;
    o.send = -1;
    p.sendsLeft--;
    sendsLeft_--;
    *progress = true;
  }
}

Status Run::completeRecv(PeerRun& p, uint32_t flat) {
  const auto& sched = w_->schedules[recvs_[flat].inst];
  const auto& r = sched.recvs[recvs_[flat].idx];
  if (r.quantize) {
    auto* dst = reinterpret_cast<float*>(addr(recvs_[flat].inst, r.dst));
    k_->quantize(sched.wire.format, sched.wire.exp, dst, r.postScale,
                 r.feedback ? reinterpret_cast<float*>(addr(recvs_[flat].inst, r.err)) : nullptr,
                 r.bytes / sizeof(float), dst);
  }
  if (r.finalize) {
    uint8_t* dst = addr(recvs_[flat].inst, r.dst);
    k_->divide(dst, dst, r.bytes / dataTypeSize(sched.spec.dt), sched.spec.dt, sched.spec.divisor);
  }
  p.recvsLeft--;
  if (!channel0Only(sched, r.encoded, r.bytes)) p.bigRecvsLeft--;
  recvsLeft_--;
  recvDone_[flat] = 1;
  for (uint32_t s : waiters_[flat]) {
    const auto& sd = w_->schedules[sends_[s].inst].sends[sends_[s].idx];
    peers_[slot_[sd.peer]].ready.push_back(s);
  }
  return Status::ok();
}

Status Run::reduceInPlace(PeerRun& p, Channel& chan, In& in, uint32_t inst,
                          const algo::Schedule& sched, const algo::RecvStep& r, bool* progress) {
  const size_t es = dataTypeSize(sched.spec.dt);
  uint8_t* dst = addr(inst, r.dst);
  const uint8_t* local = addr(inst, r.local);
  while (in.payGot < r.bytes) {
    size_t avail = 0;
    const uint8_t* src =
        in.carryGot ? nullptr : static_cast<const uint8_t*>(chan.conn->peek(&avail));
    size_t whole = std::min(avail, r.bytes - in.payGot) / es * es;
    if (src && whole) {
      combine(*k_, sched.spec, dst + in.payGot, src, local + in.payGot, whole / es);
      chan.conn->consume(whole);
      in.payGot += whole;
      *progress = true;
      continue;
    }
    // Less than one element is contiguous (the ring wraps inside it, or it is
    // still arriving): take it through tryRecv, which also reports a peer
    // that closed or died.
    auto n = chan.conn->tryRecv(in.carry + in.carryGot, es - in.carryGot);
    if (!n) return peerFailure(p, n.status(), "receiving from ");
    if (*n == 0) return Status::ok();
    *progress = true;
    in.carryGot += *n;
    if (in.carryGot == es) {
      combine(*k_, sched.spec, dst + in.payGot, in.carry, local + in.payGot, 1);
      in.payGot += es;
      in.carryGot = 0;
    }
  }
  return Status::ok();
}

Status Run::progressRecv(PeerRun& p, int ch, bool* progress) {
  In& in = p.in[ch];
  Channel& chan = c_->channel(p.peer, ch);
  RecvState& rx = chan.rx;
  for (;;) {
    if (c_->aborted()) return abortedError();
    if (c_->revoked()) return Comm::revokedError();
    if (!rx.haveHeader) {
      // Never read past this operation's last message: the peer may have
      // left already, and the next operation's bytes belong to the next run.
      if (p.closed[ch] || p.recvsLeft == 0) return Status::ok();
      auto n =
          chan.conn->tryRecv(reinterpret_cast<uint8_t*>(&rx.hdr) + rx.hdrGot, kHdr - rx.hdrGot);
      if (!n && rx.hdrGot == 0) {
        p.closed[ch] = 1;
        p.nClosed++;
        p.closedStatus = n.status().withContext("receiving from " + c_->describePeer(p.peer));
        if (p.nClosed == p.closed.size() && p.recvsLeft)
          return peerFailure(p, p.closedStatus, nullptr);
        return Status::ok();
      }
      if (!n) return peerFailure(p, n.status(), "receiving from ");
      if (*n) *progress = true;
      rx.hdrGot += *n;
      if (rx.hdrGot < kHdr) return Status::ok();
      rx.haveHeader = true;
      if (tel_ && rx.hdr.seq == p.recvSeq) tel_->onHeader(p.peer, rx.hdr.gossip, Clock::now());
    }
    if (in.recv < 0) {
      const HeaderVerdict v =
          classifyHeader(
              rx.hdr, p.peer, p.recvSeq, recvIndex_,
              [&](uint32_t flat) {
                const auto& s = w_->schedules[recvs_[flat].inst];
                const auto& rr = s.recvs[recvs_[flat].idx];
                return wireSize(*k_, s, rr.encoded, rr.bytes);
              },
              [&](uint32_t inst) { return sigOf(inst); });
      switch (v.kind) {
        case HeaderClass::kMatch:
          break;
        case HeaderClass::kLater:
          return Status::ok();  // a later operation's: park it
        case HeaderClass::kStale:
          return unexpected(p, rx.hdr, "stale message");
        case HeaderClass::kUnexpected:
          return unexpected(p, rx.hdr, "unexpected message");
        case HeaderClass::kSigMismatch:
          return unexpected(p, rx.hdr, "collective mismatch");
        case HeaderClass::kSizeMismatch:
          return unexpected(p, rx.hdr, "message size mismatch");
      }
      const uint32_t rinst = recvs_[v.flat].inst;
      const auto& r = w_->schedules[rinst].recvs[recvs_[v.flat].idx];
      const size_t expect = v.expectBytes;
      // Its `local` is still being produced by another receive: hold the
      // message (the channel waits; that receive comes from another peer).
      if (r.after >= 0 && !recvDone_[recvBase_[rinst] + r.after]) return Status::ok();
      in.recv = v.flat;
      in.payGot = in.reduced = in.carryGot = 0;
      const bool staged =
          r.encoded || (r.action == algo::RecvAction::kReduce && !chan.conn->supportsPeek());
      if (staged && chan.staging.size() < expect)
        chan.staging.resize(std::max(expect, c_->chunkBytes()));
    }
    const uint32_t inst = recvs_[in.recv].inst;
    const auto& sched = w_->schedules[inst];
    const auto& r = sched.recvs[recvs_[in.recv].idx];
    const size_t payBytes = wireSize(*k_, sched, r.encoded, r.bytes);
    if (r.action == algo::RecvAction::kReduce && !r.encoded && chan.conn->supportsPeek()) {
      TUTTI_RETURN_IF_ERROR(reduceInPlace(p, chan, in, inst, sched, r, progress));
    } else if (in.payGot < payBytes) {
      uint8_t* to = r.action == algo::RecvAction::kCopy && !r.encoded ? addr(inst, r.dst)
                                                                      : chan.staging.data();
      auto n = chan.conn->tryRecv(to + in.payGot, payBytes - in.payGot);
      if (!n) return peerFailure(p, n.status(), "receiving from ");
      if (*n) *progress = true;
      in.payGot += *n;
    }
    if (r.encoded) {
      if (in.payGot < payBytes) return Status::ok();
      // Decoded (and combined, in float32) once the whole message is here.
      const algo::Wire f = sched.wire.format;
      auto* dst = reinterpret_cast<float*>(addr(inst, r.dst));
      const size_t n = r.bytes / sizeof(float);
      if (r.action == algo::RecvAction::kCopy)
        k_->decode(f, sched.wire.exp, chan.staging.data(), n, dst);
      else
        k_->decodeAdd(
            f, sched.wire.exp, chan.staging.data(), n,
            reinterpret_cast<const float*>(addr(inst, r.local)),
            sched.spec.op == RedOp::kPreMulSum ? static_cast<float>(sched.spec.scalar) : 1.0f, dst);
    } else if (r.action == algo::RecvAction::kReduce && !chan.conn->supportsPeek()) {
      // Reduce whole elements as they arrive, so the reduction overlaps the transfer.
      const size_t es = dataTypeSize(sched.spec.dt);
      size_t upto = in.payGot / es * es;
      if (upto > in.reduced && (upto - in.reduced >= (64 << 10) || in.payGot == r.bytes)) {
        combine(*k_, sched.spec, addr(inst, r.dst) + in.reduced, chan.staging.data() + in.reduced,
                addr(inst, r.local) + in.reduced, (upto - in.reduced) / es);
        in.reduced = upto;
      }
    }
    if (in.payGot < payBytes) return Status::ok();
    uint32_t flat = static_cast<uint32_t>(in.recv);
    in.recv = -1;
    rx.haveHeader = false;
    rx.hdrGot = 0;
    *progress = true;
    TUTTI_RETURN_IF_ERROR(completeRecv(p, flat));
  }
}

Status Run::pass(bool* progress, bool alone) {
  // Every pass, not only when idle: an operation that keeps moving data would
  // otherwise run to its end after ncclCommAbort (one relaxed load). The
  // send and receive loops look again before each message: over TCP one pass
  // could move tens of MiB (up to 50 ms here between passes).
  if (c_->aborted()) return abortedError();
  if (c_->revoked()) return Comm::revokedError();
  while (smallNext_ < w_->small.size()) {
    OneShotOp& op = w_->small[smallNext_];
    TUTTI_RETURN_IF_ERROR(c_->oneShot()->progress(op, progress));
    if (!op.done) break;
    ++smallNext_;
  }
  while (ipcNext_ < w_->ipc.size()) {
    DeviceIpc& ipc = *c_->deviceIpc();
    if (!ipcStarted_) {
      TUTTI_RETURN_IF_ERROR(ipc.start(w_->ipc[ipcNext_], &ipcRun_));
      ipcStarted_ = true;
      *progress = true;
    }
    const bool block =
        alone && sendsLeft_ == 0 && recvsLeft_ == 0 && smallNext_ == w_->small.size();
    TUTTI_RETURN_IF_ERROR(ipc.progress(ipcRun_, progress, block));
    if (!ipcRun_.done) break;
    ++ipcNext_;
    ipcStarted_ = false;
  }
  for (auto& p : peers_) {
    if (p.sendsLeft == 0 && p.recvsLeft == 0) continue;
    for (int ch = 0; ch < c_->nChannels(); ++ch) {
      if (p.sendsLeft && p.canSend[ch]) TUTTI_RETURN_IF_ERROR(progressSend(p, ch, progress));
      if (p.recvsLeft && p.canRecv[ch]) TUTTI_RETURN_IF_ERROR(progressRecv(p, ch, progress));
    }
  }
  // After the sends: what this pass handed over is counted.
  const size_t unsentBefore = unsent_;
  unsent_ = 0;
  for (const auto& [slot, ch] : driven_) {
    PeerRun& p = peers_[slot];
    auto idle = c_->channel(p.peer, ch).conn->progress();
    if (!idle) return peerFailure(p, idle.status(), "sending to ");
    if (!*idle) ++unsent_;
  }
  if (unsent_ < unsentBefore) *progress = true;
  if (tel_ && done()) {
    tel_->end(Clock::now());
    tel_ = nullptr;
  }
  return Status::ok();
}

Status Run::checkStalled(Clock::time_point lastProgress) {
  // (An abort is seen by pass(), which runs before every stall check.)
  // A peer this run needs was aborted (the arena says so; read first: an
  // aborted peer's own executor may also have sent a notice), or gave up
  // (its notice came over the bootstrap): its messages will never come,
  // whatever the transport.
  for (const auto& p : peers_)
    if ((p.recvsLeft || p.sendsLeft) && c_->oneShot() && c_->oneShot()->peerAborted(p.peer))
      return c_->peerAbortedError(p.peer, " while this rank waited for it");
  for (const auto& p : peers_)
    if (p.recvsLeft || p.sendsLeft) TUTTI_RETURN_IF_ERROR(c_->noticeFrom(p.peer));
  // A peer that took the one-shot path for a call this run makes as a
  // schedule was given another count, on the other side of
  // TUTTI_ONESHOT_MAX: neither would ever hear from the other.
  if (c_->oneShot())
    for (const auto& p : peers_) {
      if (!p.recvsLeft && !p.sendsLeft) continue;
      for (size_t i = 0; i < w_->schedules.size() && i < w_->sigs.size(); ++i) {
        const OpSig& mine = w_->sigs[i];
        const auto coll = static_cast<algo::Collective>(mine.coll);
        if (coll == algo::Collective::kSend || coll == algo::Collective::kRecv) continue;
        if (auto theirs = c_->oneShot()->postedAsCall(p.peer, mine.call))
          return invalidUsage(fmt::format(
              "collective mismatch: {} called {} where rank {} called {}: the ranks called "
              "collectives with different counts (here on either side of the one-shot limit, "
              "TUTTI_ONESHOT_MAX, so they took different paths)",
              c_->describePeer(p.peer), *theirs, c_->rank(),
              describeSig(mine, w_->schedules[i].algorithm.c_str())));
      }
    }
  if (smallNext_ < w_->small.size())
    TUTTI_RETURN_IF_ERROR(c_->oneShot()->check(w_->small[smallNext_], Clock::now() - lastProgress));
  if (ipcStarted_)
    TUTTI_RETURN_IF_ERROR(c_->deviceIpc()->check(ipcRun_, Clock::now() - lastProgress));
  for (auto& p : peers_) {
    if (p.sendsLeft == 0 && p.recvsLeft == 0) continue;
    if (p.nClosed && p.recvsLeft) {
      // Some channel closed: the peer has left. Whatever is still in flight on
      // the open channels arrives within the stall check period; after that
      // the pending receives can never complete.
      if (Clock::now() - lastProgress > std::chrono::seconds(1))
        return peerFailure(p, p.closedStatus, nullptr);
    }
    // A peer that failed or left says so in the arena.
    if (c_->oneShot() && c_->oneShot()->peerGone(p.peer) &&
        Clock::now() - lastProgress > std::chrono::milliseconds(200))
      return peerFailure(
          p,
          remoteError(fmt::format("{} failed or destroyed its communicator while this rank "
                                  "waited for it",
                                  c_->describePeer(p.peer))),
          nullptr);
    // A failed liveness check is only a suspicion: a peer that finished and
    // closed may have left its last bytes in flight, and those are read
    // first. The suspicion becomes the error if nothing moves for a while.
    for (int ch = 0; ch < c_->nChannels(); ++ch) {
      if (p.closed[ch]) continue;
      Status st = c_->channel(p.peer, ch).conn->checkAlive();
      if (st) continue;
      auto now = Clock::now();
      if (!p.suspect || p.suspectSince < lastProgress) {
        p.suspect = true;
        p.suspectSince = now;
      } else if (now - p.suspectSince > std::chrono::milliseconds(500)) {
        return peerFailure(p, st, "");
      }
    }
  }
  double idle = std::chrono::duration<double>(Clock::now() - lastProgress).count();
  if (idle < c_->timeoutSec()) return Status::ok();
  std::string waiting;
  if (ipcNext_ < w_->ipc.size())
    waiting = fmt::format("a device-IPC {} (its device work or its peers)",
                          algo::collectiveName(w_->ipc[ipcNext_].coll));
  for (auto& p : peers_)
    if (p.recvsLeft || p.sendsLeft)
      waiting += fmt::format("{}{} ({} receives, {} sends pending)", waiting.empty() ? "" : "; ",
                             c_->describePeer(p.peer), p.recvsLeft, p.sendsLeft);
  if (unsent_)
    waiting += fmt::format("{}{} connection(s) whose last messages have not left",
                           waiting.empty() ? "" : "; ", unsent_);
  return remoteError(
      fmt::format("no progress for {:.0f} s (TUTTI_TIMEOUT) waiting on {}", idle, waiting));
}

void Run::preparePoll(std::vector<pollfd>* fds, std::vector<std::pair<PeerRun*, int>>* owners,
                      bool* unpollable, bool* ready) {
  if (smallNext_ < w_->small.size() || ipcNext_ < w_->ipc.size() || unsent_) *unpollable = true;
  for (auto& p : peers_) {
    if (p.sendsLeft == 0 && p.recvsLeft == 0) continue;
    for (int ch = 0; ch < c_->nChannels(); ++ch) {
      if (p.fd[ch] < 0) {
        if (!p.closed[ch]) *unpollable = true;
        continue;
      }
      short ev = 0;
      const Channel& chan = c_->channel(p.peer, ch);
      const RecvState& rx = chan.rx;
      bool parked = rx.haveHeader && rx.hdr.seq != p.recvSeq;  // a later operation's message
      // A message of this operation held back for a dependency: no poll
      // (its bytes are ready), but retried every pass.
      bool held = rx.haveHeader && !parked && p.in[ch].recv < 0;
      // Channels above 0 carry only messages that are not channel0Only.
      const bool wantRecv =
          p.recvsLeft && !p.closed[ch] && !parked && !held && (ch == 0 || p.bigRecvsLeft > 0);
      // Bytes the connection read ahead: a poll would not show them.
      const bool ahead = wantRecv && chan.conn->buffered();
      if (ahead) *ready = true;
      if (wantRecv && !ahead) ev |= POLLIN;
      const bool wantSend =
          p.sendsLeft && (p.out[ch].send >= 0 || (!p.ready.empty() && ch < sendChannels_));
      if (wantSend && p.sendFull[ch]) ev |= POLLOUT;
      p.canSend[ch] = wantSend && !p.sendFull[ch] ? 1 : 0;
      p.canRecv[ch] = held || ahead ? 1 : 0;
      if (!ev) continue;
      fds->push_back({p.fd[ch], ev, 0});
      owners->emplace_back(&p, ch);
    }
  }
}

// A run failed: find the root cause (a peer that gave up may have said why),
// tell the peers, and break the communicator.
Status fail(Run* run, Work* w, Status st) {
  if (run && run->failedPeer() >= 0) st = w->comm->explainPeerFailure(run->failedPeer(), st);
  w->comm->setError(st);
  w->comm->noticeFailure(st);
  return st;
}

// What execute() keeps between operations: each communicator's Run (in
// Comm::executorCache, used under the communicator's mutex), and per thread
// the containers of the progress loop, so a repeated operation allocates
// nothing in the executor.
struct LoopScratch {
  std::vector<Run*> runs;
  std::vector<Status> connected;
  std::vector<pollfd> fds;
  std::vector<std::pair<PeerRun*, int>> owners;
  std::vector<int> waiting;  // peers a stalled run waits for
  bool busy = false;
};

Run* cachedRun(Comm* c) {
  std::shared_ptr<void>& slot = c->executorCache();
  if (!slot) slot = std::make_shared<Run>();
  return static_cast<Run*>(slot.get());
}

}  // namespace

Status execute(std::vector<Work*>& work) {
  // Every Work is of its own communicator (a group's operations of one communicator share a
  // Work), so each may use its communicator's Run. A thread's loop containers serve one
  // execute() at a time; a nested one (none is known) gets its own.
  thread_local LoopScratch tls;
  LoopScratch own;
  LoopScratch& ls = tls.busy ? own : tls;
  ls.busy = true;
  struct Release {
    LoopScratch& ls;
    std::vector<Work*>& work;
    ~Release() {
      ls.busy = false;
      for (Work* w : work) w->comm->clearWaiting();
    }
  } release{ls, work};
  std::vector<Run*>& runs = ls.runs;
  runs.clear();
  std::vector<std::shared_ptr<Run>> extra;  // a second Work of one communicator (not expected)
  for (Work* w : work) {
    Run* r = cachedRun(w->comm);
    if (std::find(runs.begin(), runs.end(), r) != runs.end()) {
      extra.push_back(std::make_shared<Run>());
      r = extra.back().get();
    }
    r->reset(w);
    runs.push_back(r);
  }
  // Connections first. Communicators driven by this one thread (a group over
  // several ranks of one process) connect concurrently: one waiting for its
  // peer would otherwise wait for a rank this very thread has yet to drive.
  std::vector<Status>& connected = ls.connected;
  connected.assign(runs.size(), Status::ok());
  if (runs.size() == 1) {
    connected[0] = work[0]->comm->ensureConnected(runs[0]->peerList());
  } else {
    // What a connect thread throws, or a thread that cannot be started,
    // becomes that communicator's connect error (base::startThread). Joined at the
    // end of the scope, also when an exception leaves it.
    struct JoinAll {
      std::vector<std::thread> v;
      ~JoinAll() {
        for (auto& t : v) t.join();
      }
    } threads;
    threads.v.reserve(runs.size());
    for (size_t i = 0; i < runs.size(); ++i) {
      auto t = base::startThread(
          "connect", fmt::format("connect thread of rank {}", work[i]->comm->rank()),
          [&, i] { return work[i]->comm->ensureConnected(runs[i]->peerList()); },
          [&, i](Status st) { connected[i] = std::move(st); });
      if (t)
        threads.v.push_back(std::move(t.value()));
      else
        connected[i] = t.status();
    }
  }
  // One failure ends the whole group: the other communicators' operations
  // stop half-way, so they are broken too (and say why).
  auto failGroup = [&](size_t i, Status st) {
    for (Run* r : runs) r->quiesce();
    st = fail(runs[i], work[i], st);
    for (size_t k = 0; k < runs.size(); ++k)
      if (k != i && !runs[k]->done() && work[k]->comm != work[i]->comm)
        (void)fail(
            nullptr, work[k],
            Status(st.code(), "another communicator of the same group failed: " + st.message()));
    return st;
  };
  for (size_t i = 0; i < runs.size(); ++i) {
    Status st = connected[i];
    if (st) st = runs[i]->start();
    if (!st) return failGroup(i, st);
  }
  auto lastProgress = Clock::now();
  auto lastCheck = lastProgress;
  bool oversubscribed = false;
  for (Work* w : work) oversubscribed = oversubscribed || w->comm->oversubscribed();
  base::Backoff backoff(oversubscribed);
  bool progress = true;
  std::vector<pollfd>& fds = ls.fds;
  std::vector<std::pair<PeerRun*, int>>& owners = ls.owners;
  for (;;) {
    // Which sockets can move bytes: without waiting after progress, while
    // shared-memory channels must be spun on, or while the backoff spins
    // (one poll per pause of its spin phase, about a thousand: 0.5-3 ms with
    // the system calls; only when every local rank has a core, as each try
    // takes the core a peer needs); else sleeping up to 1 ms until a socket
    // is ready. Waking from a sleeping poll() costs a
    // context switch per message: measured side by side, spinning made TCP
    // all-reduce on 2 ranks 1.25-1.45x faster at 512 KiB-2 MiB. Polling
    // through the yield phase as well (sched_yield between polls) made 4
    // ranks on 2 cores 1.3-1.7x faster at 512 KiB-8 MiB on an idle machine,
    // but 4-10x slower for small messages once other processes competed for
    // the cores (a yielding rank hands its core to whoever runs next, for a
    // whole time slice; a sleeping one is woken when its data arrives): not
    // done.
    const bool spin = !oversubscribed && !backoff.pastSpin();
    fds.clear();
    owners.clear();
    bool unpollable = false, ready = false;
    for (auto& r : runs)
      if (!r->done()) r->preparePoll(&fds, &owners, &unpollable, &ready);
    const bool noWait = progress || unpollable || spin || ready;
    if (noWait && fds.size() == 1 && fds[0].events == POLLIN) {
      // One socket to receive from, and no sleep: its recv answers what a
      // poll would, and on success it has the bytes, one system call fewer
      // per message (each costs about 1 us on a VM).
      owners[0].first->canRecv[owners[0].second] = 1;
    } else if (!fds.empty()) {
      int rc = ::poll(fds.data(), fds.size(), noWait ? 0 : 1);
      if (rc > 0) {
        for (size_t k = 0; k < fds.size(); ++k) {
          short re = fds[k].revents;
          PeerRun* p = owners[k].first;
          int ch = owners[k].second;
          // |=: a receive known possible without the poll (held, read
          // ahead) stays possible when the socket is polled for sending.
          p->canRecv[ch] |= (re & (POLLIN | POLLERR | POLLHUP)) != 0;
          if (re & (POLLOUT | POLLERR | POLLHUP)) {
            p->canSend[ch] = 1;
            p->sendFull[ch] = 0;
          }
        }
      }
    }
    progress = false;
    bool allDone = true;
    for (size_t i = 0; i < runs.size(); ++i) {
      if (runs[i]->done()) continue;
      Status st = runs[i]->pass(&progress, runs.size() == 1);
      if (!st) return failGroup(i, st);
      if (!runs[i]->done()) allDone = false;
    }
    if (allDone) return Status::ok();
    auto now = Clock::now();
    if (progress) {
      lastProgress = now;
      backoff.progress();
      continue;
    }
    // The stall check every 100 ms, or at once when a peer on this host says
    // in the arena that it is gone (a few loads, every 16 idle passes).
    bool peerGone = false;
    if (backoff.pastSpin() && (backoff.idleIters() & 15) == 0)
      for (Work* w : work)
        peerGone = peerGone || (w->comm->oneShot() && w->comm->oneShot()->anyPeerGone());
    if (peerGone || now - lastCheck > std::chrono::milliseconds(100)) {
      lastCheck = now;
      for (size_t i = 0; i < runs.size(); ++i) {
        if (runs[i]->done()) continue;
        Status st = runs[i]->checkStalled(lastProgress);
        if (!st) return failGroup(i, st);
        std::vector<int>& waiting = ls.waiting;
        waiting.clear();
        runs[i]->listWaiting(&waiting);
        if (!waiting.empty()) work[i]->comm->noteWaiting(waiting);
      }
    }
    if (!unpollable) {
      if (spin) backoff.idle();  // a pause; counts the spin phase down
      continue;
    }
    // Shared memory: spin briefly, then yield the core, then sleep on this
    // rank's doorbell until a peer has moved bytes for it (at most
    // kBellSleep), so ranks that outnumber cores still progress and a long
    // wait costs no wake-ups. Without a doorbell to sleep on (no node arena,
    // sockets to poll too, several communicators on this thread), nap
    // instead.
    if (backoff.napping() && fds.empty() && runs.size() == 1 && runs[0]->sleepsOnBell()) {
      bool moved = false;
      Status st;
      transport::shm::sleep(work[0]->comm->oneShot()->bell(work[0]->comm->rank()), kBellSleep, [&] {
        st = runs[0]->pass(&moved);  // the last look, after announcing
        return st && !moved && !runs[0]->done();
      });
      if (!st) return failGroup(0, st);
      progress = moved;
      continue;
    }
    backoff.idle();
  }
}

}  // namespace tutti::core
