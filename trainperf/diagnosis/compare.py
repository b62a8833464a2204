"""``trainperf compare RUN_A RUN_B [...]``: runs side by side, the speed-up and what changed.

``compare_runs(dirs)`` returns the ``--json`` object::

    {"runs": [{"run_dir", "tokens_per_s", "step_time_s", "mfu", "hfu", "phase_fractions",
               "peak_memory_bytes", "final_loss"}],
     "speedup": [tokens/s of each run / the first's],
     "config_diff": {"dotted.key": [value per run]}}

Every figure is the diagnosis's (:func:`trainperf.diagnosis.run_evidence.compute_summary`): medians
over the steady steps (the first 10% left out), phase fractions without the ``compile`` phase.
Step records no real step can have (a non-positive, non-finite or absurd step time or tokens/s) and
such summary.json figures are left out, and an MFU/HFU outside [0, 1] is left out of the MFU/HFU
figures, each with a note naming the file.
``final_loss`` is the last logged step's loss (null when not finite). ``peak_memory_bytes`` is ``torch.cuda.max_memory_allocated`` on CUDA runs, else the largest
sampled RSS of the training process and its loader workers (samples.jsonl). ``config_diff``
lists every key of the saved config.yaml whose value differs between runs (``run.dir`` left
out). ``format_compare`` is the text, ``build_compare_report`` the HTML.
"""

from __future__ import annotations

import html
import statistics
from pathlib import Path
from typing import Any

from trainperf.diagnosis import charts as C
from trainperf.diagnosis.engine import diagnose_run
from trainperf.diagnosis.evidence import num as _num
from trainperf.diagnosis.rundir import load_run
from trainperf.diagnosis.run_evidence import COMPILE_PHASE
from trainperf.diagnosis.screen import (  # noqa: F401 - the rule diagnose and report share (diagnosis/screen.py)
    MAX_BYTES, MAX_STEP_TIME_S, MAX_TOKENS_PER_S, MAX_TRAIN_TIME_S, SUMMARY_BOUNDS, _bad_step, _no_steps, _rank_file,
    _reasons, _screen_steps, _screen_summary)

IGNORED_KEYS = {"run.dir"}
LOSS_WINDOW = 5  # aligned losses: mean of the records ending at the aligned point


def flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(d, dict) or not d:
        return {prefix: d} if prefix else {}
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def config_diff(configs: list[dict]) -> dict[str, list]:
    flat = [flatten(c) for c in configs]
    keys = sorted({k for f in flat for k in f} - IGNORED_KEYS)
    return {k: [f.get(k) for f in flat] for k in keys if any(f.get(k) != flat[0].get(k) for f in flat[1:])}


def peak_memory(run: dict, s: dict) -> tuple[int | None, str]:
    if s.get("mem_peak_bytes"):
        return int(s["mem_peak_bytes"]), "CUDA max allocated"
    rss = [x.get("proc_rss_bytes") for recs in run["samples"].values() for x in recs]
    rss = [v for v in rss if _num(v)]
    return (int(max(rss)), "sampled RSS") if rss else (None, "not recorded")


def tokens_per_step(recs: list[dict]) -> float | None:
    got = [r["tokens_per_s"] * r["step_time_s"] for r in recs
           if _num(r.get("tokens_per_s")) and _num(r.get("step_time_s"))]
    return statistics.median(got) if got else None


def _loss_curve(recs: list[dict]) -> list[tuple[int, float]]:
    return [(r["step"], float(r["loss"])) for r in recs if isinstance(r.get("step"), int) and _num(r.get("loss"))]


def _loss_upto(curve: list[tuple[int, float]], step: float) -> float | None:
    xs = [loss for st, loss in curve if st <= step][-LOSS_WINDOW:]
    return sum(xs) / len(xs) if xs else None


def _load(run_dirs) -> list[dict]:
    from trainperf.errors import UserError

    if len(run_dirs) < 2:
        raise UserError(f"compare needs two or more run directories, got {len(run_dirs)}; for one run use "
                        "`trainperf diagnose RUN_DIR` or `trainperf report RUN_DIR`")
    loaded = []
    for d in run_dirs:
        run = load_run(d)
        data_notes = _screen_steps(run) + _screen_summary(run)
        if not run["ranks"].get(0):
            raise UserError(_no_steps(d, run))
        diag = diagnose_run(run)
        recs = run["ranks"][0]
        tps = tokens_per_step(recs)
        loaded.append({"run": run, "diag": diag, "s": diag["summary"], "curve": _loss_curve(recs),
                       "tokens_per_step": tps, "memory": peak_memory(run, diag["summary"]), "data_notes": data_notes})
    return loaded


