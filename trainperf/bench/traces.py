"""``trainperf bench traces FILE|DIR``: trainperf and Holistic Trace Analysis side by side on the same traces; on
an Nsight Systems export (.sqlite), trainperf's nsys reader against a plain ``sqlite3`` scan of its kernel table
(:func:`bench_nsys`).

Each tool runs as a whole process on the same PATH (a trace file, or a directory of one trace per rank),
``repeat`` times, the two alternating so that a change in the machine's load hits both alike:

* trainperf: ``python -m trainperf diagnose PATH --json`` (reading, every figure, the rules);
* HTA: ``TraceAnalysis(trace_dir)`` (load) + ``get_temporal_breakdown`` + ``get_idle_time_breakdown``:
  the work the speed claim is about. A single file, or a directory holding other JSON beside the traces,
  is given to HTA as a temporary directory of links to the trace files trainperf reads. Once more, untimed against the claim, HTA's ``get_comm_comp_overlap`` and
  ``get_gpu_kernel_breakdown`` for the figures that compare.

Per tool: wall time (median over the repeats, and each run), CPU time (its worker processes included), peak
resident memory of the child process (the child program's own high-water mark, ``VmHWM``, its imports
included) and of its whole process tree (both read with worker processes when given several ranks; see
:func:`run_child`). Then the figures
both compute, per rank, with their difference in percentage points: temporal breakdown (compute / non-compute
/ idle % of the GPU timeline), idle breakdown (host_wait / kernel_wait / other, HTA's idle time summed over
the rank's streams), comm/compute overlap, and kernel time by type.

HTA is an optional peer, found as ``hta_python`` (``--hta-python``), else ``TRAINPERF_HTA_PYTHON``, else the
current interpreter if it can ``import hta``; without it the HTA rows are skipped with a note saying how
to install it. Nothing here imports torch or HTA in this process.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from trainperf.errors import UserError

INSTALL_NOTE = ("HTA not found: install it in a virtual environment of its own (python -m venv hta; "
                "hta/bin/pip install HolisticTraceAnalysis==0.5.0) and pass --hta-python hta/bin/python "
                "(or set TRAINPERF_HTA_PYTHON)")

# The HTA child: load + temporal + idle (timed as a whole process), printed as JSON.
HTA_TIMED = r"""
import json, sys, time
t0 = time.perf_counter()
from hta.trace_analysis import TraceAnalysis
ta = TraceAnalysis(trace_dir=sys.argv[1])
t1 = time.perf_counter()
tb = ta.get_temporal_breakdown(visualize=False)
ranks = sorted(int(r) for r in ta.t.traces.keys())
idle = ta.get_idle_time_breakdown(ranks=ranks, visualize=False)[0]
t2 = time.perf_counter()
out = {"load_s": t1 - t0, "breakdowns_s": t2 - t1, "temporal": {}, "idle": {}}
for _, r in tb.iterrows():
    out["temporal"][int(r["rank"])] = {"compute": float(r["compute_time_pctg"]),
        "non_compute": float(r["non_compute_time_pctg"]), "idle": float(r["idle_time_pctg"])}
for rank, g in idle.groupby("rank"):
    tot = float(g["idle_time"].sum())
    out["idle"][int(rank)] = {c: (100.0 * float(g[g["idle_category"] == c]["idle_time"].sum()) / tot if tot else None)
                              for c in ("host_wait", "kernel_wait", "other")}
print("HTA_JSON " + json.dumps(out))
"""

HTA_EXTRA = r"""
import json, sys
from hta.trace_analysis import TraceAnalysis
ta = TraceAnalysis(trace_dir=sys.argv[1])
out = {"overlap": {}, "kernel_types": {}}
try:
    ov = ta.get_comm_comp_overlap(visualize=False)
    for _, r in ov.iterrows():
        v = float(r["comp_comm_overlap_pctg"])
        out["overlap"][int(r["rank"])] = v if v == v else None
except Exception as exc:
    out["overlap_error"] = f"{type(exc).__name__}: {exc}"
try:
    kt = ta.get_gpu_kernel_breakdown(visualize=False)[0]
    out["kernel_types"] = {str(r["kernel_type"]): float(r["percentage"]) for _, r in kt.iterrows()}
except Exception as exc:
    out["kernel_types_error"] = f"{type(exc).__name__}: {exc}"
