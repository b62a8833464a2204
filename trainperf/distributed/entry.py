"""``trainperf train`` under torchrun (WORLD_SIZE > 1): the same loop and ``fit``, distributed.

    validate the layout (ParallelDims, before any process group) -> init process group
    -> DeviceMesh -> data (this rank's data-parallel slice of each global batch)
    -> parallelize (TP -> AC -> compile -> FSDP/DDP, or pipeline stages) -> optimizer per part
    -> fit (resume from / save to DCP checkpoints) inside FailFast (heartbeats, watchdog)

Only rank 0 prints and writes metrics and summary.json; every rank writes its checkpoint shards.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch

from trainperf.config.resolve import Resolved
from trainperf.distributed.parallel_dims import ParallelDims
from trainperf.errors import ConfigError
from trainperf.train.loop import StepResult, Trainer


@dataclass
class DistributedTrainer(Trainer):
    pm: object = None  # ParallelModel
    fail_fast: object = None  # FailFast

    def __post_init__(self):
        from trainperf.distributed.optim import MultiOptimizer, split_by_placement
        from trainperf.monitor.phases import PhaseTimer
        from trainperf.train.optim import build_optimizer
        from trainperf.train.precision import build_precision

        c = self.cfg
        self.optimizer = MultiOptimizer([split_by_placement(build_optimizer(m, c.optimizer)) for m in self.pm.modules])
        self.precision = build_precision(c.precision.dtype, self.device.type, c.precision.init_scale)
        if self.precision.scaler is not None:
            raise ConfigError("precision.dtype='fp16' (loss scaling) is not supported in distributed runs yet; "
                              "use precision.dtype=bf16 or fp32")
        self.pm.autocast = self.precision.autocast
        self.local_batch = c.train.global_batch // self.dp_world
        # a micro-batch above this rank's share trains as the share (resolve() notes it)
        self.micro_batch = min(c.train.micro_batch, self.local_batch)
        self.accum = 1 if self.pm.schedule is not None else self.local_batch // self.micro_batch
        self.pm.accum_hint = self.accum
        self.timer = PhaseTimer(self.device.type)
        self.step = 0
        self._compile_checked = True  # compiled per block inside parallelize
        self.tokens_per_step = c.train.global_batch * self.data.seq_len
        self.can_sample = False  # generation would need every rank of a sharded model
        self.balancer = self.clock = None
        if c.parallelism.balance.enabled and self.dp_world > 1:  # parallelism.balance: per-rank shares
            from trainperf.distributed.balance import ComputeClock, DynamicBalancer

            self.balancer = DynamicBalancer.from_config(
                c.parallelism.balance, c.train.global_batch, micro_steps=self.accum, world=self.dp_world,
                rank=self.dp_rank, gather=_dp_gather(self.pm.dims, self.device), device=self.device)
            # FSDP2's all-gathers inside forward wait for slower ranks, which ComputeClock would count;
            # on CPU this thread's CPU time leaves those waits out (gloo waits without spinning).
            cpu_fsdp = self.pm.kind == "fsdp" and self.device.type == "cpu"
            self.clock = _ThreadCpuClock() if cpu_fsdp else ComputeClock(self.pm.modules[0], self.device.type)
        from trainperf.distributed.slow import SlowRank  # TRAINPERF_SLOW_RANK=R:F (tests, demos); None if unset

        self.slow = SlowRank.from_env(self.pm.rank, c, data_vocab=self.data.vocab_size, device=self.device,
                                      chunk=self.micro_batch, autocast=self.precision.autocast)

    # ------------------------------------------------------------------ one step
    def train_step(self) -> StepResult:
        from trainperf.distributed.ddp import COMM
        from trainperf.train.optim import lr_at

        c, timer, pm = self.cfg, self.timer, self.pm
        t0 = time.perf_counter()
        self.fail_fast.beat(self.step)
        timer.start_step()
        lr = lr_at(self.step, peak=c.optimizer.lr, total_steps=c.run.steps, sched=c.schedule)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        timer.phase("data")
        bal = self.balancer
        # this data-parallel rank's share of the global batch (balanced: bal.shares[rank] samples)
        x, y = self.data.train.next_batch(shares=bal.shares) if bal else self.data.train.next_batch()
        timer.phase("forward_backward")
        if bal:
            shares = bal.shares
            self.clock.start()
        if self.slow:
            self.slow.burn(x, y)
        if bal:  # same micro-step count on every rank; each micro-batch's loss x n x world / global_batch
            local = pm.forward_backward(x, y, micro_batch=self.micro_batch, sizes=bal.micro_batches(),
                                        loss_scale=bal.loss_scale)
            compute = self.clock.stop()
        else:
            local = pm.forward_backward(x, y, micro_batch=self.micro_batch)
        timer.phase("optimizer")
        grad_norm = pm.clip_grad_norm_(c.train.grad_clip) if c.train.grad_clip > 0 else None
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        timer.phase("comm")
        loss = pm.global_loss(local)  # mean loss of the global batch (one all-reduce)
        if bal:
            decision = bal.step(self.step + 1, compute)  # collective: every rank, every step
        phases = timer.end_step()
        self.step += 1
        extras = {k: v for k, v in COMM.take().items()}
        if bal:
            extras["balance/shares"] = shares  # the shares this step ran with
            extras["balance/compute_s"] = compute  # this (the logging) rank's compute clock
            if decision is not None:
                extras.update(decision.as_metrics())  # speeds, step times, old -> new shares (from next step)
        extras.update(pm.comm_estimate())
        res = StepResult(loss=loss, grad_norm=grad_norm, phases=phases, step_time=time.perf_counter() - t0,
                         tokens=self.tokens_per_step)
        if hasattr(res, "extras"):
            res.extras.update(extras)
        return res

    # ------------------------------------------------------------------ evaluation (collective)
    @torch.no_grad()
    def evaluate(self) -> float:
        import numpy as np

        from trainperf.data.loader import windows_to_batch

        pm, c = self.pm, self.cfg
        self.fail_fast.touch()
        pm.train(False)
        n = len(self.data.val)
        per = c.train.micro_batch
        if pm.schedule is not None:  # the schedule splits each batch into `microbatches` equal chunks
            m = c.parallelism.microbatches
            per = -(-per // m) * m
        total = min(n, per * c.run.eval_batches)
        idx = np.linspace(0, n - 1, total).astype(np.int64)
        losses = []
        for i in range(0, total, per):
            x, y = windows_to_batch(self.data.val.gather(idx[i:i + per]), self.device)
            losses.append(pm.eval_loss(x, y))
        pm.train(True)
        self.fail_fast.touch()
        local = torch.stack(losses).mean()
        return pm.global_loss(local).item()  # host-device sync point

    # ------------------------------------------------------------------ checkpoints (collective, DCP)
    def extra_state(self) -> dict:
        from trainperf.train.state import rng_state

        return {"step": self.step, "schedule": {"step": self.step, "type": self.cfg.schedule.type},
                "data": self.data.train.state_dict(), "rng": rng_state(),
                "config": self.cfg.model_dump(mode="json"), "layout": self.pm.dims.describe(),
                "balance": self.balancer.state_dict() if self.balancer else None}

    def save_checkpoint(self, ckpt_dir) -> Path:
        from trainperf.distributed import checkpoint as dckpt

        self.fail_fast.touch()
        return dckpt.save(ckpt_dir, self.step, self.pm.modules, self.optimizer.optimizers, self.extra_state(),
                          keep=self.cfg.checkpoint.keep)

    def resume(self, resume: str, ckpt_dir) -> int | None:
        """``--resume auto|never|PATH`` on a DCP checkpoint directory (saved on any layout)."""
        import shutil

        import torch.distributed as dist

        from trainperf.distributed import checkpoint as dckpt
        from trainperf.train.loop import _check_resume_compatible
        from trainperf.train.state import set_rng_state

        if resume == "never":
            dist.barrier()
            if self.is_main and Path(ckpt_dir).exists():
                shutil.rmtree(ckpt_dir)
            dist.barrier()
            return None
        path = dckpt.latest(ckpt_dir) if resume == "auto" else Path(resume)
        if path is None:
            return None
        _check_resume_compatible(_peek_config(path), self.cfg.model_dump(mode="json"))
        extra = dckpt.load(path, self.pm.modules, self.optimizer.optimizers)
        self.data.train.load_state_dict(extra["data"])
        if self.balancer and extra.get("balance"):
            self.balancer.load_state_dict(extra["balance"])  # same global batch and ranks: keep the shares
        set_rng_state(extra["rng"])
        self.step = int(extra["step"])
        return self.step


class _ThreadCpuClock:
    """The balancer's compute clock for FSDP2 on CPU: this thread's CPU seconds (no collective waits)."""

    def start(self) -> None:
        self._t0 = time.thread_time()

    def stop(self) -> float:
        return time.thread_time() - self._t0


def _dp_gather(dims, device):
    """The balancer's exchange over the whole world, reduced to one row per data-parallel rank (the
    slowest of its tensor/pipeline ranks), so every rank, whatever its data-parallel group, takes
    the same decisions."""
    import torch.distributed as dist

    world = dist.get_world_size()
    dp_of = [dims.dp_rank(r) for r in range(world)]

    def gather(values: list[float]) -> list[list[float]]:
        local = torch.tensor(values, dtype=torch.float64, device=device)
        out = [torch.empty_like(local) for _ in range(world)]
        dist.all_gather(out, local)
        rows: list = [None] * dims.dp
        for r, t in enumerate(out):
            row, d = t.tolist(), dp_of[r]
            rows[d] = row if rows[d] is None else [max(a, b) for a, b in zip(rows[d], row)]
        return rows

    return gather


def _peek_config(path: Path) -> dict:
    return torch.load(Path(path) / "trainer.pt", map_location="cpu", weights_only=False).get("config", {})


def train_distributed(resolved: Resolved, *, resume: str = "auto", verbose: bool = True) -> dict | None:
    """Run ``fit`` on this rank. Returns the summary on rank 0 (None elsewhere)."""
    from trainperf.data.loader import build_data
    from trainperf.distributed.failure import FailFast
    from trainperf.distributed.init import destroy_distributed, env_world, init_distributed
    from trainperf.distributed.parallelize import parallelize
    from trainperf.models.build import build_model
    from trainperf.train.loop import _seq_len
    from trainperf.train.run import fit
    from trainperf.train.state import seed_everything

    cfg = resolved.cfg
    env = env_world()
    if cfg.run.device == "xla":
        raise ConfigError("run.device=xla runs under torch_xla's launcher, not torchrun; see trainperf/train/xla.py")
    # Validate before any process group or work: degrees x world size, model shape, compression.
    dims = ParallelDims.from_config(cfg, env.world_size)
    from trainperf.config.resolve import model_shape
    from trainperf.distributed.parallel_dims import check_compression

    if cfg.model.entrypoint:  # a user's model: data parallelism only (DDP / FSDP2 / HSDP)
        from trainperf.distributed.parallelize import check_entrypoint_layout

        check_entrypoint_layout(dims)
    else:
        shape = model_shape(cfg)
        dims.validate_model(n_head=shape["n_head"], n_layer=shape["n_layer"], n_embd=shape["n_embd"],
                            interleave=cfg.parallelism.interleave if dims.pp_enabled else 1)
    p = cfg.parallelism
    check_compression(p.compression.type, dp_replicate=dims.dp_replicate, dp_shard=dims.dp_shard, tp=dims.tp,
                      pp=dims.pp)

    device = torch.device(cfg.run.device, env.local_rank) if cfg.run.device == "cuda" else torch.device(cfg.run.device)
    env = init_distributed(backend=cfg.distributed.backend, device_type=device.type,
                           timeout_s=cfg.distributed.timeout_s, flight_recorder=cfg.distributed.flight_recorder)
    ff = FailFast(env.rank, env.world_size, cfg.distributed.timeout_s)
    try:
        with ff.guard():
            torch.set_num_threads(int(cfg.run.threads))
            seed_everything(cfg.run.seed)
            seq_len = _seq_len(cfg)
            data = build_data(cfg, seq_len=seq_len, device=device, dp_rank=dims.dp_rank(env.rank), dp_world=dims.dp,
                              verbose=verbose and env.is_main)
            if cfg.model.entrypoint:
                from trainperf.distributed.parallelize import parallelize_data_parallel

                model = build_model(cfg, data_vocab=data.vocab_size, device=device)  # the user's, initialized
                pm = parallelize_data_parallel(model, cfg, dims, rank=env.rank, device=device, seq_len=seq_len)
            else:
                meta = build_model(cfg, data_vocab=data.vocab_size, device=device, materialize=False)
                pm = parallelize(meta, cfg, dims, rank=env.rank, device=device, seq_len=seq_len)
            notes = dict(resolved.notes)
            notes.update({k: str(v) for k, v in pm.notes.items()})
            trainer = DistributedTrainer(cfg=cfg, model=pm.parts[0], eager_model=pm.modules[0], data=data,
                                         device=device, notes=notes, dp_rank=dims.dp_rank(env.rank),
                                         dp_world=dims.dp, is_main=env.is_main, pm=pm, fail_fast=ff)
            summary = fit(trainer, resume=resume, verbose=verbose)
    finally:
        ff.close()
    destroy_distributed()
    return summary if env.is_main else None
