"""Helpers shared by subcommand modules (kept free of torch imports)."""

from __future__ import annotations

import sys
from typing import Any

from trainperf.lazy import moved_names

__getattr__ = moved_names(__name__, {"ensure_dir": "trainperf.runio"})


def no_blas_threads() -> None:
    """For a command that does no linear algebra (reading traces, run directories, reports): numpy's OpenBLAS
    starts a thread per core when numpy is imported, and each spins on its core a while before it sleeps
    (~0.1 s of CPU a process on an idle 2-core machine, none of it useful here: measured in
    docs/benchmarks/traces.md). One thread, set before numpy is imported, unless the user set a number."""
    import os

    if "numpy" not in sys.modules:
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def whole(minimum: int = 1, maximum: int = 2**53):
    """An argparse ``type`` for a whole number in [``minimum``, ``maximum``]: ``--gpus 0`` is an error that
    names the flag, the value and the bound (argparse: exit 2, no traceback), never a silent default
    or a division by zero further on; ``--gpus 99999999999999999999`` (a typo) never a search that does
    not end. The default maximum is where floats stop holding whole numbers exactly."""
    import argparse

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} is below {minimum}: give a whole number >= {minimum}")
        if value > maximum:
            raise argparse.ArgumentTypeError(f"{value} is above {maximum}: give a whole number <= {maximum}")
        return value

    parse.__name__ = f"whole number in [{minimum}, {maximum}]"
    return parse


def finite(minimum: float = 0.0, *, strict: bool = True, hi: float | None = None):
    """An argparse ``type`` for a finite number above (``strict``) or at least ``minimum``, and at most ``hi``."""
    import argparse
    import math

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not math.isfinite(value) or value < minimum or (strict and value == minimum):
            raise argparse.ArgumentTypeError(f"{text} must be a finite number {'>' if strict else '>='} {minimum:g}"
                                             + (f" and at most {hi:g}" if hi is not None else ""))
        if hi is not None and value > hi:
            raise argparse.ArgumentTypeError(f"{text} must be at most {hi:g}")
        return value

    parse.__name__ = "number"
    return parse


def add_json_flag(parser) -> None:
    parser.add_argument("--json", action="store_true", help="print the figures as JSON for scripts")


def add_config_args(parser, *, required: bool = True) -> None:
    parser.add_argument("config", nargs=None if required else "?", help="YAML config file")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config field, e.g. --set optimizer.lr=3e-4 (repeatable; wins over the file)",
    )


def print_json(obj: Any) -> None:
    """Every ``--json`` output: strict JSON (NaN/Infinity as null; trainperf.runio.dumps_strict)."""
    from trainperf.runio import dumps_strict

    sys.stdout.write(dumps_strict(obj) + "\n")
