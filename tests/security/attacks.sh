#!/usr/bin/env bash
# ctest mp.security.attacks (issue 29): every attack of bench/security/run.sh
# once, short, against a 4-rank job, with assertions.
#
#   attacks.sh VICTIM ATTACKER [--keep DIR] [--proto old|new]
#
# The job (victim.c): 4 ranks, 2 s of checked all-reduces and an
# ncclCommSplit every 5 iterations, under `ulimit -n 1024`, over TCP
# (NCCL_SHM_DISABLE=1) on loopback (NCCL_SOCKET_IFNAME=lo); its parent waits
# 1 s between ncclGetUniqueId and the ranks' init, so the attacks on the
# root's listener land before the ranks join. The attacker attacks the root
# and every listener the job opens while it runs (attacker.cc).
#
# Asserted for every attack:
# - job correct: every rank finished, all-reduces exact, exit 0; no crash;
# - the worst init, split and all-reduce of any rank exceed the baseline run's
#   by at most 3 s: the issue's 2 s (how long a listener gives a connection to
#   authenticate; nothing waits longer for a stranger) plus 1 s of margin for
#   two shared CPU cores running 4 ranks, the root and the attacker (the
#   baseline's own worst all-reduce varies by tens of ms, a TCP connect retry
#   slice is 50 ms, and an honest connection evicted by a flood is retried;
#   under a sanitizer, 2 s + 4 s);
# - memory: no process of the job grows by more than 16 MiB of max RSS over
#   the baseline. A pending connection costs a few hundred bytes (64 held per
#   listener at most), so 16 MiB is far above anything the attacks can
#   legitimately cost and far below the 1 GiB a huge length field allocated
#   (under ASan, whose quarantine keeps up to 256 MiB of freed memory: 256 MiB);
# - no listener of the job on 0.0.0.0 or [::] (ss -Htlnp during every run,
#   and every listener the attacker saw); nor the root of ncclGetUniqueId
#   without NCCL_SOCKET_IFNAME (only listened on; nobody connects);
# - idle, partial, garbage: the victim closed every connection the attacker
#   held within 2.5 s (2 s and 0.5 s for the listener's and the attacker's
#   poll granularity; under a sanitizer too), and none it had held for more
#   than 2.5 s was open at the end (connections whose other end no process
#   holds, left half-open by a listener closed as they connected, are not
#   the job's: attacker.cc, halfopen_at_end);
# - wrong key: no Welcome ever came; the attacker did get as far as sending a
#   proof (the listener answered the hello);
# - huge length fields (NCCL_COMM_ID job without a secret, whose key is the
#   all-zero key anyone may use; attacked once init is done, so that the
#   frames reach the ranks' own listeners): the attacker completed the
#   handshake (the frame reached the reader), and memory did not grow;
# - flood (1,100 connections to every listener, held and reopened when
#   closed; from before init (5 runs), and on the running job): the job's
#   descriptors stay under half its limit;
# - intruder (NCCL_COMM_ID job with TUTTI_BOOTSTRAP_SECRET; an intruder
#   claiming rank 3 with a wrong secret, and with none): it never joins, its
#   own init fails with an error that speaks of the key, and the job is
#   correct.
set -u
VICTIM=${1:?usage: attacks.sh VICTIM ATTACKER [--keep DIR] [--proto old|new]}
ATTACKER=${2:?usage: attacks.sh VICTIM ATTACKER [--keep DIR] [--proto old|new]}
shift 2
KEEP='' PROTO=''
while [ $# -gt 0 ]; do
  case $1 in
    --keep) KEEP=$2; shift 2 ;;
    --proto) PROTO=$2; shift 2 ;;
    *) echo "attacks.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
if [ -z "$PROTO" ]; then
  lib=$(readlink -f "$(ldd "$VICTIM" | awk '/libtutti\.so/ {print $3; exit}')")
  if grep -qa 'tutti-auth-1 answer' "$lib"; then PROTO=new; else PROTO=old; fi
  echo "library $lib: $PROTO handshake"
fi
if [ -n "$KEEP" ]; then OUT=$KEEP; mkdir -p "$OUT"; else OUT=$(mktemp -d /tmp/tutti-attacks.XXXXXX); fi

