"""``trainperf report RUN_DIR [RUN_DIR ...] [--out FILE] [--json]``: a self-contained HTML report
(one run), or the side-by-side comparison of `trainperf compare` as HTML (several runs)."""

from __future__ import annotations

from trainperf.cli._common import add_json_flag


def register(subparsers) -> None:
    p = subparsers.add_parser("report", help="write RUN_DIR/report.html (charts, findings); with several runs, "
                                             "RUN_A/compare.html (the runs side by side)")
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR",
                   help="run directory written by `trainperf train` (run.dir); several: compare them")
    p.add_argument("--out", default=None, metavar="FILE",
                   help="HTML path (default: RUN_DIR/report.html, or RUN_A/compare.html for several runs)")
    add_json_flag(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from trainperf.runio import dumps_strict

    if len(args.run_dirs) == 1:
        from trainperf.monitor.report import build_report

        result = build_report(args.run_dirs[0], args.out)
    else:
        from trainperf.monitor.compare import build_compare_report

        result = build_compare_report(args.run_dirs, args.out)
    if args.json:
        print(dumps_strict(result))
    else:
        print(f"report: {result['html']} ({len(result['charts'])} charts"
              + (f"; no data for {', '.join(result['skipped'])}" if result["skipped"] else "") + ")")
        if result.get("known") is not None:  # a run killed before its first step record: what it left
            from trainperf.monitor.diagnose import known_lines

            print("\n".join(known_lines(result)))
    return 0
