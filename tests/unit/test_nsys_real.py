"""The real 2-GPU H100 Nsight Systems export (tests/data/nsys, see its README): every figure the reader gives is
checked against SQL written directly on the file, and against what the kernel names and ranges say."""

from __future__ import annotations

import gzip
import shutil
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from trainperf.trace.nsys import analyze_capture, read_capture

DATA = Path(__file__).resolve().parents[1] / "data" / "nsys" / "h100_2gpu_1s.sqlite.gz"
PIDS = {0: 281476838981632, 1: 281476855758848}  # device -> globalPid, from the export's PROCESSES


@pytest.fixture(scope="module")
def export(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("nsys") / "h100_2gpu_1s.sqlite"
    with gzip.open(DATA, "rb") as src, open(out, "wb") as dst:
        shutil.copyfileobj(src, dst)
    return out


@pytest.fixture(scope="module")
def results(export):
    return {r["rank_hint"]["device"]: r for r in analyze_capture(export)}


@pytest.fixture(scope="module")
def sql(export):
    db = sqlite3.connect(export)
    yield lambda q, *a: db.execute(q, a).fetchall()
    db.close()


def test_one_rank_per_gpu_named_by_device_and_process(results):
    assert sorted(results) == [0, 1]
    for dev, r in results.items():
        assert r["source"] == "nsys"
        assert r["rank_hint"]["pid"] == (PIDS[dev] >> 24) & 0xFFFFFF
        assert r["rank_hint"]["process"] == "python3"
        assert f"GPU {dev}" in r["label"] and r["capture"]["schema_version"] == "3.25.0"


def test_kernel_busy_time_per_gpu_equals_sql(results, sql):
    # the union of each device's kernel intervals, by a running maximum in SQL
    busy = dict(sql("""
        WITH k AS (SELECT deviceId d, start s, "end" e,
                          max("end") OVER (PARTITION BY deviceId ORDER BY start, "end"
                                           ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev
                   FROM CUPTI_ACTIVITY_KIND_KERNEL)
        SELECT d, sum(CASE WHEN prev IS NULL OR s >= prev THEN e - s WHEN e > prev THEN e - prev ELSE 0 END)
        FROM k GROUP BY d"""))
    total = dict(sql('SELECT deviceId, sum("end" - start) FROM CUPTI_ACTIVITY_KIND_KERNEL GROUP BY deviceId'))
    for dev, r in results.items():
        # no NCCL kernel: HTA's compute time (every GPU event: the capture has no steps) is the kernels' union
        assert r["temporal_us"]["compute"] == pytest.approx(busy[dev] / 1000.0, rel=1e-9)
        assert r["gpus"][str(dev)]["kernel_us"] == pytest.approx(total[dev] / 1000.0, rel=1e-9)


def test_top_kernels_equal_sql(results, sql):
    for dev, r in results.items():
        want = sql("""SELECT s.value, count(*), sum(k."end" - k.start) FROM CUPTI_ACTIVITY_KIND_KERNEL k
                      JOIN StringIds s ON s.id = k.demangledName WHERE k.deviceId = ?
                      GROUP BY k.demangledName ORDER BY 3 DESC LIMIT 10""", dev)
        got = [(t["name"], t["count"], t["us"]) for t in r["top_kernels"]]
        assert [g[:2] for g in got] == [w[:2] for w in want]
        assert [g[2] for g in got] == pytest.approx([w[2] / 1000.0 for w in want], rel=1e-9)


def test_nccl_time_equals_sql(results, sql):
    for dev, r in results.items():
        (nccl_ns,) = sql("""SELECT coalesce(sum(k."end" - k.start), 0) FROM CUPTI_ACTIVITY_KIND_KERNEL k
                            JOIN StringIds s ON s.id = k.demangledName
                            WHERE k.deviceId = ? AND lower(s.value) LIKE '%nccl%'""", dev)[0]
        assert nccl_ns == 0  # this window holds no collective
        assert r["kernel_us"]["communication"] == nccl_ns / 1000.0
        assert r["comm"]["us_per_step"] == 0.0


def test_sync_time_equals_sql(export, results, sql):
    tls = {lab: tl for lab, tl in read_capture(export)}
    for dev, r in results.items():
        tl = next(t for lab, t in tls.items() if f"GPU {dev}" in lab)
        lo = PIDS[dev]
        rows = sql("""SELECT r.start, r."end" FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId
                      WHERE s.value LIKE 'cudaStreamSynchronize%' AND r.globalTid >= ? AND r.globalTid < ?""",
                   lo, lo + (1 << 24))
        name = tl.names.index("cudaStreamSynchronize")
        mine = tl.r_dur[tl.r_name == name]
        assert sorted(mine) == pytest.approx(sorted((e - s) / 1000.0 for s, e in rows), rel=1e-9)
        # inside the analysed window (the steps' span), the figure equals SQL over the same window
        w0 = min(s["start_us"] for s in r["per_step"]) - tl.base_us
        w1 = max(s["start_us"] + s["dur_us"] for s in r["per_step"]) - tl.base_us
        inside = [(e - s) / 1000.0 for s, e in rows if w0 <= s / 1000.0 < w1]
        row = next(x for x in r["host_syncs"] if x["name"] == "cudaStreamSynchronize")
        assert row["count"] == len(inside) and row["us"] == pytest.approx(sum(inside), rel=1e-9)


def test_what_an_expert_reads_in_it(export, results):
    for dev, r in results.items():
        # the GPUs copy most of the time: host-to-device from pinned memory, then device-to-device copies of
        # the same bytes (parameters brought in per layer)
        assert r["step_breakdown_pct"]["memcpy"] > 90
        by = r["memcpy"]["by_direction"]
        assert by["HtoD"]["pinned_us"] > 0.99 * by["HtoD"]["us"]
        assert by["DtoD"]["bytes"] == pytest.approx(by["HtoD"]["bytes"], rel=0.01)
        assert r["memcpy"]["pageable_us_per_step"] < 0.001 * r["memcpy"]["us_per_step"]
        # kernels run a few percent of the time, and the GEMMs are fp32 on CUDA cores (cuBLAS ffma kernels)
        assert r["gpu_utilization_pct"] < 5
        assert r["tensor_cores"]["kernel_pct"] == 0.0
        assert all("f32f32_f32f32" in n and "ffma" in n for n in r["tensor_cores"]["top_fp32"])
        assert r["tensor_cores"]["fp32_eligible_us_per_step"] > 0.8 * r["tensor_cores"]["gemm_us_per_step"]
        # no step range, no GPU table, no GPU metrics: each said, not guessed
        notes = " ".join(r["notes"])
        assert "--step NAME" in notes and "names no GPU" in notes and "--gpu-metrics-devices" in notes
        assert "host ran about 424 ms ahead" in notes
        assert r["gpu_metrics"]["source"] is None and r["sm_efficiency_pct"] is None
    # the host waits 0.43 s in one sync per process: `if tensor:` -> aten::item -> cudaStreamSynchronize
    for label, tl in read_capture(export):
        sync = tl.names.index("cudaStreamSynchronize")
        i = int(np.argmax(np.where(tl.r_name == sync, tl.r_dur, 0)))
        assert tl.r_dur[i] > 400_000
        item = np.flatnonzero(tl.c_name == tl.names.index("aten::item"))
        around = item[(tl.c_ts[item] <= tl.r_ts[i]) & (tl.c_ts[item] + tl.c_dur[item] >= tl.r_ts[i] + tl.r_dur[i])]
        assert around.size == 1 and tl.c_tid[around[0]] == tl.r_tid[i]


def test_diagnose_reads_the_export_and_names_what_the_expert_does(export, capsys):
    """`trainperf diagnose X.sqlite`: both GPUs as ranks; the finding is the copies that fill the step (pinned
    host-to-device weights every step), never launch-bound; the fp32 GEMMs are what is left."""
    from trainperf.cli import main
    from trainperf.diagnosis.engine import diagnose_path

    r = diagnose_path(export)
    assert r["ranks"]["count"] == 2 and {t["source"] for t in r["traces"]} == {"nsys"}
    ids = [f["id"] for f in r["findings"]]
    assert ids[0] == "copy_bound" and "launch_bound" not in ids, ids
    f = r["findings"][0]
    assert f["severity"] == "critical" and "HtoD" in f["evidence"] and "pinned" in f["evidence"]
    assert main(["diagnose", str(export)]) == 0
    out = capsys.readouterr().out
    assert "copy_bound" in out and "fp32 GEMM/conv off tensor cores" in out
