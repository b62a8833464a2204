"""Interval sets as numpy arrays: ``(starts, ends)``, sorted and disjoint once merged. Everything vectorized
(a sort, a running maximum, a cumulative sum); no Python loop per interval."""

from __future__ import annotations

import numpy as np

Set = tuple[np.ndarray, np.ndarray]
EMPTY: Set = (np.zeros(0), np.zeros(0))


def union(starts, ends) -> Set:
    """The union of intervals [s, e): sorted, disjoint, no empty pieces. Touching intervals join."""
    s = np.asarray(starts, dtype=np.float64)
    e = np.asarray(ends, dtype=np.float64)
    if s.size == 0:
        return EMPTY
    keep = e > s
    s, e = s[keep], e[keep]
    if s.size == 0:
        return EMPTY
    o = np.argsort(s, kind="stable")
    s, e = s[o], e[o]
    run = np.maximum.accumulate(e)
    new = np.empty(s.size, dtype=bool)
    new[0] = True
    new[1:] = s[1:] > run[:-1]
    idx = np.flatnonzero(new)
    ends_at = np.append(idx[1:] - 1, s.size - 1)
    return s[idx], run[ends_at]


def total(a: Set) -> float:
    return float(np.sum(a[1] - a[0])) if a[0].size else 0.0


def _combine(a: Set, b: Set, want: str) -> Set:
    """Boolean combination of two disjoint sets by a sweep over their endpoints."""
    if want == "and" and (a[0].size == 0 or b[0].size == 0):
        return EMPTY
    if want == "minus":
        if a[0].size == 0:
            return EMPTY
        if b[0].size == 0:
            return a
    na, nb = a[0].size, b[0].size
    t = np.concatenate([a[0], a[1], b[0], b[1]])
    w = np.empty(t.size, dtype=np.int8)  # one byte per endpoint: +-1 for a, +-2 for b
    w[:na], w[na:2 * na], w[2 * na:2 * na + nb], w[2 * na + nb:] = 1, -1, 2, -2
    # at one instant, ends before starts, so touching pieces do not overlap
    o = np.lexsort((w, t))
    t, w = t[o], w[o]
    del o
    state = np.cumsum(w, dtype=np.int32)  # after each endpoint: 1 = a only, 2 = b only, 3 = both
    del w
    inside = state == 3 if want == "and" else state == 1 if want == "minus" else state > 0
    del state
    if t.size < 2:
        return EMPTY
    seg = inside[:-1] & (t[1:] > t[:-1])
    del inside
    s, e = t[:-1][seg], t[1:][seg]
    if s.size == 0:
        return EMPTY
    # the pieces are sorted and disjoint already: join the ones split by an endpoint inside (touching)
    new = np.empty(s.size, dtype=bool)
    new[0] = True
    new[1:] = s[1:] > e[:-1]
    idx = np.flatnonzero(new)
    return s[idx], e[np.append(idx[1:] - 1, s.size - 1)]


def intersect(a: Set, b: Set) -> Set:
    return _combine(a, b, "and")


def subtract(a: Set, b: Set) -> Set:
    return _combine(a, b, "minus")


def join(a: Set, b: Set) -> Set:
    return union(np.concatenate([a[0], b[0]]), np.concatenate([a[1], b[1]]))


def clip(a: Set, lo: float, hi: float) -> Set:
    if a[0].size == 0 or hi <= lo:
        return EMPTY
    s = np.maximum(a[0], lo)
    e = np.minimum(a[1], hi)
    k = e > s
    return s[k], e[k]


def covered_before(a: Set, t) -> np.ndarray:
    """Length of ``a`` before each time in ``t`` (vectorized)."""
    t = np.asarray(t, dtype=np.float64)
    if a[0].size == 0:
        return np.zeros(t.shape)
    lens = a[1] - a[0]
    prefix = np.concatenate([[0.0], np.cumsum(lens)])
    i = np.searchsorted(a[0], t, side="right")  # pieces starting at or before t
    j = np.maximum(i - 1, 0)
    part = np.clip(t - a[0][j], 0.0, lens[j])
    return np.where(i > 0, prefix[j] + part, 0.0)


def within(a: Set, lo, hi) -> np.ndarray:
    """Length of ``a`` inside each window [lo_k, hi_k)."""
    return covered_before(a, hi) - covered_before(a, lo)


class Accumulator:
    """A union built chunk by chunk in bounded work: each chunk's intervals are merged, and the pieces are
    merged together when they have doubled (amortized O(n log n), memory ~ the union's size)."""

    def __init__(self):
        self.parts: list[Set] = []
        self.merged: Set = EMPTY
        self.pending = 0

    def add(self, starts, ends) -> None:
        u = union(starts, ends)
        if u[0].size:
            self.parts.append(u)
            self.pending += u[0].size
        if self.pending > max(65536, 2 * self.merged[0].size):
            self._merge()

    def _merge(self) -> None:
        if self.parts:
            ss = [self.merged[0]] + [p[0] for p in self.parts]
            ee = [self.merged[1]] + [p[1] for p in self.parts]
            self.merged = union(np.concatenate(ss), np.concatenate(ee))
            self.parts, self.pending = [], 0

    def result(self) -> Set:
        self._merge()
        return self.merged


__all__ = ["Accumulator", "EMPTY", "clip", "covered_before", "intersect", "join", "subtract", "total",
           "union", "within"]
