"""The trainer: one step body for every world size and backend.

    train_step:  set the LR (a pure function of the step) | take this rank's share of the global
                 batch (the balancer's share when balancing) | forward/backward over the
                 ParallelModel (accumulation, or the pipeline schedule; loss scaling) | reduce
                 gradients the backend's way | clip | optimizer step | mean loss of the global batch
    evaluate:    mean loss over fixed validation batches (collective when distributed)
    state:       extra_state / load_extra_state (step, loader position, RNG, scaler, balancer);
                 the Checkpointer adds model and optimizer states

What differs per run was chosen when the trainer was built (:func:`trainperf.train.build.build_trainer`)
and is passed in as objects: the ParallelModel (one process is the layout where every degree is 1),
the Backend (eager CPU/CUDA or XLA), the Checkpointer (one file, or sharded DCP), the heartbeat
(fail-fast reports when distributed) and the test knobs (a slowed rank).
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field

import torch

from trainperf.errors import ConfigError
from trainperf.monitor.phases import PhaseTimer
from trainperf.train.optim import build_optimizer, lr_at
from trainperf.train.precision import build_precision
from trainperf.train.state import rng_state, set_rng_state


@dataclass
class StepResult:
    loss: torch.Tensor  # mean loss of the global batch (not yet synced to host)
    grad_norm: torch.Tensor | None
    phases: dict[str, float]
    step_time: float
    tokens: int
    lr: float = 0.0  # the learning rate this step used
    extras: dict = field(default_factory=dict)  # figures for metrics.jsonl (bytes on the wire, balancer, XLA)


class NoHeartbeat:
    """One process: nobody to report to."""

    def beat(self, step: int) -> None:
        pass

    def touch(self) -> None:
        pass


class OptimizerSet:
    """One optimizer per model part (pipeline stages held by one rank); ``param_groups`` lists all of
    them, so setting a group's ``lr`` works as for one optimizer."""

    def __init__(self, optimizers: list[torch.optim.Optimizer]):
        self.optimizers = optimizers

    @property
    def param_groups(self) -> list[dict]:
        return [g for o in self.optimizers for g in o.param_groups]

    def zero_grad(self, set_to_none: bool = True) -> None:
        for o in self.optimizers:
            o.zero_grad(set_to_none=set_to_none)


