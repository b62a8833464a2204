"""Trainer: learns, writes its run directory, resumes bit-exactly after kill -9, survives a corrupt checkpoint."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.conftest import ROOT, run_cli
from trainperf.config import load_config
from trainperf.train.resolve import resolve
from trainperf.train.checkpoint import CheckpointManager
from trainperf.train.knobs import CKPT_KILL_ENV as FAULT_ENV
from trainperf.train.build import build_trainer
from trainperf.train.run import fit


def train_in_process(overrides, resume="never"):
    cfg = load_config(None, overrides)
    trainer = build_trainer(resolve(cfg, world_size=1), verbose=False)
    return trainer, fit(trainer, resume=resume, verbose=False)


def final_state(run_dir: Path) -> dict:
    mgr = CheckpointManager(run_dir / "checkpoints")
    step, state = mgr.load_latest()
    return state


def assert_bit_identical(a: dict, b: dict):
    assert a["step"] == b["step"]
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), f"parameter {k} differs"
    for (ka, sa), (kb, sb) in zip(a["optimizer"]["state"].items(), b["optimizer"]["state"].items()):
        assert torch.equal(sa["exp_avg"], sb["exp_avg"]) and torch.equal(sa["exp_avg_sq"], sb["exp_avg_sq"])


def test_trains_and_writes_run_directory(tiny_overrides, tmp_path):
    trainer, summary = train_in_process(tiny_overrides + ["run.steps=40", "run.eval_every=20", "run.sample_tokens=20"])
    run = tmp_path / "run"
    for key in ("final_loss", "steps", "tokens_per_s", "elapsed_s"):
        assert summary[key] is not None
    assert summary["steps"] == 40
    assert summary["val_loss"] < summary["initial_val_loss"] - 0.5  # learned something real
    assert json.loads((run / "summary.json").read_text())["steps"] == 40
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines if "loss" in r] == list(range(1, 41))
    assert {"data", "forward", "backward", "optimizer"} <= set(lines[-1]["phases_s"])
    assert any("val_loss" in r for r in lines)
    assert summary["sample"].startswith("def ") and len(summary["sample"]) > 4
    assert CheckpointManager(run / "checkpoints").steps() == [40]


def test_gradient_accumulation_matches_one_big_micro_batch(tiny_overrides, tmp_path):
    _, a = train_in_process(tiny_overrides + ["run.steps=5", "train.micro_batch=8", f"run.dir={tmp_path}/a"])
    _, b = train_in_process(tiny_overrides + ["run.steps=5", "train.micro_batch=2", f"run.dir={tmp_path}/b"])
    assert a["final_loss"] == pytest.approx(b["final_loss"], rel=1e-4)  # fp32 summation order only


def _cli_train(overrides, run_dir, resume="auto", env=None):
    args = ["train", "-"] if False else ["train", str(ROOT / "configs" / "gpt-tiny.yaml")]
    sets = []
    for o in overrides + [f"run.dir={run_dir}"]:
        sets += ["--set", o]
    return run_cli(args + sets + ["--resume", resume], env=env)


@pytest.mark.slow
def test_kill9_during_checkpoint_write_then_resume_is_bit_identical(tiny_overrides, tmp_path):
    ov = tiny_overrides + ["run.steps=12", "checkpoint.every=4", "checkpoint.keep=5"]
    ref = _cli_train(ov, tmp_path / "ref", resume="never")
    assert ref.returncode == 0, ref.stderr
    # Killed with SIGKILL half-way through writing the step-8 checkpoint.
    crashed = _cli_train(ov, tmp_path / "b", resume="never", env={FAULT_ENV: "8"})
    assert crashed.returncode == -signal.SIGKILL
    ckdir = tmp_path / "b" / "checkpoints"
    assert CheckpointManager(ckdir).steps() == [4]
    assert any(p.name.startswith(".step-00000008.pt.tmp") for p in ckdir.iterdir())  # the torn write
    resumed = _cli_train(ov, tmp_path / "b", resume="auto")
    assert resumed.returncode == 0, resumed.stderr
    assert "continuing from the checkpoint of step 4" in resumed.stdout
    assert_bit_identical(final_state(tmp_path / "ref"), final_state(tmp_path / "b"))
    ref_m = (tmp_path / "ref" / "metrics.jsonl").read_text().splitlines()
    b_m = (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()
    ref_loss = [json.loads(x)["loss"] for x in ref_m]
    b_loss = [json.loads(x)["loss"] for x in b_m]
    assert ref_loss == b_loss  # metrics truncated at the checkpoint and recomputed exactly


@pytest.mark.slow
def test_kill9_at_a_random_moment_then_resume_is_bit_identical(tiny_overrides, tmp_path):
    ov = tiny_overrides + ["run.steps=30", "checkpoint.every=3"]
    ref_dir, run_dir = tmp_path / "ref", tmp_path / "b"
    _, _ = train_in_process(ov + [f"run.dir={ref_dir}"])
    sets = sum((["--set", o] for o in ov + [f"run.dir={run_dir}"]), [])
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "trainperf", "train", str(ROOT / "configs/gpt-tiny.yaml"), *sets,
                             "--resume", "never"], env=env, cwd=str(ROOT),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    metrics = run_dir / "metrics.jsonl"
    deadline = time.time() + 120
    target = random.Random().randint(5, 20)
    while time.time() < deadline:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= target:
            break
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    _, summary = train_in_process(ov + [f"run.dir={run_dir}"], resume="auto")
    assert summary["steps"] == 30
    assert_bit_identical(final_state(ref_dir), final_state(run_dir))


def test_corrupt_latest_checkpoints_fall_back_to_previous_good(tiny_overrides, tmp_path, capsys):
    ov = tiny_overrides + ["run.steps=12", "checkpoint.every=4"]
    ref_dir, run_dir = tmp_path / "ref", tmp_path / "b"
    train_in_process(ov + [f"run.dir={ref_dir}"])
    train_in_process(ov + [f"run.dir={run_dir}"])  # checkpoints at 4, 8 and 12
    ck = run_dir / "checkpoints"
    latest = ck / "step-00000012.pt"
    data = bytearray(latest.read_bytes())
    data[len(data) // 2] ^= 0xFF  # corrupted in the middle
    latest.write_bytes(bytes(data))
    older = ck / "step-00000008.pt"
    older.write_bytes(older.read_bytes()[:1000])  # truncated
    with pytest.warns(UserWarning) as record:
        _, summary = train_in_process(ov + [f"run.dir={run_dir}"], resume="auto")
    messages = " ".join(str(w.message) for w in record)
    assert "step 12 is corrupt" in messages and "checksum mismatch" in messages
    assert "step 8 is corrupt" in messages and "truncated" in messages
    assert summary["resumed_from"] == 4 and "using step 4" in capsys.readouterr().out
    assert_bit_identical(final_state(ref_dir), final_state(run_dir))


def test_resume_with_changed_model_is_refused(tiny_overrides, tmp_path, capsys):
    from trainperf.cli import main

    ov = tiny_overrides + ["run.steps=2"]
    train_in_process(ov)
    sets = sum((["--set", o] for o in ov + ["model.n_layer=3"]), [])
    assert main(["train", str(ROOT / "configs/gpt-tiny.yaml"), *sets]) == 2
    assert "resume with the same setting" in capsys.readouterr().err


def test_missing_data_path_is_a_clear_error(tiny_overrides, tmp_path, capsys):
    from trainperf.cli import main

    sets = sum((["--set", o] for o in tiny_overrides + [f"data.path={tmp_path}/nowhere", "data.prepare_from=null"]), [])
    assert main(["train", str(ROOT / "configs/gpt-tiny.yaml"), *sets]) == 2
    err = capsys.readouterr().err
    assert "holds no prepared tokens" in err and "trainperf data prepare" in err and "Traceback" not in err


def test_corrupt_checkpoint_file_named_explicitly_exit_2(tiny_overrides, tmp_path, capsys):
    from trainperf.cli import main

    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a checkpoint")
    sets = sum((["--set", o] for o in tiny_overrides), [])
    assert main(["train", str(ROOT / "configs/gpt-tiny.yaml"), *sets, "--resume", str(bad)]) == 2
    assert "cannot be loaded as a checkpoint" in capsys.readouterr().err


def test_a_diverged_run_ends_with_what_to_change_and_keeps_its_records(tiny_overrides, tmp_path, capsys):
    # optimizer.lr=1e6 once ended in a FloatingPointError traceback (exit 1 all the same)
    from trainperf.cli import main
    from trainperf.errors import DivergedError

    assert issubclass(DivergedError, FloatingPointError)  # a library caller catching FloatingPointError still does
    run_dir = tmp_path / "run"
    sets = sum((["--set", o] for o in tiny_overrides + ["run.steps=6", "run.log_every=1", "optimizer.lr=1e6",
                                                         "train.grad_clip=0", "run.eval_every=0"]), [])
    assert main(["train", str(ROOT / "configs/gpt-tiny.yaml"), *sets]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and "training diverged (optimizer.lr=1e+06" in err, err
    assert "lower optimizer.lr (e.g. 0.0003)" in err and "clip gradients (train.grad_clip: 1.0)" in err
    assert f"trainperf diagnose {run_dir}" in err
    steps = [r for r in map(__import__("json").loads, (run_dir / "metrics.jsonl").read_text().splitlines())
             if "loss" in r]
    assert steps  # the steps before the divergence reached the disk
    assert main(["diagnose", str(run_dir)]) == 0  # and a diagnosis reads them


@pytest.mark.parametrize("field", ["run.dir", "checkpoint.dir"])
def test_a_run_directory_that_cannot_be_made_is_refused_before_the_model_is_built(tiny_overrides, tmp_path, capsys,
                                                                                  field):
    # a file where the directory goes once ended the run with FileExistsError / NotADirectoryError tracebacks
    from trainperf.cli import main

    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    for path, needle in ((blocker, "is a file, not a directory"), (blocker / "sub", "cannot be created")):
        sets = sum((["--set", o] for o in tiny_overrides + ["run.steps=1", f"{field}={path}"]), [])
        assert main(["train", str(ROOT / "configs/gpt-tiny.yaml"), *sets]) == 2
        err = capsys.readouterr().err
        assert f"{field}='{path}'" in err and needle in err and "Traceback" not in err, err


def test_a_model_that_cannot_be_built_releases_the_loaders_already_started(tiny_overrides, monkeypatch):
    # the loaders (worker processes, shared memory) were left running: "leaked shared_memory objects" at exit
    import trainperf.data.loader as loader_mod
    import trainperf.models.build as model_build
    from trainperf.config import load_config
    from trainperf.train.resolve import resolve
    from trainperf.errors import ConfigError
    from trainperf.train.build import build_trainer

    closed, closable = [], []
    real_build_data = loader_mod.build_data

    def spying_build_data(*a, **k):
        data = real_build_data(*a, **k)
        for loader in (data.train, data.val):
            if hasattr(loader, "close"):
                closable.append(loader)
                real_close = loader.close
                loader.close = lambda real_close=real_close: (closed.append(1), real_close())
        return data

    def no_model(*a, **k):
        raise ConfigError("model.entrypoint='os:getcwd' returned str, not an nn.Module")

    monkeypatch.setattr(loader_mod, "build_data", spying_build_data)
    monkeypatch.setattr(model_build, "build_model", no_model)
    cfg = load_config(str(ROOT / "configs/gpt-tiny.yaml"), tiny_overrides + ["data.loader=hybrid"])
    with pytest.raises(ConfigError, match="not an nn.Module"):
        build_trainer(resolve(cfg), verbose=False)
    assert closable and len(closed) == len(closable)  # every loader that holds workers or memory was closed