LIMIT_MS=3000      # 2 s + 1 s margin (above)
MEM_KB=$((16 * 1024))
CLOSE_MS=2500
# Under a sanitizer (scripts/sanitize.sh runs label mp too) everything is
# several times slower, and ASan's RSS holds its quarantine of freed memory
# (256 MiB by default): 2 s + 4 s, and 256 MiB, which still catches 1 GiB.
if ldd "$VICTIM" | grep -qE 'lib(asan|tsan|ubsan)'; then
  LIMIT_MS=6000
  MEM_KB=$((256 * 1024))
  echo "sanitizer build: delays up to $LIMIT_MS ms, memory growth up to $MEM_KB KiB"
fi
FDS_MAX=512        # half of ulimit -n 1024
SECS=2
WATCHDOG=40
export NCCL_SOCKET_IFNAME=lo NCCL_SHM_DISABLE=1 TUTTI_INIT_TIMEOUT=10 TUTTI_TIMEOUT=15
FAILS=0
# shellcheck source=tests/security/lib.sh
. "$(dirname "$0")/lib.sh"  # freePort ssWatch wildcards kv kvn
fail() { echo "FAIL: $*"; FAILS=$((FAILS + 1)); }
pass() { echo "ok:   $*"; }

# run NAME JOBENV ATTACK [attacker args]: one job, attacked; sets JOB, ATT, RC, D
run() {
  local name=$1 jobenv=$2 attack=$3
  shift 3
  D=$OUT/$name
  mkdir -p "$D"
  ( ulimit -n 1024 && exec env $jobenv "$VICTIM" -t "${RUNSECS:-$SECS}" -d 1000 -p "$D/pid" -w $WATCHDOG ) \
    > "$D/victim.out" 2> "$D/victim.err" &
  local vpid=$!
  ssWatch "$D/ss.txt" "$D/pid" &
  local spid=$! apid=
  if [ "$attack" != none ]; then
    "$ATTACKER" "$attack" --pidfile "$D/pid" --duration $((WATCHDOG + 10)) --proto "$PROTO" "$@" \
      > "$D/attacker.out" 2> "$D/attacker.err" &
    apid=$!
  fi
  wait $vpid
  RC=$?
  [ -n "$apid" ] && wait $apid
  kill $spid 2>/dev/null
  wait $spid 2>/dev/null
  JOB=$(grep '^job ' "$D/victim.out" | tail -1)
  ATT=$(grep '^attacker ' "$D/attacker.out" 2>/dev/null | tail -1)
  echo "-- $name: $(echo "$JOB" | cut -c1-200)"
  [ -n "$ATT" ] && echo "   $(echo "$ATT" | cut -c1-400)"
  return 0
}

