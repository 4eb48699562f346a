# shellcheck shell=bash
# shellcheck disable=SC2034  # NETNS_* variables are this library's outputs
# netns_lib.sh: emulated multi-node runs of tutti on one machine (docs/netns.md).
#
# Source it from bash (4.3+; 5.1+ for netns_run_ranks), as root:
#
#   source tests/netns/netns_lib.sh
#   netns_setup 2 1gbit            # 2 "nodes", each link shaped to 1 Gbit/s both ways
#   netns_run_ranks 2,2 tutti-perf all_reduce -b 1M -e 64M -f 4
#   netns_counters                 # bytes each node's link carried
#   # netns_cleanup runs on EXIT/INT/TERM/HUP (installed by netns_setup)
#
# Layout: one network namespace per node (<prefix>-n<i>) and one "switch"
# namespace (<prefix>-sw) holding a bridge. Node i is joined to the switch by
# one veth pair, <prefix>n<i> in the node and <prefix>s<i> in the switch. The
# pairs are created directly inside those namespaces, so nothing is ever added
# to, or changed in, the root namespace. <prefix> is "ttn<pid>" (pid of the
# shell that called netns_setup), so parallel runs never collide, and every
# interface name stays within 15 characters.
#
# Functions (every one returns non-zero on failure; netns_setup exits 77 when
# namespaces cannot be made, which ctest reports as SKIPPED):
#   netns_setup NODES [RATE]      create the nodes; RATE (tc syntax, "1gbit") shapes
#                                 both directions of each node's link with tbf
#   netns_run_ranks SPEC CMD...   one rank per process; SPEC = ranks per node, "2,2"
#   netns_counters                "<node> <if> <tx_bytes> <rx_bytes>" per node
#   netns_exec NODE CMD...        run a command inside node NODE's namespace
#   netns_shape_node NODE RATE    reshape node NODE's link (both directions) to RATE
#                                 (after netns_setup with a rate: a slow node)
#   netns_tcp_rate FROM TO [SECS] one plain TCP stream FROM -> TO through the same
#                                 links (tcp_stream.py); prints its GB/s
#   netns_cleanup                 kill what runs in our namespaces, delete them
#   netns_skip REASON             print "SKIP: REASON" and exit 77
#   netns_rate_bytes RATE         a tc rate ("1gbit", "100mbit", "1gbps") in bytes/s
#
# Variables set by netns_setup (read-only by convention):
#   NETNS_PREFIX NETNS_NODES NETNS_RATE NETNS_SWITCH NETNS_SUBNET NETNS_WORKDIR
#   NETNS_TBF_BURST_USED NETNS_TBF_LATENCY_USED (bytes; when RATE is given)
#   NETNS_NS[i] NETNS_IF[i] NETNS_SWIF[i] NETNS_IP[i] NETNS_HOSTID[i]
# Set by netns_run_ranks: NETNS_RUN_DIR (rank<r>.log of the last run),
#   NETNS_MASTER_PORT, NETNS_FAILED_RANK (-1 when every rank exited 0).
#
# Knobs (environment, read when the function runs):
#   NETNS_TBF_BURST (4 ms at the rate, at least 512 KiB: 512k at 1gbit),
#   NETNS_TBF_LATENCY (20ms): tbf bucket and queue bound (docs/netns.md says why)
#   NETNS_MTU (1500): MTU of the veths and the bridge
#   NETNS_TIMEOUT (120): seconds netns_run_ranks waits for all ranks
#   NETNS_PYTHON (/usr/bin/python3, else python3): runs tcp_stream.py
#   NETNS_SHOW (1): netns_run_ranks prints rank 0's output when every rank passed
#   NETNS_TAIL (30): lines of a failed rank's output shown

NETNS_SKIP_CODE=77
_NETNS_LIBDIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

netns_skip() {
  echo "SKIP: $*" >&2
  exit "$NETNS_SKIP_CODE"
}

# netns_rate_bytes RATE: tc's rate syntax (SI prefixes: 1gbit = 1e9 bit/s;
# "bps" units are bytes) -> bytes per second.
netns_rate_bytes() {
  awk -v r="${1:-}" 'BEGIN {
    n = r + 0; u = tolower(substr(r, length(n "") + 1))
    m["bit"] = 1; m["kbit"] = 1e3; m["mbit"] = 1e6; m["gbit"] = 1e9; m["tbit"] = 1e12
    m["bps"] = 8; m["kbps"] = 8e3; m["mbps"] = 8e6; m["gbps"] = 8e9; m["tbps"] = 8e12
    if (n <= 0 || !(u in m)) exit 1
    printf "%.0f\n", n * m[u] / 8 }'
}

