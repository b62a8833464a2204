"""Catalog, calibration and Hugging Face config readers on garbage: UserError naming the file, exit 2."""

from __future__ import annotations

import json
import random

import pytest

from trainperf.cli import main

GOOD_CATALOG = "gpus:\n  my-gpu:\n    base: a100-80gb\n    internode_gbps: 12.5\n"
GOOD_SUMMARY = json.dumps({"tokens_per_s": 1000.0, "gpu_name": "NVIDIA A100-SXM4-80GB"})
GOOD_HF = json.dumps({"model_type": "llama", "hidden_size": 512, "num_hidden_layers": 4, "num_attention_heads": 8,
                      "vocab_size": 1000, "intermediate_size": 1024})


def _garbage(rng: random.Random, good: str) -> list[bytes]:
    raw = good.encode()
    return [
        b"",                                                   # empty
        bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 400))),  # random binary
        b"\x00" * 16 + raw,                                     # NUL bytes
        "caf\u00e9: ".encode("latin-1") + b"\xff\xfe\x80",      # not UTF-8
        raw[: rng.randint(1, max(1, len(raw) - 2))],            # truncated
        b"[1, 2, 3]\n",                                         # valid but not a mapping
        b"{{{{ : : ]]\n",                                       # broken syntax
    ]


@pytest.mark.parametrize("seed", range(3))
def test_catalog_garbage_exits_2_naming_the_file(tmp_path, capsys, seed):
    rng = random.Random(seed)
    for i, blob in enumerate(_garbage(rng, GOOD_CATALOG)):
        path = tmp_path / f"cat{i}.yaml"
        path.write_bytes(blob)
        rc = main(["plan", "--model", "gpt-22b", "--gpus", "8", "--catalog", str(path), "--json"])
        err = capsys.readouterr().err
        if rc == 0:  # a truncation can still be a valid catalog; then it must have been read as one
            continue
        assert rc == 2 and str(path) in err and "Traceback" not in err, (blob[:40], err)


@pytest.mark.parametrize("seed", range(3))
def test_calibration_files_garbage_exit_2(tmp_path, capsys, seed):
    rng = random.Random(100 + seed)
    for which in ("summary.json", "config.yaml"):
        for i, blob in enumerate(_garbage(rng, GOOD_SUMMARY if which == "summary.json" else "model: {preset: tiny}\n")):
            run = tmp_path / f"{which}-{i}"
            run.mkdir()
            (run / "summary.json").write_text(GOOD_SUMMARY)
            (run / "config.yaml").write_text("model:\n  preset: tiny\n")
            (run / which).write_bytes(blob)
            rc = main(["plan", "--model", "gpt-22b", "--gpus", "8", "--calibrate", str(run)])
            err = capsys.readouterr().err
            assert rc == 2 and "Traceback" not in err, (which, blob[:40], err)
            assert str(run) in err, err


@pytest.mark.parametrize("seed", range(3))
def test_hf_config_garbage_exits_2(tmp_path, capsys, seed):
    rng = random.Random(200 + seed)
    for i, blob in enumerate(_garbage(rng, GOOD_HF)):
        path = tmp_path / f"config{i}.json"
        path.write_bytes(blob)
        rc = main(["plan", "--hf-config", str(path), "--gpus", "8"])
        err = capsys.readouterr().err
        assert rc == 2 and str(path) in err and "Traceback" not in err, (blob[:40], err)
    assert main(["plan", "--hf-config", str(tmp_path / "missing.json"), "--gpus", "8"]) == 2


