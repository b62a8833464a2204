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
