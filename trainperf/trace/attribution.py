"""Who made the GPU wait: every microsecond of a rank's step charged to one named cause, summing to the step,
with the gain of removing each host cause recomputed on the rank's dependency graph.

Two entry points, both torch-free and vectorized (no Python loop per event):

``attribute_windows(tl, lo, hi) -> list[dict[str, float]]``
    For arbitrary windows (arrays of start / end, in the Timeline's microseconds), the microseconds of each
    cause in each window; each window's values sum to its length. Causes (:data:`CAUSES`): ``compute``,
    ``communication``, ``memcpy``, ``memset`` (the GPU busy), then the idle time by what kept the GPU waiting:
    ``allocator``, ``sync``, ``gc``, ``dataloader``, ``optimizer``, ``launch``, ``cpu_op``, ``untraced``, and
    ``gpu_wait`` (queued GPU work that did not start on the idle device: it waited on what the trace does not
    show). The
    cross-rank stage asks it why a late rank arrived late (its window before a collective).

``attribute(tl, spans, host_spans) -> dict``
    The ``"attribution"`` of ``analyze_timeline`` (``trainperf diagnose --json``: ``traces[i].attribution``),
    over the analysed steps, per step on average::

        {"method": str,                   # how (below), in one line
         "steps": int, "step_us": float,  # the steps analysed, their mean duration
         "gpu_us":  {"compute", "communication", "memcpy", "memset", "idle"},   # us per step
         "gpu_pct": {same keys},          # % of the step; the five sum to 100
         "idle_causes": [                 # the idle, by cause, largest first (causes with any time)
            {"cause": str,                # allocator | sync | gc | dataloader | optimizer | launch | cpu_op |
                                          # untraced | gpu_wait
             "detail": str | null,        # its largest single name: cudaFree, aten::item, Optimizer.step#AdamW.step
             "names": [[str, us_per_step], ...],    # its top 5 names
             "us_per_step": float, "pct": float,    # idle charged to it, and that in % of the step
             "calls_per_step": float,     # distinct host events (calls, ops, waits; untraced stretches) charged
             "callers": [[str, us_per_step], ...],  # the top 5 CPU ops around them (allocator, sync, launch, cpu_op)
             "whatif_step_us": float | null,  # the step replayed without this cause's host time (below)
             "gain_us": float | null}],   # step_us - whatif_step_us (>= 0); both null when unreplayable
         "untraced_us": float,            # idle per step no host event covers
         "refill_us": float,              # idle per step moved to a wait by the refill rule
         "device": int | null, "main_thread": int, "threads": [int],
         "unreplayable": str | null}      # why the rank's times cannot be replayed (GPU work before its launch
                                          # call: the clocks disagree): then no refill and no gains

**Method** (docs/concepts/attribution.md has it in full, with its check against HTA's critical path):

1. GPU busy on the rank's device: compute kernels, then communication kernels where no compute runs, then
   copies, then fills; the rest is idle (:mod:`trainperf.trace.charge`).
2. Each idle gap is charged along the critical path through it: the gap ends when a GPU event starts; its
   launch call names the host thread the GPU waited for. From that call's start to the gap's end: the launch
   (call + launch-to-start latency), as part of whatever phase it is in. Before the call: what that thread was
   doing, by precedence (:mod:`trainperf.trace.hostmap`): allocator and sync calls, then gc, the DataLoader
   and the optimizer step, then launch calls, then plain CPU ops / Python functions / annotations, else
   untraced. Queued work that still has not started 30 us after its launch call returned, on an idle device,
   is ``gpu_wait``.
3. Refill: a named cause (allocator, sync, gc, DataLoader, optimizer) eats the GPU's lead; the idle gaps that
   shrink when its host time is replayed away (4.), by more than it is charged there already, give it that
   much of their launch / cpu_op / untraced idle (:mod:`trainperf.trace.whatif`): a sync drain is the sync's.
4. The gain of a cause: the rank's dependencies (launch -> kernel by correlation id, stream order,
   cross-stream events inferred from the times, syncs waiting on their streams, the host threads as one
   serial program) replayed with that cause's host time removed (:mod:`trainperf.trace.replay`): the host
   moves earlier, each kernel starts at max(its launch + latency, its stream predecessor, its dependency),
   each sync waits for its streams. Removed syncs / allocator calls no longer wait; removing ``launch`` also
   drops the launch latency; removing ``gpu_wait`` caps every latency and queued gap at 30 us. The step's new end is the later of the host's and the GPU's.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from trainperf.trace.columns import unique

from trainperf.trace import charge as chg
from trainperf.trace import intervals as iv
from trainperf.trace import whatif
from trainperf.trace.charge import CAUSES, CODE, GPU_CAUSES, IDLE_CAUSES, Charges
from trainperf.trace.patterns import load as load_patterns
from trainperf.trace.timeline import Timeline

METHOD = ("idle charged along the critical path: each gap to the host thread that launched the next GPU work "
          "(the launch itself, else what that thread was doing: allocator/sync calls > gc/DataLoader/optimizer > "
          "launch > CPU op/Python > untraced), the refill after a named cause to it; gain = the step replayed on "
          "the rank's dependency graph without the cause's host time (docs/concepts/attribution.md)")
_CALLER_CAUSES = {"allocator", "sync", "launch", "cpu_op"}
_TOP = 5


def charges(tl: Timeline, patterns: Any = None, kind: np.ndarray | None = None,
            launch: np.ndarray | None = None) -> Charges:
    """The rank's charged timeline, computed once per Timeline and pattern table (``kind``: each GPU event's
    class by that table; ``launch``: :func:`trainperf.trace.tb.launch_index`; when the caller has them)."""
    pats = load_patterns(patterns)
    key = repr(pats.to_dict())
    cached = tl.__dict__.get("_attribution_charges")
    if cached is not None and cached[0] == key:
        return cached[1]
    ch = whatif.charged(tl, pats, kind, launch)
    tl.__dict__["_attribution_charges"] = (key, ch)
    return ch


def attribute_windows(tl: Timeline, lo, hi, *, patterns: Any = None) -> list[dict[str, float]]:
    """Microseconds of each cause of :data:`CAUSES` in each window ``[lo[k], hi[k])`` (Timeline us); each
    window's values sum to its length (time outside the trace is ``untraced``)."""
    lo = np.atleast_1d(np.asarray(lo, dtype=np.float64))
    hi = np.atleast_1d(np.asarray(hi, dtype=np.float64))
    if lo.shape != hi.shape:
        raise ValueError(f"attribute_windows: lo has {lo.size} window start(s) and hi {hi.size} end(s); pass one "
                         "end per start")
    hi = np.maximum(hi, lo)
    with np.errstate(over="ignore", invalid="ignore"):
        m = chg.windows(charges(tl, patterns), lo, hi)
    return [dict(zip(CAUSES, map(float, row))) for row in m]


