"""One trace file in, one rank's figures out: :func:`analyze_file` (the element of the ``traces`` list of
``trainperf diagnose --json``). Streamed and torch-free: reader -> timeline arrays -> figures."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable

import numpy as np

from trainperf.errors import UserError
from trainperf.trace import attribution, hta, tb
from trainperf.trace.columns import release_freed_memory, unique
from trainperf.trace import figures as fg
from trainperf.trace.collectives import collectives
from trainperf.trace.patterns import load as load_patterns
from trainperf.trace.patterns import tb_tensor_core
from trainperf.trace.reader import TraceReader
from trainperf.trace.timeline import Collector, Timeline


def read_timeline(path: str | Path, progress: Callable[[int], None] | None = None) -> Timeline:
    r = TraceReader(path, progress)
    try:
        release_freed_memory(Path(path).stat().st_size)
    except OSError:
        pass  # the reader says why
    c = Collector()
    for chunk in r.chunks():
        c.feed(chunk)
    return c.finish(r.meta)


def _clean(x: Any) -> Any:
    """Strict JSON: NaN/inf -> None, numpy scalars -> Python, recursively."""
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if isinstance(x, (np.floating, float)):
        f = float(x)
        return f if math.isfinite(f) else None
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, np.bool_):
        return bool(x)
    return x


def _pct(x: float | None) -> float | None:
    return None if x is None else 100.0 * x


def timeline_notes(tl: Timeline) -> list[str]:
    """What the reader left out or repaired in a corrupt or hand-edited trace, one line each."""
    out = []
    if tl.far_events:
        out.append(f"{tl.far_events} GPU event(s) or runtime call(s) start or end implausibly far from the rest of "
                   "the trace (minutes away: a corrupt ts or dur): left out of every figure")
    if tl.duplicate_events:
        out.append(f"{tl.duplicate_events} GPU event(s) appear twice (same start, duration, name, stream and "
                   "correlation id: a merged or concatenated trace): counted once")
    if tl.bad_occupancy:
        out.append(f"{tl.bad_occupancy} kernel(s) had an achieved occupancy outside 0-100%: left out of the "
                   "occupancy figures")
    if tl.bad_steps:
        out.append(f"{tl.bad_steps} ProfilerStep annotation(s) had a zero, negative or non-numeric duration: left out")
    if tl.overlapping_steps:
        out.append(f"{tl.overlapping_steps} ProfilerStep annotation(s) start inside an earlier step (nested or "
                   "overlapping; torch writes them one after another): left out")
    if tl.repeated_step_numbers:
        out.append(f"{tl.repeated_step_numbers} ProfilerStep annotation(s) repeat an earlier step's number (a merged "
                   "or hand-edited trace): each is still its own step")
    if tl.empty_steps:
        out.append(f"the {tl.empty_steps} ProfilerStep window(s) hold none of the trace's GPU events or runtime "
                   "calls (steps timed apart from everything else): the trace span is used as one step")
    return out


def _pattern_notes(tl: Timeline, pats: Any, cls: dict) -> list[str]:
    """A user's communication pattern that also matched kernels the built-in table calls GEMM or convolution
    (``--comm-pattern .`` matches everything): their time then counts as communication; the note says how much."""
    from trainperf.trace.patterns import DEFAULT

    if not getattr(pats, "communication", None) or not tl.g_ts.size:
        return []
    kern = tl.g_kind == 0
    was_compute = np.zeros(max(len(tl.names), 1), dtype=bool)
    for i in unique(tl.g_name).tolist():
        d = DEFAULT.describe(tl.names[i])
        was_compute[i] = d[0] == "compute" and d[3]
    caught = kern & (cls["kind"] == 1) & was_compute[tl.g_name]
    if not caught.any():
        return []
    share = float(tl.g_dur[caught].sum()) / max(float(tl.g_dur[kern].sum()), 1e-9)
    example = tl.names[int(tl.g_name[np.flatnonzero(caught)[0]])]
    return [f"the communication pattern(s) {', '.join(map(repr, pats.communication))} also match GEMM/convolution "
            f"kernels ({100 * share:.0f}% of kernel time, e.g. {str(example)[:60]!r}): they count as communication "
            "here; narrow the pattern to the collective kernels' names"]


def analyze_timeline(tl: Timeline, *, path: str = "", rank: int | None = None, patterns: Any = None,
                     top_n: int = 10) -> dict[str, Any]:
    pats = load_patterns(patterns)
    launch = tb.launch_index(tl)
    cls = fg.classify(tl, pats)
    notes = _pattern_notes(tl, pats, cls)
    tc_names = np.zeros(max(len(tl.names), 1), dtype=bool)
    for i in unique(tl.g_name).tolist():  # the GPU events' names (the table also names every CPU event)
        tc_names[i] = tb_tensor_core(tl.names[i])
    tc_tb = tc_names[tl.g_name]
    tc_tb &= tl.g_kind == 0
    st = tb.steps(tl, launch)
    notes += st["notes"]
    spans = st["spans"]
    # the attribution first: its peak then holds none of the other figures' arrays, and it keeps only its
    # charges past it (attribute_windows, for the collectives below)
    attr = attribution.attribute(tl, spans, st["host"], patterns=pats, kind=cls["kind"], launch=launch) \
        if tl.g_ts.size else None
    lo = np.array([s for s, _ in spans])
    hi = np.array([e for _, e in spans])
    nsteps = len(spans)
    roles = tb.role_sets(tl, cls["kind"] == 1)
    bd = tb.breakdown(spans, roles)
    del roles  # the role unions (as many intervals as launches and kernels) are not needed past here
    gm = tb.gpu_metrics(tl, spans, launch, tc_tb, cls["tc"])
    main = gm["main"]
    dm = gm["devices"].get(main, {}) if main is not None else {}
    h = hta.figures(tl, launch, cls["kind"])
    has_gpu = tl.g_ts.size > 0
    if not has_gpu:
        notes.append("no GPU events (a CPU-only trace): the GPU figures are None")
    if tl.untimed:
        notes.append(f"{tl.untimed} GPU event(s) or runtime call(s) had a start time that is not a number (a corrupt "
                     "or hand-edited trace): left out of every figure")
    if tl.bad_durations:
        notes.append(f"{tl.bad_durations} GPU event(s) or runtime call(s) had a duration that is negative or not a "
                     "number (a corrupt or hand-edited trace): timed as 0")
    notes += timeline_notes(tl)
    cm = None
    if nsteps and has_gpu:
        cm = fg.comm(tl, cls, lo, hi)
    elif nsteps and tl.comm_ops:
        cm = fg.cpu_comm(tl, lo, hi)
        notes.append(f"no GPU events: communication is the time {cm['cpu_ops']} collective CPU op(s) (gloo:* / "
                     "nccl:*) cover, exposed where no cpu_op runs beside them; a rank's compute is its step less "
                     "its exposed communication")
    syncs, sync_sum = fg.host_syncs(tl, lo, hi)
    dev = fg.device(tl, main)
    if dev and dev.get("from") == "kernel names":
        notes.append(f"no deviceProperties: compute capability {dev['compute_capability']} inferred from kernel names")
    temporal, idle, ov = h["temporal"], h["idle"], h["overlap"]
    di = tl.meta.get("distributedInfo")
    pct = bd["pct"] or {}
    per_step = []
    for j, (s, e) in enumerate(spans):
        row = {"number": st["numbers"][j], "start_us": s + tl.base_us, "dur_us": e - s,
               "host_dur_us": st["host"][j][1] - st["host"][j][0]}
        row |= {f"{k}_us": v for k, v in bd["per_step_us"][j].items() if k != "total"}
        if cm:
            row |= {"comm_kernel_us": cm["_step_comm_us"][j], "exposed_comm_us": cm["_step_exposed_comm_us"][j],
                    "non_comm_gpu_us": cm["_step_compute_us"][j]}
        per_step.append(row)
    launch_stats = h["launch"]
    if launch_stats is not None and nsteps:
        r_in = fg.step_of(tl.r_ts, lo, hi) >= 0
        launch_stats = dict(launch_stats, launch_us_per_step=float(tl.r_dur[r_in].sum()) / nsteps)
    if attr and attr["unreplayable"]:
        notes.append(attr["unreplayable"])
    res: dict[str, Any] = {
        "path": path, "rank": rank, "cpu_only": not has_gpu, "device": (dev or {}).get("name") if dev else None,
        "device_info": dev, "distributed_info": di if isinstance(di, dict) else None,
        "steps": nsteps, "steps_found": st["found"] or "none: the whole trace is one step",
        "step_numbers": st["numbers"], "step_time_us": bd["step_time_us"],
        "step_breakdown_pct": {k: pct.get(k) for k in ("kernel", "memcpy", "memset", "communication", "runtime",
                                                        "dataloader", "cpu_exec", "other")},
        "gpu_utilization_pct": _pct(dm.get("utilization")), "sm_efficiency_pct": _pct(dm.get("sm_efficiency")),
        "achieved_occupancy_pct": dm.get("occupancy_pct"), "tensor_core_kernel_pct": _pct(dm.get("tensor_core")),
        "tensor_core_kernel_pct_tb_list": _pct(dm.get("tensor_core_tb")),
        "temporal_pct": (temporal or {}).get("pct") or {"compute": None, "non_compute": None, "idle": None},
        "idle_pct": (idle or {}).get("pct") or {"host_wait": None, "kernel_wait": None, "other": None},
        "comm_compute_overlap_pct": ov["pct"],
        "top_kernels": fg.top_kernels(tl, cls, h["mask"], top_n, nsteps),
        "launch": launch_stats or {},
        "memcpy": fg.memcpy(tl, lo, hi) if has_gpu else {},
        "host_syncs": syncs if (tl.r_ts.size or tl.sync_ops) else None,
        "host_sync": sync_sum,
        "comm": {k: v for k, v in (cm or {}).items() if not k.startswith("_")} | {"overlap_pct": ov["pct"]},
        "dataloader": fg.dataloader(tl, lo, hi, [r["dataloader"] for r in bd["per_step_us"]]),
        "tensor_cores": fg.tensor_cores(tl, cls, lo, hi, tc_tb) if has_gpu else {},
        "occupancy": fg.occupancy(tl, cls, float(lo[0]), float(hi[-1])) if (has_gpu and nsteps) else {},
        "kernel_us": {k: float(tl.g_dur[(cls["kind"] == c) & (tl.g_kind == 0)].sum()) for k, c in fg.KIND_CODE.items()},
        "kernel_type_pct": h["kernel_types"]["pct"], "kernel_type_us": h["kernel_types"]["us"],
        "temporal_us": {k: (temporal or {}).get(f"{k}_us") for k in ("compute", "non_compute", "idle")}
        | {"window": (temporal or {}).get("window_us")},
        "idle_us": (idle or {}).get("us"), "idle_by_stream": (idle or {}).get("by_stream"),
        "hta_window": h["window"], "per_step": per_step,
        "attribution": attr,
        "gpus": {str(k): {kk: (_pct(v) if kk in ("utilization", "sm_efficiency", "tensor_core", "tensor_core_tb")
                               else v) for kk, v in d.items()} for k, d in gm["devices"].items()},
        "patterns": pats.source, "events": tl.events, "base_time_us": tl.base_us,
        "notes": notes,
        "_step_compute_us": cm["_step_compute_us"] if cm else [],
        "_step_comm_us": cm["_step_comm_us"] if cm else [],
        "_step_exposed_comm_us": cm["_step_exposed_comm_us"] if cm else [],
        "_comm": collectives(tl, cls["kind"], lo, hi) if cm else None,
    }
    return _clean(res)


def analyze_file(path: str | Path, *, rank: int | None = None, patterns: Any = None, top_n: int = 10,
                 progress: Callable[[int], None] | None = None) -> dict[str, Any]:
    """One rank's figures from one trace file (every key: the docstrings of figures.py, tb.py, hta.py). Raises
    :class:`~trainperf.errors.UserError` naming the file when it is not a readable trace."""
    tl = read_timeline(path, progress)
    if not tl.all_max > tl.all_min:  # nothing measured: its figures would read as "no findings"
        raise UserError(f"{path}: measures no time ({tl.events} event(s); none a complete event (ph 'X') of a "
                        "category torch writes (kernel, cpu_op, cuda_runtime, user_annotation...) with a time "
                        "and a duration): a trace of nothing, or not a torch.profiler trace. Profile at least "
                        "one active step (torch.profiler.schedule(..., active=1) or more) and pass the trace it "
                        "writes")
    return analyze_timeline(tl, path=str(path), rank=rank, patterns=patterns, top_n=top_n)


__all__ = ["analyze_file", "analyze_timeline", "read_timeline"]
