"""Replay one rank's CPU-GPU dependencies with host time removed or added: the what-if behind each cause's
gain, and the engine :mod:`trainperf.tracegen.causes` edits real traces with.

**The graph** (built once per rank, :func:`build`), read off the trace's own times:

* **host**: the rank's host threads are one serial program (PyTorch's main thread waits for the autograd
  thread during backward): removing host time moves every later host event earlier by it, adding some moves
  them later (``base(t) = t - removed_before(t) + added_before(t)``);
* **launch**: a GPU event starts no earlier than its launch call (correlation id) plus its launch latency;
* **stream order**: nor before its stream predecessor ends (plus the gap the GPU itself left between them,
  when the event was already queued: under 30 us);
* **cross-stream events**: an event that started after its launch and its predecessor allowed waited for
  another stream (``cudaStreamWaitEvent``): its dependency is the event of another stream that ended last
  before it started (within 30 us), and it starts that long after that event ends;
* **syncs**: a call that makes the host wait (stream / device / event syncs, blocking copies, ``cudaFree``
  and ``hipFree``, which synchronize the device) returns when the streams it waits on are done, plus the
  time it took after that; the host after it follows. A device-wide call waits on every stream; another, on
  the streams whose work ended while it waited, else the stream its thread last launched on.

Each event's latency, gap and dependency lag are taken from the trace so that replaying with nothing changed
gives back every GPU event's time (checked by the tests). Kernel durations never change; a collective's
includes its wait for the other ranks (the cross-rank stage splits it).

**The replay** (:func:`run`) goes from sync to sync: the launches before the next sync start at their host
time; each stream is a max-plus recurrence (``end_i = max(end_(i-1) + gap_i, ready_i) + dur_i``, a cumulative
maximum per stream), cross-stream dependencies are relaxed until nothing moves; the sync then returns when its
streams are done and sets the host's shift after it. Vectorized per stream between syncs: the Python loop is
per sync and stream, never per event.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from trainperf.trace.columns import percentiles, unique

from trainperf.trace import intervals as iv
from trainperf.trace.hostmap import HOST_CAUSES
from trainperf.trace.hta import KERNEL_WAIT_US
from trainperf.trace.timeline import Timeline

DEVICE_WIDE = re.compile(r"(?:cuda|hip|cu)(?:Device|Thread|Ctx)Synchronize$|(?:cuda|hip)(?:Free|FreeHost|HostFree)$|"
                         r"cuMemFree(?:Host)?(?:_v2)?$")
DEFAULT_LATENCY_US = 5.0
_EPS = 0.5  # us: two events this close count as touching


@dataclass
class Graph:
    """GPU events sorted by (stream, start): their index in the timeline (``ev``), stream code, latency and
    stream gap; their durations, starts and launch calls are the Timeline's (``g_dur``, ``g_ts``, ``r_ts``,
    ``launch``: not copied); the cross-stream dependencies, few (``d_at``: the events that have one, in this
    order; ``d_to``: it; ``d_lag``: the time after it ends); the order the events are replayed in (``order``: by
    the host time they are replayed by, the latest launch of them and their stream predecessors, ``okey``,
    rising); the waits (syncs) sorted by start: start, end, target streams, the time after the wait, their
    runtime call index. Indices are int32 while they fit: 30 bytes a GPU event."""
    ev: np.ndarray
    stream: np.ndarray
    lat: np.ndarray
    gap: np.ndarray
    g_dur: np.ndarray
    g_ts: np.ndarray
    r_ts: np.ndarray
    launch: np.ndarray
    d_at: np.ndarray
    d_to: np.ndarray
    d_lag: np.ndarray
    nstreams: int
    order: np.ndarray
    okey: np.ndarray
    w_s: np.ndarray
    w_e: np.ndarray
    w_streams: np.ndarray  # bool (waits, streams)
    w_tail: np.ndarray
    w_call: np.ndarray

    def launched_at(self, idx: np.ndarray) -> np.ndarray:
        """The launch call's start of events (in the graph's order; an event with none: its own start)."""
        ev = self.ev[idx]
        li = self.launch[ev]
        out = self.g_ts[ev]
        m = li >= 0
        out[m] = self.r_ts[li[m]]
        return out


def wait_calls(tl: Timeline, classes: np.ndarray) -> np.ndarray:
    """The runtime calls that may make the host wait: syncs (``classes``: the host cause code per name id, from
    :func:`trainperf.trace.hostmap.name_classes`) and the frees that synchronize the device."""
    if tl.r_ts.size == 0:
        return np.zeros(0, dtype=np.int64)
    waits = classes == HOST_CAUSES.index("sync")
    for i in unique(tl.r_name).tolist():
        waits[i] |= bool(DEVICE_WIDE.match(str(tl.names[i])))
    return np.flatnonzero(waits[tl.r_name])


def build(tl: Timeline, launch: np.ndarray, wait_calls: np.ndarray) -> Graph:
    """The graph of a rank (module docstring). ``wait_calls``: the runtime calls that may make the host wait.
    Each per-event array is made when it is needed and dropped after (the transient memory is a few arrays of
    a float per GPU event)."""
    n = tl.g_ts.size
    itype = np.int32 if n < 2**31 else np.int64
    if n:
        codes, s_inv = np.unique(tl.g_stream, return_inverse=True)
        o = np.lexsort((tl.g_ts, s_inv)).astype(itype)
        stream = s_inv[o].astype(np.int32)
        del s_inv
    else:
        codes, o, stream = np.zeros(0), np.zeros(0, dtype=itype), np.zeros(0, dtype=np.int32)
    ns = int(codes.size)
    start = tl.g_ts[o]
    end = start + tl.g_dur[o]
    li = launch[o]
    has = li >= 0
    first = np.ones(n, dtype=bool)
    first[1:] = stream[1:] != stream[:-1]
    # no launch call in the trace (launched before the profiling window, its call dropped, work the device starts
    # itself such as MTIA's DMA requests): taken as launched at its own start, on the host's time
    l_ts = start.copy()
    l_ts[has] = tl.r_ts[li[has]]
    key = _keys(first, l_ts)
    dep = _deps(start, end, stream, key)
    pred_end = np.empty(n)
    pred_end[1:] = end[:-1]
    pred_end[first] = -np.inf
    l_end = np.full(n, np.nan)
    l_end[has] = l_ts[has] + tl.r_dur[li[has]]
    del li
    with np.errstate(invalid="ignore"):
        queued = has & (l_end <= pred_end)
    typical = DEFAULT_LATENCY_US
    lb = (start - l_ts)[has & ~queued & (start > pred_end + _EPS) & (dep < 0)]  # launch-bound, no dependency
    if lb.size:
        typical = float(max(percentiles(lb, [50])[0], 0.0))
    del lb
    lat = np.where(has, np.minimum(start - l_ts, typical), 0.0)
    gap = start - pred_end  # the stream gap, kept only where the GPU itself left it (below)
    small = queued & (gap <= KERNEL_WAIT_US)
    with np.errstate(invalid="ignore"):
        dep_end = np.where(dep >= 0, end[np.maximum(dep, 0)], -np.inf)
        dep_bound = (dep >= 0) & ~small & (dep_end > np.where(has, l_end, -np.inf)) & (dep_end > pred_end)
    del l_end, pred_end
    d_at = np.flatnonzero(dep_bound)
    d_to, d_lag = dep[d_at], start[d_at] - dep_end[d_at]
    del dep_end, dep
    rest = has & ~small & ~dep_bound
    launch_bound = rest & ~queued
    lat[launch_bound] = (start - l_ts)[launch_bound]  # launch-bound: the whole delay is the launch's
    # the gap: where queued and small (may be a little negative: integer-us times overlap by a rounding), or
    # queued and unexplained (the GPU's own), or negative (started before its predecessor ended: overlapping
    # copies, DMA requests, as recorded); else none
    keep_gap = small | (rest & queued) | (~first & (gap < 0))
    gap[~keep_gap] = 0.0
    del keep_gap, small, rest, launch_bound, dep_bound
    w = _waits(tl, wait_calls, launch, o, stream, end, l_ts, key, has, ns)
    del start, end, has, first, l_ts
    order = np.argsort(key, kind="stable").astype(itype)  # ties: in (stream, start) order
    return Graph(o, stream, lat, gap, tl.g_dur, tl.g_ts, tl.r_ts, launch, d_at.astype(itype), d_to.astype(itype),
                 d_lag, ns, order, key[order], *w)


def _deps(start: np.ndarray, end: np.ndarray, stream: np.ndarray, key: np.ndarray) -> np.ndarray:
    """Per event (graph order): the event of another stream that ended last before it started (within
    KERNEL_WAIT_US) and is replayed no later (its key no later), -1: none; found a chunk of events at a time."""
    n = start.size
    dep = np.full(n, -1, dtype=np.int32 if n < 2**31 else np.int64)
    if n == 0:
        return dep
    eo = np.argsort(end, kind="stable").astype(dep.dtype)
    ends = end[eo]
    for a in range(0, n, CHUNK):
        sl = slice(a, min(a + CHUNK, n))
        st, k, out = start[sl], key[sl], dep[sl]
        j = np.searchsorted(ends, st + _EPS, side="right") - 1
        for _ in range(4):  # step back past same-stream events (a handful at most)
            ok = (j >= 0) & (out < 0)
            jj = np.maximum(j, 0)
            cand = eo[jj]
            good = ok & (stream[cand] != stream[sl]) & (ends[jj] >= st - KERNEL_WAIT_US) & (key[cand] <= k)
            out[good] = cand[good]
            j = np.where(ok & ~good & (stream[cand] == stream[sl]), j - 1, -1)
    return dep


def _keys(first: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Per event (in (stream, start) order): the host time by which it is replayed, the latest launch of it
    and of its stream predecessors (a running maximum per stream, ``first`` marking each stream's start): the
    replay goes from wait to wait by it, so that an event is never replayed before its stream predecessor
    (work launched after a wait can precede, on its stream, work launched before it: an event whose launch call
    is not in the trace is taken as launched at its start)."""
    out = t.copy()
    cut = np.append(np.flatnonzero(first), t.size)
    for a, b in zip(cut[:-1], cut[1:]):  # a loop per stream
        np.maximum.accumulate(out[a:b], out=out[a:b])
    return out


