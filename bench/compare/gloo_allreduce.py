"""torch.distributed Gloo all-reduce benchmark, the Gloo side of bench/compare.

float32 sum, out-of-place semantics as DDP uses it (all_reduce on a tensor),
sizes min..max bytes by factor, warm-up, then iterations for about `seconds`,
time = max over ranks of the mean per call. Prints CSV lines:
    impl,transport,coll,np,bytes,time_us,busbw_gbs (coll: all_reduce)
Run with Debian's interpreter: /usr/bin/python3 gloo_allreduce.py NP MIN MAX FACTOR SECONDS PORT
"""
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def worker(rank, np_, minb, maxb, factor, seconds, port):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=np_)
    nbytes = max(minb, 4)
    while nbytes <= maxb:
        count = nbytes // 4
        base = torch.tensor([(rank + i) % 7 for i in range(min(count, 7))], dtype=torch.float32)
        data = base.repeat((count + 6) // 7)[:count].clone()
        for _ in range(3):
            t = data.clone()
            dist.all_reduce(t)
        t = data.clone()
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(t)
        one = time.perf_counter() - t0
        iters = torch.tensor([max(5, min(100000, int(seconds / max(one, 1e-7))))])
        dist.broadcast(iters, 0)
        iters = int(iters.item())
        bufs = [data.clone() for _ in range(2)]
        dist.barrier()
        t0 = time.perf_counter()
        for k in range(iters):
            dist.all_reduce(bufs[k % 2])  # values grow; only timing matters here
        mean = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64)
        dist.all_reduce(mean, op=dist.ReduceOp.MAX)
        check = data.clone()
        dist.all_reduce(check)
        want = sum(torch.tensor([(r + i) % 7 for i in range(min(count, 7))],
                                dtype=torch.float32).repeat((count + 6) // 7)[:count]
                   for r in range(np_))
        if not torch.equal(check, want):
            raise SystemExit(f"gloo_allreduce: wrong result at {nbytes} bytes")
        if rank == 0:
            worst = mean.item()
            busbw = nbytes / worst * 2.0 * (np_ - 1) / np_ / 1e9
            print(f"gloo,tcp,all_reduce,{np_},{nbytes},{worst * 1e6:.3f},{busbw:.4f}", flush=True)
        nbytes *= factor
    dist.destroy_process_group()


if __name__ == "__main__":
    np_, minb, maxb, factor = (int(x) for x in sys.argv[1:5])
    seconds = float(sys.argv[5])
    port = int(sys.argv[6])
    mp.spawn(worker, args=(np_, minb, maxb, factor, seconds, port), nprocs=np_, join=True)
