// What ncclComm_t points to, and the registry of live handles. A handle holds
// what the C boundary needs (init arguments and state, the last error); the
// communicator's state is tutti::core::Comm.
//
// A handle is valid from ncclCommInit* until ncclCommDestroy/Abort; the
// registry lets every API call reject a NULL, destroyed or foreign pointer
// with a clear error instead of crashing.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "core/backend.h"
#include "core/comm.h"
#include "nccl.h"

struct ncclComm {
  static constexpr uint64_t kMagic = 0x7475747469636f6dull;  // "tutticom"
  uint64_t magic = kMagic;
  // The communicator itself, once initialisation has succeeded.
  std::unique_ptr<tutti::core::Comm> impl;
  // What ncclCommInit* was given: the communicator is created from these
  // (at once, at ncclGroupEnd, or on initThread for a non-blocking one).
  int nranks = 0;
  int rank = -1;
  tutti::core::UniqueIdData id{};
  tutti::core::CommConfig config;
  tutti::core::Backend* backend = nullptr;  // the process's device backend
  int device = 0;                           // the device this rank is bound to
  // Initialisation state: ncclInProgress while a deferred or non-blocking
  // init runs, then its result.
  std::atomic<int> initState{ncclInProgress};
  std::thread initThread;
  bool finalized = false;

  std::mutex errMu;
  std::string lastError;  // ncclGetLastError(comm)
};

namespace tutti::capi {

void registerComm(ncclComm* c);
void unregisterComm(ncclComm* c);
bool isLiveComm(const ncclComm* c);

}  // namespace tutti::capi
