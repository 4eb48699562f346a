#!/usr/bin/env bash
# Issue 29's table: a local attacker against a running 4-rank tutti job.
#
#   bench/security/run.sh [-T trials] [-F trials] [-t seconds] [-n ranks]
#                         [-b bindir] [-l libdir] [-p old|new|auto] [-o outdir]
#                         [-r rows]
#
#   -T  trials per attack (10)        -F  trials of floods and intruders (5)
#   -t  seconds each job loops (5)    -n  ranks (4)
#   -b  where victim and attacker are (build/tests/security)
#   -l  a directory with the libtutti.so to attack (LD_LIBRARY_PATH; default:
#       the one the victim was linked with)
#   -p  the handshake the attacker speaks: new (base/auth.h), old (tutti before
#       issue 29: the secret in clear), auto (new when the library has it)
#   -o  where every trial's output goes (a fresh directory in /tmp)
#   -r  only these rows (space-separated keys, e.g. "idle partial"; the
#       baselines they need run too)
#
# The job (tests/security/victim.c): N ranks loop all-reduces (values checked
# exactly) and, every 5 iterations, an ncclCommSplit into 2 colours with a
# checked all-reduce on the child. Every rank runs under `ulimit -n 1024`,
# with NCCL_SOCKET_IFNAME=lo and NCCL_SHM_DISABLE=1 (the ranks talk over TCP,
# so TCP data listeners exist too), TUTTI_INIT_TIMEOUT=30 and TUTTI_TIMEOUT=30.
# Its parent gets the unique id, waits 1 s (the attacker meanwhile finds the
# root's listener, whose port is in the id), then lets the ranks join.
#
# The attacker (tests/security/attacker.cc) attacks the root's listener and
# every listener the job's processes open while it runs (ranks' bootstrap
# listeners, TCP data listeners, the roots and listeners of the split
# children), on loopback only, for as long as the job runs. Rows:
#   garbage, wrongkey, idle, partial, truncated: a job from ncclGetUniqueId
#   hugelen: a job with NCCL_COMM_ID and no secret (the only job whose key a
#     stranger has: the all-zero key; before issue 29, FNV of the address),
#     attacked from 2 s after the ranks were let go, so that the frames reach
#     the ranks' bootstrap listeners (not only the root)
#   flood: 1,100 connections to every listener, held, from before init;
#   flood_after: the same, starting 2 s after the ranks were let go (a
#     running job: the connections land on the ranks' own listeners)
#   intruder_nokey: a job with NCCL_COMM_ID and no secret; a process that
#     knows NCCL_COMM_ID joins as rank N-1 before the real one (the ranks
#     start 300 ms apart) and contributes poisoned data
#   intruder_key / intruder_wrongkey: the job has TUTTI_BOOTSTRAP_SECRET; the
#     intruder has none / a wrong one
#
# Columns: job correct: trials where every rank finished with exact data and
# the job exited 0. job slowed (worst): the largest increase, over all
# trials, of the worst init, all-reduce or split time of any rank against the
# worst of that job's baseline trials. crash: trials where a rank did not
# finish normally (killed by a signal, hung past the watchdog, or a call
# failed with an error). memory growth: the largest max RSS of any process of
# the job (ranks, and the parent hosting the root) minus the baseline's, MiB.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=tests/security/lib.sh
. "$ROOT/tests/security/lib.sh"  # freePort ssWatch wildcards
T=10 TF=5 SECS=5 NR=4 BIN=$ROOT/build/tests/security LIB='' PROTO=auto OUT='' ROWS=''
while getopts "T:F:t:n:b:l:p:o:r:h" opt; do
  case $opt in
    T) T=$OPTARG ;; F) TF=$OPTARG ;; t) SECS=$OPTARG ;; n) NR=$OPTARG ;;
    b) BIN=$OPTARG ;; l) LIB=$OPTARG ;; p) PROTO=$OPTARG ;; o) OUT=$OPTARG ;;
    r) ROWS=$OPTARG ;;
    *) sed -n '2,20p' "$0"; exit 2 ;;
  esac
done
VICTIM=$BIN/victim ATTACKER=$BIN/attacker
for b in "$VICTIM" "$ATTACKER"; do
  [ -x "$b" ] || { echo "run.sh: $b is missing (build the tests, or give -b)" >&2; exit 2; }
done
[ -n "$LIB" ] && export LD_LIBRARY_PATH=$LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
LIBFILE=$(ldd "$VICTIM" | awk '/libtutti\.so/ {print $3; exit}')
LIBFILE=$(readlink -f "$LIBFILE")
if [ "$PROTO" = auto ]; then
  if grep -qa 'tutti-auth-1 answer' "$LIBFILE"; then PROTO=new; else PROTO=old; fi
