#include "core/compressor.h"

#include <algorithm>
#include <cstring>

#include "base/log.h"
#include "base/params.h"
#include "base/tsan.h"
#include "compress/powersgd.h"
#include "compress/wire.h"
#include "core/comm.h"
#include "core/engine.h"
#include "core/group.h"
#include "nccl.h"
#include "transports/shm/cma.h"
#include "transports/shm/shared_region.h"

namespace tutti::core {

namespace {

// The API call compressor errors and log lines name.
constexpr const char* kFn = "tuttiAllReduceCompressed";

// Bytes of the rows of a rows x cols matrix that node member `index` of `count` stages for the
// others: every row but its own share, in order.
size_t stageBytes(size_t rows, size_t cols, int index, int count) {
  const auto [r0, r1] = compress::shareRows(rows, index, count);
  return (rows - (r1 - r0)) * cols * sizeof(float);
}

// Where byte `offset` of member `index`'s input (a row outside its share) sits in its stage.
size_t stageOffset(size_t offset, size_t rows, size_t cols, int index, int count) {
  const auto [r0, r1] = compress::shareRows(rows, index, count);
  const size_t rowBytes = cols * sizeof(float);
  return offset / rowBytes < r0 ? offset : offset - (r1 - r0) * rowBytes;
}

}  // namespace

struct Compressor::Tensor {
  size_t count = 0, rows = 0, cols = 0;
  std::vector<float> residual;  // 1-bit: worker then server residuals
  std::unique_ptr<compress::PowerSgdState> powerSgd;
};

const char* Compressor::kindName(int kind) {
  switch (kind) {
    case tuttiCompressNone:
      return "none";
    case tuttiCompressFp16:
      return "fp16";
    case tuttiCompressBf16:
      return "bf16";
    case tuttiCompressOneBit:
      return "1-bit";
    case tuttiCompressPowerSGD:
      return "PowerSGD";
  }
  return "?";
}

Result<Compressor::Settings> Compressor::resolve(const tuttiCompressionConfig_t& in) {
  Settings s{TUTTI_COMPRESSION_CONFIG_INITIALIZER, false};
  tuttiCompressionConfig_t& d = s.cfg;
  memcpy(&d, &in, std::min(in.size, sizeof(d)));
  d.size = sizeof(d);
  int kind;  // as the caller's int: loading an out-of-range enum is undefined
  memcpy(&kind, &d.kind, sizeof(kind));
  if (kind < tuttiCompressNone || kind > tuttiCompressPowerSGD)
    return invalidArgument(fmt::format("unknown compression kind {}", kind));
  if (d.errorFeedback < -1 || d.errorFeedback > 1)
    return invalidArgument(fmt::format("errorFeedback {} (must be -1, 0 or 1)", d.errorFeedback));
  const bool stateful = kind == tuttiCompressOneBit || kind == tuttiCompressPowerSGD;
  s.feedback = d.errorFeedback == -1 ? stateful : d.errorFeedback == 1;
  if (s.feedback && !stateful)
    return invalidArgument(
        fmt::format("error feedback is offered for 1-bit and PowerSGD, not {}", kindName(kind)));
  if (kind == tuttiCompressPowerSGD) {
    if (d.powerSgdRank < 1)
      return invalidArgument(fmt::format("powerSgdRank {} (must be >= 1)", d.powerSgdRank));
    if (!(d.epsilon >= 0)) return invalidArgument("epsilon must be >= 0");
    if (!(d.minCompressionRate >= 0)) return invalidArgument("minCompressionRate must be >= 0");
    if (d.warmStart != 0 && d.warmStart != 1)
      return invalidArgument(fmt::format("warmStart {} (must be 0 or 1)", d.warmStart));
  }
  return s;
}

Compressor::Compressor(Comm* comm, const Settings& settings)
    : comm_(comm), cfg_(settings.cfg), feedback_(settings.feedback) {}

Compressor::~Compressor() = default;

tuttiCompressionStats_t Compressor::stats() const {
  comm_->drainEngine();  // calls still queued there update the counters
  tuttiCompressionStats_t s = stats_;
  s.wireBytesSent = wireBytes_;
  return s;
}

const std::vector<float>* Compressor::residual(unsigned long long key) const {
  comm_->drainEngine();
  auto it = tensors_.find(key);
  if (it == tensors_.end()) return nullptr;
  const Tensor& t = *it->second;
  if (t.powerSgd) {
    const std::vector<float>& res = t.powerSgd->residual();
    return res.empty() ? nullptr : &res;
  }
  return t.residual.empty() ? nullptr : &t.residual;
}

Status Compressor::sum(const void* send, void* recv, size_t count, int dt, int op,
                       const Compressed& c, Queue stream) {
  TUTTI_RETURN_IF_ERROR(comm_->usable());
  Op o;
  o.comm = comm_;
  o.coll = algo::Collective::kAllReduce;
  o.send = send;
  o.recv = recv;
  o.count = count;
  o.dt = dt;
  o.op = op;
  o.stream = stream;
  o.call = comm_->nextCollectiveCall();
  o.rec = comm_->recorder().record(o);
  o.compress(c);
  return runOne(o).status;
}

// Whether PowerSGD's states share one residual per node: every rank must be able to read the
// inputs of the others on its node. Decided by all ranks together at the first PowerSGD state
// of a compressor (each reads a canary from every node member; one refusal anywhere keeps
// residuals per rank everywhere). TUTTI_POWERSGD_NODE_FEEDBACK=0 on any rank turns it off;
// matrices below TUTTI_POWERSGD_SHARE_MIN_BYTES (the largest any rank asks for) keep their
// residuals per rank: sharing costs one more small all-reduce per call (the input addresses),
// which only pays for itself on matrices of megabytes.
Status Compressor::decideNodeShare(const Compressed& exact) {
  namespace cma = transport::shm::cma;
  if (nodeShare_ >= 0) return Status::ok();
  const int n = comm_->nranks(), me = comm_->rank();
  const algo::NodeMap& map = comm_->nodeMap();
  const std::vector<int>& node = map.nodes[map.nodeOf[me]];
  if (map.maxPerNode() <= 1) {  // every rank knows: nothing to share anywhere
    nodeShare_ = 0;
    return Status::ok();
  }
  // A rank alone on its node has nothing to share and nothing against it.
  const bool want = feedback_ && params::getBool("TUTTI_POWERSGD_NODE_FEEDBACK", true);
  if (want && node.size() > 1) cma::allowPeerReads();
  // Lives until every rank has probed it (they all have once the second all-reduce is done).
  const uint64_t canary =
      cma::processToken() ^ reinterpret_cast<uintptr_t>(&canary) ^ comm_->commHash();
  constexpr int kFields = 4;  // process token, canary address, canary value, minimum bytes
  std::vector<uint64_t> rec(kFields * static_cast<size_t>(n), 0);
  uint64_t* mine = &rec[kFields * me];
  mine[0] = cma::processToken();
  mine[1] = reinterpret_cast<uintptr_t>(&canary);
  mine[2] = canary;
  mine[3] = static_cast<uint64_t>(
      std::max<int64_t>(0, params::getInt("TUTTI_POWERSGD_SHARE_MIN_BYTES", 4 << 20)));
  base::tsanRelease(&canary);  // peers in this process read it directly (base/tsan.h)
  TUTTI_RETURN_IF_ERROR(
      sum(rec.data(), rec.data(), rec.size(), ncclUint64, ncclSum, exact, nullptr));
  int32_t ok = want ? 1 : 0;
  std::string why = want ? "" : feedback_ ? "TUTTI_POWERSGD_NODE_FEEDBACK=0" : "no error feedback";
  for (int q : node) {
    if (q == me || !ok) continue;
    uint64_t seen = 0;
    const uint64_t* theirs = &rec[kFields * q];
    const auto* addr = reinterpret_cast<const void*>(theirs[1]);
    Status st = cma::readPeer(static_cast<pid_t>(comm_->peer(q).pid), theirs[0] == mine[0], addr, 0,
                              &seen, sizeof(seen));
    if (!st || seen != theirs[2]) {
      ok = 0;
      why = st ? "read a wrong value from " + comm_->describePeer(q) : st.message();
    }
  }
  Status st = sum(&ok, &ok, 1, ncclInt32, ncclMin, exact, nullptr);
  base::tsanAcquire(&canary);  // every reader is done with it
  TUTTI_RETURN_IF_ERROR(st);
  nodeShare_ = ok;
  nodeRanks_ = node;
  nodeIndex_ = static_cast<int>(std::find(node.begin(), node.end(), me) - node.begin());
  tokens_.resize(n);
  shareMinBytes_ = 0;
  for (int q = 0; q < n; ++q) {
    tokens_[q] = rec[kFields * q];
    shareMinBytes_ = std::max(shareMinBytes_, rec[kFields * q + 3]);
  }
  if (ok && node.size() > 1)
    TUTTI_INFO(log::kColl,
               "{}: PowerSGD keeps one residual per node for matrices of {} bytes and more, "
               "shared by its ranks ({} here)",
               kFn, shareMinBytes_, node.size());
  else if (feedback_)
    TUTTI_INFO(log::kColl, "{}: PowerSGD keeps a residual per rank ({})", kFn,
               why.empty() ? "a rank elsewhere cannot share" : why);
  return Status::ok();
}

// Sets up (or grows) the shared-memory stages for a new rows x cols shared PowerSGD state:
// each call, every rank with node members in other processes copies the rows they read into
// its stage, and they read it there instead of with cross-memory attach, which pins and walks
// the owner's pages on every call (measured on 2 nodes x 2 ranks: 15 ms of a 51 ms call).
// Collective: every rank runs it at the same state creations (sharing is agreed), with two
// small all-reduces. A failure anywhere, or TUTTI_POWERSGD_STAGING=0 on any rank, turns the
// stages off on every rank for good; the reads then go through cross-memory attach.
Status Compressor::prepareStaging(const Compressed& exact, size_t rows, size_t cols) {
  using transport::shm::SharedRegion;
  if (staging_ == 0) return Status::ok();
  const int n = comm_->nranks(), me = comm_->rank(), k = static_cast<int>(nodeRanks_.size());
  bool elsewhere = false;  // a node member in another process
  for (int q : nodeRanks_) elsewhere |= tokens_[q] != tokens_[me];
  constexpr int kNameWords = 8, kFields = kNameWords + 1;  // name, then its size in bytes
  std::vector<uint64_t> rec(kFields * static_cast<size_t>(n), 0);
  int32_t ok = params::getBool("TUTTI_POWERSGD_STAGING", true) ? 1 : 0;
  std::string why = ok ? "" : "TUTTI_POWERSGD_STAGING=0";
  const size_t need = stageBytes(rows, cols, nodeIndex_, k);
  std::unique_ptr<SharedRegion> fresh;
  if (ok && elsewhere && (!ownStage_ || ownStage_->size() < need)) {
    auto r = SharedRegion::create(SharedRegion::makeName(comm_->commHash(), "psgd", me), need);
    if (r) {
      fresh = std::move(r.value());
    } else {
      ok = 0;
      why = r.status().message();
    }
  }
  SharedRegion* mine = fresh ? fresh.get() : ownStage_.get();
  if (ok && mine) {
    const std::string& name = mine->name();
    std::memcpy(&rec[kFields * me], name.data(), std::min<size_t>(name.size(), kNameWords * 8 - 1));
    rec[kFields * me + kNameWords] = mine->size();
  }
  TUTTI_RETURN_IF_ERROR(
      sum(rec.data(), rec.data(), rec.size(), ncclUint64, ncclSum, exact, nullptr));
  std::vector<std::unique_ptr<SharedRegion>> opened(k);
  for (int m = 0; m < k && ok; ++m) {
    const int q = nodeRanks_[m];
    if (q == me || tokens_[q] == tokens_[me]) continue;
    char name[kNameWords * 8];
    std::memcpy(name, &rec[kFields * q], sizeof(name));
    name[sizeof(name) - 1] = '\0';
    const size_t bytes = rec[kFields * q + kNameWords];
    if (memberStage_.size() == static_cast<size_t>(k) && memberStage_[m] &&
        memberStage_[m]->name() == name)
      continue;  // already mapped
    auto r = SharedRegion::open(name, bytes);
    if (!r || bytes < stageBytes(rows, cols, m, k)) {
      ok = 0;
      why = r ? comm_->describePeer(q) + "'s stage is smaller than this matrix needs"
              : r.status().withContext(comm_->describePeer(q)).message();
      break;
    }
    opened[m] = std::move(r.value());
  }
  Status st = sum(&ok, &ok, 1, ncclInt32, ncclMin, exact, nullptr);
  if (fresh) fresh->unlink();  // every reader has opened it (or given up)
  TUTTI_RETURN_IF_ERROR(st);
  if (!ok) {
    if (staging_ != 0)
      TUTTI_INFO(log::kColl,
                 "{}: PowerSGD node members read each other's inputs with cross-memory attach ({})",
                 kFn, why.empty() ? "a rank elsewhere could not set up shared memory" : why);
    staging_ = 0;
    ownStage_.reset();
    memberStage_.clear();
    return Status::ok();
  }
  if (staging_ != 1 && elsewhere)
    TUTTI_INFO(log::kColl,
               "{}: PowerSGD node members read each other's inputs through shared memory", kFn);
  staging_ = 1;
  if (fresh) ownStage_ = std::move(fresh);
  memberStage_.resize(k);
  for (int m = 0; m < k; ++m)
    if (opened[m]) memberStage_[m] = std::move(opened[m]);
  return Status::ok();
}

Status Compressor::runPowerSgd(Tensor& t, const void* send, void* recv, size_t count, bool average,
                               unsigned long long key, size_t rows, size_t cols, Queue stream,
                               const Compressed& exact) {
  if (!t.powerSgd) {
    compress::PowerSgdConfig pc;
    pc.rank = cfg_.powerSgdRank;
    pc.seed = cfg_.seed;
    pc.epsilon = cfg_.epsilon;
    pc.warmStart = cfg_.warmStart == 1;
    pc.feedback = feedback_;
    TUTTI_RETURN_IF_ERROR(decideNodeShare(exact));
    compress::NodeShare share;
    if (nodeShare_ == 1 && count * sizeof(float) >= shareMinBytes_)
      share = {nodeIndex_, static_cast<int>(nodeRanks_.size()), true};
    t.powerSgd = std::make_unique<compress::PowerSgdState>(rows, cols, pc, key, share);
    if (share.on) TUTTI_RETURN_IF_ERROR(prepareStaging(exact, rows, cols));
  }
  // PowerSGD's matrix work runs on the host: device buffers are copied to host memory and the
  // result back, in the order of the caller's stream (the exact sums in between run on host
  // memory). Host buffers still wait for the stream: earlier device work may write them.
  const float* in = static_cast<const float*>(send);
  float* out = static_cast<float*>(recv);
  std::vector<float> hostIn, hostOut;
  Backend& be = comm_->backend();
  const bool device = be.isDevice(send) || be.isDevice(recv);
  Status st;
  if (device) {
    hostIn.resize(count);
    hostOut.resize(count);
    st = be.copyAsync(hostIn.data(), send, count * sizeof(float), stream);
    in = hostIn.data();
    out = hostOut.data();
  }
  if (st && !be.hostOnly()) st = be.sync(stream);
  TUTTI_RETURN_IF_ERROR(st.withContext(kFn));
  compress::PowerSgdState::ReadInput read;
  if (t.powerSgd->shared()) {
    // Where each rank's input is this call (node members read their rows of it; every rank
    // takes part, also one alone on its node).
    const int k = static_cast<int>(nodeRanks_.size());
    if (staging_ == 1 && ownStage_) {
      // The rows the node's other members read: all but this rank's share, in order. They
      // read them after the all-reduce below and are done before the first sum completes
      // (compress/powersgd.h), so the next call may overwrite them.
      const auto [r0, r1] = compress::shareRows(rows, nodeIndex_, k);
      const size_t rowBytes = cols * sizeof(float);
      uint8_t* stage = ownStage_->data();
      std::memcpy(stage, in, r0 * rowBytes);
      std::memcpy(stage + r0 * rowBytes, in + r1 * cols, (rows - r1) * rowBytes);
    }
    inputs_.assign(comm_->nranks(), 0);
    inputs_[comm_->rank()] = reinterpret_cast<uintptr_t>(in);
    base::tsanRelease(in);  // node members in this process read it (base/tsan.h)
    TUTTI_RETURN_IF_ERROR(
        sum(inputs_.data(), inputs_.data(), inputs_.size(), ncclUint64, ncclSum, exact, nullptr));
    read = [this, rows, cols, k](int member, size_t offset, void* dst, size_t bytes) {
      const int q = nodeRanks_[member];
      if (staging_ == 1 && memberStage_[member]) {
        const transport::shm::SharedRegion& stage = *memberStage_[member];
        const size_t at = stageOffset(offset, rows, cols, member, k);
        if (at + bytes > stage.size())
          return internalError(
              fmt::format("PowerSGD: bytes {}-{} of {}'s input are outside its stage ({} bytes)",
                          offset, offset + bytes, comm_->describePeer(q), stage.size()));
        std::memcpy(dst, stage.data() + at, bytes);
        return Status::ok();
      }
      Status rs = transport::shm::cma::readPeer(
          static_cast<pid_t>(comm_->peer(q).pid), tokens_[q] == tokens_[comm_->rank()],
          reinterpret_cast<const void*>(inputs_[q]), offset, dst, bytes);
      return rs ? rs : rs.withContext(comm_->describePeer(q));
    };
  }
  // Once a sum is done the node members have read `in` (base/tsan.h; a no-op otherwise).
  auto sumThenAcquire = [&](float* data, size_t n) {
    Status done = sum(data, data, n, ncclFloat32, ncclSum, exact, nullptr);
    base::tsanAcquire(in);
    return done;
  };
  st = t.powerSgd->run(in, out, average, comm_->nranks(), sumThenAcquire, read);
  if (st && device) st = be.copyAsync(recv, out, count * sizeof(float), stream);
  if (st && device) st = be.sync(stream);
  return st;
}

Status Compressor::allReduce(const void* send, void* recv, size_t count, int op,
                             unsigned long long key, size_t rows, size_t cols, Queue stream) {
  const int kind = cfg_.kind;
  std::unique_ptr<Tensor>& slot = tensors_[key];
  if (!slot) slot = std::make_unique<Tensor>();
  Tensor& t = *slot;
  t.count = count;
  t.rows = rows;
  t.cols = cols;
  stats_.calls++;
  stats_.payloadBytes += count * sizeof(float);
  Compressed exact;
  exact.wireBytes = &wireBytes_;
  auto runExact = [&] {
    stats_.exactCalls++;
    return sum(send, recv, count, ncclFloat32, op, exact, stream);
  };
  if (kind == tuttiCompressNone || count * sizeof(float) < cfg_.minBytes || count == 0)
    return runExact();
  if (kind == tuttiCompressPowerSGD) {
    const int r = cfg_.powerSgdRank;
    if (compress::powerSgdRate(rows, cols, r) < cfg_.minCompressionRate ||
        std::min(rows, cols) <= static_cast<size_t>(r))
      return runExact();
    return runPowerSgd(t, send, recv, count, op == ncclAvg, key, rows, cols, stream, exact);
  }
  Compressed z;
  z.wireBytes = &wireBytes_;
  if (kind == tuttiCompressOneBit) {
    z.wire.format = algo::Wire::kSign;
    if (t.residual.empty())
      t.residual.assign(compress::signStateFloats(count, comm_->nranks(), comm_->rank()), 0.0f);
    // Without feedback the residuals are cleared before every call.
    if (!feedback_) std::fill(t.residual.begin(), t.residual.end(), 0.0f);
    z.state = t.residual.data();
  } else {
    z.wire.format = kind == tuttiCompressFp16 ? algo::Wire::kHalf : algo::Wire::kBf16;
  }
  return sum(send, recv, count, ncclFloat32, op, z, stream);
}

Status Compressor::submit(const void* send, void* recv, size_t count, int op,
                          unsigned long long key, size_t rows, size_t cols, Queue stream,
                          bool* inProgress) {
  *inProgress = false;
  if (cfg_.kind == tuttiCompressPowerSGD && count > 0 &&
      (rows == 0 || cols == 0 || rows > count || cols > count || rows * cols != count))
    return invalidArgument(
        fmt::format("{}: PowerSGD needs the matrix shape: rows {} x cols {} must equal count {}",
                    kFn, rows, cols, count));
  // The shape a key was first used with, checked before anything is queued.
  // (A key used only with count 0 so far has no shape yet.)
  auto [it, fresh] = shapes_.try_emplace(key, Shape{count, rows, cols});
  if (it->second.count == 0) it->second = Shape{count, rows, cols};
  const Shape& was = it->second;
  if (!fresh && (was.count != count ||
                 (cfg_.kind == tuttiCompressPowerSGD && (was.rows != rows || was.cols != cols))))
    return invalidArgument(
        fmt::format("{}: key {} was used with count {} ({} x {}), now count {} ({} x {}); "
                    "a key names one gradient",
                    kFn, key, was.count, was.rows, was.cols, count, rows, cols));
  auto job = [=](Queue own) { return allReduce(send, recv, count, op, key, rows, cols, own); };
  if (runsOnEngine(*comm_, stream)) return comm_->engine().submit({stream}, job);
  if (!comm_->config().blocking) {
    std::vector<Queue> streams;
    if (stream && !comm_->backend().hostOnly()) streams.push_back(stream);
    Status st = comm_->engine().submit(streams, job, false);
    *inProgress = st.isOk();
    return st;
  }
  comm_->drainEngine();
  return allReduce(send, recv, count, op, key, rows, cols, stream);
}

}  // namespace tutti::core
