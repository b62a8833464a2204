"""Build the trainer for this run, whatever its size: the one set-up path.

    resolve (validated layout: ParallelDims) -> [init process group, fail-fast heartbeat]
    -> backend (eager CPU/CUDA or XLA) -> seed -> data (this rank's data-parallel slice)
    -> model (reference GPT on meta, or a user's) -> parallelize (TP -> AC -> compile -> FSDP/DDP,
    or pipeline stages; one process: every degree 1) -> backend places it -> Trainer
    (checkpointer: one atomic file in one process, sharded DCP when distributed)

:func:`train` runs ``fit`` on it inside the fail-fast guard and tears the process group down.
"""

from __future__ import annotations

import contextlib

import torch

from trainperf.config.resolve import Resolved
from trainperf.hardware import hostmem
from trainperf.models.shape import seq_len_of
from trainperf.train.knobs import Knobs
from trainperf.train.loop import Trainer


def make_backend(cfg, local_rank: int = 0):
    if cfg.run.device == "xla":
        from trainperf.xla.backend import XlaBackend

        return XlaBackend()
    from trainperf.train.backend import EagerBackend

    device = torch.device("cuda", local_rank) if cfg.run.device == "cuda" else torch.device(cfg.run.device)
    return EagerBackend(device)


def build_trainer(resolved: Resolved, *, verbose: bool = True, knobs: Knobs | None = None,
                  heartbeat=None, rank: int = 0, local_rank: int = 0) -> Trainer:
    """Everything a run needs, on this rank. When distributed, the process group must exist
    (:func:`train` creates it); ``heartbeat`` is the rank's FailFast."""
    from trainperf.data.loader import build_data
    from trainperf.models.build import build_model
    from trainperf.train.state import seed_everything

    cfg, dims, knobs = resolved.cfg, resolved.dims, knobs or Knobs()
    backend = make_backend(cfg, local_rank)
    torch.set_num_threads(int(cfg.run.threads))
    host_note = hostmem.apply(cfg.run.host_memory)
    seed_everything(cfg.run.seed)
    backend.seed(cfg.run.seed, rank)
    dp_rank, dp_world = backend.data_parallel(dims, rank)
    seq_len = seq_len_of(cfg)
    is_main = rank == 0 and dp_rank == 0
    data = build_data(cfg, seq_len=seq_len, device=backend.data_device, dp_rank=dp_rank, dp_world=dp_world,
                      verbose=verbose and is_main)
    try:
        data.train = backend.wrap_loader(data.train)
        model = build_model(cfg, data_vocab=data.vocab_size, device=backend.build_device, materialize=False)
        return assemble(cfg, dims, model, data, backend=backend, rank=rank, knobs=knobs, heartbeat=heartbeat,
                        notes={**resolved.notes, **({"run.host_memory": host_note} if host_note else {})})
    except BaseException:  # a model that cannot be built: the loaders' workers and shared memory go now
        close_loaders(data)
        raise


def assemble(cfg, dims, model, data, *, backend=None, rank: int = 0, knobs: Knobs | None = None, heartbeat=None,
             notes: dict | None = None, checkpointer=None) -> Trainer:
    """parallelize ``model`` (built on meta, or a user's) and wrap it, with ``data``, in the Trainer:
    the part of :func:`build_trainer` that benchmarks and tests with their own data reuse."""
    from trainperf.distributed.parallelize import parallelize
    from trainperf.distributed.slow import SlowRank

    knobs = knobs or Knobs()
    backend = backend or make_backend(cfg)
    pm = parallelize(model, dims, cfg, rank=rank, device=backend.build_device, seq_len=data.seq_len,
                     bf16_gather=knobs.bf16_gather)
    if knobs.oom_above is not None and knobs.oom_above[0] in (-1, rank):
        pm.oom_above = knobs.oom_above[1]
    backend.place(pm)
    notes = {**(notes or {}), **getattr(model, "trainperf_notes", {}), **{k: str(v) for k, v in pm.notes.items()},
             **backend.notes}
    dp_world = backend.data_parallel(dims, rank)[1]
    slow = SlowRank.build(knobs.slow_rank, rank, cfg, data_vocab=data.vocab_size, device=pm.device,
                          chunk=min(cfg.train.micro_batch, cfg.train.global_batch // dp_world))
    return Trainer(cfg, pm, data, backend, checkpointer or make_checkpointer(cfg, dims, knobs), notes=notes,
                   heartbeat=heartbeat, slow=slow)


def make_checkpointer(cfg, dims, knobs: Knobs):
    from pathlib import Path

    directory = cfg.checkpoint.dir or Path(cfg.run_dir()) / "checkpoints"
    if dims.distributed:
        from trainperf.distributed.checkpoint import DcpCheckpointer

        return DcpCheckpointer(directory, keep=cfg.checkpoint.keep, kill_step=knobs.checkpoint_kill_step,
                               kill_rank=knobs.checkpoint_kill_rank)
    from trainperf.distributed import checkpoint as sharded
    from trainperf.train.checkpoint import FileCheckpointer

    return FileCheckpointer(directory, keep=cfg.checkpoint.keep, kill_step=knobs.checkpoint_kill_step,
                            sharded=sharded)


def close_data(trainer) -> None:
    """Stop the trainer's loaders (threads, worker processes, shared memory); a second signal meanwhile
    waits (trainperf/interrupt.py)."""
    close_loaders(trainer.data)


def close_loaders(data) -> None:
    """Stop the loaders of a :class:`~trainperf.data.loader.Data` (also before a trainer holds them)."""
    from trainperf import interrupt

    with interrupt.deferred():
        for loader in (getattr(data, "train", None), getattr(data, "val", None)):
            close = getattr(loader, "close", None)
            if close is not None:
                with contextlib.suppress(Exception):
                    close()


def train(resolved: Resolved, *, resume: str = "auto", verbose: bool = True, knobs: Knobs | None = None) -> dict | None:
    """``trainperf train``: one process, or this rank of a torchrun job. Returns the summary on the
    main rank (None elsewhere)."""
    from trainperf.distributed.failure import FailFast
    from trainperf.distributed.init import destroy_distributed, env_world, init_distributed
    from trainperf.train.run import fit

    cfg, knobs = resolved.cfg, knobs or Knobs()
    env = env_world()
    distributed = resolved.dims.distributed
    ff = None
    if distributed:
        device_type = "cuda" if cfg.run.device == "cuda" else cfg.run.device
        env = init_distributed(backend=cfg.distributed.backend, device_type=device_type,
                               timeout_s=cfg.distributed.timeout_s, flight_recorder=cfg.distributed.flight_recorder)
        from pathlib import Path

        ff = FailFast(env.rank, env.world_size, cfg.distributed.timeout_s, fault=knobs.fault,
                      record_to=Path(cfg.run_dir()) / "failures.jsonl")
    trainer = None
    try:
        with ff.guard() if ff else contextlib.nullcontext():
            trainer = build_trainer(resolved, verbose=verbose, knobs=knobs, heartbeat=ff, rank=env.rank,
                                    local_rank=env.local_rank)
            summary = fit(trainer, resume=resume, verbose=verbose)
    finally:
        if ff:
            ff.close()
        if trainer is not None:  # loader workers and shared memory released now, also after Ctrl-C / SIGTERM
            close_data(trainer)
    is_main = trainer.is_main
    if distributed:
        trainer = None  # the model's DDP/FSDP state goes before the group it holds
        destroy_distributed(barrier=True)
    return summary if is_main else None
