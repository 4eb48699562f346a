#!/bin/sh
# PyTorch benches for tutti_torch (docs/pytorch.md): the overlap timeline and
# the ResNet-18 DDP run (Gloo vs tutti and tutti's compression hooks).
#
# usage: bench/pytorch/run.sh [OUTDIR] [-- extra resnet18.py args]
#   TUTTI_BUILD=<cmake build dir>  where tutti_torch was built (default: build,
#                                  else the first build*/ that has python/tutti_torch)
#   PYTHON=/usr/bin/python3        Debian's python3, whose torch the backend targets
# Installs python3-torchvision and python3-matplotlib with apt when missing
# (needs root or sudo; never pip). Results: OUTDIR (default ./pytorch_bench_out)
# holds overlap_timeline.png, resnet18.png, resnet18.json and the logs.
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
PYTHON=${PYTHON:-/usr/bin/python3}
OUTDIR=${1:-$PWD/pytorch_bench_out}
[ $# -gt 0 ] && shift
[ "${1:-}" = "--" ] && shift

need=""
$PYTHON -c "import torchvision" 2>/dev/null || need="$need python3-torchvision"
$PYTHON -c "import matplotlib" 2>/dev/null || need="$need python3-matplotlib"
if [ -n "$need" ]; then
  echo "installing with apt:$need"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $need
fi

if [ -z "${TUTTI_BUILD:-}" ]; then
  for d in "$ROOT/build" "$ROOT"/build*; do
    if [ -d "$d/python/tutti_torch" ]; then TUTTI_BUILD=$d; break; fi
  done
fi
if [ -n "${TUTTI_BUILD:-}" ] && [ -d "$TUTTI_BUILD/python/tutti_torch" ]; then
  export PYTHONPATH="$TUTTI_BUILD/python${PYTHONPATH:+:$PYTHONPATH}"
fi
if ! $PYTHON -c "import tutti_torch" 2>/dev/null; then
  echo "tutti_torch is not importable by $PYTHON: build it (cmake --build <build>) and set TUTTI_BUILD, or install it (docs/pytorch.md)" >&2
  exit 1
fi
echo "tutti_torch: $($PYTHON -c 'import tutti_torch, os; print(os.path.dirname(tutti_torch.__file__), tutti_torch.tutti_version())')"
mkdir -p "$OUTDIR"
echo "== overlap of bucket all-reduces with backward =="
$PYTHON "$HERE/overlap_timeline.py" --out "$OUTDIR/overlap" --check 2>&1 | tee "$OUTDIR/overlap.log"
echo "== ResNet-18 =="
$PYTHON "$HERE/resnet18.py" --out "$OUTDIR" "$@" 2>&1 | tee "$OUTDIR/resnet18.log"
cp "$OUTDIR/overlap/overlap_timeline.png" "$OUTDIR/" 2>/dev/null || true
echo "results in $OUTDIR"
