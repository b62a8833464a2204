"""Hugging Face ``transformers`` causal LMs as trainperf models (``model.hf``).

Config (data, never code)::

    model:
      hf:
        config: {model_type: llama, hidden_size: 256, num_hidden_layers: 4, num_attention_heads: 8,
                 num_key_value_heads: 2, intermediate_size: 688, vocab_size: 512,
                 max_position_embeddings: 256}
        # or  path: ./my-llama   (a local directory; from_pretrained, nothing downloaded)
      block_size: 128          # sequence length; default min(max_position_embeddings, 1024)

What trainperf handles so that the user writes no wrapper:

* **Loss**: trainperf's batches are ``(x, targets)`` with the targets already shifted by one. The
  model is called with ``input_ids`` only (never HF ``labels``, which HF shifts again) and the
  loss is the mean cross-entropy of the logits against the targets, in fp32.
* ``use_cache=False`` (a KV cache is useless in training and breaks checkpoint recompute).
* **FQNs unchanged**: the model's class is swapped for a subclass (the trick FSDP2 and trainperf's
  activation checkpointing use) whose ``forward(idx, targets)`` returns ``(logits, loss)``; no
  wrapper module, so ``state_dict`` keys are HF's and ``save_pretrained`` / ``from_pretrained``
  work on the result. Called the HF way (keywords, e.g. by ``generate``), it is HF's forward.
* **Blocks**: ``model.blocks`` (or the HF layout's decoder layers: ``model.layers`` for Llama-style,
  ``transformer.h`` for GPT-2) is recorded on the model for the block finder, so activation
  checkpointing, FSDP and tensor parallelism wrap the same blocks.
* **Dropout**: layouts (DDP, FSDP, TP) match one process only with dropout 0; a config with
  non-zero dropout is noted in ``model.trainperf_notes``.
* **Vocabulary**: a data vocabulary larger than the model's is an error before training.
* **MFU**: ``flops_per_token(seq_len)`` from the model's real shape (GQA, SwiGLU through the
  parameter count): ``6N + 12 * l * (heads * head_dim) * s`` per token (PaLM appendix B; N: every
  matmul weight, the lm_head included, token and position embedding lookups excluded).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from trainperf.errors import ConfigError

DEFAULT_MAX_SEQ = 1024
_DROPOUT_KEYS = ("attention_dropout", "hidden_dropout", "dropout", "attn_pdrop", "resid_pdrop", "embd_pdrop",
                 "hidden_dropout_prob", "attention_probs_dropout_prob", "summary_first_dropout")


def _transformers():
    try:
        import transformers
    except ImportError as exc:
        raise ConfigError("model.hf needs the transformers package: pip install 'trainperf[integrations]'") from exc
    return transformers


def hf_config(hf) -> "object":
    """The transformers config of a ``model.hf`` section (from the dict or the local directory)."""
    tr = _transformers()
    if (hf.config is None) == (hf.path is None):
        raise ConfigError("model.hf needs exactly one of model.hf.config (a config as data) or model.hf.path "
                          "(a local directory)")
    if hf.path is not None:
        p = Path(hf.path)
        if not (p / "config.json").is_file():
            raise ConfigError(f"model.hf.path={hf.path!r} has no config.json; point it at a directory written by "
                              "save_pretrained (nothing is downloaded)")
        where = f"model.hf.path={hf.path!r} (its config.json)"
        try:
            config = tr.AutoConfig.from_pretrained(str(p), local_files_only=True)
        except Exception as exc:  # noqa: BLE001 - transformers' own validation errors, JSON errors, unknown types
            raise ConfigError(f"{where}: transformers could not read it: {_first_line(exc)}; fix that field") from None
    else:
        where = "model.hf.config"
        d = dict(hf.config)
        model_type = d.pop("model_type", None)
        if not model_type or not isinstance(model_type, str):
            raise ConfigError(f"model.hf.config.model_type={model_type!r}: needs a model type name (e.g. llama, "
                              "gpt2, mistral, qwen2)")
        _check_sizes(d, where)  # before transformers divides by them
        try:
            config = tr.AutoConfig.for_model(model_type, **d)
        except ValueError as exc:
            if "Unrecognized model" in str(exc) or "model_type" in str(exc):
                raise ConfigError(f"model.hf.config.model_type={model_type!r}: {_first_line(exc)}") from None
            raise ConfigError(f"{where}: transformers refused it: {_first_line(exc)}; fix that field") from None
        except Exception as exc:  # noqa: BLE001 - e.g. StrictDataclassFieldValidationError (a field's type)
            raise ConfigError(f"{where}: transformers refused it: {_first_line(exc)}; fix that field") from None
    for k, v in (hf.overrides or {}).items():
        try:
            setattr(config, k, v)
        except Exception as exc:  # noqa: BLE001 - transformers validates some fields on assignment
            raise ConfigError(f"model.hf.overrides.{k}={v!r}: transformers refused it: {_first_line(exc)}") from None
    _check_shape(config, where if not hf.overrides else f"{where} with model.hf.overrides")
    if getattr(config, "is_encoder_decoder", False):
        raise ConfigError(f"model.hf: {type(config).__name__} is an encoder-decoder model; trainperf trains "
                          "decoder-only causal LMs (Llama, GPT-2, Mistral, Qwen, ...)")
    config.use_cache = False
    return config


def _first_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return (text[:300] + "...") if len(text) > 300 else text or type(exc).__name__


def _size_bounds() -> dict[str, int]:
    from trainperf.limits import MAX_CONTEXT, MAX_HEADS, MAX_HIDDEN, MAX_LAYERS, MAX_VOCAB

    return {"hidden_size": MAX_HIDDEN, "n_embd": MAX_HIDDEN, "num_hidden_layers": MAX_LAYERS, "n_layer": MAX_LAYERS,
            "num_attention_heads": MAX_HEADS, "n_head": MAX_HEADS, "num_key_value_heads": MAX_HEADS,
            "intermediate_size": 8 * MAX_HIDDEN, "n_inner": 8 * MAX_HIDDEN, "head_dim": MAX_HIDDEN,
            "vocab_size": MAX_VOCAB, "max_position_embeddings": MAX_CONTEXT, "n_positions": MAX_CONTEXT}


def _check_sizes(d: dict, where: str) -> None:
    """The size fields a config dict sets are whole numbers in range (None: the model type's default)."""
    for key, top in _size_bounds().items():
        v = d.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= top):
            raise ConfigError(f"{where}: {key}={v!r} must be a whole number in [1, {top}]")


