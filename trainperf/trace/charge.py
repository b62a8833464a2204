"""Every microsecond of a rank's timeline charged to one cause: the GPU's busy time by what ran, each idle
instant by what the host was doing that kept the GPU waiting. The method (stated in full in
docs/concepts/attribution.md and :mod:`trainperf.trace.attribution`):

* **GPU busy**, on the rank's device (the one with the most kernel time): ``compute`` (non-communication
  kernels), ``communication`` (collective kernels while no compute kernel runs), ``memcpy`` and ``memset``
  (copies / fills while neither runs). The rest of the time is idle.
* **Each idle gap** ends when some GPU event starts; that event's launch call (correlation id) names the host
  thread the GPU was waiting for. From the launch call's start to the end of the gap the GPU waits on the
  launch itself (the call and the launch-to-start latency): charged to the cause of the thread's activity
  at the launch (``launch``, or the phase around it: the optimizer's launches are the optimizer's). Before
  the launch call, each instant is charged to what that thread was doing then
  (:mod:`trainperf.trace.hostmap`: allocator and sync calls, then gc / DataLoader / optimizer phases, then
  launches, then plain CPU ops and Python functions, else ``untraced``). This is the critical path through
  the gap: nothing on the GPU could start, so the path runs through the host thread that launched the next
  work, back to the launch, the ops before it, and the waits before them.
  A launched event that still does not start once the call has returned and 30 us have passed waited on
  something the trace does not show (``gpu_wait``: another device or process, dropped events).
* **Refill** (:mod:`trainperf.trace.whatif`): a wait or phase (allocator or sync calls, gc, the DataLoader,
  the optimizer step) first eats the GPU's lead (the work queued ahead of the host); once it is over, the
  queue refills only as fast as the host launches. The idle gaps that shrink when that cause's host time is
  replayed away, beyond what is charged to it there already, give it that much of their ``launch`` /
  ``cpu_op`` / ``untraced`` idle.

No Python loop per event: unions, searchsorted and cumulative sums over sorted arrays.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from trainperf.trace.columns import unique

from trainperf.trace import figures as fg
from trainperf.trace import hostmap
from trainperf.trace import intervals as iv
from trainperf.trace.hostmap import HOST_CAUSES
from trainperf.trace.patterns import load as load_patterns
from trainperf.trace.tb import launch_index
from trainperf.trace.timeline import GPU_KERNEL, GPU_MEMCPY, GPU_MEMSET, Timeline

GPU_CAUSES = ("compute", "communication", "memcpy", "memset")
IDLE_CAUSES = HOST_CAUSES + ("gpu_wait",)
"""The idle causes: the host's (:data:`trainperf.trace.hostmap.HOST_CAUSES`), then ``gpu_wait``: GPU work
launched and queued that did not start on the idle device (more than 30 us after its launch call returned):
it waited on something the trace does not show (another device or process, events the profiler dropped)."""
CAUSES = GPU_CAUSES + IDLE_CAUSES
"""Every cause, GPU-busy ones first: the keys of :func:`trainperf.trace.attribution.attribute_windows`."""
CODE = {c: i for i, c in enumerate(CAUSES)}
NAMED = ("allocator", "sync", "gc", "dataloader", "optimizer")
"""The named host causes: the refill rule gives them the plain idle their host time causes after them, in
this order."""
PLAIN = ("launch", "cpu_op", "untraced")
AHEAD_US = 30.0
"""The launch's share of a gap: up to this long after its launch call returned (and any gap shorter than this:
the GPU's own kernel-to-kernel overhead, HTA's kernel wait); queued work that waits longer on an idle device
waited on something else (``gpu_wait``). HTA's consecutive-kernel threshold."""
_H = len(GPU_CAUSES)


