"""Build the configured model: a reference GPT (on meta, then materialized) or a user's model."""

from __future__ import annotations

import inspect

import torch
import torch.nn as nn

from trainperf.config.resolve import model_shape
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
