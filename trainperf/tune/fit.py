"""Will a candidate fit? The memory estimate, asked before anything runs.

:func:`estimate` is the one call into :mod:`trainperf.memory` (its ``trainperf memory`` entry
point, :func:`trainperf.memory.report.memory_report`): bytes per rank for the candidate's
micro-batch, precision, layout and checkpointing mode, and the budget it is held against
(the CUDA device's memory, else the host's available memory). A user's model (no closed-form
estimate) is estimated from a traced forward by the same entry point.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from trainperf.config.schema import Config

HEADROOM = 0.9  # a candidate must fit in this fraction of the budget (allocator fragmentation, workspace)


@dataclass(frozen=True)
class Fit:
    bytes: int | None  # estimated bytes per rank (None: no estimate)
    budget: int | None
    budget_source: str

    @property
    def fits(self) -> bool:
        return self.bytes is None or self.budget is None or self.bytes <= HEADROOM * self.budget

    def reason(self) -> str:
        return (f"memory estimate {self.bytes / 2**20:,.0f} MiB per rank > {HEADROOM:.0%} of "
                f"{self.budget / 2**20:,.0f} MiB ({self.budget_source})")


def _label(cfg: Config) -> str:
    ac = cfg.memory.checkpointing
    return f"ratio {ac.ratio:g}" if ac.mode == "ratio" else ac.mode


class Estimator:
    """Estimates per candidate, cached for one search (the same config is asked about often)."""

    def __init__(self):
        self._cache: dict[str, tuple[dict, int | None, str]] = {}

    def __call__(self, cfg: Config) -> Fit:
        """The memory estimate of ``cfg`` (a candidate, resolved) against its device's budget."""
        from trainperf.errors import UserError

        key = json.dumps(cfg.model_dump(mode="json"), sort_keys=True)
        if key not in self._cache:
            try:
                self._cache[key] = _report(cfg)
            except UserError as exc:  # e.g. a user's model with no repeated blocks for a checkpointing mode
                return Fit(None, None, f"no estimate: {exc}")
        totals, budget, source = self._cache[key]
        return Fit(totals.get(_label(cfg)), budget, source)


def _report(cfg: Config) -> tuple[dict, int | None, str]:
    """Bytes per checkpointing mode at ``cfg``'s micro-batch, and the budget (the memory package's
    stable entry point: the one call into it)."""
    from trainperf.memory.report import memory_report

    rep = memory_report(cfg, progress=False)
    return {m["label"]: m["estimate_bytes"]["total"] for m in rep["modes"]}, rep["budget_bytes"], rep["budget_source"]
