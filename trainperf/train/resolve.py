"""Resolution, the assembly's first step: the config joined with this machine, its model and its layout.

:func:`resolve` replaces every ``auto`` with its value and its reason (the device and the machine's settings
by :mod:`trainperf.config.resolve`; an XLA device by :mod:`trainperf.xla.env`) and validates the layout once,
before any process group or work: :class:`~trainperf.distributed.parallel_dims.ParallelDims` for this world size
(degrees, compression, the balancer), the degrees against the model's shape (:func:`check_model_shape`,
:func:`check_layout`), the batch arithmetic and ``compile.regional``. What it returns, :class:`Resolved`, is what
``trainperf config show`` prints and :func:`trainperf.train.build.build_trainer` builds from.
"""

from __future__ import annotations

from trainperf.config.resolve import (  # noqa: F401  (DeviceFacts, Resolved: resolve's arguments and result)
    DeviceFacts, Resolved, _divisors, check_batch, check_pipeline_schedule, resolve_device, resolve_global_batch,
    resolve_settings, world_size_from_env,
)
from trainperf.config.schema import Config
from trainperf.distributed.parallel_dims import ParallelDims, check_compression
from trainperf.errors import ConfigError
from trainperf.models.presets import PRESETS
from trainperf.models.shape import model_shape


def derive_data_degree(cfg: Config, world_size: int) -> int:
    """The data-parallel degree (``parallelism.data=-1`` derived from the world size); ParallelDims
    owns the rule and its error messages."""
    return ParallelDims.from_config(cfg, world_size).dp_replicate


def resolve(cfg: Config, facts: DeviceFacts | None = None, world_size: int | None = None) -> Resolved:
    """Resolve ``auto`` fields and validate combinations. Raises ConfigError naming the fix."""
    facts = facts or DeviceFacts.probe()
    world_size = world_size or world_size_from_env()
    cfg = cfg.model_copy(deep=True)
    notes: dict[str, str] = {}

    resolve_device(cfg, facts, notes)
    if cfg.run.device == "xla":  # torch_xla usable? precision and backend for XLA (trainperf/xla/env.py)
        from trainperf.xla.env import resolve_xla

        resolve_xla(cfg, notes, world_size)
    resolve_settings(cfg, facts, notes)

    # --- parallel degrees and batch arithmetic
    p = cfg.parallelism
    dp = derive_data_degree(cfg, world_size)
    if p.data == -1:
        notes["parallelism.data"] = f"world size {world_size} / (tensor {p.tensor} x pipeline {p.pipeline} x data_shard {p.data_shard})"
        p.data = dp
    # Degrees x world size first (ParallelDims owns the rule and names the fix); layout-bound
    # compression checks only when several processes run (one process ignores compression).
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


def check_model_shape(cfg: Config) -> None:
    """The model's shape against the degrees, before any work (one check for resolve, ``launch`` and ``plan``):
    a Hugging Face model's heads and KV heads against the tensor degree, the reference GPT's width against its
    heads, its heads against the tensor degree, its blocks against the pipeline's stages."""
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
