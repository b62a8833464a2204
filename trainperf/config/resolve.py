"""The autos of the config that the machine decides, and the config's own cross-field rules.

:func:`resolve_device` and :func:`resolve_settings` replace each ``auto`` that follows from the device and the
machine (:class:`DeviceFacts`) with its value and its reason; :func:`check_batch`,
:func:`check_pipeline_schedule` and :func:`resolve_global_batch` are the batch and pipeline arithmetic. None of
them needs more than the config and the facts. Joining them with the model, the parallel layout and an XLA
device is the assembly's: :func:`trainperf.train.resolve.resolve` returns the :class:`Resolved` config that
``trainperf config show`` prints and ``train`` builds from.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any

from trainperf.config.schema import Config
from trainperf.errors import ConfigError
from trainperf.hardware.cpu import loader_workers, local_world_size, usable_cpus
from trainperf.lazy import moved_names

# kept here for one release: the assembly (XLA, the layout, the degrees against the model) moved to
# trainperf.train.resolve, the model's shape to trainperf.models.shape
__getattr__ = moved_names(__name__, {
    "resolve": "trainperf.train.resolve", "derive_data_degree": "trainperf.train.resolve",
    "check_model_shape": "trainperf.train.resolve", "check_layout": "trainperf.train.resolve",
    "model_shape": "trainperf.models.shape", "seq_len_of": "trainperf.models.shape",
})


def _native_bf16(torch) -> bool:
    """BF16 on tensor cores (Ampere and later, ROCm). ``torch.cuda.is_bf16_supported()`` alone also
    says yes on a V100 since torch 2.3 (emulated: CUDA-core math, several times slower than fp16)."""
    try:
        return bool(torch.cuda.is_bf16_supported(including_emulation=False))
    except TypeError:  # torch < 2.3: no emulation counted
        return bool(torch.cuda.is_bf16_supported())


@dataclass
class DeviceFacts:
    """What resolution needs to know about the machine (injectable for tests)."""

    cuda: bool = False
    cuda_name: str = ""
    bf16: bool = False
    tf32: bool = False  # Ampere (sm80) or newer
    fused_adam_devices: tuple = ("cuda",)
    xla: bool = False
    cpus: int = 1
    local_ranks: int = 1

    @classmethod
    def probe(cls) -> "DeviceFacts":
        """The facts of this process's device 0 (CUDA), its CPUs and its local ranks."""
        import torch

        facts = cls(cpus=usable_cpus(), local_ranks=local_world_size())
        if torch.cuda.is_available():
            facts.cuda = True
            facts.cuda_name = torch.cuda.get_device_name(0)
            major, _ = torch.cuda.get_device_capability(0)
            facts.tf32 = major >= 8
            facts.bf16 = _native_bf16(torch)
        try:
            from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

            fused_devices = set(_get_fused_kernels_supported_devices())
        except ImportError:  # older torch: fused AdamW on CUDA only
            fused_devices = {"cuda"}
        facts.fused_adam_devices = tuple(sorted(fused_devices))
        return facts


@dataclass
class Resolved:
    """A config with every ``auto`` resolved, the reasons, and the validated layout (``dims``:
    ParallelDims for this world size, checked against the model, compression and balancing once,
    here, before any process group or work)."""

    cfg: Config
    notes: dict[str, str] = field(default_factory=dict)
    world_size: int = 1
    dims: Any = None


def world_size_from_env() -> int:
    try:
        return max(1, int(os.environ.get("WORLD_SIZE", "1")))
    except ValueError:
        return 1


