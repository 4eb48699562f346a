// The flight recorder (issue 28): the last operations a communicator was
// given, kept for the question users of collective libraries ask most when a
// job stops: "which rank hangs?".
//
// Contract:
// - record(op) keeps `op` (a collective with its call number, or a send or
//   receive with its peer) among the last kCapacity of the communicator and
//   returns its number, which the operation carries (Op::rec); ended(rec, ok)
//   marks it done or failed. Both are a handful of relaxed atomic stores
//   (no lock, no read-modify-write, no allocation: they sit on every call's
//   path; about 5 ns together); record reads a coarse clock
//   (CLOCK_MONOTONIC_COARSE, a few ms resolution).
// - The operations of one communicator are recorded by the threads that
//   call it (NCCL: one at a time) and ended by those or its engine; entries()
//   may run on any thread at any time: an entry being overwritten is skipped.
// - Comm dumps them once when it fails (a timeout, a peer's death, a
//   mismatch: Comm::setError) or is aborted with an operation pending: to the
//   log (WARN), and, with TUTTI_DEBUG_DUMP, as one JSON line appended to
//   that file (dumpJson); bench/fault/flight_merge.py merges the ranks' lines
//   and names the rank the others wait for.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "core/op.h"

namespace tutti::core {

class FlightRecorder {
 public:
  static constexpr size_t kCapacity = 64;

  enum class State : uint8_t { kPending, kDone, kFailed };
  struct Entry {
    uint64_t rec = 0;   // record()'s number: 0, 1, 2, ... per communicator
    uint64_t call = 0;  // Op::call (collectives only)
    algo::Collective coll{};
    size_t count = 0;
    int dt = 0, op = 0;
    int root = 0;         // root, or peer of a send or receive
    double calledAt = 0;  // seconds since the recorder was made
    State state = State::kPending;
  };

  FlightRecorder();
  uint64_t record(const Op& op);
  void ended(uint64_t rec, bool ok);
  // The operations kept, oldest first.
  std::vector<Entry> entries() const;
  // How many operations were recorded in all.
  uint64_t recorded() const { return next_.load(std::memory_order_relaxed); }
  // Seconds since the recorder was made, on record()'s clock.
  double now() const;

 private:
  struct Slot {
    // rec + 1 once the slot holds operation `rec` (0: empty); written last
    // by record(), so a reader that sees it sees the rest.
    std::atomic<uint64_t> tag{0};
    std::atomic<uint64_t> call{0};
    std::atomic<uint64_t> shape{0};  // collective | dt << 8 | op << 16 | root << 32
    std::atomic<uint64_t> count{0};
    std::atomic<int64_t> calledMs{0};
    std::atomic<uint8_t> state{0};
  };
  std::array<Slot, kCapacity> slots_;
  std::atomic<uint64_t> next_{0};
  int64_t startMs_ = 0;
};

// The communicator's side of a dump: what FlightRecorder keeps, plus who it
// was and what it waited for.
struct FlightDump {
  uint64_t commHash = 0;
  int rank = 0, nranks = 0;
  std::string host;
  int pid = 0;
  std::string reason;
  std::vector<int> waitingOn;
  uint64_t recorded = 0;
  double at = 0;  // FlightRecorder::now() when dumped
  std::vector<FlightRecorder::Entry> entries;
};

// The dump as text lines for the log (the summary first), and as one JSON
// object (one line) for TUTTI_DEBUG_DUMP.
std::vector<std::string> dumpLines(const FlightDump& d);
std::string dumpJson(const FlightDump& d);
// TUTTI_DEBUG_DUMP with %h (host), %p (pid) and %r (rank) replaced.
std::string dumpPath(const std::string& pattern, const FlightDump& d);

}  // namespace tutti::core
