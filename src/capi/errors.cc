#include "capi/errors.h"

#include <atomic>
#include <mutex>
#include <unordered_set>

#include "base/log.h"
#include "capi/handle.h"

namespace tutti::capi {
namespace {

thread_local std::string t_lastError;
std::mutex g_regMu;
std::unordered_set<const ncclComm*>& registry() {
  static auto* r = new std::unordered_set<const ncclComm*>();  // never destroyed: exit-safe
  return *r;
}

}  // namespace

namespace {
// Bumped whenever a handle leaves the registry: a thread's cached "c is live"
// answer holds while the generation it was taken at is current (the hot path
// of a collective then costs one atomic load instead of a lock and a lookup).
std::atomic<uint64_t> g_regGen{1};
struct LiveCache {
  const ncclComm* comm = nullptr;
  uint64_t gen = 0;
};
thread_local LiveCache t_live;
}  // namespace

void registerComm(ncclComm* c) {
  std::lock_guard<std::mutex> lk(g_regMu);
  registry().insert(c);
}

void unregisterComm(ncclComm* c) {
  std::lock_guard<std::mutex> lk(g_regMu);
  registry().erase(c);
  g_regGen.fetch_add(1, std::memory_order_acq_rel);
}

bool isLiveComm(const ncclComm* c) {
  if (!c) return false;
  const uint64_t gen = g_regGen.load(std::memory_order_acquire);
  if (t_live.comm == c && t_live.gen == gen) return true;
  std::lock_guard<std::mutex> lk(g_regMu);
  if (registry().count(c) == 0) return false;
  t_live = {c, g_regGen.load(std::memory_order_relaxed)};
  return true;
}

ncclResult_t fail(ncclResult_t code, const std::string& message, ncclComm_t comm) {
  if (code == ncclSuccess || code == ncclInProgress) return code;
  TUTTI_WARN("{}", message);
  return record(code, message, comm);
}

ncclResult_t record(ncclResult_t code, const std::string& message, ncclComm_t comm) {
  if (code == ncclSuccess || code == ncclInProgress) return code;
  t_lastError = message;
  if (comm && isLiveComm(comm)) {
    std::lock_guard<std::mutex> lk(comm->errMu);
    comm->lastError = message;
  }
  return code;
}

ncclResult_t fromStatus(const Status& st, ncclComm_t comm) {
  if (st.isOk()) return ncclSuccess;
  return fail(static_cast<ncclResult_t>(st.code()), st.message(), comm);
}

const char* lastError(ncclComm_t comm) {
  if (comm && isLiveComm(comm)) {
    std::lock_guard<std::mutex> lk(comm->errMu);
    if (!comm->lastError.empty()) {
      // Copy into thread-local storage so the pointer stays valid for the caller.
      t_lastError = comm->lastError;
    }
  }
  return t_lastError.c_str();
}

}  // namespace tutti::capi
