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
    import sys

    from trainperf.diagnosis.compare import compare_json, compare_text
    from trainperf.runio import dumps_strict

    if not args.json:
        print(compare_text(args.run_dirs)[1])
        return 0
    result, notes = compare_json(args.run_dirs)
    print(dumps_strict(result))  # strict JSON: null, never NaN
    for n in notes:  # what the text prints as notes (left-out records, ignored figures), kept off stdout
        print(f"trainperf compare: note: {n}", file=sys.stderr)
    return 0
