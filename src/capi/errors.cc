#include "capi/errors.h"

#include <mutex>
#include <unordered_set>

#include "capi/handle.h"
#include "core/log.h"

namespace tutti::capi {
namespace {

thread_local std::string t_lastError;
std::mutex g_regMu;
std::unordered_set<const ncclComm*>& registry() {
  static auto* r = new std::unordered_set<const ncclComm*>();  // never destroyed: exit-safe
  return *r;
}

}  // namespace

void registerComm(ncclComm* c) {
  std::lock_guard<std::mutex> lk(g_regMu);
  registry().insert(c);
}

void unregisterComm(ncclComm* c) {
  std::lock_guard<std::mutex> lk(g_regMu);
  registry().erase(c);
}

bool isLiveComm(const ncclComm* c) {
  if (!c) return false;
  std::lock_guard<std::mutex> lk(g_regMu);
  return registry().count(c) != 0;
}

ncclResult_t fail(ncclResult_t code, const std::string& message, ncclComm_t comm) {
  if (code == ncclSuccess || code == ncclInProgress) return code;
  TUTTI_WARN("{}", message);
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
