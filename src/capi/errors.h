// Error plumbing at the C boundary.
//
// Every exported function records why it failed: fail() logs at WARN and stores
// the message per thread (and per communicator when one is given) where
// ncclGetLastError finds it, then returns the code to hand back to the caller.
// guard() runs a body, converting escaped C++ exceptions into ncclInternalError
// (or ncclSystemError for std::bad_alloc) so nothing throws across extern "C".
#pragma once

#include <exception>
#include <new>
#include <string>

#include "base/status.h"
#include "nccl.h"

namespace tutti::capi {

// Records `message` as the last error (thread-local, and on `comm` if non-null).
ncclResult_t fail(ncclResult_t code, const std::string& message, ncclComm_t comm = nullptr);
// Like fail(), without the WARN line: for an error the core has logged.
ncclResult_t record(ncclResult_t code, const std::string& message, ncclComm_t comm = nullptr);
// Status -> ncclResult_t, recording the message when not ok.
ncclResult_t fromStatus(const Status& st, ncclComm_t comm = nullptr);
// The message ncclGetLastError returns.
const char* lastError(ncclComm_t comm);

template <typename F>
ncclResult_t guard(const char* fn, F&& body) noexcept {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return fail(ncclSystemError, std::string(fn) + ": out of host memory");
  } catch (const std::exception& e) {
    return fail(ncclInternalError, std::string(fn) + ": internal error: " + e.what());
  } catch (...) {
    return fail(ncclInternalError, std::string(fn) + ": unknown internal error");
  }
}

}  // namespace tutti::capi
