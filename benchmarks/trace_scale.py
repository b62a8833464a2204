"""Time and memory of ``trainperf diagnose`` as a trace grows: 1x against Nx, in both layouts.

    python benchmarks/trace_scale.py SRC.json.gz [--times 16] [--repeat 1] [--workdir DIR] [--json OUT]

Writes SRC repeated ``--times`` times (``trainperf.tracegen.synth.repeat``: the events copied with shifted
timestamps, ids and profiler steps renumbered) in each layout: ``lines`` (one event per line, as torch writes
a trace) and ``single`` (the whole JSON on one line, as tools that re-save traces write it), gzipped. Then
runs ``python -m trainperf diagnose FILE --json`` on each, as a whole process, ``--repeat`` times alternating,
and prints per file: events, MB on disk, wall and CPU seconds (median; CPU = user + system of the child,
steadier on a loaded machine), peak RSS of the child (its own high-water mark, ``VmHWM``: see
``trainperf.bench.traces.run_child``), and for Nx its ratios to 1x (time ~N and memory ~constant is the
claim). A wall time on a shared machine is noisy: the ratios are measured side by side in one run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trainperf.bench.traces import run_child  # noqa: E402
from trainperf.tracegen import synth  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("src")
    ap.add_argument("--times", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    work = Path(a.workdir or tempfile.mkdtemp(prefix="trace-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    files = {}
    for layout in ("lines", "single"):
        for n in (1, a.times):
            p = work / f"x{n}_{layout}.json.gz"
            if not p.exists():
                info = synth.repeat(a.src, p, times=n, layout=layout)
            else:
                info = {"events": None}
            files[(layout, n)] = (p, info["events"])
    runs: dict = {k: [] for k in files}
    for _ in range(a.repeat):
        for k, (p, _) in files.items():
            r = run_child([sys.executable, "-m", "trainperf", "diagnose", str(p), "--json"])
            if r["rc"] != 0:
                print(f"{p}: exit {r['rc']}: {r['stderr'][-800:]}", file=sys.stderr)
                return 1
            runs[k].append(r)
    rows = []
    for (layout, n), (p, events) in files.items():
        rs = runs[(layout, n)]
        out = json.loads(rs[-1]["stdout"])
        ev = events or sum(t.get("events") or 0 for t in out["traces"]) or None
        rows.append({"layout": layout, "times": n, "file": str(p), "events": ev, "mb": p.stat().st_size / 2**20,
                     "wall_s": statistics.median(r["wall_s"] for r in rs), "cpu_s": statistics.median(r["cpu_s"] for r in rs),
                     "peak_rss_mb": max(r["peak_rss_mb"] for r in rs),
                     "steps": out["traces"][0].get("steps")})
    base = {r["layout"]: r for r in rows if r["times"] == 1}
    for r in rows:
        b = base[r["layout"]]
        r["time_ratio"] = r["wall_s"] / b["wall_s"]
        r["cpu_ratio"] = r["cpu_s"] / b["cpu_s"]
        r["rss_ratio"] = r["peak_rss_mb"] / b["peak_rss_mb"]
    print(f"uptime: {os.popen('uptime').read().strip()}")
    print(f"{'layout':<8}{'x':>4}{'events':>11}{'MB gz':>8}{'steps':>7}{'wall s':>9}{'CPU s':>8}{'peak RSS MB':>13}"
          f"{'time/1x':>9}{'CPU/1x':>8}{'RSS/1x':>8}")
    for r in rows:
        print(f"{r['layout']:<8}{r['times']:>4}{(r['events'] or 0):>11,}{r['mb']:>8.1f}{str(r['steps']):>7}"
              f"{r['wall_s']:>9.2f}{r['cpu_s']:>8.2f}{r['peak_rss_mb']:>13.0f}{r['time_ratio']:>9.2f}{r['cpu_ratio']:>8.2f}"
              f"{r['rss_ratio']:>8.2f}")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
