"""Planner cost model and hardware catalog: formulas, monotonic behaviour, overrides."""

from __future__ import annotations

from dataclasses import replace

import pytest

from trainperf.errors import UserError
from trainperf.hardware.catalog import CATALOG, get_gpu, load_catalog, lookup_gpu
from trainperf.planner import DEFAULTS, Layout, ModelSpec, estimate, from_preset

A100 = get_gpu("a100-80gb")
M175 = from_preset("gpt3-175b", attention="eager")  # Megatron 2022: the s x s scores are kept


def test_params_match_narayanan_formula():
    m = M175
    h, l, V, s = m.hidden, m.layers, m.vocab, m.seq
    formula = 12 * l * h * h * (1 + 13 / (12 * h) + (V + s) / (12 * l * h))
    assert abs(m.params() - formula) / formula < 1e-4
    assert 170e9 < m.params() < 180e9


def test_model_flops_match_korthikanti_formula():
    m = M175
    h, l, V, s = m.hidden, m.layers, m.vocab, m.seq
    formula = 72 * s * l * h * h * (1 + s / (6 * h) + V / (12 * h * l))
    assert s * m.model_flops_per_token() == pytest.approx(formula, rel=1e-9)
    full = 96 * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))  # Narayanan 2021
    assert s * m.hardware_flops_per_token(n_full=l) == pytest.approx(full, rel=1e-9)
    # FlashAttention's backward recomputes QK^T: + 2*a*d*s per layer and token in hardware FLOPs
    flash = replace(m, attention="flash")
    assert flash.hardware_flops_per_token() - flash.model_flops_per_token() == pytest.approx(l * 2 * h * s)


def _est(**kw):
    base = dict(tp=8, pp=8, dp=1, micro_batch=1, interleave=1, recompute="selective", sequence_parallel=True)
    base.update(kw)
    return estimate(M175, A100, Layout(**base), 64)


def test_memory_savers_order():
    none = _est(recompute="none", sequence_parallel=False).memory["activations"]
    sel = _est(recompute="selective", sequence_parallel=False).memory["activations"]
    sp_sel = _est().memory["activations"]
    full = _est(recompute="full").memory["activations"]
    assert none > sel > sp_sel > full


def test_recompute_costs_time():
    assert _est(recompute="full").step_time_s > _est(recompute="selective").step_time_s > _est(recompute="none").step_time_s


def test_zero_stages_shrink_model_states():
    model = from_preset("gpt3-13b")
    g = get_gpu("a100-80gb")
    states = [estimate(model, g, Layout(1, 1, 64, 1, zero=z), 512).memory["model_states"] for z in range(4)]
    assert states[0] > states[1] > states[2] > states[3]
    # Megatron 18 B/param replicated vs FSDP's sharded fp32 master: 16 B/param over 64 ranks
    assert states[0] / states[3] == pytest.approx(18 / (16 / 64), rel=1e-6)


def test_interleaving_shrinks_bubble():
    assert _est(interleave=3).time["pp_bubble"] < _est(interleave=1).time["pp_bubble"] / 2


def test_tp_across_nodes_is_slower():
    m = from_preset("gpt-22b")
    inside = estimate(m, A100, Layout(8, 1, 2, 1), 64)
    across = estimate(m, A100, Layout(16, 1, 1, 1), 64)
    # across two nodes the all-reduce runs over 8 NICs per node (20 GB/s each) instead of NVLink (240 GB/s)
    assert across.time["tp_comm"] > 1.4 * inside.time["tp_comm"]


def test_faster_gpu_is_faster_and_bigger_gpu_holds_more():
    lay = Layout(8, 8, 1, 1, 1, "selective", True)
    a100 = estimate(M175, A100, lay, 64)
    h100 = estimate(M175, get_gpu("h100-sxm"), lay, 64)
    assert h100.step_time_s < a100.step_time_s / 2
    assert get_gpu("h200").hbm_bytes > get_gpu("h100-sxm").hbm_bytes


