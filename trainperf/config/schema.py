"""The typed configuration tree.

Every field carries a docstring: those docstrings are the JSON Schema
descriptions (``trainperf config schema``) and the documentation. Unknown keys
are rejected (the loader suggests the nearest valid name). ``"auto"`` values
are resolved from the hardware probe by :func:`trainperf.train.resolve.resolve`.

Precedence: ``--set`` overrides > YAML file > the defaults written here.
"""

from __future__ import annotations

import math
import typing
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from trainperf.limits import MAX_BATCH, MAX_CONTEXT, MAX_DEGREE, MAX_HEADS, MAX_HIDDEN, MAX_LAYERS, MAX_VOCAB

Auto = Literal["auto"]
# Numeric ranges, shared by the fields below (the loader names the range and the default in its errors).
PosInt = Annotated[int, Field(ge=1)]
NonNegInt = Annotated[int, Field(ge=0)]
Fraction = Annotated[float, Field(ge=0, le=1)]


class Section(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        use_attribute_docstrings=True,
        validate_assignment=True,
        protected_namespaces=(),
        allow_inf_nan=False,  # .nan / .inf are never a valid setting
    )

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        """Refuse true/false where a number is expected. Pydantic's lax mode reads True as 1 and False as 0,
        and YAML 1.1 reads yes/no/on/off as booleans, so `steps: yes` silently meant a one-step run. Runs for
        every field of every section (new fields included); fields whose type admits bool are left alone."""
        if isinstance(value, bool):
            kind = _number_kind(_field_annotation(cls, info.field_name))
        elif isinstance(value, (list, tuple)) and any(isinstance(v, bool) for v in value):
            kind = _number_kind(_field_annotation(cls, info.field_name), items=True)
        else:
            return value
        if kind:
            raise ValueError(f"a boolean where {kind} is expected (YAML reads yes/no/on/off/true/false as "
                             "booleans); write a number")
        return value


def _field_annotation(model: type[BaseModel], name: str | None) -> Any:
    info = model.model_fields.get(name) if name else None
    return info.annotation if info is not None else None


def _number_kind(annotation: Any, *, items: bool = False) -> str:
    """"a whole number" / "a number" when ``annotation`` (through Optional, Union, Annotated) takes an int or a
    float but not a bool, else "". ``items``: look at the element types of a tuple/list annotation instead."""
    kinds: set[type] = set()

    def walk(ann: Any, inside: bool) -> None:
        origin, args = typing.get_origin(ann), typing.get_args(ann)
        if origin is Annotated:
            walk(args[0], inside)
        elif origin is Literal:
            return
        elif origin in (tuple, list):
            if inside:
                for a in args:
                    if a is not Ellipsis:
                        walk(a, False)
        elif args:  # Union / Optional
            for a in args:
                walk(a, inside)
        elif ann in (int, float, bool) and not inside:
            kinds.add(ann)

    walk(annotation, items)
    if bool in kinds or not kinds:
        return ""
    return "a whole number" if kinds == {int} else "a number"


