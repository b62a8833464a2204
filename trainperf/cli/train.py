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
    from trainperf.config import load_config
    from trainperf.config.resolve import resolve
    from trainperf.train.loop import build_trainer
    from trainperf.train.run import fit

    cfg = load_config(args.config, args.overrides)
    resolved = resolve(cfg)
    if resolved.world_size > 1:
        from trainperf.distributed.entry import train_distributed  # torchrun: WORLD_SIZE > 1

        summary = train_distributed(resolved, resume=args.resume, verbose=not args.json)
    else:
        trainer = build_trainer(resolved, verbose=not args.json)
        summary = fit(trainer, resume=args.resume, verbose=not args.json)
    if args.json and summary is not None:
        print_json(summary)
    return 0
