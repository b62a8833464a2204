"""``trainperf report TRACE|DIR``: the HTML report of profiler traces, and the trace section of a run's report.

One self-contained HTML file (inline SVG drawn by :mod:`trainperf.diagnosis.charts`, no scripts, nothing
fetched): a table of each rank's figures, then the charts — step time per rank broken down as the
TensorBoard plugin does (kernel, memcpy, memset, runtime, dataloader, cpu_exec, other; ms per step), the
GPU timeline per rank as HTA breaks it down (compute / non-compute / idle, %), and, with several ranks,
compute and communication per rank (the communication split into the time spent waiting for the slowest
rank and the rest) — then the findings with their gains and what was not measured.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from trainperf.diagnosis import charts as C
from trainperf.diagnosis.page import findings_html
from trainperf.diagnosis.text import BREAKDOWN, where_the_step_went

BREAKDOWN_COLORS = {"kernel": "#2e86ab", "communication": "#f18f01", "memcpy": "#ffc914", "memset": "#17bebb", "runtime": "#9b59b6",
                    "dataloader": "#e4572e", "cpu_exec": "#76b041", "other": "#5f6b6d"}
TEMPORAL_COLORS = {"compute": "#2e86ab", "non_compute": "#ffc914", "idle": "#d1495b"}


def _n(v) -> float:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else 0.0


def _labels(traces: list[dict]) -> list[str]:
    return [f"rank {t.get('rank')}" for t in traces]


def chart_breakdown(traces: list[dict]) -> str | None:
    if not traces or not any(t.get("step_time_us") for t in traces):
        return None
    stacks = [(k, [_n((t.get("step_breakdown_pct") or {}).get(k)) * _n(t.get("step_time_us")) / 1e5 for t in traces],
               BREAKDOWN_COLORS[k]) for k in BREAKDOWN]
    return C.stacked_bars(_labels(traces), stacks, title="Step time per rank, broken down (TensorBoard plugin's "
                          "categories)", ylabel="ms per step")


def chart_temporal(traces: list[dict]) -> str | None:
    if not any(v is not None for t in traces for v in (t.get("temporal_pct") or {}).values()):
        return None  # CPU-only traces: no GPU timeline to draw
    stacks = [(k, [_n((t.get("temporal_pct") or {}).get(k)) for t in traces], c) for k, c in TEMPORAL_COLORS.items()]
    return C.stacked_bars(_labels(traces), stacks, title="GPU timeline per rank: compute / non-compute / idle "
                          "(HTA's temporal breakdown)", ylabel="% of the GPU timeline")


def chart_ranks(ranks: dict) -> str | None:
    per = ranks.get("per_rank") or []
    if len(per) < 2 or not any(p.get("compute_us_per_step") for p in per):
        return None
    comp = [_n(p.get("compute_us_per_step")) / 1000 for p in per]
    wait = [_n(p.get("comm_wait_us_per_step")) / 1000 for p in per]
    comm = [max(0.0, _n(p.get("comm_us_per_step")) / 1000 - w) for p, w in zip(per, wait)]
    return C.stacked_bars([f"rank {p['rank']}" for p in per],
                          [("compute", comp, "#2e86ab"), ("communication", comm, "#ffc914"),
                           ("waiting for the slowest rank", wait, "#e4572e")],
                          title="Compute and communication per rank (GPU kernel time per step)", ylabel="ms per step")


def _p(v) -> str:
    return f"{v:.1f}%" if isinstance(v, (int, float)) else "-"


def _ms(us) -> str:
    return f"{us / 1000:.2f} ms" if isinstance(us, (int, float)) else "-"


GPU_COLUMNS = (("gpu_utilization_pct", "GPU utilization"), ("sm_efficiency_pct", "est. SM efficiency"),
               ("achieved_occupancy_pct", "est. achieved occupancy"), ("tensor_core_kernel_pct", "tensor-core kernel time"),
               ("comm_compute_overlap_pct", "comm/compute overlap"))


def rank_table(traces: list[dict]) -> str:
    """Each rank's figures, one rank per row (a job of 256 ranks reads down, never sideways): the step and its
    breakdown, then the GPU's figures and HTA's temporal and idle breakdowns."""
    step = C.table([[str(t.get("rank")), Path(str(t.get("path"))).name,
                     str((t.get("device_info") or {}).get("name") if isinstance(t.get("device_info"), dict)
                         else t.get("device") or "CPU only"),
                     str(t.get("steps") or "none: the whole trace"), _ms(t.get("step_time_us"))]
                    + [_p((t.get("step_breakdown_pct") or {}).get(k)) for k in BREAKDOWN] for t in traces],
                   ["rank", "file", "device", "profiler steps", "step time"] + [f"{k} %" for k in BREAKDOWN],
                   num_cols=range(4, 5 + len(BREAKDOWN)))
    gpu = C.table([[str(t.get("rank"))] + [_p(t.get(key)) for key, _ in GPU_COLUMNS]
                   + [_p((t.get("temporal_pct") or {}).get(k)) for k in ("compute", "non_compute", "idle")]
                   + [_p((t.get("idle_pct") or {}).get(k)) for k in ("host_wait", "kernel_wait", "other")]
                   for t in traces],
                  ["rank"] + [label for _, label in GPU_COLUMNS]
                  + [f"temporal {k}" for k in ("compute", "non_compute", "idle")]
                  + [f"idle: {k}" for k in ("host_wait", "kernel_wait", "other")],
                  num_cols=range(1, 12))
    return (f"<h3>The step, per rank (% of the step time)</h3>{step}"
            f"<h3>The GPU, per rank (HTA's temporal and idle breakdowns, % of the GPU timeline)</h3>{gpu}")


STEP_COLORS = {"compute": "#2e86ab", "waiting for other ranks": "#e4572e", "communication": "#f18f01",
               "memcpy": "#ffc914", "memset": "#17bebb", "idle: allocator": "#8e44ad", "idle: syncs": "#c0392b",
               "idle: launches": "#9b59b6", "idle: DataLoader": "#d35400", "idle: optimizer step": "#16a085",
               "idle: host ops": "#76b041", "idle: gc": "#7f8c8d", "idle: untraced host": "#5f6b6d",
               "idle: queued work waiting": "#bdc3c7", "idle: other": "#dddddd"}


def _steps_of(result: dict) -> list[tuple[dict, list[tuple[str, float]]]]:
    per = {p["rank"]: p for p in (result.get("ranks") or {}).get("per_rank") or []}
    return [(t, where_the_step_went(t, per.get(t.get("rank")))) for t in result.get("traces") or []]


def chart_step(result: dict) -> str | None:
    """Where each rank's step went, summing to 100%: the GPU's busy parts, then its idle by host cause."""
    rows = [(t, parts) for t, parts in _steps_of(result) if parts]
    if not rows:
        return None
    names = list(dict.fromkeys(k for _, parts in rows for k, _ in parts))
    stacks = [(n, [dict(parts).get(n, 0.0) for _, parts in rows], STEP_COLORS.get(n, "#999999")) for n in names]
    return C.stacked_bars([f"rank {t.get('rank')}" for t, _ in rows], stacks, title="Where the step went (critical "
                          "path: the GPU's busy time, then its idle by the host cause it waited on)",
                          ylabel="% of the step")


def step_table(result: dict) -> str:
    rows = [(t, dict(parts)) for t, parts in _steps_of(result) if parts]
    if not rows:
        return ""
    names = list(dict.fromkeys(k for _, parts in rows for k in parts))
    table = C.table([[str(t.get("rank"))] + [_p(parts.get(n)) if n in parts else "-" for n in names]
                     for t, parts in rows], ["rank"] + names, num_cols=range(1, len(names) + 1))
    return (f"<h3>Where the step went, per rank (% of the step, summing to 100)</h3>{table}<p>Idle GPU time is "
            "charged along the critical path to what the host thread that launched the next GPU work was doing "
            "(docs/concepts/attribution.md).</p>")


def wait_matrix_html(m: dict | None) -> str:
    """Who waits for whom: a row per rank that waits, a column per late rank, ms per step, shaded by size."""
    if not m or not m.get("late"):
        return ""
    top = max([v for row in m["ms_per_step"] for v in row] + [1e-9])
    other = m.get("other_ms_per_step")
    head = "".join(f"<th>rank {r}</th>" for r in m["late"]) + ("<th>other late ranks</th>" if other else "")
    rows = []
    for i, w in enumerate(m["waiting"]):
        cells = "".join(f"<td class='num' style='background: rgba(228,87,46,{min(1.0, v / top):.2f})'>{v:.2f}</td>"
                        for v in m["ms_per_step"][i])
        if other:
            cells += f"<td class='num'>{other[i]:.2f}</td>"
        rows.append(f"<tr><th>rank {w}</th>{cells}</tr>")
    return ("<h3>Who waits for whom (ms per step: a row per waiting rank, a column per late rank)</h3>"
            f"<table><tr><th>waits for</th>{head}</tr>{''.join(rows)}</table>"
            f"<p>{html.escape(m.get('definition') or '')}</p>")


def across_html(r: dict) -> str:
    """The figures across ranks: each rank's communication split into the wait for the last arrival and the
    transfer, its clock offset; the late arrivals and what made them late; the wait matrix."""
    per = r.get("per_rank") or []
    if len(per) < 2:
        return ""
    partial = bool(r.get("partial"))
    rows = [[str(p["rank"]), _ms(p.get("step_time_us")), _ms(p.get("compute_us_per_step")),
             _ms(p.get("comm_us_per_step")), _ms(p.get("comm_wait_us_per_step")),
             _ms(p.get("comm_incl_absent_wait_us_per_step") if partial else p.get("transfer_us_per_step")),
             f"{p['clock_offset_us']:+.0f} us" if isinstance(p.get("clock_offset_us"), (int, float)) else "-"]
            for p in per]
    table = C.table(rows, ["rank", "step", "compute", "communication", "waiting for the last arrival",
                           "rest (incl. waits for ranks not here)" if partial else "transfer", "clock offset"],
                    num_cols=range(1, 7))
    late = "".join(f"<li>{html.escape(x['summary'])}</li>" for x in (r.get("late_arrivals") or [])[:8])
    ck = r.get("clocks") or {}
    clocks = (f"<p>{html.escape(ck['method'])} (residual median {ck.get('residual_us') or 0:.0f} us, p95 "
              f"{ck.get('residual_p95_us') or 0:.0f} us).</p>" if ck.get("method") else "")
    return (f"<h3>Across ranks: waits and transfers per step</h3>{table}{clocks}"
            + (f"<h3>Late arrivals</h3><ul>{late}</ul>" if late else "") + wait_matrix_html(r.get("wait_matrix")))


def trace_section(result: dict) -> tuple[str, list[tuple[str, str | None]]]:
    """The per-rank tables and the charts of a diagnosis over traces: (tables HTML, [(chart name, svg)])."""
    traces = result.get("traces") or []
    drawn = [("trace_step", chart_step(result)), ("trace_breakdown", chart_breakdown(traces)),
             ("trace_temporal", chart_temporal(traces)), ("trace_ranks", chart_ranks(result.get("ranks") or {}))]
    return step_table(result) + rank_table(traces) + across_html(result.get("ranks") or {}), drawn


def default_out(path: Path) -> Path:
    return path / "trace_report.html" if path.is_dir() else path.with_name(path.name.split(".json")[0] + ".report.html")


def build_trace_report(path: str | Path, out: str | Path | None = None, found: dict | None = None,
                       **kw) -> dict[str, Any]:
    """Diagnose the traces of PATH (``found``: what :func:`trainperf.trace.ranks.discover` found there, when the
    caller looked already) and write the HTML report; returns {"html", "charts", "skipped", "findings"}."""
    from trainperf.diagnosis.engine import diagnose_found
    from trainperf.trace.ranks import discover

    path = Path(path)
    result = diagnose_found(found if found is not None else discover(path), **kw)
    table, drawn = trace_section(result)
    figs = "".join(C.figure(n, svg) for n, svg in drawn if svg)
    missing = "".join(f"<li><code>{html.escape(str(m['id']))}</code>: {html.escape(m['reason'])}</li>"
                      for m in result["not_measured"])
    rk = result.get("ranks") or {}
    said = [f"skipped {s['path']}: {s['why']}" for s in rk.get("skipped") or []] + list(rk.get("notes") or [])
    said += [f"rank {t.get('rank')}: {n}" for t in result.get("traces") or [] for n in t.get("notes") or []]
    notes = ("<h2>Notes</h2><ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in said) + "</ul>") if said else ""
    body = (f"<h1>trainperf report: {html.escape(str(path))}</h1>"
            f"<h2>Findings</h2>{findings_html(result, 'No rule fired: no bottleneck found in these traces.')}"
            f"<h2>Per rank</h2>{table}<div class=\"charts\">{figs}</div>{notes}"
            f"<h2>Not measured</h2><ul>{missing or '<li>nothing</li>'}</ul>")
    out = Path(out) if out else default_out(path)
    from trainperf.runio import atomic_write_text

    atomic_write_text(out, C.page(f"trainperf report: {path.name}", body))  # replaced whole or not at all
    return {"html": str(out), "charts": [n for n, s in drawn if s], "skipped": [n for n, s in drawn if not s],
            "findings": [f["id"] for f in result["findings"]]}


__all__ = ["build_trace_report", "trace_section"]