def _parse_bytes(value):
    """Accept 1024, "512MB", "50GB", "8GiB"."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if not math.isfinite(value):
            raise ValueError(f"{value!r} is not a size; write bytes as a number or with a unit, e.g. '512MB'")
        return int(value)
    if isinstance(value, str):
        text = value.strip().replace(" ", "")
        units = {
            "": 1, "b": 1,
            "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
            "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
        }
        num = text.rstrip("KMGTBikmgtb")
        unit = text[len(num):].lower()
        if unit in units and num:
            try:
                return int(float(num) * units[unit])
            except (ValueError, OverflowError):
                pass
    raise ValueError(f"{value!r} is not a size; write bytes as a number or with a unit, e.g. '512MB' or '50GB'")


# --------------------------------------------------------------------------- run
class RunConfig(Section):
    name: str = Field("run", min_length=1, max_length=128)
    """Name of the run; used in the default run directory (runs/<name>): one path component."""

    @field_validator("name")
    @classmethod
    def _one_component(cls, v: str) -> str:
        # runs/<name> must stay one directory inside runs/: no separators, no '..' (a name of '../x' wrote
        # outside it), no control characters
        if "/" in v or "\\" in v or v in (".", "..") or any(ord(ch) < 32 for ch in v):
            raise ValueError("must be one directory name (no '/', '\\', '.' or '..', no control characters); "
                             "to write elsewhere set run.dir")
        return v
    dir: Optional[str] = None
    """Run directory (metrics, checkpoints, summary.json). Default: runs/<name>."""
    steps: int = Field(200, ge=1)
    """Number of optimizer steps to train."""
    seed: int = Field(1337, ge=0, lt=2**64)
    """Seed for parameters, data order and dropout; the same seed gives the same run."""
    device: Literal["auto", "cpu", "cuda", "xla"] = "auto"
    """Where to train: auto picks cuda when available, else cpu; xla: a torch_xla device (PJRT_DEVICE=TPU|CUDA|CPU)."""
    threads: Union[Auto, PosInt] = "auto"
    """CPU threads for intra-op parallelism (auto: usable CPUs / local ranks)."""
    host_memory: Literal["release", "retain"] = "release"
    """What the C allocator does with freed host memory (glibc). release: its default, large blocks are mapped per
    allocation and returned to the kernel when freed, so a CPU step pays fresh page faults for its activations;
    retain: freed blocks stay mapped for the next step (faster CPU steps; the process keeps its peak resident
    memory). A setting of the whole process (trainperf/hardware/hostmem.py); `trainperf tune` measures it."""
    log_every: int = Field(10, ge=1)
    """Print and log a progress line every this many steps."""
    eval_every: int = Field(100, ge=0)
    """Evaluate on the validation split every this many steps (0: only at the end)."""
    eval_batches: int = Field(8, ge=1)
    """Micro-batches averaged for one validation loss."""
    sample_tokens: int = Field(200, ge=0)
    """Length of the text sample generated at the end (0: none)."""
    progress: bool = True
    """Show a progress bar (disabled automatically when stderr is not a terminal)."""


# --------------------------------------------------------------------------- model
class HFModelConfig(Section):
    config: Optional[dict] = None
    """A Hugging Face config as data: {"model_type": "llama", "hidden_size": 256, ...} (built with
    AutoConfig.for_model, weights initialized from run.seed). Exactly one of config / path."""
    path: Optional[str] = None
    """A local directory with config.json (and weights: loaded with from_pretrained; nothing is
    downloaded). Exactly one of config / path."""
    pretrained: bool = True
    """With path: load the directory's weights (False: only its config, weights from run.seed)."""
    attn_implementation: Literal["sdpa", "eager"] = "sdpa"
    """Hugging Face attention implementation."""
    overrides: dict = {}
    """Config fields set on top of config / path's config.json (e.g. {"attention_dropout": 0.0})."""


