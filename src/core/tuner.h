// Run-time tuning: the algorithm, the number of channels and the chunk size
// of large collectives, chosen from what they measure on this communicator.
//
// Contract
// - A class is a collective (all-reduce, all-gather, reduce-scatter) and a
//   size class: its whole vector (all-reduce: the buffer; all-gather and
//   reduce-scatter: every rank's block) in [2^k, 2^(k+1)) bytes, from
//   TUTTI_TUNE_MIN_BYTES up. Each class is tuned on its own.
// - A class tunes one knob at a time (a stage): the algorithm, then the
//   channels, then the chunk size. A stage's candidates are the setting
//   chosen so far (the incumbent, first) and its alternatives; its calls try
//   them in turn, kTrials times each, side by side. Then the ranks agree
//   (core/group.cc agreeTuning: one small all-reduce of every rank's figures,
//   so every rank holds the same numbers and takes the same decision) and
//   the stage's winner becomes the incumbent: a challenger wins when its time
//   is below kKeep times the incumbent's. After the last stage the class runs
//   its setting.
// - Deterministic: the setting of every call is a function of the calls of
//   its class so far and of the agreed figures, so every rank runs every
//   call alike (the operation fingerprint, which carries the algorithm and
//   the plan, would catch a rank that did not). Measurements only decide.
// - Numerics: the channels and the chunk size never change a result (each
//   element is reduced in the same order, whatever the slicing); the
//   algorithm changes the order of a floating-point reduction as each
//   algorithm's documented order says (docs/topology-algorithms.md), so a
//   tuned class may give other rounding in its first calls than later.
//   TUTTI_TUNE=0 or NCCL_ALGO keep one algorithm.
// - Not thread-safe: used under the communicator's mutex, by the thread that
//   runs its operations, in call order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "algo/schedule.h"

namespace tutti::core {

// What an operation runs with (core::Op::tune; part of a plan's shape).
struct Tuning {
  int8_t algo = -1;         // the algo::CollArgs::Algo it runs; -1: the cost model's choice
  uint8_t channels = 0;     // the channels its messages leave on; 0: every one
  uint32_t chunkBytes = 0;  // the slice size; 0: the communicator's
  // Bookkeeping, not part of what runs: the class (-1: not tuned), the
  // candidate this call tries (-1: none, the class has settled), and whether
  // the call ends its class's stage (the ranks agree after it).
  int32_t cls = -1;
  int16_t trial = -1;
  bool last = false;

  bool sameRun(const Tuning& o) const {
    return algo == o.algo && channels == o.channels && chunkBytes == o.chunkBytes;
  }
};

class Tuner {
 public:
  enum Knob : unsigned { kAlgo = 1, kChannels = 2, kChunk = 4, kAll = 7 };
  struct Options {
    unsigned knobs = 0;                 // what is tuned (0: nothing)
    size_t minBytes = size_t{1} << 20;  // TUTTI_TUNE_MIN_BYTES
    int nranks = 1;
    int channels = 1;               // the communicator's channels
    size_t chunkBytes = 512 << 10;  // its chunk size
    size_t minChunkBytes = 4 << 10, maxChunkBytes = 2 << 20;
  };
  // Calls per candidate in a stage (each rank's figure is the fastest): 2
  // left the 4-rank shared-memory runs of bench/tune on 2 vCPUs to noise.
  static constexpr int kTrials = 3;
  // A challenger replaces the incumbent when faster than this times its
  // time (at 0.97 with 2 trials, noise moved settings both ways there).
  static constexpr double kKeep = 0.9;

  Tuner() = default;
  explicit Tuner(const Options& o) : opt_(o) {}
  const Options& options() const { return opt_; }

  // TUTTI_TUNE: "1", "all" or unset: every knob; "0", "off" or "none":
  // nothing; else a comma list of "algo", "channels", "chunk". False for
  // anything else.
  static bool parseKnobs(const std::string& value, unsigned* knobs);
  static std::string knobNames(unsigned knobs);

  // The whole vector of an operation (see the contract), in bytes.
  static size_t vectorBytes(algo::Collective coll, size_t count, size_t elemSize, int nranks);
  // Whether a collective with a vector of `bytes` is tuned.
  bool tunes(algo::Collective coll, size_t bytes) const;
  // The setting for the next call of the class of (coll, bytes), in call
  // order. `algorithms`: the candidate algorithms, the cost model's choice
  // first (algo::algorithmCandidates), asked once per class (and again after
  // restart()); only when the algorithm is tuned.
  Tuning next(algo::Collective coll, size_t bytes,
              const std::function<std::vector<algo::CollArgs::Algo>()>& algorithms);
  // This rank's time for a call that ran `t` (a trial), in microseconds.
  void record(const Tuning& t, double us);
  // After the call that ended a stage (t.last): this rank's figure per
  // candidate (its fastest trial; infinity when none was measured), for
  // the ranks to sum.
  std::vector<double> figures(const Tuning& t) const;
  // Ends that stage with the sums over `nranks` ranks (the same on every
  // rank); returns what was decided, for the log.
  std::string decide(const Tuning& t, const std::vector<double>& sums);
  // Conditions changed (the balance re-planned): every class tunes again
  // from its next call, starting from the cost model's choice.
  void restart();
  // Tests: the class's setting once it has settled (nullopt: unseen, or
  // still trying candidates).
  std::optional<Tuning> settled(algo::Collective coll, size_t bytes) const;
  // "AllReduce of 16-32 MiB".
  static std::string describeClass(algo::Collective coll, size_t bytes);
  std::string describe(const Tuning& t) const;

 private:
  struct Class {
    algo::Collective coll{};
    int log2 = 0;
    Tuning best;                              // the incumbent
    std::vector<algo::CollArgs::Algo> algos;  // candidate algorithms (stage kAlgo)
    unsigned stage = 0;                       // the knob being tuned; 0: settled
    std::vector<Tuning> cands;                // this stage's candidates (cands[0]: the incumbent)
    std::vector<double> mine;                 // this rank's fastest time per candidate
    int calls = 0;                            // calls in this stage
    uint64_t explored = 0;                    // calls that tried a candidate, all stages
  };
  // Moves `c` to its next stage with more than one candidate after `from`
  // (0: the first), or settles it.
  void advance(Class& c, unsigned from) const;
  std::vector<Tuning> candidates(const Class& c, unsigned knob) const;
  size_t classBytes(const Class& c) const { return size_t{1} << c.log2; }

  Options opt_;
  std::vector<Class> classes_;
  std::map<std::pair<int, int>, int32_t> index_;  // (coll, log2) -> classes_
};

}  // namespace tutti::core
