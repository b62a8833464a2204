"""80% prediction intervals of the planner's step time (no torch).

The interval is empirical: it is the spread of the model's **cross-validated** errors **across
sources**, not the scatter inside one table. For every source of the development set the model is
fitted without it and predicts it (leave-one-source-out); the log ratios ``log(published /
predicted)`` of those held-out predictions, each source weighted equally (so that a 70-row table
counts as much as a 4-row one), give the 10th and 90th percentiles ``low`` and ``high``. A new
prediction ``t`` then carries ``[t * exp(low), t * exp(high)]``: it is as wrong as a source the
model has never seen usually is, which is what a user's own cluster and stack are.

After ``--measured`` / ``--calibrate`` the user's own run tells the stack's level, but with the
scatter of one run: rows of one source differ among themselves (other model sizes, sequences,
layouts) about as much as sources differ in level. So a calibration moves the prediction only part
of the way to the measurement (partial pooling): the calibrated model matches
``predicted^(1 - w) x measured^w`` for the measured layout, ``w`` = :data:`CALIBRATION_WEIGHT`. The
weight and the calibrated interval (:data:`CALIBRATED`) are set by the same held-out errors: for
every ordered pair of rows of a source, one row plays the measured run and the other the layout
being predicted, ``r_predicted - w x r_measured`` is what is left, each source weighted equally; ``w``
is the weight whose 80% spread of those is narrowest (:func:`calibration_weight`). That interval
carries the calibration run's own scatter, and is narrower than the one across sources. (Matching
the measurement exactly, ``w = 1``, is wider on the development set than not calibrating at all.)

The shipped percentiles below are set by the data (``python -m trainperf.planner.loso`` prints
them as ``interval``; ``tests/unit/test_planner_interval.py`` checks they match a fresh fit).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

LEVEL = 0.8
QUANTILES = (0.1, 0.9)


@dataclass(frozen=True)
class Spread:
    low: float
    """10th percentile of log(published / predicted) over held-out sources."""
    high: float
    """90th percentile."""
    basis: str

    def bounds(self, step_time_s: float) -> tuple[float, float]:
        return step_time_s * math.exp(self.low), step_time_s * math.exp(self.high)

    def relative_width(self) -> float:
        """Width of the interval as a fraction of the estimate."""
        return math.exp(self.high) - math.exp(self.low)

    def as_dict(self) -> dict:
        return {"level": LEVEL, "log_ratio_low": round(self.low, 4), "log_ratio_high": round(self.high, 4),
                "relative_low": round(math.exp(self.low) - 1, 4), "relative_high": round(math.exp(self.high) - 1, 4),
                "basis": self.basis}


# FITTED by python -m trainperf.planner.loso (the "interval" block of its output; all sources).
ACROSS = Spread(-0.0969, 0.1286, "leave-one-source-out errors across the development set's sources, "
                                   "each source weighted equally (10th / 90th percentile)")
CALIBRATION_WEIGHT = 0.45
"""FITTED by python -m trainperf.planner.loso (``calibration_weight``): how far a calibration moves the
model toward the measured run (0: not at all, 1: matches it)."""
CALIBRATED = Spread(-0.0944, 0.1128, "pairs of held-out errors of the same source, one row calibrating (partially "
                                       "pooled by CALIBRATION_WEIGHT) as a measured run does, the other predicted")


def weighted_quantile(values: list[float], weights: list[float], q: float) -> float:
    """The q-quantile of values with weights (linear between the weighted mid-points)."""
    pairs = sorted(zip(values, weights))
    total = sum(w for _, w in pairs)
    if not pairs or total <= 0:
        raise ValueError("no values")
    cum, mids = 0.0, []
    for v, w in pairs:
        mids.append(((cum + w / 2) / total, v))
        cum += w
    if q <= mids[0][0]:
        return mids[0][1]
    if q >= mids[-1][0]:
        return mids[-1][1]
    for (p0, v0), (p1, v1) in zip(mids, mids[1:]):
        if p0 <= q <= p1:
            return v0 + (v1 - v0) * (q - p0) / (p1 - p0) if p1 > p0 else v1
    return mids[-1][1]


def spread_from(residuals_by_source: dict[str, list[float]], *, within: bool = False, weight: float = 1.0,
                basis: str = "") -> Spread:
    """Spread from held-out log ratios per source (None entries: rows predicted not to fit, left out).
    ``within``: of ``r_a - weight x r_b`` over ordered pairs of rows of the same source (``b`` calibrates,
    ``a`` is predicted; a source of one row has none)."""
    values, weights = [], []
    for rs in residuals_by_source.values():
        rs = [r for r in rs if r is not None]
        if within:
            pairs = [a - weight * b for i, a in enumerate(rs) for j, b in enumerate(rs) if i != j]
            if not pairs:
                continue
            values += pairs
            weights += [1.0 / len(pairs)] * len(pairs)
            continue
        for r in rs:
            values.append(r)
            weights.append(1.0 / len(rs))
    lo, hi = (weighted_quantile(values, weights, q) for q in QUANTILES)
    return Spread(round(lo, 4), round(hi, 4), basis or ("within-source" if within else "across sources"))


def calibration_weight(residuals_by_source: dict[str, list[float]]) -> float:
    """The partial-pooling weight (0 to 1, steps of 0.05) whose calibrated 80% spread is narrowest."""
    grid = [i / 20 for i in range(21)]
    widths = [(spread_from(residuals_by_source, within=True, weight=w).relative_width(), w) for w in grid]
    return min(widths)[1]


def shrunk_target(predicted: float, measured: float, weight: float) -> float:
    """What a calibration matches: the prediction moved ``weight`` of the way (in log) to the measurement."""
    return predicted ** (1.0 - weight) * measured ** weight


def log_ratio(published_s: float, predicted_s: float) -> float:
    return math.log(published_s / predicted_s)
