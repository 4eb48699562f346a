// Link probe: measures the latency and bandwidth of one data connection at
// communicator init, for the cost model (algo::CostModel::inter).
//
// Contract
// - Two sides over one transport::Connection that nothing else uses while
//   the probe runs: the initiator (probeLink or skipLinkProbe) drives, the
//   responder (serveLinkProbe) answers until told to stop. Every run of the
//   initiator ends with a stop command, so the responder always returns, and
//   both sides read exactly the bytes of the probe: the connection is left
//   empty, ready for the executor's framed messages.
// - Wire: 16-byte commands (ProbeCmd). kPing: the responder echoes the
//   command. kBulk: `bytes` payload bytes follow; the responder answers with
//   the command once it has them all. kBulkNext: the same, sent right behind
//   the previous transfer; the answer's `bytes` is the microseconds from the
//   previous transfer's last byte to this one's at the responder. kStop: no
//   answer. A command with another magic is a protocol error (the peer is
//   not probing).
// - probeLink measures: one untimed ping, then `pings` round trips (latency =
//   median round trip / 2), then one untimed transfer of `warmupBytes` (TCP
//   slow start; it also drains a rate limiter's burst allowance) and, right
//   behind it, a timed one of `bulkBytes` (kBulkNext: bandwidth = bytes /
//   the responder's time, the link having been busy throughout, so neither
//   round trips, nor the sender's scheduling, nor a burst the limiter
//   refilled in a pause count). Further timed transfers of `bulkBytes` each
//   follow the previous answer; the figure is the best (each is timed by the responder too: the
//   pause before it, in which a limiter may refill its burst, counts in its time). It starts
//   another only when, at the pace of the previous one,
//   it ends within `budget` of the first answer: about 3 MiB at the link's
//   rate in all when the link is slow (25-35 ms at 1 Gbit/s), a few ms on
//   loopback or shared memory.
// - Every wait notices *abortFlag and gives up at `deadline` with an error;
//   an error leaves the connection unusable (half a command may be in flight).
//   Waits poll the connection's fd when it has one (TCP), else spin, yield
//   and nap (base/backoff.h).
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "base/status.h"
#include "transports/transport.h"

namespace tutti::core {

struct ProbeCmd {
  uint32_t magic;
  uint32_t kind;   // kPing, kBulk, kStop
  uint64_t bytes;  // kBulk: payload bytes that follow
};
static_assert(sizeof(ProbeCmd) == 16, "ProbeCmd is wire format");
static_assert(std::is_trivially_copyable_v<ProbeCmd>, "ProbeCmd is wire format");

struct LinkProbeOptions {
  int pings = 8;
  size_t warmupBytes = 1 << 20;
  size_t bulkBytes = 2 << 20;
  int bulkTransfers = 2;  // timed transfers at most (at least 1 runs)
  std::chrono::milliseconds budget{40};
  transport::Clock::time_point deadline;  // required: every wait gives up here
  const std::atomic<bool>* abortFlag = nullptr;
  bool oversubscribed = false;  // shared memory waits: see base/backoff.h
};

struct LinkProbeResult {
  double latencyUs = 0;     // one way: median round trip / 2
  double bandwidthGBs = 0;  // one direction, initiator to responder (1e9 bytes/s)
  int pings = 0;            // timed round trips
  int transfers = 0;        // timed bulk transfers
  double elapsedMs = 0;     // from the first answer on (warm-up transfer included)
};

// Initiator: measures, then tells the responder to stop.
Result<LinkProbeResult> probeLink(transport::Connection& conn, const LinkProbeOptions& opt);
// Initiator that does not measure: only the stop command.
Status skipLinkProbe(transport::Connection& conn, const LinkProbeOptions& opt);
// Responder: answers commands until the stop command.
Status serveLinkProbe(transport::Connection& conn, const LinkProbeOptions& opt);

}  // namespace tutti::core