def _top(ids: np.ndarray, us: np.ndarray, names: list, nsteps: int) -> list[list]:
    if ids.size == 0:
        return []
    ok = ids >= 0
    if not ok.any():
        return []
    ids, us = ids[ok], us[ok]
    u = np.flatnonzero(np.bincount(ids, minlength=len(names)))  # the names there, in order (np.unique's)
    s = np.bincount(ids, weights=us, minlength=len(names))[u]  # their time, summed in the pieces' order
    o = np.argsort(-s)[:_TOP]
    return [[str(names[int(u[i])]), float(s[i]) / nsteps] for i in o if s[i] > 0]


def attribute(tl: Timeline, spans: list, host_spans: list, *, patterns: Any = None,
              kind: np.ndarray | None = None, launch: np.ndarray | None = None) -> dict[str, Any] | None:
    """The attribution of the analysed steps (module docstring); None without steps or GPU events. ``kind``:
    each GPU event's class (0 compute, 1 communication, 2 memory), ``launch`` its launch call, when the caller
    has them."""
    if not spans or tl.g_ts.size == 0:
        return None
    with np.errstate(over="ignore", invalid="ignore"):  # a corrupt time near float's limit: inf, not a warning
        return _attribute(tl, spans, host_spans, charges(tl, patterns, kind, launch))


def _attribute(tl: Timeline, spans: list, host_spans: list, ch: Charges) -> dict[str, Any]:
    lo = np.array([s for s, _ in spans], dtype=np.float64)
    hi = np.array([e for _, e in spans], dtype=np.float64)
    n = lo.size
    w = chg.windows(ch, lo, hi)
    step_us = float(np.mean(hi - lo))
    per = w.sum(axis=0) / n
    gpu_us = {k: float(per[CODE[k]]) for k in GPU_CAUSES}
    gpu_us["idle"] = float(per[len(GPU_CAUSES):].sum())
    gpu_pct = {k: (100.0 * v / step_us if step_us > 0 else None) for k, v in gpu_us.items()}
    # the charged pieces inside the steps
    steps_set = iv.union(lo, hi)
    inside = iv.within(steps_set, ch.lo, ch.hi)
    names = tl.names
    lo0, step_end = float(lo[0]), float(hi[-1])
    host_end = float(host_spans[len(spans) - 1][1]) if host_spans else step_end
    replay = ch.unreplayable is None
    if replay:
        a0, b0 = whatif.span_end(tl, ch, *whatif.run(tl, ch, None), lo0, host_end, step_end)
    causes = []
    for name in IDLE_CAUSES:
        code = CODE[name]
        us = float(per[code])
        if us <= 0:
            continue
        m = (ch.cause == code) & (inside > 0)
        row = {"cause": name, "detail": None, "names": _top(ch.detail[m], inside[m], names, n),
               "us_per_step": us, "pct": 100.0 * us / step_us if step_us > 0 else None,
               "calls_per_step": float(unique(ch.src[m]).size) / n,
               "callers": _top(ch.caller[m], inside[m], names, n) if name in _CALLER_CAUSES else []}
        row["detail"] = row["names"][0][0] if row["names"] else None
        row["whatif_step_us"] = row["gain_us"] = None
        if replay:
            a, b = whatif.span_end(tl, ch, *whatif.run(tl, ch, name), lo0, host_end, step_end)
            gain = max(0.0, ((b0 - a0) - (b - a)) / n)
            row["whatif_step_us"] = step_us - gain
            row["gain_us"] = gain
        causes.append(row)
    causes.sort(key=lambda r: -r["us_per_step"])
    # the replays, the graph and the host map are not needed past here (attribute_windows reads the charges
    # alone; another attribution makes them again)
    ch.whatif.clear()
    ch.graph = None
    ch.hmap.release()
    return {"method": METHOD, "steps": n, "step_us": step_us, "gpu_us": gpu_us, "gpu_pct": gpu_pct,
            "idle_causes": causes, "untraced_us": float(per[CODE["untraced"]]),
            "refill_us": float(inside[ch.refilled].sum()) / n, "device": ch.device, "main_thread": ch.main_thread,
            "threads": [int(t) for t in ch.hmap.threads], "unreplayable": ch.unreplayable}


__all__ = ["CAUSES", "METHOD", "attribute", "attribute_windows", "charges"]
