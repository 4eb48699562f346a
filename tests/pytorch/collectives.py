"""Every supported torch.distributed call through tutti, checked against exact
expected values (integer-valued data, so every dtype sums exactly in any
order) and against Gloo in the same processes where Gloo implements the call."""
import gc
import time

import torch
import torch.distributed as dist
from torch.distributed import ReduceOp

from common import RANK, WORLD, Checker, init, log

gloo = init()
C = Checker()
t0 = time.time()

FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
INTS = [torch.int8, torch.uint8, torch.int32, torch.int64]
SIZES = [0, 1, 7, 1001, 65537]
# Relative error of ncclAvg (each contribution scaled by 1/n, then summed):
# a few roundings in the element type.
AVG_RTOL = {torch.float16: 4e-3, torch.bfloat16: 3e-2, torch.float32: 1e-6, torch.float64: 1e-14}


def data(r, n, dtype):
    """Rank r's input: small positive integers (1 .. 5 + WORLD)."""
    return ((torch.arange(n) % 5) + r + 1).to(dtype)


def pdata(r, n, dtype):
    """Rank r's input for PRODUCT: 1s and 2s (products stay <= 16)."""
    return (1 + (torch.arange(n) + r) % 2).to(dtype)


def expected(op, n, dtype):
    if op == ReduceOp.PRODUCT:
        return torch.stack([pdata(r, n, torch.int64) for r in range(WORLD)]).prod(0).to(dtype)
    allr = torch.stack([data(r, n, torch.int64) for r in range(WORLD)])
    if op == ReduceOp.SUM:
        return allr.sum(0).to(dtype)
    if op == ReduceOp.MIN:
        return allr.min(0).values.to(dtype)
    if op == ReduceOp.MAX:
        return allr.max(0).values.to(dtype)
    if op == ReduceOp.AVG:
        if dtype.is_floating_point:
            return (allr.double().sum(0) / WORLD).to(dtype)
        return torch.div(allr.sum(0), WORLD, rounding_mode="trunc").to(dtype)


def inp(op, n, dtype):
    return (pdata if op == ReduceOp.PRODUCT else data)(RANK, n, dtype)


# ---- all_reduce: every op x dtype x size ----
gloo_cmp = 0
for dtype in FLOATS + INTS:
    for op in [ReduceOp.SUM, ReduceOp.PRODUCT, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.AVG]:
        for n in SIZES:
            t = inp(op, n, dtype)
            dist.all_reduce(t, op=op)
            want = expected(op, n, dtype)
            what = "all_reduce %s %s n=%d" % (op, dtype, n)
            if op == ReduceOp.AVG and dtype.is_floating_point:
                C.close(t, want, AVG_RTOL[dtype], 0, what)
            else:
                C.eq(t, want, what)
            if op != ReduceOp.AVG and n in (7, 1001):
                g = inp(op, n, dtype)
                try:
                    dist.all_reduce(g, op=op, group=gloo)
                except RuntimeError:
                    continue  # Gloo lacks this dtype/op
                C.eq(t, g, what + " vs gloo")
                gloo_cmp += 1
log("all_reduce: exact for %d dtypes x 5 ops x %d sizes; %d Gloo comparisons"
    % (len(FLOATS + INTS), len(SIZES), gloo_cmp))

# bool: SUM is logical or, PRODUCT logical and.
b = torch.tensor([RANK == 0, True, False, RANK % 2 == 1])
t = b.clone(); dist.all_reduce(t)
C.eq(t, torch.tensor([True, True, False, WORLD > 1]), "all_reduce bool SUM")
t = b.clone(); dist.all_reduce(t, op=ReduceOp.PRODUCT)
C.eq(t, torch.tensor([WORLD == 1, True, False, False]), "all_reduce bool PRODUCT")

# Random float32 data against Gloo: bit-identical for 1-2 ranks (a + b is
# commutative), otherwise sums of up to 4 terms in another order: |err| is a
# few ulp of the largest partial sum (|x| < 6), so atol 1e-5.
g = torch.Generator().manual_seed(1234 + RANK)
x = torch.randn(100003, generator=g)
a, b2 = x.clone(), x.clone()
dist.all_reduce(a)
dist.all_reduce(b2, group=gloo)
if WORLD <= 2:
    C.eq(a, b2, "all_reduce random fp32 vs gloo (bit-identical)")
else:
    C.close(a, b2, 1e-6, 1e-5, "all_reduce random fp32 vs gloo")

