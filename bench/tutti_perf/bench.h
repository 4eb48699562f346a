// tutti-perf: the benchmark proper, run by every rank on an initialized
// communicator. Rank 0 prints nccl-tests' table; the other ranks print nothing
// on stdout.
//
// Contract: runBenchmark is collective (every rank calls it with the same
// options) and blocks until the sweep is done. Buffers are host memory (or,
// with --mem device, ncclMemAlloc'd memory that only tutti touches, with host
// shadows for inputs and checks) and every operation uses the NULL stream, so
// each call completes before it returns. A failing NCCL call is reported on stderr and ends the
// process (exit code 3) after aborting the communicator, so that peers notice.
#pragma once

#include <string>

#include "nccl.h"
#include "options.h"

namespace tutti::perf {

struct RankContext {
  int rank = 0;
  int nranks = 1;
  int local_rank = 0;
  ncclComm_t comm = nullptr;
  long long rss_before_init = 0;  // residentBytes() before ncclCommInitRank (-M)
};

// Exit codes shared by the whole program.
constexpr int kExitOk = 0;
constexpr int kExitWrongResults = 1;
constexpr int kExitUsage = 2;
constexpr int kExitError = 3;
constexpr int kExitTimeout = 124;

// Whether the library in use provides what the options need from tutti
// beyond NCCL (--mem device: tuttiMemcpy, tuttiBackendName); false with
// *error set if not. Calls nothing in the library: safe before fork.
bool checkLibrarySupport(const Options& opts, std::string* error);
// Prints the preamble (rank 0 only; call before the communicator exists).
void printPreamble(const Options& opts, int nranks);
// Returns kExitOk, or kExitWrongResults when any result was wrong (or the
// average bus bandwidth was under NCCL_TESTS_MIN_BW).
int runBenchmark(const Options& opts, const RankContext& ctx);

// This process's resident set size in bytes (0 when unknown).
long long residentBytes();
// -J: creates `path` exclusively, or path.0, path.1, ... when it exists (as
// nccl-tests does); *created is the one made. False with *error set otherwise.
bool createJsonFile(const std::string& path, std::string* created, std::string* error);
// The JSON file rank 0 of this process wrote (empty if none).
const std::string& jsonFileWritten();

}  // namespace tutti::perf
