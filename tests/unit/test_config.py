"""Config: loading, precedence, strictness, suggestions, auto resolution, the seed's fragment."""

from __future__ import annotations

import json

import pytest

from trainperf.cli import main
from trainperf.config import load_config
from trainperf.train.resolve import DeviceFacts, resolve
from trainperf.errors import ConfigError

CPU = DeviceFacts(cpus=2, local_ranks=1, fused_adam_devices=("cpu", "cuda"))
A100 = DeviceFacts(cuda=True, cuda_name="NVIDIA A100-SXM4-80GB", bf16=True, tf32=True, cpus=64, local_ranks=8,
                   fused_adam_devices=("cpu", "cuda"))
V100 = DeviceFacts(cuda=True, cuda_name="Tesla V100", bf16=False, tf32=False, cpus=40, local_ranks=4)


def write(tmp_path, text, name="c.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def test_seed_fragment_loads_exactly(tmp_path):
    path = write(tmp_path, "optimizer: {type: fused_adam, lr: 6e-5, weight_decay: 0.01}\n"
                           "parallelism: {tensor: 8, pipeline: 4, data: 16}\n")
    cfg = load_config(path)
    assert cfg.optimizer.type == "fused_adam" and cfg.optimizer.lr == 6e-5 and cfg.optimizer.weight_decay == 0.01
    assert (cfg.parallelism.tensor, cfg.parallelism.pipeline, cfg.parallelism.data) == (8, 4, 16)


def test_fused_adam_resolution_says_which_kernel():
    cfg = load_config(None, ["optimizer.type=fused_adam"])
    r = resolve(cfg, CPU, world_size=1)
    assert r.cfg.optimizer.impl == "fused" and "fused" in r.notes["optimizer.impl"]
    no_fused = DeviceFacts(cpus=2, local_ranks=1, fused_adam_devices=("cuda",))
    r = resolve(cfg, no_fused, world_size=1)
    assert r.cfg.optimizer.impl == "foreach" and "foreach" in r.notes["optimizer.impl"]


def test_precedence_set_over_file_over_default(tmp_path):
    path = write(tmp_path, "optimizer: {lr: 0.5}\nrun: {steps: 7}\n")
    cfg = load_config(path, ["optimizer.lr=0.25"])
    assert cfg.optimizer.lr == 0.25 and cfg.run.steps == 7 and cfg.run.seed == 1337


def test_unknown_key_suggests_nearest(tmp_path):
    path = write(tmp_path, "parallelism: {tensr: 2}\n")
    with pytest.raises(ConfigError, match=r"parallelism\.tensr: unknown key; did you mean 'parallelism\.tensor'"):
        load_config(path)
    with pytest.raises(ConfigError, match="did you mean 'optimizer'"):
        load_config(None, ["optimiser.lr=1"])


def test_wrong_type_and_negative_value_name_field_and_value():
    with pytest.raises(ConfigError, match=r"optimizer\.lr='fast'"):
        load_config(None, ["optimizer.lr=fast"])
    with pytest.raises(ConfigError, match=r"run\.steps=-3: .*greater than or equal to 1"):
        load_config(None, ["run.steps=-3"])


def test_sizes_parse_with_units():
    cfg = load_config(None, ["data.cache.max_bytes=50GB", "data.prefetch.device_bytes=8GiB"])
    assert cfg.data.cache.max_bytes == 50 * 10**9 and cfg.data.prefetch.device_bytes == 8 * 2**30
    with pytest.raises(ConfigError, match="not a size"):
        load_config(None, ["data.cache.max_bytes=lots"])


def test_auto_resolution_cpu_and_gpu():
    cfg = load_config(None)
    r = resolve(cfg, CPU, world_size=1)
    assert r.cfg.run.device == "cpu" and r.cfg.precision.dtype == "fp32" and r.cfg.data.pin_memory is False
    assert r.cfg.data.num_workers == 2 and r.cfg.distributed.backend == "gloo"
    assert {"run.device", "precision.dtype", "data.num_workers"} <= set(r.notes)
    r = resolve(cfg, A100, world_size=1)
    assert r.cfg.precision.dtype == "bf16" and r.cfg.data.pin_memory is True and r.cfg.distributed.backend == "nccl"
    assert r.cfg.data.num_workers == 8  # 64 CPUs / 8 local ranks, not 2 x cores
    assert resolve(cfg, V100, world_size=1).cfg.precision.dtype == "fp16"


def test_a_v100_is_not_taken_for_bf16_hardware(monkeypatch):
    # torch >= 2.3 says a V100 supports bf16 (emulated, no tensor cores); auto precision must still pick fp16
    import torch

    from trainperf.config.resolve import DeviceFacts

    calls = []

    def is_bf16_supported(including_emulation=True):
        calls.append(including_emulation)
        return including_emulation  # what torch answers on compute capability 7.0

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "Tesla V100-SXM2-32GB")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=0: (7, 0))
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", is_bf16_supported)
    facts = DeviceFacts.probe()
    assert calls == [False] and facts.cuda and not facts.bf16 and not facts.tf32
    assert resolve(load_config(None, []), facts, world_size=1).cfg.precision.dtype == "fp16"
    with pytest.raises(ConfigError, match="no bf16 tensor cores.*precision.dtype=fp16"):
        resolve(load_config(None, ["precision.dtype=bf16"]), facts, world_size=1)