def _check_shape(config, where: str) -> None:
    """The decoder shape a config gives is one a model can be built from: positive sizes within the bounds
    of trainperf/limits.py, heads that divide the hidden size (unless head_dim is set) and KV heads that
    divide the heads. (A head count of 0 was a ZeroDivisionError, a negative one "Trying to create tensor with
    negative dimension", a size of 10**12 an allocator error.)"""
    from trainperf.limits import MAX_HEADS, MAX_HIDDEN, MAX_LAYERS, MAX_VOCAB

    s = hf_shape(config)
    names = {"n_layer": "num_hidden_layers", "n_head": "num_attention_heads", "n_kv_head": "num_key_value_heads",
             "n_embd": "hidden_size", "vocab_size": "vocab_size"}
    tops = {"n_layer": MAX_LAYERS, "n_head": MAX_HEADS, "n_kv_head": MAX_HEADS, "n_embd": MAX_HIDDEN,
            "vocab_size": MAX_VOCAB}
    for key, top in tops.items():
        v = s[key]
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= top:
            raise ConfigError(f"{where}: {names[key]}={v!r} must be a whole number in [1, {top}]")
    for attr, top in (("num_key_value_heads", MAX_HEADS), ("intermediate_size", 8 * MAX_HIDDEN), ("n_inner", 8 * MAX_HIDDEN),
                      ("head_dim", MAX_HIDDEN)):
        v = getattr(config, attr, None)  # optional fields: checked when the config sets them
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= top):
            raise ConfigError(f"{where}: {attr}={v!r} must be a whole number in [1, {top}]")
    explicit_head_dim = isinstance(getattr(config, "head_dim", None), int)
    if not explicit_head_dim and s["n_embd"] % s["n_head"]:
        raise ConfigError(f"{where}: hidden_size={s['n_embd']} is not divisible by num_attention_heads={s['n_head']}; "
                          "choose a head count that divides it (or set head_dim)")
    if s["n_head"] % s["n_kv_head"]:
        raise ConfigError(f"{where}: num_key_value_heads={s['n_kv_head']} must divide num_attention_heads="
                          f"{s['n_head']} (grouped-query attention)")


def context_length(config) -> int | None:
    for k in ("max_position_embeddings", "n_positions", "n_ctx", "seq_length"):
        v = getattr(config, k, None)
        if isinstance(v, int) and v > 0:
            return v
    return None


