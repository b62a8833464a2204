"""Every numeric config field has its range, errors name field, value, range and default; train.global_batch
auto (the Megatron convention) and the ways out of an impossible batch."""

from __future__ import annotations

import typing

import pytest
from pydantic import BaseModel

from trainperf.config import load_config
from trainperf.config.load import _bounds
from trainperf.config.resolve import DeviceFacts, resolve
from trainperf.config.schema import Config
from trainperf.errors import ConfigError

CPU = DeviceFacts(cpus=2, local_ranks=1, fused_adam_devices=("cpu", "cuda"))
# numeric fields whose validity is not a simple range (checked by a validator with its own message)
CUSTOM = {"parallelism.data"}  # a positive degree or -1


def numeric_fields(model: type[BaseModel] = Config, prefix: str = ""):
    for name, info in model.model_fields.items():
        ann, path = info.annotation, prefix + name
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            yield from numeric_fields(ann, path + ".")
            continue
        b = _bounds(ann, list(info.metadata), {})
        if b.get("kinds", set()) & {"int", "float"} or typing.get_origin(ann) is tuple:
            yield path, b


def test_every_numeric_field_has_a_range():
    fields = dict(numeric_fields())
    assert len(fields) > 50  # the walk reached the whole tree
    missing = [p for p, b in fields.items() if not ({"ge", "gt", "le", "lt"} & set(b)) and p not in CUSTOM]
    assert not missing, f"numeric fields without a range: {missing}"


@pytest.mark.parametrize("key,value,needle", [
    ("memory.checkpointing.ratio", "1.5", "to a number in (0, 1] (default: 0.25)"),
    ("memory.checkpointing.ratio", "0", "in (0, 1]"),
    ("parallelism.balance.threshold", "0", "> 0 (default: 0.2)"),
    ("parallelism.balance.min_share", "1.5", "in [0, 1] (default: 0.0)"),
    ("parallelism.balance.max_share", "0", "in (0, 1] (default: 1.0)"),
    ("parallelism.balance.min_gain", "1", "in [0, 1) (default: 0.02)"),
    ("parallelism.balance.window", "1", ">= 2 (default: 100)"),
    ("parallelism.balance.sync_every", "0", ">= 1"),
    ("parallelism.data_shard", "-1", ">= 1 (default: 1)"),
    ("optimizer.betas", "[0.9, 1.0]", "in [0, 1)"),
    ("optimizer.lr", ".inf", "must be a finite number"),
    ("optimizer.eps", ".nan", "must be a finite number"),
    ("run.seed", "-1", "in [0, 2**64)"),
    ("run.threads", "0", ">= 1 or 'auto'"),
    ("run.name", "''", "at least 1 character"),
    ("data.val_fraction", "0.5", "in (0, 0.5)"),
    ("data.cache.max_bytes", "0", "a size (bytes, or with a unit like '512MB') >= 1"),
    ("data.prefetch.device_bytes", "-1GB", ">= 1"),
    ("data.num_workers", "-1", ">= 0 or 'auto'"),
    ("model.vocab_size", "1", ">= 2 or 'auto'"),
    ("train.global_batch", "0", "a whole number >= 1 or 'auto' (default: 'auto')"),
    ("monitor.prometheus_port", "70000", "in [0, 65535] or null"),
])
def test_out_of_range_names_field_value_range_and_default(key, value, needle):
    with pytest.raises(ConfigError) as e:
        load_config(None, [f"{key}={value}"])
    msg = str(e.value)
    assert f"{key}=" in msg and f"set {key} to" in msg and needle in msg, msg


def test_sizes_accept_units_and_refuse_nonsense():
    cfg = load_config(None, ["data.prepare_max_bytes=2MB", "data.cache.max_bytes=1GiB"])
    assert cfg.data.prepare_max_bytes == 2_000_000 and cfg.data.cache.max_bytes == 2**30
    for bad in ("1e400GB", ".inf", "lots"):
        with pytest.raises(ConfigError, match="data.cache.max_bytes"):
            load_config(None, [f"data.cache.max_bytes={bad}"])


