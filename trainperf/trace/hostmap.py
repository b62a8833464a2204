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
    used = np.unique(np.concatenate([_arr(tl.c_name, np.int32), _arr(tl.r_name, np.int32)]))
    for i in used.tolist():
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
    """Labelled disjoint segments per host thread, sorted by (thread, start): ``lo``, ``hi``, ``cause`` (int8
    index into :data:`HOST_CAUSES`; never untraced: that is what no segment covers) and ``src``, the event
    each comes from (runtime call ``r``, or CPU event ``n_runtime + c``); 21 bytes a segment. The names come
    from the events when asked: :meth:`detail` (the event's own name) and :meth:`caller` (the outermost CPU op
    around it on its thread)."""

    def __init__(self, tl: Timeline, lo, hi, cause, src, threads, offsets, classes):
        self.lo, self.hi, self.cause, self.src = lo, hi, cause, src
        self.threads, self.offsets = threads, offsets
        self.n_runtime = tl.r_ts.size
        self._tl, self._classes = tl, classes
        self._tops: dict[int, tuple] = {}

    def thread(self, tid: int) -> slice:
        k = int(np.searchsorted(self.threads, tid))
        if k >= self.threads.size or self.threads[k] != tid:
            return slice(0, 0)
        return slice(int(self.offsets[k]), int(self.offsets[k + 1]))

    def lookup(self, tid: int, t: np.ndarray) -> np.ndarray:
        """Index of the segment of thread ``tid`` covering each time (-1: none, untraced)."""
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

    def caller(self, idx: np.ndarray) -> np.ndarray:
        """Name id of the outermost CPU op on the thread around each segment (-1: none)."""
        idx = np.asarray(idx, dtype=np.int64)
        out = np.full(idx.size, -1, dtype=np.int32)
        k = np.searchsorted(self.offsets, idx, side="right") - 1
        for j in np.unique(k).tolist():
            m = k == j
            s, e, names = self._top_ops(int(self.threads[j]))
            mid = 0.5 * (self.lo[idx[m]] + self.hi[idx[m]])
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


CHUNK = 65536
"""Events of one thread mapped at a time: a thread's events are cut by time into runs of this many, each run
mapped with the events open across its start (clipped to it), so memory stays bounded on any trace; the
innermost event and the precedence at an instant do not change when the events around it are clipped."""


def _segments(lo, hi, cls, src) -> list[tuple]:
    """The labelled segments of a set of events (one thread's, or one run of them)."""
    taken = iv.EMPTY
    out = []
    for code in range(len(HOST_CAUSES) - 1):
        m = cls == code
        if not m.any():
            continue
        region = iv.subtract(iv.union(lo[m], hi[m]), taken)
        taken = iv.join(taken, region)
        s_lo, s_hi, j = innermost(lo[m], hi[m])
        a, b, lab = clip_labelled(s_lo, s_hi, j, region)
        out.append((a, b, np.full(a.size, code, dtype=np.int8), src[np.flatnonzero(m)[lab]]))
    return out


def _thread_segments(tl: Timeline, tid: int, cls_of_name: np.ndarray) -> tuple[np.ndarray, ...]:
    """One thread's labelled segments: (lo, hi, cause, src), sorted by start."""
    nr = tl.r_ts.size
    r = np.flatnonzero(tl.r_tid == tid)
    c = np.flatnonzero(tl.c_tid == tid)
    lo = np.concatenate([tl.r_ts[r], tl.c_ts[c]])
    hi = lo + np.concatenate([tl.r_dur[r], tl.c_dur[c]])
    cls = np.concatenate([cls_of_name[tl.r_name[r]], cls_of_name[tl.c_name[c]]]).astype(np.int8)
    src = np.concatenate([r, nr + c]).astype(np.int64)
    del r, c
    keep = (cls >= 0) & (hi > lo)  # the step annotation says nothing; empty events cover nothing
    lo, hi, cls, src = lo[keep], hi[keep], cls[keep], src[keep]
    o = np.argsort(lo, kind="stable")
    lo, hi, cls, src = lo[o], hi[o], cls[o], src[o]
    del o, keep
    out: list[tuple] = []
    open_ = np.zeros(0, dtype=np.int64)  # events started before the run that reach into it
    for a in range(0, lo.size, CHUNK):
        b = min(a + CHUNK, lo.size)
        t0 = lo[a]
        t1 = lo[b] if b < lo.size else np.inf
        open_ = open_[hi[open_] > t0]
        idx = np.concatenate([open_, np.arange(a, b)])
        out += _segments(np.maximum(lo[idx], t0), np.minimum(hi[idx], t1), cls[idx], src[idx])
        open_ = idx[hi[idx] > t1]
    if not out:
        z = np.zeros(0)
        return z, z, np.zeros(0, dtype=np.int8), np.zeros(0, dtype=np.int64)
    a = np.concatenate([x[0] for x in out])
    o = np.argsort(a, kind="stable")
    return a[o], np.concatenate([x[1] for x in out])[o], np.concatenate([x[2] for x in out])[o], \
        np.concatenate([x[3] for x in out])[o]


def build(tl: Timeline, threads) -> HostMap:
    """The map of the given host threads."""
    classes = name_classes(tl)
    parts = []
    ths = np.unique(np.asarray(list(threads), dtype=np.int64))
    ths = ths[ths >= 0]
    for tid in ths.tolist():
        parts.append(_thread_segments(tl, tid, classes))
    counts = np.array([p[0].size for p in parts], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    if not parts:
        z = np.zeros(0)
        return HostMap(tl, z, z, np.zeros(0, dtype=np.int8), np.zeros(0, dtype=np.int64), ths, offsets, classes)
    lo, hi, cause, src = (np.concatenate([p[i] for p in parts]) for i in range(4))
    if src.size and src.max() < 2**31:
        src = src.astype(np.int32)
    return HostMap(tl, lo, hi, cause, src, ths, offsets, classes)


__all__ = ["HOST_CAUSES", "HostMap", "SYNC_OPS", "build", "clip_labelled", "innermost", "name_classes"]
