"""Other forms of the composition interval, refitted on the nested held-out errors of a LOSO run (no torch).

``python -m trainperf.planner.loso --json > loso.json`` stores, for every held-out source S, the errors its
interval was fitted on (``folds[S]["inner"]``: the other sources' log ratios, each from a fit without S and
without itself, and the composition of each of their predicted steps). This module refits the interval on
them in other forms and judges each on S's rows, as ``loso`` judges the shipped form:

* **groupings** of the step's composition into terms (:data:`GROUPINGS`: seven, four (shipped), three, two);
* **estimation**: REML with the prior on the terms' log sd (shipped), REML without it, and the terms' parts
  added linearly instead of in quadrature (one error shared by every term of a step).

Each variant is scored by the mean over held-out sources of its rows' interval score (a proper scoring rule:
width plus 10 times any miss, in log), the measure the shipped form was chosen by, and by issue 39's
per-source coverage.

:func:`oracle` asks another question: can ANY interval of this family meet the per-source criterion? It searches
the family's parameters (two percentiles, the level's sd, the seven terms' sd) to meet the criterion on the very
rows it is judged on: fitting on the held-out tables, which an honest interval must not do. What it finds tells
what meeting the criterion takes.

``python -m trainperf.planner.interval_variants LOSO_JSON [--json]``.
"""

from __future__ import annotations

import math
import random

from trainperf.planner.composition import PRIOR_SD, TERMS, fit, grouped
from trainperf.planner.interval import interval_score

_COMM = ("tp_comm", "cp_comm", "fsdp_comm", "dp_comm", "pp_p2p")
GROUPINGS = {
    "7 terms": {"gemm": ("", ("gemm",)), "gemm_shape": ("", ("gemm_shape",)), "attention": ("", ("attention",)),
                "elementwise": ("", ("elementwise", "optimizer")), "recompute": ("", ("recompute",)),
                "communication": ("", _COMM), "bubble": ("", ("pp_bubble",))},
    "4 terms": TERMS,
    "3 terms": {"compute": ("", ("gemm", "gemm_shape", "recompute", "elementwise", "optimizer")),
                "attention": ("", ("attention",)), "communication": ("", _COMM + ("pp_bubble",))},
    "2 terms": {"compute": ("", ("gemm", "gemm_shape", "recompute", "elementwise", "optimizer", "attention")),
                "non-compute": ("", _COMM + ("pp_bubble",))},
}
"""Groupings of :data:`~trainperf.planner.cost.COMPOSITION` into the interval's terms."""
ESTIMATIONS = {"REML + prior": {"prior_sd": 1.0, "combine": "quadrature"},
               "REML, no prior": {"prior_sd": None, "combine": "quadrature"},
               "REML + prior, linear": {"prior_sd": 1.0, "combine": "linear"}}


def _judged(res: dict) -> list[str]:
    return list(res["criteria"]["judged_sources"]) if "criteria" in res else [
        s for s, v in res["summary"].items() if s != "pooled" and v["rows"] >= 8]


def _summary(per_source: dict, judged: list[str], band: tuple) -> dict:
    rows = [x for xs in per_source.values() for x in xs]
    lo, hi = band
    counts = {s: (sum(x[0] for x in per_source[s]), len(per_source[s])) for s in per_source}
    return {"pooled_coverage": round(sum(x[0] for x in rows) / len(rows), 4),
            "mean_width": round(sum(x[1] for x in rows) / len(rows), 4),
            "mean_interval_score": round(sum(sum(x[2] for x in xs) / len(xs) for xs in per_source.values())
                                         / len(per_source), 4),
            "inside": {s: list(counts[s]) for s in judged},
            "judged_in_band": sum(lo <= counts[s][0] / counts[s][1] <= hi for s in judged)}


def variant(res: dict, terms: dict, prior_sd: float | None, combine: str) -> dict:
    """One form of the interval refitted per fold on the fold's inner errors and judged on its held-out rows."""
    per_source = {}
    for s, fold in res["folds"].items():
        inner = fold["inner"]
        sp = fit({t: v["log_ratio"] for t, v in inner.items()},
                 {t: [grouped(c, terms) for c in v["composition_shares"]] for t, v in inner.items()},
                 prior_sd=prior_sd, combine=combine)
        out = []
        for x in res["rows"]:
            if x["source"] != s or x["log_ratio"] is None:
                continue
            lo, hi = sp.log_bounds(grouped(x["composition_shares"], terms), len(x["far_from_development"] or ()))
            r = x["log_ratio"]
            out.append((lo <= r <= hi, math.exp(hi) - math.exp(lo), interval_score(lo, hi, r)))
        per_source[s] = out
    return _summary(per_source, _judged(res), res["criteria"]["band"])


def single_width(res: dict) -> dict:
    """Issue 39's single-width interval, as the LOSO run judged it."""
    per_source = {}
    for x in res["rows"]:
        if x["log_ratio"] is None:
            continue
        p = x["predicted_s"]
        lo, hi = (math.log(v / p) for v in x["interval_single_s"])
        per_source.setdefault(x["source"], []).append((x["inside_single"], (x["interval_single_s"][1]
                                                                             - x["interval_single_s"][0]) / p,
                                                       interval_score(lo, hi, x["log_ratio"])))
    return _summary(per_source, _judged(res), res["criteria"]["band"])


def variants(res: dict) -> dict:
    out = {"single width (issue 39)": single_width(res)}
    for g, terms in GROUPINGS.items():
        for e, kw in ESTIMATIONS.items():
            shipped = terms is TERMS and kw == {"prior_sd": PRIOR_SD, "combine": "quadrature"}
            out[f"{g}, {e}" + (" (shipped)" if shipped else "")] = variant(res, terms, **kw)
    return out


