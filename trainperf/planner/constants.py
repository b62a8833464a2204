"""Every constant of the planner's cost model, named, documented and overridable.

Override on the command line with ``trainperf plan --set-constant NAME=VALUE`` (repeatable) or
in code with ``dataclasses.replace(DEFAULTS, name=value)``. ``trainperf plan --constants``
lists them. ``--calibrate RUN_DIR`` and ``--measured STEP_TIME_S`` replace ``stack_efficiency`` by the one a
real run measured (see :mod:`trainperf.planner.calibrate`).

The defaults are physically motivated and few; none is fitted to a single published run:
the bandwidth fractions come from measurements of one kernel or one collective, the byte counts
from the data types of mixed-precision training. Three are FITTED (marked so below) on the
development set (docs/benchmarks/planner.md; ``python -m trainperf.planner.loso``), by
leave-one-source-out cross-validation; the per-GPU GEMM ceiling and NCCL's bandwidths are published figures
(:mod:`trainperf.planner.parts`), NCCL's latencies its own cost model (:mod:`trainperf.planner.kernels`).
"""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass, fields, replace

from trainperf.errors import UserError


RATE_CONSTANTS = {"stack_efficiency": "the GEMM rate", "attention_efficiency": "the attention matmuls' rate",
                  "hbm_fraction": "the HBM bandwidth", "nvlink_fraction": "the NVLink bandwidth",
                  "internode_fraction": "the network bandwidth"}
"""Constants that multiply a rate: 0 would make a step take forever (a division by zero)."""


_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")
FRACTIONS = ("stack_efficiency", "attention_efficiency", "comm_contention", "wave_quantization", "published_gemm",
             "published_fabric", "nccl_tuning")
"""Constants that are a share of something (at most 1), besides the *_fraction / *_overlap ones."""
MIN_RATE = 1e-3


def _upper(name: str) -> float:
    """The largest value a constant can take and still describe a GPU and a training stack."""
    if name.endswith("_s"):
        return 1.0  # a second per kernel launch or per collective
    if name.endswith("_bytes") or name == "loss_bytes_per_logit":
        return 1024.0
    if name.endswith("_gib"):
        return 1e4
    return 1e3


