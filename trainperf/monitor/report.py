"""``trainperf report RUN_DIR``: one self-contained HTML file with the run's charts and diagnosis.

Writes ``RUN_DIR/report.html`` (every chart embedded as a base64 PNG, no external files, no
scripts) and the same charts as ``RUN_DIR/report/*.png``. Charts: loss, throughput (and MFU),
time per phase per step (stacked), utilization over time, per-rank comparison, memory over time;
then the findings of :func:`trainperf.monitor.diagnose.diagnose` and what was not measured.
Needs matplotlib (``pip install 'trainperf[plot]'``).
"""

from __future__ import annotations

import base64
import html
import io
from pathlib import Path
from typing import Any

from trainperf.monitor.diagnose import _steady, compute_summary, diagnose, load_run

PHASE_COLORS = {"data": "#e4572e", "forward": "#17bebb", "backward": "#2e86ab", "optimizer": "#76b041",
                "comm": "#ffc914"}


def _plt():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        from trainperf.errors import UserError

        raise UserError("trainperf report draws its charts with matplotlib: pip install 'trainperf[plot]'") from exc
    return plt


def _chart_loss(plt, run):
    recs = run["ranks"].get(0, [])
    if not recs:
        return None
    fig, ax = plt.subplots(figsize=(7, 3.2))
    ax.plot([r["step"] for r in recs], [r.get("loss") for r in recs], label="train loss (rank 0)", lw=1.2)
    if run["evals"]:
        ax.plot([r["step"] for r in run["evals"]], [r["val_loss"] for r in run["evals"]], "o-", label="val loss")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.legend()
    ax.set_title("Loss")
    return fig


def _chart_throughput(plt, run):
    recs = run["ranks"].get(0, [])
    if not recs:
        return None
    fig, ax = plt.subplots(figsize=(7, 3.2))
    ax.plot([r["step"] for r in recs], [r.get("tokens_per_s") for r in recs], color="#2e86ab", lw=1.2)
    ax.set_xlabel("step")
    ax.set_ylabel("tokens/s (all ranks)")
    ax.set_title("Throughput (wall clock per step)")
    mfu = [(r["step"], 100 * r["mfu"]) for r in recs if r.get("mfu") is not None]
    if mfu:
        ax2 = ax.twinx()
        ax2.plot(*zip(*mfu), color="#e4572e", lw=0.8, ls="--", alpha=0.8)  # same shape as tokens/s
        ax2.set_ylabel("MFU % (formula FLOPs)", color="#e4572e")
    return fig


def _chart_phases(plt, run):
    recs = [r for r in run["ranks"].get(0, []) if r.get("phases_s")]
    if not recs:
        return None
    names = [p for p in PHASE_COLORS if any(p in r["phases_s"] for r in recs)]
    names += sorted({k for r in recs for k in r["phases_s"]} - set(names))
    steps = [r["step"] for r in recs]
    ys = [[1000 * r["phases_s"].get(n, 0.0) for r in recs] for n in names]
    fig, ax = plt.subplots(figsize=(7, 3.2))
    ax.stackplot(steps, *ys, labels=names, colors=[PHASE_COLORS.get(n, "#999999") for n in names])
    ax.set_xlabel("step")
    ax.set_ylabel("ms per step")
    ax.set_title("Time per phase (stacked, rank 0)")
    ax.legend(loc="upper right", fontsize=8)
    return fig


def _chart_utilization(plt, run):
    series = {"machine CPU %": "cpu_pct", "GPU kernel-busy % (NVML)": "gpu_kernel_busy_pct",
              "SM active % (GPM)": "gpu_sm_active_pct", "tensor active % (GPM)": "gpu_tensor_active_pct",
              "memory-copy util % (NVML)": "gpu_mem_copy_util_pct"}
    fig, ax = plt.subplots(figsize=(7, 3.2))
    drawn = 0
    for rank, recs in sorted(run["samples"].items()):
        for label, key in series.items():
            pts = [(r["elapsed_s"], r[key]) for r in recs if r.get(key) is not None]
            if pts:
                ax.plot(*zip(*pts), lw=1.0, label=f"{label} r{rank}" if len(run["samples"]) > 1 else label)
                drawn += 1
        pts = [(r["elapsed_s"], r["proc_cpu_pct"]) for r in recs if r.get("proc_cpu_pct") is not None]
        if pts:
            ax.plot(*zip(*pts), lw=1.0, ls="--", label=f"process CPU % (100 = 1 core) r{rank}")
            drawn += 1
    if not drawn:
        plt.close(fig)
        return None
    ax.set_xlabel("seconds since the monitor started")
    ax.set_ylabel("%")
    ax.set_title("Utilization over time")
    ax.legend(fontsize=7)
    return fig


def _chart_ranks(plt, run):
    per: dict[int, dict[str, float]] = {}
    for rank, recs in sorted(run["ranks"].items()):
        st = _steady(recs)
        if not st:
            continue
        tot: dict[str, float] = {}
        for r in st:
            for k, v in (r.get("phases_s") or {}).items():
                tot[k] = tot.get(k, 0.0) + v
        per[rank] = {k: 1000 * v / len(st) for k, v in tot.items()}
    if not per:
        return None
    names = [p for p in PHASE_COLORS if any(p in d for d in per.values())]
    fig, ax = plt.subplots(figsize=(7, 3.2))
    bottom = [0.0] * len(per)
    xs = [f"rank {r}" for r in per]
    for n in names:
        vals = [d.get(n, 0.0) for d in per.values()]
        ax.bar(xs, vals, bottom=bottom, label=n, color=PHASE_COLORS[n])
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_ylabel("mean ms per step")
    ax.set_title("Per-rank comparison (steady steps)")
    ax.legend(fontsize=8)
    return fig


