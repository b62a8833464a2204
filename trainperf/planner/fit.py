"""Fit the planner's FITTED constants on the development set (no torch). ``python -m
trainperf.planner.loso [--data DIR] [--json] [--plot PNG] [--fast]`` (or ``trainperf plan
--devset-report``) cross-validates them with intervals (:mod:`trainperf.planner.loso`, which imports
this module: the command lives there, so that the two do not import each other).

Objective: half the mean over sources of each source's mean absolute error of the step time (so
that a 70-row table does not drown an 8-row one), half the pooled mean absolute error; a row
predicted not to fit counts as 100% error.
Minimizer: Nelder-Mead on the logits of the constants (each kept inside (0, 1)), from the
defaults. Leave-one-source-out (LOSO): for each source, fit on the others and predict it.
Baseline: one constant efficiency E, step time = model FLOPs / (GPUs x dense peak x E), fitted
the same way (E minimizing the same objective), the MFU-like model the issue compares against.
"""

from __future__ import annotations

import math
from dataclasses import replace

from trainperf.planner import devset
from trainperf.planner.constants import DEFAULTS, Constants

FITTED = ("gemm_memory_weight", "attention_efficiency", "comm_contention")
UNBOUNDED = ("gemm_memory_weight",)  # positive, searched on a log scale; the others are fractions in (0, 1)


def _logit(x: float) -> float:
    x = min(max(x, 1e-4), 1 - 1e-4)
    return math.log(x / (1 - x))


def _sigmoid(z: float) -> float:
    return 1 / (1 + math.exp(-z))


def nelder_mead(f, x0: list[float], step: float = 0.5, iters: int = 300, tol: float = 1e-7) -> list[float]:
    """Minimize f from x0 (plain Nelder-Mead, standard coefficients)."""
    n = len(x0)
    pts = [list(x0)] + [[x0[j] + (step if j == i else 0.0) for j in range(n)] for i in range(n)]
    vals = [f(p) for p in pts]
    for _ in range(iters):
        order = sorted(range(n + 1), key=vals.__getitem__)
        pts, vals = [pts[i] for i in order], [vals[i] for i in order]
        if abs(vals[-1] - vals[0]) < tol:
            break
        cen = [sum(p[j] for p in pts[:-1]) / n for j in range(n)]
        refl = [cen[j] + (cen[j] - pts[-1][j]) for j in range(n)]
        fr = f(refl)
        if fr < vals[0]:
            exp = [cen[j] + 2 * (cen[j] - pts[-1][j]) for j in range(n)]
            fe = f(exp)
            pts[-1], vals[-1] = (exp, fe) if fe < fr else (refl, fr)
        elif fr < vals[-2]:
            pts[-1], vals[-1] = refl, fr
        else:
            con = [cen[j] + 0.5 * (pts[-1][j] - cen[j]) for j in range(n)]
            fc = f(con)
            if fc < vals[-1]:
                pts[-1], vals[-1] = con, fc
            else:
                for i in range(1, n + 1):
                    pts[i] = [pts[0][j] + 0.5 * (pts[i][j] - pts[0][j]) for j in range(n)]
                    vals[i] = f(pts[i])
    return pts[min(range(n + 1), key=vals.__getitem__)]


def _objective(errs_by_source: dict[str, list]) -> float:
    """Half the mean of the per-source mean absolute errors, half the pooled one."""
    per = [sum(1.0 if e is None else abs(e) for e in errs) / len(errs) for errs in errs_by_source.values() if errs]
    flat = [1.0 if e is None else abs(e) for errs in errs_by_source.values() for e in errs]
    return 0.5 * sum(per) / len(per) + 0.5 * sum(flat) / len(flat)


def _by_source(rows, errs) -> dict[str, list]:
    out: dict[str, list] = {}
    for r, e in zip(rows, errs):
        out.setdefault(r.source, []).append(e)
    return out


def _to(k: str, z: float) -> float:
    return math.exp(z) if k in UNBOUNDED else _sigmoid(z)


def _from(k: str, x: float) -> float:
    return math.log(max(x, 1e-6)) if k in UNBOUNDED else _logit(x)


def fit_constants(rows, base: Constants = DEFAULTS) -> Constants:
    def f(z):
        c = replace(base, **{k: _to(k, v) for k, v in zip(FITTED, z)})
        return _objective(_by_source(rows, devset.errors(rows, c)))

    z = nelder_mead(f, [_from(k, getattr(base, k)) for k in FITTED])
    return replace(base, **{k: round(_to(k, v), 4) for k, v in zip(FITTED, z)})


# ---------------------------------------------------------------------------------- baseline
def baseline_errors(rows, efficiency: float) -> list[float]:
    out = []
    for r in rows:
        flops = r.model.model_flops_per_token() * r.model.seq * r.global_batch
        pred = flops / (r.gpus * r.spec().half_tflops * 1e12 * efficiency)
        out.append(pred / r.published_s - 1)
    return out


def fit_baseline(rows) -> float:
    best = nelder_mead(lambda z: _objective(_by_source(rows, baseline_errors(rows, _sigmoid(z[0])))), [0.0], 1.0)
    return round(_sigmoid(best[0]), 4)
