"""The 80% interval whose width follows what the predicted step is made of (no torch).

The model times every part of a step (:attr:`~trainperf.planner.cost.Estimate.composition`). Its error on
a part depends on what the part is: GEMM FLOPs at the published GEMM ceiling, memory-bound work and the
GEMMs' shape losses, the attention core, or communication and pipeline bubbles. The interval therefore
groups the step's time into four **terms** (:data:`TERMS`). ``f_k(q)`` is term k's share of the predicted
step of query q. The log ratio ``r = log(published / predicted)`` of a run of a source never seen is
modelled as

    r = mu + level + e,   level ~ N(0, tau^2),   e ~ sigma(q) x t,
    sigma(q)^2 = sum_k (s_k f_k(q))^2,

with:

* ``mu``: the model's average bias across sources;
* ``tau``: the **between-source** spread. It is a source's level: its stack, cluster and how it reports.
  A user's own stack is one more level;
* ``s_k``: the relative uncertainty of term k's time. Term errors are taken as independent, so a step made
  of several terms carries the root-sum-square of their parts;
* ``t``: a standardized deviation.

The interval is ``mu + [q_10, q_90] x sqrt(tau^2 (1 + far) + Var(mu) + sigma(q)^2)``. ``q_10`` and ``q_90``
are the 10th and 90th percentiles of the held-out deviations, each divided by its own predicted sd
(studentized). They come from the data, not from a normal: the deviations have heavier tails and are
skewed. ``far`` counts the respects in which the query is far from every development source
(:mod:`trainperf.planner.distance`). Each such respect counts ``tau^2`` once more, as the single-width
interval did.

**Estimation** (:func:`fit`). ``mu``, ``tau`` and ``s_k`` are fitted by restricted maximum likelihood (REML)
of that random-effects model on the leave-one-source-out log ratios of the development sources:

* each source's rows share one level, so their covariance is ``diag(sigma_i^2) + tau^2``;
* ``mu`` is the generalized least-squares mean; REML corrects for it being estimated.

A term that few development rows exercise (a bubble of half the step, say) is weakly determined. Its
``s_k`` would collapse to 0 when the sources that exercise it are held out. So each ``log s_k`` has a
normal prior around a common ``log s`` with sd :data:`PRIOR_SD` = 1 (a term's uncertainty within a
factor e of the others' unless the data say otherwise). That is a rule, not a fit: it is the MAP
estimate. Rows each weigh 1 in the likelihood. In the percentiles a source weighs the square root of its
rows, as in the single-width interval.

``python -m trainperf.planner.loso`` fits every fold's interval on the other sources only (nested: each of
their errors from a fit without the held-out source). That is the held-out coverage in
docs/benchmarks/planner.md. The shipped :data:`trainperf.planner.interval.ACROSS` is the fit on every
source.

**Why these four terms.** The model's FITTED constants and published ceilings act on them separately:

* ``stack_efficiency`` and the MAMF ceiling act on GEMM FLOPs;
* ``gemm_memory_weight`` acts on the GEMMs' memory term, and HBM bandwidth on the elementwise work;
* ``attention_efficiency`` acts on the attention core;
* ``comm_contention``, NCCL's figures and the schedule act on communication and bubbles.

A finer split (seven terms) and coarser ones (three, two) were measured too, each with and without the prior
and with the parts added linearly (``python -m trainperf.planner.interval_variants``). docs/benchmarks/planner.md
lists them with their held-out interval scores. The form was chosen by that score (a proper scoring rule), not
by issue 39's per-source coverage, which no form meets (the same page says why). These four, in quadrature, with
the prior, scored best, by a margin smaller than the differences between sources.

**What the fit says** (all sources, 7 Dec):

* per unit of share, GEMM compute carries 9.9%, more than attention's 7.5%. The premise that a step of large
  GEMMs is the best predicted does not hold on the development set: its large misses are GEMM-dominated steps
  (MPT's 13B-70B runs);
* in quadrature, a step spread over several terms is narrower than one dominated by one term. The linear form
  has no such effect, and scored a little worse;
* a per-term uncertainty learned on the development stacks does not carry over to a stack whose parts run
  differently. Held out, torchtitan's context-parallel attention and 405B pipelines fall outside: 11 of 18 runs
  inside, 15 with the single width. The far-from-development widening (``far``) is the only guard there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from trainperf.planner.cost import COMPOSITION

TERMS = {
    "compute": ("GEMM FLOPs at the published GEMM ceiling, and the recomputed forward", ("gemm", "recompute")),
    "memory": ("memory-bound work: the GEMMs' shape losses (waves, memory roofline, launches, FP8 casts), "
               "elementwise ops, the optimizer", ("gemm_shape", "elementwise", "optimizer")),
    "attention": ("the attention core", ("attention",)),
    "communication": ("exposed communication and pipeline bubbles",
                      ("tp_comm", "cp_comm", "fsdp_comm", "dp_comm", "pp_p2p", "pp_bubble")),
}
"""The interval's terms: a description and the :data:`~trainperf.planner.cost.COMPOSITION` keys each is made of."""
assert sorted(k for _, keys in TERMS.values() for k in keys) == sorted(COMPOSITION)

