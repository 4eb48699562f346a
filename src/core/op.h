// One operation as the API described it, validated: what the planner
// (core/group.h) turns into work for the executor, the one-shot path or device
// IPC. Plain data; the communicator it runs on is `comm`.
#pragma once

#include <cstddef>
#include <cstdint>

#include "algo/schedule.h"
#include "core/backend.h"
#include "core/tuner.h"

namespace tutti::core {

class Comm;

// A compressed all-reduce's wire format (kHalf: the scale exponent is agreed
// when the operation runs), its residuals (algo::Buf::kState) and the counter
// its wire bytes are added to.
struct Compressed {
  algo::WireSpec wire{};
  float* state = nullptr;
  uint64_t* wireBytes = nullptr;
};

struct Op {
  Comm* comm = nullptr;
  algo::Collective coll{};
  const void* send = nullptr;
  void* recv = nullptr;
  size_t count = 0;  // as passed to the API
  int dt = 0;        // ncclDataType_t, validated
  int op = 0;        // ncclRedOp_t (built-in or one of comm's PreMulSum operators), validated
  int root = 0;      // root, or peer for send/recv (a receive: kAnySource)
  // A receive from any source (tuttiRecvAny): its peer is the first whose
  // next message to this rank is a point-to-point one, found when the
  // operation runs (Comm::awaitAnySource) and written to *source.
  static constexpr int kAnySource = -2;
  int* source = nullptr;
  // A collective's number among its communicator's collective calls (every
  // rank numbers its calls alike): OpSig::call, which tells a skipped call
  // from a late one.
  uint64_t call = 0;
  // Its number in the communicator's flight recorder (FlightRecorder::record),
  // ended there when it has run.
  static constexpr uint64_t kNotRecorded = ~uint64_t{0};
  uint64_t rec = kNotRecorded;
  // A part of call `call` run on its own before it (the fp16 scale probe),
  // not the call itself: it does not stand for the call in the node arena
  // (OneShot::postedAsCall).
  bool part = false;
  // Compressed all-reduce (float32): wire format, residuals and counter;
  // needsScale: fp16 whose scale exponent all ranks agree on when it runs.
  algo::WireSpec wire{};
  bool needsScale = false;
  float* state = nullptr;
  uint64_t* wireBytes = nullptr;
  Queue stream = nullptr;  // the caller's stream: the backend queue to order with
  // What it runs with, set by the communicator's Tuner when it runs (a
  // collective of a tuned class; default: the communicator's settings).
  Tuning tune;

  // A plain operation: exact (no wire format, no counter, no residuals).
  bool raw() const {
    return wire.format == algo::Wire::kRaw && !needsScale && !state && !wireBytes;
  }
  void compress(const Compressed& c) {
    wire = c.wire;
    needsScale = c.wire.format == algo::Wire::kHalf;
    state = c.state;
    wireBytes = c.wireBytes;
  }
};

// A PreMulSum operator created on a communicator (ncclRedOpCreatePreMulSum):
// its datatype, where the scalar lives (ncclScalarResidence_t) and the scalar.
struct UserRedOp {
  bool live = false;
  int dt = 0;
  int residence = 0;
  const void* ptr = nullptr;  // ncclScalarDevice: read at each use
  double value = 0;           // ncclScalarHostImmediate: read at creation
  uint64_t raw = 0;           // ncclScalarHostImmediate: the scalar's bytes
};

inline bool isReducing(algo::Collective c) {
  return c == algo::Collective::kAllReduce || c == algo::Collective::kReduce ||
         c == algo::Collective::kReduceScatter;
}

}  // namespace tutti::core
