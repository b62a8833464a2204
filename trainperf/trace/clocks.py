"""Each host's clock offset, from the collectives the ranks share, before any skew between ranks is measured.

A collective ends on every rank that takes part at about the same true moment: the last rank to arrive
completes it for all (give or take one hop's latency). So the end of collective i read on rank r's clock is
``e[r, i] = T[i] + o[r] + noise``: ``T[i]`` the true end, ``o[r]`` how far rank r's clock is ahead of the
reference's. :func:`estimate_offsets` fits ``o`` and ``T`` by least absolute deviations, by alternating
medians: ``T[i] = median over r of (e[r, i] - o[r])``, then ``o[r] = median over i of (e[r, i] - T[i])``,
until no offset moves by more than ``TOLERANCE_US`` (at most ``MAX_ROUNDS`` rounds). A median, not a mean:
one collective whose ends disagree (an all-to-all of uneven sizes, a kernel held back behind another on its
stream) does not move the fit. The reference is the lowest rank of each group of ranks joined by shared
collectives (offset 0). The **residual** is ``|e[r, i] - o[r] - T[i]|``: its median and maximum per rank say
how well one offset per host explains every end (microseconds on one node; more means clocks that drift
during the trace, or collectives whose ends really differ).

Vectorized: one sort per median round over every (rank, collective) pair, whatever the number of ranks.
"""

from __future__ import annotations

import numpy as np

from trainperf.trace.columns import percentiles

TOLERANCE_US = 0.01
MAX_ROUNDS = 50
METHOD = ("each collective ends at the same true time on every rank that takes part; each rank's clock offset is "
          "the least-absolute-deviation fit of its collectives' end times to a common end per collective "
          "(alternating medians: common end = median over ranks of the corrected ends, offset = median over "
          "collectives of the rank's end minus the common end), relative to the lowest rank sharing "
          "collectives with it; residual = |corrected end - common end|")


def group_median(values: np.ndarray, groups: np.ndarray, n: int) -> np.ndarray:
    """The median of ``values`` in each group 0..n-1 (NaN where a group is empty)."""
    out = np.full(n, np.nan)
    if values.size == 0:
        return out
    o = np.lexsort((values, groups))
    v = values[o]
    counts = np.bincount(groups, minlength=n)
    first = np.cumsum(counts) - counts
    has = counts > 0
    c, f = counts[has], first[has]
    out[has] = 0.5 * (v[f + (c - 1) // 2] + v[f + c // 2])
    return out


def _components(rank: np.ndarray, coll: np.ndarray, n_ranks: int) -> np.ndarray:
    """For each rank, the lowest rank index joined to it by shared collectives (union-find)."""
    parent = list(range(n_ranks))

    def find(a: int) -> int:
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    first: dict[int, int] = {}
    for r, c in zip(rank.tolist(), coll.tolist()):
        if c in first:
            a, b = find(r), find(first[c])
            if a != b:
                parent[max(a, b)] = min(a, b)
        else:
            first[c] = r
    return np.array([find(r) for r in range(n_ranks)], dtype=np.int64)


def estimate_offsets(rank: np.ndarray, coll: np.ndarray, end: np.ndarray, n_ranks: int) -> dict:
    """Offsets from matched collectives. ``rank``/``coll``: the index of the rank (0..n_ranks-1) and of the
    collective of each observation, ``end`` its end time (us, on the rank's own clock). Returns
    {"offset_us": array (NaN: a rank in no shared collective), "residual_median_us", "residual_max_us" (per
    rank), "residual_us" (median over every observation), "residual_p95_us", "rounds", "reference": array
    (each rank's reference rank index)}."""
    rank = np.asarray(rank, dtype=np.int64)
    coll = np.asarray(coll, dtype=np.int64)
    end = np.asarray(end, dtype=np.float64)
    off = np.zeros(n_ranks)
    used = np.bincount(rank, minlength=n_ranks) > 0
    if end.size == 0:
        nan = np.full(n_ranks, np.nan)
        return {"offset_us": nan, "residual_median_us": nan, "residual_max_us": nan, "residual_us": None,
                "residual_p95_us": None, "rounds": 0, "reference": np.arange(n_ranks)}
    _, coll = np.unique(coll, return_inverse=True)  # dense collective ids
    n_coll = int(coll.max()) + 1
    e = end - float(np.min(end))  # small numbers: no precision lost to the epoch
    ref = _components(rank, coll, n_ranks)
    rounds = 0
    t = group_median(e, coll, n_coll)
    for rounds in range(1, MAX_ROUNDS + 1):
        new = group_median(e - t[coll], rank, n_ranks)
        new = np.where(used, new, 0.0)
        new = new - new[ref]  # the reference of each group reads 0
        moved = float(np.max(np.abs(new - off)))
        off = new
        t = group_median(e - off[rank], coll, n_coll)
        if moved < TOLERANCE_US:
            break
    res = np.abs(e - off[rank] - t[coll])
    med = group_median(res, rank, n_ranks)
    top = np.full(n_ranks, np.nan)
    np.fmax.at(top, rank, res)
    return {"offset_us": np.where(used, off, np.nan), "residual_median_us": med, "residual_max_us": top,
            "residual_us": float(percentiles(res, [50])[0]), "residual_p95_us": float(percentiles(res, [95])[0]),
            "rounds": rounds, "reference": ref}


__all__ = ["MAX_ROUNDS", "METHOD", "TOLERANCE_US", "estimate_offsets", "group_median"]