checkJob() {  # checkJob NAME: the assertions every attack shares
  local name=$1
  if [ -z "$JOB" ]; then
    fail "$name: the job printed no result (exit $RC): $(tail -3 "$D/victim.err" 2>/dev/null)"
    return
  fi
  if [ "$RC" -eq 0 ] && [ "$(kv "$JOB" ok)" = 1 ]; then pass "$name: job correct"; else
    fail "$name: job not correct (exit $RC): $(grep -h 'err="[^"]' "$D/victim.out" | head -2 | cut -c1-300)"; fi
  if grep -qE '^rank=.*(crashed=1|hung=1)' "$D/victim.out" || [ -z "$JOB" ]; then
    fail "$name: a rank crashed or hung"; else pass "$name: no crash"; fi
  local m v b
  for m in init op split; do
    v=$(kv "$JOB" worst_${m}_ms); b=$(kv "$BASE" worst_${m}_ms)
    if awk -v v="${v:-1e9}" -v b="$b" -v l=$LIMIT_MS 'BEGIN {exit !(v - b <= l)}'; then
      pass "$name: worst $m ${v} ms (baseline $b ms)"
    else fail "$name: worst $m ${v} ms, baseline $b ms: delayed by more than $LIMIT_MS ms"; fi
  done
  local rss brss
  rss=$(( $(kvn "$JOB" max_rss_kb) > $(kvn "$JOB" parent_rss_kb) ? $(kvn "$JOB" max_rss_kb) : $(kvn "$JOB" parent_rss_kb) ))
  brss=$(( $(kvn "$BASE" max_rss_kb) > $(kvn "$BASE" parent_rss_kb) ? $(kvn "$BASE" max_rss_kb) : $(kvn "$BASE" parent_rss_kb) ))
  if [ $((rss - brss)) -le $MEM_KB ]; then pass "$name: max RSS $rss KiB (baseline $brss KiB)"
  else fail "$name: max RSS $rss KiB, baseline $brss KiB: grew by more than $MEM_KB KiB"; fi
  local w
  w=$(wildcards "$D/ss.txt")
  if [ -n "$ATT" ]; then w=$((w + $(kvn "$ATT" wildcard) + $(kvn "$ATT" nonloopback))); fi
  if [ "$w" -eq 0 ]; then pass "$name: no wildcard listener"; else
    fail "$name: $w listener(s) on a wildcard (or non-loopback) address: $(awk '{print $4}' "$D/ss.txt" | sort -u | head -3 | tr '\n' ' ')"; fi
}

checkClosed() {  # unauthenticated connections closed within CLOSE_MS
  local name=$1 c o
  c=$(kvn "$ATT" close_ms_max); o=$(kvn "$ATT" old_open_at_end)
  if [ "$(kvn "$ATT" peer_closed)" -gt 0 ] && [ "${c%.*}" -le $CLOSE_MS ] && [ "$o" -eq 0 ]; then
    pass "$name: held connections closed by the job within ${c} ms"
  else fail "$name: the job kept a stranger's connection ${c} ms (closed: $(kv "$ATT" peer_closed)), $o held > 2.5 s at the end"; fi
}

# ---- baseline ----
run baseline "" none
BASE=$JOB
if [ "$RC" -ne 0 ] || [ "$(kv "$BASE" ok)" != 1 ]; then
  fail "baseline job failed: $(cat "$D/victim.out" "$D/victim.err" | tail -5)"
  echo "$FAILS failure(s); output in $OUT"
  exit 1
fi
[ "$(wildcards "$D/ss.txt")" -eq 0 ] && pass "baseline: no wildcard listener" || fail "baseline: wildcard listener"

# ---- attacks on a job from ncclGetUniqueId ----
for mode in garbage wrongkey idle partial truncated; do
  run "$mode" "" "$mode"
  checkJob "$mode"
  case $mode in
    idle | partial | garbage) checkClosed "$mode" ;;
    wrongkey)
      if [ -n "$ATT" ] && [ "$(kvn "$ATT" accepted)" -eq 0 ]; then pass "wrongkey: no wrong key accepted"; else fail "wrongkey: $(kv "$ATT" accepted) wrong keys accepted"; fi
      if [ "$PROTO" = new ]; then
        if [ "$(kvn "$ATT" rejected_proof)" -gt 0 ]; then pass "wrongkey: wrong proofs sent and refused"; else fail "wrongkey: the attack never reached the proof"; fi
      fi
      ;;
  esac
done
# A flood from before init, 5 times (1 s of work each): an honest connection
# evicted by the flood at the wrong moment failed init in 2 to 3 runs of 5
# with the first gate of issue 29 (an honest handshake evicted after its
# answer was not retried), so once is not enough to see it.
for f in flood_1 flood_2 flood_3 flood_4 flood_5 flood_after; do
  if [ $f = flood_after ]; then run $f "" flood --after-ms 1500; else RUNSECS=1 run $f "" flood; fi
  checkJob $f
  fds=$(kv "$ATT" victim_fds_max)
  if [ "${fds:-9999}" -le $FDS_MAX ]; then pass "$f: the job's processes held at most $fds descriptors"
  else fail "$f: a process of the job held $fds descriptors (more than $FDS_MAX of its 1024)"; fi
done

