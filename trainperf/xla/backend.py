"""The trainer's backend on an XLA device (``run.device: xla``): one XLA graph per step.

What differs from eager, and why:

* the model is built and initialized on the CPU, then moved: parameters start identical to an
  eager CPU run with the same seed (XLA's random generator differs from the CPU one);
* batches arrive through :class:`~trainperf.xla.loader.XlaDeviceLoader` (torch_xla's
  ParallelLoader uploading ahead of use), with an exact data position for resume;
* data parallelism over XLA processes: the gradients are all-reduced through torch_xla's
  collectives before the optimizer step (not by DDP), then ``torch_xla.sync()`` ends the step:
  the step's graph is compiled (once per distinct graph) and launched;
* each step's record carries XLA's figures (compilations, compile and execute time, the batch
  shape) for metrics.jsonl and the ``xla_recompile`` rule;
* checkpoints hold CPU tensors: they load on a CPU-only machine and back onto XLA; text samples
  are generated from a CPU copy (each generated length would compile its own graph).
"""

from __future__ import annotations

import copy

import torch
import torch.nn as nn

from trainperf.xla import runtime


class XlaBackend:
    name = "xla"

    def __init__(self):
        self.device = runtime.device()
        self.world, self.rank = runtime.world_size(), runtime.ordinal()
        self._compiles_before = 0

    build_device = torch.device("cpu")  # CPU init = eager CPU init
    data_device = torch.device("cpu")  # the XLA loader uploads

    def data_parallel(self, dims, rank: int) -> tuple[int, int]:
        return self.rank, self.world

    def seed(self, seed: int, rank: int) -> None:
        runtime.set_seed(seed + self.rank)

    def wrap_loader(self, loader):
        from trainperf.xla.loader import XlaDeviceLoader

        return XlaDeviceLoader(loader, self.device)

    def place(self, pm) -> None:
        for m in pm.modules:
            m.to(self.device)  # in place: parameters keep their identity (optimizer built after)
        pm.device = self.device

    @property
    def notes(self) -> dict:
        try:
            import torch_xla.runtime as xr

            kind = str(xr.device_type())
        except Exception:  # noqa: BLE001
            kind = "unknown"
        return {"xla": f"{self.device} ({kind}), {self.world} XLA process(es)"}

    # ------------------------------------------------------------------ each step
    def begin_step(self) -> None:
        from trainperf.monitor.xla import compile_count

        self._compiles_before = compile_count()

    def reduce_gradients(self, optimizer) -> None:
        if self.world > 1:
            for opt in getattr(optimizer, "optimizers", [optimizer]):
                runtime.reduce_gradients(opt)  # all-reduce (mean) through torch_xla's collectives

    def end_step(self, data) -> dict:
        from trainperf.monitor.xla import step_metrics

        runtime.sync()  # step boundary: compile (cached after warm-up) and launch this step's graph
        extras = step_metrics()
        extras["xla_step_compiles"] = extras["xla_compiles"] - self._compiles_before
        shape = getattr(data.train, "last_shape", None)
        if shape is not None:
            extras["xla_batch_shape"] = list(shape)
        return extras

    # ------------------------------------------------------------------ checkpoints and sampling
    map_location = "cpu"  # torch.load cannot restore storages onto XLA: load_state_dict copies them over

    def to_host(self, state: dict) -> dict:
        return runtime.to_cpu(state)  # device -> host copies: loadable without torch_xla

    def rng_extra(self) -> dict:
        return {"xla_seed": runtime.rng_seed()}

    def load_rng_extra(self, rng: dict) -> None:
        if rng.get("xla_seed") is not None:
            runtime.set_seed(int(rng["xla_seed"]))

    def after_load(self) -> None:
        runtime.sync()

    def sampling_model(self, model: nn.Module) -> tuple[nn.Module, torch.device]:
        return copy.deepcopy(model).to("cpu"), torch.device("cpu")

    counts_flops = False
