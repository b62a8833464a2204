"""``trainperf compare A B`` on two profiles: profiler traces (a file or a directory of ranks) or Nsight captures,
either side. Did the change help, by how much, and where did the time go?

Two profiling windows rarely hold the same amount of work, so whole windows compare nothing: both sides are
aligned on the step. Each side's **job step time** is, for every profiler step, the slowest rank's duration of
that step (every rank waits for the slowest at its collectives); its median over the steps and the spread
(interquartile range) are reported per side. The **speed-up** is median(A) / median(B); its 95% confidence
interval is a bootstrap over the steps of each side (the same seed every run: deterministic), so a claim
that rests on two noisy steps shows it.

Where it came from: the median per step of each category of the TensorBoard plugin's step breakdown (kernel,
communication, memcpy, memset, runtime, dataloader, cpu_exec, other), A against B, and the kernel families
(a kernel's name without its template arguments and parameters: ``at::native::vectorized_elementwise_kernel``)
added, removed, faster or slower, in ms per step over every rank; then the findings that went away or appeared.

No speed-up is claimed where the two are not comparable: a different GPU, a different world size, or fewer
than ``MIN_STEPS`` profiled steps on a side. The comparison is still shown, and says why no speed-up is given.
"""

from __future__ import annotations

import re
import statistics
from pathlib import Path
from typing import Any, Callable

import numpy as np

from trainperf.diagnosis.text import BREAKDOWN
from trainperf.diagnosis.text import _device as device_name

ALIGNMENT = ("Both sides are aligned on the step: the job's step time is, for each profiler step, the slowest rank's "
             "duration; medians and interquartile ranges are over the steps; the speed-up is median(A) / median(B), its "
             "95% interval a bootstrap over each side's steps.")
MIN_STEPS = 3
"""steps a side needs before a speed-up is claimed from it (a median of fewer is one step's noise)"""
BOOTSTRAP = 2000
FAMILY_MIN_SHARE = 0.01
"""a kernel family's change is listed when it moves at least this share of A's step"""
KERNELS_READ = 100_000


def family(name: str) -> str:
    """A kernel's family: its name without ``void``, template arguments and parameters."""
    n = re.sub(r"^\s*void\s+", "", str(name)).replace("(anonymous namespace)", "{anonymous}")
    depth, out = 0, []
    for ch in n:
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(0, depth - 1)
        elif ch == "(" and depth == 0:
            break
        elif depth == 0:
            out.append(ch)
    return "".join(out).strip() or str(name)


# ---------------------------------------------------------------------------- one side
def _job_steps(traces: list[dict]) -> list[float]:
    """The job's step times (us): per profiler step number, the slowest rank's; without step numbers shared by
    the ranks, by position."""
    by: dict[Any, float] = {}
    for t in traces:
        for i, row in enumerate(t.get("per_step") or []):
            key = row.get("number") if row.get("number") is not None else i
            dur = row.get("dur_us")
            if isinstance(dur, (int, float)):
                by[key] = max(by.get(key, 0.0), float(dur))
    return [by[k] for k in sorted(by, key=lambda k: (isinstance(k, str), k))]


def _categories(traces: list[dict]) -> dict[str, float]:
    """The breakdown's categories, us per step: per rank the median over its steps, then the mean over ranks."""
    out = {}
    for k in BREAKDOWN:
        per_rank = []
        for t in traces:
            vals = [row[f"{k}_us"] for row in t.get("per_step") or [] if isinstance(row.get(f"{k}_us"), (int, float))]
            if vals:
                per_rank.append(statistics.median(vals))
        out[k] = sum(per_rank) / len(per_rank) if per_rank else 0.0
    return out


def _causes(traces: list[dict]) -> dict[str, float]:
    """The step by cause along the critical path (:mod:`trainperf.trace.attribution`), us per step, the mean over
    the ranks: the GPU's busy parts and its idle by the host cause it waited on."""
    out: dict[str, float] = {}
    n = 0
    for t in traces:
        a = t.get("attribution") or {}
        if not a:
            continue
        n += 1
        for k in ("compute", "communication", "memcpy", "memset"):
            out[k] = out.get(k, 0.0) + ((a.get("gpu_us") or {}).get(k) or 0.0)
        for c in a.get("idle_causes") or []:
            key = f"idle: {c['cause']}"
            out[key] = out.get(key, 0.0) + c["us_per_step"]
    return {k: v / n for k, v in out.items()} if n else {}


def _families(traces: list[dict]) -> dict[str, dict]:
    """Kernel time per step by family, summed over the ranks' kernels and averaged over the ranks."""
    fam: dict[str, dict] = {}
    n = max(1, len(traces))
    for t in traces:
        for k in t.get("top_kernels") or []:
            f = fam.setdefault(family(k["name"]), {"us_per_step": 0.0, "count_per_step": 0.0, "kind": k.get("kind")})
            f["us_per_step"] += (k.get("us_per_step") or 0.0) / n
            f["count_per_step"] += k["count"] / max(1, t.get("steps") or 1) / n
    return fam


