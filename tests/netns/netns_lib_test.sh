#!/usr/bin/env bash
# Tests of the harness itself (tests/netns/netns_lib.sh, docs/netns.md):
#
#   netns_lib_test.sh harness     layout, rank environment, failure and timeout
#                                 handling, counters, cleanup (also after a
#                                 failure and after SIGTERM), the skip path
#   netns_lib_test.sh link_rate [RATE]
#                                 a plain TCP stream through RATE-shaped links
#                                 (default 1gbit) reaches 70..102% of RATE, in
#                                 both directions, and both tbf qdiscs on its
#                                 path (node side, switch side) carried it
# Exit: 0 passed, 1 failed, 77 skipped.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
lib="$here/netns_lib.sh"
# shellcheck source=SCRIPTDIR/netns_lib.sh
source "$lib"

failures=0
check() {
  local what=$1
  shift
  if "$@"; then
    echo "ok: $what"
  else
    echo "FAIL: $what"
    failures=$((failures + 1))
  fi
}

# Namespaces, and processes inside them, whose names start with $1.
leftovers() {
  local p=$1 ns
  ip netns list | awk '{print $1}' | grep "^$p-" || true
  for ns in $(ip netns list | awk '{print $1}' | grep "^$p-"); do
    ip netns pids "$ns" 2>/dev/null | sed "s/^/pid in $ns: /"
  done
}

harness() {
  netns_setup 3
  local prefix=$NETNS_PREFIX i n

  # Layout: a switch and 3 nodes, names within IFNAMSIZ, one address each.
  n=$(ip netns list | awk '{print $1}' | grep -c "^$prefix-" || true)
  check "4 namespaces (switch + 3 nodes)" test "$n" -eq 4
  for ((i = 0; i < 3; i++)); do
    check "node $i interface name ${NETNS_IF[i]} <= 15 chars" test "${#NETNS_IF[i]}" -le 15
    check "node $i has ${NETNS_IP[i]} on ${NETNS_IF[i]}" \
      bash -c "ip -n '${NETNS_NS[i]}' -4 -o addr show dev '${NETNS_IF[i]}' | grep -q ' ${NETNS_IP[i]}/24 '"
  done
  check "nothing of ours in the root namespace" \
    bash -c "! ip -o link show | grep -q '$prefix'"
  check "node 2 reaches node 1" _netns_wait_reachable 2 1

  # Ranks: numbered node by node, each in its node's namespace, one host id
  # per node, the node's interface pinned, one master address and port.
  local out
  # shellcheck disable=SC2016  # expanded by each rank's shell
  netns_run_ranks 1,2,3 bash -c 'echo "$RANK $WORLD_SIZE $LOCAL_RANK $MASTER_ADDR $MASTER_PORT $TUTTI_HOST_ID $NCCL_SOCKET_IFNAME $(ip -4 -o addr show scope global | awk "{print \$4}")"' \
    >"$NETNS_WORKDIR/out"
  check "netns_run_ranks prints rank 0's output" cmp -s "$NETNS_WORKDIR/out" "$NETNS_RUN_DIR/rank0.log"
  local r node l want_node want_local rk ws lr ma mp hid ifn addr
  local -A hosts=()
  r=0
  for node in 0 1 2; do
    for ((l = 0; l <= node; l++)); do
      read -r rk ws lr ma mp hid ifn addr <"$NETNS_RUN_DIR/rank$r.log"
      want_node=$node want_local=$l
      check "rank $r: RANK/WORLD_SIZE/LOCAL_RANK" test "$rk $ws $lr" = "$r 6 $want_local"
      check "rank $r: MASTER_ADDR is node 0" test "$ma" = "${NETNS_IP[0]}"
      check "rank $r: MASTER_PORT $mp" test "$mp" = "$NETNS_MASTER_PORT"
      check "rank $r: in node $want_node's namespace" test "$addr" = "${NETNS_IP[want_node]}/24"
      check "rank $r: NCCL_SOCKET_IFNAME" test "$ifn" = "=${NETNS_IF[want_node]}"
      check "rank $r: TUTTI_HOST_ID of node $want_node" test "$hid" = "${NETNS_HOSTID[want_node]}"
      hosts[$hid]=1
      r=$((r + 1))
    done
  done
  check "3 distinct host ids" test "${#hosts[@]}" -eq 3

  # A failing rank: its code comes back, the others are stopped quickly.
  local rc=0 t=$SECONDS
  # shellcheck disable=SC2016
  netns_run_ranks 2,2 bash -c '[[ $RANK == 3 ]] && { echo "rank 3 gives up"; exit 7; }; sleep 60' \
    2>"$NETNS_WORKDIR/err" || rc=$?
  check "a failing rank's exit code (7, got $rc)" test "$rc" -eq 7
  check "the others stopped within 6 s" test $((SECONDS - t)) -le 6
  check "the report names rank 3 and shows its output" \
    grep -q "rank 3 failed with exit code 7" "$NETNS_WORKDIR/err"
  check "the report shows rank 3's output" grep -q "rank 3 gives up" "$NETNS_WORKDIR/err"
  check "no rank left running" bash -c \
    "for ns in ${NETNS_NS[*]}; do [[ -z \$(ip netns pids \$ns) ]] || exit 1; done"

  # The timeout: 124, every rank stopped, even one ignoring SIGTERM.
  rc=0
  t=$SECONDS
  NETNS_TIMEOUT=1 netns_run_ranks 1,1 bash -c 'trap "" TERM; sleep 60' 2>/dev/null || rc=$?
  check "timeout gives 124 (got $rc)" test "$rc" -eq 124
  check "timeout and stop within 6 s" test $((SECONDS - t)) -le 6
  check "nothing left in the nodes" bash -c \
    "for ns in ${NETNS_NS[*]}; do [[ -z \$(ip netns pids \$ns) ]] || exit 1; done"

  # Counters: a stream from node 0 to node 2 shows up on both links.
  local -a before after
  mapfile -t before < <(netns_counters)
  netns_tcp_rate 0 2 0.3 >/dev/null
  mapfile -t after < <(netns_counters)
  local tx0 rx2 a b c d
  read -r _ _ a _ <<<"${before[0]}"
  read -r _ _ b _ <<<"${after[0]}"
  read -r _ _ _ c <<<"${before[2]}"
  read -r _ _ _ d <<<"${after[2]}"
  tx0=$((b - a))
  rx2=$((d - c))
  local ok=0
  ((tx0 > 1000000 && rx2 * 100 >= tx0 * 99)) && ok=1
  check "counters: node 0 sent what node 2 received (tx0 $tx0, rx2 $rx2 bytes)" test "$ok" -eq 1

  netns_cleanup
  check "cleanup removed every namespace" test -z "$(leftovers "$prefix")"

  # Cleanup after a failing script (set -e) and after SIGTERM during a run.
  local child_prefix
  out=$(bash -c "set -euo pipefail; source '$lib'; netns_setup 2; echo \$NETNS_PREFIX; false" \
    2>/dev/null) || true
  child_prefix=$out
  check "a failing script's namespaces are gone ($child_prefix)" \
    test -n "$child_prefix" -a -z "$(leftovers "$child_prefix")"
  bash -c "set -euo pipefail; source '$lib'; netns_setup 2; echo \$NETNS_PREFIX;
    netns_run_ranks 1,1 sleep 60" >"${TMPDIR:-/tmp}/netns_lib_test.$$" 2>/dev/null &
  local child=$!
  for ((i = 0; i < 50; i++)); do
    [[ -s ${TMPDIR:-/tmp}/netns_lib_test.$$ ]] && break
    sleep 0.1
  done
  child_prefix=$(cat "${TMPDIR:-/tmp}/netns_lib_test.$$")
  rm -f "${TMPDIR:-/tmp}/netns_lib_test.$$"
  sleep 0.5
  kill -TERM "$child"
  rc=0
  wait "$child" || rc=$?
  check "SIGTERM: exit 143 (got $rc)" test "$rc" -eq 143
  check "SIGTERM: namespaces and ranks of $child_prefix are gone" \
    test -n "$child_prefix" -a -z "$(leftovers "$child_prefix")"

  # The skip path: not root -> exit 77 with the reason.
  if command -v setpriv >/dev/null 2>&1 && setpriv --reuid=65534 --regid=65534 --clear-groups \
    test -r "$lib"; then
    rc=0
    out=$(setpriv --reuid=65534 --regid=65534 --clear-groups \
      bash -c "source '$lib'; netns_setup 2" 2>&1) || rc=$?
    check "not root: exit 77 (got $rc)" test "$rc" -eq 77
    check "not root: says why ($out)" grep -q "^SKIP: .*root" <<<"$out"
  else
    echo "note: skip path not tested (no setpriv, or $lib not readable by nobody)"
  fi
}