@dataclass
class Charges:
    """One rank's charged timeline. ``busy[k]``: the disjoint set of GPU cause ``k``; the pieces: idle
    intervals (sorted, disjoint) with their cause code (index into :data:`CAUSES`), detail / caller name ids
    (-1: none), source event (to count calls) and host thread."""
    busy: list
    lo: np.ndarray
    hi: np.ndarray
    cause: np.ndarray
    detail: np.ndarray
    caller: np.ndarray
    src: np.ndarray
    tid: np.ndarray
    span: tuple[float, float]
    hmap: hostmap.HostMap
    main_thread: int
    device: int | None
    gpu: np.ndarray  # mask of the device's GPU events
    launch: np.ndarray  # per GPU event: its launch call (-1)
    refilled: np.ndarray  # per piece: moved to a wait by the refill rule
    gap: np.ndarray  # per piece: the idle gap it is part of
    gaps: iv.Set  # the idle gaps (sorted, disjoint)
    waker: np.ndarray  # per gap: the GPU event that ends it (-1: none, the trace's end)
    allbusy: iv.Set  # the device's busy time
    graph: Any = None  # the rank's dependency graph (trainperf.trace.replay), once built
    whatif: dict = None  # None -> (new GPU starts, host map) of the replay unchanged, once replayed
    unreplayable: str | None = None  # why the rank's times cannot be replayed (then no refill, no gains)
    critical: list | None = None  # per thread, when the GPU waits on it next (trainperf.trace.whatif), once


def _complete(tl: Timeline) -> None:
    """A Timeline built by another reader may lack the host columns: empty ones."""
    for k, dt in (("r_tid", np.int64), ("c_ts", np.float64), ("c_dur", np.float64), ("c_name", np.int32),
                  ("c_tid", np.int64), ("c_kind", np.int8)):
        if getattr(tl, k) is None:
            setattr(tl, k, np.zeros(0, dtype=dt))


def _fill(mask: np.ndarray, inside, outside) -> np.ndarray:
    """``inside`` (the values where ``mask`` holds, in order) and ``outside`` elsewhere (a scalar or per item)."""
    out = np.array(np.broadcast_to(outside, mask.shape), dtype=np.int64)
    out[mask] = inside
    return out


def _busy(tl: Timeline, kind: np.ndarray, gpu: np.ndarray) -> list:
    """The four disjoint GPU-busy sets: compute, then communication, copies and fills where none before runs."""
    end = tl.g_ts + tl.g_dur
    names = tl.names
    setname = np.zeros(max(len(names), 1), dtype=bool)
    for i in unique(tl.g_name[gpu]).tolist():
        setname[i] = str(names[i]).lower().startswith("memset")
    kern = tl.g_kind == GPU_KERNEL
    is_set = gpu & ((tl.g_kind == GPU_MEMSET) | (kern & (kind == 2) & setname[tl.g_name]))
    is_copy = gpu & ((tl.g_kind == GPU_MEMCPY) | (kern & (kind == 2))) & ~is_set
    sets = [iv.union(tl.g_ts[m], end[m]) for m in (gpu & kern & (kind == 0), gpu & kern & (kind == 1), is_copy,
                                                   is_set)]
    out, taken = [], iv.EMPTY
    for s in sets:
        part = iv.subtract(s, taken)
        out.append(part)
        taken = iv.join(taken, part)
    return out


def _device(tl: Timeline) -> tuple[int | None, np.ndarray]:
    kern = tl.g_kind == GPU_KERNEL
    if not kern.any():
        return None, np.ones(tl.g_ts.size, dtype=bool)
    devs, inv = np.unique(tl.g_device[kern], return_inverse=True)
    main = int(devs[int(np.argmax(np.bincount(inv, weights=tl.g_dur[kern])))])
    return main, tl.g_device == main


def _pieces_on_thread(hm: hostmap.HostMap, tid: int, lo: np.ndarray, hi: np.ndarray, gap: np.ndarray):
    """Idle pieces (disjoint, sorted) split by what thread ``tid`` was doing: (lo, hi, segment or -1, gap)."""
    s = hm.thread(tid)
    pts = hostmap.merged_points(hostmap.bounds(lo, hi), hostmap.bounds(hm.lo[s], hm.hi[s]))
    a, b = pts[:-1], pts[1:]
    mid = 0.5 * (a + b)
    pi = np.searchsorted(lo, mid, side="right") - 1
    ok = pi >= 0
    ok[ok] = mid[ok] < hi[pi[ok]]
    a, b, mid, pi = a[ok], b[ok], mid[ok], pi[ok]
    seg = hm.lookup(tid, mid)
    return a, b, seg, gap[pi]