# Non-contiguous input: a transposed view, written back in place.
base = data(RANK, 33 * 31, torch.float32).reshape(33, 31)
v = base.t()
assert not v.is_contiguous()
dist.all_reduce(v)
C.eq(base, expected(ReduceOp.SUM, 33 * 31, torch.float32).reshape(33, 31), "all_reduce non-contiguous")

# Complex SUM (as pairs of reals).
z = torch.complex(data(RANK, 9, torch.float32), -data(RANK, 9, torch.float32))
dist.all_reduce(z)
e = expected(ReduceOp.SUM, 9, torch.float32)
C.eq(z, torch.complex(e, -e), "all_reduce complex64")

# PREMUL_SUM (factor applied before the sum).
if hasattr(dist, "_make_nccl_premul_sum"):
    t = data(RANK, 10, torch.float64)
    dist.all_reduce(t, op=dist._make_nccl_premul_sum(0.5))
    C.close(t, expected(ReduceOp.SUM, 10, torch.float64) * 0.5, 1e-15, 0, "all_reduce PREMUL_SUM")

# ---- async: several in flight, completed in order ----
works, ts = [], []
for i in range(6):
    t = data(RANK, 1000 + i, torch.int64) * (i + 1)
    ts.append(t)
    works.append(dist.all_reduce(t, async_op=True))
for i, w in enumerate(works):
    if i % 2:
        w.wait()
    else:
        w.get_future().wait()
    assert w.is_completed()
    C.eq(ts[i], expected(ReduceOp.SUM, 1000 + i, torch.int64) * (i + 1), "async all_reduce %d" % i)

# ---- broadcast (any dtype moves as bytes) ----
for root in range(WORLD):
    for dtype in FLOATS + INTS + [torch.int16, torch.bool, torch.complex64]:
        for n in (0, 5, 4099):
            t = data(RANK, n, torch.int64).to(dtype) if dtype != torch.complex64 else \
                torch.complex(data(RANK, n, torch.float32), data(RANK, n, torch.float32))
            want = data(root, n, torch.int64).to(dtype) if dtype != torch.complex64 else \
                torch.complex(data(root, n, torch.float32), data(root, n, torch.float32))
            dist.broadcast(t, src=root)
            C.eq(t, want, "broadcast root=%d %s n=%d" % (root, dtype, n))
    base = data(RANK, 40, torch.float32)
    v = base[::2]  # non-contiguous
    dist.broadcast(v, src=root)
    C.eq(base[::2], data(root, 40, torch.float32)[::2], "broadcast non-contiguous")
    C.eq(base[1::2], data(RANK, 40, torch.float32)[1::2], "broadcast leaves the rest")
    g = data(RANK, 77, torch.float32)
    dist.broadcast(g, src=root, group=gloo)
    t = data(RANK, 77, torch.float32)
    dist.broadcast(t, src=root)
    C.eq(t, g, "broadcast vs gloo")

# ---- reduce ----
for root in sorted({0, WORLD - 1}):
    for dtype in [torch.float32, torch.int32, torch.bfloat16]:
        for op in [ReduceOp.SUM, ReduceOp.MAX]:
            t = data(RANK, 1001, dtype)
            dist.reduce(t, dst=root, op=op)
            if RANK == root:
                C.eq(t, expected(op, 1001, dtype), "reduce root=%d %s %s" % (root, dtype, op))
            else:
                C.eq(t, data(RANK, 1001, dtype), "reduce leaves non-root input unchanged")

# ---- all_gather (list and into-tensor) ----
for dtype in [torch.float32, torch.int8, torch.float16, torch.int16]:
    for shape in [(3, 5), (0,), (1,), (1001,)]:
        x = data(RANK, 15 if shape == (3, 5) else shape[0], dtype).reshape(shape)
        outs = [torch.full(shape, -1).to(dtype) for _ in range(WORLD)]
        dist.all_gather(outs, x)
        for r in range(WORLD):
            C.eq(outs[r], data(r, x.numel(), dtype).reshape(shape), "all_gather %s %s from %d" % (dtype, shape, r))
        if dtype == torch.float32 and x.numel():  # Gloo 1.13 dies (SIGFPE) on empty all_gather
            gouts = [torch.empty(shape, dtype=dtype) for _ in range(WORLD)]
            dist.all_gather(gouts, x, group=gloo)
            for r in range(WORLD):
                C.eq(outs[r], gouts[r], "all_gather vs gloo")
        out = torch.empty((WORLD * shape[0],) + shape[1:], dtype=dtype)
        dist.all_gather_into_tensor(out, x)
        C.eq(out, torch.cat([data(r, x.numel(), dtype).reshape(shape) for r in range(WORLD)]),
             "all_gather_into_tensor %s %s" % (dtype, shape))
