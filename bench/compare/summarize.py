"""Summarises bench/compare results: medians over repetitions, one table with
the ratios tutti/Open MPI (shared memory and TCP) and tutti/Gloo (TCP), and a
log-log plot of bus bandwidth against size.

usage: /usr/bin/python3 summarize.py results.csv plot.png
CSV columns: rep,impl,transport,np,bytes,time_us,busbw_gbs
"""
import csv
import statistics
import sys
from collections import defaultdict


def human(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:g} {unit}"
        n /= 1024
    return f"{n:g} TiB"


def main(path, png):
    samples = defaultdict(list)  # (impl, transport, bytes) -> [(time, busbw)]
    nps = set()
    for row in csv.DictReader(open(path)):
        key = (row["impl"], row["transport"], int(row["bytes"]))
        samples[key].append((float(row["time_us"]), float(row["busbw_gbs"])))
        nps.add(row["np"])
    med = {k: (statistics.median(t for t, _ in v), statistics.median(b for _, b in v), len(v))
           for k, v in samples.items()}
    series = sorted({(k[0], k[1]) for k in med})
    sizes = sorted({k[2] for k in med})

    def get(impl, tr, b):
        return med.get((impl, tr, b))

    print(f"# all-reduce float32 sum, {','.join(sorted(nps))} ranks; medians of "
          f"{max(v[2] for v in med.values())} repetitions; time in us, busbw in GB/s")
    cols = [("tutti", "shm"), ("openmpi", "shm"), ("tutti", "tcp"), ("openmpi", "tcp"),
            ("gloo", "tcp")]
    head = f"{'size':>10}"
    for impl, tr in cols:
        head += f" | {impl + '/' + tr:>21}"
    head += " | tutti/ompi shm | tutti/ompi tcp | tutti/gloo tcp"
    print(head)
    print(f"{'':>10}" + "".join(f" | {'time':>9} {'busbw':>11}" for _ in cols) +
          " | (busbw ratio, or time ratio below 64 KiB: >1 means tutti is better)")
    for b in sizes:
        line = f"{human(b):>10}"
        for impl, tr in cols:
            m = get(impl, tr, b)
            line += f" | {m[0]:9.2f} {m[1]:11.3f}" if m else f" | {'-':>9} {'-':>11}"
        for (a, ta), (c, tc) in ((("tutti", "shm"), ("openmpi", "shm")),
                                 (("tutti", "tcp"), ("openmpi", "tcp")),
                                 (("tutti", "tcp"), ("gloo", "tcp"))):
            x, y = get(a, ta, b), get(c, tc, b)
            if not x or not y:
                line += f" | {'-':>14}"
            elif b < 64 * 1024:
                line += f" | {y[0] / x[0]:13.2f}t"
            else:
                line += f" | {x[1] / y[1] if y[1] else float('inf'):14.2f}"
        print(line)

    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("# matplotlib missing: no plot (apt-get install python3-matplotlib)")
        return
    fig, ax = plt.subplots(figsize=(8, 5))
    for impl, tr in series:
        xs = [b for b in sizes if get(impl, tr, b)]
        ys = [max(get(impl, tr, b)[1], 1e-4) for b in xs]
        ax.plot(xs, ys, marker="o", label=f"{impl} ({tr})")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title(f"all-reduce float32 sum, {','.join(sorted(nps))} local ranks")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    print(f"# plot: {png}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