_netns_die() {
  echo "netns: $*" >&2
  return 1
}

# Namespaces left by a run that was SIGKILLed (no trap runs then): ours are
# named ttn<pid>-..., so a namespace whose pid no longer exists is stale.
_netns_reap_stale() {
  local name pid
  while read -r name _; do
    [[ $name =~ ^ttn([0-9]+)-(sw|n[0-9]+)$ ]] || continue
    pid=${BASH_REMATCH[1]}
    [[ $pid == "$BASHPID" ]] && continue
    if ! kill -0 "$pid" 2>/dev/null; then
      _netns_kill_ns_pids "$name"
      ip netns del "$name" 2>/dev/null || true
    fi
  done < <(ip netns list 2>/dev/null)
}

# Kills every process inside namespace $1: TERM, then KILL after 2 s.
_netns_kill_ns_pids() {
  local ns=$1 pids i
  pids=$(ip netns pids "$ns" 2>/dev/null) || return 0
  [[ -n $pids ]] || return 0
  # shellcheck disable=SC2086  # word splitting of the pid list is intended
  kill -TERM $pids 2>/dev/null || true
  for ((i = 0; i < 20; i++)); do
    pids=$(ip netns pids "$ns" 2>/dev/null) || return 0
    [[ -n $pids ]] || return 0
    sleep 0.1
  done
  # shellcheck disable=SC2086
  kill -KILL $pids 2>/dev/null || true
}

