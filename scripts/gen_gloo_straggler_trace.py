"""Write tests/data/traces/gloo_straggler_cpu/: a real 2-rank gloo job's torch.profiler traces (CPU).

Each step, rank 1 sleeps 40 ms inside ``record_function("compute")``; then both ranks all-reduce 100,000
floats. So rank 1 is the straggler by construction and rank 0 waits ~40 ms per step in ``gloo:all_reduce``.

    python scripts/gen_gloo_straggler_trace.py OUT_DIR    # then gzip -9 each file as rankN.pt.trace.json.gz
"""

from __future__ import annotations

import os
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.profiler import ProfilerActivity, profile, record_function, schedule


def worker(rank: int, out: str) -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29523")
    dist.init_process_group("gloo", rank=rank, world_size=2)
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=4),
                 on_trace_ready=lambda p: p.export_chrome_trace(f"{out}/rank{rank}.pt.trace.json")) as prof:
        for _ in range(6):
            with record_function("compute"):
                if rank == 1:
                    time.sleep(0.04)  # the straggler
                x = torch.randn(256, 256)
                x @ x
            dist.all_reduce(torch.ones(100000))
            prof.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    os.makedirs(sys.argv[1], exist_ok=True)
    mp.spawn(worker, args=(sys.argv[1],), nprocs=2)