def _entry(x: dict) -> dict:
    s, summ = x["s"], x["run"]["summary"]
    recs = x["run"]["ranks"][0]
    final = _num(recs[-1].get("loss")) if recs else _num(summ.get("final_loss"))  # a diverged run: null
    return {"run_dir": str(x["run"]["dir"]), "tokens_per_s": s.get("tokens_per_s"), "step_time_s": s.get("step_time_s"),
            "mfu": s.get("mfu"), "hfu": s.get("hfu"), "phase_fractions": s.get("phase_fractions") or {},
            "peak_memory_bytes": x["memory"][0], "final_loss": final}


def _result(loaded: list[dict]) -> dict[str, Any]:
    runs = [_entry(x) for x in loaded]
    base = runs[0]["tokens_per_s"]
    speedup = [(r["tokens_per_s"] / base) if (base and r["tokens_per_s"]) else None for r in runs]
    return {"runs": runs, "speedup": speedup, "config_diff": config_diff([x["run"]["config"] for x in loaded])}


def compare_runs(run_dirs: list[str | Path]) -> dict[str, Any]:
    """The ``--json`` object (see the module docstring)."""
    return _result(_load(run_dirs))


def labels(n: int) -> list[str]:
    return [chr(ord("A") + i) if i < 26 else f"R{i}" for i in range(n)]


def _v(v: Any) -> str:
    # None: the key is absent or null; either way the default applies (a preset's shape, an auto value)
    return "(default)" if v is None else str(v).lower() if isinstance(v, bool) else str(v)


def headlines(result: dict) -> list[str]:
    """One line per run after the first: its speed-up over the first, and what changed."""
    lab, runs, out = labels(len(result["runs"])), result["runs"], []
    for i in range(1, len(runs)):
        sp, a, b = result["speedup"][i], runs[0]["tokens_per_s"], runs[i]["tokens_per_s"]
        changed = [f"{k} {_v(v[0])} -> {_v(v[i])}" for k, v in result["config_diff"].items() if v[i] != v[0]]
        speed = (f"{sp:.2f}x the tokens/s of {lab[0]} ({a:,.0f} -> {b:,.0f} tokens/s, median over the steady steps)"
                 if sp is not None else "no tokens/s to compare")
        what = ("changed: " + ", ".join(changed)) if changed else "same config (the difference is the machine or noise)"
        out.append(f"{lab[i]} vs {lab[0]}: {speed}; {what}")
    return out


def _aligned(loaded: list[dict]) -> tuple[list[str], list[list[str]]]:
    """Loss at the last step every run reached, and after the most tokens every run saw."""
    rows: list[list[str]] = []
    heads: list[str] = []
    last_step = min((x["curve"][-1][0] for x in loaded if x["curve"]), default=None)
    if last_step is not None and all(x["curve"] for x in loaded):
        heads.append(f"loss at step {last_step} (mean of {LOSS_WINDOW} records to it)")
        rows.append([_fmt_loss(_loss_upto(x["curve"], last_step)) for x in loaded])
    if all(x["curve"] and x["tokens_per_step"] for x in loaded):
        tokens = min(x["curve"][-1][0] * x["tokens_per_step"] for x in loaded)
        heads.append(f"loss at {tokens:,.0f} tokens (same)")
        rows.append([_fmt_loss(_loss_upto(x["curve"], tokens / x["tokens_per_step"] + 1e-9)) for x in loaded])
    return heads, rows


def _fmt_loss(v: float | None) -> str:
    return f"{v:.4f}" if v is not None else "-"


