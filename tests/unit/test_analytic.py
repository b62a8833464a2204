"""trainperf.analytic: each term against a hand-computed value (no torch)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from trainperf.analytic import BF16, MEGATRON, FP32_ADAM, TransformerSpec, layer_terms, per_layer_bytes
from trainperf.analytic.hf import from_hf_config
from trainperf.analytic.recompute import counts, plan_kinds, ratio_count
from trainperf.errors import UserError
from trainperf.hardware.catalog import get_gpu
from trainperf.planner.constants import DEFAULTS
from trainperf.planner.cost import Kernels, Layout, estimate
from trainperf.planner.model import from_preset

GPT = TransformerSpec(hidden=1024, layers=4, heads=16, seq=512, vocab=1000, bias=True, tied=True)


def test_gpt_layer_params_and_total():
    h = 1024
    assert GPT.layer_params() == 12 * h * h + 13 * h  # Narayanan: 12h^2 + 13h with biases
    assert GPT.params() == 4 * (12 * h * h + 13 * h) + (1000 + 512) * h + 2 * h


def test_llama_70b_counts_gqa():
    m = from_preset("llama-70b")
    h, kv = 8192, 8 * 128
    layer = h * h + 2 * h * kv + h * h + 3 * h * 28672 + 2 * h  # Q, K, V (GQA), O, SwiGLU, 2 RMSNorms
    assert m.layer_params() == layer
    assert m.params() == 80 * layer + 2 * 32000 * h + h  # untied output, final norm
    assert 68.9e9 < m.params() < 69.1e9  # Llama 2 70B (78B when GQA is ignored)


def test_flops_conventions():
    h, l, s, V = 1024, 4, 512, 1000
    assert GPT.model_flops_per_token() == pytest.approx(6 * (l * 12 * h * h + V * h) + 12 * l * h * s)
    n = GPT.params() - GPT.embedding_params()
    assert GPT.palm_flops_per_token() == pytest.approx(6 * n + 12 * l * h * s)
    assert GPT.recompute_flops_per_token(n_full=2) == pytest.approx(2 * (24 * h * h + 4 * h * s))
    assert GPT.recompute_flops_per_token(0, n_attention=4) == pytest.approx(4 * 4 * h * s)


def test_eager_activation_terms_are_korthikanti_table_2():
    # 16-bit, dropout with 1-byte masks, eager attention: 34 sbh + 5 a s^2 b per layer (no TP)
    m = TransformerSpec(hidden=1024, layers=2, heads=16, seq=512, vocab=1000, attention="eager")
    s, b, h, a = 512, 2, 1024, 16
    t = layer_terms(m, b, s, BF16, dropout=True)
    stats = 2 * 2 * 4 * b * s  # fp32 LayerNorm mean/rstd, which Table 2 leaves out
    assert per_layer_bytes(t, "none") == s * b * h * 34 + 5 * a * s * s * b + stats
    # TP 8 + SP + Megatron's selective: 34 sbh / t (the s^2 terms are recomputed)
    assert per_layer_bytes(t, "attention", tp=8, sp=True) == pytest.approx((34 * s * b * h + stats) / 8)
    assert per_layer_bytes(t, "full") == 2 * s * b * h  # the layer input only


def test_flash_activation_terms_keep_no_scores():
    m = TransformerSpec(hidden=1024, layers=2, heads=16, seq=512, vocab=1000, attention="flash")
    s, b, h, a = 512, 2, 1024, 16
    t = layer_terms(m, b, s, BF16, dropout=False)
    stats, lse = 2 * 2 * 4 * b * s, 4 * b * s * a
    # block input, residual, 2 norm outputs (8 sbh); Q, K, V, O (8 sbh); MLP fc out + GELU out (16 sbh)
    assert per_layer_bytes(t, "none") == 32 * s * b * h + stats + lse
    assert per_layer_bytes(t, "attention") == per_layer_bytes(t, "none")  # nothing s x s to drop
    doubled = per_layer_bytes(layer_terms(m, b, 2 * s, BF16), "none")
    assert doubled == pytest.approx(2 * per_layer_bytes(t, "none"))  # linear in s, never quadratic


def test_state_bytes_per_sharding():
    assert MEGATRON.per_param(0, 64) == 18
    assert MEGATRON.per_param(1, 64) == pytest.approx(2 + 4 + 12 / 64)
    assert MEGATRON.per_param(2, 64) == pytest.approx(2 + 16 / 64)
    assert FP32_ADAM.per_param(3, 64) == pytest.approx(16 / 64)
    assert FP32_ADAM.split(1000, zero=2, shard=10) == {"param": 4000, "grad": 400, "optimizer": 800}


def test_recompute_count_rounds_half_up_and_is_shared():
    assert ratio_count(4, 0.125) == 1  # 0.5 rounds up (Python's round() gave 0)
    assert ratio_count(10, 0.25) == 3  # 2.5 -> 3 (round() gave 2)
    assert counts("ratio", 10, ratio=0.25) == (3, 0)
    assert plan_kinds("ratio", 10, ratio=0.25).count("full") == 3
    assert counts("every_k", 10, every_k=4) == (3, 0)


def test_gemm_soft_roofline_and_generations():
    a100 = Kernels(get_gpu("a100-80gb"), DEFAULTS)
    m = n = k = 8192
    flops, nbytes = 2 * m * n * k, 2 * 3 * m * n
    rate = 267.9e12 * DEFAULTS.stack_efficiency  # the A100's published maximum achievable matmul FLOPS (planner/parts.py)
    hbm = 2.039e12 * DEFAULTS.hbm_fraction
    # 8192 x 8192 output in 256 x 128 tiles: 2048 tiles on 108 SMs run in 19 waves (2052 slots)
    waves = 2048 / (19 * 108)
    expect = flops / (rate * waves) + DEFAULTS.gemm_memory_weight * nbytes / hbm + DEFAULTS.kernel_overhead_s
    assert a100.gemm(m, n, k) == pytest.approx(expect)
    from dataclasses import replace

    ideal = replace(DEFAULTS, wave_quantization=0)
    a100i, h100i = Kernels(get_gpu("a100-80gb"), ideal), Kernels(get_gpu("h100-sxm"), ideal)

    def frac(kern, peak, d):  # fraction of the dense peak reached on a d x d x d GEMM
        return 2 * d**3 / kern.gemm(d, d, d) / peak
    # roofline alone: the same shapes reach a lower fraction of the larger H100 peak, most at small sizes
    for d in (1024, 2048, 8192):
        assert frac(h100i, 989e12, d) < frac(a100i, 312e12, d)
    assert frac(h100i, 989e12, 1024) / frac(a100i, 312e12, 1024) < frac(h100i, 989e12, 8192) / frac(a100i, 312e12, 8192)
    # wave quantization: 2048 x 2048 is 128 tiles, 2 waves on the A100's 108 SMs, 1 on the H100's 132
    h100 = Kernels(get_gpu("h100-sxm"), DEFAULTS)
    assert frac(a100, 312e12, 2048) / frac(a100i, 312e12, 2048) < 0.7  # the math at 128 / 216 slots
    assert frac(h100, 989e12, 2048) / frac(h100i, 989e12, 2048) > 0.9


def test_flash_time_hand_value():
    k = Kernels(get_gpu("a100-80gb"), DEFAULTS)
    b, heads, s, d = 1, 8, 4096, 128
    scores = b * heads * s * s * 0.5
    mamf = 267.9 / 312  # the A100's GEMM ceiling as a fraction of its peak (planner/parts.py)
    mm = 4 * scores * d / (312e12 * mamf * DEFAULTS.stack_efficiency * DEFAULTS.attention_efficiency)
    sm = DEFAULTS.softmax_ops_per_score * scores / (19.5e12 * mamf * DEFAULTS.stack_efficiency)
    fwd, bwd = k.flash(b, heads, s, s, d, 0.5)
    assert fwd == pytest.approx(mm + sm + DEFAULTS.kernel_overhead_s)
    assert bwd == pytest.approx(2.5 * mm + 2 * sm + 2 * DEFAULTS.kernel_overhead_s)


def test_bandwidth_inside_and_across_nodes():
    k = Kernels(get_gpu("a100-80gb"), DEFAULTS)
    nvlink, nic = 300e9 * 0.8, 25e9 * 0.8
    assert k.bandwidth(8, 1) == pytest.approx(nvlink)
    assert k.bandwidth(64, 1) == pytest.approx(min(nvlink, 8 * nic))  # 8 NICs per node carry the ring
    assert k.bandwidth(64, 8) == pytest.approx(nic)  # one member per node (TP 8 inside): one NIC
    # NCCL's ring in one node: 7 steps at tuning.cc's Simple latency (8.4 us + 7 x 3.4 us) for a large buffer
    assert k.half_collective(1e9, 8, nvlink) == pytest.approx(7 / 8 * 1e9 / nvlink + (8.4 + 7 * 3.4) * 1e-6)
    from dataclasses import replace

    old = Kernels(get_gpu("a100-80gb"), replace(DEFAULTS, nccl_tuning=0))  # per log2 of the ranks
    assert old.half_collective(1e9, 8, nvlink) == pytest.approx(7 / 8 * 1e9 / nvlink + 3 * DEFAULTS.collective_latency_s)


def test_fsdp_traffic_is_per_layer_and_shrinks_with_micro_batch_share():
    m = TransformerSpec(hidden=8192, layers=80, heads=64, seq=2048, vocab=50368)
    g = get_gpu("a100-40gb")
    small = estimate(m, g, Layout(1, 1, 64, 2, recompute="full", zero=3), 512)
    large = estimate(m, g, Layout(1, 1, 64, 8, recompute="full", zero=3), 512)
    assert small.time["fsdp_comm"] > large.time["fsdp_comm"] > 0  # 4x the micro-batches, 4x the gathers
    assert small.memory["fsdp_unsharded"] == pytest.approx((2 * 2 + 2) * m.layer_params())


def test_hsdp_shards_states_over_the_group_only():
    m = TransformerSpec(hidden=4096, layers=32, heads=32, seq=2048, vocab=50368)
    g = get_gpu("a100-80gb")
    full = estimate(m, g, Layout(1, 1, 64, 1, recompute="full", zero=3), 512)
    hsdp = estimate(m, g, Layout(1, 1, 64, 1, recompute="full", zero=3, shard=8), 512)
    assert hsdp.memory["model_states"] == pytest.approx(8 * full.memory["model_states"])
    assert hsdp.time["dp_comm"] > 0 == full.time["dp_comm"]


def test_hf_config_llama_and_gpt2(tmp_path):
    llama = {"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
             "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256,
             "tie_word_embeddings": False, "max_position_embeddings": 8192, "hidden_act": "silu"}
    (tmp_path / "config.json").write_text(json.dumps(llama))
    m = from_hf_config(str(tmp_path))
    assert (m.kv, m.ffn, m.gated, m.tied, m.position, m.seq) == (8, 14336, True, False, "rope", 4096)
    assert 8.0e9 < m.params() < 8.1e9  # Llama 3 8B: 8.03B
    gpt2 = {"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "n_positions": 1024, "vocab_size": 50257}
    p = tmp_path / "gpt2.json"
    p.write_text(json.dumps(gpt2))
    g = from_hf_config(str(p))
    assert (g.tied, g.position, g.bias, g.gated, g.max_positions, g.seq) == (True, "learned", True, False, 1024, 1024)
    assert g.params() == 124_439_808  # GPT-2 small as transformers counts it
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"model_type": "llama", "hidden_size": 4096}))
    with pytest.raises(UserError, match="num_hidden_layers"):
        from_hf_config(str(bad))


def test_hf_config_head_dim_set_apart_encoders_and_encoder_decoders(tmp_path):
    def read(cfg):
        p = tmp_path / "config.json"
        p.write_text(json.dumps(cfg))
        return from_hf_config(str(p))

    # Gemma 7B: 16 heads of 256 on h = 3072 (Q and O are 4096 wide): 8.54B as published, not 8.19B
    gemma = read({"model_type": "gemma", "hidden_size": 3072, "intermediate_size": 24576, "num_attention_heads": 16,
                  "num_hidden_layers": 28, "num_key_value_heads": 16, "head_dim": 256, "vocab_size": 256000,
                  "max_position_embeddings": 8192, "hidden_activation": "gelu_pytorch_tanh",
                  "tie_word_embeddings": True})
    assert (gemma.head_dim, gemma.q_dim, gemma.kv_dim) == (256, 4096, 4096)
    assert 8.53e9 < gemma.params() < 8.55e9
    assert gemma.attention_flops_fwd() == 4.0 * 4096 * gemma.seq
    plain = gemma.with_(head_dim_size=None, hidden=4096)
    assert plain.q_dim == 4096 and "head_dim=" not in plain.describe() and "head_dim=256" in gemma.describe()
    # head_dim equal to hidden / heads is the usual shape: nothing set apart
    assert read({"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 2, "num_attention_heads": 32,
                 "head_dim": 128, "vocab_size": 1000}).head_dim_size is None
    # an encoder's attention is bidirectional: every score block runs (causal models skip half)
    bert = read({"architectures": ["BertForMaskedLM"], "model_type": "bert", "hidden_size": 768, "num_hidden_layers": 12,
                 "num_attention_heads": 12, "intermediate_size": 3072, "vocab_size": 30522,
                 "max_position_embeddings": 512})
    assert (bert.causal_fraction, bert.seq, bert.bias, bert.position, bert.tied) == (1.0, 512, True, "learned", True)
    gpu = get_gpu("a100-80gb")
    lay = Layout(1, 1, 1, 8, 1, "none", False, 0, 1)
    causal = estimate(bert.with_(causal_fraction=0.5), gpu, lay, 8).time["compute"]
    assert estimate(bert, gpu, lay, 8).time["compute"] > causal
    # T5 / BART: two stacks with cross-attention; read as one decoder they would be planned at half size
    for cfg in ({"model_type": "t5", "d_model": 512, "num_heads": 8, "num_layers": 6, "vocab_size": 32128},
                {"model_type": "custom", "hidden_size": 1024, "num_hidden_layers": 12, "num_attention_heads": 16,
                 "vocab_size": 50265, "decoder_layers": 12}):
        with pytest.raises(UserError, match="an encoder-decoder model"):
            read(cfg)


def test_plan_hf_config_cli(tmp_path):
    cfg = {"model_type": "llama", "hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 32,
           "num_key_value_heads": 8, "intermediate_size": 8192, "vocab_size": 128256, "tie_word_embeddings": True,
           "max_position_embeddings": 131072}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    res = subprocess.run([sys.executable, "-m", "trainperf", "plan", "--hf-config", str(tmp_path / "config.json"),
                          "--gpus", "8", "--json", "--top", "2"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["model"]["kv_heads"] == 8 and out["model"]["tied"] is True and out["model"]["seq"] == 4096
    for cand in out["candidates"]:
        assert cand["fits"] is True and cand["binding_memory_term"] in cand["memory_gib"]
        assert {"compute", "tp_comm", "fsdp_comm", "pp_bubble", "dp_comm"} <= set(cand["time_s"])
