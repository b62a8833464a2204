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

from trainperf.errors import ConfigError

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

    # parameter counts, exactly as trainperf.models.gpt builds them
    def layer_params(self) -> tuple[int, int]:
        """(numel, tensors) of one block."""
        h, b = self.n_embd, int(self.bias)
        numel = 4 * (h * h + b * h) + (4 * h * h + b * 4 * h) + (4 * h * h + b * h) + 2 * (h + b * h)
        tensors = (4 + 2 + 2) * (1 + b)
        return numel, tensors

    def other_params(self) -> tuple[int, int, int]:
        """(embeddings numel, final norm + lm_head numel, tensors)."""
        h, b = self.n_embd, int(self.bias)
        emb = self.vocab_size * h + self.block_size * h
        head = (h + b * h) + self.vocab_size * h
        return emb, head, 2 + (1 + b) + 1


@dataclass(frozen=True)
class Plan:
    """A checkpointing plan in counts: blocks fully checkpointed, blocks under selective."""

    n_full: int = 0
    n_selective: int = 0

    def describe(self) -> str:
        if self.n_full == 0 and self.n_selective == 0:
            return "no checkpointing"
        parts = []
        if self.n_full:
            parts.append(f"{self.n_full} block(s) fully checkpointed")
        if self.n_selective:
            parts.append(f"{self.n_selective} block(s) selective")
        return ", ".join(parts)


def plan_of(mode: str, n_layer: int, *, ratio: float = 0.25, every_k: int = 4) -> Plan:
    from trainperf.memory.ac import plan_kinds

    kinds = plan_kinds(mode, n_layer, ratio=ratio, every_k=every_k)
    return Plan(kinds.count("full"), kinds.count("selective"))


# --------------------------------------------------------------------------- GPT activations
def _gpt_layer_terms(shape: GPTShape, b: int, s: int, e: int, device: str = "cpu") -> dict[str, dict[str, float]]:
    """Bytes one block leaves for backward, per kind of checkpointing, split by how the tensor is
    sharded under TP ("rep": replicated across TP ranks unless sequence parallel, "tp": split).

    Attention: with dropout == 0 (or on CUDA) SDPA runs a fused kernel that keeps q, k, v, its
    output and a log-sum-exp. With dropout > 0 on CPU the fused kernel does not apply and SDPA
    falls back to the math path, which keeps contiguous copies of q, k, v, the s x s probabilities,
    their dropout mask and dropped output (Korthikanti's 5as/h term, in this model's dtypes).
    Dropout masks: the input's dtype on CPU (ATen's unfused dropout), 1 byte on CUDA (fused).
    """
    h, a, f = shape.n_embd, shape.n_head, 4 * shape.n_embd
    tok = b * s
    auto = e == 2
    drop = shape.dropout > 0
    math_attn = drop and device != "cuda"
    mask = (e if device != "cuda" else 1) if drop else 0
    x = 4 * tok * h  # the block input (fp32 residual stream: parameters are fp32)
    stats = 2 * 2 * 4 * tok  # mean and rstd of two layer norms (fp32)
    lse = 4 * tok * a  # SDPA log-sum-exp (fp32), fused kernels only
    scores = tok * a * s  # elements of the s x s attention probabilities
    none_rep = x + 4 * tok * h + stats  # block input, residual after attention (x1), LN statistics
    # Inputs of the linears: under autocast each linear casts its input (q, k, v cast ln_1's output
    # three times); in fp32 they share ln_1's / ln_2's output.
    none_rep += (3 + 1) * e * tok * h if auto else 2 * 4 * tok * h
    none_rep += 2 * mask * tok * h  # masks of the two residual dropouts
    if math_attn:
        # q, k, v copies, probabilities + mask + dropped probabilities, attention output copy
        # (CPU autocast runs this math attention in fp32: measured, not in Korthikanti.)
        ea = 4 if device != "cuda" else e
        attn = 3 * ea * tok * h + 3 * ea * scores + ea * tok * h
        attn_sel = ea * scores + ea * tok * h  # bmm outputs: scores and probabilities @ v
    else:
        attn = 3 * e * tok * h + e * tok * h + lse  # q, k, v (projection outputs), SDPA output
        attn_sel = e * tok * h + lse
    none_tp = attn + 2 * e * tok * f  # + fc output (GELU input) and GELU output (proj input)
    weights = 2 * (4 * h * h + 2 * h * f) if auto else 0  # autocast's 16-bit weight copies
    # Selective: the block input plus every matmul / attention output (q, k, v, o, fc, proj).
    sel_tp = 3 * e * tok * h + attn_sel + e * tok * h + e * tok * f + e * tok * h
    return {
        "none": {"rep": none_rep, "tp": none_tp, "weights": weights},
        "selective": {"rep": x, "tp": sel_tp, "weights": 0},
        "full": {"rep": x, "tp": 0, "weights": 0},
    }


