// A compressor (tutti/tutti.h): compressed all-reduce with per-gradient state.
//
// Contract
// - resolve(): the caller's configuration with its defaults filled in and
//   error feedback decided, or why it is invalid. A compressor is created
//   with what resolve() returned; local, no communication.
// - allReduce(): one compressed all-reduce of `count` float32 values, sum or
//   average, keyed by `key` (the gradient: its state is created on first use
//   and keeps its count and shape; a mismatch is ncclInvalidArgument).
//   fp16/bf16 encode on the wire (src/compress/wire.h); 1-bit runs the sign
//   all-reduce with error feedback; PowerSGD runs its rank-r step on the host
//   (src/compress/powersgd.h) with exact sums through the communicator, its
//   residuals shared by the ranks of a node when they can read each other's
//   inputs (decided once, by all ranks). Ordered on `stream` like an
//   all-reduce; returns once done. Not thread-safe: one caller at a time, as
//   the communicator's operations.
// - Collective: every rank calls allReduce with the same keys in the same
//   order, as for any all-reduce.
#pragma once

#include <memory>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "core/backend.h"
#include "core/op.h"
#include "tutti/tutti.h"

namespace tutti::compress {
class PowerSgdState;
}  // namespace tutti::compress
namespace tutti::transport::shm {
class SharedRegion;
}  // namespace tutti::transport::shm

namespace tutti::core {

class Comm;

class Compressor {
 public:
  // What a compressor runs with: the config, every field set (a shorter
  // struct from an older caller keeps the defaults of the fields it lacks),
  // and whether error feedback is on (errorFeedback -1: on for the stateful
  // kinds, 1-bit and PowerSGD).
  struct Settings {
    tuttiCompressionConfig_t cfg;
    bool feedback;
  };
  // `in` checked (kind, errorFeedback, PowerSGD's fields): kInvalidArgument
  // saying what is wrong. `in.size` must cover the fields before
  // errorFeedback (the C boundary checks it).
  static Result<Settings> resolve(const tuttiCompressionConfig_t& in);
  // "fp16", "1-bit", "PowerSGD", ... for messages; "?" for an unknown kind.
  static const char* kindName(int kind);

  Compressor(Comm* comm, const Settings& settings);
  ~Compressor();
  Compressor(const Compressor&) = delete;
  Compressor& operator=(const Compressor&) = delete;

  const tuttiCompressionConfig_t& config() const { return cfg_; }

  // One compressed all-reduce (op: ncclSum or ncclAvg; rows x cols:
  // PowerSGD's matrix shape, rows * cols == count, checked against the
  // key's first use: kInvalidArgument otherwise, nothing queued): on
  // the communicator's engine when `stream` is a device stream it takes
  // (core/group.h, runsOnEngine: queued, returns at once) or the
  // communicator is non-blocking (queued; *inProgress set: done when
  // Comm::engineBusy() turns false), else here after what the engine still
  // runs.
  Status submit(const void* send, void* recv, size_t count, int op, unsigned long long key,
                size_t rows, size_t cols, Queue stream, bool* inProgress);
  // This rank's counters since creation (wireBytesSent included), once what
  // the engine still runs has finished.
  tuttiCompressionStats_t stats() const;
  // Tests: the error-feedback residuals kept for `key` (1-bit: the worker's
  // for all count elements, then the server's for this rank's segment;
  // PowerSGD: rows x cols, its deferred update applied first), or null.
  const std::vector<float>* residual(unsigned long long key) const;

 private:
  // submit()'s work, where it runs: the state of `key`, the wire format, the
  // all-reduces.
  Status allReduce(const void* send, void* recv, size_t count, int op, unsigned long long key,
                   size_t rows, size_t cols, Queue stream);
  struct Tensor;
  struct Shape {
    size_t count, rows, cols;
  };
  // An exact all-reduce through the communicator (counted into wireBytes_
  // with `counted`), or with compression `c`.
  Status sum(const void* send, void* recv, size_t count, int dt, int op, const Compressed& c,
             Queue stream);
  Status decideNodeShare(const Compressed& exact);
  Status prepareStaging(const Compressed& exact, size_t rows, size_t cols);
  Status runPowerSgd(Tensor& t, const void* send, void* recv, size_t count, bool average,
                     unsigned long long key, size_t rows, size_t cols, Queue stream,
                     const Compressed& exact);

  Comm* comm_;
  tuttiCompressionConfig_t cfg_;
  bool feedback_;
  std::unordered_map<unsigned long long, Shape> shapes_;  // the caller's side (submit)
  std::unordered_map<unsigned long long, std::unique_ptr<Tensor>> tensors_;  // where it runs
  tuttiCompressionStats_t stats_{};
  uint64_t wireBytes_ = 0;
  // PowerSGD's residuals shared by the ranks of a node (compress/powersgd.h): -1 until the
  // first PowerSGD state decides it (then 1: shared, 0: per rank); the node's ranks in member
  // order, this rank's place among them, and each rank's process token (equal tokens: one
  // address space).
  int nodeShare_ = -1;
  uint64_t shareMinBytes_ = 0;  // smaller matrices keep residuals per rank (agreed)
  std::vector<int> nodeRanks_;
  int nodeIndex_ = 0;
  std::vector<uint64_t> tokens_;
  std::vector<uint64_t> inputs_;  // this call's input address of every rank
  // Node members in other processes read this rank's input through shared memory
  // (prepareStaging): this rank's copy of the rows they read, and each member's region (by
  // member index; null for this rank and for members in this process). -1 until the first
  // shared PowerSGD state, then 1 (on) or 0 (cross-memory reads), the same on every rank.
  int staging_ = -1;
  std::unique_ptr<transport::shm::SharedRegion> ownStage_;
  std::vector<std::unique_ptr<transport::shm::SharedRegion>> memberStage_;
};

}  // namespace tutti::core
