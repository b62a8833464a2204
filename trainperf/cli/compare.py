"""``trainperf compare RUN_A RUN_B [...] [--json]``: runs side by side, the speed-up and what changed."""

from __future__ import annotations

from trainperf.cli._common import add_json_flag


def register(subparsers) -> None:
    p = subparsers.add_parser("compare", help="compare runs: tokens/s, MFU/HFU, phases, memory, loss, config diff")
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR",
                   help="two or more run directories written by `trainperf train` (the first is the baseline)")
    add_json_flag(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from trainperf.monitor.compare import compare_text
    from trainperf.runio import dumps_strict

    result, text = compare_text(args.run_dirs)
    print(dumps_strict(result) if args.json else text)  # strict JSON: null, never NaN
    return 0
