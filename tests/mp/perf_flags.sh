#!/usr/bin/env bash
# tutti-perf against nccl-tests 2.19's flags, flag by flag (docs/tutti-perf.md,
# "nccl-tests parity"): one table of (exit code, environment, arguments,
# checks), one loop. Every run is small (--np 2 or 3, -n 2, -w 1, up to 64K).
#
# Checks, separated by " ;; " in the last column (stdout unless said):
#   line:RE          a line matches the extended regex RE
#   noline:RE        no line matches RE
#   err:RE           a stderr line matches RE
#   noerr:RE         no stderr line matches RE
#   hdr:A,B,...      the column-name header line is exactly "# A B ..."
#   cols:N           every result row has N fields (and there is one)
#   rows:N           there are N result rows
#   colval:C=V       in every row the column named C holds V; C@k: the k-th
#                    column of that name only (the halves repeat the names)
#   colnum:C         every column named C holds a number
#   json:EXPR        the -J file (@JSON@) is one JSON document d, and the
#                    Python expression EXPR is true for it
#   png:             the --plot file (@PNG@) is a PNG image
#
# usage: perf_flags.sh <path to tutti-perf>
set -u

perf=${1:?usage: perf_flags.sh <path to tutti-perf>}
if [[ ! -x $perf ]]; then
  echo "perf_flags: '$perf' is not an executable" >&2
  exit 2
fi
py=/usr/bin/python3
[[ -x $py ]] || py=python3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

have_json=1
"$perf" all_reduce -b 8 -e 8 -n 1 -w 0 --np 1 -J "$tmp/probe.json" >/dev/null 2>&1 || have_json=0
have_mpl=1
"$py" -c 'import matplotlib' 2>/dev/null || have_mpl=0

B="-b 8 -e 4K -f 8 -n 2 -w 1 -T 60"
S='^# Out of bounds values : 0 OK$'
H13="size,count,type,redop,root,time,algbw,busbw,#wrong,time,algbw,busbw,#wrong"
STAMP='[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2}$'
IT='i_min,i_max,i_p99,i_cv%'

