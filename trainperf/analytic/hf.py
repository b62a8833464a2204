"""A Hugging Face ``config.json`` as a :class:`TransformerSpec` (no torch, no transformers).

Llama / Mistral / Qwen2 style (``hidden_size``, ``num_hidden_layers``, ``num_attention_heads``,
``num_key_value_heads`` for GQA, ``intermediate_size`` with a SwiGLU MLP, ``tie_word_embeddings``,
``vocab_size``, ``max_position_embeddings``, RoPE, RMSNorm); GPT-2 (``n_embd``, ``n_layer``,
``n_head``, ``n_positions``, ``n_inner``, learned positions, biases, tied output); GPT-NeoX,
OPT, MPT, Falcon and Gemma keys are mapped where they name the same thing; ``head_dim`` where it is set
apart from hidden / heads (Gemma, Mistral-Nemo). Encoder-only models (BERT, RoBERTa, ELECTRA, DeBERTa)
are read with bidirectional attention (every score block computed); an encoder-decoder (T5, BART,
Whisper) and a mixture-of-experts model are refused with what to do instead.
"""

from __future__ import annotations

import os

from trainperf.analytic.spec import TransformerSpec
from trainperf.errors import UserError

_KEYS = {
    "hidden": ("hidden_size", "n_embd", "d_model"),
    "layers": ("num_hidden_layers", "n_layer", "n_layers", "num_layers"),
    "heads": ("num_attention_heads", "n_head", "n_heads", "num_heads"),
    "vocab": ("vocab_size", "padded_vocab_size"),
}
_GATED_ACTS = ("silu", "swiglu", "swish", "gelu_pytorch_tanh_gated", "geglu")


def _first(cfg: dict, names: tuple[str, ...]):
    for n in names:
        if n in cfg and cfg[n] is not None:
            return n, cfg[n]
    return None, None