# non-contiguous outputs
outs = [torch.zeros(6, 4).t() for _ in range(WORLD)]
dist.all_gather(outs, data(RANK, 24, torch.float32).reshape(4, 6))
for r in range(WORLD):
    C.eq(outs[r], data(r, 24, torch.float32).reshape(4, 6), "all_gather into non-contiguous")

# ---- reduce_scatter (list and tensor) ----
for dtype in [torch.float32, torch.int64, torch.float16]:
    for n in (0, 1, 7, 1001):
        ins = [data(RANK, n, dtype) + 10 * i for i in range(WORLD)]
        out = torch.empty(n, dtype=dtype)
        dist.reduce_scatter(out, ins)
        want = (expected(ReduceOp.SUM, n, torch.int64) + 10 * RANK * WORLD).to(dtype)
        C.eq(out, want, "reduce_scatter %s n=%d" % (dtype, n))
        out2 = torch.empty(n, dtype=dtype)
        dist.reduce_scatter_tensor(out2, torch.cat(ins))
        C.eq(out2, want, "reduce_scatter_tensor %s n=%d" % (dtype, n))
out = torch.empty(5, dtype=torch.int32)
dist.reduce_scatter(out, [data(RANK, 5, torch.int32) for _ in range(WORLD)], op=ReduceOp.MAX)
C.eq(out, expected(ReduceOp.MAX, 5, torch.int32), "reduce_scatter MAX")

# ---- all_to_all ----
k = 3
x = torch.arange(WORLD * k, dtype=torch.int64) + 100 * RANK
y = torch.empty_like(x)
dist.all_to_all_single(y, x)
want = torch.cat([torch.arange(RANK * k, RANK * k + k) + 100 * p for p in range(WORLD)])
C.eq(y, want, "all_to_all_single equal splits")
gy = torch.empty_like(x)
dist.all_to_all_single(gy, x, group=gloo)
C.eq(y, gy, "all_to_all_single vs gloo")


def rows(src, dst):
    """Unequal splits: rows src sends dst (0 .. 2)."""
    return (src + 2 * dst) % 3


def block(src, dst):
    n = rows(src, dst)
    return (1000 * src + 100 * dst + torch.arange(n * 2)).reshape(n, 2).double()


ins = [rows(RANK, p) for p in range(WORLD)]
outs_ = [rows(p, RANK) for p in range(WORLD)]
x = torch.cat([block(RANK, p) for p in range(WORLD)])
y = torch.full((sum(outs_), 2), -1.0, dtype=torch.float64)
dist.all_to_all_single(y, x, output_split_sizes=outs_, input_split_sizes=ins)
C.eq(y, torch.cat([block(p, RANK) for p in range(WORLD)]), "all_to_all_single unequal splits")
gy = torch.full_like(y, -1.0)
dist.all_to_all_single(gy, x, output_split_sizes=outs_, input_split_sizes=ins, group=gloo)
C.eq(y, gy, "all_to_all_single unequal vs gloo")

ins_l = [block(RANK, p).float() for p in range(WORLD)]
outs_l = [torch.empty(rows(p, RANK), 2) for p in range(WORLD)]
dist.all_to_all(outs_l, ins_l)
for p in range(WORLD):
    C.eq(outs_l[p], block(p, RANK).float(), "all_to_all list from %d" % p)

# ---- gather / scatter ----
for root in sorted({0, WORLD - 1}):
    x = data(RANK, 11, torch.int32)
    gl = [torch.empty(11, dtype=torch.int32) for _ in range(WORLD)] if RANK == root else None
    dist.gather(x, gather_list=gl, dst=root)
    if RANK == root:
        for r in range(WORLD):
            C.eq(gl[r], data(r, 11, torch.int32), "gather root=%d from %d" % (root, r))
    sl = [data(r, 11, torch.float32) * 3 for r in range(WORLD)] if RANK == root else None
    out = torch.empty(11)
    dist.scatter(out, scatter_list=sl, src=root)
    C.eq(out, data(RANK, 11, torch.float32) * 3, "scatter root=%d" % root)
    gout = torch.empty(11)
    dist.scatter(gout, scatter_list=sl, src=root, group=gloo)
    C.eq(out, gout, "scatter vs gloo")

