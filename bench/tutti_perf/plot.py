#!/usr/bin/python3
"""Draw bus bandwidth against size from tutti-perf (or nccl-tests) JSON files.

usage: tutti-perf-plot [-o busbw.png] [--in-place] [--title T] FILE.json [FILE.json ...]
       tutti-perf-plot --check

Each file is one run of `tutti-perf ... -J FILE.json` (nccl-tests' -J files
work too). Every run gets one line per (type, redop, root) it holds, labelled
with the file name, plus the series when a file holds more than one. The
x axis is the size in bytes (log 2), the y axis busbw in GB/s, out-of-place
by default. `tutti-perf --plot FILE.png` runs this script on its own results.

Needs matplotlib: apt-get install python3-matplotlib (Debian), or
pip install matplotlib. --check exits 0 when it is there, 2 when not.
"""

import argparse
import json
import os
import sys

PROG = "tutti-perf-plot"


def load_matplotlib():
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only, no display needed
        import matplotlib.pyplot as plt

        return plt
    except ImportError:
        print(
            f"{PROG}: matplotlib is not installed: apt-get install python3-matplotlib "
            "(or pip install matplotlib)",
            file=sys.stderr,
        )
        sys.exit(2)


def series_of(path, in_place):
    """{(type, redop, root): [(size, busbw), ...]} of one JSON file."""
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        print(f"{PROG}: cannot read {path}: {e}", file=sys.stderr)
        sys.exit(2)
    half = "in_place" if in_place else "out_of_place"
    out = {}
    for row in doc.get("results", []):
        body = row.get(half) or {}
        bw = body.get("bus_bw")
        if not isinstance(bw, (int, float)):
            continue
        key = (row.get("type", "?"), row.get("redop", "?"), str(row.get("root", "")).strip())
        out.setdefault(key, []).append((row["size"], float(bw)))
    name = (doc.get("tutti_perf") or {}).get("collective")
    return name, out


def main():
    ap = argparse.ArgumentParser(prog=PROG, description="busbw against size from -J files")
    ap.add_argument("files", nargs="*", metavar="FILE.json")
    ap.add_argument("-o", "--output", default="busbw.png", help="image file (default busbw.png)")
    ap.add_argument("--in-place", action="store_true", help="plot the in-place results")
    ap.add_argument("--title", default=None)
    ap.add_argument("--check", action="store_true", help="only check that matplotlib is there")
    args = ap.parse_args()
    if args.check:
        load_matplotlib()
        return 0
    if not args.files:
        ap.error("no JSON file given")
    lines = []
    for path in args.files:
        coll, series = series_of(path, args.in_place)
        if not series:
            print(f"{PROG}: {path} has no results to plot", file=sys.stderr)
            return 2
        base = os.path.basename(path) + (f" ({coll})" if coll else "")
        for key, points in series.items():
            label = base if len(series) == 1 else f"{base}: {' '.join(k for k in key if k)}"
            lines.append((label, sorted(points)))
    plt = load_matplotlib()
    fig, ax = plt.subplots(figsize=(9, 5.5))
    for label, points in lines:
        xs = [max(p[0], 1) for p in points]  # size 0 cannot sit on a log axis
        ax.plot(xs, [p[1] for p in points], marker="o", markersize=3, label=label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("size (bytes)")
    ax.set_ylabel("busbw (GB/s)")
    ax.grid(True, which="both", alpha=0.3)
    ax.set_title(args.title or f"busbw ({'in-place' if args.in_place else 'out-of-place'})")
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(args.output)
    print(f"{PROG}: wrote {args.output} ({len(lines)} line(s))", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
