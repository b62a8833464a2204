"""Fuzzing-pass fixes: ``compare`` on corrupt metrics/summary files, ``launch`` rendezvous / endpoint /
--resume checks, and ``memory`` budgets past float-to-int range (each once exit 0 with impossible figures,
or a traceback)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from tests.unit.test_compare import config, strict_loads, write_run
from trainperf.cli import main

CFG = "configs/gpt-tiny.yaml"


def _rewrite_metrics(d: Path, change) -> None:
    """Apply ``change(index, record)`` to each record of d/metrics.jsonl (json.dumps writes NaN as NaN)."""
    p = d / "metrics.jsonl"
    recs = [json.loads(x) for x in p.read_text().splitlines()]
    for i, r in enumerate(recs):
        change(i, r)
    p.write_text("".join(json.dumps(r) + "\n" for r in recs))


def _pair(tmp_path) -> tuple[Path, Path]:
    """Two intact runs: B twice as fast (0.1 s a step, 10,240 tokens/s, MFU 0.8 a step, 0.72 whole run)."""
    a = write_run(tmp_path / "a", step_s=0.2, config=config(False, d="a"))
    b = write_run(tmp_path / "b", step_s=0.1, config=config(False, d="b"))
    _rewrite_metrics(b, lambda i, r: r.update(mfu=0.8))
    summ = json.loads((b / "summary.json").read_text())
    summ.update(mfu=0.72, hfu=0.8)
    (b / "summary.json").write_text(json.dumps(summ))
    return a, b


# ---------------------------------------------------------------------------- compare
def test_impossible_step_records_are_left_out_with_a_note(tmp_path, capsys):
    a, b = _pair(tmp_path)

    def corrupt(i, r):
        if i == 10:
            r["step_time_s"], r["tokens_per_s"] = -r["step_time_s"], -r["tokens_per_s"]
        elif i == 11:
            r["mfu"] = 5.0
        elif i == 12:
            r["tokens_per_s"] = 1e308
        elif i == 13:
            r["step_time_s"] = "fast"
        elif i == 14:
            r["step_time_s"] = 0
        elif i == 15:
            r["hfu"] = -0.5

    _rewrite_metrics(b, corrupt)
    assert main(["compare", str(a), str(b), "--json"]) == 0
    got = capsys.readouterr()
    out = strict_loads(got.out)
    rb = out["runs"][1]
    # the figures are the intact records' (0.1 s, 10,240 tokens/s, MFU 0.8), never negative or above 1
    assert rb["step_time_s"] == pytest.approx(0.1) and rb["tokens_per_s"] == pytest.approx(10240)
    assert rb["mfu"] == pytest.approx(0.8) and out["speedup"] == pytest.approx([1.0, 2.0])
    note = f"4 of 20 step records in {b / 'metrics.jsonl'} left out of the figures as malformed"
    assert note in got.err, got.err
    assert "step_time_s not in (0, 1e+07] s: 2" in got.err and "tokens_per_s not a number" in got.err
    assert "the MFU of 1 step records (outside [0, 1]) and the HFU of 1 step records" in got.err
    assert main(["compare", str(a), str(b)]) == 0
    text = capsys.readouterr().out
    assert f"note: B: {note}" in text and "-10,240" not in text and "500.0%" not in text


def test_an_mfu_above_one_everywhere_is_left_out_not_the_timing(tmp_path, capsys):
    a, b = _pair(tmp_path)
    _rewrite_metrics(b, lambda i, r: r.update(mfu=5.0))
    summ = json.loads((b / "summary.json").read_text())
    summ.update(mfu=5.0, hfu=5.1)
    (b / "summary.json").write_text(json.dumps(summ))
    assert main(["compare", str(a), str(b), "--json"]) == 0
    got = capsys.readouterr()
    rb = strict_loads(got.out)["runs"][1]
    assert rb["mfu"] is None and rb["hfu"] is None and rb["tokens_per_s"] == pytest.approx(10240)
    assert "the MFU of 20 step records (outside [0, 1]) left out of the MFU/HFU figures" in got.err
    assert "summary.json: ignored" in got.err and "mfu=5.0" in got.err and "hfu=5.1" in got.err


def test_every_record_negated_is_refused_as_malformed(tmp_path, capsys):
    """The fuzzer's runs/m_neg: every step time and tokens/s negated, MFU 5.0: was -1.00x, MFU 500%, exit 0."""
    a, b = _pair(tmp_path)

    def negate(i, r):
        r["step_time_s"], r["tokens_per_s"], r["mfu"] = -r["step_time_s"], -r["tokens_per_s"], 5.0

    _rewrite_metrics(b, negate)
    for argv in (["compare", str(a), str(b)], ["compare", str(a), str(b), "--json"]):
        assert main(argv) == 2
        got = capsys.readouterr()
        assert got.out == "" and "Traceback" not in got.err
        assert f"{b / 'metrics.jsonl'} holds 20 step records, but every one is malformed" in got.err
        assert "did not reach its first logged step" not in got.err