# exit | environment | arguments | checks
table=$(
  cat <<EOF
0 | - | all_reduce $B --np 2 | hdr:$H13 ;; cols:13 ;; rows:4 ;; colval:#wrong=0 ;; line:$S ;; line:graph: 0 unalign: 0$
0 | - | all_reduce -b 8 -e 64 -f 8 -n 2 --np 2 | line:warmup iters: 1 iters: 2 ;; line:$S
0 | - | all_reduce $B -c 3 --np 2 | line:validation: 3 ;; colval:#wrong=0 ;; line:$S
0 | - | all_reduce $B -c 0 --np 2 | line:validation: 0 ;; colval:#wrong=N/A ;; line:$S
0 | - | all_reduce $B -z 0 --np 2 | noline:Blocking ;; line:$S
0 | - | all_reduce $B -z 1 -m 2 --np 2 | line:^# Blocking Enabled: wait and barrier after each inner iteration ;; colval:#wrong=0 ;; line:$S
0 | - | all_reduce $B -z 2 --np 2 | line:^# Blocking Enabled: wait after each inner iteration \(-m\), no barrier ;; line:$S
0 | - | all_reduce $B -z 3 --np 3 | line:^# Blocking Enabled: wait and barrier after each outer iteration \(-n\); time excludes barrier ;; colval:#wrong=0 ;; line:$S
0 | - | all_reduce $B -C 1 --np 2 -J @JSON@ | hdr:size,count,type,redop,root,cputime,algbw,busbw,#wrong,cputime,algbw,busbw,#wrong ;; cols:13 ;; json:all('cpu_time' in r['out_of_place'] and 'time' not in r['in_place'] for r in d['results'])
0 | - | all_reduce $B -C 0 --np 2 | hdr:$H13
0 | - | all_reduce $B -I 1 --np 2 | hdr:size,count,type,redop,root,time,algbw,busbw,#wrong,$IT,time,algbw,busbw,#wrong,$IT ;; cols:21 ;; colnum:i_min ;; colnum:i_max ;; colnum:i_p99 ;; colnum:i_cv% ;; colval:#wrong=0 ;; line:^# Per-Iteration Report
0 | - | all_reduce -b 8 -e 4K -f 8 -n 5 -w 1 -I 1 -K 2 --np 3 -J @JSON@ | line:summary skips first 2 iterations ;; cols:21 ;; json:all(r[h]['skipped_iterations'] == 2 and len(r[h]['times_us']) == 5 and len(r[h]['per_process_max_times_us']) == 3 and r[h]['min_us'] <= r[h]['p99_us'] <= r[h]['max_us'] for r in d['results'] for h in ('out_of_place_per_iter', 'in_place_per_iter')) ;; json:d['config']['per_iter_timing'] == 'true' and d['config']['per_iter_skip'] == 2
0 | - | all_reduce $B -K 1 --np 2 | err:-K/--per_iter_skip 1 ignored ;; cols:13
0 | - | all_reduce $B -S 1 --np 2 | hdr:$H13,timestamp ;; cols:15 ;; line:$STAMP ;; line:$S
0 | - | all_reduce $B -S 1 -I 1 --np 2 | cols:23 ;; line:$STAMP
0 | - | all_reduce $B --np 3 -J @JSON@ | line:^# Writing JSON output to ;; cols:13 ;; json:d['version'] == 3 and len(d['results']) == 4 and len(d['config']['devices']) == 3 ;; json:d['out_of_bounds'] == {'count': 0, 'okay': 'true'} and all(r['out_of_place']['nwrong'] == 0 for r in d['results']) ;; json:[r['size'] for r in d['results']] == [8, 64, 512, 4096] and d['config']['step_factor'] == 8
0 | - | alltoallv -b 1K -e 64K -f 8 -n 2 -w 1 -T 60 --np 3 -J @JSON@ | json:len(d['results']) == 3 and all(r['in_place']['nwrong'] is None for r in d['results'])
0 | - | all_reduce $B -M 1 --np 2 | line:^# Host memory usage    : Initialization [0-9.]+ [KMG]?B \| User-Allocated [0-9.]+ [KMG]?B \| Collective [0-9.]+ [KMG]?B \| Total  [0-9.]+ [KMG]?B$ ;; line:$S
0 | - | all_reduce $B -M 0 --np 2 | noline:memory usage
0 | - | all_reduce $B -u 3 -d all --np 2 | line:unalign: 3$ ;; colval:#wrong=0 ;; rows:48 ;; line:$S
0 | - | all_gather $B -u 1 --np 3 | line:unalign: 1$ ;; colval:#wrong=0 ;; line:$S
0 | - | all_reduce $B -R 0 --np 2 | noline:^# Registration
0 | - | all_reduce $B -R 1 --np 2 | line:^# Registration: local \(-R 1\): ncclCommRegister ;; colval:#wrong=0 ;; line:$S
0 | - | reduce_scatter $B -R 2 --np 2 | line:^# Registration: .*ncclCommWindowRegister ;; colval:#wrong=0 ;; line:$S
0 | - | all_reduce $B -y 1 --np 2 | line:^# NULL stream: every operation runs on the NULL stream ;; line:$S
0 | - | all_reduce $B -y 0 --np 2 | line:^# NULL stream: .*-y 0 changes nothing ;; line:$S
0 | - | all_reduce $B -p 1 --np 2 | line:^# Parallel Init Enabled ;; line:$S
0 | - | all_reduce $B -p 0 --np 2 | line:^# Parallel Init Enabled: .*-p 0 changes nothing ;; line:$S
0 | - | all_reduce $B -o mulsum --np 2 | colval:redop=mulsum ;; colval:#wrong=0 ;; line:$S
0 | - | reduce $B -o premulsum --np 2 | colval:redop=mulsum ;; colval:#wrong=0 ;; line:$S
0 | - | alltoallv -b 1K -e 64K -f 8 -n 2 -w 1 -T 60 --np 3 | colval:#wrong@1=0 ;; colval:#wrong@2=N/A ;; colval:redop=none ;; cols:13 ;; rows:3 ;; line:^# Collective test concluded: alltoallv_perf$ ;; line:$S
0 | NCCL_TESTS_ALLTOALLV_SPREAD=0 | alltoallv_perf -b 1K -e 64K -f 8 -n 2 -w 1 -T 60 --np 4 -d all | colval:#wrong@1=0 ;; line:SPREAD=0 ;; line:$S
0 | - | hypercube -b 1K -e 64K -f 8 -n 2 -w 1 -T 60 --np 4 | colval:#wrong=0 ;; colval:redop=none ;; rows:3 ;; line:^# Collective test concluded: hypercube_perf$ ;; line:$S
0 | - | hypercube_perf -b 8 -e 4K -f 8 -n 2 -w 1 -T 60 --np 2 -d all | colval:#wrong=0 ;; line:$S
2 | - | hypercube $B --np 3 | err:power-of-two
0 | - | all_reduce $B -x 1 -V 16 -G 1 -D 0 --np 2 | err:-x/--cta_policy 1 accepted, not applicable here ;; err:-V/--device_cta_count 16 accepted, not applicable here ;; err:-G/--cudagraph 1 accepted, not applicable here ;; line:$S
0 | - | all_reduce $B --compress 1bit --np 2 | line:^# Compression: onebit ;; cols:14 ;; line:$S
0 | - | all_reduce $B --compress onebit --np 2 | line:^# Compression: onebit ;; line:$S
0 | TUTTI_PERF_PROGRESS=1 | all_reduce $B --np 2 | err:^tutti-perf: size 1 of 4 done ;; err:^tutti-perf: size 4 of 4 done ;; noline:size 1 of ;; line:$S
0 | TUTTI_PERF_PROGRESS=0 | all_reduce $B --np 2 | noerr:size 1 of
0 | - | all_gather $B --np 2 --plot @PNG@ | png: ;; line:$S
2 | - | all_reduce $B -D 1 | err:-D/--device_implementation 1 is not supported
2 | - | all_reduce $B -I 1 -K 2 | err:-K/--per_iter_skip 2
2 | - | all_reduce $B -J @JSON@.txt | err:only .json is supported
2 | - | all_reduce $B -J /nonexistent-dir/x.json | err:cannot create
2 | - | all_reduce $B -z 4 | err:-z/--blocking
2 | - | all_reduce $B -R 3 | err:-R/--local_register
2 | - | all_reduce $B -I 2 | err:-I/--per_iter_timing
2 | - | all_reduce $B -c x | err:-c/--check
2 | - | all_reduce $B --compress 2bit | err:onebit
EOF
)

