// What ncclComm_t points to, and the registry of live handles. A handle holds
// what the C boundary needs (the communicator's creation, the last error);
// the communicator's state is tutti::core::Comm, created by core::CommInit.
//
// A handle is valid from ncclCommInit* until ncclCommDestroy/Abort; the
// registry lets every API call reject a NULL, destroyed or foreign pointer
// with a clear error instead of crashing.
#pragma once

#include <mutex>
#include <string>

#include "core/comm.h"
#include "core/init.h"
#include "nccl.h"

struct ncclComm {
  static constexpr uint64_t kMagic = 0x7475747469636f6dull;  // "tutticom"
  explicit ncclComm(tutti::core::InitArgs args) : init(std::move(args)) {}

  uint64_t magic = kMagic;
  // What ncclCommInit* was given and, once created (at once, at ncclGroupEnd,
  // or on a thread of its own for a non-blocking communicator), the
  // communicator.
  tutti::core::CommInit init;
  // The communicator; null until init.state() is kOk.
  tutti::core::Comm* impl() const { return init.comm(); }
  int rank() const { return init.args().rank; }
  int nranks() const { return init.args().nranks; }
  int device() const { return init.args().device; }
  bool blocking() const { return init.args().config.blocking; }
  bool finalized = false;

  std::mutex errMu;
  std::string lastError;  // ncclGetLastError(comm)
};

namespace tutti::capi {

void registerComm(ncclComm* c);
void unregisterComm(ncclComm* c);
bool isLiveComm(const ncclComm* c);

}  // namespace tutti::capi