def side(path: str | Path, result: dict) -> dict[str, Any]:
    """One side's figures, from its diagnosis (:func:`trainperf.diagnosis.engine.diagnose_found`)."""
    traces = result.get("traces") or []
    steps = _job_steps(traces)
    devices = sorted({device_name(t) for t in traces})
    worlds = {(t.get("distributed_info") or {}).get("world_size") for t in traces} - {None}
    q = np.percentile(steps, [25, 50, 75]) if steps else [None] * 3
    return {"path": str(path), "ranks": len(traces), "world_size": max(worlds) if worlds else len(traces),
            "devices": devices, "steps": len(steps), "step_us": [float(s) for s in steps],
            "median_step_us": float(q[1]) if steps else None,
            "iqr_us": [float(q[0]), float(q[2])] if steps else None,
            "categories_us": _categories(traces), "causes_us": _causes(traces), "families": _families(traces),
            "findings": [{"id": f["id"], "severity": f["severity"], "evidence": f["evidence"]}
                         for f in result.get("findings") or []]}


# ---------------------------------------------------------------------------- the two
def comparable(a: dict, b: dict) -> list[str]:
    """Why no speed-up may be claimed from A against B (empty: it may)."""
    why = []
    if a["devices"] != b["devices"]:
        why.append(f"a different GPU: A ran on {', '.join(a['devices'])}, B on {', '.join(b['devices'])}")
    if a["world_size"] != b["world_size"]:
        why.append(f"a different world size: A {a['world_size']} rank(s), B {b['world_size']}")
    for name, s in (("A", a), ("B", b)):
        if s["steps"] < MIN_STEPS:
            why.append(f"too few steps: {name} holds {s['steps']} profiled step(s), a speed-up needs {MIN_STEPS} or "
                       "more per side (profile more: torch.profiler.schedule(..., active=5))")
    return why


def speedup(a_steps: list[float], b_steps: list[float], seed: int = 0) -> dict[str, float]:
    """median(A) / median(B) and its 95% bootstrap interval over the steps of each side."""
    a, b = np.asarray(a_steps, dtype=float), np.asarray(b_steps, dtype=float)
    rng = np.random.default_rng(seed)
    ra = np.median(a[rng.integers(0, a.size, (BOOTSTRAP, a.size))], axis=1)
    rb = np.median(b[rng.integers(0, b.size, (BOOTSTRAP, b.size))], axis=1)
    ratio = ra / rb
    lo, hi = np.percentile(ratio, [2.5, 97.5])
    return {"speedup": float(np.median(a) / np.median(b)), "ci95": [float(lo), float(hi)],
            "method": f"median step time of A / of B; 95% interval: bootstrap over each side's steps ({BOOTSTRAP} "
                      "resamples)"}


def _family_changes(a: dict, b: dict) -> list[dict]:
    step = a["median_step_us"] or 1.0
    out = []
    for name in set(a["families"]) | set(b["families"]):
        fa, fb = a["families"].get(name), b["families"].get(name)
        ua, ub = (fa or {}).get("us_per_step", 0.0), (fb or {}).get("us_per_step", 0.0)
        if abs(ub - ua) < FAMILY_MIN_SHARE * step:
            continue
        what = "added" if fa is None else "removed" if fb is None else "slower" if ub > ua else "faster"
        out.append({"family": name, "change": what, "kind": (fb or fa).get("kind"), "a_us_per_step": ua,
                    "b_us_per_step": ub, "delta_us_per_step": ub - ua})
    return sorted(out, key=lambda r: -abs(r["delta_us_per_step"]))


