"""The trainer on an XLA device (``run.device: xla``): the same loop, cut into one XLA graph per step.

What differs from the eager trainer, and why:

* the model is built and initialized on the CPU, then moved: parameters start identical to an
  eager CPU run with the same seed (XLA's random generator differs from the CPU one);
* batches arrive through :class:`~trainperf.xla.loader.XlaDeviceLoader` (torch_xla's
  ParallelLoader uploading ahead of use), with an exact data position for resume;
* the optimizer step all-reduces gradients through torch_xla's collectives when several XLA
  processes run, then ``torch_xla.sync()`` ends the step: the step's graph is compiled (once
  per distinct graph) and launched;
* each step's result carries XLA's figures (compilations, compile and execute time, the batch
  shape) for metrics.jsonl and the ``xla_recompile`` rule;
* checkpoints hold CPU tensors: they load on a CPU-only machine and back onto XLA.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from trainperf.config.resolve import Resolved
from trainperf.train.loop import StepResult, Trainer
from trainperf.xla import runtime


@dataclass
class XlaTrainer(Trainer):
    def train_step(self) -> StepResult:
        from trainperf.monitor.xla import compile_count, step_metrics

        before = compile_count()
        res = super().train_step()  # ends with _optimizer_step -> torch_xla.sync()
        extras = step_metrics()
        extras["xla_step_compiles"] = extras["xla_compiles"] - before
        shape = getattr(self.data.train, "last_shape", None)
        if shape is not None:
            extras["xla_batch_shape"] = list(shape)
        res.extras.update(extras)
        return res

    def _optimizer_step(self) -> torch.Tensor | None:
        if self.dp_world > 1:
            self.timer.phase("comm")
            runtime.reduce_gradients(self.optimizer)  # all-reduce (mean) through torch_xla's collectives
            self.timer.phase("optimizer")
        grad_norm = super()._optimizer_step()
        runtime.sync()  # step boundary: compile (cached after warm-up) and launch this step's graph
        return grad_norm

    def state_dict(self) -> dict:
        state = runtime.to_cpu(super().state_dict())  # device -> host copies: loadable without torch_xla
        state["rng"]["xla_seed"] = runtime.rng_seed()
        return state

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)  # parameters and optimizer state are copied onto the XLA device
        seed = state.get("rng", {}).get("xla_seed")
        if seed is not None:
            runtime.set_seed(int(seed))
        runtime.sync()


def build_xla_trainer(resolved: Resolved, *, verbose: bool = True) -> XlaTrainer:
    """``build_trainer`` for ``run.device: xla`` (same order: seed -> data -> model -> optimizations)."""
    from trainperf.data.loader import build_data
    from trainperf.models.build import build_model
    from trainperf.train.loop import _seq_len, apply_optimizations
    from trainperf.train.state import seed_everything
    from trainperf.xla.loader import XlaDeviceLoader

    cfg = resolved.cfg
    device = runtime.device()
    torch.set_num_threads(int(cfg.run.threads))
    seed_everything(cfg.run.seed)
    world, rank = runtime.world_size(), runtime.ordinal()
    runtime.set_seed(cfg.run.seed + rank)
    data = build_data(cfg, seq_len=_seq_len(cfg), device=torch.device("cpu"), dp_rank=rank, dp_world=world,
                      verbose=verbose and rank == 0)
    data.train = XlaDeviceLoader(data.train, device)
    model = build_model(cfg, data_vocab=data.vocab_size, device="cpu").to(device)  # CPU init = eager CPU init
    model.train()
    eager = model
    model = apply_optimizations(model, cfg)
    notes = dict(resolved.notes)
    notes["xla"] = f"{device} ({_device_kind()}), {world} XLA process(es)"
    return XlaTrainer(cfg=cfg, model=model, eager_model=eager, data=data, device=device, notes=notes,
                      dp_rank=rank, dp_world=world, is_main=rank == 0)


def _device_kind() -> str:
    try:
        import torch_xla.runtime as xr

        return str(xr.device_type())
    except Exception:  # noqa: BLE001
        return "unknown"


def cpu_model(trainer: Trainer) -> nn.Module:
    """A CPU copy of the trained model (text generation changes the shape every token: on XLA each
    length would compile its own graph)."""
    import copy

    model = copy.deepcopy(trainer.eager_model).to("cpu")
    return model