# ---------------------------------------------------------------------------- global_batch: auto
def test_global_batch_auto_is_micro_x_data_x_pipeline_microbatches():
    r = resolve(load_config(None, ["train.micro_batch=4"]), CPU, world_size=1)
    assert r.cfg.train.global_batch == 4 and "micro_batch 4 x data-parallel degree 1" in r.notes["train.global_batch"]
    r = resolve(load_config(None, ["train.micro_batch=4"]), CPU, world_size=2)
    assert r.cfg.train.global_batch == 8
    r = resolve(load_config(None, ["train.micro_batch=2", "parallelism.pipeline=2", "parallelism.microbatches=4"]),
                CPU, world_size=4)
    assert r.cfg.train.global_batch == 2 * 2 * 4 and "parallelism.microbatches 4" in r.notes["train.global_batch"]
    r = resolve(load_config(None, ["train.global_batch=24", "train.micro_batch=4"]), CPU, world_size=2)
    assert r.cfg.train.global_batch == 24 and "train.global_batch" not in r.notes  # integers still work


def test_founding_fragment_resolves_with_auto(tmp_path):
    p = tmp_path / "fragment.yaml"
    p.write_text("optimizer: {type: fused_adam, lr: 6e-5, weight_decay: 0.01}\n"
                 "parallelism: {tensor: 8, pipeline: 4, data: 16}\n")
    cfg = load_config(str(p))
    assert cfg.train.global_batch == "auto"
    # the default model (tiny: 4 heads) cannot be split 8 ways: the error names the presets that can
    with pytest.raises(ConfigError, match="parallelism.tensor=8 does not divide model.n_head=4 .*model.preset such as"):
        resolve(cfg, CPU, world_size=512)
    cfg = load_config(str(p), ["model.preset=gpt3-175b"])
    r = resolve(cfg, CPU, world_size=512)
    assert r.cfg.train.global_batch == 16 * 16 * 8  # micro 16 x data 16 x microbatches 8
    from pathlib import Path

    full = load_config(str(Path(__file__).resolve().parents[2] / "configs/gpt3-175b.yaml"))
    assert resolve(full, CPU, world_size=512).cfg.train.global_batch == 1536


def test_impossible_batch_names_every_way_out():
    # the case: the old default 16 over 16 data replicas x 8 pipeline micro-batches
    cfg = load_config(None, ["model.preset=gpt3-175b", "parallelism.tensor=8", "parallelism.pipeline=4",
                             "parallelism.data=16", "train.global_batch=16"])
    with pytest.raises(ConfigError) as e:
        resolve(cfg, CPU, world_size=512)
    msg = str(e.value)
    assert "per-replica batch (train.global_batch / data degree = 16 / 16) is not divisible by " \
           "parallelism.microbatches=8" in msg
    for way in ("raise train.global_batch to 128", "lower parallelism.microbatches to 1",
                "set train.global_batch: auto (= micro_batch x data degree x microbatches = 2048)"):
        assert way in msg, (way, msg)
    # pipelining: the micro-batch count way out, and the global batch both ways
    cfg = load_config(None, ["train.global_batch=24", "train.micro_batch=4", "parallelism.pipeline=2",
                             "parallelism.microbatches=8"])
    with pytest.raises(ConfigError) as e:
        resolve(cfg, CPU, world_size=4)
    msg = str(e.value)
    for way in ("raise train.global_batch to 32", "lower it to 16", "lower parallelism.microbatches to 6"):
        assert way in msg, (way, msg)
    # the micro-batch way out
    cfg = load_config(None, ["train.global_batch=24", "train.micro_batch=8", "parallelism.pipeline=2",
                             "parallelism.microbatches=4"])
    with pytest.raises(ConfigError) as e:
        resolve(cfg, CPU, world_size=4)
    msg = str(e.value)
    assert "train.global_batch=24 is not divisible by train.micro_batch x data-parallel degree = 8 x 2 = 16" in msg
    for way in ("raise train.global_batch to 32", "lower it to 16", "lower train.micro_batch to 6"):
        assert way in msg, (way, msg)
