// tutti's compression extensions (tutti/tutti.h): compressors and compressed
// all-reduce. Validates what callers pass; the compressor itself (per-gradient
// state, PowerSGD's node sharing) is tutti::core::Compressor (core/compressor.h).
#include <algorithm>
#include <cstring>
#include <memory>
#include <mutex>
#include <unordered_set>
#include <vector>

#include "base/log.h"
#include "capi/errors.h"
#include "capi/export.h"
#include "capi/handle.h"
#include "capi/ops.h"
#include "core/compressor.h"
#include "tutti/tutti.h"

using tutti::capi::fail;
using tutti::capi::guard;

struct tuttiCompressor {
  static constexpr uint64_t kMagic = 0x7475747469637a72ull;
  uint64_t magic = kMagic;
  ncclComm* comm = nullptr;  // its communicator's handle (checked live at each call)
  std::unique_ptr<tutti::core::Compressor> impl;
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
    if (comm->init.state() != tutti::Code::kOk)
      return fail(ncclInvalidUsage, std::string(fn) + ": communicator is not initialised", comm);
    tuttiCompressionConfig_t cfg;
    bool feedback = false;
    std::string why = normalise(*config, &cfg, &feedback);
    if (!why.empty()) return fail(ncclInvalidArgument, std::string(fn) + ": " + why, comm);
    auto c = std::make_unique<tuttiCompressor>();
    c->comm = comm;
    c->impl = std::make_unique<tutti::core::Compressor>(comm->impl(), cfg, feedback);
    TUTTI_INFO(tutti::log::kColl, "{}: {} compressor{} for comm {}", fn, kindName(cfg.kind),
               feedback ? " with error feedback" : "", static_cast<void*>(comm));
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
    // Its calls may still run on the communicator's engine.
    if (tutti::capi::isLiveComm(compressor->comm) && compressor->comm->impl())
      compressor->comm->impl()->drainEngine();
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
    if ((rc = tutti::capi::checkComm(comm, fn)) != ncclSuccess) return rc;
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
    if (compressor->impl->config().kind == tuttiCompressPowerSGD && count > 0 &&
        (rows == 0 || cols == 0 || rows * cols != count || rows > count || cols > count))
      return fail(ncclInvalidArgument,
                  fmt::format("{}: PowerSGD needs the matrix shape: rows {} x cols {} must equal "
                              "count {}",
                              fn, rows, cols, count),
                  comm);
    if (count > 0 && (!sendbuff || !recvbuff))
      return fail(ncclInvalidArgument,
                  std::string(fn) + (sendbuff ? ": recvbuff is NULL" : ": sendbuff is NULL"), comm);
    TUTTI_INFO(tutti::log::kColl, "{}: sendbuff {} recvbuff {} count {} op {} key {} comm {}", fn,
               sendbuff, recvbuff, count, rop, key, static_cast<void*>(comm));
    bool inProgress = false;
    tutti::Status st =
        compressor->impl->submit(sendbuff, recvbuff, count, rop, key, rows, cols,
                                 reinterpret_cast<tutti::core::Queue>(stream), &inProgress);
    if (!st) return tutti::capi::fromStatus(st, comm);
    return inProgress ? ncclInProgress : ncclSuccess;
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
    tuttiCompressionStats_t s = compressor->impl->stats();
    s.size = std::min(stats->size, sizeof(s));
    memcpy(stats, &s, s.size);
    return ncclSuccess;
  });
}

namespace tutti::capi {

const std::vector<float>* compressorResidual(tuttiCompressor* c, unsigned long long key) {
  return isLive(c) ? c->impl->residual(key) : nullptr;
}

}  // namespace tutti::capi
