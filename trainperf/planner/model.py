"""The transformer being planned: :class:`trainperf.analytic.TransformerSpec` (no torch).

``ModelSpec`` is that one spec (the planner's historical name). Presets come from
:mod:`trainperf.models.presets` with what the preset table does not say filled in here (the
Megatron GPT runs: biases, tied output, learned positions, eager attention as in 2022; Llama:
GQA, SwiGLU, RMSNorm, RoPE, untied output).
"""

from __future__ import annotations

from trainperf.analytic.spec import TransformerSpec

ModelSpec = TransformerSpec

# What each preset family is beyond its shape (sources: Megatron-LM GPT; Llama 2, Touvron et al. 2023).
_GPT = dict(bias=True, tied=True, position="learned", norm="layernorm", attention="flash")
_LLAMA = dict(bias=False, tied=False, position="rope", norm="rmsnorm", attention="flash", gated=True)
_KV_HEADS = {"llama-70b": 8}


def from_preset(name: str, *, attention: str | None = None) -> TransformerSpec:
    """A planning shape from :mod:`trainperf.models.presets` (raises UserError if unknown)."""
    from trainperf.models.presets import get_shape

    shape = get_shape(name)
    extra = dict(_LLAMA if name.startswith("llama") else _GPT)
    if attention:
        extra["attention"] = attention
    return TransformerSpec(
        hidden=shape.n_embd, layers=shape.n_layer, heads=shape.n_head, seq=shape.block_size,
        vocab=shape.vocab_size, ffn_hidden=shape.ffn_hidden, kv_heads=_KV_HEADS.get(name), name=name, **extra,
    )