def test_constants_override_and_errors():
    c = DEFAULTS.with_overrides(["nvlink_fraction=0.4", "p2p_overlap=0"])
    assert c.nvlink_fraction == 0.4 and c.p2p_overlap == 0
    slow = estimate(M175, A100, Layout(8, 8, 1, 1, 1, "selective", True), 64, c)
    assert slow.time["tp_comm"] > _est().time["tp_comm"] * 1.5  # bandwidth term halves, latency stays
    with pytest.raises(UserError, match="nvlink_fraction"):
        DEFAULTS.with_overrides(["nvlink_fractio=0.5"])
    with pytest.raises(UserError, match="between 0 and 1"):
        DEFAULTS.with_overrides(["hbm_fraction=1.5"])
    names = [n for n, _, doc in DEFAULTS.describe() if doc]
    assert len(names) == len(DEFAULTS.as_dict())  # every constant documented


@pytest.mark.parametrize("name,key", [
    ("NVIDIA A100-SXM4-80GB", "a100-80gb"), ("NVIDIA A100-SXM4-40GB", "a100-40gb"),
    ("NVIDIA A100-PCIE-40GB", "a100-pcie-40gb"), ("NVIDIA A100 80GB PCIe", "a100-pcie-80gb"),
    ("NVIDIA H100 80GB HBM3", "h100-sxm"),
    ("NVIDIA H100 PCIe", "h100-pcie"), ("NVIDIA H200", "h200"), ("h200", "h200"), ("cpu", "cpu"),
    ("Tesla V100-SXM2-16GB", "v100-16gb"), ("Tesla V100-SXM2-32GB", "v100-32gb"),
    ("Tesla V100-SXM3-32GB", "v100-32gb"), ("Tesla V100-PCIE-16GB", "v100-pcie-16gb"),
    ("Tesla V100-PCIE-32GB", "v100-pcie-32gb"), ("NVIDIA A800-SXM4-80GB", "a800-80gb"),
    ("NVIDIA H800", "h800"), ("NVIDIA H800 80GB HBM3", "h800"), ("NVIDIA B200", "b200"),
    ("NVIDIA L40S", "l40s"), ("NVIDIA L4", "l4"), ("AMD Instinct MI250X", "mi250x"),
    ("AMD Instinct MI300X", "mi300x"),
])
def test_lookup_gpu_by_nvml_name(name, key):
    assert lookup_gpu(name).key == key


def test_lookup_unknown_and_dense_peaks():
    # parts with their own peaks that the catalog does not hold are unknown, never a neighbour's figures
    for name in ("NVIDIA H100 NVL", "NVIDIA GB200", "NVIDIA GH200 480GB", "NVIDIA L40", "AMD Instinct MI250",
                 "NVIDIA H800 PCIe", "Tesla T4"):
        assert lookup_gpu(name) is None, name
    assert CATALOG["h100-sxm"].bf16_tflops == 989  # dense, never the 1,979 sparse figure
    assert CATALOG["a100-80gb"].peak_tflops("tf32") == 156
    with pytest.raises(UserError, match="a100-80gb"):
        get_gpu("t4")
    # doctor/probe read the peak through vars(): a numeric field with "bf16" in its name.
    assert vars(lookup_gpu("NVIDIA H200"))["bf16_tflops"] == 989


def test_catalog_yaml_extension(tmp_path):
    f = tmp_path / "cat.yaml"
    f.write_text("gpus:\n  my-h100:\n    base: h100-sxm\n    internode_gbps: 12.5\n    aliases: ['ACME H100']\n"
                 "  mi-x:\n    bf16_tflops: 100\n    fp16_tflops: 100\n    tf32_tflops: 50\n    fp32_tflops: 25\n"
                 "    hbm_gib: 64\n    hbm_tbps: 1.6\n    nvlink_gbps: 400\n    internode_gbps: 25\n    gpus_per_node: 8\n")
    cat = load_catalog(str(f))
    assert cat["my-h100"].internode_gbps == 12.5 and cat["my-h100"].bf16_tflops == 989
    assert lookup_gpu("ACME H100", cat).key == "my-h100"
    assert cat["mi-x"].hbm_gib == 64
    bad = tmp_path / "bad.yaml"
    bad.write_text("gpus:\n  x:\n    base: h100-sxm\n    hbm_gb: 3\n")
    with pytest.raises(UserError, match="unknown field"):
        load_catalog(str(bad))
    partial = tmp_path / "partial.yaml"
    partial.write_text("gpus:\n  y:\n    bf16_tflops: 10\n")
    with pytest.raises(UserError, match="lacks"):
        load_catalog(str(partial))
    # Hopper inherits its mma.sync limit through base:, a new part defaults to none, and the fraction is checked
    assert cat["my-h100"].mma_sync_fraction == pytest.approx(2 / 3) and cat["mi-x"].mma_sync_fraction == 1.0
    frac = tmp_path / "frac.yaml"
    frac.write_text("gpus:\n  z:\n    base: a100-80gb\n    mma_sync_fraction: 1.5\n")
    with pytest.raises(UserError, match=r"mma_sync_fraction=1.5 must be in \(0, 1\]"):
        load_catalog(str(frac))