def charge(tl: Timeline, patterns: Any = None, kind: np.ndarray | None = None,
           launch: np.ndarray | None = None) -> Charges:
    """Charge the rank's whole timeline, instant by instant (the module docstring; the refill is
    :func:`trainperf.trace.whatif.refill`); ``kind``: each GPU event's class by the pattern table (0 compute,
    1 communication, 2 memory), and ``launch`` (:func:`trainperf.trace.tb.launch_index`): computed when not
    given."""
    _complete(tl)
    if kind is None:
        kind = fg.classify(tl, load_patterns(patterns))["kind"]
    device, gpu = _device(tl)
    if launch is None:
        launch = launch_index(tl)
    busy = _busy(tl, kind, gpu)
    allbusy = iv.union(np.concatenate([b[0] for b in busy]), np.concatenate([b[1] for b in busy]))
    lows = [v for v in (tl.all_min, tl.cpu_min) if np.isfinite(v)]
    highs = [v for v in (tl.all_max, tl.cpu_max) if np.isfinite(v)]
    if tl.c_ts.size:
        lows.append(float(tl.c_ts.min()))
        highs.append(float((tl.c_ts + tl.c_dur).max()))
    t0, t1 = (min(lows), max(highs)) if lows else (0.0, 0.0)
    gaps = iv.subtract((np.array([t0]), np.array([t1])), allbusy) if t1 > t0 else iv.EMPTY
    g0, g1 = gaps
    # the launching threads; the main one: the most launches of the device's GPU work
    has = gpu & (launch >= 0)
    l_tid = tl.r_tid[launch[has]] if has.any() else np.zeros(0, dtype=np.int64)
    threads = unique(l_tid[l_tid >= 0])
    if threads.size:
        th, cnt = np.unique(l_tid[l_tid >= 0], return_counts=True)
        main = int(th[int(np.argmax(cnt))])
    else:  # no launches: the thread with the most CPU events
        tids = tl.c_tid[tl.c_tid >= 0]
        u, cnt = np.unique(tids, return_counts=True)
        main = int(u[int(np.argmax(cnt))]) if u.size else -1
        threads = np.array([main] if main >= 0 else [], dtype=np.int64)
    # each gap's waker: the first GPU event of the device starting at the gap's end
    gi = np.flatnonzero(gpu)
    order = gi[np.argsort(tl.g_ts[gi], kind="stable")]
    starts = tl.g_ts[order]
    w = np.searchsorted(starts, g1, side="left")
    woke = w < starts.size
    ev = np.where(woke, order[np.minimum(w, max(starts.size - 1, 0))], -1) if starts.size else np.full(g1.size, -1)
    lc = np.where(ev >= 0, launch[np.maximum(ev, 0)], -1) if launch.size else np.full(g1.size, -1)
    lc = np.where(woke, lc, -1)
    has_l = lc >= 0
    l_ts = np.where(has_l, tl.r_ts[np.maximum(lc, 0)] if tl.r_ts.size else g1, g1)
    t_of = np.where(has_l, tl.r_tid[np.maximum(lc, 0)] if tl.r_tid.size else main, main)
    t_of = np.where(t_of >= 0, t_of, main)
    gap_id = np.arange(g0.size)
    rows = []  # (lo, hi, cause code, detail, caller, src, tid, gap)
    untraced_src0 = tl.r_ts.size + tl.c_ts.size
    # heads: what the launching thread was doing before the launch
    h_hi = np.minimum(g1, l_ts)
    head = h_hi > g0
    # tails: the launch call and its launch-to-start latency (up to AHEAD_US after the call returned), charged
    # as the launch's own activity; beyond that the queued work waited on something else: gpu_wait
    l_end = np.where(has_l, l_ts + (tl.r_dur[np.maximum(lc, 0)] if tl.r_dur.size else 0.0), g1) + AHEAD_US
    short = (g1 - g0) < AHEAD_US  # the GPU's own kernel-to-kernel overhead (HTA's kernel wait): the launch's
    t_hi = np.where(short, g1, np.minimum(g1, np.maximum(l_end, g0)))
    tail = has_l & (t_hi > np.maximum(g0, l_ts))
    # the host map: the threads' runs, and their segments where the charges look (the heads, the launches)
    hm = hostmap.build(tl, threads, iv.union(g0[head], h_hi[head]),
                       {t: l_ts[tail & (t_of == t)] for t in unique(t_of[tail]).tolist()})
    for tid in unique(t_of[head]).tolist():
        m = head & (t_of == tid)
        a, b, seg, gp = _pieces_on_thread(hm, tid, g0[m], h_hi[m], gap_id[m])
        traced = seg >= 0
        sg = seg[traced]
        rows.append((a, b, _fill(traced, hm.cause[sg] + _H, CODE["untraced"]), _fill(traced, hm.detail(sg), -1),
                     _fill(traced, hm.caller(sg, (0.5 * (a + b))[traced]), -1),
                     _fill(traced, hm.src[sg], untraced_src0 + gp),
                     np.full(a.size, tid, dtype=np.int64), gp))
    if tail.any():
        idx = np.flatnonzero(tail)
        seg = np.full(idx.size, -1, dtype=np.int64)
        for tid in unique(t_of[idx]).tolist():
            m = t_of[idx] == tid
            seg[m] = hm.lookup(tid, l_ts[idx][m])
        traced = seg >= 0
        sg = seg[traced]
        call = lc[idx]
        rows.append((np.maximum(g0[idx], l_ts[idx]), t_hi[idx], _fill(traced, hm.cause[sg] + _H, CODE["launch"]),
                     _fill(traced, hm.detail(sg), tl.r_name[call]),
                     _fill(traced, hm.caller(sg, l_ts[idx][traced]), -1),
                     _fill(traced, hm.src[sg], call), t_of[idx], idx))
    stuck = has_l & ~short & (g1 > np.maximum(g0, l_end))
    if stuck.any():
        idx = np.flatnonzero(stuck)
        rows.append((np.maximum(g0[idx], l_end[idx]), g1[idx], np.full(idx.size, CODE["gpu_wait"]),
                     tl.g_name[ev[idx]], np.full(idx.size, -1), untraced_src0 + g0.size + ev[idx], t_of[idx], idx))
    cols = [np.concatenate([r[i] for r in rows]) if rows else np.zeros(0) for i in range(8)]
    o = np.argsort(cols[0], kind="stable")
    lo, hi = cols[0][o].astype(np.float64), cols[1][o].astype(np.float64)
    cause, detail, caller = cols[2][o].astype(np.int8), cols[3][o].astype(np.int32), cols[4][o].astype(np.int32)
    src, tid, gp = cols[5][o].astype(np.int64), cols[6][o].astype(np.int64), cols[7][o].astype(np.int64)
    return Charges(busy, lo, hi, cause, detail, caller, src, tid, (t0, t1), hm, main, device, gpu, launch,
                   np.zeros(lo.size, dtype=bool), gp, gaps, ev, allbusy, None, {})


def windows(ch: Charges, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Microseconds of each cause in each window: shape (len(lo), len(CAUSES)); each row sums to its window's
    length (time outside the traced span is ``untraced``)."""
    lo = np.asarray(lo, dtype=np.float64)
    hi = np.asarray(hi, dtype=np.float64)
    out = np.zeros((lo.size, len(CAUSES)))
    for k, s in enumerate(ch.busy):
        out[:, k] = iv.within(s, lo, hi)
    for code in unique(ch.cause).tolist():
        m = ch.cause == code
        out[:, code] += iv.within((ch.lo[m], ch.hi[m]), lo, hi)
    out[:, CODE["untraced"]] += np.maximum((hi - lo) - out.sum(axis=1), 0.0)
    return out


__all__ = ["AHEAD_US", "CAUSES", "CODE", "Charges", "GPU_CAUSES", "IDLE_CAUSES", "NAMED", "PLAIN", "charge",
           "windows"]
