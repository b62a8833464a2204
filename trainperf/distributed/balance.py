"""Dynamic load balancer: per-rank shares of the global batch that follow measured speed, and moves that
are kept only when the step got faster.

In synchronous data parallelism every step waits for the slowest rank. The balancer gives
each data-parallel rank a number of samples (its *share*) proportional to its measured speed,
so that all ranks finish their compute at about the same time, while the global batch and the
gradient stay exactly those of the plain run.

Measurement. Each rank times its own compute of a step (:class:`ComputeClock`: step start to
the last gradient of the last backward, so the wait for the other ranks at the end of DDP's
backward is not counted), its fixed time (data + optimizer, which its share does not scale) and
the step's wall time, and hands them to :meth:`DynamicBalancer.step`, which ``all_gather``-s three
floats per rank and step (every ``sync_every`` steps, as one small tensor). Every rank keeps the
same history and takes the same decisions (pure arithmetic on identical inputs).

Imbalance = coefficient of variation (population std / mean) of the per-rank step times (fixed +
compute), each the median over the measurements taken with the current shares (at most ``window``
of them: the founding document's "last 100 load measurements"). The median ignores blips that
last less than half the window. When it fires, the speeds (samples/s = share / median time)
come from the newer half of the measurements (at least ``min_steps``), so a lasting change that
has just outweighed the older half is measured by itself.

Proposal, made when at least ``min_steps`` measurements exist under the current shares:

1. *trigger*: the imbalance exceeds ``threshold`` (the founding document's 0.2), or a move is predicted
   to cut the step by ``trigger_gain`` for ``min_steps`` judgements in a row (the CV alone misses a 1.4x
   straggler between two ranks), or the balancer is *refining* (its last move was kept);
2. some rank's current share is a whole sample or more away from its speed-proportional,
   bounded target (otherwise the shares already are a rounding of it); while refining on the last trial's
   measured slopes, the target's rounding differs from the current shares, and
3. the new shares (the target rounded) are predicted to cut the step's time
   ``max_r fixed_r + share_r x per_sample_time_r`` by at least ``min_gain`` (2% by default), and
4. while refining, they are not the shares the last move left.

Verification (``verify``, on by default; :mod:`trainperf.distributed.balance_trial`). A proposal is a
prediction, and predictions fail: a rank sharing its core with another process is slow by a time that
does not follow its work, a noisy window points the wrong way. So the new shares are *tried*: they
alternate with the old ones in blocks (new, old, old, new), and the move is kept only if the measured
step time (the slowest rank's wall time) got faster, judged against its noise; otherwise the old
shares come back and the balancer backs off (``backoff_steps``, doubled after each consecutive
revert, reset by a kept move) before it tries again. The trial also measures how each moved rank's
compute time followed its share: a rank slow *per sample* (moving work helps) or *stalled* regardless
of work (it does not); that cause is logged with the verdict, and the measured slopes replace the
proportional guess for the next refinement.

After a kept move the balancer refines: it judges the new shares after ``min_steps`` measurements
and proposes again, without waiting for the imbalance to exceed ``threshold``, as long as rules 2
to 4 find a move. The first judgement that finds none releases it: from then on only a trigger
starts it again (a Schmitt trigger: start at ``threshold``, stop at "no move gains ``min_gain``").

Shares: proportional to speed, clamped to ``[min_share, max_share] x global_batch`` (and at least
one sample per micro-step), rounded by largest remainder so that they sum exactly to the global
batch. Each rank runs the same number of micro-steps (:func:`micro_batch_sizes`), with micro-
batches of different sizes, so every rank issues the same collectives (DDP and FSDP2).

Exact gradients: the global-batch loss is the sum of per-sample losses over the global count.
A micro-batch of ``n`` samples whose loss is a mean is scaled by ``n x world / global_batch``
(:func:`micro_loss_scale`) before ``backward``; DDP and FSDP2 then *average* over ranks
(divide by ``world``), which leaves ``sum / global_batch``. With equal shares and one micro-step
the factor is 1, the plain DDP case.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable, Sequence

import numpy as np

from trainperf.distributed.balance_shares import (  # noqa: F401 - re-exported: the balancer's one import path
    check_balance_args, check_balance_config, coefficient_of_variation, equal_shares, local_loss_scale,
    micro_batch_sizes, micro_loss_scale, proportional_shares, proportional_targets, round_shares, share_bounds)
from trainperf.distributed.balance_change import BalanceChange, ChangeDetector
from trainperf.distributed.balance_trial import BalanceVerdict, Trial
from trainperf.distributed.clocks import ComputeClock, ThreadCpuClock  # noqa: F401 - re-exported
from trainperf.errors import ConfigError

# --------------------------------------------------------------------------- the policy


@dataclass
class BalanceDecision:
    """One move tried (or, unverified, made), as logged to the metrics."""

    step: int
    speeds: list[float]        # samples/s per rank (current share / median step compute time)
    fixed_times: list[float]   # median per-step time that does not scale with samples (data, optimizer) (s)
    step_times: list[float]    # median step compute time per rank, newer half of the window, old shares (s)
    old_shares: list[int]
    new_shares: list[int]
    imbalance: float           # CV of the per-rank median step times over the window (the trigger)
    predicted_imbalance: float  # CV of the step times the new shares should give (from step_times)
    predicted_gain: float      # 1 - predicted step time / measured step time (slowest rank)
    measurements: int          # steps the medians were taken over
    refinement: bool = False   # made while refining after a kept move (no threshold needed), not on a trigger
    trigger: str = "threshold"  # what started it: "threshold" (CV), "gain" (predicted cut), "refinement"
    model: str = "proportional"  # per-sample times: "proportional" (time / share) or "measured" (the last trial's slopes)
    verified: bool = True      # tried against the old shares before being kept (parallelism.balance.verify)

    def as_dict(self) -> dict:
        return asdict(self)

    def as_metrics(self, prefix: str = "balance/") -> dict:
        """Flat record for a metric sink (JSONL)."""
        return {f"{prefix}{k}": v for k, v in self.as_dict().items()}


class BalancePolicy:
    """The balancer's arithmetic, for all ranks at once; no process group (unit-testable).

    Call :meth:`update` once per step with every rank's compute time of that step (forward+backward, which
    scales with its samples) and, optionally, its fixed time (data, optimizer: the same whatever its share;
    on a rank that shares its core with another process it is slow too) and the step's wall time on each
    rank (the trial's objective; without it, the model's ``max_r fixed_r + compute_r``). A rank's time is
    modelled as ``fixed + share / speed``; new shares equalize it, and are tried against the old ones
    before they are kept (``verify``).
    """

    def __init__(self, global_batch: int, world: int, *, window: int = 100, threshold: float = 0.2,
                 min_share: float = 0.0, max_share: float = 1.0, min_gain: float = 0.02, min_steps: int = 10,
                 micro_steps: int = 1, shares: Sequence[int] | None = None, trigger_gain: float = 0.15,
                 verify: bool = True, verify_steps: int = 20, verify_block: int = 5, backoff_steps: int = 100,
                 change_steps: int = 6, change_threshold: float = 0.15):
        check_balance_args(window=window, threshold=threshold, min_gain=min_gain, min_steps=min_steps)
        check_verify_args(verify_steps=verify_steps, verify_block=verify_block, backoff_steps=backoff_steps)
        check_change_args(change_steps=change_steps, change_threshold=change_threshold)
        if world < 1 or global_batch < world * micro_steps:
            raise ConfigError(
                f"train.global_batch={global_batch} cannot give each of {world} data-parallel ranks "
                f"{micro_steps} micro-step(s) of at least one sample; use a global batch >= {world * micro_steps}"
            )
        self.global_batch, self.world = global_batch, world
        self.window, self.threshold, self.min_gain, self.trigger_gain = window, threshold, min_gain, trigger_gain
        self.min_steps = min(min_steps, window)
        self.micro_steps = micro_steps
        self.verify, self.verify_steps, self.verify_block = verify, verify_steps, verify_block
        self.backoff_steps = backoff_steps
        self.lo, self.hi = share_bounds(global_batch, world, min_share=min_share, max_share=max_share,
                                        min_samples=micro_steps)
        self.shares = list(shares) if shares is not None else equal_shares(global_batch, world)
        if len(self.shares) != world or sum(self.shares) != global_batch:
            raise ValueError(f"shares {self.shares} must be {world} counts summing to {global_batch}")
        self._buf = np.zeros((window, world))  # ring of the last `window` steps' compute times
        self._fixed = np.zeros((window, world))  # and their fixed (share-independent) times
        self._count = 0  # measurements under the current shares (capped at window)
        self._next = 0
        self.engaged = False  # refining: True from a kept move until a judgement finds no move worth making
        self._gain_streak = 0  # consecutive judgements below the CV threshold that found a move worth trigger_gain
        self._previous: list[int] | None = None  # the shares before the last move
        self.trial: Trial | None = None  # the move being tried
        self._pending: BalanceDecision | None = None  # its decision
        self._model: list | None = None  # per rank (per-sample s, intercept s) measured by the last kept trial
        self._hold_until = -1  # after a revert: no new move before this step
        self._reverts = 0  # consecutive reverted moves (the back-off doubles with each)
        self.decisions: list[BalanceDecision] = []
        self.verdicts: list[BalanceVerdict] = []
        self.changes: list[BalanceChange] = []
        # mid-run changes of the ranks' relative speeds (balance_change.py): seen within change_steps steps
        self.detector = ChangeDetector(global_batch, world, steps=change_steps, threshold=change_threshold,
                                       window=window)
        self._after_change = False  # the first judgement after a change acts on min_gain alone (trigger "change")
        self._seen = 0  # steps observed (numbers the detector's rows when no step is given)

    @property
    def measurements(self) -> int:
        """Steps measured under the current shares and kept (at most ``window``)."""
        return self._count

    @property
    def settled(self) -> bool:
        """No move being tried and none being refined."""
        return self.trial is None and not self.engaged

    def medians(self, last: int | None = None, *, fixed: bool = False) -> list[float]:
        """Per-rank median step compute time (``fixed``: fixed time) over the window (or its ``last``
        measurements)."""
        k = min(last or self._count, self._count)
        idx = (self._next - 1 - np.arange(k)) % self.window  # the k newest rows
        return np.median((self._fixed if fixed else self._buf)[idx], axis=0).tolist()  # (k, world) -> (world,)

    def imbalance(self) -> float | None:
        """CV of the per-rank median step compute times under the current shares (None: too few)."""
        if self._count < self.min_steps:
            return None
        return coefficient_of_variation(self.medians())

    # -- measurements ---------------------------------------------------------------------------
    def observe(self, compute_times: Sequence[float], fixed_times: Sequence[float] | None = None,
                wall_times: Sequence[float] | None = None, step: int | None = None) -> None:
        """Record one step run under the current shares (call :meth:`decide` once a batch of these is in)."""
        if len(compute_times) != self.world:
            raise ValueError(f"expected {self.world} compute times, got {len(compute_times)}")
        compute = np.maximum(np.asarray(compute_times, dtype=np.float64), 1e-12)
        fixed = np.zeros(self.world) if fixed_times is None else np.maximum(np.asarray(fixed_times, float), 0.0)
        self._seen += 1
        self.detector.push(self._seen if step is None else step, self.shares, compute.tolist(), fixed.tolist())
        if self.trial is not None:
            walls = None if wall_times is None else [float(w) for w in wall_times]
            known = walls is not None and all(w >= 0 for w in walls)  # a rank without a wall clock sends -1
            objective = max(walls) if known else float(np.max(compute + fixed))
            self.trial.record(self.shares, objective, compute.tolist(), fixed.tolist())
            return
        self._push(compute, fixed)

    def _push(self, compute, fixed) -> None:
        self._buf[self._next], self._fixed[self._next] = compute, fixed
        self._next = (self._next + 1) % self.window
        self._count = min(self._count + 1, self.window)

    def _restart_window(self, rows: list, fixed: list) -> None:
        self._count = self._next = 0
        for c, f in zip(rows[-self.window:], fixed[-self.window:]):
            self._push(np.asarray(c), np.asarray(f))

    def update(self, step: int, compute_times: Sequence[float], fixed_times: Sequence[float] | None = None,
               wall_times: Sequence[float] | None = None):
        """:meth:`observe` one step, then :meth:`decide` (a policy fed step by step)."""
        self.observe(compute_times, fixed_times, wall_times, step=step)
        return self.decide(step)

    # -- decisions ------------------------------------------------------------------------------
    def decide(self, step: int) -> BalanceDecision | BalanceVerdict | BalanceChange | None:
        """After the steps up to ``step`` are observed: a change of the ranks' speeds (what was measured
        before it is dropped), the move started (a decision), the verdict on the move being tried, or None.
        A trial's switches between its arms change :attr:`shares` silently."""
        change = self._check_change(step)
        if change is not None:
            return change
        if self.trial is not None:
            return self._advance_trial(step)
        if self._count < self.min_steps or step < self._hold_until:
            return None
        decision = self._propose(step)
        if decision is None:
            return None
        self._previous = self.shares
        self._gain_streak = 0
        self.decisions.append(decision)
        if self.verify:
            self.trial = Trial(old=list(self.shares), new=decision.new_shares, block=self.verify_block,
                               steps=self.verify_steps, max_steps=4 * self.verify_steps,
                               predicted_gain=decision.predicted_gain)
            self._pending = decision
        else:
            decision.verified = False
            self.engaged = True
            self._count = 0  # times under the old shares are not comparable
        self.shares = list(decision.new_shares)
        return decision

    def _advance_trial(self, step: int) -> BalanceVerdict | None:
        t = self.trial
        verdict = t.advance()
        if verdict is None:
            self.shares = t.shares  # the next block's arm
            return None
        gain, se = t.result()
        follows, model, cause = t.fit()
        kept = verdict == "kept"
        arm = "new" if kept else "old"
        self.trial, decision, self._pending = None, self._pending, None
        self.shares = list(t.new if kept else t.old)
        self._restart_window(t.compute[arm], t.fixed[arm])  # measured under the shares that stay
        self._gain_streak = 0
        if kept:
            self.engaged, self._reverts, self._model = True, 0, model
            backoff = 0
        else:
            self.engaged, self._model = False, None
            backoff = self.backoff_steps * 2 ** min(self._reverts, 6)
            self._reverts += 1
            self._hold_until = step + backoff
        v = BalanceVerdict(step=step, verdict=verdict, old_shares=list(t.old), new_shares=list(t.new),
                           shares=list(self.shares), measured_gain=gain, gain_se=se,
                           predicted_gain=decision.predicted_gain if decision else t.predicted_gain,
                           step_s={k: float(np.median(v)) for k, v in t.objective.items()},
                           measurements=t.counts(), follows=follows, cause=cause, backoff_steps=backoff)
        self.verdicts.append(v)
        return v

    def _check_change(self, step: int) -> BalanceChange | None:
        """A change of the ranks' relative speeds in the newest steps (:mod:`.balance_change`): the move being
        tried is left (its arms straddle the change), the back-off and the learned cost model are dropped, and
        the window restarts from the newest steps; the shares stay, unless equal shares are predicted faster
        from the newest steps (a straggler that moved to the rank the old shares loaded)."""
        got = self.detector.check()
        if got is None:
            return None
        rank, factor, factors, since = got
        old = list(self.shares)
        aborted = self.trial is not None
        base = list(self.trial.old) if aborted else old
        newest = self.detector.newest()
        shares = self._faster_of(base, equal_shares(self.global_batch, self.world), newest)
        self.trial = self._pending = None
        self.engaged, self._model, self._previous, self._gain_streak = False, None, None, 0
        self._hold_until, self._reverts = -1, 0
        rows = [(c, f) for s, c, f in newest if s == shares]  # re-measured: the newest steps under these shares
        self._restart_window([c for c, _ in rows], [f for _, f in rows])
        self.detector.restart(keep=self.detector.steps)
        self.shares = shares
        self._after_change = True
        change = BalanceChange(step=step, rank=rank, factor=factor, factors=factors, since_step=since,
                               shares=list(shares), old_shares=old, aborted_trial=aborted)
        self.changes.append(change)
        return change

    def _faster_of(self, base: list[int], equal: list[int], rows: list[tuple]) -> list[int]:
        """``base`` or ``equal`` shares, whichever the newest steps' per-sample and fixed times predict faster
        (``max_r fixed_r + share_r x per_sample_r``); ``base`` on a tie."""
        if base == equal:
            return base
        per = np.median([[c / max(s, 1) for s, c in zip(sh, comp)] for sh, comp, _ in rows], axis=0)
        fixed = np.median([f for _, _, f in rows], axis=0)

        def predicted(shares):
            return float(np.max(fixed + np.asarray(shares) * per))
        return list(equal) if predicted(equal) < predicted(base) else list(base)

    def _propose(self, step: int) -> BalanceDecision | None:
        """The move rules 1-4 allow now, or None (see the module docstring)."""
        after_change, self._after_change = self._after_change, False
        cv = coefficient_of_variation([c + f for c, f in zip(self.medians(), self.medians(fixed=True))])
        # The trigger uses the whole window (robust to blips); the speeds its newer half (at least
        # min_steps), so a change that has just outweighed the older half is not averaged with it.
        newer = max(self.min_steps, self._count // 2)
        times, fixed = self.medians(newer), self.medians(newer, fixed=True)
        speeds = [s / t for s, t in zip(self.shares, times)]
        per_sample, offsets, how = self._cost_model(times, fixed)
        target = proportional_targets([1 / p for p in per_sample], self.global_batch, lo=self.lo, hi=self.hi,
                                      offsets=offsets)
        new = round_shares(target, self.global_batch, lo=self.lo, hi=self.hi)
        # settled when the current shares are already a rounding of the target; with the proportional guess any
        # rounding within a sample, with the last trial's measured slopes (a fit of two arrangements, intercepts
        # included) the rounding itself: one sample is 6% of a global batch of 16, too much to leave to a guess
        near = new == self.shares if how == "measured" else all(abs(s - x) < 1 for s, x in zip(self.shares, target))
        if near:
            self.engaged = False
            return None
        if self.engaged and new == self._previous:
            self.engaged = False  # refining back to the shares just left: noise between neighbours
            return None
        predicted = [o + n * p for o, n, p in zip(offsets, new, per_sample)]
        gain = 1.0 - max(predicted) / max(f + t for f, t in zip(fixed, times))
        trigger = "refinement" if self.engaged else ("threshold" if cv > self.threshold else
                                                     "change" if after_change else "gain")
        if trigger == "gain":
            # below the CV threshold, a move must be worth trigger_gain by the newer half and the whole window
            # alike, for min_steps evaluations in a row: a noisy excursion does not start a move
            held = min(gain, self._window_gain(new)) >= self.trigger_gain
            self._gain_streak = self._gain_streak + 1 if held else 0
            if self._gain_streak < self.min_steps:
                return None
        if gain < self.min_gain:
            self.engaged = False  # not worth a move: noise, or a residual the bounds keep
            return None
        return BalanceDecision(step=step, speeds=speeds, fixed_times=fixed, step_times=times,
                               old_shares=list(self.shares), new_shares=new, imbalance=cv,
                               predicted_imbalance=coefficient_of_variation(predicted), predicted_gain=gain,
                               measurements=self._count, refinement=self.engaged, trigger=trigger, model=how)

    def _cost_model(self, times: list[float], fixed: list[float]) -> tuple[list[float], list[float], str]:
        """Per rank ``(per-sample seconds, share-independent seconds)``: while refining after a kept trial,
        the trial's measured slope (the intercept re-anchored on the current medians); else proportional
        (``time / share``, no intercept beyond the fixed time)."""
        per = [t / s for t, s in zip(times, self.shares)]
        off = list(fixed)
        model = self._model if self.engaged else None
        if not model:
            return per, off, "proportional"
        used = False
        for r, m in enumerate(model):
            if m is None:
                continue
            slope = m[0]
            intercept = times[r] - slope * self.shares[r]
            if slope > 0 and intercept >= 0:
                per[r], off[r], used = slope, fixed[r] + intercept, True
        return per, off, "measured" if used else "proportional"

    def _window_gain(self, new: list[int]) -> float:
        """Predicted cut of the step time from ``new`` shares, by the whole window's medians."""
        times, fixed = self.medians(), self.medians(fixed=True)
        predicted = [f + n * t / s for f, n, t, s in zip(fixed, new, times, self.shares)]
        return 1.0 - max(predicted) / max(f + t for f, t in zip(fixed, times))

    def state_dict(self) -> dict:
        kept = self.trial.old if self.trial is not None else self.shares  # a move being tried is not kept yet
        return {"shares": list(kept), "global_batch": self.global_batch, "world": self.world}

    def load_state_dict(self, state: dict) -> None:
        if state.get("global_batch") != self.global_batch or state.get("world") != self.world:
            return  # a different layout: start again from equal shares and re-measure
        self.shares = list(state["shares"])
        self._count = self._next = 0
        self._previous, self.engaged, self.trial, self._pending, self._model = None, False, None, None, None
        self.detector.restart()
        self._after_change = False


def check_change_args(*, change_steps: int, change_threshold: float) -> None:
    if change_steps < 3:
        raise ConfigError(f"parallelism.balance.change_steps={change_steps} must be >= 3 (a change must hold over "
                          "all but one of them); use e.g. 6")
    if not change_threshold > 0:
        raise ConfigError(f"parallelism.balance.change_threshold={change_threshold} must be > 0 (a fraction of a "
                          "rank's time relative to the others); use e.g. 0.15")


def check_verify_args(*, verify_steps: int, verify_block: int, backoff_steps: int) -> None:
    for name, value, low, example in (("verify_steps", verify_steps, 2, 20), ("verify_block", verify_block, 1, 5),
                                      ("backoff_steps", backoff_steps, 0, 100)):
        if value < low:
            raise ConfigError(f"parallelism.balance.{name}={value} must be >= {low}; use e.g. {example}")


# --------------------------------------------------------------------------- measurement and exchange


class DynamicBalancer:
    """A data-parallel rank's handle on the shared :class:`BalancePolicy`.

    Per step: ``shares = bal.shares`` (for the sampler), ``bal.micro_batches()`` (this rank's
    micro-batch sizes), then ``event = bal.step(step, compute_s, fixed_s, wall_s)``. ``gather`` defaults
    to ``torch.distributed.all_gather`` over ``group``; tests may pass a function taking this rank's
    list of floats and returning every rank's list.
    """

    def __init__(self, global_batch: int, *, world: int | None = None, rank: int | None = None, group=None,
                 sync_every: int = 1, gather: Callable[[list[float]], list[list[float]]] | None = None,
                 sync_every_settled: int | None = None,
                 device=None, **policy_kwargs):
        if world is None or rank is None:
            import torch.distributed as dist

            world = dist.get_world_size(group) if world is None else world
            rank = dist.get_rank(group) if rank is None else rank
        if sync_every < 1:
            raise ConfigError(f"parallelism.balance.sync_every={sync_every} must be >= 1; use e.g. 1 or 10")
        self.rank, self.world, self.group, self.device = rank, world, group, device
        self.sync_every = sync_every
        # while settled (no move tried or refined, no change to act on) the exchange may be rarer: each one is a
        # collective that waits for every rank's threads to be scheduled, which a busy host makes cost several ms
        self.sync_every_settled = max(sync_every, sync_every_settled or sync_every)
        self.policy = BalancePolicy(global_batch, world, **policy_kwargs)
        self._gather = gather or self._all_gather
        self._pending: list[float] = []

    @classmethod
    def from_config(cls, balance_cfg, global_batch: int, *, micro_steps: int = 1, group=None, device=None,
                    **kwargs) -> "DynamicBalancer":
        b = balance_cfg
        return cls(global_batch, group=group, device=device, sync_every=b.sync_every,
                   sync_every_settled=b.sync_every_settled, window=b.window,
                   threshold=b.threshold, min_share=b.min_share, max_share=b.max_share, min_gain=b.min_gain,
                   min_steps=b.min_steps, micro_steps=micro_steps, trigger_gain=b.trigger_gain, verify=b.verify,
                   verify_steps=b.verify_steps, verify_block=b.verify_block, backoff_steps=b.backoff_steps,
                   change_steps=b.change_steps, change_threshold=b.change_threshold, **kwargs)

    @property
    def shares(self) -> list[int]:
        return list(self.policy.shares)

    @property
    def local_share(self) -> int:
        return self.policy.shares[self.rank]

    @property
    def decisions(self) -> list[BalanceDecision]:
        return self.policy.decisions

    @property
    def verdicts(self) -> list[BalanceVerdict]:
        return self.policy.verdicts

    @property
    def changes(self) -> list[BalanceChange]:
        return self.policy.changes

    def micro_batches(self) -> list[int]:
        return micro_batch_sizes(self.local_share, self.policy.micro_steps)

    def loss_scale(self, n: int) -> float:
        """:func:`micro_loss_scale` for a micro-batch of ``n`` samples of this rank."""
        return micro_loss_scale(n, self.policy.global_batch, self.world)

    def _all_gather(self, values: list[float]) -> list[list[float]]:
        import torch
        import torch.distributed as dist

        local = torch.tensor(values, dtype=torch.float64, device=self.device)
        out = [torch.empty_like(local) for _ in range(self.world)]
        dist.all_gather(out, local, group=self.group)
        return [o.tolist() for o in out]  # host sync (every sync_every steps)

    def step(self, step: int, compute_s: float, fixed_s: float = 0.0,
             wall_s: float | None = None) -> BalanceDecision | BalanceVerdict | BalanceChange | None:
        """Record this rank's compute time of ``step``, its fixed time (data, optimizer) and the step's wall
        time so far; every ``sync_every`` steps exchange and decide.

        Collective: every rank of the group must call it at the same steps. Returns the decision when a
        move starts (its shares apply from the next step on), the verdict when a tried move is kept or
        reverted, the change when the ranks' relative speeds changed (what was measured before is dropped),
        else None. :attr:`shares` may also change between a trial's blocks.
        """
        self._pending += [float(compute_s), float(fixed_s), -1.0 if wall_s is None else float(wall_s)]
        p = self.policy
        quiet = p.trial is None and not p.engaged and not p._after_change and p.measurements >= p.min_steps
        every = self.sync_every_settled if quiet else self.sync_every  # the same on every rank: state is shared
        if len(self._pending) < 3 * every:
            return None
        rows = self._gather(self._pending)
        self._pending = []
        n = len(rows[0]) // 3
        for j in range(n):  # every buffered step ran with the current shares
            self.policy.observe([rows[r][3 * j] for r in range(self.world)],
                                [rows[r][3 * j + 1] for r in range(self.world)],
                                [rows[r][3 * j + 2] for r in range(self.world)], step=step - (n - 1 - j))
        return self.policy.decide(step)

    def state_dict(self) -> dict:
        return self.policy.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.policy.load_state_dict(state)
