#!/usr/bin/python3
"""Evidence that DDP's bucket all-reduces over tutti overlap the backward pass.

Runs DDP with 2 processes (backend "tutti", one torch thread each) on a small
CNN whose gradients fall into several buckets (small bucket_cap_mb, and the
first-bucket cap lowered to match), with TUTTI_TORCH_TRACE set so that the
process group logs every work item (enqueue, start and end on the worker
thread, CLOCK_MONOTONIC ns). Each process records, per step, the forward
start, the backward start (loss.backward() called), the time each parameter's
gradient was produced (tensor hooks; the last one is the end of the backward
computation) and the time loss.backward() returned (DDP waits there for the
last buckets). Then it prints, per bucket, the all-reduce's enqueue/start/end
relative to the end of backward and the fraction of its time that fell inside
the backward pass, and plots the timeline.

usage: overlap_timeline.py [--steps N] [--skip K] [--bucket-kb KB] [--out DIR] [--deadline S]
                           [--no-plot] [--check]
--check: exit 1 unless, on every rank, at least one bucket all-reduce started
before the backward computation ended in some measured step, and every
measured step had at least 4 buckets (ordering properties, no time limits).
Needs PYTHONPATH to reach tutti_torch (see run.sh). Steps 0-1 are skipped by
default: DDP runs step 0 with one bucket and rebuilds its buckets after it.
"""
import argparse
import glob
import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def args_parser():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--skip", type=int, default=2, help="steps left out of the statistics")
    ap.add_argument("--bucket-kb", type=float, default=64.0)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--nprocs", type=int, default=2)
    ap.add_argument("--out", default="overlap_out", help="directory for traces, JSON and the PNG")
    ap.add_argument("--no-plot", action="store_true")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--deadline", type=float, default=300.0, help="kill the processes after S seconds")
    return ap


# ---- one DDP process ------------------------------------------------------------

def worker(a):
    import time

    import torch
    import torch.distributed as dist
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    import tutti_torch  # noqa: F401  (registers "tutti")

    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    os.makedirs(a.out, exist_ok=True)
    dist.init_process_group("tutti", init_method="env://")

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(3, 32, 3, padding=1)
            self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
            self.conv3 = nn.Conv2d(64, 128, 3, stride=2, padding=1)
            self.conv4 = nn.Conv2d(128, 128, 3, stride=2, padding=1)
            self.fc1 = nn.Linear(128 * 2 * 2, 128)
            self.fc2 = nn.Linear(128, 128)
            self.fc3 = nn.Linear(128, 10)

        def forward(self, x):
            x = F.relu(self.conv1(x))
            x = F.relu(self.conv2(x))
            x = F.relu(self.conv3(x))
            x = F.relu(self.conv4(x))
            x = F.adaptive_avg_pool2d(x, 2)
            x = F.relu(self.fc1(x.flatten(1)))
            x = F.relu(self.fc2(x))
            return self.fc3(x)

    torch.manual_seed(0)
    model = Net()
    cap = int(a.bucket_kb * 1024)
    # DDP (1.13) caps the first bucket at 1 MB separately; a small model needs
    # it lowered too to get several buckets (a documented DDP knob).
    dist._DEFAULT_FIRST_BUCKET_BYTES = cap
    ddp = DDP(model, bucket_cap_mb=cap / (1024 * 1024))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)

    grad_ns = []
    for p in model.parameters():
        p.register_hook(lambda g: grad_ns.append(time.monotonic_ns()))

    gen = torch.Generator().manual_seed(1000 + rank)
    data = [(torch.randn(a.batch, 3, 32, 32, generator=gen),
             torch.randint(0, 10, (a.batch,), generator=gen)) for _ in range(a.steps)]
    steps = []
    for i, (x, y) in enumerate(data):
        grad_ns.clear()
        t_fwd = time.monotonic_ns()
        opt.zero_grad()
        loss = F.cross_entropy(ddp(x), y)
        t_bwd = time.monotonic_ns()
        loss.backward()
        t_ret = time.monotonic_ns()
        opt.step()
        t_end = time.monotonic_ns()
        steps.append(dict(step=i, fwd_start=t_fwd, bwd_start=t_bwd, bwd_end=max(grad_ns),
                          first_grad=min(grad_ns), bwd_return=t_ret, step_end=t_end,
                          loss=loss.item(), grads=len(grad_ns)))
    with open(os.path.join(a.out, "steps.%d.json" % rank), "w") as f:
        json.dump(steps, f)
    nparams = sum(p.numel() for p in model.parameters())
    print("rank %d: %d parameters (%.2f MB), %d steps, final loss %.4f"
          % (rank, nparams, nparams * 4 / 2**20, len(steps), steps[-1]["loss"]))
    dist.destroy_process_group()


