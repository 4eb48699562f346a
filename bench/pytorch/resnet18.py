#!/usr/bin/python3
"""ResNet-18 (torchvision) under DDP, 2 processes: Gloo against tutti, exact
and with each tutti_torch.hooks compression hook (PowerSGD twice: one
matrix per weight, the default, and the whole bucket padded to a square).

All runs train in the same processes from the same initial weights on the
same synthetic, seeded data (10 classes, each a smooth random pattern of
amplitude --signal in unit Gaussian noise), one step of each run in turn, so that a
noisy machine slows every run alike. Prints the loss (mean over ranks) as a
table (step x run), the median step time of each run (forward + backward +
all-reduces + SGD, steps after --skip), the wire bytes of the hooks, and
writes resnet18.json and resnet18.png into --out.

usage: resnet18.py [--steps N] [--batch B] [--size S] [--runs gloo,tutti,fp16,...]
                   [--warmup W] [--powersgd-rank R] [--bucket-mb MB] [--out DIR]
Needs torchvision (apt install python3-torchvision) and tutti_torch on
PYTHONPATH; run.sh sets both up.
"""
import argparse
import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ALL_RUNS = ["gloo", "tutti", "fp16", "bf16", "onebit", "powersgd", "powersgd_square"]


def args_parser():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--batch", type=int, default=16, help="images per process and step")
    ap.add_argument("--size", type=int, default=32, help="image side (pixels)")
    ap.add_argument("--runs", default=",".join(ALL_RUNS),
                    help="comma-separated subset of %s" % ",".join(ALL_RUNS))
    ap.add_argument("--warmup", type=int, default=5, help="exact steps before a hook compresses")
    ap.add_argument("--powersgd-rank", type=int, default=4)
    ap.add_argument("--bucket-mb", type=float, default=25.0, help="DDP bucket_cap_mb")
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--signal", type=float, default=0.3, help="amplitude of the class pattern in the noise")
    ap.add_argument("--skip", type=int, default=3, help="steps left out of the step-time median")
    ap.add_argument("--nprocs", type=int, default=2)
    ap.add_argument("--out", default="resnet18_out")
    ap.add_argument("--no-plot", action="store_true")
    return ap


def worker(a):
    import copy
    import time

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    import torchvision
    from torch.nn.parallel import DistributedDataParallel as DDP

    import tutti_torch
    import tutti_torch.hooks as hooks

    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("tutti", init_method="env://")
    gloo = dist.new_group(backend="gloo")
    runs = a.runs.split(",")

    torch.manual_seed(0)
    base = torchvision.models.resnet18(num_classes=10)
    # class templates: smooth random patterns, the same on every rank
    tg = torch.Generator().manual_seed(7)
    templates = F.interpolate(torch.randn(10, 3, 4, 4, generator=tg), size=(a.size, a.size),
                              mode="bilinear", align_corners=False)
    gen = torch.Generator().manual_seed(1000 + rank)

    def batch():
        y = torch.randint(0, 10, (a.batch,), generator=gen)
        x = torch.randn(a.batch, 3, a.size, a.size, generator=gen) + a.signal * templates[y]
        return x, y

    data = [batch() for _ in range(a.steps)]
    models = {}
    for r in runs:
        group = gloo if r == "gloo" else dist.group.WORLD
        m = DDP(copy.deepcopy(base), process_group=group, bucket_cap_mb=a.bucket_mb)
        state = None
        if r not in ("gloo", "tutti"):
            kind, shapes = (r, "param") if r != "powersgd_square" else ("powersgd", "square")
            state = hooks.TuttiHookState(dist.group.WORLD, kind, warmup_steps=a.warmup,
                                         powersgd_rank=a.powersgd_rank, powersgd_shapes=shapes)
            m.register_comm_hook(state, hooks.compressed_allreduce_hook)
        opt = torch.optim.SGD(m.parameters(), lr=a.lr, momentum=0.9, weight_decay=5e-4)
        models[r] = (m, opt, state)

    losses = {r: [] for r in runs}
    times = {r: [] for r in runs}
    for i, (x, y) in enumerate(data):
        for r in runs:
            m, opt, _ = models[r]
            t0 = time.perf_counter()
            opt.zero_grad()
            loss = F.cross_entropy(m(x), y)
            loss.backward()
            opt.step()
            times[r].append(time.perf_counter() - t0)
            lt = loss.detach().reshape(1)
            dist.all_reduce(lt, group=gloo)  # outside the timed region
            losses[r].append(lt.item() / world)
        if rank == 0:
            print("step %d: %s" % (i, " ".join("%s %.4f" % (r, losses[r][-1]) for r in runs)), flush=True)

    stats = {r: models[r][2].stats() for r in runs if models[r][2] is not None}
    # step times: the slower rank's median (both wait for each other anyway)
    med = torch.tensor([statistics.median(times[r][a.skip:]) for r in runs], dtype=torch.float64)
    dist.all_reduce(med, op=dist.ReduceOp.MAX, group=gloo)
    if rank == 0:
        res = dict(runs=runs, losses=losses, median_step_s=dict(zip(runs, med.tolist())),
                   step_s_rank0=times, stats=stats, args=vars(a), world=world,
                   torch=torch.__version__, tutti=tutti_torch.tutti_version(),
                   params=sum(p.numel() for p in base.parameters()))
        with open(os.path.join(a.out, "resnet18.json"), "w") as f:
            json.dump(res, f, indent=1)
    dist.destroy_process_group()


