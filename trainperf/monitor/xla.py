"""XLA's own figures per step, read by the trainer (:mod:`trainperf.xla.backend`) from ``torch_xla``'s metrics.

The ``xla_recompile`` rule that reads them back from metrics.jsonl is in :mod:`trainperf.diagnosis.rules_xla`
(its old names here are deprecated and forwarded for one release).
"""

from __future__ import annotations

from trainperf.lazy import moved_names

def step_metrics() -> dict:
    """Cumulative compile/execute figures from ``torch_xla.debug.metrics`` (cheap: host counters)."""
    import torch_xla.debug.metrics as met

    out = {}
    for name, key in (("CompileTime", "compile"), ("ExecuteTime", "execute")):
        data = met.metric_data(name)  # (count, total ns, samples) or None before the first event
        count, total_ns = (data[0], data[1]) if data else (0, 0)
        out["xla_compiles" if key == "compile" else "xla_executions"] = int(count)
        out[f"xla_{key}_s"] = total_ns / 1e9
    return out


def compile_count() -> int:
    import torch_xla.debug.metrics as met

    data = met.metric_data("CompileTime")
    return int(data[0]) if data else 0


__getattr__ = moved_names(__name__, "trainperf.diagnosis.rules_xla", (
    "WARMUP_MIN_STEPS", "RECOMPILE_STEPS_WARN", "RECOMPILE_TIME_CRIT", "warmup_steps", "recompile_finding"))
