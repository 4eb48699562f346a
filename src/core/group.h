// The planner: turns validated operations (core/op.h) into the work that runs
// them, and runs it.
//
// Contract
// - runOne(): an operation outside any group. On host memory a small
//   collective on one host takes the one-shot path (no schedule, no
//   executor); a plain collective runs its plan (below); anything else runs
//   as a group of one.
// - runGroup(): the operations of one ncclGroupStart/End, in call order, over
//   any number of communicators of this process, all progressed together (one
//   thread may drive every rank of a communicator). Per communicator: device
//   IPC takes the raw collectives it was negotiated for (core/device_ipc.h);
//   device buffers of the rest are staged through pinned host memory
//   (core/staging.h); fp16 compression agrees its scales (one small max
//   all-reduce); small all-reduces, reduce-scatters, all-gathers and
//   broadcasts that can travel together are fused into one collective over a
//   packed buffer; point-to-point operations form one schedule (instance 0),
//   collectives follow in call order, so both sides of any pair agree on
//   instance numbers whatever the interleaving.
// - Plans: what a communicator runs for a lone collective or for its part of
//   a group (fusion, schedules, where each buffer comes from) is built once
//   per shape (per operation in call order: collective, count, datatype,
//   reduction, root or peer, in place or not) and kept (the last few); a call
//   with a kept shape binds its own buffers to it, so a repeated call or
//   group builds no schedule and allocates nothing. A different shape builds
//   anew. Compressed operations are planned afresh at each call.
// - Both take the communicators' mutexes (in address order) and complete the
//   operations before they return; submitOne / submitGroup (below) decide
//   whether they run on the caller's thread or on the engine's.
// - The result names the communicator an error belongs to: the one whose
//   operation failed, else the first in error state, else the first.
#pragma once

#include <vector>

#include "base/status.h"
#include "core/op.h"

namespace tutti::core {

struct RunResult {
  Status status;
  Comm* comm = nullptr;  // where the error belongs (null when ok)
  // Queued on a non-blocking communicator's engine with nothing to hold a
  // stream: the API answers ncclInProgress (submitOne / submitGroup).
  bool inProgress = false;
};

RunResult runOne(const Op& op);
RunResult runGroup(std::vector<Op>& ops);

// What the API calls: like runOne / runGroup, but the operations of one
// communicator go to its engine (core/engine.h) and the call returns at once
// - on device streams (a device backend with host events, every operation
//   on a non-NULL stream): the data is produced in stream order;
// - on a non-blocking communicator (config.blocking = 0), whatever the
//   memory and the stream: the result has inProgress set, and the work has
//   completed when Comm::engineBusy() turns false (ncclCommGetAsyncError);
//   the engine still waits for the work queued earlier on a device stream.
// Everything else runs on the caller's thread after what the engines of its
// communicators still run, and is complete on return.
RunResult submitOne(const Op& op);
RunResult submitGroup(std::vector<Op>& ops);
// A call inside a group was refused (`why`: its error), so the group does not
// run on this rank: its calls that the peers make too would leave them
// waiting. Each communicator of the group fails with `why` (later calls fail
// fast with it) and tells every peer (Comm::noticeFailure), whose calls then
// fail naming this rank's error instead of waiting for a timeout. The
// returned status is `why` as this rank reports it.
Status failRefusedGroup(const std::vector<Comm*>& comms, const Status& why);
// Whether work for `comm` on `stream` is held in stream order by its engine.
bool runsOnEngine(Comm& comm, Queue stream);

// How many plans `comm` has built (a call that reuses a kept one builds
// none): for tests.
uint64_t plansBuilt(Comm& comm);

// The operation an API call describes on `comm` (arguments validated): exact,
// or an all-reduce with the wire format TUTTI_COMPRESSION asks of it (float32
// sum/avg of at least TUTTI_COMPRESSION_MIN_BYTES, communicator spanning
// several nodes: fp16 or bf16).
Op apiOp(Comm& comm, algo::Collective coll, const void* send, void* recv, size_t count, int dt,
         int op, int root, Queue stream);
// An API call's root or peer, count and buffers, checked against `comm`
// (kInvalidArgument naming what is wrong). A receive may name
// Op::kAnySource.
Status checkCall(const Comm& comm, algo::Collective coll, const void* send, const void* recv,
                 size_t count, int dt, int root);

}  // namespace tutti::core
