"""Summarises bench/compare results: medians over repetitions, one table per
collective and rank count. All-reduce: the ratios tutti/Open MPI (shared memory
and TCP) and tutti/Gloo (TCP); reduce-scatter, all-gather, broadcast: tutti/Open
MPI on shared memory. Every table has a shared-memory target column (see
TARGETS). Then the machine's physical limits (limits.csv) and, for 2 ranks, the
fraction of them reached by all-reduce at the largest size; a list of the sizes
where a target is not met; log-log plots of bus bandwidth against size, one
panel per rank count: plot.png for all-reduce, <coll>_busbw.png in the same
folder for each other collective. With rows of "tutti-base" (run.sh
--baseline), one more table per collective, rank count and transport: this
tree's tutti against the baseline's, its time and its ratios to Open MPI and
Gloo, with the medians over the sizes.

usage: /usr/bin/python3 summarize.py results.csv plot.png [limits.csv]
CSV columns: rep,impl,transport,coll,np,bytes,time_us,busbw_gbs (without coll:
all_reduce); limits: rep,limit,gbs
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
SHM_COLS = COLS[:2]
SHM_RATIOS = RATIOS[:1]
COLL_ORDER = ("all_reduce", "reduce_scatter", "all_gather", "broadcast")
TITLES = {"all_reduce": "all-reduce float32 sum", "reduce_scatter": "reduce-scatter float32 sum",
          "all_gather": "all-gather float32", "broadcast": "broadcast float32, root 0"}
# Shared-memory targets: tutti's busbw >= Open MPI's at every size (below 64 KiB
# judged on the time ratio, as the tables show it), and for these collectives
# >= THREE_X_TIMES Open MPI's from THREE_X_FROM bytes.
THREE_X_COLLS = ("all_reduce", "reduce_scatter")
THREE_X_FROM = 32 << 20
THREE_X_TIMES = 3.0
TIME_RATIO_BELOW = 64 * 1024


def human(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:.4g} {unit}"
        n /= 1024
    return f"{n:g} TiB"


def busbw_factor(n):
    """nccl-tests all-reduce bus bandwidth factor: busbw = S / t * 2(n-1)/n."""
    return 2 * (n - 1) / n


def ratio(x, y, b):
    """tutti against the other, >1 when tutti is better: time ratio below
    64 KiB, busbw ratio from there; (value, is_time) or None without data."""
    if not x or not y:
        return None
    if b < TIME_RATIO_BELOW:
        return y[0] / x[0], True
    return (x[1] / y[1] if y[1] else float("inf")), False


def target_for(coll, b):
    """The ratio tutti/Open MPI on shared memory must reach at size b."""
    return THREE_X_TIMES if coll in THREE_X_COLLS and b >= THREE_X_FROM else 1.0


def target_text(coll):
    text = "busbw >= ompi at every size"
    if coll in THREE_X_COLLS:
        text += f", >= {THREE_X_TIMES:g}x from {human(THREE_X_FROM)}"
    return text


def fmt_ratio(r):
    if r is None:
        return f"{'-':>14}"
    v, is_time = r
    return f"{v:13.2f}t" if is_time else f"{v:14.2f}"


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


def print_table(coll, n, med, sizes):
    """One table; med: (impl, transport, np, bytes) -> (time, busbw, reps) of
    this collective. Returns [(bytes, ratio or None, required)] of the
    shared-memory target, one per size."""
    def get(impl, tr, b):
        return med.get((impl, tr, n, b))

    cols, ratios = (COLS, RATIOS) if coll == "all_reduce" else (SHM_COLS, SHM_RATIOS)
    reps = max(v[2] for k, v in med.items() if k[2] == n)
    print(f"# {TITLES.get(coll, coll)}, {n} ranks; medians of {reps} repetitions; "
          f"time in us, busbw in GB/s")
    head = f"{'size':>10}"
    for impl, tr in cols:
        head += f" | {impl + '/' + tr:>21}"
    names = {("openmpi", "shm"): "tutti/ompi shm", ("openmpi", "tcp"): "tutti/ompi tcp",
             ("gloo", "tcp"): "tutti/gloo tcp"}
    head += "".join(f" | {names[c]}" for _, c in ratios) + f" | {'shm target':>12}"
    print(head)
    print(f"{'':>10}" + "".join(f" | {'time':>9} {'busbw':>11}" for _ in cols) +
          " | (busbw ratio, or time ratio below 64 KiB: >1 means tutti is better)"
          f" | ({target_text(coll)})")
    met, checks = 0, []
    for b in sizes:
        line = f"{human(b):>10}"
        for impl, tr in cols:
            m = get(impl, tr, b)
            line += f" | {m[0]:9.2f} {m[1]:11.3f}" if m else f" | {'-':>9} {'-':>11}"
        for (a, ta), (c, tc) in ratios:
            line += f" | {fmt_ratio(ratio(get(a, ta, b), get(c, tc, b), b))}"
        r = ratio(get("tutti", "shm", b), get("openmpi", "shm", b), b)
        need = target_for(coll, b)
        checks.append((b, r, need))
        if r:
            ok = r[0] >= need
            met += ok
            line += f" | {('met' if ok else 'NOT met') + (f' ({need:g}x)' if need != 1 else ''):>12}"
        else:
            line += f" | {'-':>12}"
        print(line)
    total = sum(1 for _, r, _ in checks if r)
    print(f"# {TITLES.get(coll, coll)}, {n} ranks, shm target ({target_text(coll)}): " +
          (f"met at {met} of {total} sizes" if total else "no size measured by both"))
    print()
    return checks


def print_targets(results):
    """results: [(coll, n, checks)] from print_table."""
    print("# targets (shared memory, tutti against Open MPI): sizes where one is NOT met")
    for coll, n, checks in results:
        miss = [f"{human(b)} ({r[0]:.2f}{'t' if r[1] else ''} < {need:g})"
                for b, r, need in checks if r and r[0] < need]
        absent = [human(b) for b, r, _ in checks if not r]
        text = ", ".join(miss) if miss else "all met"
        if absent:
            text += f"; not measured by both: {', '.join(absent)}"
        print(f"{coll + ',':<16} {n} ranks: {text}")
    print()


def print_baseline(coll, n, med, sizes):
    """tutti against tutti-base (measured in the same run), per transport:
    after/before time, and the ratio to each other library after and before
    (>1 better, as in print_table), with the median of each column over the
    sizes measured by both."""
    others = {"shm": ("openmpi",), "tcp": ("openmpi", "gloo")}
    for tr in ("shm", "tcp"):
        rows = [b for b in sizes if (("tutti", tr, n, b) in med and
                                     ("tutti-base", tr, n, b) in med)]
        if not rows:
            continue
        libs = [o for o in others[tr] if any((o, tr, n, b) in med for b in rows)]
        print(f"# {TITLES.get(coll, coll)}, {n} ranks, {tr}: this tree (tutti) against the "
              f"baseline (tutti-base), side by side in one run; time in us")
        head = f"{'size':>10} | {'tutti':>9} | {'base':>9} | {'time after/before':>17}"
        for o in libs:
            head += f" | {'vs ' + o + ' after':>17} | {'before':>8} | {'after/before':>12}"
        print(head)
        cols = defaultdict(list)
        for b in rows:
            x, y = med[("tutti", tr, n, b)], med[("tutti-base", tr, n, b)]
            t = x[0] / y[0]
            cols["time"].append(t)
            line = f"{human(b):>10} | {x[0]:9.2f} | {y[0]:9.2f} | {t:17.3f}"
            for o in libs:
                ra = ratio(x, med.get((o, tr, n, b)), b)
                rb = ratio(y, med.get((o, tr, n, b)), b)
                if ra and rb:
                    cols[o].append(ra[0] / rb[0])
                    line += f" | {fmt_ratio(ra):>17} | {fmt_ratio(rb).strip():>8} | " \
                            f"{ra[0] / rb[0]:12.3f}"
                else:
                    line += f" | {'-':>17} | {'-':>8} | {'-':>12}"
            print(line)
        summary = f"time after/before {statistics.median(cols['time']):.3f}"
        for o in libs:
            if cols[o]:
                summary += f"; ratio to {o} after/before {statistics.median(cols[o]):.3f}"
        print(f"# median over {len(rows)} sizes: {summary} (time < 1 and ratios > 1: "
              f"this tree is faster)")
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


def plot(png, med, nps, sizes_by_np, limits, coll="all_reduce"):
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
        for impl, tr in (COLS if coll == "all_reduce" else SHM_COLS):
            xs = [b for b in sizes if (impl, tr, n, b) in med]
            if xs:
                ys = [max(med[(impl, tr, n, b)][1], 1e-4) for b in xs]
                ax.plot(xs, ys, marker="o", label=f"{impl} ({tr})")
        if coll == "all_reduce" and n == 2 and "memcpy" in limits:
            lim = shm_limit_busbw(n, max(sizes), limits["memcpy"][0])[0]
            ax.axhline(lim, ls="--", color="gray", label="shm limit (memcpy model)")
        if coll == "all_reduce" and n == 2 and "tcp_bidir_per_dir" in limits:
            ax.axhline(tcp_limit_busbw(n, limits["tcp_bidir_per_dir"][0]), ls=":",
                       color="black", label="tcp limit (both directions, per direction)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel("bus bandwidth (GB/s)")
        ax.set_title(f"{TITLES.get(coll, coll)}, {n} local ranks")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    print(f"# plot: {png}")


def main(path, png, limits_path=None):
    samples = defaultdict(list)  # (coll, impl, transport, np, bytes) -> [(time, busbw)]
    for row in csv.DictReader(open(path)):
        key = (row.get("coll") or "all_reduce", row["impl"], row["transport"], int(row["np"]),
               int(row["bytes"]))
        samples[key].append((float(row["time_us"]), float(row["busbw_gbs"])))
    by_coll = defaultdict(dict)  # coll -> (impl, transport, np, bytes) -> (time, busbw, reps)
    for (coll, *k), v in samples.items():
        by_coll[coll][tuple(k)] = (statistics.median(t for t, _ in v),
                                   statistics.median(b for _, b in v), len(v))
    colls = [c for c in COLL_ORDER if c in by_coll] + sorted(set(by_coll) - set(COLL_ORDER))
    results, plots = [], []
    for coll in colls:
        med = by_coll[coll]
        nps = sorted({k[2] for k in med})
        sizes_by_np = {n: sorted({k[3] for k in med if k[2] == n}) for n in nps}
        for n in nps:
            results.append((coll, n, print_table(coll, n, med, sizes_by_np[n])))
        for n in nps:
            print_baseline(coll, n, med, sizes_by_np[n])
        plots.append((coll, med, nps, sizes_by_np))
    limits = read_limits(limits_path)
    med = by_coll.get("all_reduce", {})
    if limits:
        print_limits(limits, med, {n: sorted({k[3] for k in med if k[2] == n})
                                   for n in sorted({k[2] for k in med})})
    print_targets(results)
    for coll, med, nps, sizes_by_np in plots:
        out = png if coll == "all_reduce" else os.path.join(os.path.dirname(png),
                                                              f"{coll}_busbw.png")
        plot(out, med, nps, sizes_by_np, limits, coll)


if __name__ == "__main__":
    main(*sys.argv[1:4])
