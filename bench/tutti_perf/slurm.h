// tutti-perf under srun when MPI does not see the job (srun without
// --mpi=pmix/pmi2, or a tutti-perf built without MPI): the ranks agree on the
// root's address from the job step's variables alone, as NCCL_COMM_ID.
//
// Contract: pure functions of their arguments (no environment access), so
// they can be tested without Slurm; launch.cc reads the variables.
#pragma once

#include <string>

namespace tutti::perf {

// The first host of a Slurm host list as SLURM_STEP_NODELIST spells it:
// "node[007-010,012],gpu01" -> "node007"; "rack[1-2]-n[03-04]" -> "rack1-n03";
// "a,b" -> "a". Empty when the list is empty or malformed (an unclosed '[',
// an empty range).
std::string firstSlurmHost(const std::string& nodelist);

// The root's port for a job step: 20000 + (job * 64 + step) % 12000, so
// different steps and jobs on one node get different ports, all below
// Linux's default ephemeral range (32768-60999) where outgoing connections
// take theirs. Both ids are Slurm's decimal strings; -1 when either is not a
// number.
int slurmRootPort(const std::string& job_id, const std::string& step_id);

}  // namespace tutti::perf
