"""What if a cause's host time were gone: the rank's dependency graph (:mod:`trainperf.trace.replay`) replayed
without it, for two uses.

* **The gain** of a cause (``attribution``'s ``gain_us``): the analysed steps' span replayed without the cause's
  host time (every occurrence in the trace: on each host thread, while the GPU waits on that thread next, i.e.
  its thread launches the next GPU work), against the same span replayed unchanged.
  Removed sync / allocator calls no longer wait; removing ``launch`` also drops the launch latency; removing
  ``gpu_wait`` caps every launch latency and queued gap at 30 us.
* **The refill** (:func:`refill`): a wait or phase (allocator or sync calls, gc, the DataLoader, the optimizer
  step) first eats the GPU's lead, and once it is over the queue refills only as fast as the host launches.
  For each of these named causes in turn, each idle gap's reduction in its what-if (the gap before the same GPU
  event, replayed) beyond what the cause is charged in that gap already is taken from the gap's ``launch`` /
  ``cpu_op`` / ``untraced`` idle, earliest first, and charged to the cause (named by its longest recent event
  before the gap); in all, no more than the idle the what-if removes less what the cause is charged already. So the sync drain after an ``.item()`` is the sync's cost, not the next ops', and the per-window
  charges agree with the gains.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from trainperf.trace.columns import unique

from trainperf.trace import charge as chg
from trainperf.trace import intervals as iv
from trainperf.trace import replay
from trainperf.trace.charge import CODE, NAMED, PLAIN, Charges
from trainperf.trace.hostmap import HOST_CAUSES, name_classes
from trainperf.trace.hta import KERNEL_WAIT_US
from trainperf.trace.timeline import Timeline


def graph(tl: Timeline, ch: Charges) -> replay.Graph:
    if ch.graph is None:
        ch.graph = replay.build(tl, ch.launch, replay.wait_calls(tl, name_classes(tl)))
    return ch.graph


def _critical_threads(tl: Timeline, ch: Charges) -> list[tuple[int, iv.Set]]:
    """Per mapped thread, when it is the one the GPU waits on next: the thread of the next launch of the
    device's work (after the last launch: the main thread). Once per rank."""
    if ch.critical is not None:
        return ch.critical
    used = np.zeros(tl.r_ts.size, dtype=bool)
    used[ch.launch[ch.gpu & (ch.launch >= 0)]] = True
    calls = np.flatnonzero(used)
    del used
    if calls.size == 0:
        ch.critical = [(ch.main_thread, (np.array([ch.span[0]]), np.array([ch.span[1]])))]
        return ch.critical
    calls = calls[np.argsort(tl.r_ts[calls], kind="stable")]
    who = np.append(tl.r_tid[calls], ch.main_thread)  # [at[k-1], at[k]) waits on launch k's thread
    new = np.flatnonzero(np.concatenate([[True], who[1:] != who[:-1]]))  # where the thread changes
    at = tl.r_ts[calls[new[1:] - 1]]  # a run of one thread ends at its last launch
    lo = np.concatenate([[ch.span[0]], at])
    hi = np.concatenate([at, [ch.span[1]]])
    who = who[new]
    ch.critical = [(int(t), iv.union(lo[who == t], hi[who == t])) for t in unique(who).tolist()]
    return ch.critical


def removal(tl: Timeline, ch: Charges, cause: str) -> iv.Set:
    """The host time of a cause: on each mapped thread, its segments of that cause (``untraced``: what none of
    its events covers) while the GPU waits on that thread next (the thread of the next launch: PyTorch's main
    thread in the forward, the autograd thread in the backward)."""
    hm = ch.hmap
    parts = []
    for tid, crit in _critical_threads(tl, ch):
        if cause == "untraced":
            parts.append(iv.subtract(crit, hm.runs(tid)))
        else:
            parts.append(iv.intersect(hm.runs(tid, cause), crit))
    if len(parts) == 1:
        return parts[0]
    return iv.union(np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])) if parts \
        else iv.EMPTY


KEEP_REPLAYS_UPTO = 1 << 18


def run(tl: Timeline, ch: Charges, cause: str | None) -> tuple[np.ndarray, replay.HostShift]:
    """The rank replayed without ``cause`` (None: unchanged): each GPU event's new start and the host map. The
    replay unchanged is kept on the charges (every gain is measured against it); the others too while a rank
    has at most :data:`KEEP_REPLAYS_UPTO` GPU events (the refill's replays are the gains' again), else made
    each time they are asked for (an array per GPU event each: kept, they would add up)."""
    if cause in ch.whatif:
        return ch.whatif[cause]
    g = graph(tl, ch)
    if cause is None:
        out = replay.run(g)
    elif cause == "gpu_wait":
        out = replay.run(g, max_latency=KERNEL_WAIT_US)
    else:
        skip = None
        if cause in ("sync", "allocator") and g.w_call.size:
            skip = name_classes(tl)[tl.r_name[g.w_call]] == HOST_CAUSES.index(cause)
        out = replay.run(g, removal(tl, ch, cause), skip_waits=skip, zero_latency=cause == "launch")
    if cause is None or g.ev.size <= KEEP_REPLAYS_UPTO:
        ch.whatif[cause] = out
    return out


