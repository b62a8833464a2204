"""``trainperf report PATH [RUN_DIR ...] [--out FILE] [--json]``: a self-contained HTML report of one run
directory (its profile/ traces included) or of profiler traces (a trace file, or a directory of traces one
per rank), or the side-by-side comparison of `trainperf compare` as HTML (several run directories)."""

from __future__ import annotations

import os

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


def _looks_like_html(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            head = f.read(512)
    except OSError:
        return False
    head = head.lstrip(b"\xef\xbb\xbf \t\r\n").lower()
    return head.startswith((b"<!doctype html", b"<html", b"<!--")) or not head


def _written_by_trainperf(path: str) -> bool:
    """A page trainperf wrote (its generator tag, or the title of one written before the tag), or an empty file."""
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError:
        return False
    return (not head.strip() or b'<meta name="generator" content="trainperf">' in head
            or b"<title>trainperf" in head)


def check_out(path: str | None, flag: str = "--out", inputs: list[str] = ()) -> None:
    """An HTML file the user named: not a directory, in a directory that exists, not one of the inputs, and
    never a file that is not an HTML page already (a trace or a config is not replaced by a report)."""
    import os
    import stat

    from trainperf.errors import UserError

    if path is None:
        return
    if not path.strip():
        raise UserError(f"{flag} {path!r} is empty; give a file name, e.g. report.html")
    if os.path.isdir(path):
        raise UserError(f"{flag} {path!r} is a directory; give a file name, e.g. {os.path.join(path, 'report.html')}")
    if path.endswith(("/", os.sep)):
        raise UserError(f"{flag} {path!r} ends with '/', a directory (which does not exist); give a file name, e.g. "
                        f"{os.path.join(path, 'report.html')}")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise UserError(f"{flag} {path!r}: directory {parent} does not exist; create it or choose another path")
    if not os.path.exists(path):
        return
    for src in inputs:
        try:
            same = os.path.samefile(path, src)
        except OSError:
            same = False
        if same:
            raise UserError(f"{flag} {path!r} is the input being read ({src}); the report would replace it. "
                            "Choose another path, e.g. report.html")
    mode = os.stat(path).st_mode
    if not stat.S_ISREG(mode):
        raise UserError(f"{flag} {path!r} is not a regular file (a device, a pipe or a socket); give the path of "
                        "an .html file")
    if not _looks_like_html(path):
        raise UserError(f"{flag} {path!r} exists and is not an HTML page (a trace, a config, data?); the report "
                        "would replace it. Choose another path, or delete it first if it can go")
    if not _written_by_trainperf(path):
        raise UserError(f"{flag} {path!r} is an HTML page trainperf did not write; the report would replace it. "
                        "Choose another path, or delete it first if it can go")


def run(args) -> int:
    from trainperf.cli._common import no_blas_threads

    no_blas_threads()  # before numpy is imported
    from trainperf.runio import dumps_strict

    check_out(args.out, inputs=args.run_dirs)
    try:
        result = _build(args)
    except OSError as exc:  # the report's own file (the inputs' errors are UserErrors naming them)
        from trainperf.errors import UserError

        if args.out and exc.filename and os.path.dirname(os.path.abspath(str(exc.filename))) == \
                os.path.dirname(os.path.abspath(args.out)):
            raise UserError(f"--out {args.out!r} cannot be written ({exc.strerror or exc}); choose a writable "
                            "path") from None
        raise
    if args.json:
        print(dumps_strict(result))
    else:
        print(f"report: {result['html']} ({len(result['charts'])} charts"
              + (f"; no data for {', '.join(result['skipped'])}" if result["skipped"] else "") + ")")
        if result.get("known") is not None:  # a run killed before its first step record: what it left
            from trainperf.diagnosis.text import known_lines

            print("\n".join(known_lines(result)))
    return 0


def _build(args) -> dict:
    from trainperf.errors import UserError

    if len(args.run_dirs) == 1:
        from trainperf.trace.ranks import discover

        found = discover(args.run_dirs[0])  # looked at once, handed on
        if found["kind"] == "run":
            from trainperf.diagnosis.report import build_report

            result = build_report(args.run_dirs[0], args.out, found=found)
        else:
            from trainperf.diagnosis.trace_report import build_trace_report

            result = build_trace_report(args.run_dirs[0], args.out, found=found, top_n=args.top,
                                        patterns=args.comm_patterns or None, step=args.step)
    else:
        from trainperf.trace.ranks import discover

        kinds = [discover(p)["kind"] if os.path.exists(p) else None for p in args.run_dirs]
        if len(args.run_dirs) == 2 and None not in kinds and "run" not in kinds:  # two profiles: A against B
            from trainperf.diagnosis.trace_compare import build_profiles_report

            return build_profiles_report(*args.run_dirs, args.out, patterns=args.comm_patterns or None,
                                         step=args.step)
        for p in args.run_dirs:
            if os.path.exists(p) and discover(p)["kind"] != "run":
                raise UserError(f"{p} is a trace (or a directory of traces), not a run directory: with several paths "
                                "`trainperf report` puts runs side by side, or two profiles (A B) against each other; "
                                f"write one trace report per path (`trainperf report {p}`), give two profiles, or a "
                                "directory holding each rank's trace")
        from trainperf.diagnosis.compare import build_compare_report

        result = build_compare_report(args.run_dirs, args.out)
    return result