def compare_profiles(a_path: str | Path, b_path: str | Path, *, top_n: int = KERNELS_READ,
                     patterns: list[str] | None = None, progress: Callable[[int], None] | None = None,
                     step: str | None = None) -> dict[str, Any]:
    """Compare two profiles (see the module docstring): the ``--json`` of ``trainperf compare A B``."""
    from trainperf.diagnosis.engine import diagnose_found
    from trainperf.trace.ranks import discover

    sides = []
    for p in (a_path, b_path):
        found = discover(p)
        if found["kind"] == "run":
            from trainperf.errors import UserError

            raise UserError(f"{p} is a run directory and the other path is a profile: compare two run directories "
                            "(`trainperf compare RUN_A RUN_B`) or two profiles (traces or Nsight captures)")
        sides.append(side(p, diagnose_found(found, top_n=top_n, patterns=patterns, progress=progress, step=step)))
    a, b = sides
    why = comparable(a, b)
    out: dict[str, Any] = {"kind": "profiles", "a": a, "b": b, "comparable": not why, "not_comparable": why,
                           "speedup": None, "ci95": None}
    if not why:
        out.update(speedup(a["step_us"], b["step_us"]))
    out["categories_us"] = {k: {"a": a["categories_us"][k], "b": b["categories_us"][k],
                                "delta": b["categories_us"][k] - a["categories_us"][k]} for k in BREAKDOWN}
    keys = list(dict.fromkeys(list(a["causes_us"]) + list(b["causes_us"])))
    out["causes_us"] = {k: {"a": a["causes_us"].get(k, 0.0), "b": b["causes_us"].get(k, 0.0),
                            "delta": b["causes_us"].get(k, 0.0) - a["causes_us"].get(k, 0.0)} for k in keys}
    moved = sorted(((k, v) for k, v in out["causes_us"].items() if k.startswith("idle: ") and v["delta"] < 0),
                   key=lambda kv: kv[1]["delta"])
    step = a["median_step_us"] or 0.0
    out["removed_causes"] = [k[6:] for k, v in moved if step and -v["delta"] >= FAMILY_MIN_SHARE * step * 5]
    out["kernel_families"] = _family_changes(a, b)
    ids_a, ids_b = {f["id"] for f in a["findings"]}, {f["id"] for f in b["findings"]}
    out["findings_gone"] = [f for f in a["findings"] if f["id"] not in ids_b]
    out["findings_new"] = [f for f in b["findings"] if f["id"] not in ids_a]
    for s in (a, b):  # the changes above carry the families that moved; each side keeps how many it ran
        s["kernel_families"] = len(s.pop("families"))
    return out


def _ms(us) -> str:
    return f"{us / 1000:.2f} ms" if isinstance(us, (int, float)) else "n/a"


def format_profiles(r: dict) -> str:
    """The text of ``trainperf compare A B`` on two profiles."""
    a, b = r["a"], r["b"]
    lines = ["== trainperf compare (profiles) =="]
    for name, s in (("A", a), ("B", b)):
        iqr = f", IQR {_ms(s['iqr_us'][0])} to {_ms(s['iqr_us'][1])}" if s["iqr_us"] else ""
        lines.append(f"  {name}: {s['path']} ({', '.join(s['devices'])}; {s['ranks']} rank(s) of {s['world_size']}; "
                     f"{s['steps']} step(s)): step {_ms(s['median_step_us'])} median{iqr}")
    if r["comparable"]:
        lo, hi = r["ci95"]
        lines.append(f"  speed-up B over A: {r['speedup']:.3f}x (95% interval {lo:.3f}x to {hi:.3f}x; {r['method']})")
    else:
        lines.append("  no speed-up claimed: the two are not comparable:")
        lines += [f"    - {w}" for w in r["not_comparable"]]
    lines.append("  where the step changed (median ms per step, A -> B):")
    for k, v in sorted(r["categories_us"].items(), key=lambda kv: -abs(kv[1]["delta"])):
        if v["a"] or v["b"]:
            lines.append(f"    {k:<14} {v['a'] / 1000:9.2f} -> {v['b'] / 1000:9.2f}  ({v['delta'] / 1000:+.2f})")
    if r.get("causes_us"):
        lines.append("  where the critical path changed (ms per step, A -> B; idle: what the GPU waited on):")
        for k, v in sorted(r["causes_us"].items(), key=lambda kv: -abs(kv[1]["delta"]))[:8]:
            if abs(v["delta"]) >= 1.0:
                lines.append(f"    {k:<22} {v['a'] / 1000:9.2f} -> {v['b'] / 1000:9.2f}  ({v['delta'] / 1000:+.2f})")
        if r.get("removed_causes"):
            lines.append(f"  removed: the GPU no longer waits on {', '.join(r['removed_causes'])}")
    if r["kernel_families"]:
        lines.append("  kernel families that moved (ms per step, A -> B):")
        for f in r["kernel_families"][:12]:
            lines.append(f"    {f['change']:<8} {f['family'][:70]}: {f['a_us_per_step'] / 1000:.2f} -> "
                         f"{f['b_us_per_step'] / 1000:.2f} ({f['delta_us_per_step'] / 1000:+.2f})")
    for label, key in (("went away", "findings_gone"), ("appeared", "findings_new")):
        for f in r[key]:
            lines.append(f"  finding {label}: [{f['severity']}] {f['id']}: {f['evidence']}")
    if not r["findings_gone"] and not r["findings_new"]:
        lines.append("  findings: the same rules fire on both")
    return "\n".join(lines)


__all__ = ["MIN_STEPS", "build_profiles_report", "comparable", "compare_profiles", "family", "format_profiles", "side",
           "speedup"]


