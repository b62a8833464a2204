"""Activation checkpointing applied from outside the model: ``apply_ac``.

Modes: ``none``; ``full`` (every repeated block); ``ratio`` (a fraction of the blocks, spread
evenly: 0.25 = one in four); ``every_k`` (blocks 0, k, 2k, ...); ``selective`` (op level, every
block: the outputs of matmuls and attention are kept, the cheap ops are recomputed, through
torch.utils.checkpoint's selective-checkpoint policy); ``budget`` (the least recompute whose
estimate fits ``budget_gb``: chosen by :func:`trainperf.memory.budget.apply_checkpointing`, the entry
point for every mode; :func:`apply_ac` here is the mechanism and takes the chosen ``kinds``).

How blocks are wrapped: the block's class is swapped for a subclass whose ``forward`` runs the
original one under ``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)`` (the trick
FSDP2's ``fully_shard`` uses). No wrapper module is inserted, so parameter names, ``state_dict``
keys and ``isinstance`` checks are unchanged: a checkpoint saved with any AC mode loads into a
model built with any other. :func:`remove_ac` restores the original classes.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn as nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from trainperf.errors import ConfigError
from trainperf.memory.plan import MODES, check_ratio, plan_kinds, ratio_count, spread  # noqa: F401  (re-exported)
from trainperf.models.blocks import find_blocks  # noqa: F401  (re-exported)

_aten = torch.ops.aten
# Ops whose outputs selective checkpointing keeps (compute-bound); everything else is recomputed.
SAVE_OPS: frozenset = frozenset(
    getattr(_aten, name).default
    for name in (
        "mm", "addmm", "bmm", "baddbmm", "convolution", "_scaled_mm",
        "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu",
    )
    if hasattr(_aten, name)
)


def selective_policy(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    """Keep matmul / attention outputs (expensive to recompute); recompute norms, GELU, adds, casts."""
    return CheckpointPolicy.MUST_SAVE if op in SAVE_OPS else CheckpointPolicy.PREFER_RECOMPUTE


_selective_context = functools.partial(create_selective_checkpoint_contexts, selective_policy)


@dataclass
class ACPlan:
    """What :func:`apply_ac` did: per block index, ``"full"``, ``"selective"`` or ``"none"``."""

    mode: str
    block_path: str | None = None
    kinds: list[str] = field(default_factory=list)
    note: str = ""

    @property
    def n_blocks(self) -> int:
        return len(self.kinds)

    @property
    def full(self) -> list[int]:
        return [i for i, k in enumerate(self.kinds) if k == "full"]

    @property
    def selective(self) -> list[int]:
        return [i for i, k in enumerate(self.kinds) if k == "selective"]

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(full=self.full, selective=self.selective)
        return d


# --------------------------------------------------------------------------- wrapping
_CLASS_CACHE: dict[tuple[type, str], type] = {}


def _checkpointed_class(base: type, kind: str) -> type:
    key = (base, kind)
    if key in _CLASS_CACHE:
        return _CLASS_CACHE[key]
    context_fn = _selective_context if kind == "selective" else None

    def forward(self, *args, **kwargs):
        if not torch.is_grad_enabled():  # eval / no_grad: nothing is saved, nothing to recompute
            return base.forward(self, *args, **kwargs)
        extra = {"context_fn": context_fn} if context_fn is not None else {}
        return checkpoint(base.forward, self, *args, use_reentrant=False, preserve_rng_state=True,
                          **extra, **kwargs)

    prefix = "Checkpointed" if kind == "full" else "SelectiveCheckpointed"
    cls = type(f"{prefix}{base.__name__}", (base,), {
        "forward": forward, "_trainperf_ac_kind": kind, "_trainperf_ac_base": base,
        "__module__": base.__module__,
    })
    _CLASS_CACHE[key] = cls
    return cls


def _wrap(block: nn.Module, kind: str) -> None:
    base = getattr(type(block), "_trainperf_ac_base", type(block))
    block.__class__ = base if kind == "none" else _checkpointed_class(base, kind)


def remove_ac(model: nn.Module) -> None:
    """Undo :func:`apply_ac` on every module of ``model``."""
    for mod in model.modules():
        if hasattr(type(mod), "_trainperf_ac_base"):
            mod.__class__ = type(mod)._trainperf_ac_base


# --------------------------------------------------------------------------- entry point
def apply_ac(model: nn.Module, ac=None, *, mode: str | None = None, ratio: float | None = None,
             every_k: int | None = None, blocks: str | None = None, budget_bytes: int | None = None,
             micro_batch: int | None = None, seq_len: int | None = None, dtype: str = "fp32",
             optimizer: str = "adamw", example_batch=None, kinds: list[str] | None = None,
             note: str = "") -> ACPlan:
    """Apply activation checkpointing to ``model``'s repeated blocks, in place; returns the plan.

    ``ac`` is the ``memory.checkpointing`` config section (``CheckpointingConfig``); the keyword
    flags override its fields (or stand alone without it). Call after building/materializing the
    model and before ``torch.compile``. ``kinds`` (one of none/full/selective per block) bypasses the
    mode; ``budget`` mode needs them (:func:`trainperf.memory.budget.apply_checkpointing` chooses
    them from the estimate and calls this). ``budget_bytes``, ``micro_batch``, ``seq_len``, ``dtype``,
    ``optimizer`` and ``example_batch`` are accepted for the callers that pass them and unused here.
    """
    mode = mode or (ac.mode if ac is not None else "none")
    ratio = ratio if ratio is not None else (ac.ratio if ac is not None else 0.25)
    every_k = every_k if every_k is not None else (ac.every_k if ac is not None else 4)
    blocks = blocks if blocks is not None else (ac.blocks if ac is not None else None)
    if mode not in MODES:
        raise ConfigError(f"memory.checkpointing.mode={mode!r} is unknown; choose one of {', '.join(MODES)}")
    if mode == "ratio":
        check_ratio(ratio)

    remove_ac(model)
    path, found = find_blocks(model, blocks)
    if mode == "none" and kinds is None:
        return ACPlan("none", path, ["none"] * len(found))
    if not found:
        raise ConfigError(
            f"memory.checkpointing.mode={mode!r} needs repeated blocks, but {type(model).__name__} has no "
            "ModuleList/ModuleDict/Sequential of two or more children of one type; name the blocks with "
            "memory.checkpointing.blocks=<dotted path> or use mode=none"
        )
    if kinds is None and mode == "budget":
        raise ConfigError(
            "memory.checkpointing.mode=budget is chosen from a memory estimate: call "
            "trainperf.memory.budget.apply_checkpointing(model, ac_cfg, micro_batch=..., seq_len=...) "
            "(the entry point for every mode), or pass the per-block kinds to apply_ac"
        )
    if kinds is None:
        kinds = plan_kinds(mode, len(found), ratio=ratio, every_k=every_k)
    if len(kinds) != len(found):
        raise ConfigError(f"{len(kinds)} checkpoint kinds given for {len(found)} blocks at {path!r}")
    for block, kind in zip(found, kinds):
        _wrap(block, kind)
    return ACPlan(mode, path, list(kinds), note)
