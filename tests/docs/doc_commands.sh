#!/usr/bin/env bash
# The commands the README and docs/*.md tell users to type, run as written.
#
# Every line of every ```sh / ```bash block in README.md and docs/*.md (a
# line ending in '\' joined with the next; blank and comment lines left out)
# must be classified in one of the two tables below:
#   RUN   the command is run here, verbatim, and must exit 0;
#   SKIP  the command is not run here, with the reason (a cluster, a GPU, a
#         placeholder program of the user's, minutes of run time, or it is
#         what CI runs anyway).
# A documented command in neither table fails the test (so a new command in
# the docs gets tested or an explicit reason), and so does a table entry the
# docs no longer contain (so the tables never drift from the docs).
#
# How "verbatim" is kept safe on a shared machine: the commands run in a
# scratch directory that holds a symbolic link to every top-level entry of the
# source tree and `build` -> the build tree, with HOME set to a scratch home
# (so ~/tutti-venv is made there) and /opt/tutti replaced by a scratch prefix
# (nothing is installed outside the scratch directory). Those two are the only
# rewrites. Programs the docs take as the user's own (my.c, my_nccl_program,
# train.py) are written into the scratch directory first.
#
# usage: doc_commands.sh <source dir> <build dir>
# Exit 0 when every RUN command passed; 1 otherwise. In a build without the
# PyTorch backend (TUTTI_BUILD_TORCH=OFF, torch not importable) the commands
# that use it are reported as skipped and the exit code is 77 if nothing
# failed.
set -u

src=$(cd "${1:?usage: doc_commands.sh <source dir> <build dir>}" && pwd)
bld=$(cd "${2:?usage: doc_commands.sh <source dir> <build dir>}" && pwd)