@pytest.mark.parametrize("value", [float("nan"), "fast"])
def test_nan_or_text_step_times_say_malformed_not_unstarted(tmp_path, capsys, value):
    a, b = _pair(tmp_path)
    _rewrite_metrics(b, lambda i, r: r.update(step_time_s=value))
    assert main(["compare", str(a), str(b)]) == 2
    err = capsys.readouterr().err
    assert f"{b / 'metrics.jsonl'} holds 20 step records, but every one is malformed" in err
    assert "NaN, text, negative" in err and "first logged step" not in err


def test_a_run_that_logged_no_step_keeps_the_old_message(tmp_path, capsys):
    a, b = _pair(tmp_path)
    (b / "metrics.jsonl").write_text(json.dumps({"step": 1, "val_loss": 2.0}) + "\n")
    assert main(["compare", str(a), str(b)]) == 2
    assert "did not reach its first logged step" in capsys.readouterr().err


@pytest.mark.parametrize("bad", [-5, 0, 1e308, "x"])
def test_impossible_summary_figures_are_ignored_with_a_note(tmp_path, capsys, bad):
    a, b = _pair(tmp_path)
    summ = json.loads((b / "summary.json").read_text())
    summ.update(tokens_per_s=bad, mfu=bad, hfu=bad)
    (b / "summary.json").write_text(json.dumps(summ))
    assert main(["compare", str(a), str(b)]) == 0
    text = capsys.readouterr().out
    row = next(line for line in text.splitlines() if "whole run (summary.json)" in line)
    assert row.split()[-1] == "-", row  # B's whole-run tokens/s: not printed
    assert f"note: B: {b / 'summary.json'}: ignored tokens_per_s=" in text and "mfu=" in text
    assert len(row) < 100 and not re.search(r"\d[\d,]{20,}", text)  # no 310-digit number
    assert main(["compare", str(a), str(b), "--json"]) == 0
    got = capsys.readouterr()
    hfu = strict_loads(got.out)["runs"][1]["hfu"]
    assert hfu is None or (math.isfinite(hfu) and 0 < hfu <= 1)
    assert "summary.json: ignored" in got.err


def test_intact_runs_have_no_data_notes(tmp_path, capsys):
    a, b = _pair(tmp_path)
    assert main(["compare", str(a), str(b), "--json"]) == 0
    assert "note" not in capsys.readouterr().err
    assert main(["compare", str(a), str(b)]) == 0
    assert "left out" not in capsys.readouterr().out


# ---------------------------------------------------------------------------- launch
def _launch(capsys, *argv) -> tuple[int, str, str]:
    rc = main(["launch", CFG, "--dry-run", *argv])
    got = capsys.readouterr()
    return rc, got.out, got.err


def test_several_nodes_need_a_rendezvous_endpoint(capsys):
    rc, out, err = _launch(capsys, "--nnodes", "2")
    assert rc == 2 and out == "" and "Traceback" not in err
    assert "--nnodes 2 needs --rdzv-endpoint HOST:PORT (every node must reach the same rendezvous" in err
    assert "or use --slurm" in err
    rc, out, _ = _launch(capsys, "--nnodes", "2", "--rdzv-endpoint", "node001:29500", "--node-rank", "1")
    assert rc == 0 and "--nnodes=2 --rdzv-backend=c10d --rdzv-endpoint=node001:29500 --node-rank=1" in out
    rc, out, _ = _launch(capsys)  # one node: --standalone, no endpoint needed
    assert rc == 0 and "--standalone" in out


def test_slurm_mode_still_takes_nnodes_without_an_endpoint(capsys):
    assert main(["launch", CFG, "--slurm", "--nnodes", "2", "--set", "train.global_batch=auto"]) == 0
    text = capsys.readouterr().out
    assert "#SBATCH --nodes=2" in text and '--rdzv-endpoint="$head_node:29500"' in text


