#!/usr/bin/env bash
# All-reduce across emulated nodes with rate-limited links (docs/netns.md).
#
# Each "node" is a network namespace (tests/netns/netns_lib.sh); ranks of one
# node share memory, ranks of different nodes talk over TCP through the node's
# veth link, shaped with tc tbf to --rate in both directions. The script
#   1. measures the link: one plain TCP stream node 0 -> node 1 (tcp_stream.py),
#      then one stream each way at the same time;
#   2. runs tutti-perf all_reduce once per NCCL_ALGO value (auto = unset),
#      then once per --compress codec (tutti-perf --compress, NCCL_ALGO unset);
#   3. prints a markdown table: per size and algorithm the time, algbw and
#      busbw (out-of-place), algbw as a fraction of the nominal link rate, of
#      the measured TCP rate and of the ideal, and algbw relative to ring;
#      with --compress also the wire ratio and algbw relative to the best
#      uncompressed row at that size (the "effective busbw" ratio).
#
# The ideal all-reduce algbw over N nodes whose links carry B each way is
# B * N / (2 (N - 1)) (reduce-scatter + all-gather between nodes: each node
# sends and receives 2 (N-1)/N of the data); for 2 nodes that is B itself.
#
# usage: bench/netns/run.sh [options]
#   --nodes SPEC     ranks per node (2,2)
#   --rate R         link rate, tc syntax (1gbit); "none": no shaping
#   --sizes S        MIN:MAX:FACTOR, one tutti-perf sweep (1K:256M:4), or a
#                    comma list (4M,64M), one tutti-perf run per size
#   --algos A        comma list of NCCL_ALGO values (auto,ring,2dring,hierarchical)
#   --compress C     comma list of codecs, each one more row set: none, fp16, bf16,
#                    onebit (or 1bit), powersgd (default: none of them, the table as without)
#   --powersgd-rank R  PowerSGD's rank (4)
#   --iters N        timed iterations per size (5); --warmup N (1)
#   --check          validate results (-c 1); default -c 0
#   --tcp-secs S     seconds of each TCP measurement (3)
#   --perf PATH      tutti-perf (default: build-netns, then build, build-*/)
#   --out DIR        keep the raw outputs there (default: a temporary directory)
# Needs root (network namespaces); exits 77 when they cannot be made.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
# shellcheck source=SCRIPTDIR/../../tests/netns/netns_lib.sh
source "$root/tests/netns/netns_lib.sh"

spec=2,2 rate=1gbit sizes=1K:256M:4 algos=auto,ring,2dring,hierarchical
iters=5 warmup=1 check=0 tcp_secs=3 perf='' out='' compress='' psgd_rank=4
while (($# > 0)); do
  case $1 in
    --nodes) spec=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --sizes) sizes=$2; shift 2 ;;
    --algos) algos=$2; shift 2 ;;
    --iters) iters=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --check) check=1; shift ;;
    --tcp-secs) tcp_secs=$2; shift 2 ;;
    --perf) perf=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --compress) compress=$2; shift 2 ;;
    --powersgd-rank) psgd_rank=$2; shift 2 ;;
    -h | --help) sed -n '2,36p' "$0"; exit 0 ;;
    *) echo "run.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