def divisor_list(n: int, limit: int = 10**6) -> tuple[list[int], bool]:
    """The divisors of ``n`` in order, by trial division up to min(sqrt(n), limit): O(sqrt n), never O(n).
    Returns (divisors, complete); complete is False when n was too large to search fully (the list then
    holds every divisor <= limit and their cofactors)."""
    small, large = [], []
    root = math.isqrt(max(n, 1))
    for d in range(1, min(root, limit) + 1):
        if n % d == 0:
            small.append(d)
            if d != n // d:
                large.append(n // d)
    return small + large[::-1], root <= limit


def _divisors(n: int, show: int = 24) -> str:
    """The divisors of ``n`` for an error message: all of them, or the first and last few when there are many."""
    divs, complete = divisor_list(n)
    if len(divs) > show:
        text = ", ".join(map(str, divs[: show // 2])) + ", ..., " + ", ".join(map(str, divs[-(show // 2):]))
    else:
        text = ", ".join(map(str, divs))
    return text if complete else text + " (among others)"


def resolve_device(cfg: Config, facts: DeviceFacts, notes: dict) -> None:
    """``run.device: auto`` -> cuda when this machine has a CUDA device, else cpu; cuda without one is refused.
    In place, with the reason in ``notes`` (an XLA device is resolved after this, by the assembly)."""
    if cfg.run.device == "auto":
        cfg.run.device = "cuda" if facts.cuda else "cpu"
        notes["run.device"] = f"CUDA available ({facts.cuda_name})" if facts.cuda else "no CUDA device found"
    if cfg.run.device == "cuda" and not facts.cuda:
        raise ConfigError("run.device='cuda' but no CUDA device is visible; use run.device=cpu or auto")


def resolve_settings(cfg: Config, facts: DeviceFacts, notes: dict) -> None:
    """The autos that follow from the device and the machine alone: threads, host memory, precision, the
    optimizer's kernel, the loader's workers and pinned memory, the process group's backend. In place, each
    with its reason in ``notes``; a setting this device cannot run is refused with the fix."""
    on_cuda = cfg.run.device == "cuda"
    if cfg.run.threads == "auto":
        cfg.run.threads = max(1, facts.cpus // facts.local_ranks)
        notes["run.threads"] = f"{facts.cpus} usable CPUs / {facts.local_ranks} local rank(s)"
    from trainperf.hardware.hostmem import check as check_host_memory

    check_host_memory(cfg.run.host_memory)

    # --- precision
    prec = cfg.precision
    if prec.dtype == "auto":
        if on_cuda:
            prec.dtype = "bf16" if facts.bf16 else "fp16"
            notes["precision.dtype"] = (
                f"{facts.cuda_name} supports bf16" if facts.bf16 else f"{facts.cuda_name} lacks bf16; fp16 with loss scaling"
            )
        else:
            prec.dtype = "fp32"
            notes["precision.dtype"] = f"device {cfg.run.device}: fp32 (no reduced-precision speed-up to take)"
    if prec.dtype == "fp16" and not on_cuda:
        raise ConfigError(
            f"precision.dtype='fp16' on run.device={cfg.run.device!r}: fp16 with loss scaling needs a CUDA device; "
            "use precision.dtype=bf16 or fp32 on this device"
        )
    if prec.dtype == "tf32" and not (on_cuda and facts.tf32):
        raise ConfigError(
            f"precision.dtype='tf32' needs an NVIDIA GPU of compute capability 8.0 or newer "
            f"(run.device={cfg.run.device!r}{', ' + facts.cuda_name if facts.cuda else ''}); use fp32 or bf16"
        )
    if prec.dtype == "bf16" and on_cuda and not facts.bf16:
        raise ConfigError(f"precision.dtype='bf16' but {facts.cuda_name} has no bf16 tensor cores (torch emulates "
                          "bf16 there, several times slower than fp16); use precision.dtype=fp16 (loss scaling "
                          "is automatic) or fp32")

    # --- optimizer kernel
    opt = cfg.optimizer
    if opt.impl == "auto":
        if opt.type == "sgd":
            opt.impl = "foreach"
            notes["optimizer.impl"] = "SGD: foreach"
        elif cfg.run.device in facts.fused_adam_devices:
            opt.impl = "fused"
            notes["optimizer.impl"] = f"{opt.type}: this torch has a fused AdamW kernel for {cfg.run.device}"
        else:
            opt.impl = "foreach"
            notes["optimizer.impl"] = f"{opt.type}: no fused kernel on {cfg.run.device}; foreach (multi-tensor) instead"
    if opt.impl == "fused" and (opt.type == "sgd" or cfg.run.device not in facts.fused_adam_devices):
        raise ConfigError(
            f"optimizer.impl='fused' is not available for {opt.type} on {cfg.run.device} with this torch; "
            "use optimizer.impl=foreach or auto"
        )

    # --- data loader settings
    d = cfg.data
    if d.num_workers == "auto":
        d.num_workers = loader_workers(facts.local_ranks, facts.cpus)
        notes["data.num_workers"] = (
            f"min(32, {facts.cpus} usable CPUs / {facts.local_ranks} local rank(s)) "
            "(the founding document's 2 x cores oversubscribes a multi-GPU node)"
        )
    if d.pin_memory == "auto":
        d.pin_memory = on_cuda
        notes["data.pin_memory"] = "pinned host memory speeds host-to-device copies" if on_cuda else "no CUDA device"

    # --- distributed backend
    if cfg.distributed.backend == "auto":
        notes["distributed.backend"] = "nccl on CUDA" if on_cuda else "gloo on CPU"
        cfg.distributed.backend = "nccl" if on_cuda else "gloo"
    if cfg.distributed.backend == "nccl" and not on_cuda:
        raise ConfigError("distributed.backend='nccl' needs CUDA devices; use gloo or auto on CPU")
    if cfg.distributed.backend == "xla" and cfg.run.device != "xla":
        raise ConfigError(f"distributed.backend='xla' needs run.device=xla (run.device={cfg.run.device!r}); use auto")


def resolve_global_batch(cfg: Config, notes: dict | None = None) -> int:
    """``train.global_batch: auto`` -> micro_batch x data-parallel degree (x parallelism.microbatches when
    pipelining), the Megatron convention; the number replaces ``auto`` in ``cfg`` (degrees already resolved)."""
    t, p = cfg.train, cfg.parallelism
    if t.global_batch == "auto":
        dp = max(1, p.data) * p.data_shard
        m = p.microbatches if p.pipeline > 1 else 1
        t.global_batch = t.micro_batch * dp * m
        if notes is not None:
            notes["train.global_batch"] = (
                f"micro_batch {t.micro_batch} x data-parallel degree {dp}"
                + (f" x parallelism.microbatches {m} (pipelining)" if p.pipeline > 1 else "")
                + " (the Megatron convention)")
    return t.global_batch


def _largest_divisor_at_most(n: int, cap: int) -> int:
    return max([d for d in divisor_list(n)[0] if d <= cap] or [1])


def check_pipeline_schedule(cfg: Config) -> None:
    """What torch.distributed.pipelining's schedules require of parallelism.microbatches (each raised a
    ValueError on one rank mid-launch): 1F1B at least one micro-batch per stage; interleaved 1F1B a multiple
    of its rounds (microbatches // pipeline, at least 1). GPipe takes any count."""
    p = cfg.parallelism
    if p.sequence_parallel and p.tensor <= 1:
        raise ConfigError("parallelism.sequence_parallel=true needs parallelism.tensor >= 2 (it shards the norms and "
                          "dropouts along the sequence over the tensor-parallel ranks); set parallelism.tensor or "
                          "sequence_parallel: false")
    if p.interleave > 1 and p.pipeline > 1 and p.pipeline_schedule != "interleaved_1f1b":
        raise ConfigError(f"parallelism.interleave={p.interleave} applies to pipeline_schedule: interleaved_1f1b "
                          f"only (got {p.pipeline_schedule!r}, which runs one stage per rank); set "
                          "parallelism.pipeline_schedule: interleaved_1f1b, or interleave: 1")
    if p.pipeline <= 1:
        return
    m, pp = p.microbatches, p.pipeline
    if p.pipeline_schedule == "1f1b" and m < pp:
        raise ConfigError(
            f"parallelism.microbatches={m} is below parallelism.pipeline={pp}: the 1f1b schedule needs at least one "
            f"micro-batch per stage (torch.distributed.pipelining); set parallelism.microbatches >= {pp} (more "
            "also shrinks the pipeline bubble), or parallelism.pipeline_schedule: gpipe")
    if p.pipeline_schedule == "interleaved_1f1b":
        rounds = max(1, m // pp)
        if m % rounds:
            lower, upper = rounds * pp, (rounds + 1) * pp
            raise ConfigError(
                f"parallelism.microbatches={m} with parallelism.pipeline={pp}: interleaved 1F1B runs the micro-batches "
                f"in rounds ({m} // {pp} = {rounds}) and needs a multiple of the rounds; set parallelism.microbatches "
                f"to {lower} or {upper} (a multiple of the pipeline degree always works)")


def check_batch(cfg: Config, micro_batch: int | None = None) -> None:
    """The global batch must split into micro_batch x data-parallel degree (and, when pipelining, each
    replica's batch into parallelism.microbatches). The error names every way out. ``micro_batch``: the
    micro-batch actually trained, when it differs from train.micro_batch (capped at a rank's share)."""
    t, p = cfg.train, cfg.parallelism
    if t.global_batch == "auto":
        resolve_global_batch(cfg)
    B, b = t.global_batch, micro_batch or t.micro_batch
    dp = max(1, p.data) * p.data_shard
    m = p.microbatches if p.pipeline > 1 else 1
    unit = math.lcm(b * dp, dp * m)  # every valid global batch is a multiple of this
    if B % unit == 0:
        return
    problems = []
    if B % (b * dp):
        problems.append(f"train.global_batch={B} is not divisible by train.micro_batch x data-parallel degree = "
                        f"{b} x {dp} = {b * dp}")
    if p.pipeline > 1 and B % (dp * m):
        problems.append(f"the per-replica batch (train.global_batch / data degree = {B} / {dp}) is not divisible "
                        f"by parallelism.microbatches={m}")
    up, down = -(-B // unit) * unit, B // unit * unit
    ways = [f"raise train.global_batch to {up}"]
    if down >= unit:
        ways.append(f"lower it to {down}")
    if B % dp == 0:
        local = B // dp
        if local % b:
            ways.append(f"lower train.micro_batch to {_largest_divisor_at_most(local, b)} "
                        f"(any divisor of the per-replica batch {local}: {_divisors(local)})")
        if p.pipeline > 1 and local % m:
            ways.append(f"lower parallelism.microbatches to {_largest_divisor_at_most(local, m)} "
                        f"(any divisor of {local}: {_divisors(local)})")
    else:
        ways.append(f"use a data-parallel degree that divides {B} ({_divisors(B)})")
    ways.append(f"set train.global_batch: auto (= micro_batch x data degree{' x microbatches' if m > 1 else ''} "
                f"= {t.micro_batch * dp * m})")
    raise ConfigError("; ".join(problems) + ": " + ", or ".join(ways))


