"""``trainperf train CONFIG [--set k=v ...] [--resume auto|never|PATH] [--json]``."""

from __future__ import annotations

from trainperf.cli._common import add_config_args, add_json_flag, print_json


def register(subparsers) -> None:
    p = subparsers.add_parser("train", help="train a model from a config (one process, or under torchrun)")
    add_config_args(p)
    p.add_argument("--resume", default="auto", metavar="auto|never|PATH",
                   help="auto: continue from the newest good checkpoint in the run directory (default); "
                        "never: start over; PATH: a checkpoint file")
    add_json_flag(p)
    p.set_defaults(func=run)


def run(args) -> int:
    import os

    from trainperf.config import load_config
    from trainperf.config.resolve import resolve
    from trainperf.train.build import train
    from trainperf.train.knobs import from_environ

    cfg = load_config(args.config, args.overrides)
    resolved = resolve(cfg)
    # test and benchmark knobs (a slowed rank, injected faults) come from the environment here, at the
    # edge, and are handed to the trainer as an object
    summary = train(resolved, resume=args.resume, verbose=not args.json, knobs=from_environ(os.environ))
    if args.json and summary is not None:
        print_json(summary)
    return 0
