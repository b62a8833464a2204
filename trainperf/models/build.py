"""Build the configured model: a reference GPT (on meta, then materialized) or a user's model."""

from __future__ import annotations

import inspect

import torch
import torch.nn as nn

from trainperf.models.shape import model_shape
from trainperf.config.schema import Config
from trainperf.errors import ConfigError
from trainperf.entrypoint import load_entrypoint
from trainperf.models.gpt import GPT, GPTConfig


def pad_vocab(n: int, multiple: int = 64) -> int:
    return ((n + multiple - 1) // multiple) * multiple


def gpt_config(cfg: Config, data_vocab: int | None = None) -> GPTConfig:
    shape = model_shape(cfg)
    vocab = shape["vocab_size"]
    if cfg.model.vocab_size == "auto" and data_vocab:
        vocab = pad_vocab(data_vocab)
    if data_vocab and vocab < data_vocab:
        raise ConfigError(
            f"model.vocab_size={vocab} is smaller than the data's vocabulary ({data_vocab}); "
            "set model.vocab_size=auto or a larger value"
        )
    return GPTConfig(
        n_layer=shape["n_layer"], n_head=shape["n_head"], n_embd=shape["n_embd"],
        block_size=shape["block_size"], vocab_size=vocab, dropout=cfg.model.dropout,
        bias=cfg.model.bias, init_std=cfg.model.init_std,
    )


def model_vocab(model: nn.Module) -> tuple[int | None, str]:
    """A user's model's vocabulary size and where it was read: its input embedding
    (``get_input_embeddings()``, Hugging Face), ``config.vocab_size``, ``vocab_size``, or the first
    nn.Embedding. (None, "") when the model shows none of them."""
    get = getattr(model, "get_input_embeddings", None)
    if callable(get):
        try:
            emb = get()
        except Exception:  # noqa: BLE001 - not implemented by this model
            emb = None
        if isinstance(emb, nn.Embedding):
            return emb.num_embeddings, "get_input_embeddings()"
    for owner, where in ((getattr(model, "config", None), "config.vocab_size"), (model, "vocab_size")):
        v = getattr(owner, "vocab_size", None) if owner is not None else None
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v, where
    for name, m in model.named_modules():
        if isinstance(m, nn.Embedding):
            return m.num_embeddings, f"the first nn.Embedding ({name})"
    return None, ""


def check_model_vocab(model: nn.Module, data_vocab: int | None, entrypoint: str) -> None:
    """Refuse, before the first step, a model whose vocabulary is smaller than the data's (the first batch
    with a token id past it would stop the run with an IndexError in the embedding)."""
    vocab, where = model_vocab(model)
    if data_vocab and vocab is not None and vocab < data_vocab:
        raise ConfigError(
            f"model.entrypoint={entrypoint!r}: the model's vocabulary ({vocab} tokens, from {where}) is smaller "
            f"than the data's ({data_vocab}, from the data's meta.json / vocab_size): token ids up to "
            f"{data_vocab - 1} would index past its embedding. Use data tokenized with the model's tokenizer, or "
            f"enlarge the model's vocabulary to at least {data_vocab} (Hugging Face: "
            f"model.resize_token_embeddings({data_vocab}))"
        )


def build_model(cfg: Config, *, data_vocab: int | None = None, device: str | torch.device = "cpu",
                materialize: bool = True) -> nn.Module:
    """Build on ``meta``; with ``materialize`` move to ``device`` (to_empty) and initialize with run.seed.

    Distributed code builds with ``materialize=False``, shards, then calls :func:`materialize`.
    """
    if cfg.model.hf is not None:  # a Hugging Face causal LM (built materialized, like an entrypoint model)
        from trainperf.models.hf import build_hf_model

        return build_hf_model(cfg, data_vocab=data_vocab, device=device)
    if cfg.model.entrypoint:
        fn = load_entrypoint(cfg.model.entrypoint)
        torch.manual_seed(cfg.run.seed)
        model = fn(cfg) if len(inspect.signature(fn).parameters) >= 1 else fn()
        if not isinstance(model, nn.Module):
            raise ConfigError(f"model.entrypoint={cfg.model.entrypoint!r} returned {type(model).__name__}, not an nn.Module")
        check_model_vocab(model, data_vocab, cfg.model.entrypoint)
        _no_kv_cache(model)
        if cfg.model.blocks:
            from trainperf.models.blocks import find_blocks, set_block_path

            find_blocks(model, cfg.model.blocks, field="model.blocks")
            set_block_path(model, cfg.model.blocks)
        return model.to(device)
    gcfg = gpt_config(cfg, data_vocab)
    with torch.device("meta"):
        model = GPT(gcfg)
    if materialize:
        materialize_model(model, device, cfg.run.seed)
    return model


def _no_kv_cache(model: nn.Module) -> None:
    """A Hugging Face model inside a user's wrapper: ``use_cache=False``. HF's default ``True`` makes each
    layer append to a KV cache during the forward, so a checkpointed block's recompute sees a different
    cache (other shapes, other ops) than its forward: selective checkpointing fails with "aten.slice.Tensor
    invocation index N ... not found in storage", full checkpointing with a shape error."""
    for mod in model.modules():
        config = getattr(mod, "config", None)
        if getattr(config, "use_cache", False) is True:
            config.use_cache = False


def materialize_model(model: nn.Module, device, seed: int) -> nn.Module:
    model.to_empty(device=device)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model.init_weights()
    return model
