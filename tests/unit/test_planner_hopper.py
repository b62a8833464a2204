"""Issue 39: Hopper as mechanisms, each a published figure, and each with a test that fails without it; the
interval's between-source component and its widening far from the development set; plan --explain."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from trainperf.cli import main
from trainperf.hardware.catalog import get_gpu
from trainperf.planner import parts
from trainperf.planner.constants import DEFAULTS
from trainperf.planner.cost import Layout, estimate
from trainperf.planner.kernels import Kernels
from trainperf.planner.model import from_preset
from trainperf.planner.stack import get_stack

A100, H100 = get_gpu("a100-80gb"), get_gpu("h100-sxm")
IDEAL = replace(DEFAULTS, wave_quantization=0, gemm_memory_weight=0.0, kernel_overhead_s=0.0)


# ------------------------------------------------------------------ GEMM ceiling by generation
def test_an_h100_reaches_a_lower_fraction_of_its_peak_than_an_a100():
    # the published maximum achievable matmul FLOPS (Bekman, ml-engineering, CUDA 12.1): 267.9 / 312, 792.1 / 989
    d = 8192
    for gpu, mamf in ((A100, 267.9e12), (H100, 792.1e12)):
        k = Kernels(gpu, IDEAL)
        assert 2 * d**3 / k.gemm(d, d, d) == pytest.approx(mamf, rel=1e-9)
    assert parts.sustained_fraction(H100) < parts.sustained_fraction(A100)
    # and on every GEMM shape of a layer, roofline and waves included, the H100 stays below the A100's fraction
    h, a = Kernels(H100, DEFAULTS), Kernels(A100, DEFAULTS)
    for hidden in (1024, 2048, 4096, 8192, 16384):
        for m, n, kk in ((8192, 3 * hidden, hidden), (8192, hidden, 4 * hidden)):
            flops = 2 * m * n * kk
            assert flops / h.gemm(m, n, kk) / 989e12 < flops / a.gemm(m, n, kk) / 312e12, (hidden, n, kk)
    # without the published figure: the catalog's gemm_fraction
    off = Kernels(H100, replace(IDEAL, published_gemm=0.0))
    assert 2 * d**3 / off.gemm(d, d, d) == pytest.approx(989e12 * H100.gemm_fraction, rel=1e-9)


# ------------------------------------------------------------------ NCCL on NVLink 4 / NDR
def test_nccl_bandwidths_of_an_h100_node_are_the_published_ones():
    k = Kernels(H100, DEFAULTS)
    assert k.nvlink == pytest.approx(370e9)  # ring busbw, NVIDIA/nccl-tests#212
    assert k.nic == pytest.approx(47e9)  # NDR, NVIDIA/nccl-tests#290
    off = Kernels(H100, replace(DEFAULTS, published_fabric=0.0))
    assert off.nvlink == pytest.approx(450e9 * DEFAULTS.nvlink_fraction) and off.nic == pytest.approx(50e9 * 0.8)
    # a part described with other link rates (fewer NVLink links, another NIC) keeps the generic fractions
    odd = Kernels(replace(H100, key="h100-odd", nvlink_gbps=400, internode_gbps=25), DEFAULTS)
    assert odd.nvlink == pytest.approx(200e9 * DEFAULTS.nvlink_fraction) and odd.nic == pytest.approx(25e9 * 0.8)
    # an A100 has no published entry for its fabric: unchanged
    assert Kernels(A100, DEFAULTS).nvlink == pytest.approx(300e9 * DEFAULTS.nvlink_fraction)


def test_nvlink_sharp_all_reduce_on_8_h100s():
    on, off = Kernels(H100, DEFAULTS, nvls=True), Kernels(H100, DEFAULTS, nvls=False)
    big = 4e9
    t_on, t_off = on.all_reduce_group(big, 8, 1), off.all_reduce_group(big, 8, 1)
    assert 2 * 7 / 8 * big / t_on == pytest.approx(480e9, rel=0.01)  # busbw ~480 GB/s (NVIDIA/nccl#1455)
    assert 2 * 7 / 8 * big / t_off == pytest.approx(370e9, rel=0.01)  # the ring's 370
    assert on.all_reduce_group(big, 4, 1) == pytest.approx(off.all_reduce_group(big, 4, 1), rel=1e-3)  # 2-4: no gain
    a = Kernels(A100, DEFAULTS, nvls=True)  # NVSwitch 2: no NVLink SHARP
    assert a.all_reduce_group(big, 8, 1) == pytest.approx(Kernels(A100, DEFAULTS, nvls=False).all_reduce_group(big, 8, 1))
    # in a plan: TP 8 without sequence parallelism all-reduces, and those all-reduces get faster
    model = from_preset("gpt3-13b")
    lay = Layout(8, 1, 1, 1, recompute="none", sequence_parallel=False)
    fast = estimate(model, H100, lay, 8, stack=get_stack("megatron-core", async_tp=False))
    slow = estimate(model, H100, lay, 8, stack=get_stack("megatron-core", async_tp=False, nvls=False))
    assert fast.time["tp_comm"] < 0.85 * slow.time["tp_comm"]


# ------------------------------------------------------------------ NCCL's latency by message size
def test_collective_latency_is_nccls_ring_with_one_step_per_rank():
    k = Kernels(A100, DEFAULTS)
    bw = k.bandwidth(128, 1)
    big = 1e10
    # 128 ranks on 16 nodes: tuning.cc's Simple ring, 8.4 us + 112 in-node steps (the 3 us net overhead beats NVLink's
    # 3.4? no: max(3.4, 3)) + 15 network steps of 14 us
    lat = (8.4 + 112 * 3.4 + 15 * 14.0) * 1e-6
    assert k.half_collective(big, 128, bw, nodes=16) == pytest.approx(127 / 128 * big / bw + lat, rel=1e-9)
    assert k.nodes(128, 1) == 16 and k.nodes(8, 1) == 1 and k.nodes(8, 8) == 8
    # a small buffer takes the low-latency protocol: far below the Simple ring's latency
    assert k.half_collective(8192, 8, k.nvlink) < (8.4 + 7 * 3.4) * 1e-6
    # the former model: 20 us per log2 of the ranks, whatever the nodes
    old = Kernels(A100, replace(DEFAULTS, nccl_tuning=0.0))
    assert old.half_collective(big, 128, bw, nodes=16) == pytest.approx(127 / 128 * big / bw + 7 * 20e-6)
    # FSDP across 16 nodes pays the ring's steps per layer: more exposed than the log2 model said
    model = from_preset("gpt3-1.3b")
    lay = Layout(1, 1, 128, 4, recompute="none", zero=3)
    new = estimate(model, A100, lay, 512).time["fsdp_comm"]
    before = estimate(model, A100, lay, 512, replace(DEFAULTS, nccl_tuning=0.0)).time["fsdp_comm"]
    assert new > before


# ------------------------------------------------------------------ TP communication overlapped with the GEMMs
def test_tp_communication_overlapped_by_decomposition():
    model = from_preset("llama-70b")
    lay = Layout(8, 1, 4, 1, recompute="none", sequence_parallel=True, zero=1)
    st = get_stack("megatron-core")
    assert st.async_tp and st.tp_overlap == "decomposed"  # the preset runs it, as NVIDIA's configurations do
    exposed = estimate(model, H100, lay, 32, stack=st).time["tp_comm"]
    full = estimate(model, H100, lay, 32, stack=replace(st, async_tp=False)).time["tp_comm"]
    concurrent = estimate(model, H100, lay, 32, stack=replace(st, tp_overlap="concurrent")).time["tp_comm"]
    assert 0 < exposed < full
    # the last chunk of each reduce-scatter has no GEMM beside it: at least 1 / (2 tp) of the traffic stays
    assert exposed >= full / 16 - 1e-12
    assert concurrent < exposed  # beside independent work (LLaMA's): nothing left by construction


# ------------------------------------------------------------------ FP8 weights cast once per step (Transformer Engine)
def test_fp8_weights_cast_once_per_step_under_transformer_engine():
    model = from_preset("llama-70b")
    st = get_stack("megatron-core", float8=True)
    assert st.fp8_weight_cache
    many = Layout(8, 1, 1, 1, recompute="none", sequence_parallel=True, zero=0)  # 32 micro-batches of 1, no bubble
    cached = estimate(model, H100, many, 32, stack=st)
    every = estimate(model, H100, many, 32, stack=replace(st, fp8_weight_cache=False))
    assert cached.step_time_s < every.step_time_s
    k = Kernels(H100, DEFAULTS)
    from trainperf.planner.cost import _gemm_weights

    w = _gemm_weights(model) / 8  # one layer's GEMM weights on a TP rank
    per_step = cached.layers_per_stage * k.weight_cast_once(w)
    # every micro-batch casts each weight twice (forward, data gradient: 5 bytes each) without the cache
    saved = cached.microbatches * cached.layers_per_stage * 2 * 5 * w / k.hbm
    assert every.step_time_s - cached.step_time_s == pytest.approx(saved - per_step, rel=0.05)


# ------------------------------------------------------------------ the distributed optimizer's overlap
def test_param_gather_overlap_and_the_exposed_last_bucket():
    model = from_preset("gpt3-13b")
    lay = Layout(2, 1, 32, 1, recompute="none", sequence_parallel=True, zero=1)
    st = get_stack("megatron-core", async_tp=False)
    overlap = estimate(model, H100, lay, 64, stack=st).time["dp_comm"]
    after = estimate(model, H100, lay, 64, stack=replace(st, param_gather="after")).time["dp_comm"]
    ideal = estimate(model, H100, lay, 64, stack=replace(st, dp_bucket="ideal")).time["dp_comm"]
    assert 0 < ideal < overlap < after
    # a model smaller than one of Megatron-Core's buckets (40M parameters) hides none of its reduction
    from trainperf.analytic.spec import TransformerSpec

    tiny = TransformerSpec(hidden=256, layers=4, heads=4, seq=1024, vocab=32000, name="tiny")  # ~11M parameters
    assert tiny.params() < 40e6
    lay1 = Layout(1, 1, 8, 4, recompute="none", zero=1)
    on = estimate(tiny, H100, lay1, 32, stack=st).time["dp_comm"]
    off = estimate(tiny, H100, lay1, 32, stack=replace(st, dp_reduce="after", param_gather="after")).time["dp_comm"]
    assert on == pytest.approx(off, rel=1e-6)


# ------------------------------------------------------------------ the interval: between-source component, far
def test_between_source_variance_is_estimated_from_the_sources_levels():
    from trainperf.planner.interval import components, spread_from

    same = {"a": [0.0, 0.05, -0.05, 0.02], "b": [0.01, -0.04, 0.03, 0.0], "c": [0.0, 0.05, -0.05, 0.02]}
    assert components(same).between == pytest.approx(0.0)
    apart = {"a": [0.10, 0.12, 0.08, 0.11], "b": [-0.10, -0.12, -0.08, -0.09], "c": [0.0, 0.02, -0.02, 0.01]}
    comp = components(apart)
    assert comp.between > 0.005 and comp.within < 0.001
    # a run of an unseen source carries the levels' spread: wider than the rows' scatter alone
    sp = spread_from(apart)
    assert sp.high - sp.low > 2 * 1.28 * math.sqrt(comp.within)
    assert sp.between_sd == pytest.approx(math.sqrt(comp.between), abs=1e-4)
    # far from the development set: the between variance counted once more per respect, wider each time
    widths = [sp.high - sp.low] + [hi - lo for lo, hi in sp.far]
    assert len(sp.far) == 3 and widths == sorted(widths) and widths[-1] > widths[0]
    assert sp.bounds(1.0, 0.0, far=2) == (math.exp(sp.far[1][0]), math.exp(sp.far[1][1]))


def test_far_from_every_development_source():
    from trainperf.planner.distance import Point, development_points, far_from, generation

    dev = development_points()
    assert {generation(A100), generation(H100)} == {p.generation for p in dev}
    near = Point("Hopper", 8, 4, 1, 8192)
    assert far_from(near, dev) == {}
    assert set(far_from(Point("Volta", 2, 4, 1, 2048), dev)) == {"generation"}
    assert set(far_from(Point("Hopper", 64, 1, 1, 8192), dev)) == {"parallelism"}  # TP 64: 8 at most in the set
    assert set(far_from(Point("Blackwell", 1, 1, 1, 4 * 2**20), dev)) == {"generation", "sequence"}
    # a held-out source is not its own neighbour
    solo = (Point("Ampere", 1, 1, 1, 2048, "x"),)
    assert far_from(Point("Ampere", 1, 1, 1, 2048, "x"), solo) == {}


def test_a_plan_far_from_the_development_set_says_so_and_widens(capsys):
    out_near = _json(capsys, "--model", "gpt3-13b", "--gpus", "64", "--gpu", "h100-sxm", "--top", "1")
    assert out_near["best"]["interval_far_from_development"] is None
    argv = ("--model", "gpt3-13b", "--gpus", "64", "--gpu", "v100-32gb", "--top", "1", "--tp", "4", "--pp", "2")
    out = _json(capsys, *argv)
    far = out["best"]["interval_far_from_development"]
    assert set(far) == {"generation"} and "Volta" in far["generation"]
    lo, hi = out["best"]["step_time_interval_s"]
    assert out["interval"]["far"] and (hi - lo) / out["best"]["step_time_s"] > 0
    assert main(["plan", *argv]) == 0
    text = capsys.readouterr().out
    assert "far from every development source in 1 respect (generation: Volta" in text


# ------------------------------------------------------------------ plan --explain
def _json(capsys, *argv):
    assert main(["plan", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_explain_times_the_best_layout_without_each_mechanism(capsys):
    argv = ("--model", "llama-70b", "--gpus", "64", "--gpu", "h100-sxm", "--stack", "megatron-core", "--float8",
            "--tp", "8", "--pp", "2", "--top", "1", "--explain")
    out = _json(capsys, *argv)
    ex = out["explain"]
    names = {m["mechanism"] for m in ex["mechanisms"]}
    assert {"gemm_generation", "nccl_fabric", "tp_comm_overlap", "float8", "fp8_weight_cache", "grad_reduce_overlap",
            "param_gather_overlap", "fused", "attention_kernel"} <= names
    step = out["best"]["step_time_s"]
    assert ex["step_time_s"] == pytest.approx(step, abs=1e-3)
    for m in ex["mechanisms"]:  # contribution = step with it - step without it
        assert m["contribution_s"] == pytest.approx(step - m["step_without_s"], abs=2e-3), m["mechanism"]
    by = {m["mechanism"]: m for m in ex["mechanisms"]}
    assert by["float8"]["contribution_s"] < 0 and by["tp_comm_overlap"]["contribution_s"] < 0
    assert by["gemm_generation"]["contribution_s"] > 0  # an H100 reaches less of its peak than an A100 would
    assert main(["plan", *argv]) == 0
    text = capsys.readouterr().out
    assert "what each mechanism contributed" in text and "tp_comm_overlap" in text
    # --tp-comm-overlap is the same switch as --async-tp
    off = _json(capsys, "--model", "llama-70b", "--gpus", "64", "--gpu", "h100-sxm", "--stack", "megatron-core",
                "--no-tp-comm-overlap", "--tp", "8", "--pp", "2", "--top", "1")
    assert off["stack"]["mechanisms"]["async_tp"] is False and off["stack"]["source"]["async_tp"] == "flag"


# ------------------------------------------------------------------ criteria that can be met
def test_criteria_judge_only_sources_of_eight_runs_or_more():
    from trainperf.planner.loso import criteria

    def src(rows, err, base, cov, width=0.2):
        return {"rows": rows, "model_mean_abs_error": err, "baseline_mean_abs_error": base, "coverage": cov,
                "mean_relative_width": width}
    summary = {"big": src(20, 0.05, 0.10, 0.80), "tiny": src(1, 0.20, 0.10, 0.0), "pooled": src(21, 0.05, 0.1, 0.8)}
    crit = criteria(summary)
    assert crit["judged_sources"] == ["big"] and crit["small_sources"] == {"tiny": 1}
    assert crit["all_pass"]  # the 1-run source's 0% coverage and 20% error carry no pass mark
    summary["big"]["coverage"] = 0.95
    assert not criteria(summary)["all_pass"]
