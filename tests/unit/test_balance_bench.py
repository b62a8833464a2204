"""``trainperf bench balance`` arguments (the measurement itself runs in tests/distributed/test_balance_dist.py)."""

from __future__ import annotations

import pytest

from trainperf.cli import main


@pytest.mark.parametrize("argv,msg", [
    (["--slowdown", "0.5"], "--slowdown 0.5 must be >= 1"),
    (["--ranks", "1"], "at least 2 ranks"),
    (["--slow-rank", "2"], "--slow-rank 2 is not a rank of 0..1"),
    (["--global-batch", "3"], "--global-batch 3 must be >= ranks x micro-steps = 4"),
    (["--threshold", "0"], "threshold=0.0 must be > 0"),
    (["--window", "1"], "window=1 must be >= 2"),
])
def test_bench_balance_bad_arguments(argv, msg, capsys):
    assert main(["bench", "balance", *argv]) == 2
    assert msg in capsys.readouterr().err


def test_control_reruns_with_equal_speeds_and_no_balancing(monkeypatch, capsys):
    """--control measures the noise floor: a second run, every rank at speed 1x, no settling phase."""
    import json

    import trainperf.bench.balance as bb

    calls = []

    def fake_run(args):
        calls.append(dict(slowdown=args.slowdown, settle_steps=args.settle_steps))
        k = len(calls)
        return {"ideal_step_s": 0.1 * k, "balanced_step_s": 0.11 * k, "balanced_vs_ideal": 1.1,
                "unbalanced_vs_ideal": 1.05 + k, "balanced_slowest_compute_vs_ideal": 1.04, "overhead_s": 0.003,
                "shares": [32, 32]}

    monkeypatch.setattr(bb, "run_bench", fake_run)
    assert main(["bench", "balance", "--slowdown", "3", "--control", "--json"]) == 0
    assert calls == [{"slowdown": 3.0, "settle_steps": 300}, {"slowdown": 1.0, "settle_steps": 0}]
    ctl = json.loads(capsys.readouterr().out)["control"]
    assert ctl["ideal_step_s"] == 0.2 and ctl["step_s"] == 0.22 and ctl["unbalanced_vs_ideal"] == 3.05


def test_busy_straggler_needs_pinned_ranks(capsys):
    """--busy puts a busy process on the slow rank's CPU: without pinning there is no such CPU."""
    assert main(["bench", "balance", "--busy", "--no-pin"]) == 2
    assert "--busy needs the ranks pinned" in capsys.readouterr().err


@pytest.mark.parametrize("argv,msg", [
    (["--hog-step", "120"], "--hog-step 120 must be inside the run"),
    (["--last", "100"], "--last 100 must be > 0 and at most the steps after the hog starts (90)"),
    (["--global-batch", "1"], "--global-batch 1 must be >= --ranks 2"),
    (["--config", "/nonexistent.yaml"], "--config /nonexistent.yaml: no such file"),
    (["--config", "x.yaml", "--model", "mlp"], "give one of them"),
])
def test_mid_run_bad_arguments(argv, msg, capsys):
    assert main(["bench", "balance", "--mid-run", *argv]) == 2
    assert msg in capsys.readouterr().err