if [[ -z $perf ]]; then
  for d in build-netns build "$root"/build-*; do
    [[ $d == /* ]] || d="$root/$d"
    for f in "$d/bench/tutti_perf/tutti-perf" "$d/bin/tutti-perf"; do
      if [[ -x $f ]]; then
        perf=$f
        break 2
      fi
    done
  done
fi
[[ -n $perf && -x $perf ]] || { echo "run.sh: tutti-perf not found; pass --perf PATH" >&2; exit 2; }

shape=$rate
link_Bps=0
if [[ $rate == none ]]; then
  shape=''
else
  link_Bps=$(netns_rate_bytes "$rate") || { echo "run.sh: cannot read --rate '$rate'" >&2; exit 2; }
fi

IFS=, read -ra per <<<"$spec"
nodes=${#per[@]}
((nodes >= 2)) || { echo "run.sh: --nodes needs at least 2 nodes" >&2; exit 2; }
world=0
for n in "${per[@]}"; do world=$((world + n)); done
IFS=, read -ra algo_list <<<"$algos"
compress_list=()
if [[ -n $compress ]]; then
  IFS=, read -ra compress_list <<<"$compress"
  for c in "${compress_list[@]}"; do
    case $c in
      none | fp16 | bf16 | onebit | 1bit | powersgd) ;;
      *) echo "run.sh: unknown codec '$c' in --compress (none, fp16, bf16, onebit, powersgd)" >&2; exit 2 ;;
    esac
  done
fi
[[ $psgd_rank =~ ^[1-9][0-9]*$ ]] || { echo "run.sh: --powersgd-rank needs an integer >= 1" >&2; exit 2; }

size_args=()
if [[ $sizes == *:*:* ]]; then
  IFS=: read -r smin smax sfac <<<"$sizes"
  size_args+=("-b $smin -e $smax -f $sfac")
else
  IFS=, read -ra slist <<<"$sizes"
  for s in "${slist[@]}"; do size_args+=("-b $s -e $s"); done
fi

netns_setup "$nodes" "$shape"
if [[ -z $out ]]; then
  out="$NETNS_WORKDIR/bench"
fi
mkdir -p "$out"
echo "# netns all-reduce benchmark: $nodes nodes ($spec ranks), links ${shape:-unshaped}" \
  "${shape:+(tbf burst ${NETNS_TBF_BURST_USED} bytes, latency ${NETNS_TBF_LATENCY_USED}) }tutti-perf: $perf"
echo "# outputs in $out$([[ $out == "$NETNS_WORKDIR"/* ]] && echo ' (removed at exit; use --out to keep)')"

# 1. The link, measured with a plain TCP stream.
tcp_one=$(netns_tcp_rate 0 1 "$tcp_secs")
echo "# TCP one stream 0 -> 1: $tcp_one"
tcp_one_Bps=$(sed 's/.*GB\/s=\([0-9.]*\).*/\1/' <<<"$tcp_one" | awk '{printf "%.0f", $1 * 1e9}')
netns_tcp_rate 1 0 "$tcp_secs" >"$out/tcp_bidir_10" &
bid=$!
tcp_b01=$(netns_tcp_rate 0 1 "$tcp_secs")
wait "$bid"
tcp_b10=$(cat "$out/tcp_bidir_10")
echo "# TCP both ways at once: 0 -> 1 $tcp_b01"
echo "#                        1 -> 0 $tcp_b10"
tcp_bidir_Bps=$(printf '%s\n%s\n' "$tcp_b01" "$tcp_b10" |
  sed 's/.*GB\/s=\([0-9.]*\).*/\1/' | awk '{s += $1} END {printf "%.0f", s / NR * 1e9}')

# 2. tutti-perf per algorithm. NCCL_DEBUG=INFO with subsystem TUNING logs the
# algorithm each operation ran (one line per operation, in each rank's log).
export NETNS_SHOW=0 NETNS_TIMEOUT=${NETNS_TIMEOUT:-1800}
results="$out/results.tsv"
: >"$results"
# The row sets: one per NCCL_ALGO value, then one per --compress codec
# ("compress=<codec>": tutti-perf --compress, NCCL_ALGO unset).
row_sets=("${algo_list[@]}")
for c in "${compress_list[@]}"; do row_sets+=("compress=$c"); done
for algo in "${row_sets[@]}"; do
  for sa in "${size_args[@]}"; do
    # shellcheck disable=SC2206  # "-b X -e Y -f Z" splits into arguments
    args=($sa)
    tag="${algo//=/-}${sa// /}"
    extra=()
    noran=-
    if [[ $algo == compress=* ]]; then
      codec=${algo#compress=}
      envs=(env -u NCCL_ALGO)
      extra=(--compress "$codec")
      if [[ $codec == powersgd ]]; then
        extra+=(--powersgd-rank "$psgd_rank")
        # Its own all-reduces are of the factors P and Q, not of the data.
        noran="powersgd r=$psgd_rank"
      fi
      what="tutti-perf --compress $codec"
    elif [[ $algo == auto ]]; then
      envs=(env -u NCCL_ALGO)
      what="NCCL_ALGO=$algo"
    else
      envs=(env NCCL_ALGO="$algo")
      what="NCCL_ALGO=$algo"
    fi
    echo "# running $what: tutti-perf all_reduce ${args[*]} -n $iters -w $warmup -c $check ${extra[*]}" >&2
    rc=0
    netns_run_ranks "$spec" "${envs[@]}" NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=TUNING \
      "$perf" all_reduce "${args[@]}" -n "$iters" -w "$warmup" -c "$check" "${extra[@]}" || rc=$?
    cp "$NETNS_RUN_DIR/rank0.log" "$out/$tag.log"
    if ((rc != 0)); then
      echo "run.sh: $what ${args[*]} failed (exit $rc); see above" >&2
      printf '%s\tFAILED\t%s\n' "$algo" "$rc" >>"$results"
      continue
    fi
    # Data rows: size count type redop root time algbw busbw #wrong (out of
    # place), then the same four for in place, then (--compress) the wire
    # ratio. Then the algorithm that ran for each count, from the TUNING lines.
    awk -v algo="$algo" -v noran="$noran" -v wirecol="$((${#compress_list[@]} > 0))" -v bf="$(awk -v w="$world" 'BEGIN {print 2 * (w - 1) / w}')" '
      # "AllReduce count <n> <type> on <w> ranks: algorithm <a> [(NCCL_ALGO=x[ not applicable])]
      # [(run-time tuning: a trial|settled)]"
      # (tutti-perf also reduces its timings with count-1 all-reduces: keyed
      # by count and type, they do not mix with the data rows).
      /AllReduce count [0-9]+ [a-z0-9]+ on .*algorithm / {
        c = $0; sub(/.*AllReduce count /, "", c); sub(/ on .*/, "", c)
        a = $0; sub(/.*algorithm /, "", a); sub(/ \(run-time tuning: .*/, "", a)
        na = (a ~ /not applicable/)
        sub(/ \(NCCL_ALGO=.*/, "", a)
        if (na) a = a "(forced n/a)"
        if (!((c, a) in seen)) {
          seen[c, a] = 1
          if (c in ran) ran[c] = ran[c] "+" a
          else ran[c] = a
        }
        next }
      /^ *[0-9]+ +[0-9]+ +[a-z0-9]+ / { row[++n] = $0; next }
      END {
        for (i = 1; i <= n; i++) {
          split(row[i], f, " ")
          r = ((f[2] " " f[3]) in ran) ? ran[f[2] " " f[3]] : noran
          # algbw and busbw again from size and time: tutti-perf prints 2 decimals.
          alg = f[6] > 0 ? f[1] / f[6] / 1e3 : 0
          printf "%s\t%s\t%s\t%.5f\t%.5f\t%s\t%s", algo, f[1], f[6], alg, alg * bf, f[9], r
          # With --compress, an 8th field: the wire ratio (payload / wire bytes).
          if (wirecol) printf "\t%s", (14 in f) ? f[14] : "-"
          printf "\n"
        }
      }' "$out/$tag.log" >>"$results"
  done
done

# 3. The table.
echo
echo "## all_reduce, $nodes nodes x ($spec) ranks, links ${shape:-unshaped}"
echo
if ((link_Bps > 0)); then
  awk -v l="$link_Bps" -v t="$tcp_one_Bps" -v b="$tcp_bidir_Bps" -v n="$nodes" 'BEGIN {
    printf "Link: nominal %.4f GB/s each way; TCP one stream %.4f GB/s (%.1f%% of nominal); ", l / 1e9, t / 1e9, 100 * t / l
    printf "TCP both ways at once %.4f GB/s per direction.\n", b / 1e9
    printf "Ideal all-reduce algbw over %d nodes: nominal x %d/(2x%d) = %.4f GB/s.\n", n, n, n - 1, l * n / (2 * (n - 1)) / 1e9 }'
else
  awk -v t="$tcp_one_Bps" -v b="$tcp_bidir_Bps" 'BEGIN {
    printf "Links unshaped. TCP one stream %.4f GB/s; both ways at once %.4f GB/s per direction.\n", t / 1e9, b / 1e9 }'
fi
echo "Out-of-place figures (GB = 1e9 B); algbw = size / time, busbw = algbw x 2(W-1)/W with W = $world ranks" \
  "(nccl-tests' definition). \"vs link\" = algbw / ideal at the nominal rate," \
  "\"vs TCP\" = algbw / ideal at the measured one-stream TCP rate, \"vs ring\" = algbw / ring's algbw" \
  "at that size; \"ran\": the algorithm tutti reported (TUNING log)."
if ((${#compress_list[@]} > 0)); then
  psgd_note=''
  [[ ,$compress, == *,powersgd,* ]] && psgd_note=", PowerSGD rank $psgd_rank"
  echo "compress=<codec> rows: tutti-perf --compress <codec> (tuttiAllReduceCompressed, NCCL_ALGO" \
    "unset$psgd_note); size, algbw and busbw count the float32 payload." \
    "\"wire\" = payload / bytes sent, over all ranks (tuttiCompressorGetStats);" \
    "\"vs best\" = algbw / the best uncompressed row's algbw at that size (NCCL_ALGO rows and" \
    "compress=none): the effective busbw ratio."
fi
echo
awk -F'\t' -v l="$link_Bps" -v t="$tcp_one_Bps" -v n="$nodes" -v wirecol="$((${#compress_list[@]} > 0))" '
  $2 == "FAILED" { failed[$1] = $3; next }
  {
    key = $2; if (!(key in sz)) { sz[key] = 1; sizes[++ns] = key }
    if (!($1 in al)) { al[$1] = 1; algos[++na] = $1 }
    time[$1, key] = $3; alg[$1, key] = $4; bus[$1, key] = $5; ran[$1, key] = $7; wire[$1, key] = $8
    # The best uncompressed row per size: any NCCL_ALGO row, or compress=none.
    if (($1 !~ /^compress=/ || $1 == "compress=none") && (!(key in best) || $4 > best[key])) {
      best[key] = $4; bestname[key] = $1
    }
  }
  function human(b) {
    if (b >= 1073741824 && b % 1073741824 == 0) return b / 1073741824 "G"
    if (b >= 1048576 && b % 1048576 == 0) return b / 1048576 "M"
    if (b >= 1024 && b % 1024 == 0) return b / 1024 "K"
    return b
  }
  function ratio(x, y) { return (y > 0 && x != "") ? sprintf("%.3f", x / y) : "-" }
  END {
    ideal = n / (2 * (n - 1))
    if (wirecol) {
      print "| size | algo | ran | time (us) | algbw (GB/s) | busbw (GB/s) | vs link | vs TCP | vs ring | wire | vs best |"
      print "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"
    } else {
      print "| size | algo | ran | time (us) | algbw (GB/s) | busbw (GB/s) | vs link | vs TCP | vs ring |"
      print "|---:|---|---|---:|---:|---:|---:|---:|---:|"
    }
    for (i = 1; i <= ns; i++) {
      s = sizes[i]
      for (j = 1; j <= na; j++) {
        a = algos[j]
        if (!((a, s) in alg)) continue
        vr = (("ring", s) in alg) ? ratio(alg[a, s], alg["ring", s]) : "-"
        printf "| %s | %s | %s | %s | %.4f | %.4f | %s | %s | %s |", human(s), a, ran[a, s], time[a, s],
          alg[a, s], bus[a, s], ratio(alg[a, s] * 1e9, l * ideal), ratio(alg[a, s] * 1e9, t * ideal), vr
        if (wirecol) printf " %s | %s |", wire[a, s], (s in best) ? ratio(alg[a, s], best[s]) : "-"
        printf "\n"
      }
    }
    if (wirecol) {
      printf "\n"
      for (i = 1; i <= ns; i++) {
        s = sizes[i]
        if (s in best) printf "Best uncompressed at %s: %s, algbw %.4f GB/s.\n", human(s), bestname[s], best[s]
      }
    }
    for (a in failed) {
      if (a ~ /^compress=/) printf "\n%s: tutti-perf failed (exit %s)\n", a, failed[a]
      else printf "\nNCCL_ALGO=%s: tutti-perf failed (exit %s)\n", a, failed[a]
    }
  }' "$results"
