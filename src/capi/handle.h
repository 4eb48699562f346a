// What ncclComm_t points to, and the registry of live handles.
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
#include <unordered_set>
#include <vector>

#include "capi/device_ipc.h"
#include "capi/device_staging.h"
#include "core/backend.h"
#include "core/comm.h"
#include "nccl.h"

struct ncclComm {
  static constexpr uint64_t kMagic = 0x7475747469636f6dull;  // "tutticom"
  uint64_t magic = kMagic;
  std::unique_ptr<tutti::core::Comm> impl;
  int nranks = 0;
  int rank = -1;
  // Initialisation state: ncclInProgress while a deferred or non-blocking
  // init runs, then its result.
  std::atomic<int> initState{ncclInProgress};
  std::thread initThread;
  tutti::core::UniqueIdData id{};
  tutti::core::CommConfig config;
  bool finalized = false;
  uint64_t splitSeq = 0;
  // The process's device backend and the device this communicator is bound
  // to (the backend's current device at init; devlist[i] for ncclCommInitAll).
  tutti::core::Backend* backend = nullptr;
  int device = 0;
  // Pinned host memory that device buffers are staged through (grown on
  // demand, freed with the communicator; used under impl->mutex()).
  tutti::capi::PinnedBuffer staging;
  // Collectives on device memory device to device between the processes of
  // one host (negotiated at init; null when not used).
  std::unique_ptr<tutti::capi::DeviceIpc> ipc;

  struct UserOp {
    bool live = false;
    int dt;           // ncclDataType_t, validated
    int residence;    // ncclScalarResidence_t, validated
    const void* ptr;  // ncclScalarDevice: read at each use
    double value;     // ncclScalarHostImmediate: read at creation
    uint64_t raw;     // ncclScalarHostImmediate: the scalar's bytes
  };
  std::vector<UserOp> userOps;
  std::unordered_set<void*> registrations;

  // The executor's work for the last collective this communicator ran on its
  // own (outside a group, on host memory), and the call it was built for: a
  // next call of the same shape reuses it (capi/nccl_api.cc, runAlone).
  struct LastWork;
  std::shared_ptr<LastWork> lastWork;

  std::mutex errMu;
  std::string lastError;
};

namespace tutti::capi {

void registerComm(ncclComm* c);
void unregisterComm(ncclComm* c);
bool isLiveComm(const ncclComm* c);

}  // namespace tutti::capi
