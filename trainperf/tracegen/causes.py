"""A real rank edited to carry a known host cause of GPU idle time, with the truth a reader should find.

``inject(src, out, cause, ...) -> dict`` reads one real torch.profiler trace, adds host time of one kind on
every profiler step, and writes a trace that stays consistent: every host event after the insertion moves
later by what was added, every GPU event is replayed on the rank's dependency graph
(:mod:`trainperf.trace.replay`: it starts at max(its launch + latency, its stream predecessor, its
cross-stream dependency); syncs wait for their streams), so the GPU absorbs what its lead can hide and idles
for the rest, as a real run would. The causes:

==============  ==================================================================  =====================
``cause``       what is added on every step                                         expected cause
==============  ==================================================================  =====================
``free``        ``calls`` ``cudaFree`` calls (``hipFree`` with ``rocm=True``)       ``allocator``
                before the step's first collective (its top-level CPU op; a step
                without one: before its optimizer step), the first waiting for
                the device (``cudaFree`` synchronizes it), each then taking
                ``us / calls``: ``torch.cuda.empty_cache()`` in the loop
``sync``        ``calls`` ``aten::item`` ops spread over the step's launches, each  ``sync``
                a ``cudaStreamSynchronize`` on the stream its thread last launched
                on (8 us of op before, 4 us after the wait): the sync drain
``dataloader``  ``us`` more inside the DataLoader's ``__next__`` (one is added at    ``dataloader``
                the step's start when the trace has none)
``python``      ``us`` of Python before the step's first event (op or annotation)   ``cpu_op`` (traced) /
                on the loop's thread: a ``python_function`` event (``traced=True``)  ``untraced``
                or nothing at all (``traced=False``)
``optimizer``   ``us`` spread over the launches inside ``Optimizer.step#...``: the   ``optimizer``
                host-side loop of an unfused (per-parameter) optimizer
==============  ==================================================================  =====================

The truth (returned, and what ``truth.json`` beside a made set holds): the mean step time before and after
as the TensorBoard plugin's steps measure it (:func:`trainperf.trace.tb.steps`) and their difference, the
GPU idle the edit added per step (the GPU's work is unchanged, so the step grows by exactly the idle it
adds); ``rocm=True`` writes the ROCm spelling of the same rank (``hip*`` runtime calls, RCCL's
``ncclDevKernel_Generic`` collectives, MIOpen xdlops convolutions and Tensile ``Cijk_`` GEMMs for cuDNN's and
cuBLAS's, an MI300X device) so that the same truth holds for ROCm names.

The source is read whole (``json.load``): it is one real rank of a few MB.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from trainperf.trace import intervals as iv
from trainperf.trace import replay, tb
from trainperf.trace.analyze import read_timeline
from trainperf.trace.hostmap import name_classes
from trainperf.trace.patterns import DEFAULT, classify_kernel, host_kind
from trainperf.tracegen.synth import load_trace, write_trace
from trainperf.trace.timeline import CATEGORIES, thread_id

CAUSES = ("free", "sync", "dataloader", "python", "optimizer")
EXPECTED = {"free": "allocator", "sync": "sync", "dataloader": "dataloader", "python": "cpu_op",
            "optimizer": "optimizer"}
_EPS = 1e-3  # us: an insertion point this far before the event it precedes
_GPU_CODE = 1
_RCCL = "ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)"
_MIOPEN = "igemm_fwd_gtcx3_nhwc_fp32_bx0_ex1_bt128x128x16_wt32x32x2_ws1x1_wr2x2_ta1x4x4x1_1x4x1x32_tb1x4x4x1_1x4x1x32"
_TENSILE = "Cijk_Ailk_Bljk_SB_MT128x128x16_MI32x32x2x1_SN_LDSB0_AFC1_AFEM1"
PYTHON_FUNCTION = "train.py(212): log_metrics"


def _is_gpu(e: dict) -> bool:
    c = CATEGORIES.get(str(e.get("cat")).lower()) if e.get("cat") is not None else None
    return e.get("ph") == "X" and c is not None and c[0] == _GPU_CODE


def _num(x: float) -> float | int:
    x = float(x)
    return int(x) if x.is_integer() and abs(x) < 2**53 else round(x, 3)


def _top_op_start(tl, tid: int, t: float) -> float:
    """The start of the outermost CPU op (not an annotation) on ``tid`` around ``t``, else ``t``."""
    c = np.flatnonzero((tl.c_tid == tid) & (tl.c_kind == 0) & (tl.c_ts <= t) & (tl.c_ts + tl.c_dur >= t))
    if c.size == 0:
        return t
    names = [tl.names[i] for i in tl.c_name[c]]
    keep = [i for i, n in zip(c, names) if host_kind(n) == "other"]
    return float(min(tl.c_ts[keep])) if keep else t


def _optimizer_step(tl, lo: float, hi: float) -> float:
    """The start of the step's ``Optimizer.step#...`` annotation."""
    opt = [i for i in np.flatnonzero((tl.c_ts >= lo) & (tl.c_ts < hi))
           if host_kind(tl.names[tl.c_name[i]]) == "optimizer" and "step" in tl.names[tl.c_name[i]]]
    if not opt:
        raise ValueError(f"a step [{lo:.0f}, {hi:.0f}) has no Optimizer.step# annotation: this edit needs one")
    return float(tl.c_ts[opt[0]])


