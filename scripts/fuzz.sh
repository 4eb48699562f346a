#!/usr/bin/env bash
# Fuzzes tutti's parsers with libFuzzer (tests/fuzz/, one target per parser).
#
# usage: scripts/fuzz.sh [--seconds N | --runs N] [--parallel N] [--build-dir DIR] [target...]
#   --seconds N     run each target for N seconds (-max_total_time; default 10)
#   --runs N        run each target for N executions instead (-runs)
#   --parallel N    run N targets at a time (default 1; each uses one core)
#   --build-dir DIR the clang build (default build-fuzz; kept between runs)
#   target...       some of: the names of tests/fuzz/*_fuzz.cc (default: all)
#
# Configures DIR with clang-14 and TUTTI_FUZZ=ON (tests/fuzz/CMakeLists.txt),
# builds the fuzz targets only (and the parts of tutti they link), then runs
# each target over a copy of its seed corpus (tests/fuzz/corpus/<target>;
# the committed corpus is never written to) and prints one row per target:
# executions, seconds, executions per second, crashes, libFuzzer's exit
# status. A crash prints libFuzzer's report (the stack) and the input, in
# hex, saved under DIR/fuzz-run/<target>/artifacts/.
#
# Exit status: 0 when no target crashed, 1 otherwise (or when the build
# failed), 2 on a usage error, 77 (with a line saying why) when clang-14 or
# libFuzzer is missing (Debian: clang-14, libclang-rt-14-dev; scripts/setup.sh
# installs both).
set -uo pipefail
cd "$(dirname "$0")/.."

usage() {
  sed -n '4,9s/^# \{0,1\}//p' "$0" >&2
  exit 2
}

seconds=10
runs=""
build=build-fuzz
parallel=1
targets=()
while (($#)); do
  case "$1" in
    --seconds)
      [[ "${2:-}" =~ ^[0-9]+$ ]] || usage
      seconds=$2 runs=""
      shift 2
      ;;
    --runs)
      [[ "${2:-}" =~ ^[0-9]+$ ]] || usage
      runs=$2
      shift 2
      ;;
    --parallel)
      [[ "${2:-}" =~ ^[1-9][0-9]*$ ]] || usage
      parallel=$2
      shift 2
      ;;
    --build-dir)
      [ -n "${2:-}" ] || usage
      build=$2
      shift 2
      ;;
    -h | --help) usage ;;
    -*) usage ;;
    *)
      targets+=("$1")
      shift
      ;;
  esac
done

all=()
for f in tests/fuzz/*_fuzz.cc; do
  n=${f##*/}
  all+=("${n%_fuzz.cc}")
