"""Booleans are refused where the config expects a number: pydantic's lax mode read True as 1 and False as 0, and
YAML 1.1 reads yes/no/on/off as booleans, so `run: {steps: yes}` silently meant a one-step run. Boolean fields
still take true/false."""

from __future__ import annotations

import typing

import pytest
from pydantic import BaseModel

from trainperf.cli import main
from trainperf.config import load_config
from trainperf.config.load import _bounds
from trainperf.config.schema import Config
from trainperf.errors import ConfigError

HINT = "a boolean where"


def numeric_fields(model: type[BaseModel] = Config, prefix: str = ""):
    """(path, bounds) of every field that takes an int or a float, through the whole tree."""
    for name, info in model.model_fields.items():
        ann, path = info.annotation, prefix + name
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            yield from numeric_fields(ann, path + ".")
            continue
        b = _bounds(ann, list(info.metadata), {})
        if b.get("kinds", set()) & {"int", "float"} or typing.get_origin(ann) is tuple:
            yield path, b


def write(tmp_path, text, name="c.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


# key, YAML value as written, shown value, what the error says is expected
SET_CASES = [
    ("run.steps", "true", "True", "a whole number"),                       # int
    ("run.seed", "false", "False", "a whole number"),                      # int, False is not 0
    ("optimizer.lr", "true", "True", "a number"),                          # float
    ("train.global_batch", "true", "True", "a whole number"),              # Union["auto", int]
    ("parallelism.balance.threshold", "on", "True", "a number"),           # nested float, YAML 1.1 'on'
    ("parallelism.compression.rank", "yes", "True", "a whole number"),     # nested int, YAML 1.1 'yes'
    ("model.n_layer", "no", "False", "a whole number"),                    # Optional[int]
    ("optimizer.betas", "[0.9, true]", "[0.9, True]", "a number"),         # inside a tuple of floats
]


@pytest.mark.parametrize("key,raw,shown,kind", SET_CASES, ids=[c[0] for c in SET_CASES])
def test_set_refuses_a_boolean_for_a_number(key, raw, shown, kind, tmp_path, capsys):
    ok = write(tmp_path, "run: {steps: 3}\n", "ok.yaml")
    assert main(["config", "show", ok, "--set", f"{key}={raw}"]) == 2
    err = capsys.readouterr().err
    assert f"{key}={shown}: {HINT} {kind} is expected" in err, err
    assert "yes/no/on/off/true/false" in err and f"set {key} to" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("text,key,shown,kind", [
    ("run: {steps: yes}\n", "run.steps", "True", "a whole number"),
    ("optimizer: {lr: true}\n", "optimizer.lr", "True", "a number"),
    ("parallelism:\n  balance:\n    window: off\n", "parallelism.balance.window", "False", "a whole number"),
    ("monitor:\n  profile:\n    start_step: true\n", "monitor.profile.start_step", "True", "a whole number"),
], ids=["int", "float", "nested-int", "nested-optional-int"])
def test_yaml_file_refuses_a_boolean_for_a_number(text, key, shown, kind, tmp_path, capsys):
    bad = write(tmp_path, text)
    assert main(["config", "show", bad]) == 2
    err = capsys.readouterr().err
    assert f"{key}={shown}: {HINT} {kind} is expected" in err, err
    assert "Traceback" not in err


def test_global_batch_error_names_the_boolean_not_1(tmp_path, capsys):
    ok = write(tmp_path, "run: {steps: 3}\n", "ok.yaml")
    assert main(["config", "show", ok, "--set", "train.global_batch=true"]) == 2
    err = capsys.readouterr().err
    assert "train.global_batch=True" in err and "train.global_batch=1" not in err


def test_a_size_field_refuses_a_boolean(tmp_path, capsys):
    ok = write(tmp_path, "run: {steps: 3}\n", "ok.yaml")
    assert main(["config", "show", ok, "--set", "data.cache.max_bytes=true"]) == 2
    assert "data.cache.max_bytes=True" in capsys.readouterr().err


def test_every_numeric_field_refuses_true_and_false():
    """The check lives on the common base model, so every int/float field (new ones too) has it."""
    paths = [p for p, b in numeric_fields() if "bool" not in b.get("kinds", set())]
    assert len(paths) > 50
    for path in paths:
        for value in ("true", "false"):
            with pytest.raises(ConfigError, match=rf"{path.replace('.', r'[.]')}=(True|False|\[)"):
                load_config(None, [f"{path}={value}"])


def test_boolean_fields_still_take_booleans(tmp_path, capsys):
    cfg = load_config(None, ["run.progress=false", "compile.enabled=true", "data.pin_memory=no",
                             "compile.regional=on", "monitor.tensorboard=yes", "parallelism.balance.verify=false"])
    assert cfg.run.progress is False and cfg.compile.enabled is True and cfg.data.pin_memory is False
    assert cfg.compile.regional is True and cfg.monitor.tensorboard is True and cfg.parallelism.balance.verify is False
    path = write(tmp_path, "run: {progress: no}\nmodel: {bias: off}\ncheckpoint: {at_end: false}\n")
    cfg = load_config(path)
    assert cfg.run.progress is False and cfg.model.bias is False and cfg.checkpoint.at_end is False
    assert main(["config", "show", path, "--set", "compile.fullgraph=true"]) == 0
    assert "fullgraph: true" in capsys.readouterr().out


def test_numbers_and_free_form_dicts_are_unchanged():
    cfg = load_config(None, ["run.steps=5", "optimizer.lr=3e-4", "optimizer.betas=[0.9, 0.99]",
                             "model.hf.config={model_type: llama, tie_word_embeddings: true}"])
    assert cfg.run.steps == 5 and cfg.optimizer.lr == 3e-4 and cfg.optimizer.betas == (0.9, 0.99)
    assert cfg.model.hf.config["tie_word_embeddings"] is True
    assert Config().run.steps == 200


def test_a_key_given_twice_in_one_mapping_is_refused_not_last_wins(tmp_path):
    from trainperf.config.load import load_config
    from trainperf.errors import UserError
    from trainperf.runio import load_yaml

    path = tmp_path / "dup.yaml"
    path.write_text("run:\n  steps: 3\n  steps: 500\n")
    with pytest.raises(UserError, match=r"key 'steps' appears twice in one mapping \(line 2 and line 3\)"):
        load_config(str(path))
    # a merge key then an override is YAML's own way to reuse a block, not a repeat
    assert load_yaml("base: &b {steps: 3, seed: 1}\nrun:\n  <<: *b\n  steps: 7\n", "x")["run"] == {"steps": 7, "seed": 1}


def test_a_learning_rate_of_1e10_is_refused_before_training(capsys):
    # it used to train, diverge, exit 1 and suggest "lower optimizer.lr (e.g. 1e+09)"
    from tests.conftest import ROOT

    assert main(["config", "show", str(ROOT / "configs" / "gpt-tiny.yaml"), "--set", "optimizer.lr=1e10"]) == 2
    assert "optimizer.lr='1e10': must be less than or equal to 1000000" in capsys.readouterr().err
