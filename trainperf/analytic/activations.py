"""Activation bytes of one transformer layer and of what lies outside the layers (no torch).

Korthikanti et al. 2022 (Table 2) written per tensor, so that one account serves every precision
and kernel: the memory estimate of the reference GPT (fp32 parameters under autocast, measured on
CPU by :mod:`trainperf.memory.measure`) and the planner (bf16 weights, FlashAttention or
Megatron's eager attention). Each term is the bytes a forward leaves for backward.

Per layer and micro-batch, split by how the tensor shards under tensor parallelism: ``rep``
(replicated across TP ranks unless sequence parallel: block input, residual, norm inputs/outputs,
dropout masks), ``tp`` (split by TP: Q/K/V, attention, MLP), ``weights`` (autocast's 16-bit weight
copies, split by TP). Kinds: ``none``; ``selective`` (op level, trainperf's policy: matmul and
attention outputs kept, the rest recomputed); ``attention`` (Megatron's selective recompute: the
attention core recomputed, so no s x s tensor is kept); ``full`` (the block input only).

Attention kernels: ``flash`` keeps Q, K, V, the output and a log-sum-exp (fp32, per head and
token), never the s x s scores; ``eager`` keeps the softmax output and, with dropout, its mask and
the dropped probabilities (Korthikanti's 5as/h term for 16-bit with a 1-byte mask).
"""

from __future__ import annotations

from dataclasses import dataclass

from trainperf.analytic.spec import TransformerSpec


@dataclass(frozen=True)
class Precision:
    """Bytes of the tensors a forward keeps."""

    compute: int = 2
    """Matmul outputs (2 under bf16/fp16, 4 in fp32)."""
    residual: int = 2
    """Residual stream, norm inputs and outputs: the parameters' dtype (4 when fp32 parameters run
    under autocast, 2 for bf16 weights)."""
    autocast_copies: bool = False
    """Autocast casts each linear's input and weight to 16 bits (fp32 parameters): the casts are
    kept for backward."""
    attention: int = 2
    """Bytes of eager attention's tensors (CPU autocast runs math attention in fp32: 4)."""
    mask: int = 1
    """Bytes per dropout-mask element (1 on CUDA's fused dropout, the input's dtype on CPU)."""


BF16 = Precision()
"""Pure bf16 weights (Megatron's fp16/bf16 params with fp32 master copy in the optimizer, FSDP
param_dtype=bf16): 2-byte activations everywhere."""


def precision_for(dtype: str, *, device: str = "cuda", params_fp32: bool = True) -> Precision:
    """Precision of a trainperf run: ``dtype`` (fp32/tf32/bf16/fp16) with fp32 parameters under
    autocast (the trainer's default) or 16-bit parameters."""
    e = 2 if dtype in ("bf16", "fp16") else 4
    residual = 4 if params_fp32 else e
    return Precision(compute=e, residual=residual, autocast_copies=(e == 2 and params_fp32),
                     attention=4 if device != "cuda" and params_fp32 else e,
                     mask=1 if device == "cuda" else e)


def layer_terms(spec: TransformerSpec, b: int, s: int, prec: Precision = BF16, *, dropout: bool = False,
                qkv_casts: int = 3, device: str = "cuda") -> dict[str, dict[str, float]]:
    """Bytes one layer leaves for backward, per kind (module doc).

    ``qkv_casts``: how many times autocast casts the first norm's output (3 for separate Q/K/V
    projections as in trainperf's GPT, 1 for a fused QKV). ``device`` matters only for eager math
    attention, which the CPU takes whenever dropout is on.
    """
    h, a, f, kvd, q = spec.hidden, spec.heads, spec.ffn, spec.kv_dim, spec.q_dim
    e, r = prec.compute, prec.residual
    tok = b * s
    mask = prec.mask if dropout else 0
    eager = spec.attention == "eager" or (dropout and device != "cuda")
    x = r * tok * h                                         # block input
    n_stats = 2 if spec.norm == "layernorm" else 1          # mean and rstd, or rstd (fp32)
    stats = 2 * n_stats * 4 * tok
    none_rep = x + r * tok * h + stats                      # + residual after attention, norm statistics
    if prec.autocast_copies:
        none_rep += (qkv_casts + 1) * e * tok * h           # 16-bit casts of the norm outputs
    else:
        none_rep += 2 * r * tok * h                         # the two norm outputs
    none_rep += 2 * mask * tok * h                          # residual dropout masks
    qkv = tok * (q + 2 * kvd)
    scores = tok * a * s
    if eager:
        ea = prec.attention
        amask = (ea if device != "cuda" else prec.mask) if dropout else 0  # math attention's own mask dtype
        probs = ea * scores + ((amask + ea) * scores if dropout else 0)
        attn = ea * qkv + probs + ea * tok * q
        attn_sel = ea * scores + ea * tok * q               # bmm outputs: scores, probabilities @ V
        core = probs                                        # what Megatron's selective recompute drops
    else:
        lse = 4 * tok * a
        attn = e * qkv + e * tok * q + lse                  # Q, K, V, the kernel's output and LSE
        attn_sel = e * tok * q + lse
        core = 0
    mlp = (4 if spec.gated else 2) * e * tok * f            # fc out + act out (gated: gate, up, act, product)
    none_tp = attn + mlp
    weights = 2 * spec.layer_matmul_params() if prec.autocast_copies else 0
    sel_tp = e * qkv + attn_sel + e * tok * h + (2 if spec.gated else 1) * e * tok * f + e * tok * h
    return {
        "none": {"rep": none_rep, "tp": none_tp, "weights": weights},
        "attention": {"rep": none_rep, "tp": none_tp - core, "weights": weights},
        "selective": {"rep": x, "tp": sel_tp, "weights": 0},
        "full": {"rep": x, "tp": 0, "weights": 0},
    }


def outside_terms(spec: TransformerSpec, b: int, s: int, prec: Precision = BF16, *,
                  dropout: bool = False) -> dict[str, float]:
    """Bytes outside the layers: ``first`` (embedding stage), ``last`` (final norm, output layer
    input, the fp32 log-softmax cross-entropy keeps: 4 bytes x b x s x V), ``weights`` (autocast
    copy of the output weight)."""
    h, v = spec.hidden, spec.vocab
    e, r = prec.compute, prec.residual
    tok = b * s
    first = 8 * s if spec.position == "learned" else 0      # position ids (int64)
    if dropout:
        first += (r if prec.mask > 1 else 1) * tok * h     # embedding dropout mask (input's dtype on CPU)
    n_stats = 2 if spec.norm == "layernorm" else 1
    last = r * tok * h + n_stats * 4 * tok                  # final norm input and statistics
    last += (e if prec.autocast_copies else r) * tok * h    # output layer input
    last += 4 * tok * v + 4                                 # fp32 log-softmax output; its total weight
    weights = 2 * v * h if prec.autocast_copies else 0
    return {"first": first, "last": last, "weights": weights}


def per_layer_bytes(terms: dict[str, dict[str, float]], kind: str, *, tp: int = 1, sp: bool = False) -> float:
    """One layer's bytes on one TP rank (sequence parallel also splits the replicated part)."""
    tm = terms[kind]
    return tm["rep"] / (tp if sp else 1) + tm["tp"] / tp + tm["weights"] / tp
