"""The training loop: a straight line of small named steps.

    setup:  resolve config -> seed -> data -> model (meta -> materialize) -> optimizations
            (activation checkpointing -> compile) -> optimizer, precision -> resume
    step:   data wait | forward | backward (x accumulation) | optimizer      (timed per phase)
    around: log every k steps, evaluate, checkpoint (atomic), summary.json at the end
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from trainperf.config.resolve import Resolved
from trainperf.config.schema import Config
from trainperf.errors import CheckpointError, ConfigError
from trainperf.monitor.phases import PhaseTimer
from trainperf.train.optim import build_optimizer, lr_at
from trainperf.train.precision import build_precision
from trainperf.train.state import rng_state, seed_everything, set_rng_state

# Sections whose change makes a checkpoint meaningless for this run.
_RESUME_KEYS = ("model", "data.source", "data.path", "train.global_batch")


@dataclass
class StepResult:
    loss: torch.Tensor  # mean loss of the global batch on this rank (not yet synced to host)
    grad_norm: torch.Tensor | None
    phases: dict[str, float]
    step_time: float
    tokens: int
    extras: dict = field(default_factory=dict)  # backend figures for metrics.jsonl (XLA: compilations, shape)


@dataclass
class Trainer:
    cfg: Config
    model: nn.Module  # what runs forward (possibly compiled)
    eager_model: nn.Module  # the plain module: state_dict, eval, generation
    data: Any
    device: torch.device
    notes: dict[str, str] = field(default_factory=dict)
    dp_rank: int = 0
    dp_world: int = 1
    is_main: bool = True

    def __post_init__(self):
        c = self.cfg
        self.optimizer = build_optimizer(self.eager_model, c.optimizer)
        self.precision = build_precision(c.precision.dtype, self.device.type, c.precision.init_scale)
        self.local_batch = c.train.global_batch // self.dp_world
        if self.local_batch % c.train.micro_batch:
            raise ConfigError(
                f"per-rank batch {self.local_batch} is not divisible by train.micro_batch={c.train.micro_batch}"
            )
        self.accum = self.local_batch // c.train.micro_batch
        self.timer = PhaseTimer(self.device.type)
        self.step = 0  # optimizer steps done
        self._compile_checked = not c.compile.enabled
        self.tokens_per_step = c.train.global_batch * self.data.seq_len

    # ------------------------------------------------------------------ one step
    def train_step(self) -> StepResult:
        c, timer = self.cfg, self.timer
        t0 = time.perf_counter()
        timer.start_step()
        lr = lr_at(self.step, peak=c.optimizer.lr, total_steps=c.run.steps, sched=c.schedule)
        for group in self.optimizer.param_groups:
            group["lr"] = lr

        timer.phase("data")
        x, y = self.data.train.next_batch()  # (local_batch, T) each
        loss_sum = torch.zeros((), device=self.device)
        for i in range(self.accum):
            mx = x[i * c.train.micro_batch:(i + 1) * c.train.micro_batch]
            my = y[i * c.train.micro_batch:(i + 1) * c.train.micro_batch]
            if not self._compile_checked:
                loss = self._first_compiled_micro_step(mx, my)
            else:
                timer.phase("forward")
                with self.precision.autocast():
                    _, loss = self.model(mx, my)
                loss = loss / self.accum  # mean over the local batch
                timer.phase("backward")
                self._backward(loss)
            loss_sum += loss.detach()

        timer.phase("optimizer")
        grad_norm = self._optimizer_step()
        phases = timer.end_step()
        self.step += 1
        return StepResult(loss=loss_sum, grad_norm=grad_norm, phases=phases,
                          step_time=time.perf_counter() - t0, tokens=self.tokens_per_step)

    def _backward(self, loss: torch.Tensor) -> None:
        scaler = self.precision.scaler
        (scaler.scale(loss) if scaler else loss).backward()

    def _optimizer_step(self) -> torch.Tensor | None:
        scaler, clip = self.precision.scaler, self.cfg.train.grad_clip
        if scaler:
            scaler.unscale_(self.optimizer)
        grad_norm = None
        if clip > 0:
            grad_norm = torch.nn.utils.clip_grad_norm_(self.eager_model.parameters(), clip)
        if scaler:
            scaler.step(self.optimizer)
            scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return grad_norm

    def _first_compiled_micro_step(self, mx, my) -> torch.Tensor:
        """Run the first micro-step compiled; on a compile failure warn and continue eagerly."""
        self._compile_checked = True
        t0 = time.perf_counter()
        try:
            with self.precision.autocast():
                _, loss = self.model(mx, my)
            loss = loss / self.accum
            self._backward(loss)
            self.notes["compile"] = f"compiled; first step took {time.perf_counter() - t0:.1f}s"
            return loss
        except Exception as exc:  # noqa: BLE001 - any compiler failure falls back
            reason = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
            warnings.warn(f"torch.compile failed ({reason}); continuing in eager mode", stacklevel=2)
            self.notes["compile"] = f"fell back to eager: {reason}"
            self.optimizer.zero_grad(set_to_none=True)
            self.model = self.eager_model
            with self.precision.autocast():
                _, loss = self.model(mx, my)
            loss = loss / self.accum
            self._backward(loss)
            return loss

    # ------------------------------------------------------------------ evaluation
    @torch.no_grad()
    def evaluate(self) -> float:
        """Mean loss over ``run.eval_batches`` fixed validation micro-batches (evenly spaced windows)."""
        import numpy as np

        from trainperf.data.loader import windows_to_batch

        model, c = self.eager_model, self.cfg
        was_training = model.training
        model.eval()
        n = len(self.data.val)
        per = c.train.micro_batch
        total = min(n, per * c.run.eval_batches)
        idx = np.linspace(0, n - 1, total).astype(np.int64)
        losses = []
        for i in range(0, total, per):
            x, y = windows_to_batch(self.data.val.gather(idx[i:i + per]), self.device)
            with self.precision.autocast():
                _, loss = model(x, y)
            losses.append(loss.float())
        model.train(was_training)
        return torch.stack(losses).mean().item()  # host-device sync point

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict:
        return {
            "step": self.step,
            "model": self.eager_model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scaler": self.precision.scaler.state_dict() if self.precision.scaler else None,
            "schedule": {"step": self.step, "type": self.cfg.schedule.type},
            "data": self.data.train.state_dict(),
            "rng": rng_state(),
            "config": self.cfg.model_dump(mode="json"),
        }

    def load_state_dict(self, state: dict) -> None:
        _check_resume_compatible(state.get("config", {}), self.cfg.model_dump(mode="json"))
        self.eager_model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.precision.scaler and state.get("scaler"):
            self.precision.scaler.load_state_dict(state["scaler"])
        self.data.train.load_state_dict(state["data"])
        set_rng_state(state["rng"])
        self.step = int(state["step"])


def _get(d: dict, dotted: str):
    for part in dotted.split("."):
        d = d.get(part, {}) if isinstance(d, dict) else {}
    return d


def _check_resume_compatible(saved: dict, current: dict) -> None:
    for key in _RESUME_KEYS:
        if _get(saved, key) != _get(current, key):
            raise CheckpointError(
                f"the checkpoint was written with {key}={_get(saved, key)!r} but this run has {_get(current, key)!r}; "
                "resume with the same setting, or start over with --resume never (or another run.dir)"
            )


# ---------------------------------------------------------------------- setup
def build_trainer(resolved: Resolved, *, verbose: bool = True) -> Trainer:
    from trainperf.data.loader import build_data
    from trainperf.models.build import build_model

    cfg = resolved.cfg
    if cfg.run.device == "xla":  # XLA device, one graph per step, torch_xla collectives: trainperf/train/xla.py
        from trainperf.train.xla import build_xla_trainer

        return build_xla_trainer(resolved, verbose=verbose)
    torch.set_num_threads(int(cfg.run.threads))
    seed_everything(cfg.run.seed)
    device = torch.device(cfg.run.device)
    seq_len = _seq_len(cfg)
    data = build_data(cfg, seq_len=seq_len, device=device, verbose=verbose)
    model = build_model(cfg, data_vocab=data.vocab_size, device=device)
    model.train()
    eager = model
    model = apply_optimizations(model, cfg)
    return Trainer(cfg=cfg, model=model, eager_model=eager, data=data, device=device, notes=dict(resolved.notes))


def _seq_len(cfg: Config) -> int:
    from trainperf.config.resolve import model_shape

    if cfg.model.entrypoint:
        return cfg.model.block_size or 128
    return model_shape(cfg)["block_size"]


def apply_optimizations(model: nn.Module, cfg: Config) -> nn.Module:
    """In this fixed order: activation checkpointing -> compile. (Parallelism wraps around these.)
    Returns the module that runs forward; parameters are shared with ``model``."""
    ac = cfg.memory.checkpointing
    if ac.mode != "none":
        from trainperf.memory.ac import apply_ac

        apply_ac(model, ac, micro_batch=cfg.train.micro_batch, seq_len=_seq_len(cfg), dtype=cfg.precision.dtype,
                 optimizer=cfg.optimizer.type)
    if cfg.compile.enabled:
        if cfg.compile.regional:
            for name, block in _blocks(model):
                block.compile(mode=cfg.compile.mode, fullgraph=cfg.compile.fullgraph, backend=cfg.compile.backend)
            return model
        return torch.compile(model, mode=cfg.compile.mode, fullgraph=cfg.compile.fullgraph, backend=cfg.compile.backend)
    return model


def _blocks(model: nn.Module):
    layers = getattr(model, "layers", None)
    if isinstance(layers, (nn.ModuleDict, nn.ModuleList)):
        return list(layers.named_children())
    return []


def run_dir_of(cfg: Config) -> Path:
    return Path(cfg.run_dir())
