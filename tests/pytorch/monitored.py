"""tutti_torch.monitored_barrier (PyTorch 1.13 refuses dist.monitored_barrier
for every backend but Gloo) against Gloo's, in the same processes: all ranks
pass; the last rank skips one and rank 0 names it in Gloo's words, after the
timeout, while the ranks that came are told at once; with wait_all_ranks every
missing rank is named; a rank that skipped one call meets the next; the group
stays usable. Also the wording of timeouts ("Timed out", the rank waited for)."""
import gc
import re
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import tutti_torch
from common import RANK, WORLD, init, log

assert WORLD >= 2
gloo = init()
g = dist.new_group(backend="tutti")
late = WORLD - 1
T = timedelta(seconds=2)


def attempt(fn):
    """fn's error message, or None when it passed."""
    try:
        fn()
    except RuntimeError as e:
        return str(e)
    return None


def tutti_mb(**kw):
    return lambda: tutti_torch.monitored_barrier(g, **kw)


# 1. Everyone comes.
assert attempt(tutti_mb(timeout=timedelta(seconds=30))) is None
dist.monitored_barrier(gloo, timeout=timedelta(seconds=30))

# 2. The last rank skips a barrier. Each backend on a group of its own (a
# failed Gloo barrier leaves a receive pending on its group).
gm = dist.new_group(backend="gloo")
if RANK != late:
    t0 = time.time()
    msg = attempt(tutti_mb(timeout=T))
    dt = time.time() - t0
    gmsg = attempt(lambda: dist.monitored_barrier(gm, timeout=T))
    assert msg is not None, "tutti: a missing rank passed the barrier"
    if RANK == 0:
        want = "Rank %d failed to pass monitoredBarrier in 2000 ms" % late
        assert want in msg, msg
        assert gmsg is not None and ("Rank %d failed to pass monitoredBarrier" % late) in gmsg, gmsg
        assert 1.9 <= dt < 10, dt
    else:
        # Told by rank 0 as soon as it gave up (Gloo's ranks time out instead).
        assert "rank 0 says" in msg and "Rank %d failed" % late in msg, msg
        assert dt < 10, dt
    log("rank %d: tutti said %r after %.2f s; gloo said %r" % (RANK, msg, dt, (gmsg or "")[:160]))
dist.barrier(group=gloo)

# 3. wait_all_ranks: every rank but 0 skips; rank 0 names them all, as Gloo.
gm2 = dist.new_group(backend="gloo")
if RANK == 0:
    missing = ", ".join(str(r) for r in range(1, WORLD))
    word = "Ranks" if WORLD > 2 else "Rank"
    msg = attempt(tutti_mb(timeout=T, wait_all_ranks=True))
    gmsg = attempt(lambda: dist.monitored_barrier(gm2, timeout=T, wait_all_ranks=True))
    assert msg is not None and "%s %s failed to pass monitoredBarrier" % (word, missing) in msg, msg
    assert gmsg is not None and re.search(r"Ranks? %s failed to pass monitoredBarrier" % missing, gmsg), gmsg
    log("wait_all_ranks: tutti %r; gloo %r" % (msg, gmsg[:160]))
dist.barrier(group=gloo)

# 4. The skipped call is forgotten: the next barrier passes for everyone, and
# the group's communicator was never involved.
assert attempt(tutti_mb(timeout=timedelta(seconds=30))) is None
t = torch.full((100,), float(RANK + 1))
dist.all_reduce(t, group=g)
assert torch.equal(t, torch.full((100,), WORLD * (WORLD + 1) / 2.0)), t
try:
    tutti_torch.monitored_barrier(gloo)
    raise AssertionError("a Gloo group was accepted")
except ValueError as e:
    assert "not a tutti group" in str(e), str(e)

# 5. Timeouts say "Timed out" (PyTorch's tests match " (Timed out|closed|timeout) ")
# and name the rank waited for: rank 0 barriers alone on a group with a 2 s timeout.
gt = dist.new_group(backend="tutti", timeout=T)
if RANK == 0:
    t0 = time.time()
    msg = attempt(lambda: dist.barrier(group=gt))
    dt = time.time() - t0
    assert msg is not None and re.search(" (Timed out|closed|timeout) ", msg), msg
    assert re.search(r"waiting for ranks? [0-9]", msg), msg
    assert WORLD > 2 or "waiting for rank 1" in msg, msg
    assert dt >= 1.9, dt
    log("barrier timeout after %.2f s: %s" % (dt, msg))
dist.barrier(group=gloo)
for grp in (g, gm, gm2, gt):
    dist.destroy_process_group(grp)
# The Gloo groups end while Python is alive (their worker threads may free
# tensors; after the interpreter finalized that aborts: issue 30, ddp.py).
dist.destroy_process_group()
del gloo, gm, gm2
gc.collect()
log("monitored: passed on rank %d of %d" % (RANK, WORLD))
