"""Corrupt or hand-edited traces (found by fuzzing the reader): numbers beyond float64, absurd times,
occupancy above 100%, broken or duplicated steps and events. Each is left out or counted once with a note
saying so, never a traceback and never a figure stretched by one bad event; and `report --out` never
replaces its own input, a device file or a file that is not an HTML page."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest

from tests.unit.trace_factory import base_rank
from trainperf.cli import main


@pytest.fixture(scope="module")
def doc(tmp_path_factory) -> dict:
    p = base_rank(tmp_path_factory.mktemp("corrupt") / "rank0.pt.trace.json.gz", steps=3)
    return json.loads(gzip.decompress(p.read_bytes()))


def _kernels(d: dict) -> list[dict]:
    return [e for e in d["traceEvents"] if e.get("cat") == "kernel"]


def _steps(d: dict) -> list[dict]:
    return [e for e in d["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep")]


def run(tmp_path: Path, d: dict, capsys, name: str = "t.json") -> dict:
    p = tmp_path / name
    p.write_text(json.dumps(d))  # json.dumps writes a big int literally: 10**400 stays 10**400
    assert main(["diagnose", str(p), "--json"]) == 0, capsys.readouterr().err[-500:]
    out = json.loads(capsys.readouterr().out)
    return out["traces"][0]


def notes(r: dict) -> str:
    return " | ".join(r.get("notes") or [])


def test_the_clean_trace_has_none_of_these_notes(doc, tmp_path, capsys):
    r = run(tmp_path, doc, capsys)
    assert "far from the rest" not in notes(r) and "appear twice" not in notes(r)
    assert "ProfilerStep" not in notes(r) and "occupancy" not in notes(r)


def test_integers_beyond_float64_and_huge_step_numbers_do_not_crash(doc, tmp_path, capsys):
    clean = run(tmp_path, doc, capsys)
    for field in ("ts", "dur"):
        d = json.loads(json.dumps(doc))
        _kernels(d)[3][field] = 10**400
        r = run(tmp_path, d, capsys)
        assert r["step_time_us"] == pytest.approx(clean["step_time_us"], rel=0.05)
    d = json.loads(json.dumps(doc))
    _kernels(d)[3]["args"]["correlation"] = 10**400
    _kernels(d)[4]["args"]["est. achieved occupancy %"] = 10**400
    run(tmp_path, d, capsys)
    d = json.loads(json.dumps(doc))
    _steps(d)[0]["name"] = "ProfilerStep#" + "9" * 5000  # beyond Python's int-from-text limit: not a step
    r = run(tmp_path, d, capsys)
    assert r["steps"] == 2


def test_one_absurd_kernel_time_is_left_out_with_a_note(doc, tmp_path, capsys):
    clean = run(tmp_path, doc, capsys)
    for field, value in (("dur", 1e30), ("dur", 1e9), ("ts", 1e30), ("ts", 2.0**70)):
        d = json.loads(json.dumps(doc))
        k = _kernels(d)
        k[5][field] = value if field == "dur" else value
        if field == "ts":  # also the first event of the file: the time base must not come from it
            d["traceEvents"].remove(k[5])
            d["traceEvents"].insert(0, k[5])
        r = run(tmp_path, d, capsys)
        assert "1 GPU event(s) or runtime call(s) start or end implausibly far" in notes(r), (field, value)
        assert r["step_time_us"] == pytest.approx(clean["step_time_us"], rel=0.05), (field, value)
        assert 0 <= r["gpu_utilization_pct"] <= 100


def test_occupancy_outside_0_100_is_left_out(doc, tmp_path, capsys):
    d = json.loads(json.dumps(doc))
    for e in _kernels(d):
        e["args"]["est. achieved occupancy %"] = 150
    r = run(tmp_path, d, capsys)
    assert r["achieved_occupancy_pct"] is None and "occupancy outside 0-100%" in notes(r)


def test_steps_with_no_duration_nested_or_apart_from_everything(doc, tmp_path, capsys):
    clean = run(tmp_path, doc, capsys)
    d = json.loads(json.dumps(doc))
    for s in _steps(d):
        s["dur"] = 0
    r = run(tmp_path, d, capsys)
    assert "3 ProfilerStep annotation(s) had a zero, negative" in notes(r) and "no usable ProfilerStep" in notes(r)
    d = json.loads(json.dumps(doc))
    s = sorted(_steps(d), key=lambda e: e["ts"])
    s[1]["ts"], s[1]["dur"] = s[0]["ts"] + 10, s[0]["dur"] - 20  # step 2 inside step 1
    r = run(tmp_path, d, capsys)
    assert "1 ProfilerStep annotation(s) start inside an earlier step" in notes(r) and r["steps"] == 2
    d = json.loads(json.dumps(doc))
    for e in _steps(d):
        e["ts"] = e["ts"] - 10**9  # 1000 s before everything else
    r = run(tmp_path, d, capsys)
    assert "hold none of the trace's GPU events" in notes(r)
    assert 0 < r["gpu_utilization_pct"] <= 100
    assert r["step_time_us"] < 5 * clean["step_time_us"] * clean["steps"]  # the trace span, not the gap


def test_duplicated_events_count_once(doc, tmp_path, capsys):
    clean = run(tmp_path, doc, capsys)
    d = json.loads(json.dumps(doc))
    d["traceEvents"] = d["traceEvents"] * 2
    r = run(tmp_path, d, capsys)
    assert f"{len(_kernels(doc))} GPU event(s) appear twice" in notes(r)
    assert [k["us"] for k in r["top_kernels"]] == [k["us"] for k in clean["top_kernels"]]
    d = json.loads(json.dumps(doc))
    for s in _steps(d):
        s["name"] = "ProfilerStep#4"
    assert "2 ProfilerStep annotation(s) repeat an earlier step's number" in notes(run(tmp_path, d, capsys))


def test_report_out_never_replaces_its_input_a_device_or_a_non_html_file(doc, tmp_path, capsys):
    trace = tmp_path / "rank0.json"
    trace.write_text(json.dumps(doc))
    before = trace.read_bytes()
    cfg = tmp_path / "train.yaml"
    cfg.write_text("run: {steps: 3}\n")
    for out in (trace, "/dev/null", cfg, ""):
        assert main(["report", str(trace), "--out", str(out)]) == 2, out
        err = capsys.readouterr().err
        assert "--out" in err and "Traceback" not in err, err
    assert trace.read_bytes() == before and cfg.read_text() == "run: {steps: 3}\n"
    assert os.path.exists("/dev/null") and not os.path.isfile("/dev/null")
    html = tmp_path / "r.html"
    assert main(["report", str(trace), "--out", str(html)]) == 0
    assert main(["report", str(trace), "--out", str(html)]) == 0  # a report replaces a report
    capsys.readouterr()


@pytest.mark.parametrize("encoding,says", [("utf-32", "is UTF-32 text"), ("utf-16-le", "is UTF-16LE text"),
                                           ("utf-16-be", "is UTF-16BE text"), ("utf-16", "is UTF-16 text")])
def test_wide_encodings_are_named_with_the_right_conversion(doc, tmp_path, capsys, encoding, says):
    p = tmp_path / "wide.json"
    p.write_bytes(("\n" + json.dumps(doc)).encode(encoding))  # a leading newline, as some tools write
    assert main(["diagnose", str(p)]) == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err, err


def test_an_empty_path_is_not_the_current_directory(capsys):
    assert main(["diagnose", ""]) == 2
    assert "the path is empty" in capsys.readouterr().err


def test_report_of_several_traces_says_it_compares_runs(doc, tmp_path, capsys):
    # two profiles are compared A against B (report A B); three are not a comparison report can make
    a, b, c = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "c.json"
    for p in (a, b, c):
        p.write_text(json.dumps(doc))
    assert main(["report", str(a), str(b), str(c)]) == 2
    assert "is a trace (or a directory of traces), not a run directory" in capsys.readouterr().err
