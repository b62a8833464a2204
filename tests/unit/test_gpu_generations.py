"""Other GPU generations in the hardware catalog: a part without BF16 tensor cores (V100) plans,
reports MFU and reads traces against its FP16 peak; asking it for a BF16 or TF32 peak says what to
use instead; every built-in entry gives the planner a layout for a small model."""

from __future__ import annotations

import json

import pytest

from trainperf.cli import main
from trainperf.errors import ConfigError
from trainperf.hardware.catalog import CATALOG, get_gpu
from trainperf.planner import DEFAULTS, Layout, estimate, from_preset

SMALL = ["--hidden", "1024", "--layers", "12", "--heads", "16", "--seq", "1024", "--vocab", "32000",
         "--gpus", "8", "--global-batch", "64"]


def test_v100_has_no_bf16_and_says_to_train_in_fp16():
    v100 = get_gpu("Tesla V100-SXM2-32GB")
    assert v100.half_dtype == "fp16" and v100.half_tflops == 125
    with pytest.raises(ConfigError, match=r"no bf16 tensor cores.*train in fp16.*fp16 125"):
        v100.peak_tflops("bf16")
    with pytest.raises(ConfigError, match="no tf32"):
        v100.peak_tflops("tf32")
    a100 = get_gpu("a100-80gb")
    assert a100.half_dtype == "bf16" and a100.half_tflops == 312


def test_the_planner_counts_a_v100_step_against_its_fp16_peak():
    model = from_preset("gpt2-124m")
    layout = Layout(1, 1, 8, 8, 1, "none", False, 0)
    v100 = estimate(model, get_gpu("v100-32gb"), layout, 64, DEFAULTS)
    a100 = estimate(model, get_gpu("a100-80gb"), layout, 64, DEFAULTS)
    assert v100.peak_flops == 125e12 and a100.peak_flops == 312e12
    # the same step is slower on the older part, by less than the peak ratio plus the HBM ratio allow
    assert 1.5 < v100.step_time_s / a100.step_time_s < (312 / 125) * (2.039 / 0.9)
    assert 0 < v100.mfu < 1


