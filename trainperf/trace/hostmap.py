"""What each host thread was doing at every instant, as labelled disjoint segments: the map
:mod:`trainperf.trace.attribution` charges GPU idle time against.

A thread's CPU events (ops, annotations, Python functions) and runtime calls nest; each instant goes to one
**cause**, the first in this order that covers it (specific runtime calls, then phases, then plain work):

1. ``allocator``: a runtime call that allocates or frees memory (``cudaMalloc``, ``cudaFree``, ``hipFree``,
   pinned-host and ``cuMem*`` calls: :data:`trainperf.trace.patterns.HOST_PATTERNS`);
2. ``sync``: a call that makes the host wait for the device (stream / device / event syncs, a blocking
   ``cudaMemcpy``), and the ``aten::item`` / ``aten::_local_scalar_dense`` ops around them;
3. ``gc``: Python's garbage collector (``Python GC`` events, torch's ``record_python_gc_info``);
4. ``dataloader``: the DataLoader's next batch (``enumerate(DataLoader)#...``);
5. ``optimizer``: ``Optimizer.step#...`` and ``Optimizer.zero_grad#...``;
6. ``launch``: a call that puts work on a stream (``cudaLaunchKernel``, ``cuLaunchKernel``, async copies and
   fills, graph launches, the HIP twins);
7. ``cpu_op``: any other CPU op, runtime call, Python function or annotation (``ProfilerStep#N`` aside: it
   covers the whole step and says nothing);
8. ``untraced``: no event covers the instant (Python without ``with_stack``, the framework's own code).

Each segment comes from one event, the innermost of its cause covering it (its **source**, to count calls):
its **detail** is that event's name (``cudaFree``, ``aten::mm``, ``Optimizer.step#AdamW.step``), its
**caller** the outermost CPU op around it on that thread (``aten::item`` for the stream sync inside it);
both are looked up only for the segments asked about. Everything is
sorted interval arithmetic (:mod:`trainperf.trace.intervals`) and a depth sweep for nesting: no Python loop
per event (one per thread and per nesting depth).
"""

from __future__ import annotations

import numpy as np

from trainperf.trace import intervals as iv
from trainperf.trace.columns import reserved
from trainperf.trace.patterns import host_kind
from trainperf.trace.timeline import C_OP, Timeline

HOST_CAUSES = ("allocator", "sync", "gc", "dataloader", "optimizer", "launch", "cpu_op", "untraced")
"""The host causes in their order of precedence (``untraced``: the rest)."""
_SPECIAL = {"allocator": 0, "sync": 1, "gc": 2, "dataloader": 3, "optimizer": 4, "launch": 5}
_CPU_OP, _STEP = 6, -1
SYNC_OPS = ("aten::item", "aten::_local_scalar_dense")


def _arr(a, dtype) -> np.ndarray:
    return np.zeros(0, dtype=dtype) if a is None else a


def name_classes(tl: Timeline) -> np.ndarray:
    """Per name id: the host cause code (index into :data:`HOST_CAUSES`; -1: a ``ProfilerStep#N``) of an
    event of that name. Only the names host events use are looked at."""
    n = len(tl.names)
    out = np.full(max(n, 1), _CPU_OP, dtype=np.int8)
    used = np.zeros(max(n, 1), dtype=bool)
    used[_arr(tl.c_name, np.int32)] = True
    used[_arr(tl.r_name, np.int32)] = True
    for i in np.flatnonzero(used).tolist():
        name = tl.names[i]
        k = host_kind(name)
        if k == "step":
            out[i] = _STEP
        elif k in _SPECIAL:
            out[i] = _SPECIAL[k]
        elif name in SYNC_OPS:
            out[i] = _SPECIAL["sync"]
    return out


def merged_points(*runs: np.ndarray) -> np.ndarray:
    """The distinct values of arrays that are each sorted already, sorted: a merge (timsort finds the runs),
    not a full sort."""
    pts = np.concatenate(runs)
    pts.sort(kind="stable")
    if pts.size < 2:
        return pts
    keep = np.empty(pts.size, dtype=bool)
    keep[0] = True
    np.not_equal(pts[1:], pts[:-1], out=keep[1:])
    return pts[keep]


