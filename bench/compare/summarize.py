"""Summarises bench/compare results: medians over repetitions, one table per
rank count with the ratios tutti/Open MPI (shared memory and TCP) and
tutti/Gloo (TCP) and whether tutti's shared-memory busbw reaches Open MPI's
from 1 MiB; the machine's physical limits (limits.csv) and, for 2 ranks, the
fraction of them reached at the largest size; a log-log plot of bus bandwidth
against size, one panel per rank count.

usage: /usr/bin/python3 summarize.py results.csv plot.png [limits.csv]
CSV columns: rep,impl,transport,np,bytes,time_us,busbw_gbs; limits: rep,limit,gbs
"""
import csv
import os
import statistics
import sys
from collections import defaultdict

COLS = [("tutti", "shm"), ("openmpi", "shm"), ("tutti", "tcp"), ("openmpi", "tcp"),
        ("gloo", "tcp")]
RATIOS = ((("tutti", "shm"), ("openmpi", "shm")),
          (("tutti", "tcp"), ("openmpi", "tcp")),
          (("tutti", "tcp"), ("gloo", "tcp")))
TARGET_FROM = 1 << 20  # "target met": tutti shm busbw >= Open MPI shm busbw from this size


def human(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:g} {unit}"
        n /= 1024
    return f"{n:g} TiB"


def busbw_factor(n):
    """nccl-tests all-reduce bus bandwidth factor: busbw = S / t * 2(n-1)/n."""
    return 2 * (n - 1) / n


def shm_ring_allreduce_traffic(n, size):
    """Model of the memory traffic of tutti's shared-memory ring all-reduce:
    the bytes ONE rank reads and writes for a buffer of `size` bytes per rank,
    n ranks. Returns [(step, reads as text, writes as text, read bytes,
    written bytes)]; change this function when the algorithm changes."""
    c = (n - 1) / n * size  # one ring pass: (n-1) chunks of size/n
    return [
        ("reduce-scatter send: copy into the ring", "(n-1)/n*S", "(n-1)/n*S", c, c),
        ("reduce-scatter reduce: ring + local -> out", "2(n-1)/n*S", "(n-1)/n*S", 2 * c, c),
        ("all-gather send: copy into the ring", "(n-1)/n*S", "(n-1)/n*S", c, c),
        ("all-gather receive: ring -> out", "(n-1)/n*S", "(n-1)/n*S", c, c),
    ]


def shm_limit_busbw(n, size, memcpy_gbs):
    """busbw limit (GB/s) of the shm ring under the model above: a memcpy moves
    2 bytes (one read, one write) per byte copied, so a core moves 2 * memcpy
    bytes/s; ranks run in parallel on separate cores."""
    total = sum(r + w for *_, r, w in shm_ring_allreduce_traffic(n, size))
    t = total / (2 * memcpy_gbs * 1e9)
    return size / t * busbw_factor(n) / 1e9, total, t


def tcp_limit_busbw(n, bidir_per_dir_gbs):
    """busbw limit over loopback TCP, 2 ranks: each rank sends S and receives S
    at the same time, so t >= S / per-direction rate and busbw = S/t*2(n-1)/n
    = S/t <= the per-direction figure of the both-directions stream."""
    assert n == 2, "the both-directions figure is a 2-process measurement"
    return bidir_per_dir_gbs


def read_limits(path):
    vals = defaultdict(list)
    if path and os.path.exists(path):
        for row in csv.DictReader(open(path)):
            vals[row["limit"]].append(float(row["gbs"]))
    return {k: (statistics.median(v), min(v), max(v), len(v)) for k, v in vals.items()}


def print_table(n, med, sizes):
    def get(impl, tr, b):
        return med.get((impl, tr, n, b))

    reps = max(v[2] for k, v in med.items() if k[2] == n)
    print(f"# all-reduce float32 sum, {n} ranks; medians of {reps} repetitions; "
          f"time in us, busbw in GB/s")
    head = f"{'size':>10}"
    for impl, tr in COLS:
        head += f" | {impl + '/' + tr:>21}"
    head += " | tutti/ompi shm | tutti/ompi tcp | tutti/gloo tcp | shm target"
    print(head)
    print(f"{'':>10}" + "".join(f" | {'time':>9} {'busbw':>11}" for _ in COLS) +
          " | (busbw ratio, or time ratio below 64 KiB: >1 means tutti is better)"
          f" | (busbw >= ompi from {human(TARGET_FROM)})")
    met = total = 0
    for b in sizes:
        line = f"{human(b):>10}"
        for impl, tr in COLS:
            m = get(impl, tr, b)
            line += f" | {m[0]:9.2f} {m[1]:11.3f}" if m else f" | {'-':>9} {'-':>11}"
        for (a, ta), (c, tc) in RATIOS:
            x, y = get(a, ta, b), get(c, tc, b)
            if not x or not y:
                line += f" | {'-':>14}"
            elif b < 64 * 1024:
                line += f" | {y[0] / x[0]:13.2f}t"
            else:
                line += f" | {x[1] / y[1] if y[1] else float('inf'):14.2f}"
        x, y = get("tutti", "shm", b), get("openmpi", "shm", b)
        if b >= TARGET_FROM and x and y:
            ok = x[1] >= y[1]
            met, total = met + ok, total + 1
            line += f" | {'met' if ok else 'NOT met':>10}"
        else:
            line += f" | {'':>10}"
        print(line)
    print(f"# {n} ranks, target tutti shm busbw >= Open MPI shm busbw from "
          f"{human(TARGET_FROM)}: " +
          (f"met at {met} of {total} sizes" if total else "no size measured that large"))
    print()


