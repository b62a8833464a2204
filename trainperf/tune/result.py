"""What a search leaves: the trial records, the choice, the JSON and the table, the files.

The tune directory (default ``runs/tune-<config name>/``) holds everything needed to reproduce
and audit the choice: ``trials.jsonl`` (one line per trial, written as it finishes),
``settings.json`` (default and chosen settings, the side-by-side figures, the notes),
``tuned.yaml`` (a copy of the tuned config) and ``doctor.json`` (the machine, as ``trainperf
doctor --json`` prints it).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from trainperf.tune.space import Settings, label

STATUSES = ("ok", "pruned", "oom", "failed")


def _num(x):
    """Strict JSON: NaN and infinities become null."""
    return None if isinstance(x, float) and not math.isfinite(x) else x


@dataclass
class TrialRecord:
    settings: Settings  # the candidate's full settings
    status: str  # ok | pruned | oom | failed
    dimension: str = "default"
    changed: Settings = field(default_factory=dict)  # what it changes against the best at the time
    tokens_per_s: float | None = None
    step_s: float | None = None
    peak_memory_bytes: int | None = None
    peak_memory_source: str | None = None
    estimate_bytes: int | None = None
    first_step_s: float | None = None  # compilation, when compile is on (not in tokens/s)
    elapsed_s: float | None = None
    build_s: float | None = None
    warm_steps: int | None = None
    vs_best: float | None = None  # paired trials: tokens/s ratio to the best, interleaved (see trial.Paired)
    rounds_won: str | None = None  # paired trials: rounds in which it was faster, "k/R"
    p_faster: float | None = None  # paired trials: one-sided Wilcoxon signed-rank p (tune/stats.py)
    minor_faults_per_step: float | None = None  # trials in their own process: page faults per timed step
    reason: str | None = None
    expected: str | None = None  # its dimension's place in the search order and why (tune/order.py)

    def as_dict(self) -> dict[str, Any]:
        return {k: _num(v) for k, v in asdict(self).items()}


@dataclass
class Side:
    """The default or the chosen candidate, as reported."""

    settings: Settings
    tokens_per_s: float | None
    peak_memory_bytes: int | None
    peak_memory_source: str | None = None
    trial: TrialRecord | None = None


@dataclass
class TuneResult:
    default: Side
    best: Side
    config_path: str | None  # the tuned YAML
    speedup: float | None  # best / default, measured side by side (1.0 when the default is kept unmeasured)
    trials: list[TrialRecord]
    budget_s: float
    elapsed_s: float
    tune_dir: str
    notes: list[str] = field(default_factory=list)
    side_by_side: dict | None = None  # the chosen candidate's against the default
    interrupted: bool = False
    confirmations: list[dict] = field(default_factory=list)  # every side-by-side measurement made
    order: list[dict] = field(default_factory=list)  # the dimensions as searched, surest gains first (tune/order.py)
    kept_previous: str | None = None  # where the file config_path replaced was copied (None: nothing replaced)

    def to_json(self) -> dict[str, Any]:
        """The ``--json`` document (exactly the documented keys; strict JSON)."""
        side = lambda s: {"tokens_per_s": _num(s.tokens_per_s), "peak_memory_bytes": s.peak_memory_bytes,  # noqa: E731
                          "settings": s.settings}
        return {
            "default": side(self.default),
            "best": {**side(self.best), "config_path": self.config_path},
            "speedup": _num(self.speedup),
            "trials": [{"settings": t.settings, "status": t.status, "tokens_per_s": _num(t.tokens_per_s),
                        "reason": t.reason} for t in self.trials],
            "budget_s": _num(self.budget_s),
            "elapsed_s": _num(self.elapsed_s),
        }

    def settings_doc(self) -> dict[str, Any]:
        return {"default": self.default.settings, "chosen": self.best.settings, "config_path": self.config_path,
                "speedup": _num(self.speedup), "side_by_side": self.side_by_side,
                "confirmations": self.confirmations, "notes": self.notes, "order": self.order,
                "interrupted": self.interrupted, "budget_s": self.budget_s, "elapsed_s": self.elapsed_s,
                "peak_memory": {"default": self.default.peak_memory_bytes, "best": self.best.peak_memory_bytes,
                                "source": self.best.peak_memory_source}}


def _mib(n) -> str:
    return "-" if n is None else f"{n / 2**20:,.0f}"


def render(res: TuneResult) -> str:
    """The search order with its reasons, the trial table, then before / after."""
    lines = ["search order (surest gains first):"] if res.order else []
    for i, o in enumerate(res.order, 1):
        gain = f", expected x{o['expected_speedup']:.2f}" if o.get("expected_speedup") is not None else ""
        lines.append(f"  {i}. {o['dimension']} [{o['class']}{gain}]: {o['why']}")
    rows = [["#", "dimension", "changes", "status", "tokens/s", "vs best", "peak MiB", "est MiB", "first s",
             "faults/step", "reason"]]
    for i, t in enumerate(res.trials):
        rows.append([str(i), t.dimension, label(t.changed) or "(default)", t.status,
                     "-" if t.tokens_per_s is None else f"{t.tokens_per_s:,.0f}",
                     "-" if t.vs_best is None else f"x{t.vs_best:.3f} ({t.rounds_won}, p={t.p_faster:.2f})", _mib(t.peak_memory_bytes),
                     _mib(t.estimate_bytes), "-" if t.first_step_s is None else f"{t.first_step_s:.1f}",
                     "-" if t.minor_faults_per_step is None else f"{t.minor_faults_per_step:,.0f}",
                     (t.reason or "")[:110]])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1] for r in rows]
    src = next((t.peak_memory_source for t in res.trials if t.peak_memory_source), "-")
    lines.append(f"(tokens/s: tokens per step / median step time of the timed steps; vs best: paired trials, the "
                 "ratio to the best so far measured interleaved with it (rounds won, one-sided signed-rank p that it is "
                 f"faster: adopted when the ratio > 1 and p < 0.05); peak: {src}; est: the memory "
                 "estimate; first s: the first step, the compilation when compile is on, not in tokens/s; faults/step: "
                 "minor page faults per timed step of the trial's process, the pages the C allocator took afresh from "
                 "the kernel)")
    lines.append("")
    d, b = res.default, res.best
    changed = {k: v for k, v in b.settings.items() if d.settings.get(k) != v}
    lines.append(f"default  {_fig(d.tokens_per_s)} tokens/s  peak {_mib(d.peak_memory_bytes)} MiB")
    lines.append(f"tuned    {_fig(b.tokens_per_s)} tokens/s  peak {_mib(b.peak_memory_bytes)} MiB  "
                 f"changes: {label(changed) or 'none (the default is kept)'}")
    for c in res.confirmations:
        lines.append(f"side by side: {label(c['changes'])}: x{c['ratio']:.3f} against the default "
                     f"({c['a_tokens_per_s']:,.0f} -> {c['b_tokens_per_s']:,.0f} tokens/s"
                     + (f", faster in {c['b_faster_rounds']} of {c['rounds']} rounds" if "rounds" in c else "")
                     + (f", signed-rank p = {c['p_faster']:.3f}" if c.get("p_faster") is not None else "")
                     + (f"; page faults per step {c['a_minor_faults_per_step']:,.0f} -> {c['b_minor_faults_per_step']:,.0f}"
                        if c.get("b_minor_faults_per_step") is not None else "") + ")")
    if res.speedup is not None:
        how = res.side_by_side["method"] if res.side_by_side else "the default itself"
        lines.append(f"speed-up x{res.speedup:.3f} ({how})")
    for note in res.notes:
        lines.append(f"note: {note}")
    lines.append(f"tuned config: {res.config_path}   tune directory: {res.tune_dir}   "
                 f"{res.elapsed_s:.0f} s of a {res.budget_s:.0f} s budget")
    return "\n".join(lines)


def _fig(x) -> str:
    return "-" if x is None else f"{x:,.0f}"


class TrialLog:
    """``trials.jsonl``: one line per trial, flushed as it finishes."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        path.write_text("")

    def write(self, rec: TrialRecord) -> None:
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(rec.as_dict(), allow_nan=False) + "\n")


def write_outputs(res: TuneResult, tuned_yaml: str, doctor: dict | None) -> None:
    from trainperf.runio import atomic_write_text

    d = Path(res.tune_dir)
    d.mkdir(parents=True, exist_ok=True)
    atomic_write_text(d / "tuned.yaml", tuned_yaml)
    atomic_write_text(d / "settings.json", json.dumps(res.settings_doc(), indent=2, allow_nan=False, default=str) + "\n")
    atomic_write_text(d / "result.json", json.dumps(res.to_json(), indent=2, allow_nan=False) + "\n")
    if doctor is not None:
        atomic_write_text(d / "doctor.json", json.dumps(doctor, indent=2, default=str) + "\n")