# ---- huge length fields: a job without a key (NCCL_COMM_ID, no secret) ----
cid=127.0.0.1:$(freePort)
run base_commid "NCCL_COMM_ID=$cid" none
BASE_UID=$BASE
BASE=$JOB
cid=127.0.0.1:$(freePort)
run hugelen "NCCL_COMM_ID=$cid" hugelen --comm-id "$cid" --after-ms 1200
checkJob hugelen
if [ "$PROTO" = new ]; then
  if [ "$(kvn "$ATT" hs_done)" -gt 0 ]; then pass "hugelen: $(kv "$ATT" hs_done) handshakes completed, frames of 1 GiB announced"
  else fail "hugelen: the attacker never completed a handshake (the frame reader was not reached)"; fi
fi
BASE=$BASE_UID

# ---- the intruder: a job with a key; the intruder has a wrong one, or none ----
# The ranks start 300 ms apart (rank 3 last), so that an intruder claiming
# rank 3 comes first; the baseline is such a job without an intruder.
for case_ in none wrongkey nokey; do
  D=$OUT/intruder_$case_
  mkdir -p "$D"
  cid=127.0.0.1:$(freePort)
  secret=job-$RANDOM$RANDOM
  ( ulimit -n 1024 && exec env NCCL_COMM_ID=$cid TUTTI_BOOTSTRAP_SECRET=$secret "$VICTIM" -t $SECS -s 300 -p "$D/pid" -w $WATCHDOG ) \
    > "$D/victim.out" 2> "$D/victim.err" &
  vpid=$!
  ssWatch "$D/ss.txt" "$D/pid" &
  spid=$!
  irc=0 ILINE='' took=0
  if [ $case_ != none ]; then
    ienv="NCCL_COMM_ID=$cid TUTTI_INIT_TIMEOUT=5"
    [ $case_ = wrongkey ] && ienv="$ienv TUTTI_BOOTSTRAP_SECRET=not-$secret"
    t0=$(date +%s.%N)
    env $ienv "$VICTIM" -I 3 -t $SECS -w $WATCHDOG > "$D/intruder.out" 2> "$D/intruder.err"
    irc=$?
    took=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}')
    ILINE=$(grep '^rank=' "$D/intruder.out" | head -1)
  fi
  wait $vpid
  RC=$?
  kill $spid 2>/dev/null
  wait $spid 2>/dev/null
  JOB=$(grep '^job ' "$D/victim.out" | tail -1)
  ATT=
  echo "-- intruder_$case_: $(echo "$JOB" | cut -c1-200)"
  if [ $case_ = none ]; then
    BASE_I=$JOB
    [ "$RC" -eq 0 ] || fail "intruder baseline (no intruder) failed: $(grep -h 'err="[^"]' "$D/victim.out" | head -2)"
    continue
  fi
  echo "   intruder (exit $irc, $took s): $(echo "$ILINE" | cut -c1-400)"
  BASE=$BASE_I
  checkJob "intruder_$case_"
  BASE=$BASE_UID
  if [ $irc -ne 0 ] && echo "$ILINE" | grep -q 'ops=0 ' && echo "$ILINE" | grep -qi 'key'; then
    pass "intruder_$case_: refused, with an error about the key"
  else fail "intruder_$case_: the intruder was not refused with a clear error (exit $irc): $ILINE"; fi
done

# ---- the root of ncclGetUniqueId without NCCL_SOCKET_IFNAME: only listened on ----
D=$OUT/idcheck
mkdir -p "$D"
env -u NCCL_SOCKET_IFNAME "$VICTIM" -U 1000 > "$D/out" 2>&1 &
idpid=$!
sleep 0.5
ss -Htlnp | grep "pid=$idpid," > "$D/ss.txt"
wait $idpid
if [ ! -s "$D/ss.txt" ]; then fail "idcheck: no root listener seen ($(cat "$D/out"))"
elif [ "$(wildcards "$D/ss.txt")" -eq 0 ]; then pass "idcheck: the root listens on $(awk '{print $4}' "$D/ss.txt" | tr '\n' ' ')"
else fail "idcheck: the root of ncclGetUniqueId listens on a wildcard: $(awk '{print $4}' "$D/ss.txt" | tr '\n' ' ')"; fi

echo
if [ $FAILS -eq 0 ]; then
  echo "all attacks repelled"
  [ -z "$KEEP" ] && rm -rf "$OUT"
  exit 0
fi
echo "$FAILS failure(s); output in $OUT"
exit 1
