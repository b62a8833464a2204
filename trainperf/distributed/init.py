"""Process-group set-up from the torchrun environment, with fail-fast defaults.

``torchrun`` sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT. Backend
``auto`` is nccl on CUDA and gloo on CPU. The collective timeout comes from
``distributed.timeout_s``. On CUDA, before the process group exists, NCCL's
asynchronous error handling is set to tear the process down on a failed or
timed-out collective (``TORCH_NCCL_ASYNC_ERROR_HANDLING=3``) and the flight
recorder keeps the last collectives for a post-mortem — never the founding
document's ``NCCL_ASYNC_ERROR_HANDLING=0``, which hides failures and hangs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

from trainperf.errors import ConfigError


@dataclass
class DistEnv:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    backend: str = "gloo"

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def env_world() -> DistEnv:
    """Rank facts from the launcher's environment (defaults: one process)."""
    def _int(name: str, default: int) -> int:
        try:
            return int(os.environ.get(name, default))
        except ValueError:
            return default

    return DistEnv(rank=_int("RANK", 0), world_size=_int("WORLD_SIZE", 1), local_rank=_int("LOCAL_RANK", 0),
                   local_world_size=_int("LOCAL_WORLD_SIZE", 1))


def pick_backend(backend: str, device_type: str) -> str:
    if backend == "auto":
        return "nccl" if device_type == "cuda" else "gloo"
    if backend == "nccl" and device_type != "cuda":
        raise ConfigError("distributed.backend='nccl' needs CUDA devices; use gloo or auto on CPU")
    return backend


def nccl_env_defaults(flight_recorder: bool, environ=None) -> dict[str, str]:
    """The NCCL/c10d variables set before init on CUDA (only where the user has not set them).

    TORCH_NCCL_ASYNC_ERROR_HANDLING=3: on a failed or timed-out collective, the watchdog tears
    the process down (skipping the cleanup that could hang), so torchrun ends the job.
    TORCH_NCCL_TRACE_BUFFER_SIZE: the flight recorder's ring of recent collectives;
    TORCH_NCCL_DUMP_ON_TIMEOUT=1 writes it out when a timeout fires.
    """
    environ = os.environ if environ is None else environ
    want = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "3"}
    if flight_recorder:
        want.update({"TORCH_NCCL_TRACE_BUFFER_SIZE": "2000", "TORCH_NCCL_DUMP_ON_TIMEOUT": "1"})
    legacy = environ.get("NCCL_ASYNC_ERROR_HANDLING")
    if legacy == "0" or environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING") == "0":
        raise ConfigError(
            "NCCL_ASYNC_ERROR_HANDLING=0 / TORCH_NCCL_ASYNC_ERROR_HANDLING=0 disables error handling: a failed rank "
            "would leave the job hanging. Unset it; trainperf sets TORCH_NCCL_ASYNC_ERROR_HANDLING=3 and fails fast "
            "after distributed.timeout_s"
        )
    return {k: v for k, v in want.items() if k not in environ}


def init_distributed(*, backend: str = "auto", device_type: str = "cpu", timeout_s: float = 300.0,
                     flight_recorder: bool = True) -> DistEnv:
    """Initialize the default process group when WORLD_SIZE > 1 (idempotent). Returns the rank facts."""
    import torch
    import torch.distributed as dist

    env = env_world()
    env.backend = pick_backend(backend, device_type)
    if env.world_size <= 1:
        return env
    if dist.is_initialized():
        return env
    if device_type == "cuda":
        os.environ.update(nccl_env_defaults(flight_recorder))
        torch.cuda.set_device(env.local_rank)
    kwargs = {}
    if device_type == "cuda":
        kwargs["device_id"] = torch.device("cuda", env.local_rank)
    store = attempt_store(env.world_size, timeout_s)
    if store is not None:
        kwargs.update(store=store, rank=env.rank, world_size=env.world_size)
    dist.init_process_group(backend=env.backend, timeout=timedelta(seconds=timeout_s), **kwargs)
    import atexit

    atexit.register(_destroy_at_exit)
    return env


def attempt_store(world_size: int, timeout_s: float, environ=None):
    """The launcher's store, seen through a prefix unique to this attempt, under torchrun (None otherwise).

    torchrun's workers all connect to the agent's shared TCPStore, and torch (2.13) keeps that store across
    the restarts of ``--max-restarts`` without separating the attempts: the workers of a restart would read
    the keys of the dead attempt (gloo's peer addresses: "Connection refused" to the dead rank's port). The
    prefix ``trainperf/attempt_<TORCHELASTIC_RESTART_COUNT>/`` gives every attempt its own keys."""
    environ = os.environ if environ is None else environ
    attempt = environ.get("TORCHELASTIC_RESTART_COUNT")
    if environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or attempt is None:
        return None
    from torch.distributed import PrefixStore, TCPStore

    tcp = TCPStore(environ["MASTER_ADDR"], int(environ["MASTER_PORT"]), world_size=world_size, is_master=False,
                   timeout=timedelta(seconds=timeout_s))
    return PrefixStore(f"trainperf/attempt_{attempt}/", tcp)


def destroy_distributed(*, barrier: bool = False) -> None:
    """Leave the process group cleanly (idempotent). What still holds it (DDP reducers, FSDP and DTensor state,
    their last gloo/NCCL works) is collected while the group and the interpreter are alive; ``barrier``: the
    ranks then meet, so that none tears down a connection its peer still reads (only on a path every rank
    takes: never after an error). Left to the interpreter's shutdown, a work's tensors are released without
    the interpreter and the rank aborts ("terminate called without an active exception", SIGABRT): a run
    that succeeded would end with a failed exit code. Callers drop their own references first."""
    import gc

    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    gc.collect()
    if barrier:
        dist.barrier()
    dist.destroy_process_group()


def _destroy_at_exit() -> None:
    """atexit: a process that did not leave its group leaves it before the interpreter shuts down."""
    import contextlib

    with contextlib.suppress(Exception):
        destroy_distributed()