@pytest.mark.parametrize("argv,needle", [
    (["--gpus", "0"], "argument --gpus: 0 is below 1"),           # was a ZeroDivisionError traceback
    (["--gpus", "eight"], "argument --gpus: 'eight' is not a whole number"),
    (["--seq", "0"], "argument --seq: 0 is below 1"),             # was silently the default 2048
    (["--vocab", "0"], "argument --vocab: 0 is below 1"),
    (["--ffn-hidden", "0"], "argument --ffn-hidden: 0 is below 1"),
    (["--kv-heads", "0"], "argument --kv-heads: 0 is below 1"),
    (["--global-batch", "0"], "argument --global-batch: 0 is below 1"),
    (["--interleave", "0"], "argument --interleave: 0 is below 1"),
    (["--top", "0"], "argument --top: 0 is below 1"),             # was an empty table
    (["--max-microbatch", "0"], "argument --max-microbatch: 0 is below 1"),
    (["--recompute-layers", "-1"], "argument --recompute-layers: -1 is below 0"),
    (["--recompute-layers", "99"], "--recompute-layers 99: must be between 1 and the layers per stage - 1"),
    (["--hsdp-shard", "3"], "--hsdp-shard 3 must divide the data-parallel degree, so --gpus 8; choose among 1, 2, 4, 8"),
    (["--hsdp-shard", "3", "--dp", "4"], "--hsdp-shard 3 must divide --dp 4"),
    (["--set-constant", "hbm_fraction=nan"], "hbm_fraction=nan: must be a finite number"),  # was accepted
    (["--float8"], "pick an FP8 part (h100-sxm"),
    # each once a ZeroDivisionError traceback: a rate scaled by 0
    (["--set-constant", "hbm_fraction=0"], "hbm_fraction=0: must be above 0 (it scales a rate"),
    (["--set-constant", "attention_efficiency=0"], "attention_efficiency=0: must be above 0"),
    (["--set-constant", "stack_efficiency=0"], "stack_efficiency=0: must be above 0"),
    (["--set-constant", "nvlink_fraction=0"], "nvlink_fraction=0: must be above 0"),
    (["--set-constant", "internode_fraction=0"], "internode_fraction=0: must be above 0"),
    (["--emit-config", "."], "--emit-config '.' is a directory; give a file name"),  # was IsADirectoryError
])
def test_bad_numbers_on_the_plan_command_line_exit_2_naming_the_flag(capsys, argv, needle):
    try:
        rc = main(["plan", "--model", "gpt2-124m", "--gpus", "8", *argv])
    except SystemExit as exc:  # argparse's own errors (a flag's type): exit 2 with usage
        rc = exc.code
    err = capsys.readouterr().err
    assert rc == 2, err
    assert needle in err and "Traceback" not in err, err


@pytest.mark.parametrize("fields,needle", [
    ("hbm_tbps: 0", "gpus.x.hbm_tbps=0.0 must be > 0 (memory bandwidth"),         # each was a ZeroDivisionError
    ("nvlink_gbps: 0", "gpus.x.nvlink_gbps=0.0 must be > 0"),
    ("internode_gbps: 0", "gpus.x.internode_gbps=0.0 must be > 0"),
    ("fp32_tflops: 0", "gpus.x.fp32_tflops=0.0 must be > 0"),
    ("hbm_gib: 0", "gpus.x.hbm_gib=0.0 must be > 0"),
    ("bf16_tflops: 0\n    fp16_tflops: 0", "gpus.x needs a 16-bit tensor peak"),
])
def test_a_catalog_entry_the_planner_cannot_time_is_refused(tmp_path, capsys, fields, needle):
    path = tmp_path / "cat.yaml"
    path.write_text(f"gpus:\n  x:\n    base: a100-80gb\n    {fields}\n")
    assert main(["plan", "--model", "gpt2-124m", "--gpus", "16", "--gpu", "x", "--catalog", str(path)]) == 2
    err = capsys.readouterr().err
    assert needle in err and str(path) in err and "Traceback" not in err, err


def test_every_built_in_entry_is_usable_and_fp16_alone_is_enough(tmp_path, capsys):
    from trainperf.hardware.catalog import CATALOG, _usable

    for spec in CATALOG.values():
        assert _usable(spec, "built-in") is spec
    path = tmp_path / "cat.yaml"
    path.write_text("gpus:\n  my-v100:\n    base: a100-80gb\n    bf16_tflops: 0\n    tf32_tflops: 0\n")
    assert main(["plan", "--model", "gpt2-124m", "--gpus", "16", "--gpu", "my-v100", "--catalog", str(path)]) == 0
    assert "dense FP16 peak 312" in capsys.readouterr().out