def _waits(tl, calls, launch, o, stream, end, l_ts, key, has, ns):
    """The waits, sorted by start, none overlapping an earlier one; their target streams and tails. A wait sees
    on each stream the events replayed before it (their key up to its start: a prefix of the stream)."""
    calls = np.asarray(calls, dtype=np.int64)
    calls = calls[np.argsort(tl.r_ts[calls], kind="stable")] if calls.size else calls
    s, e = tl.r_ts[calls], tl.r_ts[calls] + tl.r_dur[calls]
    keep = np.ones(calls.size, dtype=bool)
    if calls.size:
        prev_end = np.concatenate([[-np.inf], np.maximum.accumulate(e)[:-1]])
        keep = s >= prev_end
    calls, s, e = calls[keep], s[keep], e[keep]
    k = calls.size
    streams = np.zeros((k, max(ns, 1)), dtype=bool)
    tail = np.zeros(k)
    if k == 0:
        return s, e, streams, tail, calls
    names = tl.names
    wide = np.array([bool(DEVICE_WIDE.match(str(names[i]))) for i in tl.r_name[calls]], dtype=bool)
    # per stream (the graph's order; the keys rise along it): the running max of the ends
    bounds = np.flatnonzero(np.concatenate([[True], stream[1:] != stream[:-1], [True]]))
    last_before = np.full((k, max(ns, 1)), -np.inf)
    for a, b in zip(bounds[:-1], bounds[1:]):
        run_end = np.maximum.accumulate(end[a:b])
        j = np.searchsorted(key[a:b], s, side="right") - 1
        ok = j >= 0
        last_before[ok, int(stream[a])] = run_end[j[ok]]
    # which streams each waited on: device-wide, else those whose work ended while it waited, else the stream
    # its thread launched on last
    ended_inside = (last_before > s[:, None]) & (last_before <= e[:, None] + _EPS)
    streams[:] = ended_inside
    tid = tl.r_tid[calls]
    lt = np.flatnonzero(has)
    lt = lt[np.argsort(l_ts[lt], kind="stable")]
    l_tid = tl.r_tid[launch[o[lt]]] if lt.size else np.zeros(0, dtype=np.int64)
    open_ = np.flatnonzero(~wide & ~ended_inside.any(axis=1))
    for t in unique(tid[open_]).tolist():
        i = open_[tid[open_] == t]
        mine = lt[l_tid == t] if t >= 0 else lt
        j = np.searchsorted(l_ts[mine], s[i], side="right") - 1
        ok = j >= 0
        streams[i[ok], stream[mine[j[ok]]]] = True
        streams[i[~ok], :] = True
    streams[wide] = True
    tgt = np.where(streams, last_before, -np.inf).max(axis=1)
    tail = e - np.maximum(s, tgt)
    return s, e, streams, tail, calls