class ModelConfig(Section):
    preset: str = "tiny"
    """Reference GPT shape (tiny, gpt2-124m, gpt2-350m, ...; see trainperf.models.presets)."""
    entrypoint: Optional[str] = None
    """Your own model: "package.module:function" returning an nn.Module whose forward(idx, targets)
    returns (logits, loss) with loss the mean cross-entropy over the tokens (see README)."""
    n_layer: Optional[int] = Field(None, ge=1, le=MAX_LAYERS)
    """Transformer blocks (default: from the preset)."""
    n_head: Optional[int] = Field(None, ge=1, le=MAX_HEADS)
    """Attention heads (default: from the preset)."""
    n_embd: Optional[int] = Field(None, ge=1, le=MAX_HIDDEN)
    """Hidden size (default: from the preset)."""
    block_size: Optional[int] = Field(None, ge=1, le=MAX_CONTEXT)
    """Context length in tokens (default: from the preset)."""
    vocab_size: Union[Auto, Annotated[int, Field(ge=2, le=MAX_VOCAB)]] = "auto"
    """Vocabulary size; auto takes it from the data (padded up to a multiple of 64)."""
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    """Dropout probability in attention and MLP outputs."""
    bias: bool = True
    """Use bias in linear layers and layer norms."""
    init_std: float = Field(0.02, gt=0)
    """Standard deviation of the normal weight initialization."""
    hf: Optional[HFModelConfig] = None
    """A decoder-only Hugging Face transformers causal LM (trainperf.models.hf): model.hf.config
    (a config as data) or model.hf.path (a local directory). Sequence length: model.block_size,
    default min(the config's max_position_embeddings, 1024)."""
    blocks: Optional[str] = None
    """Dotted path of the model's repeated blocks (e.g. "model.layers", "transformer.h"), used by
    activation checkpointing, FSDP per-block wrapping and tensor parallelism alike; None: the block
    finder picks the largest list of identical blocks."""


# --------------------------------------------------------------------------- data
class CacheConfig(Section):
    dir: Optional[str] = None
    """Disk cache directory shared by the processes of a node (None: no disk cache)."""
    max_bytes: int = Field(50 * 10**9, ge=1)
    """Size bound of the disk cache; least recently used entries are evicted ("50GB", "512MB")."""

    _size = field_validator("max_bytes", mode="before")(lambda cls, v: _parse_bytes(v))


class PrefetchConfig(Section):
    device_bytes: int = Field(8 * 2**30, ge=1)
    """Bound of the device prefetch ring in bytes ("8GiB" as in the founding document)."""
    depth: Union[Auto, PosInt] = "auto"
    """Batches ready ahead of use (upper bound; the byte bound may lower it). auto: derived, with the host
    slots, from the measured read and decode times and step time (trainperf.data.prefetch_plan); an int
    fixes it (host slots then num_workers x prefetch_factor)."""
    io_threads: Union[Auto, PosInt] = "auto"
    """Threads per worker issuing reads ahead of use (async IO). auto: enough for the reads the step needs
    in flight (Little's law on the measured read latency), re-planned as the step time is measured."""

    _size = field_validator("device_bytes", mode="before")(lambda cls, v: _parse_bytes(v))


class SimulateConfig(Section):
    read_latency_ms: float = Field(0.0, ge=0)
    """Added latency per read, like a network filesystem (for benchmarks and diagnosis)."""
    bandwidth_mb_s: Optional[float] = Field(None, gt=0)
    """Bandwidth cap of the simulated storage in MB/s (None: no cap)."""


class DataConfig(Section):
    source: Literal["tokens", "synthetic", "files", "dataset"] = "tokens"
    """tokens: a prepared token memmap; synthetic: random tokens (throughput work);
    files: a directory of sample files; dataset: a map-style Dataset from `dataset_entrypoint`."""
    path: str = "data/stdlib"
    """Directory with train.bin, val.bin and meta.json (written by `trainperf data prepare`)."""
    prepare_from: Optional[str] = "stdlib"
    """If `path` holds no prepared data: prepare it from this directory of text files, or from
    "stdlib" (the Python standard library's source). None: fail with instructions."""
    prepare_max_bytes: int = Field(16 * 10**6, ge=1)
    """Bound on the text read when preparing (bytes)."""

    _size = field_validator("prepare_max_bytes", mode="before")(lambda cls, v: _parse_bytes(v))
    val_fraction: float = Field(0.05, gt=0, lt=0.5)
    """Fraction of the prepared tokens held out for validation."""
    dataset_entrypoint: Optional[str] = None
    """For source=dataset: "package.module:function" returning a map-style Dataset."""
    num_workers: Union[Auto, NonNegInt] = "auto"
    """Loader workers per rank; auto = min(32, usable CPUs / local ranks) where workers help."""
    pin_memory: Union[Auto, bool] = "auto"
    """Pin host batches (auto: on when training on CUDA)."""
    prefetch_factor: int = Field(3, ge=1)
    """Batches each worker prepares ahead (the founding document's 3)."""
    shuffle: bool = True
    """Shuffle sample order (deterministic from run.seed and the epoch)."""
    drop_last: bool = True
    """Drop the samples that do not fill an equal share for every rank (else pad by repeating)."""
    on_bad_sample: Literal["error", "skip"] = "error"
    """What to do with an unreadable sample: stop with its index and file, or skip it and count it."""
    loader: Literal["simple", "hybrid", "dataloader"] = "simple"
    """Batch loader: simple (in-process), hybrid (HybridLoader tiers), dataloader (torch DataLoader)."""
    cache: CacheConfig = CacheConfig()
    """Disk cache tier."""
    prefetch: PrefetchConfig = PrefetchConfig()
    """Host/device prefetch tier."""
    simulate: SimulateConfig = SimulateConfig()
    """Slow-storage simulation wrapped around the source."""


