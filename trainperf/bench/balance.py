"""``trainperf bench balance``: the dynamic load balancer on a straggler, measured side by side.

N gloo processes (1 thread each; ``--pin``: each on its own CPU) train a small per-token MLP
with DDP on the same global batch, through the library's own ``Trainer.train_step`` (the balancer
as in training: ``parallelism.balance``; the unbalanced blocks pass equal shares to the step).
Rank ``--slow-rank`` does ``--slowdown`` x the work per sample: it computes the MLP and the loss
again on its micro-batch (``F - 1`` extra times, a fractional part on that fraction of its tokens)
and adds ``0 x`` that extra loss to the loss, so forward *and* backward really compute it while
the loss and gradients stay those of the plain model. Not a sleep. ``--busy``
(``--outside-straggler``): instead, a busy process shares the slow rank's CPU, and every model
does the same work.

Phases: (1) warm-up; (2) the balancer runs (``--window``, ``--min-steps``, ``--threshold``; each
move tried against the old shares for ``--verify-steps`` steps per arm before it is kept) until it
has settled (a move was made, no move is being tried or refined; then ``--min-steps`` more quiet
steps) or ``--settle-steps`` have passed; (3) measurement: blocks of ``--block`` steps alternate
between equal shares (unbalanced), the balancer's shares (balanced) and, against the synthetic
straggler, the *ideal arm*, ``--steps`` steps each in all, so all see the same machine noise. In
the balanced blocks the balancer stays on, as in training (fed their measurements, it may still
try a move; its exchange counts in their step time).

Step time = wall time of a step on rank 0 (the trainer's whole step), mean over the measured steps.

Two ideals. *Measured ideal* (``ideal_arm_step_s``; synthetic straggler only): the same job with its
work perfectly divided, run in the same interleaved blocks: every rank does ``N / sum_r(1 / F_r)``
x the plain work per sample (4/3 for one rank of two at 2x) on equal shares, so each rank computes
exactly what a perfect split of the straggler's work would give it, with the same global batch,
all-reduce, optimizer, data and per-step jitter; ``balanced_vs_ideal_arm`` is the balancer's
distance from perfect division. *Compute ideal* (``ideal_step_s``): global batch / sum over ranks of
their speeds, a rank's speed being the samples it computed over phase 3 / the seconds its compute
clock (:class:`~trainperf.distributed.balance.ComputeClock`) counted for them; it leaves out
communication, the optimizer, data and per-step jitter, which no share removes, so balanced /
compute ideal also shows those (``overhead_s``: median of step wall time - slowest rank's compute,
balanced steps; ``balanced_vs_ideal_plus_overhead``). ``balanced_slowest_compute_s``: the slowest
rank's compute per balanced step, averaged. ``--control`` runs it all again with every rank at the
same speed and equal shares: its step over its own ideal is the noise floor of the machine.

``--rounds N`` (:mod:`trainperf.bench.balance_rounds`): N independent runs, each its own ranks and a
fresh balancer, balanced / unbalanced per round and a summary; ``--control`` there adds, per round, a
run without the straggler (the balancer on), whose ratio should be 1.

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
from pathlib import Path

from trainperf.errors import UserError


def check_args(args) -> None:
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
    if getattr(args, "rounds", 1) < 1:
        raise UserError(f"--rounds {args.rounds} must be >= 1")
    from trainperf.distributed.balance import check_balance_args, check_verify_args

    check_balance_args(window=args.window, threshold=args.threshold, min_gain=args.min_gain, min_steps=args.min_steps)
    check_verify_args(verify_steps=args.verify_steps, verify_block=args.verify_block, backoff_steps=args.backoff_steps)


def measure(args) -> dict:
    """The bench (and, with ``args.control``, the noise floor) as one result; ``--rounds N``: N rounds."""
    check_args(args)
    if args.rounds > 1:
        from trainperf.bench.balance_rounds import measure_rounds

        return measure_rounds(args, run_bench)
    res = run_bench(args)
    if args.control:
        # The noise floor: the same run with every rank at the same speed and equal shares; its step
        # over its own ideal is what per-step jitter, the all-reduce and the optimizer cost when
        # there is nothing to balance.
        ctl = run_bench(argparse.Namespace(**{**vars(args), "slowdown": 1.0, "settle_steps": 0, "busy": False}))
        res["control"] = {"ideal_step_s": ctl["ideal_step_s"], "step_s": ctl["balanced_step_s"],
                          "vs_ideal": ctl["balanced_vs_ideal"], "unbalanced_vs_ideal": ctl["unbalanced_vs_ideal"],
                          "slowest_compute_vs_ideal": ctl["balanced_slowest_compute_vs_ideal"],
                          "overhead_s": ctl["overhead_s"], "shares": ctl["shares"]}
    return res


def run_bench(args) -> dict:
    from trainperf.distributed.spawn import run_processes

    os.environ["OMP_NUM_THREADS"] = "1"  # inherited by the spawned ranks
    hog = _busy_process(args) if getattr(args, "busy", False) else None
    try:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp, "result.json")
            # All ranks are local: they meet through a file store, not a TCP port. (A port picked free
            # here can be taken before rank 0 listens on it, or a rank's retried connect can land on
            # itself, and the ranks then wait for each other until the timeout.)
            init = f"file://{Path(tmp, 'store')}"
            run_processes(_worker, (args.ranks, init, vars(args), str(out)), args.ranks)  # Ctrl-C: ranks stopped
            return json.loads(out.read_text())
    finally:
        if hog is not None:
            hog.kill()
            hog.wait()


def _busy_process(args):
    """``--busy``: the straggler comes from outside: a busy loop pinned to the slow rank's CPU (the ranks
    are pinned one per CPU), as a host shared with another job; the slow rank's model does normal work."""
    import subprocess
    import sys

    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if not args.pin or len(cpus) < args.ranks:
        raise UserError(f"--busy needs the ranks pinned one per CPU (--pin) and at least --ranks {args.ranks} usable "
                        f"CPUs; this process may use {len(cpus)}")
    from trainperf import interrupt

    cpu = cpus[args.slow_rank]
    with interrupt.starting():  # it leaves Ctrl-C to this process, which kills it
        return subprocess.Popen([sys.executable, "-c", interrupt.HOG_CODE], preexec_fn=lambda: os.sched_setaffinity(0, {cpu}))


