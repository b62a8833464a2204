"""``trainperf bench balance``: the dynamic load balancer on a straggler, measured side by side.

N gloo processes (1 thread each; ``--pin``: each on its own CPU) train a small per-token MLP
with DDP on the same global batch. Rank ``--slow-rank`` does ``--slowdown`` x the work per
sample: it runs the MLP again on its micro-batch (``F - 1`` extra times, the fractional part on
part of the rows) and adds ``0 x`` that extra output to the loss, so forward *and* backward
really compute it while the loss and gradients stay those of the plain model. Not a sleep.

Phases: (1) warm-up; (2) the balancer runs (``--window``, ``--min-steps``, ``--threshold``)
until it has settled (no move for 2 x min-steps after one) or ``--settle-steps`` have passed;
(3) measurement: blocks of ``--block`` steps alternate between equal shares (unbalanced) and the
settled shares (balanced), ``--steps`` steps each in all, so both see the same machine noise.

Step time = wall time of a step on rank 0 (start to after the optimizer step, which follows the
gradient all-reduce), mean over the measured steps. Ideal = global batch / sum over ranks of
1 / per-sample compute time, the per-sample times being the medians of each rank's compute
clock (:class:`~trainperf.distributed.balance.ComputeClock`) / share over phase 3. The ideal
leaves out communication, the optimizer and scheduling delays, so balanced / ideal also shows
those; ``overhead_s`` (median of step wall time - slowest rank's compute, balanced steps) is
reported next to it, and ``balanced_vs_ideal_plus_overhead`` compares with ideal + overhead.
"""

from __future__ import annotations

import json
import os
import socket
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
    p.add_argument("--steps", type=int, default=40, help="measured steps per arrangement (unbalanced, balanced)")
    p.add_argument("--block", type=int, default=5, help="steps per block when alternating the two arrangements")
    p.add_argument("--global-batch", type=int, default=64, help="samples per step over all ranks")
    p.add_argument("--micro-steps", type=int, default=2, help="micro-steps per rank per step (uneven sizes)")
    p.add_argument("--seq", type=int, default=32, help="tokens per sample")
    p.add_argument("--dim", type=int, default=128, help="MLP width (the hidden layer is 4x)")
    p.add_argument("--window", type=int, default=40, help="balancer window (measurements kept)")
    p.add_argument("--min-steps", type=int, default=15, help="balancer measurements before a judgement")
    p.add_argument("--threshold", type=float, default=0.2, help="balancer trigger: CV of per-rank step compute time")
    p.add_argument("--settle-steps", type=int, default=150, help="at most this many steps for the balancer to settle")
    p.add_argument("--pin", action="store_true",
                   help="pin each rank to its own CPU (when there are at least --ranks usable CPUs); on a machine "
                        "shared with other jobs, unpinned ranks see more even contention")
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
    from trainperf.distributed.balance import check_balance_args

    check_balance_args(window=args.window, threshold=args.threshold, hysteresis=0.5, min_steps=args.min_steps)


def balance_command(args) -> int:
    _check(args)
    res = run_bench(args)
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
        for d in res["decisions"]:
            print(f"  decision at step {d['step']}: imbalance {d['imbalance']:.2f}, {d['old_shares']} -> {d['new_shares']}")
    return 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_bench(args) -> dict:
    import torch.multiprocessing as mp

    os.environ["OMP_NUM_THREADS"] = "1"  # inherited by the spawned ranks
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp, "result.json")
        mp.start_processes(_worker, args=(args.ranks, _free_port(), vars(args), str(out)), nprocs=args.ranks,
                           join=True, start_method="spawn")
        return json.loads(out.read_text())


