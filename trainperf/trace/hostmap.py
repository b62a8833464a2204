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

Each segment comes from one event, the innermost of its cause covering it (the latest to start; its
**source**, to count calls): its **detail** is that event's name (``cudaFree``, ``aten::mm``,
``Optimizer.step#AdamW.step``), its **caller** the outermost CPU op around it on that thread (``aten::item``
for the stream sync inside it); both are looked up only for the segments asked about. Everything is sorted
interval arithmetic (:mod:`trainperf.trace.intervals`) and pointer jumping for nesting: no Python loop per
event (one per chunk of a thread's events, and a few passes per nesting level).
"""

from __future__ import annotations

import numpy as np

from trainperf.trace import intervals as iv
from trainperf.trace.columns import reserved, unique
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
    event of that name. Only the names host events use are looked at; once per Timeline (the map, the graph's
    waits and the what-ifs all ask)."""
    n = len(tl.names)
    got = tl.__dict__.get("_name_classes")
    if got is not None and got[0] == n:
        return got[1]
    out = _classes(tl, n)
    tl.__dict__["_name_classes"] = (n, out)
    return out


def _classes(tl: Timeline, n: int) -> np.ndarray:
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
    return unique(np.concatenate(runs), kind="stable")


def bounds(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """The ends of disjoint sorted intervals, interleaved: a sorted run."""
    return np.column_stack((lo, hi)).ravel()


def innermost(lo: np.ndarray, hi: np.ndarray, tie: np.ndarray | None = None
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Disjoint segments ``(start, end, i)``, each labelled with the index ``i`` of the innermost interval
    ``[lo, hi)`` covering it: the latest to start (of two that start together, the shorter; of two alike, the
    larger ``tie``, else the later). Intervals that overlap without nesting are no exception: an instant goes to
    the latest-starting interval that covers it. Vectorized: each interval's nearest earlier one that ends
    later is found by pointer jumping, and each segment's label by walking those links from the last interval
    started (a few passes: as many as the nesting is deep)."""
    keep = np.flatnonzero(hi > lo)
    if keep.size == 0:
        z = np.zeros(0)
        return z, z, np.zeros(0, dtype=np.int64)
    lo, hi = lo[keep], hi[keep]
    o = np.lexsort((-hi, lo) if tie is None else (tie[keep], -hi, lo))  # by start; at one start, the longer first
    slo, shi = lo[o], hi[o]
    up = np.arange(-1, o.size - 1)  # the nearest earlier interval (in this order) that ends later (-1: none)
    active = np.arange(1, o.size)  # those whose link may still jump (one that does not jump is final)
    while active.size:
        u = up[active]
        jump = shi[u] <= shi[active]
        active = active[jump]
        up[active] = up[u[jump]]
        active = active[up[active] >= 0]
    pts = merged_points(slo, np.sort(shi))
    seg_lo, seg_hi = pts[:-1], pts[1:]
    label = np.searchsorted(slo, seg_lo, side="right") - 1  # the last to start at or before the segment
    active = np.flatnonzero(label >= 0)  # ... or, where that one has ended, the nearest earlier one that ends later
    while active.size:
        active = active[shi[label[active]] <= seg_lo[active]]
        label[active] = up[label[active]]
        active = active[label[active] >= 0]
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

    * the **runs**: each cause's time on the thread, over the whole trace (what a what-if removes), as the
      starts of runs (``r_lo``) that follow one another, each with its cause (``r_cause``: untraced too, where
      no event covers the thread; the last of a thread, an untraced one, never ends); 9 bytes a run;
    * the **segments**: ``lo``, ``hi``, ``cause`` (int8 index into :data:`HOST_CAUSES`) and ``src``, the event
      each comes from (runtime call ``r``, or CPU event ``n_runtime + c``; int32 while it fits), where they were
      asked for (:func:`build`'s ``want`` and ``points``; the named causes' everywhere). The names come from the
      events when asked: :meth:`detail` (the event's own name) and :meth:`caller` (the outermost CPU op around
      it on its thread, from the thread's top-level ops, found as the map is built)."""

    def __init__(self, tl: Timeline, seg: tuple, runs: tuple, tops: tuple, threads, offsets, r_offsets, t_offsets):
        self.lo, self.hi, self.cause, self.src = seg
        self.r_lo, self.r_cause = runs
        self.t_lo, self.t_hi, self.t_name = tops
        self.threads, self.offsets, self.r_offsets, self.t_offsets = threads, offsets, r_offsets, t_offsets
        self.n_runtime = tl.r_ts.size
        self._tl = tl

    def _k(self, tid: int) -> int:
        k = int(np.searchsorted(self.threads, tid))
        return k if k < self.threads.size and self.threads[k] == tid else -1

    def thread(self, tid: int) -> slice:
        """The thread's segments."""
        k = self._k(tid)
        return slice(0, 0) if k < 0 else slice(int(self.offsets[k]), int(self.offsets[k + 1]))

    def release(self) -> None:
        """Drop the runs and the callers (what the gains and the charges' names need); :meth:`runs` maps the
        threads again when asked."""
        self.r_lo = self.r_cause = None
        self.t_lo = self.t_hi = self.t_name = None

    def _again(self) -> None:
        if self.r_lo is None:  # released: the threads mapped again (their runs and top-level ops)
            again = build(self._tl, self.threads, iv.EMPTY)
            self.r_lo, self.r_cause, self.r_offsets = again.r_lo, again.r_cause, again.r_offsets
            self.t_lo, self.t_hi, self.t_name, self.t_offsets = again.t_lo, again.t_hi, again.t_name, again.t_offsets

    def runs(self, tid: int, cause: str | None = None) -> iv.Set:
        """The thread's time of one cause (None: of any: the traced time), a disjoint sorted set."""
        self._again()
        k = self._k(tid)
        if k < 0:
            return iv.EMPTY
        s = slice(int(self.r_offsets[k]), int(self.r_offsets[k + 1]))
        lo, code = self.r_lo[s], self.r_cause[s]
        m = code != _UNTRACED if cause is None else code == HOST_CAUSES.index(cause)
        hi = np.append(lo[1:], np.inf)[m]
        return iv.union(lo[m], hi) if cause is None else (lo[m], hi)

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
        self._again()
        idx = np.asarray(idx, dtype=np.int64)
        out = np.full(idx.size, -1, dtype=np.int32)
        at = 0.5 * (self.lo[idx] + self.hi[idx]) if at is None else np.asarray(at, dtype=np.float64)
        k = np.searchsorted(self.offsets, idx, side="right") - 1
        for j in unique(k).tolist():
            m = k == j
            t = slice(int(self.t_offsets[j]), int(self.t_offsets[j + 1]))
            s, e, names = self.t_lo[t], self.t_hi[t], self.t_name[t]
            mid = at[m]
            q = np.searchsorted(s, mid, side="right") - 1
            ok = q >= 0
            ok[ok] = mid[ok] < e[q[ok]]
            got = np.full(mid.size, -1, dtype=np.int32)
            got[ok] = names[q[ok]]
            out[m] = got
        return out


CHUNK = 65536
"""Events of one thread mapped at a time: a thread's events, in order of start, are cut into runs of about this
many (between distinct starts), each mapped with the events open across its start, so memory stays bounded on
any trace; every event covering an instant of the run is there, so the innermost event and the precedence at an
instant are those of the whole thread, and a segment cut at a run's start is joined again."""
_NAMED = len(HOST_CAUSES) - 3  # allocator, sync, gc, dataloader, optimizer: their segments are kept everywhere
_UNTRACED = len(HOST_CAUSES) - 1


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


def _segments(lo, hi, cls, src, asked: _Asked, t0: float, t1: float) -> tuple[list, list]:
    """The labelled segments (where asked; the named causes' everywhere) and the runs, inside ``[t0, t1)``, of
    a set of events: a chunk of a thread's events with those open across its start."""
    taken = iv.EMPTY
    segs, runs = [], []
    for code in range(len(HOST_CAUSES) - 1):
        m = np.flatnonzero(cls == code)
        if m.size == 0:
            continue
        region = iv.subtract(iv.union(np.maximum(lo[m], t0), np.minimum(hi[m], t1)), taken)
        taken = iv.join(taken, region)
        runs.append((region[0], region[1], np.full(region[0].size, code, dtype=np.int8)))
        if code >= _NAMED:
            m = m[asked.hits(lo[m], hi[m])]  # an instant asked about: every event covering it is among these
        if m.size == 0 or region[0].size == 0:
            continue
        s_lo, s_hi, j = innermost(lo[m], hi[m], src[m])  # whole events: the same labels in any chunk
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


def _by_thread(ts: np.ndarray, tids: np.ndarray, tid: int, itype) -> np.ndarray:
    """The events of one thread in one of the Timeline's columns, in order of start (stable): their indices
    (int32 while they fit; sorted only when the column is not in order already, as file order mostly is)."""
    idx = np.flatnonzero(tids == tid).astype(itype)
    for a in range(0, idx.size, 1 << 20):
        t = ts[idx[a:a + (1 << 20) + 1]]
        if np.any(t[1:] < t[:-1]):
            return idx[np.argsort(ts[idx], kind="stable")]
    return idx


def _chunks(tl: Timeline, tid: int, size: int):
    """A thread's events (runtime call ``r``, CPU event ``n_runtime + c``), in order of start (a call before a
    CPU event that starts with it), ``size`` at a time, never cutting between two that start together: each
    chunk merged from the thread's calls and CPU events, each already in order, so the thread's events are
    never all copied at once."""
    nr = tl.r_ts.size
    itype = np.int32 if nr + tl.c_ts.size < 2**31 else np.int64
    r = _by_thread(tl.r_ts, tl.r_tid, tid, itype)
    c = _by_thread(tl.c_ts, tl.c_tid, tid, itype)
    pr = pc = 0
    w = size
    while pr < r.size or pc < c.size:
        rw, cw = r[pr:pr + w], c[pc:pc + w]
        src = np.concatenate([rw, cw + itype(nr)])
        st = np.concatenate([tl.r_ts[rw], tl.c_ts[cw]])
        o = np.argsort(st, kind="stable")
        src, st = src[o], st[o]
        # every event outside the windows starts at or after the last start each window holds
        lim = min(float(tl.r_ts[rw[-1]]) if pr + w < r.size else np.inf,
                  float(tl.c_ts[cw[-1]]) if pc + w < c.size else np.inf)
        safe = int(np.searchsorted(st, lim, side="left"))
        if safe == 0:  # every event here starts at the windows' limit: look further
            w *= 2
            continue
        p = min(size, safe)
        p = min(safe, int(np.searchsorted(st, st[p - 1], side="right")))  # the whole of a tie
        src = src[:p]
        k = int(np.count_nonzero(src < nr))
        pr, pc, w = pr + k, pc + (p - k), size
        yield src


def _gather(tl: Timeline, src: np.ndarray, col: str) -> np.ndarray:
    """The ``ts`` / ``dur`` / ``name`` of events numbered as :func:`_chunks` numbers them."""
    nr = tl.r_ts.size
    r, c = getattr(tl, "r_" + col), getattr(tl, "c_" + col)
    out = np.empty(src.size, dtype=np.result_type(r.dtype, c.dtype))
    rt = src < nr
    out[rt] = r[src[rt]]
    out[~rt] = c[src[~rt] - nr]
    return out


def _map_thread(tl: Timeline, tid: int, cls_of_name: np.ndarray, asked: _Asked, out: tuple) -> None:
    """One thread's segments, runs and top-level ops, appended to the columns of ``out`` in order of time."""
    seg_out, run_out, top_out = out
    o_lo, o_hi = np.zeros(0), np.zeros(0)  # the events open across the next run's start: times, class, source
    o_cls, o_src = np.zeros(0, dtype=np.int8), np.zeros(0, dtype=np.int64)
    last = [-np.inf, -1, -np.inf]  # the last run's end and cause; the latest end of the top-level ops
    chunks = _chunks(tl, tid, CHUNK)
    src = next(chunks, None)
    while src is not None:
        following = next(chunks, None)
        lo = _gather(tl, src, "ts")
        hi = lo + _gather(tl, src, "dur")
        name = _gather(tl, src, "name")
        cls = cls_of_name[name]
        _add_tops(top_out, tl, src, lo, hi, name, cls, last)
        del name
        keep = (cls >= 0) & (hi > lo)  # the step annotation says nothing; empty events cover nothing
        t0 = float(lo[0])
        t1 = float(_gather(tl, following[:1], "ts")[0]) if following is not None else np.inf
        o_keep = o_hi > t0
        lo = np.concatenate([o_lo[o_keep], lo[keep]])
        hi = np.concatenate([o_hi[o_keep], hi[keep]])
        cls = np.concatenate([o_cls[o_keep], cls[keep]])
        src = np.concatenate([o_src[o_keep], src[keep]])
        segs, runs = _segments(lo, hi, cls, src, asked, t0, t1)
        _add_segments(seg_out, _by_start(segs, 4))
        _add_runs(run_out, _by_start(runs, 3), last)
        spill = hi > t1
        o_lo, o_hi, o_cls, o_src = lo[spill], hi[spill], cls[spill], src[spill]
        src = following
    if last[1] >= 0:  # the untraced run after the thread's last event
        run_out[0].add(np.array([last[0]]))
        run_out[1].add(np.array([_UNTRACED], dtype=np.int8))


def _add_segments(cols: list, seg: list) -> None:
    """Append segments, joining the first to the last one there when it goes on from the same event (a
    segment cut at a chunk's start)."""
    lo, hi, cause, src = seg
    c_lo, c_hi, c_cause, c_src = cols
    n = c_lo.n
    if lo.size and n and c_hi.buf[n - 1] == lo[0] and c_src.buf[n - 1] == src[0] and c_cause.buf[n - 1] == cause[0]:
        c_hi.buf[n - 1] = hi[0]
        lo, hi, cause, src = lo[1:], hi[1:], cause[1:], src[1:]
    for col, v in zip(cols, (lo, hi, cause, src)):
        col.add(v)


def _add_tops(cols: list, tl: Timeline, src, lo, hi, name, cls, last: list) -> None:
    """Append the top-level CPU ops of a run of the thread's events (not inside an earlier op; the step
    annotation and the phases' spans, which 1.8 writes as ops, are not callers): the callers."""
    nr = tl.r_ts.size
    op = (src >= nr) & ((cls == _CPU_OP) | (cls == _SPECIAL["sync"]))
    op[op] = tl.c_kind[src[op] - nr] == C_OP
    s, e, n = lo[op], hi[op], name[op]
    if s.size == 0:
        return
    o = np.lexsort((-e, s))  # the parent first where two start together
    s, e, n = s[o], e[o], n[o]
    run = np.maximum.accumulate(e)
    before = np.concatenate([[last[2]], np.maximum(run[:-1], last[2])])
    top = s >= before
    last[2] = max(last[2], float(run[-1]))
    for col, v in zip(cols, (s[top], e[top], n[top])):
        col.add(v)


def _add_runs(cols: list, run: list, last: list) -> None:
    """Append runs as starts and causes: an untraced run where the thread has a hole, the first run joined to
    the last one there when it goes on with the same cause (a run cut at a chunk's start)."""
    lo, hi, cause = run
    if lo.size == 0:
        return
    hole = np.concatenate([[lo[0] > last[0]], lo[1:] > hi[:-1]])
    starts = np.empty(lo.size + int(hole.sum()))
    codes = np.empty(starts.size, dtype=np.int8)
    at = np.arange(lo.size) + np.cumsum(hole)  # each run after the holes before it
    starts[at], codes[at] = lo, cause
    h = at[hole] - 1
    starts[h] = np.concatenate([[last[0]], hi[:-1]])[hole]
    codes[h] = _UNTRACED
    if last[1] < 0 and hole[0]:  # the thread's first run: nothing before it to say
        starts, codes = starts[1:], codes[1:]
    elif codes[0] == last[1]:  # it goes on with the run before it
        starts, codes = starts[1:], codes[1:]
    cols[0].add(starts)
    cols[1].add(codes)
    last[0], last[1] = float(hi[-1]), int(cause[-1])


def build(tl: Timeline, threads, want: iv.Set | None = None, points: dict | None = None) -> HostMap:
    """The map of the given host threads: every thread's runs and top-level ops, and its segments where asked:
    over ``want`` (a disjoint sorted set of times; None: everywhere) and at the instants ``points[tid]`` (the
    named causes' everywhere)."""
    classes = name_classes(tl)
    ths = unique(np.asarray(list(threads), dtype=np.int64))
    ths = ths[ths >= 0]
    n = int(tl.r_ts.size + tl.c_ts.size)
    out = ([reserved(np.float64), reserved(np.float64), reserved(np.int8), reserved(np.int64)],
           [reserved(np.float64, 2 * n + 16), reserved(np.int8, 2 * n + 16)],
           [reserved(np.float64, tl.c_ts.size), reserved(np.float64, tl.c_ts.size), reserved(np.int32, tl.c_ts.size)])
    offsets = [[0], [0], [0]]
    for tid in ths.tolist():
        asked = _Asked(want, None if want is None or points is None else points.get(tid))
        _map_thread(tl, tid, classes, asked, out)
        for k in range(3):
            offsets[k].append(out[k][0].n)
    seg, runs, tops = (tuple(c.array() for c in cols) for cols in out)
    return HostMap(tl, seg, runs, tops, ths, *(np.array(o, dtype=np.int64) for o in offsets))


__all__ = ["HOST_CAUSES", "HostMap", "SYNC_OPS", "build", "clip_labelled", "innermost", "name_classes"]
