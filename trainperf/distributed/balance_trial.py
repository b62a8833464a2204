"""Verifying a balancer move on the measured step time: an interleaved trial of the new shares against the old.

A move is a prediction (``fixed + share / speed`` per rank, from the compute clocks). It can be wrong:
a rank that shares its core with another process is slow by a time that does not follow its work
(descheduled in a collective, at its optimizer step), a noisy window can point the wrong way, and
per-sample costs change with the micro-batch size. So a move is only *tried*: the two arrangements
alternate in blocks, ``new, old, old, new`` (ABBA: a linear drift of the machine's speed, other jobs
starting or stopping, weighs on both arms alike), and the move is kept only if the *step* got faster:

- the objective is each step's wall time, the slowest rank's (start of the step to the exchange;
  without wall times, the model's ``max_r fixed_r + compute_r``), the first step of each block
  left out (a change of shares restarts prefetching and re-grows buffers);
- after an ABBA round with at least half of ``steps`` per arm, an early look: a move ``Z_EARLY`` = 3 standard
  errors ahead is kept, one that measured no faster at all is reverted (a longer trial would run the worse arm
  for another round to look for a gain the first round did not show), anything between runs on;
- after each full ABBA round with at least ``steps`` measurements per arm, ``gain = 1 - median(new) /
  median(old)`` is judged against its noise, ``se`` (standard errors of the two medians from their
  median absolute deviations, combined): kept when ``gain >= z x se`` (``z`` = 2.5), reverted when ``gain <= 0`` or
  ``gain <= -z x se``; undecided, the trial runs another round, up to ``max_steps`` per arm, then it is
  kept only when ``gain >= 2 se``: a move without evidence that the step got faster is not kept.

The same measurements say *why* a rank was slow. For each rank whose share changed, the measured
slope of its compute time against its share is compared with the proportional model's
(``time / share``): ``follows`` = measured / predicted. A slowest rank whose time follows its work
(``follows >= 0.5``) is slow *per sample* (``cause = "per_sample"``: moving work helps); one whose time
barely moved is *stalled* regardless of work (``cause = "stall"``: moving work does not help). The
measured slopes and intercepts are handed to the policy for its next move (a two-point fit instead
of the proportional guess).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field
from typing import Sequence

MAD_TO_SIGMA = 1.4826  # median absolute deviation -> standard deviation (normal)
MEDIAN_EFFICIENCY = 1.2533  # standard error of the median / standard error of the mean (normal)
# Standard errors a kept move must be ahead by. The verdict looks again after each round (up to 4 looks
# or more): 2.5 keeps the chance that noise alone keeps a move that changes nothing near 5% over all of
# them (Pocock's repeated-looks boundary for a one-sided 2.5% test is about 2.4 for 5 to 10 looks).
Z = 2.5
Z_FINAL = 2.0  # at the last look (the trial's longest): a one-sided 2.3% test
# An early look, after an ABBA round with at least half the steps per arm: a move 3 standard errors ahead is kept
# within one round (a straggler that appeared mid-run is balanced sooner), one that measured no faster is left at
# once (a refinement that measured -6% +- 4% ran its worse arm for a second round, in the measured window of
# `bench balance --mid-run`), anything between runs on.
Z_EARLY = 3.0


def median_se(values: Sequence[float]) -> float:
    """Standard error of the median of ``values``, from their median absolute deviation (robust to outliers)."""
    n = len(values)
    if n < 2:
        return math.inf
    med = statistics.median(values)
    mad = statistics.median(abs(v - med) for v in values)
    return MEDIAN_EFFICIENCY * MAD_TO_SIGMA * mad / math.sqrt(n)


def judge(old: Sequence[float], new: Sequence[float], *, z: float = Z, final: bool = False) -> tuple[str | None, float, float]:
    """``(verdict, gain, se)`` for step times measured under the old and the new shares.

    ``gain = 1 - median(new) / median(old)``; ``se`` its standard error. Verdict ``"kept"`` when the
    step is faster by ``z`` standard errors, ``"reverted"`` when it is not faster at all (or slower by
    ``z`` of them), ``None`` when undecided; ``final``: undecided is decided, kept only when
    ``gain >= 2 se``.
    """
    m_old, m_new = statistics.median(old), statistics.median(new)
    gain = 1.0 - m_new / m_old
    se = math.hypot(median_se(old) * m_new / m_old, median_se(new)) / m_old  # delta method on m_new / m_old
    if gain >= z * se and gain > 0:
        return "kept", gain, se
    if gain <= 0 or gain <= -z * se:
        return "reverted", gain, se
    if final:
        return ("kept" if gain >= Z_FINAL * se else "reverted"), gain, se
    return None, gain, se


@dataclass
class BalanceVerdict:
    """The outcome of a tried move, as logged to the metrics."""

    step: int
    verdict: str                # "kept" or "reverted"
    old_shares: list[int]
    new_shares: list[int]
    shares: list[int]           # the shares from the next step on (new when kept, old when reverted)
    measured_gain: float        # 1 - median step time (new) / median step time (old), interleaved
    gain_se: float              # its standard error
    predicted_gain: float       # what the move was expected to give
    step_s: dict                # median step time per arm {"old": s, "new": s}
    measurements: dict          # steps measured per arm {"old": n, "new": n}
    follows: list               # per rank: measured slope of compute vs share / proportional slope (None: share unchanged)
    cause: str | None           # slowest rank: "per_sample" (its time follows its work) or "stall" (it does not)
    backoff_steps: int = 0      # after a revert: steps before the next move may be tried

    def as_dict(self) -> dict:
        return asdict(self)

    def as_metrics(self, prefix: str = "balance/") -> dict:
        """Flat record: ``balance/verdict`` and ``balance/verdict_<field>`` (apart from a decision's keys)."""
        d = self.as_dict()
        out = {f"{prefix}verdict": d.pop("verdict")}
        out.update({f"{prefix}verdict_{k}": v for k, v in d.items()})
        return out


def _arm_of_block(i: int) -> str:
    return "new" if i % 4 in (0, 3) else "old"  # new, old, old, new, new, old, old, new, ...


@dataclass
class Trial:
    """An interleaved trial of ``new`` shares against ``old`` ones (see the module docstring).

    The policy feeds every measured step to :meth:`record` (with the shares it ran under) and calls
    :meth:`advance` at each point where shares may change; :attr:`shares` are the shares to run next.
    """

    old: list[int]
    new: list[int]
    block: int = 5
    steps: int = 20
    max_steps: int = 80
    settle: int = 1
    z: float = Z
    predicted_gain: float = 0.0
    objective: dict = field(default_factory=lambda: {"old": [], "new": []})
    compute: dict = field(default_factory=lambda: {"old": [], "new": []})  # per step: per-rank compute
    fixed: dict = field(default_factory=lambda: {"old": [], "new": []})
    index: int = 0        # block number
    in_block: int = 0     # steps recorded in the current block (settle steps included)

    @property
    def arm(self) -> str:
        return _arm_of_block(self.index)

    @property
    def shares(self) -> list[int]:
        return list(self.new if self.arm == "new" else self.old)

    def record(self, shares: Sequence[int], objective: float, compute: Sequence[float], fixed: Sequence[float]) -> None:
        """One measured step (ignored if it ran under other shares than the current arm's)."""
        if list(shares) != self.shares:
            return
        self.in_block += 1
        if self.in_block <= self.settle:
            return  # the first step after a change of shares
        arm = self.arm
        self.objective[arm].append(float(objective))
        self.compute[arm].append(list(compute))
        self.fixed[arm].append(list(fixed))

    def counts(self) -> dict:
        return {k: len(v) for k, v in self.objective.items()}

    def advance(self) -> str | None:
        """At a point where shares may change: move to the next block when this one is full; at the end
        of a round, judge. Returns the verdict ("kept" / "reverted") when the trial is over, else None."""
        if self.in_block < self.block + self.settle:
            return None
        self.index += 1
        self.in_block = 0
        if self.index % 4:
            return None  # inside an ABBA round
        n = min(self.counts().values())
        if n < self.steps:
            if n < max(3, self.steps // 2):
                return None
            verdict, _, _ = judge(self.objective["old"], self.objective["new"], z=Z_EARLY)
            return verdict  # kept Z_EARLY ahead; reverted when not faster at all; else the trial runs on
        verdict, _, _ = judge(self.objective["old"], self.objective["new"], z=self.z, final=n >= self.max_steps)
        return verdict

    def result(self) -> tuple[float, float]:
        _, gain, se = judge(self.objective["old"], self.objective["new"], z=self.z)
        return gain, se

    def medians(self, arm: str) -> tuple[list[float], list[float]]:
        """Per-rank median compute and fixed time under one arm."""
        rows, fixed = self.compute[arm], self.fixed[arm]
        return ([statistics.median(c[r] for c in rows) for r in range(len(self.old))],
                [statistics.median(f[r] for f in fixed) for r in range(len(self.old))])

    def fit(self) -> tuple[list, list[tuple[float, float] | None], str | None]:
        """``(follows, model, cause)``: per rank the measured slope / proportional slope and a two-point
        ``(per_sample_s, intercept_s)`` model (None where the share did not move, or moved too little for
        the change it should make to stand out of the noise of the compute medians), and the cause of the
        slowest rank's slowness under the old shares (None when its slope is unknown)."""
        c_old, f_old = self.medians("old")
        c_new, _ = self.medians("new")
        follows: list = []
        model: list = []
        for r, (so, sn) in enumerate(zip(self.old, self.new)):
            # the change the proportional model expects must stand out of the medians' noise, or the slope says nothing
            expected = abs(sn - so) * c_old[r] / so
            noise = math.hypot(median_se([c[r] for c in self.compute["old"]]),
                               median_se([c[r] for c in self.compute["new"]]))
            if so == sn or expected < self.z * noise:
                follows.append(None)
                model.append(None)
                continue
            slope = (c_new[r] - c_old[r]) / (sn - so)
            follows.append(slope / (c_old[r] / so))
            model.append((slope, c_old[r] - slope * so) if slope > 0 else None)
        slowest = max(range(len(self.old)), key=lambda r: c_old[r] + f_old[r])
        cause = None if follows[slowest] is None else ("per_sample" if follows[slowest] >= 0.5 else "stall")
        return follows, model, cause
