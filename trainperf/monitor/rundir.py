"""Reading a run directory (what ``trainperf train`` wrote), for diagnose, report and compare.

All file reading of those three commands is here: ``load_run(run_dir)`` returns the step and eval
records per rank, the sampler records, summary.json and config.yaml. A crashed run (no
summary.json, a last line cut in half) loads; a directory that is not a run is a ``UserError``.
``strict(obj)`` makes an object safe for strict JSON (NaN and infinities become None).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


def _read_text(path: Path) -> str:
    from trainperf.errors import UserError

    try:
        return path.read_bytes().decode("utf-8", errors="replace")
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror or exc}; check the file's permissions") from exc


def read_jsonl(path: Path) -> list[dict]:
    """The JSON objects of a JSONL file; lines that do not parse (cut by a crash, garbage) are skipped."""
    if not path.is_file():
        return []
    out = []
    for line in _read_text(path).splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict):
            out.append(rec)
    return out


def _read_json(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        obj = json.loads(_read_text(path))
    except ValueError:
        return {}
    return obj if isinstance(obj, dict) else {}


def _read_yaml(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        import yaml

        obj = yaml.safe_load(_read_text(path))
    except Exception:  # noqa: BLE001 - the config only adds context (fixes' wording, compare's diff)
        return {}
    return obj if isinstance(obj, dict) else {}


def _is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def rank_of(path: Path) -> int:
    """``metrics.jsonl`` -> 0, ``metrics.rank3.jsonl`` -> 3."""
    for p in path.name.split("."):
        if p.startswith("rank") and p[4:].isdigit():
            return int(p[4:])
    return 0


def load_run(run_dir: str | Path) -> dict[str, Any]:
    """Everything the rules, the report and compare need, from one run directory."""
    from trainperf.errors import UserError

    d = Path(run_dir)
    if not d.is_dir():
        what = "is not a directory" if d.exists() else "does not exist"
        raise UserError(f"run directory {str(d)!r} {what}; pass the run.dir of a `trainperf train` run")
    metric_files = sorted(d.glob("metrics*.jsonl"))
    if not metric_files and not (d / "summary.json").is_file():
        raise UserError(f"{d} holds no metrics.jsonl or summary.json; is it a trainperf run directory "
                        "(the run.dir of `trainperf train`)?")
    ranks: dict[int, list[dict]] = {}
    evals: list[dict] = []
    for f in metric_files:
        recs = read_jsonl(f)
        r = rank_of(f)
        ranks[r] = [x for x in recs if _is_num(x.get("step_time_s")) and isinstance(x.get("step"), int)]
        if r == 0:
            evals = [x for x in recs if "val_loss" in x]
    samples: dict[int, list[dict]] = {}
    sample_meta: dict[int, dict] = {}
    for f in sorted(d.glob("samples*.jsonl")):
        recs = read_jsonl(f)
        r = rank_of(f)
        samples[r] = [x for x in recs if "meta" not in x]
        metas = [x["meta"] for x in recs if isinstance(x.get("meta"), dict)]
        if metas:
            sample_meta[r] = metas[-1]
    return {"dir": d, "ranks": ranks, "evals": evals, "samples": samples, "sample_meta": sample_meta,
            "summary": _read_json(d / "summary.json"), "config": _read_yaml(d / "config.yaml"),
            "crashed": not (d / "summary.json").is_file()}


def strict(obj: Any) -> Any:
    """A copy that ``json.dumps(..., allow_nan=False)`` accepts: non-finite floats become None,
    tuples lists, paths and other objects their ``str``."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    if isinstance(obj, dict):
        return {str(k): strict(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [strict(v) for v in obj]
    return str(obj)


def dumps_strict(obj: Any) -> str:
    return json.dumps(strict(obj), indent=2, allow_nan=False)
