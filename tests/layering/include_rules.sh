#!/usr/bin/env bash
# The include rules of the layers (docs/architecture.md, "Include rules"):
# includes go down only, and each folder may include only the folders below.
#
#   include/ (nccl.h, tutti/*.h)    the public C API, anyone
#   src/capi                        anything of tutti; nothing else includes capi/
#   src/core                        algo, compress, transports, topology, base; backends/cpu
#                                     only in backend.cc and host_kernels.cc (the seam's two
#                                     implementations: the CPU plugin table, the host kernels)
#   src/algo, src/compress          algo (compress also backends/cpu), base
#   transports/, backends/cpu,      their own folder and base only: a transport or
#   topology/                         backend never sees the communicator
#   src/base                        nothing else of tutti
#   src/pytorch, bench/tutti_perf,  the public headers only (they link libtutti.so),
#   backends/{cuda,ze,xpu_emu,...}    plus their own files
#
# In the library's folders (src/, transports/, topology/, backends/cpu)
# every quoted include is folder-qualified ("core/comm.h", never "comm.h");
# plugins and programs built like out-of-tree code include their own headers
# by plain name. Tests (tests/) may reach any internal header.
#
# usage: include_rules.sh <source dir>        check the tree; exit 1 on a violation
#        include_rules.sh --self-test         show that a violation is caught
set -uf  # -f: the rules hold "*" literally

# folder | allowed include prefixes ("." = the file's own folder by plain
# name, "@" = the file's own folder qualified, "*" = anything); folders (or
# single files) are matched longest first.
RULES=(
  "src/base|base/"
  "src/algo|algo/ base/"
  "src/compress|compress/ algo/ backends/cpu/ base/"
  "src/core|core/ algo/ compress/ transports/ topology/ base/ tutti/ nccl.h"
  "src/core/backend.cc|core/ backends/cpu/ base/ tutti/ nccl.h"
  "src/core/host_kernels.cc|core/ backends/cpu/"
  "src/capi|*"
  "src/pytorch|tutti/ nccl.h"
  "transports|transports/ base/"
  "topology|topology/ base/"
  "backends/cpu|backends/cpu/ base/ tutti/ nccl.h"
  "backends|. @ tutti/ nccl.h"
  "bench/tutti_perf|. common/ tutti/ nccl.h"
)
QUALIFIED=(src transports topology backends/cpu)

check_tree() {
  local root=$1 bad=0 f rel line inc rule folder allowed ok a own
  while IFS= read -r f; do
    rel=${f#"$root"/}
    # the most specific rule
    rule=
    for r in "${RULES[@]}"; do
      folder=${r%%|*}
      if [[ ($rel == "$folder"/* || $rel == "$folder") && ${#folder} -gt ${#rule} ]]; then
        rule=$folder
      fi
    done
    [[ -z $rule ]] && continue
    for r in "${RULES[@]}"; do [[ ${r%%|*} == "$rule" ]] && allowed=${r#*|}; done
    own=$(dirname "$rel")
    while IFS=: read -r line inc; do
      inc=${inc#*\"}
      inc=${inc%%\"*}
      for q in "${QUALIFIED[@]}"; do
        if [[ $rel == "$q"/* && $inc != */* && $inc != nccl.h ]]; then
          echo "$rel:$line: #include \"$inc\" is not folder-qualified (write \"${own#src/}/$inc\")"
          bad=1
          continue 2
        fi
      done
      ok=0
      for a in $allowed; do
        case $a in
          '*') ok=1 ;;
          .) [[ $inc != */* && -e $root/$own/$inc ]] && ok=1 ;;
          @) [[ $inc == "$own"/* ]] && ok=1 ;;
          */) [[ $inc == "$a"* ]] && ok=1 ;;
          *) [[ $inc == "$a" ]] && ok=1 ;;
        esac
        ((ok)) && break
      done
      if ((!ok)); then
        echo "$rel:$line: #include \"$inc\" crosses a seam: $rule/ may include only: $allowed"
        bad=1
      fi
    done < <(grep -n '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$f")
  done < <(find "$root/src" "$root/transports" "$root/topology" "$root/backends" \
    "$root/bench/tutti_perf" -type f \( -name '*.h' -o -name '*.cc' -o -name '*.c' \
    -o -name '*.cu' -o -name '*.inc' \) 2>/dev/null | sort)
  return $bad
}

if [[ ${1:-} == --self-test ]]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  mkdir -p "$tmp/src/base" "$tmp/src/core" "$tmp/transports/tcp" "$tmp/src/pytorch"
  printf '#include "base/log.h"\n' >"$tmp/src/base/ok.cc"
  check_tree "$tmp" >/dev/null || { echo "self-test: a clean tree was refused"; exit 1; }
  fails=0
  for bad in "transports/tcp/x.cc|core/comm.h" "src/base/y.cc|core/comm.h" \
    "src/core/z.cc|capi/handle.h" "src/core/w.cc|comm.h" "src/pytorch/v.cc|core/comm.h" \
    "src/core/executor.cc|backends/cpu/kernels.h"; do
    file=${bad%%|*} inc=${bad#*|}
    printf '#include "%s"\n' "$inc" >"$tmp/$file"
    if out=$(check_tree "$tmp"); then
      echo "self-test: $file including \"$inc\" was not refused"
      fails=1
    else
      echo "self-test: refused as it should: $out"
    fi
    rm "$tmp/$file"
  done
  exit $fails
fi

root=$(cd "${1:?usage: include_rules.sh <source dir> | --self-test}" && pwd)
if check_tree "$root"; then
  echo "include_rules: every include of src/, transports/, topology/, backends/ and bench/tutti_perf follows the layers"
else
  echo "include_rules: includes that break the layering (see docs/architecture.md, \"Include rules\")"
  exit 1
fi