# --------------------------------------------------------------------------- train
class TrainConfig(Section):
    global_batch: Union[Auto, Annotated[int, Field(ge=1, le=MAX_BATCH)]] = "auto"
    """Sequences per optimizer step, summed over all data-parallel ranks and micro-steps. auto: micro_batch x
    data-parallel degree (x parallelism.microbatches when pipelining), the Megatron convention."""
    micro_batch: int = Field(16, ge=1, le=MAX_BATCH)
    """Sequences per forward/backward on one rank; accumulation = global / (micro * data ranks)."""
    grad_clip: float = Field(1.0, ge=0)
    """Clip the global gradient norm to this value (0: no clipping)."""
    on_oom: Literal["error", "halve_micro_batch"] = "error"
    """Out of device memory in a step: error (stop), or halve_micro_batch (free the step, halve the
    micro-batch, double the accumulation so the global batch stays, and run the same step again;
    every rank agrees on the new size)."""


class OptimizerConfig(Section):
    type: Literal["adamw", "fused_adam", "adam", "sgd"] = "adamw"
    """adamw / fused_adam (AdamW with the fused kernel where the device has one, foreach elsewhere),
    adam (no decoupled decay), sgd (momentum 0.9)."""
    lr: float = Field(1e-3, gt=0, le=1e6)
    """Peak learning rate (at most 1e6: above it a typo or a unit slip, not a schedule)."""
    weight_decay: float = Field(0.1, ge=0)
    """Decoupled weight decay, applied to matrices only (not biases, norms or embeddings' bias)."""
    betas: tuple[Annotated[float, Field(ge=0, lt=1)], Annotated[float, Field(ge=0, lt=1)]] = (0.9, 0.95)
    """Adam betas."""
    eps: float = Field(1e-8, gt=0)
    """Adam epsilon."""
    impl: Literal["auto", "fused", "foreach", "for-loop"] = "auto"
    """Kernel: auto picks fused where the device supports it, foreach elsewhere."""


class ScheduleConfig(Section):
    type: Literal["cosine", "linear", "constant"] = "cosine"
    """Decay after warm-up."""
    warmup_steps: int = Field(20, ge=0)
    """Linear warm-up from 0 to the peak learning rate."""
    min_lr_ratio: float = Field(0.1, ge=0, le=1)
    """Final learning rate as a fraction of the peak."""


class PrecisionConfig(Section):
    dtype: Literal["auto", "fp32", "tf32", "bf16", "fp16"] = "auto"
    """fp32; tf32 (fp32 storage, TF32 matmuls on Ampere+); bf16 or fp16 autocast (fp16 with loss
    scaling). auto: bf16 on GPUs that support it, fp16 on older GPUs, fp32 on CPU."""
    init_scale: float = Field(2.0**16, gt=0)
    """Initial loss scale for fp16."""


