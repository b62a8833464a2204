"""HTA's critical path analysis on one trace, as a whole process: the yardstick for the speed of trainperf's
attribution (docs/benchmarks/traces.md, "Who made the GPU wait").

    python benchmarks/hta_critical_path.py TRACE [--annotation ProfilerStep] [--instances all|N|A-B]

Runs HolisticTraceAnalysis 0.5.0 (not a trainperf dependency; run it under the interpreter that has it, e.g.
PEERS_VENV/bin/python): ``TraceAnalysis`` on the trace's directory (a copy holding only that file), then
``critical_path_analysis(rank, annotation, instance_id)`` over the profiler steps and its ``summary()``; prints
the seconds of each part and the summary. HTA 0.5.0's critical path needs pandas < 3 (with pandas 3 its
``drop(axis=1, columns=...)`` raises): put a pandas 2 first on PYTHONPATH when the interpreter has pandas 3.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import tempfile
import time


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("--annotation", default="ProfilerStep", help="HTA's annotation ('' = the whole trace)")
    ap.add_argument("--instances", default="all", help="all | N | A-B (instances of the annotation)")
    a = ap.parse_args(argv)
    os.environ.setdefault("CRITICAL_PATH_ADD_ZERO_WEIGHT_LAUNCH_EDGE", "1")
    logging.disable(logging.WARNING)
    t0 = time.perf_counter()
    from hta.trace_analysis import TraceAnalysis  # noqa: E402 - timed: HTA's import is part of its cost

    t1 = time.perf_counter()
    with tempfile.TemporaryDirectory() as d:
        shutil.copy(a.trace, os.path.join(d, os.path.basename(a.trace)))
        t = TraceAnalysis(trace_dir=d)
        t2 = time.perf_counter()
        rank = sorted(t.t.traces)[0]
        if a.annotation and a.instances == "all":
            df = t.t.get_trace(rank)
            ids = [v for k, v in t.t.symbol_table.get_sym_id_map().items() if a.annotation in k]
            n = int(df.name.isin(ids).sum())
            inst = (0, max(n - 1, 0))
        elif "-" in a.instances:
            x, y = a.instances.split("-")
            inst = (int(x), int(y))
        else:
            inst = None if a.instances == "none" else int(a.instances)
        out = t.critical_path_analysis(rank=rank, annotation=a.annotation, instance_id=inst)
        t3 = time.perf_counter()
        if out is None or not out[1]:
            print(f"HTA critical path analysis failed on {a.trace}", file=sys.stderr)
            return 1
        summary = out[0].summary()
        t4 = time.perf_counter()
    print(f"import {t1 - t0:.2f} s, load {t2 - t1:.2f} s, critical path {t3 - t2:.2f} s, summary {t4 - t3:.2f} s; "
          f"annotation {a.annotation!r} instances {inst}, {len(out[0].nodes)} nodes")
    print(summary.to_string())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
