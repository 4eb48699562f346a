#!/usr/bin/env bash
# Installs the build into a temporary prefix, checks the documented layout,
# then builds a consumer through pkg-config and runs it (one rank, host memory).
#   install_layout.sh <build-dir>
set -euo pipefail
build="$1"
prefix="$(mktemp -d)"
trap 'rm -rf "$prefix"' EXIT
cmake --install "$build" --prefix "$prefix" > /dev/null
for f in include/nccl.h include/tutti/tutti.h include/tutti/backend_plugin.h lib/libtutti.so \
         lib/tutti-nccl/libnccl.so.2 lib/pkgconfig/tutti.pc lib/cmake/tutti/tuttiConfig.cmake \
         bin/tutti-perf bin/tutti-topo; do
  [ -e "$prefix/$f" ] || { echo "missing $f"; exit 1; }
done
[ -d "$prefix/lib/tutti" ] || { echo "missing lib/tutti/"; exit 1; }
cat > "$prefix/consumer.c" <<'C'
#include <stdio.h>
#include <nccl.h>
#include <tutti/tutti.h>
int main(void) {
  ncclUniqueId id; ncclComm_t c; int in[3] = {1, 2, 3}, out[3] = {0, 0, 0}, v = 0;
  if (ncclGetUniqueId(&id) || ncclCommInitRank(&c, 1, id, 0)) return 1;
  if (ncclAllReduce(in, out, 3, ncclInt32, ncclSum, c, NULL)) return 2;
  if (tuttiGetVersion(&v) || v <= 0) return 3;
  ncclCommDestroy(c);
  printf("consumer ok: %d %d %d, tutti %s from %s\n", out[0], out[1], out[2],
         tuttiGetVersionString(), tuttiLibraryPath());
  return out[0] == 1 && out[1] == 2 && out[2] == 3 ? 0 : 4;
}
C
flags="$(PKG_CONFIG_PATH="$prefix/lib/pkgconfig" pkg-config --cflags --libs tutti)"
cc -std=c99 -o "$prefix/consumer" "$prefix/consumer.c" $flags -Wl,-rpath,"$prefix/lib"
out="$("$prefix/consumer")"
echo "$out"
case "$out" in *"from $prefix/lib/libtutti.so"*) ;; *) echo "answered by the wrong library"; exit 1;; esac