def _int(path: str, name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UserError(f"{path}: {name}={value!r} must be a positive integer")
    return value


_MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")


def _refuse_moe(path: str, cfg: dict) -> None:
    """A mixture-of-experts config (Mixtral, Qwen-MoE, OLMoE, DeepSeek-V2/V3, DBRX) read as its dense
    shape would be planned as a model a fraction of its size: say so instead."""
    for where in (cfg, cfg.get("ffn_config") if isinstance(cfg.get("ffn_config"), dict) else {}):
        key, n = _first(where, _MOE_KEYS)
        if key is not None and isinstance(n, int) and not isinstance(n, bool) and n > 1:
            _, k = _first(cfg, ("num_experts_per_tok", "moe_top_k", "num_experts_per_token"))
            if k is None and where is not cfg:
                _, k = _first(where, ("moe_top_k",))
            active = f", {k} active per token" if k is not None else ""
            raise UserError(
                f"{path}: a mixture-of-experts model ({key}={n}{active}): the planner times dense transformers only "
                "(experts' weights and memory, routing and the expert-parallel all-to-all are not modeled), so "
                "reading this config as a dense model would plan one a fraction of its size; plan a dense shape with "
                "--hidden/--layers/--heads/--ffn-hidden instead, knowing it is not this model"
            )


_ENCODER_DECODER = ("t5", "mt5", "umt5", "longt5", "switch_transformers", "bart", "mbart", "pegasus", "marian",
                    "m2m_100", "nllb_moe", "whisper", "prophetnet", "led", "blenderbot", "plbart", "fsmt")
_ENCODER_ONLY = ("bert", "roberta", "xlm-roberta", "camembert", "electra", "deberta", "deberta-v2", "ernie",
                 "mpnet", "megatron-bert", "nezha", "roformer", "esm", "data2vec-text", "xlm-roberta-xl")


def _refuse_encoder_decoder(path: str, cfg: dict, model_type: str) -> None:
    """T5 / BART style configs name one stack's layers (``num_layers``) beside a second one
    (``num_decoder_layers``, ``decoder_layers``) with cross-attention: read as one decoder they would be
    planned at half their size or less."""
    second = next((k for k in ("num_decoder_layers", "decoder_layers", "encoder_layers") if k in cfg), None)
    if cfg.get("is_encoder_decoder") is True or model_type in _ENCODER_DECODER or second:
        why = f"{second}={cfg[second]!r}" if second else (f"model_type={model_type!r}" if model_type else
                                                              "is_encoder_decoder: true")
        raise UserError(
            f"{path}: an encoder-decoder model ({why}): the planner times one transformer stack (decoder-only, "
            "or an encoder with --hf-config of an encoder-only model); an encoder plus a decoder with "
            "cross-attention is not modeled. Plan each stack as its own shape (--hidden/--layers/--heads/"
            "--ffn-hidden/--seq), knowing the cross-attention is left out")


def read_json_object(path: str, what: str) -> dict:
    """A JSON file's top-level object; garbage (missing, binary, not UTF-8, empty, truncated, not
    an object) is a UserError naming the file (trainperf.runio)."""
    from trainperf.runio import read_json

    return read_json(path, what=what, expect=dict)


def from_hf_config(path: str, *, seq: int | None = None, attention: str = "flash") -> TransformerSpec:
    """Read ``config.json`` (a file, or a directory holding one) into the transformer spec.
    ``seq`` defaults to the config's maximum positions (capped at 4096 when larger: planning a
    128k-context model at full length is rarely the question; pass --seq)."""
    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
    cfg = read_json_object(path, "--hf-config")
    if isinstance(cfg.get("text_config"), dict):  # multimodal wrappers keep the LM in text_config
        cfg = {**cfg["text_config"], **{k: v for k, v in cfg.items() if k == "tie_word_embeddings"}}
    _refuse_moe(path, cfg)
    vals = {}
    for field, names in _KEYS.items():
        key, value = _first(cfg, names)
        if key is None:
            present = next((n for n in names if n in cfg), None)
            if present is not None:  # there, but null (or NaN / Infinity, which the reader reads as null)
                raise UserError(f"{path}: {present} is null, NaN or Infinity in the file; it must be a positive "
                                "integer")
            raise UserError(f"{path}: no {' / '.join(names)} key; is this a decoder-only transformer's config.json?")
        vals[field] = _int(path, key, value)
    h, heads = vals["hidden"], vals["heads"]
    model_type = str(cfg.get("model_type", "")).lower()
    _refuse_encoder_decoder(path, cfg, model_type)
    archs = cfg.get("architectures") if isinstance(cfg.get("architectures"), list) else []
    encoder = model_type in _ENCODER_ONLY or any(isinstance(a, str) and a.endswith("ForMaskedLM") for a in archs)
    key, hd = _first(cfg, ("head_dim", "kv_channels"))
    head_dim = _int(path, key, hd) if key else None
    if head_dim is not None and head_dim * heads == h:
        head_dim = None  # the usual hidden / heads: nothing set apart
    gpt2_like = "n_embd" in cfg or encoder or model_type in ("gpt2", "gpt_bigcode", "opt", "gptj", "gpt_neox", "mpt",
                                                              "falcon")
    key, kv = _first(cfg, ("num_key_value_heads", "n_head_kv", "num_kv_heads", "multi_query_group_num"))
    kv_heads = _int(path, key, kv) if key else None
    if cfg.get("multi_query") is True and kv_heads is None:
        kv_heads = 1
    key, ffn = _first(cfg, ("intermediate_size", "n_inner", "ffn_dim", "ffn_hidden_size"))
    ffn = _int(path, key, ffn) if key else None
    act = str(cfg.get("hidden_act") or cfg.get("activation_function") or cfg.get("hidden_activation") or "").lower()
    gated = (not gpt2_like) and (act in _GATED_ACTS or model_type in ("llama", "mistral", "mixtral", "qwen2", "gemma",
                                                                       "gemma2", "qwen3", "olmo", "phi3"))
    tied = cfg.get("tie_word_embeddings")
    if tied is not None and not isinstance(tied, bool):
        raise UserError(f"{path}: tie_word_embeddings={tied!r} must be true or false (a JSON boolean)")
    if tied is None:
        tied = gpt2_like  # GPT-2 and friends tie; Llama's config says so explicitly
    learned = gpt2_like and model_type not in ("gpt_neox", "gptj", "falcon", "mpt")
    key, max_pos = _first(cfg, ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "n_ctx"))
    max_pos = _int(path, key, max_pos) if key else None
    s = seq or (min(max_pos, 4096) if max_pos else 2048)
    bias = bool(cfg.get("attention_bias", False)) or (gpt2_like and model_type not in ("mpt",) and not cfg.get("no_bias"))
    norm = "layernorm" if gpt2_like else "rmsnorm"
    name = os.path.basename(os.path.dirname(os.path.abspath(path))) or model_type or "hf"
    try:
        return TransformerSpec(
            hidden=h, layers=vals["layers"], heads=heads, seq=s, vocab=vals["vocab"], kv_heads=kv_heads,
            ffn_hidden=ffn, gated=gated, tied=bool(tied), position="learned" if learned else "rope",
            max_positions=max_pos if learned else None, bias=bias, norm=norm, attention=attention, name=name,
            head_dim_size=head_dim, causal_fraction=1.0 if encoder else 0.5,
        )
    except UserError as exc:
        raise UserError(f"{path}: {exc}") from None
