// tutti's compression extensions (tutti/tutti.h): compressors and compressed
// all-reduce. The codecs and schedules live in src/compress; this file keeps
// the per-gradient state and validates what callers pass.
#include <algorithm>
#include <cstring>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "algo/schedule_util.h"
#include "base/log.h"
#include "base/params.h"
#include "base/tsan.h"
#include "capi/errors.h"
#include "capi/export.h"
#include "capi/handle.h"
#include "capi/ops.h"
#include "compress/powersgd.h"
#include "compress/wire.h"
#include "transports/shm/cma.h"
#include "transports/shm/shared_region.h"
#include "tutti/tutti.h"

namespace algo = tutti::algo;
namespace compress = tutti::compress;
using tutti::capi::fail;
using tutti::capi::guard;

struct tuttiCompressor {
  static constexpr uint64_t kMagic = 0x7475747469637a72ull;
  uint64_t magic = kMagic;
  ncclComm* comm = nullptr;
  tuttiCompressionConfig_t cfg{};
  bool feedback = false;
  struct Tensor {
    size_t count = 0, rows = 0, cols = 0;
    std::vector<float> residual;  // 1-bit: worker then server residuals
    std::unique_ptr<compress::PowerSgdState> powerSgd;
  };
  std::unordered_map<unsigned long long, Tensor> tensors;
  tuttiCompressionStats_t stats{};
  uint64_t wireBytes = 0;
  // PowerSGD's residuals shared by the ranks of a node (compress/powersgd.h): -1 until the
  // first PowerSGD state decides it (then 1: shared, 0: per rank); the node's ranks in member
  // order, this rank's place among them, and each rank's process token (equal tokens: one
  // address space).
  int nodeShare = -1;
  uint64_t shareMinBytes = 0;  // smaller matrices keep residuals per rank (agreed)
  std::vector<int> nodeRanks;
  int nodeIndex = 0;
  std::vector<uint64_t> tokens;
  std::vector<uint64_t> inputs;  // this call's input address of every rank
  // Node members in other processes read this rank's input through shared memory
  // (prepareStaging): this rank's copy of the rows they read, and each member's region (by
  // member index; null for this rank and for members in this process). -1 until the first
  // shared PowerSGD state, then 1 (on) or 0 (cross-memory reads), the same on every rank.
  int staging = -1;
  std::unique_ptr<tutti::transport::shm::SharedRegion> ownStage;
  std::vector<std::unique_ptr<tutti::transport::shm::SharedRegion>> memberStage;
};

