"""Jobs made from a real A100 rank by trainperf/tracegen/ranks.py, each with one injected cause and known truth
(truth.json): the reader names the late rank and its cause, charges it the others' waits, and recovers each
host's clock offset within 5% of the one injected. The generator's own answers are first checked on the raw
events, without the reader. Plus the real two-rank gloo job (rank 1 sleeps 40 ms before each all-reduce)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.unit.trace_factory import base_rank, read_json
from tests.unit.trace_fixtures import real_trace
from trainperf.tracegen import ranks as tracegen_ranks
from trainperf.trace.job import read_traces
from trainperf.tracegen.ranks import DATALOADER_NAME, FREE_NAME, make_job

HTA_A100 = "hta-data/tests/data/nccl_parser_config/nccl_data.json.gz"  # committed under tests/data/real
A100 = real_trace(HTA_A100)

GLOO = Path(__file__).resolve().parents[1] / "data" / "traces" / "gloo_straggler_cpu"


def _read(d: Path) -> tuple[list[dict], dict]:
    return read_traces(sorted(d.glob("rank*.pt.trace.json.gz")))


def _raw(path: Path) -> tuple[dict, list[dict]]:
    d = read_json(path)
    return d, d["traceEvents"]


def _check_job(across: dict, truth: dict, *, cause: str) -> dict:
    """The late rank, its cause and the wait charged to it, against truth.json: within 5%."""
    truth = json.loads(json.dumps(truth))  # as truth.json has it (rank keys as text)
    late = truth["late_rank"]
    top = across["late_arrivals"][0]
    assert top["rank"] == late and top["cause"] == cause, top
    assert top["cause_share"] > 0.9, top["causes_us_per_step"]
    assert top["steps_last"] == truth["steps"] == top["steps"]  # "rank L last in 3 of 3 steps"
    assert top["delay_us_per_step"] == pytest.approx(truth["job"]["delay_us_per_step"], rel=0.05)
    assert top["wait_caused_us_per_step"] == pytest.approx(truth["job"]["wait_us_per_step"], rel=0.05)
    per = {p["rank"]: p for p in across["per_rank"]}
    for r, t in truth["ranks"].items():
        assert per[int(r)]["comm_wait_us_per_step"] == pytest.approx(t["wait_us_mean_per_step"], rel=0.05, abs=50), r
    wm = across["wait_matrix"]
    col = wm["late"].index(late)
    for r, row in zip(wm["waiting"], wm["ms_per_step"]):
        assert row[col] == pytest.approx(truth["ranks"][str(r)]["wait_us_mean_per_step"] / 1000, rel=0.05, abs=0.05)
    return top


def _check_clocks(across: dict, truth: dict) -> None:
    truth = json.loads(json.dumps(truth))
    for p in across["per_rank"]:
        want = truth["clock_offset_vs_rank0_us"][str(p["rank"])]
        assert p["clock_offset_us"] == pytest.approx(want, rel=0.05, abs=1.0), p["rank"]
    assert across["clocks"]["residual_us"] <= truth["end_jitter_us"]


def test_a_late_data_loader_with_host_clock_offsets(tmp_path):
    offsets = {1: 3200.0, 2: -15_000.0, 3: 250_000.0}
    truth = make_job(A100, tmp_path, world=4, late=2, cause="dataloader", late_us=15_000.0, dataloader_us=1000.0,
                     clock_offsets_us=offsets, end_jitter_us=8.0, seed=3)
    # the truth, on the raw events: every rank has a DataLoader span per step, the late rank's 15 ms longer
    for r in range(4):
        meta, ev = _raw(tmp_path / f"rank{r}.pt.trace.json.gz")
        dl = [e["dur"] for e in ev if e.get("name") == DATALOADER_NAME]
        assert dl == pytest.approx([16_000.0 if r == 2 else 1000.0] * 3)
        assert meta["distributedInfo"]["rank"] == r and meta["distributedInfo"]["world_size"] == 4
    assert truth["job"]["late_collectives"] > 0 and truth["ranks"][2]["wait_us_total"] == 0
    results, across = _read(tmp_path)
    top = _check_job(across, truth, cause="dataloader")
    assert "DataLoader" in top["summary"] and not top["straggler_by_compute"]
    _check_clocks(across, truth)
    assert not across["partial"] and all(p["transfer_us_per_step"] > 0 for p in across["per_rank"])
    json.dumps(across, allow_nan=False)


def test_a_host_blocked_in_free_calls_before_its_collective(tmp_path):
    truth = make_job(A100, tmp_path, world=3, late=1, cause="allocator", late_us=12_000.0, free_calls=4)
    _, ev = _raw(tmp_path / "rank1.pt.trace.json.gz")
    frees = [e for e in ev if e.get("name") == FREE_NAME]
    assert len(frees) == 4 * truth["steps"] and sum(e["dur"] for e in frees) == pytest.approx(
        sum(truth["allocator_us_per_step"]))
    assert not any(e.get("name") == FREE_NAME for e in _raw(tmp_path / "rank0.pt.trace.json.gz")[1])
    _, across = _read(tmp_path)
    top = _check_job(across, truth, cause="allocator")
    assert "cudaFree" in top["summary"]


def test_a_straggler_by_compute_is_the_late_rank_with_cause_compute(tmp_path):
    truth = make_job(A100, tmp_path, world=3, late=0, cause="compute", slowdown=1.3, dataloader_us=0.0)
    _, across = _read(tmp_path)
    top = _check_job(across, truth, cause="compute")
    assert top["straggler_by_compute"] and across["straggler"]["rank"] == 0 and across["straggler"]["slower"]


def test_with_one_rank_missing_the_wait_is_not_split_into_transfer(tmp_path):
    make_job(A100, tmp_path / "all", world=4, late=3, cause="dataloader", late_us=10_000.0)
    (tmp_path / "some").mkdir()
    for r in (0, 1, 3):
        shutil.copy(tmp_path / "all" / f"rank{r}.pt.trace.json.gz", tmp_path / "some")
    _, across = _read(tmp_path / "some")
    assert across["partial"] and all(p["transfer_us_per_step"] is None for p in across["per_rank"])
    assert all(p["comm_incl_absent_wait_us_per_step"] > 0 for p in across["per_rank"])
    assert any("includes waiting for ranks not in these traces" in n for n in across["notes"])
    top = across["late_arrivals"][0]
    assert top["rank"] == 3 and top["cause"] == "dataloader" and "among the ranks in these traces" in top["summary"]


def test_generated_from_a_generated_rank_matched_by_stream_order(tmp_path):
    """A rank that records no process group: collectives matched by stream order, the same answers."""
    src = base_rank(tmp_path / "base.json.gz", steps=4, pg=False)
    truth = make_job(src, tmp_path / "job", world=3, late=1, cause="dataloader", late_us=2000.0,
                     dataloader_us=300.0, clock_offsets_us={2: 700.0})
    _, across = _read(tmp_path / "job")
    assert across["matching"]["by"] == ["stream order"]
    _check_job(across, truth, cause="dataloader")
    _check_clocks(across, truth)


def test_multi_rank_is_make_job_with_cause_compute(tmp_path):
    src = base_rank(tmp_path / "base.json.gz", steps=3)
    a = tracegen_ranks.multi_rank(src, tmp_path / "a", world=3, straggler=1, slowdown=1.4)
    b = make_job(src, tmp_path / "b", world=3, late=1, cause="compute", slowdown=1.4, dataloader_us=0.0)
    assert a["ranks"] == b["ranks"] and a["straggler"] == b["straggler"] == 1
    for r in range(3):
        assert (tmp_path / "a" / f"rank{r}.pt.trace.json.gz").read_bytes() == \
            (tmp_path / "b" / f"rank{r}.pt.trace.json.gz").read_bytes()


def test_make_job_refuses_what_it_cannot_make(tmp_path):
    src = base_rank(tmp_path / "base.json.gz", steps=2)
    for kw in (dict(world=1), dict(late=5), dict(cause="gc"), dict(late_us=-1.0), dict(free_calls=0)):
        with pytest.raises(ValueError, match="need world >= 2"):
            make_job(src, tmp_path / "x", **kw)


def test_the_gloo_job_names_the_sleeping_rank_and_untraced_host_time():
    _, across = read_traces(sorted(GLOO.glob("*.json.gz")))
    (top,) = across["late_arrivals"]
    assert top["rank"] == 1 and top["cause"] == "untraced" and top["last_at"] == 4 == top["steps_last"]
    assert top["delay_us_per_step"] > 35_000  # it sleeps 40 ms before each all-reduce
    assert abs(across["per_rank"][1]["clock_offset_us"]) < 1000  # one host
    assert across["wait_definition"].startswith("wait of a rank at a collective = the last arrival's start")
