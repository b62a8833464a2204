"""Shapes of the reference decoder-only transformers (no torch import).

Used by the model builder (``model.preset``), the memory estimator and the
planner. ``vocab_size`` here is the shape's published vocabulary; the trainer
replaces it by the data's vocabulary when ``model.vocab_size`` is ``auto``.
Sources: GPT-2 (Radford et al. 2019), GPT-3 (Brown et al. 2020, Table 2.1),
Megatron runs (Korthikanti et al. 2022, Table 5), Llama 2 (Touvron et al. 2023).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Shape:
    n_layer: int
    n_head: int
    n_embd: int
    block_size: int
    vocab_size: int
    # Only for planning presets that are not GPT-2 style (e.g. Llama's SwiGLU width).
    ffn_hidden: int | None = None
    note: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


PRESETS: dict[str, Shape] = {
    # Trains on 2 CPU cores in minutes (byte-level vocabulary of 256).
    "tiny": Shape(4, 4, 128, 128, 256, note="CPU default"),
    "gpt2-124m": Shape(12, 12, 768, 1024, 50304, note="GPT-2 small, vocab padded to 50304"),
    "gpt2-350m": Shape(24, 16, 1024, 1024, 50304, note="GPT-2 medium"),
    "gpt2-774m": Shape(36, 20, 1280, 1024, 50304, note="GPT-2 large"),
    "gpt2-1.5b": Shape(48, 25, 1600, 1024, 50304, note="GPT-2 XL"),
    "gpt3-1.3b": Shape(24, 16, 2048, 2048, 51200, note="GPT-3 XL"),
    "gpt3-6.7b": Shape(32, 32, 4096, 2048, 51200, note="GPT-3 6.7B"),
    "gpt3-13b": Shape(40, 40, 5120, 2048, 51200, note="GPT-3 13B"),
    "gpt-22b": Shape(48, 64, 6144, 2048, 51200, note="Megatron 22B (Korthikanti 2022)"),
    "gpt3-175b": Shape(96, 96, 12288, 2048, 51200, note="GPT-3 175B"),
    "gpt-530b": Shape(105, 128, 20480, 2048, 51200, note="Megatron-Turing 530B"),
    "gpt3-1t": Shape(128, 160, 25600, 2048, 51200, note="Megatron 1T (Korthikanti 2022)"),
    "llama-70b": Shape(80, 64, 8192, 4096, 32000, ffn_hidden=28672, note="Llama 2 70B (GQA ignored)"),
}


def get_shape(name: str) -> Shape:
    try:
        return PRESETS[name]
    except KeyError:
        import difflib

        close = difflib.get_close_matches(name, PRESETS, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        from trainperf.errors import ConfigError

        raise ConfigError(
            f"model preset {name!r} is unknown{hint} Known presets: {', '.join(PRESETS)}"
        ) from None
