"""Shared by the tutti_torch tests: one process of a launch.py run."""
import faulthandler
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

import tutti_torch  # noqa: F401  (registers the "tutti" backend)

torch.set_num_threads(1)
faulthandler.enable()  # a crash prints the Python stack

RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])


def init(timeout_s=60):
    """Default group: tutti over env://; returns a Gloo group on the same ranks."""
    dist.init_process_group("tutti", init_method="env://", timeout=timedelta(seconds=timeout_s))
    assert dist.get_backend() == "tutti", dist.get_backend()
    assert dist.get_rank() == RANK and dist.get_world_size() == WORLD
    return dist.new_group(backend="gloo")


class Checker:
    def __init__(self):
        self.n = 0

    def eq(self, got, want, what):
        """Bit-exact equality (values and dtype)."""
        self.n += 1
        if got.dtype != want.dtype or got.shape != want.shape or not torch.equal(got, want):
            raise AssertionError("%s: got %s %s\n%s\nwant %s %s\n%s" % (
                what, got.dtype, tuple(got.shape), got, want.dtype, tuple(want.shape), want))

    def true(self, cond, what):
        self.n += 1
        if not cond:
            raise AssertionError(what)

    def close(self, got, want, rtol, atol, what):
        self.n += 1
        if got.dtype != want.dtype or got.shape != want.shape or \
                not torch.allclose(got.double(), want.double(), rtol=rtol, atol=atol):
            diff = (got.double() - want.double()).abs().max().item() if got.numel() else 0
            raise AssertionError("%s: max abs diff %g exceeds rtol %g atol %g" % (what, diff, rtol, atol))


def log(*a):
    print(*a, flush=True)
    sys.stdout.flush()
