"""The text of ``python -m trainperf.planner.loso`` (markdown tables) and its plot (matplotlib, optional)."""

from __future__ import annotations

from trainperf.planner.composition import TERMS
from trainperf.planner.fit import FITTED


def _pct(v, fmt: str = ".0f") -> str:
    return "-" if v is None else f"{100 * v:{fmt}}%"


def render_text(res: dict) -> str:
    """The whole report: issue 39's criteria, coverage by interval scale, the per-source tables, the V100 check."""
    return (render_criteria(res["criteria"]) + "\n\nCoverage if every interval were scaled (the judged sources' levels "
            "differ more than any one width can absorb):\n\n"
            + render_scales(res["coverage_by_scale"], res["criteria"]["band"]) + "\n\n" + render_markdown(res)
            + "\n\n## Held-out check: another GPU generation (V100)\n\n" + render_generation_check(res["generation_check"]))


def render_scales(table: dict, band: tuple) -> str:
    sources = list(next(iter(table.values())))
    lines = ["| interval width x | " + " | ".join(sources) + " |", "|---" * (len(sources) + 1) + "|"]
    lo, hi = band
    for f, cov in table.items():
        cells = [("-" if v is None else f"{100 * v:.0f}%" + ("" if lo <= v <= hi else " (out)")) for v in cov.values()]
        lines.append(f"| {f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def render_criteria(crit: dict) -> str:
    judged_rows = crit["judged_rows"]
    lines = [f"Issue 39's Done-when, on this run: {crit['passed']} of {crit['total']} checks pass "
             f"(sources of >= {judged_rows} runs judged: {', '.join(crit['judged_sources'])})", "",
             "| criterion | value | pass |", "|---|---|---|"]
    for c in crit["checks"]:
        val = _pct(c["value"], ".1f")
        if "baseline" in c:
            val += f" vs {100 * c['baseline']:.1f}%"
        if c.get("count"):
            val += f" ({c['count']})"
        lines.append(f"| {c['criterion']} | {val} | {'yes' if c['pass'] else '**no**'} |")
    if crit["small_sources"]:
        lines += ["", "Reported without a pass mark (fewer than %d runs): " % judged_rows
                  + ", ".join(f"{s} ({n} run{'s' if n > 1 else ''})" for s, n in crit["small_sources"].items())]
    ch = crit.get("chance_if_calibrated")
    if ch:
        lines += ["", "Chance that an exactly calibrated 80% interval puts each judged source's coverage in 75-90% "
                  "(binomial, runs independent; an upper bound, runs of one source sharing its level): "
                  + ", ".join(f"{s} {100 * p:.0f}%" for s, p in ch["per_source"].items())
                  + f"; all at once {100 * ch['all']:.1f}%"]
    return "\n".join(lines)


def render_generation_check(g: dict) -> str:
    lines = ["| V100 rows (held out, never fitted) | rows | model mean abs error | model max | mean signed "
             "| constant-E baseline | 80% interval coverage | single-width interval coverage | calibrated coverage (width) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for k, v in g["summary"].items():
        cal = ("-" if v.get("calibrated_coverage") is None
               else f"{100 * v['calibrated_coverage']:.0f}% ({100 * v['calibrated_width']:.0f}%)")
        lines.append(f"| {k} | {v['rows']} | {100 * v['model_mean_abs_error']:.1f}% | {100 * v['model_max_abs_error']:.1f}% "
                     f"| {100 * v['model_mean_signed_error']:+.1f}% | {100 * v['baseline_mean_abs_error']:.1f}% "
                     f"| {_pct(v['coverage'])} | {_pct(v.get('coverage_single'))} | {cal} |")
    lines += ["", "| row | GPU | published s | predicted s | error | 80% interval s | layout | baseline error |",
              "|---|---|---|---|---|---|---|---|"]
    for x in g["rows"]:
        err = "no fit" if x["error"] is None else f"{100 * x['error']:+.1f}%"
        mark = " (approx.)" if x["approximate"] else ""
        lines.append(f"| {x['row']}{mark} | {x['gpu']} | {x['published_s']:.3f} | {x['predicted_s'] or '-'} | {err} "
                     f"| {_interval(x)} | {x['layout'] or '-'} | {100 * x['baseline_error']:+.1f}% |")
    return "\n".join(lines)


def _interval(x: dict, key: str = "interval_s", inside: str = "inside") -> str:
    if not x.get(key):
        return "-"
    return f"{x[key][0]:.3g}-{x[key][1]:.3g}{'' if x[inside] else ' (out)'}"


def render_markdown(res: dict) -> str:
    lines = ["| held-out source | rows | model mean abs error | model max | mean signed | constant-E baseline "
             "| E = 0.5 baseline | 80% interval coverage | mean width | interval score "
             "| single-width coverage | its width | its score | calibrated coverage (width) | not fitting |",
             "|---" * 15 + "|"]
    for s, v in res["summary"].items():
        cal = ("-" if v.get("calibrated_coverage") is None
               else f"{100 * v['calibrated_coverage']:.0f}% ({100 * v['calibrated_width']:.0f}%)")
        approx = f" ({v['approximate_rows']} approx.)" if v["approximate_rows"] else ""
        lines.append(f"| {s} | {v['rows']}{approx} | {100 * v['model_mean_abs_error']:.1f}% | "
                     f"{100 * v['model_max_abs_error']:.1f}% | {100 * v['model_mean_signed_error']:+.1f}% | "
                     f"{100 * v['baseline_mean_abs_error']:.1f}% | {100 * v['baseline_half_mean_abs_error']:.1f}% | "
                     f"{_pct(v['coverage'])} ({v['inside']}) | {_pct(v['mean_relative_width'])} | "
                     f"{v['mean_interval_score']:.3f} | {_pct(v['coverage_single'])} ({v['inside_single']}) | "
                     f"{_pct(v['mean_relative_width_single'])} | {v['mean_interval_score_single']:.3f} | "
                     f"{cal} | {v['not_fitting']} |")
    lines += ["", "| held-out source | " + " | ".join(FITTED) + " | baseline E | mu | tau | "
              + " | ".join(f"s {k}" for k in TERMS) + " | studentized 10/90% | single width (log, all compute) "
              "| non-compute scale |", "|---" * (len(FITTED) + len(TERMS) + 7) + "|"]
    folds = [(s, f["constants"], f["baseline_efficiency"], f["interval"], f["interval_single"])
             for s, f in res["folds"].items()]
    folds.append(("(all sources)", res["fit_all"], res["baseline_all"], res["interval"], res["interval_single"]))
    for s, c, e, iv, one in folds:
        lines.append(f"| {s} | " + " | ".join(f"{c[k]:.3f}" for k in FITTED)
                     + f" | {e:.3f} | {iv['center']:+.4f} | {iv['between_source_sd']:.4f} | "
                     + " | ".join(f"{iv['term_sd'][k]:.4f}" for k in TERMS)
                     + f" | [{iv['studentized_quantiles'][0]:+.2f}, {iv['studentized_quantiles'][1]:+.2f}] "
                       f"| [{one['log_ratio_low']:+.3f}, {one['log_ratio_high']:+.3f}] | {one['noncompute_scale']:g} |")
    ic = res["interval_calibrated"]
    lines.append(f"\ncalibrated spread, all sources: [{ic['log_ratio_low']:+.4f}, {ic['log_ratio_high']:+.4f}] with "
                 f"calibration weight {res['calibration_weight']:g} (a measured run moves the model that far, in log)")
    lines += ["", "| source | row | published s | predicted s | error | 80% interval s | largest term (share) "
              "| single-width interval s | layout | baseline error |", "|---" * 10 + "|"]
    for x in res["rows"]:
        err = "no fit" if x["error"] is None else f"{100 * x['error']:+.1f}%"
        mark = " (approx.)" if x["approximate"] else ""
        iv = _interval(x)
        if x.get("far_from_development"):
            iv += f" (far: {', '.join(x['far_from_development'])})"
        made = x.get("interval_made_of")
        big = "-" if not made else f"{made['largest_term']} ({100 * made['largest_share']:.0f}%)"
        lines.append(f"| {x['source']}{mark} | {x['row']} | {x['published_s']:.3f} | {x['predicted_s'] or '-'} | {err} "
                     f"| {iv} | {big} | {_interval(x, 'interval_single_s', 'inside_single')} | {x['layout'] or '-'} "
                     f"| {100 * x['baseline_error']:+.1f}% |")
    return "\n".join(lines)


def plot(result: dict, path: str) -> str:
    try:
        import matplotlib
    except ImportError:
        from trainperf.errors import UserError

        raise UserError(f"--plot {path}: the plot needs matplotlib, which is not installed; "
                        "pip install matplotlib (or trainperf[plots]), or leave out --plot") from None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.0, 6.4))
    marks = "so^DvP*Xh<>"
    for i, s in enumerate(result["summary"]):
        if s == "pooled":
            continue
        rs = [x for x in result["rows"] if x["source"] == s and x["predicted_s"]]
        if not rs:
            continue
        xs = [x["published_s"] for x in rs]
        ys = [x["predicted_s"] for x in rs]
        # the interval at the published value's abscissa: inside when the bar crosses the diagonal
        yerr = [[y - x["interval_s"][0] for x, y in zip(rs, ys)], [x["interval_s"][1] - y for x, y in zip(rs, ys)]]
        ax.errorbar(xs, ys, yerr=yerr, fmt=marks[i % len(marks)], ms=4, lw=0.5, capsize=0,
                    label=f"{s} ({100 * result['summary'][s]['model_mean_abs_error']:.1f}%, "
                          f"cov {100 * (result['summary'][s]['coverage'] or 0):.0f}%)")
    allx = [x["published_s"] for x in result["rows"]]
    lo, hi = min(allx) * 0.5, max(allx) * 2.0
    ax.plot([lo, hi], [lo, hi], "k-", lw=0.8)
    for f in (0.92, 1.08):
        ax.plot([lo, hi], [lo * f, hi * f], "k:", lw=0.6)
    ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi), xlabel="published step time (s)",
           ylabel="predicted step time (s), source held out",
           title="trainperf plan: leave-one-source-out predictions with their 80% interval\n"
                 "(a bar that crosses the diagonal holds the published value)")
    ax.legend(fontsize=6.5, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path
