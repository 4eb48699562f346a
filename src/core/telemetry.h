// Straggler telemetry: who arrives late at the collectives, and which network
// link is slow, measured on every data message and named by every rank.
//
// Contract
// - Always on, and cheap: the executor reads the clock once per message
//   sent and once per header received, stamps a 24-byte Gossip on every
//   message header (core/wire_header.h) and tells this class what arrived
//   and what left; an operation that sends kRateMinBytes or more to a peer
//   over the network reads each channel's counters at its start and end.
//   Operations of no collective call (point to point) and those that send
//   no messages (the one-shot and device-IPC paths) are not measured.
// - Lateness. A sender stamps how long after the start of its operation it
//   sent each message (Gossip::sinceStart). The receiver takes the arrival
//   time minus that as the moment the sender started, on its own clock: no
//   clocks are compared between hosts. The peer's lateness in an operation
//   is that moment minus this rank's own start, the least over the peer's
//   messages (queueing only adds to it). A sender also stamps how long it
//   spent outside tutti before the operation (its gap: from the end of its
//   last measured operation). A peer is late by the lesser of its lateness
//   and how much longer its gap was than this rank's: a rank that computes
//   longer than the others before calling (a slow *compute* rank) is late
//   by both; a rank whose previous operation ended later (its inbound link
//   is slow) starts late but with no longer a gap, and is not late.
// - Slow links. The network knows best how a link carried what it was
//   given: for every peer this rank sent at least kRateMinBytes to in an
//   operation, it reads the connections' counters (TCP_INFO: bytes
//   acknowledged, time busy sending less the time the receiver's window was
//   the limit; Connection::linkCounters) and takes, since its last look, the
//   busy time over the operation's time (how saturated the link was) and
//   bytes over busy time (its rate). The link's bytes are its channels'
//   sum, its busy time their longest (channels fed from one queue are busy
//   together; the union of their busy times is not known). Only a saturated link (busy kSaturated
//   of the operation or more) says how fast it can go: a link that waits on
//   its receiver or on its sender's data is not busy then, and a lightly
//   used link's bytes may leave at the wire's speed out of a rate limiter's
//   burst allowance. A saturated link is slow when its rate is below
//   kSlowRatio of the reference: the inter-node bandwidth the link probe
//   measured at init (or the topology file gave), else the fastest saturated
//   link known (a saturated link's bytes may still have left partly in a
//   rate limiter's burst: an even network's links measured up to 2x their
//   rate under load). (In a pipelined ring every link
//   carries the same bytes at the slowest link's pace: the slow link is the
//   saturated one; on an even ring all are, at one rate.) Each operation's
//   figures move the smoothed ones a quarter of the way (the first sets
//   them). Shared memory is not a link here; transports without counters
//   (net plugins today) are not measured.
// - Gossip. Each rank stamps its view (the worst late rank, the slowest
//   saturated link and the fastest saturated link's rate it knows, with the
//   oldest collective call they were measured in) on its messages, and takes
//   from the messages it receives a view measured at most 8 collective calls
//   before that names a worse straggler (later, or a slower link). A view is
//   never restamped with a newer call than it was measured in, so nothing
//   circulates once the cause is gone. A late rank is in the view as soon as
//   a header shows it (in a ring it reaches every rank within the same
//   operation); link rates when the operation that measured them ends (they
//   reach the others in the next one).
// - Naming. At the end of each measured collective a rank keeps its view's
//   late rank (if later than kLateMin and a tenth of this rank's operation
//   time: less costs the others little) and its slow link (above); when the
//   same one holds kWarnAfter operations in a row, one WARN line names it
//   (the rank, its host and, for a link, both ends, by how much and for how
//   many operations); the same straggler is named again only after
//   kQuietOps operations without it. An even run (no candidate persists)
//   prints nothing.
// - The balance re-plan (Comm::replanBalance): for the links to the ranks
//   of the next node (watchNextNode), every measured operation that sent
//   across nodes only to the next node (the ring algorithms, the two-level
//   algorithms' network ring; not recursive doubling or Rabenseifner's,
//   whose traffic to other nodes shares the node's link) adds what they
//   carried (acknowledged bytes, the busiest connection's busy time) and
//   its own time to a sum that Comm takes when the ranks gather their
//   figures.
// - tuttiCommStragglers (tutti.h) reads this rank's measurements and its
//   named stragglers (Telemetry::report), from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <vector>

