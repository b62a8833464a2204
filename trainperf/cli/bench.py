"""``trainperf bench KIND``: measured, side by side with the plain way.

Each bench kind measures in ``trainperf/bench/<kind>.py`` (a library function returning its result)
and is parsed and printed by ``trainperf/cli/bench_<kind>.py`` (``register(subparsers)``).
"""

from __future__ import annotations

import importlib

KINDS = {
    "step": "trainer step vs a plain PyTorch loop (overhead), plus precision/compile rows",
    "data": "HybridLoader vs torch DataLoader on a slow source",
    "balance": "dynamic load balancer on a straggler rank",
    "comm": "bytes and time per step for each parallel layout and compression",
    "traces": "trainperf vs Holistic Trace Analysis on the same profiler traces: time, memory, figures",
}


CLI = {"step": "trainperf.cli.bench_step", "data": "trainperf.cli.bench_data", "balance": "trainperf.cli.bench_balance",
       "comm": "trainperf.cli.bench_comm", "traces": "trainperf.cli.bench_traces"}


def register(subparsers) -> None:
    parser = subparsers.add_parser("bench", help="run a benchmark side by side with the plain way",
                                   description=__doc__)
    sub = parser.add_subparsers(dest="bench_kind", metavar="KIND", required=True)
    for kind in KINDS:
        importlib.import_module(CLI[kind]).register(sub)
