"""The CPU peak MFU divides by holds for the run it divides (issue 40 item 7): `make demo` printed "the MFU
of 224 step records (outside [0, 1]) left out" beside an MFU of 87.4%, its steps faster than the 1024^3
matmuls the peak was measured on. The peak is now measured on the model's own matmul shapes, at the start
and end of the run (the best kept), and the step records' MFU is read against that one peak."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import ROOT, run_cli
from tests.unit.test_compare import config, strict_loads, write_run
from trainperf.cli import main
from trainperf.diagnosis.rundir import load_run


def _records(d: Path) -> list[dict]:
    return [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]


def _edit(d: Path, *, step_mfu: float, **summary) -> None:
    recs = _records(d)
    for r in recs:
        r["mfu"] = step_mfu
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    s = json.loads((d / "summary.json").read_text())
    s.update(summary)
    (d / "summary.json").write_text(json.dumps(s))


def test_step_mfu_is_read_against_the_best_of_the_start_and_end_peak(tmp_path, capsys):
    """Step records divide by the peak measured at the start; summary.json's peak is the best of start and
    end: the records are read against that one (1.2 x 100 / 150 = 0.8), so none is left out."""
    d = write_run(tmp_path / "r", step_s=0.1, config=config(False, d="r"))
    _edit(d, step_mfu=1.2, mfu=0.72, hfu=0.8, peak_flops=150e9, peak_flops_start=100e9,
          peak_source="measured: best of 90 fp32 matmuls ...; measured at the start and end of the run")
    assert [r["mfu"] for r in load_run(d)["ranks"][0]] == pytest.approx([0.8] * 20)
    assert main(["diagnose", str(d), "--json"]) == 0
    out = strict_loads(capsys.readouterr().out)
    assert out["summary"]["mfu"] == pytest.approx(0.8)
    assert not any("outside [0, 1]" in n for n in out["data_notes"]), out["data_notes"]
    # no peak_flops_start (a catalog peak, or a run from before): the records are read as written
    _edit(d, step_mfu=0.5, peak_flops_start=None)
    assert {r["mfu"] for r in load_run(d)["ranks"][0]} == {0.5}


def test_a_step_mfu_above_a_measured_peak_says_what_that_peak_is(tmp_path, capsys):
    d = write_run(tmp_path / "r", step_s=0.1, config=config(False, d="r"))
    _edit(d, step_mfu=1.1, mfu=0.72, peak_flops=100e9, peak_source="measured: best of 90 fp32 matmuls ...")
    assert main(["diagnose", str(d), "--json"]) == 0
    (note,) = [n for n in strict_loads(capsys.readouterr().out)["data_notes"] if "step records" in n]
    assert "(outside [0, 1]) left out of the MFU/HFU figures (above 100% of a measured peak" in note
    assert "not a hardware limit" in note
    _edit(d, step_mfu=1.1, peak_source="catalog h100-sxm dense bf16 peak 989 TFLOP/s")  # a catalog peak: no such words
    assert main(["diagnose", str(d), "--json"]) == 0
    (note,) = [n for n in strict_loads(capsys.readouterr().out)["data_notes"] if "step records" in n]
    assert note.endswith("left out of the MFU/HFU figures") and "measured peak" not in note


@pytest.mark.slow
def test_a_demo_sized_run_records_no_mfu_above_one(corpus, tmp_path):
    """gpt-tiny as `make demo` trains it (2 threads, micro-batch 16 x 128), 20 steps, on a machine with no
    cached peak: no step record, and no figure diagnose prints, is above 100% of the peak."""
    run = tmp_path / "run"
    r = run_cli(["train", str(ROOT / "configs" / "gpt-tiny.yaml"), "--resume", "never",
                 "--set", f"run.dir={run}", "--set", f"data.path={corpus}", "--set", "data.prepare_from=null",
                 "--set", "run.steps=20", "--set", "run.log_every=10", "--set", "run.eval_every=0",
                 "--set", "run.sample_tokens=0", "--set", "checkpoint.every=0", "--set", "checkpoint.at_end=false",
                 "--set", "run.threads=2", "--set", "run.progress=false"],
                env={"TRAINPERF_CACHE": str(tmp_path / "cache")}, timeout=600)  # a step is 0.1 s, 5 s at load 9
    assert r.returncode == 0, r.stderr[-3000:]
    s = json.loads((run / "summary.json").read_text())
    assert "the model's 8 matmul shapes" in s["peak_source"] and "start and end of the run" in s["peak_source"]
    assert s["peak_flops"] >= s["peak_flops_start"] > 0 and 0 < s["mfu"] <= 1, s
    mfus = [x["mfu"] for x in load_run(run)["ranks"][0]]
    assert len(mfus) == 20 and max(mfus) <= 1, sorted(mfus)[-5:]
    assert "outside [0, 1]" not in r.stdout and "MFU" in r.stdout, r.stdout[-2000:]
