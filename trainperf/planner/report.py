"""Plain-text rendering of a plan (aligned columns; no extra dependency)."""

from __future__ import annotations

from trainperf.planner.cost import GIB, Estimate
from trainperf.planner.search import Plan, explain


def _table(rows: list[list[str]], right: set[int]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = []
    for r in rows:
        cells = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))]
        out.append("  ".join(cells).rstrip())
    return out


def _row(rank: str, e: Estimate, spread, far=None) -> list[str]:
    L = e.layout
    lo, hi = spread.bounds_for(e, len(far(e)) if far else 0)
    rc = f"partial {L.recompute_layers}/{e.layers_per_stage}" if L.recompute == "partial" else L.recompute
    return [
        rank, str(L.tp), str(L.pp), str(L.interleave), str(L.dp), str(L.micro_batch), str(e.microbatches),
        rc, "yes" if L.sequence_parallel else "no", str(L.zero),
        f"{e.step_time_s:.2f}", f"{lo:.2f}-{hi:.2f}", f"{e.tflops_per_gpu:.0f}", f"{100 * e.mfu:.1f}%",
        f"{e.memory_bytes / GIB:.1f}",
    ]


HEADER = ["rank", "tp", "pp", "v", "dp", "mb", "m", "recompute", "SP", "zero", "step s", "80% interval s",
          "TFLOP/s/GPU", "MFU", "GiB/GPU"]
RIGHT = {0, 1, 2, 3, 4, 5, 6, 10, 11, 12, 13, 14}


def breakdown(e: Estimate) -> str:
    t = ", ".join(f"{k.replace('_', ' ')} {v:.2f}" for k, v in e.time.items() if v > 0)
    m = ", ".join(f"{k.replace('_', ' ')} {v / GIB:.1f}" for k, v in e.memory.items() if v > 0)
    fit = "fits" if e.fits else "does not fit"
    return (f"time (s): {t}\n  memory (GiB): {m}; {fit} in {e.gpu_memory_bytes / GIB:.0f} GiB, "
            f"binding term: {e.binding.replace('_', ' ')}")


def far_note(far: dict, spread, est) -> str:
    """The plan's words for a query far from every development source (empty when it is near)."""
    if not far or not spread.widens_far:
        return ""
    what = "; ".join(f"{k}: {v}" for k, v in sorted(far.items()))
    n = len(far)
    return (f"far from every development source in {n} respect{'s' if n > 1 else ''} ({what}): the interval counts "
            f"the between-source variance {n + 1} times instead of once, so it is wider than near the development set "
            f"({100 * spread.width_for(est, n):.0f}% against {100 * spread.width_for(est):.0f}% of this estimate); "
            "measure one step (--measured) before trusting the plan")


def made_of_note(spread, est, far: int = 0) -> str:
    """What the best layout's interval is made of: the step's largest term and its share, each part's share of the
    interval's variance (the composition interval), or the step's non-compute share (the calibrated one)."""
    m = spread.made_of(est, far)
    if "largest_term" not in m:
        return (f"  interval: {100 * m['relative_width']:.0f}% wide, the step {100 * m['noncompute_share']:.0f}% "
                "outside compute")
    parts = ", ".join(f"{k.replace('_', ' ')} {100 * v:.0f}%" for k, v in m["variance_shares"].items() if v >= 0.005)
    return (f"  interval: {100 * m['relative_width']:.0f}% wide; the step is {100 * m['largest_share']:.0f}% "
            f"{m['largest_term']} (its largest term; " + ", ".join(f"{k} {100 * v:.0f}%" for k, v in m["shares"].items())
            + f"); the interval's variance: {parts}")


