"""The ``xla_recompile`` rule's check: XLA compiling new graphs after warm-up.

XLA compiles one graph per distinct trace (op sequence + shapes + dtypes). A run that is
healthy compiles during the first steps (first forward/backward, then the step that first holds
optimizer state) and then reuses cached graphs. A shape that keeps changing (sequence length,
a last partial batch, a Python value baked into the trace) makes every new variant compile
again: often seconds each, silently. The trainer records, per step (``metrics.jsonl``)::

    xla_compiles        compilations so far (torch_xla.debug.metrics CompileTime count)
    xla_compile_s       seconds spent compiling so far (CompileTime total)
    xla_executions      graph executions so far (ExecuteTime count)
    xla_execute_s       seconds executing so far (ExecuteTime total; execution is asynchronous,
                        so a step's figure can trail by a step)
    xla_step_compiles   compilations during this step's train_step (the step graph; evaluation
                        and loss transfers between steps compile their own small graphs, not
                        counted here)
    xla_batch_shape     the shape of this step's input batch [B, T]

The rule fires when compilations keep happening after warm-up and names the first such step
and the shape change there.
"""

from __future__ import annotations

import math

from trainperf.diagnosis.evidence import Evidence

# Warm-up: the first 10% of the recorded steps, at least this many (step 1 traces forward and
# backward, step 2 first reads optimizer state: two distinct graphs before the steady one).
WARMUP_MIN_STEPS = 3
RECOMPILE_STEPS_WARN = 2  # steps after warm-up that compiled: "keeps growing" from two on
RECOMPILE_TIME_CRIT = 0.20  # compile time after warm-up above this fraction of the train time: critical


def warmup_steps(n_records: int) -> int:
    return max(WARMUP_MIN_STEPS, math.ceil(0.1 * n_records))


def recompile_finding(records: list[dict]) -> dict | None:
    """The ``xla_recompile`` finding from the step records of one rank (all steps, in order)."""
    recs = sorted((r for r in records if "xla_step_compiles" in r), key=lambda r: r["step"])
    if len(recs) <= WARMUP_MIN_STEPS:
        return None
    warm = warmup_steps(len(recs))
    after = recs[warm:]
    hits = [r for r in after if r["xla_step_compiles"] > 0]
    if len(hits) < RECOMPILE_STEPS_WARN:
        return None
    n_compiles = sum(r["xla_step_compiles"] for r in hits)
    first = hits[0]
    prev = next((r for r in reversed(recs) if r["step"] < first["step"]), None)
    shape_now, shape_before = first.get("xla_batch_shape"), (prev or {}).get("xla_batch_shape")
    if shape_now is not None and shape_before is not None and shape_now != shape_before:
        where = f"at step {first['step']} the batch shape changed from {shape_before} to {shape_now}"
    elif shape_now is not None:
        where = f"first at step {first['step']} (batch shape {shape_now}, unchanged: a Python value or " \
                "control flow changed the trace)"
    else:
        where = f"first at step {first['step']}"
    shapes = sorted({tuple(r["xla_batch_shape"]) for r in after if r.get("xla_batch_shape")})
    compile_s = _delta(recs, after, "xla_compile_s")
    train_s = sum(r.get("step_time_s", 0.0) for r in after)
    frac = compile_s / train_s if (compile_s is not None and train_s) else None
    ev = (f"{n_compiles} XLA compilation(s) in {len(hits)} of the {len(after)} steps after warm-up "
          f"(steps {', '.join(str(r['step']) for r in hits[:8])}{', ...' if len(hits) > 8 else ''}); {where}")
    if len(shapes) > 1:
        ev += f"; {len(shapes)} distinct batch shapes after warm-up"
    if frac is not None:
        ev += f"; compiling took {compile_s:.1f} s, {100 * frac:.0f}% of the train time after warm-up"
    return {"severity": "critical" if (frac is not None and frac > RECOMPILE_TIME_CRIT) else "warning",
            "evidence": ev, "step": first["step"], "compiles_after_warmup": n_compiles,
            "batch_shape": shape_now, "previous_batch_shape": shape_before}


def _delta(recs: list[dict], after: list[dict], key: str) -> float | None:
    if not after or key not in after[-1]:
        return None
    start = recs[len(recs) - len(after) - 1].get(key, 0.0) if len(recs) > len(after) else 0.0
    return after[-1][key] - start


def xla_recompile(ev: Evidence) -> dict | None:
    return recompile_finding(ev.xla_steps or [])


__all__ = ["RECOMPILE_STEPS_WARN", "RECOMPILE_TIME_CRIT", "WARMUP_MIN_STEPS", "recompile_finding", "warmup_steps",
           "xla_recompile"]
