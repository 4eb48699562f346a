#!/usr/bin/env bash
# The asynchrony and abort benchmark (docs/performance.md, "Asynchrony and
# abort"): runs tutti-async-bench from the build tree (TUTTI_BUILD_DIR,
# default build/), which prints its tables and exits non-zero when a result
# is not exact, a call failed, an aborted call did not return an error, or a
# process hung. Arguments go to tutti-async-bench (--help); without any it
# runs both transports, 10 trials per kind with the peer 500 ms late, and the
# 1 GiB abort (2 GiB of host memory per process).
set -euo pipefail
cd "$(dirname "$0")/../.."
bin="${TUTTI_BUILD_DIR:-build}/bench/async/tutti-async-bench"
if [ ! -x "$bin" ]; then
  echo "run.sh: $bin not found: build it (cmake --build ${TUTTI_BUILD_DIR:-build} --target tutti-async-bench)" >&2
  exit 2
fi
exec "$bin" "$@"