def span_end(tl: Timeline, ch: Charges, starts: np.ndarray, h: replay.HostShift, lo0: float, host_end: float,
             step_end: float) -> tuple[float, float]:
    """(new start, new end) of the span [lo0, step_end]: its host start, and the later of its host end and the
    end of the device's GPU events that ran in it."""
    inside = ch.gpu & (tl.g_ts >= lo0) & (tl.g_ts < step_end)
    gpu_end = float(np.max(starts[inside] + tl.g_dur[inside])) if inside.any() else -np.inf
    a, b = h(np.array([lo0, host_end]))
    return float(a), max(float(b), gpu_end)


def reduction(tl: Timeline, ch: Charges, starts: np.ndarray, h: replay.HostShift) -> np.ndarray:
    """Per idle gap: how much shorter it is in the replay (>= 0): the gap before the same GPU event, after
    every GPU event that ended before the gap began."""
    g0, g1 = ch.gaps
    out = np.zeros(g0.size)
    dev = np.flatnonzero(ch.gpu)
    if dev.size == 0 or g0.size == 0:
        return out
    end = tl.g_ts[dev] + tl.g_dur[dev]
    o = np.argsort(end, kind="stable")
    ends = end[o]
    new_end = np.maximum.accumulate((starts[dev] + tl.g_dur[dev])[o])
    j = np.searchsorted(ends, g0, side="right") - 1
    prev = np.where(j >= 0, new_end[np.maximum(j, 0)], h(g0))  # before any GPU event: the host's new time
    w = ch.waker
    ok = w >= 0
    new_gap = np.where(ok, starts[np.maximum(w, 0)] - prev, g1 - g0)
    out[ok] = np.maximum((g1 - g0)[ok] - np.maximum(new_gap[ok], 0.0), 0.0)
    return out


_LOOK_BACK = 8