namespace {

std::mutex g_mu;
std::unordered_set<const tuttiCompressor*> g_live;

bool isLive(const tuttiCompressor* c) {
  std::lock_guard<std::mutex> lk(g_mu);
  return c && g_live.count(c) && c->magic == tuttiCompressor::kMagic;
}

const char* kindName(int kind) {
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

// The config with defaults filled in, or the reason it is invalid.
std::string normalise(const tuttiCompressionConfig_t& in, tuttiCompressionConfig_t* out,
                      bool* feedback) {
  tuttiCompressionConfig_t d = TUTTI_COMPRESSION_CONFIG_INITIALIZER;
  // Fields an older caller's struct has; the rest keep their defaults.
  memcpy(&d, &in, std::min(in.size, sizeof(d)));
  d.size = sizeof(d);
  int kind;
  memcpy(&kind, &d.kind, sizeof(kind));
  if (kind < tuttiCompressNone || kind > tuttiCompressPowerSGD)
    return fmt::format("unknown compression kind {}", kind);
  if (d.errorFeedback < -1 || d.errorFeedback > 1)
    return fmt::format("errorFeedback {} (must be -1, 0 or 1)", d.errorFeedback);
  const bool stateful = kind == tuttiCompressOneBit || kind == tuttiCompressPowerSGD;
  *feedback = d.errorFeedback == -1 ? stateful : d.errorFeedback == 1;
  if (*feedback && !stateful)
    return fmt::format("error feedback is offered for 1-bit and PowerSGD, not {}", kindName(kind));
  if (kind == tuttiCompressPowerSGD) {
    if (d.powerSgdRank < 1) return fmt::format("powerSgdRank {} (must be >= 1)", d.powerSgdRank);
    if (!(d.epsilon >= 0)) return "epsilon must be >= 0";
    if (!(d.minCompressionRate >= 0)) return "minCompressionRate must be >= 0";
    if (d.warmStart != 0 && d.warmStart != 1)
      return fmt::format("warmStart {} (must be 0 or 1)", d.warmStart);
  }
  *out = d;
  return "";
}

ncclResult_t checkCompressor(tuttiCompressor_t c, const char* fn) {
  if (!c) return fail(ncclInvalidArgument, std::string(fn) + ": compressor is NULL");
  if (!isLive(c))
    return fail(ncclInvalidArgument,
                std::string(fn) + ": compressor is not valid (destroyed or never created)");
  return ncclSuccess;
}

tutti::Status statusOf(ncclResult_t rc, ncclComm* comm) {
  return tutti::Status(static_cast<tutti::Code>(rc), ncclGetLastError(comm));
}

// Whether PowerSGD's states share one residual per node: every rank must be able to read the
// inputs of the others on its node. Decided by all ranks together at the first PowerSGD state
// of a compressor (each reads a canary from every node member; one refusal anywhere keeps
// residuals per rank everywhere). TUTTI_POWERSGD_NODE_FEEDBACK=0 on any rank turns it off;
// matrices below TUTTI_POWERSGD_SHARE_MIN_BYTES (the largest any rank asks for) keep their
// residuals per rank: sharing costs one more small all-reduce per call (the input addresses),
// which only pays for itself on matrices of megabytes.
ncclResult_t decideNodeShare(tuttiCompressor* c, const char* fn,
                             const tutti::capi::Compressed* exact) {
  namespace cma = tutti::transport::shm::cma;
  if (c->nodeShare >= 0) return ncclSuccess;
  ncclComm* comm = c->comm;
  const int n = comm->nranks, me = comm->rank;
  const tutti::algo::NodeMap& map = comm->impl->nodeMap();
  const std::vector<int>& node = map.nodes[map.nodeOf[me]];
  if (map.maxPerNode() <= 1) {  // every rank knows: nothing to share anywhere
    c->nodeShare = 0;
    return ncclSuccess;
  }
  // A rank alone on its node has nothing to share and nothing against it.
  const bool want = c->feedback && tutti::params::getBool("TUTTI_POWERSGD_NODE_FEEDBACK", true);
  if (want && node.size() > 1) cma::allowPeerReads();
  // Lives until every rank has probed it (they all have once the second all-reduce is done).
  const uint64_t canary =
      cma::processToken() ^ reinterpret_cast<uintptr_t>(&canary) ^ comm->impl->commHash();
  constexpr int kFields = 4;  // process token, canary address, canary value, minimum bytes
  std::vector<uint64_t> rec(kFields * static_cast<size_t>(n), 0);
  uint64_t* mine = &rec[kFields * me];
  mine[0] = cma::processToken();
  mine[1] = reinterpret_cast<uintptr_t>(&canary);
  mine[2] = canary;
  mine[3] = static_cast<uint64_t>(
      std::max<int64_t>(0, tutti::params::getInt("TUTTI_POWERSGD_SHARE_MIN_BYTES", 4 << 20)));
  tutti::base::tsanRelease(&canary);  // peers in this process read it directly (base/tsan.h)
  ncclResult_t rc = tutti::capi::allReduce(fn, rec.data(), rec.data(), rec.size(), ncclUint64,
                                           ncclSum, comm, exact, nullptr);
  if (rc != ncclSuccess) return rc;
  int32_t ok = want ? 1 : 0;
  std::string why = want          ? ""
                    : c->feedback ? "TUTTI_POWERSGD_NODE_FEEDBACK=0"
                                  : "no error feedback";
  for (int q : node) {
    if (q == me || !ok) continue;
    uint64_t seen = 0;
    const uint64_t* theirs = &rec[kFields * q];
    const auto* addr = reinterpret_cast<const void*>(theirs[1]);
    tutti::Status st = cma::readPeer(static_cast<pid_t>(comm->impl->peer(q).pid),
                                     theirs[0] == mine[0], addr, 0, &seen, sizeof(seen));
    if (!st || seen != theirs[2]) {
      ok = 0;
      why = st ? "read a wrong value from " + comm->impl->describePeer(q) : st.message();
    }
  }
  rc = tutti::capi::allReduce(fn, &ok, &ok, 1, ncclInt32, ncclMin, comm, exact, nullptr);
  tutti::base::tsanAcquire(&canary);  // every reader is done with it
  if (rc != ncclSuccess) return rc;
  c->nodeShare = ok;
  c->nodeRanks = node;
  c->nodeIndex = static_cast<int>(std::find(node.begin(), node.end(), me) - node.begin());
  c->tokens.resize(n);
  c->shareMinBytes = 0;
  for (int q = 0; q < n; ++q) {
    c->tokens[q] = rec[kFields * q];
    c->shareMinBytes = std::max(c->shareMinBytes, rec[kFields * q + 3]);
  }
  if (ok && node.size() > 1)
    TUTTI_INFO(tutti::log::kColl,
               "{}: PowerSGD keeps one residual per node for matrices of {} bytes and more, "
               "shared by its ranks ({} here)",
               fn, c->shareMinBytes, node.size());
  else if (c->feedback)
    TUTTI_INFO(tutti::log::kColl, "{}: PowerSGD keeps a residual per rank ({})", fn,
               why.empty() ? "a rank elsewhere cannot share" : why);
  return ncclSuccess;
}

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

// Sets up (or grows) the shared-memory stages for a new rows x cols shared PowerSGD state:
// each call, every rank with node members in other processes copies the rows they read into
// its stage, and they read it there instead of with cross-memory attach, which pins and walks
// the owner's pages on every call (measured on 2 nodes x 2 ranks: 15 ms of a 51 ms call).
// Collective: every rank runs it at the same state creations (sharing is agreed), with two
// small all-reduces. A failure anywhere, or TUTTI_POWERSGD_STAGING=0 on any rank, turns the
// stages off on every rank for good; the reads then go through cross-memory attach.
ncclResult_t prepareStaging(tuttiCompressor* c, const char* fn,
                            const tutti::capi::Compressed* exact, size_t rows, size_t cols) {
  using tutti::transport::shm::SharedRegion;
  if (c->staging == 0) return ncclSuccess;
  ncclComm* comm = c->comm;
  const int n = comm->nranks, me = comm->rank, k = static_cast<int>(c->nodeRanks.size());
  bool elsewhere = false;  // a node member in another process
  for (int q : c->nodeRanks) elsewhere |= c->tokens[q] != c->tokens[me];
  constexpr int kNameWords = 8, kFields = kNameWords + 1;  // name, then its size in bytes
  std::vector<uint64_t> rec(kFields * static_cast<size_t>(n), 0);
  int32_t ok = tutti::params::getBool("TUTTI_POWERSGD_STAGING", true) ? 1 : 0;
  std::string why = ok ? "" : "TUTTI_POWERSGD_STAGING=0";
  const size_t need = stageBytes(rows, cols, c->nodeIndex, k);
  std::unique_ptr<SharedRegion> fresh;
  if (ok && elsewhere && (!c->ownStage || c->ownStage->size() < need)) {
    auto r = SharedRegion::create(SharedRegion::makeName(comm->impl->commHash(), "psgd", me), need);
    if (r) {
      fresh = std::move(r.value());
    } else {
      ok = 0;
      why = r.status().message();
    }
  }
  SharedRegion* mine = fresh ? fresh.get() : c->ownStage.get();
  if (ok && mine) {
    const std::string& name = mine->name();
    std::memcpy(&rec[kFields * me], name.data(), std::min<size_t>(name.size(), kNameWords * 8 - 1));
    rec[kFields * me + kNameWords] = mine->size();
  }
  ncclResult_t rc = tutti::capi::allReduce(fn, rec.data(), rec.data(), rec.size(), ncclUint64,
                                           ncclSum, comm, exact, nullptr);
  if (rc != ncclSuccess) return rc;
  std::vector<std::unique_ptr<SharedRegion>> opened(k);
  for (int m = 0; m < k && ok; ++m) {
    const int q = c->nodeRanks[m];
    if (q == me || c->tokens[q] == c->tokens[me]) continue;
    char name[kNameWords * 8];
    std::memcpy(name, &rec[kFields * q], sizeof(name));
    name[sizeof(name) - 1] = '\0';
    const size_t bytes = rec[kFields * q + kNameWords];
    if (c->memberStage.size() == static_cast<size_t>(k) && c->memberStage[m] &&
        c->memberStage[m]->name() == name)
      continue;  // already mapped
    auto r = SharedRegion::open(name, bytes);
    if (!r || bytes < stageBytes(rows, cols, m, k)) {
      ok = 0;
      why = r ? comm->impl->describePeer(q) + "'s stage is smaller than this matrix needs"
              : r.status().withContext(comm->impl->describePeer(q)).message();
      break;
    }
    opened[m] = std::move(r.value());
  }
  rc = tutti::capi::allReduce(fn, &ok, &ok, 1, ncclInt32, ncclMin, comm, exact, nullptr);
  if (fresh) fresh->unlink();  // every reader has opened it (or given up)
  if (rc != ncclSuccess) return rc;
  if (!ok) {
    if (c->staging != 0)
      TUTTI_INFO(tutti::log::kColl,
                 "{}: PowerSGD node members read each other's inputs with cross-memory attach ({})",
                 fn, why.empty() ? "a rank elsewhere could not set up shared memory" : why);
    c->staging = 0;
    c->ownStage.reset();
    c->memberStage.clear();
    return ncclSuccess;
  }
  if (c->staging != 1 && elsewhere)
    TUTTI_INFO(tutti::log::kColl,
               "{}: PowerSGD node members read each other's inputs through shared memory", fn);
  c->staging = 1;
  if (fresh) c->ownStage = std::move(fresh);
  c->memberStage.resize(k);
  for (int m = 0; m < k; ++m)
    if (opened[m]) c->memberStage[m] = std::move(opened[m]);
  return ncclSuccess;
}

ncclResult_t runCompressed(tuttiCompressor* c, const void* send, void* recv, size_t count, int op,
                           unsigned long long key, size_t rows, size_t cols, cudaStream_t stream) {
  constexpr const char* fn = "tuttiAllReduceCompressed";
  ncclComm* comm = c->comm;
  const int kind = c->cfg.kind;
  const bool average = op == ncclAvg;
  auto& t = c->tensors[key];
  const bool fresh = t.count == 0 && !t.powerSgd && t.residual.empty();
  if (!fresh &&
      (t.count != count || (kind == tuttiCompressPowerSGD && (t.rows != rows || t.cols != cols))))
    return fail(ncclInvalidArgument,
                fmt::format("{}: key {} was used with count {} ({} x {}), now count {} ({} x {}); "
                            "a key names one gradient",
                            fn, key, t.count, t.rows, t.cols, count, rows, cols),
                comm);
  t.count = count;
  t.rows = rows;
  t.cols = cols;
  c->stats.calls++;
  c->stats.payloadBytes += count * sizeof(float);
  tutti::capi::Compressed exact;
  exact.wireBytes = &c->wireBytes;
  auto runExact = [&] {
    c->stats.exactCalls++;
    return tutti::capi::allReduce(fn, send, recv, count, ncclFloat32, op, comm, &exact, stream);
  };
  if (kind == tuttiCompressNone || count * sizeof(float) < c->cfg.minBytes || count == 0)
    return runExact();
  if (kind == tuttiCompressPowerSGD) {
    const int r = c->cfg.powerSgdRank;
    if (compress::powerSgdRate(rows, cols, r) < c->cfg.minCompressionRate ||
        std::min(rows, cols) <= static_cast<size_t>(r))
      return runExact();
    if (!t.powerSgd) {
      compress::PowerSgdConfig pc;
      pc.rank = r;
      pc.seed = c->cfg.seed;
      pc.epsilon = c->cfg.epsilon;
      pc.warmStart = c->cfg.warmStart == 1;
      pc.feedback = c->feedback;
      ncclResult_t rc = decideNodeShare(c, fn, &exact);
      if (rc != ncclSuccess) return rc;
      compress::NodeShare share;
      if (c->nodeShare == 1 && count * sizeof(float) >= c->shareMinBytes)
        share = {c->nodeIndex, static_cast<int>(c->nodeRanks.size()), true};
      t.powerSgd = std::make_unique<compress::PowerSgdState>(rows, cols, pc, key, share);
      if (share.on) {
        rc = prepareStaging(c, fn, &exact, rows, cols);
        if (rc != ncclSuccess) return rc;
      }
    }
    auto sum = [&](float* data, size_t n) {
      ncclResult_t rc =
          tutti::capi::allReduce(fn, data, data, n, ncclFloat32, ncclSum, comm, &exact, nullptr);
      return rc == ncclSuccess ? tutti::Status::ok() : statusOf(rc, comm);
    };
    // PowerSGD's matrix work runs on the host: device buffers are copied
    // to host memory and the result back, in the order of the caller's
    // stream (the exact sums in between run on host memory). Host buffers
    // still wait for the stream: earlier device work may write them.
    const float* in = static_cast<const float*>(send);
    float* out = static_cast<float*>(recv);
    std::vector<float> hostIn, hostOut;
    auto* be = comm->backend;
    const auto q = reinterpret_cast<tutti::core::Queue>(stream);
    const bool device = be->isDevice(send) || be->isDevice(recv);
    tutti::Status st;
    if (device) {
      hostIn.resize(count);
      hostOut.resize(count);
      st = be->copyAsync(hostIn.data(), send, count * sizeof(float), q);
      in = hostIn.data();
      out = hostOut.data();
    }
    if (st && !be->hostOnly()) st = be->sync(q);
    if (!st) return tutti::capi::fromStatus(st.withContext(fn), comm);
    compress::PowerSgdState::ReadInput read;
    if (t.powerSgd->shared()) {
      // Where each rank's input is this call (node members read their rows of it; every rank
      // takes part, also one alone on its node).
      const int k = static_cast<int>(c->nodeRanks.size());
      if (c->staging == 1 && c->ownStage) {
        // The rows the node's other members read: all but this rank's share, in order. They
        // read them after the all-reduce below and are done before the first sum completes
        // (compress/powersgd.h), so the next call may overwrite them.
        const auto [r0, r1] = compress::shareRows(rows, c->nodeIndex, k);
        const size_t rowBytes = cols * sizeof(float);
        uint8_t* stage = c->ownStage->data();
        std::memcpy(stage, in, r0 * rowBytes);
        std::memcpy(stage + r0 * rowBytes, in + r1 * cols, (rows - r1) * rowBytes);
      }
      c->inputs.assign(comm->nranks, 0);
      c->inputs[comm->rank] = reinterpret_cast<uintptr_t>(in);
      tutti::base::tsanRelease(in);  // node members in this process read it (base/tsan.h)
      ncclResult_t rc =
          tutti::capi::allReduce(fn, c->inputs.data(), c->inputs.data(), c->inputs.size(),
                                 ncclUint64, ncclSum, comm, &exact, nullptr);
      if (rc != ncclSuccess) return rc;
      read = [c, comm, rows, cols, k](int member, size_t offset, void* dst, size_t bytes) {
        const int q = c->nodeRanks[member];
        if (c->staging == 1 && c->memberStage[member]) {
          const tutti::transport::shm::SharedRegion& stage = *c->memberStage[member];
          const size_t at = stageOffset(offset, rows, cols, member, k);
          if (at + bytes > stage.size())
            return tutti::internalError(
                fmt::format("PowerSGD: bytes {}-{} of {}'s input are outside its stage ({} bytes)",
                            offset, offset + bytes, comm->impl->describePeer(q), stage.size()));
          std::memcpy(dst, stage.data() + at, bytes);
          return tutti::Status::ok();
        }
        tutti::Status rs = tutti::transport::shm::cma::readPeer(
            static_cast<pid_t>(comm->impl->peer(q).pid), c->tokens[q] == c->tokens[comm->rank],
            reinterpret_cast<const void*>(c->inputs[q]), offset, dst, bytes);
        return rs ? rs : rs.withContext(comm->impl->describePeer(q));
      };
    }
    // Once a sum is done the node members have read `in` (base/tsan.h; a no-op otherwise).
    auto sumThenAcquire = [&](float* data, size_t n) {
      tutti::Status done = sum(data, n);
      tutti::base::tsanAcquire(in);
      return done;
    };
    st = t.powerSgd->run(in, out, average, comm->nranks, sumThenAcquire, read);
    if (st && device) st = be->copyAsync(recv, out, count * sizeof(float), q);
    if (st && device) st = be->sync(q);
    return st ? ncclSuccess : tutti::capi::fromStatus(st, comm);
  }
  tutti::capi::Compressed z;
  z.wireBytes = &c->wireBytes;
  if (kind == tuttiCompressOneBit) {
    z.wire.format = algo::Wire::kSign;
    if (t.residual.empty())
      t.residual.assign(compress::signStateFloats(count, comm->nranks, comm->rank), 0.0f);
    // Without feedback the residuals are cleared before every call.
    if (!c->feedback) std::fill(t.residual.begin(), t.residual.end(), 0.0f);
    z.state = t.residual.data();
  } else {
    z.wire.format = kind == tuttiCompressFp16 ? algo::Wire::kHalf : algo::Wire::kBf16;
  }
  return tutti::capi::allReduce(fn, send, recv, count, ncclFloat32, op, comm, &z, stream);
}

}  // namespace

TUTTI_API ncclResult_t tuttiCompressorCreate(ncclComm_t comm,
                                             const tuttiCompressionConfig_t* config,
                                             tuttiCompressor_t* compressor) {
  return guard("tuttiCompressorCreate", [&] {
    constexpr const char* fn = "tuttiCompressorCreate";
    if (!compressor) return fail(ncclInvalidArgument, std::string(fn) + ": compressor is NULL");
    *compressor = nullptr;
    if (!comm || !tutti::capi::isLiveComm(comm))
      return fail(ncclInvalidArgument, std::string(fn) + ": comm is not a valid communicator");
    if (!config) return fail(ncclInvalidArgument, std::string(fn) + ": config is NULL", comm);
    if (config->size < offsetof(tuttiCompressionConfig_t, errorFeedback))
      return fail(ncclInvalidArgument,
                  std::string(fn) +
                      ": config.size is too small (initialise it with "
                      "TUTTI_COMPRESSION_CONFIG_INITIALIZER)",
                  comm);
    auto c = std::make_unique<tuttiCompressor>();
    std::string why = normalise(*config, &c->cfg, &c->feedback);
    if (!why.empty()) return fail(ncclInvalidArgument, std::string(fn) + ": " + why, comm);
    c->comm = comm;
    TUTTI_INFO(tutti::log::kColl, "{}: {} compressor{} for comm {}", fn, kindName(c->cfg.kind),
               c->feedback ? " with error feedback" : "", static_cast<void*>(comm));
    std::lock_guard<std::mutex> lk(g_mu);
    g_live.insert(c.get());
    *compressor = c.release();
    return ncclSuccess;
  });
}

TUTTI_API ncclResult_t tuttiCompressorDestroy(tuttiCompressor_t compressor) {
  return guard("tuttiCompressorDestroy", [&] {
    if (!compressor) return ncclSuccess;
    ncclResult_t rc = checkCompressor(compressor, "tuttiCompressorDestroy");
    if (rc != ncclSuccess) return rc;
    {
      std::lock_guard<std::mutex> lk(g_mu);
      g_live.erase(compressor);
    }
    compressor->magic = 0;
    delete compressor;
    return ncclSuccess;
  });
}

TUTTI_API ncclResult_t tuttiAllReduceCompressed(const void* sendbuff, void* recvbuff, size_t count,
                                                ncclDataType_t datatype, ncclRedOp_t op,
                                                tuttiCompressor_t compressor,
                                                unsigned long long key, size_t rows, size_t cols,
                                                cudaStream_t stream) {
  return guard("tuttiAllReduceCompressed", [&] {
    constexpr const char* fn = "tuttiAllReduceCompressed";
    ncclResult_t rc = checkCompressor(compressor, fn);
    if (rc != ncclSuccess) return rc;
    ncclComm* comm = compressor->comm;
    if (!tutti::capi::isLiveComm(comm))
      return fail(ncclInvalidUsage,
                  std::string(fn) + ": the compressor's communicator was destroyed");
    int dt, rop;
    memcpy(&dt, &datatype, sizeof(dt));
    memcpy(&rop, &op, sizeof(rop));
    if (dt != ncclFloat32)
      return fail(ncclInvalidArgument,
                  fmt::format("{}: datatype {} (compressed all-reduce takes ncclFloat32)", fn, dt),
                  comm);
    if (rop != ncclSum && rop != ncclAvg)
      return fail(
          ncclInvalidArgument,
          fmt::format("{}: op {} (compressed all-reduce takes ncclSum or ncclAvg)", fn, rop), comm);
    if (tutti::capi::inGroup())
      return fail(ncclInvalidUsage,
                  std::string(fn) + ": not allowed inside ncclGroupStart/ncclGroupEnd", comm);
    if (compressor->cfg.kind == tuttiCompressPowerSGD && count > 0 &&
        (rows == 0 || cols == 0 || rows * cols != count || rows > count || cols > count))
      return fail(ncclInvalidArgument,
                  fmt::format("{}: PowerSGD needs the matrix shape: rows {} x cols {} must equal "
                              "count {}",
                              fn, rows, cols, count),
                  comm);
    return runCompressed(compressor, sendbuff, recvbuff, count, rop, key, rows, cols, stream);
  });
}

TUTTI_API ncclResult_t tuttiCompressorGetStats(tuttiCompressor_t compressor,
                                               tuttiCompressionStats_t* stats) {
  return guard("tuttiCompressorGetStats", [&] {
    ncclResult_t rc = checkCompressor(compressor, "tuttiCompressorGetStats");
    if (rc != ncclSuccess) return rc;
    if (!stats) return fail(ncclInvalidArgument, "tuttiCompressorGetStats: stats is NULL");
    if (stats->size < sizeof(size_t))
      return fail(
          ncclInvalidArgument,
          "tuttiCompressorGetStats: stats->size is not set (sizeof(tuttiCompressionStats_t))");
    tuttiCompressionStats_t s = compressor->stats;
    s.wireBytesSent = compressor->wireBytes;
    s.size = std::min(stats->size, sizeof(s));
    memcpy(stats, &s, s.size);
    return ncclSuccess;
  });
}

namespace tutti::capi {

const std::vector<float>* compressorResidual(tuttiCompressor* c, unsigned long long key) {
  if (!isLive(c)) return nullptr;
  auto it = c->tensors.find(key);
  if (it == c->tensors.end()) return nullptr;
  if (it->second.powerSgd) {
    const std::vector<float>& res = it->second.powerSgd->residual();
    return res.empty() ? nullptr : &res;
  }
  return it->second.residual.empty() ? nullptr : &it->second.residual;
}

}  // namespace tutti::capi
