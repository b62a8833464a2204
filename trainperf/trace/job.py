"""Reading one job's traces on every core: :func:`read_traces`.

Each file is analysed (``trainperf.trace.analyze_file``: streamed, torch-free) in a worker process of a pool
(forked on Linux when the reading starts, before any result is held; spawned elsewhere), and returns only its small result: one rank's figures and its collectives table (:mod:`trainperf.trace.collectives`:
a few numpy arrays, ~100 bytes per collective). The parent never holds a timeline. So the peak resident memory is

* in the parent: its own base (imports) + N results (N ranks; tens of KB each, more with many collectives);
* in each of the W workers (``min(files, usable cores)``): the parent's base it started from (shared, not
  copied) + one rank's peak, the largest trace it reads (the reader streams: its buffer + that rank's numpy
  columns),

that is about ``W x one rank's peak + N x one result``: bounded by the number of workers, not of ranks, but
for the results (``tests/unit/test_trace_scale.py`` measures both). One file, one usable core or
``workers=1``: everything in this process, as before. ``progress`` gets the running total of bytes read over
every file (each worker reports its file's progress through a queue; the parent sums).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

from trainperf.errors import UserError

_PROGRESS: Any = None  # the worker's end of the progress queue (set by _init)
_REPORT_EVERY_S = 0.2


def usable_cores() -> int:
    """The cores this process may run on (its affinity, where the platform says)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def default_workers(n_files: int) -> int:
    return max(1, min(n_files, usable_cores()))


def _context():
    """fork on Linux: the workers start from the parent as it is before any result is read (its imports, shared
    copy-on-write), and a caller's script is never imported again in them (spawn and forkserver re-run an
    unguarded ``__main__``); spawn elsewhere."""
    import multiprocessing  # imported by the pool alone: one trace is read without it

    if sys.platform.startswith("linux"):
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context("spawn")


def _init(q) -> None:
    global _PROGRESS
    _PROGRESS = q


def analyze_any(path: str | Path, *, top_n: int, patterns, step: str | None = None,
                progress: Callable[[int], None] | None = None) -> list[dict]:
    """Each rank's figures in one file: a Kineto trace holds one rank, an Nsight Systems capture (an SQLite
    export or a report) one per GPU and process (:func:`trainperf.trace.nsys.analyze_capture`); each result's
    collectives as numpy columns (what crosses the pipe and stays in the parent)."""
    from trainperf.trace.analyze import analyze_file
    from trainperf.trace.collectives import compact
    from trainperf.trace.ranks import is_capture_name

    if is_capture_name(Path(path).name):
        from trainperf.trace.nsys import analyze_capture

        out = analyze_capture(path, patterns=patterns, top_n=top_n, step=step, progress=progress)
    else:
        out = [analyze_file(path, patterns=patterns, top_n=top_n, progress=progress)]
    for res in out:
        res["_comm"] = compact(res.get("_comm"))
    return out


def _one(i: int, path: str, top_n: int, patterns: list[str] | None,
         step: str | None) -> tuple[int, list[dict] | None, str | None]:
    """In a worker: (file index, its results or None, why it is not a trace)."""
    from trainperf.trace.reader import NotATrace

    last = [0.0]

    def report(n: int) -> None:
        now = time.monotonic()
        if now - last[0] >= _REPORT_EVERY_S:
            last[0] = now
            _PROGRESS.put((i, n))
    try:
        res = analyze_any(path, patterns=patterns, top_n=top_n, step=step,
                          progress=report if _PROGRESS is not None else None)
        return i, res, None
    except NotATrace as exc:
        return i, None, exc.what


def _serial(files: list[Path], top_n: int, patterns, progress, step) -> list[tuple[list[dict] | None, str | None]]:
    from trainperf.trace.reader import NotATrace

    out, done = [], 0  # done: bytes of the files read so far (``progress`` gets a running total)
    for p in files:
        cb = (lambda n, base=done: progress(base + n)) if progress else None
        try:
            out.append((analyze_any(p, patterns=patterns, top_n=top_n, step=step, progress=cb), None))
        except NotATrace as exc:
            if len(files) == 1:
                raise
            out.append((None, exc.what))
        finally:
            done += p.stat().st_size
            if progress:
                progress(done)
    return out


