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
    auto settings = tutti::core::Compressor::resolve(*config);
    if (!settings) return tutti::capi::fromStatus(settings.status().withContext(fn), comm);
    auto c = std::make_unique<tuttiCompressor>();
    c->comm = comm;
    c->impl = std::make_unique<tutti::core::Compressor>(comm->impl(), settings.value());
    TUTTI_INFO(tutti::log::kColl, "{}: {} compressor{} for comm {}", fn,
               tutti::core::Compressor::kindName(settings->cfg.kind),
               settings->feedback ? " with error feedback" : "", static_cast<void*>(comm));
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
