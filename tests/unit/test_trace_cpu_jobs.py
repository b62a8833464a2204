"""Traces of CPU jobs and directories as torch 2.13's profiler leaves them (fuzzing with real traces): gloo
communication counted everywhere it is shown, a late rank (a straggler) found from CPU-only traces, the
communication share in the printed breakdown, the profiling windows of one process not read as ranks, torch's memory-timeline JSON
skipped beside the traces, a rank's trace under another name read beside torch-named ones."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest

from trainperf.cli import main

DATA = Path(__file__).resolve().parents[1] / "data" / "traces"
GLOO = DATA / "gloo_straggler_cpu"  # 2 ranks; rank 1 sleeps 40 ms per step before an all-reduce
CPU_TRACE = DATA / "trainperf_cpu_rank0_step4.json.gz"  # one rank of trainperf's own CPU run, no collectives


def diagnose_json(path, capsys) -> dict:
    assert main(["diagnose", str(path), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def diagnose_text(path, capsys) -> str:
    assert main(["diagnose", str(path)]) == 0
    return capsys.readouterr().out


def test_gloo_communication_feeds_the_ranks_the_wait_and_the_straggler(capsys):
    """The breakdown counted gloo's all-reduce (96% of rank 0's step) while the ranks read 'communication 0.0 ms'
    and no rule fired on a 40 ms straggler."""
    r = diagnose_json(GLOO, capsys)
    per = {p["rank"]: p for p in r["ranks"]["per_rank"]}
    step0 = per[0]["step_time_us"]
    assert per[0]["comm_us_per_step"] > 0.7 * step0  # rank 0 spends the step in gloo:all_reduce, waiting
    assert per[0]["comm_wait_us_per_step"] > 30_000 and per[1]["comm_wait_us_per_step"] < 5_000
    assert per[1]["compute_us_per_step"] > 35_000 > 10_000 > per[0]["compute_us_per_step"]
    assert r["ranks"]["matching"]["matched_collectives"] == 4  # one all-reduce in each of the 4 steps
    assert r["ranks"]["compute_definition"].startswith("step time less exposed communication")
    # rank 1 sleeps: the late rank, charged with rank 0's wait, its cause its untraced host time (not compute)
    st = next(f for f in r["findings"] if f["id"] == "late_rank")
    assert st["rank"] == 1 and st["severity"] == "critical" and st["late_cause"] == "untraced"
    assert not any(f["id"] == "straggler" for f in r["findings"])  # one finding for one late rank
    # the wait is the straggler's, so it is not also reported as rank 0's own exposed communication
    assert not any(f["id"] == "comm_bound" for f in r["findings"])
    t0 = next(t for t in r["traces"] if t["rank"] == 0)
    assert t0["cpu_only"] and t0["comm"]["us_per_step"] == pytest.approx(per[0]["comm_us_per_step"])
    assert any("collective CPU op(s)" in n for n in t0["notes"])
    # GPU rules say why they were not judged, rather than that the trace lacks a GPU's name
    reasons = {n["id"]: n["reason"] for n in r["not_measured"]}
    assert reasons["fp32_on_tensor_cores"].startswith("a CPU-only trace")


def test_the_printed_breakdown_has_the_communication_share_and_adds_up(capsys):
    text = diagnose_text(GLOO, capsys)
    lines = re.findall(r"step [\d.]+ ms: (.*)", text)
    assert len(lines) == 2
    for line in lines:
        assert "communication " in line
        assert sum(int(v) for v in re.findall(r" (\d+)%", line)) in range(97, 104)  # whole percents, rounded
    assert "collectives matched across ranks: 4 (by name and order of the CPU ops; 0 ops unmatched)" in text


def test_the_html_report_has_a_communication_row(tmp_path, capsys):
    out = tmp_path / "r.html"
    assert main(["report", str(GLOO), "--out", str(out)]) == 0
    capsys.readouterr()
    assert "<th>communication %</th>" in out.read_text()  # a column of the per-rank table (one rank per row)


def _copy_as(dst: Path, src: Path = CPU_TRACE) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_bytes(gzip.decompress(src.read_bytes()) if not dst.name.endswith(".gz") else src.read_bytes())


def test_successive_windows_of_one_process_are_not_read_as_ranks(tmp_path, capsys):
    """tensorboard_trace_handler with repeat=0 writes WORKER.TIMESTAMP.pt.trace.json per window: same worker,
    no rank. They were read as ranks 0..3."""
    for ts in (1111, 2222):
        _copy_as(tmp_path / "w" / f"host_4242.{ts}.pt.trace.json")
    assert main(["diagnose", str(tmp_path / "w")]) == 2
    err = capsys.readouterr().err
    assert "two profiling windows of one process (worker 'host_4242'" in err and "Traceback" not in err


def test_a_memory_timeline_beside_the_trace_is_skipped_not_fatal(tmp_path, capsys):
    """export_memory_timeline(...json) writes [[times], [sizes]]: the directory exited 2 on it."""
    d = tmp_path / "m"
    _copy_as(d / "trace.json")
    (d / "mem.json").write_text(json.dumps([[1, 2, 3], [[0, 1], [2, 3]]]))
    r = diagnose_json(d, capsys)
    assert len(r["traces"]) == 1
    (skip,) = r["ranks"]["skipped"]
    assert skip["path"].endswith("mem.json") and "export_memory_timeline" in skip["why"]
    assert main(["diagnose", str(d / "mem.json")]) == 2  # alone, it is an error naming what it is
    assert "top-level JSON array" in capsys.readouterr().err


def test_a_rank_named_file_beside_torch_named_traces_is_read_and_others_are_listed(tmp_path, capsys):
    """rank1.json beside rank0.123.pt.trace.json was dropped without a word (only *.pt.trace.* were read);
    a Chakra et.json there is now listed as not read."""
    d = tmp_path / "mixed"
    for r in (0, 1):
        src = GLOO / f"rank{r}.pt.trace.json.gz"
        _copy_as(d / ("rank0.123.pt.trace.json" if r == 0 else "rank1.json"), src)
    (d / "et.json").write_text(json.dumps({"schema": "1.0.2-chakra", "nodes": []}))
    r = diagnose_json(d, capsys)
    assert sorted(t["rank"] for t in r["traces"]) == [0, 1]
    assert [Path(s["path"]).name for s in r["ranks"]["skipped"]] == ["et.json"]


def test_a_trace_without_step_markers_says_no_steps(tmp_path, capsys):
    doc = json.loads(gzip.decompress((GLOO / "rank1.pt.trace.json.gz").read_bytes()))
    doc["traceEvents"] = [e for e in doc["traceEvents"] if not str(e.get("name", "")).startswith("ProfilerStep")]
    p = tmp_path / "nosteps.json"
    p.write_text(json.dumps(doc))
    assert "no profiler step(s): the whole trace as one step" in diagnose_text(p, capsys)


def test_time_in_no_torch_op_is_named_in_what_is_left(tmp_path, capsys):
    """A CPU job that slept 98% of each step outside any op got 'no findings' and nothing in what is left."""
    doc = json.loads(gzip.decompress((GLOO / "rank1.pt.trace.json.gz").read_bytes()))
    steps = sorted((e for e in doc["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep")),
                   key=lambda e: e["ts"])
    last = steps[-1]
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e not in steps[:-1]]
    last["dur"] *= 20  # the last step, stretched: 95% of it has no op running (a sleep after the work)
    p = tmp_path / "stall.json"
    p.write_text(json.dumps(doc))
    text = diagnose_text(p, capsys)
    left = re.search(r"time in no torch op \(Python, sleeps, I/O waits\) ([\d.]+)%", text)
    assert left and float(left.group(1)) > 80, text


def test_a_missing_rank_and_a_copied_trace_are_noted(tmp_path, capsys):
    one = tmp_path / "one"
    _copy_as(one / "rank1.pt.trace.json.gz", GLOO / "rank1.pt.trace.json.gz")
    r = diagnose_json(one, capsys)
    assert any("the job had 2 ranks (distributedInfo.world_size) and 1 trace(s) are here: rank(s) 0 missing" in n
               for n in r["ranks"]["notes"])
    dup = tmp_path / "dup"
    _copy_as(dup / "rank2.json")
    _copy_as(dup / "rank10.json")
    text = diagnose_text(dup, capsys)
    assert "note: the traces of ranks 2 and 10 are the same trace" in text
    assert not diagnose_json(GLOO, capsys)["ranks"]["notes"]


def test_the_html_report_lists_the_notes_a_reader_needs(tmp_path, capsys):
    one = tmp_path / "one"
    _copy_as(one / "rank1.pt.trace.json.gz", GLOO / "rank1.pt.trace.json.gz")
    (one / "mem.json").write_text("[[1, 2], [3, 4]]")
    out = tmp_path / "r.html"
    assert main(["report", str(one), "--out", str(out)]) == 0
    capsys.readouterr()
    page = out.read_text()
    assert "<h2>Notes</h2>" in page and "rank(s) 0 missing" in page and "mem.json" in page


def test_a_comm_pattern_that_swallows_the_gemms_is_noted(capsys):
    fp8 = DATA / "fp8_tuned_gen_single_ns.json.gz"
    r = json.loads((lambda: (main(["diagnose", str(fp8), "--json", "--comm-pattern", "."]),
                             capsys.readouterr().out)[1])())
    (t,) = r["traces"]
    assert any("also match GEMM/convolution kernels" in n for n in t["notes"])
    assert main(["diagnose", str(fp8), "--json", "--comm-pattern", "ncclDevKernel"]) == 0
    assert not any("also match" in n for n in json.loads(capsys.readouterr().out)["traces"][0]["notes"])