class HostShift:
    """``t -> `` the host time after the edit: ``base(t)`` plus the shift set by the last wait that ended
    before ``t``; inside a wait, interpolated between its new start and its new end."""

    def __init__(self, removed: iv.Set, add_t: np.ndarray, add_us: np.ndarray, w_s: np.ndarray, w_e: np.ndarray):
        self.removed = removed
        self._pre = iv.prefix(removed)
        o = np.argsort(add_t, kind="stable")
        self.add_t = np.asarray(add_t, dtype=np.float64)[o]
        self.add_cum = np.concatenate([[0.0], np.cumsum(np.asarray(add_us, dtype=np.float64)[o])])
        self.w_s, self.w_e = w_s, w_e
        self.shift = np.zeros(w_s.size)  # after each wait
        self.new_end = w_e.copy()

    def base(self, t) -> np.ndarray:
        t = np.asarray(t, dtype=np.float64)
        return t - iv.covered_before(self.removed, t, self._pre) + \
            self.add_cum[np.searchsorted(self.add_t, t, side="left")]

    def base_one(self, t: float) -> float:
        """:meth:`base` of one time, in Python scalars (the replay asks it twice per wait), to the bit."""
        lo, hi = self.removed
        i = int(np.searchsorted(lo, t, side="right")) if lo.size else 0
        covered = 0.0
        if i > 0:
            j = i - 1
            covered = float(self._pre[j]) + min(max(t - float(lo[j]), 0.0), float(hi[j]) - float(lo[j]))
        return t - covered + float(self.add_cum[int(np.searchsorted(self.add_t, t, side="left"))])

    def one(self, t: float, upto: int) -> float:
        """``self([t], upto)[0]`` in Python scalars, to the bit."""
        out = self.base_one(t)
        if upto == 0:
            return out
        k = int(np.searchsorted(self.w_s[:upto], t, side="right")) - 1
        if k < 0:
            return out + 0.0
        if t >= self.w_e[k]:
            return out + float(self.shift[k])
        a = self.base_one(float(self.w_s[k])) + (float(self.shift[k - 1]) if k > 0 else 0.0)
        frac = (t - float(self.w_s[k])) / max(float(self.w_e[k]) - float(self.w_s[k]), 1e-12)
        return a + frac * (float(self.new_end[k]) - a)

    def __call__(self, t, upto: int | None = None) -> np.ndarray:
        """Vectorized; ``upto``: only the first ``upto`` waits are known (the replay in progress)."""
        t = np.asarray(t, dtype=np.float64)
        n = self.w_s.size if upto is None else upto
        out = self.base(t)
        if n == 0:
            return out
        k = np.searchsorted(self.w_s[:n], t, side="right") - 1
        done = (k >= 0) & (t >= self.w_e[np.maximum(k, 0)])
        prev = np.where(done, k, k - 1)  # the last wait over before t
        out = out + np.where(prev >= 0, self.shift[np.maximum(prev, 0)], 0.0)
        inside = (k >= 0) & ~done
        if inside.any():
            kk = k[inside]
            a = self.base(self.w_s[kk]) + np.where(kk > 0, self.shift[np.maximum(kk - 1, 0)], 0.0)
            frac = (t[inside] - self.w_s[kk]) / np.maximum(self.w_e[kk] - self.w_s[kk], 1e-12)
            out[inside] = a + frac * (self.new_end[kk] - a)
        return out


