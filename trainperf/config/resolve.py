"""Resolve every ``auto`` from the hardware and check cross-field constraints.

:func:`resolve` returns a new :class:`Config` with no ``auto`` left (except
``model.vocab_size``, which comes from the data when the model is built) and a
dict ``notes`` mapping each resolved field path to the reason, shown by
``trainperf config show``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from trainperf.config.schema import Config
from trainperf.errors import ConfigError
from trainperf.hardware.cpu import loader_workers, local_world_size, usable_cpus


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
        import torch

        facts = cls(cpus=usable_cpus(), local_ranks=local_world_size())
        if torch.cuda.is_available():
            facts.cuda = True
            facts.cuda_name = torch.cuda.get_device_name(0)
            major, _ = torch.cuda.get_device_capability(0)
            facts.tf32 = major >= 8
            facts.bf16 = torch.cuda.is_bf16_supported()
        try:
            from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

            fused_devices = set(_get_fused_kernels_supported_devices())
        except ImportError:  # older torch: fused AdamW on CUDA only
            fused_devices = {"cuda"}
        facts.fused_adam_devices = tuple(sorted(fused_devices))
        return facts


@dataclass
class Resolved:
    cfg: Config
    notes: dict[str, str] = field(default_factory=dict)
    world_size: int = 1


def world_size_from_env() -> int:
    try:
        return max(1, int(os.environ.get("WORLD_SIZE", "1")))
    except ValueError:
        return 1


def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)


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
        raise ConfigError(f"precision.dtype='bf16' but {facts.cuda_name} does not support bf16; use fp16 or fp32")

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

    ParallelDims.from_config(cfg, world_size)
    # micro_batch is a memory knob, the global batch the contract: a micro-batch larger than a data
    # rank's share (e.g. gpt-tiny's 16 at data=2) trains as that share (no accumulation), the same
    # training. The field keeps its value (evaluation batches stay those of one process).
    n_dp = max(1, p.data) * p.data_shard
    share = cfg.train.global_batch // n_dp
    if n_dp > 1 and cfg.train.global_batch % n_dp == 0 and cfg.train.micro_batch > share:
        notes["train.micro_batch"] = (f"{cfg.train.micro_batch} > the per-rank batch {share} (global_batch "
                                      f"{cfg.train.global_batch} / {n_dp} data ranks): each rank trains "
                                      f"micro-batches of {share}")
        configured, cfg.train.micro_batch = cfg.train.micro_batch, share
        check_batch(cfg)
        cfg.train.micro_batch = configured
    else:
        check_batch(cfg)
    check_model_shape(cfg)
    if world_size > 1 and cfg.run.device != "xla":
        check_compression(p.compression.type, dp_replicate=p.data, dp_shard=p.data_shard, tp=p.tensor, pp=p.pipeline)
    if p.compression.type != "none" and p.data_shard > 1:
        raise ConfigError(
            f"parallelism.compression.type={p.compression.type!r} applies to DDP gradients; with data_shard={p.data_shard} "
            "(FSDP) use parallelism.fsdp_reduce_dtype instead"
        )
    from trainperf.distributed.balance import check_balance_config

    check_balance_config(cfg, world_size)
    return Resolved(cfg=cfg, notes=notes, world_size=world_size)


def check_batch(cfg: Config) -> None:
    t, p = cfg.train, cfg.parallelism
    dp = max(1, p.data) * p.data_shard
    per_step = t.micro_batch * dp
    if t.global_batch % per_step:
        raise ConfigError(
            f"train.global_batch={t.global_batch} is not divisible by train.micro_batch x data-parallel degree = "
            f"{t.micro_batch} x {dp} = {per_step}; choose a global_batch that is a multiple of {per_step} "
            f"or a micro_batch among {_divisors(t.global_batch // dp) if t.global_batch % dp == 0 else '(none: change the data degree)'}"
        )
    if p.pipeline > 1:
        local = t.global_batch // dp
        if local % p.microbatches:
            raise ConfigError(
                f"per-replica batch {local} (train.global_batch / data degree) is not divisible by "
                f"parallelism.microbatches={p.microbatches}; choose microbatches among {_divisors(local)}"
            )


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
        raise ConfigError(
            f"parallelism.tensor={p.tensor} does not divide model.n_head={s['n_head']}; choose among {_divisors(s['n_head'])}"
        )
    if p.pipeline * p.interleave > s["n_layer"]:
        raise ConfigError(
            f"parallelism.pipeline x interleave = {p.pipeline} x {p.interleave} exceeds model.n_layer={s['n_layer']} "
            "blocks; every stage needs at least one block"
        )
