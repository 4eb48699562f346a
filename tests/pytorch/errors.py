"""Error paths: a timeout and a mismatched call each raise a RuntimeError with
tutti's message within seconds (never a hang), on a separate tutti group so
the default group stays usable; then a clean shutdown."""
import gc
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from common import RANK, WORLD, init, log

assert WORLD == 2
gloo = init()

# 1. Timeout: rank 0 all-reduces on a group with a 2 s timeout, rank 1 never
# joins. The watchdog aborts the communicator; wait() raises.
g1 = dist.new_group(backend="tutti", timeout=timedelta(seconds=2))
if RANK == 0:
    t0 = time.time()
    w = dist.all_reduce(torch.ones(1000), group=g1, async_op=True)
    try:
        w.wait()
        raise AssertionError("timeout: no exception")
    except RuntimeError as e:
        dt = time.time() - t0
        assert "Timed out" in str(e) and "waiting for rank 1" in str(e), str(e)
        assert dt < 10, dt
        log("timeout raised after %.2f s: %s" % (dt, str(e).splitlines()[0]))
    # later calls on the aborted group fail at once, with the same reason
    t0 = time.time()
    try:
        dist.all_reduce(torch.ones(3), group=g1)
        raise AssertionError("aborted group accepted a call")
    except RuntimeError as e:
        assert "Timed out" in str(e) and time.time() - t0 < 2, str(e)
dist.barrier(group=gloo)

# 2. Explicit wait(timeout) shorter than the group's.
g2 = dist.new_group(backend="tutti")
if RANK == 1:
    w = dist.broadcast(torch.ones(10), src=0, group=g2, async_op=True)
    t0 = time.time()
    try:
        w.wait(timeout=timedelta(milliseconds=500))
        raise AssertionError("wait(timeout): no exception")
    except RuntimeError as e:
        assert "Timed out" in str(e) and "waiting for rank 0" in str(e), str(e)
        assert time.time() - t0 < 5
        log("wait(timeout) raised: %s" % str(e).splitlines()[0])
dist.barrier(group=gloo)

# 3. Mismatched call: the ranks disagree on the count; tutti reports it.
g3 = dist.new_group(backend="tutti", timeout=timedelta(seconds=20))
t0 = time.time()
try:
    dist.all_reduce(torch.ones(10 if RANK == 0 else 20), group=g3)
    raise AssertionError("mismatch: no exception")
except RuntimeError as e:
    log("mismatch raised after %.2f s: %s" % (time.time() - t0, str(e).splitlines()[0]))
    assert "tutti" in str(e) and "mismatch" in str(e), str(e)
dist.barrier(group=gloo)

# 4. The default group still works after all that.
t = torch.full((5,), RANK + 1.0)
dist.all_reduce(t)
assert torch.equal(t, torch.full((5,), 3.0)), t
for g in (g1, g2, g3):
    dist.destroy_process_group(g)
# The Gloo groups end while Python is alive (their worker threads may free
# tensors; after the interpreter finalized that aborts: issue 30, ddp.py).
dist.destroy_process_group()
del gloo
gc.collect()
log("errors: passed on rank %d" % RANK)
