"""``trainperf bench KIND``: measured, side by side with the plain way.

Each bench kind lives in ``trainperf/bench/<kind>.py`` and exposes
``register(subparsers)`` (adding its parser and ``func``), like a subcommand.
"""

from __future__ import annotations

import importlib

KINDS = {
    "step": "trainer step vs a plain PyTorch loop (overhead), plus precision/compile rows",
    "data": "HybridLoader vs torch DataLoader on a slow source",
    "balance": "dynamic load balancer on a straggler rank",
    "comm": "bytes and time per step for each parallel layout and compression",
}


def register(subparsers) -> None:
    parser = subparsers.add_parser("bench", help="run a benchmark side by side with the plain way",
                                   description=__doc__)
    sub = parser.add_subparsers(dest="bench_kind", metavar="KIND", required=True)
    for kind in KINDS:
        try:
            module = importlib.import_module(f"trainperf.bench.{kind}")
        except ModuleNotFoundError as exc:
            if exc.name == f"trainperf.bench.{kind}":
                continue
            raise
        module.register(sub)
