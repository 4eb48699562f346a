# Helpers shared by tests/security/attacks.sh and bench/security/run.sh
# (sourced, not run).

# A TCP port on this host that nothing listens on (for NCCL_COMM_ID).
freePort() {
  local p
  while :; do
    p=$((20000 + RANDOM % 10000))
    ss -Htln "sport = :$p" | grep -q . || { echo "$p"; return; }
  done
}

# ssWatch OUT PIDFILE [INTERVAL]: appends the listening sockets of the job's
# processes (the parent= and pids= lines of the victim's pid file, once it
# exists) to OUT, every INTERVAL seconds (0.2), until the first of them is
# gone.
ssWatch() {
  local out=$1 pidfile=$2 interval=${3:-0.2} pids re first
  for _ in $(seq 200); do [ -s "$pidfile" ] && break; sleep 0.05; done
  pids=$(sed -n 's/^parent=//p; s/^pids=//p' "$pidfile" 2>/dev/null | tr '\n' ' ')
  [ -n "$pids" ] || return
  re=$(echo "$pids" | sed 's/ *$//; s/ /|/g')
  first=${pids%% *}
  while kill -0 "$first" 2>/dev/null; do
    ss -Htlnp 2>/dev/null | grep -E "pid=($re)," >> "$out"
    sleep "$interval"
  done
}

# wildcards FILE: how many lines of an ss sample file listen on a wildcard
# address.
wildcards() {
  awk '$4 ~ /^(0\.0\.0\.0|\*|\[::\]):/' "$1" 2>/dev/null | wc -l
}

# kv LINE KEY: the value of KEY=value in a line of key=value words; kvn: the
# same, 0 when absent (numbers).
kv() { echo " $1" | grep -o " $2=[^ ]*" | head -1 | cut -d= -f2; }
kvn() {
  local v
  v=$(kv "$1" "$2")
  echo "${v:-0}"
}
