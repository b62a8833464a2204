"""benchmarks/gpu_suite.py --smoke: the GPU suite's code path on CPU, tiny shapes."""

from __future__ import annotations

import importlib.util
import json

import pytest

from tests.conftest import ROOT


def _suite():
    spec = importlib.util.spec_from_file_location("gpu_suite", ROOT / "benchmarks" / "gpu_suite.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow
def test_gpu_suite_smoke_runs_every_row(tmp_path, capsys):
    suite = _suite()
    out = tmp_path / "suite.json"
    assert suite.main(["--smoke", "--steps", "1", "--warmup", "1", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    rows = result["rows"]
    assert [r["row"] for r in rows] == [name for name, _ in suite.ROWS]
    for r in rows:
        assert "error" not in r and "skipped" not in r, r
        assert r["tokens_per_s"] > 0 and 0 < r["mfu"] < 1 and r["estimate_bytes"] > 0
    # cumulative: the last row carries every optimization
    last = rows[-1]["overrides"]
    for o in ("precision.dtype=bf16", "compile.enabled=true", "optimizer.impl=fused", "data.loader=hybrid",
              "memory.checkpointing.mode=full"):
        assert o in last
    assert rows[-1]["micro_batch"] >= rows[0]["micro_batch"] and "estimate" in rows[-1]["largest_batch"]
    assert result["peak_source"].startswith("measured")
    table = capsys.readouterr().out
    assert table.count("\n| ") == 2 + len(rows) - 1 and "MFU against measured" in table