def run(g: Graph, removed: iv.Set = iv.EMPTY, *, add_t=None, add_us=None, skip_waits=None,
        zero_latency: bool = False, max_latency: float | None = None, extra_waits=None
        ) -> tuple[np.ndarray, HostShift]:
    """Replay: the new start of every GPU event (in the timeline's order) and the host-time map.

    ``removed``: host time taken out; ``add_t``/``add_us``: host time added at instants (before an event
    starting there); ``skip_waits``: bool per wait, those that no longer wait (their time removed too);
    ``zero_latency``: launches start their work at once; ``max_latency``: no launch latency or queued gap
    longer than this (the work that waited on what the trace does not show runs at once); ``extra_waits``: ``(at, streams_mask, after_us)``
    waits inserted at host instants (a ``cudaFree`` that synchronizes the device, a sync after ``.item()``)."""
    add_t = np.zeros(0) if add_t is None else np.asarray(add_t, dtype=np.float64)
    add_us = np.zeros(0) if add_us is None else np.asarray(add_us, dtype=np.float64)
    w_s, w_e, w_streams, w_tail = g.w_s, g.w_e, g.w_streams, g.w_tail
    if skip_waits is not None and np.any(skip_waits):
        keep = ~np.asarray(skip_waits, dtype=bool)
        w_s, w_e, w_streams, w_tail = w_s[keep], w_e[keep], w_streams[keep], w_tail[keep]
    if extra_waits is not None and len(extra_waits[0]):
        at, mask, after = (np.asarray(x) for x in extra_waits)
        w_s = np.concatenate([w_s, at.astype(np.float64)])
        w_e = np.concatenate([w_e, at.astype(np.float64)])  # an instant of the original host timeline
        w_streams = np.concatenate([w_streams, mask.astype(bool).reshape(len(at), -1)])
        w_tail = np.concatenate([w_tail, np.full(len(at), np.nan)])  # marks an inserted wait: 'after' follows
        extra_after = np.concatenate([np.full(g.w_s.size if skip_waits is None else int((~np.asarray(
            skip_waits, dtype=bool)).sum()), np.nan), after.astype(np.float64)])
        o = np.argsort(w_s, kind="stable")
        w_s, w_e, w_streams, w_tail, extra_after = w_s[o], w_e[o], w_streams[o], w_tail[o], extra_after[o]
    else:
        extra_after = np.full(w_s.size, np.nan)
    h = HostShift(removed, add_t, add_us, w_s, w_e)
    n = g.ev.size
    new_end = np.full(n, np.nan)
    last_end = np.full(max(g.nstreams, 1), -np.inf)  # per stream: the end of its last event replayed
    done = last_end.copy()  # ... and the latest end of any (what a wait waits for)
    # batch k: the events replayed by a host time up to wait k's start, after wait k - 1's
    cut = np.concatenate([[0], np.searchsorted(g.okey, w_s, side="right"), [n]])
    for k in range(w_s.size + 1):
        for a, b in _pieces(g.okey, int(cut[k]), max(int(cut[k]), int(cut[k + 1]))):
            _replay(g, a, b, lambda t, k=k: h(t, upto=k), zero_latency, max_latency, new_end, last_end, done)
        if k < w_s.size:
            at = h.one(float(w_s[k]), k)
            mask = w_streams[k]
            tgt = float(done[mask].max()) if mask.any() else -np.inf
            if np.isnan(w_tail[k]):  # an inserted wait: waits, then takes its own time
                ne = max(at, tgt) + float(extra_after[k])
            else:
                ne = max(at, tgt) + float(w_tail[k])
            h.new_end[k] = ne
            h.shift[k] = ne - h.base_one(float(w_e[k]))
    new_end -= g.g_dur[g.ev]
    out = np.empty(n)
    out[g.ev] = new_end
    return out, h