def test_swiglu_model_counts_three_mlp_matrices():
    m = ModelSpec(hidden=8192, layers=80, heads=64, seq=4096, vocab=32000, ffn_hidden=28672, gated=True)
    assert m.layer_matmul_params() == 4 * 8192**2 + 3 * 8192 * 28672
    assert replace(m, gated=False).layer_matmul_params() < m.layer_matmul_params()


def test_fp8_casts_of_activations_cost_less_when_a_fused_producer_took_their_amax():
    # torchao under torch.compile (or TE's fused norm-cast) computes an activation's amax in the kernel that
    # wrote it: 3 bytes per element instead of 5; the weight's cast is never fused. Only FP8 GEMMs pay casts.
    from trainperf.planner.kernels import CAST_EAGER, CAST_FUSED, Kernels

    k = Kernels(get_gpu("h100-sxm"), DEFAULTS)
    m, n, kk = 8192.0, 4096.0, 4096.0
    eager, fused = k.gemm_fwd_bwd(m, n, kk, fp8=True), k.gemm_fwd_bwd(m, n, kk, fp8=True, fused=True)
    saved = (CAST_EAGER - CAST_FUSED) / k.hbm
    assert eager[0] - fused[0] == pytest.approx(saved * m * kk)                  # X
    assert eager[1] - fused[1] == pytest.approx(saved * (m * n + kk * m + m * n))  # dY (dgrad), X and dY (wgrad)
    assert k.gemm_fwd_bwd(m, n, kk) == k.gemm_fwd_bwd(m, n, kk, fused=True)      # BF16: no casts at all


def test_sharded_optimizer_all_reducing_the_whole_gradient_doubles_its_traffic():
    # DeepSpeed's BF16_Optimizer under the pipeline engine all-reduces the whole FP32 gradient buffer
    # (each rank then steps its shard); Megatron's distributed optimizer reduce-scatters it: a ring all-reduce
    # is a reduce-scatter plus an all-gather, so the gradient part of the DP time doubles; the parameter
    # all-gather after the step is the same in both
    from trainperf.planner.stack import Stack

    model = from_preset("gpt3-13b")
    lay = Layout(2, 1, 32, 4, zero=1)
    rs_stack = Stack("rs", dp_reduce="after", distributed_optimizer=True)
    ar_stack = replace(rs_stack, grad_reduce_op="all-reduce")
    no_dp = replace(rs_stack, distributed_optimizer=True)
    rs = estimate(model, A100, lay, 512, stack=rs_stack).time["dp_comm"]
    ar = estimate(model, A100, lay, 512, stack=ar_stack).time["dp_comm"]
    from trainperf.planner.kernels import Kernels

    k = Kernels(A100, DEFAULTS)
    dev_params = (model.layers * model.layer_params() + model.embedding_params()) / 2
    gather = k.gather_group(dev_params * DEFAULTS.param_bytes, 32, 2)
    # the bytes double; NCCL's latency of an all-reduce (ring or tree) is not exactly twice a reduce-scatter's
    assert ar - gather == pytest.approx(2 * (rs - gather), rel=1e-3)
    assert ar > rs > gather > 0
    # ZeRO-0 (DDP all-reduce) and FSDP are not touched by it
    for zero in (0, 3):
        z = Layout(2, 1, 32, 4, zero=zero)
        assert (estimate(model, A100, z, 512, stack=replace(no_dp, distributed_optimizer=None)).step_time_s
                == estimate(model, A100, z, 512, stack=replace(no_dp, distributed_optimizer=None,
                                                               grad_reduce_op="all-reduce")).step_time_s)
    with pytest.raises(UserError, match="grad-reduce-op"):
        Stack("bad", grad_reduce_op="allreduce")
