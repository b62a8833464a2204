"""``trainperf report PATH [RUN_DIR ...] [--out FILE] [--json]``: a self-contained HTML report of one run
directory (its profile/ traces included) or of profiler traces (a trace file, or a directory of traces one
per rank), or the side-by-side comparison of `trainperf compare` as HTML (several run directories)."""

from __future__ import annotations

from trainperf.cli._common import add_json_flag


def register(subparsers) -> None:
    from trainperf.cli.diagnose import add_trace_args

    p = subparsers.add_parser("report", help="write RUN_DIR/report.html (charts, findings), a trace report "
                                             "(TRACE.report.html or DIR/trace_report.html); with several runs, "
                                             "RUN_A/compare.html (the runs side by side)")
    p.add_argument("run_dirs", nargs="+", metavar="PATH",
                   help="run directory written by `trainperf train` (run.dir), a trace file or a directory of "
                        "traces; several run directories: compare them")
    p.add_argument("--out", default=None, metavar="FILE",
                   help="HTML path (default: RUN_DIR/report.html, TRACE.report.html, DIR/trace_report.html, or "
                        "RUN_A/compare.html for several runs)")
    add_json_flag(p)
    add_trace_args(p)
    p.set_defaults(func=run)


def check_out(path: str | None, flag: str = "--out") -> None:
    """An output file the user named: not a directory, in a directory that exists."""
    import os

    from trainperf.errors import UserError

    if path is None:
        return
    if os.path.isdir(path):
        raise UserError(f"{flag} {path!r} is a directory; give a file name, e.g. {os.path.join(path, 'report.html')}")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise UserError(f"{flag} {path!r}: directory {parent} does not exist; create it or choose another path")


def run(args) -> int:
    from trainperf.runio import dumps_strict

    check_out(args.out)
    if len(args.run_dirs) == 1:
        from trainperf.trace.ranks import discover

        if discover(args.run_dirs[0])["kind"] == "run":
            from trainperf.monitor.report import build_report

            result = build_report(args.run_dirs[0], args.out)
        else:
            from trainperf.monitor.trace_report import build_trace_report

            result = build_trace_report(args.run_dirs[0], args.out, top_n=args.top,
                                        patterns=args.comm_patterns or None)
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
