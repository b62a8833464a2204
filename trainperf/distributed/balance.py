"""Dynamic load balancer: per-rank shares of the global batch that follow measured speed.

In synchronous data parallelism every step waits for the slowest rank. The balancer gives
each data-parallel rank a number of samples (its *share*) proportional to its measured speed,
so that all ranks finish their compute at about the same time, while the global batch and the
gradient stay exactly those of the plain run.

Measurement. Each rank times its own compute of a step (:class:`ComputeClock`: step start to
the last gradient of the last backward, so the wait for the other ranks at the end of DDP's
backward is not counted) and hands it to :meth:`DynamicBalancer.step`, which ``all_gather``-s
one float per rank (every ``sync_every`` steps, as one small tensor). Every rank keeps the same
history and takes the same decisions (pure arithmetic on identical inputs).

Imbalance = coefficient of variation (population std / mean) of the per-rank step compute
times, each the median over the measurements taken with the current shares (at most ``window``
of them: the founding document's "last 100 load measurements"). The median ignores blips that
last less than half the window. When it fires, the speeds (samples/s = share / median time)
come from the newer half of the measurements (at least ``min_steps``), so a lasting change that
has just outweighed the older half is measured by itself.

Decision, taken when at least ``min_steps`` measurements exist under the current shares:

1. *trigger*: the imbalance exceeds ``threshold`` (the founding document's 0.2), or the balancer
   is *refining* (it moved at its last judgement, see below);
2. some rank's current share is a whole sample or more away from its speed-proportional,
   bounded target (otherwise the shares already are a rounding of it), and
3. the new shares (the target rounded) are predicted to cut the step's compute time
   ``max_r share_r x per_sample_time_r`` by at least ``min_gain`` (2% by default), and
4. while refining, they are not the shares the last move left (two neighbouring roundings that
   noise makes look better in turn).

After a move the balancer refines: it judges the new shares after ``min_steps`` measurements
and moves again, without waiting for the imbalance to exceed ``threshold``, as long as rules 2
to 4 find a move. The first judgement that finds none releases it: from then on only an
imbalance above ``threshold`` starts it again. This is the hysteresis (a Schmitt trigger: start
at ``threshold``, stop at "no move gains ``min_gain``"). The refinement finishes what an
imprecise first move left (noisy estimates, per-step costs that do not scale with the share:
the fixed point of proportional moves is equal compute times whatever those costs), so the
balanced step is within a rounding of the ideal instead of anywhere under ``threshold``. Rules 2
to 4 stop jitter between neighbouring roundings, residual imbalance the bounds do not let it
remove, and small noise, so shares do not oscillate while speeds are steady. After a move the
measurements restart (times under the old shares are not comparable).

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

import math
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Callable, Sequence

import numpy as np

from trainperf.errors import ConfigError

# --------------------------------------------------------------------------- gradient math


def micro_loss_scale(n: int, global_count: int, world: int) -> float:
    """Factor for the *mean* loss of a micro-batch of ``n`` samples (or tokens) before backward.

    ``loss_mean x n`` is the micro-batch's summed loss; ``x world / global_count`` makes the
    rank-average taken by DDP / FSDP2 equal ``sum over the global batch / global_count``.
    Counts can be samples (equal tokens per sample) or tokens (padding, ignore_index).
    """
    if global_count <= 0 or world <= 0 or n < 0:
        raise ValueError(f"micro_loss_scale needs n >= 0, global_count > 0 and world > 0 (got {n}, {global_count}, {world})")
    return n * world / global_count


def local_loss_scale(share: int, global_batch: int, world: int) -> float:
    """Factor for the mean loss over a rank's whole share (one micro-step): ``share x world / global_batch``.

    Equivalently, a rank's *summed* loss is scaled by ``world / global_batch``.
    """
    return micro_loss_scale(share, global_batch, world)


def micro_batch_sizes(share: int, micro_steps: int) -> list[int]:
    """Split a rank's share into ``micro_steps`` micro-batches as even as possible (larger first).

    Every rank runs the same number of micro-steps, so the gradient collectives match.
    """
    if micro_steps < 1 or share < micro_steps:
        raise ValueError(f"a share of {share} samples cannot fill {micro_steps} micro-steps (need share >= micro_steps >= 1)")
    q, r = divmod(share, micro_steps)
    return [q + 1] * r + [q] * (micro_steps - r)


# --------------------------------------------------------------------------- shares


def share_bounds(global_batch: int, world: int, *, min_share: float = 0.0, max_share: float = 1.0,
                 min_samples: int = 1) -> tuple[int, int]:
    """Per-rank sample bounds ``(lo, hi)`` from fractions of the global batch; ConfigError if impossible."""
    lo = max(int(min_samples), math.ceil(min_share * global_batch - 1e-9))
    hi = min(global_batch, math.floor(max_share * global_batch + 1e-9))
    if lo * world > global_batch:
        raise ConfigError(
            f"parallelism.balance.min_share={min_share} with {world} data-parallel ranks asks for at least {lo} "
            f"samples per rank ({lo * world} in all), more than train.global_batch={global_batch}; "
            f"choose min_share <= {1 / world:.4g} (1 / ranks) or a larger global batch"
        )
    if hi * world < global_batch:
        raise ConfigError(
            f"parallelism.balance.max_share={max_share} with {world} data-parallel ranks allows at most {hi} "
            f"samples per rank ({hi * world} in all), fewer than train.global_batch={global_batch}; "
            f"choose max_share >= {1 / world:.4g} (1 / ranks)"
        )
    return lo, hi


def proportional_targets(speeds: Sequence[float], global_batch: int, *, lo: int = 1, hi: int | None = None,
                         offsets: Sequence[float] | None = None) -> list[float]:
    """Real-valued shares ``clamp(speed x (T - offset), lo, hi)``, the step time ``T`` chosen so they sum to
    ``global_batch``: every unclamped rank then takes ``offset + share / speed = T`` (``offset``: its
    per-step time that does not scale with samples; none: shares in proportion to speed).

    Clamped ranks sit at their bound and the others share the rest.
    """
    n = len(speeds)
    offsets = [0.0] * n if offsets is None else [max(0.0, float(o)) for o in offsets]
    hi = global_batch if hi is None else hi
    if n == 0 or lo * n > global_batch or hi * n < global_batch:
        raise ValueError(f"no shares of {global_batch} for {n} ranks within [{lo}, {hi}]")
    if any(not (s > 0 and math.isfinite(s)) for s in speeds):
        raise ValueError(f"speeds must be positive and finite, got {list(speeds)}")

    def total(t: float) -> float:  # nondecreasing in t: bisection
        return sum(min(hi, max(lo, (t - o) * s)) for s, o in zip(speeds, offsets))

    a, b = 0.0, max(offsets) + global_batch / min(speeds)
    for _ in range(200):
        mid = (a + b) / 2
        a, b = (mid, b) if total(mid) < global_batch else (a, mid)
    return [min(hi, max(lo, (b - o) * s)) for s, o in zip(speeds, offsets)]


def round_shares(target: Sequence[float], global_batch: int, *, lo: int = 1, hi: int | None = None) -> list[int]:
    """Largest-remainder rounding of ``target`` to integers in ``[lo, hi]`` summing to ``global_batch``
    (ties to the lower rank)."""
    n = len(target)
    hi = global_batch if hi is None else hi
    shares = [min(hi, max(lo, math.floor(t + 1e-9))) for t in target]
    rest = global_batch - sum(shares)
    order = sorted(range(n), key=lambda i: (-(target[i] - shares[i]), i))
    for i in order:  # largest remainder first
        if rest <= 0:
            break
        if shares[i] < hi:
            shares[i] += 1
            rest -= 1
    for i in reversed(order):  # only reachable through float round-off: take back
        if rest >= 0:
            break
        if shares[i] > lo:
            shares[i] -= 1
            rest += 1
    if sum(shares) != global_batch:
        raise ValueError(f"cannot round {list(target)} to {global_batch} within [{lo}, {hi}]")
    return shares


def proportional_shares(speeds: Sequence[float], global_batch: int, *, lo: int = 1, hi: int | None = None) -> list[int]:
    """Integer shares proportional to ``speeds``, each in ``[lo, hi]``, summing exactly to ``global_batch``."""
    return round_shares(proportional_targets(speeds, global_batch, lo=lo, hi=hi), global_batch, lo=lo, hi=hi)


def equal_shares(global_batch: int, world: int) -> list[int]:
    q, r = divmod(global_batch, world)
    return [q + 1] * r + [q] * (world - r)


def coefficient_of_variation(values: Sequence[float]) -> float:
    mean = sum(values) / len(values)
    return statistics.pstdev(values) / mean if mean > 0 else 0.0


# --------------------------------------------------------------------------- the policy


@dataclass
class BalanceDecision:
    """One rebalancing decision, as logged to the metrics."""

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
    refinement: bool = False   # made while refining after a move (no threshold needed), not on a trigger
    trigger: str = "threshold"  # what started it: "threshold" (CV), "gain" (predicted cut), "refinement"

    def as_dict(self) -> dict:
        return asdict(self)

    def as_metrics(self, prefix: str = "balance/") -> dict:
        """Flat record for a metric sink (JSONL)."""
        return {f"{prefix}{k}": v for k, v in self.as_dict().items()}


class BalancePolicy:
    """The balancer's arithmetic, for all ranks at once; no process group (unit-testable).

    Call :meth:`update` once per step with every rank's compute time of that step (forward+backward, which
    scales with its samples) and, optionally, its fixed time (data, optimizer: the same whatever its share;
    on a rank that shares its core with another process it is slow too). A rank's time is modelled as
    ``fixed + share / speed``; new shares equalize it.

    When to act: the CV of the per-rank step times above ``threshold`` (the founding document's rule), or
    a predicted cut of the step time of at least ``trigger_gain`` (the CV alone misses a 1.4x straggler
    between two ranks); after a move, refine while a move gains ``min_gain``.
    """

    def __init__(self, global_batch: int, world: int, *, window: int = 100, threshold: float = 0.2,
                 min_share: float = 0.0, max_share: float = 1.0, min_gain: float = 0.02, min_steps: int = 10,
                 micro_steps: int = 1, shares: Sequence[int] | None = None, trigger_gain: float = 0.15):
        check_balance_args(window=window, threshold=threshold, min_gain=min_gain, min_steps=min_steps)
        if world < 1 or global_batch < world * micro_steps:
            raise ConfigError(
                f"train.global_batch={global_batch} cannot give each of {world} data-parallel ranks "
                f"{micro_steps} micro-step(s) of at least one sample; use a global batch >= {world * micro_steps}"
            )
        self.global_batch, self.world = global_batch, world
        self.window, self.threshold, self.min_gain, self.trigger_gain = window, threshold, min_gain, trigger_gain
        self.min_steps = min(min_steps, window)
        self.micro_steps = micro_steps
        self.lo, self.hi = share_bounds(global_batch, world, min_share=min_share, max_share=max_share,
                                        min_samples=micro_steps)
        self.shares = list(shares) if shares is not None else equal_shares(global_batch, world)
        if len(self.shares) != world or sum(self.shares) != global_batch:
            raise ValueError(f"shares {self.shares} must be {world} counts summing to {global_batch}")
        self._buf = np.zeros((window, world))  # ring of the last `window` steps' compute times
        self._fixed = np.zeros((window, world))  # and their fixed (share-independent) times
        self._count = 0  # measurements under the current shares (capped at window)
        self._next = 0
        self.engaged = False  # refining: True from a move until a judgement finds no move worth making
        self._gain_streak = 0  # consecutive judgements below the CV threshold that found a move worth trigger_gain
        self._previous: list[int] | None = None  # the shares before the last move
        self.decisions: list[BalanceDecision] = []

    @property
    def measurements(self) -> int:
        """Steps measured under the current shares and kept (at most ``window``)."""
        return self._count

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

    def update(self, step: int, compute_times: Sequence[float],
               fixed_times: Sequence[float] | None = None) -> BalanceDecision | None:
        """Record one step's compute (and fixed) time per rank; return a decision when the shares change."""
        if len(compute_times) != self.world:
            raise ValueError(f"expected {self.world} compute times, got {len(compute_times)}")
        self._buf[self._next] = np.maximum(np.asarray(compute_times, dtype=np.float64), 1e-12)
        self._fixed[self._next] = 0.0 if fixed_times is None else np.maximum(np.asarray(fixed_times, float), 0.0)
        self._next = (self._next + 1) % self.window
        self._count = min(self._count + 1, self.window)
        if self._count < self.min_steps:
            return None
        cv = coefficient_of_variation([c + f for c, f in zip(self.medians(), self.medians(fixed=True))])
        # The trigger uses the whole window (robust to blips); the speeds its newer half (at least
        # min_steps), so a change that has just outweighed the older half is not averaged with it.
        newer = max(self.min_steps, self._count // 2)
        times, fixed = self.medians(newer), self.medians(newer, fixed=True)
        speeds = [s / t for s, t in zip(self.shares, times)]
        target = proportional_targets(speeds, self.global_batch, lo=self.lo, hi=self.hi, offsets=fixed)
        if all(abs(s - x) < 1 for s, x in zip(self.shares, target)):
            self.engaged = False  # the current shares are already a rounding of the target: settled
            return None
        new = round_shares(target, self.global_batch, lo=self.lo, hi=self.hi)
        if self.engaged and new == self._previous:
            self.engaged = False  # refining back to the shares just left: noise between neighbours
            return None
        per_sample = [t / s for s, t in zip(self.shares, times)]
        predicted = [f + n * p for f, n, p in zip(fixed, new, per_sample)]
        gain = 1.0 - max(predicted) / max(f + t for f, t in zip(fixed, times))
        trigger = "refinement" if self.engaged else ("threshold" if cv > self.threshold else "gain")
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
        decision = BalanceDecision(step=step, speeds=speeds, fixed_times=fixed, step_times=times,
                                   old_shares=list(self.shares), new_shares=new, imbalance=cv,
                                   predicted_imbalance=coefficient_of_variation(predicted), predicted_gain=gain,
                                   measurements=self._count, refinement=self.engaged, trigger=trigger)
        self._previous, self.shares = self.shares, new
        self._gain_streak = 0
        self._count = 0  # times under the old shares are not comparable
        self.engaged = True
        self.decisions.append(decision)
        return decision

    def _window_gain(self, new: list[int]) -> float:
        """Predicted cut of the step time from ``new`` shares, by the whole window's medians."""
        times, fixed = self.medians(), self.medians(fixed=True)
        predicted = [f + n * t / s for f, n, t, s in zip(fixed, new, times, self.shares)]
        return 1.0 - max(predicted) / max(f + t for f, t in zip(fixed, times))

    def state_dict(self) -> dict:
        return {"shares": list(self.shares), "global_batch": self.global_batch, "world": self.world}

    def load_state_dict(self, state: dict) -> None:
        if state.get("global_batch") != self.global_batch or state.get("world") != self.world:
            return  # a different layout: start again from equal shares and re-measure
        self.shares = list(state["shares"])
        self._count = 0
        self._previous, self.engaged = None, False


# --------------------------------------------------------------------------- validation


def check_balance_args(*, window: int, threshold: float, min_gain: float, min_steps: int) -> None:
    if not threshold > 0:
        raise ConfigError(
            f"parallelism.balance.threshold={threshold} must be > 0 (it is the coefficient of variation of the "
            "per-rank step times above which shares move); use e.g. 0.2"
        )
    if window < 2:
        raise ConfigError(
            f"parallelism.balance.window={window} must be >= 2 (a spread needs several measurements per rank); "
            "use e.g. 100"
        )
    if not 0 <= min_gain < 1:
        raise ConfigError(
            f"parallelism.balance.min_gain={min_gain} must be in [0, 1) (the smallest predicted cut of the step's "
            "compute time worth a move); use e.g. 0.02"
        )
    if min_steps < 1:
        raise ConfigError(f"parallelism.balance.min_steps={min_steps} must be >= 1; use e.g. 10")


def check_balance_config(cfg, world_size: int | None = None) -> None:
    """Cross-field checks of ``parallelism.balance`` on a resolved config (called by ``resolve``)."""
    b, p, t = cfg.parallelism.balance, cfg.parallelism, cfg.train
    if not b.enabled:
        return
    check_balance_args(window=b.window, threshold=b.threshold, min_gain=b.min_gain, min_steps=b.min_steps)
    dp = max(1, p.data) * p.data_shard
    if dp == 1 and (p.tensor > 1 or p.pipeline > 1 or (world_size or 1) > 1):
        raise ConfigError(
            f"parallelism.balance.enabled=true but there is one data-parallel rank (tensor={p.tensor}, "
            f"pipeline={p.pipeline}, data={p.data}, data_shard={p.data_shard}): the balancer moves samples between "
            "data-parallel ranks, so there is nothing to balance; set parallelism.balance.enabled=false or data > 1"
        )
    if p.pipeline > 1:
        raise ConfigError(
            f"parallelism.balance.enabled=true with parallelism.pipeline={p.pipeline}: uneven per-replica batches "
            "are not supported with pipeline schedules yet; set parallelism.balance.enabled=false or pipeline=1"
        )
    if dp == 1:
        return
    micro_steps = max(1, t.global_batch // max(1, t.micro_batch * dp))
    share_bounds(t.global_batch, dp, min_share=b.min_share, max_share=b.max_share, min_samples=micro_steps)


# --------------------------------------------------------------------------- measurement and exchange


class ComputeClock:
    """Times one rank's own compute in a step: from :meth:`start` to the last gradient accumulated.

    Under DDP the wait for the other ranks happens after the last gradient (when the reducer
    finishes its all-reduces), so it is not counted. On CPU the clock is the host clock. On
    CUDA it records events on the current stream (read at :meth:`stop`; the gradient kernels'
    completion, not their launch). Under FSDP2 the all-gathers inside forward wait for slower
    ranks, so this clock over-states a fast rank's compute there; pass your own measurement.
    """

    def __init__(self, model, device_type: str = "cpu"):
        import torch

        self.cuda = device_type == "cuda"
        self._torch = torch
        self._t0 = 0.0
        self._last: float | None = None
        self._ev0 = self._ev1 = None
        self._handles = [p.register_post_accumulate_grad_hook(self._ready)
                         for p in model.parameters() if p.requires_grad]

    def _ready(self, _param) -> None:
        self._last = time.perf_counter()
        if self.cuda:
            self._ev1.record()  # re-recorded: the last gradient's kernels are what it marks

    def start(self) -> None:
        self._last = None
        if self.cuda:
            self._ev0 = self._torch.cuda.Event(enable_timing=True)
            self._ev1 = self._torch.cuda.Event(enable_timing=True)
            self._ev0.record()
        self._t0 = time.perf_counter()

    def stop_later(self):
        """Like :meth:`stop`, without a host-device sync now: returns a function that reads the seconds
        later (once per log interval), for the straggler evidence of a run that is not balancing."""
        if self.cuda and self._last is not None:
            ev0, ev1 = self._ev0, self._ev1

            def read() -> float:
                ev1.synchronize()
                return ev0.elapsed_time(ev1) / 1e3

            return read
        value = self.stop()
        return lambda: value

    def stop(self) -> float:
        """Seconds of compute since :meth:`start` (to now if no gradient was accumulated)."""
        if self.cuda and self._last is not None:
            self._ev1.synchronize()  # host-device sync
            return self._ev0.elapsed_time(self._ev1) / 1e3
        end = self._last if self._last is not None else time.perf_counter()
        return end - self._t0

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []


class ThreadCpuClock:
    """A compute clock for FSDP2 on CPU: this thread's CPU seconds (collective waits left out)."""

    def start(self) -> None:
        self._t0 = time.thread_time()

    def stop(self) -> float:
        return time.thread_time() - self._t0

    def stop_later(self):
        value = self.stop()
        return lambda: value


class DynamicBalancer:
    """A data-parallel rank's handle on the shared :class:`BalancePolicy`.

    Per step: ``shares = bal.shares`` (for the sampler), ``bal.micro_batches()`` (this rank's
    micro-batch sizes), then ``decision = bal.step(step, compute_s)``. ``gather`` defaults to
    ``torch.distributed.all_gather`` over ``group``; tests may pass a function taking this rank's
    list of floats and returning every rank's list.
    """

    def __init__(self, global_batch: int, *, world: int | None = None, rank: int | None = None, group=None,
                 sync_every: int = 1, gather: Callable[[list[float]], list[list[float]]] | None = None,
                 device=None, **policy_kwargs):
        if world is None or rank is None:
            import torch.distributed as dist

            world = dist.get_world_size(group) if world is None else world
            rank = dist.get_rank(group) if rank is None else rank
        if sync_every < 1:
            raise ConfigError(f"parallelism.balance.sync_every={sync_every} must be >= 1; use e.g. 1 or 10")
        self.rank, self.world, self.group, self.device = rank, world, group, device
        self.sync_every = sync_every
        self.policy = BalancePolicy(global_batch, world, **policy_kwargs)
        self._gather = gather or self._all_gather
        self._pending: list[float] = []

    @classmethod
    def from_config(cls, balance_cfg, global_batch: int, *, micro_steps: int = 1, group=None, device=None,
                    **kwargs) -> "DynamicBalancer":
        b = balance_cfg
        return cls(global_batch, group=group, device=device, sync_every=b.sync_every, window=b.window,
                   threshold=b.threshold, min_share=b.min_share, max_share=b.max_share, min_gain=b.min_gain,
                   min_steps=b.min_steps, micro_steps=micro_steps, trigger_gain=b.trigger_gain, **kwargs)

    @property
    def shares(self) -> list[int]:
        return list(self.policy.shares)

    @property
    def local_share(self) -> int:
        return self.policy.shares[self.rank]

    @property
    def decisions(self) -> list[BalanceDecision]:
        return self.policy.decisions

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

    def step(self, step: int, compute_s: float, fixed_s: float = 0.0) -> BalanceDecision | None:
        """Record this rank's compute time of ``step`` (and its fixed time: data, optimizer); every
        ``sync_every`` steps exchange and decide.

        Collective: every rank of the group must call it at the same steps. Returns the decision
        when the shares change (apply them from the next step on), else None.
        """
        self._pending += [float(compute_s), float(fixed_s)]
        if len(self._pending) < 2 * self.sync_every:
            return None
        rows = self._gather(self._pending)
        self._pending = []
        n = len(rows[0]) // 2
        for j in range(n):
            # All buffered steps ran with the current shares; a decision mid-buffer makes the rest stale.
            decision = self.policy.update(step - n + 1 + j, [rows[r][2 * j] for r in range(self.world)],
                                          [rows[r][2 * j + 1] for r in range(self.world)])
            if decision is not None:
                return decision
        return None

    def state_dict(self) -> dict:
        return self.policy.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.policy.load_state_dict(state)
