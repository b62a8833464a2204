"""``trainperf report RUN_DIR``: one self-contained HTML file with the run's charts and diagnosis.

Writes ``RUN_DIR/report.html`` (every chart inline SVG: no image files, no scripts, nothing
fetched) and the same charts as ``RUN_DIR/report/*.svg``. Charts: loss, throughput (and MFU),
time per phase per step (stacked), utilization over time, per-rank comparison (each rank's file,
and the trainer's per-rank compute clock where recorded), memory over time; then the findings
of :func:`trainperf.diagnosis.engine.diagnose` and what was not measured. Drawn by
:mod:`trainperf.diagnosis.charts` (no plotting library needed). Several run directories give the
side-by-side report of :mod:`trainperf.diagnosis.compare`.
"""

from __future__ import annotations

import html
import statistics
from pathlib import Path
from typing import Any

from trainperf.diagnosis import charts as C
from trainperf.diagnosis.engine import diagnose_run, with_traces
from trainperf.diagnosis.page import findings_html
from trainperf.diagnosis.run_evidence import COMPILE_PHASE, _phases, _steady, compute_summary, load_screened
from trainperf.diagnosis.text import known_lines
from trainperf.diagnosis.trace_report import trace_section


def phase_order(names) -> list[str]:
    names = set(names) - {COMPILE_PHASE}
    return [p for p in C.PHASE_COLORS if p in names] + sorted(names - set(C.PHASE_COLORS))


def _chart_loss(run):
    recs = run["ranks"].get(0, [])
    if not recs:
        return None
    series = [{"label": "train loss (rank 0)", "x": [r["step"] for r in recs], "y": [r.get("loss") for r in recs]}]
    if run["evals"]:
        series.append({"label": "val loss", "x": [r["step"] for r in run["evals"]],
                       "y": [r.get("val_loss") for r in run["evals"]], "markers": True, "dash": True})
    return C.line_chart(series, title="Loss", xlabel="step", ylabel="loss")


def _chart_throughput(run):
    recs = run["ranks"].get(0, [])
    if not recs:
        return None
    ratio = [r["mfu"] / r["tokens_per_s"] for r in recs if C._num(r.get("mfu")) and C._num(r.get("tokens_per_s"))]
    y2 = (100 * statistics.median(ratio), "MFU % (formula FLOPs)") if ratio else None
    return C.line_chart([{"label": "tokens/s (all ranks)", "x": [r["step"] for r in recs],
                          "y": [r.get("tokens_per_s") for r in recs]}],
                        title="Throughput (wall clock per step)" + (", MFU on the right axis" if y2 else ""),
                        xlabel="step", ylabel="tokens/s", y2=y2, y_from_zero=True)


def _chart_phases(run):
    recs = [r for r in run["ranks"].get(0, []) if _phases(r)]
    if not recs:
        return None
    names = phase_order(k for r in recs for k in _phases(r))
    layers = [(n, [1000 * _phases(r).get(n, 0.0) for r in recs], C.PHASE_COLORS.get(n, "#999999")) for n in names]
    comp = sum(_phases(r).get(COMPILE_PHASE, 0.0) for r in recs)
    note = f" (compile {comp:.1f} s not drawn)" if comp else ""
    return C.stacked_area([r["step"] for r in recs], layers, title="Time per phase (stacked, rank 0)" + note,
                          xlabel="step", ylabel="ms per step")


_UTIL = {"machine CPU %": "cpu_pct", "GPU kernel-busy % (NVML)": "gpu_kernel_busy_pct",
         "SM active % (GPM)": "gpu_sm_active_pct", "tensor active % (GPM)": "gpu_tensor_active_pct",
         "memory-copy util % (NVML)": "gpu_mem_copy_util_pct", "process CPU % (100 = 1 core)": "proc_cpu_pct"}


