#!/usr/bin/env bash
# Quick start, command 2: set up, build, and run the whole test suite (ctest).
# Extra arguments go to ctest (e.g. -L unit, -R Collectives).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
BUILD_DIR="${TUTTI_BUILD_DIR:-build}"
JOBS="${TUTTI_JOBS:-$(nproc)}"
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$JOBS" --timeout 900 "$@"