# netns_setup NODES [RATE]
netns_setup() {
  local nodes=${1:-} rate=${2:-}
  if [[ ! $nodes =~ ^[0-9]+$ ]] || ((nodes < 1 || nodes > 250)); then
    _netns_die "netns_setup: NODES must be 1..250, got '${nodes}'"
    return 2
  fi
  [[ ${NETNS_PREFIX:-} ]] && { _netns_die "netns_setup: already set up ($NETNS_PREFIX)"; return 2; }

  # Skip (exit 77) when this machine cannot make namespaces.
  ((EUID == 0)) || netns_skip "network namespaces need root (running as uid $EUID)"
  command -v ip >/dev/null 2>&1 || netns_skip "the 'ip' command (iproute2) is not installed"
  if [[ -n $rate ]]; then
    command -v tc >/dev/null 2>&1 || netns_skip "rate $rate needs the 'tc' command (iproute2)"
  fi

  _netns_reap_stale

  # $BASHPID, not $$: two subshells of one script get different prefixes.
  local me=$BASHPID
  NETNS_PREFIX="ttn$me"
  NETNS_NODES=$nodes
  NETNS_RATE=$rate
  NETNS_SWITCH="${NETNS_PREFIX}-sw"
  # A private /24 per run, from the pid: 10.<64..191>.<0..255>.0/24. The
  # namespaces are isolated anyway; distinct subnets keep captures and logs of
  # parallel runs apart.
  NETNS_SUBNET="10.$((64 + (me / 256) % 128)).$((me % 256))"
  NETNS_NS=() NETNS_IF=() NETNS_SWIF=() NETNS_IP=() NETNS_HOSTID=()
  _NETNS_CREATED=()
  _NETNS_PIDS=()
  _NETNS_RUNS=0
  _NETNS_LAST_PORT=0
  NETNS_RUN_DIR=''
  NETNS_WORKDIR=$(mktemp -d "${TMPDIR:-/tmp}/${NETNS_PREFIX}.XXXXXX") || {
    _netns_die "mktemp failed"
    return 1
  }

  trap netns_cleanup EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  trap 'exit 129' HUP

  local err
  if ! err=$(ip netns add "$NETNS_SWITCH" 2>&1); then
    netns_cleanup
    netns_skip "cannot create a network namespace: ip netns add: $err"
  fi
  _NETNS_CREATED+=("$NETNS_SWITCH")

  local mtu=${NETNS_MTU:-1500} burst=${NETNS_TBF_BURST:-} latency=${NETNS_TBF_LATENCY:-20ms}
  if [[ -n $rate && -z $burst ]]; then
    # 4 ms at the rate, at least 512 KiB (see the knobs above).
    local rb
    rb=$(netns_rate_bytes "$rate") || { _netns_die "netns_setup: cannot read rate '$rate'"; return 2; }
    burst=$((rb / 250 > 524288 ? rb / 250 : 524288))
  fi
  NETNS_TBF_BURST_USED=$burst
  NETNS_TBF_LATENCY_USED=$latency
  local sw=$NETNS_SWITCH br="${NETNS_PREFIX}br" i ns nif sif
  _netns_sysctls "$sw" || return 1
  ip -n "$sw" link set lo up || return 1
  ip -n "$sw" link add "$br" mtu "$mtu" type bridge stp_state 0 || return 1
  ip -n "$sw" link set "$br" up || return 1

  for ((i = 0; i < nodes; i++)); do
    ns="${NETNS_PREFIX}-n$i"
    nif="${NETNS_PREFIX}n$i"
    sif="${NETNS_PREFIX}s$i"
    ip netns add "$ns" || { _netns_die "ip netns add $ns failed"; return 1; }
    _NETNS_CREATED+=("$ns")
    _netns_sysctls "$ns" || return 1
    ip -n "$sw" link add "$sif" mtu "$mtu" type veth peer name "$nif" netns "$ns" mtu "$mtu" ||
      return 1
    ip -n "$sw" link set "$sif" master "$br" || return 1
    ip -n "$sw" link set "$sif" up || return 1
    ip -n "$ns" link set lo up || return 1
    ip -n "$ns" addr add "$NETNS_SUBNET.$((i + 1))/24" dev "$nif" || return 1
    ip -n "$ns" link set "$nif" up || return 1
    if [[ -n $rate ]]; then
      # Node side: what the node sends. Switch side: what the node receives.
      if ! err=$(tc -n "$ns" qdisc add dev "$nif" root tbf rate "$rate" burst "$burst" \
        latency "$latency" 2>&1); then
        netns_cleanup
        netns_skip "tc tbf does not work here (rate $rate): $err"
      fi
      tc -n "$sw" qdisc add dev "$sif" root tbf rate "$rate" burst "$burst" latency "$latency" ||
        return 1
    fi
    NETNS_NS[i]=$ns
    NETNS_IF[i]=$nif
    NETNS_SWIF[i]=$sif
    NETNS_IP[i]="$NETNS_SUBNET.$((i + 1))"
    NETNS_HOSTID[i]="${NETNS_PREFIX}-node$i-$RANDOM$RANDOM"
  done
  # Every node reaches every other one (ARP resolved, bridge ports forwarding).
  for ((i = 1; i < nodes; i++)); do
    _netns_wait_reachable 0 "$i" || { _netns_die "node 0 cannot reach node $i"; return 1; }
  done
  return 0
}

# No IPv6 (no router solicitations or DAD on the links: the byte counters see
# only what the test sends), no slow start after idle (a benchmark's
# back-to-back operations should not restart from a small window).
_netns_sysctls() {
  # shellcheck disable=SC2016  # the script runs in sh, inside the namespace
  ip netns exec "$1" sh -c '
    for f in /proc/sys/net/ipv6/conf/all/disable_ipv6 /proc/sys/net/ipv6/conf/default/disable_ipv6; do
      [ -w "$f" ] && echo 1 > "$f"
    done
    echo 0 > /proc/sys/net/ipv4/tcp_slow_start_after_idle
    exit 0' 2>/dev/null
}

_netns_wait_reachable() {
  local from=$1 to=$2 k
  if command -v ping >/dev/null 2>&1; then
    for ((k = 0; k < 50; k++)); do
      ip netns exec "${NETNS_NS[from]}" ping -c 1 -W 1 -q "${NETNS_IP[to]}" >/dev/null 2>&1 &&
        return 0
      sleep 0.1
    done
    return 1
  fi
  # Without ping: a TCP connect to a closed port is refused once ARP works.
  for ((k = 0; k < 50; k++)); do
    ip netns exec "${NETNS_NS[from]}" bash -c \
      "exec 3<>/dev/tcp/${NETNS_IP[to]}/9 2>/dev/null; [[ \$? -ne 0 ]]" 2>/dev/null && return 0
    sleep 0.1
  done
  return 1
}