def table_rows(result: dict, loaded: list[dict]) -> list[list[str]]:
    """[label, value per run] rows shared by the text and the HTML."""
    runs = result["runs"]

    def row(label, fn):
        return [label] + [fn(i, r) for i, r in enumerate(runs)]

    def pct(v):
        return f"{100 * v:.1f}%" if v is not None else "-"

    rows = [row("tokens/s (steady median)", lambda i, r: f"{r['tokens_per_s']:,.0f}" if r["tokens_per_s"] else "-"),
            row("speed-up vs A", lambda i, r: f"{result['speedup'][i]:.2f}x" if result["speedup"][i] else "-"),
            row("tokens/s whole run (summary.json)", lambda i, r: f"{v:,.0f}" if (
                v := _num(loaded[i]["run"]["summary"].get("tokens_per_s"))) else "-"),
            row("step time (steady median)", lambda i, r: f"{1000 * r['step_time_s']:.1f} ms" if r["step_time_s"] else "-"),
            row("MFU", lambda i, r: pct(r["mfu"])), row("HFU", lambda i, r: pct(r["hfu"]))]
    names = [p for p in C.PHASE_COLORS if any(p in r["phase_fractions"] for r in runs)]
    names += sorted({k for r in runs for k in r["phase_fractions"]} - set(names))
    for n in names:
        rows.append(row(f"time in {n}", lambda i, r, n=n: (
            f"{pct(r['phase_fractions'].get(n))} ({1000 * loaded[i]['s']['phase_mean_s'].get(n, 0.0):.1f} ms)")))
    rows.append(row(f"{COMPILE_PHASE} (not in the fractions)",
                    lambda i, r: f"{loaded[i]['s']['compile_s']:.1f} s" if loaded[i]["s"].get("compile_s") else "-"))
    rows.append(row("peak memory", lambda i, r: (f"{r['peak_memory_bytes'] / 2**20:,.0f} MiB ({loaded[i]['memory'][1]})"
                                                  if r["peak_memory_bytes"] else "-")))
    rows.append(row("final loss", lambda i, r: _fmt_loss(r["final_loss"])))
    heads, aligned = _aligned(loaded)
    rows += [[h] + vals for h, vals in zip(heads, aligned)]
    return rows


def findings_of(x: dict) -> str:
    return ", ".join(f"{f['id']} ({f['severity']})" for f in x["diag"]["findings"]) or "none"


def notes(loaded: list[dict]) -> list[str]:
    """Caveats that change how the figures read."""
    lab = labels(len(loaded))
    out = [f"{lab[i]}: {n}" for i, x in enumerate(loaded) for n in x.get("data_notes", [])]
    for i, x in enumerate(loaded):
        recs = x["run"]["ranks"].get(0) or []
        planned = (x["run"].get("config") or {}).get("run", {})
        planned = planned.get("steps") if isinstance(planned, dict) else None
        if x["run"].get("crashed") and recs:
            of = f" of run.steps={planned}" if isinstance(planned, int) and not isinstance(planned, bool) else ""
            out.append(f"{lab[i]} did not finish (no summary.json): its last step record is step {recs[-1]['step']}"
                       f"{of}; its 'final loss' is the last logged one")
        if len(recs) < 3:  # _steady keeps them all: no step is left out as warm-up
            out.append(f"{lab[i]} has {len(recs)} step record(s): no steady steps after warm-up, so its medians "
                       "include the first (warm-up) step and read slow")
    peaks = [x["s"].get("peak_source") for x in loaded]
    if len(set(peaks)) > 1:
        lab = labels(len(loaded))

        def peak(i: int, p) -> str:
            if p:
                return p
            if loaded[i]["run"].get("crashed"):  # a killed run: its MFU comes from the step records
                return "not recorded (no summary.json: the run did not finish; MFU from its step records)"
            return "none (no MFU)"
        out.append("MFU/HFU use different peaks, so they compare only within a run: "
                   + "; ".join(f"{lab[i]}: {peak(i, p)}" for i, p in enumerate(peaks)))
    noisy = [labels(len(loaded))[i] for i, x in enumerate(loaded)
             if any(f["id"] == "host_contention" for f in x["diag"]["findings"])]
    if noisy:
        out.append(f"host_contention in {', '.join(noisy)}: measured on a shared or unsteady host; the speed-up "
                   "holds only as far as the contention was the same")
    return out


def format_compare(result: dict, loaded: list[dict]) -> str:
    lab = labels(len(result["runs"]))
    lines = ["== trainperf compare =="] + [f"  {line}" for line in headlines(result)] + [""]
    lines += [f"  {lab[i]} = {r['run_dir']}" for i, r in enumerate(result["runs"])] + [""]
    rows = [[""] + lab] + table_rows(result, loaded)
    widths = [max(len(r[j]) for r in rows) for j in range(len(rows[0]))]
    for r in rows:
        lines.append("  " + r[0].ljust(widths[0]) + "  " + "  ".join(c.rjust(w) for c, w in zip(r[1:], widths[1:])))
    lines.append("")
    lines += [f"  findings {lab[i]}: {findings_of(x)}" for i, x in enumerate(loaded)] + [""]
    if result["config_diff"]:
        lines.append(f"  config differences ({' | '.join(lab)}):")
        for k, v in result["config_diff"].items():
            lines.append(f"    {k}: " + " | ".join(_v(x) for x in v))
    else:
        lines.append("  config differences: none (run.dir aside)")
    lines += [f"  note: {n}" for n in notes(loaded)]
    return "\n".join(lines)


def compare_text(run_dirs: list[str | Path]) -> tuple[dict, str]:
    loaded = _load(run_dirs)
    result = _result(loaded)
    return result, format_compare(result, loaded)