done
if ((${#targets[@]} == 0)); then targets=("${all[@]}"); fi
for t in "${targets[@]}"; do
  if [ ! -f "tests/fuzz/${t}_fuzz.cc" ]; then
    echo "fuzz.sh: no fuzz target '$t' (targets: ${all[*]})" >&2
    exit 2
  fi
done

skip() {
  echo "SKIPPED: $*"
  exit 77
}
command -v clang-14 > /dev/null && command -v clang++-14 > /dev/null ||
  skip "clang-14 is not installed (Debian: apt-get install clang-14 libclang-rt-14-dev)"
probe=$(mktemp -d)
trap 'rm -rf "$probe"' EXIT
printf 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }\n' \
  > "$probe/probe.cc"
if ! clang++-14 -fsanitize=fuzzer,address,undefined "$probe/probe.cc" -o "$probe/probe" \
  2> "$probe/err"; then
  skip "clang-14 cannot link libFuzzer (Debian: apt-get install libclang-rt-14-dev): $(head -n 1 "$probe/err")"
fi

# ---- build ------------------------------------------------------------------
cc=$(command -v clang-14)
cxx=$(command -v clang++-14)
mkdir -p "$build"
# A cache made otherwise (another compiler, TUTTI_FUZZ off) is started afresh:
# CMake would drop it anyway on a compiler change, and TUTTI_FUZZ with it.
if [ -f "$build/CMakeCache.txt" ] &&
  ! { grep -qxF "CMAKE_CXX_COMPILER:STRING=$cxx" "$build/CMakeCache.txt" &&
    grep -qxF "TUTTI_FUZZ:BOOL=ON" "$build/CMakeCache.txt"; }; then
  rm -rf "$build/CMakeCache.txt" "$build/CMakeFiles"
fi
start=$(date +%s)
if ! cmake -S . -B "$build" -DCMAKE_C_COMPILER="$cc" -DCMAKE_CXX_COMPILER="$cxx" \
  -DCMAKE_BUILD_TYPE=Debug -DTUTTI_FUZZ=ON -DTUTTI_BUILD_BENCH=OFF -DTUTTI_BUILD_TORCH=OFF \
  > "$build/fuzz-configure.log" 2>&1; then
  tail -n 30 "$build/fuzz-configure.log"
  echo "fuzz.sh: configuring $build failed (log: $build/fuzz-configure.log)"
  exit 1
fi
build_targets=()
for t in "${targets[@]}"; do build_targets+=(--target "fuzz_$t"); done
if ! cmake --build "$build" -j "${TUTTI_JOBS:-$(nproc)}" "${build_targets[@]}" \
  > "$build/fuzz-build.log" 2>&1; then
  grep -E -m 20 'error|Error' "$build/fuzz-build.log"
  tail -n 20 "$build/fuzz-build.log"
  echo "fuzz.sh: building the fuzz targets failed (log: $build/fuzz-build.log)"
  exit 1
fi
echo "fuzz.sh: clang-14 build of ${#targets[@]} fuzz targets in $build: $(($(date +%s) - start)) s"

# ---- run --------------------------------------------------------------------
if [ -n "$runs" ]; then
  limit=(-runs="$runs")
  echo "fuzz.sh: $runs executions per target"
else
  limit=(-max_total_time="$seconds")
  echo "fuzz.sh: $seconds s per target"
fi
export ASAN_OPTIONS="${ASAN_OPTIONS:-}"
export UBSAN_OPTIONS="print_stacktrace=1 halt_on_error=1 ${UBSAN_OPTIONS:-}"
# One target: its row of the table in $work/row, and what to show of a
# crash in $work/report.
run_one() {
  local t=$1 work="$build/fuzz-run/$1"
  rm -rf "$work"
  mkdir -p "$work/corpus" "$work/artifacts"
  cp tests/fuzz/corpus/"$t"/* "$work/corpus/"
  local t0 t1 rc execs crashes secs rate
  t0=$(date +%s.%N)
  # topology_xml: loadXml reads each input in a forked child first, which it
  # does only in a process with one thread; libFuzzer's memory watch is a
  # thread (-rss_limit_mb), so that target caps each allocation instead.
  local memory=(-rss_limit_mb=2048)
  [ "$t" = topology_xml ] && memory=(-rss_limit_mb=0 -malloc_limit_mb=2048)
  "$build/tests/fuzz/fuzz_$t" "${limit[@]}" -timeout=10 "${memory[@]}" -error_exitcode=1 \
    -timeout_exitcode=1 -print_final_stats=1 -artifact_prefix="$work/artifacts/" "$work/corpus" \
    > "$work/log" 2>&1
  rc=$?
  t1=$(date +%s.%N)
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/log" | tail -n 1)
  [ -n "$execs" ] || execs=$(sed -n 's/^Done \([0-9]*\) runs.*/\1/p' "$work/log" | tail -n 1)
  [ -n "$execs" ] || execs=0
  crashes=$(find "$work/artifacts" -type f | wc -l)
  secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
  rate=$(awk -v n="$execs" -v a="$t0" -v b="$t1" 'BEGIN { printf "%d", (b > a) ? n / (b - a) : 0 }')
  printf '%-18s %12s %9s %10s %8s %5s\n' "$t" "$execs" "$secs" "$rate" "$crashes" "$rc" > "$work/row"
  : > "$work/report"
  if [ "$rc" -ne 0 ] || [ "$crashes" -ne 0 ]; then
    {
      echo "== $t: libFuzzer exit status $rc, $crashes crash input(s) (log: $work/log)"
      grep -v -E '^(#[0-9]+|INFO:|MERGE|\s*$)' "$work/log" | tail -n 60
      for a in "$work"/artifacts/*; do
        [ -f "$a" ] || continue
        echo "-- input $a ($(stat -c %s "$a") bytes), hex:"
        od -An -tx1 -v "$a" | tr -d ' \n' | fold -w 128
        echo
      done
    } > "$work/report"
  fi
}

running=0
for t in "${targets[@]}"; do
  if ((running >= parallel)); then
    wait -n
    running=$((running - 1))
  fi
  run_one "$t" &
  running=$((running + 1))
done
wait

failed=0
for t in "${targets[@]}"; do
  if [ ! -s "$build/fuzz-run/$t/row" ] || [ -s "$build/fuzz-run/$t/report" ]; then
    failed=1
    cat "$build/fuzz-run/$t/report" 2> /dev/null
  fi
done
printf '%-18s %12s %9s %10s %8s %5s\n' target executions seconds exec/s crashes exit
for t in "${targets[@]}"; do
  cat "$build/fuzz-run/$t/row" 2> /dev/null || echo "$t: no result"
done
if ((failed)); then
  echo "fuzz.sh: FAILED (a crash or a libFuzzer error above)"
  exit 1
fi
echo "fuzz.sh: no crash"