CHUNK = 65536
"""Events replayed at once: a batch (the events between two waits) is replayed in pieces of this many, in their
order (cut only between distinct host times): an event's stream predecessor and dependency are never in a later
piece, so the pieces one after another give the batch's replay, in bounded memory."""


def _pieces(okey: np.ndarray, a: int, b: int, size: int = CHUNK) -> list[tuple[int, int]]:
    """``[a, b)`` cut into pieces of about ``size`` events, between distinct keys."""
    out = []
    while a < b:
        c = a + size
        c = b if c >= b else min(b, int(np.searchsorted(okey, okey[c - 1], side="right")))
        out.append((a, c))
        a = c
    return out


def _replay(g: Graph, a: int, b: int, host, zero_latency: bool, max_latency: float | None, new_end: np.ndarray,
            last_end: np.ndarray, done: np.ndarray) -> None:
    """Replay the events ``g.order[a:b]`` (their host times mapped by ``host``); where the cross-stream
    dependencies do not settle, in halves."""
    idx = np.sort(g.order[a:b])  # the graph's order is (stream, start): sorted indices keep it
    lat = np.zeros(idx.size) if zero_latency else g.lat[idx]
    gap = g.gap[idx]
    if max_latency is not None:
        np.minimum(lat, max_latency, out=lat)
        np.minimum(gap, max_latency, out=gap)
    ready = host(g.launched_at(idx)) + lat
    del lat
    saved = (last_end.copy(), done.copy())
    if _stream_batch(g, idx, ready, gap, new_end, last_end, done):
        return
    halves = _pieces(g.okey, a, b, (b - a + 1) // 2)
    if len(halves) < 2:  # one host time: nothing to cut (what has settled stands)
        return
    new_end[idx] = np.nan  # a chain of dependencies too long to settle at once: the halves one after another
    last_end[:], done[:] = saved
    for p, q in halves:
        _replay(g, p, q, host, zero_latency, max_latency, new_end, last_end, done)


_SETTLE = 64


def _stream_batch(g: Graph, idx: np.ndarray, ready: np.ndarray, gap: np.ndarray, new_end: np.ndarray,
                  last_end: np.ndarray, done: np.ndarray) -> bool:
    """Replay events (``idx``, in stream order; ``ready``, ``gap``: theirs) on their streams, relaxing
    cross-stream dependencies until nothing moves; False when they have not settled after ``_SETTLE`` passes."""
    st = g.stream[idx]
    bounds = np.flatnonzero(np.concatenate([[True], st[1:] != st[:-1], [True]]))
    k = np.minimum(np.searchsorted(g.d_at, idx), max(g.d_at.size - 1, 0))
    has_dep = (g.d_at[k] == idx) if g.d_at.size else np.zeros(idx.size, dtype=bool)
    d, lag = g.d_to[k[has_dep]], g.d_lag[k[has_dep]]
    del k
    dur = g.g_dur[g.ev[idx]]
    base_last = last_end.copy()
    settled = not has_dep.any()
    for _ in range(_SETTLE):
        eff = ready.copy()
        if not settled:
            de = new_end[d]
            eff[has_dep] = np.maximum(eff[has_dep], np.where(np.isnan(de), -np.inf, de + lag))
            before = new_end[idx]
        for a, b in zip(bounds[:-1], bounds[1:]):
            s = int(st[a])
            dd = dur[a:b] + gap[a:b]
            p = np.cumsum(dd)
            best = np.maximum.accumulate(eff[a:b] - gap[a:b] - (p - dd))
            e = p + np.maximum(base_last[s], best)
            new_end[idx[a:b]] = e
            last_end[s] = e[-1]
        if settled or np.array_equal(before, new_end[idx], equal_nan=True):
            settled = True
            break
    for a, b in zip(bounds[:-1], bounds[1:]):
        s = int(st[a])
        done[s] = max(done[s], float(new_end[idx[a:b]].max()))
    return settled


__all__ = ["DEVICE_WIDE", "Graph", "HostShift", "build", "run", "wait_calls"]
