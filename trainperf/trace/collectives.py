"""What one rank's analysis keeps of each collective for the figures across ranks (``analyze_timeline``'s
``_comm``): one small columnar table. ``analyze_timeline`` returns it as plain lists (strict JSON, like the rest
of its result); :func:`compact` turns it into numpy arrays (~100 bytes per collective instead of ~700), which is
how :func:`trainperf.trace.job.read_traces` keeps 256 ranks' worth in memory.

Per collective (a communication kernel; on a CPU-only trace a ``gloo:*`` / ``nccl:*`` CPU op), in time order:
its start (``ts``, the trace's own clock, in us) and duration, stream, profiler step (index of the analysed
step holding its start, -1 none), kernel name, ``Collective name`` and ``Process Group Name`` (ids into
``names``), its **sequence** (``seq``: the process group when the trace records it, else the communication
stream in the order the streams first appear; collectives are matched across ranks by order within a
sequence) and its **window**: from the rank's previous arrival at a collective of the same sequence (its
start) to its arrival at this one; the first of a sequence from the start of its profiler step (else of the
trace). ``causes[i]`` is what the rank did in that window, in us per cause (:data:`CAUSES`, the names of
``trainperf.trace.attribution``), by :func:`attribute`. Comparing the late rank's window with the same window
on the other ranks names what made it late (:mod:`trainperf.trace.blame`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from trainperf.trace.columns import unique

from trainperf.trace import intervals as iv
from trainperf.trace.figures import HOST_SYNC_CALLS, step_of
from trainperf.trace.timeline import GPU_KERNEL, GPU_MEMCPY, GPU_MEMSET, Timeline

CAUSES = ("compute", "communication", "memcpy", "memset", "allocator", "sync", "launch", "dataloader", "optimizer",
          "cpu_op", "gc", "untraced")
ALLOCATOR_CALLS = {"cudaMalloc", "cudaFree", "cudaMallocHost", "cudaFreeHost", "cudaHostAlloc", "cudaHostRegister",
                   "cudaHostUnregister", "cudaMallocAsync", "cudaFreeAsync", "cudaMallocManaged", "cuMemAlloc_v2",
                   "cuMemFree_v2", "cuMemAllocHost_v2", "cuMemFreeHost", "cuMemCreate", "cuMemRelease", "cuMemMap",
                   "cuMemUnmap", "cuMemAddressReserve", "cuMemAddressFree", "cuMemSetAccess", "hipMalloc", "hipFree",
                   "hipHostMalloc", "hipHostFree", "hipMallocAsync", "hipFreeAsync", "hipExtMallocWithFlags",
                   "hipMallocManaged"}

HOST_CAUSES = ("dataloader", "allocator", "sync", "launch", "optimizer", "cpu_op", "gc")

try:  # the per-window attribution of every cause (another module of this package), when it is there
    from trainperf.trace.attribution import attribute_windows as _attribute_windows  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover - depends on which modules are installed
    _attribute_windows = None


def _set(starts, ends) -> iv.Set:
    return iv.union(np.asarray(starts, dtype=np.float64), np.asarray(ends, dtype=np.float64))


def _spans(items: list) -> iv.Set:
    if not items:
        return iv.EMPTY
    a = np.array([(ts, dur) for ts, dur, *_ in items], dtype=np.float64)
    return _set(a[:, 0], a[:, 0] + a[:, 1])


def _runtime(tl: Timeline, names: set[str] | None, exclude: set[str] = frozenset()) -> iv.Set:
    """The union of the runtime calls named in ``names`` (None: every call not in ``exclude``)."""
    if not tl.r_ts.size:
        return iv.EMPTY
    pick = np.array([(n in names) if names is not None else (n not in exclude) for n in tl.names] or [False])
    m = pick[tl.r_name]
    return _set(tl.r_ts[m], tl.r_ts[m] + tl.r_dur[m])


def window_causes(tl: Timeline, lo, hi, *, kind: np.ndarray | None = None) -> np.ndarray:
    """Us per cause in each window [lo_k, hi_k) (trace-relative times), (windows, len(CAUSES)), the causes
    partitioning the window: first what the GPU computed (compute kernels, copies, fills), then what the host
    was doing (a DataLoader span, an allocator call, a sync call or ``aten::item``, another runtime call
    (launch), another CPU op), then the GPU's communication kernels, the rest ``untraced``. Communication
    comes after the host because these windows are compared across ranks: a rank waiting in a collective
    keeps doing its host work, which must count as such on it as on the late rank. A CPU-only trace:
    DataLoader, CPU ops (``compute``), the collectives' CPU ops (communication), untraced. ``kind``: each GPU
    event's class (0 compute, 1 communication, 2 memory; default: the built-in pattern table)."""
    lo = np.asarray(lo, dtype=np.float64)
    hi = np.maximum(np.asarray(hi, dtype=np.float64), lo)
    parts: list[tuple[str, iv.Set]] = []
    if tl.g_ts.size:
        if kind is None:
            from trainperf.trace.figures import classify
            from trainperf.trace.patterns import load

            kind = classify(tl, load(None))["kind"]
        end = tl.g_ts + tl.g_dur
        kern = tl.g_kind == GPU_KERNEL
        for name, m in (("compute", kern & (kind != 1)), ("memcpy", tl.g_kind == GPU_MEMCPY),
                        ("memset", tl.g_kind == GPU_MEMSET)):
            parts.append((name, _set(tl.g_ts[m], end[m])))
        parts += [("dataloader", _spans(tl.dataloader)), ("allocator", _runtime(tl, ALLOCATOR_CALLS)),
                  ("sync", iv.join(_runtime(tl, HOST_SYNC_CALLS), _spans(tl.sync_ops))),
                  ("launch", _runtime(tl, None, ALLOCATOR_CALLS | HOST_SYNC_CALLS)),
                  ("cpu_op", tl.cpu_ops if tl.cpu_ops is not None else iv.EMPTY),
                  ("communication", _set(tl.g_ts[kern & (kind == 1)], end[kern & (kind == 1)]))]
    else:
        parts += [("dataloader", _spans(tl.dataloader)),
                  ("compute", tl.cpu_op_only if tl.cpu_op_only is not None else iv.EMPTY),
                  ("communication", _spans(tl.comm_ops))]
    out = np.zeros((lo.size, len(CAUSES)))
    col = {c: i for i, c in enumerate(CAUSES)}
    taken = iv.EMPTY
    for name, s in parts:
        mine = iv.subtract(s, taken) if taken[0].size else s
        if mine[0].size:
            out[:, col[name]] += iv.within(mine, lo, hi)
            taken = iv.join(taken, mine)
    out[:, col["untraced"]] = np.maximum(0.0, (hi - lo) - out.sum(axis=1))
    return out


