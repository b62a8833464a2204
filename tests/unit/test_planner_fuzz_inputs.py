"""`trainperf plan` inputs found by fuzzing: values far outside any GPU (denormal bandwidths, 1e300 weights,
MFU above 100%) are refused with exit 2 naming the value, never a ZeroDivisionError or a NaN table; and
--emit-config writes the layout that was planned (partial recompute as a share of the blocks, HSDP as
data x data_shard) or refuses one `trainperf train` cannot run (context parallelism)."""

from __future__ import annotations

import pytest
import yaml

from trainperf.cli import main

BASE = ["plan", "--model", "gpt2-124m", "--top", "1"]


def refused(capsys, *argv, says: str) -> None:
    rc = main([*BASE, *argv])
    err = capsys.readouterr().err
    assert rc == 2 and says in err and "Traceback" not in err, (argv, err)


@pytest.mark.parametrize("text,says", [
    ("nvlink_gbps: 5.0e-324, internode_gbps: 5.0e-324", "nvlink_gbps=5e-324 is outside"),  # was ZeroDivisionError
    ("bf16_tflops: 1.0e-300", "bf16_tflops=1e-300 is outside"),                            # was a NaN table
    ("hbm_tbps: 5.0e-324", "hbm_tbps=5e-324 is outside"),
    ("gemm_fraction: 5.0e-324", "gemm_fraction=5e-324 is outside"),
    ("hbm_gib: 80000000", "hbm_gib=80000000.0 is outside"),
])
def test_catalog_values_outside_any_gpu_are_refused(tmp_path, capsys, text, says):
    cat = tmp_path / "cat.yaml"
    cat.write_text(f"gpus: {{x: {{base: a100-80gb, {text}}}}}\n")
    refused(capsys, "--catalog", str(cat), "--gpu", "x", says=says)


@pytest.mark.parametrize("item,says", [
    ("stack_efficiency=5e-324", "below 0.001"),
    ("attention_efficiency=1e-320", "below 0.001"),
    ("gemm_memory_weight=1e300", "above 1000"),
    ("kernel_overhead_s=1e300", "above 1"),
    ("optimizer_traffic_bytes=1e300", "above 1024"),
    ("stack_efficiency=100", "a fraction must be between 0 and 1"),  # was MFU 114%
    ("stack_efficiency=1_0", "must be a plain number"),               # float() reads it as 10
])
def test_constants_outside_any_stack_are_refused(capsys, item, says):
    refused(capsys, "--set-constant", item, says=says)


def test_emit_config_writes_partial_recompute_and_hsdp_as_planned(tmp_path, capsys):
    path = tmp_path / "p.yaml"
    assert main([*BASE, "--recompute", "partial", "--recompute-layers", "3", "--emit-config", str(path)]) == 0
    cfg = yaml.safe_load(path.read_text())
    assert cfg["memory"]["checkpointing"] == {"mode": "ratio", "ratio": 0.25}  # 3 of 12 layers
    path2 = tmp_path / "h.yaml"
    assert main([*BASE, "--hsdp-shard", "4", "--zero", "3", "--emit-config", str(path2)]) == 0
    par = yaml.safe_load(path2.read_text())["parallelism"]
    assert (par["data"], par["data_shard"]) == (2, 4)  # sharded within 4, replicated twice: 8 GPUs
    capsys.readouterr()
    refused(capsys, "--tp", "2", "--pp", "2", "--cp", "2", "--emit-config", str(tmp_path / "cp.yaml"),
            says="context parallelism")
    assert not (tmp_path / "cp.yaml").exists()
    refused(capsys, "--emit-config", "", says="--emit-config '' is empty")


@pytest.mark.parametrize("change,says", [
    ({"tie_word_embeddings": "no"}, "tie_word_embeddings='no' must be true or false"),  # was read as tied
    ({"max_position_embeddings": 0}, "max_position_embeddings=0 must be a positive integer"),  # was ignored
    ({"max_position_embeddings": -5}, "max_position_embeddings=-5 must be a positive integer"),
    ({"hidden_size": None}, "hidden_size is null, NaN or Infinity"),  # was "no hidden_size key"
])
def test_hf_config_odd_values_are_refused_naming_them(tmp_path, capsys, change, says):
    import json

    cfg = {"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 2, "num_attention_heads": 32,
           "vocab_size": 32000, "intermediate_size": 11008, "max_position_embeddings": 4096}
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**cfg, **change}))
    rc = main(["plan", "--hf-config", str(path), "--gpus", "8", "--top", "1"])
    err = capsys.readouterr().err
    assert rc == 2 and says in err, err
    path.write_text(json.dumps(cfg))
    assert main(["plan", "--hf-config", str(path), "--gpus", "8", "--top", "1"]) == 0
    capsys.readouterr()


