"""DDP communication hooks running tutti's compressed all-reduce.

    import tutti_torch.hooks as hooks
    state = hooks.TuttiHookState(process_group, "powersgd", warmup_steps=10)
    ddp_model.register_comm_hook(state, hooks.compressed_allreduce_hook)

kind: "fp16", "bf16" (scaled half-precision on the wire), "onebit" (signs plus
a scale per 512 values, error feedback), "powersgd" (rank-r factors, error
feedback), or "none" (exact, through the compressor, for comparisons).
PowerSGD's matrices (powersgd_shapes): "param" (default) compresses each
parameter's gradient of two or more dimensions as a (shape[0] x rest) matrix
and all-reduces the others (biases, norms, matrices too small to gain) exactly
in one call per bucket, as torch's own PowerSGD hook does; "square" zero-pads
the whole bucket to one square matrix. The first `warmup_steps` iterations
run the exact all-reduce, as the PowerSGD and 1-bit papers advise. Codec state
(residuals, PowerSGD's Q) lives in one tutti compressor per hook state, keyed
by bucket index and size, so rebuilt buckets start fresh. Gradients must be
float32 (other buckets run exact). Semantics and wire ratios: docs/compression.md.
"""
import itertools
import math

import torch
import torch.distributed as dist

from . import _backend_of

KINDS = {"none": 0, "fp16": 1, "bf16": 2, "onebit": 3, "powersgd": 4}
_ids = itertools.count(1)


class TuttiHookState:
    def __init__(self, process_group=None, kind="fp16", warmup_steps=10, powersgd_rank=4,
                 error_feedback=None, seed=0, powersgd_shapes="param"):
        if kind not in KINDS:
            raise ValueError("kind must be one of %s, not %r" % (sorted(KINDS), kind))
        if powersgd_shapes not in ("param", "square"):
            raise ValueError("powersgd_shapes must be 'param' or 'square', not %r" % (powersgd_shapes,))
        self.powersgd_shapes = powersgd_shapes
        self.group = process_group
        self.pg = _backend_of(process_group)
        if self.pg is None:
            raise ValueError("tutti_torch.hooks need a process group of the 'tutti' backend")
        self.kind = kind
        self.warmup_steps = int(warmup_steps)
        self.powersgd_rank = int(powersgd_rank)
        self.error_feedback = -1 if error_feedback is None else int(bool(error_feedback))
        self.seed = int(seed)
        # Every rank creates its states in the same order, so ids agree.
        self.config_id = next(_ids)
        self.iteration = 0
        self.world_size = dist.get_world_size(process_group)

    def stats(self):
        """This rank's compressor counters: calls, payload_bytes, wire_bytes_sent, exact_calls."""
        return self.pg._compression_stats(self.config_id)


def _exact(state, buf):
    fut = dist.all_reduce(buf, group=state.group, async_op=True).get_future()

    def done(f):
        return f.value()[0].div_(state.world_size)
    return fut.then(done)


def compressed_allreduce_hook(state, bucket):
    buf = bucket.buffer()
    warm = state.iteration < state.warmup_steps
    if bucket.is_last():
        state.iteration += 1
    if warm or buf.dtype != torch.float32 or not buf.is_contiguous():
        return _exact(state, buf)
    if state.kind == "powersgd" and state.powersgd_shapes == "param":
        return _powersgd_per_param(state, bucket, buf)
    n = buf.numel()
    key = (bucket.index() << 34) | n
    rows, cols, work = 1, n, buf
    if state.kind == "powersgd":
        side = max(1, math.isqrt(n - 1) + 1) if n > 1 else 1
        rows = cols = side
        work = torch.zeros(side * side, dtype=buf.dtype)
        work[:n].copy_(buf)
    fut = state.pg._allreduce_compressed(work, state.config_id, KINDS[state.kind], state.powersgd_rank,
                                         state.error_feedback, state.seed, key, rows, cols, True).get_future()

    def done(f):
        f.value()
        if work is not buf:
            buf.copy_(work[:n])
        return buf
    return fut.then(done)


# tutti's PowerSGD runs exact below this rate (minCompressionRate's default) or
# when a side is not longer than the rank; such gradients are batched instead.
_MIN_RATE = 2.0


def _powersgd_per_param(state, bucket, buf):
    r = state.powersgd_rank
    futs, exact = [], []
    # gradients(): views of the bucket buffer, in its layout, with the
    # parameters' shapes (results written through them land in buf)
    for i, g in enumerate(bucket.gradients()):
        n = g.numel()
        rows = g.shape[0] if g.dim() >= 2 else 1
        cols = n // rows if rows else 0
        if g.dim() < 2 or min(rows, cols) <= r or rows * cols < _MIN_RATE * (rows + cols) * r \
                or not g.is_contiguous():
            exact.append(g)
            continue
        # a key per (bucket, parameter, shape): tuples of ints hash alike in every process
        key = hash((bucket.index(), i, rows, cols)) & ((1 << 63) - 1)
        futs.append(state.pg._allreduce_compressed(g, state.config_id, KINDS["powersgd"], r,
                                                   state.error_feedback, state.seed, key, rows, cols,
                                                   True).get_future())
    flat = None
    if exact:
        flat = torch.cat([g.reshape(-1) for g in exact])
        futs.append(dist.all_reduce(flat, group=state.group, async_op=True).get_future())

    def done(f):
        for x in f.value():
            x.value()  # raises the first error
        if flat is not None:
            flat.div_(state.world_size)
            off = 0
            for g in exact:
                g.copy_(flat[off:off + g.numel()].view_as(g))
                off += g.numel()
        return buf
    return torch.futures.collect_all(futs).then(done)