#include "algo/balance.h"
#include "core/wire_header.h"
#include "transports/transport.h"
#include "tutti/tutti.h"

namespace tutti::core {

class Comm;

// One line of Telemetry::report: tutti.h's tuttiStraggler_t.
using StragglerRow = tuttiStraggler_t;

class Telemetry {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr std::chrono::milliseconds kLateMin{20};
  static constexpr size_t kRateMinBytes = 128 << 10;
  static constexpr uint64_t kRateMinBusyUs = 1000;  // less: too little to judge
  static constexpr double kSaturated = 0.6;         // of the operation's time
  static constexpr double kSlowRatio = 0.5;
  static constexpr int kWarnAfter = 3;

  explicit Telemetry(Comm* comm);

  // The executor's side (under the communicator's mutex).
  void begin(uint32_t call, Clock::time_point start);
  Gossip stamp(Clock::time_point now) const;
  // A header of this operation from `peer`, complete at `now`.
  void onHeader(int peer, const Gossip& g, Clock::time_point now);
  // This operation will send `bytes` to `peer` (at its start): enough, and
  // the link's counters are read now and at the end.
  void willSend(int peer, uint64_t bytes);
  // A message of `bytes` payload sent to `peer`.
  void onSent(int peer, size_t bytes) {
    if (measuring_) sent_[peer] += bytes;
  }
  void end(Clock::time_point now);

  // Any thread.
  std::vector<StragglerRow> report() const;

  // The balance re-plan's sums (under the communicator's mutex): `where`,
  // per peer, which node it is on.
  enum Where : uint8_t { kThisNode, kNextNode, kOtherNode };
  void watchNextNode(std::vector<uint8_t> where) { where_ = std::move(where); }
  const algo::LinkLoad& nextNodeLoad() const { return nextLoad_; }
  void clearNextNodeLoad() { nextLoad_ = {}; }

 private:
  struct Late {
    int rank = -1;
    uint32_t ms = 0;
    uint32_t call = 0;  // measured in this collective call
  };
  struct Link {
    int from = -1, to = -1;
    uint32_t slowMBps = 0;
    uint32_t call = 0;
  };
  void merge(const Gossip& g);
  void takeLate(const Late& l);
  void takeLink(const Link& l);
  void name(int64_t lateMinUs, std::vector<StragglerRow>* rows);

  Comm* comm_;
  int rank_, nranks_;
  // The operation being measured.
  bool measuring_ = false;
  uint32_t call_ = 0;
  Clock::time_point start_{};
  int64_t gapUs_ = 0;   // since the last measured operation ended (0: first)
  bool ended_ = false;  // one ended
  Clock::time_point lastEnd_{};
  std::vector<int64_t> lateUs_;  // per peer: least lateness seen (INT64_MIN: none)
  std::vector<uint64_t> sent_;   // per peer: payload bytes sent in this operation
  // Per peer, the link to it: each channel's counters at the start of this
  // operation (`based_`: read), this operation's rate and busy fraction
  // (measureLinks), and both smoothed (0: not measured yet).
  std::vector<std::vector<transport::Connection::LinkCounters>> seen_;  // [peer][channel]
  std::vector<uint8_t> based_;
  bool countersOf(int peer, std::vector<transport::Connection::LinkCounters>* out) const;
  std::vector<double> mbps_, busy_;
  std::vector<double> avgMBps_, avgBusy_;
  static constexpr double kSmoothing = 0.25;  // the weight of each operation's figures
  void measureLinks(int64_t tookUs);
  std::vector<uint8_t> where_;  // watchNextNode (empty: not summed)
  algo::LinkLoad nextLoad_;
  // The view (what this rank stamps and names).
  Late late_;
  Link link_;
  uint32_t fastMBps_ = 0, fastCall_ = 0;  // the fastest saturated link's rate known
  // How long each verdict held, and what was named (Episode::advance).
  struct Episode {
    int64_t key = -1, named = -1;
    uint64_t run = 0, heldAt = 0, away = 0;
    bool advance(int64_t k, uint64_t op);
  };
  static constexpr uint64_t kQuietOps = 8;
  uint64_t ops_ = 0;  // measured operations
  Episode lateEp_, linkEp_;
  mutable std::mutex mu_;           // guards rows_ (report() runs on any thread)
  std::vector<StragglerRow> rows_;  // of the last measured operation
};

}  // namespace tutti::core