def oracle(res: dict, tries: int = 20000, seed: int = 0) -> dict:
    """Search the family ``[c_low, c_high] x sqrt(t^2 (1 + far) + sum (s_k f_k)^2)`` over the seven terms for the
    parameters that bring every judged source's coverage (and the pooled one) into the band, scored on the held-out
    rows themselves (module doc: not an honest interval). Seeded random search with local steps."""
    terms = GROUPINGS["7 terms"]
    judged, (lo_b, hi_b) = _judged(res), res["criteria"]["band"]
    rows = [(x["source"], x["log_ratio"], list(grouped(x["composition_shares"], terms).values()),
             len(x["far_from_development"] or ())) for x in res["rows"] if x["log_ratio"] is not None]

    def judge(p):
        c_lo, c_hi, t, s = p[0], p[1], p[2], p[3:]
        inside, width, counts = 0, 0.0, {j: [0, 0] for j in judged}
        for src, r, f, far in rows:
            sd = math.sqrt(t * t * (1 + far) + sum((a * b) ** 2 for a, b in zip(s, f)))
            ok = c_lo * sd <= r <= c_hi * sd
            inside += ok
            width += math.exp(c_hi * sd) - math.exp(c_lo * sd)
            if src in counts:
                counts[src][0] += ok
                counts[src][1] += 1
        cov = [inside / len(rows)] + [k / n for k, n in counts.values()]
        miss = sum(max(0.0, lo_b - c) + max(0.0, c - hi_b) for c in cov) + max(0.0, width / len(rows) - 0.3)
        return miss, counts, inside / len(rows), width / len(rows)

    rng = random.Random(seed)
    best = None
    for i in range(tries):
        if best is None or i % 3 == 0:
            p = [-rng.uniform(0.5, 3.0), rng.uniform(0.5, 3.0), rng.uniform(0.0, 0.1)]
            p += [rng.uniform(0.0, 0.4) for _ in terms]
        else:
            p = [x + rng.gauss(0.0, 0.05 * (abs(x) + 0.01)) for x in best[1]]
            p = [min(p[0], 0.0), max(p[1], 0.0)] + [abs(x) for x in p[2:]]
        v = judge(p)
        if best is None or v[0] < best[0]:
            best = (v[0], p, v)
    miss, p, (_, counts, pooled, width) = best
    return {"meets_the_criterion": miss == 0.0, "miss": round(miss, 4), "pooled_coverage": round(pooled, 4),
            "mean_width": round(width, 4), "inside": {s: c for s, c in counts.items()},
            "percentiles": [round(p[0], 3), round(p[1], 3)], "level_sd": round(p[2], 4),
            "term_sd": {k: round(v, 4) for k, v in zip(terms, p[3:])}, "tries": tries, "seed": seed}


def render(table: dict, orc: dict | None = None) -> str:
    judged = list(next(iter(table.values()))["inside"])
    lines = ["| interval | pooled coverage | mean width | mean interval score | judged sources in 75-90% | "
             + " | ".join(judged) + " |", "|---" * (5 + len(judged)) + "|"]
    for name, v in table.items():
        lines.append(f"| {name} | {100 * v['pooled_coverage']:.1f}% | {100 * v['mean_width']:.1f}% | "
                     f"{v['mean_interval_score']:.4f} | {v['judged_in_band']} of {len(judged)} | "
                     + " | ".join(f"{k}/{n}" for k, n in v["inside"].values()) + " |")
    if orc:
        lines += ["", f"In-sample search ({orc['tries']} tries, seed {orc['seed']}), parameters chosen on the judged rows "
                  f"themselves: {'meets' if orc['meets_the_criterion'] else 'does not meet'} the per-source criterion "
                  f"(pooled {100 * orc['pooled_coverage']:.1f}%, width {100 * orc['mean_width']:.1f}%; "
                  + ", ".join(f"{s} {k}/{n}" for s, (k, n) in orc["inside"].items())
                  + f") with percentiles {orc['percentiles']} of the sd, level sd {orc['level_sd']}, term sd "
                  + ", ".join(f"{k} {v}" for k, v in orc["term_sd"].items())]
    return "\n".join(lines)


def main(argv=None) -> None:
    import argparse
    import json

    ap = argparse.ArgumentParser(prog="python -m trainperf.planner.interval_variants",
                                 description="other forms of the interval, refitted on a LOSO run's nested errors")
    ap.add_argument("loso_json", help="the output of python -m trainperf.planner.loso --json (nested)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    from trainperf.errors import UserError

    try:
        res = _load(args.loso_json)
    except UserError as exc:
        import sys

        print(f"python -m trainperf.planner.interval_variants: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    table, orc = variants(res), oracle(res)
    print(json.dumps({"variants": table, "oracle": orc}, indent=1) if args.json else render(table, orc))


def _load(path: str) -> dict:
    import json

    from trainperf.errors import UserError

    try:
        with open(path) as f:
            res = json.load(f)
    except OSError as exc:
        raise UserError(f"{path}: cannot be read ({exc.strerror}); give the file python -m trainperf.planner.loso "
                        "--json wrote") from None
    except ValueError:
        raise UserError(f"{path}: not JSON; give the file python -m trainperf.planner.loso --json wrote") from None
    folds = res.get("folds") if isinstance(res, dict) else None
    if not folds or not res.get("nested") or "inner" not in next(iter(folds.values())):
        raise UserError(f"{path}: not a nested leave-one-source-out run with its folds' errors (nested: "
                        f"{res.get('nested') if isinstance(res, dict) else None!r}); run python -m trainperf.planner.loso --json, without --fast, "
                        "from this version of trainperf")
    return res


if __name__ == "__main__":
    main()
