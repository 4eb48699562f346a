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

__all__ = ["ProcessGroupTutti", "BACKEND", "tutti_version", "library_path", "is_tutti_group"]

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


_register()
