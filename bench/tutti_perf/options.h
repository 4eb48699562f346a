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
  kAllToAllv,  // nccl-tests' alltoallv: per-peer sizes of a distance-weighted pattern
  kHyperCube,  // nccl-tests' hypercube: an all-gather in log2(n) pairwise exchanges
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
// "none", "fp16", "bf16", "onebit", "powersgd" ("off" for kOff); "1bit" is
// accepted on the command line as an old spelling of "onebit".
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
  int warmup_iters = 1;  // nccl-tests 2.19's default
  int agg_iters = 1;
  int check = 1;    // -c N: N checked calls per result (0: none)
  int average = 1;  // 0 rank 0, 1 average, 2 min, 3 max across ranks
  int root = 0;     // -1: every rank in turn
  // -z: 0 none, 1 barrier after each inner iteration (-m), 2 wait after each
  // inner iteration (every call waits on host memory), 3 barrier after each
  // outer iteration, excluded from the time.
  int blocking = 0;
  int report_cputime = 0;     // -C 1: the time column is "cputime"
  int report_timestamps = 0;  // -S 1: a timestamp ends every row
  int per_iter = 0;           // -I 1: i_min i_max i_p99 i_cv% after each half
  int per_iter_skip = 0;      // -K: leading iterations left out of the -I stats
  int unalign = 0;            // -u: buffers start this many elements past the allocation
  int local_register = 0;     // -R: 0 none, 1 ncclCommRegister, 2 ncclCommWindowRegister
  int stream_null = -1;       // -y as given (-1: not given); always the NULL stream
  int parallel_init = -1;     // -p as given (-1: not given); always parallel
  int memory_report = 0;      // -M 1: host memory report after the footer
  std::string json_path;      // -J as given
  // The file -J writes: json_path, or json_path.N when that exists (as
  // nccl-tests), created by the launching process before the ranks start;
  // empty under a launcher, where rank 0 picks it.
  std::string json_file;
  std::string plot_path;           // --plot FILE.png
  std::vector<std::string> args;   // the command line, for -J
  std::vector<std::string> notes;  // "accepted, not applicable" notes for rank 0 to print
  long run_cycles = 1;             // 0: forever
  int timeout_s = 0;               // 0: none
  int np = 2;
  bool np_given = false;
  std::vector<const TypeInfo*> types;
  std::vector<Op> ops;
  Compress compress = Compress::kOff;  // kOff: plain ncclAllReduce
  int powersgd_rank = 4;
  Mem mem = Mem::kHost;
};

enum class ParseResult { kOk, kHelp, kError };

// Whether this tutti-perf writes JSON (-J, --plot): built with nlohmann-json.
bool haveJson();

ParseResult parseOptions(int argc, char** argv, Options* opts);
void printUsage(const char* prog);

}  // namespace tutti::perf
