"""Reading a run directory (what ``trainperf train`` wrote), for diagnose, report and compare.

All file reading of those three commands is here: ``load_run(run_dir)`` returns the step and eval
records per rank, the sampler records, summary.json and config.yaml. A crashed run (no
summary.json, a last line cut in half) loads; a directory that is not a run is a ``UserError``.
Strict JSON output: :func:`trainperf.runio.dumps_strict`.

A step may take several lines of metrics.jsonl: its timing record, then ``{"step": S, "part":
"values", "loss": ..., "grad_norm": ...}`` once its device values reached the host
(:mod:`trainperf.monitor.steplog`, which the trainer runs); :func:`merge_parts` joins them, so every reader sees one
record per step. A run killed before its first whole record loads with no step records;
:func:`known_state` says what it left (config, checkpoints, samples). Step lines whose
``step_time_s`` is not a finite number (NaN, text) or whose ``step`` is not a whole number are left
out; ``malformed`` counts them per rank (``rank_files``: the file each rank's records came from),
so a reader can tell a run that logged no step from one whose records are corrupt; ``skipped_lines``
counts the lines that are not JSON objects at all (garbage; a last line cut by a crash is not counted),
and ``out_of_order`` the places where a step record's step is below the one before it (the records are
put back in step order).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from trainperf.runio import rank_of


def read_jsonl(path: Path, counts: dict | None = None) -> list[dict]:
    """The JSON objects of a JSONL file (none if it is missing); lines cut by a crash are skipped, a file of
    garbage is a UserError naming it (trainperf.runio); ``counts["skipped"]``: the other lines skipped."""
    from trainperf.runio import read_jsonl as _read

    return _read(path, what="trainperf metrics/samples log", counts=counts) if path.is_file() else []


def _in_step_order(recs: list[dict]) -> tuple[list[dict], int]:
    """The step records in step order (stable), and how many times a record's step went below the one before
    it: a file edited or pasted together. train writes them in order (a resume cuts the log back to its
    step first), and the figures after warm-up are taken by position."""
    back = sum(1 for a, b in zip(recs, recs[1:]) if b["step"] < a["step"])
    return (sorted(recs, key=lambda x: x["step"]) if back else recs), back


def _read_json(path: Path) -> dict:
    """summary.json, or {} when it is missing (a crashed run has none); garbage is a UserError naming it."""
    from trainperf.runio import read_json

    return read_json(path, what="run summary") if path.is_file() else {}


def _read_text(path: Path) -> str:
    from trainperf.errors import UserError

    try:
        return path.read_bytes().decode("utf-8", errors="replace")
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror or exc}; check the file's permissions") from exc


def _read_yaml(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        from trainperf.runio import load_yaml

        obj = load_yaml(_read_text(path), str(path))
    except Exception:  # noqa: BLE001 - the config only adds context (fixes' wording, compare's diff)
        return {}
    return obj if isinstance(obj, dict) else {}


def _is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def run_files(d: Path, stem: str) -> list[Path]:
    """This run's ``STEM.jsonl`` and ``STEM.rankN.jsonl``: never an earlier run's set aside beside them
    (``STEM.previous.jsonl``, ``STEM.previous.rank1.jsonl``), which sorted after the live file and was once read
    in its place."""
    import re

    pat = re.compile(rf"^{stem}(\.rank\d+)?\.jsonl$")
    return sorted(p for p in d.glob(f"{stem}*.jsonl") if pat.match(p.name))


def merge_parts(recs: list[dict]) -> list[dict]:
    """One record per step line: each ``"part"`` line (a step's values that followed its timing line) is
    merged into the latest record of the same step before it, and dropped; a part without one is dropped."""
    out: list[dict] = []
    latest: dict[int, dict] = {}
    for r in recs:
        step = r.get("step")
        step = step if isinstance(step, int) and not isinstance(step, bool) else None
        if "part" in r:
            target = latest.get(step) if step is not None else None
            if target is not None:
                target.update({k: v for k, v in r.items() if k not in ("part", "step")})
            continue
        if step is not None and "val_loss" not in r:
            latest[step] = r
        out.append(r)
    return out


def _checkpoint_steps(d: Path, config: dict) -> list[int]:
    """Steps of the complete checkpoints (a .pt with its manifest, or a DCP directory with COMPLETE)."""
    import re

    where = ((config.get("checkpoint") or {}).get("dir") if isinstance(config.get("checkpoint"), dict) else None)
    ck = Path(where) if where else d / "checkpoints"
    steps = set()
    if ck.is_dir():
        for p in ck.iterdir():
            m = re.match(r"^step-(\d{8})(\.pt)?$", p.name)
            if m and ((m.group(2) and p.with_suffix(".json").is_file()) or (not m.group(2) and (p / "COMPLETE").is_file())):
                steps.add(int(m.group(1)))
    return sorted(steps)


def known_state(run: dict) -> dict[str, Any]:
    """What a run that wrote no whole step record left: its config, checkpoints and device samples."""
    cfg = run["config"] or {}
    sec = lambda k: cfg.get(k) if isinstance(cfg.get(k), dict) else {}  # noqa: E731
    samples = [x for recs in run["samples"].values() for x in recs]
    steps = [x["step"] for x in samples if _is_num(x.get("step"))]
    spans = [x["elapsed_s"] for x in samples if _is_num(x.get("elapsed_s"))]
    model = sec("model")
    return {
        "config": {"name": sec("run").get("name"), "steps": sec("run").get("steps"),
                   "log_every": sec("run").get("log_every"), "device": sec("run").get("device"),
                   "flush_s": sec("monitor").get("flush_s"),
                   "model": model.get("preset") or model.get("entrypoint") or ("hf" if model.get("hf") else None)}
        if cfg else None,
        "checkpoint_steps": _checkpoint_steps(run["dir"], cfg),
        "finished": not run.get("crashed", True),  # summary.json is there
        "summary_steps": (run.get("summary") or {}).get("steps") if _is_num((run.get("summary") or {}).get("steps"))
        else None,
        "samples": len(samples),
        "samples_span_s": max(spans) if spans else None,
        "last_sampled_step": max(steps) if steps else None,
    }


def _to_run_peak(ranks: dict[int, list[dict]], summary: Any) -> None:
    """Step records' MFU/HFU divide by the peak measured at the start of the run (``peak_flops_start``);
    summary.json's ``peak_flops`` is the best of that and the same matmuls measured at the end. The records'
    figures are rescaled to it in place, so every MFU of a run divides by the one peak it names."""
    if not isinstance(summary, dict):
        return
    start, peak = summary.get("peak_flops_start"), summary.get("peak_flops")
    if not (_is_num(start) and _is_num(peak) and start > 0 and peak > 0) or start == peak:
        return
    for recs in ranks.values():
        for r in recs:
            for k in ("mfu", "hfu"):
                if _is_num(r.get(k)):
                    r[k] = r[k] * start / peak


def load_run(run_dir: str | Path) -> dict[str, Any]:
    """Everything the rules, the report and compare need, from one run directory."""
    from trainperf.errors import UserError

    d = Path(run_dir)
    if not d.is_dir():
        what = "is not a directory" if d.exists() else "does not exist"
        raise UserError(f"run directory {str(d)!r} {what}; pass the run.dir of a `trainperf train` run")
    metric_files = run_files(d, "metrics")
    if not metric_files and not (d / "summary.json").is_file() and not (d / "config.yaml").is_file():
        raise UserError(f"{d} holds no metrics.jsonl, summary.json or config.yaml; is it a trainperf run directory "
                        "(the run.dir of `trainperf train`)?")
    ranks: dict[int, list[dict]] = {}
    evals: list[dict] = []
    rank_files: dict[int, Path] = {}
    malformed: dict[int, int] = {}
    skipped: dict[int, int] = {}
    out_of_order: dict[int, int] = {}
    for f in metric_files:
        counts: dict = {}
        recs = merge_parts(read_jsonl(f, counts))
        r = rank_of(f)
        ranks[r], out_of_order[r] = _in_step_order(
            [x for x in recs if _is_num(x.get("step_time_s")) and isinstance(x.get("step"), int)
             and not isinstance(x.get("step"), bool)])
        skipped[r] = counts.get("skipped", 0)
        rank_files[r] = f
        # step lines that are there but unreadable as one (NaN/text step_time_s, a step that is not whole)
        malformed[r] = sum(1 for x in recs if "val_loss" not in x and ("step" in x or "step_time_s" in x)) - len(
            [x for x in ranks[r] if "val_loss" not in x])
        if r == 0:
            evals = [x for x in recs if "val_loss" in x]
    samples: dict[int, list[dict]] = {}
    sample_meta: dict[int, dict] = {}
    for f in run_files(d, "samples"):
        recs = read_jsonl(f)
        r = rank_of(f)
        samples[r] = [x for x in recs if "meta" not in x]
        metas = [x["meta"] for x in recs if isinstance(x.get("meta"), dict)]
        if metas:
            sample_meta[r] = metas[-1]
    summary = _read_json(d / "summary.json")
    _to_run_peak(ranks, summary)
    return {"dir": d, "ranks": ranks, "evals": evals, "samples": samples, "sample_meta": sample_meta,
            "rank_files": rank_files, "malformed": malformed, "skipped_lines": skipped, "out_of_order": out_of_order,
            "summary": summary, "config": _read_yaml(d / "config.yaml"),
            "failures": [f for f in read_jsonl(d / "failures.jsonl") if isinstance(f.get("report"), str)],
            "crashed": not (d / "summary.json").is_file()}
