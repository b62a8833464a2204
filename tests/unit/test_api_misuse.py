"""The your-own-loop API (``trainperf.track``) and the framework callbacks as users misuse them (fuzzing):
another run's files in the directory are kept, two trackers never share one, a step with no tokens keeps its
timing, nesting and use after close are refused by name, a run that raised says so, bad values are refused,
and a Hugging Face train() that raised leaves no hook behind for the next one."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import trainperf
from trainperf.cli import main
from trainperf.errors import UserError


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(64, 16)
        self.out = torch.nn.Linear(16, 64)

    def forward(self, x):
        return self.out(self.emb(x))


def _train(tp, steps: int = 6, *, batch=True, model=None):
    model = model or Tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        x = torch.randint(0, 64, (4, 8))
        with tp.step(x if batch else None):
            with tp.phase("forward"):
                loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), x.flatten())
            with tp.phase("backward"):
                loss.backward()
            with tp.phase("optimizer"):
                opt.step()
                opt.zero_grad()
            tp.loss(loss)
    return tp.close()


def _diagnose(d, capsys) -> tuple[str, dict]:
    assert main(["diagnose", str(d)]) == 0
    text = capsys.readouterr().out
    assert main(["diagnose", str(d), "--json"]) == 0
    return text, json.loads(capsys.readouterr().out)


def test_another_runs_files_are_kept_beside_not_deleted(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    (d / "metrics.jsonl").write_text('{"epoch": 1, "acc": 0.9}\n{"epoch": 2, "acc": 0.93}\n')
    (d / "summary.json").write_text('{"best_acc": 0.93}')
    with pytest.warns(UserWarning, match="held another run's records: summary.json -> summary.previous.json"):
        tp = trainperf.track(d, model=Tiny())
    _train(tp)
    assert json.loads((d / "summary.previous.json").read_text()) == {"best_acc": 0.93}
    assert (d / "metrics.previous.jsonl").read_text().count("acc") == 2
    assert json.loads((d / "summary.json").read_text())["steps"] == 6
    with pytest.warns(UserWarning, match=r"metrics.jsonl -> metrics.previous2.jsonl"):  # a third run: nothing lost
        _train(trainperf.track(d, model=Tiny()))
    assert (d / "metrics.previous.jsonl").read_text().count("acc") == 2


def test_a_reused_directory_whose_new_run_crashes_reads_as_unfinished(tmp_path, capsys):
    d = tmp_path / "run"
    _train(trainperf.track(d, model=Tiny()))
    tp = trainperf.track(d, model=Tiny())  # the next run: dies after 4 steps, never closed
    for _ in range(4):
        with tp.step(tokens=32):
            pass
    tp.rec.abandon()  # what a crash leaves: its records on disk, no summary.json
    text, out = _diagnose(d, capsys)
    assert "no summary.json: the run did not finish" in text and out["crashed"]
    assert "MFU" not in text.split("time by phase")[0]  # the first run's summary is not read as this run's


def test_two_trackers_never_share_a_directory(tmp_path):
    d = tmp_path / "run"
    a = trainperf.track(d)
    with pytest.raises(UserError, match="already being written by another tracker in this process"):
        trainperf.track(d)
    a.close()
    trainperf.track(d).close()  # free again once closed


def test_a_lock_of_a_live_process_refuses_and_a_dead_ones_does_not(tmp_path):
    import os
    import subprocess
    import sys

    d = tmp_path / "run"
    d.mkdir()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        (d / ".trainperf.lock").write_text(str(live.pid))
        with pytest.raises(UserError, match=f"is being written by process {live.pid}"):
            trainperf.track(d)
    finally:
        live.kill()
        live.wait()
    trainperf.track(d).close()  # that process is gone: its lock is stale
    assert not (d / ".trainperf.lock").exists() and os.getpid()


def test_steps_without_tokens_keep_their_timing_and_say_why_no_throughput(tmp_path, capsys):
    d = tmp_path / "run"
    summary = _train(trainperf.track(d, model=Tiny()), batch=False)
    assert summary["tokens_per_s"] is None and "no tokens counted" in summary["notes"]["tokens"]
    text, out = _diagnose(d, capsys)
    assert "time by phase:" in text and "malformed" not in text and "corrupt" not in text
    assert "note: tokens: no tokens counted" in text
    assert out["summary"]["steps_used"] >= 4


def test_nesting_and_use_after_close_are_refused_by_name(tmp_path):
    tp = trainperf.track(tmp_path / "run")
    with tp.step(tokens=8):
        with pytest.raises(UserError, match=r"tp.step\(\) inside another tp.step\(\)"):
            with tp.step(tokens=8):
                pass
    tp.close()
    with pytest.raises(UserError, match=r"tp.step\(\) after tp.close\(\)"):
        with tp.step(tokens=8):
            pass
    with pytest.raises(UserError, match=r"tp.loss\(\) after tp.close\(\)"):
        tp.loss(1.0)


def test_a_phase_inside_another_hands_the_time_back_to_it(tmp_path):
    import time

    tp = trainperf.track(tmp_path / "run")
    for _ in range(3):
        with tp.step(tokens=8):
            with tp.phase("forward"):
                with tp.phase("data"):
                    time.sleep(0.005)
                time.sleep(0.03)  # still forward, not "other"
    s = tp.close()
    ph = s["phase_seconds"]
    assert ph["forward"] > 0.06 and ph.get("other", 0.0) < 0.03, ph


def test_a_run_that_raised_says_so_in_summary_and_diagnose(tmp_path, capsys):
    d = tmp_path / "run"
    with pytest.raises(OSError):
        with trainperf.track(d, model=Tiny()) as tp:
            for i in range(10):
                if i == 5:
                    raise OSError("storage went away")
                with tp.step(tokens=32):
                    pass
    notes = json.loads((d / "summary.json").read_text())["notes"]
    assert notes["raised"].startswith("OSError: storage went away (after step 5)")
    text, _ = _diagnose(d, capsys)
    assert "note: raised: OSError: storage went away" in text


def test_a_step_that_raised_is_left_out_and_named(tmp_path):
    tp = trainperf.track(tmp_path / "run")
    with tp.step(tokens=8):
        pass
    with pytest.raises(KeyError):
        with tp.step(tokens=8):
            raise KeyError("x")
    s = tp.close()
    assert s["steps"] == 1 and "KeyError" in s["notes"]["raised"] and "in step 2" in s["notes"]["raised"]


@pytest.mark.parametrize("tokens", [-512, float("nan"), 2.5, "256", True])
def test_tokens_must_be_a_whole_number(tmp_path, tokens):
    tp = trainperf.track(tmp_path / "run")
    with pytest.raises(UserError, match=r"give the tokens this step processes, a whole number >= 0"):
        with tp.step(tokens=tokens):
            pass
    tp.close()


@pytest.mark.parametrize("loss", ["abc", True, [1.0]])
def test_a_loss_must_be_a_number_or_a_tensor(tmp_path, loss):
    tp = trainperf.track(tmp_path / "run")
    with pytest.raises(UserError, match="give the step's loss as a number or a tensor"):
        tp.loss(loss)
    tp.close()


@pytest.mark.parametrize("fpt,says", [(lambda s: 1 / 0, "raised ZeroDivisionError"),
                                      (lambda s: -5, "not a positive number"),
                                      (lambda s: float("inf"), "not a positive number"),
                                      (lambda s: "abc", "raised ValueError")])
def test_a_failing_flops_formula_costs_the_mfu_not_the_summary(tmp_path, fpt, says):
    m = Tiny()
    m.flops_per_token = fpt
    s = _train(trainperf.track(tmp_path / "run", model=m))
    assert s["flops_per_token_formula"] is None and says in s["flops_formula_note"]
    assert s["mfu"] is None or 0 < s["mfu"] < 1
    assert (tmp_path / "run" / "summary.json").is_file()


@pytest.mark.parametrize("kw,says", [
    ({"run_dir": ""}, "give the directory the run writes"),
    ({"run_dir": None}, "give the directory the run writes"),
    ({"precision": "fp8x"}, "precision='fp8x' is not one of"),
    ({"device": "gpu0"}, "device='gpu0' is not a torch device"),
    ({"device": "meta"}, "device='meta' holds no data"),
    ({"log_every": "ten"}, "log_every='ten'"),
    ({"monitor": ["jsonl"]}, "give a dict of monitor settings"),
    ({"monitor": {"bogus": 1}}, "bogus"),
    ({"model": print}, "is not a torch.nn.Module"),
])
def test_constructor_misuse_is_named(tmp_path, kw, says):
    kw = {"run_dir": tmp_path / "run", **kw}
    with pytest.raises(UserError, match=None) as exc:
        trainperf.track(**kw)
    assert says in str(exc.value)
    assert "Traceback" not in str(exc.value)


def test_a_run_dir_that_is_a_file_is_named(tmp_path):
    f = tmp_path / "afile"
    f.write_text("x")
    with pytest.raises(UserError, match="is a file, not a directory"):
        trainperf.track(f)


def test_hf_callback_after_a_train_that_raised_drops_its_hooks_and_frees_the_directory(tmp_path):
    hf = pytest.importorskip("trainperf.integrations.hf")
    cb = hf.TrainperfCallback(run_dir=tmp_path / "run")
    args = SimpleNamespace(bf16=False, fp16=False, device="cpu", world_size=1, process_index=0,
                           gradient_accumulation_steps=1, per_device_train_batch_size=4)
    model = Tiny()
    cb.on_train_begin(args, None, None, model=model)
    first = cb.rec
    # train() raised: on_train_end never came. The next train() with the same callback:
    cb.on_train_begin(args, None, None, model=model)
    assert first.closed and cb.rec is not first
    assert len(model._forward_pre_hooks) == 1 and len(model._forward_hooks) == 1  # not two of each
    cb.on_train_end(args, None, None)
    assert not model._forward_pre_hooks and (tmp_path / "run" / "summary.json").is_file()
    assert Path(cb.run_dir) == tmp_path / "run"


def test_a_run_set_aside_beside_this_one_is_never_read_as_it(tmp_path, capsys):
    """metrics.previous.jsonl sorted after metrics.jsonl and was read in its place: diagnose showed the old run."""
    d = tmp_path / "run"
    _train(trainperf.track(d, model=Tiny()), steps=12)
    with pytest.warns(UserWarning):
        _train(trainperf.track(d, model=Tiny()), steps=5)
    _, out = _diagnose(d, capsys)
    assert out["summary"]["steps_recorded"] == 5


def test_starting_over_sets_every_ranks_files_and_the_config_aside(tmp_path):
    from trainperf.train.run import _set_aside_previous_run

    d = tmp_path / "run"
    d.mkdir()
    names = ["summary.json", "metrics.jsonl", "samples.jsonl", "config.yaml", "metrics.rank1.jsonl",
             "samples.rank1.jsonl", "metrics.rank3.jsonl"]
    for n in names:
        (d / n).write_text(n)
    said = []
    _set_aside_previous_run(d, said.append)
    left = sorted(p.name for p in d.iterdir())
    assert left == sorted(["summary.previous.json", "metrics.previous.jsonl", "samples.previous.jsonl",
                           "config.previous.yaml", "metrics.previous.rank1.jsonl", "samples.previous.rank1.jsonl",
                           "metrics.previous.rank3.jsonl"])
    assert (d / "metrics.previous.rank3.jsonl").read_text() == "metrics.rank3.jsonl" and said