failures=0
n=0

# The fields of the column-name header line ("#" dropped), one per line.
header_names() { grep -m1 -E '^# +size +count ' <<<"$1" | awk '{for (i = 2; i <= NF; ++i) print $i}'; }
# Result rows: the lines that start with a size.
result_rows() { grep -E '^ *[0-9]+ +[0-9]+ ' <<<"$1"; }

# check SPEC: 0 when it holds for $out/$err/$json/$png, else 1 with $why set.
check() {
  local spec=$1 kind=${1%%:*} arg=${1#*:}
  why=
  case $kind in
    line) grep -qE -- "$arg" <<<"$out" || why="no line matches /$arg/" ;;
    noline) ! grep -qE -- "$arg" <<<"$out" || why="a line matches /$arg/" ;;
    err) grep -qE -- "$arg" <<<"$err" || why="no stderr line matches /$arg/" ;;
    noerr) ! grep -qE -- "$arg" <<<"$err" || why="a stderr line matches /$arg/" ;;
    hdr)
      local got
      got=$(header_names "$out" | paste -sd, -)
      [[ $got == "$arg" ]] || why="header is '$got', expected '$arg'"
      ;;
    cols)
      local bad
      bad=$(result_rows "$out" | awk -v n="$arg" 'NF != n {print NF": "$0; exit}')
      if [[ -z $(result_rows "$out") ]]; then
        why="no result rows"
      elif [[ -n $bad ]]; then
        why="a row has $bad (expected $arg fields)"
      fi
      ;;
    rows)
      local got
      got=$(result_rows "$out" | wc -l)
      [[ $got -eq $arg ]] || why="$got result rows, expected $arg"
      ;;
    colval | colnum)
      local name=${arg%%=*} want=${arg#*=} nth=0 idx bad
      [[ $kind == colnum ]] && want=
      if [[ $name == *@* ]]; then
        nth=${name#*@}
        name=${name%@*}
      fi
      idx=$(header_names "$out" | awk -v c="$name" -v k="$nth" '$0 == c {++seen; if (k == 0 || seen == k) printf "%d ", NR}')
      if [[ -z $idx ]]; then
        why="no column '$name' in the header"
      elif [[ -z $(result_rows "$out") ]]; then
        why="no result rows"
      else
        bad=$(result_rows "$out" | awk -v cols="$idx" -v want="$want" -v num=$([[ $kind == colnum ]] && echo 1 || echo 0) '
          BEGIN { n = split(cols, c, " ") }
          { for (i = 1; i <= n; ++i) {
              v = $(c[i])
              if (num ? v !~ /^[0-9]+(\.[0-9]+)?(e[-+]?[0-9]+)?$/ : v != want) { print "field " c[i] " is \"" v "\" in: " $0; exit }
          } }')
        [[ -z $bad ]] || why="$bad"
      fi
      ;;
    json)
      if [[ ! -s $json ]]; then
        why="no JSON file $json"
      elif ! "$py" -c 'import json, sys
d = json.load(open(sys.argv[1]))
sys.exit(0 if eval(sys.argv[2]) else 1)' "$json" "$arg" 2>"$tmp/pyerr"; then
        why="JSON check failed: $arg $(tail -n 1 "$tmp/pyerr")"
      fi
      ;;
    png)
      [[ $(head -c 8 "$png" 2>/dev/null | od -An -tx1 | tr -d ' \n') == 89504e470d0a1a0a ]] ||
        why="$png is not a PNG image"
      ;;
    *) why="unknown check '$spec'" ;;
  esac
  [[ -z $why ]]
}

