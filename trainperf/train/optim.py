"""Optimizer and learning-rate schedule builders."""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from trainperf.config.schema import OptimizerConfig, ScheduleConfig


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Decay matrices (embeddings and linear weights); not biases or norm gains."""
    decay, no_decay = [], []
    for p in model.parameters():
        if not p.requires_grad:
            continue
        (decay if p.dim() >= 2 else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def build_optimizer(model: nn.Module, cfg: OptimizerConfig) -> torch.optim.Optimizer:
    """``fused_adam`` and ``adamw`` are AdamW; cfg.impl (resolved) picks fused / foreach / for-loop."""
    impl = cfg.impl if cfg.impl != "auto" else "foreach"
    kernel = {"fused": {"fused": True}, "foreach": {"foreach": True}, "for-loop": {"foreach": False}}[impl]
    if cfg.type in ("adamw", "fused_adam"):
        return torch.optim.AdamW(param_groups(model, cfg.weight_decay), lr=cfg.lr, betas=tuple(cfg.betas),
                                 eps=cfg.eps, **kernel)
    if cfg.type == "adam":
        return torch.optim.Adam(model.parameters(), lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps,
                                weight_decay=cfg.weight_decay, **kernel)
    kernel.pop("fused", None)
    return torch.optim.SGD(param_groups(model, cfg.weight_decay), lr=cfg.lr, momentum=0.9,
                           foreach=kernel.get("foreach", True))


def lr_at(step: int, *, peak: float, total_steps: int, sched: ScheduleConfig) -> float:
    """Learning rate for optimizer step ``step`` (0-based): linear warm-up, then cosine/linear/constant decay.
    A pure function of the step, so the schedule's state is the step count."""
    if sched.warmup_steps and step < sched.warmup_steps:
        return peak * (step + 1) / sched.warmup_steps
    floor = peak * sched.min_lr_ratio
    if sched.type == "constant":
        return peak
    span = max(1, total_steps - sched.warmup_steps)
    progress = min(1.0, (step - sched.warmup_steps) / span)
    if sched.type == "linear":
        return floor + (peak - floor) * (1 - progress)
    return floor + (peak - floor) * 0.5 * (1 + math.cos(math.pi * progress))
