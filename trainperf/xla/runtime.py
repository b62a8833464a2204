"""The XLA device, the step boundary and the collectives, behind a few small functions.

XLA tensors are lazy: operations are recorded into a graph, and ``sync()`` (``torch_xla.sync``,
formerly ``xm.mark_step``) compiles that graph (cached by its hash) and runs it. trainperf cuts
one graph per optimizer step. With several XLA processes (``torch_xla.launch`` / PJRT), each
holds one device and ``reduce_gradients`` all-reduces the gradients through torch_xla's own
collectives (``xm.reduce_gradients``, the first half of ``xm.optimizer_step``).
"""

from __future__ import annotations

from typing import Any

import torch

from trainperf.xla.env import require_torch_xla


def device() -> torch.device:
    """This process's XLA device (``xla:0`` under PJRT: one device per process)."""
    torch_xla = require_torch_xla()
    return torch_xla.device()


def sync() -> None:
    """Cut the lazy graph here: compile it (or take it from the cache) and launch it (asynchronously)."""
    import torch_xla

    torch_xla.sync()


def world_size() -> int:
    """Number of XLA processes taking part in data parallelism (1 for a single process)."""
    import torch_xla.runtime as xr

    return xr.world_size()


def ordinal() -> int:
    import torch_xla.runtime as xr

    return xr.global_ordinal()


def reduce_gradients(optimizer: torch.optim.Optimizer) -> None:
    """All-reduce (mean) the gradients across the XLA processes; a no-op for one process."""
    import torch_xla.core.xla_model as xm

    xm.reduce_gradients(optimizer)


def set_seed(seed: int) -> None:
    """Seed the XLA device's own random generator (dropout on the device draws from it)."""
    import torch_xla

    torch_xla.manual_seed(seed)


def rng_seed() -> int:
    import torch_xla.core.xla_model as xm

    return int(xm.get_rng_state())


def to_cpu(tree: Any) -> Any:
    """A copy of a nested state (dicts, lists, tuples) with every XLA tensor moved to the CPU.

    Checkpoints written this way load on a CPU-only machine and back onto an XLA device."""
    if isinstance(tree, torch.Tensor):
        return tree.cpu() if tree.device.type == "xla" else tree
    if isinstance(tree, dict):
        return type(tree)((k, to_cpu(v)) for k, v in tree.items())
    if isinstance(tree, list):
        return [to_cpu(v) for v in tree]
    if isinstance(tree, tuple):
        return tuple(to_cpu(v) for v in tree)
    return tree
