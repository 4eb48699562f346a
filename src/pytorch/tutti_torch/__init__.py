"""tutti as a torch.distributed backend.

    import tutti_torch            # registers the backend "tutti"
    torch.distributed.init_process_group("tutti", ...)

Every collective runs on one worker thread per process group, in call order,
on tutti's communicator; calls return a Work at once (see docs/pytorch.md).
"""
import inspect
from datetime import timedelta

import torch
import torch.distributed as dist

from . import _C
from ._C import ProcessGroupTutti

__all__ = [
    "ProcessGroupTutti",
    "BACKEND",
    "tutti_version",
    "library_path",
    "is_tutti_group",
    "monitored_barrier",
]

BACKEND = "tutti"
tutti_version = _C.tutti_version
library_path = _C.library_path


def _create(store, rank, world_size, timeout):
    if not isinstance(timeout, timedelta):
        timeout = timedelta(seconds=float(timeout))
    return _C.create_process_group(store, rank, world_size, timeout)


def _register():
    if BACKEND.upper() in getattr(dist.Backend, "_plugins", {}):
        return
    kwargs = {}
    params = inspect.signature(dist.Backend.register_backend).parameters
    if "devices" in params:  # PyTorch >= 2.1: the backend serves CPU tensors
        kwargs["devices"] = ["cpu"]
    dist.Backend.register_backend(BACKEND, _create, **kwargs)


def _backend_of(group=None):
    """The ProcessGroupTutti behind `group` (the default group if None), or None."""
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    if isinstance(pg, ProcessGroupTutti):
        return pg
    get = getattr(pg, "_get_backend", None)  # PyTorch 2.x wraps backends
    if get is not None:
        try:
            b = get(torch.device("cpu"))
            if isinstance(b, ProcessGroupTutti):
                return b
        except RuntimeError:
            pass
    return None


def is_tutti_group(group=None):
    return _backend_of(group) is not None


def monitored_barrier(group=None, timeout=None, wait_all_ranks=False):
    """torch.distributed.monitored_barrier for a tutti group (PyTorch 1.13
    refuses it for every backend but Gloo), with Gloo's semantics and words:
    every rank but 0 checks in with rank 0, which waits for each until
    `timeout` (the group's own when None) and then raises "Rank R failed to
    pass monitoredBarrier in T ms" (with wait_all_ranks, every rank that did
    not arrive: "Ranks 1, 3 failed ..."); the ranks that arrived raise too,
    quoting rank 0. It goes through the group's store, not its communicator,
    so the group stays usable after a failure. docs/pytorch.md.
    """
    pg = _backend_of(group)
    if pg is None:
        raise ValueError(
            "tutti_torch.monitored_barrier: not a tutti group "
            "(torch.distributed.monitored_barrier serves Gloo groups)"
        )
    if timeout is None:
        timeout = timedelta(milliseconds=-1)  # the group's timeout
    elif not isinstance(timeout, timedelta):
        timeout = timedelta(seconds=float(timeout))
    pg.monitored_barrier(timeout, wait_all_ranks)


_register()