@pytest.mark.parametrize("endpoint,needle", [
    ("h;rm -rf /:29500", "is not a host name or IP address"),
    ("my host:29500", "is not a host name or IP address"),
    ("$(id):29500", "is not a host name or IP address"),
    (":29500", "the host is missing"),
    ("node001:0", "port '0' is not a whole number in 1-65535"),
    ("node001:65536", "port '65536'"),
    ("node001:", "port ''"),
    ("fd00::1:29500", "IPv6 address goes in brackets"),
    ("[nothex]:29500", "is not an IPv6 address"),
])
def test_bad_rendezvous_endpoints_exit_2(capsys, endpoint, needle):
    rc, out, err = _launch(capsys, "--nnodes", "2", "--rdzv-endpoint", endpoint)
    assert rc == 2 and out == "" and "Traceback" not in err
    assert f"--rdzv-endpoint {endpoint!r}: give HOST or HOST:PORT" in err and needle in err, err


@pytest.mark.parametrize("endpoint", ["node001:29500", "10.0.0.1:29400", "[fd00::1]:29500", "head",
                                      "n-1.cluster.local:1"])
def test_good_rendezvous_endpoints_pass(capsys, endpoint):
    rc, out, err = _launch(capsys, "--nnodes", "2", "--rdzv-endpoint", endpoint)
    assert rc == 0, err
    assert endpoint in out


def test_resume_path_must_exist_before_launch(tmp_path, capsys):
    missing = tmp_path / "nonexistent.pt"
    rc, out, err = _launch(capsys, "--resume", str(missing))
    assert rc == 2 and out == "" and "Traceback" not in err
    assert f"--resume {str(missing)!r}: no such file or directory" in err and "auto" in err and "never" in err
    rc, _, err = _launch(capsys, "--resume", "")
    assert rc == 2 and "--resume ''" in err
    ck = tmp_path / "step-00000010.pt"
    ck.write_bytes(b"x")
    for ok in (str(ck), "never", "auto"):
        rc, out, err = _launch(capsys, "--resume", ok)
        assert rc == 0, err
        assert ("--resume" not in out) if ok == "auto" else (f"--resume {ok}" in out)
    # --slurm: the job's nodes read the path (it may be on their file system only), so it is not checked here
    assert main(["launch", CFG, "--slurm", "--resume", str(missing)]) == 0
    assert f"--resume {missing}" in capsys.readouterr().out


# ---------------------------------------------------------------------------- memory
@pytest.mark.parametrize("value", ["1e300", "1e7", "1000000.5"])
def test_memory_budget_flag_has_an_upper_bound(capsys, value):
    assert main(["memory", CFG, "--budget-gb", value]) == 2
    err = capsys.readouterr().err
    assert "--budget-gb=" in err and "at most 1e+06 GB per rank" in err and "Traceback" not in err


@pytest.mark.parametrize("value", ["1e300", "1.0e300", "2000000.0"])
def test_memory_budget_config_field_has_an_upper_bound(capsys, value):
    assert main(["memory", CFG, "--set", f"memory.checkpointing.budget_gb={value}"]) == 2
    err = capsys.readouterr().err
    assert "memory.checkpointing.budget_gb" in err and "less than or equal to 1000000" in err
    assert "Traceback" not in err
    assert main(["config", "show", CFG, "--set", f"memory.checkpointing.budget_gb={value}"]) == 2
    capsys.readouterr()


def test_memory_budget_bytes_never_overflow():
    """The conversion itself refuses what the CLI and the schema would (a config built past validation)."""
    import types

    from trainperf.errors import ConfigError
    from trainperf.memory.report import MAX_BUDGET_GB, _budget

    cfg = types.SimpleNamespace(memory=types.SimpleNamespace(checkpointing=types.SimpleNamespace(budget_gb=1e300)))
    with pytest.raises(ConfigError, match=r"memory.checkpointing.budget_gb=1e\+300 must be a positive number"):
        _budget(None, cfg, "cpu")
    for bad in (1e300, float("inf"), float("nan"), 0.0, -1.0):
        with pytest.raises(ConfigError, match="--budget-gb"):
            _budget(bad, cfg, "cpu")
    assert _budget(MAX_BUDGET_GB, cfg, "cpu") == (int(MAX_BUDGET_GB * 1e9), "--budget-gb")
    cfg.memory.checkpointing.budget_gb = 80.0
    assert _budget(None, cfg, "cpu") == (80 * 10**9, "memory.checkpointing.budget_gb")