def ideal_factor(ranks: int, slow_rank: int, slowdown: float) -> float:
    """Work per sample on every rank of the measured ideal: a perfect split of the straggler's work.

    Ranks of per-sample cost ``F_r`` (``slowdown`` on ``slow_rank``, 1 elsewhere) finish together at
    ``B / sum_r(1 / F_r)`` plain samples' work each; on equal shares ``B / N`` that is ``N / sum_r(1 / F_r)``
    per sample (the harmonic mean of the costs: 4/3 for one rank of two at 2x)."""
    costs = [slowdown if r == slow_rank else 1.0 for r in range(ranks)]
    return ranks / sum(1.0 / c for c in costs)


def _model(dim: int, slowdown: float):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class StragglerMLP(nn.Module):
        """Per-token MLP whose forward returns the mean squared error of a micro-batch.

        ``slowdown`` > 1 computes the whole sample work (MLP and loss) again on the same input
        (``slowdown - 1`` times; a fractional part on that fraction of the micro-batch's tokens, a
        contiguous prefix) and adds 0 x that extra loss, so forward and backward really do it while
        value and gradient stay those of the plain model. ``slowdown`` may change between steps
        (the measured ideal's blocks).
        """

        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)
            self.slowdown = slowdown

        def sample_loss(self, x, y):
            return F.mse_loss(self.fc2(F.gelu(self.fc1(x))), y)  # mean over (n, T, dim)

        def forward(self, x, y):  # the trainer's model contract: (output, loss)
            loss = self.sample_loss(x, y)
            extra, burn = self.slowdown - 1.0, None
            while extra > 1e-9:
                if extra >= 1:
                    b = self.sample_loss(x, y)
                else:  # (n, T, dim) -> (n * T, dim): a contiguous prefix of the tokens
                    k = round(extra * x.shape[0] * x.shape[1])
                    b = self.sample_loss(x.reshape(-1, dim)[:k], y.reshape(-1, dim)[:k]) if k else None
                if b is not None:
                    burn = b if burn is None else burn + b
                extra -= 1.0
            return None, (loss if burn is None else loss + 0.0 * burn)  # same value and gradient, real extra work

    torch.manual_seed(0)
    return StragglerMLP()