class _Edit:
    """What to add: host delays (instant, us) and waits (instant, device-wide?, us after), and the events that
    show them (built once the replay knows their times)."""

    def __init__(self):
        self.add_t: list[float] = []
        self.add_us: list[float] = []
        self.waits: list[tuple[float, bool, int, float]] = []  # (at, device-wide, stream code, after)
        self.shows: list[tuple] = []  # (kind, anchor instant, thread, payload)


def _plan(tl, cause: str, launch: np.ndarray, g: replay.Graph, steps: list, us: float, calls: int,
          traced: bool) -> _Edit:
    ed = _Edit()
    has = launch >= 0
    l_ts = np.where(has, tl.r_ts[np.maximum(launch, 0)], np.nan)
    l_tid = np.where(has, tl.r_tid[np.maximum(launch, 0)], -1)
    comm = np.array([classify_kernel(tl.names[i]) == "communication" for i in tl.g_name], dtype=bool)
    steps_on = np.flatnonzero(np.isin(tl.c_name, [i for i, n in enumerate(tl.names) if host_kind(n) == "step"]))
    th, cnt = np.unique(l_tid[has], return_counts=True)
    main = int(tl.c_tid[steps_on[0]]) if steps_on.size else (int(th[int(np.argmax(cnt))]) if th.size else -1)
    # main: the training loop's thread (its ProfilerStep annotations), else the one that launches the most
    for (lo, hi) in steps:
        in_step = has & (l_ts >= lo) & (l_ts < hi)
        if cause == "free":
            c = np.flatnonzero(in_step & comm)
            if c.size:
                k = c[np.argmin(l_ts[c])]
                at = _top_op_start(tl, int(l_tid[k]), float(l_ts[k])) - _EPS
            else:  # a step with no collective: before its optimizer step
                a = _optimizer_step(tl, lo, hi)
                c = np.flatnonzero(in_step & (l_ts >= a))
                if c.size == 0:
                    raise ValueError(f"a step [{lo:.0f}, {hi:.0f}) launches neither a collective nor an optimizer "
                                     "step: 'free' needs one of them")
                k = c[np.argmin(l_ts[c])]
                at = a - _EPS
            ed.waits.append((at, True, -1, us))
            ed.shows.append(("free", at, int(l_tid[k]), (calls, us)))
        elif cause == "sync":
            c = np.flatnonzero(in_step & (tl.g_kind == 0))
            c = c[np.argsort(l_ts[c])]
            if c.size < calls + 1:
                raise ValueError(f"a step launches {c.size} kernel(s): too few for {calls} syncs")
            for j in range(calls):
                k = c[(j + 1) * c.size // (calls + 1)]
                at = _top_op_start(tl, int(l_tid[k]), float(l_ts[k])) - _EPS
                stream = int(np.searchsorted(np.unique(tl.g_stream), tl.g_stream[k]))
                ed.add_t.append(at - _EPS)
                ed.add_us.append(8.0)
                ed.waits.append((at, False, stream, 4.0))
                ed.shows.append(("sync", at, int(l_tid[k]), None))
        elif cause == "dataloader":
            dl = [i for i in np.flatnonzero((tl.c_ts >= lo) & (tl.c_ts < hi))
                  if host_kind(tl.names[tl.c_name[i]]) == "dataloader"]
            if dl:
                i = dl[0]
                ed.add_t.append(float(tl.c_ts[i] + tl.c_dur[i]) - _EPS)
                ed.add_us.append(us)
            else:
                at = float(lo) + _EPS
                ed.add_t.append(at)
                ed.add_us.append(us)
                ed.shows.append(("dataloader", at, main, us))
        elif cause == "python":  # before the step's first event on the loop's thread (op or annotation)
            ev = np.flatnonzero((tl.c_tid == main) & (tl.c_ts > lo) & (tl.c_ts < hi))
            ev = ev[[host_kind(tl.names[i]) != "step" for i in tl.c_name[ev]]]
            at = (float(tl.c_ts[ev].min()) if ev.size else float(lo) + 1.0) - _EPS
            ed.add_t.append(at)
            ed.add_us.append(us)
            if traced:
                ed.shows.append(("python", at, main, us))
        elif cause == "optimizer":
            a = _optimizer_step(tl, lo, hi)
            i = int(np.flatnonzero(tl.c_ts == a)[0])
            b = a + float(tl.c_dur[i])
            inside = np.flatnonzero((tl.r_ts >= a) & (tl.r_ts < b))
            inside = inside[np.array([host_kind(tl.names[tl.r_name[i]]) == "launch" for i in inside], dtype=bool)]
            if inside.size == 0:
                raise ValueError("the optimizer step launches nothing: 'optimizer' needs its launches")
            for i in inside:
                ed.add_t.append(float(tl.r_ts[i]) - _EPS)
                ed.add_us.append(us / inside.size)
        else:
            raise ValueError(f"cause={cause!r}: choose one of {', '.join(CAUSES)}")
    return ed


def _rocm_name(name: str, cat: str | None) -> str:
    """A CUDA-side name as ROCm spells its twin: hip* runtime calls, RCCL's generic collective kernel, MIOpen's
    xdlops convolutions and Tensile's GEMMs (matrix-core kernels) for cuDNN's and cuBLAS's."""
    c = str(cat).lower()
    if c in ("cuda_runtime", "runtime", "cuda_driver") and name.startswith("cuda"):
        return "hip" + name[4:]
    if c == "kernel":
        if re.match(r"nccl", name, re.I):
            return _RCCL
        if DEFAULT.describe(name)[3]:  # a GEMM or a convolution
            return _MIOPEN if re.search(r"conv|cudnn|implicit|wgrad|dgrad|fprop", name, re.I) else _TENSILE
    return name


def inject(src: str | Path, out: str | Path, cause: str | None, *, us: float = 2000.0, calls: int = 4,
           traced: bool = True, rocm: bool = False, layout: str = "lines") -> dict[str, Any]:
    """Write ``out``: the real trace ``src`` with ``cause`` (:data:`CAUSES`) added on every profiler step
    (module docstring; None: no edit, e.g. the ROCm spelling alone with ``rocm=True``). Returns the truth:
    ``{"cause", "expected", "detail", "step_us_before", "step_us_after", "truth_us_per_step", "steps", "rocm",
    "path", "added_host_us_per_step"}``."""
    if cause is not None and cause not in CAUSES:
        raise ValueError(f"cause={cause!r}: choose one of {', '.join(CAUSES)}")
    if us <= 0 or calls < 1:
        raise ValueError(f"us={us}, calls={calls}: need us > 0 and calls >= 1")
    meta, events = load_trace(src)
    tl = read_timeline(src)
    launch = tb.launch_index(tl)
    st = tb.steps(tl, launch)
    if not st["found"]:
        raise ValueError(f"{src}: no ProfilerStep#N: the edit is made on every profiler step")
    g = replay.build(tl, launch, replay.wait_calls(tl, name_classes(tl)))
    ed = _plan(tl, cause, launch, g, st["host"], us, calls, traced) if cause else _Edit()
    ns = max(g.nstreams, 1)
    masks = np.zeros((len(ed.waits), ns), dtype=bool)
    for j, (_, wide, stream, _) in enumerate(ed.waits):
        if wide or stream < 0:
            masks[j] = True
        else:
            masks[j, stream] = True
    extra = (np.array([w[0] for w in ed.waits]), masks, np.array([w[3] for w in ed.waits])) if ed.waits else None
    starts, h = replay.run(g, iv.EMPTY, add_t=ed.add_t, add_us=ed.add_us, extra_waits=extra)
    new_events = _rewrite(meta, events, tl, starts, h, ed, rocm)
    if rocm:
        for d in meta.get("deviceProperties") or []:
            if isinstance(d, dict):
                d["name"] = "AMD Instinct MI300X"
    p = write_trace(out, meta, new_events, layout=layout)
    before = _mean_step(tl)
    after = _mean_step(read_timeline(p))
    detail = {"free": "hipFree" if rocm else "cudaFree", "sync": "hipStreamSynchronize" if rocm else
              "cudaStreamSynchronize", "python": PYTHON_FUNCTION if traced else None}.get(cause)
    return {"cause": cause, "expected": "untraced" if cause == "python" and not traced else EXPECTED.get(cause),
            "detail": detail, "step_us_before": before, "step_us_after": after,
            "truth_us_per_step": after - before, "steps": len(st["spans"]), "rocm": rocm, "path": str(p),
            "added_host_us_per_step": 0.0 if cause is None else (us if cause != "sync" else 12.0 * calls)}


def _mean_step(tl) -> float:
    st = tb.steps(tl, tb.launch_index(tl))
    return float(np.mean([e - s for s, e in st["spans"]]))


def _rewrite(meta: dict, events: list[dict], tl, starts: np.ndarray, h: replay.HostShift, ed: _Edit,
             rocm: bool) -> list[dict]:
    """Every event at its new time, and the inserted ones."""
    base = tl.base_us
    gpu_i = 0
    out: list[dict] = []
    corr_start: dict[Any, float] = {}
    gpu_old = tl.g_ts
    order = np.argsort(gpu_old, kind="stable")
    shift_sorted = (starts - gpu_old)[order]
    old_sorted = gpu_old[order]
    raw_tid: dict[int, Any] = {}
    host_pid: dict[int, Any] = {}
    max_corr = 0
    for e in events:
        ts = e.get("ts")
        a = e.get("args") if isinstance(e.get("args"), dict) else {}
        if isinstance(a.get("correlation"), int):
            max_corr = max(max_corr, a["correlation"])
        if not isinstance(ts, (int, float)) or not np.isfinite(ts):
            out.append(e)
            continue
        e2 = dict(e)
        if rocm and isinstance(e.get("name"), str):
            e2["name"] = _rocm_name(e["name"], e.get("cat"))
        if _is_gpu(e):
            if gpu_i >= gpu_old.size or abs((ts - base) - gpu_old[gpu_i]) > 1e-2:
                raise ValueError("the source trace's GPU events do not match its timeline (a corrupt or merged "
                                 "trace: duplicates or far-off times were left out): edit a clean real trace")
            e2["ts"] = _num(starts[gpu_i] + base)
            if isinstance(a.get("correlation"), int):
                corr_start[a["correlation"]] = starts[gpu_i] + base
            gpu_i += 1
        elif str(e.get("cat")).lower() == "gpu_user_annotation":
            t0, t1 = ts - base, ts - base + float(e.get("dur") or 0)
            k0 = min(np.searchsorted(old_sorted, t0), max(old_sorted.size - 1, 0))
            k1 = max(np.searchsorted(old_sorted, t1, side="right") - 1, 0)
            if old_sorted.size:
                e2["ts"] = _num(t0 + shift_sorted[k0] + base)
                e2["dur"] = _num(max(t1 + shift_sorted[k1] - (t0 + shift_sorted[k0]), 0.0))
        elif e.get("ph") == "f":
            continue  # placed after the kernels' new times are known
        else:
            t0 = float(h(np.array([ts - base]))[0])
            e2["ts"] = _num(t0 + base)
            if isinstance(e.get("dur"), (int, float)):
                t1 = float(h(np.array([ts - base + e["dur"]]))[0])
                e2["dur"] = _num(max(t1 - t0, 0.0))
            if e.get("ph") == "X" and e.get("tid") is not None:
                key = thread_id(e.get("tid"))
                raw_tid.setdefault(key, e.get("tid"))
                host_pid.setdefault(key, e.get("pid"))
        out.append(e2)
    for e in events:  # flow ends sit at their kernel's start
        if e.get("ph") == "f":
            e2 = dict(e)
            if e.get("id") in corr_start:
                e2["ts"] = _num(corr_start[e["id"]])
            out.append(e2)
    out.extend(_shown(ed, h, base, raw_tid, host_pid, max_corr, rocm))
    return out


def _shown(ed: _Edit, h: replay.HostShift, base: float, raw_tid: dict, host_pid: dict, max_corr: int,
           rocm: bool) -> list[dict]:
    """The inserted events, at the times the replay gave them."""
    out = []
    corr = max_corr + 1
    wait_at = h.w_s
    rt = "cuda_runtime"

    def ev(cat, name, tid, t0, t1, args=None):
        e = {"ph": "X", "cat": cat, "name": name, "pid": host_pid.get(tid, 0), "tid": raw_tid.get(tid, tid),
             "ts": _num(t0 + base), "dur": _num(max(t1 - t0, 0.0))}
        if args:
            e["args"] = args
        return e

    for kind, at, tid, payload in ed.shows:
        if kind in ("free", "sync"):
            k = int(np.flatnonzero(np.isclose(wait_at, at, atol=1e-9))[0])
            start = float(h.base(np.array([at]))[0]) + (h.shift[k - 1] if k > 0 else 0.0)
            end = float(h.new_end[k])
            if kind == "free":
                n, after = payload
                waited = max(end - start - after, 0.0)  # the first call waits for the device to drain
                t = start
                for j in range(n):
                    t1 = t + after / n + (waited if j == 0 else 0.0)
                    out.append(ev(rt, "hipFree" if rocm else "cudaFree", tid, t, t1, {"correlation": corr}))
                    corr += 1
                    t = t1
            else:
                op0 = start - 8.0
                sync_end = end - 4.0
                out.append(ev("cpu_op", "aten::item", tid, op0, end))
                out.append(ev("cpu_op", "aten::_local_scalar_dense", tid, op0 + 1.0, end - 1.0))
                out.append(ev(rt, "hipStreamSynchronize" if rocm else "cudaStreamSynchronize", tid, start,
                              max(sync_end, start), {"correlation": corr}))
                corr += 1
        elif kind in ("dataloader", "python"):
            t0 = float(h(np.array([at - _EPS]))[0])
            name = PYTHON_FUNCTION if kind == "python" else "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__"
            cat = "python_function" if kind == "python" else "user_annotation"
            out.append(ev(cat, name, tid, t0, t0 + float(payload)))
    return out


__all__ = ["CAUSES", "EXPECTED", "PYTHON_FUNCTION", "inject"]
