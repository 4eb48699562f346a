"""PyTorch's own distributed test suite (torch.testing._internal.distributed.
distributed_test, the tests PyTorch's CI runs for Gloo), run with every Gloo
group replaced by a tutti group: dist.init_process_group and dist.new_group
(and the helpers of distributed_c10d that call them) get backend "tutti"
wherever they were asked for "gloo". The tests still believe they run on Gloo
(BACKEND=gloo), so they take Gloo's code paths and expectations. This file
is what PyTorch's test/distributed/test_distributed_spawn.py is, plus the
routing; the suite itself comes with torch (Debian's python3-torch 1.13).

usage (bench/pytorch/gloo_suite.sh runs it at world sizes 2 and 3, for both
backends, and counts):
  WORLD_SIZE=2 /usr/bin/python3 tests/pytorch/gloo_suite.py [unittest args, e.g. -k barrier]
  TUTTI_SUITE_BACKEND=gloo ...   # the same tests on Gloo itself, for comparison
"""
import os
import sys

os.environ.setdefault("BACKEND", "gloo")
os.environ.setdefault("WORLD_SIZE", "2")
ROUTE = os.environ.get("TUTTI_SUITE_BACKEND", "tutti") == "tutti"

try:
    import expecttest  # noqa: F401  (torch's test utilities need it)
except ImportError:  # not packaged by Debian 12: a stand-in (shim/expecttest.py)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "shim"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed.distributed_c10d as c10d  # noqa: E402

if ROUTE:
    import tutti_torch  # noqa: E402,F401  (registers "tutti")

    def _route(backend):
        if backend is None or str(backend).lower() == "gloo":
            return "tutti"
        return backend

    def _wrap(fn, pos):
        def routed(*args, **kwargs):
            if "backend" in kwargs:
                kwargs["backend"] = _route(kwargs["backend"])
            elif len(args) > pos:
                args = args[:pos] + (_route(args[pos]),) + args[pos + 1:]
            else:
                kwargs["backend"] = "tutti"
            return fn(*args, **kwargs)
        routed.__wrapped__ = fn
        return routed

    # init_process_group(backend, ...): backend first; new_group(ranks=None,
    # timeout=..., backend=None, ...): backend third.
    _init = _wrap(c10d.init_process_group, 0)
    _new = _wrap(c10d.new_group, 2)
    for mod in (dist, c10d):
        mod.init_process_group = _init
        mod.new_group = _new

from torch.testing._internal.common_utils import run_tests  # noqa: E402
from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest,
    TestDistBackend,
)

torch.backends.cuda.matmul.allow_tf32 = False


RESULTS = os.environ.get("TUTTI_SUITE_RESULTS")  # a file: one "test outcome" line each


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        self._spawn_processes()
        torch.backends.cudnn.flags(enabled=True, allow_tf32=False).__enter__()

    def run(self, result=None):
        # The outcome of each test, for bench/pytorch/gloo_suite.sh (unittest's
        # own lines are interleaved with the spawned processes' output).
        if result is None or not RESULTS:
            return super().run(result)
        seen = [len(getattr(result, k)) for k in ("failures", "errors", "skipped",
                                                   "unexpectedSuccesses")]
        ret = super().run(result)
        now = [len(getattr(result, k)) for k in ("failures", "errors", "skipped",
                                                  "unexpectedSuccesses")]
        if now[0] > seen[0] or now[1] > seen[1] or now[3] > seen[3]:
            outcome = "FAIL"
        elif now[2] > seen[2]:
            outcome = "skipped"
        else:
            outcome = "ok"
        with open(RESULTS, "a") as f:
            f.write("%s %s\n" % (self._testMethodName, outcome))
        return ret


if __name__ == "__main__":
    sys.exit(run_tests())
