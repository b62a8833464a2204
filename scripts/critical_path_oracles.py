"""HTA's critical path on its own test traces: the oracle that trainperf's attribution of idle time is checked
against (tests/unit/test_attribution_hta.py, docs/concepts/attribution.md).

    PYTHONPATH=<pandas 2> PEERS_VENV/bin/python scripts/critical_path_oracles.py \
        --root tests/data/real --out tests/data/trace_oracles/critical_path.json

Runs HolisticTraceAnalysis 0.5.0 (not a trainperf dependency) on each trace of ``CASES`` (paths relative to
``--root``, as HTA's repository has them under ``hta-data/``), with the annotation and instance its own tests
use (tests/test_critical_path_analysis.py at f4d0062), ``CRITICAL_PATH_ADD_ZERO_WEIGHT_LAUNCH_EDGE=1`` as they
set it, and writes per trace: the window HTA analysed (the annotation instance's start and end, in the trace's
microseconds), the critical path's total, its breakdown by ``bound_by`` (HTA's ``summary()``), and its
CPU-bound time by event name. HTA 0.5.0's critical path needs pandas < 3 (pandas 3 rejects its
``drop(axis=1, columns=...)``): put a pandas 2 first on PYTHONPATH when the interpreter has pandas 3.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

FORWARD = "[param|pytorch.model.alex_net|0|0|0|measure|forward]"
CASES = {  # trace -> (annotation, instance), as HTA's tests call critical_path_analysis
    "hta-data/tests/data/critical_path/alexnet/benchmark_result_2869224_1695835535_trace.json.gz": (FORWARD, 1),
    "hta-data/tests/data/critical_path/simple_add/benchmark_result_493459_1694039959_trace.json.gz": (FORWARD, 1),
    "hta-data/tests/data/critical_path/cuda_event_sync/event_sync_trace.json.gz": ("ProfilerStep", 0),
    "hta-data/tests/data/critical_path/cuda_event_sync_multi_stream/event_sync_trace.json.gz": ("", None),
}


def _window(t, rank: int, annotation: str, instance) -> tuple[float, float]:
    """The window HTA's critical_path_analysis analyses (its own rule, restated)."""
    df = t.t.get_trace(rank)
    if annotation == "":
        return float(df.ts.min()), float((df.ts + df.dur).max())
    ids = [v for k, v in t.t.symbol_table.get_sym_id_map().items() if annotation in k]
    a = df[df.name.isin(ids)]
    i0, i1 = (instance, instance) if isinstance(instance, int) else instance
    return float(a.ts.iloc[i0:i1 + 1].min()), float((a.ts + a.dur).iloc[i0:i1 + 1].max())


def oracle(path: Path, annotation: str, instance) -> dict:
    from hta.trace_analysis import TraceAnalysis

    with tempfile.TemporaryDirectory() as d:
        shutil.copy(path, os.path.join(d, path.name))
        t = TraceAnalysis(trace_dir=d)
        rank = sorted(t.t.traces)[0]
        g, ok = t.critical_path_analysis(rank=rank, annotation=annotation, instance_id=instance)
        if not ok:
            raise RuntimeError(f"HTA's critical path failed on {path}")
        bd = g.get_critical_path_breakdown()
        summary = g.summary()
        cpu = bd[bd.bound_by == "cpu_bound"].groupby("s_name").duration.sum().sort_values(ascending=False)
        lo, hi = _window(t, rank, annotation, instance)
        # HTA keeps the file's microseconds; the oracle says where its window lies in them
        return {"annotation": annotation, "instance": instance, "window_us": [lo, hi],
                "path_us": float(bd.duration.sum()),
                "bound_by_pct": {str(k): round(float(v), 3) for k, v in summary.items() if str(k)},
                "cpu_bound_us": {str(k): float(v) for k, v in cpu.items() if v > 0},
                "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default="tests/data/real", help="where hta-data/... lies")
    ap.add_argument("--out", default="tests/data/trace_oracles/critical_path.json")
    a = ap.parse_args(argv)
    os.environ["CRITICAL_PATH_ADD_ZERO_WEIGHT_LAUNCH_EDGE"] = "1"
    logging.disable(logging.WARNING)
    import hta
    import pandas

    out = {"command": "PYTHONPATH=<pandas 2> python scripts/critical_path_oracles.py --root " + a.root + " --out "
                      + a.out,
           "made": datetime.date.today().isoformat(),
           "peers": {"HolisticTraceAnalysis": getattr(hta, "__version__", "0.5.0"), "pandas": pandas.__version__},
           "traces": {rel: oracle(Path(a.root) / rel, *case) for rel, case in CASES.items()}}
    Path(a.out).write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
