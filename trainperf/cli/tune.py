"""``trainperf tune CONFIG [--set k=v ...] [--budget-min N] [--json] [--out DIR]``: argument parsing
and printing (the search: :mod:`trainperf.tune.search`)."""

from __future__ import annotations

from trainperf.cli._common import add_config_args, add_json_flag, print_json, whole


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "tune", help="find the fastest settings that fit, by short measured trials",
        description="Try micro-batch, activation checkpointing, precision, compile and loader settings "
                    "(fastest-first, one dimension at a time, pruned by the memory estimate), each for a few "
                    "measured steps through the trainer; confirm the best against the default side by side; "
                    "write the tuned config next to CONFIG and the trial log under --out.")
    add_config_args(p)
    p.add_argument("--budget-min", type=float, default=10.0, metavar="N",
                   help="time budget in minutes, the final side-by-side included (default 10)")
    p.add_argument("--out", default=None, metavar="DIR", help="tune directory (default runs/tune-<config name>)")
    p.add_argument("--steps", type=whole(1, 10**5), default=5, help="timed steps per trial (default 5)")
    p.add_argument("--warmup", type=whole(0, 10**5), default=2, help="untimed steps per trial after the first (default 2)")
    p.add_argument("--nproc-per-node", type=whole(1, 1024), default=1, metavar="N", dest="nproc",
                   help="ranks per trial on this machine, launched as torchrun would (gloo on a CPU, NCCL on CUDA); "
                        "adds the planner's best layouts for N ranks to the search (default 1)")
    add_json_flag(p)
    p.set_defaults(func=run)


def _doctor() -> dict:
    from trainperf.cli.doctor import to_json
    from trainperf.hardware.advice import advise
    from trainperf.hardware.probe import probe

    facts = probe()
    return to_json(facts, [r.to_dict() for r in advise(facts)])


def run(args) -> int:
    import sys

    from trainperf.config import load_config
    from trainperf.tune.result import render
    from trainperf.tune.search import Options, tune

    cfg = load_config(args.config, args.overrides)
    opts = Options(budget_s=args.budget_min * 60, steps=args.steps, warmup=args.warmup, nproc=args.nproc,
                   progress=not args.json and sys.stderr.isatty())
    from trainperf.runio import ensure_dir

    ensure_dir(args.out, "--out")
    res = tune(cfg, config_path=args.config, out_dir=args.out, options=opts, doctor=_doctor)
    if args.json:
        print_json(res.to_json())
        if res.kept_previous:  # stdout is the JSON document: the notice goes to stderr
            print(f"note: replaced the existing {res.config_path}; its previous content is kept in "
                  f"{res.kept_previous}", file=sys.stderr)
    else:
        print(render(res))
    from trainperf import interrupt

    return interrupt.exit_code() if res.interrupted else 0  # 130 after Ctrl-C, 143 after SIGTERM