class CheckpointingConfig(Section):
    mode: Literal["none", "full", "ratio", "every_k", "selective", "budget"] = "none"
    """Activation checkpointing: none, full (every block), ratio (a fraction of blocks, spread
    evenly), every_k (one block in k), selective (op level: keep matmul outputs), budget (least
    recompute that fits memory.checkpointing.budget_gb)."""
    ratio: float = Field(0.25, gt=0, le=1)
    """For mode=ratio: fraction of blocks checkpointed (0.25 = one in four, the founding document's)."""
    every_k: int = Field(4, ge=1)
    """For mode=every_k: checkpoint one block in this many."""
    blocks: Optional[str] = None
    """Dotted path of the repeated blocks (e.g. "transformer.h"); None: found automatically."""
    budget_gb: Optional[float] = Field(None, gt=0, le=1e6)
    """For mode=budget: activation + model-state budget per rank in GB (at most 1e6: a petabyte per rank)."""


class MemoryConfig(Section):
    checkpointing: CheckpointingConfig = CheckpointingConfig()
    """Activation (gradient) checkpointing."""
    preflight: bool = True
    """Before ``trainperf train`` builds the reference GPT, refuse a run whose memory estimate (model states +
    activations per rank, ``trainperf memory``) is above the device's memory (CPU: the host's available
    memory, shared by its ranks); false starts it anyway."""


class CompileConfig(Section):
    enabled: bool = False
    """Compile the model with torch.compile (falls back to eager with a warning if it fails)."""
    mode: Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"] = "default"
    """torch.compile mode."""
    fullgraph: bool = False
    """Require one graph (no graph breaks)."""
    backend: str = "inductor"
    """torch.compile backend (inductor; openxla on XLA devices)."""
    regional: bool | Literal["auto"] = "auto"
    """Compile each repeated block separately (faster compile) instead of the whole model; auto: the whole
    model in one process and under DDP, each block under FSDP2, tensor or pipeline parallelism."""


class CompressionConfig(Section):
    type: Literal["none", "fp16", "bf16", "powersgd"] = "none"
    """Gradient compression for data-parallel all-reduce (DDP communication hooks)."""
    rank: int = Field(4, ge=1)
    """PowerSGD matrix approximation rank."""
    warmup_steps: int = Field(10, ge=0)
    """PowerSGD: steps of uncompressed all-reduce before compression starts."""