fi
[ -n "$OUT" ] || OUT=$(mktemp -d /tmp/tutti-security.XXXXXX)
mkdir -p "$OUT"
RES=$OUT/results.tsv
: > "$RES"
WATCHDOG=$((SECS + 150))
echo "library: $LIBFILE ($(stat -c %y "$LIBFILE" | cut -d. -f1)); attacker speaks the $PROTO handshake"
echo "source tree now: $(git -C "$ROOT" log -1 --format='%h %s' 2>/dev/null | cut -c1-70)$(git -C "$ROOT" diff --quiet HEAD -- src transports include 2>/dev/null || echo ' (+ uncommitted changes in src/transports/include)')"
echo "output: $OUT"

want() { [ -z "$ROWS" ] || [[ " $ROWS " == *" $1 "* ]]; }

victimEnv=(NCCL_SOCKET_IFNAME=lo NCCL_SHM_DISABLE=1 TUTTI_INIT_TIMEOUT=30 TUTTI_TIMEOUT=30)

# trial ROW I JOBKIND ATTACK [attacker args...]
#   JOBKIND: uid | commid | commid_key (stagger for intruder rows)
#   ATTACK: none | intruder_nokey | intruder_key | intruder_wrongkey | <attacker mode>
trial() {
  local row=$1 i=$2 kind=$3 attack=$4
  shift 4
  local d=$OUT/$row/$i
  mkdir -p "$d"
  local env=("${victimEnv[@]}") vargs=(-n "$NR" -t "$SECS" -d 1000 -p "$d/pid" -w "$WATCHDOG")
  local commId=""
  case $kind in
    commid | commid_key)
      commId=127.0.0.1:$(freePort)
      env+=("NCCL_COMM_ID=$commId")
      [ "$kind" = commid_key ] && env+=(TUTTI_BOOTSTRAP_SECRET=job-secret-$RANDOM$RANDOM)
      ;;
  esac
  case $row in intruder_* | base_intruder) vargs+=(-s 300) ;; esac
  ( ulimit -n 1024 && exec env "${env[@]}" "$VICTIM" "${vargs[@]}" ) > "$d/victim.out" 2> "$d/victim.err" &
  local vpid=$!
  ssWatch "$d/ss.txt" "$d/pid" 0.3 &
  local spid=$!
  local apid=""
  case $attack in
    none) ;;
    intruder_*)
      local ienv=("${victimEnv[@]}" "NCCL_COMM_ID=$commId" TUTTI_INIT_TIMEOUT=10)
      [ "$attack" = intruder_wrongkey ] && ienv+=(TUTTI_BOOTSTRAP_SECRET=wrong-secret)
      env "${ienv[@]}" "$VICTIM" -n "$NR" -I $((NR - 1)) -t "$SECS" -w "$WATCHDOG" \
        > "$d/attacker.out" 2> "$d/attacker.err" &
      apid=$!
      ;;
    *)
      local extra=()
      [ "$attack" = hugelen ] && extra+=(--comm-id "$commId")
      "$ATTACKER" "$attack" --pidfile "$d/pid" --duration $((WATCHDOG + 30)) --proto "$PROTO" \
        --listeners "$d/listeners.txt" "${extra[@]}" "$@" > "$d/attacker.out" 2> "$d/attacker.err" &
      apid=$!
      ;;
  esac
  wait "$vpid"
  local rc=$?
  if [ -n "$apid" ]; then
    # The attacker ends with the job; an intruder that got in runs to its end.
    for _ in $(seq 100); do kill -0 "$apid" 2>/dev/null || break; sleep 0.1; done
    kill "$apid" 2>/dev/null
    wait "$apid" 2>/dev/null
  fi
  kill "$spid" 2>/dev/null
  wait "$spid" 2>/dev/null
  local job
  job=$(grep '^job ' "$d/victim.out" | tail -1)
  # Ranks that did not finish normally: a signal, the watchdog, an error.
  local crash
  crash=$(grep -cE '^rank=.*(crashed=1|hung=1|errors=[1-9])' "$d/victim.out")
  [ -z "$job" ] && crash=$((crash + 1))
  local wild
  wild=$(wildcards "$d/ss.txt")
  local al
  al=$(grep '^attacker ' "$d/attacker.out" 2>/dev/null | tail -1)
  local intr=""
  case $attack in
    intruder_*)
      if grep -q '^rank=.*intruder=1' "$d/attacker.out" && grep -q 'ok=[01] ops=[1-9]' "$d/attacker.out"; then
        intr=joined
      else
        intr=refused
      fi
      ;;
  esac
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$row" "$i" "$rc" "$crash" "$wild" "$intr" "$job" "$al" >> "$RES"
  printf '  %-18s %2d: rc=%d %s\n' "$row" "$i" "$rc" "$(echo "$job" | cut -c1-150)"
}

