"""``trainperf compare``: runs side by side. Hand-written run directories check each figure and
the strict ``--json`` shape; two real tiny runs check it end to end; bad input exits 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.unit.test_report import tiny_run
from trainperf.cli import main

KEYS = {"run_dir", "tokens_per_s", "step_time_s", "mfu", "hfu", "phase_fractions", "peak_memory_bytes",
        "final_loss"}


def strict_loads(text: str):
    def refuse(c):
        raise AssertionError(f"non-strict JSON constant {c}")

    return json.loads(text, parse_constant=refuse)


def write_run(d: Path, *, step_s: float, tokens: int = 1024, n: int = 20, config: dict, diverged: bool = False,
              compile_s: float = 0.0, rss: int = 2**28) -> Path:
    d.mkdir(parents=True)
    recs = []
    for i in range(1, n + 1):
        ph = {"data": 0.1 * step_s, "forward": 0.3 * step_s, "backward": 0.5 * step_s, "optimizer": 0.1 * step_s}
        if i == 1 and compile_s:
            ph["compile"] = compile_s
        recs.append({"step": i, "loss": 5.0 - 0.1 * i, "step_time_s": step_s + (compile_s if i == 1 else 0.0),
                     "tokens_per_s": tokens / step_s, "phases_s": ph, "mfu": 0.0001 * tokens / step_s})
    if diverged:
        recs[-1]["loss"] = float("nan")  # json.dumps writes NaN, as a diverged run's log would hold
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    (d / "samples.jsonl").write_text(json.dumps({"step": 5, "elapsed_s": 1.0, "proc_rss_bytes": rss}) + "\n")
    (d / "config.yaml").write_text(yaml.safe_dump(config))
    summary = {"final_loss": recs[-1]["loss"], "tokens_per_s": tokens / step_s * 0.9, "mfu": 0.0001 * tokens / step_s * 0.9,
               "hfu": 0.00012 * tokens / step_s * 0.9, "peak_source": "measured"}
    (d / "summary.json").write_text(json.dumps(summary))
    return d


def config(compile_on: bool, workers: int = 2, d: str = "x") -> dict:
    return {"run": {"dir": d, "steps": 20}, "compile": {"enabled": compile_on, "mode": "default"},
            "data": {"num_workers": workers}}


def test_json_shape_speedup_and_config_diff(tmp_path, capsys):
    a = write_run(tmp_path / "a", step_s=0.2, config=config(False, d="a"))
    b = write_run(tmp_path / "b", step_s=0.1, config=config(True, d="b"), compile_s=30.0, rss=3 * 2**28,
                  diverged=True)
    c = write_run(tmp_path / "c", step_s=0.25, tokens=2048, config=config(False, workers=4, d="c"))
    assert main(["compare", str(a), str(b), str(c), "--json"]) == 0
    out = strict_loads(capsys.readouterr().out)  # the diverged run's NaN loss comes back as null
    assert set(out) == {"runs", "speedup", "config_diff"}
    assert [set(r) for r in out["runs"]] == [KEYS] * 3
    ra, rb, rc = out["runs"]
    assert ra["run_dir"] == str(a) and ra["tokens_per_s"] == pytest.approx(5120) and ra["step_time_s"] == 0.2
    assert out["speedup"] == pytest.approx([1.0, 2.0, 8192 / 5120])
    # steady-step figures: the compile step is left out, and compile is not a phase fraction
    assert rb["step_time_s"] == pytest.approx(0.1) and "compile" not in rb["phase_fractions"]
    assert rb["phase_fractions"]["data"] == pytest.approx(0.1)
    assert ra["mfu"] == pytest.approx(0.512) and ra["hfu"] == pytest.approx(0.512 * 1.2)  # HFU/MFU kept
    assert ra["final_loss"] == pytest.approx(3.0) and rb["final_loss"] is None
    assert rb["peak_memory_bytes"] == 3 * 2**28
    assert out["config_diff"] == {"compile.enabled": [False, True, False], "data.num_workers": [2, 2, 4]}


def test_text_headline_says_the_speedup_and_what_changed(tmp_path, capsys):
    a = write_run(tmp_path / "a", step_s=0.2, config=config(False, d="a"))
    b = write_run(tmp_path / "b", step_s=0.1, config=config(True, d="b"), compile_s=30.0)
    assert main(["compare", str(a), str(b)]) == 0
    text = capsys.readouterr().out
    assert "B vs A: 2.00x the tokens/s of A (5,120 -> 10,240 tokens/s" in text
    assert "changed: compile.enabled false -> true" in text and "run.dir" not in text
    assert "30.0 s" in text  # compilation shown apart
    assert "loss at step 20" in text and "loss at 20,480 tokens" in text


def test_losses_are_aligned_by_step_and_by_tokens(tmp_path, capsys):
    a = write_run(tmp_path / "a", step_s=0.1, tokens=1000, n=20, config=config(False, d="a"))
    b = write_run(tmp_path / "b", step_s=0.1, tokens=2000, n=10, config=config(False, d="b"))
    assert main(["compare", str(a), str(b)]) == 0
    rows = {line.split("  ")[1].strip(): line.split()[-2:] for line in capsys.readouterr().out.splitlines()
            if line.strip().startswith("loss at")}
    # by step: the last step both reached (10), mean of the 5 records up to it: 5 - 0.1 * 8 = 4.2
    assert rows["loss at step 10 (mean of 5 records to it)"] == ["4.2000", "4.2000"]
    # by tokens: 20,000 tokens = step 20 of A, step 10 of B
    assert rows["loss at 20,000 tokens (same)"] == ["3.2000", "4.2000"]


def test_two_real_runs_end_to_end(tmp_path, capsys):
    a = tiny_run(tmp_path / "a")
    b = tiny_run(tmp_path / "b", "train.micro_batch=8")
    assert main(["compare", str(a), str(b), "--json"]) == 0
    out = strict_loads(capsys.readouterr().out)
    assert out["config_diff"]["train.micro_batch"] == [4, 8]
    assert "run.dir" not in out["config_diff"]
    for r in out["runs"]:
        assert r["tokens_per_s"] > 0 and 0 < r["mfu"] < 1 and r["final_loss"] > 0
        assert sum(r["phase_fractions"].values()) == pytest.approx(1.0)
    assert out["speedup"][0] == 1.0 and out["speedup"][1] == pytest.approx(
        out["runs"][1]["tokens_per_s"] / out["runs"][0]["tokens_per_s"])
    assert main(["report", str(a), str(b), "--json"]) == 0  # the HTML version
    rep = strict_loads(capsys.readouterr().out)
    html = Path(rep["html"]).read_text()
    assert Path(rep["html"]) == a / "compare.html" and rep["speedup"] == out["speedup"]
    assert {Path(c).stem for c in rep["charts"]} == {"loss_by_step", "loss_by_tokens", "throughput", "phases",
                                                     "peak_memory"}
    assert "train.micro_batch" in html and "B vs A:" in html and "<script" not in html


def test_bad_run_dirs_exit_2_with_a_message(tmp_path, capsys):
    good = write_run(tmp_path / "good", step_s=0.1, config=config(False))
    (tmp_path / "empty").mkdir()
    nosteps = tmp_path / "nosteps"
    nosteps.mkdir()
    (nosteps / "metrics.jsonl").write_bytes(b"\xff\xfe garbage\n{\"step\": 1, \"val_loss\": 2.0}\n")
    (tmp_path / "file").write_text("x")
    cases = {str(tmp_path / "missing"): "does not exist", str(tmp_path / "empty"): "no metrics.jsonl",
             str(nosteps): "no step records", str(tmp_path / "file"): "is not a directory"}
    for bad, msg in cases.items():
        assert main(["compare", str(good), bad]) == 2, bad
        err = capsys.readouterr().err
        assert msg in err and "Traceback" not in err, err
    assert main(["compare", str(good)]) == 2
    assert "two or more run directories" in capsys.readouterr().err
    assert main(["report", str(good), str(tmp_path / "missing")]) == 2


def test_garbage_in_run_files_never_gives_a_traceback(tmp_path, capsys):
    """Randomized damage to every file the three commands read: each exits 0 or 2, never raises."""
    import random

    rng = random.Random(16)
    base = write_run(tmp_path / "base", step_s=0.1, config=config(False))
    junk = [None, "x", -1, 1e308, float("nan"), [], {}, True, {"a": "b"}, [1, "2"]]
    codes = []
    for i in range(12):
        d = tmp_path / f"g{i}"
        d.mkdir()
        for name in ("metrics.jsonl", "samples.jsonl", "summary.json", "config.yaml"):
            data = (base / name).read_bytes()
            kind = rng.choice(["truncate", "bytes", "values", "empty", "keep"])
            if kind == "truncate":
                data = data[:rng.randrange(len(data) + 1)]
            elif kind == "bytes":
                data = bytes(rng.randrange(256) if rng.random() < 0.05 else b for b in data)
            elif kind == "values" and name.endswith("jsonl"):
                recs = [json.loads(x) for x in data.decode().splitlines()]
                for r in recs:
                    for k in list(r):
                        if rng.random() < 0.3:
                            r[k] = rng.choice(junk)
                data = "".join(json.dumps(r) + "\n" for r in recs).encode()
            elif kind == "empty":
                data = b""
            (d / name).write_bytes(data)
        for argv in (["diagnose", str(d), "--json"], ["report", str(d)], ["compare", str(base), str(d), "--json"]):
            code = main(argv)
            out = capsys.readouterr()
            assert code in (0, 2), (argv, out.err)
            if code == 0 and "--json" in argv:
                strict_loads(out.out)
            codes.append(code)
    assert codes.count(0) > 5 and codes.count(2) > 2, codes  # both damaged-but-readable and unreadable cases


def test_a_killed_run_says_its_peak_was_not_recorded_not_none(tmp_path, capsys):
    """A killed run (no summary.json) showed 'MFU 56.8%' and then '... A: none' in the peaks note."""
    from trainperf.cli import main

    a = write_run(tmp_path / "a", step_s=0.2, config=config(False, d="a"))
    (a / "summary.json").unlink()
    b = write_run(tmp_path / "b", step_s=0.1, config=config(False, d="b"))
    assert main(["compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "A: not recorded (no summary.json: the run did not finish; MFU from its step records); B: measured" in out
    assert "A: none;" not in out
