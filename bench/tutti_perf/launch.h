// tutti-perf: how the ranks come to be.
//
// Without a launcher the binary forks --np copies of itself (before any tutti
// call); the parent creates the unique id, hands it to the children through
// pipes, waits for them, and stops the rest when one fails. Under torchrun,
// mpirun or srun each process is one rank and the id comes from NCCL_COMM_ID
// (derived from MASTER_ADDR/MASTER_PORT under torchrun) or, in an MPI build
// under an MPI launcher, from rank 0 through MPI_Bcast.
//
// Contract: both entry points return the process exit code; neither throws.
#pragma once

#include <string>

#include "options.h"

namespace tutti::perf {

struct LaunchEnv {
  enum class Kind { kLocal, kTorchrun, kMpi, kSlurm };
  Kind kind = Kind::kLocal;
  const char* name = "local";
  int rank = 0;
  int size = 1;
  int local_rank = 0;
};

// Reads the launchers' variables. Returns false (with *error set) when they
// are present but malformed.
bool detectLaunch(LaunchEnv* env, std::string* error);

int runForked(const Options& opts);
int runLaunched(const Options& opts, const LaunchEnv& env);

}  // namespace tutti::perf