def hf_seq_len(cfg) -> int:
    """Training sequence length: model.block_size, else min(the config's context length, 1024)."""
    config = hf_config(cfg.model.hf)
    ctx = context_length(config)
    if cfg.model.block_size:
        if ctx is not None and cfg.model.block_size > ctx and not _rope(config):
            raise ConfigError(f"model.block_size={cfg.model.block_size} exceeds the model's learned position "
                              f"embeddings ({ctx}); use at most {ctx}")
        return cfg.model.block_size
    return min(ctx or DEFAULT_MAX_SEQ, DEFAULT_MAX_SEQ)


def _rope(config) -> bool:
    return getattr(config, "rope_theta", None) is not None or getattr(config, "rope_parameters", None) is not None


def hf_shape(config) -> dict:
    """n_layer / n_head / n_kv_head / n_embd / head_dim / vocab_size of a decoder config."""
    n_layer = getattr(config, "num_hidden_layers", None) or getattr(config, "n_layer", None)
    n_head = getattr(config, "num_attention_heads", None) or getattr(config, "n_head", None)
    n_embd = getattr(config, "hidden_size", None) or getattr(config, "n_embd", None)
    n_kv = getattr(config, "num_key_value_heads", None) or n_head
    head_dim = getattr(config, "head_dim", None) or (n_embd // n_head if n_embd and n_head else None)
    return {"n_layer": n_layer, "n_head": n_head, "n_kv_head": n_kv, "n_embd": n_embd, "head_dim": head_dim,
            "vocab_size": getattr(config, "vocab_size", None)}


def shape_for_resolve(cfg) -> dict:
    """What ``models.shape.model_shape`` reports for a ``model.hf`` model."""
    config = hf_config(cfg.model.hf)
    s = hf_shape(config)
    return {"n_layer": s["n_layer"], "n_head": s["n_head"], "n_kv_head": s["n_kv_head"], "n_embd": s["n_embd"],
            "block_size": hf_seq_len(cfg), "vocab_size": s["vocab_size"],
            "model_type": getattr(config, "model_type", None)}


def default_block_path(model: nn.Module) -> str | None:
    """The decoder layers of the common HF layouts (Llama-style ``model.layers``, GPT-2 ``transformer.h``)."""
    for path in ("model.layers", "transformer.h", "model.decoder.layers", "gpt_neox.layers", "transformer.layers"):
        try:
            mod = model.get_submodule(path)
        except AttributeError:
            continue
        if isinstance(mod, nn.ModuleList) and len(mod):
            return path
    return None


def find_hf_module(model: nn.Module) -> tuple[str, nn.Module] | None:
    """(path, module) of the outermost module inside ``model`` (itself included) that carries a Hugging Face
    decoder ``config`` (layers, heads and head size readable): a user's ``nn.Module`` wrapper around a
    transformers model hides the config from ``model.config``; any depth is searched, not only children."""
    for path, mod in model.named_modules():
        config = getattr(mod, "config", None)
        if config is None or isinstance(config, dict):
            continue
        try:
            s = hf_shape(config)
        except (TypeError, ZeroDivisionError):
            continue
        if all(isinstance(s[k], int) and s[k] > 0 for k in ("n_layer", "n_head", "head_dim")):
            return path, mod
    return None


def hf_flops_per_token(model: nn.Module, seq_len: int, *, hf_module: nn.Module | None = None) -> tuple[float | None, str]:
    """Model FLOPs per token of a HF decoder (PaLM appendix B convention, see the module docstring).

    ``hf_module``: the transformers model inside ``model`` (a user's wrapper) whose config gives the shape;
    N counts every parameter of ``model`` (the wrapper's own layers too), the embedding lookups excepted."""
    hf = hf_module if hf_module is not None else model
    config = getattr(hf, "config", None)
    s = hf_shape(config) if config is not None else {}
    if not s.get("n_layer") or not s.get("n_head") or not s.get("head_dim"):
        return None, "the Hugging Face config does not give layers / heads / head_dim"
    n = sum(p.numel() for p in model.parameters())
    emb = _call(hf, "get_input_embeddings")
    out = _call(hf, "get_output_embeddings")
    n_emb = emb.weight.numel() if isinstance(emb, nn.Embedding) else 0
    tied = emb is not None and out is not None and getattr(out, "weight", None) is getattr(emb, "weight", 0)
    n_pos = sum(m.weight.numel() for name, m in model.named_modules()
                if isinstance(m, nn.Embedding) and m is not emb and name.split(".")[-1] in ("wpe", "embed_positions"))
    n_matmul = n - n_pos - (0 if tied else n_emb)
    attn = s["n_head"] * s["head_dim"]
    fpt = 6.0 * n_matmul + 12.0 * s["n_layer"] * attn * seq_len
    return fpt, (f"6N + 12*l*(heads*head_dim)*s per token (PaLM app. B) from the Hugging Face config: N={n_matmul} "
                 f"matmul weights (lm_head {'tied, counted once' if tied else 'counted'}; embedding lookups "
                 f"excluded), l={s['n_layer']}, heads*head_dim={attn}, s={seq_len}")


def _call(mod: nn.Module, name: str):
    fn = getattr(mod, name, None)
    if not callable(fn):
        return None
    try:
        return fn()
    except (NotImplementedError, AttributeError):
        return None


# ---------------------------------------------------------------------- the trainperf contract
_CLASSES: dict[type, type] = {}


def _trainperf_class(base: type) -> type:
    if base in _CLASSES:
        return _CLASSES[base]

    def forward(self, idx=None, targets=None, *args, **kwargs):
        if args or kwargs or idx is None:  # called the Hugging Face way (generate, Trainer, a user)
            if idx is not None:
                args = (idx, targets, *args) if targets is not None else (idx, *args)
            return base.forward(self, *args, **kwargs)
        out = base.forward(self, input_ids=idx, use_cache=False, return_dict=True)
        logits = out.logits
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), targets.reshape(-1))
        return logits, loss

    def flops_per_token(self, seq_len: int) -> float | None:
        return hf_flops_per_token(self, seq_len)[0]

    cls = type(base.__name__, (base,), {"forward": forward, "flops_per_token": flops_per_token,
                                        "_trainperf_hf_base": base, "__module__": base.__module__})
    _CLASSES[base] = cls
    return cls