def fallback_attribute_windows(tl: Timeline, lo, hi) -> list[dict[str, float]]:
    """``trainperf.trace.attribution.attribute_windows``'s signature, for when that module is not there:
    :func:`window_causes` as one dict per window."""
    return [dict(zip(CAUSES, map(float, row))) for row in window_causes(tl, lo, hi)]


def attribute(tl: Timeline, lo, hi, kind: np.ndarray | None = None) -> tuple[np.ndarray, str]:
    """The causes of each window, compared across ranks: (windows x CAUSES float32, how they were found).
    :func:`window_causes`; where ``trainperf.trace.attribution.attribute_windows`` is there, the host's time in
    each window is split among the host causes as it splits them (it names more: the optimizer, garbage
    collection...), scaled to the host time :func:`window_causes` finds (which also counts the host's work
    while a collective runs)."""
    mine = window_causes(tl, lo, hi, kind=kind)
    if _attribute_windows is None:
        return mine.astype(np.float32), "window_causes"
    host = [CAUSES.index(c) for c in HOST_CAUSES]
    theirs = np.zeros_like(mine)
    for i, r in enumerate(_attribute_windows(tl, lo, hi)):
        for j in host:
            v = r.get(CAUSES[j]) if isinstance(r, dict) else None
            if isinstance(v, (int, float)) and np.isfinite(v) and v > 0:
                theirs[i, j] = v
    got = theirs[:, host].sum(axis=1, keepdims=True)
    total = mine[:, host].sum(axis=1, keepdims=True)
    split = np.where(got > 0, theirs[:, host] / np.where(got > 0, got, 1.0) * total, mine[:, host])
    mine[:, host] = split
    return mine.astype(np.float32), "window_causes + trainperf.trace.attribution.attribute_windows (host split)"


def sequences(streams: np.ndarray, pgs: list) -> tuple[np.ndarray, list[list]]:
    """Each collective's matching sequence (rows in time order): ``["pg", name]`` when its process group is
    recorded, else ``["stream", k]``, k the order in which its stream first appears."""
    keys: dict[tuple, int] = {}
    stream_order: dict[int, int] = {}
    seq = np.empty(len(pgs), dtype=np.int32)
    for i, (s, pg) in enumerate(zip(streams.tolist(), pgs)):
        k = ("pg", str(pg)) if pg not in (None, "") else ("stream", stream_order.setdefault(s, len(stream_order)))
        seq[i] = keys.setdefault(k, len(keys))
    return seq, [list(k) for k in keys]


def windows(ts: np.ndarray, seq: np.ndarray, first_lo: np.ndarray) -> np.ndarray:
    """Each collective's window start: the previous start in its sequence; the first: ``first_lo``."""
    lo = first_lo.astype(np.float64).copy()
    for s in unique(seq):
        idx = np.flatnonzero(seq == s)
        lo[idx[1:]] = ts[idx[:-1]]
    return np.minimum(lo, ts)