def _names_before(ch: Charges, code: int, g0: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each gap start, the (detail, caller, src) of the cause's longest event among its last
    ``_LOOK_BACK`` before it (the optimizer step, not the zero_grad after it); the runtime calls name a cause
    that has any (the stream sync inside ``aten::item``)."""
    hm = ch.hmap
    m = np.flatnonzero(hm.cause == code - chg._H)
    calls = m[hm.src[m] < hm.n_runtime]
    m = calls if calls.size else m
    if m.size == 0:
        z = np.full(g0.size, -1)
        return z.astype(np.int32), z.astype(np.int32), z.astype(np.int64)
    o = m[np.argsort(hm.lo[m], kind="stable")]
    last = np.searchsorted(hm.lo[o], g0, side="right") - 1
    cand = np.clip(last[:, None] - np.arange(_LOOK_BACK)[None, :], 0, o.size - 1)
    dur = (hm.hi - hm.lo)[o][cand]
    dur[(last[:, None] - np.arange(_LOOK_BACK)[None, :]) < 0] = -1.0
    k = o[cand[np.arange(g0.size), np.argmax(dur, axis=1)]]
    return hm.detail(k), hm.caller(k), hm.src[k].astype(np.int64)


def refill(tl: Timeline, ch: Charges) -> None:
    """The refill rule (module docstring), in place on the charges."""
    if ch.lo.size == 0 or ch.gaps[0].size == 0:
        return
    present = [c for c in NAMED if np.any(ch.hmap.cause == HOST_CAUSES.index(c))]
    plain_codes = [CODE[c] for c in PLAIN]
    g0, g1 = ch.gaps
    ng = g0.size
    for c in present:
        code = CODE[c]
        starts, h = run(tl, ch, c)
        r = reduction(tl, ch, starts, h)
        mine = ch.cause == code
        already = np.bincount(ch.gap[mine], weights=(ch.hi - ch.lo)[mine], minlength=ng)
        extra = np.maximum(r - already, 0.0)
        plain = np.isin(ch.cause, plain_codes) & (extra[ch.gap] > 0)
        if not plain.any():
            continue
        length = np.where(plain, ch.hi - ch.lo, 0.0)
        cum = np.cumsum(length) - length
        first = np.full(ng, -1, dtype=np.int64)
        pi = np.flatnonzero(plain)
        heads = pi[np.concatenate([[True], ch.gap[pi][1:] != ch.gap[pi][:-1]])]
        first[ch.gap[heads]] = heads
        done = cum - cum[np.maximum(first[ch.gap], 0)]
        take = np.where(plain, np.clip(extra[ch.gap] - done, 0.0, length), 0.0)
        # in all, no more than the idle its what-if removes beyond its own charges (an instant charged to the
        # cause, such as the launch latency inside its phase, may stay when its host time goes)
        budget = max(float(r.sum()) - float(already.sum()), 0.0)
        given = np.cumsum(take) - take
        take = np.clip(budget - given, 0.0, take)
        moved = np.flatnonzero(take > 0)
        _move(ch, take, moved, code, *_names_before(ch, code, g0[ch.gap[moved]]))


def _move(ch: Charges, take: np.ndarray, j: np.ndarray, code: int, detail: np.ndarray, caller: np.ndarray,
          src: np.ndarray) -> None:
    """Charge the first ``take`` us of the pieces ``j`` (those with some) to ``code``, named by ``detail``,
    ``caller`` and ``src`` (one each); split where it falls inside a piece."""
    if j.size == 0:
        return
    cut = ch.lo[j] + take[j]
    part = cut < ch.hi[j]
    rest = j[part]
    cols: dict[str, Any] = {
        "lo": np.concatenate([ch.lo[j], cut[part]]), "hi": np.concatenate([cut, ch.hi[rest]]),
        "cause": np.concatenate([np.full(j.size, code), ch.cause[rest]]).astype(np.int8),
        "detail": np.concatenate([detail, ch.detail[rest]]).astype(np.int32),
        "caller": np.concatenate([caller, ch.caller[rest]]).astype(np.int32),
        "src": np.concatenate([src, ch.src[rest]]).astype(np.int64),
        "tid": np.concatenate([ch.tid[j], ch.tid[rest]]).astype(np.int64),
        "gap": np.concatenate([ch.gap[j], ch.gap[rest]]).astype(np.int64),
        "refilled": np.concatenate([np.ones(j.size, dtype=bool), ch.refilled[rest]])}
    keep = np.ones(take.size, dtype=bool)
    keep[j] = False
    for name, v in cols.items():
        setattr(ch, name, np.concatenate([getattr(ch, name)[keep], v]))
    o = np.argsort(ch.lo, kind="stable")
    for name in cols:
        setattr(ch, name, getattr(ch, name)[o])


REPLAY_TOL_US = 1e-3
"""The replay with nothing changed must give back every GPU event's start within this (1 ns)."""
CLOCK_TOL_US = 1.0
"""A GPU event may start this much before its launch call (integer-microsecond times, each rounded); more, and
the host's and the GPU's clocks disagree."""


def unreplayable(tl: Timeline, ch: Charges) -> str | None:
    """Why the rank's times cannot be replayed (None: they can): GPU work that starts before its launch call
    (the host's and the GPU's clocks disagree: every what-if would move work by a wrong lead), or a replay
    with nothing changed that does not give back every GPU event's start (a dependency the graph misreads)."""
    has = ch.launch >= 0
    if has.any():
        early = tl.g_ts[has] - tl.r_ts[ch.launch[has]]
        bad = early < -CLOCK_TOL_US
        if bad.any():
            return (f"{int(bad.sum())} of {int(has.sum())} launched GPU event(s) start before their launch call "
                    f"(by up to {-float(early.min()):,.1f} us): the host's and the GPU's clocks disagree, so the "
                    "what-if replays (each cause's gain, the refill after a wait) are not computed; the charges "
                    "compare the two clocks as recorded")
    starts, _ = run(tl, ch, None)
    off = np.abs(starts - tl.g_ts)
    off = np.where(np.isnan(off), np.inf, off)
    bad = off > REPLAY_TOL_US
    if bad.any():
        return (f"the rank's dependency replay with nothing changed moves {int(bad.sum())} of {off.size} GPU "
                f"event(s) (by up to {float(off.max()):,.1f} us): the what-if replays (each cause's gain, the refill "
                "after a wait) are not computed")
    return None


def charged(tl: Timeline, patterns: Any = None, kind: np.ndarray | None = None,
            launch: np.ndarray | None = None) -> Charges:
    """The rank's charges: instant by instant (:func:`trainperf.trace.charge.charge`), then the refill, when
    the rank's times can be replayed (:func:`unreplayable`)."""
    ch = chg.charge(tl, patterns, kind, launch)
    ch.unreplayable = unreplayable(tl, ch)
    if ch.unreplayable is None:
        refill(tl, ch)
    return ch


__all__ = ["CLOCK_TOL_US", "REPLAY_TOL_US", "charged", "graph", "reduction", "refill", "removal", "run",
           "span_end", "unreplayable"]
