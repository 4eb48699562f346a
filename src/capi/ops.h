// What the files of the C API layer share beyond errors.h: argument checks,
// the calling thread's group, communicator creation and destruction.
#pragma once

#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "base/status.h"
#include "core/op.h"
#include "nccl.h"

struct tuttiCompressor;

namespace tutti::capi {

// The integer a caller passed for an enum parameter. A C caller may pass any
// int; loading an out-of-range value as the C++ enum is undefined, so the
// bytes are copied instead.
template <typename E>
int rawEnum(const E& e) {
  std::underlying_type_t<E> v;
  static_assert(sizeof(v) == sizeof(E), "enum representation");
  std::memcpy(&v, &e, sizeof(v));
  return static_cast<int>(v);
}

// A datatype's name for messages ("invalid" outside NCCL's range).
const char* typeName(int t);
// The "NCCL version" line, once per process.
void logVersionOnce();

// The communicator is a live handle (with needReady: initialised, not finalized, not aborted,
// and not in error state unless `failed` allows it: split, shrink); else the error, recorded.
ncclResult_t checkComm(ncclComm_t comm, const char* fn, bool needReady = true, bool failed = false);
ncclResult_t checkDtype(int dt, const char* fn, ncclComm_t comm);

// The calling thread's ncclGroupStart/End: communicators to initialise and
// operations to run when the outermost ncclGroupEnd comes (core/group.h plans
// and runs them), with the handle each operation was called on.
struct GroupState {
  int depth = 0;
  std::vector<ncclComm*> inits;
  std::vector<core::Op> ops;
  std::vector<ncclComm*> handles;       // of ops[i]
  ncclResult_t deferred = ncclSuccess;  // first error seen inside the group
  std::string refusedWhy;               // a call refused in the group: the first's message,
  std::vector<core::Comm*> refused;     // and the communicators of those refused
};
GroupState& threadGroup();
// Whether the calling thread is inside ncclGroupStart/End.
inline bool inGroup() { return threadGroup().depth > 0; }

// A new handle for rank `rank` of `nranks` (comm_api.cc): validated, then
// initialised at once, at ncclGroupEnd (inside a group) or on a thread of its
// own (config->blocking = 0). `device`: the device the communicator is bound
// to; -1: the calling thread's current device (the CPU backend's is always 0).
// `split`: a child of ncclCommSplit whose id, rank and size come from the
// exchange queued on its parent's engine (core::CommInit::startSplit).
struct SplitFrom {
  core::Comm* parent;
  int color, key;
};
ncclResult_t initRank(const char* fn, ncclComm_t* out, int nranks, const ncclUniqueId& id, int rank,
                      const ncclConfig_t* config, int device = -1,
                      const SplitFrom* split = nullptr);
// The state of `c`'s creation as the API reports it: ncclInProgress while it
// runs, else its result, an error recorded as the last error (the core has
// logged it).
ncclResult_t initResult(ncclComm* c, const char* fn);
// Unregisters and frees a handle; abort: ends an operation in flight first.
void destroyComm(ncclComm* c, bool abort);

// Tests: the error-feedback residuals a compressor keeps for `key`
// (core::Compressor::residual), or null when it keeps none.
const std::vector<float>* compressorResidual(tuttiCompressor* c, unsigned long long key);

}  // namespace tutti::capi