def _sample_series(run, keys: dict[str, str], scale: float = 1.0) -> list[dict]:
    out = []
    many = len(run["samples"]) > 1
    for rank, recs in sorted(run["samples"].items()):
        for label, key in keys.items():
            pts = [(r.get("elapsed_s"), r[key] * scale) for r in recs if C._num(r.get(key)) is not None]
            if pts:
                out.append({"label": f"{label} r{rank}" if many else label, "x": [p[0] for p in pts],
                            "y": [p[1] for p in pts], "dash": key == "proc_cpu_pct"})
    return out


def _chart_utilization(run):
    return C.line_chart(_sample_series(run, _UTIL), title="Utilization over time",
                        xlabel="seconds since the monitor started", ylabel="%", y_from_zero=True)


def _chart_memory(run):
    keys = {"process RSS (with workers)": "proc_rss_bytes", "GPU memory used (NVML)": "gpu_memory_used_bytes"}
    return C.line_chart(_sample_series(run, keys, 1 / 2**30), title="Memory over time",
                        xlabel="seconds since the monitor started", ylabel="GiB", y_from_zero=True)


def _chart_ranks(run):
    per: dict[int, dict[str, float]] = {}
    for rank, recs in sorted(run["ranks"].items()):
        st = _steady(recs)
        tot: dict[str, float] = {}
        for r in st:
            for k, v in _phases(r).items():
                tot[k] = tot.get(k, 0.0) + v
        if tot:
            per[rank] = {k: 1000 * v / len(st) for k, v in tot.items()}
    if not per:
        return None
    names = phase_order(k for d in per.values() for k in d)
    return C.stacked_bars([f"rank {r}" for r in per],
                          [(n, [d.get(n, 0.0) for d in per.values()], C.PHASE_COLORS.get(n, "#999999"))
                           for n in names], title="Per-rank comparison (steady steps, wall clock)",
                          ylabel="mean ms per step")


def _chart_rank_compute(s):
    rc = s.get("rank_compute")
    if not rc:
        return None
    n = max(len(w) for w in rc["windows"])
    med = [statistics.median([w[i] for w in rc["windows"] if len(w) > i and w[i] is not None] or [0.0]) * 1000
           for i in range(n)]
    return C.stacked_bars([f"rank {i}" for i in range(n)], [("compute", med, "#2e86ab")],
                          title=f"Compute per rank, trainer clock ({rc.get('clock') or '?'}; median over windows)",
                          ylabel="ms per step")


CHARTS = [("loss", _chart_loss), ("throughput", _chart_throughput), ("phases", _chart_phases),
          ("utilization", _chart_utilization), ("ranks", _chart_ranks), ("memory", _chart_memory)]


def write_charts(drawn: list[tuple[str, str | None]], svg_dir: Path) -> tuple[list[str], list[str], list[str]]:
    """Write each drawn chart to ``svg_dir/NAME.svg``; returns (paths, figure HTML, names not drawn)."""
    svg_dir.mkdir(parents=True, exist_ok=True)
    paths, figs, skipped = [], [], []
    for name, svg in drawn:
        if svg is None:
            skipped.append(name)
            continue
        path = svg_dir / f"{name}.svg"
        path.write_text(svg, encoding="utf-8")
        paths.append(str(path))
        figs.append(C.figure(name, svg))
    return paths, figs, skipped


def _fmt(v: Any) -> str:
    return "-" if v is None else f"{v:.4g}" if isinstance(v, float) else str(v)


