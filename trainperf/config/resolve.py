"""Resolve every ``auto`` from the hardware and check cross-field constraints.

:func:`resolve` returns a new :class:`Config` with no ``auto`` left (except
``model.vocab_size``, which comes from the data when the model is built) and a
dict ``notes`` mapping each resolved field path to the reason, shown by
``trainperf config show``.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any

from trainperf.config.schema import Config
from trainperf.errors import ConfigError
from trainperf.hardware.cpu import loader_workers, local_world_size, usable_cpus


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


def derive_data_degree(cfg: Config, world_size: int) -> int:
    """The data-parallel degree (``parallelism.data=-1`` derived from the world size); ParallelDims
    owns the rule and its error messages."""
    from trainperf.distributed.parallel_dims import ParallelDims

    return ParallelDims.from_config(cfg, world_size).dp_replicate


def resolve(cfg: Config, facts: DeviceFacts | None = None, world_size: int | None = None) -> Resolved:
    """Resolve ``auto`` fields and validate combinations. Raises ConfigError naming the fix."""
    facts = facts or DeviceFacts.probe()
    world_size = world_size or world_size_from_env()
    cfg = cfg.model_copy(deep=True)
    notes: dict[str, str] = {}

    # --- device
    if cfg.run.device == "auto":
        cfg.run.device = "cuda" if facts.cuda else "cpu"
        notes["run.device"] = f"CUDA available ({facts.cuda_name})" if facts.cuda else "no CUDA device found"
    if cfg.run.device == "cuda" and not facts.cuda:
        raise ConfigError("run.device='cuda' but no CUDA device is visible; use run.device=cpu or auto")
    on_cuda = cfg.run.device == "cuda"
    if cfg.run.device == "xla":  # torch_xla usable? precision and backend for XLA (trainperf/xla/env.py)
        from trainperf.xla.env import resolve_xla

        resolve_xla(cfg, notes, world_size)

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

    # --- parallel degrees and batch arithmetic
    p = cfg.parallelism
    dp = derive_data_degree(cfg, world_size)
    if p.data == -1:
        notes["parallelism.data"] = f"world size {world_size} / (tensor {p.tensor} x pipeline {p.pipeline} x data_shard {p.data_shard})"
        p.data = dp
    # Degrees x world size first (ParallelDims owns the rule and names the fix); layout-bound
    # compression checks only when several processes run (one process ignores compression).
    from trainperf.distributed.parallel_dims import ParallelDims, check_compression

    xla = cfg.run.device == "xla"  # XLA processes are data-parallel through torch_xla (the backend), no mesh
    dims = ParallelDims.single() if xla else ParallelDims.from_config(cfg, world_size)
    resolve_global_batch(cfg, notes)
    # micro_batch is a memory knob, the global batch the contract: a micro-batch larger than a data
    # rank's share (e.g. gpt-tiny's 16 at data=2) trains as that share (no accumulation), the same
    # training. The field keeps its value (evaluation batches stay those of one process).
    n_dp = max(1, p.data) * p.data_shard
    share = cfg.train.global_batch // n_dp
    if n_dp > 1 and cfg.train.global_batch % n_dp == 0 and cfg.train.micro_batch > share:
        notes["train.micro_batch"] = (f"{cfg.train.micro_batch} > the per-rank batch {share} (global_batch "
                                      f"{cfg.train.global_batch} / {n_dp} data ranks): each rank trains "
                                      f"micro-batches of {share}")
        check_batch(cfg, micro_batch=share)
    else:
        check_batch(cfg)
    check_model_shape(cfg)
    check_pipeline_schedule(cfg)
    check_layout(cfg, dims)
    _resolve_compile(cfg, dims, notes)
    if world_size > 1 and not xla:
        check_compression(p.compression.type, dp_replicate=p.data, dp_shard=p.data_shard, tp=p.tensor, pp=p.pipeline)
    if p.compression.type != "none" and p.data_shard > 1:
        raise ConfigError(
            f"parallelism.compression.type={p.compression.type!r} applies to DDP gradients; with data_shard={p.data_shard} "
            "(FSDP) use parallelism.fsdp_reduce_dtype instead"
        )
    from trainperf.distributed.balance import check_balance_config

    check_balance_config(cfg, world_size)
    return Resolved(cfg=cfg, notes=notes, world_size=world_size, dims=dims)


def check_layout(cfg: Config, dims) -> None:
    """The degrees against the model: a reference GPT's heads, width and blocks; a Hugging Face model
    (``model.hf``) with data and tensor parallelism (its heads checked in check_model_shape); a user's
    model (``model.entrypoint``) with data parallelism only."""
    if cfg.model.hf is not None:
        if dims.pp_enabled:
            raise ConfigError(
                f"parallelism.pipeline={dims.pp} needs the reference GPT's stage split; a Hugging Face model (model.hf) "
                "trains with data parallelism (parallelism.data / data_shard) and tensor parallelism; set pipeline=1")
        return
    if cfg.model.entrypoint:
        if dims.tp_enabled or dims.pp_enabled:
            raise ConfigError(
                f"model.entrypoint models train with data parallelism only (DDP: parallelism.data, FSDP2: "
                f"parallelism.data_shard); got parallelism.tensor={dims.tp}, parallelism.pipeline={dims.pp}, which "
                "need the reference GPT's blocks and attention projections; set both to 1 or use the reference model"
            )
        return
    # the reference GPT: heads against tensor, blocks against stages, checked once, in check_model_shape


def _resolve_compile(cfg: Config, dims, notes: dict) -> None:
    """``compile.regional: auto``: the whole model in one process and under DDP, each block under
    FSDP2, tensor or pipeline parallelism (whole-model graphs cannot span FSDP2's per-block hooks,
    DTensor redistributions or stage boundaries; torchtitan compiles per block too)."""
    c = cfg.compile
    sharded = dims.fsdp_enabled or dims.tp_enabled or dims.pp_enabled
    if c.regional == "auto":
        c.regional = bool(sharded)
        if c.enabled:
            notes["compile.regional"] = ("FSDP2 / tensor / pipeline parallelism: each block compiled" if sharded
                                         else "the whole model compiled in one graph")
    elif c.enabled and sharded and c.regional is False:
        raise ConfigError(
            f"compile.regional=false (one graph for the whole model) cannot be used with {dims.describe()}: FSDP2's "
            "per-block hooks, DTensor redistributions and pipeline stages split it; set compile.regional=true "
            "(each block compiled) or auto"
        )


def seq_len_of(cfg: Config) -> int:
    """Tokens per sample: the reference GPT's context, or ``model.block_size`` (default 128) for a user's model."""
    if cfg.model.entrypoint:
        return cfg.model.block_size or 128
    return model_shape(cfg)["block_size"]


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


def model_shape(cfg: Config) -> dict:
    """The reference GPT shape this config asks for (preset + explicit fields)."""
    from trainperf.models.presets import get_shape

    if cfg.model.hf is not None:  # a Hugging Face model: its config says its shape
        from trainperf.models.hf import shape_for_resolve

        return shape_for_resolve(cfg)
    shape = get_shape(cfg.model.preset).as_dict()
    for key in ("n_layer", "n_head", "n_embd", "block_size"):
        val = getattr(cfg.model, key)
        if val is not None:
            shape[key] = val
    if cfg.model.vocab_size != "auto":
        shape["vocab_size"] = cfg.model.vocab_size
    return shape


def check_model_shape(cfg: Config) -> None:
    if cfg.model.hf is not None:
        if cfg.model.entrypoint:
            raise ConfigError("model.hf and model.entrypoint are both set; keep one")
        if cfg.parallelism.tensor > 1:
            from trainperf.distributed.hf_tp import check_tp_degree

            s = model_shape(cfg)
            check_tp_degree(s["n_head"], s["n_kv_head"], cfg.parallelism.tensor)
            if s.get("model_type") == "gpt2" and cfg.parallelism.data_shard > 1:
                raise ConfigError(
                    f"parallelism.tensor={cfg.parallelism.tensor} with data_shard={cfg.parallelism.data_shard} "
                    "(FSDP2) is not supported for GPT-2: its fused c_attn bias, sharded by both, did not give the "
                    "one-process gradients; use tensor parallelism with DDP (parallelism.data) or FSDP2 alone")
        return
    if cfg.model.entrypoint:
        return
    s = model_shape(cfg)
    if s["n_embd"] % s["n_head"]:
        raise ConfigError(
            f"model.n_embd={s['n_embd']} is not divisible by model.n_head={s['n_head']}; "
            f"choose n_head among {_divisors(s['n_embd'])}"
        )
    p = cfg.parallelism
    if s["n_head"] % p.tensor:
        from trainperf.models.presets import PRESETS

        fits = [n for n, sh in PRESETS.items() if sh.n_head % p.tensor == 0 and sh.n_layer >= p.pipeline * p.interleave]
        raise ConfigError(
            f"parallelism.tensor={p.tensor} does not divide model.n_head={s['n_head']} (model.preset="
            f"{cfg.model.preset!r}); choose parallelism.tensor among {_divisors(s['n_head'])}, or a model whose head "
            f"count is a multiple of {p.tensor} (model.n_head, or a model.preset such as {', '.join(fits[:3]) or '(none)'})"
        )
    virtual = p.interleave if (p.pipeline > 1 and p.pipeline_schedule == "interleaved_1f1b") else 1
    stages = p.pipeline * virtual
    if stages > s["n_layer"]:
        best = max(1, s["n_layer"] // virtual)
        raise ConfigError(
            f"parallelism.pipeline x interleave = {p.pipeline} x {p.interleave} = {stages} stages exceeds "
            f"model.n_layer={s['n_layer']} blocks (every stage needs at least one block); choose pipeline <= {best} "
            "or a deeper model"
        )