PRIOR_SD = 1.0
"""Sd of each term's ``log s_k`` around the common ``log s`` (module doc): a rule, not fitted."""
QUANTILES = (0.1, 0.9)


def shares(est, terms: dict = TERMS) -> dict[str, float]:
    """Each term's share of an estimate's step (summing to 1)."""
    return grouped(est.composition, terms)


def grouped(composition: dict, terms: dict = TERMS) -> dict[str, float]:
    """Each term's share of a step given by its :data:`~trainperf.planner.cost.COMPOSITION` (seconds or shares)."""
    total = sum(composition.values())
    if not total > 0:
        return {k: float(i == 0) for i, k in enumerate(terms)}
    return {k: sum(composition.get(x, 0.0) for x in keys) / total for k, (_, keys) in terms.items()}


@dataclass(frozen=True)
class TermSpread:
    """An 80% interval whose width follows the step's composition (module doc); all figures in log ratio."""

    center: float
    """``mu``: the model's average level across sources (log published / predicted)."""
    center_var: float
    """``Var(mu)``."""
    between_sd: float
    """``tau``: the spread of sources' levels, the between-source component."""
    term_sd: dict
    """``s_k`` per term of :data:`TERMS`: term k's relative uncertainty."""
    q_low: float
    """10th percentile of the studentized held-out deviations."""
    q_high: float
    """90th percentile."""
    basis: str = ""
    combine: str = "quadrature"
    """How the terms' parts add: ``quadrature`` (independent errors, the shipped interval) or ``linear`` (one error
    shared by every term of a step, the share-weighted mean of their uncertainties: a variant measured beside it)."""

    def _parts(self, share: dict) -> dict:
        return {k: s * share.get(k, 0.0) for k, s in self.term_sd.items()}

    def _within(self, share: dict) -> float:
        parts = self._parts(share).values()
        return sum(parts) ** 2 if self.combine == "linear" else sum(x * x for x in parts)

    def sd(self, share: dict, far: int = 0) -> float:
        return math.sqrt(self.between_sd ** 2 * (1 + far) + self.center_var + self._within(share))

    def log_bounds(self, share: dict, far: int = 0) -> tuple[float, float]:
        s = self.sd(share, far)
        return self.center + self.q_low * s, self.center + self.q_high * s

    def bounds_for(self, est, far: int = 0) -> tuple[float, float]:
        """The interval (s) of a planner estimate; ``far``: respects in which the query is far from every
        development source."""
        lo, hi = self.log_bounds(shares(est), far)
        return est.step_time_s * math.exp(lo), est.step_time_s * math.exp(hi)

    def relative_width(self, share: dict | None = None, far: int = 0) -> float:
        """Width as a fraction of the estimate (``share`` None: a step all of one term, the narrowest's)."""
        if share is None:
            return min(self.relative_width({k: 1.0}, far) for k in self.term_sd)
        lo, hi = self.log_bounds(share, far)
        return math.exp(hi) - math.exp(lo)

    def made_of(self, est, far: int = 0) -> dict:
        """What the interval of ``est`` is made of: each term's share of the step and of the interval's variance."""
        sh = shares(est, {k: TERMS[k] for k in self.term_sd})
        var = self.sd(sh, far) ** 2
        largest = max(sh, key=sh.get)
        parts = self._parts(sh)
        within = self._within(sh)
        return {"largest_term": largest, "largest_share": round(sh[largest], 4),
                "shares": {k: round(v, 4) for k, v in sh.items()},
                "variance_shares": {"between_sources": round(self.between_sd ** 2 * (1 + far) / var, 4),
                                    "mean_bias": round(self.center_var / var, 4),
                                    **{k: round(within * v / max(sum(parts.values()), 1e-300) / var, 4)
                                       if self.combine == "linear" else round(v * v / var, 4) for k, v in parts.items()}},
                "relative_width": round(self.relative_width(sh, far), 4)}

    widens_far = True

    def width_for(self, est, far: int = 0) -> float:
        """Width of ``est``'s interval as a fraction of its step time."""
        return self.relative_width(shares(est), far)

    def describe(self) -> str:
        """The plan's sentence for this interval."""
        terms = ", ".join(f"{k} {100 * v:.1f}%" for k, v in self.term_sd.items())
        return (f"its width follows what the step is made of, from {self.basis}: sources' levels "
                f"{100 * self.between_sd:.1f}% apart (sd), and per term a relative uncertainty ({terms}) times the "
                "term's share of the step, the terms' parts added in quadrature.")

    def as_dict(self) -> dict:
        return {"level": round(QUANTILES[1] - QUANTILES[0], 2), "kind": "composition", "basis": self.basis,
                "center": round(self.center, 4), "center_sd": round(math.sqrt(self.center_var), 4),
                "between_source_sd": round(self.between_sd, 4),
                "term_sd": {k: round(v, 4) for k, v in self.term_sd.items()},
                "terms": {k: {"what": what, "made_of": list(keys)} for k, (what, keys) in TERMS.items()
                          if k in self.term_sd}, "combine": self.combine,
                "studentized_quantiles": [round(self.q_low, 4), round(self.q_high, 4)], "prior_sd": PRIOR_SD,
                "far": [{"respects": n, "between_source_variance_times": n + 1} for n in (1, 2, 3)]}


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