# ---- send / recv ----
# Exchanges and rings must be one group (batch_isend_irecv), as with NCCL:
# a lone send may wait for its receiver.
if WORLD > 1:
    nxt, prv = (RANK + 1) % WORLD, (RANK - 1) % WORLD
    for n in (0, 1, 5000, 1 << 20):
        s = data(RANK, n, torch.float32)
        r2 = torch.empty(n)
        reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, s, nxt), dist.P2POp(dist.irecv, r2, prv)])
        for w in reqs:
            w.wait()
        C.eq(r2, data(prv, n, torch.float32), "batch_isend_irecv ring n=%d" % n)
    # one direction, rank 0 -> 1: blocking and async, several messages in order
    if RANK in (0, 1):
        for i, n in enumerate((10, 0, 70000)):
            if RANK == 0:
                w = dist.isend(torch.full((n,), i, dtype=torch.int64), 1, tag=i)
                if i == 1:
                    w.wait()
                else:
                    dist.send(torch.full((n,), -i, dtype=torch.int64), 1)
                    w.wait()
            else:
                r = torch.empty(n, dtype=torch.int64)
                dist.recv(r, 0, tag=i)
                C.eq(r, torch.full((n,), i, dtype=torch.int64), "send/recv order %d" % i)
                if i != 1:
                    r = torch.empty(n, dtype=torch.int64)
                    dist.irecv(r, 0).wait()
                    C.eq(r, torch.full((n,), -i, dtype=torch.int64), "send/irecv order %d" % i)
        # recv into a non-contiguous view
        if RANK == 0:
            dist.send(torch.arange(6.0), 1)
        else:
            m = torch.zeros(3, 4)
            dist.recv(m[:, 1:3].t(), 0)
            C.eq(m[:, 1:3].t().reshape(-1), torch.arange(6.0), "recv into non-contiguous")

# ---- recv without a source rank (any source) ----
# Every rank but 0 sends rank 0 two messages; rank 0 takes them with recv
# (which returns the sender) and irecv (work._source_rank()), tutti into a
# non-contiguous view every other pair of calls: each sender's two, in order, values
# checked; then the same through Gloo, which must see the same messages.
if WORLD > 1:
    def any_source(group):
        got = []
        if RANK != 0:
            for m in range(2):
                dist.send(torch.arange(1000, dtype=torch.int64) + RANK * 10000 + m * 1000, 0,
                          group=group)
        else:
            for i in range(2 * (WORLD - 1)):
                if i % 4 < 2 or group is not None:  # (Gloo takes only contiguous tensors)
                    t = torch.full((1000,), -1, dtype=torch.int64)
                else:
                    t = torch.full((1000, 2), -1, dtype=torch.int64)[:, 1]  # a strided view
                if i % 2 == 0:
                    src = dist.recv(t, group=group)
                else:
                    w = dist.irecv(t, group=group)
                    w.wait()
                    src = w._source_rank()
                m = sum(1 for s, _ in got if s == src)
                C.eq(t, torch.arange(1000, dtype=torch.int64) + src * 10000 + m * 1000,
                     "recv from any source: message %d of rank %d" % (m, src))
                got.append((src, m))
            C.true(sorted(got) == [(s, m) for s in range(1, WORLD) for m in range(2)],
                   "recv from any source: every rank's two messages once (got %s)" % got)
        return sorted(got)
    C.true(any_source(None) == any_source(gloo), "recv from any source: the same messages as Gloo")

# ---- all_gather_coalesced: several inputs of different shapes and dtypes ----
# (PyTorch wants the inputs of one call to share a dtype.)
for dtype, shapes in ((torch.float32, [(3,), (2, 5), (0,)]), (torch.int64, [(1001,)]),
                      (torch.bfloat16, [(7, 3), (65537,), (4,)])):
    ins = [data(RANK, int(torch.Size(sh).numel()), dtype).reshape(sh) + i
           for i, sh in enumerate(shapes)]
    outs = [[torch.empty_like(x) for x in ins] for _ in range(WORLD)]
    dist.all_gather_coalesced(outs, ins)
    gouts = None
    if dtype != torch.bfloat16:  # Gloo's all_gather_coalesced has no bfloat16
        gouts = [[torch.empty_like(x) for x in ins] for _ in range(WORLD)]
        dist.all_gather_coalesced(gouts, ins, group=gloo)
    for r in range(WORLD):
        for i, sh in enumerate(shapes):
            want = data(r, int(torch.Size(sh).numel()), dtype).reshape(sh) + i
            C.eq(outs[r][i], want, "all_gather_coalesced rank %d input %d %s" % (r, i, sh))
            if gouts is not None:
                C.eq(outs[r][i], gouts[r][i], "all_gather_coalesced vs gloo")
