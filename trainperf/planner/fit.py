"""Fit the planner's FITTED constants on the development set and cross-validate them:
``python -m trainperf.planner.fit [--data DIR] [--json] [--plot PNG]`` (no torch; the plot needs
matplotlib).

Objective: half the mean over sources of each source's mean absolute error of the step time (so
that a 70-row table does not drown an 8-row one), half the pooled mean absolute error; a row
predicted not to fit counts as 100% error.
Minimizer: Nelder-Mead on the logits of the constants (each kept inside (0, 1)), from the
defaults. Leave-one-source-out (LOSO): for each source, fit on the others and predict it.
Baseline: one constant efficiency E, step time = model FLOPs / (GPUs x dense peak x E), fitted
the same way (E minimizing the same objective), the MFU-like model the issue compares against.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import replace

from trainperf.hardware.catalog import get_gpu
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
        pred = flops / (r.gpus * get_gpu(r.gpu).peak_tflops("bf16") * 1e12 * efficiency)
        out.append(pred / r.published_s - 1)
    return out


def fit_baseline(rows) -> float:
    best = nelder_mead(lambda z: _objective(_by_source(rows, baseline_errors(rows, _sigmoid(z[0])))), [0.0], 1.0)
    return round(_sigmoid(best[0]), 4)


# ---------------------------------------------------------------------------------- LOSO
def loso(rows, base: Constants = DEFAULTS) -> dict:
    """Leave-one-source-out for the model and the constant baseline; plus the fit on all rows."""
    sources = [s for s in devset.SOURCES if any(r.source == s for r in rows)]
    per_row, folds = [], {}
    for s in sources:
        train = [r for r in rows if r.source != s]
        test = [r for r in rows if r.source == s]
        c = fit_constants(train, base)
        e_base = fit_baseline(train)
        errs = devset.errors(test, c)
        berrs = baseline_errors(test, e_base)
        folds[s] = {"constants": {k: getattr(c, k) for k in FITTED}, "baseline_efficiency": e_base}
        for r, e, be in zip(test, errs, berrs):
            est = devset.predict(r, c)
            per_row.append({
                "source": s, "row": r.label, "published_s": r.published_s, "approximate": r.approximate,
                "predicted_s": None if est is None else round(est.step_time_s, 4),
                "layout": None if est is None else est.layout.short(), "fits": est is not None,
                "error": None if e is None else round(e, 4),
                "baseline_s": round(r.published_s * (1 + be), 4), "baseline_error": round(be, 4),
            })
    summary = {}
    for s in sources + ["pooled"]:
        rs = [x for x in per_row if s in ("pooled", x["source"])]
        model = [abs(x["error"]) if x["error"] is not None else 1.0 for x in rs]
        base_ = [abs(x["baseline_error"]) for x in rs]
        summary[s] = {"rows": len(rs), "model_mean_abs_error": round(sum(model) / len(model), 4),
                      "model_max_abs_error": round(max(model), 4),
                      "baseline_mean_abs_error": round(sum(base_) / len(base_), 4),
                      "not_fitting": sum(1 for x in rs if not x["fits"])}
    all_c = fit_constants(rows, base)
    return {"folds": folds, "rows": per_row, "summary": summary,
            "fit_all": {k: getattr(all_c, k) for k in FITTED}, "baseline_all": fit_baseline(rows)}


def plot(result: dict, path: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 6.0))
    marks = {"korthikanti": "s", "mpt-a100-80gb": "o", "mpt-a100-40gb": "^", "llama3-405b": "D"}
    for s in marks:
        rs = [x for x in result["rows"] if x["source"] == s and x["predicted_s"]]
        if rs:
            ax.scatter([x["published_s"] for x in rs], [x["predicted_s"] for x in rs], marker=marks[s], s=22,
                       label=f"{s} (LOSO mean {100 * result['summary'][s]['model_mean_abs_error']:.1f}%)")
    lo = min(x["published_s"] for x in result["rows"]) * 0.7
    hi = max(x["published_s"] for x in result["rows"]) * 1.4
    ax.plot([lo, hi], [lo, hi], "k-", lw=0.8)
    for f in (0.92, 1.08):
        ax.plot([lo, hi], [lo * f, hi * f], "k:", lw=0.6)
    ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi), xlabel="published step time (s)",
           ylabel="predicted step time (s), source held out",
           title="trainperf plan: leave-one-source-out predictions")
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path


def main(argv=None) -> None:
    import json

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", help="planner-dev directory (default $TRAINPERF_PLANNER_DEV or /work/shared/planner-dev)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--plot", metavar="PNG")
    args = ap.parse_args(argv)
    rows = devset.load(args.data)
    res = loso(rows)
    if args.plot:
        plot(res, args.plot)
    if args.json:
        print(json.dumps(res, indent=1))
        return
    print(render_markdown(res))


def render_markdown(res: dict) -> str:
    lines = ["| source | rows | model LOSO mean abs error | model max | constant-efficiency LOSO mean abs error | not fitting |",
             "|---|---|---|---|---|---|"]
    for s, v in res["summary"].items():
        lines.append(f"| {s} | {v['rows']} | {100 * v['model_mean_abs_error']:.1f}% | {100 * v['model_max_abs_error']:.1f}% "
                     f"| {100 * v['baseline_mean_abs_error']:.1f}% | {v['not_fitting']} |")
    lines += ["", "| held-out source | " + " | ".join(FITTED) + " | baseline E |", "|---" * (len(FITTED) + 2) + "|"]
    for s, f in res["folds"].items():
        lines.append(f"| {s} | " + " | ".join(f"{f['constants'][k]:.3f}" for k in FITTED) + f" | {f['baseline_efficiency']:.3f} |")
    lines.append("| (all sources) | " + " | ".join(f"{res['fit_all'][k]:.3f}" for k in FITTED) + f" | {res['baseline_all']:.3f} |")
    lines += ["", "| source | row | published s | predicted s | error | layout | baseline error |", "|---|---|---|---|---|---|---|"]
    for x in res["rows"]:
        err = "no fit" if x["error"] is None else f"{100 * x['error']:+.1f}%"
        mark = " (approx.)" if x["approximate"] else ""
        lines.append(f"| {x['source']}{mark} | {x['row']} | {x['published_s']:.3f} | {x['predicted_s'] or '-'} | {err} "
                     f"| {x['layout'] or '-'} | {100 * x['baseline_error']:+.1f}% |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
