"""``trainperf bench balance --mid-run``: the balancer in the real trainer when a straggler appears mid-run.

A round is two whole ``trainperf train`` runs of the same job, one with ``parallelism.balance.enabled=true`` and
one without (their order alternates from round to round, so a drift of the machine weighs on both alike):

- the default model is gpt-tiny (``model.preset=tiny``, 4 layers, context 128; synthetic tokens so nothing is
  prepared), trained through :func:`trainperf.train.build.train` (``fit`` -> ``Trainer.train_step``, the monitor,
  the run directory) on ``--ranks`` gloo processes, one thread each, each pinned to its own CPU; ``--config``
  trains your own config instead (its model and optimizer; the bench sets the steps, the layout and the logging);
  ``--model mlp`` the bench's own per-token MLP (:mod:`trainperf.bench.balance`, ``--seq``, ``--dim``) through the
  same ``Trainer.train_step`` in a plain loop, rank 0 writing each step's record to the run's metrics.jsonl;
- the balancer runs with the defaults of ``parallelism.balance`` (what a user gets with ``enabled=true``);
- after ``--hog-step`` steps a busy process (``while True: pass``) starts on the CPU of rank ``--slow-rank`` and
  stays to the end of the run: another job landing on the node. The rank starts it itself, before its step
  ``--hog-step + 1`` (the ``busy`` fault of :mod:`trainperf.distributed.failure`), so it starts at the same
  step however loaded the machine is, and the step it started at is read back from the rank;
- the figure of a run is the median step time (rank 0's ``step_time_s``, the trainer's whole step) over its last
  ``--last`` steps; the round's figure is balanced / unbalanced (below 1: balancing paid).

Everything the balancer did is in the balanced run's metrics.jsonl (``balance/*``) and in its diagnosis (the
``balancer`` finding); the bench reports the same lines per round. ``--keep DIR`` keeps the run directories.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from trainperf.errors import UserError

FLUSH_S = 0.2  # monitor.flush_s of the bench's runs
BUSY_FILE = "busy.json"  # the busy process's start (step, time, pid), written by the rank that started it


def check_midrun_args(args) -> None:
    if args.ranks < 2:
        raise UserError(f"--ranks {args.ranks}: a balancer needs at least 2 ranks")
    if not 0 <= args.slow_rank < args.ranks:
        raise UserError(f"--slow-rank {args.slow_rank} is not a rank of 0..{args.ranks - 1}")
    if not 0 < args.hog_step < args.run_steps:
        raise UserError(f"--hog-step {args.hog_step} must be inside the run (0 < step < --run-steps {args.run_steps})")
    if not 0 < args.last <= args.run_steps - args.hog_step:
        raise UserError(f"--last {args.last} must be > 0 and at most the steps after the hog starts "
                        f"({args.run_steps - args.hog_step}); raise --run-steps or lower --last")
    if args.global_batch < args.ranks:
        raise UserError(f"--global-batch {args.global_batch} must be >= --ranks {args.ranks} (a sample per rank)")
    if args.rounds < 1:
        raise UserError(f"--rounds {args.rounds} must be >= 1")
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if len(cpus) < args.ranks:
        raise UserError(f"--mid-run pins each rank to its own CPU and the busy process to rank {args.slow_rank}'s: "
                        f"it needs at least --ranks {args.ranks} usable CPUs; this process may use {len(cpus)}")
    if args.config and args.model == "mlp":
        raise UserError("--config trains your model; --model mlp the bench's own: give one of them")
    if args.config and not Path(args.config).is_file():
        raise UserError(f"--config {args.config}: no such file; give a trainperf YAML config (e.g. configs/gpt-tiny.yaml)")


def run_sets(args, run_dir: Path, balanced: bool) -> list[str]:
    """The ``--set`` overrides of one run: the bench's layout, length and logging on the model's config."""
    sets = [] if args.config else ["model.preset=tiny", "model.dropout=0.0", "data.source=synthetic",
                                   "optimizer.type=adamw", "optimizer.lr=0.002"]
    gb = args.global_batch
    return sets + [
        f"run.dir={run_dir}", f"run.steps={args.run_steps}", "run.log_every=10", "run.eval_every=0",
        "run.sample_tokens=0", "run.progress=false", "run.threads=1", "run.device=cpu", "checkpoint.every=0",
        "checkpoint.at_end=false", "monitor.mfu=false", f"monitor.flush_s={FLUSH_S}", f"parallelism.data={args.ranks}",
        "parallelism.tensor=1", "parallelism.pipeline=1", "parallelism.data_shard=1",
        f"train.global_batch={gb}", f"train.micro_batch={max(1, gb // args.ranks)}",
        f"parallelism.balance.enabled={'true' if balanced else 'false'}", f"distributed.timeout_s={args.timeout_s}"]


def _write_busy(run_dir: str, rank: int) -> None:
    """The rank that started the busy process writes its start (the bench reads the step from it)."""
    from trainperf.distributed.failure import busy_log

    if busy_log:
        Path(run_dir, BUSY_FILE).write_text(json.dumps({"rank": rank, **busy_log[0]}))


def _worker(rank: int, world: int, init: str, config: str | None, sets: list[str], timeout_s: float,
            fault: tuple[str, int, int], run_dir: str) -> None:
    from datetime import timedelta

    from trainperf import interrupt

    interrupt.worker_signals()  # Ctrl-C is the parent's: run_processes stops the ranks
    cpus = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpus[rank]})  # one CPU per rank: the busy process then slows one rank only
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                      OMP_NUM_THREADS="1")
    import torch.distributed as dist

    # all ranks are local: they meet through a file store (no port to race for)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world,
                            timeout=timedelta(seconds=timeout_s))
    from trainperf.config.load import load_config
    from trainperf.train.build import train
    from trainperf.train.resolve import resolve

    from trainperf.train.knobs import Knobs

    train(resolve(load_config(config, sets), world_size=world), resume="never", verbose=False,
          knobs=Knobs(fault=fault))
    _write_busy(run_dir, rank)


def _worker_mlp(rank: int, world: int, init: str, a: dict, balanced: bool, run_dir: str,
                fault: tuple[str, int, int]) -> None:
    """``--model mlp``: the bench's own model and in-memory data through ``Trainer.train_step``; rank 0 writes
    each step's record (step, step_time_s, the balancer's balance/*) to metrics.jsonl as it goes."""
    from datetime import timedelta
    from types import SimpleNamespace

    from trainperf import interrupt

    interrupt.worker_signals()
    cpus = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpus[rank]})
    import torch
    import torch.distributed as dist

    from trainperf.bench.balance import _Batches, _model, bench_config
    from trainperf.config.schema import BalanceConfig
    from trainperf.data.sampler import GlobalBatchSampler
    from trainperf.distributed.init import destroy_distributed
    from trainperf.distributed.parallel_dims import ParallelDims
    from trainperf.hardware import hostmem
    from trainperf.train.build import assemble

    torch.set_num_threads(1)
    if hostmem.supported()[0]:
        hostmem.apply("retain")
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world,
                            timeout=timedelta(seconds=a["timeout_s"]))
    d = BalanceConfig()  # the user's defaults, not the steady bench's settings
    cfg = bench_config({**a, "micro_steps": 1, "window": d.window, "min_steps": d.min_steps, "threshold": d.threshold,
                        "min_gain": d.min_gain, "sync_every": d.sync_every, "verify": d.verify,
                        "verify_steps": d.verify_steps, "verify_block": d.verify_block,
                        "backoff_steps": d.backoff_steps}, world)
    cfg.parallelism.balance.enabled = balanced
    B = a["global_batch"]
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4 * B, a["seq"], a["dim"], generator=g)
    y = torch.randn(4 * B, a["seq"], a["dim"], generator=g)
    data = SimpleNamespace(train=_Batches(x, y, GlobalBatchSampler(4 * B, B, rank=rank, world=world, seed=0)),
                           val=None, seq_len=a["seq"], vocab_size=0, meta={})
    trainer = assemble(cfg, ParallelDims.from_config(cfg, world), _model(a["dim"], 1.0), data, rank=rank)
    from trainperf.distributed.failure import end_busy, inject_fault

    out = open(Path(run_dir) / "metrics.jsonl", "w") if rank == 0 else None
    try:
        for _ in range(a["run_steps"]):
            inject_fault(fault, rank, trainer.step)  # the busy process, before step hog_step + 1
            res = trainer.train_step()
            if out is not None:
                rec = {"step": trainer.step, "step_time_s": res.step_time,
                       **{k: v for k, v in res.extras.items() if k.startswith("balance/")}}
                out.write(json.dumps(rec) + "\n")
                out.flush()
    finally:
        end_busy()
        if out is not None:
            out.close()
    _write_busy(run_dir, rank)
    del trainer
    destroy_distributed(barrier=True)


def run_arm(args, run_dir: Path, balanced: bool) -> dict:
    """One whole training run (balanced or not) with the busy process from ``--hog-step``: its figures."""
    from trainperf.diagnosis.run_evidence import balance_log
    from trainperf.distributed.spawn import run_processes

    run_dir.mkdir(parents=True, exist_ok=True)
    init = f"file://{run_dir / '.store'}"
    fault = ("busy", args.slow_rank, args.hog_step)
    t0 = time.perf_counter()
    if args.model == "mlp":
        a = {k: getattr(args, k) for k in ("global_batch", "seq", "dim", "run_steps", "timeout_s")}
        run_processes(_worker_mlp, (args.ranks, init, a, balanced, str(run_dir), fault), args.ranks)
    else:
        run_processes(_worker, (args.ranks, init, args.config, run_sets(args, run_dir, balanced), args.timeout_s,
                                fault, str(run_dir)), args.ranks)
    busy = json.loads((run_dir / BUSY_FILE).read_text()) if (run_dir / BUSY_FILE).is_file() else {}
    recs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = sorted((r for r in recs if "step_time_s" in r), key=lambda r: r["step"])
    times = [r["step_time_s"] for r in steps]
    last = times[-args.last:]
    shares = [r.get("balance/shares") for r in steps if "balance/shares" in r]
    return {"balanced": balanced, "last_median_s": statistics.median(last), "last_mean_s": statistics.mean(last),
            "before_hog_median_s": statistics.median(times[:args.hog_step][-20:]),
            "hog_started_at_step": busy.get("step"), "steps": len(times), "wall_s": time.perf_counter() - t0,
            "final_shares": shares[-1] if shares else None, "balance_log": balance_log(steps) if balanced else [],
            "run_dir": str(run_dir)}


def measure_midrun(args) -> dict:
    """``--rounds`` rounds of (balanced, unbalanced) runs; per round balanced / unbalanced; the summary."""
    from tqdm import tqdm

    from trainperf.bench.balance_rounds import summarize_rounds

    check_midrun_args(args)
    os.environ["OMP_NUM_THREADS"] = "1"  # inherited by the ranks
    keep = Path(args.keep) if args.keep else None
    rounds = []
    bar = tqdm(total=2 * args.rounds, desc="balance mid-run (busy process from step "
               f"{args.hog_step})", unit="run", file=sys.stderr, disable=None if not args.json else True)
    with tempfile.TemporaryDirectory() as tmp:
        base = keep or Path(tmp)
        for i in range(args.rounds):
            load0 = os.getloadavg()[0]
            order = ("balanced", "unbalanced") if i % 2 == 0 else ("unbalanced", "balanced")
            arms = {}
            for name in order:
                arms[name] = run_arm(args, base / f"round{i + 1}-{name}", name == "balanced")
                bar.update()
            b, u = arms["balanced"], arms["unbalanced"]
            rounds.append({"round": i + 1, "ratio": b["last_median_s"] / u["last_median_s"],
                           "mean_ratio": b["last_mean_s"] / u["last_mean_s"], "order": list(order),
                           # before the busy process both runs are the same job on equal shares: this ratio is
                           # the noise between two runs on this machine (A/A), the spread the round's ratio carries
                           "before_hog_ratio": b["before_hog_median_s"] / u["before_hog_median_s"],
                           "balanced": b, "unbalanced": u, "load_1m_before": round(load0, 2),
                           "load_1m_after": round(os.getloadavg()[0], 2)})
    bar.close()
    setup = {k: getattr(args, k) for k in ("ranks", "slow_rank", "hog_step", "run_steps", "last", "global_batch",
                                           "rounds", "target_ratio", "config", "timeout_s")}
    setup["model"] = (f"the bench's per-token MLP (dim {args.dim}, {args.seq} tokens per sample)" if args.model == "mlp"
                      else args.config or "gpt-tiny (model.preset=tiny, synthetic tokens)")
    aa = [r["before_hog_ratio"] for r in rounds]
    return {"mode": "mid_run", "rounds": rounds, "setup": setup,
            "summary": summarize_rounds([r["ratio"] for r in rounds], args.target_ratio),
            "before_hog": {"what": "balanced / unbalanced median step before the busy process (the same job on equal "
                                   "shares in both runs: the run-to-run noise)",
                           "min": min(aa), "median": statistics.median(aa), "max": max(aa)},
            "cpus": len(os.sched_getaffinity(0))}


def print_midrun(res: dict) -> None:
    s, st = res["summary"], res["setup"]
    print(f"balance bench, mid-run straggler: {st['model']} on {st['ranks']} gloo ranks (one CPU each), "
          f"{st['run_steps']} steps, global batch {st['global_batch']}; a busy process on rank {st['slow_rank']}'s CPU "
          f"from step {st['hog_step']}; median step time of the last {st['last']} steps, balanced / unbalanced")
    print(f"{'round':>5} {'ratio':>7} {'balanced ms':>12} {'unbalanced ms':>14} {'hog at':>7} {'shares':>9} "
          f"{'before hog':>10}  load")
    for r in res["rounds"]:
        b, u = r["balanced"], r["unbalanced"]
        shares = "/".join(map(str, b["final_shares"])) if b["final_shares"] else "-"
        print(f"{r['round']:>5} {r['ratio']:>7.3f} {1e3 * b['last_median_s']:>12.1f} {1e3 * u['last_median_s']:>14.1f} "
              f"{str(b['hog_started_at_step']):>7} {shares:>9} {r['before_hog_ratio']:>10.3f}  "
              f"{r['load_1m_before']:.1f}-{r['load_1m_after']:.1f}")
        for line in b["balance_log"]:
            print(f"      {line}")
    print(f"  <= {s['target_ratio']:.2f}: {s['at_or_below_target']} of {s['rounds']}; above 1.0: {s['above_1']}; "
          f"median {s['median']:.3f}, worst {s['worst']:.3f}, best {s['best']:.3f}")
    a = res["before_hog"]
    print(f"  before the busy process (the same job in both runs: the noise between runs) balanced / unbalanced "
          f"{a['min']:.3f}-{a['max']:.3f}, median {a['median']:.3f}")