# async, and a non-contiguous input
x = torch.arange(12.0).reshape(3, 4).t() + RANK
outs = [[torch.empty(4, 3)] for _ in range(WORLD)]
dist.all_gather_coalesced(outs, [x], async_op=True).wait()
for r in range(WORLD):
    C.eq(outs[r][0], torch.arange(12.0).reshape(3, 4).t() + r, "all_gather_coalesced non-contiguous")

# ---- sparse all_reduce (COO): Gloo's semantics, compared with Gloo ----
def sparse_input(case, dtype, r):
    """Rank r's sparse tensor: overlapping and own indices, integer values."""
    if case == "vector":  # 1 sparse dim
        idx = torch.tensor([[0, 3, 7, 3 + r, 20 + 2 * r]])
        val = torch.arange(1, 6, dtype=dtype) * (r + 1)
        return torch.sparse_coo_tensor(idx, val, (40,))
    if case == "rows":  # embedding-style gradient: rows of a [50, 4] matrix
        rows = torch.tensor([[1, 5, r, 49 - r, 5]])  # row 5 twice: uncoalesced
        val = torch.arange(20, dtype=dtype).reshape(5, 4) + r
        return torch.sparse_coo_tensor(rows, val, (50, 4))
    if case == "empty_on_odd":  # nnz = 0 on odd ranks
        n = 0 if r % 2 else 3
        idx = torch.tensor([[2, 4, 6][:n], [1, 1, 0][:n]], dtype=torch.long).reshape(2, n)
        return torch.sparse_coo_tensor(idx, torch.ones(n, dtype=dtype), (8, 2))
    raise ValueError(case)


for case in ("vector", "rows", "empty_on_odd"):
    for dtype in (torch.float32, torch.float64):
        t = sparse_input(case, dtype, RANK)
        dist.all_reduce(t)
        g = sparse_input(case, dtype, RANK)
        dist.all_reduce(g, group=gloo)
        want = sum(sparse_input(case, dtype, q).to_dense() for q in range(WORLD))
        assert t.is_sparse and t.is_coalesced(), case
        C.eq(t.to_dense(), want, "sparse all_reduce %s %s" % (case, dtype))
        g = g.coalesce()
        C.eq(t._indices(), g._indices(), "sparse all_reduce indices vs gloo %s" % case)
        C.eq(t._values(), g._values(), "sparse all_reduce values vs gloo %s" % case)
# mismatched shapes fail on every rank, and the group goes on
try:
    dist.all_reduce(torch.sparse_coo_tensor(torch.tensor([[0]]), torch.ones(1), (10 + RANK,)))
    if WORLD > 1:
        raise AssertionError("sparse shape mismatch: no exception")
except RuntimeError as e:
    assert "other sizes" in str(e), str(e)

dist.barrier()

# ---- rejected inputs: clear errors before anything is queued ----
def expect_error(fn, words, what):
    try:
        fn()
    except RuntimeError as e:
        msg = str(e)
        assert all(w in msg for w in words), "%s: message %r lacks %r" % (what, msg, words)
        return
    raise AssertionError("%s: no exception" % what)


expect_error(lambda: dist.all_reduce(torch.ones(4, dtype=torch.int16)), ["int16", "cannot be reduced"], "int16 reduce")
expect_error(lambda: dist.all_reduce(torch.ones(4, dtype=torch.int32), op=ReduceOp.BAND), ["not supported"], "BAND")
expect_error(lambda: dist.all_reduce(torch.ones(3).to_sparse(), op=ReduceOp.MAX), ["only SUM"], "sparse MAX")
expect_error(lambda: dist.broadcast(torch.ones(3), src=WORLD + 3), ["root rank"], "bad root")
expect_error(lambda: dist.all_gather_coalesced([[torch.ones(3)] for _ in range(WORLD)], [torch.ones(4)]),
             ["allgather_coalesced", "elements"], "all_gather_coalesced shape")
expect_error(lambda: dist.all_gather_coalesced([[torch.ones(3)]] * (WORLD + 1), [torch.ones(3)]),
             ["allgather_coalesced", "output lists"], "all_gather_coalesced lists")
dist.barrier()
log("collectives: %d checks passed on rank %d of %d in %.1f s" % (C.n, RANK, WORLD, time.time() - t0))
# The Gloo groups end while Python is alive (their worker threads may free
# tensors; after the interpreter finalized that aborts: issue 30, ddp.py).
dist.destroy_process_group()
del gloo
gc.collect()
