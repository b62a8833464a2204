"""``trainperf diagnose RUN_DIR [--json]``: where did the time go, and what to change."""

from __future__ import annotations

from trainperf.cli._common import add_json_flag


def register(subparsers) -> None:
    p = subparsers.add_parser("diagnose", help="diagnose a run directory: bottlenecks, evidence and fixes")
    p.add_argument("run_dir", metavar="RUN_DIR", help="run directory written by `trainperf train` (run.dir)")
    add_json_flag(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from trainperf.monitor.diagnose import diagnose, format_findings
    from trainperf.runio import dumps_strict

    result = diagnose(args.run_dir)
    if args.json:
        print(dumps_strict(result))  # strict JSON: null, never NaN
    else:
        print(format_findings(result).lstrip("\n"))
    return 0
