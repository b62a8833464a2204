"""``trainperf compare RUN_A RUN_B [...] [--json]``: runs side by side, the speed-up and what changed.
``trainperf compare A B``: two profiles (torch.profiler traces, a directory of ranks, or Nsight captures,
either side), aligned on the step: the speed-up with its confidence, where it came from, the findings that
went away or appeared."""

from __future__ import annotations

from trainperf.cli._common import add_json_flag


def register(subparsers) -> None:
    p = subparsers.add_parser("compare", help="compare runs (tokens/s, MFU/HFU, phases, memory, loss, config diff) or "
                                              "two profiles (speed-up per step, where it came from, findings)")
    p.add_argument("run_dirs", nargs="+", metavar="PATH",
                   help="two or more run directories written by `trainperf train` (the first is the baseline); or "
                        "two profiles A B: a trace, a directory of traces (one per rank) or an Nsight export")
    add_json_flag(p)
    p.add_argument("--comm-pattern", dest="comm_patterns", action="append", default=[], metavar="REGEX",
                   help="profiles: a kernel-name regex that is communication too (repeatable)")
    p.add_argument("--step", default=None, metavar="NAME",
                   help="Nsight Systems captures: the NVTX range that marks one training step")
    p.set_defaults(func=run)


def _profiles(paths: list[str]) -> bool:
    """True when the paths are profiles (not run directories); a mix is an error that says what to do."""
    from trainperf.errors import UserError
    from trainperf.trace.ranks import discover

    def is_run(p: str) -> bool:  # a path that is no profile is read as a run directory (its errors say why)
        try:
            return discover(p)["kind"] == "run"
        except UserError:
            return True

    kinds = [is_run(p) for p in paths]
    if all(kinds):
        return False
    if any(kinds):
        runs = [p for p, k in zip(paths, kinds) if k]
        raise UserError(f"{', '.join(runs)}: run director{'ies' if len(runs) > 1 else 'y'} beside profiles; compare "
                        "run directories with each other (`trainperf compare RUN_A RUN_B`) or two profiles (traces, "
                        "directories of traces, Nsight exports: `trainperf compare A B`)")
    if len(paths) != 2:
        raise UserError(f"compare takes two profiles (A, the baseline, and B), got {len(paths)}; compare them two at a "
                        "time")
    return True


def run(args) -> int:
    import sys

    from trainperf.cli._common import no_blas_threads

    no_blas_threads()  # before numpy is imported
    from trainperf.diagnosis.compare import compare_json, compare_text
    from trainperf.runio import dumps_strict

    if len(args.run_dirs) >= 2 and _profiles(args.run_dirs):
        from trainperf.cli._common import print_json
        from trainperf.diagnosis.trace_compare import compare_profiles, format_profiles

        result = compare_profiles(*args.run_dirs, patterns=args.comm_patterns or None, step=args.step)
        if args.json:
            print_json(result)
        else:
            print(format_profiles(result))
        return 0

    if not args.json:
        print(compare_text(args.run_dirs)[1])
        return 0
    result, notes = compare_json(args.run_dirs)
    print(dumps_strict(result))  # strict JSON: null, never NaN
    for n in notes:  # what the text prints as notes (left-out records, ignored figures), kept off stdout
        print(f"trainperf compare: note: {n}", file=sys.stderr)
    return 0