runRow() {  # runRow ROW TRIALS JOBKIND ATTACK [attacker args...]
  local row=$1 n=$2
  shift 2
  for i in $(seq "$n"); do trial "$row" "$i" "$@"; done
}

echo "== trials"
# Baselines first: the rows compare with the baseline of the same kind of job.
runRow base_uid "$T" uid none
want hugelen && runRow base_commid "$T" commid none
(want intruder_nokey || want intruder_key || want intruder_wrongkey) &&
  runRow base_intruder "$TF" commid_key none
want garbage && runRow garbage "$T" uid garbage
want wrongkey && runRow wrongkey "$T" uid wrongkey
want idle && runRow idle "$T" uid idle
want partial && runRow partial "$T" uid partial
want truncated && runRow truncated "$T" uid truncated
want hugelen && runRow hugelen "$T" commid hugelen --after-ms 2000
want flood && runRow flood "$TF" uid flood
want flood_after && runRow flood_after "$TF" uid flood --after-ms 2000
want intruder_nokey && runRow intruder_nokey "$TF" commid intruder_nokey
want intruder_key && runRow intruder_key "$TF" commid_key intruder_key
want intruder_wrongkey && runRow intruder_wrongkey "$TF" commid_key intruder_wrongkey

# The root listener of ncclGetUniqueId without NCCL_SOCKET_IFNAME (the
# interface tutti picks itself): only listens, nobody connects.
idcheck=$OUT/idcheck
mkdir -p "$idcheck"
env -u NCCL_SOCKET_IFNAME "$VICTIM" -U 1500 -p "$idcheck/pid" > "$idcheck/out" 2>&1 &
idpid=$!
sleep 0.7
ss -Htlnp | grep "pid=$idpid," > "$idcheck/ss.txt"
wait $idpid

