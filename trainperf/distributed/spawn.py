"""Gloo processes on this machine, for tests and benchmarks: :func:`spawn` runs ``fn(rank, world, *args)`` in
``world`` processes of one process group (``OMP_NUM_THREADS=1``) and returns rank 0's result;
:func:`run_processes` starts and waits for processes the way an interrupt needs (none is left behind);
:func:`free_port` is a port for the group's rendezvous. What they run is the caller's: the Trainer's tiny
runs are :mod:`trainperf.bench.harness`.
"""

from __future__ import annotations

import os
import socket
import traceback

import torch


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank: int, world: int, port: int, fn, args, result_path: str, timeout_s: float) -> None:
    import datetime
    import pickle

    import torch.distributed as dist

    from trainperf import interrupt
    from trainperf.distributed.init import destroy_distributed

    interrupt.worker_signals()  # Ctrl-C is the parent's (spawn() stops the ranks); SIGTERM ends a rank at once

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world), OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=timeout_s))
    ok = False
    try:
        result = fn(rank, world, *args)
        if rank == 0:
            with open(result_path, "wb") as f:
                pickle.dump(result, f)
        ok = True
    except Exception:
        traceback.print_exc()
        raise
    finally:
        result = None  # what the case built goes before the groups it holds (destroy_distributed)
        destroy_distributed(barrier=ok)


def spawn(fn, world: int, *args, timeout_s: float = 60.0):
    """Run ``fn(rank, world, *args)`` in ``world`` gloo processes; returns rank 0's (picklable) result."""
    import pickle
    import tempfile

    os.environ["OMP_NUM_THREADS"] = "1"
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "result.pkl")
        run_processes(_entry, (world, free_port(), fn, args, path, timeout_s), world)
        with open(path, "rb") as f:
            return pickle.load(f)


def run_processes(fn, args: tuple, nprocs: int) -> None:
    """``torch.multiprocessing.start_processes(fn, args, nprocs, start_method="spawn")`` and wait for them,
    the way an interrupt needs (trainperf/interrupt.py): they start with Ctrl-C left to this process
    (``fn`` calls ``interrupt.worker_signals()`` first); when this process is interrupted, or one of them
    fails, the others are stopped (SIGTERM, then SIGKILL) before the exception goes on; none is left."""
    import torch.multiprocessing as mp

    from trainperf import interrupt

    with interrupt.starting():
        ctx = mp.start_processes(fn, args=args, nprocs=nprocs, join=False, start_method="spawn")
    try:
        while not ctx.join():
            pass
    except BaseException as exc:
        codes = [p.exitcode for p in ctx.processes]  # which rank ended first, and how
        stop_processes(ctx.processes)
        if hasattr(exc, "add_note") and not isinstance(exc, KeyboardInterrupt):  # Python 3.11+
            exc.add_note(f"exit codes by rank: {codes} (None: still running; -15: stopped after another rank "
                         "failed; other -N: killed by signal N); a rank's own error, if it raised one, is printed above")
        raise


def stop_processes(procs, timeout_s: float = 5.0) -> None:
    """SIGTERM to each live process, a wait of ``timeout_s`` in all, then SIGKILL to those still there."""
    import time

    for p in procs:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + timeout_s
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join(1)