def compare_json(run_dirs: list[str | Path]) -> tuple[dict, list[str]]:
    """The ``--json`` object and the notes the text would print (``--json`` prints them on stderr)."""
    loaded = _load(run_dirs)
    return _result(loaded), notes(loaded)


# ---------------------------------------------------------------------- HTML
def _charts(result: dict, loaded: list[dict]) -> list[tuple[str, str | None]]:
    lab = labels(len(loaded))
    name = [f"{lab[i]}: {Path(r['run_dir']).name}" for i, r in enumerate(result["runs"])]
    by_step = [{"label": name[i], "x": [p[0] for p in x["curve"]], "y": [p[1] for p in x["curve"]], "dash": i % 2}
               for i, x in enumerate(loaded)]  # every other run dashed: identical curves stay visible
    by_tokens = [{"label": name[i], "x": [p[0] * x["tokens_per_step"] for p in x["curve"]],
                  "y": [p[1] for p in x["curve"]], "dash": i % 2} for i, x in enumerate(loaded) if x["tokens_per_step"]]
    tput = [{"label": name[i], "x": [r["step"] for r in x["run"]["ranks"][0]],
             "y": [r.get("tokens_per_s") for r in x["run"]["ranks"][0]]} for i, x in enumerate(loaded)]
    phases = sorted({k for x in loaded for k in x["s"]["phase_mean_s"]},
                    key=lambda p: list(C.PHASE_COLORS).index(p) if p in C.PHASE_COLORS else 99)
    stacks = [(p, [1000 * x["s"]["phase_mean_s"].get(p, 0.0) for x in loaded], C.PHASE_COLORS.get(p, "#999999"))
              for p in phases]
    mem = [(r["peak_memory_bytes"] or 0) / 2**20 for r in result["runs"]]
    return [("loss_by_step", C.line_chart(by_step, title="Loss by step", xlabel="step", ylabel="train loss")),
            ("loss_by_tokens", C.line_chart(by_tokens, title="Loss by tokens seen", xlabel="tokens",
                                            ylabel="train loss")),
            ("throughput", C.line_chart(tput, title="Throughput per step", xlabel="step", ylabel="tokens/s",
                                        y_from_zero=True)),
            ("phases", C.stacked_bars(lab, stacks, title="Time per phase (steady steps, mean)",
                                      ylabel="ms per step")),
            ("peak_memory", C.stacked_bars(lab, [("peak memory", mem, "#9b59b6")], title="Peak memory "
                                           "(CUDA max allocated, else sampled RSS)", ylabel="MiB")
             if any(mem) else None)]


def build_compare_report(run_dirs: list[str | Path], out: str | Path | None = None) -> dict[str, Any]:
    """Write the side-by-side HTML (default RUN_A/compare.html, charts in RUN_A/compare/*.svg)."""
    from trainperf.diagnosis.report import write_charts

    loaded = _load(run_dirs)
    result = _result(loaded)
    first = Path(result["runs"][0]["run_dir"])
    paths, figs, skipped = write_charts(_charts(result, loaded), first / "compare")
    lab = labels(len(loaded))
    e = html.escape
    heads = "".join(f"<p class='headline'>{e(h)}</p>" for h in headlines(result))
    runs = C.table([[lab[i], r["run_dir"]] for i, r in enumerate(result["runs"])], header=["run", "directory"])
    figures = C.table(table_rows(result, loaded) + [["findings"] + [findings_of(x) for x in loaded]],
                      header=[""] + lab, num_cols=range(1, len(lab) + 1))
    diff = (C.table([[k] + [_v(x) for x in v] for k, v in result["config_diff"].items()], header=["key"] + lab)
            if result["config_diff"] else "<p>None (run.dir aside).</p>")
    body = (f"<h1>trainperf compare: {e(', '.join(Path(r['run_dir']).name for r in result['runs']))}</h1>{heads}"
            f"{runs}<h2>Figures</h2>{figures}<p>Medians over the steady steps (the first 10% left out); phase "
            f"fractions leave out the '{COMPILE_PHASE}' phase.</p>"
            + "".join(f"<p class='warning'>{e(n)}</p>" for n in notes(loaded))
            + f"<h2>Config differences</h2>{diff}"
            f"<h2>Charts</h2><div class=\"charts\">{''.join(figs)}</div>")
    out = Path(out) if out else first / "compare.html"
    from trainperf.runio import atomic_write_text

    atomic_write_text(out, C.page("trainperf compare", body))  # replaced whole or not at all
    return {"html": str(out), "charts": paths, "skipped": skipped, **result}