def _pooled(files: list[Path], top_n: int, patterns, progress, workers: int,
            step) -> list[tuple[list[dict] | None, str | None]]:
    import queue as queue_mod
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
    from concurrent.futures.process import BrokenProcessPool

    ctx = _context()
    q = ctx.Queue() if progress else None
    sizes = [p.stat().st_size for p in files]
    read = [0] * len(files)
    got: list[tuple[list[dict] | None, str | None] | None] = [None] * len(files)
    ex = ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=_init, initargs=(q,))
    try:
        pending = {ex.submit(_one, i, str(p), top_n, patterns, step): i for i, p in enumerate(files)}
        while pending:
            finished, _ = wait(pending, timeout=_REPORT_EVERY_S, return_when=FIRST_COMPLETED)
            while q is not None:
                try:
                    i, n = q.get_nowait()
                except queue_mod.Empty:
                    break
                read[i] = max(read[i], min(n, sizes[i]))
            for f in finished:
                i = pending.pop(f)
                try:
                    _, res, why = f.result()
                except BrokenProcessPool as exc:
                    raise UserError(f"a process reading the traces died while reading {files[i]} ({exc}): out of "
                                    "memory? each of the workers holds one rank's trace; pass fewer workers "
                                    "(read_traces(..., workers=1)) or free memory") from None
                got[i] = (res, why)
                read[i] = sizes[i]
            if progress:
                progress(sum(read))
    finally:
        ex.shutdown(wait=True, cancel_futures=True)
        if q is not None:
            q.close()
    return got  # type: ignore[return-value]


def read_traces(files: list[Path], *, top_n: int = 10, patterns: list[str] | None = None,
                progress: Callable[[int], None] | None = None,
                workers: int | None = None, step: str | None = None) -> tuple[list[dict], dict]:
    """(each rank's analysis, in rank order, with "rank" and "rank_from"; the figures across ranks,
    :func:`trainperf.trace.across.across_ranks`). Among several files, one that is valid JSON but no profiler
    trace (an execution trace, a config next to the traces) is skipped and listed in the figures across ranks
    (``skipped``); a broken trace is an error. ``workers``: processes reading files at once (default: one per
    usable core, at most one per file; 1 reads in this process). An Nsight capture holds a rank per GPU and
    process (``step``: the NVTX range that marks its steps); a rank in no file name nor ``distributedInfo`` gets
    the NCCL rank its capture names, else the next free one."""
    from trainperf.trace.across import across_ranks
    from trainperf.trace.ranks import assign_ranks

    files = [Path(p) for p in files]
    if workers is not None and workers < 1:
        raise UserError(f"workers={workers}: read the traces with at least 1 process")
    n = default_workers(len(files)) if workers is None else min(workers, max(1, len(files)))
    got = _serial(files, top_n, patterns, progress, step) if n <= 1 else \
        _pooled(files, top_n, patterns, progress, n, step)
    results, skipped, names, infos = [], [], [], []
    for p, (many, why) in zip(files, got):
        if many is None:
            skipped.append({"path": str(p), "why": why})
            continue
        for k, res in enumerate(many):
            res["path"] = str(p)
            results.append(res)
            hint = res.get("rank_hint") or {}
            info = res.get("distributed_info")
            if info is None and isinstance(hint.get("nccl_rank"), int):
                info = {"rank": hint["nccl_rank"]}
            # several ranks in one capture: the file's name says nothing about which is which
            names.append(p if len(many) == 1 else Path(f"capture-{len(names)}"))
            infos.append(info)
    if not results:
        each = "; ".join(f"{Path(x['path']).name} {x['why']}" for x in skipped[:5])
        raise UserError(f"{files[0].parent}: none of its {len(files)} files is a profiler trace ({each}). "
                        "Pass a directory of torch.profiler traces (one per rank), or one trace file")
    ranks = assign_ranks(names, infos)
    for res, (rank, how) in zip(results, ranks):
        res["rank"], res["rank_from"] = rank, how
    results.sort(key=lambda r: r["rank"])
    across = across_ranks(results)
    if skipped:
        across["skipped"] = skipped
    return results, across


__all__ = ["analyze_any", "default_workers", "read_traces", "usable_cores"]
