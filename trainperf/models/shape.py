"""The shape of the configured model, read without building it: the reference GPT's preset with the config's
explicit fields, or a Hugging Face model's config (``model.hf``). The tokens per sample follow from it.
Torch-free for the reference GPT (``models.hf`` is imported only for a ``model.hf`` config)."""

from __future__ import annotations

from trainperf.config.schema import Config
from trainperf.models.presets import get_shape


def model_shape(cfg: Config) -> dict:
    """The reference GPT shape this config asks for (preset + explicit fields)."""
    if cfg.model.hf is not None:  # a Hugging Face model: its config says its shape
        from trainperf.models.hf import shape_for_resolve

        return shape_for_resolve(cfg)
    shape = get_shape(cfg.model.preset).as_dict()
    for key in ("n_layer", "n_head", "n_embd", "block_size"):
        val = getattr(cfg.model, key)
        if val is not None:
            shape[key] = val
    if cfg.model.vocab_size != "auto":
        shape["vocab_size"] = cfg.model.vocab_size
    return shape


def seq_len_of(cfg: Config) -> int:
    """Tokens per sample: the reference GPT's context, or ``model.block_size`` (default 128) for a user's model."""
    if cfg.model.entrypoint:
        return cfg.model.block_size or 128
    return model_shape(cfg)["block_size"]
