"""Which traces a PATH holds, which rank each one is, and the figures across ranks.

PATH is a trace file (``.json``, ``.json.gz``, ``*.pt.trace.json[.gz]``), a directory of traces (one per
rank), or a trainperf run directory (its ``profile/`` traces). :func:`discover` finds the files;
:func:`assign_ranks` gives each its rank: the trace's ``distributedInfo.rank``, else a rank in its file
name (``rank-3``, ``rank3``, ``rank_3``, ``worker3``, ``..._rank3_...``), else the order given (the lowest
ranks not taken, in file-name order). Two files of one rank, a file whose name and ``distributedInfo``
disagree, or files from jobs of different world sizes are a :class:`~trainperf.errors.UserError` naming
them.

:func:`across_ranks` takes each rank's analysis (``trainperf.trace.analyze_file``) and computes:

* step time and compute time per rank: compute is the GPU time covered by non-communication kernels
  (union across streams) per profiler step, so a rank that waits inside its collectives is not counted
  slow;
* the straggler: the rank whose compute per step exceeds the median of the other ranks' by more than
  ``STRAGGLER_RATIO`` (and ``STRAGGLER_MIN_GAP_US``);
* per-rank communication wait. Collectives are matched across ranks by order: the communication kernels
  of each process group (``Process Group Name`` when the trace records it, else each communication
  stream in the order the streams first appear) form a sequence per rank, and the i-th kernel of a
  sequence on one rank is the same collective as the i-th on the others, as long as their names agree
  (matching stops at the first disagreement: the rest is reported unmatched). A collective ends on every
  rank at about the same moment, when the last rank has arrived and the data has moved; the rank that
  arrives last waits least, and its kernel lasts only the transfer. So the **wait** of rank r on a
  collective is its kernel's duration minus the shortest duration of that collective on any rank:
  ``wait_r = dur_r - min_k dur_k``. This needs no common clock across hosts (durations only) and
  assumes the transfer itself takes as long on every rank (true of ring/tree all-reduce, all-gather and
  reduce-scatter; an uneven all-to-all moves different amounts, and its wait is then an upper bound).
  A rank's wait per step is the sum over the matched collectives in its steps, divided by its steps.
"""

from __future__ import annotations

import re
import statistics
from pathlib import Path
from typing import Any, Callable, Sequence

from trainperf.errors import UserError

STRAGGLER_RATIO = 1.15  # as the run-directory straggler rule (monitor/rules_runtime.py)
STRAGGLER_MIN_GAP_US = 1000.0
TRACE_SUFFIXES = (".json", ".json.gz")
_RANK_RE = re.compile(r"(?:^|[^a-z])(?:rank|worker)[-_]?(\d+)(?![0-9])", re.I)
COMPUTE_DEFINITION = "GPU time in non-communication kernels per step"
CPU_COMPUTE_DEFINITION = ("step time less exposed communication: on CPU-only traces, the time the rank was not waiting "
                          "in a gloo/nccl collective")
CPU_WAIT_DEFINITION = ("wait of a rank on a collective = its CPU op's duration - the shortest duration of the same "
                       "collective on any rank (the last to arrive waits least); collectives matched across ranks "
                       "by name and order; per step = sum over its steps / steps")
WAIT_DEFINITION = ("wait of a rank on a collective = its kernel's duration - the shortest duration of the "
                   "same collective on any rank (the last to arrive waits least); collectives matched across "
                   "ranks by order within each process group (or communication stream); per step = sum over "
                   "its steps / steps")