def report(a):
    with open(os.path.join(a.out, "resnet18.json")) as f:
        res = json.load(f)
    runs, L = res["runs"], res["losses"]
    name = {"gloo": "gloo", "tutti": "tutti", "powersgd_square": "tutti+psgd-sq"}
    label = [name.get(r, "tutti+" + r) for r in runs]
    print("\nResNet-18 (%.1fM parameters), DDP, %d processes, batch %d x %dx%d per process, "
          "torch %s, tutti %s; hooks: %d exact warm-up steps%s"
          % (res["params"] / 1e6, res["world"], a.batch, a.size, a.size, res["torch"], res["tutti"],
             a.warmup, ", PowerSGD rank %d" % a.powersgd_rank if "powersgd" in runs else ""))
    print("\nloss (mean over ranks)")
    print("%5s " % "step" + " ".join("%12s" % l for l in label))
    for i in range(len(L[runs[0]])):
        print("%5d " % i + " ".join("%12.4f" % L[r][i] for r in runs))
    tail = lambda v: sum(v[-10:]) / len(v[-10:])  # noqa: E731  (one batch is noisy)
    print("%5s " % "last10" + " ".join("%12.4f" % tail(L[r]) for r in runs))
    ref = tail(L["gloo"]) if "gloo" in runs else None
    if ref:
        print("%5s " % "rel" + " ".join("%+12.2e" % ((tail(L[r]) - ref) / ref) for r in runs))
    if "gloo" in runs and "tutti" in runs:
        same = sum(x == y for x, y in zip(L["gloo"], L["tutti"]))
        print("\ntutti vs gloo (exact): %d of %d steps bit-identical losses, max |diff| %.3g"
              % (same, len(L["gloo"]), max(abs(x - y) for x, y in zip(L["gloo"], L["tutti"]))))
    print("\nmedian step time (steps %d-%d; slower rank)" % (a.skip, len(L[runs[0]]) - 1))
    g = res["median_step_s"].get("gloo")
    for r, l in zip(runs, label):
        t = res["median_step_s"][r]
        extra = ""
        if g:
            extra += "  %.2fx gloo" % (t / g)
        s = res["stats"].get(r)
        if s and s["payload_bytes"]:
            extra += "  wire/payload %.3f of the compressor's calls" % (s["wire_bytes_sent"] / s["payload_bytes"])
        print("%14s %9.1f ms%s" % (l, 1e3 * t, extra))
    if not a.no_plot:
        plot(a, res, label)


def plot(a, res, label):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is missing (apt install python3-matplotlib): no PNG")
        return
    runs, L = res["runs"], res["losses"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5), gridspec_kw={"width_ratios": [2, 1]})
    for r, l in zip(runs, label):  # gloo last, dashed, on top (tutti's exact curve is identical)
        if r != "gloo":
            ax1.plot(range(len(L[r])), L[r], label=l, lw=1.2)
    if "gloo" in runs:
        ax1.plot(range(len(L["gloo"])), L["gloo"], label="gloo", lw=1.0, ls="--", color="black")
    if a.warmup and any(r not in ("gloo", "tutti") for r in runs):
        ax1.axvline(a.warmup - 0.5, color="gray", lw=0.8, ls=":")
        ax1.text(a.warmup - 0.4, ax1.get_ylim()[1], " hooks compress", va="top", fontsize=8, color="gray")
    ax1.set_xlabel("step")
    ax1.set_ylabel("cross-entropy loss (mean over ranks)")
    ax1.legend(fontsize=8)
    ax1.set_title("loss", fontsize=10)
    ms = [1e3 * res["median_step_s"][r] for r in runs]
    ax2.barh(range(len(runs)), ms, color=["tab:gray" if r == "gloo" else "tab:red" for r in runs])
    ax2.set_yticks(range(len(runs)))
    ax2.set_yticklabels(label)
    ax2.invert_yaxis()
    ax2.set_xlabel("median step time (ms)")
    for i, v in enumerate(ms):
        ax2.text(v, i, " %.0f" % v, va="center", fontsize=8)
    ax2.set_title("step time", fontsize=10)
    fig.suptitle("ResNet-18, DDP, %d processes x 1 thread, batch %d of %dx%d, synthetic data"
                 % (res["world"], a.batch, a.size, a.size))
    fig.tight_layout()
    path = os.path.join(a.out, "resnet18.png")
    fig.savefig(path, dpi=110)
    print("wrote %s" % path)


def main():
    a = args_parser().parse_args()
    bad = [r for r in a.runs.split(",") if r not in ALL_RUNS]
    if bad:
        print("unknown runs %s (choose from %s)" % (bad, ALL_RUNS))
        return 2
    os.makedirs(a.out, exist_ok=True)
    if "RANK" in os.environ:
        worker(a)
        return 0
    sys.path.insert(0, HERE)
    sys.dont_write_bytecode = True  # no __pycache__ in the source tree
    from ddp_launch import spawn
    argv = [x for x in sys.argv[1:]]
    if "--out" not in argv:
        argv += ["--out", a.out]
    if not spawn(os.path.abspath(__file__), a.nprocs, argv, deadline=3600.0, quiet=True, live=True):
        print("a DDP process failed")
        return 1
    report(a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