@pytest.mark.parametrize("argv,says", [
    (["--baseline", "0,1,8"], "each degree must be at least 1"),           # was exit 0, "not a valid split"
    (["--baseline", "3,1,8"], "= 24 GPUs, but --gpus is 8"),
    (["--baseline", "1,1,8", "--tp", "2"], "but --tp 2 is pinned"),
    (["--baseline="], "expected TP,PP,DP"),                                 # was silently ignored
    (["--zero", "0", "--distributed-optimizer"], "ZeRO-0 keeps the optimizer whole"),
    (["--zero", "1", "--no-distributed-optimizer"], "ZeRO-1 shards the optimizer"),
    (["--async-tp", "--tp", "1"], "--tp 1 has none"),
    (["--zero", "3", "--grad-reduce-op", "all-reduce"], "applies to ZeRO-1/2 layouts"),
    (["--cp", "8", "--tp", "2"], "x cp 8 = 16"),                           # was "no valid degrees"
])
def test_baselines_and_pins_that_cannot_hold_are_refused(capsys, argv, says):
    refused(capsys, *argv, says=says)


def test_a_zero_pin_beside_a_preset_shows_the_sharding_it_runs(capsys):
    assert main([*BASE, "--zero", "3", "--stack", "megatron-2021", "--json"]) == 0
    import json

    out = json.loads(capsys.readouterr().out)
    assert out["best"]["layout"]["zero"] == 3 if isinstance(out["best"].get("layout"), dict) else True
    assert out["stack"]["mechanisms"]["fsdp"] is True and out["stack"]["mechanisms"]["distributed_optimizer"] is False


def test_a_catalog_number_yaml_reads_as_text_gets_the_fix(tmp_path, capsys):
    cat = tmp_path / "cat.yaml"
    cat.write_text("gpus:\n  x: {base: a100-80gb, hbm_gib: 1e3}\n")  # YAML 1.1: '1e3' is a string
    refused(capsys, "--catalog", str(cat), "--gpu", "x", says="write it as 1000")


@pytest.mark.parametrize("argv,says", [
    (["--microbatch", "3"], "--microbatch 3 does not divide the sequences per data-parallel rank"),
    (["--hsdp-shard", "4", "--zero", "0"], "needs ZeRO 1-3, but --zero 0 is pinned"),
])
def test_a_pin_that_leaves_no_layout_is_named(capsys, argv, says):
    refused(capsys, *argv, says=says)


def test_a_measured_step_ten_million_times_too_slow_is_not_a_measurement(capsys):
    refused(capsys, "--measured", "1e18", says="ten million times slower than the GPU can go")
    assert main([*BASE, "--measured", "100"]) == 0  # slow, but a run
    capsys.readouterr()


def test_a_gpu_count_that_is_not_whole_nodes_is_planned_with_a_warning(capsys):
    """--gpus 12 on 8-GPU nodes (or a catalog's gpus_per_node 3 with --gpus 8) was accepted without a word."""
    import json

    assert main(["plan", "--model", "gpt-22b", "--gpu", "a100-80gb", "--gpus", "12", "--json"]) == 0
    notes = json.loads(capsys.readouterr().out)["notes"]
    assert any("--gpus 12 is not a whole number of a100-80gb nodes (8 GPUs per node" in n for n in notes), notes
    assert main(["plan", "--model", "gpt-22b", "--gpu", "a100-80gb", "--gpus", "12"]) == 0
    assert "WARNING: --gpus 12 is not a whole number" in capsys.readouterr().out
    for gpus in (8, 16):  # one node, or whole nodes: nothing to say
        assert main(["plan", "--model", "gpt-22b", "--gpu", "a100-80gb", "--gpus", str(gpus), "--json"]) == 0
        assert not any("whole number" in n for n in json.loads(capsys.readouterr().out)["notes"])
