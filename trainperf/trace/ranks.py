"""Which traces a PATH holds, and which rank each one is.

PATH is a trace file (``.json``, ``.json.gz``, ``*.pt.trace.json[.gz]``), a directory of traces (one per
rank), or a trainperf run directory (its ``profile/`` traces). :func:`discover` finds the files;
:func:`assign_ranks` gives each its rank: the trace's ``distributedInfo.rank``, else a rank in its file
name (``rank-3``, ``rank3``, ``rank_3``, ``worker3``, ``..._rank3_...``), else the order given (the lowest
ranks not taken, in file-name order). Two files of one rank, a file whose name and ``distributedInfo``
disagree, or files from jobs of different world sizes are a :class:`~trainperf.errors.UserError` naming
them.

The figures across ranks are in :mod:`trainperf.trace.across` (matching, clocks, waits, late ranks) and the
reading of a job's files, on every core, in :mod:`trainperf.trace.job`; ``read_traces``, ``across_ranks``,
``comm_waits`` and ``straggler`` are still importable from here.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Sequence

from trainperf.errors import UserError
from trainperf.lazy import lazy_names

TRACE_SUFFIXES = (".json", ".json.gz")
_RANK_RE = re.compile(r"(?:^|[^a-z])(?:rank|worker)[-_]?(\d+)(?![0-9])", re.I)


# ---------------------------------------------------------------------------- finding the files
CAPTURE_SUFFIXES = (".sqlite", ".nsys-rep", ".qdrep")
"""Nsight Systems: an SQLite export (``nsys export --type sqlite``) or a report (exported beside it)."""


def is_capture_name(name: str) -> bool:
    return name.lower().endswith(CAPTURE_SUFFIXES) and not name.startswith(".")


def _captures_in(d: Path) -> list[Path]:
    """The Nsight captures of a directory (a report and the export beside it count once: the export)."""
    from trainperf.trace.nsys.schema import is_nsys_export

    found = sorted(p for p in d.iterdir() if p.is_file() and is_capture_name(p.name)
                   and (not p.name.lower().endswith(".sqlite") or is_nsys_export(p)))
    exports = {p.with_suffix("") for p in found if p.name.lower().endswith(".sqlite")}
    return [p for p in found if p.name.lower().endswith(".sqlite") or p.with_suffix("") not in exports]


def is_trace_name(name: str) -> bool:
    n = name.lower()
    return n.endswith(TRACE_SUFFIXES) and not n.startswith(".")


def is_run_dir(d: Path) -> bool:
    return d.is_dir() and (any(d.glob("metrics*.jsonl")) or (d / "summary.json").is_file())


def _traces_in(d: Path) -> list[Path]:
    """The trace files of a directory: when some are named as torch writes them (``*.pt.trace.*``), those and the
    files whose name carries a rank (``rank1.json``); else every JSON file (one that is not a trace is skipped
    with a note when read). :func:`aside` lists the files left out."""
    files = sorted(p for p in d.iterdir() if p.is_file() and is_trace_name(p.name))
    torch_named = [p for p in files if ".pt.trace." in p.name or rank_from_name(p.name) is not None]
    return torch_named if any(".pt.trace." in p.name for p in files) else files


def aside(found: dict) -> list[dict]:
    """The JSON files of a directory of traces that :func:`_traces_in` left out, as ``skipped`` entries."""
    if found.get("kind") != "dir":
        return []
    d = Path(found["files"][0]).parent if found.get("files") else Path(found["path"])
    kept = set(found.get("files") or [])
    return [{"path": str(p), "why": "is not named as torch.profiler names a trace (*.pt.trace.json) nor after a "
                                    "rank, beside traces that are: not read"}
            for p in sorted(d.iterdir()) if p.is_file() and is_trace_name(p.name) and p not in kept]


def discover(path: str | Path) -> dict[str, Any]:
    """{"kind": "run" | "file" | "dir", "path", "files": [trace paths], "run_dir": Path | None}."""
    if not str(path).strip():
        raise UserError("the path is empty; pass a run directory, a trace file (.json, .json.gz) or a directory of "
                        "traces (one per rank)")
    p = Path(path)
    if not p.exists():
        raise UserError(f"{str(p)!r} does not exist; pass a run directory, a trace file (.json, .json.gz) or a "
                        "directory of traces (one per rank)")
    if p.is_file():
        if not (is_trace_name(p.name) or is_capture_name(p.name)):
            raise UserError(f"{p} is not a trace file (a torch.profiler Chrome trace: .json, .json.gz, "
                            "*.pt.trace.json[.gz]; an Nsight Systems export .sqlite or report .nsys-rep) nor a run "
                            "directory; pass a trace, a directory of traces or a run directory (a trace saved under "
                            "another name: rename it to end in .json or .json.gz)")
        return {"kind": "file", "path": p, "files": [p], "run_dir": None}
    if not p.is_dir():  # a device, a FIFO, a socket: neither a file to read nor a directory to list
        raise UserError(f"{p} is not a regular file or a directory; pass a run directory, a trace file (.json, "
                        ".json.gz) or a directory of traces (one per rank)")
    if is_run_dir(p):
        prof = p / "profile"
        return {"kind": "run", "path": p, "files": _traces_in(prof) if prof.is_dir() else [], "run_dir": p}
    files = _traces_in(p) or _captures_in(p)
    if not files and (p / "profile").is_dir():
        files = _traces_in(p / "profile")
    if not files:
        below = _dirs_with_traces(p)
        hint = (f"; traces are in {', '.join(str(d) for d in below[:3])}{' ...' if len(below) > 3 else ''}: pass "
                "one of those" if below else "")
        raise UserError(f"{p} holds no trace (*.json, *.json.gz, Nsight *.sqlite / *.nsys-rep) and is not a run "
                        "directory (no metrics.jsonl "
                        "or summary.json); pass a trace file, a directory with one trace per rank, or the "
                        f"run.dir of `trainperf train`{hint}")
    return {"kind": "dir", "path": p, "files": files, "run_dir": None}


def _dirs_with_traces(top: Path, depth: int = 3, budget: int = 2000) -> list[Path]:
    """Directories below ``top`` (at most ``depth`` levels, ``budget`` entries looked at, links not followed)
    that hold trace files: where a user who passed the parent most likely meant to point."""
    found, queue, seen = [], [(top, 0)], 0
    while queue and seen < budget:
        d, level = queue.pop(0)
        try:
            entries = sorted(d.iterdir())
        except OSError:
            continue
        for e in entries:
            seen += 1
            if e.is_symlink():
                continue
            if e.is_dir() and level < depth:
                queue.append((e, level + 1))
            elif d != top and e.is_file() and (is_trace_name(e.name) or is_capture_name(e.name)) and d not in found:
                found.append(d)
    return found


# ---------------------------------------------------------------------------- ranks
def rank_from_name(name: str) -> int | None:
    """``rank-3.json.gz``, ``rank3``, ``rank_3``, ``worker3.pt.trace.json``, ``job_rank3_step9`` -> 3."""
    found = _RANK_RE.findall(Path(name).name)
    return int(found[-1]) if found else None


def _dist_rank(info: Any) -> tuple[int | None, int | None]:
    if not isinstance(info, dict):
        return None, None
    r, w = info.get("rank"), info.get("world_size")
    ok = lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0  # noqa: E731
    return (r if ok(r) else None), (w if ok(w) and w > 0 else None)


def assign_ranks(paths: Sequence[Path], infos: Sequence[Any]) -> list[tuple[int, str]]:
    """Each file's (rank, where it came from): "distributedInfo", "file name" or "order"."""
    got: list[tuple[int | None, str]] = []
    worlds: dict[int, list[Path]] = {}
    for p, info in zip(paths, infos):
        r, w = _dist_rank(info)
        n = rank_from_name(p.name)
        if w is not None:
            worlds.setdefault(w, []).append(p)
        if r is not None and w is not None and r >= w:
            raise UserError(f"{p}: distributedInfo.rank={r} is not below its world_size={w}: a corrupt trace; "
                            "profile again, or leave this file out")
        if r is not None and n is not None and r != n and len(paths) > 1:
            raise UserError(f"{p}: its name says rank {n} but its distributedInfo.rank is {r}: the files are "
                            "mixed up; rename the file after the rank it holds (or keep the traces of one job "
                            "in one directory)")
        got.append((r, "distributedInfo") if r is not None else (n, "file name") if n is not None else (None, "order"))
    if len(worlds) > 1:
        desc = "; ".join(f"world_size {w}: {', '.join(x.name for x in ps[:3])}" for w, ps in sorted(worlds.items()))
        raise UserError(f"the traces come from jobs of different sizes ({desc}); put the traces of one job in "
                        "one directory")
    seen: dict[int, Path] = {}
    for p, (r, how) in zip(paths, got):
        if r is None:
            continue
        if r in seen:
            raise UserError(f"two traces of rank {r}: {seen[r]} and {p} (rank from {how}); a directory must "
                            "hold one trace per rank: pass one file, or move the other profiling windows "
                            "to their own directories")
        seen[r] = p
    windows: dict[str, Path] = {}
    for p, (r, how) in zip(paths, got):
        # tensorboard_trace_handler names a file WORKER.TIMESTAMP.pt.trace.json (WORKER: host_pid by default):
        # two files of one worker with no rank of their own are that process's successive profiling windows
        if r is None and ".pt.trace." in p.name:
            worker = p.name.split(".")[0]
            if worker in windows:
                raise UserError(f"{windows[worker]} and {p} are two profiling windows of one process (worker "
                                f"{worker!r}, no rank in the name or distributedInfo): a directory must hold one "
                                "trace per rank; pass one file, or move the other windows to their own directories")
            windows[worker] = p
    out: list[tuple[int, str]] = []
    free = (i for i in range(len(paths) + len(seen)) if i not in seen)
    for r, how in got:
        out.append((r, how) if r is not None else (next(free), "order"))
    return out


_LAZY = {  # the figures across ranks are in across.py (the reading of a job: job.read_traces)
    "across_ranks": ("trainperf.trace.across", "across_ranks"), "comm_waits": ("trainperf.trace.across", "comm_waits"),
    "straggler": ("trainperf.trace.across", "straggler"),
    "COMPUTE_DEFINITION": ("trainperf.trace.across", "COMPUTE_DEFINITION"),
    "CPU_COMPUTE_DEFINITION": ("trainperf.trace.across", "CPU_COMPUTE_DEFINITION"),
    "STRAGGLER_RATIO": ("trainperf.trace.across", "STRAGGLER_RATIO"),
    "WAIT_DEFINITION": ("trainperf.trace.across", "WAIT_DEFINITION")}
__getattr__ = lazy_names(__name__, globals(), _LAZY)  # the figures across ranks moved to across.py / job.py

__all__ = ["aside", "assign_ranks", "discover", "is_run_dir", "is_trace_name", "rank_from_name", *_LAZY]
