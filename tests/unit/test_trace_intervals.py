"""Interval sets: intersect and subtract (binary search over one set's pieces, in chunks) against a brute-force
sweep over every elementary segment, on random sets, including pieces that touch and chunk boundaries."""

from __future__ import annotations

import numpy as np
import pytest

from trainperf.trace import intervals as iv


def _random_set(rng, n: int) -> iv.Set:
    s = rng.integers(0, 100, n).astype(float)
    return iv.union(s, s + rng.integers(1, 8, n))


def _brute(a: iv.Set, b: iv.Set, want: str) -> float:
    grid = np.unique(np.concatenate([a[0], a[1], b[0], b[1], [0.0, 200.0]]))
    mid = (grid[:-1] + grid[1:]) / 2
    ina = np.zeros(mid.size, dtype=bool)
    inb = np.zeros(mid.size, dtype=bool)
    for s, e in zip(*a):
        ina |= (mid >= s) & (mid < e)
    for s, e in zip(*b):
        inb |= (mid >= s) & (mid < e)
    sel = ina & inb if want == "and" else ina & ~inb
    return float(np.sum(np.diff(grid)[sel]))


@pytest.mark.parametrize("chunk", [1 << 18, 3])
def test_intersect_and_subtract_match_a_sweep(monkeypatch, chunk):
    monkeypatch.setattr(iv, "_CHUNK", chunk)
    rng = np.random.default_rng(7)
    for _ in range(300):
        a, b = _random_set(rng, int(rng.integers(0, 30))), _random_set(rng, int(rng.integers(0, 30)))
        for want, f in (("and", iv.intersect), ("minus", iv.subtract)):
            got = f(a, b)
            assert iv.total(got) == pytest.approx(_brute(a, b, want), abs=1e-9)
            assert np.all(got[1] > got[0]) and np.all(got[0][1:] > got[1][:-1])  # sorted, disjoint, not touching


def test_join_merges_as_the_union_of_both_and_union_needs_no_sort_when_in_order():
    rng = np.random.default_rng(11)
    for _ in range(300):
        a, b = _random_set(rng, int(rng.integers(0, 30))), _random_set(rng, int(rng.integers(0, 30)))
        got = iv.join(a, b)
        want = iv.union(np.concatenate([b[0], a[0]])[::-1].copy(), np.concatenate([b[1], a[1]])[::-1].copy())
        assert all(np.array_equal(g, w) for g, w in zip(got, want))  # the same pieces, to the bit
        s = np.sort(rng.integers(0, 100, 40).astype(float))  # in order (the no-sort path), touching and nested
        e = s + rng.integers(0, 8, 40)
        o = rng.permutation(40)
        assert all(np.array_equal(x, y) for x, y in zip(iv.union(s, e), iv.union(s[o], e[o])))