def _rows(residuals: dict, shares_: dict, keys: tuple) -> dict[str, list[tuple[float, tuple]]]:
    out = {}
    for s, rs in residuals.items():
        kept = [(r, tuple(x[k] for k in keys)) for r, x in zip(rs, shares_[s]) if r is not None]
        if kept:
            out[s] = kept
    return out


def _reml(z: list[float], data: dict, nk: int, prior_sd: float | None, linear: bool) -> tuple[float, float, float]:
    """Minus the restricted log likelihood (plus the prior) at ``z`` = (log tau, log s_k..., [log s]); and mu, Var(mu).
    Per source, covariance ``diag(sigma_i^2) + tau^2`` (inverted by Sherman-Morrison)."""
    tau2 = math.exp(2 * z[0])
    sk = [math.exp(x) for x in z[1:1 + nk]]
    parts, num, den = [], 0.0, 0.0
    for rows in data.values():
        if linear:
            w = [1.0 / max(sum(a * f for a, f in zip(sk, fs)) ** 2, 1e-12) for _, fs in rows]
        else:
            w = [1.0 / max(sum((a * f) ** 2 for a, f in zip(sk, fs)), 1e-12) for _, fs in rows]
        W = sum(w)
        g = 1.0 / (1.0 + tau2 * W)
        den += W * g
        num += sum(wi * r for wi, (r, _) in zip(w, rows)) * g
        parts.append((w, g, rows))
    mu = num / den
    nll = 0.5 * math.log(den)
    for w, g, rows in parts:
        d = [r - mu for r, _ in rows]
        sw = sum(wi * di for wi, di in zip(w, d))
        nll += 0.5 * (sum(wi * di * di for wi, di in zip(w, d)) - tau2 * sw * sw * g
                      - sum(math.log(wi) for wi in w) - math.log(g))
    if prior_sd:
        nll += 0.5 * sum((x - z[-1]) ** 2 for x in z[1:1 + nk]) / prior_sd ** 2
    return nll, mu, 1.0 / den


def fit(residuals_by_source: dict[str, list], shares_by_source: dict[str, list[dict]], basis: str = "", *,
        prior_sd: float | None = PRIOR_SD, combine: str = "quadrature") -> TermSpread:
    """The interval from held-out log ratios per source (None entries: rows predicted not to fit, left out) and each
    row's term shares (:func:`shares`; the terms are the keys of those dicts): REML with the prior on the terms
    (``prior_sd`` None: none), then the studentized percentiles (module doc). Deterministic: Nelder-Mead from two
    fixed starts. ``combine``: :attr:`TermSpread.combine`."""
    from trainperf.planner.fit import nelder_mead

    keys = next((tuple(x) for xs in shares_by_source.values() for x in xs), ())
    data = _rows(residuals_by_source, shares_by_source, keys)
    if not data or not keys:
        raise ValueError("no held-out errors to fit the interval on")
    nk, linear = len(keys), combine == "linear"
    f = lambda z: _reml(z, data, nk, prior_sd, linear)[0]  # noqa: E731
    best = None
    for start in (-3.5, -2.5):
        z = nelder_mead(f, [start] * (nk + 1 + bool(prior_sd)), step=0.7, iters=3000, tol=1e-10)
        z = nelder_mead(f, z, step=0.2, iters=3000, tol=1e-12)
        if best is None or f(z) < f(best):
            best = z
    _, mu, var_mu = _reml(best, data, nk, prior_sd, linear)
    spread = TermSpread(mu, var_mu, math.exp(best[0]), {k: math.exp(x) for k, x in zip(keys, best[1:1 + nk])},
                        0.0, 0.0, basis, combine)
    values, weights = [], []
    for rows in data.values():
        for r, fs in rows:
            values.append((r - mu) / spread.sd(dict(zip(keys, fs))))
            weights.append(1.0 / math.sqrt(len(rows)))
    q_lo, q_hi = (weighted_quantile(values, weights, q) for q in QUANTILES)
    return TermSpread(mu, var_mu, spread.between_sd, spread.term_sd, q_lo, q_hi,
                      basis or "the leave-one-source-out errors of the development set", combine)