class Trainer:
    def __init__(self, cfg, pm, data, backend, checkpointer, *, notes: dict | None = None, heartbeat=None,
                 slow=None):
        from trainperf.distributed.optim import split_by_placement

        c = self.cfg = cfg
        self.pm, self.data, self.backend, self.checkpointer = pm, data, backend, checkpointer
        self.notes = dict(notes or {})
        self.heartbeat = heartbeat or NoHeartbeat()
        self.slow = slow  # trainperf.distributed.slow.SlowRank (a test/benchmark knob) or None
        self.dp_rank, self.dp_world = backend.data_parallel(pm.dims, pm.rank)
        self.is_main = pm.rank == 0 and self.dp_rank == 0
        self.optimizer = OptimizerSet([split_by_placement(build_optimizer(m, c.optimizer)) for m in pm.modules])
        self.precision = build_precision(c.precision.dtype, self.device.type, c.precision.init_scale)
        if self.precision.scaler is not None and pm.dims.distributed:
            raise ConfigError("precision.dtype='fp16' (loss scaling) is not supported in distributed runs yet; "
                              "use precision.dtype=bf16 or fp32")
        pm.autocast = self.precision.autocast
        if slow is not None:
            slow.autocast = self.precision.autocast
        self.local_batch = c.train.global_batch // self.dp_world
        # a micro-batch above this rank's share trains as the share (resolve() notes it)
        self.micro_batch = min(c.train.micro_batch, self.local_batch)
        if self.local_batch % self.micro_batch:
            raise ConfigError(f"per-rank batch {self.local_batch} is not divisible by train.micro_batch="
                              f"{self.micro_batch}; see `trainperf config show` for the batch arithmetic")
        self.accum = 1 if pm.schedule is not None else self.local_batch // self.micro_batch
        pm.accum_hint = self.accum
        self.timer = PhaseTimer(self.device.type)
        self.step = 0  # optimizer steps done
        self.tokens_per_step = c.train.global_batch * data.seq_len
        self._compile_pending = bool(c.compile.enabled)  # the first step compiles (its own phase)
        self.balancer = self.clock = None
        self._fixed_clock = lambda: 0.0
        self._window: list = []  # this rank's (compute, cpu) seconds per step since the last exchange
        if pm.dims.distributed:
            self._build_clock()
        self._oom_events: list[dict] = []
        if c.train.on_oom == "halve_micro_batch":
            if pm.schedule is not None:
                raise ConfigError("train.on_oom=halve_micro_batch does not apply to pipeline parallelism (the schedule "
                                  "splits each batch into parallelism.microbatches); lower train.micro_batch or raise "
                                  "parallelism.microbatches instead")
            if pm.dims.distributed:
                pm.oom_agree = oom_agreement(self.device)
                if pm.dims.fsdp_enabled or pm.dims.tp_enabled:
                    self.notes["on_oom"] = (
                        "FSDP2 / tensor parallelism gather inside the forward: an OOM partway through one cannot be "
                        "agreed on (the other ranks wait in the next gather); the collective timeout then ends the job "
                        "with the fail-fast report. Under DDP every forward OOM is agreed on and recovered.")

    # ------------------------------------------------------------------ properties
    @property
    def device(self) -> torch.device:
        return self.pm.device

    @property
    def model(self) -> torch.nn.Module:
        """The plain module (full model's FQNs): state dicts, evaluation, generation, FLOP counting."""
        return self.pm.modules[0]

    @property
    def can_sample(self) -> bool:
        return not self.pm.dims.distributed  # generation would need every rank of a sharded model

    def _build_clock(self) -> None:
        """This rank's compute clock: forward+backward without waiting for the others (the balancer's
        input and the straggler diagnosis's evidence), on every rank of a distributed run."""
        from trainperf.distributed.balance import ComputeClock, DynamicBalancer, ThreadCpuClock

        pm, c, dims = self.pm, self.cfg, self.pm.dims
        # FSDP2's all-gathers, tensor parallelism's all-reduces inside every layer and the pipeline's
        # sends/receives wait for slower ranks inside forward/backward, which ComputeClock (wall time to the last
        # gradient) would count; on CPU this thread's CPU time leaves those waits out (gloo waits without spinning).
        cpu_thread = (pm.kind == "fsdp" or dims.tp_enabled or dims.pp_enabled) and self.device.type == "cpu"
        self.clock = ThreadCpuClock() if cpu_thread else ComputeClock(pm.modules[0], self.device.type)
        self.clock_name = "thread_cpu" if cpu_thread else ("cuda_events" if self.device.type == "cuda" else "wall_to_last_grad")
        if self.dp_world < 2:
            return  # no data-parallel peers: the clock is the straggler evidence only (no balancer, no fixed time)
        # the balancer's fixed time (data + optimizer, which a rank's share does not scale): the compute clock's
        # kind on CPU; on CUDA the optimizer's kernels run asynchronously (identical GPUs: nothing to model)
        self._fixed_clock = (time.thread_time if cpu_thread else time.perf_counter) if self.device.type == "cpu" \
            else (lambda: 0.0)
        if c.parallelism.balance.enabled:  # parallelism.balance: per-rank shares of the global batch
            self.balancer = DynamicBalancer.from_config(
                c.parallelism.balance, c.train.global_batch, micro_steps=self.accum, world=self.dp_world,
                rank=self.dp_rank, gather=dp_gather(pm.dims, self.device), device=self.device)

    # ------------------------------------------------------------------ one step
    def train_step(self, shares: list[int] | None = None) -> StepResult:
        """One optimizer step. ``shares`` (per data rank samples) overrides the balancer's for this
        step and is not fed to it (the balance benchmark's unbalanced blocks)."""
        c, timer, pm, bal = self.cfg, self.timer, self.pm, self.balancer
        t0 = time.perf_counter()
        self.heartbeat.beat(self.step)
        timer.start_step()
        self.backend.begin_step()
        lr = lr_at(self.step, peak=c.optimizer.lr, total_steps=c.run.steps, sched=c.schedule)
        for group in self.optimizer.param_groups:
            group["lr"] = lr

        timer.phase("data")
        fixed_clock = self._fixed_clock
        f0 = fixed_clock()
        forced = shares is not None
        if bal is not None and not forced:
            shares = bal.shares
        x, y = self.data.train.next_batch(shares=shares) if shares else self.data.train.next_batch()  # (local, T)
        fixed = fixed_clock() - f0

        compiling, self._compile_pending = self._compile_pending, False
        timer.phase("compile" if compiling else "forward")
        if self.clock is not None:
            self.clock.start()
            cpu0 = time.process_time()
        if self.slow is not None:
            self.slow.burn(x, y)
        kw = {"micro_batch": self.micro_batch, "backward": self._backward,
              "phase": None if compiling else timer.phase}
        if shares and bal is not None:  # same micro-step count on every rank; loss x n x world / global_batch
            from trainperf.distributed.balance import micro_batch_sizes

            kw.update(sizes=micro_batch_sizes(x.shape[0], bal.policy.micro_steps), loss_scale=bal.loss_scale)
        local = self._forward_backward(x, y, kw, compiling)
        compute = cpu = None
        if self.clock is not None:
            # balancing reads the clock now (its exchange syncs anyway); otherwise it is read once per log
            # interval (rank_compute), so a CUDA run does not sync with the host every step for it
            reading = self.clock.stop_later() if bal is None else None
            compute = reading if bal is None else self.clock.stop()
            cpu = time.process_time() - cpu0
            self._window.append((reading or (lambda v=compute: v), cpu))

        timer.phase("optimizer")
        f1 = fixed_clock()
        self.backend.reduce_gradients(self.optimizer)
        grad_norm = self._optimizer_step()
        fixed += fixed_clock() - f1  # data + optimizer: this rank's time that its share does not scale
        timer.phase("comm")
        loss = pm.global_loss(local)  # mean loss of the global batch (one all-reduce when distributed)
        # collective; the step's wall time so far is the balancer's verdict on a move it is trying
        decision = bal.step(self.step + 1, compute, fixed, time.perf_counter() - t0) if (bal is not None and not forced) \
            else None
        extras = self.backend.end_step(self.data)
        phases = timer.end_step()
        self.step += 1
        extras.update(pm.comm_figures())
        if self._oom_events:  # oom/*: the micro-batch change(s) this step made, as one record
            first, last = self._oom_events[0], self._oom_events[-1]
            extras.update({**last, "oom/old_micro_batch": first["oom/old_micro_batch"],
                           "oom/halvings": len(self._oom_events)})
            self._oom_events = []
        if bal is not None:
            extras["balance/shares"] = shares  # the shares this step ran with
            extras["balance/compute_s"] = compute  # this (the logging) rank's compute clock
            extras["balance/fixed_s"] = fixed  # and its data + optimizer time
            if decision is not None:
                extras.update(decision.as_metrics())  # speeds, step times, old -> new shares (from next step)
        return StepResult(loss=loss, grad_norm=grad_norm, phases=phases, step_time=time.perf_counter() - t0,
                          tokens=self.tokens_per_step, lr=lr, extras=extras)

    def _forward_backward(self, x, y, kw: dict, compiling: bool) -> torch.Tensor:
        """The step's forward/backward; with ``train.on_oom: halve_micro_batch`` an out-of-memory step is
        freed and run again on the same batch with half the micro-batch (twice the accumulation)."""
        from trainperf.distributed.parallelize import StepOOM, is_oom

        while True:
            try:
                if compiling:
                    return self._compiled_first(x, y, kw)
                return self.pm.forward_backward(x, y, **kw)
            except Exception as exc:  # noqa: BLE001 - only out-of-memory errors are recovered
                if not (isinstance(exc, StepOOM) or is_oom(exc)) or self.cfg.train.on_oom != "halve_micro_batch":
                    raise
                self._shrink(exc, kw)

    def _shrink(self, exc: BaseException, kw: dict) -> None:
        """Free what the failed step held, halve the micro-batch (every rank took the same decision: the
        agreement in ParallelModel.forward_backward), double the accumulation; the global batch stays."""
        import gc

        old = self.micro_batch
        if old <= 1 or self.local_batch % (old // 2):
            raise exc  # nothing smaller keeps the global batch: the original error stands
        self.optimizer.zero_grad(set_to_none=True)  # gradients of the abandoned micro-steps
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        self.micro_batch = old // 2
        self.accum = self.local_batch // self.micro_batch
        self.pm.accum_hint = self.accum
        kw["micro_batch"] = self.micro_batch
        if "sizes" in kw:  # balancing: the same number of micro-steps on every rank, twice as many
            from trainperf.distributed.balance import micro_batch_sizes

            self.balancer.policy.micro_steps *= 2
            kw["sizes"] = micro_batch_sizes(sum(kw["sizes"]), self.balancer.policy.micro_steps)
        reason = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        event = {"oom/step": self.step, "oom/old_micro_batch": old, "oom/new_micro_batch": self.micro_batch,
                 "oom/accumulation": self.accum, "oom/reason": reason}
        self._oom_events.append(event)
        self.notes["on_oom"] = (f"out of memory at step {self.step} with micro-batch {old}: continued with "
                                f"{self.micro_batch} x {self.accum} accumulation (global batch unchanged)")
        warnings.warn(f"step {self.step}: out of memory with micro-batch {old} ({reason}); retrying the step with "
                      f"micro-batch {self.micro_batch} and accumulation {self.accum}", stacklevel=3)

    def _backward(self, loss: torch.Tensor) -> None:
        scaler = self.precision.scaler
        (scaler.scale(loss) if scaler else loss).backward()

    def _optimizer_step(self) -> torch.Tensor | None:
        scaler, clip = self.precision.scaler, self.cfg.train.grad_clip
        if scaler:
            for o in self.optimizer.optimizers:
                scaler.unscale_(o)
        grad_norm = self.pm.clip_grad_norm_(clip) if clip > 0 else None
        for o in self.optimizer.optimizers:
            scaler.step(o) if scaler else o.step()
        if scaler:
            scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        return grad_norm

    def _compiled_first(self, x, y, kw) -> torch.Tensor:
        """The first step runs compiled (booked as the ``compile`` phase); on a compile failure warn and
        continue eagerly."""
        t0 = time.perf_counter()
        try:
            local = self.pm.forward_backward(x, y, **kw)
            self.notes["compile"] = f"compiled; first step took {time.perf_counter() - t0:.1f}s"
            return local
        except Exception as exc:  # noqa: BLE001 - any compiler failure falls back
            reason = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
            warnings.warn(f"torch.compile failed ({reason}); continuing in eager mode", stacklevel=2)
            self.notes["compile"] = f"fell back to eager: {reason}"
            self.optimizer.zero_grad(set_to_none=True)
            self.pm.uncompile()
            return self.pm.forward_backward(x, y, **kw)

    # ------------------------------------------------------------------ per-rank compute (straggler evidence)
    def rank_compute(self) -> dict | None:
        """Each data rank's mean compute and CPU seconds per step since the last call (``rank_compute_s``,
        ``rank_cpu_s``: the slowest of its tensor/pipeline ranks) and, under tensor or pipeline parallelism,
        each global rank's (``rank_compute_by_rank_s``, ``rank_cpu_by_rank_s``) with the groups that wait
        for each other (``rank_groups``: :func:`rank_groups`). Collective when distributed (one all-gather;
        every rank calls at the same steps); None in one process."""
        if self.clock is None:
            return None
        n = max(1, len(self._window))
        mine = [sum(w[0]() for w in self._window) / n, sum(w[1] for w in self._window) / n]  # host sync on CUDA
        self._window = []
        dims = self.pm.dims
        ranks = world_gather(self.device)(mine)
        out: dict = {"rank_clock": self.clock_name}
        if dims.dp > 1:
            rows = dp_rows(dims, ranks)
            out.update(rank_compute_s=[r[0] for r in rows], rank_cpu_s=[r[1] for r in rows])
        if dims.tp_enabled or dims.pp_enabled:
            out.update(rank_compute_by_rank_s=[r[0] for r in ranks], rank_cpu_by_rank_s=[r[1] for r in ranks],
                       rank_groups=rank_groups(dims, self._virtual_stages()))
        return out

    def _virtual_stages(self) -> int:
        """Pipeline stages each pipeline rank holds (interleaved schedules: parallelism.interleave)."""
        p = self.cfg.parallelism
        return p.interleave if (self.pm.dims.pp_enabled and p.pipeline_schedule == "interleaved_1f1b") else 1

    # ------------------------------------------------------------------ evaluation (collective when distributed)
    @torch.no_grad()
    def evaluate(self) -> float:
        """Mean loss over ``run.eval_batches`` fixed validation micro-batches (evenly spaced windows)."""
        import numpy as np

        from trainperf.data.loader import windows_to_batch

        pm, c = self.pm, self.cfg
        self.heartbeat.touch()
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
        self.heartbeat.touch()
        return pm.global_loss(torch.stack(losses).mean()).item()  # host-device sync point

    # ------------------------------------------------------------------ checkpoints (the Checkpointer's)
    def save_checkpoint(self):
        self.heartbeat.touch()
        return self.checkpointer.save(self)

    def resume(self, mode: str) -> int | None:
        """``--resume auto | never | PATH``: the step resumed from, or None for a fresh start."""
        return self.checkpointer.resume(self, mode)

    def extra_state(self) -> dict:
        """Everything but the model and optimizer states (those are the Checkpointer's)."""
        rng = rng_state()
        rng.update(self.backend.rng_extra())
        return {"step": self.step, "schedule": {"step": self.step, "type": self.cfg.schedule.type},
                "scaler": self.precision.scaler.state_dict() if self.precision.scaler else None,
                "data": self.data.train.state_dict(), "rng": rng, "config": self.cfg.model_dump(mode="json"),
                "layout": self.pm.dims.describe(),
                "balance": self.balancer.state_dict() if self.balancer else None}

    def load_extra_state(self, state: dict) -> None:
        if self.precision.scaler and state.get("scaler"):
            self.precision.scaler.load_state_dict(state["scaler"])
        self.data.train.load_state_dict(state["data"])
        if self.balancer and state.get("balance"):
            self.balancer.load_state_dict(state["balance"])  # same global batch and ranks: keep the shares
        set_rng_state(state["rng"])
        self.backend.load_rng_extra(state["rng"])
        self.step = int(state["step"])
        self.backend.after_load()


def world_gather(device):
    """``gather(values) -> one row per global rank``: an all-gather of each rank's floats over the world."""
    import torch.distributed as dist

    def gather(values: list[float]) -> list[list[float]]:
        local = torch.tensor(values, dtype=torch.float64, device=device)
        out = [torch.empty_like(local) for _ in range(dist.get_world_size())]
        dist.all_gather(out, local)
        return [t.tolist() for t in out]

    return gather


def dp_rows(dims, ranks: list[list[float]]) -> list[list[float]]:
    """Rows per global rank reduced to one per data-parallel rank (the slowest of its tensor/pipeline ranks)."""
    rows: list = [None] * dims.dp
    for r, row in enumerate(ranks):
        d = dims.dp_rank(r)
        rows[d] = row if rows[d] is None else [max(a, b) for a, b in zip(rows[d], row)]
    return rows


def dp_gather(dims, device):
    """An exchange over the whole world reduced to one row per data-parallel rank (the slowest of its
    tensor/pipeline ranks), so every rank, whatever its data-parallel group, sees the same rows."""
    gather = world_gather(device)
    return lambda values: dp_rows(dims, gather(values))


def rank_groups(dims, virtual_stages: int = 1) -> dict:
    """The ranks that wait for each other inside a step, by global rank: ``tensor`` (each tensor-parallel
    group: their collectives run inside every layer), ``pipeline`` (per pipeline rank, the ranks at that
    place of the pipeline) and ``stages`` (per pipeline rank, the schedule's stage indices it holds)."""
    tensor: dict[tuple, list[int]] = {}
    pipeline: list[list[int]] = [[] for _ in range(dims.pp)]
    for r in range(dims.world_size):
        c = dims.coords(r)
        tensor.setdefault((c["pp"], c["dp"]), []).append(r)
        pipeline[c["pp"]].append(r)
    return {"tensor": list(tensor.values()) if dims.tp_enabled else [],
            "pipeline": pipeline if dims.pp_enabled else [],
            "stages": [[p + k * dims.pp for k in range(virtual_stages)] for p in range(dims.pp)] if dims.pp_enabled
            else []}


def oom_agreement(device):
    """``agree(local_failed) -> any rank failed``: one all-reduce (max) of a flag over the world."""
    import torch.distributed as dist

    def agree(failed: bool) -> bool:
        flag = torch.tensor([1.0 if failed else 0.0], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())  # host sync: only with train.on_oom=halve_micro_batch

    return agree
