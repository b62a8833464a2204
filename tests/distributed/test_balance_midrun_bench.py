"""``trainperf bench balance --mid-run`` end to end, kept small: two short real training runs (2 gloo ranks, one CPU
each, a one-layer GPT) with the busy process started by rank 1 at the step asked, then the balanced run's
diagnosis. What is asserted is the wiring (the busy process starts at the step asked, both runs are measured over
their last steps, the balancer's records reach metrics.jsonl and `diagnose`), never a speed-up: a short run on a
busy machine decides nothing about the balancer (docs/benchmarks/balance.md has the measured rounds)."""

from __future__ import annotations

import json
import os

import pytest

from trainperf.cli import main

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

TINY = """\
model: {n_layer: 1, n_head: 2, n_embd: 32, block_size: 32, vocab_size: 64, dropout: 0.0}
data: {source: synthetic}
optimizer: {type: adamw, lr: 1.0e-3}
"""


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="the bench pins each of 2 ranks to its own CPU")
def test_mid_run_bench_measures_both_runs_and_logs_the_balancer(tmp_path, capsys):
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(TINY)
    keep = tmp_path / "runs"
    rc = main(["bench", "balance", "--mid-run", "--config", str(cfg), "--run-steps", "24", "--hog-step", "6",
               "--last", "8", "--global-batch", "8", "--keep", str(keep), "--json"])
    assert rc == 0
    res = json.loads(capsys.readouterr().out)
    (r,) = res["rounds"]
    assert r["order"] == ["balanced", "unbalanced"]
    for arm in ("balanced", "unbalanced"):
        a = r[arm]
        assert a["steps"] == 24 and a["last_median_s"] > 0
        assert a["hog_started_at_step"] == 6  # the rank starts it before its step 7, however loaded the machine
    assert r["ratio"] == pytest.approx(r["balanced"]["last_median_s"] / r["unbalanced"]["last_median_s"])
    aa = r["balanced"]["before_hog_median_s"] / r["unbalanced"]["before_hog_median_s"]
    assert r["before_hog_ratio"] == pytest.approx(aa) and res["before_hog"]["min"] == pytest.approx(aa)
    assert r["balanced"]["final_shares"] is not None and sum(r["balanced"]["final_shares"]) == 8
    assert r["unbalanced"]["final_shares"] is None  # no balancer there
    # the balanced run's directory is a run like any other: the diagnosis reads it
    assert main(["diagnose", str(keep / "round1-balanced"), "--json"]) == 0
    diag = json.loads(capsys.readouterr().out)
    ids = {f["id"] for f in diag["findings"]}
    assert ("balancer" in ids) == bool(r["balanced"]["balance_log"])


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="the bench pins each of 2 ranks to its own CPU")
def test_mid_run_bench_on_the_benchs_own_model(capsys):
    rc = main(["bench", "balance", "--mid-run", "--model", "mlp", "--seq", "16", "--dim", "32", "--run-steps", "30",
               "--hog-step", "8", "--last", "10", "--global-batch", "16", "--json"])
    assert rc == 0
    (r,) = json.loads(capsys.readouterr().out)["rounds"]
    assert r["balanced"]["steps"] == r["unbalanced"]["steps"] == 30
    assert r["balanced"]["hog_started_at_step"] == r["unbalanced"]["hog_started_at_step"] == 8
    assert sum(r["balanced"]["final_shares"]) == 16
