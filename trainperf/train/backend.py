"""Where the step runs: the device-specific parts of training, chosen once when the trainer is built.

A backend owns device placement, the data-parallel rank among its processes, the end of a step,
``map_location`` for checkpoints, the host copy that checkpoints and text sampling use, and the
figures it adds to each step's record. :class:`EagerBackend` serves CPU and CUDA (gradients are
reduced inside backward by DDP/FSDP2, nothing syncs with the host at the end of a step);
:class:`trainperf.xla.backend.XlaBackend` serves ``run.device: xla``.
"""

from __future__ import annotations

import torch
import torch.nn as nn


class EagerBackend:
    name = "eager"

    def __init__(self, device: torch.device):
        self.device = torch.device(device)

    # ------------------------------------------------------------------ building
    @property
    def build_device(self) -> torch.device:
        """Where the model is materialized and initialized."""
        return self.device

    @property
    def data_device(self) -> torch.device:
        """Where the loader delivers batches."""
        return self.device

    def data_parallel(self, dims, rank: int) -> tuple[int, int]:
        """(this process's data-parallel rank, the data-parallel degree)."""
        return dims.dp_rank(rank), dims.dp

    def seed(self, seed: int, rank: int) -> None:
        """Device generators beyond torch's (seeded by ``seed_everything``): none."""

    def wrap_loader(self, loader):
        return loader

    def place(self, pm) -> None:
        """Move the prepared model onto the device (``parallelize`` already materialized it there)."""

    @property
    def notes(self) -> dict:
        return {}

    # ------------------------------------------------------------------ each step
    def begin_step(self) -> None:
        pass

    def reduce_gradients(self, optimizer) -> None:
        """Data-parallel gradient reduction outside backward: none (DDP/FSDP2 reduce inside it)."""

    def end_step(self, data) -> dict:
        """End of the optimizer step; returns figures for the step's record. No host sync here:
        ``fit`` brings the losses back once per log interval."""
        return {}

    # ------------------------------------------------------------------ checkpoints and sampling
    @property
    def map_location(self):
        return self.device

    def to_host(self, state: dict) -> dict:
        return state

    def rng_extra(self) -> dict:
        return {}

    def load_rng_extra(self, rng: dict) -> None:
        pass

    def after_load(self) -> None:
        pass

    def sampling_model(self, model: nn.Module) -> tuple[nn.Module, torch.device]:
        """The module and device to generate text with."""
        return model, self.device

    @property
    def counts_flops(self) -> bool:
        """Whether an extra counted forward/backward is cheap here (not on XLA: it would compile a graph)."""
        return True