print("HTA_JSON " + json.dumps(out))
"""


# The nsys children: trainperf's reader (every per-rank figure), and the floor: a plain sqlite3 scan of the kernel
# table (each row to Python, as any Python reader of the table pays) and SQLite summing it without Python rows.
NSYS_TP = r"""
import json, sys, time
t0 = time.perf_counter()
from trainperf.trace.nsys import analyze_capture
res = analyze_capture(sys.argv[1])
print("NSYS_JSON " + json.dumps({"s": time.perf_counter() - t0, "ranks": len(res),
      "events": sum(r.get("events") or 0 for r in res)}))
"""
NSYS_SCAN = r"""
import json, sqlite3, sys, time
from pathlib import Path
from urllib.parse import quote
t0 = time.perf_counter()
db = sqlite3.connect(f"file:{quote(str(Path(sys.argv[1]).resolve()))}?mode=ro", uri=True)
cols = [r[1] for r in db.execute("PRAGMA table_info(CUPTI_ACTIVITY_KIND_KERNEL)")]
want = [c for c in ("start", "end", "deviceId", "streamId", "correlationId", "demangledName", "gridX", "gridY",
                    "gridZ", "blockX", "blockY", "blockZ", "registersPerThread", "staticSharedMemory",
                    "dynamicSharedMemory") if c in cols]
if sys.argv[2] == "rows":
    n = 0
    for row in db.execute("SELECT " + ", ".join(f'"{c}"' for c in want) + " FROM CUPTI_ACTIVITY_KIND_KERNEL"):
        n += 1
else:
    n = db.execute('SELECT count(*), sum("end" - start) FROM CUPTI_ACTIVITY_KIND_KERNEL').fetchone()[0]
print("NSYS_JSON " + json.dumps({"s": time.perf_counter() - t0, "rows": n, "columns": len(want)}))
"""


def _nsys_json(stdout: str) -> dict | None:
    for line in stdout.splitlines():
        if line.startswith("NSYS_JSON "):
            return json.loads(line[10:])
    return None


def bench_nsys(path: str | Path, *, repeat: int = 1, timeout: float = 3600.0) -> dict[str, Any]:
    """trainperf's nsys reader against a plain ``sqlite3`` scan of the export's kernel table, each a whole
    process, ``repeat`` times alternating: wall and CPU time, peak RSS (VmHWM), against the file's size."""
    from trainperf.trace.nsys.schema import KERNEL, MEMCPY, MEMSET, NVTX, RUNTIME, Export

    if repeat < 1:
        raise UserError(f"--repeat {repeat}: run each reader at least once")
    path = Path(path)
    exp = Export(path)  # a UserError naming the file unless it is an export
    rows = {t: exp.row_estimate(t) for t in (KERNEL, MEMCPY, MEMSET, RUNTIME, NVTX)}
    exp.close()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    tools = {"trainperf": [sys.executable, "-c", NSYS_TP, str(path)],
             "sqlite3_rows": [sys.executable, "-c", NSYS_SCAN, str(path), "rows"],
             "sqlite3_sum": [sys.executable, "-c", NSYS_SCAN, str(path), "sum"]}
    runs: dict[str, list[dict]] = {k: [] for k in tools}
    inside: dict[str, dict] = {}
    for _ in range(repeat):
        for name, argv in tools.items():
            r = run_child(argv, env=env, timeout=timeout)
            got = _nsys_json(r["stdout"]) if r["rc"] == 0 else None
            if got is None:
                raise UserError(f"bench traces: the {name} reader failed on {path} (exit {r['rc']}): "
                                f"{r['stderr'][-500:].strip()}")
            inside[name] = got
            runs[name].append({k: r[k] for k in ("wall_s", "cpu_s", "peak_rss_mb")} | {"inside_s": got["s"]})
    size = path.stat().st_size
    out: dict[str, Any] = {"path": str(path), "bytes": size, "rows": rows, "repeat": repeat, "kind": "nsys"}
    for name, rs in runs.items():
        out[name] = {"wall_s": statistics.median(r["wall_s"] for r in rs), "wall_s_runs": [r["wall_s"] for r in rs],
                     "cpu_s": statistics.median(r["cpu_s"] for r in rs), "peak_rss_mb": max(r["peak_rss_mb"] for r in rs),
                     "inside_s": statistics.median(r["inside_s"] for r in rs)}
    tp, scan = out["trainperf"], out["sqlite3_rows"]
    out["ranks"] = inside["trainperf"]["ranks"]
    out["events"] = inside["trainperf"]["events"]
    out["kernel_rows"] = inside["sqlite3_rows"]["rows"]
    out["x_scan_wall"] = tp["wall_s"] / scan["wall_s"] if scan["wall_s"] else None
    out["x_scan_cpu"] = tp["cpu_s"] / scan["cpu_s"] if scan["cpu_s"] else None
    out["rss_mb_per_gb"] = tp["peak_rss_mb"] / (size / 1e9) if size else None
    out["measures"] = {"trainperf": "nsys reader: analyze_capture, every rank's figures",
                       "sqlite3_rows": "sqlite3: 15 columns of the kernel table, each row to Python",
                       "sqlite3_sum": "sqlite3: count(*), sum(end - start) of the kernel table, in SQL"}
    out["notes"] = []
    return out


