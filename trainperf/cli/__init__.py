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


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser of every subcommand, or of ``only`` (the command being run: its module alone is imported, so
    a command does not pay for the others' imports)."""
    parser = argparse.ArgumentParser(
        prog="trainperf",
        description="Measure where a PyTorch training job loses time and memory, "
        "apply the right optimization, and prove the gain.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in [only] if only in COMMANDS else COMMANDS:
        try:
            module = importlib.import_module(f"trainperf.cli.{name}")
        except ModuleNotFoundError as exc:  # a subcommand not built yet
            if exc.name == f"trainperf.cli.{name}":
                continue
            raise
        module.register(sub)
    return parser


def _cli_warning_format():
    """trainperf's own warnings printed as ``trainperf: warning: MESSAGE`` (a user reads them; the source line
    Python puts first is for developers); any other library's keep Python's format."""
    import os
    import warnings

    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    default = warnings.formatwarning

    def fmt(message, category, filename, lineno, line=None):
        if str(filename).startswith(package) and issubclass(category, UserWarning):
            return f"trainperf: warning: {message}\n"
        return default(message, category, filename, lineno, line)

    return fmt


def main(argv: list[str] | None = None) -> int:
    """Exit codes: 0, 2 for a UserError (its message, no traceback), 130 / 143 when Ctrl-C / SIGTERM
    stopped the command (trainperf/interrupt.py: whatever fails after the signal is part of stopping)."""
    from trainperf import interrupt

    replaced = interrupt.install()
    import warnings

    if argv is None:  # the trainperf command (in-process callers keep their own warning format)
        warnings.formatwarning = _cli_warning_format()
    code = None  # set when the command returns one; an exception leaves it unset
    try:
        code = _main(argv)
        return code
    except KeyboardInterrupt as exc:  # while the parser imported the subcommands (torch)
        code = _interrupted(None, interrupt.exit_code(exc))
        return code
    finally:
        try:
            if argv is None:  # the trainperf command: a Ctrl-C while the interpreter shuts down keeps the exit code
                interrupt.finished()
            else:  # called in-process (tests, scripts): the caller's handlers back
                interrupt.restore(replaced)
        except KeyboardInterrupt as exc:  # the first signal just as the command returned: stopped all the same
            code = interrupt.exit_code(exc)
            return code  # noqa: B012 - this exit code replaces the command's
        finally:
            if argv is None and interrupt.received() is not None:
                interrupt.exit_now(code if code is not None else interrupt.exit_code())


def _main(argv: list[str] | None) -> int:
    from trainperf import interrupt
    from trainperf.errors import UserError

    words = sys.argv[1:] if argv is None else list(argv)
    first = next((w for w in words if not str(w).startswith("-")), None)
    parser = build_parser(only=first if first in COMMANDS else None)
    args = parser.parse_args(argv)
    bad = _not_finite(parser, args)
    if bad:
        print(f"trainperf {args.command}: error: {bad}", file=sys.stderr)
        return 2
    try:
        rc = args.func(args)
    except KeyboardInterrupt as exc:
        return _interrupted(args.command, interrupt.exit_code(exc))
    except UserError as exc:
        if interrupt.received() is not None:
            return _interrupted(args.command, interrupt.exit_code())
        print(f"trainperf {args.command}: error: {exc}", file=sys.stderr)
        _record_for_torchrun(exc)
        return exc.exit_code
    except BrokenPipeError:
        if interrupt.received() is not None:
            return _interrupted(args.command, interrupt.exit_code())
        return 0
    except Exception:
        if interrupt.received() is not None:  # e.g. a collective whose peer was stopped by the same Ctrl-C
            return _interrupted(args.command, interrupt.exit_code())
        raise
    return int(rc or 0)


def _record_for_torchrun(exc: BaseException) -> None:
    """Under torchrun (``TORCHELASTIC_ERROR_FILE`` set), write why this rank failed into its error file, as
    torch's ``@record`` does: ``trainperf launch`` reads it to tell a diverged run (which a restart from the
    last checkpoint would repeat) from one a restart can fix. Only where torch is already loaded (a training
    rank); never an error of its own."""
    import os

    if not os.environ.get("TORCHELASTIC_ERROR_FILE") or "torch" not in sys.modules:
        return
    try:
        from torch.distributed.elastic.multiprocessing.errors import ErrorHandler

        ErrorHandler().record_exception(exc)
    except Exception:  # noqa: BLE001 - the rank's own message is already printed
        pass


def _not_finite(parser, args) -> str | None:
    """Any number given on the command line must be finite: argparse's ``float`` takes ``nan`` and
    ``inf``, which every ``< bound`` check lets through (a budget of nan minutes, a slowdown of nan)."""
    import math

    for dest, value in vars(args).items():
        if isinstance(value, float) and not math.isfinite(value):
            flag = _option_for(parser, dest) or f"--{dest.replace('_', '-')}"
            return f"{flag} {value}: give a finite number"
    return None


def _option_for(parser, dest: str) -> str | None:
    import argparse

    for action in parser._actions:  # noqa: SLF001 - argparse keeps no public index of its actions
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            for sub in action.choices.values():
                found = _option_for(sub, dest)
                if found:
                    return found
        elif action.dest == dest and action.option_strings:
            return max(action.option_strings, key=len)
    return None


def _interrupted(command: str | None, code: int) -> int:
    import os

    from trainperf import interrupt

    if os.environ.get("RANK", "0") not in ("", "0") and os.environ.get("WORLD_SIZE", "1") != "1":
        return code  # under torchrun rank 0 says it for all
    try:
        print(f"trainperf{' ' + command if command else ''}: {interrupt.describe(code)}", file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass
    return code