def _gpt_outside_terms(shape: GPTShape, b: int, s: int, e: int, device: str = "cpu") -> dict[str, float]:
    """Bytes outside the blocks: embeddings, the final norm, the head and the loss."""
    h, v = shape.n_embd, shape.vocab_size
    tok = b * s
    auto = e == 2
    first = 8 * s  # position ids (int64)
    if shape.dropout > 0:
        first += (4 if device != "cuda" else 1) * tok * h  # embedding dropout mask (fp32 embeddings)
    last = 4 * tok * h + 2 * 4 * tok  # final norm input (last block's output) and statistics
    last += (2 if auto else 4) * tok * h  # lm_head input (16-bit cast under autocast)
    last += 4 * tok * v + 4  # fp32 log-softmax output kept by cross-entropy; its total weight
    weights = 2 * v * h if auto else 0  # autocast copy of the lm_head weight
    return {"first": first, "last": last, "weights": weights}


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
    numel_fsdp = numel / sharding.fsdp
    n_tensors = layers_here * layer_tensors + other_tensors
    params = int(4 * numel_fsdp)
    grads = int(4 * numel_fsdp)
    opt = int(optimizer_bytes_per_param(optimizer) * numel_fsdp)
    if optimizer in ("adamw", "adam", "fused_adam"):
        opt += 4 * n_tensors  # the per-tensor step counter

    # --- activations: blocks of this stage, each in the plan's kind, times micro-batches in flight
    terms = _gpt_layer_terms(shape, micro_batch, s, e, device)
    rep_div = t if sharding.sp else 1

    def per_layer(kind: str) -> float:
        tm = terms[kind]
        return tm["rep"] / rep_div + tm["tp"] / t + tm["weights"] / t

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


# --------------------------------------------------------------------------- budget / fit
def max_micro_batch(estimate_at, budget_bytes: int, *, upper: int = 1 << 16) -> int:
    """Largest micro-batch ``b`` with ``estimate_at(b).total <= budget_bytes`` (0 if none).
    ``estimate_at`` must be monotone in b."""
    if estimate_at(1).total > budget_bytes:
        return 0
    lo, hi = 1, 2
    while hi <= upper and estimate_at(hi).total <= budget_bytes:
        lo, hi = hi, hi * 2
    if hi > upper:
        return lo
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if estimate_at(mid).total <= budget_bytes:
            lo = mid
        else:
            hi = mid
    return lo


def budget_candidates(n_blocks: int) -> list[Plan]:
    """Plans from least to most recompute: none, selective everywhere, then k fully checkpointed
    blocks with the others selective, then k+1 blocks fully checkpointed ... up to all of them.
    Selective recompute (norms, GELU, adds) is taken as cheaper than any full block's recompute."""
    out = [Plan(0, 0), Plan(0, n_blocks)]
    for k in range(1, n_blocks + 1):
        out.append(Plan(k, 0))
        if k < n_blocks:
            out.append(Plan(k, n_blocks - k))
    return out


