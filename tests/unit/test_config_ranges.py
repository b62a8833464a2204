"""Every numeric config field has its range, errors name field, value, range and default; train.global_batch
auto (the Megatron convention) and the ways out of an impossible batch."""

from __future__ import annotations

import typing

import pytest
from pydantic import BaseModel

from trainperf.config import load_config
from trainperf.config.load import _bounds
from trainperf.train.resolve import DeviceFacts, resolve
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
    ("parallelism.data_shard", "-1", "in [1, 1048576] (default: 1)"),
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
    ("model.vocab_size", "1", "in [2, 2**26] or 'auto'"),
    ("train.global_batch", "0", "a whole number in [1, 2**30] or 'auto' (default: 'auto')"),
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


# ---------------------------------------------------------------------------- sizes a typo makes absurd
@pytest.mark.parametrize("key", ["model.n_layer", "model.n_head", "model.n_embd", "model.block_size",
                                 "model.vocab_size", "train.global_batch", "train.micro_batch", "parallelism.tensor",
                                 "parallelism.pipeline", "parallelism.data_shard", "parallelism.microbatches"])
def test_sizes_have_an_upper_bound(key):
    # 10**20 once hung `config show` (a divisor search over range(n) for the error message) or crashed the
    # model shape check; every size now has a bound far above any published run
    with pytest.raises(ConfigError) as e:
        load_config(None, [f"{key}={10**20}"])
    assert f"{key}={10**20}" in str(e.value) and "less than or equal to" in str(e.value)


def test_parallelism_data_upper_bound_and_auto():
    assert load_config(None, ["parallelism.data=-1"]).parallelism.data == -1  # -1: derive from the world size
    with pytest.raises(ConfigError, match=r"parallelism.data=100000000000: must be a positive degree \(at most"):
        load_config(None, ["parallelism.data=100000000000"])


def test_divisor_messages_are_fast_and_bounded_for_large_numbers():
    import time

    from trainperf.config.resolve import _divisors, _largest_divisor_at_most, divisor_list

    assert divisor_list(36) == ([1, 2, 3, 4, 6, 9, 12, 18, 36], True)
    assert divisor_list(1) == ([1], True) and divisor_list(49) == ([1, 7, 49], True)
    t0 = time.process_time()
    big_prime = 2**31 - 1  # trial division to its square root (46341), never to the number itself
    assert divisor_list(big_prime) == ([1, big_prime], True)
    assert _largest_divisor_at_most(2**30, 1000) == 512
    huge = 10**20  # beyond the search limit: the small divisors and their cofactors, flagged as partial
    divs, complete = divisor_list(huge)
    assert not complete and divs[0] == 1 and divs[-1] == huge and all(huge % d == 0 for d in divs)
    assert "among others" in _divisors(huge) and "..." in _divisors(huge)
    assert time.process_time() - t0 < 30  # CPU time: a whole-range loop would take hours
    # a many-divisor batch: the message shows the first and last dozen, not all 120
    assert _divisors(720720).count(",") == 24 and _divisors(720720).startswith("1, 2, 3")


def test_impossible_batch_with_a_large_prime_global_batch_answers_at_once():
    cfg = load_config(None, ["train.global_batch=999999937", "train.micro_batch=16"])
    with pytest.raises(ConfigError) as e:
        resolve(cfg, CPU, world_size=1)
    assert "lower train.micro_batch to 1 (any divisor of the per-replica batch 999999937: 1, 999999937)" in str(e.value)


@pytest.mark.parametrize("sets,needle", [
    # each once a ValueError from torch.distributed.pipelining on one rank, mid-launch
    (["parallelism.microbatches=1"], "parallelism.microbatches=1 is below parallelism.pipeline=2: the 1f1b schedule"),
    (["parallelism.microbatches=5", "parallelism.pipeline_schedule=interleaved_1f1b", "parallelism.interleave=2"],
     "set parallelism.microbatches to 4 or 6"),
])
def test_pipeline_schedules_get_the_micro_batches_torch_requires(sets, needle):
    cfg = load_config(None, ["parallelism.pipeline=2", "train.micro_batch=1", *sets])
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(")):
        resolve(cfg, CPU, world_size=2)
    for ok in (["parallelism.microbatches=1", "parallelism.pipeline_schedule=gpipe"],
               ["parallelism.microbatches=3", "parallelism.pipeline_schedule=interleaved_1f1b", "parallelism.interleave=2"],
               ["parallelism.microbatches=2"]):
        resolve(load_config(None, ["parallelism.pipeline=2", "train.micro_batch=1", *ok]), CPU, world_size=2)


@pytest.mark.parametrize("name", ["../../elsewhere", "a/b", "..", "x" * 300])
def test_run_name_stays_one_directory_under_runs(name):
    # run.name of 300 characters ended in "OSError: File name too long"; '../x' wrote outside runs/
    with pytest.raises(ConfigError, match="run.name="):
        load_config(None, [f"run.name={name}"])
    cfg = load_config(None, ["run.name=llama3_8b-v2.1"])
    assert cfg.run_dir() == "runs/llama3_8b-v2.1"


def test_an_integer_written_in_exponent_form_says_how_to_write_it():
    # YAML 1.1 reads 1e3 as text; the error says to write 1000
    with pytest.raises(ConfigError, match=r"write it as 1000 \(YAML reads '1e3' as text"):
        load_config(None, ["run.steps=1e3"])


@pytest.mark.parametrize("spec", [":", ":fn", "a.b:c:d", "x", ""])
def test_an_entrypoint_that_is_not_module_colon_function_is_refused(spec):
    # ':' once reached importlib ("ValueError: Empty module name", a traceback)
    from trainperf.entrypoint import load_entrypoint

    with pytest.raises(ConfigError, match="write it as 'package.module:function'"):
        load_entrypoint(spec)
