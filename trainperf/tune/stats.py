"""When a paired measurement says "faster": a Wilcoxon signed-rank test on the per-round ratios.

A paired measurement (:func:`trainperf.tune.trial.interleave`) gives one ratio per round,
baseline step time / candidate step time, the two measured back to back under the same load.
On a shared machine a round's ratio is noisy and a few rounds can show a median gain that is
not there, so a candidate is called *faster* only when its median ratio is above 1 **and** the
log-ratios are shifted above 0 beyond what chance gives two equally fast candidates: the
one-sided Wilcoxon signed-rank test (exact null distribution: each rank's sign a fair coin),
p below ``P``. It uses the size of each round's difference, not only its sign, so it needs
fewer rounds than a sign test for the same evidence, and one wild round cannot dominate it as
it would a mean. It is called *not faster* when its median is below ``1 - margin`` or the test
says slower with the same confidence. Otherwise the verdict is open, and the measurement takes
more rounds while it may (a sequential test: a clear result stops early, a close one buys
rounds).
"""

from __future__ import annotations

import math
import statistics

P = 0.05
MIN_ROUNDS = next(n for n in range(1, 64) if 2.0 ** -n < P)
"""The fewest rounds whose test can say *faster* at all: with n rounds the smallest one-sided p is 2^-n
(every round faster), so below 5 rounds p < 0.05 cannot happen, whatever the rounds show."""


def signed_rank_p(diffs: list[float]) -> float:
    """One-sided p of the Wilcoxon signed-rank test that ``diffs`` are shifted above 0: the
    chance, with each rank's sign a fair coin, of a positive rank sum at least the observed one.
    Zeros are dropped; tied magnitudes share their mean rank (the sums then count half-ranks)."""
    d = [x for x in diffs if x != 0]
    n = len(d)
    if n == 0:
        return 1.0
    order = sorted(range(n), key=lambda i: abs(d[i]))
    ranks = [0.0] * n
    i = 0
    while i < n:  # mean ranks over ties
        j = i
        while j + 1 < n and abs(d[order[j + 1]]) == abs(d[order[i]]):
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    twice = [int(round(2 * r)) for r in ranks]  # integer half-ranks
    observed = sum(t for t, x in zip(twice, d) if x > 0)
    counts = {0: 1}  # number of sign patterns per positive (half-)rank sum
    for t in twice:
        nxt = dict(counts)
        for s, c in counts.items():
            nxt[s + t] = nxt.get(s + t, 0) + c
        counts = nxt
    return sum(c for s, c in counts.items() if s >= observed) / 2 ** n


def p_faster(ratios: list[float]) -> float:
    return signed_rank_p([math.log(r) for r in ratios if r > 0])


def faster(ratios: list[float], p: float = P) -> bool:
    return bool(ratios) and statistics.median(ratios) > 1 and p_faster(ratios) < p


def verdict(ratios: list[float], margin: float, p: float = P) -> str | None:
    """"faster", "not faster", or None (open) for the per-round ratios so far."""
    if not ratios:
        return None
    if faster(ratios, p):
        return "faster"
    med = statistics.median(ratios)
    if med < 1 - margin or (med < 1 and p_faster([1 / r for r in ratios if r > 0]) < p):
        return "not faster"
    return None
