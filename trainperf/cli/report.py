"""``trainperf report RUN_DIR [--out FILE] [--json]``: a self-contained HTML report with charts."""

from __future__ import annotations

from trainperf.cli._common import add_json_flag, print_json


def register(subparsers) -> None:
    p = subparsers.add_parser("report", help="write RUN_DIR/report.html (charts, findings) and RUN_DIR/report/*.png")
    p.add_argument("run_dir", metavar="RUN_DIR", help="run directory written by `trainperf train` (run.dir)")
    p.add_argument("--out", default=None, metavar="FILE", help="HTML path (default: RUN_DIR/report.html)")
    add_json_flag(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from trainperf.monitor.report import build_report

    result = build_report(args.run_dir, args.out)
    if args.json:
        print_json(result)
    else:
        print(f"report: {result['html']} ({len(result['charts'])} charts"
              + (f"; no data for {', '.join(result['skipped'])}" if result["skipped"] else "") + ")")
    return 0
