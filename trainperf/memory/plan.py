"""Checkpointing plans as counts, and the order budget mode tries them in (no torch).

The per-block kinds of each mode live in :mod:`trainperf.analytic.recompute` (one count for AC,
the estimate, MFU and the planner); they are re-exported here for the memory modules.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainperf.analytic.recompute import MODES, check_ratio, plan_kinds, ratio_count, spread

__all__ = ["MODES", "Plan", "budget_candidates", "check_ratio", "plan_kinds", "plan_of", "ratio_count", "spread"]


@dataclass(frozen=True)
class Plan:
    """A checkpointing plan in counts: blocks fully checkpointed, blocks under selective."""

    n_full: int = 0
    n_selective: int = 0

    def describe(self) -> str:
        if self.n_full == 0 and self.n_selective == 0:
            return "no checkpointing"
        parts = []
        if self.n_full:
            parts.append(f"{self.n_full} block(s) fully checkpointed")
        if self.n_selective:
            parts.append(f"{self.n_selective} block(s) selective")
        return ", ".join(parts)


def plan_of(mode: str, n_layer: int, *, ratio: float = 0.25, every_k: int = 4) -> Plan:
    kinds = plan_kinds(mode, n_layer, ratio=ratio, every_k=every_k)
    return Plan(kinds.count("full"), kinds.count("selective"))


def budget_candidates(n_blocks: int) -> list[Plan]:
    """Plans from least to most recompute: none, selective everywhere, then k fully checkpointed
    blocks with the others selective, then k+1 blocks fully checkpointed ... up to all of them.
    Selective recompute (norms, GELU, adds) is taken as cheaper than any full block's recompute."""
    out = [Plan(0, 0), Plan(0, n_blocks)]
    for k in range(1, n_blocks + 1):
        out.append(Plan(k, 0))
        if k < n_blocks:
            out.append(Plan(k, n_blocks - k))
    return out
