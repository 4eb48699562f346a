// tutti-sim: predicts collective times by running the library's own schedule
// generator (algo::makeSchedule) for every rank and simulating the messages
// over a model of links (docs/simulator.md).
//
// Contract: the simulator is deterministic, single-threaded and pure (no
// I/O); it never blocks and never throws on bad schedules, it returns a
// Status naming rank, peer and tag instead. Schedules are matched like the
// executor (src/core/executor.cc) matches them: a send meets the receive of
// its peer with the same tag; local steps run first; a send starts once its
// `waitRecv` receive has completed; a receive completes once its message has
// arrived and its `after` receive has completed. The model:
// - every rank has an intra-node send port and receive port (`cost.intra`);
// - every node has a NIC uplink and downlink (`cost.inter`), shared by all of
//   the node's ranks: a message between two nodes occupies the sender node's
//   uplink, then the receiver node's downlink;
//   (SimConfig::nodeInterGBs gives a node's NIC a bandwidth of its own);
// - a message occupies each of its two resources for bytes / bandwidth, in
//   FIFO order of arrival at the resource (no fair sharing), the second one
//   from `latencyUs` after it started on the first (so an idle path delivers
//   it latency + bytes / bandwidth after it was ready);
// - optionally every rank has one CPU that spends `msgOverheadUs` per send
//   and bytes / `computeGBs` per reduction, local step and final division.
// Time is in microseconds (double); GB = 1e9 bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "algo/schedule.h"
#include "base/status.h"

namespace tutti::sim {

struct SimConfig {
  algo::CostModel cost;      // intra: per-rank ports; inter: per-node NIC
  // Per node: its NIC's bandwidth both ways, GB/s, where it differs from
  // cost.inter's (a slow node); a missing or non-positive entry: cost.inter.
  std::vector<double> nodeInterGBs;
  double computeGBs = 0;     // per rank: reduce / copy / scale throughput; 0: free
  double msgOverheadUs = 0;  // per message, on the sending rank's CPU; 0: none
};

struct SimResult {
  double timeUs = 0;               // completion: the last rank to finish
  std::vector<double> rankTimeUs;  // per rank: its last receive done or send gone
  uint64_t messages = 0;
  uint64_t messageBytes = 0;  // all messages
  uint64_t interNodeMessages = 0;
  uint64_t interNodeBytes = 0;  // messages between different nodes
  std::string algorithm;        // rank 0's Schedule::algorithm (for rank counts > 1)
  // Filled by simulate() (it knows the collective); 0 for simulateSchedules().
  size_t sizeBytes = 0;  // nccl-tests' "size" column (see collSizeBytes)
  double algBwGBs = 0;   // sizeBytes / time
  double busBwGBs = 0;   // algBw * busFactor
};

// A node map with consecutive ranks per node: {8, 8} is ranks 0-7 on node 0
// and 8-15 on node 1 (NodeMap::fromHostIds with host id = node index).
algo::NodeMap makeNodeMap(const std::vector<int>& ranksPerNode);

// nccl-tests' bus bandwidth factor: all-reduce 2(n-1)/n; reduce-scatter,
// all-gather, all-to-all, gather, scatter (n-1)/n; broadcast, reduce 1.
double busFactor(algo::Collective c, int nranks);

// nccl-tests' "size" of one call: count * elemSize, times nranks where
// `count` is per rank (all-gather, reduce-scatter, all-to-all, gather, scatter).
size_t collSizeBytes(const algo::CollArgs& a);

// Generates every rank's schedule for `a` (a.rank ignored; a.nodes null = one
// node; a.cost null = cfg.cost) and simulates them. Schedules are generated
// and folded in one rank at a time, so memory is proportional to the number
// of messages, not to the schedules' size. Errors: kInvalidArgument for bad
// arguments, kInternalError for an inconsistent schedule or a deadlock (the
// message names rank, peer and tag).
Result<SimResult> simulate(const algo::CollArgs& a, const SimConfig& cfg);

// Simulates hand-made (or pre-generated) schedules, one per rank in rank
// order. `nodes` null: every rank on one node.
Result<SimResult> simulateSchedules(const std::vector<algo::Schedule>& schedules,
                                    const algo::NodeMap* nodes, const SimConfig& cfg);

// Formats a tag the way the generators build it: "0x... (phase p, x, j)".
std::string describeTag(uint64_t tag);

}  // namespace tutti::sim