def bounds(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """The ends of disjoint sorted intervals, interleaved: a sorted run."""
    return np.column_stack((lo, hi)).ravel()


def innermost(lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Disjoint segments ``(start, end, i)``, each labelled with the index ``i`` of the innermost of the
    nested intervals ``[lo, hi)`` covering it (the one with the latest start). Intervals that overlap without
    nesting are taken as nested in the order they start."""
    keep = np.flatnonzero(hi > lo)
    if keep.size == 0:
        z = np.zeros(0)
        return z, z, np.zeros(0, dtype=np.int64)
    lo, hi = lo[keep], hi[keep]
    o = np.lexsort((-hi, lo))  # by start, the longer (the parent) first
    slo, shi = lo[o], hi[o]
    ends = np.sort(shi)
    depth = np.arange(1, o.size + 1) - np.searchsorted(ends, slo, side="right")  # open just after each start
    pts = merged_points(slo, ends)
    seg_lo, seg_hi = pts[:-1], pts[1:]
    d = np.searchsorted(slo, seg_lo, side="right") - np.searchsorted(ends, seg_lo, side="right")
    label = np.full(seg_lo.size, -1, dtype=np.int64)
    # per depth: the intervals opened at that depth (in start order) and the segments at it, grouped once
    by_depth = np.argsort(depth, kind="stable")
    d_cut = np.searchsorted(depth[by_depth], np.arange(depth.max() + 2)) if depth.size else np.zeros(1, int)
    seg_by = np.argsort(d, kind="stable")
    s_cut = np.searchsorted(d[seg_by], np.arange(depth.max() + 2)) if depth.size else np.zeros(1, int)
    for k in range(1, int(depth.max()) + 1 if depth.size else 1):
        at = by_depth[d_cut[k]:d_cut[k + 1]]
        want = seg_by[s_cut[k]:s_cut[k + 1]]
        if at.size == 0 or want.size == 0:
            continue
        j = np.searchsorted(slo[at], seg_lo[want], side="right") - 1
        ok = j >= 0
        cand = at[j[ok]]
        good = shi[cand] > seg_lo[want[ok]]
        label[want[ok][good]] = cand[good]
    # a segment whose depth-k interval has ended (overlaps that do not nest): the latest-starting cover
    bad = np.flatnonzero((d > 0) & (label < 0))
    if bad.size:
        j = np.searchsorted(slo, seg_lo[bad], side="right") - 1
        run_max = np.maximum.accumulate(shi)
        ok = (j >= 0) & (run_max[np.maximum(j, 0)] > seg_lo[bad])
        label[bad[ok]] = j[ok]  # an approximation: the last interval started before it
    m = label >= 0
    seg_lo, seg_hi, label = seg_lo[m], seg_hi[m], label[m]
    if seg_lo.size:  # join neighbours with one label
        new = np.ones(seg_lo.size, dtype=bool)
        new[1:] = (label[1:] != label[:-1]) | (seg_lo[1:] > seg_hi[:-1])
        idx = np.flatnonzero(new)
        seg_lo, seg_hi, label = seg_lo[idx], seg_hi[np.append(idx[1:] - 1, new.size - 1)], label[idx]
    return seg_lo, seg_hi, keep[o[label]]


def clip_labelled(lo: np.ndarray, hi: np.ndarray, label: np.ndarray, region: iv.Set
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The parts of disjoint labelled segments inside a disjoint set, with their labels."""
    if lo.size == 0 or region[0].size == 0:
        return lo[:0], hi[:0], label[:0]
    pts = merged_points(bounds(lo, hi), bounds(*region))
    a, b = pts[:-1], pts[1:]
    mid = 0.5 * (a + b)
    si = np.searchsorted(lo, mid, side="right") - 1
    ri = np.searchsorted(region[0], mid, side="right") - 1
    ok = (si >= 0) & (ri >= 0)
    ok[ok] = (mid[ok] < hi[si[ok]]) & (mid[ok] < region[1][ri[ok]])
    return a[ok], b[ok], label[si[ok]]


class HostMap:
    """What the host threads were doing, per thread (sorted by thread, then time):

    * the **runs**: each cause's time on the thread (``r_lo``, ``r_hi``, ``r_cause``: disjoint, touching runs of
      one cause joined; what no run covers is untraced), over the whole trace: what a what-if removes;
    * the **segments**: ``lo``, ``hi``, ``cause`` (int8 index into :data:`HOST_CAUSES`) and ``src``, the event
      each comes from (runtime call ``r``, or CPU event ``n_runtime + c``; int32 while it fits), where they were
      asked for (:func:`build`'s ``want`` and ``points``; the named causes' everywhere). The names come from the
      events when asked: :meth:`detail` (the event's own name) and :meth:`caller` (the outermost CPU op around
      it on its thread)."""

    def __init__(self, tl: Timeline, seg: tuple, runs: tuple, threads, offsets, r_offsets, classes):
        self.lo, self.hi, self.cause, self.src = seg
        self.r_lo, self.r_hi, self.r_cause = runs
        self.threads, self.offsets, self.r_offsets = threads, offsets, r_offsets
        self.n_runtime = tl.r_ts.size
        self._tl, self._classes = tl, classes
        self._tops: dict[int, tuple] = {}

    def _k(self, tid: int) -> int:
        k = int(np.searchsorted(self.threads, tid))
        return k if k < self.threads.size and self.threads[k] == tid else -1

    def thread(self, tid: int) -> slice:
        """The thread's segments."""
        k = self._k(tid)
        return slice(0, 0) if k < 0 else slice(int(self.offsets[k]), int(self.offsets[k + 1]))

    def runs(self, tid: int, cause: str | None = None) -> iv.Set:
        """The thread's time of one cause (None: of any: the traced time), a disjoint sorted set."""
        k = self._k(tid)
        if k < 0:
            return iv.EMPTY
        s = slice(int(self.r_offsets[k]), int(self.r_offsets[k + 1]))
        lo, hi = self.r_lo[s], self.r_hi[s]
        if cause is None:
            return iv.union(lo, hi)
        m = self.r_cause[s] == HOST_CAUSES.index(cause)
        return lo[m], hi[m]

    def lookup(self, tid: int, t: np.ndarray) -> np.ndarray:
        """Index of the segment of thread ``tid`` covering each time (-1: none, untraced), for times where
        segments were built."""
        s = self.thread(tid)
        out = np.full(t.size, -1, dtype=np.int64)
        if s.stop == s.start:
            return out
        lo, hi = self.lo[s], self.hi[s]
        j = np.searchsorted(lo, t, side="right") - 1
        ok = j >= 0
        ok[ok] = t[ok] < hi[j[ok]]
        out[ok] = j[ok] + s.start
        return out

    def detail(self, idx: np.ndarray) -> np.ndarray:
        """Name id of each segment's own event."""
        tl, nr = self._tl, self.n_runtime
        src = self.src[idx]
        out = np.full(src.size, -1, dtype=np.int32)
        rt = src < nr
        out[rt] = tl.r_name[src[rt]]
        out[~rt] = tl.c_name[src[~rt] - nr]
        return out

    def caller(self, idx: np.ndarray, at: np.ndarray | None = None) -> np.ndarray:
        """Name id of the outermost CPU op on the thread around each segment (-1: none), at the instants ``at``
        inside them (default: their middles; a segment built for some instants is exact there, not
        necessarily at its middle)."""
        idx = np.asarray(idx, dtype=np.int64)
        out = np.full(idx.size, -1, dtype=np.int32)
        at = 0.5 * (self.lo[idx] + self.hi[idx]) if at is None else np.asarray(at, dtype=np.float64)
        k = np.searchsorted(self.offsets, idx, side="right") - 1
        for j in np.unique(k).tolist():
            m = k == j
            s, e, names = self._top_ops(int(self.threads[j]))
            mid = at[m]
            q = np.searchsorted(s, mid, side="right") - 1
            ok = q >= 0
            ok[ok] = mid[ok] < e[q[ok]]
            got = np.full(mid.size, -1, dtype=np.int32)
            got[ok] = names[q[ok]]
            out[m] = got
        return out

    def _top_ops(self, tid: int) -> tuple:
        """The thread's top-level CPU ops (start, end, name id), once. The step annotation and the phases'
        spans (1.8 writes record_function spans as ops) are not callers."""
        if tid not in self._tops:
            tl = self._tl
            c = np.flatnonzero((tl.c_tid == tid) & (tl.c_kind == C_OP))
            k = self._classes[tl.c_name[c]]
            c = c[(k == _CPU_OP) | (k == _SPECIAL["sync"])]
            s, e = tl.c_ts[c], tl.c_ts[c] + tl.c_dur[c]
            o = np.lexsort((-e, s))
            s, e, c = s[o], e[o], c[o]
            before = np.concatenate([[-np.inf], np.maximum.accumulate(e)[:-1]]) if c.size else e
            top = s >= before  # not inside an earlier op
            self._tops[tid] = (s[top], e[top], tl.c_name[c[top]])
        return self._tops[tid]

    def forget_callers(self) -> None:
        """Drop the threads' top-level ops (looked up again when asked)."""
        self._tops.clear()


CHUNK = 65536
"""Events of one thread mapped at a time: a thread's events, in order of start, are cut into runs of this many,
each mapped with the events open across its start (clipped to it), so memory stays bounded on any trace; the
innermost event and the precedence at an instant do not change when the events around it are clipped."""
_NAMED = len(HOST_CAUSES) - 3  # allocator, sync, gc, dataloader, optimizer: their segments are kept everywhere


class _Asked:
    """Where segments are wanted: a disjoint sorted set of times (``want``) and sorted instants (``points``);
    None: everywhere."""

    def __init__(self, want: iv.Set | None, points: np.ndarray | None):
        self.all = want is None
        self.w0, self.w1 = (np.zeros(0), np.zeros(0)) if want is None else want
        self.pts = np.zeros(0) if points is None else np.sort(np.asarray(points, dtype=np.float64))

    def hits(self, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        """Which intervals ``[lo, hi)`` overlap the wanted times or hold a wanted instant."""
        if self.all:
            return np.ones(lo.size, dtype=bool)
        j = np.searchsorted(self.w1, lo, side="right")
        out = (j < self.w0.size) & (self.w0[np.minimum(j, max(self.w0.size - 1, 0))] < hi) if self.w0.size \
            else np.zeros(lo.size, dtype=bool)
        if self.pts.size:
            k = np.searchsorted(self.pts, lo, side="left")
            out |= (k < self.pts.size) & (self.pts[np.minimum(k, self.pts.size - 1)] < hi)
        return out


def _segments(lo, hi, cls, src, asked: _Asked) -> tuple[list, list]:
    """The labelled segments (where asked; the named causes' everywhere) and the runs of a set of events (one
    run of a thread's events, clipped to it)."""
    taken = iv.EMPTY
    segs, runs = [], []
    for code in range(len(HOST_CAUSES) - 1):
        m = np.flatnonzero(cls == code)
        if m.size == 0:
            continue
        region = iv.subtract(iv.union(lo[m], hi[m]), taken)
        taken = iv.join(taken, region)
        runs.append((region[0], region[1], np.full(region[0].size, code, dtype=np.int8)))
        if code >= _NAMED:
            m = m[asked.hits(lo[m], hi[m])]  # an instant asked about: every event covering it is among these
        if m.size == 0 or region[0].size == 0:
            continue
        s_lo, s_hi, j = innermost(lo[m], hi[m])
        a, b, lab = clip_labelled(s_lo, s_hi, j, region)
        if code >= _NAMED:
            keep = asked.hits(a, b)
            a, b, lab = a[keep], b[keep], lab[keep]
        segs.append((a, b, np.full(a.size, code, dtype=np.int8), src[m[lab]]))
    return segs, runs


def _by_start(parts: list, k: int) -> list[np.ndarray]:
    """Parts (tuples of ``k`` columns) joined and sorted by their first column."""
    if not parts:
        return [np.zeros(0)] * k
    cols = [np.concatenate([p[i] for p in parts]) for i in range(k)]
    o = np.argsort(cols[0], kind="stable")
    return [c[o] for c in cols]


def _order(tl: Timeline, tid: int) -> np.ndarray:
    """The thread's events (runtime call ``r``, CPU event ``n_runtime + c``) in order of start: int32 while
    they fit (timsort merges the two runs, each near sorted)."""
    nr = tl.r_ts.size
    idx = np.concatenate([np.flatnonzero(tl.r_tid == tid), np.flatnonzero(tl.c_tid == tid) + nr])
    if nr + tl.c_ts.size < 2**31:
        idx = idx.astype(np.int32)
    start = _gather(tl, idx, "ts")
    o = np.argsort(start, kind="stable")
    del start
    return idx[o]


def _gather(tl: Timeline, src: np.ndarray, col: str) -> np.ndarray:
    """The ``ts`` / ``dur`` / ``name`` of events numbered as :func:`_order` numbers them."""
    nr = tl.r_ts.size
    r, c = getattr(tl, "r_" + col), getattr(tl, "c_" + col)
    out = np.empty(src.size, dtype=np.result_type(r.dtype, c.dtype))
    rt = src < nr
    out[rt] = r[src[rt]]
    out[~rt] = c[src[~rt] - nr]
    return out


def _map_thread(tl: Timeline, tid: int, cls_of_name: np.ndarray, asked: _Asked, seg_out: list, run_out: list
                ) -> None:
    """One thread's segments and runs, appended to the columns ``seg_out`` and ``run_out`` in order of time."""
    order = _order(tl, tid)
    o_lo, o_hi = np.zeros(0), np.zeros(0)  # the events open across the next run's start: times, class, source
    o_cls, o_src = np.zeros(0, dtype=np.int8), np.zeros(0, dtype=order.dtype)
    for a in range(0, order.size, CHUNK):
        src = order[a:a + CHUNK]
        lo = _gather(tl, src, "ts")
        hi = lo + _gather(tl, src, "dur")
        cls = cls_of_name[_gather(tl, src, "name")]
        keep = (cls >= 0) & (hi > lo)  # the step annotation says nothing; empty events cover nothing
        t0 = float(lo[0])
        t1 = float(_gather(tl, order[a + CHUNK:a + CHUNK + 1], "ts")[0]) if a + CHUNK < order.size else np.inf
        o_keep = o_hi > t0
        lo = np.concatenate([o_lo[o_keep], lo[keep]])
        hi = np.concatenate([o_hi[o_keep], hi[keep]])
        cls = np.concatenate([o_cls[o_keep], cls[keep]])
        src = np.concatenate([o_src[o_keep], src[keep]])
        segs, runs = _segments(np.maximum(lo, t0), np.minimum(hi, t1), cls, src, asked)
        for col, v in zip(seg_out, _by_start(segs, 4)):
            col.add(v)
        _add_runs(run_out, _by_start(runs, 3))
        spill = hi > t1
        o_lo, o_hi, o_cls, o_src = lo[spill], hi[spill], cls[spill], src[spill]


def _add_runs(cols: list, run: list) -> None:
    """Append runs, joining the first to the last one there when they touch with one cause (a run cut at a
    chunk's start)."""
    lo, hi, cause = run
    c_lo, c_hi, c_cause = cols
    if lo.size and c_lo.n and c_cause.buf[c_cause.n - 1] == cause[0] and c_hi.buf[c_hi.n - 1] == lo[0]:
        c_hi.buf[c_hi.n - 1] = hi[0]
        lo, hi, cause = lo[1:], hi[1:], cause[1:]
    for col, v in zip(cols, (lo, hi, cause)):
        col.add(v)


def build(tl: Timeline, threads, want: iv.Set | None = None, points: dict | None = None) -> HostMap:
    """The map of the given host threads: every thread's runs, and its segments where asked: over ``want`` (a
    disjoint sorted set of times; None: everywhere) and at the instants ``points[tid]`` (the named causes'
    everywhere)."""
    classes = name_classes(tl)
    ths = np.unique(np.asarray(list(threads), dtype=np.int64))
    ths = ths[ths >= 0]
    n = int(tl.r_ts.size + tl.c_ts.size)
    seg = [reserved(np.float64, 0), reserved(np.float64, 0), reserved(np.int8, 0), reserved(np.int64, 0)]
    run = [reserved(np.float64, 2 * n + 16), reserved(np.float64, 2 * n + 16), reserved(np.int8, 2 * n + 16)]
    offsets, r_offsets = [0], [0]
    for tid in ths.tolist():
        asked = _Asked(want, None if want is None or points is None else points.get(tid))
        _map_thread(tl, tid, classes, asked, seg, run)
        offsets.append(seg[0].n)
        r_offsets.append(run[0].n)
    return HostMap(tl, tuple(c.array() for c in seg), tuple(c.array() for c in run), ths,
                   np.array(offsets, dtype=np.int64), np.array(r_offsets, dtype=np.int64), classes)


__all__ = ["HOST_CAUSES", "HostMap", "SYNC_OPS", "build", "clip_labelled", "innermost", "name_classes"]
