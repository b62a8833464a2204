"""`trainperf plan` end to end: JSON contract, human output, errors (exit 2), emit-config,
calibration, and no torch import."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from trainperf.cli import main


def _json(capsys, *argv):
    assert main(["plan", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_json_contract(capsys):
    out = _json(capsys, "--model", "gpt3-175b", "--gpus", "512", "--gpu", "a100-80gb", "--top", "5")
    keys = {"tp", "pp", "dp", "micro_batch", "interleave", "recompute", "sequence_parallel",
            "step_time_s", "tflops_per_gpu", "mfu", "memory_per_gpu_gib"}
    assert keys <= set(out["best"])
    assert len(out["candidates"]) == 5 and out["candidates"][0] == out["best"]
    assert isinstance(out["rejected"], list) and out["rejected"]
    best = out["best"]
    assert best["tp"] * best["pp"] * best["dp"] == 512
    assert best["memory_per_gpu_gib"] <= 80
    # MFU is model FLOPs against the dense peak: tflops_per_gpu / 312.
    assert best["mfu"] == pytest.approx(best["tflops_per_gpu"] / 312, abs=2e-3)
    assert out["baseline"]["tp"] == 8 and out["baseline"]["rank"] >= 1


def test_human_output_seed_case(capsys):
    assert main(["plan", "--model", "gpt3-175b", "--gpus", "512", "--gpu", "a100-80gb"]) == 0
    text = capsys.readouterr().out
    assert "tensor 8 x pipeline 4 x data 16" in text
    assert "dense BF16 peak" in text and "Korthikanti" in text
    assert "rank" in text and "MFU" in text


def test_custom_shape_and_fixed_parts(capsys):
    out = _json(capsys, "--hidden", "4096", "--layers", "32", "--heads", "32", "--seq", "2048", "--vocab", "50304",
                "--gpus", "16", "--gpu", "h100-sxm", "--tp", "2", "--recompute", "selective", "--global-batch", "256")
    assert all(c["tp"] == 2 and c["recompute"] == "selective" for c in out["candidates"])


@pytest.mark.parametrize("argv,needle", [
    (["--model", "gpt3-175b", "--gpus", "512", "--tp", "5"], "does not divide the 96 attention heads"),
    (["--model", "gpt3-175b", "--gpus", "512", "--pp", "5"], "does not divide the 96 layers"),
    (["--model", "gpt3-175b", "--gpus", "100", "--tp", "8"], "does not divide --gpus 100"),
    (["--model", "gpt3-175b", "--gpu", "t4"], "h100-sxm"),
    (["--model", "gpt3-175b", "--gpus", "8", "--gpu", "a100-40gb"], "GiB over"),
    (["--hidden", "1024"], "missing --layers, --heads"),
    (["--model", "gpt3-175b", "--set-constant", "nvlink=1"], "not a planner constant"),
])
def test_bad_input_exits_2(capsys, argv, needle):
    assert main(["plan", *argv]) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err


def test_emit_config_is_accepted_by_the_config_loader(tmp_path, capsys):
    from trainperf.config.load import load_config
    from trainperf.config.resolve import check_batch
    from trainperf.train.resolve import check_model_shape

    path = tmp_path / "plan.yaml"
    out = _json(capsys, "--model", "gpt3-175b", "--gpus", "512", "--pp", "4", "--emit-config", str(path))
    cfg = load_config(str(path))
    check_batch(cfg)
    check_model_shape(cfg)
    best = out["best"]
    p = cfg.parallelism
    assert (p.tensor, p.pipeline, p.interleave) == (best["tp"], best["pp"], best["interleave"])
    assert max(1, p.data) * p.data_shard == best["dp"]
    assert cfg.train.micro_batch == best["micro_batch"] and cfg.model.preset == "gpt3-175b"
    assert p.microbatches == best["microbatches"]
    assert cfg.memory.checkpointing.mode == best["recompute"]


def _run_dir(tmp_path, summary: dict):
    run = tmp_path / "run"
    run.mkdir()
    cfg = {"model": {"preset": "gpt-22b"}, "train": {"global_batch": 4, "micro_batch": 4},
           "parallelism": {"data": 1, "tensor": 8, "sequence_parallel": True},
           "memory": {"checkpointing": {"mode": "selective"}}}
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    (run / "summary.json").write_text(json.dumps(summary))
    return run


def test_calibrate_from_tokens_per_s(tmp_path, capsys):
    # A run measured at half the default model's speed must lower the stack efficiency.
    base = _json(capsys, "--model", "gpt-22b", "--gpus", "8", "--tp", "8", "--pp", "1", "--microbatch", "4",
                 "--recompute", "selective", "--sequence-parallel", "--global-batch", "4")["best"]["step_time_s"]
    run = _run_dir(tmp_path, {"tokens_per_s": 4 * 2048 / (2 * base), "gpu_name": "NVIDIA A100-SXM4-80GB"})
    out = _json(capsys, "--model", "gpt-22b", "--gpus", "8", "--calibrate", str(run))
    cal = out["calibration"]["stack_efficiency"]
    assert cal["calibrated"] < 0.95 * cal["default"]  # slower than the model: a lower efficiency
    assert out["constants"]["stack_efficiency"] == cal["calibrated"]
    # partial pooling: a 2x deviation is far beyond the development set's, so the measured layout is now
    # predicted at 2x less the held-back cap (a small one would move CALIBRATION_WEIGHT of the way, in log)
    import math

    from trainperf.planner.interval import CALIBRATED, CALIBRATION_WEIGHT, shrink_cap

    m = out["calibration"]["measured"]
    assert m["calibration_weight"] == CALIBRATION_WEIGHT
    assert m["held_back_max_log"] == pytest.approx(shrink_cap(CALIBRATED, CALIBRATION_WEIGHT), abs=1e-6)
    assert (1 - CALIBRATION_WEIGHT) * math.log(2) > m["held_back_max_log"]
    after = _json(capsys, "--model", "gpt-22b", "--gpus", "8", "--tp", "8", "--pp", "1", "--microbatch", "4",
                  "--recompute", "selective", "--sequence-parallel", "--global-batch", "4", "--calibrate", str(run))
    assert after["best"]["step_time_s"] == pytest.approx(base * 2 * math.exp(-m["held_back_max_log"]), rel=0.01)


def test_calibrate_without_measurements_exits_2(tmp_path, capsys):
    run = _run_dir(tmp_path, {"steps": 10, "final_loss": 2.0})
    assert main(["plan", "--model", "gpt-22b", "--gpus", "8", "--calibrate", str(run)]) == 2
    err = capsys.readouterr().err
    assert "tokens_per_s" in err and "mfu" in err and "achieved_flops_per_s" in err


def test_a_measurement_faster_than_the_peak_is_refused_not_calibrated_to(tmp_path, capsys):
    # 1e300 tokens/s in a corrupt summary once calibrated silently to the 2.0 bound; a step of 1 ms for 22B on
    # 8 A100s is the same mistake typed by hand: both imply far more model FLOP/s than the dense peak
    fixed = ["--model", "gpt-22b", "--gpus", "8", "--tp", "8", "--pp", "1", "--microbatch", "4", "--recompute",
             "selective", "--sequence-parallel", "--global-batch", "4"]
    base = _json(capsys, *fixed)["best"]
    assert main(["plan", *fixed, "--measured", "0.001"]) == 2
    err = capsys.readouterr().err
    assert "implies" in err and "dense BF16 peak" in err and "Traceback" not in err
    # at the model's own MFU the same layout calibrates (the refusal is about the peak, not the model)
    ok = _json(capsys, *fixed, "--measured", str(base["step_time_s"] * base["mfu"] / 0.95))
    assert ok["calibration"]["stack_efficiency"]["calibrated"] > 0
    run = _run_dir(tmp_path, {"tokens_per_s": 1e300, "gpu_name": "NVIDIA A100-SXM4-80GB"})
    assert main(["plan", "--model", "gpt-22b", "--gpus", "8", "--calibrate", str(run)]) == 2
    err = capsys.readouterr().err
    assert "tokens_per_s=1e+300" in err and "summary.json" in err and "implies" in err


def test_plan_does_not_import_torch():
    code = (
        "import sys\n"
        "from trainperf.cli import main\n"
        "rc = main(['plan', '--model', 'gpt3-1t', '--gpus', '3072', '--json', '--top', '1'])\n"
        "assert rc == 0\n"
        "assert 'torch' not in sys.modules, 'trainperf plan imported torch'\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr


def test_measured_step_recalibrates_and_reranks(capsys):
    fixed = ["--model", "gpt-22b", "--gpus", "16", "--tp", "8", "--pp", "1", "--dp", "2", "--microbatch", "1",
             "--recompute", "none", "--zero", "1", "--no-sequence-parallel", "--global-batch", "16"]
    before = _json(capsys, *fixed)["best"]["step_time_s"]
    out = _json(capsys, *fixed, "--measured", str(1.5 * before), "--top", "50")
    cal = out["calibration"]["stack_efficiency"]
    assert cal["calibrated"] < cal["default"]  # a slower step than predicted: a less efficient stack
    moves = {m["layout"]: m for m in out["measured_moves"]}
    measured = "TP8 PP1 DP2 mb1 none zero1"
    if measured in moves:  # the measured layout now predicts the measured time
        assert moves[measured]["after_s"] == pytest.approx(1.5 * before, rel=1e-3)
    changes = [m["change"] for m in out["measured_moves"] if m["change"] is not None]
    assert changes and all(c > 0 for c in changes)  # every layout slows, by how much compute it has
    # only compute scales: no layout slows by more than the compute itself did
    assert max(changes) <= cal["default"] / cal["calibrated"] - 1 + 1e-3
    for cand in out["candidates"]:
        assert cand["fits"] and cand["binding_memory_term"] in cand["memory_gib"]
    assert main(["plan", "--model", "gpt-22b", "--gpus", "8", "--measured", "-1"]) == 2


def test_hsdp_shard_fixes_the_state_sharding_group(capsys):
    out = _json(capsys, "--model", "gpt3-1.3b", "--gpus", "16", "--zero", "3", "--hsdp-shard", "8", "--tp", "1",
                "--pp", "1", "--top", "3")
    assert all(c["hsdp_shard"] == 8 for c in out["candidates"])
    assert out["best"]["time_s"]["dp_comm"] > 0  # the replicas all-reduce their gradient shards


def test_shape_flags_reach_the_model_and_change_the_estimate(capsys):
    """--bias/--tied/--position/--norm/--gated describe the model; each is echoed in the JSON model and a
    rotary, untied, biased, gated model costs differently from the plain default shape."""
    base = ["--hidden", "2048", "--layers", "8", "--heads", "16", "--gpus", "8", "--tp", "1", "--pp", "1",
            "--microbatch", "4", "--recompute", "none", "--zero", "3"]
    plain = _json(capsys, *base)
    other = _json(capsys, *base, "--bias", "--no-tied", "--position", "rope", "--norm", "rmsnorm", "--gated",
                  "--stack", "torchtitan")
    m = other["model"]
    assert (m["bias"], m["tied"], m["position"], m["norm"], m["gated"]) == (True, False, "rope", "rmsnorm", True)
    assert (plain["model"]["bias"], plain["model"]["gated"]) == (False, False)
    assert other["best"]["step_time_s"] > plain["best"]["step_time_s"]  # more weights, eager RoPE and norms
    assert other["pins"]["stack"] == "torchtitan"


def test_a_fully_fixed_layout_over_the_memory_budget_is_timed_and_flagged(capsys):
    """A layout the user fixed entirely (a run they made, or a published one) is timed even when the memory
    model says it does not fit: marked fits=false, with the shortfall and the fix in the notes; a search
    with free parts still refuses with exit 2."""
    fixed = ["--model", "gpt3-175b", "--gpus", "64", "--tp", "8", "--pp", "8", "--dp", "1", "--microbatch", "1",
             "--recompute", "none", "--zero", "0", "--gpu", "a100-40gb"]
    out = _json(capsys, *fixed)
    assert out["best"]["fits"] is False and out["best"]["step_time_s"] > 0
    assert out["notes"] and "predicted NOT to fit" in out["notes"][0] and "GiB over" in out["notes"][0]
    assert main(["plan", *fixed[:-2], "--gpu", "a100-40gb"]) == 0
    assert "WARNING: predicted NOT to fit" in capsys.readouterr().out
    assert main(["plan", "--model", "gpt3-175b", "--gpus", "8", "--gpu", "a100-40gb"]) == 2


def test_measured_beside_a_preset_and_its_overriding_pins(capsys):
    """--measured frees the layout for its table of how every layout moves; the pins that override the
    preset's stack (--zero 3 beside megatron-2021's ZeRO-0, --no-sequence-parallel) must not make that search
    find nothing and end the command (found by 150 random pin sets)."""
    argv = ["--model", "llama-70b", "--gpus", "16", "--zero", "3", "--stack", "megatron-2021", "--attention", "eager",
            "--no-sequence-parallel", "--fused", "--top", "50"]
    t = _json(capsys, *argv)["best"]["step_time_s"]
    out = _json(capsys, *argv, "--measured", str(1.3 * t))
    assert out["calibration"]["stack_efficiency"]["calibrated"] < 1.0
    assert all(c["zero"] == 3 and not c["sequence_parallel"] for c in out["candidates"])
    assert out["measured_moves"] and all(m["layout"].endswith("zero3") for m in out["measured_moves"])