class _Batches:
    """In-memory samples as the trainer's data: this rank's share of each global batch (the sampler's split)."""

    def __init__(self, x, y, sampler):
        self.x, self.y, self.sampler = x, y, sampler

    def next_batch(self, shares=None):
        import torch

        idx = torch.as_tensor(self.sampler.next_local(shares))
        return self.x[idx], self.y[idx]

    def state_dict(self) -> dict:
        return self.sampler.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.sampler.load_state_dict(state)


def bench_config(a: dict, world: int):
    """The run as a config: DDP over ``world`` ranks, the balancer's settings, ``micro_steps`` per rank."""
    from trainperf.config.schema import Config

    cfg = Config()
    cfg.run.device, cfg.run.threads, cfg.run.steps = "cpu", 1, 10**9
    cfg.precision.dtype, cfg.optimizer.type, cfg.optimizer.impl, cfg.optimizer.lr = "fp32", "sgd", "foreach", 1e-3
    cfg.optimizer.weight_decay = 0.0
    cfg.schedule.type, cfg.schedule.warmup_steps = "constant", 0
    cfg.train.global_batch, cfg.train.grad_clip = a["global_batch"], 0.0
    cfg.train.micro_batch = max(1, a["global_batch"] // (world * a["micro_steps"]))
    cfg.parallelism.data = world
    b = cfg.parallelism.balance
    b.enabled, b.window, b.min_steps, b.threshold, b.min_gain, b.sync_every = (
        True, a["window"], a["min_steps"], a["threshold"], a["min_gain"], a["sync_every"])
    b.verify, b.verify_steps, b.verify_block, b.backoff_steps = (
        a.get("verify", True), a.get("verify_steps", 15), a.get("verify_block", 5), a.get("backoff_steps", 100))
    cfg.distributed.timeout_s = a.get("timeout_s", 300.0)
    return cfg


def _worker(rank: int, world: int, init_method: str, a: dict, out: str) -> None:
    from datetime import timedelta
    from types import SimpleNamespace

    from trainperf import interrupt

    interrupt.worker_signals()  # Ctrl-C is the parent's: run_processes stops the ranks
    import torch
    import torch.distributed as dist

    from trainperf.data.sampler import GlobalBatchSampler
    from trainperf.distributed.balance import equal_shares
    from trainperf.distributed.parallel_dims import ParallelDims
    from trainperf.train.build import assemble

    torch.set_num_threads(1)
    # keep freed activation buffers mapped for the next step (page faults each step cost a CPU step
    # time and jitter): run.host_memory=retain, in this rank's process only
    from trainperf.hardware import hostmem

    if hostmem.supported()[0]:
        hostmem.apply("retain")
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if a["pin"] and len(cpus) >= world:
        # One core per rank: a rank that waits frees its core for others' processes, not for the
        # other rank, so each rank's speed is its own (on a shared machine it is still noisy).
        os.sched_setaffinity(0, {cpus[rank]})
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world,
                            timeout=timedelta(seconds=a.get("timeout_s", 300.0)))
    B = a["global_batch"]
    cfg = bench_config(a, world)
    model = _model(a["dim"], a["slowdown"] if (rank == a["slow_rank"] and not a.get("busy")) else 1.0)  # (B, T, dim) MLP
    g = torch.Generator().manual_seed(1)
    n_samples = 4 * B
    x = torch.randn(n_samples, a["seq"], a["dim"], generator=g)
    y = torch.randn(n_samples, a["seq"], a["dim"], generator=g)
    sampler = GlobalBatchSampler(n_samples, B, rank=rank, world=world, seed=0)
    data = SimpleNamespace(train=_Batches(x, y, sampler), val=None, seq_len=a["seq"], vocab_size=0, meta={})
    trainer = assemble(cfg, ParallelDims.from_config(cfg, world), model, data, rank=rank)
    bal = trainer.balancer
    own = a["slowdown"] if (rank == a["slow_rank"] and not a.get("busy")) else 1.0
    ideal_f = ideal_factor(world, a["slow_rank"], a["slowdown"]) if (not a.get("busy") and a["slowdown"] > 1) else None

    def step(shares=None) -> tuple[float, float, bool]:
        res = trainer.train_step(shares)  # shares given: this step runs them and the balancer is not fed
        moved = "balance/new_shares" in res.extras or "balance/verdict" in res.extras
        return res.extras["balance/compute_s"], res.step_time, moved

    equal = equal_shares(B, world)
    from tqdm import tqdm

    arms = ["unbalanced", "balanced"] + (["ideal"] if ideal_f else [])
    label = "control" if a["slowdown"] == 1.0 and a["settle_steps"] == 0 else "balance bench"
    bar = tqdm(total=3 + a["settle_steps"] + len(arms) * a["steps"], desc=f"{label}: warm-up", unit="step", leave=False,
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
    # A trial still running when the settle steps run out is let finish (a busy machine makes the balancer
    # decide later): its longest is 4 x verify_steps measured steps per arm, one block's first step unmeasured.
    trial_cap = 2 * 4 * a.get("verify_steps", 20) * max(2, a.get("verify_block", 5)) + 2 * a["sync_every"]
    s = 0
    while s < a["settle_steps"] or (bal.policy.trial is not None and s < a["settle_steps"] + trial_cap):
        # phase 2: the balancer at work (moves tried, kept or reverted)
        if s % a["block"] == 0:
            gc.collect()
        _, _, moved = step()
        bar.update()
        s += 1
        settle_used = s
        quiet = 0 if moved else quiet + 1
        if bal.decisions and bal.policy.settled and quiet >= a["min_steps"]:
            break
    settled = bal.shares
    # Phase 3. The balancer stays on in the balanced blocks, as in training: it is fed their
    # measurements (and may still try a move), and its exchange is part of the balanced step's time.
    rows = {name: [] for name in arms}  # (wall, compute, share) per measured step
    done = {name: 0 for name in arms}
    bar.total = 3 + settle_used + len(arms) * a["steps"]
    bar.set_description(f"{label}: measuring")
    while min(done.values()) < a["steps"]:
        for name in arms:
            trainer.model.slowdown = ideal_f if name == "ideal" else own
            for _ in range(min(a["block"], a["steps"] - done[name])):
                shares = bal.shares if name == "balanced" else equal
                compute, wall, _ = step(None if name == "balanced" else equal)
                rows[name].append((wall, compute, shares[rank]))
                done[name] += 1
                bar.update()
            gc.collect()
    trainer.model.slowdown = own
    bar.close()
    gc.enable()
    gathered = [None] * world
    dist.all_gather_object(gathered, rows)
    if rank == 0:
        Path(out).write_text(json.dumps(summarize(gathered, B, bal, equal, settled, settle_used, a)))
    # Free DDP (its reducer holds the group and its last work) while the group is alive, and
    # leave together: torn down after destroy_process_group, gloo could wait forever at exit.
    del trainer, bal
    gc.unfreeze()
    from trainperf.distributed.init import destroy_distributed

    destroy_distributed(barrier=True)


def summarize(gathered: list[dict], B: int, bal, equal: list[int], settled: list[int], settle_used: int,
              a: dict) -> dict:
    """The figures, from every rank's (wall, compute, share) rows of the measured steps."""
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
    arm = {}
    if "ideal" in gathered[0]:  # the measured ideal: the same job, its work perfectly divided, interleaved
        ideal_arm = statistics.mean(w for w, _, _ in gathered[0]["ideal"])
        arm = {"ideal_arm_step_s": ideal_arm, "ideal_arm_step_median_s": statistics.median(
                   w for w, _, _ in gathered[0]["ideal"]),
               "ideal_arm_factor": ideal_factor(a["ranks"], a["slow_rank"], a["slowdown"]),
               "balanced_vs_ideal_arm": bald / ideal_arm, "unbalanced_vs_ideal_arm": unb / ideal_arm,
               "ideal_arm_compute_s": [statistics.median(c for _, c, _ in r["ideal"]) for r in gathered]}
    return {**arm,
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
        "decisions": [d.as_dict() for d in bal.decisions], "verdicts": [v.as_dict() for v in bal.verdicts],
        "setup": {k2: a.get(k2) for k2 in ("ranks", "slow_rank", "slowdown", "steps", "block", "global_batch",
                                           "micro_steps", "seq", "dim", "window", "min_steps", "threshold", "min_gain",
                                           "sync_every", "pin", "verify", "verify_steps", "verify_block",
                                           "backoff_steps")}, "busy": bool(a.get("busy")),
        "load_avg_1m_at_end": round(os.getloadavg()[0], 2),
    }