# ---- analysis (the launching process; no torch needed) ----------------------------

def load(out, rank):
    with open(os.path.join(out, "steps.%d.json" % rank)) as f:
        steps = json.load(f)
    with open(os.path.join(out, "trace.%d.jsonl" % rank)) as f:
        trace = [json.loads(line) for line in f if line.strip()]
    # DDP's gradient all-reduces: the default group (the first tutti group of
    # the process); anything else (DDP's broadcasts) is left out.
    ars = [t for t in trace if t["group"] == 0 and t["op"] == "allreduce"]
    for s in steps:
        s["buckets"] = [t for t in ars if s["fwd_start"] <= t["enqueue_ns"] <= s["step_end"]]
    return steps


def overlap(a0, a1, b0, b1):
    return max(0, min(a1, b1) - max(a0, b0))


def analyse(a, nprocs):
    ms = lambda ns: ns / 1e6  # noqa: E731
    ranks = [load(a.out, r) for r in range(nprocs)]
    ok = True
    summary = {}
    for r, steps in enumerate(ranks):
        meas = steps[a.skip:]
        nb = [len(s["buckets"]) for s in meas]
        print("\nrank %d: %d measured steps (steps %d-%d), buckets per step: %s"
              % (r, len(meas), a.skip, len(steps) - 1, sorted(set(nb))))
        print("times in ms relative to the end of the backward computation (last gradient "
              "produced); medians over the measured steps")
        print("%6s %10s %9s %9s %9s %9s %12s" % ("bucket", "bytes", "enqueue", "start", "end",
                                                 "duration", "in backward"))
        B = min(nb) if nb else 0
        tot_dur = tot_in = 0
        for b in range(B):
            rows = []
            for s in meas:
                t = s["buckets"][b]
                dur = t["end_ns"] - t["start_ns"]
                inb = overlap(t["start_ns"], t["end_ns"], s["bwd_start"], s["bwd_end"])
                tot_dur += dur
                tot_in += inb
                rows.append((ms(t["enqueue_ns"] - s["bwd_end"]), ms(t["start_ns"] - s["bwd_end"]),
                             ms(t["end_ns"] - s["bwd_end"]), ms(dur), inb / dur if dur else 0.0,
                             t["bytes"]))
            med = [statistics.median(c) for c in zip(*rows)]
            print("%6d %10d %+9.2f %+9.2f %+9.2f %9.2f %11.0f%%"
                  % (b, rows[0][5], med[0], med[1], med[2], med[3], 100 * med[4]))
        started = [sum(t["start_ns"] < s["bwd_end"] for t in s["buckets"]) for s in meas]
        ended = [sum(t["end_ns"] <= s["bwd_end"] for t in s["buckets"]) for s in meas]
        frac = tot_in / tot_dur if tot_dur else 0.0
        bwd = statistics.median(ms(s["bwd_end"] - s["bwd_start"]) for s in meas)
        tail = statistics.median(ms(s["bwd_return"] - s["bwd_end"]) for s in meas)
        step = statistics.median(ms(s["step_end"] - s["fwd_start"]) for s in meas)
        print("buckets started before the backward computation ended, per step: %s" % started)
        print("buckets finished before it ended, per step: %s" % ended)
        print("fraction of all-reduce time (start to end on the worker) inside the backward "
              "pass: %.0f%%" % (100 * frac))
        print("median backward computation %.1f ms; loss.backward() returned %.1f ms after it "
              "(waiting for the last buckets); step %.1f ms" % (bwd, tail, step))
        summary[r] = dict(frac=frac, started=started, buckets=nb)
        if a.check:
            if not meas or min(nb) < 4:
                print("CHECK FAILED (rank %d): fewer than 4 buckets in a step: %s" % (r, nb))
                ok = False
            if not any(started):
                print("CHECK FAILED (rank %d): no bucket all-reduce started before the backward "
                      "computation ended in any measured step" % r)
                ok = False
            for s in meas:
                for t in s["buckets"]:
                    if not (t["enqueue_ns"] <= t["start_ns"] <= t["end_ns"]) or not t["ok"]:
                        print("CHECK FAILED (rank %d): bad trace record %s" % (r, t))
                        ok = False
    if a.check:
        print("\ncheck: %s" % ("passed: bucket all-reduces started while backward was still "
                              "running" if ok else "FAILED"))
    if not a.no_plot:
        plot(a, ranks)
    return ok


