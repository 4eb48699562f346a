#!/usr/bin/env bash
# Run-time tuning against none (issue 27; docs/performance.md "Run-time
# tuning"; core/tuner.h): tutti-perf on local ranks, each round running the
# modes side by side on new communicators:
#   off   TUTTI_TUNE=0 (the cost model's algorithm, TUTTI_NCHANNELS channels,
#         TUTTI_CHUNK_SIZE chunks)
#   on    the default (every class of 1 MiB or more tunes its algorithm,
#         channels and chunk size during its first calls)
# With the default warm-up (-w 24, every size) each class has settled before
# the timed iterations, so the table compares settled settings; -w 0 shows
# what the trials cost a short run instead. A run's time per size is the
# better of tutti-perf's out-of-place and in-place averages; the table gives
# each mode's runs, medians and the ratio off / on (above 1: tuning is
# faster), then the decisions rank 0 logged in the last round.
#
# usage: bench/tune/run.sh [options]
#   --coll C          all_reduce, all_gather or reduce_scatter (all_reduce)
#   --np N            local ranks (4)
#   --tcp             NCCL_SHM_DISABLE=1 (ranks talk over loopback TCP)
#   --links SPEC      with --tcp: emulated link rates, TUTTI_TEST_LINK_MBPS
#                     (from:to:MBps,...; a test hook: token buckets per link)
#   -b B, -e E        sizes, doubling (1M, 64M)
#   --rounds K        rounds (3); --iters N (10); --warmup N (24)
#   --perf PATH       tutti-perf (default: build/bench/tutti_perf/tutti-perf)
#   --out DIR         keep the raw outputs there (default: a temporary directory)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
coll=all_reduce np=4 tcp=0 links='' begin=1M end=64M rounds=3 iters=10 warmup=24
perf=$root/build/bench/tutti_perf/tutti-perf out=''
while (($# > 0)); do
  case $1 in
    --coll) coll=$2; shift 2 ;;
    --np) np=$2; shift 2 ;;
    --tcp) tcp=1; shift ;;
    --links) links=$2; shift 2 ;;
    -b) begin=$2; shift 2 ;;
    -e) end=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --iters) iters=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --perf) perf=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    -h | --help) sed -n '2,26p' "$0"; exit 0 ;;
    *) echo "run.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ -x $perf ]] || { echo "run.sh: no tutti-perf at $perf (build first)" >&2; exit 2; }
[[ -n $out ]] || out=$(mktemp -d /tmp/tutti-tune.XXXXXX)
mkdir -p "$out"

echo "# run-time tuning: $coll on $np local ranks over $( ((tcp)) && echo tcp || echo shared memory)," \
  "${links:+links $links MB/s, }$begin..$end, -n $iters -w $warmup, $rounds rounds; $(nproc) CPUs; $(date -u +%F)"
times="$out/times.tsv"
: >"$times"
for ((k = 1; k <= rounds; ++k)); do
  for m in off on; do
    log="$out/$m.$k.log"
    tune=$([[ $m == off ]] && echo 0 || echo 1)
    env TUTTI_TUNE="$tune" NCCL_SHM_DISABLE="$tcp" ${links:+TUTTI_TEST_LINK_MBPS=$links} NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=TUNING \
      "$perf" "$coll" -b "$begin" -e "$end" -f 2 -n "$iters" -w "$warmup" -c 1 --np "$np" \
      >"$log" 2>&1 || { echo "run.sh: tutti-perf failed ($m, round $k): $log" >&2; tail -5 "$log" >&2; exit 1; }
    # size, the better of out-of-place and in-place time (us); #wrong must be 0.
    awk -v m="$m" '/^ *[0-9]+ +[0-9]+ / {
        if ($(NF - 4) != 0 || $NF != 0) { print "wrong results in " FILENAME > "/dev/stderr"; exit 1 }
        t = $(NF - 7) < $(NF - 3) ? $(NF - 7) : $(NF - 3); printf "%s\t%s\t%s\n", m, $1, t }' \
      "$log" >>"$times"
  done
done

echo "| bytes | off runs (us) | off median | on runs (us) | on median | off / on |"
echo "|---|---|---|---|---|---|"
awk -F'\t' '
  function median(s,   a, n, i, j, t) {
    n = split(s, a, " ")
    for (i = 1; i <= n; ++i) for (j = i + 1; j <= n; ++j) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
  }
  { runs[$1 SUBSEP $2] = runs[$1 SUBSEP $2] " " $3; if (!($2 in seen)) { seen[$2] = 1; order[++n] = $2 } }
  END {
    for (i = 1; i <= n; ++i) {
      s = order[i]; off = median(runs["off" SUBSEP s]); on = median(runs["on" SUBSEP s])
      printf "| %s |%s | %.1f |%s | %.1f | %.2fx |\n", s, runs["off" SUBSEP s], off, runs["on" SUBSEP s], on, off / on
    }
  }' "$times"
echo "# decisions (rank 0, round $rounds):"
grep -ho 'tuning: [A-Z][A-Za-z]* of .*' "$out/on.$rounds.log" | sed 's/^/  /' || true
