"""Shared by the bench/pytorch scripts: start N copies of a script torchrun
style (MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE/LOCAL_RANK, one torch thread
each), kill them all at a deadline, and return whether all succeeded.

The scripts run with /usr/bin/python3 (Debian's torch); PYTHONPATH must reach
tutti_torch (<build>/python, or an installed copy); see run.sh."""
import os
import socket
import subprocess
import sys
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(script, nprocs, args, extra_env=None, deadline=600.0, quiet=False, live=False):
    """quiet: print the processes' output only on failure; live: rank 0 writes
    to this process's stdout as it runs (the others' output comes at the end)."""
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               WORLD_SIZE=str(nprocs), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env.update(extra_env or {})
    procs = []
    t0 = time.time()
    for r in range(nprocs):
        e = dict(env, RANK=str(r), LOCAL_RANK=str(r))
        pipe = None if (live and r == 0) else subprocess.PIPE
        procs.append(subprocess.Popen([sys.executable, script] + list(args), env=e,
                                      stdout=pipe, stderr=subprocess.STDOUT if pipe else None, text=True))
    outs, ok = [], True
    for r, p in enumerate(procs):
        try:
            out, _ = p.communicate(timeout=max(1.0, deadline - (time.time() - t0)))
        except subprocess.TimeoutExpired:
            for q in procs:
                if q.poll() is None:
                    q.kill()
            out, _ = p.communicate()
            out = (out or "") + "\n[launch] rank %d killed after the %.0f s deadline\n" % (r, deadline)
        outs.append(out or "")
        ok = ok and p.returncode == 0
    for r, out in enumerate(outs):
        if not ok or not quiet:
            for line in out.splitlines():
                print("[rank %d] %s" % (r, line))
    return ok
