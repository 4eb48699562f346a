#!/usr/bin/env bash
# Installs the build into a temporary prefix, checks the documented layout,
# then builds a consumer through pkg-config and runs it (one rank, host memory),
# runs the installed tutti-conformance on the installed xpu_emu plugin, and
# builds the installed template plugin the way docs/backends.md tells a vendor
# to and runs tutti-conformance on it (both must exit 0).
#   install_layout.sh <build-dir>
set -euo pipefail
build="$1"
prefix="$(mktemp -d)"
trap 'rm -rf "$prefix"' EXIT
cmake --install "$build" --prefix "$prefix" > /dev/null
for f in include/nccl.h include/tutti/tutti.h include/tutti/backend_plugin.h lib/libtutti.so \
         lib/tutti-nccl/libnccl.so.2 lib/pkgconfig/tutti.pc lib/cmake/tutti/tuttiConfig.cmake \
         bin/tutti-perf bin/tutti-topo bin/tutti-conformance lib/tutti/libtutti-backend-xpu_emu.so \
         share/tutti/backend-template/template_backend.c \
         share/tutti/backend-template/CMakeLists.txt; do
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

# tutti-conformance finds the plugin by name in P/lib/tutti, as libtutti.so does.
set +e
conf="$(env -u TUTTI_PLUGIN_PATH "$prefix/bin/tutti-conformance" xpu_emu 2>&1)"
rc=$?
set -e
echo "$conf" | tail -n 3
[ "$rc" -eq 0 ] || { echo "$conf"; echo "tutti-conformance xpu_emu: exit status $rc"; exit 1; }
case "$conf" in *"backend 'xpu_emu' from $prefix/lib/tutti/libtutti-backend-xpu_emu.so"*) ;;
  *) echo "tutti-conformance did not load the installed xpu_emu"; exit 1;; esac

# The vendor's steps (docs/backends.md, "Writing a plugin"), as written there.
cd "$prefix"
cp -r "$prefix/share/tutti/backend-template" mybackend
cmake -S mybackend -B mybackend/build -DCMAKE_PREFIX_PATH="$prefix" -DPLUGIN_NAME=mine > /dev/null
cmake --build mybackend/build > /dev/null
set +e
conf="$("$prefix/bin/tutti-conformance" mybackend/build/libtutti-backend-mine.so 2>&1)"
rc=$?
set -e
echo "$conf" | tail -n 1
[ "$rc" -eq 0 ] || { echo "$conf"; echo "tutti-conformance on the template: exit status $rc"; exit 1; }
case "$conf" in *"backend 'mine' from "*) ;; *) echo "the template's name is not 'mine'"; exit 1;; esac
