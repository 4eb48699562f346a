// NCCL 2.28 entry points tutti does not implement yet.
//
// Contract: every function NVIDIA's libnccl.so.2 exports exists in tutti with
// the same signature, so programs that link (or dlsym) one still load. Each
// records "<fn> is not supported by tutti yet" as the last error (per thread,
// and per communicator when one is given) and returns ncclInvalidUsage (other
// return types: a neutral value, documented per function); new objects handed
// back through out-parameters are set to NULL. The exception,
// ncclResetDebugInit (and NVIDIA's internal twin), works: it re-reads the
// logging environment. docs/api.md lists every function and its status.
// Nothing here blocks or allocates beyond the error message.

#include <cstdint>
#include <string>

#include "base/log.h"
#include "capi/errors.h"
#include "capi/export.h"
#include "nccl.h"

namespace tutti::capi::devapi {

// Host-side types of NVIDIA's device API (nccl_device/core.h), declared here
// rather than in nccl.h. Only what the exported signatures need: the team is
// passed and returned by value, so its layout must match exactly (three ints,
// returned in registers on x86-64); everything else crosses as a pointer and
// stays incomplete.
struct Team {
  int nRanks;
  int rank;
  int stride;
};
static_assert(sizeof(Team) == 12 && alignof(Team) == 4, "ncclTeam_t layout");

struct DevComm;                  // ncclDevComm_t
struct DevCommRequirements;      // ncclDevCommRequirements_t
struct DevResourceRequirements;  // ncclDevResourceRequirements_t
struct LsaBarrierHandle;         // ncclLsaBarrierHandle_t
struct GinBarrierHandle;         // ncclGinBarrierHandle_t
struct LLA2AHandle;              // ncclLLA2AHandle_t

// Neutral answers of the non-ncclResult_t functions.
constexpr Team kEmptyTeam{0, 0, 0};
constexpr int kNoRank = -1;

}  // namespace tutti::capi::devapi

namespace {

using tutti::capi::fail;
using tutti::capi::guard;
namespace devapi = tutti::capi::devapi;

// Records "<fn> is not supported by tutti yet"; ncclInvalidUsage. The
// functions without an ncclResult_t ignore the code.
ncclResult_t notSupported(const char* fn, ncclComm_t comm = nullptr) noexcept {
  return guard(fn, [&] {
    return fail(ncclInvalidUsage, std::string(fn) + " is not supported by tutti yet", comm);
  });
}

}  // namespace

// ---- Symmetric memory windows ------------------------------------------------------

// Not supported; *win is set to NULL.
TUTTI_API ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void* /*buff*/, size_t /*size*/,
                                              ncclWindow_t* win, int /*winFlags*/) {
  if (win != nullptr) *win = nullptr;
  return notSupported("ncclCommWindowRegister", comm);
}
TUTTI_PNCCL(ncclCommWindowRegister)

TUTTI_API ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t /*win*/) {
  return notSupported("ncclCommWindowDeregister", comm);
}
TUTTI_PNCCL(ncclCommWindowDeregister)

// ---- Groups --------------------------------------------------------------------------

// Not supported: simInfo is left untouched. NOTE: the enclosing group is not
// ended by this call; callers must still end it with ncclGroupEnd.
TUTTI_API ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t* /*simInfo*/) {
  return notSupported("ncclGroupSimulateEnd");
}
TUTTI_PNCCL(ncclGroupSimulateEnd)

// ---- Logging --------------------------------------------------------------------------

// Declared deprecated in nccl.h (as in NVIDIA's header); defining and aliasing
// it here is not a use.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

// Works: re-reads NCCL_DEBUG / NCCL_DEBUG_SUBSYS / NCCL_DEBUG_FILE.
TUTTI_API void ncclResetDebugInit(void) {
  (void)guard("ncclResetDebugInit", [] {
    tutti::log::reset();
    return ncclSuccess;
  });
}
TUTTI_PNCCL(ncclResetDebugInit)

// NVIDIA's library exports this internal helper (without a pnccl twin) and
// some tools call it directly; same behaviour as ncclResetDebugInit.
TUTTI_API void ncclResetDebugInitInternal(void) {
  (void)guard("ncclResetDebugInitInternal", [] {
    tutti::log::reset();
    return ncclSuccess;
  });
}

#pragma GCC diagnostic pop

// ---- Device API (host side of nccl_device.h) --------------------------------------------

TUTTI_API ncclResult_t ncclDevCommCreate(ncclComm_t comm,
                                         const devapi::DevCommRequirements* /*reqs*/,
                                         devapi::DevComm* /*outDevComm*/) {
  return notSupported("ncclDevCommCreate", comm);
}
TUTTI_PNCCL(ncclDevCommCreate)

TUTTI_API ncclResult_t ncclDevCommDestroy(ncclComm_t comm, const devapi::DevComm* /*devComm*/) {
  return notSupported("ncclDevCommDestroy", comm);
}
TUTTI_PNCCL(ncclDevCommDestroy)

// Not supported: the teams are empty ({nRanks 0, rank 0, stride 0}); a rank
// maps to -1 (no such rank) rather than 0, which is a valid rank.
#define TUTTI_NO_TEAM(fn)                                     \
  TUTTI_API devapi::Team fn(ncclComm_t comm) {                \
    return (void)notSupported(#fn, comm), devapi::kEmptyTeam; \
  }                                                           \
  TUTTI_PNCCL(fn)
#define TUTTI_NO_TEAM_RANK(fn)                             \
  TUTTI_API int fn(ncclComm_t comm, devapi::Team, int) {   \
    return (void)notSupported(#fn, comm), devapi::kNoRank; \
  }                                                        \
  TUTTI_PNCCL(fn)
TUTTI_NO_TEAM(ncclTeamWorld)
TUTTI_NO_TEAM(ncclTeamLsa)
TUTTI_NO_TEAM(ncclTeamRail)
TUTTI_NO_TEAM_RANK(ncclTeamRankToWorld)
TUTTI_NO_TEAM_RANK(ncclTeamRankToLsa)

TUTTI_API ncclResult_t ncclLsaBarrierCreateRequirement(
    devapi::Team /*team*/, int /*nBarriers*/, devapi::LsaBarrierHandle* /*outHandle*/,
    devapi::DevResourceRequirements* /*outReq*/) {
  return notSupported("ncclLsaBarrierCreateRequirement");
}
TUTTI_PNCCL(ncclLsaBarrierCreateRequirement)

TUTTI_API ncclResult_t ncclGinBarrierCreateRequirement(
    ncclComm_t comm, devapi::Team /*team*/, int /*nBarriers*/,
    devapi::GinBarrierHandle* /*outHandle*/, devapi::DevResourceRequirements* /*outReq*/) {
  return notSupported("ncclGinBarrierCreateRequirement", comm);
}
TUTTI_PNCCL(ncclGinBarrierCreateRequirement)

// Not supported: returns 0 slots.
TUTTI_API int ncclLLA2ACalcSlots(int /*maxElts*/, int /*maxEltSize*/) {
  (void)notSupported("ncclLLA2ACalcSlots");
  return 0;
}
TUTTI_PNCCL(ncclLLA2ACalcSlots)

TUTTI_API ncclResult_t ncclLLA2ACreateRequirement(int /*nBlocks*/, int /*nSlots*/,
                                                  devapi::LLA2AHandle* /*outHandle*/,
                                                  devapi::DevResourceRequirements* /*outReq*/) {
  return notSupported("ncclLLA2ACreateRequirement");
}
TUTTI_PNCCL(ncclLLA2ACreateRequirement)