def adopt(model: nn.Module, *, blocks: str | None = None) -> nn.Module:
    """Give a transformers causal LM trainperf's ``forward(idx, targets) -> (logits, loss)`` in place
    (FQNs unchanged), ``use_cache=False``, and the block path for the block finder."""
    base = getattr(type(model), "_trainperf_hf_base", type(model))
    model.__class__ = _trainperf_class(base)
    model.config.use_cache = False
    path = blocks or default_block_path(model)
    if path is not None:
        from trainperf.models.blocks import find_blocks, set_block_path

        find_blocks(model, path, field="model.blocks")  # a wrong path fails here, listing candidates
        set_block_path(model, path)
    notes = {}
    drop = {k: getattr(model.config, k) for k in _DROPOUT_KEYS
            if isinstance(getattr(model.config, k, None), (int, float)) and getattr(model.config, k)}
    if drop:
        notes["model.hf dropout"] = (f"{drop}: distributed layouts match one process only with dropout 0 (each rank "
                                     "draws its own dropout masks); set model.hf.overrides to 0 to compare layouts")
    notes["model.hf"] = (f"{type(model).__name__}: loss = cross-entropy of the logits against trainperf's "
                         f"pre-shifted targets (HF labels not used), use_cache=False, blocks at {path!r}")
    model.trainperf_notes = notes
    return model


def build_hf_model(cfg, *, data_vocab: int | None = None, device="cpu") -> nn.Module:
    """The configured HF model on ``device``, weights from the directory or initialized from run.seed."""
    tr = _transformers()
    hf = cfg.model.hf
    config = hf_config(hf)
    vocab = getattr(config, "vocab_size", None)
    if data_vocab and vocab is not None and data_vocab > vocab:
        raise ConfigError(
            f"the data's vocabulary ({data_vocab} tokens) is larger than the model's vocab_size={vocab}; token ids "
            f">= {vocab} would index past the embedding. Use data tokenized for this model, or set "
            f"model.hf.overrides.vocab_size>={data_vocab} (a new, untrained embedding)")
    torch.manual_seed(cfg.run.seed)
    kw = {"attn_implementation": hf.attn_implementation}
    if hf.path is not None and hf.pretrained and not (hf.overrides or {}).get("vocab_size"):
        model = tr.AutoModelForCausalLM.from_pretrained(hf.path, config=config, local_files_only=True, **kw)
    else:
        model = tr.AutoModelForCausalLM.from_config(config, **kw)
    if getattr(model.config, "is_decoder", True) is False and getattr(model.config, "is_encoder_decoder", False):
        raise ConfigError("model.hf: not a decoder-only model")
    adopt(model, blocks=cfg.model.blocks)
    return model.to(device)