# ---------------------------------------------------------------------------- finding the files
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
        if not is_trace_name(p.name):
            raise UserError(f"{p} is not a trace file (a torch.profiler Chrome trace: .json, .json.gz, "
                            "*.pt.trace.json[.gz]) nor a run directory; pass a trace, a directory of traces or a "
                            "run directory (a trace saved under another name: rename it to end in .json or "
                            ".json.gz)")
        return {"kind": "file", "path": p, "files": [p], "run_dir": None}
    if not p.is_dir():  # a device, a FIFO, a socket: neither a file to read nor a directory to list
        raise UserError(f"{p} is not a regular file or a directory; pass a run directory, a trace file (.json, "
                        ".json.gz) or a directory of traces (one per rank)")
    if is_run_dir(p):
        prof = p / "profile"
        return {"kind": "run", "path": p, "files": _traces_in(prof) if prof.is_dir() else [], "run_dir": p}
    files = _traces_in(p)
    if not files and (p / "profile").is_dir():
        files = _traces_in(p / "profile")
    if not files:
        below = _dirs_with_traces(p)
        hint = (f"; traces are in {', '.join(str(d) for d in below[:3])}{' ...' if len(below) > 3 else ''}: pass "
                "one of those" if below else "")
        raise UserError(f"{p} holds no trace (*.json, *.json.gz) and is not a run directory (no metrics.jsonl "
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
            elif d != top and e.is_file() and is_trace_name(e.name) and d not in found:
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


# ---------------------------------------------------------------------------- across ranks
def _num(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _sequences(comm: list) -> dict[tuple, list]:
    """Communication kernels per matching key, in time order: (process group,) when recorded, else the
    communication stream by the order the streams first appear."""
    rows = sorted((r for r in comm if isinstance(r, (list, tuple)) and len(r) >= 4), key=lambda r: r[0])
    stream_order: dict[Any, int] = {}
    seqs: dict[tuple, list] = {}
    for r in rows:
        pg = r[6] if len(r) > 6 else None
        if pg not in (None, ""):
            key: tuple = ("pg", str(pg))
        else:
            key = ("stream", stream_order.setdefault(r[2], len(stream_order)))
        seqs.setdefault(key, []).append(r)
    return seqs


def _same(a: list, b: list) -> bool:
    ca = a[5] if len(a) > 5 else None
    cb = b[5] if len(b) > 5 else None
    if ca and cb:
        return ca == cb
    return a[3] == b[3]


def comm_waits(per_rank: dict[int, list]) -> dict[str, Any]:
    """Match collectives across ranks and measure each rank's wait (see the module docstring).
    ``per_rank``: rank -> its ``_comm`` rows. Returns {"waits": {rank: [(step, wait_us)]},
    "matched", "unmatched", "by"}."""
    seqs = {r: _sequences(c or []) for r, c in per_rank.items()}
    keys = sorted({k for s in seqs.values() for k in s})
    waits: dict[int, list[tuple[int | None, float]]] = {r: [] for r in per_rank}
    matched = unmatched = 0
    by = set()
    for key in keys:
        holders = [r for r in seqs if key in seqs[r]]
        if len(holders) < 2:
            unmatched += sum(len(seqs[r][key]) for r in holders)
            continue
        by.add("process group" if key[0] == "pg" else "stream order")
        lists = [seqs[r][key] for r in holders]
        n = min(len(x) for x in lists)
        for i in range(n):
            row = [x[i] for x in lists]
            if not all(_same(row[0], y) for y in row[1:]):
                n = i
                break
            durs = [float(y[1]) for y in row]
            low = min(durs)
            for r, y, d in zip(holders, row, durs):
                waits[r].append((y[4] if len(y) > 4 else None, d - low))
            matched += 1
        unmatched += sum(len(x) - n for x in lists)
    return {"waits": waits, "matched": matched, "unmatched": unmatched, "by": sorted(by)}


def _mean(xs) -> float | None:
    xs = [x for x in (_num(v) for v in xs) if x is not None]
    return sum(xs) / len(xs) if xs else None


def across_ranks(results: list[dict]) -> dict[str, Any]:
    """The contract's ``ranks``: per-rank step and compute time, communication wait, the straggler."""
    per = []
    for res in sorted(results, key=lambda r: r["rank"]):
        steps = max(1, int(res.get("steps") or 0) or len(res.get("_step_compute_us") or []) or 1)
        per.append({"rank": res["rank"], "path": res.get("path"), "steps": res.get("steps"),
                    "step_time_us": _num(res.get("step_time_us")),
                    "compute_us_per_step": _mean(res.get("_step_compute_us") or []),
                    "comm_us_per_step": _mean(res.get("_step_comm_us") or []),
                    "exposed_comm_us_per_step": _mean(res.get("_step_exposed_comm_us") or []),
                    "comm_wait_us_per_step": None, "_steps": steps})
    cpu = bool(results) and all(res.get("cpu_only") for res in results)
    out: dict[str, Any] = {"count": len(per), "per_rank": per, "straggler": None,
                           "wait_definition": CPU_WAIT_DEFINITION if cpu else WAIT_DEFINITION, "matching": None,
                           "compute_definition": CPU_COMPUTE_DEFINITION if cpu else COMPUTE_DEFINITION,
                           "notes": _job_notes(results)}
    if len(per) < 2:
        out["note"] = "one rank: the straggler and the communication wait need the traces of two or more ranks"
        for p in per:
            p.pop("_steps")
        return out
    m = comm_waits({res["rank"]: res.get("_comm") or [] for res in results})
    out["matching"] = {"matched_collectives": m["matched"], "unmatched_kernels": m["unmatched"], "by": m["by"]}
    for p in per:
        ws = m["waits"].get(p["rank"], [])
        p["comm_wait_us_total"] = sum(w for _, w in ws)
        p["comm_wait_us_per_step"] = p["comm_wait_us_total"] / p["_steps"] if m["matched"] else None
        p.pop("_steps")
    out["straggler"] = straggler(per)
    return out


def _job_notes(results: list[dict]) -> list[str]:
    """What the set of traces says about itself: ranks of the job that have no trace here (from
    ``distributedInfo.world_size``), and two files that hold the same trace (one copied under two names)."""
    notes = []
    worlds = {_dist_rank(r.get("distributed_info"))[1] for r in results} - {None}
    if len(worlds) == 1:
        world = worlds.pop()
        have = {r["rank"] for r in results}
        missing = [k for k in range(world) if k not in have]
        if missing:
            shown = ", ".join(map(str, missing[:8])) + (" ..." if len(missing) > 8 else "")
            notes.append(f"the job had {world} ranks (distributedInfo.world_size) and {len(have)} trace(s) are here: "
                         f"rank(s) {shown} missing, so the figures across ranks (straggler, waits) leave them out")
    seen: dict[tuple, int] = {}
    for r in sorted(results, key=lambda r: r["rank"]):
        key = (r.get("events"), r.get("base_time_us"), r.get("step_time_us"), tuple(r.get("step_numbers") or ()))
        if key[0] and key in seen:
            notes.append(f"the traces of ranks {seen[key]} and {r['rank']} are the same trace (same events, start "
                         "time and steps): a file copied under two names? the figures across ranks count it twice")
        seen.setdefault(key, r["rank"])
    return notes


def straggler(per: list[dict]) -> dict | None:
    """The rank whose compute per step is furthest above the median of the others', if above the
    threshold; by compute, never by wall time (a fast rank's collectives are long because they wait)."""
    comp = {p["rank"]: p["compute_us_per_step"] for p in per if p.get("compute_us_per_step")}
    if len(comp) < 2:
        return None
    worst = max(comp, key=comp.get)
    base = statistics.median(v for r, v in comp.items() if r != worst)
    ratio = comp[worst] / base if base else None
    waits = {p["rank"]: p.get("comm_wait_us_per_step") for p in per}
    others_wait = [w for r, w in waits.items() if r != worst and w is not None]
    return {"rank": worst, "compute_us_per_step": comp[worst], "median_others_us": base, "ratio": ratio,
            "excess_us_per_step": comp[worst] - base,
            "slower": bool(ratio and ratio > STRAGGLER_RATIO and comp[worst] - base >= STRAGGLER_MIN_GAP_US),
            "threshold_ratio": STRAGGLER_RATIO, "its_wait_us_per_step": waits.get(worst),
            "others_wait_us_per_step": statistics.median(others_wait) if others_wait else None}


# ---------------------------------------------------------------------------- reading a job
def read_traces(files: list[Path], *, top_n: int = 10, patterns: list[str] | None = None,
                progress: Callable[[int], None] | None = None) -> tuple[list[dict], dict]:
    """(each rank's analysis, in rank order, with "rank" and "rank_from"; the figures across ranks). Among
    several files, one that is valid JSON but no profiler trace (an execution trace, a config next to the
    traces) is skipped and listed in the figures across ranks (``skipped``); a broken trace is an error."""
    from trainperf.trace.analyze import analyze_file
    from trainperf.trace.reader import NotATrace

    results, skipped = [], []
    done = 0  # bytes of the files read so far: ``progress`` gets a running total over every file
    for p in files:
        cb = (lambda n, base=done: progress(base + n)) if progress else None
        try:
            res = analyze_file(p, patterns=patterns, top_n=top_n, progress=cb)
        except NotATrace as exc:
            if len(files) == 1:
                raise
            skipped.append({"path": str(p), "why": exc.what})
            continue
        finally:
            done += p.stat().st_size
            if progress:
                progress(done)
        res["path"] = str(p)
        results.append(res)
    if not results:
        each = "; ".join(f"{Path(x['path']).name} {x['why']}" for x in skipped[:5])
        raise UserError(f"{files[0].parent}: none of its {len(files)} JSON files is a profiler trace ({each}). "
                        "Pass a directory of torch.profiler traces (one per rank), or one trace file")
    got = assign_ranks([Path(r["path"]) for r in results], [r.get("distributed_info") for r in results])
    for res, (rank, how) in zip(results, got):
        res["rank"], res["rank_from"] = rank, how
    results.sort(key=lambda r: r["rank"])
    across = across_ranks(results)
    if skipped:
        across["skipped"] = skipped
    return results, across


__all__ = ["across_ranks", "read_traces", "aside", "assign_ranks", "comm_waits", "discover", "rank_from_name", "straggler",
           "COMPUTE_DEFINITION", "CPU_COMPUTE_DEFINITION", "STRAGGLER_RATIO", "WAIT_DEFINITION"]
