#!/usr/bin/env bash
# Quick start, command 1: set up, build, and run the main job: the all-reduce
# bus-bandwidth benchmark across local ranks (shared memory), 8 B to 256 MiB.
# Extra arguments go to tutti-perf (e.g. --np 4, -e 1G, -d half).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
BUILD_DIR="${TUTTI_BUILD_DIR:-build}"
exec "$BUILD_DIR/bench/tutti_perf/tutti-perf" all_reduce -b 8 -e 256M -f 2 --np 2 "$@"
