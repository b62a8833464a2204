"""One analytic model: memory estimate, planner and MFU agree on the same shape; the FlashAttention
activation term matches a measured CPU run of the reference GPT with SDPA."""

from __future__ import annotations

import types

import pytest
import torch

from trainperf.analytic import BF16, layer_terms, per_layer_bytes
from trainperf.analytic.activations import precision_for
from trainperf.hardware.catalog import get_gpu
from trainperf.memory.ac import apply_ac
from trainperf.memory.estimate import GPTShape, estimate_gpt
from trainperf.memory.measure import measure_activations
from trainperf.memory.plan import Plan
from trainperf.models.gpt import GPT, GPTConfig
from trainperf.models.presets import get_shape
from trainperf.monitor import flops as F
from trainperf.planner.constants import DEFAULTS
from trainperf.planner.cost import Layout, estimate, layer_cost


def _tiny(**kw):
    s = get_shape("tiny")
    cfg = dict(n_layer=s.n_layer, n_head=s.n_head, n_embd=s.n_embd, block_size=s.block_size, vocab_size=s.vocab_size)
    cfg.update(kw)
    return GPTConfig(**cfg)


def _measured(cfg: GPTConfig, b: int, s: int) -> int:
    torch.manual_seed(0)
    model = GPT(cfg)
    idx = torch.randint(0, cfg.vocab_size, (b, s))
    return measure_activations(model, (idx, idx.clone())).bytes


def test_flash_activation_term_matches_a_measured_sdpa_layer():
    # One layer's bytes = (3-layer model) - (2-layer model), fp32 on CPU, SDPA's fused kernel (dropout 0).
    b, s = 2, 128
    one_layer = _measured(_tiny(n_layer=3), b, s) - _measured(_tiny(n_layer=2), b, s)
    spec = GPTShape.of(_tiny()).spec(s)
    term = per_layer_bytes(layer_terms(spec, b, s, precision_for("fp32", device="cpu"), device="cpu"), "none")
    assert abs(term / one_layer - 1) < 0.05, (term, one_layer)
    # no s x s scores: doubling s doubles the layer's bytes (eager attention would more than double it)
    half = _measured(_tiny(n_layer=3), b, s // 2) - _measured(_tiny(n_layer=2), b, s // 2)
    assert 1.9 < one_layer / half < 2.1  # linear in s


def test_mfu_from_the_analytic_spec_equals_the_monitor_on_gpt_tiny():
    cfg = _tiny()
    model = GPT(cfg)
    s = cfg.block_size
    spec = GPTShape.of(cfg).spec(s)
    assert spec.params() == model.num_params()
    assert spec.palm_flops_per_token(s) == model.flops_per_token(s) == F.formula_flops_per_token(model, s)
    peak = {"peak_flops": 1e12}
    monitor = F.utilization(5000.0, {"flops_per_token_formula": F.formula_flops_per_token(model, s)}, peak)
    assert monitor["mfu"] == pytest.approx(5000.0 * spec.palm_flops_per_token(s) / 1e12)


def test_recompute_count_is_the_checkpointing_count():
    model = GPT(_tiny())  # 4 blocks; ratio 0.125 -> 0.5 block: both round to one block now
    plan = apply_ac(model, mode="ratio", ratio=0.125)
    extra, how = F.recompute_flops_per_token(model, 128, types.SimpleNamespace(mode="ratio", ratio=0.125, every_k=4))
    n_block = sum(p.numel() for p in model.layers.parameters()) / 4
    assert len(plan.full) == 1 and extra == pytest.approx(2 * n_block + 4 * 128 * 128) and "1/4" in how


def test_memory_planner_and_mfu_agree_on_one_shape():
    cfg = GPTConfig(n_layer=4, n_head=8, n_embd=512, block_size=256, vocab_size=1000, bias=True)
    shape = GPTShape.of(cfg)
    spec = shape.spec()
    b, s = 2, 256
    # parameters: memory estimate (fp32 states, 4 B each), the model, the planner's spec
    est = estimate_gpt(shape, micro_batch=b, dtype="bf16", plan=Plan(), device="cuda")
    assert est.params == 4 * spec.params() == 4 * GPT(cfg).num_params()
    # activations per layer: the memory estimate and the planner both read analytic.layer_terms
    prec = precision_for("bf16", device="cuda")
    assert est.detail["per_layer_bytes"]["none"] == int(per_layer_bytes(layer_terms(spec, b, s, prec), "none"))
    g = get_gpu("a100-80gb")
    lc = layer_cost(spec, g, DEFAULTS, 1, b, False, "none")
    assert lc["act_bytes"] == per_layer_bytes(layer_terms(spec, b, s, BF16), "none")
    # FLOPs: planner model FLOPs and the monitor's PaLM figure differ only by convention
    plan_est = estimate(spec, g, Layout(1, 1, 1, b, recompute="none"), b)
    assert plan_est.model_flops == pytest.approx(spec.model_flops_per_token() * s * b)
    non_matmul = spec.params() - spec.embedding_params() - 4 * spec.layer_matmul_params() - spec.vocab * spec.hidden
    assert F.formula_flops_per_token(GPT(cfg), s) == pytest.approx(spec.model_flops_per_token() + 6 * non_matmul)
