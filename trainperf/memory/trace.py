"""Traced estimate for any model: one measured forward at micro-batch 1 and 2, per block.

Each allocation of the forward is attributed to the repeated block running when it was made
(forward pre-/post-hooks on the blocks). Per block i: ``inner`` (bytes it leaves for backward,
its output excluded), ``out`` (its output, kept in every mode: by the next block, or by
checkpoint as the next region's input), ``sel`` (bytes of its matmul / attention outputs, what
selective checkpointing caches). Outside the blocks: ``outside``. Every figure is taken at
micro-batch 1 and 2 and extended linearly (exact for models whose activations are linear in the
batch, such as transformers with fused attention).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch
import torch.nn as nn
from torch.utils._pytree import tree_leaves

from trainperf.errors import ConfigError
from trainperf.memory.ac import remove_ac
from trainperf.memory.estimate import MemoryEstimate, Sharding, act_bytes, optimizer_bytes_per_param
from trainperf.memory.measure import measure_activations
from trainperf.memory.plan import Plan, plan_kinds
from trainperf.models.blocks import find_blocks


@dataclass
class TraceProfile:
    n_blocks: int
    block_path: str | None
    param_bytes: int
    param_numel: int
    param_tensors: int
    # name -> (value at micro-batch 1, value at micro-batch 2); lists are per block
    outside: tuple[int, int] = (0, 0)
    inner: list[tuple[int, int]] = field(default_factory=list)
    out: list[tuple[int, int]] = field(default_factory=list)
    sel: list[tuple[int, int]] = field(default_factory=list)


def _at(pair: tuple[int, int], b: int) -> float:
    return pair[0] + (pair[1] - pair[0]) * (b - 1)


def _rows(batch: tuple, b: int) -> tuple:
    def cut(t):
        if not isinstance(t, torch.Tensor) or t.dim() == 0:
            return t
        reps = -(-b // t.shape[0])
        return (t.repeat(reps, *([1] * (t.dim() - 1))) if reps > 1 else t)[:b].clone()
    return tuple(cut(t) for t in batch)


def _autocast_for(dtype: str, device: torch.device):
    act_bytes(dtype)
    if dtype in ("bf16", "fp16"):
        return torch.autocast(device.type, dtype=torch.bfloat16 if dtype == "bf16" else torch.float16)
    return None


def trace_profile(model: nn.Module, batch: tuple, *, dtype: str = "fp32", blocks: str | None = None) -> TraceProfile:
    """Trace ``model(*batch)`` (no checkpointing applied) at micro-batch 1 and 2."""
    remove_ac(model)
    path, found = find_blocks(model, blocks)
    if not found:
        raise ConfigError(
            f"{type(model).__name__} has no repeated blocks to checkpoint; name them with "
            "memory.checkpointing.blocks=<dotted path> or use mode=none"
        )
    device = next(model.parameters()).device
    seen: set[int] = set()
    numel = nbytes = tensors = 0
    for p in model.parameters():
        key = p.untyped_storage().data_ptr()
        if key in seen:
            continue
        seen.add(key)
        numel += p.numel()
        nbytes += p.untyped_storage().nbytes()
        tensors += 1
    prof = TraceProfile(len(found), path, nbytes, numel, tensors)
    samples = []
    for b in (1, 2):
        outputs: list[set[int]] = [set() for _ in found]

        @contextlib.contextmanager
        def hooks(recorder, outputs=outputs):
            handles = []
            for i, blk in enumerate(found):
                def pre(mod, args, i=i):
                    recorder.block = i
                def post(mod, args, out, i=i):
                    recorder.block = None
                    for t in tree_leaves(out):
                        if isinstance(t, torch.Tensor):
                            outputs[i].add(t.untyped_storage().data_ptr())
                handles.append(blk.register_forward_pre_hook(pre))
                handles.append(blk.register_forward_hook(post))
            try:
                yield
            finally:
                for h in handles:
                    h.remove()

        model.zero_grad(set_to_none=True)
        meas = measure_activations(model, _rows(batch, b), autocast=_autocast_for(dtype, device), tracer=hooks)
        model.zero_grad(set_to_none=True)
        alive = meas._alive
        out_keys = {k: i for i, keys in enumerate(outputs) for k in keys}
        inner = [0] * len(found)
        out = [0] * len(found)
        outside = 0
        for key, a in alive.items():
            if key in out_keys:
                out[out_keys[key]] += a.nbytes
            elif a.block is not None:
                inner[a.block] += a.nbytes
            else:
                outside += a.nbytes
        outside += meas.bytes - meas.retained_bytes  # saved but not found by the recorder (rare)
        sel = [meas._save_op_bytes.get(i, 0) for i in range(len(found))]
        samples.append((outside, inner, out, sel))
    (o1, i1, u1, s1), (o2, i2, u2, s2) = samples
    prof.outside = (o1, o2)
    prof.inner = list(zip(i1, i2))
    prof.out = list(zip(u1, u2))
    prof.sel = list(zip(s1, s2))
    return prof


def estimate_traced(prof: TraceProfile, *, micro_batch: int, plan: Plan = Plan(), optimizer: str = "adamw",
                    sharding: Sharding = Sharding()) -> MemoryEstimate:
    """Estimate from a :class:`TraceProfile`. Sharding: only FSDP (model states / fsdp) is modeled."""
    kinds = plan_kinds("budget", prof.n_blocks, n_full=plan.n_full, n_selective=plan.n_selective)
    b = micro_batch
    acts = _at(prof.outside, b)
    for i, kind in enumerate(kinds):
        acts += _at(prof.out[i], b)
        if kind == "none":
            acts += _at(prof.inner[i], b)
        elif kind == "selective":
            acts += _at(prof.sel[i], b)
    div = sharding.fsdp
    params = prof.param_bytes // div
    opt = optimizer_bytes_per_param(optimizer) * prof.param_numel // div
    if optimizer in ("adamw", "adam", "fused_adam"):
        opt += 4 * prof.param_tensors
    detail = {"method": "traced at micro-batch 1 and 2, linear in the micro-batch", "plan": plan.describe()}
    return MemoryEstimate(params, params, opt, int(max(0, acts)), detail)
