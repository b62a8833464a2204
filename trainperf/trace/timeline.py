"""From streamed events to a per-rank timeline of compact numpy arrays (never a Python object per event kept).

Every torch format is normalised here. Categories (case-insensitive):

=====================  ======================================================  ==============
what                   torch 2.x                                               1.8-era
=====================  ======================================================  ==============
GPU kernel             ``kernel`` (ROCm too; MTIA ``mtia_ccp_events``)          ``Kernel``
GPU copy / fill        ``gpu_memcpy`` / ``gpu_memset``                          ``Memcpy`` / ``Memset``
launch / runtime call  ``cuda_runtime``, ``cuda_driver`` (``cuLaunchKernel``),  ``Runtime``
                       ``mtia_runtime``
CPU op                 ``cpu_op``, ``python``                                   ``Operator``
annotation             ``user_annotation`` (``record_function``,                 (``Operator``)
                       ``ProfilerStep#N``, ``enumerate(DataLoader)#...``)
Python function        ``python_function`` (``with_stack=True``; ``Python GC``:  (none)
                       ``record_python_gc_info``): the ``c_*`` columns only
CUPTI sync record      ``cuda_sync`` with a ``stream`` (HTA's temporal breakdown counts them; nothing else)
ignored                ``gpu_user_annotation``, flows (``ac2g``,
                       ``async``, ``fwdbwd``: the correlation ids in ``args`` already link launches to
                       kernels), instant and counter events, ``Trace``
=====================  ======================================================  ==============

Every complete CPU event (op, annotation, Python function) is also kept, in file order, in the ``c_*`` columns
(start, duration, name id, host thread, kind: 25 bytes an event), and every runtime call's host thread in
``r_tid``: what :mod:`trainperf.trace.attribution` needs to say what the host was doing at any instant. A
thread is whatever the trace calls one (Kineto's integer ``tid``; 1.8's ``"25738"`` text), compared only for
equality (-1: none).

Time: ``ts``/``dur`` are microseconds (the Chrome trace format's unit; ``displayTimeUnit`` only says how a
viewer shows them). Integer microseconds (1.8 to 2.3) and float microseconds with nanosecond decimals
(torch >= 2.4, HTA's ``ns_resolution_trace``) both read exactly: each time is kept relative to the first
event's (``base_us``), so no precision is lost to the epoch offset. ``baseTimeNanoseconds`` (the epoch of
``ts`` = 0 in newer traces) is kept in the metadata.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from trainperf.trace.columns import _Column, _floats, _ints, _stream_num, _Threads, _tid_stream, _tids, thread_id, unique, percentiles
from trainperf.trace.intervals import Accumulator, Set
from trainperf.trace.reader import Args, Event

GPU_KERNEL, GPU_MEMCPY, GPU_MEMSET = 0, 1, 2
_GPU, _RT, _OP, _ANNO, _SYNC, _PY = 1, 2, 3, 4, 5, 6
C_OP, C_ANNOTATION, C_PYTHON = 0, 1, 2  # Timeline.c_kind
CATEGORIES = {"kernel": (_GPU, GPU_KERNEL), "mtia_ccp_events": (_GPU, GPU_KERNEL),
              "gpu_memcpy": (_GPU, GPU_MEMCPY), "memcpy": (_GPU, GPU_MEMCPY),
              "gpu_memset": (_GPU, GPU_MEMSET), "memset": (_GPU, GPU_MEMSET),
              "cuda_runtime": (_RT, 0), "runtime": (_RT, 0), "cuda_driver": (_RT, 1), "mtia_runtime": (_RT, 0),
              "hip_runtime": (_RT, 0), "cpu_op": (_OP, 0), "operator": (_OP, 0), "python": (_OP, 0),
              "user_annotation": (_ANNO, 0), "cuda_sync": (_SYNC, 0), "python_function": (_PY, 0)}
STEP_RE = re.compile(r"^ProfilerStep\s*#\s*(\d{1,18})(?!\d)")  # a longer number is not a step (nor an int64)
COMM_OPS = {"nccl:broadcast", "nccl:reduce", "nccl:all_reduce", "nccl:all_gather", "nccl:reduce_scatter",
            "gloo:broadcast", "gloo:reduce", "gloo:all_reduce", "gloo:all_gather", "gloo:reduce_scatter"}
SYNC_OPS = {"aten::item", "aten::_local_scalar_dense"}
# CPU op roles
_R_OP, _R_STEP, _R_DL, _R_COMM, _R_SYNC = 0, 1, 2, 3, 4
NOARGS = Args()


def _op_role(name: Any) -> int:
    n = str(name) if name is not None else ""
    if STEP_RE.match(n):
        return _R_STEP
    if (n.startswith("enumerate(DataLoader)#") and n.endswith(".__next__")) or n.startswith("enumerate(DataPipe)#"):
        return _R_DL
    if n in COMM_OPS:
        return _R_COMM
    if n in SYNC_OPS:
        return _R_SYNC
    return _R_OP


def _tc_op(name: Any) -> bool:
    n = str(name) if name is not None else ""
    return not (STEP_RE.match(n) or n in ("DataParallel.forward", "DistributedDataParallel.forward")
                or n.startswith("Optimizer."))


class _Names(dict):
    """String -> small int, in first-seen order (``names[i]`` is the string)."""

    def __init__(self):
        super().__init__()
        self.names: list[str] = []

    def __missing__(self, key):
        s = "" if key is None else str(key)
        i = self[key] = len(self.names)
        self.names.append(s)
        return i


@dataclass
class Timeline:
    """One rank's trace as arrays (times in us relative to ``base_us``)."""
    meta: dict = field(default_factory=dict)
    base_us: float = 0.0
    names: list = field(default_factory=list)  # name id -> string (GPU events, launches, sync ops)
    # GPU events (kernels, copies, fills)
    g_ts: np.ndarray = None
    g_dur: np.ndarray = None
    g_kind: np.ndarray = None  # GPU_KERNEL / GPU_MEMCPY / GPU_MEMSET
    g_name: np.ndarray = None
    g_stream: np.ndarray = None
    g_device: np.ndarray = None
    g_corr: np.ndarray = None  # int32 while every id fits, else int64 (the same holds for every id column)
    g_occ: np.ndarray = None
    g_bps: np.ndarray = None
    g_bytes: np.ndarray = None
    g_coll: np.ndarray = None  # name id of "Collective name", -1
    g_pg: np.ndarray = None  # name id of "Process Group Name", -1
    # launches / runtime calls
    r_ts: np.ndarray = None
    r_dur: np.ndarray = None
    r_corr: np.ndarray = None
    r_ext: np.ndarray = None
    r_name: np.ndarray = None
    r_driver: np.ndarray = None  # bool: a cuda_driver event
    r_tid: np.ndarray = None  # the host thread of each runtime call (-1: unknown); int32 while every id fits
    # every complete CPU event (cpu_op / operator / python, user_annotation, python_function), in file order
    c_ts: np.ndarray = None  # float64 us, relative to base_us
    c_dur: np.ndarray = None  # float64 us
    c_name: np.ndarray = None  # int32 index into names
    c_tid: np.ndarray = None  # host thread (-1: unknown); int32 while every id fits
    c_kind: np.ndarray = None  # int8: 0 CPU op, 1 annotation (record_function / NVTX range), 2 Python function
    # CPU side
    steps: list = field(default_factory=list)  # (ts, dur, number) of ProfilerStep#N, CPU side
    dataloader: list = field(default_factory=list)  # (ts, dur, name)
    comm_ops: list = field(default_factory=list)  # (ts, dur, name): nccl:* / gloo:* ops (the plugin's CPU comm)
    sync_ops: list = field(default_factory=list)  # (ts, dur, name): aten::item, _local_scalar_dense
    cpu_ops: Set = None  # union of the other CPU ops (the plugin's "CPU Exec" role)
    cpu_op_only: Set = None  # union of the cpu_op events alone (no annotations): a CPU trace's compute
    op_ext: np.ndarray = None  # the External ids of the CPU ops and annotations (sorted, unique)
    # CUPTI synchronization records (cat cuda_sync: Stream Sync, Stream Wait Event...) that name a stream
    s_ts: np.ndarray = None
    s_dur: np.ndarray = None
    s_stream: np.ndarray = None
    cpu_min: float = np.inf
    cpu_max: float = -np.inf
    all_min: float = np.inf
    all_max: float = -np.inf
    events: int = 0
    cpu_events: int = 0
    untimed: int = 0
    """GPU events and runtime calls whose start time is not a finite number (a corrupt trace): left out
    of every figure, counted here so the report can say so."""
    bad_durations: int = 0
    """GPU events and runtime calls whose duration is negative or not a number: timed as 0."""
    far_events: int = 0
    """GPU events and runtime calls that start or end implausibly far from the rest of the trace (more
    than ``_FAR`` times its interquartile spread, at least ``_FAR`` s, from the median start): a corrupt
    time, left out of every figure."""
    duplicate_events: int = 0
    """GPU events repeated exactly (start, duration, kind, name, stream and correlation id): counted once."""
    bad_occupancy: int = 0
    """Kernels whose achieved occupancy is outside 0-100%: left out of the occupancy figures."""
    bad_steps: int = 0
    """ProfilerStep annotations with a zero, negative or non-numeric duration: left out."""
    overlapping_steps: int = 0
    """ProfilerStep annotations that start inside an earlier step (nested or overlapping): left out."""
    repeated_step_numbers: int = 0
    """ProfilerStep annotations (distinct spans) that repeat an earlier step's number."""
    empty_steps: int = 0
    """ProfilerStep annotations dropped because none of their windows holds a GPU event or runtime call
    of the trace (steps timed apart from everything else): the trace span is used instead."""


