"""The balancer's arithmetic: exact gradients with uneven shares, shares from speeds, and the checks of its settings.

No process group and no torch: :mod:`trainperf.distributed.balance` (the policy and the exchange) builds on it
and re-exports every name.
"""

from __future__ import annotations

import math
import statistics
from typing import Sequence

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
