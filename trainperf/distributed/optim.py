"""Optimizers over tensor-parallel parts: DTensor and plain parameters in separate groups."""

from __future__ import annotations

import torch


def split_by_placement(opt: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """The same optimizer with each param group split into plain tensors and DTensors per mesh and
    placement: multi-tensor (foreach) kernels cannot mix them (tensor parallelism leaves embeddings
    and norms as plain replicated tensors next to sharded DTensor weights)."""
    from torch.distributed.tensor import DTensor

    groups = []
    for g in opt.param_groups:
        buckets: dict = {}
        for p in g["params"]:
            key = (id(p.device_mesh), tuple(p.placements)) if isinstance(p, DTensor) else None
            buckets.setdefault(key, []).append(p)
        for params in buckets.values():
            groups.append({**{k: v for k, v in g.items() if k != "params"}, "params": params})
    if len(groups) == len(opt.param_groups):
        return opt
    import inspect

    accepted = inspect.signature(type(opt).__init__).parameters
    return type(opt)(groups, **{k: v for k, v in opt.defaults.items() if k in accepted})
