"""Budget mode and the one entry point for activation checkpointing: :func:`apply_checkpointing`.

Budget mode picks the least recompute whose estimated total fits ``memory.checkpointing.budget_gb``:
the closed-form estimate for trainperf's GPT (:mod:`trainperf.memory.estimate`), a traced one for
any other model (:mod:`trainperf.memory.trace`). Every other mode goes straight to the mechanism,
:func:`trainperf.memory.ac.apply_ac`. This module sits on top of the memory package: it imports
ac, estimate and trace; none of them imports it.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainperf.errors import ConfigError
from trainperf.memory.ac import ACPlan, apply_ac
from trainperf.memory.estimate import GB, GPTShape, MemoryEstimate, estimate_gpt
from trainperf.memory.plan import Plan, budget_candidates, plan_kinds
from trainperf.models.blocks import find_blocks


def max_micro_batch(estimate_at, budget_bytes: int, *, upper: int = 1 << 16) -> int:
    """Largest micro-batch ``b`` with ``estimate_at(b).total <= budget_bytes`` (0 if none).
    ``estimate_at`` must be monotone in b."""
    if estimate_at(1).total > budget_bytes:
        return 0
    lo, hi = 1, 2
    while hi <= upper and estimate_at(hi).total <= budget_bytes:
        lo, hi = hi, hi * 2
    if hi > upper:
        return lo
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if estimate_at(mid).total <= budget_bytes:
            lo = mid
        else:
            hi = mid
    return lo


@dataclass(frozen=True)
class BudgetChoice(Plan):
    estimate: MemoryEstimate | None = None

    def describe(self) -> str:
        text = Plan.describe(self)
        if self.estimate is not None:
            text += f" (estimate {self.estimate.total / GB:.3f} GB)"
        return text


def choose_plan(estimate_for, n_blocks: int, budget_bytes: int, *, what: str = "",
                suggest_micro_batch=None) -> BudgetChoice:
    """The least-recompute plan whose estimated total fits ``budget_bytes``.
    ``estimate_for(plan) -> MemoryEstimate``. Raises ConfigError naming the minimum otherwise."""
    for plan in budget_candidates(n_blocks):
        est = estimate_for(plan)
        if est.total <= budget_bytes:
            return BudgetChoice(plan.n_full, plan.n_selective, est)
    floor = estimate_for(Plan(n_blocks, 0))
    hint = ""
    if suggest_micro_batch is not None:
        b = suggest_micro_batch()
        if b > 0:
            hint = f", or lower train.micro_batch to {b} (fits with mode=full)"
        else:
            hint = (f"; model states alone take {floor.states / GB:.3f} GB, so also shard them "
                    "(parallelism.data_shard) or use a smaller model")
    raise ConfigError(
        f"memory.checkpointing.budget_gb={budget_bytes / GB:g} is below the minimum possible{what}: "
        f"{floor.total / GB:.3f} GB with mode=full (every block checkpointed: model states "
        f"{floor.states / GB:.3f} GB + activations {floor.activations / GB:.3f} GB); raise budget_gb to at "
        f"least {floor.total / GB:.3f}{hint}"
    )


def plan_for_budget(model, *, budget_bytes: int, micro_batch: int | None, seq_len: int | None,
                    dtype: str = "fp32", optimizer: str = "adamw", example_batch=None,
                    blocks: str | None = None) -> BudgetChoice:
    """Budget mode: formula for the reference GPT, traced estimate (needs ``example_batch``) for
    any other model."""
    from trainperf.models.gpt import GPT

    if isinstance(model, GPT):
        if not micro_batch:
            raise ConfigError("memory.checkpointing.mode=budget needs the micro-batch (train.micro_batch) to estimate")
        shape = GPTShape.of(model.cfg)
        s = seq_len or shape.block_size

        def at(plan, b=micro_batch):
            return estimate_gpt(shape, micro_batch=b, seq_len=s, dtype=dtype, plan=plan, optimizer=optimizer)

        def fit_full():
            return max_micro_batch(lambda b: at(Plan(shape.n_layer, 0), b), budget_bytes)

        return choose_plan(at, shape.n_layer, budget_bytes, suggest_micro_batch=fit_full,
                           what=f" at micro_batch={micro_batch}, seq_len={s}, {dtype}")
    if example_batch is None:
        raise ConfigError(
            "memory.checkpointing.mode=budget on a model that is not trainperf's GPT needs a sample batch to trace; "
            "pass example_batch=(idx, targets) to apply_checkpointing, or choose mode=ratio/full/selective"
        )
    from trainperf.memory.trace import estimate_traced, trace_profile

    prof = trace_profile(model, example_batch, dtype=dtype, blocks=blocks)
    b = micro_batch or example_batch[0].shape[0]

    def at_traced(plan, bb=b):
        return estimate_traced(prof, micro_batch=bb, plan=plan, optimizer=optimizer)

    def fit_full_traced():
        return max_micro_batch(lambda bb: at_traced(Plan(prof.n_blocks, 0), bb), budget_bytes)

    return choose_plan(at_traced, prof.n_blocks, budget_bytes, suggest_micro_batch=fit_full_traced,
                       what=f" at micro_batch={b}, {dtype}")


def apply_checkpointing(model, ac_cfg, *, micro_batch: int, seq_len: int, dtype: str = "fp32",
                        optimizer: str = "adamw", example_batch=None) -> ACPlan:
    """Apply ``memory.checkpointing`` (``ac_cfg``, a ``CheckpointingConfig``) to ``model`` in place,
    for every mode, budget included; returns what was done. Call after building the model and
    before ``torch.compile`` / FSDP. Budget mode estimates with ``micro_batch``, ``seq_len``,
    ``dtype`` and ``optimizer`` (and traces ``example_batch`` for a model that is not trainperf's GPT)."""
    mode = ac_cfg.mode if ac_cfg is not None else "none"
    if mode != "budget":
        return apply_ac(model, ac_cfg)
    if ac_cfg.budget_gb is None:
        raise ConfigError("memory.checkpointing.mode=budget needs memory.checkpointing.budget_gb (e.g. 70)")
    from trainperf.memory.ac import remove_ac

    remove_ac(model)
    path, found = find_blocks(model, ac_cfg.blocks)
    if not found:
        raise ConfigError(
            f"memory.checkpointing.mode='budget' needs repeated blocks, but {type(model).__name__} has no "
            "ModuleList/ModuleDict/Sequential of two or more children of one type; name the blocks with "
            "memory.checkpointing.blocks=<dotted path> or use mode=none"
        )
    choice = plan_for_budget(model, budget_bytes=int(ac_cfg.budget_gb * GB), micro_batch=micro_batch,
                             seq_len=seq_len, dtype=dtype, optimizer=optimizer, example_batch=example_batch,
                             blocks=ac_cfg.blocks)
    kinds = plan_kinds("budget", len(found), n_full=choice.n_full, n_selective=choice.n_selective)
    return apply_ac(model, ac_cfg, mode="budget", kinds=kinds, note=choice.describe())
