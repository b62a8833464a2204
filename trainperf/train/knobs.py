"""Test and benchmark instruments, passed in explicitly (never read from the environment inside
the library): the CLI builds one from its flags and environment (:func:`from_environ`), tests
construct one directly.

    slow_rank            (rank, factor): that global rank does ``factor`` x the model compute per
                         sample (:mod:`trainperf.distributed.slow`), a straggler for the balancer
                         and the diagnosis
    fault                (kind, rank, step): that rank exits (code 17), hangs, stops (SIGSTOP), waits in a
                         receive no rank sends (stuck in a collective) or gets a busy process on its CPUs
                         ("busy": a straggler from that step on) at that step
                         (:mod:`trainperf.distributed.failure`)
    checkpoint_kill_step the process SIGKILLs itself midway through writing that step's checkpoint
                         (exact-resume tests); in a distributed run (sharded DCP checkpoints) the rank
                         ``checkpoint_kill_rank`` does, once its shards are written (the others then
                         end with the fail-fast report)
    bf16_gather          DDP bf16 compression through the all-gather fallback even where the
                         backend can all-reduce bf16
    oom_above            (rank, n): on that rank (-1: every rank) a micro-batch of more than n samples
                         raises torch.OutOfMemoryError before its forward (OOM recovery tests on CPU)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from trainperf.errors import ConfigError

SLOW_ENV = "TRAINPERF_SLOW_RANK"  # R:F
FAULT_ENV = ("TRAINPERF_FAULT", "TRAINPERF_FAULT_RANK", "TRAINPERF_FAULT_STEP")  # kind, rank, step
FAULT_KINDS = ("exit", "hang", "stop", "collective", "busy")
CKPT_KILL_ENV = "TRAINPERF_FAULT_KILL_IN_CHECKPOINT"  # step; distributed: on rank TRAINPERF_FAULT_RANK (0)
OOM_ENV = "TRAINPERF_OOM_ABOVE"  # RANK:N (RANK -1: every rank)


@dataclass(frozen=True)
class Knobs:
    slow_rank: tuple[int, float] | None = None
    fault: tuple[str, int, int] | None = None
    checkpoint_kill_step: int | None = None
    checkpoint_kill_rank: int = 0
    bf16_gather: bool = False
    oom_above: tuple[int, int] | None = None


def parse_slow_rank(value: str | None) -> tuple[int, float] | None:
    """``"R:F"`` -> ``(R, F)``; None or "" -> None; ConfigError on anything else."""
    if not value:
        return None
    try:
        r, f = value.split(":")
        rank, factor = int(r), float(f)
    except ValueError:
        raise ConfigError(f"{SLOW_ENV}={value!r} must be RANK:FACTOR, e.g. 1:2 (rank 1 does 2x the compute per "
                          "sample)") from None
    if rank < 0 or not factor >= 1:
        raise ConfigError(f"{SLOW_ENV}={value!r}: the rank must be >= 0 and the factor >= 1 (work per sample, "
                          "x the others')")
    return rank, factor


def _int(environ: Mapping[str, str], name: str) -> int | None:
    val = environ.get(name)
    if val in (None, ""):
        return None
    try:
        return int(val)
    except ValueError:
        raise ConfigError(f"{name}={val!r} must be an integer") from None


def from_environ(environ: Mapping[str, str]) -> Knobs:
    """The knobs the CLI takes from its environment (documented in the README's distributed and
    balance sections; unset: none)."""
    fault = None
    kind = environ.get(FAULT_ENV[0])
    if kind:
        if kind not in FAULT_KINDS:
            raise ConfigError(f"{FAULT_ENV[0]}={kind!r} must be one of {', '.join(FAULT_KINDS)} (exit with code 17, "
                              "sleep forever, SIGSTOP itself: a frozen rank, wait in a receive no rank sends, or "
                              "go on beside a busy process on its CPUs)")
        fault = (kind, _int(environ, FAULT_ENV[1]) or 0, _int(environ, FAULT_ENV[2]) or 0)
    oom = None
    if environ.get(OOM_ENV):
        try:
            r, n = environ[OOM_ENV].split(":")
            oom = (int(r), int(n))
        except ValueError:
            raise ConfigError(f"{OOM_ENV}={environ[OOM_ENV]!r} must be RANK:N, e.g. 1:4 (rank 1 fails micro-batches "
                              "above 4 samples; rank -1: every rank)") from None
    return Knobs(slow_rank=parse_slow_rank(environ.get(SLOW_ENV)), fault=fault,
                 checkpoint_kill_step=_int(environ, CKPT_KILL_ENV),
                 checkpoint_kill_rank=_int(environ, FAULT_ENV[1]) or 0, oom_above=oom)