def table(ts, dur, stream, step, name: list, coll: list, pg: list) -> dict[str, Any]:
    """The columnar table from per-collective values (``ts`` absolute us); rows sorted by start. No causes."""
    ts = np.asarray(ts, dtype=np.float64)
    o = np.argsort(ts, kind="stable")
    names: dict[str, int] = {}

    def ids(values: list) -> np.ndarray:
        return np.array([-1 if values[i] in (None, "") else names.setdefault(str(values[i]), len(names))
                         for i in o], dtype=np.int32)

    streams = np.asarray(stream, dtype=np.int64)[o] if len(o) else np.zeros(0, dtype=np.int64)
    pgs = [pg[i] for i in o]
    seq, seqs = sequences(streams, pgs)
    n_ids, c_ids, p_ids = ids(name), ids(coll), ids(pg)
    return {"ts": ts[o], "dur": np.asarray(dur, dtype=np.float64)[o],
            "stream": streams, "step": np.asarray(step, dtype=np.int32)[o] if len(o) else np.zeros(0, np.int32),
            "name": n_ids, "coll": c_ids, "pg": p_ids, "names": list(names), "seq": seq, "seqs": seqs,
            "win": np.zeros(len(o)), "causes": np.zeros((len(o), len(CAUSES)), dtype=np.float32),
            "cause_names": list(CAUSES), "attribution": None}


_NUMERIC = {"ts": np.float64, "dur": np.float64, "stream": np.int64, "step": np.int32, "name": np.int32,
            "coll": np.int32, "pg": np.int32, "seq": np.int32, "win": np.float64, "causes": np.float32}


def compact(t: Any) -> Any:
    """The table with numpy columns (in place; a table already compact, or not a table, is returned as is)."""
    if isinstance(t, dict) and "ts" in t:
        for k, dt in _NUMERIC.items():
            if k in t and not isinstance(t[k], np.ndarray):
                t[k] = np.asarray(t[k], dtype=dt)
        if t["causes"].ndim != 2:
            t["causes"] = t["causes"].reshape(len(t["ts"]), len(CAUSES))
    return t


def plain(t: dict) -> dict:
    """The table with list columns (strict JSON, comparable with ==)."""
    return {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in t.items()}


def from_rows(rows: list) -> dict[str, Any]:
    """The table from the older list form ``[ts, dur, stream, name, step, collective, process group]``."""
    rows = [r for r in rows if isinstance(r, (list, tuple)) and len(r) >= 4]

    def col(k: int, default=None) -> list:
        return [r[k] if len(r) > k else default for r in rows]

    return table(col(0), col(1), [s if isinstance(s, int) else -1 for s in col(2)],
                 [s if isinstance(s, int) else -1 for s in col(4)], col(3), col(5), col(6))


def collectives(tl: Timeline, kind: np.ndarray | None, lo: np.ndarray, hi: np.ndarray) -> dict[str, Any]:
    """One rank's table (module docstring), as plain lists: its communication kernels, or on a CPU-only trace
    its collective CPU ops, with each window's causes. ``kind``: each GPU event's class (``figures.classify``); ``lo``/``hi``:
    the analysed steps (trace-relative)."""
    if tl.g_ts.size:
        idx = np.flatnonzero((kind == 1) & (tl.g_kind == GPU_KERNEL))
        ts, dur = tl.g_ts[idx], tl.g_dur[idx]
        names = tl.names
        t = table(ts + tl.base_us, dur, tl.g_stream[idx], step_of(ts, lo, hi), [names[i] for i in tl.g_name[idx]],
                  [names[i] if i >= 0 else None for i in tl.g_coll[idx]],
                  [names[i] if i >= 0 else None for i in tl.g_pg[idx]])
    else:
        ops = sorted(tl.comm_ops)
        ts = np.array([c[0] for c in ops], dtype=np.float64)
        t = table(ts + tl.base_us, [c[1] for c in ops], np.zeros(len(ops), dtype=np.int64), step_of(ts, lo, hi),
                  [c[2] for c in ops], [None] * len(ops), [None] * len(ops))
    if not t["ts"].size:
        return plain(t)
    rel = t["ts"] - tl.base_us
    k = t["step"]
    start = np.full(rel.size, float(tl.all_min) if np.isfinite(tl.all_min) else float(rel.min()))
    start[k >= 0] = lo[k[k >= 0]]
    w_lo = windows(rel, t["seq"], start)
    t["win"] = rel - w_lo
    t["causes"], t["attribution"] = attribute(tl, w_lo, rel, kind)
    return plain(t)


__all__ = ["ALLOCATOR_CALLS", "CAUSES", "HOST_CAUSES", "attribute", "collectives", "compact",
           "fallback_attribute_windows", "from_rows", "plain", "sequences", "table", "window_causes", "windows"]
