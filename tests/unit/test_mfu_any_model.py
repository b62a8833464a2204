"""MFU for every model that trains: a Hugging Face Llama inside a user's own wrapper (``model.entrypoint``) whose
loss calls ``.view`` on the targets gets its formula from the config found inside the wrapper and its FLOPs
counted on the real step (the batch and targets that step trains on); a model no formula knows gets its MFU
from the counted FLOPs, and every output says which convention it used. Tiny configs built from dicts:
nothing downloaded."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

transformers = pytest.importorskip("transformers", reason="transformers not installed")

from tests.conftest import TINY, run_cli  # noqa: E402
from trainperf.config import load_config  # noqa: E402
from trainperf.train.resolve import resolve  # noqa: E402
from trainperf.train.build import build_trainer  # noqa: E402
from trainperf.train.run import fit  # noqa: E402

LLAMA = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 32}


class Wrapped(nn.Module):
    """The common pattern: the user's module holds the HF model one level down (``self.core.lm``) and computes
    the loss itself, with ``.view`` (which refuses non-contiguous targets)."""

    def __init__(self):
        super().__init__()
        self.core = nn.ModuleDict({"lm": transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA))})

    def forward(self, idx, targets=None):
        logits = self.core["lm"](input_ids=idx).logits  # (B, T, V)
        if targets is None:
            return logits, None
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def wrapped_llama():
    return Wrapped()


class NoFormula(nn.Module):
    """A model no formula knows: no flops_per_token, no config, no cfg."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(256, 32)
        self.mix = nn.Sequential(nn.Linear(32, 128), nn.GELU(), nn.Linear(128, 32))
        self.out = nn.Linear(32, 256)

    def forward(self, idx, targets=None):
        logits = self.out(self.mix(self.emb(idx)))  # (B, T, V)
        loss = None if targets is None else F.cross_entropy(logits.view(-1, 256), targets.view(-1))
        return logits, loss


def no_formula():
    return NoFormula()


def _train(tmp_path, entry: str, extra=()):
    ov = TINY + ["data.source=synthetic", f"model.entrypoint={__name__}:{entry}", "run.steps=4",
                 f"run.dir={tmp_path / 'run'}", "checkpoint.at_end=false", *extra]
    trainer = build_trainer(resolve(load_config(None, ov), world_size=1), verbose=False)
    return fit(trainer, resume="never", verbose=False)


def test_hf_llama_in_a_wrapper_that_views_its_targets_gets_mfu(tmp_path):
    s = _train(tmp_path, "wrapped_llama")
    assert s["mfu"] is not None and s["mfu"] > 0 and s["mfu_source"] == "formula", s
    assert "config of submodule 'core.lm'" in s["flops_formula_note"], s["flops_formula_note"]
    assert "PaLM" in s["mfu_convention"]
    # counted on the real step (its contiguous targets): no view error
    assert s["flops_per_token_counted"] is not None, s["flops_counted_note"]
    assert "real training step 1" in s["flops_counted_note"]
    # the formula and the counted forward agree (3 x forward is the same 6N convention)
    assert 0.9 < 3 * s["flops_per_token_counted_forward"] / s["flops_per_token_formula"] < 1.1, s
    # the step records carry MFU, and diagnose names the convention
    recs = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert all(r.get("mfu") for r in recs if "step_time_s" in r)
    r = run_cli(["diagnose", str(tmp_path / "run")])
    assert r.returncode == 0 and "MFU convention: model FLOPs 6N+12*l*h*s" in r.stdout, r.stdout


def test_formula_found_at_any_depth_counts_the_whole_wrapper():
    from trainperf.models.hf import find_hf_module
    from trainperf.monitor.flops import formula_with_note

    m = Wrapped()
    path, hf = find_hf_module(m)
    assert path == "core.lm" and hf is m.core["lm"]  # the outermost module with a config, two levels down
    fpt, _ = formula_with_note(m, 32)
    n = sum(p.numel() for p in m.parameters()) - 256 * 32  # untied: the input embedding is a lookup
    assert fpt == 6 * n + 12 * 2 * 32 * 32
    m.extra_head = nn.Linear(32, 32)  # the wrapper's own layers count in N
    assert formula_with_note(m, 32)[0] == fpt + 6 * (32 * 32 + 32)


def test_a_model_without_a_formula_gets_mfu_from_counted_flops(tmp_path):
    s = _train(tmp_path, "no_formula")
    assert s["flops_per_token_formula"] is None and "no FLOP formula" in s["flops_formula_note"]
    assert s["mfu"] is not None and s["mfu_source"] == "counted", s
    assert "3 x its forward FLOPs" in s["mfu_convention"]
    # the counted model FLOPs are the matmuls: 2 x weights per token forward, 3x that with the backward
    weights = 32 * 128 + 128 * 32 + 32 * 256
    assert s["flops_per_token_counted_forward"] == 2 * weights
    assert s["mfu"] == pytest.approx(s["tokens_per_s"] * 3 * 2 * weights / s["peak_flops"])
    r = run_cli(["diagnose", str(tmp_path / "run")])
    assert r.returncode == 0 and "MFU convention: model FLOPs counted on a real training step" in r.stdout, r.stdout
    r = run_cli(["report", str(tmp_path / "run")])
    assert r.returncode == 0
    assert "3 x its forward FLOPs" in (tmp_path / "run" / "report.html").read_text()


def test_with_checkpointing_the_counted_mfu_leaves_the_recompute_out(tmp_path):
    """Full recompute adds forward FLOPs inside the backward: HFU sees them, the counted MFU does not."""
    plain = _train(tmp_path / "a", "wrapped_llama")
    ac = _train(tmp_path / "b", "wrapped_llama", ["memory.checkpointing.mode=full"])
    assert ac["flops_per_token_counted"] > plain["flops_per_token_counted"]
    assert ac["flops_per_token_counted_forward"] == plain["flops_per_token_counted_forward"]


def test_compiled_model_is_counted_on_its_second_step(tmp_path):
    s = _train(tmp_path, "no_formula", ["compile.enabled=true"])
    if "compile" in (s.get("notes") or {}) and "fell back" in s["notes"]["compile"]:
        pytest.skip(f"torch.compile unavailable here: {s['notes']['compile']}")
    assert "real training step 2" in s["flops_counted_note"], s["flops_counted_note"]
    assert s["flops_per_token_counted_forward"] == 2 * (32 * 128 + 128 * 32 + 32 * 256)