@pytest.mark.parametrize("key", [k for k in CATALOG if k != "cpu"])
def test_every_catalog_gpu_plans_a_small_model(capsys, key):
    assert main(["plan", *SMALL, "--gpu", key, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    g = CATALOG[key]
    assert out["peak"] == f"dense {g.half_dtype.upper()}" and out["peak_tflops_per_gpu"] == g.half_tflops
    best = out["best"]
    lo, hi = best["step_time_interval_s"]
    assert lo < best["step_time_s"] < hi and 0 < best["mfu"] < 1


def test_v100_plan_text_names_the_fp16_peak(capsys):
    assert main(["plan", *SMALL, "--gpu", "v100-16gb"]) == 0
    text = capsys.readouterr().out
    assert "dense FP16 peak 125 TFLOP/s" in text and "against the dense FP16 peak of v100-16gb" in text


def test_monitor_peak_on_a_v100_never_claims_tensor_cores_it_lacks():
    from trainperf.monitor.flops import _catalog_peak

    v100, h100 = get_gpu("v100-32gb"), get_gpu("h100-sxm")
    assert _catalog_peak(v100, "fp16") == 125
    assert _catalog_peak(v100, "tf32") == 15.7  # the TF32 flag is a no-op there: FP32 peak
    assert _catalog_peak(v100, "bf16") is None  # emulated without tensor cores: measured instead
    assert _catalog_peak(h100, "bf16") == 989 and _catalog_peak(h100, "tf32") == 494
    assert _catalog_peak(None, "bf16") is None


def test_doctor_and_trace_rules_read_the_16_bit_peak_of_the_part():
    from trainperf.diagnosis.evidence import Evidence
    from trainperf.diagnosis.rules_trace import _tc_ratio
    from trainperf.hardware.probe import _catalog_peak

    assert _catalog_peak("Tesla V100-SXM2-16GB") == ("fp16", 125.0)
    assert _catalog_peak("NVIDIA A100-SXM4-80GB") == ("bf16", 312.0)
    assert _catalog_peak("Tesla T4") is None
    ratio, why = _tc_ratio(Evidence(device={"name": "Tesla V100-SXM2-32GB"}))
    assert ratio == pytest.approx(125 / 15.7) and "fp16" in why


def test_tune_ranks_fp16_on_a_v100_even_where_torch_reports_bf16():
    # torch reports bf16 on a V100 (emulated, no tensor cores); the catalog's FP16 peak is the one to take
    from trainperf.config.load import load_config
    from trainperf.tune import space
    from trainperf.tune.order import _precision

    default = load_config(None, ["precision.dtype=fp32", "run.device=cuda"])
    v100 = space.Facts("cuda", bf16=True, tf32=False, gpu_name="Tesla V100-SXM2-32GB")
    step = _precision(None, default, v100)
    assert "fp32 -> fp16" in step.why and step.factor == pytest.approx(125 / 15.7)
    a100 = space.Facts("cuda", bf16=True, tf32=True, gpu_name="NVIDIA A100-SXM4-80GB")
    assert "fp32 -> bf16" in _precision(None, default, a100).why


def test_the_plan_names_the_fabric_between_the_gpus_of_a_node(capsys):
    for key, fabric in (("l4", "PCIe 64 GB/s"), ("mi300x", "Infinity Fabric 896 GB/s"), ("h100-sxm", "NVLink 900 GB/s")):
        assert main(["plan", *SMALL, "--gpu", key, "--top", "1"]) == 0
        assert fabric in capsys.readouterr().out.splitlines()[1], key


def test_doctor_shows_the_fp16_peak_of_a_v100():
    from trainperf.cli.doctor import _gpu_lines

    lines = "\n".join(_gpu_lines({"name": "Tesla V100-SXM2-32GB", "fp16_dense_tflops": 125.0}))
    assert "dense FP16 peak" in lines and "125 TFLOP/s" in lines and "train in fp16" in lines
    assert "dense BF16" not in lines


def test_a_catalog_file_sets_the_fabric(tmp_path):
    from trainperf.hardware.catalog import load_catalog

    f = tmp_path / "cat.yaml"
    f.write_text("gpus:\n  my-l40s:\n    base: l40s\n    fabric: NVLink bridge\n    nvlink_gbps: 112\n")
    cat = load_catalog(str(f))
    assert cat["my-l40s"].fabric == "NVLink bridge" and cat["my-l40s"].nvlink_gbps == 112
    assert cat["l40s"].fabric == "PCIe" and cat["h200"].fabric == "NVLink"


def test_validated_parts_are_the_development_sets_parts():
    from trainperf.planner import devset
    from trainperf.planner.interval import VALIDATED_PARTS

    assert {r.spec().name for r in devset.load()} == set(VALIDATED_PARTS)


def test_a_plan_on_a_part_no_published_run_used_says_its_interval_does_not_cover_it(capsys):
    for key in ("v100-32gb", "mi300x", "l4"):
        out = json.loads((main(["plan", *SMALL, "--gpu", key, "--json"]), capsys.readouterr().out)[1])
        assert key in out["interval_unvalidated_part"] and "--measured" in out["interval_unvalidated_part"]
    for key in ("a100-80gb", "a100-40gb", "h100-sxm"):
        assert main(["plan", *SMALL, "--gpu", key, "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["interval_unvalidated_part"] is None
    assert main(["plan", *SMALL, "--gpu", "v100-32gb"]) == 0
    text = capsys.readouterr().out
    assert "note: no development-set run was on v100-32gb" in text
    # a measured step on the part itself calibrates there: no such note
    assert main(["plan", *SMALL, "--gpu", "v100-32gb", "--measured", "1.0", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["interval_unvalidated_part"] is None


# ---------------------------------------------------------------------------- held-out V100 check
@pytest.fixture(scope="module")
def v100_check():
    from trainperf.planner.loso import generation_check

    return generation_check()


def test_v100_rows_are_cited_held_out_and_never_fitted():
    from trainperf.planner import devset

    rows = devset.generation_rows()
    assert rows and {r.source for r in rows} == set(devset.GENERATION_CHECKS)
    assert all("V100" in r.spec().name and r.spec().gpus_per_node == 4 for r in rows)
    assert all(r.note.split(";")[0].split(":")[-1].isdigit() for r in rows)  # every row names its file and line
    assert not set(devset.GENERATION_CHECKS) & set(devset.SOURCES)  # outside the fit and its LOSO
    assert not any(r.source in devset.GENERATION_CHECKS for r in devset.load())
    assert "bigscience-workshop/bigscience" in rows[0].citation


def test_the_plan_note_on_a_v100_says_what_the_held_out_check_found(v100_check):
    # the words printed by `trainperf plan --gpu v100-*` (interval.CHECKED_GENERATIONS) hold on a fresh check
    from trainperf.planner.interval import CHECKED_GENERATIONS

    text = CHECKED_GENERATIONS["V100"]
    s = v100_check["summary"]
    assert f"on {s['all']['rows']} published V100 runs" in text
    # "without tensor parallelism: inside about as often as A100 / H100 runs" (85% pooled on the dev set)
    assert s["TP = 1"]["coverage"] >= 0.7 and s["TP = 1"]["model_mean_abs_error"] < 0.08
    assert s["TP = 1"]["model_mean_abs_error"] < s["TP = 1"]["baseline_mean_abs_error"]
    # "every run with tensor parallelism (TP 2) was slower than its upper bound"
    # "a measured step corrects the level" (docs/benchmarks/planner.md): calibrated on the part, inside again
    assert s["TP > 1"]["calibrated_coverage"] >= 0.7 and s["TP = 1"]["calibrated_coverage"] >= 0.7
    tp = [x for x in v100_check["rows"] if x["tp"] > 1]
    assert tp and {x["tp"] for x in tp} == {2} and all(x["published_s"] > x["interval_s"][1] for x in tp)
