// tutti-perf: command line. nccl-tests' flags (where they make sense for a
// host-memory, one-rank-per-process benchmark) plus tutti's own --np.
//
// Contract: parseOptions never exits and never throws; it reports bad input
// on stderr and tells the caller what exit code to use.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "types.h"

namespace tutti::perf {

enum class Coll {
  kAllReduce,
  kAllGather,
  kReduceScatter,
  kBroadcast,
  kReduce,
  kAllToAll,
  kGather,
  kScatter,
  kSendRecv,
};

struct CollInfo {
  Coll coll;
  const char* name;  // "all_reduce"; the nccl-tests binary is name + "_perf"
  bool has_op;
  bool has_root;
};

// Accepts "all_reduce", "all_reduce_perf", "allreduce", "AllReduce", ...
const CollInfo* findColl(const std::string& name);
const std::vector<CollInfo>& allColls();

// --compress: all_reduce through tuttiAllReduceCompressed (docs/tutti-perf.md).
enum class Compress { kOff, kNone, kFp16, kBf16, kOneBit, kPowerSGD };
// "none", "fp16", "bf16", "1bit", "powersgd" ("off" for kOff).
const char* compressName(Compress c);

// --mem: where the buffers the collectives run on live (docs/tutti-perf.md).
// kDevice: ncclMemAlloc'd memory of tutti's process backend, with host shadow
// buffers for the inputs and the checks, copied with tuttiMemcpy (tutti only).
enum class Mem { kHost, kDevice };
// "host", "device".
const char* memName(Mem m);

struct Options {
  const CollInfo* coll = nullptr;
  size_t min_bytes = size_t{32} << 20;
  size_t max_bytes = size_t{32} << 20;
  size_t step_bytes = size_t{1} << 20;
  size_t step_factor = 1;
  int iters = 20;
  int warmup_iters = 5;
  int agg_iters = 1;
  int check = 1;
  int average = 1;  // 0 rank 0, 1 average, 2 min, 3 max across ranks
  int root = 0;     // -1: every rank in turn
  int blocking = 0;
  long run_cycles = 1;  // 0: forever
  int timeout_s = 0;    // 0: none
  int np = 2;
  bool np_given = false;
  std::vector<const TypeInfo*> types;
  std::vector<Op> ops;
  Compress compress = Compress::kOff;  // kOff: plain ncclAllReduce
  int powersgd_rank = 4;
  Mem mem = Mem::kHost;
};

enum class ParseResult { kOk, kHelp, kError };

ParseResult parseOptions(int argc, char** argv, Options* opts);
void printUsage(const char* prog);

}  // namespace tutti::perf
