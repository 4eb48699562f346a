#!/bin/sh
# abi_symbols: tutti's shared libraries against NVIDIA's libnccl.so.2.
#
#   check_symbols.sh NVIDIA_LIBNCCL TUTTI_LIB [TUTTI_LIB...]
#
# For every tutti library given (libtutti.so, tutti's libnccl.so.2):
#   1. it exports every function NVIDIA's library exports (names, unversioned);
#   2. it exports nothing but nccl*, pnccl* and tutti* (linker-made markers
#      such as _init/_fini/_edata/_end/__bss_start are tolerated);
#   3. its DT_NEEDED names no vendor runtime (CUDA, Level Zero, UCX, libfabric,
#      ibverbs) and no libnccl: those belong to plugins under lib/tutti/.
# Exits 0 if all hold, 1 otherwise (listing each problem), 77 (skip) when
# NVIDIA's library is not installed.
set -u

if [ $# -lt 2 ]; then
  echo "usage: $0 NVIDIA_LIBNCCL TUTTI_LIB [TUTTI_LIB...]" >&2
  exit 2
fi
nvidia=$1
shift

if [ ! -r "$nvidia" ]; then
  echo "SKIP: NVIDIA's libnccl.so.2 not found at '$nvidia'; nothing to compare against"
  exit 77
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/tutti-abi-symbols.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT INT TERM

# Defined dynamic symbols, one name a line, version suffix (@...) dropped.
exports() {
  nm -D --defined-only "$1" | awk 'NF >= 3 { sub(/@.*/, "", $3); print $3 }' | sort -u
}

if ! exports "$nvidia" >"$tmp/nvidia"; then
  echo "FAIL: cannot read the dynamic symbols of $nvidia"
  exit 1
fi
if grep -q '^tutti' "$tmp/nvidia"; then
  echo "FAIL: $nvidia exports tutti* symbols: it is tutti, not NVIDIA's library"
  exit 1
fi
echo "reference: $nvidia ($(wc -l <"$tmp/nvidia") exported symbols)"

status=0
for lib in "$@"; do
  echo "== $lib"
  if [ ! -r "$lib" ]; then
    echo "FAIL: $lib does not exist (is the library built?)"
    status=1
    continue
  fi
  if ! exports "$lib" >"$tmp/tutti"; then
    echo "FAIL: cannot read the dynamic symbols of $lib"
    status=1
    continue
  fi

  missing=$(comm -23 "$tmp/nvidia" "$tmp/tutti")
  if [ -n "$missing" ]; then
    echo "FAIL: $(echo "$missing" | wc -l) symbol(s) of NVIDIA's library not exported:"
    echo "$missing" | sed 's/^/  /'
    status=1
  else
    echo "ok: all $(wc -l <"$tmp/nvidia") NVIDIA symbols exported"
  fi

  extra=$(grep -Ev '^(nccl|pnccl|tutti)' "$tmp/tutti" |
    grep -Ev '^(_init|_fini|_edata|_end|__bss_start|_DYNAMIC|_GLOBAL_OFFSET_TABLE_)$')
  if [ -n "$extra" ]; then
    echo "FAIL: $(echo "$extra" | wc -l) symbol(s) exported outside nccl*/pnccl*/tutti*:"
    echo "$extra" | head -50 | sed 's/^/  /'
    status=1
  else
    echo "ok: exports only nccl*/pnccl*/tutti* ($(wc -l <"$tmp/tutti") symbols)"
  fi

  needed=$(readelf -d "$lib" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
  bad=$(echo "$needed" | grep -E '^lib(cuda|ze|ucp|ucs|uct|fabric|ibverbs|nccl)' || true)
  if [ -n "$bad" ]; then
    echo "FAIL: links vendor runtimes directly (DT_NEEDED):"
    echo "$bad" | sed 's/^/  /'
    status=1
  else
    echo "ok: DT_NEEDED free of vendor runtimes ($(echo $needed))"
  fi
done

exit $status
