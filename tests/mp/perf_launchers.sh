#!/usr/bin/env bash
# tutti-perf under the launchers operators type (docs/tutti-perf.md,
# "Launching"): Open MPI's mpirun (--oversubscribe: more ranks than this
# machine's cores), and srun as emulated by its environment variables
# (SLURM_PROCID, SLURM_STEP_NUM_TASKS, SLURM_STEP_NODELIST, ...) with no MPI
# that sees the job. Every run is on loopback only and must validate
# (`# Out of bounds values : 0 OK`) with the expected number of ranks.
#
# usage: perf_launchers.sh <tutti-perf> <with-mpi: 0|1>
# Exit 77 (skipped, reason on stdout) for the mpirun cases when tutti-perf was
# built without MPI or mpirun is missing; the srun cases run regardless.
set -u

perf=${1:?usage: perf_launchers.sh <tutti-perf> <with-mpi: 0|1>}
with_mpi=${2:?usage: perf_launchers.sh <tutti-perf> <with-mpi: 0|1>}
failures=0
skipped=()
export NCCL_SOCKET_IFNAME=lo

# check <name> <nranks> <output> <rc>: exit 0, validated, nranks ranks listed.
check() {
  local name=$1 nranks=$2 out=$3 rc=$4 ranks
  ranks=$(grep -c '^#  Rank ' <<<"$out")
  if [[ $rc -ne 0 ]] || ! grep -q '^# Out of bounds values : 0 OK' <<<"$out" ||
    [[ $ranks -ne $nranks ]]; then
    echo "FAIL: $name (exit $rc, $ranks rank lines, want $nranks)"
    tail -n 25 <<<"$out" | sed 's/^/    /'
    failures=$((failures + 1))
  else
    echo "ok: $name"
  fi
}

# ---- mpirun -------------------------------------------------------------------
if [[ $with_mpi != 1 ]]; then
  skipped+=("mpirun: this tutti-perf was built without MPI (install libopenmpi-dev and reconfigure)")
elif ! command -v mpirun >/dev/null; then
  skipped+=("mpirun: not on PATH (install openmpi-bin)")
else
  # Open MPI refuses root unless told; these two variables are its own switch.
  if [[ $(id -u) -eq 0 ]]; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  fi
  # Open MPI's own traffic on loopback too.
  mpi=(mpirun --oversubscribe --mca btl self,vader --mca oob_tcp_if_include lo)
  for np in 1 3 4; do
    out=$(timeout 120 "${mpi[@]}" -np "$np" "$perf" all_reduce -b 8 -e 256K -f 8 -n 3 -w 1 -T 100 2>&1)
    check "mpirun -np $np all_reduce" "$np" "$out" $?
  done
  out=$(timeout 120 "${mpi[@]}" -np 3 -x NCCL_SHM_DISABLE=1 "$perf" all_gather -b 8 -e 64K -f 8 \
    -n 3 -w 1 -T 100 2>&1)
  check "mpirun -np 3 all_gather over TCP" 3 "$out" $?
fi

# ---- srun, emulated -------------------------------------------------------------
# Each rank gets what srun gives a task of a one-node step; without MPI seeing
# the job and without NCCL_COMM_ID, tutti-perf derives the root's address from
# the step's first node and a port from the job and step ids.
srun_like() {
  local n=$1 job=$2
  shift 2
  local dir pids=() r rc=0
  dir=$(mktemp -d)
  for ((r = 0; r < n; r++)); do
    env -u OMPI_COMM_WORLD_RANK -u OMPI_COMM_WORLD_SIZE -u PMI_RANK -u PMI_SIZE \
      SLURM_PROCID=$r SLURM_LOCALID=$r SLURM_STEP_NUM_TASKS=$n SLURM_NTASKS=$n \
      SLURM_STEP_NODELIST="localhost" SLURM_NODELIST="localhost" SLURM_JOB_ID="$job" \
      SLURM_STEP_ID=0 timeout 120 "$perf" "$@" >"$dir/out.$r" 2>&1 &
    pids+=($!)
  done
  for ((r = 0; r < n; r++)); do
    wait "${pids[$r]}" || rc=$?
  done
  out=$(cat "$dir/out.0"; for ((r = 1; r < n; r++)); do sed "s/^/[rank $r] /" "$dir/out.$r"; done)
  rm -rf "$dir"
  return $rc
}
srun_like 3 4242 all_reduce -b 8 -e 256K -f 8 -n 3 -w 1 -T 100
check "srun-like 3 tasks all_reduce (Slurm variables, no MPI)" 3 "$out" $?

for s in "${skipped[@]}"; do echo "SKIPPED: $s"; done
if ((failures)); then
  echo "perf_launchers: $failures failure(s)"
  exit 1
fi
if ((${#skipped[@]})); then exit 77; fi
echo "perf_launchers: all passed"
