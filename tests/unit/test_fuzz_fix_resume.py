"""Fuzzing report (train/resume) fixes: --resume never deletes nothing up front and leaves no stale summary;
checkpoints that are not trainperf's, do not fit the model, hold a bad step or pickled code are refused with a
message naming the file (exit 2, no traceback)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
import torch

from tests.conftest import ROOT
from tests.unit.test_train import train_in_process
from trainperf.train.checkpoint import CheckpointManager


def _finished_run(tiny_overrides, tmp_path) -> tuple[list[str], Path]:
    """A finished 6-step run with checkpoints at steps 3 and 6 (and its summary.json)."""
    run_dir = tmp_path / "run"
    ov = tiny_overrides + ["run.steps=6", "checkpoint.every=3"]
    train_in_process(ov)
    assert CheckpointManager(run_dir / "checkpoints").steps() == [3, 6]
    return ov, run_dir


def _cli(tiny_overrides, resume: str, *extra: str) -> int:
    from trainperf.cli import main

    sets = sum((["--set", o] for o in tiny_overrides + list(extra)), [])
    return main(["train", str(ROOT / "configs/gpt-tiny.yaml"), *sets, "--resume", resume])


# ------------------------------------------------------------------------ 2. --resume never
def test_resume_never_keeps_the_old_checkpoints_until_the_new_run_has_one(tiny_overrides, tmp_path, monkeypatch):
    from trainperf.train.loop import Trainer

    ov, run_dir = _finished_run(tiny_overrides, tmp_path)
    old = {p.name: p.read_bytes() for p in (run_dir / "checkpoints").iterdir()}
    old_summary = json.loads((run_dir / "summary.json").read_text())

    def boom(self):
        raise RuntimeError("the new run failed before its first checkpoint")

    with monkeypatch.context() as m:
        m.setattr(Trainer, "train_step", boom)
        with pytest.raises(RuntimeError, match="failed before its first checkpoint"):
            train_in_process(ov, resume="never")
    # nothing of the good run was deleted: its checkpoints are set aside intact, and usable
    aside = run_dir / "checkpoints.previous"
    assert {p.name: p.read_bytes() for p in aside.iterdir()} == old
    assert CheckpointManager(aside).load_latest()[0] == 6
    # and the failed run does not pass the old run's summary off as its own
    assert not (run_dir / "summary.json").exists()
    assert json.loads((run_dir / "summary.previous.json").read_text()) == old_summary
    assert (run_dir / "metrics.previous.jsonl").exists()

    # a second fresh start that succeeds: its own checkpoints, and only then is the old run's set aside dropped
    _, summary = train_in_process(ov + ["run.steps=4", "checkpoint.every=2"], resume="never")
    assert CheckpointManager(run_dir / "checkpoints").steps() == [2, 4]
    assert not aside.exists()
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 4 == summary["steps"]
    assert summary["resumed_from"] is None


# ------------------------------------------------------------------------ 3. tensors that don't fit the model
def test_a_checkpoint_whose_tensors_do_not_fit_the_model_is_a_user_error(tiny_overrides, tmp_path, capsys):
    ov, run_dir = _finished_run(tiny_overrides, tmp_path)
    state = CheckpointManager(run_dir / "checkpoints").load_latest()[1]
    want = list(state["model"]["tok_emb.weight"].shape)
    state["model"]["tok_emb.weight"] = torch.zeros(10, 10)
    bad = tmp_path / "shape" / "step-00000006.pt"
    bad.parent.mkdir()
    torch.save(state, bad)
    assert _cli(ov, str(bad), f"run.dir={tmp_path / 'other'}") == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and str(bad) in err, err
    assert "tok_emb.weight has shape [10, 10]" in err and f"needs {want}" in err
    assert "--resume never" in err


# ------------------------------------------------------------------------ 4. not a dict at the top level
@pytest.mark.parametrize("payload, needle", [([1, 2, 3], "its top level is a list"),
                                              ({"a": torch.zeros(3)}, "no 'model', 'optimizer', 'step', 'config'")])
def test_a_pt_file_that_is_not_a_trainperf_checkpoint_is_refused(tiny_overrides, tmp_path, capsys, payload, needle):
    bad = tmp_path / "thing.pt"
    torch.save(payload, bad)
    assert _cli(tiny_overrides, str(bad)) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and str(bad) in err and "not a trainperf checkpoint" in err, err
    assert needle in err


# ------------------------------------------------------------------------ 7. a negative or non-integer step
@pytest.mark.parametrize("step", [-5, 2.5, "6"])
def test_a_checkpoint_with_an_invalid_step_named_by_resume_is_refused(tiny_overrides, tmp_path, capsys, step):
    ov, run_dir = _finished_run(tiny_overrides, tmp_path)
    state = CheckpointManager(run_dir / "checkpoints").load_latest()[1]
    state["step"] = step
    bad = tmp_path / "neg" / "step-00000006.pt"  # no manifest: loaded as an outside file
    bad.parent.mkdir()
    torch.save(state, bad)
    assert _cli(ov, str(bad), f"run.dir={tmp_path / 'fresh'}") == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and str(bad) in err and "not a valid checkpoint step" in err, err
    assert not (tmp_path / "fresh" / "metrics.jsonl").exists()  # no training counted from a bad step


def test_a_run_checkpoint_with_a_negative_step_is_skipped_as_corrupt(tiny_overrides, tmp_path, capsys):
    """In auto mode it is treated like other corruption: warned about, and the previous good one is used."""
    ov, run_dir = _finished_run(tiny_overrides, tmp_path)
    ck = run_dir / "checkpoints"
    state = CheckpointManager(ck).verify_and_load(6)
    state["step"] = -5
    pt = ck / "step-00000006.pt"
    torch.save(state, pt)
    data = pt.read_bytes()  # the manifest matches the file: only the step inside is wrong
    (ck / "step-00000006.json").write_text(json.dumps({"step": 6, "file": pt.name, "bytes": len(data),
                                                       "sha256": hashlib.sha256(data).hexdigest()}))
    with pytest.warns(UserWarning, match="step 6 is corrupt.*not a valid checkpoint step"):
        _, summary = train_in_process(ov, resume="auto")
    assert summary["resumed_from"] == 3 and summary["steps"] == 6


# ------------------------------------------------------------------------ 16. pickled code
def test_a_pickle_payload_is_refused_without_advising_weights_only_false(tiny_overrides, tmp_path, capsys):
    marker = tmp_path / "PWNED"

    class Evil:
        def __reduce__(self):
            return os.system, (f"touch {marker}",)

    bad = tmp_path / "evil.pt"
    torch.save({"model": Evil(), "optimizer": {}, "step": 1, "config": {}}, bad)
    assert _cli(tiny_overrides, str(bad)) == 2
    err = capsys.readouterr().err
    assert not marker.exists()  # never executed
    assert "Traceback" not in err and str(bad) in err, err
    assert "weights_only=False" not in err and "set to `False`" not in err and "will likely succeed" not in err
    assert "untrusted source" in err and "not a trainperf checkpoint" in err and "system" in err


def test_a_garbage_file_is_refused_without_torchs_weights_only_advice(tiny_overrides, tmp_path, capsys):
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a checkpoint")
    assert _cli(tiny_overrides, str(bad)) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "cannot be loaded as a checkpoint" in err and "Traceback" not in err, err
    assert "will likely succeed" not in err and "set to `False`" not in err


def test_sharded_resume_never_sets_the_previous_checkpoints_aside_not_deletes_them(tmp_path, capsys):
    # the DCP checkpointer (several processes) used to rmtree the checkpoint directory at startup
    from trainperf.distributed.checkpoint import DcpCheckpointer

    d = tmp_path / "checkpoints"
    (d / "step-00000004").mkdir(parents=True)
    (d / "step-00000004" / "COMPLETE").write_text("")
    ck = DcpCheckpointer(d)
    ck._start_over()
    aside = tmp_path / "checkpoints.previous"
    assert (aside / "step-00000004" / "COMPLETE").exists() and not d.exists() and ck.set_aside == aside
    assert "moved to" in capsys.readouterr().out
    # a second start over after an attempt that wrote no complete checkpoint keeps the good run aside
    (d / "step-00000002").mkdir(parents=True)  # no COMPLETE marker: a leftover
    ck2 = DcpCheckpointer(d)
    ck2._start_over()
    assert (aside / "step-00000004" / "COMPLETE").exists() and ck2.set_aside == aside


def test_a_config_mismatch_names_the_key_that_differs_not_two_whole_sections():
    from trainperf.errors import CheckpointError
    from trainperf.train.checkpoint import check_resume_compatible

    saved = {"model": {"preset": "tiny", "n_layer": 2, "n_head": 4}}
    current = {"model": {"preset": "tiny", "n_layer": None, "n_head": 4}}
    with pytest.raises(CheckpointError, match=r"written with model\.n_layer=2 but this run has None"):
        check_resume_compatible(saved, current)


def test_the_cli_prints_its_own_warnings_without_python_source_lines():
    # "<the checkout>/trainperf/train/checkpoint.py:227: UserWarning: checkpoint of step 6 is corrupt ..." was
    # what a user saw; a library's warning keeps Python's format
    import trainperf.train.checkpoint as ck
    from trainperf.cli import _cli_warning_format

    fmt = _cli_warning_format()
    assert fmt("checkpoint of step 6 is corrupt", UserWarning, ck.__file__, 227) == \
        "trainperf: warning: checkpoint of step 6 is corrupt\n"
    assert "site-packages/x.py:3: UserWarning: other" in fmt("other", UserWarning, "/site-packages/x.py", 3)


def test_a_resume_that_changes_the_schedule_says_so():
    from trainperf.train.checkpoint import schedule_change_notes

    saved = {"run": {"steps": 200}, "optimizer": {"lr": 1e-3, "type": "adamw"}, "schedule": {"warmup_steps": 10}}
    same = schedule_change_notes(saved, saved)
    assert same == []
    changed = schedule_change_notes(saved, {"run": {"steps": 92}, "optimizer": {"lr": 3e-4, "type": "adamw"},
                                            "schedule": {"warmup_steps": 10}})
    assert [n.split(" was ")[0] for n in changed] == ["resume: run.steps", "resume: optimizer.lr"]
    assert "200" in changed[0] and "92" in changed[0] and "may jump" in changed[0]