def print_limits(limits, med, sizes_by_np):
    print("# physical limits (bench/compare/limits.c), GB/s, median [min, max] of "
          f"{max((v[3] for v in limits.values()), default=0)} repetitions")
    names = (("memcpy", "memcpy, 1 core, 256 MiB, bytes copied/s"),
             ("tcp_one", "TCP loopback, one stream, one direction"),
             ("tcp_bidir_per_dir", "TCP loopback, both directions at once, per direction"),
             ("tcp_bidir_aggregate", "TCP loopback, both directions at once, sum"))
    for key, text in names:
        if key in limits:
            m, lo, hi, _ = limits[key]
            print(f"{text:>55}: {m:8.3f}  [{lo:.3f}, {hi:.3f}]")
    n = 2
    if n not in sizes_by_np:
        print()
        return
    s = max(sizes_by_np[n])
    print(f"\n# fraction of the limit reached, {n} ranks, largest size S = {human(s)} ({s} bytes)")
    tutti_shm = med.get(("tutti", "shm", n, s))
    if "memcpy" in limits and tutti_shm:
        mc = limits["memcpy"][0]
        lim, total, t = shm_limit_busbw(n, s, mc)
        print(f"shm: bytes one rank reads + writes (model shm_ring_allreduce_traffic, n={n}):")
        for step, rt, wt, r, w in shm_ring_allreduce_traffic(n, s):
            print(f"  {step:<43} read {rt:<10} = {r:>11.0f} B, write {wt:<9} = {w:>11.0f} B")
        print(f"  total read + written = {total:.0f} B = {total / s:g} S; "
              f"t_min = total / (2 * memcpy) = {total:.0f} B / (2 * {mc:.3f} GB/s) = "
              f"{t * 1e6:.1f} us")
        print(f"  busbw limit = S / t_min * 2(n-1)/n = {lim:.3f} GB/s (= {lim / mc:.3f} x memcpy)")
        for impl in ("tutti", "openmpi"):
            m = med.get((impl, "shm", n, s))
            if m:
                print(f"  {impl + '/shm':<12} busbw {m[1]:8.3f} GB/s = {m[1] / lim:.2f} of the limit")
    if "tcp_bidir_per_dir" in limits and med.get(("tutti", "tcp", n, s)):
        lim = tcp_limit_busbw(n, limits["tcp_bidir_per_dir"][0])
        print(f"tcp: each rank sends S and receives S at once: t_min = S / per-direction rate;")
        print(f"  busbw limit = S / t_min * 2(n-1)/n = per-direction both-ways figure = "
              f"{lim:.3f} GB/s")
        for impl in ("tutti", "openmpi", "gloo"):
            m = med.get((impl, "tcp", n, s))
            if m:
                print(f"  {impl + '/tcp':<12} busbw {m[1]:8.3f} GB/s = {m[1] / lim:.2f} of the limit")
    print("# below the caches' size the shm figures can exceed a limit taken from a 256 MiB memcpy")
    print()


def plot(png, med, nps, sizes_by_np, limits):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("# matplotlib missing: no plot (apt-get install python3-matplotlib)")
        return
    fig, axes = plt.subplots(1, len(nps), figsize=(8 * len(nps), 5), squeeze=False)
    for ax, n in zip(axes[0], nps):
        sizes = sizes_by_np[n]
        for impl, tr in COLS:
            xs = [b for b in sizes if (impl, tr, n, b) in med]
            if xs:
                ys = [max(med[(impl, tr, n, b)][1], 1e-4) for b in xs]
                ax.plot(xs, ys, marker="o", label=f"{impl} ({tr})")
        if n == 2 and "memcpy" in limits:
            lim = shm_limit_busbw(n, max(sizes), limits["memcpy"][0])[0]
            ax.axhline(lim, ls="--", color="gray", label="shm limit (memcpy model)")
        if n == 2 and "tcp_bidir_per_dir" in limits:
            ax.axhline(tcp_limit_busbw(n, limits["tcp_bidir_per_dir"][0]), ls=":",
                       color="black", label="tcp limit (both directions, per direction)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel("bus bandwidth (GB/s)")
        ax.set_title(f"all-reduce float32 sum, {n} local ranks")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    print(f"# plot: {png}")


def main(path, png, limits_path=None):
    samples = defaultdict(list)  # (impl, transport, np, bytes) -> [(time, busbw)]
    for row in csv.DictReader(open(path)):
        key = (row["impl"], row["transport"], int(row["np"]), int(row["bytes"]))
        samples[key].append((float(row["time_us"]), float(row["busbw_gbs"])))
    med = {k: (statistics.median(t for t, _ in v), statistics.median(b for _, b in v), len(v))
           for k, v in samples.items()}
    nps = sorted({k[2] for k in med})
    sizes_by_np = {n: sorted({k[3] for k in med if k[2] == n}) for n in nps}
    for n in nps:
        print_table(n, med, sizes_by_np[n])
    limits = read_limits(limits_path)
    if limits:
        print_limits(limits, med, sizes_by_np)
    plot(png, med, nps, sizes_by_np, limits)


if __name__ == "__main__":
    main(*sys.argv[1:4])
