#!/usr/bin/env python3
"""Runs a test script in N processes, torchrun style (MASTER_ADDR/MASTER_PORT/
RANK/WORLD_SIZE/LOCAL_RANK), and fails if any process fails or the whole run
passes its deadline (every process is then killed: a hang is a failure, never a
stuck ctest).

usage: launch.py --nprocs N [--deadline S] script.py [args...]
Exit status 77 (ctest: skipped) when torch or tutti_torch cannot be imported.
"""
import argparse
import os
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nprocs", type=int, required=True)
    ap.add_argument("--deadline", type=float, default=100.0)
    ap.add_argument("script")
    ap.add_argument("args", nargs=argparse.REMAINDER)
    a = ap.parse_args()

    probe = subprocess.run([sys.executable, "-c", "import torch, tutti_torch"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        print("SKIP: %s cannot import torch/tutti_torch:\n%s" % (sys.executable, probe.stderr))
        return 77

    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               WORLD_SIZE=str(a.nprocs), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    # A rare abort at exit (issue 30): the aborting thread's stack, if it recurs.
    env.setdefault("TUTTI_TORCH_TERMINATE_TRACE", "1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in [HERE, env.get("PYTHONPATH", "")] if p)
    script = a.script if os.path.isabs(a.script) else os.path.join(HERE, a.script)
    procs = []
    t0 = time.time()
    for r in range(a.nprocs):
        e = dict(env, RANK=str(r), LOCAL_RANK=str(r))
        procs.append(subprocess.Popen([sys.executable, script] + a.args, env=e,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = [None] * a.nprocs
    failed = False
    for r, p in enumerate(procs):
        left = max(1.0, a.deadline - (time.time() - t0))
        try:
            outs[r], _ = p.communicate(timeout=left)
        except subprocess.TimeoutExpired:
            failed = True
            for q in procs:
                if q.poll() is None:
                    q.kill()
            outs[r], _ = p.communicate()
            outs[r] += "\n[launch] rank %d killed after the %.0f s deadline\n" % (r, a.deadline)
    for r, p in enumerate(procs):
        if outs[r] is None:
            outs[r], _ = p.communicate()
        if p.returncode != 0:
            failed = True
        for line in (outs[r] or "").splitlines():
            print("[rank %d] %s" % (r, line))
        print("[rank %d] exit status %s" % (r, p.returncode))
    print("[launch] %s with %d process(es): %s in %.1f s" %
          (a.script, a.nprocs, "FAILED" if failed else "passed", time.time() - t0))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
