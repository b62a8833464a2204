"""Noticing that the ranks' speeds changed mid-run: a straggler appears, grows, moves to another rank or goes away.

Shares learned before such a change are wrong after it, and the balancer's window (up to ``window`` steps of
medians) would take half a window to notice. So every measured step is also kept here, whatever shares it ran
under: each rank's time ``t_r = fixed_r + compute_r`` and, to leave out what slows every rank alike (the
machine, a longer sequence), relative to the ranks' mean: ``rel_r = t_r / mean(t)``.

The newest ``steps`` steps are compared with the steps before them since the last change (the *reference*)
that ran under the *same shares* (a rank's time need not follow its share: a trial's arms, a stalled rank;
shares with fewer than 3 reference steps are not compared). Per rank, ``d_i = log(rel_r,i / median(rel_r of
the reference steps under the same shares))``. A change on rank ``r`` needs

- all but one of the compared newest steps (at least ``steps - 1`` of them) on the same side and beyond
  ``log(1 + threshold)`` (a sign test: one or two slow steps are a blip, not a change), and
- their median beyond three robust standard deviations of the reference's own ``d`` (a noisy machine raises
  the bar instead of raising alarms).

The change is named by the rank whose own time moved most (``factor`` = median of ``t_r`` over the newest
steps / its reference median: "rank 1 slowed x1.9 at step 34"; a machine-wide slowdown, in every rank's
factor alike, fires nothing). The detector then keeps only the newest steps; the policy decides what to do
with the change (re-measure from there, leave a trial whose arms straddle it, go back to equal shares when
they are predicted faster).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Sequence

import numpy as np

MAD_TO_SIGMA = 1.4826


@dataclass
class BalanceChange:
    """A change of the ranks' relative speeds, as logged to the metrics."""

    step: int
    rank: int                   # the rank whose time moved most relative to the others
    factor: float               # its step time (fixed + compute), newest steps / before (2: twice as slow)
    factors: list[float]        # the same for every rank
    since_step: int             # the first of the newest steps that showed it
    shares: list[int]           # the shares from the next step on (kept, or equal when predicted faster)
    old_shares: list[int]       # the shares when the change was seen
    aborted_trial: bool = False  # a move being tried was left (its arms were measured across the change)

    @property
    def summary(self) -> str:
        verb = "slowed" if self.factor >= 1 else "sped up"
        f = self.factor if self.factor >= 1 else 1 / self.factor
        text = f"rank {self.rank} {verb} x{f:.1f} at step {self.since_step}"
        others = [f"rank {i} {'slowed' if x >= 1 else 'sped up'} x{max(x, 1 / x):.1f}"
                  for i, x in enumerate(self.factors) if i != self.rank and abs(math.log(x)) > math.log(1.15)]
        if others:
            text += " (" + ", ".join(others) + ")"
        if self.shares != self.old_shares:
            text += f"; shares {'/'.join(map(str, self.old_shares))} -> {'/'.join(map(str, self.shares))} (equal " \
                    "shares predicted faster than the old ones) while it re-measures"
        else:
            text += "; re-measuring under the current shares"
        if self.aborted_trial:
            text += " (the move being tried was left: measured across the change)"
        return text

    def as_dict(self) -> dict:
        return {**asdict(self), "summary": self.summary}

    def as_metrics(self, prefix: str = "balance/") -> dict:
        """Flat record: ``balance/change`` (the summary) and ``balance/change_<field>``."""
        d = self.as_dict()
        out = {f"{prefix}change": d.pop("summary")}
        out.update({f"{prefix}change_{k}": v for k, v in d.items()})
        return out


class ChangeDetector:
    """Per-step times of every rank, and the test above (see the module docstring)."""

    def __init__(self, global_batch: int, world: int, *, steps: int = 6, threshold: float = 0.15, window: int = 100):
        if steps < 3:
            raise ValueError(f"steps={steps}: the sign test needs at least 3 steps")
        self.global_batch, self.world, self.steps, self.threshold = global_batch, world, steps, threshold
        self.window = max(window, 2 * steps)
        self._est: list[np.ndarray] = []   # per step: every rank's time (fixed + compute)
        self._raw: list[tuple] = []        # per step: (shares, compute, fixed) as measured
        self._steps: list[int] = []        # the step each row belongs to

    def __len__(self) -> int:
        return len(self._est)

    def push(self, step: int, shares: Sequence[int], compute: Sequence[float], fixed: Sequence[float]) -> None:
        self._est.append(np.asarray(fixed, float) + np.asarray(compute, float))
        self._raw.append((list(shares), list(compute), list(fixed)))
        self._steps.append(step)
        if len(self._est) > self.window:
            del self._est[0], self._raw[0], self._steps[0]

    def restart(self, keep: int = 0) -> None:
        """Forget all but the newest ``keep`` steps (after a change, or when the shares restart)."""
        keep = min(keep, len(self._est))
        cut = len(self._est) - keep
        del self._est[:cut], self._raw[:cut], self._steps[:cut]

    def newest(self, k: int | None = None) -> list[tuple]:
        """The newest ``k`` steps as measured: ``(shares, compute, fixed)``."""
        k = self.steps if k is None else k
        return self._raw[-k:]

    def check(self) -> tuple[int, float, list[float], int] | None:
        """``(rank, factor, factors, since_step)`` when the newest steps show a change, else None."""
        k = self.steps
        if len(self._est) < 2 * k:
            return None
        est = np.maximum(np.vstack(self._est), 1e-12)
        rel = est / est.mean(axis=1, keepdims=True)
        keys = [tuple(r[0]) for r in self._raw]
        n_ref = len(keys) - k
        groups: dict[tuple, list[int]] = {}
        for i in range(n_ref):
            groups.setdefault(keys[i], []).append(i)
        groups = {key: idx for key, idx in groups.items() if len(idx) >= 3}  # a reference needs 3 steps
        if not groups:
            return None
        ref_rel = {key: np.median(rel[idx], axis=0) for key, idx in groups.items()}
        ref_est = {key: np.median(est[idx], axis=0) for key, idx in groups.items()}
        d_ref = np.vstack([np.log(rel[idx] / ref_rel[key]) for key, idx in groups.items()])
        noise = MAD_TO_SIGMA * np.median(np.abs(d_ref - np.median(d_ref, axis=0)), axis=0)
        newest = [i for i in range(n_ref, len(keys)) if keys[i] in groups]  # steps under shares seen before
        if len(newest) < k - 1:
            return None
        d = np.vstack([np.log(rel[i] / ref_rel[keys[i]]) for i in newest])  # (m, world)
        m = len(newest)
        bar = math.log1p(self.threshold)
        med = np.median(d, axis=0)
        up = (d > bar).sum(axis=0) >= m - 1
        down = (d < -bar).sum(axis=0) >= m - 1
        moved = (up | down) & (np.abs(med) > 3 * noise)
        if not moved.any():
            return None
        factors = np.median(np.vstack([est[i] / ref_est[keys[i]] for i in newest]), axis=0)
        # name the rank whose own time moved most (the relative test fired; a machine-wide change moves every
        # rank's time alike: it is left out of rel, not of the factors)
        r = int(np.argmax(np.abs(np.log(factors))))
        j = int(np.argmax(np.where(moved, np.abs(med), -1.0)))
        side = d[:, j] > bar if up[j] else d[:, j] < -bar
        first = newest[int(np.argmax(side))]  # the first of the newest steps on the changed side: where it began
        return r, float(factors[r]), [float(f) for f in factors], int(self._steps[first])
