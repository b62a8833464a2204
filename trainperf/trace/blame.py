"""Who made the other ranks wait, and for what: the late arrival at each collective, charged with their waits.

Input: one matched sequence of collectives (:func:`trainperf.trace.across.match`): per rank and collective its
arrival (the start of its kernel, on the reference clock), its wait and the causes of its window (from its
previous arrival in the sequence to this one; :mod:`trainperf.trace.collectives`).

* The **last arrival** at a collective is the rank that starts it last; it is named a *late arrival* when the
  others' median wait there is at least the threshold (``late_threshold_us``: ``LATE_MIN_US``, or 3x the
  clocks' median residual when that is larger: below it an arrival order is noise).
* A rank's **lag** at a collective is its arrival minus the median arrival of the others. Lag is inherited:
  a rank held up before collective i is still behind at i+1 when the others went on without waiting for it
  (data-parallel buckets on their own stream). So along a *late episode* (the collectives in a row where it
  is behind) the lag it already had keeps the causes found for it, and only the lag beyond it is new,
  charged to the causes whose time in this window exceeds the others' median time in the same window (the
  positive excess of each cause, in proportion; :func:`lag_causes`).
* Every other rank's wait at a late arrival is charged to the late rank's causes at that collective in the
  same proportions: the **wait matrix** (rank waiting x late rank, ms per step), and per late rank the wait
  it costs the job per step (``delay_us_per_step``: the others' median wait, summed over its late arrivals:
  what the job's step loses) and the GPU time all the other ranks lose (``wait_caused_us_per_step``: their
  waits summed).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from trainperf.trace.columns import unique

LATE_MIN_US = 20.0
LABELS = {"compute": "compute", "communication": "other collectives", "memcpy": "copies", "memset": "fills",
          "allocator": "allocator calls (cudaMalloc/cudaFree)", "sync": "host syncs", "launch": "runtime calls (launches)",
          "dataloader": "DataLoader", "optimizer": "optimizer step", "cpu_op": "CPU ops", "gc": "garbage collection",
          "untraced": "untraced host time (Python, sleeps, I/O)"}
MATRIX_COLUMNS = 16
DEFINITION = ("at each collective the last rank to arrive (after clock offsets) is a late arrival when the others' "
              "median wait there is at least late_threshold_us; the others' waits are charged to what made it late: "
              "the causes whose time in its window before this arrival (from its previous arrival at the same "
              "sequence) exceeds the others' median in the same window, lateness carried over from an earlier "
              "collective keeping the causes found there")


EXACT_BELOW = 16
"""With this many ranks or more, "the others' median" is the median over all ranks (the one rank left out moves
it by at most one place in the order), computed once per sequence instead of once per late rank."""


def others_median(m: np.ndarray, r: int, everyone: np.ndarray | None = None) -> np.ndarray:
    """The median over every row but ``r`` (axis 0), for each column (and trailing axes); from
    ``EXACT_BELOW`` rows on, ``everyone`` (the median over all rows) stands for it."""
    if m.shape[0] >= EXACT_BELOW and everyone is not None:
        return everyone
    return np.median(np.delete(m, r, axis=0), axis=0)


def lag_causes(lag: np.ndarray, excess: np.ndarray, untraced: int) -> np.ndarray:
    """For one rank along one sequence: its lag at each collective (us) split by cause, (n, causes).

    A *late episode* runs while the rank's lag stays positive. The episode keeps the lag it has explained so
    far (``explained``) and its causes: a lag up to ``explained`` is inherited (the earlier causes, rescaled);
    a lag beyond it is new and goes to the causes of this window's positive excess, in proportion. A lag that
    dips and comes back is not a catch-up: a rank that waited in the previous collective starts the next one
    on the same stream only when the previous ends, which narrows the gap at that one collective only."""
    n, k = excess.shape
    out = np.zeros((n, k))
    comp = np.zeros(k)
    explained = 0.0
    for j in range(n):
        lag_j = float(lag[j])
        if lag_j <= 0:
            comp, explained = np.zeros(k), 0.0
            continue
        if lag_j > explained:
            new = lag_j - explained
            pos = np.clip(excess[j], 0.0, None)
            s = float(pos.sum())
            if s > 0:
                comp = comp + pos * (new / s)
            else:
                comp[untraced] += new
            explained = lag_j
        out[j] = comp * (lag_j / explained)
    return out


class Ledger:
    """Charges accumulated over every sequence, for the ranks ``ranks`` (every rank of the job)."""

    def __init__(self, causes: list[str], ranks: list[int]):
        self.causes = causes
        self.index = {r: i for i, r in enumerate(ranks)}
        self.ranks = ranks
        self.matrix: dict[int, np.ndarray] = {}  # late rank -> us each rank waited for it
        self.by_cause: dict[int, np.ndarray] = {}  # late rank -> us charged per cause (sum over waiting ranks)
        self.delay: dict[int, float] = {}
        self.last_at: dict[int, int] = {}
        self.steps: dict[int, dict[int, float]] = {}  # late rank -> {step: us of wait it caused there}
        self.taken_part: dict[int, int] = {}  # rank -> collectives it took part in (matched)
        self.late_total = 0
        self.blind: set[int] = set()  # late ranks charged somewhere without per-collective causes (all untraced)

    def add_sequence(self, ranks: list[int], arrival: np.ndarray, wait: np.ndarray, causes: np.ndarray | None,
                     steps: np.ndarray, threshold: float) -> None:
        """One matched sequence: ``arrival``/``wait``/``steps`` (ranks x collectives, reference clock),
        ``causes`` (ranks x collectives x causes) or None."""
        h, n = arrival.shape
        for r in ranks:
            self.taken_part[r] = self.taken_part.get(r, 0) + n
        if h < 2 or n == 0:
            return
        last = np.argmax(arrival, axis=0)
        cols_all = np.arange(n)
        masked = wait.copy()
        masked[last, cols_all] = np.nan
        others_wait = np.nanmedian(masked, axis=0)  # the others' median wait at each collective
        late = others_wait >= threshold
        if not late.any():
            return
        k = len(self.causes)
        untraced = self.causes.index("untraced")
        at = np.array([self.index[r] for r in ranks])
        big = h >= EXACT_BELOW
        arr_med = np.median(arrival, axis=0) if big else None
        cause_med = np.median(causes, axis=0) if (big and causes is not None) else None
        for li in unique(last[late]):
            cols = np.flatnonzero(late & (last == li))
            if causes is not None:
                lag = arrival[li] - others_median(arrival, li, arr_med)
                excess = causes[li] - others_median(causes, li, cause_med)
                comp = lag_causes(lag, excess, untraced)
            else:
                comp = np.zeros((n, k))
                comp[:, untraced] = 1.0
            r = ranks[li]
            if causes is None:
                self.blind.add(r)
            acc = self.by_cause.setdefault(r, np.zeros(k))
            row = self.matrix.setdefault(r, np.zeros(len(self.ranks)))
            w = wait[:, cols].copy()
            w[li] = 0.0
            tot = w.sum(axis=0)  # per late collective, the waits of every other rank
            c = comp[cols]
            norm = c.sum(axis=1, keepdims=True)
            share = np.where(norm > 0, c / np.where(norm > 0, norm, 1.0), np.eye(k)[untraced])
            acc += (share * tot[:, None]).sum(axis=0)
            np.add.at(row, at, w.sum(axis=1))
            self.delay[r] = self.delay.get(r, 0.0) + float(others_wait[cols].sum())
            self.last_at[r] = self.last_at.get(r, 0) + int(cols.size)
            per = self.steps.setdefault(r, {})
            for st, x in zip(steps[li, cols].tolist(), tot.tolist()):
                if st >= 0:
                    per[st] = per.get(st, 0.0) + x
            self.late_total += int(cols.size)

    def late_arrivals(self, nsteps: int, partial: bool) -> list[dict[str, Any]]:
        """One entry per rank that arrived late somewhere, the costliest first."""
        step_owner: dict[int, int] = {}  # step -> the late rank that caused the most wait in it
        for r, per in self.steps.items():
            for st, us in per.items():
                if st not in step_owner or us > self.steps[step_owner[st]].get(st, 0.0):
                    step_owner[st] = r
        out = []
        for r, acc in self.by_cause.items():
            total = float(acc.sum())
            causes = {c: float(v) / nsteps for c, v in zip(self.causes, acc) if v > 1e-6 * max(total, 1.0)}
            cause = max(causes, key=causes.get) if causes else None
            steps_last = sum(1 for o in step_owner.values() if o == r)
            among = " among the ranks in these traces" if partial else ""
            out.append({
                "rank": r, "last_at": self.last_at.get(r, 0), "collectives": self.taken_part.get(r, 0),
                "steps_last": steps_last, "steps": nsteps, "cause": cause,
                "cause_share": (causes[cause] * nsteps / total) if cause and total > 0 else None,
                "causes_measured": r not in self.blind,
                "causes_us_per_step": dict(sorted(causes.items(), key=lambda x: -x[1])),
                "wait_caused_us_per_step": total / nsteps, "delay_us_per_step": self.delay.get(r, 0.0) / nsteps,
                "summary": (f"rank {r} last{among} in {steps_last} of {nsteps} step(s) (at {self.last_at.get(r, 0)} "
                            f"of {self.taken_part.get(r, 0)} collectives); the job waits "
                            f"{self.delay.get(r, 0.0) / nsteps / 1000:.2f} ms per step for it"
                            + (", what made it late is not measured in these traces (no attribution of its step)"
                               if r in self.blind else
                               f", {100 * causes[cause] * nsteps / total:.0f}% of it charged to its "
                               f"{LABELS.get(cause, cause)}" if cause and total else ""))})
        out.sort(key=lambda x: -x["delay_us_per_step"])
        return out

    def wait_matrix(self, nsteps: int) -> dict[str, Any] | None:
        """Who waits for whom, ms per step: a row per rank, a column per late rank (the costliest
        ``MATRIX_COLUMNS``; the rest summed in ``other_ms_per_step``)."""
        if not self.matrix:
            return None
        cost = {r: float(v.sum()) for r, v in self.matrix.items()}
        cols = sorted(cost, key=lambda r: -cost[r])[:MATRIX_COLUMNS]
        rest = [r for r in cost if r not in cols]
        scale = 1.0 / nsteps / 1000
        m = np.stack([self.matrix[c] for c in cols], axis=1) * scale
        other = (sum(self.matrix[r] for r in rest) * scale).tolist() if rest else None
        return {"unit": "ms per step", "waiting": list(self.ranks), "late": cols, "ms_per_step": m.tolist(),
                "other_ms_per_step": other,
                "definition": "row: the rank that waits; column: the late arrival it waits for; waits at collectives "
                              "where the others' median wait is below late_threshold_us are not charged"}


__all__ = ["DEFINITION", "EXACT_BELOW", "LABELS", "LATE_MIN_US", "Ledger", "lag_causes", "others_median"]