def test_impossible_combinations():
    with pytest.raises(ConfigError, match="fp16.*needs a CUDA device"):
        resolve(load_config(None, ["precision.dtype=fp16"]), CPU, world_size=1)
    with pytest.raises(ConfigError, match="tf32"):
        resolve(load_config(None, ["precision.dtype=tf32"]), V100, world_size=1)
    with pytest.raises(ConfigError, match="no CUDA device"):
        resolve(load_config(None, ["run.device=cuda"]), CPU, world_size=1)


def test_cross_field_batch_and_shape_checks():
    with pytest.raises(ConfigError, match=r"global_batch=10 is not divisible by .* 4 x 1 = 4"):
        resolve(load_config(None, ["train.global_batch=10", "train.micro_batch=4"]), CPU, world_size=1)
    with pytest.raises(ConfigError, match=r"global_batch=16 .* 3 x 4 = 12"):
        resolve(load_config(None, ["train.global_batch=16", "train.micro_batch=3"]), CPU, world_size=4)
    # a micro-batch above a data rank's share trains as that share (same training; distributed issue)
    r = resolve(load_config(None, ["train.global_batch=16", "train.micro_batch=8"]), CPU, world_size=4)
    assert "micro-batches of 4" in r.notes["train.micro_batch"] and r.cfg.train.micro_batch == 8
    with pytest.raises(ConfigError, match=r"parallelism.tensor=3 does not divide model.n_head=4 .*choose parallelism.tensor among 1, 2, 4"):
        resolve(load_config(None, ["parallelism.tensor=3"]), CPU, world_size=3)
    with pytest.raises(ConfigError, match="exceeds model.n_layer=4"):
        resolve(load_config(None, ["parallelism.pipeline=8", "parallelism.microbatches=1"]), CPU, world_size=8)


def test_data_degree_derived_from_world_size():
    cfg = load_config(None, ["parallelism.tensor=2", "train.global_batch=32", "train.micro_batch=4"])
    r = resolve(cfg, CPU, world_size=8)
    assert r.cfg.parallelism.data == 4 and "world size 8" in r.notes["parallelism.data"]


# ---------------------------------------------------------------- CLI: exit code 2, no traceback
BAD = [
    ("missing file", ["config", "show", "/nonexistent/x.yaml"], "does not exist"),
    ("yaml syntax", None, "YAML syntax error at line 3"),
    ("unknown key", ["config", "show", "{ok}", "--set", "run.stpes=3"], "did you mean 'run.steps'"),
    ("wrong type", ["config", "show", "{ok}", "--set", "train.micro_batch=big"], "train.micro_batch='big'"),
    ("negative", ["config", "show", "{ok}", "--set", "optimizer.lr=-1"], "optimizer.lr=-1"),
    ("impossible", ["config", "show", "{ok}", "--set", "precision.dtype=fp16"], "needs a CUDA device"),
]


@pytest.mark.parametrize("name,argv,expect", BAD, ids=[b[0] for b in BAD])
def test_cli_bad_input_exit_2_without_traceback(name, argv, expect, tmp_path, capsys):
    ok = write(tmp_path, "run: {steps: 3}\n", "ok.yaml")
    if argv is None:
        bad = write(tmp_path, "run:\n  steps: [1, 2\nmodel: {}\n", "bad.yaml")
        argv = ["config", "show", bad]
    argv = [a.replace("{ok}", ok) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert expect in err and "Traceback" not in err


def test_config_show_marks_auto_and_schema_has_docs(capsys, tmp_path):
    ok = write(tmp_path, "run: {steps: 3}\n")
    assert main(["config", "show", ok, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["config"]["run"]["steps"] == 3 and "precision.dtype" in out["resolved"]
    assert main(["config", "show", ok]) == 0
    assert "# (auto:" in capsys.readouterr().out
    assert main(["config", "schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    run_props = schema["$defs"]["RunConfig"]["properties"]
    assert all(prop.get("description") for prop in run_props.values())


@pytest.mark.parametrize("name", ["gpt-tiny", "gpt2-124m", "gpt3-175b"])
def test_shipped_configs_resolve(name):
    from tests.conftest import ROOT

    cfg = load_config(str(ROOT / "configs" / f"{name}.yaml"))
    p = cfg.parallelism
    world = max(1, p.data) * p.data_shard * p.tensor * p.pipeline
    r = resolve(cfg, CPU, world_size=world)
    assert r.cfg.run.steps >= 1
    if name == "gpt3-175b":  # the founding document's fragment, as written
        assert (p.tensor, p.pipeline, p.data, cfg.optimizer.type, cfg.optimizer.lr) == (8, 4, 16, "fused_adam", 6e-5)