# ---- the tables -------------------------------------------------------------
# file | command, exactly as in the file's sh block
RUN=(
  "README.md|cmake --install build --prefix /opt/tutti"
  "README.md|/opt/tutti/bin/tutti-perf all_reduce -b 8 -e 1M -f 4 --np 2"
  "README.md|LD_PRELOAD=/opt/tutti/lib/libtutti.so ./my_nccl_program"
  "README.md|LD_LIBRARY_PATH=/opt/tutti/lib/tutti-nccl ./my_nccl_program"
  "README.md|cc my.c \$(PKG_CONFIG_PATH=/opt/tutti/lib/pkgconfig pkg-config --cflags --libs tutti) -Wl,-rpath,/opt/tutti/lib"
  "README.md|build/bench/tutti_perf/tutti-perf all_reduce -b 8 -e 1M -f 4 --np 2"
  "README.md|mpirun --allow-run-as-root --oversubscribe -np 2 build/bench/tutti_perf/tutti-perf all_reduce -b 8 -e 1M -f 4"
  "README.md|PYTHONPATH=\$PWD/build/python /usr/bin/python3 -m torch.distributed.run --nproc_per_node 2 --redirects 1 --tee 1 tests/pytorch/ddp.py"
  "README.md|/usr/bin/python3 -m venv --system-site-packages ~/tutti-venv"
  "README.md|TUTTI_PREFIX=/opt/tutti ~/tutti-venv/bin/pip install --no-build-isolation --no-index src/pytorch"
  "README.md|~/tutti-venv/bin/python tests/pytorch/launch.py --nprocs 2 ddp.py"
  "docs/pytorch.md|export PYTHONPATH=\$PWD/build/python"
  "docs/pytorch.md|PYTHONPATH=\$PWD/build/python /usr/bin/python3 -m torch.distributed.run --nproc_per_node 2 --redirects 1 --tee 1 tests/pytorch/ddp.py"
  "docs/pytorch.md|PYTHONPATH=\$PWD/build/python torchrun --nproc_per_node 2 --redirects 1 --tee 1 tests/pytorch/ddp.py"
  "docs/pytorch.md|PYTHONPATH=\$PWD/build/python /usr/bin/python3 tests/pytorch/launch.py --nprocs 2 ddp.py"
  "docs/pytorch.md|cmake --install build --prefix /opt/tutti"
  "docs/pytorch.md|/usr/bin/python3 -m venv --system-site-packages ~/tutti-venv"
  "docs/pytorch.md|TUTTI_PREFIX=/opt/tutti ~/tutti-venv/bin/pip install --no-build-isolation --no-index src/pytorch"
  "docs/pytorch.md|PKG_CONFIG_PATH=/opt/tutti/lib/pkgconfig /usr/bin/python3 -m pip install --no-build-isolation --no-index --target ~/tutti-py src/pytorch"
  "docs/pytorch.md|~/tutti-venv/bin/python tests/pytorch/launch.py --nprocs 2 ddp.py"
  "docs/pytorch.md|bash bench/pytorch/gloo_suite.sh -w 2 -k all_gather_coalesced"
  "docs/tutti-perf.md|torchrun --nproc_per_node 2 --redirects 1 --tee 1 --no_python build/bench/tutti_perf/tutti-perf all_reduce -b 8 -e 1M -f 4"
  "docs/tutti-perf.md|mpirun --allow-run-as-root --oversubscribe -np 4 build/bench/tutti_perf/tutti-perf all_reduce -b 8 -e 1M -f 4"
  "docs/security.md|head -c 32 /dev/urandom | base64 > /tmp/tutti-demo.key && chmod 600 /tmp/tutti-demo.key"
  "docs/security.md|NCCL_COMM_ID=127.0.0.1:29517 TUTTI_BOOTSTRAP_SECRET_FILE=/tmp/tutti-demo.key NCCL_SOCKET_IFNAME=lo build/bench/tutti_perf/tutti-perf all_reduce -b 8 -e 1K --np 2 -n 2 -w 1"
  "docs/security.md|NCCL_SOCKET_IFNAME=lo build/bench/tutti_perf/tutti-perf all_reduce -b 8 -e 1K --np 2 -n 2 -w 1"
  "docs/security.md|ss -Htln | grep -v -e '127\\.0\\.0\\.' -e '\\[::1\\]' || true"
  "docs/performance.md|bash bench/async/run.sh --trials 2 --late-ms 200 --abort-bytes 64M --abort-delay-ms 2"
  "docs/performance.md|bash bench/group/run.sh --reps 1 --iters 200"
  "docs/performance.md|bash bench/net/run.sh --reps 1 -e 1M"
  "docs/performance.md|bash bench/balance/run.sh --rounds 1 --size 4M --rate 100mbit --slow-rate 25mbit --iters 1 --warmup 0"
  "docs/performance.md|bash bench/balance/follow.sh --rate 100mbit --slow-rate 25mbit --size 4M --rows 8 --slow-at 4 --back-at 8"
  "docs/performance.md|bash bench/tune/run.sh --np 2 -b 1M -e 2M --rounds 1 --iters 2 --warmup 20"
  "docs/simulator.md|build/bench/sim/tutti-sim --layout 1,1,1,1 --inter-bw 1gbit --node-bw 2:250mbit --algo ring -b 64M"
  "docs/simulator.md|build/bench/sim/tutti-sim --layout 1,1,1,1 --inter-bw 1gbit --node-bw 2:250mbit --algo ring -b 64M --balance"
  "docs/transports.md|NCCL_SHM_DISABLE=1 TUTTI_NET=ucx UCX_TLS=tcp build/bench/tutti_perf/tutti-perf all_reduce -b 8 -e 1M -f 4 --np 2"
  "docs/transports.md|NCCL_SHM_DISABLE=1 TUTTI_NET=ofi FI_PROVIDER=tcp build/bench/tutti_perf/tutti-perf all_reduce -b 8 -e 1M -f 4 --np 2"
  "docs/transports.md|NCCL_SHM_DISABLE=1 NCCL_NET_PLUGIN=\$PWD/build/tests/netplugin/libnccl-net-tsock.so NCCL_NET=TestSock build/bench/tutti_perf/tutti-perf all_reduce -b 8 -e 1M -f 4 --np 2"
)
# file | command prefix | why it is not run here
SKIP=(
  "README.md|bash scripts/bench.sh|the quick start itself: CI runs scripts/test.sh, which runs the same set-up and build; bench.sh then runs the 8 B-256 MiB sweep (minutes)"
  "README.md|bash scripts/test.sh|the quick start itself: CI (.ci/run) runs it, this test is part of it"
  "docs/comparison.md|bash bench/compare/run.sh|a benchmark: tutti, Open MPI and Gloo side by side for 20-60 minutes (bench/)"
  "docs/comparison.md|rm -rf /tmp/tutti-before && git clone|the baseline for the benchmark's --baseline (bench/): a clone of the previous commit"
  "docs/comparison.md|cmake -S /tmp/tutti-before|configures the benchmark baseline's clone (bench/)"
  "docs/comparison.md|cmake --build /tmp/tutti-before/build|builds the benchmark baseline's tutti-perf: minutes (bench/)"
  "docs/netns.md|source tests/netns/netns_lib.sh|a shell-library fragment; tests/netns/netns_lib_test.sh runs each function (ctest -L netns)"
  "docs/netns.md|netns_|a shell-library function, defined only after the fragment's source line; tests/netns/netns_lib_test.sh runs each (ctest -L netns)"
  "docs/pytorch.md|cmake -S . -B build|the configure scripts/setup.sh runs before this test"
  "docs/pytorch.md|cmake --build build|the build scripts/setup.sh runs before this test"
  "docs/performance.md|cmake --build build --target tutti-async-bench|the build scripts/setup.sh runs before this test (every target)"
  "docs/performance.md|bash bench/group/run.sh --reps 9|a benchmark: about two minutes of interleaved repetitions; the short form (RUN above) runs here"
  "docs/performance.md|bash bench/balance/follow.sh --rounds 3|a benchmark: 64 MiB all-reduces while a node turns slow and recovers, about 5 minutes per round and layout; the short form (RUN above) runs here"
  "docs/performance.md|bash bench/tune/run.sh --rounds 5|a benchmark: about 4 minutes per layout; the short form (RUN above) runs here"
  "docs/performance.md|bash bench/tune/run.sh --rounds 5 --tcp|a benchmark: about 4 minutes per layout; the short form (RUN above) runs here"
  "docs/performance.md|bash bench/balance/run.sh --rounds 5|a benchmark: 64 MiB all-reduces on emulated nodes with a slow node, about 5 minutes per layout; the short form (RUN above) runs here"
  "docs/performance.md|bash bench/async/run.sh|a benchmark: about a minute, and its 1 GiB abort takes 2 GiB of host memory per process; the short form (RUN above) runs here"
  "docs/performance.md|ctest --test-dir build -L bench-smoke|the test suite itself (CI runs ctest); device.async_bench_smoke is that label's test"
  "docs/architecture.md|bash scripts/fuzz.sh --seconds 60|a minute per target plus a clang-14 build of its own (build-fuzz/); ctest fuzz.short (label fuzz) runs the same script for 5 s per target"
  "docs/architecture.md|bash bench/fuzz/run.sh|the long fuzzing run: hours, topology_xml alone about 3 (bench/); ctest fuzz.short runs the short form"
  "docs/pytorch.md|bash bench/pytorch/gloo_suite.sh|PyTorch's whole distributed suite on both backends: about 65 minutes (bench/); the short form (RUN above) runs here"
  "docs/pytorch.md|PYTHONPATH=build/python /usr/bin/python3 bench/pytorch/overlap_timeline.py|a benchmark with plots (bench/); ctest torch.ddp_overlap_np2 runs it with --check"
)

