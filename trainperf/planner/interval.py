"""80% prediction intervals of the planner's step time (no torch).

The interval is empirical: it is the spread of the model's **cross-validated** errors **across
sources**, not the scatter inside one table. For every source of the development set the model is
fitted without it and predicts it (leave-one-source-out); the log ratios ``log(published /
predicted)`` of those held-out predictions, each source weighted by the square root of its row
count, give the 10th and 90th percentiles ``low`` and ``high``. (A 78-row table tells more about the
spread than a 1-row one, but not 78 times more: its rows share one stack and one cluster, so they
are far from independent. Weighting each source equally let the small, well-fitted sources set the
width: 70% of the held-out runs inside; weighting each run equally lets the two MPT tables, 139 of
203 runs, set it.) A new
prediction ``t`` then carries ``[t * exp(low), t * exp(high)]``: it is as wrong as a source the
model has never seen usually is, which is what a user's own cluster and stack are.

After ``--measured`` / ``--calibrate`` the user's own run tells the stack's level, but with the
scatter of one run: rows of one source differ among themselves (other model sizes, sequences,
layouts) about as much as sources differ in level. So a calibration moves the prediction only part
of the way to the measurement (partial pooling): the calibrated model matches
``predicted^(1 - w) x measured^w`` for the measured layout, ``w`` = :data:`CALIBRATION_WEIGHT`. The
weight and the calibrated interval (:data:`CALIBRATED`) are set by the same held-out errors: for
every ordered pair of rows of a source that train the same model (a calibration plans the model
that was measured, in other layouts, sequences or cluster sizes), one row plays the measured run
and the other the layout being predicted, ``r_predicted - w x r_measured`` is what is left, each source weighted equally; ``w``
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
    """10th percentile of log(published / predicted) over held-out sources, for a step spent in compute."""
    high: float
    """90th percentile."""
    basis: str
    noncompute_scale: float = 0.0
    """How much wider the interval is per unit of the step's non-compute share (communication not hidden,
    pipeline bubbles, the optimizer): the log bounds scale by ``1 + noncompute_scale x share`` (the model's
    collectives, contention and bubbles are less certain than its GEMMs). FITTED with the bounds, by the
    interval score of the held-out rows (:func:`fit_noncompute_scale`); per-share error figures are in
    docs/benchmarks/planner.md."""

    def bounds(self, step_time_s: float, noncompute: float = 0.0) -> tuple[float, float]:
        f = 1.0 + self.noncompute_scale * min(max(noncompute, 0.0), 1.0)
        return step_time_s * math.exp(self.low * f), step_time_s * math.exp(self.high * f)

    def bounds_for(self, est) -> tuple[float, float]:
        """The interval of a planner :class:`~trainperf.planner.cost.Estimate`."""
        return self.bounds(est.step_time_s, noncompute_share(est))

    def relative_width(self, noncompute: float = 0.0) -> float:
        """Width of the interval as a fraction of the estimate."""
        lo, hi = self.bounds(1.0, noncompute)
        return hi - lo

    def as_dict(self) -> dict:
        return {"level": LEVEL, "log_ratio_low": round(self.low, 4), "log_ratio_high": round(self.high, 4),
                "relative_low": round(math.exp(self.low) - 1, 4), "relative_high": round(math.exp(self.high) - 1, 4),
                "noncompute_scale": self.noncompute_scale, "basis": self.basis}


def noncompute_share(est) -> float:
    """Share of a planner estimate's step not spent in compute (its ``time`` terms other than compute)."""
    if not est.step_time_s > 0:
        return 0.0
    return min(max(1.0 - est.time.get("compute", est.step_time_s) / est.step_time_s, 0.0), 1.0)


# FITTED by python -m trainperf.planner.loso (the "interval", "calibration_weight" and "interval_calibrated"
# blocks of its output; all sources).
ACROSS = Spread(-0.0547, 0.0762, "leave-one-source-out errors across the development set's sources, "
                                   "each source weighted by the square root of its rows (10th / 90th percentile)",
                noncompute_scale=2.0)