class BalanceConfig(Section):
    enabled: bool = False
    """Rebalance per-rank shares of the global batch to follow measured speed (trainperf.distributed.balance)."""
    window: int = Field(100, ge=2)
    """Most recent per-rank compute-time measurements kept (the founding document's 100); the medians
    over them (taken with the current shares) are the speeds. Must be >= 2."""
    threshold: float = Field(0.2, gt=0)
    """Rebalance when the coefficient of variation (std / mean) of the per-rank median step compute
    times exceeds this (the founding document's 0.2). Must be > 0."""
    min_share: Fraction = 0.0
    """Smallest fraction of the global batch a rank may get (min_share x ranks must be <= 1); a rank
    always gets at least one sample per micro-step."""
    max_share: float = Field(1.0, gt=0, le=1)
    """Largest fraction of the global batch a rank may get (max_share x ranks must be >= 1); bounds the
    fast ranks' micro-batch size, hence their activation memory."""
    min_gain: float = Field(0.02, ge=0, lt=1)
    """In [0, 1). A move must be predicted to cut the step's compute time (slowest rank) by at least this
    fraction. After a move the balancer keeps refining (no threshold needed) while such a move exists,
    then waits for the threshold again: the hysteresis. Moves that are only rounding are never made."""
    trigger_gain: float = Field(0.15, gt=0, lt=1)
    """In (0, 1). Also act, below the CV threshold, when the measured speeds predict a move that cuts the
    step's time by at least this fraction: with two ranks a CV of 0.2 is a 1.5x speed ratio, so the CV alone
    leaves a 1.4x straggler (a core shared with another process) alone; the move must hold over the whole
    window and its newer half for min_steps judgements in a row."""
    min_steps: PosInt = 10
    """Measurements needed under the current shares before the balancer judges them (again after each move)."""
    sync_every: PosInt = 1
    """Exchange the measurements (one all_gather) every this many steps; on CUDA each exchange is a
    host-device sync."""
    sync_every_settled: PosInt = 5
    """While the balancer is settled (no move being tried or refined, no change to act on): exchange every this
    many steps instead (at least sync_every). Each exchange is a collective that waits for every rank to be
    scheduled: on a busy host, one per step cost the balanced run 7-14% beside an extra CPU hog. A change of the
    ranks' speeds is then seen up to this many steps later."""
    verify: bool = True
    """Try each move before keeping it: the new and the old shares alternate in blocks (new, old, old, new)
    and the move is kept only if the measured step time (the slowest rank's wall time) got faster, judged
    against its noise; otherwise the old shares come back and the balancer backs off. False: keep every
    move the cost model predicts (the founding document's balancer)."""
    verify_steps: int = Field(20, ge=2)
    """Steps measured per arrangement (new shares, old shares) before a verdict; an undecided trial runs
    up to 4x as many."""
    verify_block: PosInt = 5
    """Steps per block of a trial (the first step of each block is not counted: a change of shares restarts
    prefetching). Blocks end at exchanges, so with sync_every > verify_block a block is sync_every steps."""
    backoff_steps: int = Field(100, ge=0)
    """After a reverted move: steps before the balancer may try another, doubled after each consecutive
    revert (at most 64x), reset by a kept move."""
    change_steps: int = Field(6, ge=3, le=1000)
    """Mid-run changes (a straggler appears, grows, moves or goes away): a rank's time relative to the others,
    at equal shares, that moved beyond change_threshold in all but one of the newest change_steps steps (and
    beyond the noise of the steps before) is a change: what was measured before it is dropped, a move being
    tried is left, the back-off ends, and the balancer re-measures (trainperf.distributed.balance_change)."""
    change_threshold: float = Field(0.15, gt=0, le=10)
    """The fraction by which a rank's relative time must move to be a change (0.15: with two ranks, one
    becoming about 1.35x slower)."""


class ParallelismConfig(Section):
    data: int = -1
    """Data-parallel replicas (DDP); -1 derives it from the world size."""
    data_shard: int = Field(1, ge=1, le=MAX_DEGREE)
    """FSDP2 sharding degree (fully_shard)."""
    tensor: int = Field(1, ge=1, le=MAX_DEGREE)
    """Tensor-parallel degree (DTensor); must divide model.n_head."""
    pipeline: int = Field(1, ge=1, le=MAX_DEGREE)
    """Pipeline-parallel degree (torch.distributed.pipelining); at most model.n_layer."""
    microbatches: int = Field(8, ge=1, le=MAX_BATCH)
    """Pipeline micro-batches per step (the founding document's chunks=8)."""
    pipeline_schedule: Literal["gpipe", "1f1b", "interleaved_1f1b"] = "1f1b"
    """Pipeline schedule."""
    interleave: int = Field(1, ge=1, le=MAX_DEGREE)
    """Virtual stages per rank for interleaved 1F1B."""
    sequence_parallel: bool = False
    """Shard layer norms and dropout along the sequence under tensor parallelism."""
    compression: CompressionConfig = CompressionConfig()
    """Gradient compression."""
    fsdp_reduce_dtype: Literal["fp32", "bf16", "fp16"] = "fp32"
    """FSDP2 gradient reduce-scatter dtype."""
    balance: BalanceConfig = BalanceConfig()
    """Dynamic load balancer."""

    @field_validator("data")
    @classmethod
    def _degree(cls, v: int) -> int:
        if v == 0 or v < -1 or v > MAX_DEGREE:
            raise ValueError(f"must be a positive degree (at most {MAX_DEGREE}) or -1 (derive from the world size)")
        return v