while IFS= read -r row; do
  [[ -z ${row// /} ]] && continue
  n=$((n + 1))
  IFS='|' read -r want envs args checks <<<"$row"
  want=${want// /}
  envs=$(echo $envs)
  json="$tmp/run$n.json"
  png="$tmp/run$n.png"
  args=${args//@JSON@/$json}
  args=${args//@PNG@/$png}
  if [[ $checks == *json:* || $args == *" -J "* ]] && [[ $have_json -eq 0 ]]; then
    echo "skip (tutti-perf built without nlohmann-json): $args"
    continue
  fi
  if [[ $checks == *png:* ]] && [[ $have_json -eq 0 || $have_mpl -eq 0 ]]; then
    echo "skip (needs nlohmann-json and python3-matplotlib): $args"
    continue
  fi
  env_list=()
  [[ $envs != - ]] && read -ra env_list <<<"$envs"
  # shellcheck disable=SC2086 # the arguments are words
  out=$(env ${env_list[@]+"${env_list[@]}"} "$perf" $args 2>"$tmp/stderr")
  rc=$?
  err=$(<"$tmp/stderr")
  failed=()
  [[ $rc -eq $want ]] || failed+=("exit code $rc, expected $want")
  while IFS= read -r spec; do
    spec=$(sed 's/^ *//; s/ *$//' <<<"$spec")
    [[ -z $spec ]] && continue
    check "$spec" || failed+=("$why")
  done < <(sed 's/ ;; /\n/g' <<<"$checks")
  label="tutti-perf $(echo $args)"
  [[ $envs != - ]] && label="$envs $label"
  if [[ ${#failed[@]} -eq 0 ]]; then
    echo "ok: $label"
  else
    echo "FAIL: $label"
    printf '    - %s\n' "${failed[@]}"
    { tail -n 12 <<<"$out"; tail -n 5 <<<"$err"; } | sed 's/^/    | /'
    failures=$((failures + 1))
  fi
done <<<"$table"

if [[ $failures -ne 0 ]]; then
  echo "perf_flags: $failures of $n rows failed"
  exit 1
fi
echo "perf_flags: all $n rows passed"