def render(plan: Plan, *, batch_note: str, top: int, baseline, calibration, elapsed: float, emitted,
           flop_convention: str, moves=None, spread=None, stack=None, pins=None, far=None, explained=None) -> str:
    """The plan as text. ``far``: a function of an estimate giving the respects in which it is far from every
    development source (:func:`trainperf.planner.distance.far_from`); ``explained``: the lines of ``--explain``."""
    from trainperf.planner.interval import ACROSS, unvalidated_part

    spread = spread or ACROSS
    far = far or (lambda e: {})
    g, model = plan.gpu, plan.model
    lines = [
        f"trainperf plan: {model.describe()}",
        f"cluster: {plan.gpus} x {g.key} ({g.name}; {g.hbm_gib:g} GiB, dense {g.half_dtype.upper()} peak {g.half_tflops:g} TFLOP/s, "
        f"{g.fabric} {g.nvlink_gbps:g} GB/s, network {g.internode_gbps:g} GB/s per {'device' if g.key == 'cpu' else 'GPU'}, "
        f"{g.gpus_per_node} per node)",
        f"global batch: {plan.global_batch} sequences x {model.seq} tokens ({batch_note})",
        f"searched {plan.evaluated} layouts in {elapsed:.2f} s: {sum(e.fits for e in plan.candidates)} fit, "
        f"{plan.out_of_memory} out of memory, {len(plan.rejected)} degree combinations rejected",
    ]
    if stack is not None:
        mech = ", ".join(f"{k}={'|'.join(v) if isinstance(v, tuple) else v}"
                         for k, v in stack.mechanisms().items() if v is not None)
        lines.append(f"stack: {stack.name} ({mech})")
    if pins:
        lines.append("pinned (held in every candidate): " + ", ".join(f"--{k} {v}" for k, v in pins.items()))
    lines.append("")
    rows = [HEADER] + [_row(str(i + 1), e, spread, far) for i, e in enumerate(plan.candidates[:top])]
    base_est = baseline["estimate"] if baseline else None
    if base_est is not None and baseline["rank"] > top:
        rows.append(_row(str(baseline["rank"]), base_est, spread, far))
    lines += _table(rows, RIGHT)
    lines += [
        "",
        f"TFLOP/s/GPU and MFU count {flop_convention}; MFU is against the dense {g.half_dtype.upper()} peak of {g.key} "
        f"({g.half_tflops:g} TFLOP/s). v: interleaved stages per GPU; m: micro-batches per pipeline per step.",
        "80% interval: " + spread.describe(),
        "",
        f"best: {plan.best.layout.short()}: {plan.best.step_time_s:.2f} s/step "
        f"(80% interval {spread.bounds_for(plan.best, len(far(plan.best)))[0]:.2f}-"
        f"{spread.bounds_for(plan.best, len(far(plan.best)))[1]:.2f} s), "
        f"{plan.global_batch * model.seq / plan.best.step_time_s:,.0f} tokens/s",
        "  " + breakdown(plan.best),
        made_of_note(spread, plan.best, len(far(plan.best))),
    ]
    if explained:
        lines += ["", *explained]
    unvalidated = None if calibration else unvalidated_part(g)
    at = next(i for i, line in enumerate(lines) if line.startswith("80% interval:")) + 1
    wide = far_note(far(plan.best), spread, plan.best)
    if wide:
        lines.insert(at, f"note: the best layout is {wide}.")
    if unvalidated:
        lines.insert(at, f"note: {unvalidated}.")
    for note in plan.notes:
        lines += ["", f"WARNING: {note}"]
    if baseline:
        tp, pp, dp = baseline["degrees"]
        lines.append("")
        head = f"{baseline['source']}: tensor {tp} x pipeline {pp} x data {dp}"
        if base_est is None:
            why = "; ".join(r["reason"] for r in baseline["rejected"]) or "not a valid split of these GPUs"
            lines.append(f"{head}: does not fit or is invalid: {why}")
        else:
            slower = base_est.step_time_s / plan.best.step_time_s - 1
            lines.append(
                f"{head}: ranks {baseline['rank']} of {len(plan.candidates)} at best "
                f"({base_est.layout.short()}: {base_est.step_time_s:.2f} s/step, {100 * base_est.mfu:.1f}% MFU"
                + (f", {100 * slower:.1f}% slower than the best)" if base_est is not plan.best else ", the best)")
            )
            lines.append("  " + breakdown(base_est))
            if base_est is not plan.best:
                lines.append("  why the best beats it: " + "; ".join(explain(plan.best, base_est)))
    if plan.rejected:
        lines.append("")
        lines.append("rejected degree combinations (first 8):")
        for r in plan.rejected[:8]:
            deg = " ".join(f"{k} {r[k]}" for k in ("tp", "pp", "dp") if k in r)
            lines.append(f"  {deg}: {r['reason']}")
    if calibration:
        rep = calibration.report
        m = rep["measured"]
        lines += ["", f"calibrated from {rep['run_dir']}: stack_efficiency "
                      f"{rep['stack_efficiency']['default']} -> {rep['stack_efficiency']['calibrated']} "
                      f"(measured {m['matched']} = {m['target']:.4g}, model "
                      f"{m.get('predicted_before', float('nan')):.4g}: matched "
                      f"{m.get('matched_value', m['target']):.4g}, {_moved(m)})"]
        lines += [f"  note: {n}" for n in rep["notes"]]
    if moves:
        lines += ["", "how the predictions moved with the calibration (step s, before -> after):"]
        rows = [["layout", "before", "after", "change", "rank before"]]
        for mv in moves:
            rows.append([mv["layout"], "-" if mv["before_s"] is None else f"{mv['before_s']:.2f}", f"{mv['after_s']:.2f}",
                         "-" if mv["change"] is None else f"{100 * mv['change']:+.1f}%", str(mv["rank_before"] or "-")])
        lines += ["  " + ln for ln in _table(rows, {1, 2, 3, 4})]
    if emitted:
        lines += ["", f"wrote {emitted} (the best layout as a trainperf config)"]
    lines += ["", "model: trainperf/planner (analytical; constants: trainperf plan --constants). Estimates, not measurements."]
    return "\n".join(lines)


def _moved(m: dict) -> str:
    """How far (in log) the calibration moved the model toward the measurement, and why not all the way."""
    import math

    pred, target, matched = m.get("predicted_before"), m.get("target"), m.get("matched_value", m.get("target"))
    w = m.get("calibration_weight", 1.0)
    try:
        frac = math.log(matched / pred) / math.log(target / pred)
    except (TypeError, ValueError, ZeroDivisionError):
        frac = w
    cap = m.get("held_back_max_log")
    why = (f"one run sets the level in part (weight {w:g}), holding back at most {100 * (math.exp(cap) - 1):.1f}% of a "
           "deviation larger than the development set's" if isinstance(cap, (int, float)) else
           "as the development set says one run sets the level")
    return f"moved {frac:.2g} of the way in log: {why}"
