"""The one transformer spec (no torch): shape, parameters and FLOPs per token.

Read by the memory estimate (:mod:`trainperf.memory.estimate`), MFU (:mod:`trainperf.monitor.flops`)
and the planner (:mod:`trainperf.planner`). A Hugging Face ``config.json`` (Llama, Mistral, GPT-2,
GPT-NeoX, MPT, OPT...) becomes a spec with :func:`trainperf.analytic.hf.from_hf_config`.

FLOP conventions (each figure names its own):

* :meth:`TransformerSpec.model_flops_per_token`: forward + backward matmuls, 2 FLOPs per weight per
  token forward, backward twice the forward, the logits layer counted (tied or not), attention
  ``QK^T`` and ``PV`` counted over the full (non-causal) ``s x s``: ``6 * (l * W_layer + V * h) +
  12 * l * a * d * s``. For a GPT layer with a 4h MLP this is Korthikanti et al. 2022's
  ``72 B s l h^2 (1 + s/(6h) + V/(12 h l))`` per step.
* :meth:`TransformerSpec.palm_flops_per_token`: PaLM appendix B, ``6N + 12 l h s`` with N every
  parameter except the token and position embeddings (an untied head counts, a tied one not):
  the monitor's MFU convention (``trainperf.models.gpt.GPT.flops_per_token``).
* :meth:`TransformerSpec.hardware_flops_per_token`: what runs: model FLOPs plus recompute (full:
  one more forward of the block; ``attention``: the attention core again, Megatron's selective)
  plus FlashAttention's backward recomputation of ``QK^T`` (``+ 2 a d s`` per layer).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from trainperf.errors import UserError
from trainperf.limits import MAX_CONTEXT, MAX_HEADS, MAX_HIDDEN, MAX_LAYERS, MAX_VOCAB

ATTENTION_KERNELS = ("flash", "eager")
"""``flash``: FlashAttention / SDPA fused kernels (no s x s tensor kept, scores recomputed in
backward); ``eager``: scores and probabilities materialized (Megatron 2022, math SDPA)."""
POSITIONS = ("learned", "rope", "none")


@dataclass(frozen=True)
class TransformerSpec:
    """Decoder-only transformer."""

    hidden: int
    layers: int
    heads: int
    seq: int
    """Training sequence length."""
    vocab: int
    kv_heads: int | None = None
    """Key/value heads (GQA/MQA); None: as many as query heads."""
    ffn_hidden: int | None = None
    """MLP width; None: 4 x hidden."""
    gated: bool = False
    """SwiGLU / GeGLU MLP (gate, up and down matrices) instead of two matrices."""
    tied: bool = True
    """Output layer shares the token embedding."""
    position: str = "learned"
    """learned (a max_positions x h table), rope or none."""
    max_positions: int | None = None
    """Rows of the learned position table; None: seq."""
    bias: bool = False
    """Biases in the linear layers and norms."""
    norm: str = "layernorm"
    """layernorm (weight + bias when ``bias``) or rmsnorm (weight only)."""
    attention: str = "flash"
    """Attention kernel, one of ATTENTION_KERNELS."""
    causal_fraction: float = 0.5
    """Fraction of the s x s score blocks a causal kernel executes (FlashAttention skips the
    masked half). Counted FLOPs keep the full s x s by convention; time uses this fraction; 1.0 for
    an encoder's bidirectional attention."""
    name: str = "custom"
    head_dim_size: int | None = None
    """Width of one attention head where the model sets it apart from hidden / heads (Gemma: 16 heads of
    256 on h = 3072; Mistral-Nemo, some Qwen3): Q and the attention output are heads x head_dim wide,
    K and V kv_heads x head_dim. None: hidden / heads."""

    def __post_init__(self):
        bounds = {"hidden": MAX_HIDDEN, "layers": MAX_LAYERS, "heads": MAX_HEADS, "seq": MAX_CONTEXT, "vocab": MAX_VOCAB}
        for field_name, top in bounds.items():
            val = getattr(self, field_name)
            if isinstance(val, bool) or not isinstance(val, int) or val < 1:
                raise UserError(f"model {field_name}={val!r} must be a positive integer")
            if val > top:  # a typo's extra digits: refused here, not a search that does not end
                raise UserError(f"model {field_name}={val} is above {top}, far beyond any published model; "
                                "check the value")
        for field_name, top in (("kv_heads", MAX_HEADS), ("ffn_hidden", 8 * MAX_HIDDEN), ("max_positions", MAX_CONTEXT)):
            val = getattr(self, field_name)
            if isinstance(val, int) and not isinstance(val, bool) and val > top:
                raise UserError(f"model {field_name}={val} is above {top}, far beyond any published model; "
                                "check the value")
        hd = self.head_dim_size
        if hd is not None and (isinstance(hd, bool) or not isinstance(hd, int) or not 1 <= hd <= MAX_HIDDEN):
            raise UserError(f"model head_dim={hd!r} must be a positive integer up to {MAX_HIDDEN}")
        if hd is None and self.hidden % self.heads:
            raise UserError(
                f"hidden size {self.hidden} is not divisible by heads={self.heads}; "
                "choose a head count that divides the hidden size"
            )
        kv = self.kv
        if kv < 1 or self.heads % kv:
            raise UserError(f"kv_heads={self.kv_heads} must divide heads={self.heads} (GQA groups)")
        if self.attention not in ATTENTION_KERNELS:
            raise UserError(f"attention={self.attention!r}: choose one of {', '.join(ATTENTION_KERNELS)}")
        if self.position not in POSITIONS:
            raise UserError(f"position={self.position!r}: choose one of {', '.join(POSITIONS)}")
        if self.ffn_hidden is not None and self.ffn_hidden < 1:
            raise UserError(f"ffn_hidden={self.ffn_hidden} must be a positive integer")

    # ------------------------------------------------------------------ shape
    @property
    def kv(self) -> int:
        return self.kv_heads or self.heads

    @property
    def ffn(self) -> int:
        return self.ffn_hidden or 4 * self.hidden

    @property
    def head_dim(self) -> int:
        return self.head_dim_size or self.hidden // self.heads

    @property
    def q_dim(self) -> int:
        """Width of Q and of the attention output: heads x head_dim (= hidden unless head_dim is set apart)."""
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of K (and of V): kv_heads x head_dim."""
        return self.kv * self.head_dim

    @property
    def ffn_in(self) -> int:
        """Output width of the MLP's first matmul(s): 2 x ffn when gated."""
        return (2 if self.gated else 1) * self.ffn

    def with_(self, **kw) -> "TransformerSpec":
        return replace(self, **kw)

    # ------------------------------------------------------------------ parameters
    def layer_matmul_params(self) -> int:
        """Weights of one layer's matmuls: Q, K, V, O and the MLP."""
        h, q = self.hidden, self.q_dim
        return h * q + 2 * h * self.kv_dim + q * h + h * self.ffn_in + self.ffn * h

    def norm_params(self) -> int:
        return self.hidden * (2 if self.bias and self.norm == "layernorm" else 1)

    def layer_params(self) -> int:
        """All parameters of one layer: matmul weights, their biases, two norms.
        12h^2 + 13h for a GPT layer with biases."""
        h = self.hidden
        biases = (self.q_dim + 2 * self.kv_dim + h + self.ffn_in + h) if self.bias else 0
        return self.layer_matmul_params() + biases + 2 * self.norm_params()

    def token_embedding_params(self) -> int:
        return self.vocab * self.hidden

    def position_params(self) -> int:
        return (self.max_positions or self.seq) * self.hidden if self.position == "learned" else 0

    def embedding_params(self) -> int:
        """Token + position embeddings."""
        return self.token_embedding_params() + self.position_params()

    def head_params(self) -> int:
        """Final norm + the output layer when it is not tied."""
        return self.norm_params() + (0 if self.tied else self.vocab * self.hidden)

    def params(self) -> int:
        return self.layers * self.layer_params() + self.embedding_params() + self.head_params()

    # ------------------------------------------------------------------ FLOPs per token
    def attention_flops_fwd(self, seq: int | None = None) -> float:
        """QK^T and PV of one layer, forward, per token, full s x s: 4 a d s."""
        s = seq or self.seq
        return 4.0 * self.heads * self.head_dim * s

    def layer_flops_fwd(self, seq: int | None = None) -> float:
        return 2.0 * self.layer_matmul_params() + self.attention_flops_fwd(seq)

    def model_flops_per_token(self, seq: int | None = None) -> float:
        """Forward + backward, logits included, no recompute (module doc)."""
        return 3.0 * (self.layers * self.layer_flops_fwd(seq) + 2.0 * self.vocab * self.hidden)

    def palm_flops_per_token(self, seq: int | None = None) -> float:
        """6N + 12 l h s, N without token/position embeddings (PaLM appendix B; the monitor's MFU)."""
        s = seq or self.seq
        n = self.params() - self.embedding_params()
        return 6.0 * n + 12.0 * self.layers * self.hidden * s

    def recompute_flops_per_token(self, n_full: int, n_attention: int = 0, seq: int | None = None) -> float:
        """Forward FLOPs re-run per token: one block forward per fully checkpointed block, the
        attention core per block under Megatron's selective recompute. Op-level selective
        (trainperf's policy) keeps matmul and attention outputs: no matmul FLOPs re-run."""
        return n_full * self.layer_flops_fwd(seq) + n_attention * self.attention_flops_fwd(seq)

    def flash_backward_flops_per_token(self, seq: int | None = None) -> float:
        """FlashAttention's backward recomputes QK^T (5 matmuls instead of 4): + 2 a d s per layer."""
        if self.attention != "flash":
            return 0.0
        return self.layers * 0.5 * self.attention_flops_fwd(seq)

    def hardware_flops_per_token(self, n_full: int = 0, n_attention: int = 0, seq: int | None = None) -> float:
        return (self.model_flops_per_token(seq) + self.recompute_flops_per_token(n_full, n_attention, seq)
                + self.flash_backward_flops_per_token(seq))

    # ------------------------------------------------------------------ text
    def describe(self) -> str:
        extra = []
        if self.kv != self.heads:
            extra.append(f"kv={self.kv}")
        if self.q_dim != self.hidden:
            extra.append(f"head_dim={self.head_dim}")
        if self.causal_fraction >= 1.0:
            extra.append("bidirectional (encoder)")
        if self.ffn_hidden or self.gated:
            extra.append(f"ffn={self.ffn}{' (SwiGLU)' if self.gated else ''}")
        extra.append(f"{'tied' if self.tied else 'untied'} output")
        extra.append(f"{self.attention} attention")
        return (f"{self.name}: {self.params() / 1e9:.2f}B parameters, h={self.hidden}, l={self.layers}, "
                f"a={self.heads}, s={self.seq}, V={self.vocab}, " + ", ".join(extra))

    def as_dict(self) -> dict:
        d = asdict(self)
        d.update(kv_heads=self.kv, ffn_hidden=self.ffn, params=self.params())
        return d