@pytest.mark.parametrize("cfg,needle", [
    ({"model_type": "mixtral", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
      "num_key_value_heads": 8, "vocab_size": 32000, "intermediate_size": 14336, "num_local_experts": 8,
      "num_experts_per_tok": 2}, "num_local_experts=8, 2 active per token"),
    ({"model_type": "qwen2_moe", "hidden_size": 2048, "num_hidden_layers": 24, "num_attention_heads": 16,
      "vocab_size": 151936, "num_experts": 60, "num_experts_per_tok": 4}, "num_experts=60, 4 active per token"),
    ({"model_type": "deepseek_v3", "hidden_size": 7168, "num_hidden_layers": 61, "num_attention_heads": 128,
      "vocab_size": 129280, "n_routed_experts": 256, "num_experts_per_tok": 8}, "n_routed_experts=256"),
    ({"model_type": "dbrx", "d_model": 6144, "n_layers": 40, "n_heads": 48, "vocab_size": 100352,
      "ffn_config": {"moe_num_experts": 16, "moe_top_k": 4}}, "moe_num_experts=16, 4 active per token"),
])
def test_a_mixture_of_experts_config_is_not_planned_as_a_dense_model(tmp_path, capsys, cfg, needle):
    # Mixtral 8x7B once came back as a dense 7.24B model: a plan for a model a fraction of its size
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    assert main(["plan", "--hf-config", str(path), "--gpus", "8"]) == 2
    err = capsys.readouterr().err
    assert "mixture-of-experts" in err and needle in err and "dense transformers only" in err, err
    dense = {k: v for k, v in cfg.items() if k not in ("num_local_experts", "num_experts", "n_routed_experts",
                                                       "ffn_config")}
    path.write_text(json.dumps({**dense, "num_experts": 1}))  # one expert is a dense MLP
    assert main(["plan", "--hf-config", str(path), "--gpus", "8", "--top", "1"]) in (0, 2)
    assert "mixture-of-experts" not in capsys.readouterr().err


@pytest.mark.parametrize("key,value", [("num_hidden_layers", 10**20), ("hidden_size", 10**9), ("vocab_size", 10**12),
                                       ("num_attention_heads", 10**6), ("intermediate_size", 10**15)])
def test_a_config_with_a_typos_extra_digits_is_refused_at_once(tmp_path, capsys, key, value):
    # num_hidden_layers = 10**20 once searched pipeline splits for ever; every size has a bound far above
    # any published model (trainperf/limits.py), checked where the model's shape is built
    cfg = json.loads(GOOD_HF)
    cfg[key] = value
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    assert main(["plan", "--hf-config", str(path), "--gpus", "8"]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and f"={value} is above" in err and "Traceback" not in err, err


@pytest.mark.parametrize("value", ["3", "null", "true", "{a: 1}", "[[1]]"])
def test_catalog_aliases_that_are_not_names_are_refused(tmp_path, capsys, value):
    # aliases: 3 once ended in "TypeError: 'int' object is not iterable"
    path = tmp_path / "cat.yaml"
    path.write_text(f"gpus:\n  x:\n    base: a100-80gb\n    aliases: {value}\n")
    assert main(["plan", "--model", "gpt2-124m", "--gpus", "16", "--gpu", "x", "--catalog", str(path)]) == 2
    err = capsys.readouterr().err
    assert "gpus.x.aliases=" in err and "a name or a list of names" in err and str(path) in err, err
    path.write_text("gpus:\n  x:\n    base: a100-80gb\n    aliases: [My GPU, Other]\n")
    assert main(["plan", "--model", "gpt2-124m", "--gpus", "16", "--gpu", "x", "--catalog", str(path), "--top", "1"]) == 0


def test_calibrating_on_a_hand_written_config_with_an_auto_batch(tmp_path, capsys):
    # config.yaml without train.global_batch (auto) once ended in "TypeError: unsupported operand type(s) for /"
    run = tmp_path / "run"
    run.mkdir()
    (run / "summary.json").write_text(json.dumps({"tokens_per_s": 5000.0, "gpu_name": "NVIDIA A100-SXM4-80GB"}))
    (run / "config.yaml").write_text("model:\n  preset: tiny\ntrain:\n  micro_batch: 4\n")
    assert main(["plan", "--model", "gpt2-124m", "--gpus", "8", "--calibrate", str(run), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert "train.global_batch: auto in" in json.dumps(out) and "taken as 4" in json.dumps(out)