def _chart_memory(plt, run):
    fig, ax = plt.subplots(figsize=(7, 3.2))
    drawn = 0
    for rank, recs in sorted(run["samples"].items()):
        for label, key in (("process RSS", "proc_rss_bytes"), ("GPU memory used (NVML)", "gpu_memory_used_bytes")):
            pts = [(r["elapsed_s"], r[key] / 2**30) for r in recs if r.get(key)]
            if pts:
                ax.plot(*zip(*pts), lw=1.0, label=f"{label} r{rank}")
                drawn += 1
    if not drawn:
        plt.close(fig)
        return None
    ax.set_xlabel("seconds since the monitor started")
    ax.set_ylabel("GiB")
    ax.set_title("Memory over time")
    ax.legend(fontsize=8)
    return fig


CHARTS = [("loss", _chart_loss), ("throughput", _chart_throughput), ("phases", _chart_phases),
          ("utilization", _chart_utilization), ("ranks", _chart_ranks), ("memory", _chart_memory)]


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return html.escape(str(v))


def build_report(run_dir: str | Path, out: str | Path | None = None) -> dict[str, Any]:
    """Write the HTML report and PNGs; returns {"html": path, "charts": [png paths], "skipped": [...]}."""
    plt = _plt()
    run_dir = Path(run_dir)
    run = load_run(run_dir)
    result = diagnose(run_dir)
    png_dir = run_dir / "report"
    png_dir.mkdir(parents=True, exist_ok=True)
    charts, skipped, imgs = [], [], []
    for name, fn in CHARTS:
        fig = fn(plt, run)
        if fig is None:
            skipped.append(name)
            continue
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=100)
        plt.close(fig)
        data = buf.getvalue()
        path = png_dir / f"{name}.png"
        path.write_bytes(data)
        charts.append(str(path))
        imgs.append(f'<figure><img alt="{name}" src="data:image/png;base64,{base64.b64encode(data).decode()}">'
                     f"<figcaption>{name}</figcaption></figure>")
    s = result["summary"]
    summ = run["summary"]
    rows = [("steps (recorded / used after warm-up)", f"{s['steps_recorded']} / {s['steps_used']}"),
            ("median step time", f"{1000 * s['step_time_s']:.1f} ms" if s.get("step_time_s") else "-"),
            ("median throughput", f"{s['tokens_per_s']:,.0f} tokens/s" if s.get("tokens_per_s") else "-"),
            ("MFU", f"{100 * s['mfu']:.2f}%" if s.get("mfu") is not None else "-"),
            ("HFU", f"{100 * s['hfu']:.2f}%" if s.get("hfu") is not None else "-"),
            ("peak", s.get("peak_source") or "-"),
            ("MFU convention", summ.get("mfu_convention") or "-"),
            ("HFU convention", summ.get("hfu_convention") or "-"),
            ("FLOPs/token formula | counted", f"{_fmt(summ.get('flops_per_token_formula'))} | "
                                              f"{_fmt(summ.get('flops_per_token_counted'))}"),
            ("time by phase", ", ".join(f"{k} {100 * v:.1f}%" for k, v in s["phase_fractions"].items()) or "-"),
            ("device / precision", f"{summ.get('device', '-')} / {summ.get('precision', '-')}")]
    table = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(str(v))}</td></tr>" for k, v in rows)
    if result["findings"]:
        frows = "".join(
            f"<tr class='{f['severity']}'><td>{f['severity']}</td><td><code>{f['id']}</code></td>"
            f"<td>{html.escape(f['evidence'])}</td><td>{html.escape(f['cause'])}</td><td>{html.escape(f['fix'])}</td></tr>"
            for f in result["findings"])
        findings = ("<table><tr><th>severity</th><th>id</th><th>evidence</th><th>likely cause</th>"
                    f"<th>what to try</th></tr>{frows}</table>")
    else:
        findings = "<p>No rule fired: no bottleneck found in the recorded figures.</p>"
    missing = "".join(f"<li>{html.escape(m)}</li>" for m in result["missing"] + [f"chart '{n}': no data" for n in skipped])
    crashed = "<p class='critical'>No summary.json: the run did not finish; figures come from metrics.jsonl.</p>" \
        if run["crashed"] else ""
    doc = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>trainperf report: {html.escape(run_dir.name)}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1500px; color: #222; }}
table {{ border-collapse: collapse; margin: 1em 0; }} td, th {{ border: 1px solid #ccc; padding: 4px 8px;
text-align: left; vertical-align: top; font-size: 0.9em; }} th {{ background: #f3f3f3; }}
.charts {{ display: flex; flex-wrap: wrap; gap: 12px; }} figure {{ margin: 0; }}
img {{ max-width: 700px; border: 1px solid #ddd; }} .critical {{ background: #fde2dd; }}
.warning {{ background: #fff4cc; }} .info {{ background: #e8f1fb; }}
</style></head><body>
<h1>trainperf report: {html.escape(str(run_dir))}</h1>
{crashed}
<h2>Summary</h2><table>{table}</table>
<h2>Findings</h2>{findings}
<h2>Charts</h2><div class="charts">{''.join(imgs)}</div>
<h2>Not measured</h2><ul>{missing or '<li>nothing</li>'}</ul>
</body></html>
"""
    out = Path(out) if out else run_dir / "report.html"
    out.write_text(doc, encoding="utf-8")
    return {"html": str(out), "charts": charts, "skipped": skipped, "findings": [f["id"] for f in result["findings"]]}


__all__ = ["build_report", "compute_summary"]
