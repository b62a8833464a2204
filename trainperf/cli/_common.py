"""Helpers shared by subcommand modules (kept free of torch imports)."""

from __future__ import annotations

import sys
from typing import Any


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
