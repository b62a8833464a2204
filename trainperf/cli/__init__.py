"""The ``trainperf`` command line.

The root only registers subcommands; each lives in its own module with a
``register(subparsers)`` function that adds its parser and sets
``func=<callable(args) -> int>``. Modules must not import torch at import
time: ``trainperf plan`` answers without it.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# One module per subcommand, in the order shown by --help.
COMMANDS = [
    "doctor",
    "config",
    "data",
    "train",
    "memory",
    "tune",
    "plan",
    "launch",
    "diagnose",
    "report",
    "compare",
    "bench",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trainperf",
        description="Measure where a PyTorch training job loses time and memory, "
        "apply the right optimization, and prove the gain.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"trainperf.cli.{name}")
        except ModuleNotFoundError as exc:  # a subcommand not built yet
            if exc.name == f"trainperf.cli.{name}":
                continue
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from trainperf.errors import UserError

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        rc = args.func(args)
    except UserError as exc:
        print(f"trainperf {args.command}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"trainperf {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    return int(rc or 0)