def generate_nsys(path: str | Path, mb: int) -> dict[str, Any]:
    """A generated export of at least ``mb`` MB at ``path`` (reused when there): tracegen.nsys.make_large."""
    from trainperf.trace.nsys.schema import is_nsys_export

    p = Path(path)
    if p.exists():
        if not is_nsys_export(p):
            raise UserError(f"--generate-nsys-mb: {p} exists and is not an Nsight Systems export; it is never "
                            "replaced: pass a new path")
        if p.stat().st_size >= mb * 1e6:
            return {"reused": True, "bytes": p.stat().st_size}
        raise UserError(f"--generate-nsys-mb {mb}: {p} is an export of {p.stat().st_size / 1e6:.0f} MB, smaller; it "
                        "is never replaced: pass a new path")
    if not p.parent.is_dir():
        raise UserError(f"--generate-nsys-mb: {p.parent} is not a directory; pass a path in an existing directory")
    from trainperf.tracegen.nsys import make_large

    got = make_large(p, int(mb * 1e6))
    return {"reused": False} | {k: v for k, v in got.items() if k != "path"}


def find_hta(hta_python: str | None = None) -> tuple[str | None, str]:
    """(the interpreter that has HTA, how it was found) or (None, the note saying how to install it)."""
    cand = hta_python or os.environ.get("TRAINPERF_HTA_PYTHON")
    how = "--hta-python" if hta_python else "TRAINPERF_HTA_PYTHON"
    if cand:
        if not Path(cand).exists():
            raise UserError(f"{how}={cand}: no such interpreter; pass the python of a venv that has "
                            "HolisticTraceAnalysis installed")
        if not Path(cand).is_file() or not os.access(cand, os.X_OK):
            raise UserError(f"{how}={cand}: {'a directory' if Path(cand).is_dir() else 'not an executable file'}, "
                            "not a Python interpreter; pass the python of a venv that has HolisticTraceAnalysis "
                            "installed (e.g. hta/bin/python)")
        ok = subprocess.run([cand, "-c", "import hta"], capture_output=True, timeout=120).returncode == 0
        if not ok:
            raise UserError(f"{how}={cand} cannot `import hta`; " + INSTALL_NOTE)
        return cand, how
    ok = subprocess.run([sys.executable, "-c", "import hta"], capture_output=True, timeout=120).returncode == 0
    return (sys.executable, "this interpreter") if ok else (None, INSTALL_NOTE)


