"""Which JSON parser reads a profiler trace: parse-only time and peak memory of each candidate, side by side.

    python benchmarks/trace_parsers.py [--events 1200000] [--kind a100_ddp] [--repeat 1] [--workdir DIR]
                                       [--peer-python PEERS/bin/python] [--no-hta] [--json OUT]

Makes one generated trace of about ``--events`` events (``make_trace(kind, steps=50)`` repeated by
``trainperf.tracegen.synth.repeat`` with shifted timestamps and ids) in both layouts, gzipped: ``lines`` (one
event per line, as torch writes it) and ``single`` (one line, as tools re-save it). Then, on each file, each
candidate runs in a process of its own, the candidates alternating within a repeat so that a change in the
machine's load hits them alike:

* ``gzip floor``: ``gzip.open(f).read(1 MiB)`` until the end, the bytes dropped: decompression alone;
* ``json.load``: the standard library, the whole document into dicts;
* ``orjson``: ``orjson.loads`` of the decompressed bytes (the whole document);
* ``msgspec structs``: ``msgspec.json.decode`` of the whole document into typed structs (trainperf's own
  ``Event`` / ``Args`` types);
* ``ijson yajl2_c``: ``ijson.items(f, "traceEvents.item")``, streaming, each event a dict, dropped;
* ``trainperf reader``: ``TraceReader(f).chunks()``, trainperf's streaming reader (msgspec typed structs
  over event-boundary chunks, a bounded buffer), the events dropped;
* ``trainperf diagnose``: the whole command, ``python -m trainperf diagnose FILE --json`` (read, every
  figure, the rules);
* ``HTA``: ``TraceAnalysis`` load + ``get_temporal_breakdown`` + ``get_idle_time_breakdown``, as
  ``trainperf bench traces`` runs it.

Each parse-only child prints the number of events it saw, checked equal across candidates (so each measures
what it names). Measured per run: wall time of the whole child (its imports included, median over repeats),
its CPU time (user + system: on a loaded machine the steadier figure, since it leaves out the time the child
waited for a core) and its peak RSS (that child program's own high-water mark, ``VmHWM``, see
``trainperf.bench.traces.run_child``). Ratios are to the gzip floor of the same file, in the same run. A
candidate whose module is absent in this interpreter runs under ``--peer-python`` if that has it, else it is
skipped with a note.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trainperf.bench.traces import HTA_TIMED, _hta_json, run_child  # noqa: E402

PRE = "import gzip, sys\np = sys.argv[1]\nf = gzip.open(p, 'rb')\n"
CHILDREN = {
    "gzip floor": (None, PRE + "n = 0\nwhile True:\n    b = f.read(1 << 20)\n    if not b: break\n    n += len(b)\n"
                         "print('EVENTS', -1)\n"),
    "json.load": ("json", PRE + "import json\nd = json.load(f)\nprint('EVENTS', len(d['traceEvents']))\n"),
    "orjson": ("orjson", PRE + "import orjson\nd = orjson.loads(f.read())\nprint('EVENTS', len(d['traceEvents']))\n"),
    "msgspec structs": ("msgspec", PRE + (
        "import msgspec\nfrom trainperf.trace.reader import Event\n"
        "class Trace(msgspec.Struct):\n    traceEvents: list[Event]\n"
        "d = msgspec.json.decode(f.read(), type=Trace)\nprint('EVENTS', len(d.traceEvents))\n")),
    "ijson yajl2_c": ("ijson", PRE + (
        "import ijson\nassert ijson.backend == 'yajl2_c', ijson.backend\nn = 0\n"
        "for e in ijson.items(f, 'traceEvents.item'):\n    n += 1\nprint('EVENTS', n)\n")),
    "trainperf reader": ("trainperf", PRE + (
        "from trainperf.trace.reader import TraceReader\nn = 0\n"
        "for c in TraceReader(p).chunks():\n    n += len(c)\nprint('EVENTS', n)\n")),
}


def has(python: str, module: str | None) -> bool:
    if module is None:
        return True
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([python, "-c", f"import {module}"], capture_output=True, env=env).returncode == 0


def make_files(work: Path, events: int, kind: str) -> dict[str, tuple[Path, int]]:
    from trainperf.tracegen import synth
    from trainperf.tracegen.generate import make_trace

    base = work / f"{kind}_50steps.json.gz"
    info = make_trace(base, kind=kind, steps=50, layout="lines", seed=11)
    times = max(1, round(events / info["events"]))
    out = {}
    for layout in ("lines", "single"):
        p = work / f"{kind}_x{times}_{layout}.json.gz"
        if not p.exists():
            r = synth.repeat(base, p, times=times, layout=layout)
            (work / (p.name + ".events")).write_text(str(r["events"]))
        out[layout] = (p, int((work / (p.name + ".events")).read_text()))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=1_200_000)
    ap.add_argument("--kind", default="a100_ddp")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--peer-python", default=None,
                    help="an interpreter holding the candidates trainperf does not install (HTA, orjson, ijson)")
    ap.add_argument("--no-hta", action="store_true")
    ap.add_argument("--layouts", default="single,lines")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    work = Path(a.workdir or tempfile.mkdtemp(prefix="trace-parsers-"))
    work.mkdir(parents=True, exist_ok=True)
    files = make_files(work, a.events, a.kind)
    peer = a.peer_python if a.peer_python and Path(a.peer_python).exists() else None
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    plan, notes = [], []
    for name, (mod, code) in CHILDREN.items():
        if has(sys.executable, mod):
            plan.append((name, [sys.executable, "-c", code], "this venv"))
        elif peer and has(peer, mod):
            plan.append((name, [peer, "-c", code], peer))
        else:
            notes.append(f"{name}: skipped ({mod} not installed here{' nor in ' + peer if peer else ''})")
    plan.append(("trainperf diagnose", [sys.executable, "-m", "trainperf", "diagnose", "{}", "--json"], "this venv"))
    hta_py = None
    if not a.no_hta:
        for cand in [sys.executable] + ([peer] if peer else []):
            if has(cand, "hta"):
                hta_py = cand
                break
        if hta_py:
            plan.append(("HTA load+temporal+idle", [hta_py, "-c", HTA_TIMED, "{dir}"], hta_py))
        else:
            notes.append("HTA: skipped (HolisticTraceAnalysis not installed)")
    up0 = os.popen("uptime").read().strip()
    rows = []
    for layout in a.layouts.split(","):
        p, n_events = files[layout]
        hdir = work / f"hta_{layout}"
        hdir.mkdir(exist_ok=True)
        link = hdir / "rank-0.json.gz"
        if not link.exists():
            link.symlink_to(p.resolve())
        runs: dict[str, list] = {name: [] for name, _, _ in plan}
        for _ in range(a.repeat):
            for name, argv_, _ in plan:
                cmd = [str(hdir) if x == "{dir}" else str(p) if x == "{}" else x for x in argv_]
                if name in CHILDREN:
                    cmd = cmd + [str(p)]
                print(f"[{layout}] {name} ...", file=sys.stderr, flush=True)
                r = run_child(cmd, env=env)
                if r["rc"] != 0:
                    print(f"{name} on {p}: exit {r['rc']}: {r['stderr'][-600:]}", file=sys.stderr)
                seen = None
                for line in r["stdout"].splitlines():
                    if line.startswith("EVENTS "):
                        seen = int(line.split()[1])
                if name in CHILDREN and name != "gzip floor" and r["rc"] == 0 and seen != n_events:
                    print(f"{name}: saw {seen} events, the file has {n_events}", file=sys.stderr)
                    return 1
                if name.startswith("HTA") and r["rc"] == 0:
                    h = _hta_json(r["stdout"]) or {}
                    r["split"] = {"load_s": h.get("load_s"), "breakdowns_s": h.get("breakdowns_s")}
                runs[name].append(r)
        floor = None
        for name, _, py in plan:
            rs = runs[name]
            ok = [r for r in rs if r["rc"] == 0]
            row = {"layout": layout, "candidate": name, "python": py, "file": str(p), "events": n_events,
                   "mb_gz": p.stat().st_size / 2**20, "ok": bool(ok),
                   "wall_s": statistics.median(r["wall_s"] for r in ok) if ok else None,
                   "walls": [r["wall_s"] for r in rs],
                   "cpu_s": statistics.median(r["cpu_s"] for r in ok) if ok else None,
                   "peak_rss_mb": max(r["peak_rss_mb"] for r in ok) if ok else None,
                   "split": ok[-1].get("split") if ok else None}
            if name == "gzip floor":
                floor = row
            row["x_floor"] = row["wall_s"] / floor["wall_s"] if floor and row["wall_s"] else None
            row["cpu_x_floor"] = row["cpu_s"] / floor["cpu_s"] if floor and row["cpu_s"] else None
            rows.append(row)
    print(f"uptime at start: {up0}\nuptime at end:   {os.popen('uptime').read().strip()}")
    print(f"{platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} CPUs; python {platform.python_version()}")
    for layout in a.layouts.split(","):
        r0 = next(r for r in rows if r["layout"] == layout)
        print(f"\n{layout}: {r0['file']}  {r0['events']:,} events, {r0['mb_gz']:.1f} MB gzipped")
        print(f"{'candidate':<26}{'wall s':>9}{'x floor':>9}{'CPU s':>9}{'x floor':>9}{'peak RSS MB':>13}")
        for r in rows:
            if r["layout"] != layout:
                continue
            w = f"{r['wall_s']:.2f}" if r["wall_s"] is not None else "failed"
            x = f"{r['x_floor']:.1f}" if r["x_floor"] is not None else "-"
            m = f"{r['peak_rss_mb']:.0f}" if r["peak_rss_mb"] is not None else "-"
            c = f"{r['cpu_s']:.2f}" if r["cpu_s"] is not None else "-"
            cx = f"{r['cpu_x_floor']:.1f}" if r["cpu_x_floor"] is not None else "-"
            extra = ""
            if r["split"] and r["split"].get("load_s") is not None:
                extra = f"  (load {r['split']['load_s']:.1f} s + breakdowns {r['split']['breakdowns_s']:.1f} s)"
            print(f"{r['candidate']:<26}{w:>9}{x:>9}{c:>9}{cx:>9}{m:>13}{extra}")
    for n in notes:
        print("note:", n)
    if a.json:
        Path(a.json).write_text(json.dumps({"rows": rows, "notes": notes, "uptime_start": up0,
                                            "uptime_end": os.popen("uptime").read().strip()},
                                           indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
