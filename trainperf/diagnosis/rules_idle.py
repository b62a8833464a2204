"""The checks of the rules that charge a rank's idle GPU time to what its host was doing: one rule per named
cause (the allocator, host-side ops, the optimizer step, garbage collection, untraced host time, work that
waited on what the trace does not show), each from the step's attribution
(:mod:`trainperf.trace.attribution`: every idle microsecond charged along the critical path to the host thread
that launched the next GPU work; the gain is the step replayed on the rank's dependency graph without the
cause's host time, not a sum of durations). The data wait, syncs and launches have rules of their own
(``data_bound``, ``host_syncs``, ``launch_bound``), which read the same attribution.
"""

from __future__ import annotations

from trainperf.diagnosis.causes import cause as cause_of
from trainperf.diagnosis.evidence import Evidence
from trainperf.diagnosis.gain import step_gain

IDLE_WARN, IDLE_CRIT = 0.05, 0.25  # idle GPU time charged to one cause, share of the step
UNTRACED_WARN = 0.10  # untraced host time: every trace has some (Python between ops); a finding from this share
GPU_WAIT_INFO = 0.20  # gpu_wait is an inference (queued work that did not start): reported from this share, as info


def charged(ev: Evidence, name: str) -> dict | None:
    """The attribution's entry for cause ``name`` on this rank (None: none charged)."""
    return next((c for c in (ev.attribution or {}).get("idle_causes") or [] if c.get("cause") == name), None)


def _ms(us) -> str:
    return f"{us / 1000:.2f} ms" if isinstance(us, (int, float)) else "n/a"


def describe(ev: Evidence, c: dict, share: float, threshold: float) -> str:
    """The evidence sentence of an idle cause: its share and time per step, its calls, the names and callers."""
    text = (f"the GPU idles {100 * share:.1f}% of the step{ev.where()} waiting on {cause_of(c['cause']).label} "
            f"({_ms(c['us_per_step'])} per step, threshold {100 * threshold:.0f}%")
    if c.get("calls_per_step"):
        text += f"; {c['calls_per_step']:.0f} call(s) per step"
    text += ")"
    if c.get("names"):
        text += ": " + ", ".join(f"{n} {_ms(us)}" for n, us in c["names"][:4])
    if c.get("callers"):
        text += "; called from " + ", ".join(f"{n} ({_ms(us)})" for n, us in c["callers"][:3])
    return text


def whatif_gain(ev: Evidence, c: dict, label: str) -> dict | None:
    step_s = ev.step_s or 0.0
    return step_gain(step_s, (c.get("gain_us") or 0.0) / 1e6, f"{label} were off the critical path (replayed)")


def idle_cause(name: str, warn: float = IDLE_WARN, crit: float = IDLE_CRIT, severity: str | None = None):
    """The check of the rule for idle cause ``name``: fires when the idle charged to it is at least ``warn`` of
    the step (critical above ``crit``); the cause and fix are :data:`trainperf.diagnosis.causes.CAUSES`'."""
    def check(ev: Evidence) -> dict | None:
        a = ev.attribution or {}
        c = charged(ev, name)
        step_us = a.get("step_us") or 0.0
        if c is None or not step_us:
            return None
        share = c["us_per_step"] / step_us
        if share < warn:
            return None
        info = cause_of(name)
        return {"severity": severity or ("critical" if share > crit else "warning"), "idle_share": share,
                "idle_us_per_step": c["us_per_step"],
                "evidence": describe(ev, c, share, warn), "cause": info.why, "fix": info.fix(ev.fixes),
                "gain": whatif_gain(ev, c, info.label)}
    check.__name__ = f"idle_{name}"
    return check


__all__ = ["GPU_WAIT_INFO", "IDLE_CRIT", "IDLE_WARN", "UNTRACED_WARN", "charged", "describe", "idle_cause", "whatif_gain"]