# netns_exec NODE CMD...
netns_exec() {
  local node=$1
  shift
  [[ -n ${NETNS_NS[node]:-} ]] || { _netns_die "netns_exec: no node $node"; return 2; }
  ip netns exec "${NETNS_NS[node]}" "$@"
}

netns_cleanup() {
  local rc=$? p ns
  trap - EXIT INT TERM HUP
  [[ -n ${NETNS_PREFIX:-} ]] || return "$rc"
  for p in "${_NETNS_PIDS[@]}"; do
    kill -KILL -- "-$p" 2>/dev/null || kill -KILL "$p" 2>/dev/null || true
  done
  for ns in "${_NETNS_CREATED[@]}"; do
    _netns_kill_ns_pids "$ns"
  done
  for ns in "${_NETNS_CREATED[@]}"; do
    ip netns del "$ns" 2>/dev/null || true
  done
  # Reap only what we started (the caller may have background jobs of its own).
  for p in "${_NETNS_PIDS[@]}"; do
    wait "$p" 2>/dev/null || true
  done
  [[ -n ${NETNS_WORKDIR:-} && -d $NETNS_WORKDIR ]] && rm -rf -- "$NETNS_WORKDIR"
  _NETNS_CREATED=()
  _NETNS_PIDS=()
  NETNS_PREFIX=''
  return "$rc"
}

# "<node> <ifname> <tx_bytes> <rx_bytes>" for each node's veth (node side: tx
# is what the node sent into the switch, rx what it received from it).
netns_counters() {
  local i tx rx
  for ((i = 0; i < NETNS_NODES; i++)); do
    { read -r tx && read -r rx; } < <(ip netns exec "${NETNS_NS[i]}" cat \
      "/sys/class/net/${NETNS_IF[i]}/statistics/tx_bytes" \
      "/sys/class/net/${NETNS_IF[i]}/statistics/rx_bytes") || return 1
    echo "$i ${NETNS_IF[i]} $tx $rx"
  done
}

# A TCP port that nothing listens on in node 0 and that the kernel does not
# hand out as an ephemeral port (below ip_local_port_range), with the next one
# (NCCL_COMM_ID uses MASTER_PORT+1) free too; a different one for every run.
_netns_pick_port() {
  local lo hi port k used
  read -r lo hi < <(ip netns exec "${NETNS_NS[0]}" cat /proc/sys/net/ipv4/ip_local_port_range) ||
    lo=32768
  hi=$((lo > 12000 ? lo - 2 : 60000))
  lo=$((lo > 12000 ? 10000 : lo + 2))
  used=$(ip netns exec "${NETNS_NS[0]}" ss -Htan 2>/dev/null | awk '{print $4}' | sed 's/.*://') ||
    used=''
  for ((k = 0; k < 100; k++)); do
    port=$((lo + (RANDOM * 32768 + RANDOM) % (hi - lo)))
    ((port == _NETNS_LAST_PORT || port + 1 == _NETNS_LAST_PORT || port == _NETNS_LAST_PORT + 1)) &&
      continue
    grep -qxE "$port|$((port + 1))" <<<"$used" && continue
    echo "$port"
    return 0
  done
  return 1
}

# _netns_forget PID...: drops reaped processes from the list cleanup kills.
_netns_forget() {
  local -a keep=()
  local p q gone
  for p in "${_NETNS_PIDS[@]}"; do
    gone=0
    for q in "$@"; do
      [[ $p == "$q" ]] && gone=1
    done
    ((gone)) || keep+=("$p")
  done
  _NETNS_PIDS=("${keep[@]}")
}