VALIDATED_PARTS = ("NVIDIA A100-SXM4-40GB", "NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3")
"""The parts (catalog ``name``) the development set's runs used: the intervals above are the model's
held-out error on these only (``tests/unit/test_gpu_generations.py`` checks it against the rows)."""


CHECKED_GENERATIONS = {"V100": "checked, never fitted, on 26 published V100 runs (BigScience's 2021 Megatron-DeepSpeed "
                                "runs on Jean Zay; python -m trainperf.planner.loso): layouts without tensor parallelism "
                                "fell inside this interval about as often as A100 / H100 runs do, but every run with "
                                "tensor parallelism (TP 2) was slower than its upper bound (its all-reduces ran far below "
                                "NVLink speed): with TP > 1 on a V100 the plan is optimistic"}
"""What the held-out generation check (:func:`trainperf.planner.loso.generation_check`) found per GPU family;
``tests/unit/test_gpu_generations.py`` recomputes the check and holds these words to it."""


def unvalidated_part(gpu) -> str | None:
    """What the interval does not cover on a part no development-set run used (None: one did)."""
    if gpu.name in VALIDATED_PARTS:
        return None
    checked = next((text for family, text in CHECKED_GENERATIONS.items() if family in gpu.name), None)
    return (f"no development-set run was on {gpu.key} ({gpu.name}): the 80% interval is the model's error "
            f"on A100 and H100 runs, not on this part, whose sustained GEMM fraction ({gpu.gemm_fraction:g}) and "
            + (f"kernels were {checked}; " if checked else "kernels the model has not been checked against; ")
            + "measure one step and pass --measured STEP_TIME_S (or --calibrate RUN_DIR)")


CALIBRATION_WEIGHT = 0.5
"""FITTED by python -m trainperf.planner.loso (``calibration_weight``): how far a calibration moves the
model toward the measured run (0: not at all, 1: matches it)."""
CALIBRATED = Spread(-0.0505, 0.0501, "pairs of held-out errors of the same source and model, one row calibrating "
                                       "(partially pooled by CALIBRATION_WEIGHT) as a measured run does, the other "
                                       "predicted",
                    noncompute_scale=2.0)


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
                shares_by_source: dict[str, list[float]] | None = None, scale: float = 0.0,
                groups_by_source: dict[str, list] | None = None, basis: str = "") -> Spread:
    """Spread from held-out log ratios per source (None entries: rows predicted not to fit, left out),
    each source weighing the square root of its rows (across) or 1 (``within``: its pairs share it).
    ``within``: of ``r_a - weight x r_b`` over ordered pairs of rows of the same source (``b`` calibrates,
    ``a`` is predicted; a source of one row has none), and of the same group when ``groups_by_source``
    gives each row's (the model: a calibration plans the model that was measured). ``scale`` with
    ``shares_by_source`` (each row's non-compute share): of ``r / (1 + scale x share)``, the bounds of a
    step spent in compute."""
    values, weights = [], []
    for source, rs in residuals_by_source.items():
        xs = shares_by_source[source] if scale and shares_by_source is not None else [0.0] * len(rs)
        gs = groups_by_source[source] if groups_by_source is not None else [None] * len(rs)
        kept = [(r, 1.0 + scale * x, g) for r, x, g in zip(rs, xs, gs) if r is not None]
        rs = [r / f for r, f, _ in kept]
        if within:  # the predicted row's own scale: the calibrating row's error enters through the weight
            pairs = [(a - weight * b) / fa for i, (a, fa, ga) in enumerate(kept) for j, (b, _, gb) in enumerate(kept)
                     if i != j and ga == gb]
            if not pairs:
                continue
            values += pairs
            weights += [1.0 / len(pairs)] * len(pairs)
            continue
        for r in rs:
            values.append(r)
            weights.append(1.0 / len(rs) ** 0.5)
    lo, hi = (weighted_quantile(values, weights, q) for q in QUANTILES)
    return Spread(round(lo, 4), round(hi, 4), basis or ("within-source" if within else "across sources"),
                  noncompute_scale=scale)