def summary_rows(s: dict, summ: dict) -> list[list[str]]:
    spread = ""
    if s.get("step_time_p90_s"):
        spread = f" (p90 {1000 * s['step_time_p90_s']:.1f} ms, {1000 * s['step_time_min_s']:.1f} to " \
                 f"{1000 * s['step_time_max_s']:.1f} ms)"
    return [["steps (recorded / used after warm-up)", f"{s['steps_recorded']} / {s['steps_used']}"],
            ["median step time", (f"{1000 * s['step_time_s']:.1f} ms" + spread) if s.get("step_time_s") else "-"],
            ["median throughput", f"{s['tokens_per_s']:,.0f} tokens/s" if s.get("tokens_per_s") else "-"],
            ["MFU (steady steps | whole run)", " | ".join(f"{100 * v:.2f}%" if v is not None else "-"
                                                          for v in (s.get("mfu"), s.get("mfu_run")))],
            ["HFU (steady steps | whole run)", " | ".join(f"{100 * v:.2f}%" if v is not None else "-"
                                                          for v in (s.get("hfu"), s.get("hfu_run")))],
            ["peak", s.get("peak_source") or "-"],
            ["MFU convention", summ.get("mfu_convention") or "-"],
            ["HFU convention", summ.get("hfu_convention") or "-"],
            ["FLOPs/token formula | counted", f"{_fmt(summ.get('flops_per_token_formula'))} | "
                                              f"{_fmt(summ.get('flops_per_token_counted'))}"],
            ["time by phase (steady steps)",
             ", ".join(f"{k} {100 * v:.1f}%" for k, v in s["phase_fractions"].items()) or "-"],
            ["compilation", f"{s['compile_s']:.1f} s (phase '{COMPILE_PHASE}': not in the steady-state fractions)"
             if s.get("compile_s") else "none booked"],
            ["device / precision", f"{_fmt(summ.get('device'))} / {_fmt(summ.get('precision'))}"]]


def build_report(run_dir: str | Path, out: str | Path | None = None, found: dict | None = None) -> dict[str, Any]:
    """Write the HTML report and SVGs; returns {"html": path, "charts": [svg paths], "skipped": [...], "findings"}."""
    from trainperf.trace.ranks import discover

    run_dir = Path(run_dir)
    found = found if found is not None else discover(run_dir)
    run = load_screened(run_dir)  # impossible records and figures left out, with notes (as compare)
    result = with_traces(diagnose_run(run), found["files"])
    s = result["summary"]
    drawn = [(name, fn(run)) for name, fn in CHARTS]
    if s.get("rank_compute"):
        drawn.append(("rank_compute", _chart_rank_compute(s)))
    traces_html = ""
    if result["traces"]:
        table, trace_drawn = trace_section(result)
        drawn += [(n, svg) for n, svg in trace_drawn if svg]  # drawn with the run's charts
        traces_html = f"<h2>Profiler traces (profile/)</h2>{table}"
    paths, figs, skipped = write_charts(drawn, run_dir / "report")
    missing = "".join(f"<li>{html.escape(m)}</li>" for m in result["missing"] + [f"chart '{n}': no data"
                                                                                 for n in skipped])
    crashed = "<p class='critical'>No summary.json: the run did not finish; figures come from metrics.jsonl.</p>" \
        if run["crashed"] else ""
    if result.get("known") is not None:  # killed before its first step record: say so, and what it left
        crashed = "<p class='critical'>" + "<br>".join(html.escape(x.strip()) for x in known_lines(result)) + "</p>"
    crashed += "".join(f"<p class='critical'>{html.escape(n)}</p>" for n in result.get("run_notes", []))
    crashed += "".join(f"<p class='warning'>{html.escape(n)}</p>" for n in result.get("data_notes", []))
    body = (f"<h1>trainperf report: {html.escape(str(run_dir))}</h1>\n{crashed}"
            f"<h2>Summary</h2>{C.table(summary_rows(s, run['summary']))}"
            f"<h2>Findings</h2>{findings_html(result, 'No rule fired: no bottleneck found in the recorded figures.')}"
            f"<h2>Charts</h2><div class=\"charts\">{''.join(figs)}</div>{traces_html}"
            f"<h2>Not measured</h2><ul>{missing or '<li>nothing</li>'}</ul>")
    out = Path(out) if out else run_dir / "report.html"
    from trainperf.runio import atomic_write_text

    atomic_write_text(out, C.page(f"trainperf report: {run_dir.name}", body))  # replaced whole or not at all
    return {"html": str(out), "charts": paths, "skipped": skipped, "findings": [f["id"] for f in result["findings"]],
            "known": result.get("known"), "data_notes": result.get("data_notes", [])}


__all__ = ["build_report", "compute_summary", "phase_order", "write_charts"]
