"""80% prediction intervals of the planner's step time (no torch).

Every interval is empirical: for every source of the development set the model is fitted without it and
predicts it (leave-one-source-out), and the log ratios ``r = log(published / predicted)`` of those held-out
predictions set the interval.

**The shipped interval** (:data:`ACROSS`) carries the uncertainty of the **stack itself** and follows what
the predicted step is made of: :mod:`trainperf.planner.composition` (a between-source level ``tau`` plus
one relative uncertainty per term of the step, GEMM compute, memory-bound work, attention, communication
and bubbles, fitted by REML on the held-out errors). A query far from every development source (another
GPU generation, parallel degrees or a sequence length more than a factor of 4 from every development run:
:mod:`trainperf.planner.distance`) draws its level from a wider population than the development sources
span: its variance counts ``tau^2`` once more for each such respect, and the plan says so. That factor is a
rule, not a fit: the development set holds two generations, too few to measure how much a third differs.

**The single-width interval** (:class:`Spread` across sources, :func:`spread_from`) is the one issue 39
shipped, kept to be judged beside it (``python -m trainperf.planner.loso``'s ``interval_single``): the
held-out errors split into two variance components (a one-way random-effects model, the meta-analyst's
DerSimonian-Laird estimate): each source's **level** varies around the model's average bias ``mu`` with the
**between-source** variance ``tau^2``, and its rows scatter around its level (the **within-source**
deviations, each scaled by ``sqrt(n / (n - 1))``). A run of a source never seen is one level drawn from the
first and one deviation from the second: its predictive distribution is the within-source deviations (each
source weighing the square root of its rows) each spread by a normal of variance ``tau^2 + Var(mu)``;
``low`` / ``high`` are its 10th and 90th percentiles, their log bounds scaled by ``1 + k x`` the step's
non-compute share (``k`` fitted by the interval score), and far from the development set ``tau^2`` counts
once more per respect. One width for every step of the same non-compute share.

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

The shipped figures below are set by the data (``python -m trainperf.planner.loso`` prints them as
``interval`` and ``interval_calibrated``; ``tests/unit/test_planner_devset.py`` checks they match a fresh fit).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from trainperf.planner.composition import TermSpread, weighted_quantile

LEVEL = 0.8
QUANTILES = (0.1, 0.9)


@dataclass(frozen=True)
class Spread:
    low: float
    """10th percentile of log(published / predicted) for a run of a source never seen, for a step spent in compute."""
    high: float
    """90th percentile."""
    basis: str
    noncompute_scale: float = 0.0
    """How much wider the interval is per unit of the step's non-compute share (communication not hidden,
    pipeline bubbles, the optimizer): the log bounds scale by ``1 + noncompute_scale x share`` (the model's
    collectives, contention and bubbles are less certain than its GEMMs). FITTED with the bounds, by the
    interval score of the held-out rows (:func:`fit_noncompute_scale`); per-share error figures are in
    docs/benchmarks/planner.md."""
    far: tuple = ()
    """``(low, high)`` for a query far from every development source in 1, 2, 3 respects (the between-source
    variance counted 2, 3, 4 times); empty: no widening (the calibrated interval: the user's run sets the level)."""
    between_sd: float | None = None
    """``tau``: the spread of sources' levels (log), the between-source component."""
    within_sd: float | None = None
    """The pooled within-source standard deviation (log), for the record (the bounds use the deviations)."""
    center: float | None = None
    """``mu``: the model's average level across sources (log published / predicted)."""

    def _log_bounds(self, far: int = 0) -> tuple[float, float]:
        if far and self.far:
            return self.far[min(far, len(self.far)) - 1]
        return self.low, self.high

    def bounds(self, step_time_s: float, noncompute: float = 0.0, far: int = 0) -> tuple[float, float]:
        f = 1.0 + self.noncompute_scale * min(max(noncompute, 0.0), 1.0)
        lo, hi = self._log_bounds(far)
        return step_time_s * math.exp(lo * f), step_time_s * math.exp(hi * f)

    def bounds_for(self, est, far: int = 0) -> tuple[float, float]:
        """The interval of a planner :class:`~trainperf.planner.cost.Estimate` (``far``: respects in which the query is
        far from every development source)."""
        return self.bounds(est.step_time_s, noncompute_share(est), far)

    def relative_width(self, noncompute: float = 0.0, far: int = 0) -> float:
        """Width of the interval as a fraction of the estimate."""
        lo, hi = self.bounds(1.0, noncompute, far)
        return hi - lo

    @property
    def widens_far(self) -> bool:
        return bool(self.far)

    def width_for(self, est, far: int = 0) -> float:
        """Width of ``est``'s interval as a fraction of its step time."""
        return self.relative_width(noncompute_share(est), far)

    def made_of(self, est, far: int = 0) -> dict:
        """What sets the width of ``est``'s interval: the step's non-compute share."""
        return {"noncompute_share": round(noncompute_share(est), 4), "relative_width": round(self.width_for(est, far), 4)}

    def describe(self) -> str:
        """The plan's sentence for this interval."""
        return (f"{100 * (math.exp(self.low) - 1):+.0f}% / {100 * (math.exp(self.high) - 1):+.0f}% of an estimate spent "
                f"in compute, from {self.basis}"
                + (f" (sources' levels {100 * self.between_sd:.1f}% apart, sd, and their runs {100 * self.within_sd:.1f}% "
                   "around them)" if self.between_sd is not None and self.within_sd is not None else "")
                + (f"; wider by {self.noncompute_scale:g} x the share of the step in communication, bubbles and the "
                   "optimizer, where the model is less sure." if self.noncompute_scale else "."))

    def as_dict(self) -> dict:
        r = lambda x: None if x is None else round(x, 4)  # noqa: E731
        return {"level": LEVEL, "log_ratio_low": round(self.low, 4), "log_ratio_high": round(self.high, 4),
                "relative_low": round(math.exp(self.low) - 1, 4), "relative_high": round(math.exp(self.high) - 1, 4),
                "noncompute_scale": self.noncompute_scale, "basis": self.basis,
                "between_source_sd": r(self.between_sd), "within_source_sd": r(self.within_sd), "center": r(self.center),
                "far": [{"respects": i + 1, "log_ratio_low": round(lo, 4), "log_ratio_high": round(hi, 4)}
                        for i, (lo, hi) in enumerate(self.far)]}


def noncompute_share(est) -> float:
    """Share of a planner estimate's step not spent in compute (its ``time`` terms other than compute)."""
    if not est.step_time_s > 0:
        return 0.0
    return min(max(1.0 - est.time.get("compute", est.step_time_s) / est.step_time_s, 0.0), 1.0)


# FITTED by python -m trainperf.planner.loso (the "interval", "calibration_weight" and "interval_calibrated"
# blocks of its output; all sources).
ACROSS = TermSpread(center=0.0059, center_var=0.0133 ** 2, between_sd=0.0342,
                    term_sd={"compute": 0.0991, "memory": 0.1169, "attention": 0.0753, "communication": 0.1412},
                    q_low=-0.8307, q_high=1.0566,
                    basis="the leave-one-source-out errors of the development set, a between-source level and one "
                          "uncertainty per term of the step (trainperf.planner.composition)")
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


CALIBRATION_WEIGHT = 0.2
"""FITTED by python -m trainperf.planner.loso (``calibration_weight``): how far a calibration moves the
model toward the measured run (0: not at all, 1: matches it)."""
CALIBRATED = Spread(-0.0447, 0.0619, "pairs of held-out errors of the same source and model, one row calibrating "
                                       "(partially pooled by CALIBRATION_WEIGHT) as a measured run does, the other "
                                       "predicted",
                    noncompute_scale=1.0)


FAR_RESPECTS = 3
"""Generation, parallelism, sequence length (:mod:`trainperf.planner.distance`)."""


@dataclass(frozen=True)
class Components:
    """The random-effects split of held-out log ratios (module doc)."""

    center: float
    """``mu``: the sources' levels averaged with weights ``1 / (tau^2 + sigma^2 / n)``."""
    between: float
    """``tau^2``, DerSimonian-Laird (0 when the levels differ no more than their rows' scatter explains)."""
    within: float
    """``sigma^2``: the pooled within-source variance."""
    center_var: float
    """``Var(mu)``."""
    deviations: tuple[float, ...]
    """Each row's deviation from its source's level, scaled by ``sqrt(n / (n - 1))``."""
    weights: tuple[float, ...]
    """Each deviation's weight: ``1 / sqrt(n)`` (a source weighs the square root of its rows), normalized."""

    def quantile(self, q: float, extra_between: float = 0.0) -> float:
        """The q-quantile of ``mu + level + deviation``: the deviations, each spread by a normal of variance
        ``tau^2 x (1 + extra_between) + Var(mu)``."""
        sd = math.sqrt(self.between * (1.0 + extra_between) + self.center_var)
        if sd <= 0:
            return self.center + weighted_quantile(list(self.deviations), list(self.weights), q)

        def cdf(x: float) -> float:
            return sum(w * 0.5 * (1.0 + math.erf((x - self.center - e) / (sd * math.sqrt(2.0))))
                       for e, w in zip(self.deviations, self.weights))
        lo, hi = self.center - 1.0, self.center + 1.0
        for _ in range(48):
            mid = 0.5 * (lo + hi)
            lo, hi = (mid, hi) if cdf(mid) < q else (lo, mid)
        return 0.5 * (lo + hi)


def components(values_by_source: dict[str, list[float]]) -> Components:
    """Split per-source log ratios into the between- and within-source components (DerSimonian & Laird 1986:
    ``tau^2 = max(0, (Q - (k - 1)) / (W - sum w^2 / W))`` with ``w = n / sigma^2``)."""
    groups = {s: v for s, v in values_by_source.items() if v}
    if not groups:
        raise ValueError("no values")
    means = {s: sum(v) / len(v) for s, v in groups.items()}
    dof = sum(len(v) - 1 for v in groups.values())
    ss = sum((x - means[s]) ** 2 for s, v in groups.items() for x in v)
    within = ss / dof if dof > 0 else 0.0
    tau2 = 0.0
    if within <= 0 and len(groups) > 1:  # runs that agree exactly within each source: the levels' plain variance
        mean = sum(means.values()) / len(means)
        tau2 = sum((m - mean) ** 2 for m in means.values()) / (len(means) - 1)
    elif len(groups) > 1:
        w = {s: len(v) / within for s, v in groups.items()}
        W = sum(w.values())
        mw = sum(w[s] * means[s] for s in groups) / W
        Q = sum(w[s] * (means[s] - mw) ** 2 for s in groups)
        tau2 = max(0.0, (Q - (len(groups) - 1)) / (W - sum(x * x for x in w.values()) / W))
    ws = {s: 1.0 / (tau2 + within / len(v)) if tau2 + within / len(v) > 0 else 1.0 for s, v in groups.items()}
    center = sum(ws[s] * means[s] for s in groups) / sum(ws.values())
    center_var = 1.0 / sum(ws.values()) if tau2 + within > 0 else 0.0
    devs, wts = [], []
    for s, v in groups.items():
        n = len(v)
        if n < 2:
            continue  # a one-row source tells its level, not its scatter
        f = math.sqrt(n / (n - 1))
        devs += [(x - means[s]) * f for x in v]
        wts += [1.0 / math.sqrt(n)] * n
    if not devs:
        devs, wts = [0.0], [1.0]
    total = sum(wts)
    return Components(center, tau2, within, center_var, tuple(devs), tuple(w / total for w in wts))


def spread_from(residuals_by_source: dict[str, list[float]], *, within: bool = False, weight: float = 1.0,
                shares_by_source: dict[str, list[float]] | None = None, scale: float = 0.0,
                groups_by_source: dict[str, list] | None = None, basis: str = "", far: bool = True) -> Spread:
    """Spread from held-out log ratios per source (None entries: rows predicted not to fit, left out).
    Across sources (the default): the random-effects split (:func:`components`) and the 10th / 90th
    percentiles of a run of an unseen source, near the development sources and (``far``) for 1 to 3
    respects far from them. ``within``: of ``r_a - weight x r_b`` over ordered pairs of rows of the same
    source (``b`` calibrates, ``a`` is predicted; a source of one row has none), each source weighing 1, and of
    the same group when ``groups_by_source`` gives each row's (the model: a calibration plans the model that
    was measured). ``scale`` with ``shares_by_source`` (each row's non-compute share): of
    ``r / (1 + scale x share)``, the bounds of a step spent in compute."""
    values, weights = [], []
    scaled: dict[str, list[float]] = {}
    for source, rs in residuals_by_source.items():
        xs = shares_by_source[source] if scale and shares_by_source is not None else [0.0] * len(rs)
        gs = groups_by_source[source] if groups_by_source is not None else [None] * len(rs)
        kept = [(r, 1.0 + scale * x, g) for r, x, g in zip(rs, xs, gs) if r is not None]
        scaled[source] = [r / f for r, f, _ in kept]
        if within:  # the predicted row's own scale: the calibrating row's error enters through the weight
            pairs = [(a - weight * b) / fa for i, (a, fa, ga) in enumerate(kept) for j, (b, _, gb) in enumerate(kept)
                     if i != j and ga == gb]
            if not pairs:
                continue
            values += pairs
            weights += [1.0 / len(pairs)] * len(pairs)
    if within:
        lo, hi = (weighted_quantile(values, weights, q) for q in QUANTILES)
        return Spread(round(lo, 4), round(hi, 4), basis or "within-source", noncompute_scale=scale)
    comp = components(scaled)
    lo, hi = (comp.quantile(q) for q in QUANTILES)
    wide = tuple((round(comp.quantile(QUANTILES[0], k), 4), round(comp.quantile(QUANTILES[1], k), 4))
                 for k in range(1, FAR_RESPECTS + 1)) if far else ()
    return Spread(round(lo, 4), round(hi, 4), basis or "across sources", noncompute_scale=scale, far=wide,
                  between_sd=round(math.sqrt(comp.between), 4), within_sd=round(math.sqrt(comp.within), 4),
                  center=round(comp.center, 4))


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
            sp = spread_from(others, shares_by_source=shares_by_source, scale=k, far=False)
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