@dataclass(frozen=True)
class Constants:
    # ------------------------------------------------------------- compute (3 fitted constants)
    stack_efficiency: float = 1.0
    """Fraction of the GPU's sustained GEMM rate (catalog gemm_fraction x dense peak) that the
    training stack's large matmuls reach. 1.0: when fitted on the development set it went to its
    bound 1.0 in every fold, so it is fixed there; it is what --measured / --calibrate fit to a
    user's own stack (launch gaps, host overhead, a slower kernel library)."""
    gemm_memory_weight: float = 1.304
    """FITTED (development set, all sources; per-fold values in BENCHMARKS.md). Soft roofline of
    one GEMM: time = FLOPs / rate + w x operand bytes / HBM bandwidth: the cost of operand and
    result traffic, tile fill and epilogue not hidden behind the math. Through the
    peak/bandwidth ratio small GEMMs lose more on an H100 (295 FLOP/B) than on an A100 (153)."""
    attention_efficiency: float = 0.4162
    """FITTED. Fraction of the sustained GEMM rate FlashAttention's matmuls reach (causal blocks
    only), before the softmax cost below, with the kernel native to the GPU (FlashAttention-2 on
    Ampere, ``fa3`` on Hopper); an ``fa2`` kernel on Hopper gets the catalog's ``mma_sync_fraction``
    (2/3) of it on top: a published hardware figure, not fitted."""
    comm_contention: float = 0.6436
    """FITTED (all sources; 0.61-0.65 across the leave-one-source-out folds, and weakly identified:
    the fit moves with its starting point). While a collective overlaps compute, the compute slows
    by this fraction of the overlapped time (NCCL kernels take SMs and HBM bandwidth; FSDP's rate
    limiter and stream waits): FSDP's per-layer collectives and the DDP / ZeRO-1/2 bucketed
    reduction alike (before issue 22 only FSDP's, and the fit then went to its bound 1.0)."""
    softmax_ops_per_score: float = 8.0
    """Non-tensor-core operations per attention score in FlashAttention's forward (scale, max,
    subtract, exp, sum, rescale; backward twice): runs at the FP32 (vector) peak, which makes
    small head dims slower (cost relative to the 4 x head_dim matmul FLOPs per score). Counted,
    not fitted."""
    hbm_fraction: float = 0.90
    """Fraction of HBM bandwidth reached by memory-bound kernels (softmax, norms, activations,
    optimizer). Measured device-to-device copy on H200: 4.3 of 4.8 TB/s (REFERENCE.md)."""
    kernel_overhead_s: float = 5e-6
    """Fixed cost per kernel launch (launch + tail), seconds."""

    # ------------------------------------------------------------- communication
    nvlink_fraction: float = 0.80
    """NCCL bus bandwidth reached on NVLink as a fraction of one direction of the quoted total
    (DGX A100: ~235 of 300 GB/s in nccl-tests all_reduce_perf for messages >= 64 MB)."""
    internode_fraction: float = 0.80
    """NCCL bus bandwidth reached across nodes as a fraction of the NIC rate. A group with g
    members per node uses g NICs at once (one per GPU, rail-optimized), so its bus bandwidth is
    g x per-GPU NIC rate x this, capped by NVLink."""
    collective_latency_s: float = 20e-6
    """Start-up latency of a pipeline send / receive, seconds (and of a collective per log2 of its ranks when
    nccl_tuning is 0)."""
    nccl_tuning: float = 1.0
    """1: a collective's latency is NCCL's own cost model (src/graph/tuning.cc: a base plus a per-step latency by
    protocol, link and algorithm; a ring of n ranks takes n - 1 steps), the fastest protocol for its bytes; 0:
    collective_latency_s per log2 of the ranks."""
    p2p_overlap: float = 0.0
    """Fraction of pipeline send/receive time hidden behind compute (0: blocking p2p)."""
    wave_quantization: float = 1.0
    """1: GEMM time counts wave quantization (256 x 128 output tiles over the GPU's SMs, see
    trainperf.planner.kernels); 0: ideal tiling. Counted, not fitted."""
    published_gemm: float = 1.0
    """1: a part's GEMM ceiling is its published maximum achievable matmul FLOPS (trainperf.planner.parts:
    A100 85.9%, H100 80.1% of the dense peak) where there is one; 0: the catalog's gemm_fraction."""
    published_fabric: float = 1.0
    """1: NCCL bandwidths of a part's fabric as published (trainperf.planner.parts: the ring's 370 GB/s on
    NVLink 4, 47 GB/s per NDR NIC); 0: nvlink_fraction and internode_fraction of the catalog's link rates
    everywhere. (NVLink SHARP all-reduce is the stack's nvls mechanism.)"""

    # ------------------------------------------------------------- memory (bytes per parameter)
    param_bytes: float = 2.0
    """BF16/FP16 weights (all-gathered by FSDP in this dtype)."""
    grad_bytes: float = 4.0
    """FP32 gradient accumulation buffer (Megatron; 2 with BF16 gradients)."""
    optimizer_bytes: float = 12.0
    """FP32 master weights + Adam m and v (the ZeRO paper's K=12). Under ZeRO-3/FSDP the fp32
    master is the sharded parameter itself: 4 (param) + 4 (grad) + 8 (Adam) bytes, sharded."""
    dp_grad_comm_bytes: float = 4.0
    """Bytes per gradient element in the DDP / ZeRO-1/2 reduction (FP32 reduce, Megatron)."""
    fsdp_reduce_bytes: float = 2.0
    """Bytes per gradient element in FSDP's per-layer reduce-scatter (bf16: FSDP2's default
    reduce dtype is the parameter dtype; llm-foundry's PURE mixed precision)."""
    optimizer_traffic_bytes: float = 42.0
    """HBM bytes touched per (local) parameter by the optimizer step: Adam reads the FP32 grad,
    master, m, v (16) and writes master, m, v and the BF16 weight (14); grad-norm and clipping
    read and scale the gradient (12)."""
    loss_bytes_per_logit: float = 6.0
    """Bytes per logit (b x s x V / t) held at the loss: the bf16 logits plus the fp32 log-softmax
    a standard cross-entropy keeps for backward (its fp32 upcast of the logits is transient). A
    fused / chunked cross-entropy needs less: override."""
    memory_reserved_gib: float = 2.0
    """Device memory not available to the model: CUDA context, NCCL and cuBLAS workspaces,
    allocator fragmentation (GiB)."""

    def with_overrides(self, items) -> "Constants":
        """Apply ``NAME=VALUE`` strings; unknown names are rejected with the nearest valid one."""
        values = {}
        names = [f.name for f in fields(self)]
        for item in items or ():
            if "=" not in item:
                raise UserError(f"--set-constant {item!r}: expected NAME=VALUE, e.g. --set-constant nvlink_fraction=0.7")
            name, raw = (part.strip() for part in item.split("=", 1))
            if name not in names:
                close = difflib.get_close_matches(name, names, n=1)
                hint = f"did you mean {close[0]!r}? " if close else ""
                raise UserError(f"--set-constant {name!r} is not a planner constant; {hint}see `trainperf plan --constants`")
            try:
                value = float(raw)
            except ValueError:
                raise UserError(f"--set-constant {name}={raw!r}: the value must be a number") from None
            if math.isfinite(value) and not _NUMBER.fullmatch(raw):  # float() also reads "1_0" as 10
                raise UserError(f"--set-constant {name}={raw!r}: the value must be a plain number, e.g. 0.7 or 2e-5")
            if not math.isfinite(value) or value < 0:
                raise UserError(f"--set-constant {name}={raw}: must be a finite number >= 0")
            if name in RATE_CONSTANTS and value == 0:
                raise UserError(f"--set-constant {name}={raw}: must be above 0 (it scales a rate the step time is "
                                f"divided by: {RATE_CONSTANTS[name]}); the default is {getattr(self, name):g}")
            if (name.endswith(("_fraction", "_overlap")) or name in FRACTIONS) and value > 1:
                raise UserError(f"--set-constant {name}={value}: a fraction must be between 0 and 1")
            if name in RATE_CONSTANTS and value < MIN_RATE:
                raise UserError(f"--set-constant {name}={raw}: below {MIN_RATE:g}, a GPU would run over a thousand "
                                f"times slower than its catalog rates; the default is {getattr(self, name):g}")
            hi = _upper(name)
            if value > hi:
                raise UserError(f"--set-constant {name}={raw}: above {hi:g}, no GPU or stack the model describes; "
                                f"the default is {getattr(self, name):g}")
            values[name] = value
        return replace(self, **values)

    def describe(self) -> list[tuple[str, float, str]]:
        """(name, value, first line of its docstring) for every constant."""
        docs = _field_docs()
        return [(f.name, getattr(self, f.name), docs.get(f.name, "")) for f in fields(self)]

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def _field_docs() -> dict[str, str]:
    """Attribute docstrings, read from this module's source (first sentence)."""
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(Constants))
    docs: dict[str, str] = {}
    body = tree.body[0].body
    for node, nxt in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(nxt, ast.Expr) and isinstance(getattr(nxt, "value", None), ast.Constant):
            text = " ".join(str(nxt.value.value).split())
            docs[node.target.id] = text
    return docs


DEFAULTS = Constants()
