"""``trainperf train CONFIG [--set k=v ...] [--resume auto|never|PATH] [--json]``."""

from __future__ import annotations

import os
from pathlib import Path

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
    """Under torchrun a refusal (UserError) is printed by rank 0 only; the other ranks exit 2 silently, so
    one message reaches the user, not one per rank."""
    from trainperf.errors import UserError

    try:
        return _train(args)
    except UserError as exc:
        if _launched_rank() > 0:
            raise SystemExit(exc.exit_code) from None
        raise


def _resume_after_restart(resume: str, cfg) -> str:
    """Under torchrun's elastic restarts (``--max-restarts``; TORCHELASTIC_RESTART_COUNT > 0) every restart
    continues from the newest complete checkpoint: ``--resume never`` meant the first attempt, and a
    ``--resume PATH`` yields to the run's own newer checkpoints once there are some."""

    try:
        attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    except ValueError:
        attempt = 0
    if attempt < 1 or resume == "auto":
        return resume
    from trainperf.distributed.checkpoint import latest

    ckpt_dir = cfg.checkpoint.dir or Path(cfg.run_dir()) / "checkpoints"
    if resume != "never" and latest(ckpt_dir) is None:
        return resume  # nothing saved by this run yet: start again from PATH
    if _launched_rank() == 0:
        print(f"train: restart {attempt} (torchrun --max-restarts): resuming from the newest complete checkpoint "
              f"in {ckpt_dir} instead of --resume {resume}", flush=True)
    return "auto"


def _launched_rank() -> int:

    try:
        return int(os.environ.get("RANK", "0")) if int(os.environ.get("WORLD_SIZE", "1")) > 1 else 0
    except ValueError:
        return 0


def _check_writable_dirs(cfg) -> list[Path]:
    """The run directory (and a checkpoint directory set apart) can be created and written, checked before the
    model is built: a path that is a file, or under one, or read-only, once ended the run with a traceback.
    Returns the directories made here (deepest first), for :func:`_remove_if_empty`."""
    from trainperf.errors import ConfigError, UserError
    from trainperf.runio import ensure_dir

    created: list[Path] = []
    for field, path in (("run.dir", cfg.run_dir()), ("checkpoint.dir", cfg.checkpoint.dir)):
        try:
            ensure_dir(path, field)
        except UserError as exc:
            raise ConfigError(str(exc).replace(f"{field} '", f"{field}='", 1)) from None
        if path:
            new = [d for d in (Path(path), *Path(path).parents) if not d.exists()]
            try:  # the run writes there anyway: made now, before the model is built
                Path(path).mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise ConfigError(f"{field}={path!r} cannot be created ({exc.strerror or exc}); choose a writable "
                                  "directory") from None
            created.extend(new)
    return created


def _remove_if_empty(dirs: list[Path]) -> None:
    """Remove the directories this command made that are still empty (deepest first); a directory the run
    wrote into stays."""
    import contextlib

    for d in sorted(dirs, key=lambda p: len(p.parts), reverse=True):
        with contextlib.suppress(OSError):
            d.rmdir()


def _train(args) -> int:

    from trainperf.config import load_config
    from trainperf.train.resolve import resolve
    from trainperf.memory import preflight
    from trainperf.train.build import train
    from trainperf.train.knobs import from_environ

    cfg = load_config(args.config, args.overrides)
    resolved = resolve(cfg)
    preflight.check(resolved.cfg)  # before anything is built or written: a run that cannot fit is refused
    created = _check_writable_dirs(resolved.cfg)
    try:
        args.resume = _resume_after_restart(args.resume, resolved.cfg)
        # test and benchmark knobs (a slowed rank, injected faults) come from the environment here, at the
        # edge, and are handed to the trainer as an object
        summary = train(resolved, resume=args.resume, verbose=not args.json, knobs=from_environ(os.environ))
    except BaseException:
        _remove_if_empty(created)  # a run refused before it wrote anything leaves no empty run directory
        raise
    if args.json and summary is not None:
        print_json(summary)
    return 0
