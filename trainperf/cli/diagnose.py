"""``trainperf diagnose PATH [--json] [--top N] [--comm-pattern REGEX ...]``: where did the time go, and what
to change. PATH: a run directory, a torch.profiler trace (.json, .json.gz), a directory of traces (one
per rank), or an Nsight Systems capture (.sqlite export, .nsys-rep report; a rank per GPU and process). Reading traces never imports torch."""

from __future__ import annotations

import sys

from trainperf.cli._common import add_json_flag, whole


def add_trace_args(p) -> None:
    p.add_argument("--top", type=whole(1, 10**6), default=10, metavar="N", help="kernels to list per rank (default 10)")
    p.add_argument("--comm-pattern", dest="comm_patterns", action="append", default=[], metavar="REGEX",
                   help="a kernel-name regex that is communication too (repeatable; added to the built-in "
                        "NCCL / all-to-all / NVSHMEM patterns)")
    p.add_argument("--step", default=None, metavar="NAME",
                   help="Nsight Systems captures: the NVTX range that marks one training step (default: a "
                        "repeated top-level range named like a step, else the whole capture); torch.profiler "
                        "traces mark their steps themselves (ProfilerStep#N)")


def register(subparsers) -> None:
    p = subparsers.add_parser("diagnose", help="diagnose a run directory or profiler traces: bottlenecks, "
                                               "evidence, fixes and the gain to expect")
    p.add_argument("path", metavar="PATH", help="run directory written by `trainperf train` (run.dir), a trace file "
                                                "(.json, .json.gz, *.pt.trace.json[.gz]) or a directory of traces, "
                                                "one per rank")
    add_json_flag(p)
    add_trace_args(p)
    p.set_defaults(func=run)


def progress_bar(files, quiet: bool):
    """A tqdm bar over the bytes of the trace ``files`` (stderr), or None: off with --json or when stderr is not
    a terminal."""
    if quiet or not sys.stderr.isatty():
        return None, None
    from tqdm import tqdm

    total = sum(f.stat().st_size for f in files)
    if not total:
        return None, None
    bar = tqdm(total=total, unit="B", unit_scale=True, desc="reading traces", file=sys.stderr, leave=False)

    def update(nbytes: int) -> None:  # bytes of the trace files consumed so far, all files together
        if nbytes > bar.n:
            bar.update(min(nbytes, total) - bar.n)

    return bar, update


def run(args) -> int:
    from trainperf.cli._common import no_blas_threads

    no_blas_threads()  # before numpy is imported
    from trainperf.trace import inflate

    # a gzipped trace is read and inflated on another core while the analysis is imported
    inflate.start(args.path)
    try:
        return _run(args)
    finally:
        inflate.cancel_all()


def _run(args) -> int:
    from trainperf.cli._common import print_json
    from trainperf.errors import UserError
    from trainperf.diagnosis.engine import contract, diagnose_found
    from trainperf.trace.ranks import discover

    if args.top < 0:
        raise UserError(f"--top {args.top}: give 0 or more kernels to list")
    found = discover(args.path)  # PATH is looked at once: the bar and the diagnosis read the same files
    bar, update = progress_bar(found["files"], args.json)
    try:
        result = diagnose_found(found, top_n=args.top, patterns=args.comm_patterns or None, progress=update,
                                step=args.step)
    finally:
        if bar is not None:
            bar.close()
    if args.json:
        print_json(contract(result))  # strict JSON: null, never NaN
        return 0
    if result["source"] == "trace":
        from trainperf.diagnosis.text import format_traces

        print(format_traces(result))
    else:
        from trainperf.diagnosis.text import format_findings, format_run_traces

        print(format_findings(result).lstrip("\n"))
        extra = format_run_traces(result)
        if extra:
            print(extra)
    return 0