class ProfileConfig(Section):
    start_step: Optional[int] = Field(None, ge=0)
    """Record a torch.profiler trace starting at this step (None: no trace)."""
    steps: int = Field(3, ge=1)
    """Steps recorded in the trace."""


class MonitorConfig(Section):
    jsonl: bool = True
    """Write metrics.jsonl (one line per step) in the run directory."""
    tensorboard: bool = False
    """Also write TensorBoard events (needs the tensorboard package)."""
    prometheus_port: Optional[int] = Field(None, ge=0, le=65535)
    """Serve metrics for Prometheus on this port (None: off)."""
    prometheus_host: str = "127.0.0.1"
    """Address the Prometheus endpoint binds to (loopback unless you say otherwise)."""
    sample_every_s: float = Field(1.0, gt=0)
    """Device sampler period (NVML, CPU, RAM)."""
    flush_s: float = Field(2.0, gt=0, le=3600)
    """Longest time a step record waits in memory: a background thread writes metrics.jsonl at
    least this often (records also reach the file every run.log_every steps), so a run killed
    with kill -9 keeps every record older than about this. No host sync per step: on CUDA a
    step's loss is copied to pinned host memory without blocking and may follow its timing
    line in a later line of the same step (readers merge them)."""
    nvtx: bool = True
    """Emit NVTX ranges per phase on CUDA (visible under nsys profile -t cuda,nvtx)."""
    mfu: bool = True
    """Compute MFU/HFU (FLOPs counted once with FlopCounterMode and from the formula)."""
    oom_snapshot: bool = True
    """On CUDA, record the allocator's history and, on an out-of-memory error, write
    oom_snapshot_rank{R}.pickle in the run directory (open it at pytorch.org/memory_viz)."""
    profile: ProfileConfig = ProfileConfig()
    """torch.profiler trace window."""


class CheckpointConfig(Section):
    every: int = Field(0, ge=0)
    """Save every this many steps (0: only at the end)."""
    keep: int = Field(3, ge=1)
    """Keep the last K checkpoints."""
    dir: Optional[str] = None
    """Checkpoint directory (default: <run.dir>/checkpoints)."""
    at_end: bool = True
    """Save a checkpoint after the last step."""


class DistributedConfig(Section):
    backend: Literal["auto", "nccl", "gloo", "xla"] = "auto"
    """Process-group backend: auto = nccl on CUDA, gloo on CPU, xla (torch_xla's collectives) on XLA."""
    timeout_s: float = Field(300.0, gt=0)
    """Collective timeout: a rank that dies or hangs ends the job within this time."""
    flight_recorder: bool = True
    """On CUDA, keep NCCL's flight recorder of recent collectives for post-mortem."""


class Config(Section):
    """The whole trainperf configuration."""

    run: RunConfig = RunConfig()
    """Run identity, length, seed, device."""
    model: ModelConfig = ModelConfig()
    """Model choice and shape."""
    data: DataConfig = DataConfig()
    """Data source and loader."""
    train: TrainConfig = TrainConfig()
    """Batch sizes and clipping."""
    optimizer: OptimizerConfig = OptimizerConfig()
    """Optimizer."""
    schedule: ScheduleConfig = ScheduleConfig()
    """Learning-rate schedule."""
    precision: PrecisionConfig = PrecisionConfig()
    """Numeric precision policy."""
    memory: MemoryConfig = MemoryConfig()
    """Memory savers."""
    compile: CompileConfig = CompileConfig()
    """torch.compile."""
    parallelism: ParallelismConfig = ParallelismConfig()
    """Parallel degrees and related settings."""
    monitor: MonitorConfig = MonitorConfig()
    """Metrics, sampling and profiling."""
    checkpoint: CheckpointConfig = CheckpointConfig()
    """Checkpointing for resume."""
    distributed: DistributedConfig = DistributedConfig()
    """Process group settings."""

    def run_dir(self) -> str:
        return self.run.dir or f"runs/{self.run.name}"
