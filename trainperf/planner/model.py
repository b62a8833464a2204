"""The transformer being planned: shape, parameter count and FLOPs (no torch).

Formulas (REFERENCE.md): parameters after Narayanan et al. 2021,
P = 12·l·h²·(1 + 13/(12h) + (V+s)/(12·l·h)) for GPT-style layers; model FLOPs per iteration
after Korthikanti et al. 2022, 72·B·s·l·h²·(1 + s/(6h) + V/(12·h·l)). Both are written here in
a general form (matmul parameters per layer, any MLP width) that reduces to those formulas for a
GPT layer with a 4h MLP.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainperf.errors import UserError


@dataclass(frozen=True)
class ModelSpec:
    """Decoder-only transformer shape."""

    hidden: int
    layers: int
    heads: int
    seq: int
    vocab: int
    ffn_hidden: int | None = None
    """MLP width; None means the GPT 4·hidden. Set with ``gated=True`` for SwiGLU (Llama)."""
    gated: bool = False
    """SwiGLU MLP (three matrices) instead of GELU (two)."""
    name: str = "custom"

    def __post_init__(self):
        for field_name in ("hidden", "layers", "heads", "seq", "vocab"):
            val = getattr(self, field_name)
            if not isinstance(val, int) or val < 1:
                raise UserError(f"model {field_name}={val!r} must be a positive integer")
        if self.hidden % self.heads:
            raise UserError(
                f"hidden size {self.hidden} is not divisible by heads={self.heads}; "
                "choose a head count that divides the hidden size"
            )

    @property
    def ffn(self) -> int:
        return self.ffn_hidden or 4 * self.hidden

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    # ------------------------------------------------------------------ parameters
    def layer_matmul_params(self) -> int:
        """Weights of the matmuls in one layer (QKV + proj + MLP)."""
        h = self.hidden
        mlp = (3 if self.gated else 2) * h * self.ffn
        return 4 * h * h + mlp

    def layer_params(self) -> int:
        """All parameters of one layer: matmul weights, their biases and two layer norms.
        12h² + 13h for a GPT layer."""
        h = self.hidden
        biases = 3 * h + h + ((2 if self.gated else 1) * self.ffn) + h
        norms = 4 * h
        return self.layer_matmul_params() + biases + norms

    def embedding_params(self) -> int:
        """Word + position embeddings (the output layer is tied to the word embedding)."""
        return (self.vocab + self.seq) * self.hidden

    def params(self) -> int:
        """Total parameters (Narayanan et al. 2021 for a GPT layer), final layer norm included."""
        return self.layers * self.layer_params() + self.embedding_params() + 2 * self.hidden

    # ------------------------------------------------------------------ FLOPs
    def model_flops_per_sequence(self) -> float:
        """Model FLOPs (forward + backward, no recompute) for one sequence.

        Korthikanti et al. 2022: per token and layer, 2 FLOPs per matmul weight plus 4·s·h for
        the attention scores and their product with V, forward; backward twice the forward;
        logits 2·h·V per token. For a GPT layer this is 72·s·l·h²·(1 + s/(6h) + V/(12hl))."""
        s, h = self.seq, self.hidden
        fwd_layer = 2 * self.layer_matmul_params() + 4 * s * h
        fwd = self.layers * fwd_layer + 2 * h * self.vocab
        return 3.0 * s * fwd

    def hardware_flops_per_sequence(self, recompute: str) -> float:
        """FLOPs executed, recompute included: selective re-runs the attention score products
        (s/(6h) -> s/(3h)); full re-runs every layer's forward (Narayanan 2021: 96·B·s·l·h²...)."""
        s, h = self.seq, self.hidden
        base = self.model_flops_per_sequence()
        if recompute == "selective":
            return base + s * self.layers * 4 * s * h
        if recompute == "full":
            return base + s * self.layers * (2 * self.layer_matmul_params() + 4 * s * h)
        return base

    def describe(self) -> str:
        return (
            f"{self.name}: {self.params() / 1e9:.1f}B parameters, h={self.hidden}, l={self.layers}, "
            f"a={self.heads}, s={self.seq}, V={self.vocab}"
            + (f", ffn={self.ffn}{' (SwiGLU)' if self.gated else ''}" if self.ffn_hidden else "")
        )

    def as_dict(self) -> dict:
        return {
            "name": self.name, "hidden": self.hidden, "layers": self.layers, "heads": self.heads,
            "seq": self.seq, "vocab": self.vocab, "ffn_hidden": self.ffn, "gated": self.gated,
            "params": self.params(),
        }


def from_preset(name: str) -> ModelSpec:
    """A planning shape from :mod:`trainperf.models.presets` (raises UserError if unknown)."""
    from trainperf.models.presets import get_shape

    shape = get_shape(name)
    return ModelSpec(
        hidden=shape.n_embd, layers=shape.n_layer, heads=shape.n_head, seq=shape.block_size,
        vocab=shape.vocab_size, ffn_hidden=shape.ffn_hidden, gated=shape.ffn_hidden is not None,
        name=name,
    )