_DTYPES = {"ts": np.float64, "dur": np.float64, "kind": np.int8, "name": np.int32, "stream": np.int64,
           "device": np.int64, "corr": np.int64, "ext": np.int64, "occ": np.float32, "bps": np.float32,
           "bytes": np.float64, "coll": np.int32, "pg": np.int32, "driver": bool, "tid": np.int64}


class Collector:
    """Feed it the reader's chunks; :meth:`finish` returns the :class:`Timeline`."""

    def __init__(self):
        self.names = _Names()
        self.roles: list[int] = []  # by name id: the CPU op role of the name
        self.threads = _Threads()
        self.tc_ops: list[bool] = []  # by name id: an op whose launches the tensor-core share counts
        self.cats: dict[Any, tuple] = {}
        self.base: float | None = None
        self.g = {k: _Column(_DTYPES[k]) for k in ("ts", "dur", "kind", "name", "stream", "device", "corr", "occ",
                                                   "bps", "bytes", "coll", "pg")}
        # the id and thread columns narrow to int32 while they fit (a checked fallback to int64: exact)
        self.r = {k: _Column(_DTYPES[k]) for k in ("ts", "dur", "corr", "ext", "name", "driver", "tid")}
        self.c = {k: _Column(_DTYPES[k]) for k in ("ts", "dur", "name", "tid", "kind")}
        self.op_ext = _Column(np.int64)
        self.sy = {k: _Column(_DTYPES[k]) for k in ("ts", "dur", "stream")}
        self.ops = Accumulator()
        self.op_only = Accumulator()
        self.t = Timeline()

    def _cat(self, c: Any) -> tuple | None:
        got = self.cats.get(c, False)
        if got is False:
            got = self.cats[c] = CATEGORIES.get(str(c).lower()) if c is not None else None
        return got

    def feed(self, evs: list[Event]) -> None:
        t = self.t
        gpu, rt, syncs, cpu = [], [], [], []
        gk, rk, ck = [], [], []
        cats, cat = self.cats, self._cat
        for e in evs:
            if e.ph != "X":
                continue
            k = cats.get(e.cat, False)  # a category seen before (no call per event)
            if k is False:
                k = cat(e.cat)
            if k is None:
                continue
            w = k[0]
            if w == _GPU:
                gpu.append(e)
                gk.append(k[1])
            elif w == _RT:
                rt.append(e)
                rk.append(k[1])
            elif w == _OP:
                cpu.append(e)
                ck.append(C_OP)
            elif w == _ANNO:
                cpu.append(e)
                ck.append(C_ANNOTATION)
            elif w == _PY:
                cpu.append(e)
                ck.append(C_PYTHON)
            else:
                syncs.append(e)
        t.events += len(evs)
        if not (gpu or rt or cpu or syncs):
            return
        if self.base is None:  # one of the first chunk's own times (its median: a corrupt first event's is not)
            b = _floats([e.ts for group in (gpu, rt, cpu, syncs) for e in group])
            b = b[np.isfinite(b)]
            self.base = float(np.partition(b, (b.size - 1) // 2)[(b.size - 1) // 2]) if b.size else 0.0  # lower median
            t.base_us = self.base
        if gpu:
            self._gpu(gpu, gk)
        if rt:
            self._rt(rt, rk)
        if cpu:
            self._cpu(cpu, ck)
        if syncs:
            ts, dur = self._times(syncs)
            st = np.array([_stream_num((e.args or NOARGS).stream) for e in syncs], dtype=np.int64)
            keep = st >= 0
            self.sy["ts"].add(ts[keep])
            self.sy["dur"].add(dur[keep])
            self.sy["stream"].add(st[keep])

    def _times(self, evs: list[Event], count: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """Start (relative to the base) and duration of each event; ``count``: a GPU event or runtime call, whose
        missing start or bad duration the report counts (CPU ones: the steps' are counted apart)."""
        with np.errstate(over="ignore", invalid="ignore"):  # a corrupt time beyond float64: inf, dropped
            ts = _floats([e.ts for e in evs]) - self.base
            dur = _floats([e.dur for e in evs])
            bad = ~np.isfinite(dur) | (dur < 0)
            dur[bad] = 0.0
            end = ts + dur
        ts[~np.isfinite(end)] = np.nan
        t = self.t
        ok = np.isfinite(ts)
        if count:
            t.untimed += int(ok.size - np.count_nonzero(ok))
            t.bad_durations += int(np.count_nonzero(bad & ok))
        if ok.any():
            t.all_min = min(t.all_min, float(ts[ok].min()))
            t.all_max = max(t.all_max, float(end[ok].max()))
        return ts, dur

    def _gpu(self, evs: list[Event], kinds: list[int]) -> None:
        g, names = self.g, self.names
        ts, dur = self._times(evs)
        A = [e.args or NOARGS for e in evs]
        g["ts"].add(ts)
        g["dur"].add(dur)
        g["kind"].add(np.array(kinds, dtype=np.int8))
        g["name"].add(np.array([names[e.name] for e in evs], dtype=np.int32))
        g["stream"].add(np.array([_stream_num(a.stream) if a.stream is not None else _tid_stream(e.tid)
                                     for a, e in zip(A, evs)], dtype=np.int64))
        g["device"].add(np.array([_stream_num(a.device if a.device is not None else e.pid)
                                     for a, e in zip(A, evs)], dtype=np.int64))
        g["corr"].add(_ints([a.corr for a in A]))
        occ = _floats([a.occ if a.occ is not None else np.nan for a in A])
        with np.errstate(invalid="ignore"):
            out = (occ < 0) | (occ > 100)
        self.t.bad_occupancy += int(np.count_nonzero(out))
        occ[out] = np.nan  # not a share of the SM: left out of the occupancy figures
        g["occ"].add(occ.astype(np.float32))
        g["bps"].add(_floats([a.bps if a.bps is not None else np.nan for a in A]).astype(np.float32))
        g["bytes"].add(_floats([a.nbytes if a.nbytes is not None else np.nan for a in A]))
        g["coll"].add(np.array([names[a.coll] if a.coll is not None else -1 for a in A], dtype=np.int32))
        g["pg"].add(np.array([names[a.pg] if a.pg is not None else -1 for a in A], dtype=np.int32))

    def _rt(self, evs: list[Event], kinds: list[int]) -> None:
        r, names = self.r, self.names
        ts, dur = self._times(evs)
        r["ts"].add(ts)
        r["dur"].add(dur)
        A = [e.args or NOARGS for e in evs]
        r["corr"].add(_ints([a.corr for a in A]))
        r["ext"].add(_ints([a.ext if a.ext is not None else a.ext18 for a in A]))
        r["name"].add(np.array([names[e.name] for e in evs], dtype=np.int32))
        r["driver"].add(np.array(kinds, dtype=bool))
        r["tid"].add(_tids(evs, self.threads))

    def _cpu(self, evs: list[Event], kinds: list[int]) -> None:
        """Every complete CPU event, in the ``c_*`` columns (those without a time left out, at ``finish``); its
        ops and annotations, by their roles, in the figures' CPU sets (the plugin's). One pass over the events:
        a name's role is looked up once per name, not per event."""
        t, c, names = self.t, self.c, self.names
        kind = np.array(kinds, dtype=np.int8)
        with np.errstate(over="ignore", invalid="ignore"):
            ts = _floats([e.ts for e in evs]) - self.base
            dur = _floats([e.dur for e in evs])
        dur[~np.isfinite(dur) | (dur < 0)] = 0.0
        name = np.array([names[e.name] for e in evs], dtype=np.int32)
        c["ts"].add(ts)
        c["dur"].add(dur)
        c["name"].add(name)
        c["tid"].add(_tids(evs, self.threads))
        c["kind"].add(kind)
        roles, tc_ops = self.roles, self.tc_ops
        for i in range(len(roles), len(names.names)):  # the names first seen here
            roles.append(_op_role(names.names[i]))
            tc_ops.append(_tc_op(names.names[i]))
        role_of, tc_of = np.array(roles, dtype=np.int8), np.array(tc_ops, dtype=bool)
        for code, is_op in ((C_OP, True), (C_ANNOTATION, False)):
            idx = np.flatnonzero(kind == code)
            if idx.size == 0:
                continue
            t.cpu_events += int(idx.size)
            g_ts, g_dur = ts[idx], dur[idx]  # as _times has them: a start whose end is not finite is none
            with np.errstate(over="ignore", invalid="ignore"):
                end = g_ts + g_dur
            g_ts[~np.isfinite(end)] = np.nan
            ok = np.isfinite(g_ts)
            if ok.any():
                t.all_min = min(t.all_min, float(g_ts[ok].min()))
                t.all_max = max(t.all_max, float(end[ok].max()))
            g_name = name[idx]
            role = role_of[g_name]
            # the ops whose launches the plugin's tensor-core share counts: operator nodes (not the
            # ProfilerStep, not DataParallel.forward / DistributedDataParallel.forward, not Optimizer.*)
            A = [evs[i].args or NOARGS for i in idx[tc_of[g_name]].tolist()]
            ext = _ints([a.ext if a.ext is not None else a.ext18 for a in A])
            self.op_ext.add(unique(ext[ext > 0]))
            end = g_ts + g_dur
            plain = role == _R_OP
            if plain.any():
                self.ops.add(g_ts[plain], end[plain])
                if is_op:
                    self.op_only.add(g_ts[plain], end[plain])
            span = np.isfinite(g_ts)  # the plugin's CPU span: ops, steps (and annotations, 1.8's Operator spans)
            if span.any():
                t.cpu_min = min(t.cpu_min, float(g_ts[span].min()))
                t.cpu_max = max(t.cpu_max, float(end[span].max()))
            for j in np.flatnonzero(role != _R_OP).tolist():
                e, r = evs[int(idx[j])], role[j]
                if not np.isfinite(g_ts[j]):
                    continue
                if r == _R_STEP:
                    t.steps.append((float(g_ts[j]), float(g_dur[j]), int(STEP_RE.match(str(e.name)).group(1))))
                elif r == _R_DL:
                    t.dataloader.append((float(g_ts[j]), float(g_dur[j]), str(e.name)))
                elif r == _R_COMM:
                    t.comm_ops.append((float(g_ts[j]), float(g_dur[j]), str(e.name)))
                elif r == _R_SYNC:
                    t.sync_ops.append((float(g_ts[j]), float(g_dur[j]), str(e.name)))

    def finish(self, meta: dict) -> Timeline:
        t = self.t
        t.meta = meta
        t.names = self.names.names
        for prefix, cols in (("g_", self.g), ("r_", self.r), ("s_", self.sy), ("c_", self.c)):
            for k, col in cols.items():
                setattr(t, prefix + k, col.array())
        ok = np.isfinite(t.c_ts) & np.isfinite(t.c_ts + t.c_dur)
        if not ok.all():
            for k in self.c:
                setattr(t, "c_" + k, getattr(t, "c_" + k)[ok])
        # drop events without a time
        for prefix, keys in (("g_", self.g), ("r_", self.r)):
            ok = np.isfinite(getattr(t, prefix + "ts"))
            if not ok.all():
                for k in keys:
                    setattr(t, prefix + k, getattr(t, prefix + k)[ok])
        t.op_ext = unique(self.op_ext.array())
        gk, rk = list(self.g), list(self.r)
        self.g, self.r, self.sy, self.c, self.op_ext = {}, {}, {}, {}, None
        _drop_far(t, gk, rk)
        _drop_duplicates(t, gk)
        t.cpu_ops = self.ops.result()
        t.cpu_op_only = self.op_only.result()
        t.steps = _clean_steps(t)
        t.dataloader.sort()
        return t


_FAR = 100.0
"""How far from the rest of the trace a GPU event or runtime call may lie before its time is taken for
corrupt: ``_FAR`` times the interquartile spread of the starts, and never less than ``_FAR`` seconds, from
their median. A real trace is one profiling window: nothing in it is minutes away from the rest."""
_STEP_TOLERANCE_US = 2.0  # integer-microsecond ts and dur, each rounded: consecutive steps may touch by this


def _keep(t: Timeline, prefix: str, keys: list[str], ok: np.ndarray) -> None:
    for k in keys:
        setattr(t, prefix + k, getattr(t, prefix + k)[ok])


def _drop_far(t: Timeline, gk: list[str], rk: list[str]) -> None:
    """Leave out GPU events and runtime calls far outside the trace's window (a corrupt ts or dur: one such
    kernel would otherwise stretch every step to its length)."""
    starts = np.concatenate([t.g_ts, t.r_ts])
    if starts.size == 0:
        return
    q25, q50, q75 = percentiles(starts, [25, 50, 75])
    reach = _FAR * max(float(q75 - q25), 1e6)
    lo, hi = q50 - reach, q50 + reach
    for prefix, keys in (("g_", gk), ("r_", rk)):
        ts = getattr(t, prefix + "ts")
        ok = (ts >= lo) & (ts + getattr(t, prefix + "dur") <= hi)
        if not ok.all():
            t.far_events += int(ok.size - np.count_nonzero(ok))
            _keep(t, prefix, keys, ok)
    if t.far_events:  # the trace's span without them
        lows = [t.cpu_min] + [float(a.min()) for a in (t.g_ts, t.r_ts) if a.size]
        highs = [t.cpu_max] + [float((a + d).max()) for a, d in ((t.g_ts, t.g_dur), (t.r_ts, t.r_dur)) if a.size]
        t.all_min, t.all_max = min(lows), max(highs)


def _drop_duplicates(t: Timeline, gk: list[str]) -> None:
    """Count a GPU event repeated exactly (same start, duration, kind, name, stream and correlation id) once:
    a merged or concatenated trace would otherwise count its kernels twice. Events without a correlation id
    are left alone (two sub-microsecond copies on one stream may share an integer ts and a 0 dur)."""
    n = t.g_ts.size
    if n < 2:
        return
    keyed = np.flatnonzero(t.g_corr >= 0)
    if keyed.size < 2:
        return
    cols = [t.g_corr[keyed], t.g_ts[keyed], t.g_dur[keyed], t.g_name[keyed], t.g_stream[keyed], t.g_kind[keyed]]
    order = np.lexsort(cols[::-1])  # stable: the first of equal events keeps its place (np.unique's first index)
    same = np.ones(order.size - 1, dtype=bool)
    for c in cols:
        s = c[order]
        same &= s[1:] == s[:-1]
    if not same.any():
        return
    first = order[np.concatenate(([True], ~same))]
    ok = np.ones(n, dtype=bool)
    ok[keyed] = False
    ok[keyed[first]] = True
    t.duplicate_events += int(n - np.count_nonzero(ok))
    _keep(t, "g_", gk, ok)


def _clean_steps(t: Timeline) -> list:
    """The ProfilerStep spans the figures can use: sorted, with a positive duration, none starting inside an
    earlier one, holding some of the trace's GPU work (else none: the trace span is used); exact repeats stay
    for the readers, which drop them."""
    steps = sorted(t.steps)
    good = [s for s in steps if s[1] > 0]
    t.bad_steps += len(steps) - len(good)
    kept: list = []
    end = -np.inf
    for s in good:
        if kept and s == kept[-1]:
            kept.append(s)  # an exact repeat: tb.steps / hta.window drop it, as torch never writes one
            continue
        if s[0] < end - _STEP_TOLERANCE_US:
            t.overlapping_steps += 1
            continue
        kept.append(s)
        end = s[0] + s[1]
    spans = sorted(set(kept))
    nums = [n for _, _, n in spans]
    t.repeated_step_numbers += len(nums) - len(set(nums))
    if spans and (t.g_ts.size or t.r_ts.size):
        lo = np.array([s[0] for s in spans])
        hi = np.array([s[0] + s[1] for s in spans])
        inside = 0
        for ts in (t.g_ts, t.r_ts):
            if ts.size:
                k = np.searchsorted(lo, ts, side="right") - 1
                ok = k >= 0
                inside += int(np.count_nonzero(ts[ok] <= hi[k[ok]]))
        if inside == 0:  # the steps' times are what is corrupt: the span falls back on the rest of the trace
            t.empty_steps += len(spans)
            op_lo, op_hi = t.cpu_ops
            lows = [float(a.min()) for a in (t.g_ts, t.r_ts) if a.size]
            highs = [float((a + d).max()) for a, d in ((t.g_ts, t.g_dur), (t.r_ts, t.r_dur)) if a.size]
            if op_lo.size:
                t.cpu_min, t.cpu_max = float(op_lo.min()), float(op_hi.max())
                lows.append(t.cpu_min)
                highs.append(t.cpu_max)
            else:
                t.cpu_min, t.cpu_max = min(lows), max(highs)
            t.all_min, t.all_max = min(lows), max(highs)
            return []
    return kept


__all__ = ["CATEGORIES", "C_ANNOTATION", "C_OP", "C_PYTHON", "Collector", "GPU_KERNEL", "GPU_MEMCPY", "GPU_MEMSET",
           "STEP_RE", "Timeline", "thread_id"]