@dataclass(frozen=True)
class BudgetChoice(Plan):
    estimate: MemoryEstimate | None = None

    def describe(self) -> str:
        text = Plan.describe(self)
        if self.estimate is not None:
            text += f" (estimate {self.estimate.total / GB:.3f} GB)"
        return text


def choose_plan(estimate_for, n_blocks: int, budget_bytes: int, *, what: str = "",
                suggest_micro_batch=None) -> BudgetChoice:
    """The least-recompute plan whose estimated total fits ``budget_bytes``.
    ``estimate_for(plan) -> MemoryEstimate``. Raises ConfigError naming the minimum otherwise."""
    for plan in budget_candidates(n_blocks):
        est = estimate_for(plan)
        if est.total <= budget_bytes:
            return BudgetChoice(plan.n_full, plan.n_selective, est)
    floor = estimate_for(Plan(n_blocks, 0))
    hint = ""
    if suggest_micro_batch is not None:
        b = suggest_micro_batch()
        if b > 0:
            hint = f", or lower train.micro_batch to {b} (fits with mode=full)"
        else:
            hint = (f"; model states alone take {floor.states / GB:.3f} GB, so also shard them "
                    "(parallelism.data_shard) or use a smaller model")
    raise ConfigError(
        f"memory.checkpointing.budget_gb={budget_bytes / GB:g} is below the minimum possible{what}: "
        f"{floor.total / GB:.3f} GB with mode=full (every block checkpointed: model states "
        f"{floor.states / GB:.3f} GB + activations {floor.activations / GB:.3f} GB); raise budget_gb to at "
        f"least {floor.total / GB:.3f}{hint}"
    )


def plan_for_budget(model, *, budget_bytes: int, micro_batch: int | None, seq_len: int | None,
                    dtype: str = "fp32", optimizer: str = "adamw", example_batch=None,
                    n_blocks: int | None = None) -> BudgetChoice:
    """Budget mode for :func:`trainperf.memory.ac.apply_ac`: formula for the reference GPT,
    traced estimate (needs ``example_batch``) for any other model."""
    from trainperf.models.gpt import GPT

    if isinstance(model, GPT):
        if not micro_batch:
            raise ConfigError("memory.checkpointing.mode=budget needs the micro-batch (train.micro_batch) to estimate")
        shape = GPTShape.of(model.cfg)
        s = seq_len or shape.block_size

        def at(plan, b=micro_batch):
            return estimate_gpt(shape, micro_batch=b, seq_len=s, dtype=dtype, plan=plan, optimizer=optimizer)

        def fit_full():
            return max_micro_batch(lambda b: at(Plan(shape.n_layer, 0), b), budget_bytes)

        return choose_plan(at, shape.n_layer, budget_bytes, suggest_micro_batch=fit_full,
                           what=f" at micro_batch={micro_batch}, seq_len={s}, {dtype}")
    if example_batch is None:
        raise ConfigError(
            "memory.checkpointing.mode=budget on a model that is not trainperf's GPT needs a sample batch to trace; "
            "pass example_batch=(idx, targets) to apply_ac, or choose mode=ratio/full/selective"
        )
    from trainperf.memory.trace import estimate_traced, trace_profile

    prof = trace_profile(model, example_batch, dtype=dtype)
    b = micro_batch or example_batch[0].shape[0]

    def at_traced(plan, bb=b):
        return estimate_traced(prof, micro_batch=bb, plan=plan, optimizer=optimizer)

    def fit_full_traced():
        return max_micro_batch(lambda bb: at_traced(Plan(prof.n_blocks, 0), bb), budget_bytes)

    return choose_plan(at_traced, prof.n_blocks, budget_bytes, suggest_micro_batch=fit_full_traced,
                       what=f" at micro_batch={b}, {dtype}")