# netns_run_ranks SPEC CMD...
# SPEC lists ranks per node ("2,2", "1,2,3"); ranks are numbered node by node.
# Each rank runs as
#   ip netns exec <node ns> env RANK= WORLD_SIZE= LOCAL_RANK= LOCAL_WORLD_SIZE=
#     MASTER_ADDR=<node 0 IP> MASTER_PORT=<per run> TUTTI_HOST_ID=<per node>
#     NCCL_SOCKET_IFNAME==<node veth> CMD...
# in its own process group, output in $NETNS_RUN_DIR/rank<r>.log. Returns 0 when
# every rank exits 0. When one fails, or NETNS_TIMEOUT expires, the others are
# stopped (TERM, KILL after 3 s); the failed rank, its exit code and the tail
# of its output go to stderr, and the function returns that rank's code (124
# on timeout). On success, rank 0's output goes to stdout (unless NETNS_SHOW=0).
netns_run_ranks() {
  local spec=${1:-}
  shift || true
  (($# > 0)) || { _netns_die "usage: netns_run_ranks SPEC CMD..."; return 2; }
  [[ -n ${NETNS_PREFIX:-} ]] || { _netns_die "netns_run_ranks: call netns_setup first"; return 2; }
  ((BASH_VERSINFO[0] > 5 || (BASH_VERSINFO[0] == 5 && BASH_VERSINFO[1] >= 1))) ||
    { _netns_die "netns_run_ranks needs bash >= 5.1 (wait -n -p)"; return 2; }
  local -a per
  IFS=, read -ra per <<<"$spec"
  ((${#per[@]} >= 1 && ${#per[@]} <= NETNS_NODES)) ||
    { _netns_die "netns_run_ranks: '$spec' needs 1..$NETNS_NODES nodes"; return 2; }
  local world=0 n
  for n in "${per[@]}"; do
    [[ $n =~ ^[1-9][0-9]*$ ]] || { _netns_die "netns_run_ranks: bad ranks per node '$n'"; return 2; }
    world=$((world + n))
  done

  local port
  port=$(_netns_pick_port) || { _netns_die "no free port in ${NETNS_NS[0]}"; return 1; }
  _NETNS_LAST_PORT=$port
  NETNS_MASTER_PORT=$port
  _NETNS_RUNS=$((_NETNS_RUNS + 1))
  NETNS_RUN_DIR="$NETNS_WORKDIR/run$_NETNS_RUNS"
  mkdir -p "$NETNS_RUN_DIR"

  local -a pids=() setsid=()
  command -v setsid >/dev/null 2>&1 && setsid=(setsid)
  local node l r rank=0
  for ((node = 0; node < ${#per[@]}; node++)); do
    for ((l = 0; l < per[node]; l++)); do
      # setsid: each rank leads its own process group, so stopping it also
      # stops whatever it started (cleanup also kills all in the namespaces).
      "${setsid[@]}" ip netns exec "${NETNS_NS[node]}" env RANK="$rank" WORLD_SIZE="$world" \
        LOCAL_RANK="$l" LOCAL_WORLD_SIZE="${per[node]}" GROUP_RANK="$node" \
        MASTER_ADDR="${NETNS_IP[0]}" MASTER_PORT="$port" \
        TUTTI_HOST_ID="${NETNS_HOSTID[node]}" NCCL_SOCKET_IFNAME="=${NETNS_IF[node]}" \
        "$@" </dev/null >"$NETNS_RUN_DIR/rank$rank.log" 2>&1 &
      pids[rank]=$!
      _NETNS_PIDS+=("$!")
      rank=$((rank + 1))
    done
  done

  # Poll rather than `wait -n -p`: when several ranks end at once, bash may
  # move them out of its job table before `wait -n` asks for them ("no such
  # job"); `wait PID` still finds their status once `kill -0` fails.
  local timeout=${NETNS_TIMEOUT:-120} deadline
  deadline=$((SECONDS + timeout))
  local left=$world failed=-1 failed_rc=0 rc
  local -a rcs=()
  while ((left > 0 && failed == -1)); do
    for ((r = 0; r < world; r++)); do
      [[ -z ${rcs[r]:-} ]] || continue
      kill -0 "${pids[r]}" 2>/dev/null && continue
      rc=0
      wait "${pids[r]}" 2>/dev/null || rc=$?
      rcs[r]=$rc
      left=$((left - 1))
      if ((rc != 0)); then
        failed=$r
        failed_rc=$rc
        break
      fi
    done
    ((left > 0 && failed == -1)) || break
    if ((SECONDS >= deadline)); then
      failed=-3
      failed_rc=124
      break
    fi
    sleep 0.05
  done

  local p alive k
  if ((failed != -1)); then
    # Stop the others: TERM to each rank's group, KILL after 3 s.
    for ((r = 0; r < world; r++)); do
      [[ -n ${rcs[r]:-} ]] && continue
      kill -TERM -- "-${pids[r]}" 2>/dev/null || true
    done
    for ((k = 0; k < 30; k++)); do
      alive=0
      for ((r = 0; r < world; r++)); do
        [[ -z ${rcs[r]:-} ]] && kill -0 "${pids[r]}" 2>/dev/null && alive=1
      done
      ((alive)) || break
      sleep 0.1
    done
    for ((r = 0; r < world; r++)); do
      [[ -z ${rcs[r]:-} ]] && kill -KILL -- "-${pids[r]}" 2>/dev/null
    done
    for ((r = 0; r < world; r++)); do
      [[ -n ${rcs[r]:-} ]] && continue
      rc=0
      wait "${pids[r]}" 2>/dev/null || rc=$?
      rcs[r]="$rc (stopped)"
    done
  fi
  _netns_forget "${pids[@]}"

  if ((failed == -1)); then
    [[ ${NETNS_SHOW:-1} == 0 ]] || cat "$NETNS_RUN_DIR/rank0.log"
    NETNS_FAILED_RANK=-1
    return 0
  fi
  local tail_n=${NETNS_TAIL:-30} what
  if ((failed == -3)); then
    what="timed out after ${timeout}s"
    NETNS_FAILED_RANK=-1
  else
    what="rank $failed failed with exit code $failed_rc"
    NETNS_FAILED_RANK=$failed
  fi
  {
    echo "netns_run_ranks: $what (nodes '$spec', master ${NETNS_IP[0]}:$port): $*"
    for ((r = 0; r < world; r++)); do
      echo "  rank $r: exit ${rcs[r]:-?}"
    done
    for ((r = 0; r < world; r++)); do
      # The failed rank's output; on timeout, every rank's.
      ((r == failed || failed < 0)) || continue
      echo "---- rank $r output (last $tail_n lines of $NETNS_RUN_DIR/rank$r.log) ----"
      tail -n "$tail_n" "$NETNS_RUN_DIR/rank$r.log"
    done
  } >&2
  return "$failed_rc"
}

# netns_tcp_rate FROM TO [SECONDS]: one TCP stream from node FROM to node TO
# (through both nodes' shaped links and the bridge) for SECONDS (2); prints the
# receiver's line "tcp_stream bytes= seconds= GB/s= Gbit/s=" and returns 0.
# netns_shape_node NODE RATE: node NODE's link at RATE both ways (its tbf on
# the node side and on the switch side), with the burst and latency of
# netns_setup's shaping.
netns_shape_node() {
  local node=$1 rate=$2 side ns dev
  [[ -n ${NETNS_TBF_BURST_USED:-} ]] || _netns_die "netns_shape_node: netns_setup shaped no link" || return 1
  for side in "${NETNS_NS[$node]} ${NETNS_IF[$node]}" "$NETNS_SWITCH ${NETNS_SWIF[$node]}"; do
    read -r ns dev <<<"$side"
    tc -n "$ns" qdisc change dev "$dev" root tbf rate "$rate" \
      burst "$NETNS_TBF_BURST_USED" latency "$NETNS_TBF_LATENCY_USED" || return 1
  done
}

netns_tcp_rate() {
  local from=${1:?netns_tcp_rate FROM TO [SECONDS]} to=${2:?netns_tcp_rate FROM TO [SECONDS]}
  local secs=${3:-2} py=${NETNS_PYTHON:-} port out rc=0 rpid
  if [[ -z $py ]]; then
    # A plain interpreter starts faster than a version-manager shim.
    py=python3
    [[ -x /usr/bin/python3 ]] && py=/usr/bin/python3
  fi
  port=$(_netns_pick_port) || return 1
  _NETNS_LAST_PORT=$port
  out="$NETNS_WORKDIR/tcp_rate.$port"
  ip netns exec "${NETNS_NS[to]}" "$py" "$_NETNS_LIBDIR/tcp_stream.py" recv "${NETNS_IP[to]}" \
    "$port" "$((${secs%.*} + 30))" >"$out" 2>&1 &
  rpid=$!
  _NETNS_PIDS+=("$rpid")
  ip netns exec "${NETNS_NS[from]}" "$py" "$_NETNS_LIBDIR/tcp_stream.py" send "${NETNS_IP[to]}" \
    "$port" "$secs" || rc=$?
  wait "$rpid" || rc=$?
  _netns_forget "$rpid"
  if ((rc != 0)) || ! grep -q '^tcp_stream ' "$out"; then
    _netns_die "netns_tcp_rate $from -> $to failed (exit $rc): $(tail -n 5 "$out")"
    return 1
  fi
  grep '^tcp_stream ' "$out"
}
