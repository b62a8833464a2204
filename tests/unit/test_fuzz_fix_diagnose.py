"""Fuzzing-pass fixes: ``diagnose`` / ``report`` on corrupt or diverged run directories (impossible MFU/HFU,
negative step times, a NaN loss, all-NaN records), and ``tune`` replacing an existing CONFIG.tuned.yaml.
Run directories are written by hand (tests.unit.test_compare.write_run); nothing trains."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.unit.test_compare import config, strict_loads, write_run
from tests.unit.test_tune import BASE, CPU, Fake, _speed
from trainperf.cli import main
from trainperf.config import load_config
from trainperf.tune.result import render
from trainperf.tune.search import Options, tune


def _rewrite_metrics(d: Path, change) -> None:
    p = d / "metrics.jsonl"
    recs = [json.loads(x) for x in p.read_text().splitlines()]
    for i, r in enumerate(recs):
        change(i, r)
    p.write_text("".join(json.dumps(r) + "\n" for r in recs))  # json.dumps writes NaN as NaN


def _summary(d: Path, **kw) -> None:
    s = json.loads((d / "summary.json").read_text())
    s.update(kw)
    (d / "summary.json").write_text(json.dumps(s))


def _run(tmp_path, name="r", **kw) -> Path:
    """20 steps of 0.1 s, 10,240 tokens/s, MFU 0.8 a step; summary MFU 0.72, HFU 0.8."""
    d = write_run(tmp_path / name, step_s=0.1, config=config(False, d=name), **kw)
    _rewrite_metrics(d, lambda i, r: r.update(mfu=0.8))
    _summary(d, mfu=0.72, hfu=0.8)
    return d


def _diagnose_json(d: Path, capsys) -> dict:
    assert main(["diagnose", str(d), "--json"]) == 0
    return strict_loads(capsys.readouterr().out)


def _percents(text: str) -> list[float]:
    return [float(x) for x in re.findall(r"[MH]FU (-?[\d.]+)%", text)]


# ---------------------------------------------------------------------------- 8: impossible figures
def test_step_mfu_above_one_is_left_out_of_diagnose_with_a_note(tmp_path, capsys):
    """runs/m_mfu: every record's mfu 5.0 printed 'MFU 500.0%, HFU 507.8%'."""
    d = _run(tmp_path)
    _rewrite_metrics(d, lambda i, r: r.update(mfu=5.0))
    out = _diagnose_json(d, capsys)
    s = out["summary"]
    assert s["mfu"] == 0.72 and 0 <= s["hfu"] <= 1  # summary.json's whole-run figure, as compare shows
    assert any("the MFU of 20 step records (outside [0, 1]) left out of the MFU/HFU figures" in n
               for n in out["data_notes"])
    assert main(["diagnose", str(d)]) == 0
    text = capsys.readouterr().out
    assert f"note: {d / 'metrics.jsonl'}: the MFU of 20 step records" in text
    assert _percents(text) and all(0 <= v <= 100 for v in _percents(text)), text


def test_impossible_summary_figures_are_ignored_and_no_hfu_is_negative(tmp_path, capsys):
    """runs/s_mfu: summary mfu=7.5, hfu=-1, tokens_per_s=-100 gave 'HFU -0.6%'."""
    d = _run(tmp_path)
    _summary(d, mfu=7.5, hfu=-1, tokens_per_s=-100, peak_flops=0)
    out = _diagnose_json(d, capsys)
    s = out["summary"]
    assert s["mfu"] == 0.8 and s["hfu"] is None and s["mfu_run"] is None and s["hfu_run"] is None
    note = next(n for n in out["data_notes"] if "summary.json: ignored" in n)
    assert str(d / "summary.json") in note and "mfu=7.5" in note and "hfu=-1" in note and "tokens_per_s=-100" in note
    assert main(["diagnose", str(d)]) == 0
    text = capsys.readouterr().out
    assert "HFU -" not in text and all(0 <= v <= 100 for v in _percents(text)), text


def test_negative_step_times_are_left_out_as_compare_does(tmp_path, capsys):
    d = _run(tmp_path)

    def corrupt(i, r):
        if i in (10, 11):
            r["step_time_s"], r["tokens_per_s"] = -r["step_time_s"], -r["tokens_per_s"]

    _rewrite_metrics(d, corrupt)
    out = _diagnose_json(d, capsys)
    assert out["summary"]["step_time_s"] == 0.1 and out["summary"]["tokens_per_s"] > 0
    assert out["summary"]["steps_recorded"] == 18
    assert any(f"2 of 20 step records in {d / 'metrics.jsonl'} left out of the figures as malformed" in n
               for n in out["data_notes"])