# ---- the documented commands ----------------------------------------------------
# file|command, one per line, in document order.
documented() {
  local f
  for f in "$src/README.md" "$src"/docs/*.md; do
    awk -v f="${f#"$src"/}" '
      /^```/ {
        if (on) { on = 0 } else { on = ($0 == "```sh" || $0 == "```bash") }
        next
      }
      on {
        line = $0
        while (line ~ /\\$/ && (getline nxt) > 0) { sub(/\\$/, "", line); line = line " " nxt }
        sub(/^[ \t]+/, "", line)
        if (line == "" || line ~ /^#/) next
        # a trailing comment is prose, not part of the command
        sub(/[ \t]+# .*$/, "", line)
        sub(/[ \t]+$/, "", line)
        print f "|" line
      }' "$f"
  done
}

failures=0
fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}

mapfile -t docs < <(documented)
classified() {  # file|command -> 0 when in RUN or SKIP
  local entry=$1 e
  for e in "${RUN[@]}"; do [[ $entry == "$e" ]] && return 0; done
  for e in "${SKIP[@]}"; do
    local file=${e%%|*} rest=${e#*|}
    local prefix=${rest%%|*}
    [[ $entry == "$file|$prefix"* ]] && return 0
  done
  return 1
}
for d in "${docs[@]}"; do
  classified "$d" || fail "documented command not classified (add it to RUN, or to SKIP with the reason): ${d#*|}   [${d%%|*}]"
done
for e in "${RUN[@]}"; do
  printf '%s\n' "${docs[@]}" | grep -qxF -- "$e" || fail "RUN entry no longer in the docs: ${e#*|}   [${e%%|*}]"
done
for e in "${SKIP[@]}"; do
  file=${e%%|*} rest=${e#*|}
  prefix=${rest%%|*}
  printf '%s\n' "${docs[@]}" | grep -qF -- "$file|$prefix" ||
    fail "SKIP entry no longer in the docs: $prefix   [$file]"
done
echo "doc_commands: ${#docs[@]} documented commands; ${#RUN[@]} run here, ${#SKIP[@]} skipped with a reason"

# ---- the scratch tree ---------------------------------------------------------------
scratch=$(mktemp -d /tmp/tutti-doc-commands.XXXXXX)
trap 'rm -rf "$scratch"' EXIT
root=$scratch/tree
mkdir -p "$root" "$scratch/home" "$scratch/opt"
for e in "$src"/* "$src"/.[!.]*; do
  [[ -e $e ]] || continue
  name=$(basename "$e")
  [[ $name == build* || $name == .git ]] && continue
  ln -s "$e" "$root/$name"
done
ln -s "$bld" "$root/build"
# src/pytorch is built in place by pip (setuptools' build/ directory): a copy,
# so runs never share or reuse objects.
rm "$root/src" && mkdir "$root/src"
for e in "$src"/src/*; do ln -s "$e" "$root/src/$(basename "$e")"; done
rm "$root/src/pytorch" && mkdir "$root/src/pytorch"
(cd "$src/src/pytorch" && tar cf - --exclude=./build --exclude='./*.egg-info' .) |
  (cd "$root/src/pytorch" && tar xf -)
prefix=$scratch/opt/tutti

# The user's own programs the docs refer to.
cat >"$root/my.c" <<'EOF'
/* A program written for NCCL: one rank, an all-reduce of host memory. */
#include <nccl.h>
#include <stdio.h>

int main(void) {
  int version = 0;
  ncclUniqueId id;
  ncclComm_t comm;
  float x[4] = {1, 2, 3, 4};
  if (ncclGetVersion(&version) != ncclSuccess || ncclGetUniqueId(&id) != ncclSuccess ||
      ncclCommInitRank(&comm, 1, id, 0) != ncclSuccess ||
      ncclAllReduce(x, x, 4, ncclFloat, ncclSum, comm, NULL) != ncclSuccess ||
      ncclCommDestroy(comm) != ncclSuccess || x[3] != 4.0f) {
    fprintf(stderr, "my.c: NCCL call failed: %s\n", ncclGetLastError(NULL));
    return 1;
  }
  printf("NCCL %d: all-reduce ok\n", version);
  return 0;
}
EOF

# "A program built against NVIDIA's nccl.h": my.c compiled against NVIDIA's
# header and linked to NVIDIA's libnccl.so.2 where the CUDA toolkit has them
# (it cannot initialise without a GPU, so passing proves tutti answered),
# else against tutti's header and libnccl.so.2. RUNPATH, not RPATH, so that
# LD_LIBRARY_PATH can replace the library as the README says.
nv_inc=/usr/local/cuda/include nv_lib=/usr/local/cuda/lib
if [[ -f $nv_inc/nccl.h && -f $nv_lib/libnccl.so.2 ]]; then
  inc=$nv_inc lib=$nv_lib
else
  inc=$src/include lib=$bld/tutti-nccl
fi
if ! cc "$root/my.c" -I"$inc" -L"$lib" -l:libnccl.so.2 -Wl,--enable-new-dtags,-rpath,"$lib" \
  -o "$root/my_nccl_program" 2>"$scratch/cc.err"; then
  fail "could not build my_nccl_program against $inc and $lib: $(cat "$scratch/cc.err")"
fi

# ---- run ------------------------------------------------------------------------------
export HOME=$scratch/home NCCL_SOCKET_IFNAME=lo OMP_NUM_THREADS=1 PYTHONDONTWRITEBYTECODE=1
torch_built=0
[[ -d $bld/python/tutti_torch ]] && torch_built=1
skipped=0
for e in "${RUN[@]}"; do
  file=${e%%|*} cmd=${e#*|}
  if [[ $torch_built -eq 0 && ($cmd == *torch* || $cmd == *tutti-venv* || $cmd == *src/pytorch*) ]]; then
    echo "SKIPPED (this build has no PyTorch backend): $cmd   [$file]"
    skipped=$((skipped + 1))
    continue
  fi
  run=${cmd//\/opt\/tutti/$prefix}
  start=$(date +%s)
  out=$(cd "$root" && timeout 600 bash -c "$run" 2>&1)
  rc=$?
  secs=$(($(date +%s) - start))
  if [[ $rc -ne 0 ]]; then
    fail "exit $rc after ${secs}s: $cmd   [$file]"
    tail -n 20 <<<"$out" | sed 's/^/    /'
  elif [[ $cmd == *tutti-perf* ]] && ! grep -qE '^(\[[a-z0-9]+\]:)?# Out of bounds values : 0 OK' <<<"$out"; then
    fail "no '# Out of bounds values : 0 OK' line: $cmd   [$file]"
    tail -n 20 <<<"$out" | sed 's/^/    /'
  elif [[ $cmd == *my_nccl_program ]] && ! grep -q 'all-reduce ok' <<<"$out"; then
    fail "the program did not report its all-reduce: $cmd   [$file]"
  elif [[ $cmd == "cc my.c"* ]] && ! (cd "$root" && ./a.out | grep -q 'all-reduce ok'); then
    fail "the program the cc line built (a.out) does not run: $cmd   [$file]"
  else
    echo "ok (${secs}s): $cmd   [$file]"
  fi
done

if ((failures)); then
  echo "doc_commands: $failures failure(s)"
  exit 1
fi
if ((skipped)); then
  echo "doc_commands: $skipped skipped, the rest passed"
  exit 77
fi
echo "doc_commands: all passed"
