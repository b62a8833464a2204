"""Entry points: an Nsight Systems capture (an export, a report, or a directory of them) -> one Timeline per rank
(:func:`read_capture`), and each rank's figures (:func:`analyze_capture`): the result of
:func:`trainperf.trace.analyze.analyze_timeline`, the same dict a torch.profiler trace gives, plus what only
nsys has (``gpu_metrics``: measured SM / tensor / DRAM activity; ``rank_hint``; ``capture``; ``allocator``;
``figure_sources``: which figure is measured, which estimated).

Ranks are analysed one at a time and dropped, so memory holds one rank's arrays at once."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from trainperf.errors import UserError
from trainperf.trace import intervals as iv
from trainperf.trace.analyze import _clean, analyze_timeline
from trainperf.trace.columns import release_freed_memory, trim_heap
from trainperf.trace.tb import launch_index
from trainperf.trace.nsys import layout, metrics
from trainperf.trace.nsys.reader import RankSpec, read_rank
from trainperf.trace.nsys.schema import KERNEL, MEMCPY, MEMSET, NVTX, RUNTIME, Export, check_file, is_nsys_export
from trainperf.trace.timeline import Timeline

REPORT_SUFFIXES = (".nsys-rep", ".qdrep")
ALLOC_CALLS = {"cudaMalloc", "cudaFree", "cudaMallocAsync", "cudaFreeAsync", "cudaMallocHost", "cudaFreeHost",
               "cudaHostAlloc", "cudaHostRegister", "cudaHostUnregister", "cudaMallocManaged", "cuMemAlloc",
               "cuMemFree", "cuMemAllocAsync", "cuMemFreeAsync", "cuMemCreate", "cuMemRelease", "cuMemMap",
               "cuMemUnmap", "cuMemAddressReserve", "cuMemAddressFree", "cuMemAllocHost", "cuMemHostAlloc",
               "cuMemFreeHost", "cuMemHostRegister"}
FIGURE_SOURCES = {
    "gpu_utilization_pct": "measured: the union of kernel intervals the capture recorded (kernel-busy time)",
    "sm_efficiency_pct": "estimated: blocks per SM (grid size / SM count) of the kernels running, as the "
                         "TensorBoard plugin",
    "achieved_occupancy_pct": "estimated: CUDA's occupancy calculator on each kernel's launch parameters "
                              "(registers, shared memory, block size) capped by its grid, as Kineto",
    "tensor_core_kernel_pct": "estimated: kernel names (trainperf.trace.patterns)",
}


def export_report(report: str | Path) -> Path:
    """The SQLite export of a ``.nsys-rep`` report, made beside it with ``nsys export`` (a fresh one is reused);
    without ``nsys`` on PATH a UserError prints the command to run."""
    rep = Path(report)
    if not rep.is_file():
        raise UserError(f"{rep}: no such report; pass an Nsight Systems report (.nsys-rep) or its export (.sqlite)")
    out = rep.with_suffix(".sqlite")
    cmd = f"nsys export --type=sqlite --output={out} {rep}"
    if out.exists() and out.stat().st_mtime >= rep.stat().st_mtime and is_nsys_export(out):
        return out
    exe = shutil.which("nsys")
    if exe is None:
        raise UserError(f"{rep}: an Nsight Systems report, read through its SQLite export, and nsys is not on PATH "
                        f"here. Export it where nsys is installed:\n  {cmd}\nthen pass {out}")
    tmp = out.with_name(f".{out.stem}.{os.getpid()}.tmp.sqlite")
    try:
        p = subprocess.run([exe, "export", "--type=sqlite", "--force-overwrite=true", f"--output={tmp}", str(rep)],
                           capture_output=True, text=True, stdin=subprocess.DEVNULL)
        if p.returncode != 0 or not is_nsys_export(tmp):
            tail = (p.stderr or p.stdout or "")[-600:].strip()
            raise UserError(f"{rep}: `nsys export` failed (exit {p.returncode}): {tail or 'no output'}; run it "
                            f"yourself to see why:\n  {cmd}")
        os.replace(tmp, out)
    except OSError as exc:
        raise UserError(f"{rep}: cannot write its export {out} ({exc}); export it somewhere writable:\n  "
                        f"nsys export --type=sqlite --output=DIR/{out.name} {rep}") from exc
    finally:
        if tmp.exists():
            tmp.unlink()
    return out


def capture_files(path: str | Path) -> list[Path]:
    """The exports PATH names: a .sqlite export, a .nsys-rep report (exported), or a directory of them (each
    a capture; a report and its export count once)."""
    p = Path(path)
    if p.is_dir():
        found = sorted(f for f in p.iterdir() if f.is_file() and (f.suffix in REPORT_SUFFIXES or is_nsys_export(f)))
        reps = {f.with_suffix(".sqlite") for f in found if f.suffix in REPORT_SUFFIXES}
        files = [f for f in found if f not in reps]
        if not files:
            raise UserError(f"{p}: no Nsight Systems export (.sqlite) or report (.nsys-rep) in this directory")
        return [export_report(f) if f.suffix in REPORT_SUFFIXES else f for f in files]
    if p.suffix in REPORT_SUFFIXES:
        return [export_report(p)]
    check_file(p)
    return [p]


def _progress(files: list[Path], progress: Callable[[int], None] | None):
    """A row counter -> ``progress(bytes)``: the share of rows read so far times the bytes of the files."""
    if progress is None:
        return None, None
    total_bytes = sum(f.stat().st_size for f in files)
    state = {"rows": 0, "expected": 1}

    def tick(n: int) -> None:
        state["rows"] += n
        progress(int(total_bytes * min(1.0, state["rows"] / max(state["expected"], 1))))
    return tick, state


def iter_capture(path: str | Path, *, step: str | None = None, progress: Callable[[int], None] | None = None
                 ) -> Iterator[tuple[RankSpec, Timeline, dict[str, Any]]]:
    """Each rank of each capture PATH holds: (its spec, its Timeline, what the reader noted), one at a time."""
    files = capture_files(path)
    release_freed_memory(sum(f.stat().st_size for f in files))
    tick, state = _progress(files, progress)
    for f in files:
        exp = Export(f)
        try:
            specs, notes = layout.find_ranks(exp)
            if not specs:
                raise UserError(f"{f}: the capture holds no GPU activity and no NVTX range (tables: "
                                f"{', '.join(sorted(exp.tables)[:10])}): capture with nsys profile -t cuda,nvtx")
            if state is not None:
                state["expected"] += len(specs) * sum(exp.row_estimate(t) for t in (KERNEL, MEMCPY, MEMSET, RUNTIME,
                                                                                     NVTX))
            nccl = {}
            for (p, d), name in layout.domains(exp).items():
                if name == "NCCL":
                    nccl.setdefault(p, set()).add(d)
            base = layout.session_base_us(exp)
            for spec in specs:
                tl, extra = read_rank(exp, spec, step=step, nccl_domains=nccl.get(spec.pid, set()), base_us=base,
                                      progress=tick)
                extra["notes"] = notes + extra["notes"]
                extra["export"] = exp
                trim_heap()  # the rows' transient objects, freed, go back to the system before the figures
                yield spec, tl, extra
                del tl, extra  # not alive while the next rank is read
                trim_heap()
        finally:
            exp.close()
    if progress is not None:
        progress(sum(f.stat().st_size for f in files))  # done: the whole of every file


def read_capture(path: str | Path, *, step: str | None = None, progress: Callable[[int], None] | None = None
                 ) -> list[tuple[str, Timeline]]:
    """(label, Timeline) per rank: a GPU of a process, each process on a shared GPU its own rank, every capture
    of a directory. ``step``: the NVTX range that marks a step (else found, see :mod:`.nvtx`)."""
    return [(spec.label, tl) for spec, tl, _ in iter_capture(path, step=step, progress=progress)]


def allocator(tl: Timeline, lo: np.ndarray, hi: np.ndarray) -> dict[str, Any]:
    """Allocator calls (cudaMalloc / cudaFree / cuMem*...) inside the steps: count and host time per call."""
    ids = [i for i, n in enumerate(tl.names) if n in ALLOC_CALLS]
    nsteps = max(1, lo.size)
    rows: dict[str, dict[str, float]] = {}
    total = 0.0
    if ids and tl.r_ts.size and lo.size:
        m = np.isin(tl.r_name, ids)
        k = np.searchsorted(lo, tl.r_ts, side="right") - 1
        inside = m & (k >= 0)
        inside[inside] = tl.r_ts[inside] < hi[k[inside]]
        for i in np.flatnonzero(inside):
            r = rows.setdefault(tl.names[tl.r_name[i]], {"count": 0, "us": 0.0})
            r["count"] += 1
            r["us"] += float(tl.r_dur[i])
        total = iv.total(iv.union(tl.r_ts[inside], tl.r_ts[inside] + tl.r_dur[inside]))
    return {"calls": {k: v | {"count_per_step": v["count"] / nsteps, "us_per_step": v["us"] / nsteps}
                      for k, v in sorted(rows.items(), key=lambda x: -x[1]["us"])},
            "us_per_step": total / nsteps,
            "definition": "CUDA allocator calls (cudaMalloc/cudaFree, async and host variants, cuMem*) started "
                          "inside the analysed steps: the host time they take, per step (their union)"}


def _window_ns(res: dict, base_us: float) -> tuple[float | None, float | None]:
    rows = res.get("per_step") or []
    if not rows:
        return None, None
    lo = min(r["start_us"] for r in rows) - base_us
    hi = max(r["start_us"] + r["dur_us"] for r in rows) - base_us
    return lo * 1000.0, hi * 1000.0


def analyze_capture(path: str | Path, *, patterns: Any = None, top_n: int = 10, step: str | None = None,
                    progress: Callable[[int], None] | None = None) -> list[dict[str, Any]]:
    """One :func:`analyze_timeline` result per rank, with the nsys keys: ``path``, ``label``, ``source``
    ("nsys"), ``rank_hint`` (device, pid, process, NCCL rank when NCCL's NVTX says it, the capture file),
    ``capture`` (schema / product version, GPU), ``gpu_metrics`` (measured, or why not), ``allocator``,
    ``figure_sources`` and notes on anything not measured."""
    out = []
    for spec, tl, extra in iter_capture(path, step=step, progress=progress):
        exp: Export = extra["export"]
        if not tl.all_max > tl.all_min:
            raise UserError(f"{exp.path}: {spec.label} measures no time (no kernel, copy, runtime call or NVTX "
                            "range with a duration)")
        res = analyze_timeline(tl, path=str(exp.path), rank=spec.info.get("nccl_rank"), patterns=patterns,
                               top_n=top_n)
        rows = res.get("per_step") or []
        s_lo = np.array([r["start_us"] - tl.base_us for r in rows])
        s_hi = np.array([r["start_us"] - tl.base_us + r["dur_us"] for r in rows])
        chosen = extra["step"]
        dev = spec.info["device"]
        notes = list(extra["notes"]) + list(chosen["notes"])
        if chosen["how"]:
            res["steps_found"] = chosen["how"]
        if dev.get("from") is None and spec.device is not None:
            notes.append("the capture names no GPU (no TARGET_INFO_GPU row for it: stripped or an older export): "
                         "the device, its SM count and the occupancy / SM-efficiency estimates are unknown")
        elif not dev.get("num_sms") and spec.device is not None:
            notes.append("the capture gives no SM count for the GPU: blocks per SM, SM efficiency and the "
                         "occupancy estimate are not computed")
        notes += _launched_before(tl, s_lo)
        gm = _gpu_metrics(exp, dev, spec.device, *_window_ns(res, tl.base_us))
        if gm["not_measured"]:
            notes.append(gm["not_measured"])
        if res.get("device_info"):
            res["device_info"]["from"] = f"nsys {dev.get('from')}" if dev.get("from") else \
                res["device_info"].get("from")
        tb_note = "no ProfilerStep#N in the trace"  # the plugin's wording: here the capture has no step range
        res["notes"] = notes + [n if not n.startswith(tb_note) else
                                "no step range in the capture: the whole capture (its CPU span) is one step"
                                for n in res["notes"] if not (n.startswith(tb_note) and chosen["notes"])]
        res |= {"label": spec.label, "source": "nsys",
                "rank_hint": {"device": spec.device, "pid": spec.info.get("pid"), "process": spec.info.get("process"),
                              "nccl_rank": spec.info.get("nccl_rank"), "nccl_ranks": spec.info.get("nccl_ranks"),
                              "capture": exp.path.name},
                "capture": {"schema_version": exp.schema_version, "product_version": exp.product_version,
                            "gpu": {k: dev.get(k) for k in ("name", "num_sms", "memory_bytes", "gpu_id", "from")}
                            | {"compute_capability": ".".join(map(str, dev["cc"])) if dev.get("cc") else None},
                            "occupancy_limits": {k: v for k, v in (extra.get("limits") or {}).items() if k != "cc"},
                            "nvtx_ranges": int(tl.c_ts.size), "step_candidates": chosen["candidates"],
                            "missing_tables": [t for t in (KERNEL, MEMCPY, MEMSET, RUNTIME, NVTX) if not exp.has(t)]},
                "gpu_metrics": gm, "allocator": allocator(tl, s_lo, s_hi),
                "figure_sources": FIGURE_SOURCES | {"gpu_metrics": gm["source"] or gm["not_measured"]}}
        out.append(_clean(res))
        del tl
    return out


def _launched_before(tl: Timeline, lo: np.ndarray) -> list[str]:
    """A note when the capture opens on GPU work launched before it began (no launch call in the capture): the
    host was that far ahead of the GPU, and the analysed window starts after that work (the step rule)."""
    if not lo.size or not tl.g_ts.size:
        return []
    orphan = (launch_index(tl) < 0) & (tl.g_ts + tl.g_dur <= lo[0])
    if not orphan.any():
        return []
    ahead = (float((tl.g_ts + tl.g_dur)[orphan].max()) - float(tl.g_ts.min())) / 1000.0
    return [f"the capture opens on {int(orphan.sum())} GPU event(s) ({ahead:.0f} ms) launched before it began (no "
            f"launch call in the capture: the host ran about {ahead:.0f} ms ahead of the GPU); the analysed window "
            "starts after them, as the TensorBoard plugin's step rule does"]


def _gpu_metrics(exp: Export, dev: dict, device: int | None, lo: float | None, hi: float | None) -> dict[str, Any]:
    if not exp.has("GPU_METRICS"):
        return metrics.empty(metrics.NO_TABLE)
    if device is None:
        return metrics.empty("not measured: a CPU-only rank")
    ids = metrics.gpu_ids(exp)
    gid = dev.get("gpu_id") if dev.get("gpu_id") is not None else device
    if ids and gid not in ids:
        return metrics.empty(f"not measured: GPU_METRICS sampled GPU(s) {sorted(ids)}, not this rank's GPU {gid} "
                             "(--gpu-metrics-devices names the GPUs sampled)")
    return metrics.measure(exp, gid, lo, hi)


__all__ = ["analyze_capture", "capture_files", "export_report", "iter_capture", "read_capture"]
