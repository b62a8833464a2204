"""Memory estimate per rank: parameters, gradients, optimizer states, activations.

Two estimators share one result type (:class:`MemoryEstimate`):

* :func:`estimate_gpt`: closed-form bytes for the reference GPT, Korthikanti et al. 2022
  (Table 2) adapted to this model: fused attention (SDPA keeps q, k, v, its output and a
  log-sum-exp, no s^2 score matrix), GELU MLP of width 4h, dropout masks only when dropout > 0,
  fp32 residual stream under autocast (parameters stay fp32), autocast's 16-bit copies of the
  weights and of each linear layer's input, and the logits/loss term (the fp32 log-softmax of
  B x s x V is often the largest single tensor of a small model). No model is built.
* :func:`estimate_traced`: any model, from one traced forward at micro-batch 1 and 2 per block
  (linear in the micro-batch), see :mod:`trainperf.memory.trace`.

Sharding degrees are explicit (:class:`Sharding`: tp, pp, dp, fsdp, sequence parallel,
pipeline micro-batches in flight). Only degree 1 is checked against measurement here; the
degree > 1 arithmetic follows REFERENCE.md (TP/SP per-layer split, 1F1B in-flight micro-batches,
FSDP full shard of model states) and is for the distributed work to verify.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trainperf.analytic.activations import layer_terms, outside_terms, per_layer_bytes, precision_for
from trainperf.analytic.spec import TransformerSpec
from trainperf.analytic.states import FP32_ADAM, StateBytes
from trainperf.errors import ConfigError
from trainperf.memory.plan import Plan

DTYPES = ("fp32", "tf32", "bf16", "fp16")
GB = 1e9


def act_bytes(dtype: str) -> int:
    """Bytes per element of matmul outputs: 2 under bf16/fp16 autocast, else 4."""
    if dtype not in DTYPES:
        raise ConfigError(f"precision.dtype={dtype!r} is not one of {', '.join(DTYPES)}")
    return 2 if dtype in ("bf16", "fp16") else 4


def optimizer_bytes_per_param(optimizer: str) -> int:
    """fp32 optimizer states per parameter: Adam/AdamW 2 moments, SGD(momentum) 1 buffer."""
    if optimizer in ("adamw", "adam", "fused_adam"):
        return 8
    if optimizer == "sgd":
        return 4
    raise ConfigError(f"optimizer.type={optimizer!r} unknown to the memory estimator; use adamw, adam or sgd")


@dataclass(frozen=True)
class Sharding:
    """Parallel degrees seen by one rank (defaults: a single process)."""

    tp: int = 1
    """Tensor-parallel degree."""
    pp: int = 1
    """Pipeline stages."""
    dp: int = 1
    """Data-parallel replicas (DDP: replicates everything, divides nothing)."""
    fsdp: int = 1
    """FSDP full-shard degree: divides parameters, gradients and optimizer states."""
    sp: bool = False
    """Sequence parallelism (with tp > 1): also shards norms, residuals and dropout along s."""
    microbatches: int = 1
    """Pipeline micro-batches per step; under 1F1B the first stage holds min(pp, this) in flight."""

    def in_flight(self) -> int:
        return min(self.pp, self.microbatches) if self.pp > 1 else 1


@dataclass
class MemoryEstimate:
    """Per-rank bytes. ``activations`` are the bytes the autograd graph holds after the forward."""

    params: int
    grads: int
    optimizer: int
    activations: int
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer + self.activations

    @property
    def states(self) -> int:
        return self.params + self.grads + self.optimizer

    def as_dict(self) -> dict[str, int]:
        return {"params": self.params, "grads": self.grads, "optimizer": self.optimizer,
                "activations": self.activations, "total": self.total}


@dataclass(frozen=True)
class GPTShape:
    n_layer: int
    n_head: int
    n_embd: int
    vocab_size: int
    block_size: int
    dropout: float = 0.0
    bias: bool = True

    @classmethod
    def of(cls, gcfg) -> "GPTShape":
        return cls(gcfg.n_layer, gcfg.n_head, gcfg.n_embd, gcfg.vocab_size, gcfg.block_size,
                   gcfg.dropout, gcfg.bias)

    def spec(self, seq_len: int | None = None) -> TransformerSpec:
        """trainperf's GPT as the analytic spec: learned positions, untied head, LayerNorm,
        separate Q/K/V projections, SDPA attention."""
        return TransformerSpec(hidden=self.n_embd, layers=self.n_layer, heads=self.n_head,
                               seq=seq_len or self.block_size, vocab=self.vocab_size, tied=False,
                               position="learned", max_positions=self.block_size, bias=self.bias,
                               norm="layernorm", attention="flash", name="gpt")

    # parameter counts, exactly as trainperf.models.gpt builds them
    def layer_params(self) -> tuple[int, int]:
        """(numel, tensors) of one block."""
        b = int(self.bias)
        return self.spec().layer_params(), (4 + 2 + 2) * (1 + b)

    def other_params(self) -> tuple[int, int, int]:
        """(embeddings numel, final norm + lm_head numel, tensors)."""
        spec = self.spec()
        return spec.embedding_params(), spec.head_params(), 2 + (1 + int(self.bias)) + 1


# --------------------------------------------------------------------------- GPT activations
def _gpt_layer_terms(shape: GPTShape, b: int, s: int, e: int, device: str = "cpu") -> dict[str, dict[str, float]]:
    """Bytes one block leaves for backward, per kind of checkpointing (:func:`trainperf.analytic.layer_terms`
    for this model: fp32 parameters, autocast under bf16/fp16, separate Q/K/V projections).

    Attention: with dropout == 0 (or on CUDA) SDPA runs a fused kernel that keeps q, k, v, its
    output and a log-sum-exp. With dropout > 0 on CPU the fused kernel does not apply and SDPA
    falls back to the math path, which keeps contiguous copies of q, k, v, the s x s probabilities,
    their dropout mask and dropped output (Korthikanti's 5as/h term, in this model's dtypes).
    Dropout masks: the input's dtype on CPU (ATen's unfused dropout), 1 byte on CUDA (fused).
    """
    prec = precision_for("bf16" if e == 2 else "fp32", device=device)
    return layer_terms(shape.spec(s), b, s, prec, dropout=shape.dropout > 0, qkv_casts=3, device=device)


def _gpt_outside_terms(shape: GPTShape, b: int, s: int, e: int, device: str = "cpu") -> dict[str, float]:
    """Bytes outside the blocks: embeddings, the final norm, the head and the loss."""
    prec = precision_for("bf16" if e == 2 else "fp32", device=device)
    return outside_terms(shape.spec(s), b, s, prec, dropout=shape.dropout > 0)


def estimate_gpt(shape: GPTShape, *, micro_batch: int, seq_len: int | None = None, dtype: str = "fp32",
                 plan: Plan = Plan(), optimizer: str = "adamw", sharding: Sharding = Sharding(),
                 device: str = "cpu") -> MemoryEstimate:
    """Closed-form per-rank estimate for the reference GPT (see module doc). ``device`` matters
    only with dropout (which kernels run)."""
    s = seq_len or shape.block_size
    if s > shape.block_size:
        raise ConfigError(f"sequence length {s} exceeds model.block_size={shape.block_size}; lower it")
    e = act_bytes(dtype)
    L = shape.n_layer
    t, p = sharding.tp, sharding.pp
    if plan.n_full + plan.n_selective > L:
        raise ConfigError(f"plan {plan} names more blocks than the model's {L}")

    # --- model states (fp32 master parameters and gradients; states of the first pipeline stage)
    layer_numel, layer_tensors = shape.layer_params()
    emb, head, other_tensors = shape.other_params()
    layers_here = -(-L // p)
    numel = layers_here * layer_numel / t + (emb + (head if p == 1 else 0)) / t
    n_tensors = layers_here * layer_tensors + other_tensors
    states = StateBytes(FP32_ADAM.param, FP32_ADAM.grad, optimizer_bytes_per_param(optimizer))
    split = states.split(numel, zero=3 if sharding.fsdp > 1 else 0, shard=sharding.fsdp)
    params, grads, opt = int(split["param"]), int(split["grad"]), int(split["optimizer"])
    if optimizer in ("adamw", "adam", "fused_adam"):
        opt += 4 * n_tensors  # the per-tensor step counter

    # --- activations: blocks of this stage, each in the plan's kind, times micro-batches in flight
    terms = _gpt_layer_terms(shape, micro_batch, s, e, device)
    rep_div = t if sharding.sp else 1

    def per_layer(kind: str) -> float:
        return per_layer_bytes(terms, kind, tp=t, sp=sharding.sp)

    # Spread the plan over the stages proportionally (the plan's blocks are spread evenly).
    frac = layers_here / L
    n_full = plan.n_full * frac
    n_sel = plan.n_selective * frac
    n_none = layers_here - n_full - n_sel
    blocks_bytes = n_none * per_layer("none") + n_sel * per_layer("selective") + n_full * per_layer("full")
    outside = _gpt_outside_terms(shape, micro_batch, s, e, device)
    first_stage = blocks_bytes * sharding.in_flight() + outside["first"] * sharding.in_flight()
    if p == 1:
        acts = first_stage + (outside["last"] / rep_div) + outside["weights"] / t
    else:
        last_stage = blocks_bytes + outside["last"] / rep_div + outside["weights"] / t
        acts = max(first_stage, last_stage)
    detail = {
        "per_layer_bytes": {k: int(per_layer(k)) for k in ("none", "selective", "full")},
        "outside_bytes": {k: int(v) for k, v in outside.items()},
        "plan": plan.describe(),
        "method": "formula (Korthikanti 2022 Table 2, adapted to trainperf's GPT)",
    }
    return MemoryEstimate(params, grads, opt, int(acts), detail)