echo
echo "== $NR ranks, $SECS s of all-reduces and splits per trial, ulimit -n 1024; library $(basename "$LIBFILE"), $PROTO handshake"
echo
awk -F'\t' -v proto="$PROTO" '
function kv(s, k,   m) { if (match(s, " " k "=[^ ]*")) return substr(s, RSTART + length(k) + 2, RLENGTH - length(k) - 2); return "" }
function base(row) { return row ~ /^hugelen$/ ? "base_commid" : row ~ /^intruder/ ? "base_intruder" : "base_uid" }
{
  row = $1; rc = $3; crash = $4; wild = $5; intr = $6; job = $7; al = $8
  n[row]++; order[row] = order[row] ? order[row] : ++nrows; names[nrows] = row
  if (rc == 0 && kv(job, "ok") == "1") ok[row]++
  if (crash > 0) crashed[row]++
  if (wild > 0) wildcard[row] += wild
  init = kv(job, "worst_init_ms") + 0; op = kv(job, "worst_op_ms") + 0; sp = kv(job, "worst_split_ms") + 0
  rss = kv(job, "max_rss_kb") + 0; prss = kv(job, "parent_rss_kb") + 0; if (prss > rss) rss = prss
  if (init > mi[row]) mi[row] = init; if (op > mo[row]) mo[row] = op; if (sp > ms[row]) ms[row] = sp
  if (rss > mr[row]) mr[row] = rss
  if (intr == "joined") joined[row]++
  if (al != "") {
    att[row] = 1
    lst[row] += kv(al, "listeners"); cn[row] += kv(al, "connects")
    c = kv(al, "close_ms_max") + 0; if (c > cmax[row]) cmax[row] = c
    o = kv(al, "old_open_at_end") + 0; if (o > omax[row]) omax[row] = o
    h = kv(al, "halfopen_at_end") + 0; if (h > hmax[row]) hmax[row] = h
    acc[row] += kv(al, "accepted"); f = kv(al, "victim_fds_max") + 0; if (f > fds[row]) fds[row] = f
    hs[row] += kv(al, "hs_done"); wl[row] += kv(al, "wildcard")
  }
}
END {
  label["base_uid"] = "baseline (ncclGetUniqueId job, no attack)"
  label["base_commid"] = "baseline (NCCL_COMM_ID job, no secret)"
  label["base_intruder"] = "baseline (NCCL_COMM_ID job with secret, ranks 300 ms apart)"
  label["garbage"] = "garbage"; label["wrongkey"] = "wrong key"; label["idle"] = "idle"
  label["partial"] = "partial hello"; label["truncated"] = "truncated messages"
  label["hugelen"] = "huge length fields (NCCL_COMM_ID job, no secret)"
  label["flood"] = "connection flood, 1,100 per listener, from before init"
  label["flood_after"] = "connection flood, 1,100 per listener, on the running job"
  label["intruder_nokey"] = "intruder knowing NCCL_COMM_ID, job without a key"
  label["intruder_key"] = "intruder knowing NCCL_COMM_ID, job with a key, intruder without"
  label["intruder_wrongkey"] = "intruder knowing NCCL_COMM_ID, job with a key, intruder with a wrong one"
  print "| attack | trials | job correct | job slowed (worst) | crash | memory growth |"
  print "|---|---|---|---|---|---|"
  for (k = 1; k <= nrows; k++) {
    r = names[k]
    if (r ~ /^base/) {
      slowed = sprintf("(absolute) init %.2f s, all-reduce %.2f s, split %.2f s", mi[r] / 1000, mo[r] / 1000, ms[r] / 1000)
      mem = sprintf("(absolute) %.1f MiB", mr[r] / 1024)
    } else {
      b = base(r)
      di = (mi[r] - mi[b]) / 1000; do_ = (mo[r] - mo[b]) / 1000; ds = (ms[r] - ms[b]) / 1000
      w = di; what = "init"; if (do_ > w) { w = do_; what = "all-reduce" }; if (ds > w) { w = ds; what = "split" }
      if (w < 0) w = 0
      slowed = sprintf("+%.2f s (%s)", w, what)
      mem = sprintf("%+.1f MiB", (mr[r] - mr[b]) / 1024)
    }
    printf "| %s | %d | %d/%d | %s | %d/%d | %s |\n", label[r] ? label[r] : r, n[r], ok[r], n[r], slowed, crashed[r], n[r], mem
  }
  print ""
  print "The attacker'"'"'s view (all trials of a row together):"
  print ""
  print "| attack | victim listeners attacked | connections | longest a held connection stayed open | held > 2.5 s at the end (worst trial) | half-open, no victim end (worst trial) | wrong keys accepted | handshakes completed | victim fds (max) | intruder joined |"
  print "|---|---|---|---|---|---|---|---|---|---|"
  for (k = 1; k <= nrows; k++) {
    r = names[k]
    if (r ~ /^base/) continue
    if (att[r]) printf "| %s | %d | %d | %.2f s | %d | %d | %d | %d | %d | - |\n", label[r], lst[r], cn[r], cmax[r] / 1000, omax[r], hmax[r], acc[r], hs[r], fds[r]
    else printf "| %s | - | - | - | - | - | - | - | - | %d/%d |\n", label[r], joined[r] + 0, n[r]
  }
  print ""
  tw = 0; for (r in wildcard) tw += wildcard[r]; tl = 0; for (r in wl) tl += wl[r]
  printf "Wildcard listeners of the job: %d in `ss -Htlnp` samples, %d among the listeners the attacker saw.\n", tw, tl
}' "$RES"
echo
echo "Addresses the job's processes listened on (ss -Htlnp, every trial; sockets seen):"
cat "$OUT"/*/*/ss.txt 2>/dev/null | awk '{a = $4; sub(/:[0-9]+$/, "", a); s[a " " $4]++} END {for (k in s) {split(k, f, " "); n[f[1]]++}; for (x in n) printf "  %s: %d\n", x, n[x]}' 
echo "Without NCCL_SOCKET_IFNAME, the root of ncclGetUniqueId listens on:"
if [ -s "$idcheck/ss.txt" ]; then
  awk '{print "  " $4}' "$idcheck/ss.txt"
  if awk '$4 ~ /^(0\.0\.0\.0|\*|\[::\]):/' "$idcheck/ss.txt" | grep -q .; then echo "  -> WILDCARD"; else echo "  -> not a wildcard"; fi
else
  echo "  (nothing seen: $(cat "$idcheck/out"))"
fi
for r in intruder_nokey intruder_key intruder_wrongkey; do
  f=$(ls "$OUT"/$r/*/attacker.out 2>/dev/null | head -1)
  [ -n "$f" ] || continue
  echo "The intruder ($r), first trial: $(grep '^rank=' "$f" | head -1 | cut -c1-400)"
done
