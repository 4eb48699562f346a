#!/usr/bin/env bash
# The long fuzzing run: every fuzz target of tests/fuzz (one per parser:
# the unique id, NCCL_COMM_ID addresses, the connection handshake, bootstrap
# frames, the data-path message header, topology XML, config files) for
# 10,000,000 executions each under libFuzzer with ASan and UBSan, through
# scripts/fuzz.sh (the clang-14 build in build-fuzz/). The test suite runs the
# short form (ctest fuzz.short: a few seconds per target).
#   bench/fuzz/run.sh [--runs N] [--parallel N] [target...]
# Prints a table: target | executions | seconds | exec/s | crashes | exit.
# At 25,000 to 300,000 executions per second on one core the targets but
# topology_xml take about 20 minutes together; topology_xml runs at about
# 1,000 a second (hwloc reads each input and its dump), about 3 hours for its
# 10,000,000 (docs/architecture.md, "Fuzzing"); --parallel 2
# runs two targets at a time. Exit status:
# scripts/fuzz.sh's (1 on a crash, 77 when clang-14 or libFuzzer is missing).
set -euo pipefail
cd "$(dirname "$0")/../.."
RUNS=10000000
args=()
while (($#)); do
  case $1 in
    --runs) RUNS=$2; shift 2 ;;
    --parallel) args+=(--parallel "$2"); shift 2 ;;
    -*) echo "unknown option $1" >&2; exit 2 ;;
    *) args+=("$1"); shift ;;
  esac
done
exec bash scripts/fuzz.sh --runs "$RUNS" "${args[@]}"
