"""Memory: activation checkpointing, the memory estimate and its measurement.

Layers, each importing only those above it in this list: :mod:`.plan` (plans and ratios, no
torch) -> :mod:`.ac` (the checkpointing mechanism) -> :mod:`.estimate` (closed form, no torch),
:mod:`.measure`, :mod:`.trace` -> :mod:`.budget` (budget choice and :func:`apply_checkpointing`,
the entry point) -> :mod:`.report`. Names are loaded on first use, so importing this package (or
the torch-free :mod:`.plan` / :mod:`.estimate`) does not import torch.
"""

from importlib import import_module

_WHERE = {
    "ACPlan": "ac", "apply_ac": "ac", "remove_ac": "ac", "find_blocks": "ac",
    "GPTShape": "estimate", "MemoryEstimate": "estimate", "Sharding": "estimate", "estimate_gpt": "estimate",
    "Plan": "plan", "measure_activations": "measure", "measure_states": "measure",
    "apply_checkpointing": "budget",
}

__all__ = sorted(_WHERE)


def __getattr__(name):
    if name in _WHERE:
        return getattr(import_module(f"trainperf.memory.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'trainperf.memory' has no attribute {name!r}")