SCALE_GRID = tuple(i / 4 for i in range(17))  # 0 to 4


def interval_score(lo: float, hi: float, r: float, alpha: float = 1.0 - LEVEL) -> float:
    """Gneiting & Raftery's interval score of a central (1 - alpha) interval [lo, hi] for the outcome r:
    its width, plus 2 / alpha times how far r falls outside (lower is better; a proper scoring rule)."""
    return (hi - lo) + 2.0 / alpha * (max(0.0, lo - r) + max(0.0, r - hi))


def fit_noncompute_scale(residuals_by_source: dict[str, list[float]],
                         shares_by_source: dict[str, list[float]]) -> float:
    """The ``noncompute_scale`` whose intervals score best on held-out sources: for each source, the bounds
    from the other sources, its rows scored (in log); each source weighted equally."""
    def score(k: float) -> float:
        total, n = 0.0, 0
        for s, rs in residuals_by_source.items():
            rows = [(r, x) for r, x in zip(rs, shares_by_source[s]) if r is not None]
            if not rows:
                continue
            others = {t: v for t, v in residuals_by_source.items() if t != s}
            sp = spread_from(others, shares_by_source=shares_by_source, scale=k)
            total += sum(interval_score(sp.low * (1 + k * x), sp.high * (1 + k * x), r) for r, x in rows) / len(rows)
            n += 1
        return total / max(1, n)

    return min((score(k), k) for k in SCALE_GRID)[1]


def calibration_weight(residuals_by_source: dict[str, list[float]],
                       shares_by_source: dict[str, list[float]] | None = None, scale: float = 0.0,
                       groups_by_source: dict[str, list] | None = None) -> float:
    """The partial-pooling weight (0 to 1, steps of 0.05) whose calibrated 80% spread is narrowest."""
    grid = [i / 20 for i in range(21)]
    widths = [(spread_from(residuals_by_source, within=True, weight=w, shares_by_source=shares_by_source,
                           scale=scale, groups_by_source=groups_by_source).relative_width(), w) for w in grid]
    return min(widths)[1]


def shrink_cap(spread: Spread, weight: float) -> float:
    """The most (in log) a calibration holds back of a measured deviation, derived from the fitted
    partial-pooling ``weight`` and calibrated ``spread`` (nothing more is fitted). The pooling reads the
    measured deviation ``b`` as the cluster's own level ``L`` plus one run's noise: with ``a`` another run of
    the same model, ``a - w b`` has the calibrated spread's variance ``sigma^2 (1 + w)`` at the optimal
    ``w = tau^2 / (tau^2 + sigma^2)``, which gives the noise ``sigma`` and the level's spread ``tau``. A
    Gaussian level would shrink every deviation by ``1 - w``, however large; levels have heavy tails (a
    V100's TP all-reduces were 30% off): under a Laplace level of the same variance the estimate shrinks a
    deviation by at most ``sigma^2 / beta`` (``beta = tau / sqrt 2``, the soft threshold), and that is
    the cap: a run 30% off moves the plan nearly 30%, one 3% off moves it ``w`` of the way."""
    if not 0.0 < weight < 1.0:
        return 0.0 if weight >= 1.0 else float("inf")
    sd = (spread.high - spread.low) / (2 * 1.2815515655446004)   # the 80% central interval of a normal
    sigma2 = sd * sd / (1.0 + weight)
    tau = math.sqrt(sigma2 * weight / (1.0 - weight))
    return math.sqrt(2.0) * sigma2 / tau


def shrunk_target(predicted: float, measured: float, weight: float, cap: float | None = None) -> float:
    """What a calibration matches: the prediction moved ``weight`` of the way (in log) to the measurement,
    holding back at most ``cap`` (default: :func:`shrink_cap` of the shipped calibrated spread)."""
    if cap is None:
        cap = shrink_cap(CALIBRATED, weight)
    b = math.log(measured / predicted)
    held = min(max((1.0 - weight) * b, -cap), cap)
    return predicted * math.exp(b - held)


def log_ratio(published_s: float, predicted_s: float) -> float:
    return math.log(published_s / predicted_s)