def _model(dim: int, slowdown: float):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class StragglerMLP(nn.Module):
        """Per-token MLP; ``slowdown`` > 1 computes it again on the same input and adds 0 x that."""

        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

        def block(self, x):
            return self.fc2(F.gelu(self.fc1(x)))  # (n, T, dim)

        def forward(self, x):
            out = self.block(x)
            extra, burn = slowdown - 1.0, None
            while extra > 1e-9:
                rows = x if extra >= 1 else x[: round(extra * x.shape[0])]
                if len(rows):
                    b = self.block(rows).sum()
                    burn = b if burn is None else burn + b
                extra -= 1.0
            return out if burn is None else out + 0.0 * burn  # same value and gradient, real extra work

    torch.manual_seed(0)
    return StragglerMLP()


def _worker(rank: int, world: int, port: int, a: dict, out: str) -> None:
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
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
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
    bal = DynamicBalancer(B, micro_steps=k, window=a["window"], min_steps=a["min_steps"], threshold=a["threshold"])

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
                loss = torch.nn.functional.mse_loss(ddp(x[part]), y[part])  # mean over the micro-batch
                (loss * bal.loss_scale(n)).backward()  # exact global-batch gradient
        compute = clock.stop()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return compute, time.perf_counter() - t0

    equal = equal_shares(B, world)
    for _ in range(3):  # warm-up
        step(equal)
    settle_used, quiet = 0, 0
    for s in range(a["settle_steps"]):  # phase 2: the balancer at work
        compute, _ = step(bal.shares)
        d = bal.step(s, compute)
        settle_used = s + 1
        quiet = 0 if d else quiet + 1
        if bal.decisions and quiet >= 2 * a["min_steps"]:
            break
    balanced = bal.shares
    rows = {"unbalanced": [], "balanced": []}  # (wall, compute, share) per measured step
    done = {"unbalanced": 0, "balanced": 0}
    while min(done.values()) < a["steps"]:
        for name, shares in (("unbalanced", equal), ("balanced", balanced)):
            for _ in range(min(a["block"], a["steps"] - done[name])):
                compute, wall = step(shares)
                rows[name].append((wall, compute, shares[rank]))
                done[name] += 1
    gathered = [None] * world
    dist.all_gather_object(gathered, rows)
    if rank == 0:
        per_sample = [statistics.median(c / n for _, c, n in r["unbalanced"] + r["balanced"]) for r in gathered]
        ideal = B / sum(1 / p for p in per_sample)
        per_step = zip(*(r["balanced"] for r in gathered))  # the same steps on every rank
        overhead = statistics.median(steps[0][0] - max(c for _, c, _ in steps) for steps in per_step)
        unb = statistics.mean(w for w, _, _ in gathered[0]["unbalanced"])
        bald = statistics.mean(w for w, _, _ in gathered[0]["balanced"])
        res = {
            "ideal_step_s": ideal, "unbalanced_step_s": unb, "balanced_step_s": bald, "shares": balanced,
            "unbalanced_vs_ideal": unb / ideal, "balanced_vs_ideal": bald / ideal, "speedup": unb / bald,
            "unbalanced_step_median_s": statistics.median(w for w, _, _ in gathered[0]["unbalanced"]),
            "balanced_step_median_s": statistics.median(w for w, _, _ in gathered[0]["balanced"]),
            "per_sample_s": per_sample,
            # wall - slowest rank's compute, per balanced step: gradient all-reduce, optimizer, scheduling
            "overhead_s": overhead, "ideal_plus_overhead_s": ideal + overhead,
            "balanced_vs_ideal_plus_overhead": bald / (ideal + overhead),
            "compute_s": {name: [statistics.median(c for _, c, _ in r[name]) for r in gathered]
                          for name in ("unbalanced", "balanced")}, "equal_shares": equal, "settle_steps": settle_used,
            "decisions": [d.as_dict() for d in bal.decisions],
            "setup": {k2: a[k2] for k2 in ("ranks", "slow_rank", "slowdown", "steps", "block", "global_batch",
                                           "micro_steps", "seq", "dim", "window", "min_steps", "threshold", "pin")},
        }
        Path(out).write_text(json.dumps(res))
    dist.destroy_process_group()
