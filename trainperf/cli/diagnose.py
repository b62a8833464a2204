"""``trainperf diagnose PATH [--json] [--top N] [--comm-pattern REGEX ...]``: where did the time go, and what
to change. PATH: a run directory, a torch.profiler trace (.json, .json.gz), or a directory of traces (one
per rank). Reading traces never imports torch."""

from __future__ import annotations

import sys

from trainperf.cli._common import add_json_flag, whole


def add_trace_args(p) -> None:
    p.add_argument("--top", type=whole(1, 10**6), default=10, metavar="N", help="kernels to list per rank (default 10)")
    p.add_argument("--comm-pattern", dest="comm_patterns", action="append", default=[], metavar="REGEX",
                   help="a kernel-name regex that is communication too (repeatable; added to the built-in "
                        "NCCL / all-to-all / NVSHMEM patterns)")


def register(subparsers) -> None:
    p = subparsers.add_parser("diagnose", help="diagnose a run directory or profiler traces: bottlenecks, "
                                               "evidence, fixes and the gain to expect")
    p.add_argument("path", metavar="PATH", help="run directory written by `trainperf train` (run.dir), a trace file "
                                                "(.json, .json.gz, *.pt.trace.json[.gz]) or a directory of traces, "
                                                "one per rank")
    add_json_flag(p)
    add_trace_args(p)
    p.set_defaults(func=run)


def progress_bar(path, quiet: bool):
    """A tqdm bar over the bytes of the traces (stderr), or None: off with --json or when stderr is not a
    terminal."""
    if quiet or not sys.stderr.isatty():
        return None, None
    from tqdm import tqdm

    from trainperf.trace.ranks import discover

    try:
        files = discover(path)["files"]
    except Exception:  # noqa: BLE001 - the diagnosis itself reports a bad PATH
        return None, None
    total = sum(f.stat().st_size for f in files)
    if not total:
        return None, None
    bar = tqdm(total=total, unit="B", unit_scale=True, desc="reading traces", file=sys.stderr, leave=False)

    def update(nbytes: int) -> None:  # bytes of the trace files consumed so far, all files together
        if nbytes > bar.n:
            bar.update(min(nbytes, total) - bar.n)

    return bar, update


def run(args) -> int:
    from trainperf.cli._common import print_json
    from trainperf.errors import UserError
    from trainperf.monitor.engine import contract, diagnose_path

    if args.top < 0:
        raise UserError(f"--top {args.top}: give 0 or more kernels to list")
    bar, update = progress_bar(args.path, args.json)
    try:
        result = diagnose_path(args.path, top_n=args.top, patterns=args.comm_patterns or None, progress=update)
    finally:
        if bar is not None:
            bar.close()
    if args.json:
        print_json(contract(result))  # strict JSON: null, never NaN
        return 0
    if result["source"] == "trace":
        from trainperf.monitor.trace_text import format_traces

        print(format_traces(result))
    else:
        from trainperf.monitor.diagnose import format_findings
        from trainperf.monitor.trace_text import format_run_traces

        print(format_findings(result).lstrip("\n"))
        extra = format_run_traces(result)
        if extra:
            print(extra)
    return 0
