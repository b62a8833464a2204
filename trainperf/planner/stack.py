"""What differs between training stacks, as mechanisms the cost model times (no torch).

A :class:`Stack` is a set of switches, each a physical mechanism with its own cost in
:mod:`trainperf.planner.cost`; none is a fitted efficiency:

* ``dp_reduce``: the data-parallel gradient reduction (DDP all-reduce, or the distributed
  optimizer's reduce-scatter) runs ``overlap`` = in buckets during the backward (PyTorch DDP,
  Megatron-Core ``--overlap-grad-reduce``, FSDP) or ``after`` it, on the critical path (Megatron-LM
  2021, DeepSpeed's pipeline engine).
* ``fused``: softmax / dropout / norm / bias / activation each a fused kernel that reads and writes
  HBM once (Megatron's fused kernels, ``torch.compile``, Apex) or, unfused, one kernel per
  elementwise op, each reading and writing its operands (eager PyTorch: RMSNorm as cast, pow,
  mean, rsqrt, mul; SwiGLU as silu then mul; bias add, dropout and residual add apart).
* ``attention``: ``flash`` (FlashAttention / SDPA) or ``eager`` (scores and probabilities in HBM,
  batched GEMMs plus a memory-bound softmax); None keeps the model's own.
* ``attention_kernel``: which generation of FlashAttention kernel runs the attention matmuls:
  ``fa2`` (written for Ampere's ``mma.sync``: FlashAttention-2, PyTorch SDPA's flash and
  memory-efficient backends, xformers) or ``fa3`` (the architecture's native instructions:
  FlashAttention-3, cuDNN / Transformer Engine fused attention). On Hopper ``fa2`` runs at the GPU's
  ``mma_sync_fraction`` (2/3, FlashAttention-3 paper) of the rate ``fa3`` gets; on Ampere and older
  the two are the same.
* ``distributed_optimizer``: optimizer states sharded over data parallel (ZeRO-1): gradients
  reduce-scattered, parameters all-gathered after the step (overlapped with the next forward when
  ``dp_reduce`` is ``overlap``, as Megatron-Core's ``--overlap-param-gather``). It pins ZeRO-1
  for layouts that are not FSDP; None leaves the ZeRO stage to the layout or the search.
* ``grad_reduce_op``: how a stack with sharded optimizer states (ZeRO-1/2, not FSDP) reduces the
  gradients: ``reduce-scatter`` (Megatron's distributed optimizer, DeepSpeed ZeRO-2: each rank
  receives only the shard it updates) or ``all-reduce`` (DeepSpeed's BF16_Optimizer under its pipeline
  engine: the whole FP32 gradient buffer is all-reduced on every rank, ``get_grads_for_reduction``,
  then each rank steps its shard and the BF16 parameters are all-gathered): twice the gradient traffic.
* ``fsdp``: parameters sharded too (ZeRO-3 / FSDP), per-layer all-gather and reduce-scatter
  prefetched beside compute. True pins ZeRO-3, None leaves it to the search.
* ``float8``: the linear layers' GEMMs at the FP8 dense peak (torchao / Transformer Engine
  dynamic scaling: each operand cast to FP8 in a memory-bound pass); attention stays BF16.
* ``fp8_weight_cache``: under ``float8``, each weight is cast to FP8 (and transposed) once per step,
  on the first micro-batch, and the copy reused by the others: Transformer Engine's ``is_first_microbatch``,
  which Megatron-Core passes ("it allows caching of the FP8 versions of the weights", TE's ``Linear.forward``
  documentation). Off: every micro-batch casts every weight again (torchao's dynamic scaling).
* ``async_tp``: tensor-parallel communication overlapped with the GEMMs by decomposition (Megatron-Core's
  ``--tp-comm-overlap`` with Transformer Engine userbuffers; torchtitan's AsyncTP, PyTorch's
  micro-pipelined TP): each all-gather / reduce-scatter is cut into TP-degree chunks that travel while the
  GEMM works on the chunk before (the GEMMs run as TP-degree slices of the tokens); the last chunk of each
  reduce-scatter has no GEMM left beside it. Off: every TP collective on the critical path.
  ``tp_overlap`` says how: ``decomposed`` (the above) or ``concurrent`` (the collectives run beside other,
  independent work of the layer, as LLaMA's hand-written backward overlaps its all-reduces with the
  activations' computation, LLaMA sect. 2.4: no chunking, nothing left exposed by construction).
* ``nvls``: all-reduces within an NVSwitch 3 node (H100 / H200 HGX) reduce in the switch (NVLink SHARP),
  which NCCL >= 2.17 picks by default (``NCCL_NVLS_ENABLE=0`` turns it off): up to 480 GB/s bus bandwidth on
  8 GPUs against the ring's 370 (:mod:`trainperf.planner.parts`). No effect on parts without it.
* ``param_gather``: whether the distributed optimizer's parameter all-gather after the step overlaps the
  next forward (``overlap``: Megatron-Core's ``--overlap-param-gather``) or runs before it (``after``); None:
  as ``dp_reduce``.
* ``dp_bucket``: how the overlapped data-parallel reduction is bucketed, which sets what stays exposed: the
  last bucket (the first layers' and the embedding's gradients, ready when the backward ends) cannot
  overlap anything. ``ddp``: PyTorch DDP's ``bucket_cap_mb`` = 25 MB of gradients; ``megatron``:
  Megatron-Core's ``max(40M, 1M x DP)`` parameters per bucket (``DistributedDataParallel``, its default);
  ``ideal``: nothing left exposed (the model before issue 39; for comparison).
* ``sequence_parallel``: whether the stack has sequence parallelism at all. False: tensor-parallel
  layouts keep the norm / dropout / residual region's activations whole on every TP rank (Megatron-LM
  before Korthikanti et al. 2022): more activation memory and elementwise time. None: searched.
* ``recompute``: the activation-recompute kinds the stack implements (None: all). Megatron-LM 2021
  checkpoints whole layers, every layer or none; selective (attention-core) and block (some layers
  per stage) recompute came with Korthikanti et al. 2022.

Presets (``trainperf plan --stack NAME``) set them; a flag given beside a preset overrides the
preset's value. The default, ``default``, is the stack trainperf itself trains with: overlapped
DP reduction, fused elementwise kernels, FlashAttention through PyTorch SDPA, which on Hopper
picks cuDNN's native attention in the torch trainperf ships with (``fa3``; torch 2.5.1-2.10 used the
FlashAttention-2 code: ``--attention-kernel fa2``), the ZeRO stage searched.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from trainperf.errors import UserError

DP_REDUCE = ("overlap", "after")
DP_BUCKETS = ("ddp", "megatron", "ideal")
TP_OVERLAPS = ("decomposed", "concurrent")
RECOMPUTE_KINDS = ("none", "selective", "full", "partial")
ATTENTION_KERNELS = ("fa2", "fa3")
GRAD_REDUCE_OPS = ("reduce-scatter", "all-reduce")


@dataclass(frozen=True)
class Stack:
    name: str = "default"
    dp_reduce: str = "overlap"
    fused: bool = True
    attention: str | None = None
    attention_kernel: str = "fa3"
    distributed_optimizer: bool | None = None
    grad_reduce_op: str = "reduce-scatter"
    fsdp: bool | None = None
    float8: bool = False
    async_tp: bool = False
    tp_overlap: str = "decomposed"
    fp8_weight_cache: bool = False
    nvls: bool = True
    param_gather: str | None = None
    dp_bucket: str = "ddp"
    grad_bytes: float | None = None
    """Bytes per parameter of the replicated gradient buffer, when the stack keeps 16-bit gradients
    and moves the FP32 copy into the sharded optimizer part (DeepSpeed's BF16_Optimizer: 2); None:
    the constants' grad_bytes (Megatron's FP32 main grads, 4)."""
    fsdp_reduce_bytes: float | None = None
    """Bytes per gradient element in FSDP's per-layer reduce-scatter: 4 where the stack reduces in
    FP32 (torchtitan's default ``mixed_precision_reduce: float32``), 2 in BF16 (llm-foundry's PURE,
    FSDP1 ``MixedPrecision(reduce_dtype=bf16)``); None: the constants' fsdp_reduce_bytes (2)."""
    fsdp_copy_bytes: float = 0.0
    """HBM bytes per parameter element that ZeRO-3 copies around its collectives, per micro-batch and
    layer, forward and backward together: FSDP2 (torchtitan) all-gathers into one buffer and copies out
    into each parameter (read + write 2 bytes, in the forward and again in the backward's re-gather)
    and copies each gradient into the reduce-scatter buffer (read + write, in the reduce dtype):
    8 + 2 x reduce bytes. FSDP1 and DeepSpeed ZeRO-3 gather straight into a flat parameter whose
    views are the weights, and reduce the flat gradient in place: 0."""

    sequence_parallel: bool | None = None
    """False: the stack has no sequence parallelism (TP layouts keep the replicated region whole); True:
    every TP layout uses it; None: searched. ``--sequence-parallel`` / ``--no-sequence-parallel`` overrides it."""
    recompute: tuple[str, ...] | None = None
    """The recompute kinds the search may choose (of none, selective, full, partial); None: all of them.
    ``--recompute`` overrides it."""

    def __post_init__(self):
        if self.dp_reduce not in DP_REDUCE:
            raise UserError(f"--dp-reduce {self.dp_reduce!r}: choose one of {', '.join(DP_REDUCE)}")
        if self.attention not in (None, "flash", "eager"):
            raise UserError(f"--attention {self.attention!r}: choose flash or eager")
        if self.attention_kernel not in ATTENTION_KERNELS:
            raise UserError(f"--attention-kernel {self.attention_kernel!r}: choose one of {', '.join(ATTENTION_KERNELS)}")
        if self.param_gather not in (None,) + DP_REDUCE:
            raise UserError(f"--param-gather {self.param_gather!r}: choose one of {', '.join(DP_REDUCE)}")
        if self.tp_overlap not in TP_OVERLAPS:
            raise UserError(f"stack {self.name!r}: tp_overlap {self.tp_overlap!r}: choose one of {', '.join(TP_OVERLAPS)}")
        if self.dp_bucket not in DP_BUCKETS:
            raise UserError(f"stack {self.name!r}: dp_bucket {self.dp_bucket!r}: choose one of {', '.join(DP_BUCKETS)}")
        if self.grad_reduce_op not in GRAD_REDUCE_OPS:
            raise UserError(f"--grad-reduce-op {self.grad_reduce_op!r}: choose one of {', '.join(GRAD_REDUCE_OPS)}")
        bad = [k for k in self.recompute or () if k not in RECOMPUTE_KINDS]
        if bad or (self.recompute is not None and not self.recompute):
            raise UserError(f"stack {self.name!r}: recompute kinds {list(self.recompute)!r}: choose among "
                            f"{', '.join(RECOMPUTE_KINDS)}")

    @property
    def param_gather_mode(self) -> str:
        """How the distributed optimizer's parameter all-gather runs: ``param_gather``, else as ``dp_reduce``."""
        return self.param_gather or self.dp_reduce

    def mechanisms(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "name"}

    def zero_pin(self) -> int | None:
        """The ZeRO stage this stack implies (None: the layout's or the search's)."""
        if self.fsdp:
            return 3
        if self.distributed_optimizer:
            return 1
        if self.distributed_optimizer is False and self.fsdp is False:
            return 0
        return None


