"""``trainperf bench traces EXPORT``: the nsys reader and the plain sqlite3 scans, each a whole process; what it
reports is what it measured (no speed is asserted: the machine is shared), and memory stays bounded as the export
grows (the 1 GB figure is in docs/benchmarks/traces.md)."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from trainperf.bench.traces import NSYS_TP, bench_nsys, run_child
from trainperf.tracegen.nsys import make_large

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    d = tmp_path_factory.mktemp("big")
    return {mb: make_large(d / f"x{mb}.sqlite", mb * 1_000_000) for mb in (8, 32)}


def test_bench_reports_the_readers_on_the_file(exports):
    got = exports[8]
    res = bench_nsys(got["path"])
    json.dumps(res, allow_nan=False)
    (kernels,) = sqlite3.connect(got["path"]).execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()
    assert res["kernel_rows"] == kernels == got["steps"] * got["kernels_per_step"]
    assert res["ranks"] == got["ranks"] == 2 and res["bytes"] == Path(got["path"]).stat().st_size
    assert res["events"] > kernels  # every kernel, copy, call and NVTX range of both ranks
    for k in ("trainperf", "sqlite3_rows", "sqlite3_sum"):
        assert res[k]["wall_s"] > 0 and res[k]["peak_rss_mb"] > 0 and len(res[k]["wall_s_runs"]) == 1
    assert res["x_scan_wall"] == pytest.approx(res["trainperf"]["wall_s"] / res["sqlite3_rows"]["wall_s"])


def test_bench_cli_json(exports):
    out = subprocess.run([sys.executable, "-m", "trainperf", "bench", "traces", exports[8]["path"], "--json"],
                         capture_output=True, text=True, cwd=ROOT, timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-1500:]
    res = json.loads(out.stdout)
    assert res["kind"] == "nsys" and res["kernel_rows"] > 0


def test_memory_grows_with_the_rank_not_with_python_objects(exports):
    """Peak RSS of the whole analysis, at two sizes: what the larger export adds is less than 0.7 of what its
    file adds (a reader keeping rows as Python objects adds several times the file), and the absolute peak stays
    within 60 MB + 0.7 x the file over the interpreter with its imports."""
    base = run_child([sys.executable, "-c", "import trainperf.trace.nsys.capture, trainperf.trace.analyze"],
                     env={**os.environ, "PYTHONPATH": str(ROOT)})["peak_rss_mb"]
    peak = {}
    for mb, got in exports.items():
        r = run_child([sys.executable, "-c", NSYS_TP, got["path"]], env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert r["rc"] == 0, r["stderr"]
        peak[mb] = r["peak_rss_mb"]
        assert peak[mb] - base < 60 + 0.7 * got["bytes"] / 1e6, (peak, base)
    grown = (exports[32]["bytes"] - exports[8]["bytes"]) / 1e6
    assert peak[32] - peak[8] < 0.7 * grown, (peak, grown)
