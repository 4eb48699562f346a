#!/usr/bin/env bash
# The C boundary stays thin (docs/architecture.md, "The C boundary"): src/capi
# validates, calls into the core and maps errors, in at most 1,500 lines in
# all and no file over 600. Engine logic that grows here belongs in the core.
#
# usage: capi_size.sh <source dir>   check src/capi; exit 1 when over
#        capi_size.sh --self-test    show that an oversized file is caught
set -u
readonly MAX_TOTAL=1500 MAX_FILE=600

check() {
  local dir=$1 total=0 bad=0 n f
  for f in "$dir"/*; do
    [[ -f $f ]] || continue
    n=$(wc -l <"$f")
    total=$((total + n))
    if ((n > MAX_FILE)); then
      echo "${f##*/}: $n lines (at most $MAX_FILE per file)"
      bad=1
    fi
  done
  if ((total > MAX_TOTAL)); then
    echo "src/capi: $total lines (at most $MAX_TOTAL in all)"
    bad=1
  fi
  ((bad == 0)) && echo "src/capi: $total lines (at most $MAX_TOTAL), no file over $MAX_FILE"
  return $bad
}

if [[ ${1:-} == --self-test ]]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  seq 1 $((MAX_FILE + 1)) >"$tmp/big.cc"
  if check "$tmp" >/dev/null; then echo "self-test: a $((MAX_FILE + 1))-line file passed"; exit 1; fi
  seq 1 $MAX_FILE >"$tmp/big.cc"
  for i in 1 2; do seq 1 $MAX_FILE >"$tmp/f$i.cc"; done
  if check "$tmp" >/dev/null; then echo "self-test: $((MAX_FILE * 3)) lines in all passed"; exit 1; fi
  echo "self-test: both caught"
  exit 0
fi
check "${1:?usage: capi_size.sh <source dir>}/src/capi"
