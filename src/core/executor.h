// The executor: runs schedules over the transports with the backend's host
// kernels, one-shot operations through the node arena and device-IPC
// collectives device to device.
//
// Contract: execute() drives every schedule, one-shot operation and device-IPC
// collective of every communicator in `work`
// to completion on the calling thread (a group over several communicators of
// one process progresses them together, so ranks driven by one thread cannot
// deadlock each other). It returns when all are done, or with the first
// error: a peer that closed its connection or died, no progress for the
// communicator's timeout (the error names the ranks still awaited), or an
// abort. Waiting spins briefly, then yields, then sleeps (polling sockets),
// so ranks that outnumber cores still progress.
#pragma once

#include <array>
#include <vector>

#include "algo/schedule.h"
#include "core/comm.h"
#include "core/device_ipc.h"

namespace tutti::core {

struct Work {
  Comm* comm = nullptr;
  std::vector<algo::Schedule> schedules;
  // Per schedule, indexed by algo::Buf: send, recv, scratch, (unused: kAbs),
  // state (compressed collectives' error feedback).
  std::vector<std::array<uint8_t*, 5>> buffers;
  std::vector<std::string> descriptions;         // for errors and logs
  // Per schedule (may be shorter): a counter to which the bytes its messages
  // put on the wire are added (null: none).
  std::vector<uint64_t*> wireBytes;
  // Per schedule: the fingerprint its messages carry and its receives expect
  // (core/wire_header.h).
  std::vector<OpSig> sigs;
  // Small collectives on the one-shot path (comm->oneShot()), in call order;
  // progressed alongside the schedules.
  std::vector<OneShotOp> small;
  // Collectives device to device (comm->deviceIpc()), in call order;
  // progressed alongside the rest.
  std::vector<IpcOp> ipc;
  // The telemetry measures it (false: tutti's own exchange between the
  // caller's operations, the balance re-plan's, which would stand in for
  // the next operation's start and gap).
  bool measured = true;
  // The channels its messages leave on (the first ones; 0: every one). The
  // receiving side reads every channel, so the two sides need not agree.
  int channels = 0;
};

Status execute(std::vector<Work*>& work);

}  // namespace tutti::core