# ---------------------------------------------------------------------------- HTML
def default_out(a_path: str | Path) -> Path:
    p = Path(a_path)
    return p / "compare.html" if p.is_dir() else p.with_name(p.name.split(".json")[0].split(".sqlite")[0]
                                                              + ".compare.html")


def build_profiles_report(a_path: str | Path, b_path: str | Path, out: str | Path | None = None,
                          **kw) -> dict[str, Any]:
    """The comparison of two profiles as one self-contained HTML page (default beside A: A_DIR/compare.html or
    A.compare.html); returns {"html", "charts", "skipped", "comparable", "speedup"}."""
    import html

    from trainperf.diagnosis import charts as C
    from trainperf.runio import atomic_write_text
    from trainperf.diagnosis.trace_report import BREAKDOWN_COLORS

    r = compare_profiles(a_path, b_path, **kw)
    e = html.escape
    a, b = r["a"], r["b"]
    stacks = [(k, [r["categories_us"][k]["a"] / 1000, r["categories_us"][k]["b"] / 1000], BREAKDOWN_COLORS[k])
              for k in BREAKDOWN]
    drawn = [("profiles_breakdown", C.stacked_bars(["A", "B"], stacks, title="Step broken down (median per step, "
                                                   "TensorBoard plugin's categories)", ylabel="ms per step")),
             ("profiles_steps", C.line_chart([{"label": n, "x": list(range(1, len(s["step_us"]) + 1)),
                                               "y": [v / 1000 for v in s["step_us"]], "markers": True}
                                              for n, s in (("A", a), ("B", b)) if s["step_us"]],
                                             title="Job step time per profiler step (slowest rank)", xlabel="step",
                                             ylabel="ms", y_from_zero=True) if a["step_us"] or b["step_us"] else None)]
    if r["comparable"]:
        lo, hi = r["ci95"]
        head = f"<p class='headline'>B is {r['speedup']:.3f}x the speed of A (95% interval {lo:.3f}x to {hi:.3f}x)</p>"
    else:
        head = ("<p class='warning'>No speed-up claimed: the two are not comparable.</p><ul>"
                + "".join(f"<li>{e(w)}</li>" for w in r["not_comparable"]) + "</ul>")
    sides = C.table([[n, s["path"], ", ".join(s["devices"]), f"{s['ranks']} of {s['world_size']}", str(s["steps"]),
                      _ms(s["median_step_us"]), f"{_ms(s['iqr_us'][0])} to {_ms(s['iqr_us'][1])}" if s["iqr_us"]
                      else "-"] for n, s in (("A", a), ("B", b))],
                    header=["", "profile", "device", "ranks", "steps", "median step", "IQR"])
    cats = C.table([[k, f"{v['a'] / 1000:.2f}", f"{v['b'] / 1000:.2f}", f"{v['delta'] / 1000:+.2f}"]
                    for k, v in r["categories_us"].items() if v["a"] or v["b"]],
                   header=["category", "A ms/step", "B ms/step", "change"], num_cols=(1, 2, 3))
    fams = C.table([[f["change"], f["family"], f["kind"] or "-", f"{f['a_us_per_step'] / 1000:.2f}",
                     f"{f['b_us_per_step'] / 1000:.2f}", f"{f['delta_us_per_step'] / 1000:+.2f}"]
                    for f in r["kernel_families"][:40]],
                   header=["change", "kernel family", "kind", "A ms/step", "B ms/step", "change"], num_cols=(3, 4, 5)) \
        if r["kernel_families"] else "<p>No kernel family moved by more than 1% of A's step.</p>"
    found = "".join(f"<li>{label}: <code>{e(f['id'])}</code> ({e(f['severity'])}): {e(f['evidence'])}</li>"
                    for label, key in (("went away", "findings_gone"), ("appeared", "findings_new")) for f in r[key])
    figs = "".join(C.figure(n, svg) for n, svg in drawn if svg)
    body = (f"<h1>trainperf compare: {e(Path(a['path']).name)} vs {e(Path(b['path']).name)}</h1>{head}{sides}"
            f"<h2>Where the step changed</h2>{cats}<div class=\"charts\">{figs}</div>"
            f"<h2>Kernel families</h2>{fams}<h2>Findings</h2><ul>{found or '<li>the same rules fire on both</li>'}</ul>"
            f"<p>{e(ALIGNMENT)}</p>")
    out = Path(out) if out else default_out(a_path)
    atomic_write_text(out, C.page("trainperf compare", body))
    return {"html": str(out), "charts": [n for n, s in drawn if s], "skipped": [n for n, s in drawn if not s],
            "comparable": r["comparable"], "speedup": r["speedup"], "not_comparable": r["not_comparable"]}