def plot(a, ranks):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is missing (apt install python3-matplotlib): no PNG")
        return
    show = list(range(max(a.skip, len(ranks[0]) - 3), len(ranks[0])))  # the last 3 steps
    t0 = min(steps[show[0]]["fwd_start"] for steps in ranks)
    ms = lambda ns: (ns - t0) / 1e6  # noqa: E731
    nb = max(len(s["buckets"]) for steps in ranks for s in steps)
    fig, axes = plt.subplots(len(ranks), 1, figsize=(12, 1.2 + 0.45 * (nb + 2) * len(ranks)),
                             sharex=True, squeeze=False)
    for r, steps in enumerate(ranks):
        ax = axes[r][0]
        for i in show:
            s = steps[i]
            ax.broken_barh([(ms(s["fwd_start"]), ms(s["bwd_start"]) - ms(s["fwd_start"]))],
                           (nb + 0.6, 0.8), color="tab:green", label="forward" if i == show[0] else None)
            ax.broken_barh([(ms(s["bwd_start"]), ms(s["bwd_end"]) - ms(s["bwd_start"]))],
                           (nb + 0.6, 0.8), color="tab:blue", label="backward" if i == show[0] else None)
            ax.broken_barh([(ms(s["bwd_end"]), ms(s["bwd_return"]) - ms(s["bwd_end"]))],
                           (nb + 0.6, 0.8), color="tab:gray",
                           label="backward() waits for buckets" if i == show[0] else None)
            ax.broken_barh([(ms(s["bwd_return"]), ms(s["step_end"]) - ms(s["bwd_return"]))],
                           (nb + 0.6, 0.8), color="tab:olive", label="optimizer" if i == show[0] else None)
            ax.axvline(ms(s["bwd_end"]), color="tab:blue", lw=0.8, ls="--")
            for b, t in enumerate(s["buckets"]):
                y = nb - 1 - b
                ax.plot([ms(t["enqueue_ns"]), ms(t["start_ns"])], [y + 0.4] * 2, color="tab:orange", lw=1)
                ax.broken_barh([(ms(t["start_ns"]), ms(t["end_ns"]) - ms(t["start_ns"]))], (y + 0.1, 0.6),
                               color="tab:red", label="bucket all-reduce" if i == show[0] and b == 0 else None)
        ax.set_yticks([nb - 1 - b + 0.4 for b in range(nb)] + [nb + 1.0])
        ax.set_yticklabels(["bucket %d" % b for b in range(nb)] + ["rank %d" % r])
        ax.set_title("rank %d" % r, fontsize=9, loc="left")
        if r == 0:
            ax.legend(loc="upper right", fontsize=7, ncol=5)
    axes[-1][0].set_xlabel("ms (CLOCK_MONOTONIC); dashed: end of backward computation; "
                           "orange line: queued, red: all-reduce running on the worker")
    fig.suptitle("DDP over tutti, %d processes: bucket all-reduces vs backward (steps %d-%d)"
                 % (len(ranks), show[0], show[-1]))
    fig.tight_layout()
    path = os.path.join(a.out, "overlap_timeline.png")
    fig.savefig(path, dpi=110)
    print("wrote %s" % path)


def main():
    a = args_parser().parse_args()
    if "RANK" in os.environ:
        worker(a)
        return 0
    sys.path.insert(0, HERE)
    sys.dont_write_bytecode = True  # no __pycache__ in the source tree
    from ddp_launch import spawn
    os.makedirs(a.out, exist_ok=True)
    for f in glob.glob(os.path.join(a.out, "trace.*.jsonl")) + glob.glob(os.path.join(a.out, "steps.*.json")):
        os.remove(f)  # the trace appends
    ok = spawn(os.path.abspath(__file__), a.nprocs, sys.argv[1:],
               {"TUTTI_TORCH_TRACE": os.path.join(os.path.abspath(a.out), "trace")},
               deadline=a.deadline, quiet=True)
    if not ok:
        print("a DDP process failed")
        return 1
    return 0 if analyse(a, a.nprocs) else 1


if __name__ == "__main__":
    sys.exit(main())