link_rate() {
  local rate=${1:-1gbit} bits
  bits=$(netns_rate_bytes "$rate") || { echo "link_rate: cannot read rate '$rate'" >&2; return 2; }
  bits=$((bits * 8))
  netns_setup 2 "$rate"
  local line gbit dir from to qn qs
  for dir in "0 1" "1 0"; do
    read -r from to <<<"$dir"
    line=$(netns_tcp_rate "$from" "$to" 2)
    echo "node $from -> node $to: $line"
    gbit=$(sed 's/.*Gbit\/s=//' <<<"$line")
    check "TCP $from -> $to at 70..102% of $rate" \
      awk -v g="$gbit" -v b="$bits" 'BEGIN { exit !(g * 1e9 >= 0.70 * b && g * 1e9 <= 1.02 * b) }'
  done
  # Both qdiscs on the 0 -> 1 path saw the stream (node 0's egress, and the
  # switch's port towards node 1), so each direction of each link is shaped.
  qn=$(tc -n "${NETNS_NS[0]}" -s qdisc show dev "${NETNS_IF[0]}" | awk '/^ Sent/ {print $2; exit}')
  qs=$(tc -n "$NETNS_SWITCH" -s qdisc show dev "${NETNS_SWIF[1]}" | awk '/^ Sent/ {print $2; exit}')
  tc -n "${NETNS_NS[0]}" qdisc show dev "${NETNS_IF[0]}"
  echo "tbf sent bytes: node 0 side $qn, switch side towards node 1 $qs"
  check "node-side tbf of node 0 carried the stream" test "${qn:-0}" -gt 100000000
  check "switch-side tbf towards node 1 carried the stream" test "${qs:-0}" -gt 100000000
}

case ${1:-} in
  harness) harness ;;
  link_rate) link_rate "${2:-1gbit}" ;;
  *) echo "usage: netns_lib_test.sh harness | link_rate [RATE]" >&2; exit 2 ;;
esac
echo "netns_lib_test $1: $failures failed"
((failures == 0))
