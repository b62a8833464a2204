"""The gain a finding promises: an upper bound, as a sentence and as numbers.

``step_gain(before_s, saved_s, if_what)`` -> ``{"text": "the step would shrink by up to 33% (177.6 →
118.3 ms) if DataLoader waits were hidden", "fraction": 0.33, "before": 177.6, "after": 118.3,
"unit": "ms", "metric": "step time", "if": "DataLoader waits were hidden"}``. ``fraction`` is the share
of ``metric`` that would go; it is an upper bound: the time named could at best disappear entirely
(hidden behind other work, or taken down to what the faster path needs). None when no honest bound exists.
"""

from __future__ import annotations

import math


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def gain(before: float | None, saved: float | None, if_what: str, *, metric: str = "step time",
         unit: str = "ms", scale: float = 1000.0, verb: str = "the step would shrink") -> dict | None:
    """``before`` and ``saved`` in seconds (``scale`` turns them into ``unit``)."""
    if not (_finite(before) and _finite(saved)) or before <= 0 or saved <= 0:
        return None
    saved = min(saved, before)
    frac = saved / before
    b, a = before * scale, (before - saved) * scale
    digits = 1 if max(b, a) < 1e4 else 0
    return {"text": f"{verb} by up to {100 * frac:.0f}% ({b:.{digits}f} → {a:.{digits}f} {unit}) if {if_what}",
            "fraction": frac, "before": b, "after": a, "unit": unit, "metric": metric, "if": if_what}


def step_gain(before_s: float | None, saved_s: float | None, if_what: str) -> dict | None:
    return gain(before_s, saved_s, if_what)


def fraction(g: dict | None) -> float:
    return g["fraction"] if g else 0.0
