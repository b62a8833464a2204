"""``trainperf bench balance``: the dynamic load balancer on a straggler, measured side by side.

N gloo processes (1 thread each; ``--pin``: each on its own CPU) train a small per-token MLP
with DDP on the same global batch. Rank ``--slow-rank`` does ``--slowdown`` x the work per
sample: it computes the MLP and the loss again on its micro-batch (``F - 1`` extra times, the
fractional part on part of the rows) and adds ``0 x`` that extra loss to the loss, so forward
*and* backward really compute it while the loss and gradients stay those of the plain model.
Not a sleep.

Phases: (1) warm-up; (2) the balancer runs (``--window``, ``--min-steps``, ``--threshold``)
until it has settled (it moved, then a judgement found no move gaining ``--min-gain``; then
``--min-steps`` more quiet steps) or ``--settle-steps`` have passed;
(3) measurement: blocks of ``--block`` steps alternate between equal shares (unbalanced) and the
balancer's shares (balanced), ``--steps`` steps each in all, so both see the same machine noise.
In the balanced blocks the balancer stays on, as in training (fed their measurements, it may
still move; its exchange counts in their step time).

Step time = wall time of a step on rank 0 (start to after the optimizer step, which follows the
gradient all-reduce), mean over the measured steps. Ideal = global batch / sum over ranks of
their speeds, a rank's speed being the samples it computed over phase 3 / the seconds its compute
clock (:class:`~trainperf.distributed.balance.ComputeClock`) counted for them (the ideal from the
medians of per-step compute / share is reported too: ``ideal_from_medians_step_s``). The ideal
leaves out communication, the optimizer and scheduling delays, so balanced / ideal also shows
those; ``overhead_s`` (median of step wall time - slowest rank's compute, balanced steps) is
reported next to it, and ``balanced_vs_ideal_plus_overhead`` compares with ideal + overhead.
``balanced_slowest_compute_s``: the slowest rank's compute per balanced step, averaged (above the
ideal by the residual imbalance and by per-step jitter: each step waits for whichever rank is
slow that step). ``--control`` runs it all again with every rank at the same speed and equal
shares: its step over its own ideal is the noise floor of the machine, what a job with nothing
to balance pays for jitter, the all-reduce and the optimizer.

Set-up that keeps the ranks' speeds their own: every rank pinned to its own CPU (``--no-pin``
turns it off), glibc's malloc thresholds raised so freed activations are reused instead
of being unmapped and faulted in again each step, cyclic garbage collection only between blocks.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

from trainperf.cli._common import add_json_flag, print_json
from trainperf.errors import UserError


def register(subparsers) -> None:
    p = subparsers.add_parser("balance", help="dynamic load balancer on a straggler rank", description=__doc__)
    p.add_argument("--ranks", type=int, default=2, help="gloo processes (data-parallel ranks)")
    p.add_argument("--slow-rank", type=int, default=1, help="the rank that does more work per sample")
    p.add_argument("--slowdown", type=float, default=2.0, help="work per sample on the slow rank, x the others' (>= 1)")
    p.add_argument("--steps", type=int, default=60, help="measured steps per arrangement (unbalanced, balanced)")
    p.add_argument("--block", type=int, default=5, help="steps per block when alternating the two arrangements")
    p.add_argument("--global-batch", type=int, default=64, help="samples per step over all ranks")
    p.add_argument("--micro-steps", type=int, default=2, help="micro-steps per rank per step (uneven sizes)")
    p.add_argument("--seq", type=int, default=256,
                   help="tokens per sample (the default makes a step ~0.2 s, like a real training step, so the "
                        "gradient all-reduce is a few percent of it)")
    p.add_argument("--dim", type=int, default=128, help="MLP width (the hidden layer is 4x)")
    p.add_argument("--window", type=int, default=60, help="balancer window (measurements kept)")
    p.add_argument("--min-steps", type=int, default=30, help="balancer measurements before a judgement")
    p.add_argument("--threshold", type=float, default=0.2, help="balancer trigger: CV of per-rank step compute time")
    p.add_argument("--min-gain", type=float, default=0.02,
                   help="balancer: smallest predicted cut of the step compute time worth a move")
    p.add_argument("--sync-every", type=int, default=10,
                   help="balancer: exchange the measurements (one all_gather) every this many steps")
    p.add_argument("--settle-steps", type=int, default=150, help="at most this many steps for the balancer to settle")
    p.add_argument("--control", action="store_true",
                   help="also measure the noise floor: the same run with equal speeds and equal shares")
    p.add_argument("--timeout-s", type=float, default=300.0,
                   help="collective timeout: a rank that stops answering ends the bench with an error after this long")
    p.add_argument("--pin", action=argparse.BooleanOptionalAction, default=True,
                   help="pin each rank to its own CPU when there are at least --ranks usable CPUs (default; each "
                        "rank's speed is then its own and steadier)")
    add_json_flag(p)
    p.set_defaults(func=balance_command)


def _check(args) -> None:
    if args.ranks < 2:
        raise UserError(f"--ranks {args.ranks}: a balancer needs at least 2 ranks")
    if not 0 <= args.slow_rank < args.ranks:
        raise UserError(f"--slow-rank {args.slow_rank} is not a rank of 0..{args.ranks - 1}")
    if args.slowdown < 1:
        raise UserError(f"--slowdown {args.slowdown} must be >= 1 (the work per sample relative to the others)")
    if args.global_batch < args.ranks * args.micro_steps:
        raise UserError(f"--global-batch {args.global_batch} must be >= ranks x micro-steps = {args.ranks * args.micro_steps}")
    if args.steps < 1 or args.block < 1:
        raise UserError("--steps and --block must be >= 1")
    if args.timeout_s <= 0:
        raise UserError(f"--timeout-s {args.timeout_s} must be > 0 (seconds before a silent rank ends the bench)")
    from trainperf.distributed.balance import check_balance_args

    check_balance_args(window=args.window, threshold=args.threshold, min_gain=args.min_gain, min_steps=args.min_steps)


def balance_command(args) -> int:
    _check(args)
    res = run_bench(args)
    if args.control:
        # The noise floor: the same run with every rank at the same speed and equal shares; its step
        # over its own ideal is what per-step jitter, the all-reduce and the optimizer cost when
        # there is nothing to balance.
        ctl = run_bench(argparse.Namespace(**{**vars(args), "slowdown": 1.0, "settle_steps": 0}))
        res["control"] = {"ideal_step_s": ctl["ideal_step_s"], "step_s": ctl["balanced_step_s"],
                          "vs_ideal": ctl["balanced_vs_ideal"], "unbalanced_vs_ideal": ctl["unbalanced_vs_ideal"],
                          "slowest_compute_vs_ideal": ctl["balanced_slowest_compute_vs_ideal"],
                          "overhead_s": ctl["overhead_s"], "shares": ctl["shares"]}
    if args.json:
        print_json(res)
    else:
        print(f"balance bench: {args.ranks} gloo ranks, rank {args.slow_rank} does {args.slowdown}x work per sample, "
              f"global batch {args.global_batch}, {args.steps} measured steps per arrangement")
        print(f"  per-sample compute (ms): {', '.join(f'{1e3 * p:.2f}' for p in res['per_sample_s'])}")
        print(f"  ideal step      {1e3 * res['ideal_step_s']:8.1f} ms  (global batch / summed speeds; compute only)")
        print(f"  overhead        {1e3 * res['overhead_s']:8.1f} ms  (step wall - slowest compute: all-reduce, optimizer, "
              "scheduling)")
        print(f"  unbalanced step {1e3 * res['unbalanced_step_s']:8.1f} ms  {res['unbalanced_vs_ideal']:.2f}x ideal"
              f"  shares {res['equal_shares']}")
        print(f"  balanced step   {1e3 * res['balanced_step_s']:8.1f} ms  {res['balanced_vs_ideal']:.2f}x ideal"
              f"  shares {res['shares']}  ({res['speedup']:.2f}x faster than unbalanced; "
              f"{res['balanced_vs_ideal_plus_overhead']:.2f}x ideal + overhead)")
        print(f"  slowest compute {1e3 * res['balanced_slowest_compute_s']:8.1f} ms  "
              f"{res['balanced_slowest_compute_vs_ideal']:.2f}x ideal  (balanced steps: residual imbalance + jitter)")
        if "control" in res:
            c = res["control"]
            print(f"  control         {1e3 * c['step_s']:8.1f} ms  {c['vs_ideal']:.2f}x its ideal  (equal speeds, equal "
                  "shares: the noise floor)")
        for d in res["decisions"]:
            kind = "refinement" if d.get("refinement") else "trigger"
            print(f"  decision at step {d['step']} ({kind}): imbalance {d['imbalance']:.2f}, "
                  f"{d['old_shares']} -> {d['new_shares']}")
    return 0


def run_bench(args) -> dict:
    import torch.multiprocessing as mp

    os.environ["OMP_NUM_THREADS"] = "1"  # inherited by the spawned ranks
    # glibc: keep freed activation buffers in the heap for the next step instead of returning
    # them to the OS (mmap/munmap + page faults each step cost ~10% of a CPU step and jitter).
    os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", str(1 << 30))
    os.environ.setdefault("MALLOC_TRIM_THRESHOLD_", str(1 << 32))
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp, "result.json")
        # All ranks are local: they meet through a file store, not a TCP port. (A port picked free
        # here can be taken before rank 0 listens on it, or a rank's retried connect can land on
        # itself, and the ranks then wait for each other until the timeout.)
        init = f"file://{Path(tmp, 'store')}"
        mp.start_processes(_worker, args=(args.ranks, init, vars(args), str(out)), nprocs=args.ranks,
                           join=True, start_method="spawn")
        return json.loads(out.read_text())


def _model(dim: int, slowdown: float):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class StragglerMLP(nn.Module):
        """Per-token MLP whose forward returns the mean squared error of a micro-batch.

        ``slowdown`` > 1 computes the whole sample work (MLP and loss) again on the same input
        (``slowdown - 1`` times; a fractional part on that part of the rows) and adds 0 x that
        extra loss, so forward and backward really do it while value and gradient stay those of
        the plain model.
        """

        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

        def sample_loss(self, x, y):
            return F.mse_loss(self.fc2(F.gelu(self.fc1(x))), y)  # mean over (n, T, dim)

        def forward(self, x, y):
            loss = self.sample_loss(x, y)
            extra, burn = slowdown - 1.0, None
            while extra > 1e-9:
                n = x.shape[0] if extra >= 1 else round(extra * x.shape[0])
                if n:
                    b = self.sample_loss(x[:n], y[:n])
                    burn = b if burn is None else burn + b
                extra -= 1.0
            return loss if burn is None else loss + 0.0 * burn  # same value and gradient, real extra work

    torch.manual_seed(0)
    return StragglerMLP()


def _worker(rank: int, world: int, init_method: str, a: dict, out: str) -> None:
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from trainperf.data.sampler import GlobalBatchSampler
    from trainperf.distributed.balance import ComputeClock, DynamicBalancer, equal_shares, micro_batch_sizes

    torch.set_num_threads(1)
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if a["pin"] and len(cpus) >= world:
        # One core per rank: a rank that waits frees its core for others' processes, not for the
        # other rank, so each rank's speed is its own (on a shared machine it is still noisy).
        os.sched_setaffinity(0, {cpus[rank]})
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world,
                            timeout=timedelta(seconds=a.get("timeout_s", 300.0)))
    B, k = a["global_batch"], a["micro_steps"]
    model = _model(a["dim"], a["slowdown"] if rank == a["slow_rank"] else 1.0)
    ddp = DDP(model)  # the model has no buffers: nothing is broadcast in forward
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    clock = ComputeClock(model)
    g = torch.Generator().manual_seed(1)
    n_samples = 4 * B
    x = torch.randn(n_samples, a["seq"], a["dim"], generator=g)
    y = torch.randn(n_samples, a["seq"], a["dim"], generator=g)
    sampler = GlobalBatchSampler(n_samples, B, rank=rank, world=world, seed=0)
    bal = DynamicBalancer(B, micro_steps=k, window=a["window"], min_steps=a["min_steps"], threshold=a["threshold"],
                          min_gain=a["min_gain"], sync_every=a["sync_every"])

    def step(shares) -> tuple[float, float]:
        idx = sampler.next_local(shares)
        t0 = time.perf_counter()
        clock.start()
        start = 0
        sizes = micro_batch_sizes(len(idx), k)
        for i, n in enumerate(sizes):
            part = torch.as_tensor(idx[start:start + n])
            start += n
            with nullcontext() if i == len(sizes) - 1 else ddp.no_sync():
                loss = ddp(x[part], y[part])  # mean over the micro-batch
                (loss * bal.loss_scale(n)).backward()  # exact global-batch gradient
        compute = clock.stop()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return compute, time.perf_counter() - t0

    equal = equal_shares(B, world)
    from tqdm import tqdm

    label = "control" if a["slowdown"] == 1.0 and a["settle_steps"] == 0 else "balance bench"
    bar = tqdm(total=3 + a["settle_steps"] + 2 * a["steps"], desc=f"{label}: warm-up", unit="step", leave=False,
               disable=None if rank == 0 else True)  # rank 0, on a terminal
    for _ in range(3):  # warm-up
        step(equal)
        bar.update()
    bar.set_description(f"{label}: settling")
    # As torchtitan's training.gc_freq: no cyclic garbage collection inside steps (a pause on one
    # rank stalls all); collect between blocks, outside the timed steps.
    gc.collect()
    gc.freeze()
    gc.disable()
    settle_used, quiet = 0, 0
    for s in range(a["settle_steps"]):  # phase 2: the balancer at work
        if s % a["block"] == 0:
            gc.collect()
        compute, _ = step(bal.shares)
        d = bal.step(s, compute)
        bar.update()
        settle_used = s + 1
        quiet = 0 if d else quiet + 1
        if bal.decisions and not bal.policy.engaged and quiet >= a["min_steps"]:
            break
    settled = bal.shares
    # Phase 3. The balancer stays on in the balanced blocks, as in training: it is fed their
    # measurements (and may still move), and its exchange is part of the balanced step's time.
    rows = {"unbalanced": [], "balanced": []}  # (wall, compute, share) per measured step
    done = {"unbalanced": 0, "balanced": 0}
    s = settle_used
    bar.total = 3 + settle_used + 2 * a["steps"]
    bar.set_description(f"{label}: measuring")
    while min(done.values()) < a["steps"]:
        for name in ("unbalanced", "balanced"):
            for _ in range(min(a["block"], a["steps"] - done[name])):
                shares = equal if name == "unbalanced" else bal.shares
                compute, wall = step(shares)
                if name == "balanced":
                    t0 = time.perf_counter()
                    bal.step(s, compute)
                    wall += time.perf_counter() - t0
                    s += 1
                rows[name].append((wall, compute, shares[rank]))
                done[name] += 1
                bar.update()
            gc.collect()
    bar.close()
    gc.enable()
    gathered = [None] * world
    dist.all_gather_object(gathered, rows)
    if rank == 0:
        # A rank's speed = samples / compute seconds over all its measured steps (the throughput it
        # sustains, the same statistic as the mean step time it is compared with).
        per_sample = [sum(c for _, c, _ in r["unbalanced"] + r["balanced"]) /
                      sum(n for _, _, n in r["unbalanced"] + r["balanced"]) for r in gathered]
        ideal = B / sum(1 / p for p in per_sample)
        per_sample_med = [statistics.median(c / n for _, c, n in r["unbalanced"] + r["balanced"]) for r in gathered]
        ideal_med = B / sum(1 / p for p in per_sample_med)
        per_step = list(zip(*(r["balanced"] for r in gathered)))  # the same steps on every rank
        overhead = statistics.median(steps[0][0] - max(c for _, c, _ in steps) for steps in per_step)
        # the slowest rank's compute per balanced step, averaged: above the ideal by the residual
        # imbalance and by per-step jitter (each step waits for whichever rank is slow that step)
        slowest = statistics.mean(max(c for _, c, _ in steps) for steps in per_step)
        unb = statistics.mean(w for w, _, _ in gathered[0]["unbalanced"])
        bald = statistics.mean(w for w, _, _ in gathered[0]["balanced"])
        res = {
            "ideal_step_s": ideal, "unbalanced_step_s": unb, "balanced_step_s": bald, "shares": bal.shares,
            "settled_shares": settled,
            "unbalanced_vs_ideal": unb / ideal, "balanced_vs_ideal": bald / ideal, "speedup": unb / bald,
            "unbalanced_step_median_s": statistics.median(w for w, _, _ in gathered[0]["unbalanced"]),
            "balanced_step_median_s": statistics.median(w for w, _, _ in gathered[0]["balanced"]),
            "per_sample_s": per_sample,
            # the same from the medians of per-step compute / share (lower when steps have slow outliers)
            "per_sample_median_s": per_sample_med, "ideal_from_medians_step_s": ideal_med,
            "balanced_vs_ideal_from_medians": bald / ideal_med,
            # wall - slowest rank's compute, per balanced step: gradient all-reduce, optimizer, scheduling
            "overhead_s": overhead, "ideal_plus_overhead_s": ideal + overhead,
            "balanced_slowest_compute_s": slowest, "balanced_slowest_compute_vs_ideal": slowest / ideal,
            "balanced_vs_ideal_plus_overhead": bald / (ideal + overhead),
            "compute_s": {name: [statistics.median(c for _, c, _ in r[name]) for r in gathered]
                          for name in ("unbalanced", "balanced")}, "equal_shares": equal, "settle_steps": settle_used,
            "decisions": [d.as_dict() for d in bal.decisions],
            "setup": {k2: a[k2] for k2 in ("ranks", "slow_rank", "slowdown", "steps", "block", "global_batch",
                                           "micro_steps", "seq", "dim", "window", "min_steps", "threshold", "min_gain",
                                           "sync_every", "pin")},
        }
        Path(out).write_text(json.dumps(res))
    # Free DDP (its reducer holds the group and its last work) while the group is alive, and
    # leave together: torn down after destroy_process_group, gloo could wait forever at exit.
    del ddp
    gc.unfreeze()
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()