def test_every_step_time_negated_says_malformed_not_killed(tmp_path, capsys):
    """runs/m_negt: diagnose reported as usual while compare rejected the file."""
    d = _run(tmp_path)
    _rewrite_metrics(d, lambda i, r: r.update(step_time_s=-r["step_time_s"], tokens_per_s=-r["tokens_per_s"]))
    assert main(["diagnose", str(d)]) == 0
    text = capsys.readouterr().out
    assert f"{d / 'metrics.jsonl'} holds 20 step records, but every one is malformed" in text
    assert "killed" not in text and "time by phase" not in text


def test_report_leaves_out_the_same_figures_with_the_note(tmp_path, capsys):
    d = _run(tmp_path)
    _rewrite_metrics(d, lambda i, r: r.update(mfu=5.0))
    _summary(d, hfu=-1)
    assert main(["report", str(d), "--json"]) == 0
    got = strict_loads(capsys.readouterr().out)
    assert any("the MFU of 20 step records" in n for n in got["data_notes"])
    page = (d / "report.html").read_text()
    assert "left out of the MFU/HFU figures" in page and "summary.json: ignored hfu=-1" in page
    assert "500.00%" not in page and "-" + "100.00%" not in page
    assert not re.search(r"[MH]FU \(steady steps \| whole run\)</t[dh]><td[^>]*>[^<]*-\d", page)


# ---------------------------------------------------------------------------- 9: NaN loss, divergence
def test_a_nan_loss_is_a_critical_finding_naming_the_step_and_the_fixes(tmp_path, capsys):
    d = _run(tmp_path)
    _rewrite_metrics(d, lambda i, r: r.update(loss=float("nan")) if r["step"] >= 14 else None)
    _summary(d, final_loss=float("nan"))
    out = _diagnose_json(d, capsys)
    f = out["findings"][0]
    assert f["id"] == "loss_diverged" and f["severity"] == "critical" and f["step"] == 14
    assert "at step 14" in f["evidence"] and "7 of the 20 step records" in f["evidence"]
    assert "last finite loss was 3.7 at step 13" in f["evidence"]
    assert "optimizer.lr" in f["fix"] and f["cause"] and "gain" in f
    assert main(["diagnose", str(d)]) == 0
    text = capsys.readouterr().out
    assert "[critical] loss_diverged" in text and "no findings" not in text


def test_a_run_train_stopped_as_diverged_names_the_step_and_uses_its_config(tmp_path, capsys):
    """runs/lrbig: train stops at the null loss of step 2 (no summary.json) and sends the user to diagnose,
    which said 'no findings'."""
    cfg = {"run": {"dir": "r", "steps": 6}, "optimizer": {"lr": 1e10}, "schedule": {"warmup_steps": 0},
           "train": {"grad_clip": 0.0}, "precision": {"dtype": "fp16"}}
    d = write_run(tmp_path / "r", step_s=0.1, n=2, config=cfg)
    (d / "summary.json").unlink()
    p = d / "metrics.jsonl"
    recs = [json.loads(x) for x in p.read_text().splitlines()]
    recs[1].update(loss=None, grad_norm=None)  # what strict JSON writes for the trainer's NaN
    p.write_text("".join(json.dumps(r) + "\n" for r in recs))
    out = _diagnose_json(d, capsys)
    f = next(f for f in out["findings"] if f["id"] == "loss_diverged")
    assert f["step"] == 2 and "no summary.json" in f["evidence"]
    for fix in ("optimizer.lr (now 1e+10; e.g. 0.0003)", "schedule.warmup_steps", "train.grad_clip=1.0",
                "precision.dtype=bf16"):
        assert fix in f["fix"], f["fix"]
    assert main(["report", str(d)]) == 0
    capsys.readouterr()
    assert "loss_diverged" in (d / "report.html").read_text()


def test_finite_losses_give_no_divergence_finding(tmp_path, capsys):
    d = _run(tmp_path)
    assert "loss_diverged" not in [f["id"] for f in _diagnose_json(d, capsys)["findings"]]


def test_all_nan_records_say_they_exist_but_hold_nan(tmp_path, capsys):
    """runs/m_nan: 'the run ended (was killed?) before its first record was written' although 20 exist."""
    d = _run(tmp_path)
    _rewrite_metrics(d, lambda i, r: r.update(step_time_s=float("nan"), tokens_per_s=float("nan"),
                                              mfu=float("nan"), loss=float("nan")))
    for argv in (["diagnose", str(d)], ["report", str(d)]):
        assert main(argv) == 0
        text = capsys.readouterr().out
        assert f"{d / 'metrics.jsonl'} holds 20 step records, but every one is malformed" in text, text
        assert "NaN" in text and "killed" not in text and "before its first record" not in text
    out = _diagnose_json(d, capsys)
    assert "every one is malformed" in out["known"]["malformed"]


def test_a_run_with_no_record_keeps_the_killed_message(tmp_path, capsys):
    d = _run(tmp_path)
    (d / "metrics.jsonl").write_text("")
    (d / "summary.json").unlink()  # killed: no summary
    assert main(["diagnose", str(d)]) == 0
    text = capsys.readouterr().out
    assert "before its first record was written" in text and "malformed" not in text