DEFAULT = Stack()

PRESETS: dict[str, tuple[Stack, str]] = {
    "default": (DEFAULT, "trainperf's own stack: DP reduction overlapped with the backward, fused "
                         "elementwise kernels, the model's attention kernel through PyTorch SDPA (fa3: on Hopper, torch >= "
                         "2.11 with cuDNN >= 9.15 prefers cuDNN attention), ZeRO stage searched"),
    "megatron-2021": (Stack("megatron-2021", dp_reduce="after", fused=True, attention="eager",
                            distributed_optimizer=False, fsdp=False, sequence_parallel=False,
                            recompute=("none", "full")),
                      "Megatron-LM 2021 (Narayanan et al.; MT-NLG): DP all-reduce after the backward, "
                      "eager attention (fused scale-mask-softmax), fused bias-GeLU / bias-dropout-add, "
                      "no distributed optimizer (ZeRO-0), no sequence parallelism, whole-layer "
                      "checkpointing of every layer or none (no selective or block recompute)"),
    "megatron-core": (Stack("megatron-core", dp_reduce="overlap", fused=True, attention="flash",
                            attention_kernel="fa3", distributed_optimizer=True, fsdp=False, async_tp=True,
                            fp8_weight_cache=True, param_gather="overlap", dp_bucket="megatron"),
                      "Megatron-Core with Transformer Engine as NVIDIA's performance configurations run it: "
                      "distributed optimizer (ZeRO-1) with the gradient reduce-scatter overlapped with the backward "
                      "(--overlap-grad-reduce) and the parameter all-gather with the forward "
                      "(--overlap-param-gather), in Megatron-Core's buckets; tensor-parallel communication "
                      "overlapped with the GEMMs (--tp-comm-overlap, userbuffers; --no-async-tp for Megatron-LM's "
                      "default); fused kernels; Transformer Engine's cuDNN fused attention (Hopper-native: fa3); "
                      "under --float8 Transformer Engine's FP8 weights cast once per step"),
    "fsdp": (Stack("fsdp", dp_reduce="overlap", fused=False, attention="flash", attention_kernel="fa2",
                   distributed_optimizer=False, fsdp=True),
             "PyTorch FSDP (ZeRO-3) in eager mode: per-layer all-gather / reduce-scatter prefetched beside "
             "compute, SDPA FlashAttention-2 (fa2: torch before 2.11 on Hopper; --attention-kernel fa3 where SDPA "
             "picks cuDNN), unfused elementwise ops (no torch.compile)"),
    "torchtitan": (Stack("torchtitan", dp_reduce="overlap", fused=False, attention="flash", attention_kernel="fa2",
                         distributed_optimizer=False, fsdp=True, fsdp_reduce_bytes=4.0, fsdp_copy_bytes=16.0,
                         sequence_parallel=True),
                   "torchtitan (FSDP2 + TP/PP/CP): FSDP2 per-layer collectives overlapped, SDPA "
                   "FlashAttention-2 (fa2, as in its published runs: PyTorch's context parallel had no cuDNN attention path then), gradients reduce-scattered in FP32, eager elementwise ops unless --fused "
                   "(torch.compile), sequence parallelism with every TP layout (its TP plan shards the norms); "
                   "--float8 and --async-tp as the runs enable them"),
}


def get_stack(name: str | None, **overrides) -> Stack:
    """A preset with the flags given beside it applied (a flag wins over the preset)."""
    key = name or "default"
    if key not in PRESETS:
        import difflib

        close = difflib.get_close_matches(key, PRESETS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise UserError(f"--stack {key!r} is not a preset{hint}; choose one of {', '.join(PRESETS)}")
    stack = PRESETS[key][0]
    given = {k: v for k, v in overrides.items() if v is not None}
    return replace(stack, **given) if given else stack


def provenance(name: str | None, overrides: dict) -> dict:
    """Where each mechanism's value came from: 'flag', 'preset NAME' or 'default'."""
    key = name or "default"
    out = {}
    for f in fields(Stack):
        if f.name == "name":
            continue
        if overrides.get(f.name) is not None:
            out[f.name] = "flag"
        elif key != "default":
            out[f.name] = f"preset {key}"
        else:
            out[f.name] = "default"
    return out
