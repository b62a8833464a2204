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