def test_a_finished_run_with_no_record_says_so_not_killed(tmp_path, capsys):
    """A loop closed before its first step read 'the run ended (was killed?)'; a finished run whose log was
    emptied says that instead."""
    d = _run(tmp_path)
    (d / "metrics.jsonl").write_text("")
    _summary(d, steps=20)
    assert main(["diagnose", str(d)]) == 0
    text = capsys.readouterr().out
    assert "metrics.jsonl holds no step record although summary.json counts 20 steps" in text
    assert "killed" not in text
    _summary(d, steps=0)
    assert main(["diagnose", str(d)]) == 0
    assert "the run finished (summary.json) without a step record" in capsys.readouterr().out


# ---------------------------------------------------------------------------- 13: tune
def _tune(tmp_path, cfg_path: Path):
    fake = Fake(_speed, sbs_ratio=1.1)
    cfg = load_config(str(cfg_path), BASE)
    return tune(cfg, config_path=str(cfg_path), out_dir=tmp_path / "t", options=Options(progress=False), facts=CPU,
                clock=fake.clock, trial_fn=fake.trial, sbs_fn=fake.sbs, doctor=None)


def test_tune_keeps_a_replaced_tuned_config_and_says_where(tmp_path):
    cfg_path = tmp_path / "my.yaml"
    cfg_path.write_text("train: {global_batch: 8, micro_batch: 4}\n")
    tuned = tmp_path / "my.tuned.yaml"
    tuned.write_text("# my hand-edited tuned config\n")
    res = _tune(tmp_path, cfg_path)
    backup = tmp_path / "my.tuned.yaml.bak"
    assert res.kept_previous == str(backup)
    assert backup.read_text() == "# my hand-edited tuned config\n"
    assert tuned.read_text() != backup.read_text()
    assert f"note: replaced the existing {tuned}; its previous content is kept in {backup}" in render(res)
    # a second tune with a different result never overwrites the first copy
    tuned.write_text("# edited again\n")
    res2 = _tune(tmp_path, cfg_path)
    assert res2.kept_previous == str(tmp_path / "my.tuned.yaml.bak2")
    assert backup.read_text() == "# my hand-edited tuned config\n"
    assert (tmp_path / "my.tuned.yaml.bak2").read_text() == "# edited again\n"


def test_tune_says_nothing_when_there_was_nothing_to_keep(tmp_path):
    cfg_path = tmp_path / "my.yaml"
    cfg_path.write_text("train: {global_batch: 8, micro_batch: 4}\n")
    res = _tune(tmp_path, cfg_path)
    assert res.kept_previous is None and "replaced" not in render(res)
    res2 = _tune(tmp_path, cfg_path)  # the same tuned config again: identical text, nothing lost
    assert res2.kept_previous is None and not list(tmp_path.glob("*.bak*"))


# ------------------------------------------------ garbage lines and records out of order (fuzzing)
def test_garbage_lines_are_counted_in_a_note_and_change_no_figure(tmp_path, capsys):
    """'this is garbage', a JSON list, a number and null in the middle of metrics.jsonl were skipped with no
    word; the figures must not move, and the note says how many lines were skipped."""
    d = _run(tmp_path)
    before = _diagnose_json(d, capsys)["summary"]
    p = d / "metrics.jsonl"
    lines = p.read_text().splitlines()
    lines[3:3] = ["this is garbage", "[1, 2, 3]", "42", "null"]
    p.write_text("\n".join(lines) + "\n")
    out = _diagnose_json(d, capsys)
    assert out["summary"] == before
    assert any(f"{p}: 4 line(s) that are not JSON records skipped" in n for n in out["data_notes"])


def test_a_cut_last_line_is_not_counted_as_garbage(tmp_path, capsys):
    d = _run(tmp_path)
    p = d / "metrics.jsonl"
    p.write_text(p.read_text() + '{"step": 21, "step_ti')  # kill -9 mid-write
    assert not any("not JSON records" in n for n in _diagnose_json(d, capsys)["data_notes"])


def test_records_out_of_step_order_are_read_in_order_with_a_note(tmp_path, capsys):
    """With the records reversed, diagnose's MFU moved from 4.7% to 2.5% with no remark: the figures after
    warm-up are taken by position. Read in step order, they are those of the intact file."""
    d = _run(tmp_path)
    _rewrite_metrics(d, lambda i, r: r.update(step_time_s=0.1 + 0.5 * (i < 3)))  # slow warm-up steps
    before = _diagnose_json(d, capsys)
    p = d / "metrics.jsonl"
    p.write_text("".join(reversed(p.read_text().splitlines(keepends=True))))
    after = _diagnose_json(d, capsys)
    assert after["summary"] == before["summary"]
    assert any("step records out of step order (19 place(s) where the step goes back), read in step order" in n
               for n in after["data_notes"])
    assert not before["data_notes"]
