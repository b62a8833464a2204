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
    if not keep.all():
        s, e = s[keep], e[keep]
    del keep
    if s.size == 0:
        return EMPTY
    if ordered(s):  # in order already (a column in file order, a merged set): no sort, no gather
        run = e.copy()
    else:
        o = np.argsort(s, kind="stable")
        s = s[o]
        run = e[o]  # a copy: the running maximum is taken in place
        del o
    np.maximum.accumulate(run, out=run)
    new = np.empty(s.size, dtype=bool)
    new[0] = True
    new[1:] = s[1:] > run[:-1]
    idx = np.flatnonzero(new)
    ends_at = np.append(idx[1:] - 1, s.size - 1)
    return s[idx], run[ends_at]


def ordered(x: np.ndarray) -> bool:
    """Whether ``x`` never decreases (checked a million values at a time)."""
    for a in range(0, x.size, 1 << 20):
        b = x[a:a + (1 << 20) + 1]
        if np.any(b[1:] < b[:-1]):
            return False
    return True


def total(a: Set) -> float:
    return float(np.sum(a[1] - a[0])) if a[0].size else 0.0


_CHUNK = 1 << 18  # pieces of the second set per pass: bounds the temporaries of a combination


def _overlaps(a: Set, b: Set) -> Set:
    """a and b (each sorted and disjoint) intersected without sorting their endpoints: each piece of b against
    the pieces of a that overlap it, found by binary search, ``_CHUNK`` pieces of b at a time (memory ~ the
    result, not the endpoints). Pieces that only touch do not overlap."""
    a0, a1 = a
    out_s, out_e = [], []
    for k in range(0, b[0].size, _CHUNK):
        b0, b1 = b[0][k:k + _CHUNK], b[1][k:k + _CHUNK]
        first = np.searchsorted(a1, b0, side="right")  # the first piece of a that ends after b's starts
        cnt = np.maximum(np.searchsorted(a0, b1, side="left") - first, 0)  # ... up to the first starting after
        n = int(cnt.sum())
        if n == 0:
            continue
        j = np.repeat(np.arange(b0.size), cnt)
        i = np.arange(n) + np.repeat(first - (np.cumsum(cnt) - cnt), cnt)
        out_s.append(np.maximum(a0[i], b0[j]))
        out_e.append(np.minimum(a1[i], b1[j]))
    if not out_s:
        return EMPTY
    s, e = np.concatenate(out_s), np.concatenate(out_e)
    del out_s, out_e
    new = np.empty(s.size, dtype=bool)  # join pieces that touch (none do when both inputs are merged)
    new[0] = True
    new[1:] = s[1:] > e[:-1]
    if new.all():
        return s, e
    idx = np.flatnonzero(new)
    return s[idx], e[np.append(idx[1:] - 1, s.size - 1)]


def _combine(a: Set, b: Set, want: str) -> Set:
    """a and b (``want`` "and") or a without b ("minus"), both sets sorted and disjoint."""
    if want == "and":
        if a[0].size == 0 or b[0].size == 0:
            return EMPTY
        return _overlaps(a, b)
    if a[0].size == 0:
        return EMPTY
    if b[0].size == 0:
        return a
    # a without b = a and the gaps of b
    g0 = np.concatenate([[-np.inf], b[1]])
    g1 = np.concatenate([b[0], [np.inf]])
    keep = g1 > g0
    if not keep.all():
        g0, g1 = g0[keep], g1[keep]
    return _overlaps(a, (g0, g1))


def intersect(a: Set, b: Set) -> Set:
    return _combine(a, b, "and")


def subtract(a: Set, b: Set) -> Set:
    return _combine(a, b, "minus")


def join(a: Set, b: Set) -> Set:
    """The union of two sets (each sorted and disjoint): merged in order (no sort; at one start, ``a``'s piece
    first, as the union of the two concatenated would have it)."""
    if a[0].size == 0 or b[0].size == 0:
        return (a if b[0].size == 0 else b) if a[0].size or b[0].size else EMPTY
    n = a[0].size + b[0].size
    s, e = np.empty(n), np.empty(n)
    at = np.searchsorted(b[0], a[0], side="left") + np.arange(a[0].size)
    s[at], e[at] = a
    del at
    at = np.searchsorted(a[0], b[0], side="right") + np.arange(b[0].size)
    s[at], e[at] = b
    del at
    return union(s, e)


def clip(a: Set, lo: float, hi: float) -> Set:
    if a[0].size == 0 or hi <= lo:
        return EMPTY
    s = np.maximum(a[0], lo)
    e = np.minimum(a[1], hi)
    k = e > s
    return s[k], e[k]


def prefix(a: Set) -> np.ndarray:
    """The length of ``a`` before each of its pieces (and in all, last): what :func:`covered_before` sums."""
    out = np.empty(a[0].size + 1)
    out[0] = 0.0
    np.cumsum(a[1] - a[0], out=out[1:])
    return out


def covered_before(a: Set, t, pre: np.ndarray | None = None) -> np.ndarray:
    """Length of ``a`` before each time in ``t`` (vectorized); ``pre``: its :func:`prefix`, when the caller
    asks many times."""
    t = np.asarray(t, dtype=np.float64)
    if a[0].size == 0:
        return np.zeros(t.shape)
    if pre is None:
        pre = prefix(a)
    i = np.searchsorted(a[0], t, side="right")  # pieces starting at or before t
    j = np.maximum(i - 1, 0)
    part = np.clip(t - a[0][j], 0.0, a[1][j] - a[0][j])
    return np.where(i > 0, pre[j] + part, 0.0)


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


__all__ = ["Accumulator", "EMPTY", "clip", "covered_before", "intersect", "join", "ordered", "prefix", "subtract",
           "total", "union", "within"]