def _hwm_mb(pid: int) -> float | None:
    """The peak resident set of a live process's current program (VmHWM, Linux), MB; None elsewhere."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _tree_rss_mb(pid: int) -> float | None:
    """The resident memory of a process and all its descendants now, summed (MB; pages shared after a fork
    count in each process, so this is an upper bound), or None when it cannot be read."""
    try:
        import psutil

        root = psutil.Process(pid)
        total = 0
        for q in [root, *root.children(recursive=True)]:
            try:
                total += q.memory_info().rss
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
        return total / 2**20
    except Exception:  # noqa: BLE001 - gone, or no psutil: not measured
        return None


def run_child(argv: list[str], *, env: dict | None = None, timeout: float = 3600.0) -> dict[str, Any]:
    """Run a process; its wall time, CPU time (user + system, via os.wait4: its reaped worker processes
    included) and peak RSS, exit code, stdout and the tail of stderr. On a loaded machine the CPU time is the
    steadier figure: it leaves out the time the child waited for a core.

    Peak RSS is the child program's own high-water mark (``VmHWM`` from /proc, read every few ms while it
    runs: it only grows), not ``ru_maxrss``: Linux carries into a child's ``ru_maxrss`` the resident size
    the parent had when it forked, so a large parent would floor every child's figure. Where /proc is absent
    ``ru_maxrss`` is the fallback (``peak_rss_from`` says which). A program that reads with worker processes
    (trainperf on a directory of ranks, HTA on several ranks) holds memory in them too: ``tree_peak_rss_mb``
    is the largest sum of resident memory over the child and its descendants seen while it ran (sampled every
    ~20 ms; pages shared after a fork counted in each process: an upper bound), ``largest_rss_mb`` the
    largest single process of the tree (wait4's ``ru_maxrss``)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        p = subprocess.Popen(argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env)
        deadline = t0 + timeout
        hwm = tree = None
        tick = 0
        while True:
            h = _hwm_mb(p.pid)  # before wait4: once reaped, the pid is gone
            if h is not None:
                hwm = h if hwm is None else max(hwm, h)
            if tick % 4 == 0:
                s = _tree_rss_mb(p.pid)
                if s is not None:
                    tree = s if tree is None else max(tree, s)
            tick += 1
            pid, status, ru = os.wait4(p.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() > deadline:
                p.kill()
                pid, status, ru = os.wait4(p.pid, 0)
                break
            time.sleep(0.005)
        wall = time.perf_counter() - t0
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return {"wall_s": wall, "cpu_s": ru.ru_utime + ru.ru_stime,
                "peak_rss_mb": hwm if hwm is not None else ru.ru_maxrss / 1024,
                "peak_rss_from": "VmHWM" if hwm is not None else "ru_maxrss",
                "tree_peak_rss_mb": max(tree, hwm or 0.0) if tree is not None else None,
                "largest_rss_mb": ru.ru_maxrss / 1024, "rc": p.returncode,
                "stdout": out.read().decode("utf-8", "replace"), "stderr": err.read().decode("utf-8", "replace")[-2000:]}


def _hta_json(stdout: str) -> dict | None:
    for line in stdout.splitlines():
        if line.startswith("HTA_JSON "):
            return json.loads(line[9:])
    return None


def _hta_dir(path: Path, tmp: Path, files: list[Path]) -> Path:
    """The directory HTA is given: PATH when it holds the trace files and nothing else HTA would read (it
    parses every .json / .json.gz there: a truth.json or a config beside the traces stops it); else a
    temporary directory of links to the same trace files trainperf reads."""
    if path.is_dir() and {p.resolve() for p in path.iterdir() if p.name.endswith((".json", ".json.gz"))} == \
            {f.resolve() for f in files}:
        return path
    d = tmp / "hta_traces"
    d.mkdir()
    for f in files:
        (d / f.name).symlink_to(f.resolve())
    return d


def _diff(a, b):
    return (a - b) if isinstance(a, (int, float)) and isinstance(b, (int, float)) else None


def compare_figures(tp: dict, hta: dict, extra: dict | None) -> list[dict]:
    """One row per (rank, figure) that both computed: trainperf's value, HTA's, the difference (points)."""
    from trainperf.trace.hta import hta_type_name

    rows = []
    extra = extra or {}
    for t in tp.get("traces", []):
        r = t.get("rank")
        key = str(r)
        ht = (hta.get("temporal") or {}).get(key) or {}
        hi = (hta.get("idle") or {}).get(key) or {}
        for name in ("compute", "non_compute", "idle"):
            rows.append({"rank": r, "figure": f"temporal {name} %", "trainperf": (t.get("temporal_pct") or {}).get(name),
                         "hta": ht.get(name)})
        for name in ("host_wait", "kernel_wait", "other"):
            rows.append({"rank": r, "figure": f"idle {name} %", "trainperf": (t.get("idle_pct") or {}).get(name),
                         "hta": hi.get(name)})
        rows.append({"rank": r, "figure": "comm/compute overlap %", "trainperf": t.get("comm_compute_overlap_pct"),
                     "hta": (extra.get("overlap") or {}).get(key)})
        mine = {hta_type_name(k): v for k, v in (t.get("kernel_type_pct") or {}).items()}
        theirs = extra.get("kernel_types") or {}
        for name in sorted(set(mine) | set(theirs), key=lambda n: (n.count("overlapping"), n)):
            label = f"kernel time {name} %" + (" (rank 0 for HTA)" if len(tp["traces"]) > 1 else "")
            rows.append({"rank": r, "figure": label, "trainperf": mine.get(name), "hta": theirs.get(name)})
    for row in rows:
        row["diff_points"] = _diff(row["trainperf"], row["hta"])
    return rows


def bench_traces(path: str | Path, *, repeat: int = 1, hta_python: str | None = None,
                 timeout: float = 3600.0) -> dict[str, Any]:
    """Run both tools on PATH; see the module docstring. Returns strict-JSON-ready figures."""
    from trainperf.trace.nsys.schema import is_nsys_export
    from trainperf.trace.ranks import discover

    if is_nsys_export(path):
        return bench_nsys(path, repeat=repeat, timeout=timeout)
    if repeat < 1:
        raise UserError(f"--repeat {repeat}: run each tool at least once")
    path = Path(path)
    found = discover(path)
    if found["kind"] == "run":
        raise UserError(f"{path} is a run directory: pass a trace file or a directory of traces (e.g. {path}/profile)")
    files = found["files"]
    py, how = find_hta(hta_python)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    tp_argv = [sys.executable, "-m", "trainperf", "diagnose", str(path), "--json"]
    runs: dict[str, list[dict]] = {"trainperf": [], "hta": []}
    tp_out: dict | None = None
    hta_out: dict | None = None
    extra: dict | None = None
    notes = []
    with tempfile.TemporaryDirectory(prefix="bench-traces-") as tmp:
        hdir = _hta_dir(path, Path(tmp), files) if py else None
        for _ in range(repeat):
            r = run_child(tp_argv, env=env, timeout=timeout)
            if r["rc"] != 0:
                raise UserError(f"trainperf diagnose {path} failed (exit {r['rc']}): {r['stderr'][-500:]}")
            tp_out = json.loads(r["stdout"])
            runs["trainperf"].append({k: r[k] for k in ("wall_s", "cpu_s", "peak_rss_mb", "tree_peak_rss_mb")})
            if py:
                h = run_child([py, "-c", HTA_TIMED, str(hdir)], env=env, timeout=timeout)
                got = _hta_json(h["stdout"]) if h["rc"] == 0 else None
                if got is None:
                    notes.append(f"HTA failed on {path} (exit {h['rc']}): {h['stderr'][-400:].strip()}")
                    py = None
                else:
                    hta_out = got
                    runs["hta"].append({"wall_s": h["wall_s"], "cpu_s": h["cpu_s"], "peak_rss_mb": h["peak_rss_mb"],
                                        "tree_peak_rss_mb": h["tree_peak_rss_mb"],
                                        "load_s": got["load_s"], "breakdowns_s": got["breakdowns_s"]})
        if py:
            x = run_child([py, "-c", HTA_EXTRA, str(hdir)], env=env, timeout=timeout)
            extra = _hta_json(x["stdout"]) if x["rc"] == 0 else None
            if extra is None:
                notes.append(f"HTA's overlap / kernel breakdown failed (exit {x['rc']}): {x['stderr'][-300:].strip()}")
    if not runs["hta"] and how == INSTALL_NOTE:
        notes.append(INSTALL_NOTE)

    def summary(rs: list[dict]) -> dict | None:
        if not rs:
            return None
        walls = [r["wall_s"] for r in rs]
        return {"wall_s": statistics.median(walls), "wall_s_runs": walls,
                "cpu_s": statistics.median(r["cpu_s"] for r in rs),
                "peak_rss_mb": max(r["peak_rss_mb"] for r in rs),
                "tree_peak_rss_mb": max((r["tree_peak_rss_mb"] for r in rs if r.get("tree_peak_rss_mb") is not None),
                                        default=None), **(
                    {"load_s": statistics.median(r["load_s"] for r in rs),
                     "breakdowns_s": statistics.median(r["breakdowns_s"] for r in rs)} if "load_s" in rs[0] else {})}

    tp_s, hta_s = summary(runs["trainperf"]), summary(runs["hta"])
    events = sum((t.get("events") or 0) for t in (tp_out or {}).get("traces", [])) or None
    return {"path": str(path), "files": [str(f) for f in files], "bytes": sum(f.stat().st_size for f in files),
            "events": events, "repeat": repeat, "hta_python": py and str(py), "hta_found_by": how if py else None,
            "trainperf": tp_s, "hta": hta_s,
            "speedup": (hta_s["wall_s"] / tp_s["wall_s"]) if (tp_s and hta_s) else None,
            "cpu_speedup": (hta_s["cpu_s"] / tp_s["cpu_s"]) if (tp_s and hta_s and tp_s["cpu_s"]) else None,
            "rss_ratio": (hta_s["peak_rss_mb"] / tp_s["peak_rss_mb"]) if (tp_s and hta_s) else None,
            "tree_rss_ratio": (hta_s["tree_peak_rss_mb"] / tp_s["tree_peak_rss_mb"])
            if (tp_s and hta_s and hta_s.get("tree_peak_rss_mb") and tp_s.get("tree_peak_rss_mb")) else None,
            "figures": compare_figures(tp_out or {}, hta_out or {}, extra) if hta_out else [],
            "hta_measures": "load + temporal + idle breakdown (whole process)",
            "trainperf_measures": "trainperf diagnose PATH --json (whole process: every figure and the rules)",
            "notes": notes}


__all__ = ["bench_nsys", "bench_traces", "generate_nsys", "compare_figures", "find_hta", "run_child"]
