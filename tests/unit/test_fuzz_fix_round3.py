"""Inputs found by the third fuzzing round of the commands (launch, memory, bench, report, config): each lost
data, crashed, hung or said something wrong. Each test holds the fixed behaviour."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from trainperf.cli import main

ROOT = Path(__file__).resolve().parents[2]
CFG = str(ROOT / "configs/gpt-tiny.yaml")
SLURM = ["--slurm", "--nnodes", "2", "--nproc-per-node", "2", "--set", "train.global_batch=auto"]


def _rc_err(capsys, *argv) -> tuple[int, str]:
    rc = main(list(argv))
    cap = capsys.readouterr()
    assert "Traceback" not in cap.err
    return rc, cap.out + cap.err


# ------------------------------------------------------------------------- 1. launch --slurm --output
def test_launch_output_never_replaces_the_config_or_a_file_it_did_not_write(tmp_path, capsys):
    cfg = tmp_path / "cfg.yaml"
    shutil.copy(CFG, cfg)
    before = cfg.read_bytes()
    rc, text = _rc_err(capsys, "launch", str(cfg), *SLURM, "--output", str(cfg))
    assert rc == 2 and "is the config being launched" in text and cfg.read_bytes() == before
    mine = tmp_path / "notes.html"
    mine.write_text("<html>mine</html>")
    rc, text = _rc_err(capsys, "launch", str(cfg), *SLURM, "--output", str(mine))
    assert rc == 2 and "is not an sbatch script `trainperf launch` wrote" in text
    assert mine.read_text() == "<html>mine</html>"
    job = tmp_path / "job.sbatch"
    assert _rc_err(capsys, "launch", str(cfg), *SLURM, "--output", str(job))[1].startswith("wrote ")
    rc, text = _rc_err(capsys, "launch", str(cfg), *SLURM, "--output", str(job))  # its own script: replaced
    assert rc == 0 and text.startswith(f"replaced {job}")
    assert "#SBATCH --nodes=2" in job.read_text()


def test_launch_warns_when_cpu_ranks_outnumber_the_usable_cpus(capsys, monkeypatch):
    import os

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    with pytest.warns(UserWarning, match=r"--nproc-per-node 8 x run.threads=1 = 8 threads on 2 usable CPU\(s\)"):
        assert main(["launch", CFG, "--dry-run", "--nproc-per-node", "8", "--set", "train.global_batch=auto"]) == 0
    capsys.readouterr()


# ------------------------------------------------------------------------- 2. memory --measure
def test_memory_measure_refuses_a_micro_batch_its_estimate_says_cannot_fit(capsys, monkeypatch):
    """micro_batch=100000 (447 GB by the estimate, 24 GB available) was measured anyway: the kernel killed it."""
    from trainperf.memory import report

    monkeypatch.setattr(report, "_device_budget", lambda device: (int(4e9), "test host"))
    rc, text = _rc_err(capsys, "memory", CFG, "--measure", "--reps", "1", "--set", "train.micro_batch=100000",
                       "--set", "train.global_batch=100000")
    assert rc == 2 and "--measure would run micro_batch=100000 in mode 'none' with 5 copies of the model" in text
    assert "above 4.00 GB (test host)" in text
    mb = int(text.split("lower train.micro_batch to ")[1].split()[0])
    assert 1 <= mb < 100000
    # the estimate alone needs no memory and still runs
    rc, text = _rc_err(capsys, "memory", CFG, "--set", "train.micro_batch=100000", "--set", "train.global_batch=100000")
    assert rc == 0


def test_memory_measure_turns_an_allocation_failure_into_one_line(capsys, monkeypatch):
    from trainperf.memory import report

    def boom(*a, **k):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory: you "
                           "tried to allocate 6553600000 bytes")
    monkeypatch.setattr(report, "memory_report", boom)
    rc, text = _rc_err(capsys, "memory", CFG, "--measure")
    assert rc == 2 and "--measure ran out of memory ([enforce fail" in text and "leave out --measure" in text


# ------------------------------------------------------------------------- 3, 4, 7. bench arguments
@pytest.mark.parametrize("argv,says", [
    (["bench", "data", "--quick", "--compute-ms", "0"], "must be a finite number >= 1"),       # ran for minutes
    (["bench", "data", "--quick", "--compute-ms", "0.001"], "must be a finite number >= 1"),
    (["bench", "data", "--item-kb", "1e9"], "must be at most 1.04858e+06"),                    # numpy traceback
])
def test_bench_data_arguments_that_hung_or_crashed_exit_2(capsys, argv, says):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2 and says in capsys.readouterr().err


def test_bench_data_cache_dir_that_is_a_file_exits_2(tmp_path, capsys):
    f = tmp_path / "afile"
    f.write_text("x")
    rc, text = _rc_err(capsys, "bench", "data", "--quick", "--only", "hybrid", "--cache-dir", str(f))
    assert rc == 2 and "--cache-dir" in text and "is a file, not a directory" in text


@pytest.mark.parametrize("what", ["file", "dir"])
def test_bench_traces_hta_python_that_cannot_run_exits_2(tmp_path, capsys, what):
    target = tmp_path / "p"
    target.mkdir() if what == "dir" else target.write_text("not a program")
    trace = ROOT / "tests/data/traces/cpu_only_gen_lines_us.json.gz"
    rc, text = _rc_err(capsys, "bench", "traces", str(trace), "--hta-python", str(target))
    assert rc == 2 and "not a Python interpreter" in text


def test_bench_step_refuses_an_unknown_variant_before_preparing_data(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rc, text = _rc_err(capsys, "bench", "step", CFG, "--variants", "bogus")
    assert rc == 2 and "--variants 'bogus' is unknown" in text
    assert list(tmp_path.iterdir()) == []  # it wrote 31 MB of data into the working directory first


# ------------------------------------------------------------------------- 5, 6. report --out
def _run_dir(tmp_path) -> Path:
    from tests.unit.test_compare import config, write_run

    return write_run(tmp_path / "run", step_s=0.1, config=config(False, d="run"))


def test_report_never_replaces_html_trainperf_did_not_write(tmp_path, capsys):
    run = _run_dir(tmp_path)
    mine = tmp_path / "mine.html"
    mine.write_text("<html><body>my precious notes</body></html>")
    rc, text = _rc_err(capsys, "report", str(run), "--out", str(mine))
    assert rc == 2 and "is an HTML page trainperf did not write" in text
    assert "precious" in mine.read_text()
    ours = tmp_path / "ours.html"
    assert _rc_err(capsys, "report", str(run), "--out", str(ours))[0] == 0
    assert '<meta name="generator" content="trainperf">' in ours.read_text()
    assert _rc_err(capsys, "report", str(run), "--out", str(ours))[0] == 0  # its own page: replaced
    assert "None" not in ours.read_text().split("<body>")[1].replace("none booked", "")


def test_report_out_with_a_trailing_slash_is_not_written_as_a_file(tmp_path, capsys):
    run = _run_dir(tmp_path)
    rc, text = _rc_err(capsys, "report", str(run), "--out", str(tmp_path / "newdir") + "/")
    assert rc == 2 and "ends with '/'" in text and not (tmp_path / "newdir").exists()


# ------------------------------------------------------------------------- 9, 10, 11. config values
@pytest.mark.parametrize("yaml_text,says", [
    ("train: {global_batch: 010}\n", "'010' (line 1) is read by YAML 1.1 as octal (8); write 10 without the leading zero"),
    ("run: {steps: 1:30}\n", "'1:30' (line 1) is read by YAML 1.1 as a base-60 number (90)"),
])
def test_yaml_11_octal_and_base_60_numbers_are_refused(tmp_path, capsys, yaml_text, says):
    p = tmp_path / "c.yaml"
    p.write_text(yaml_text)
    rc, text = _rc_err(capsys, "config", "show", str(p))
    assert rc == 2 and says in text
    rc, text = _rc_err(capsys, "config", "show", CFG, "--set", "run.steps=010")
    assert rc == 2 and "--set run.steps: '010'" in text


def test_plain_hex_and_zero_still_read_as_numbers(capsys):
    from trainperf.config import load_config

    assert load_config(CFG, ["run.steps=0x10", "run.seed=0"]).run.steps == 16


def test_an_infinite_integer_gets_no_advice_to_write_inf(capsys):
    rc, text = _rc_err(capsys, "config", "show", CFG, "--set", "run.steps=1e400")
    assert rc == 2 and "write it as inf" not in text and "set run.steps to a whole number >= 1" in text


def test_an_empty_config_file_is_said_to_hold_no_settings(tmp_path, capsys):
    p = tmp_path / "empty.yaml"
    p.write_text("# nothing yet\n")
    with pytest.warns(UserWarning, match="empty.yaml holds no settings"):
        assert main(["config", "show", str(p)]) == 0
    capsys.readouterr()


# ------------------------------------------------------------------------- 8. compare
def test_compare_says_a_run_did_not_finish_and_that_a_short_run_has_no_steady_steps(tmp_path, capsys):
    from tests.unit.test_compare import config, write_run

    a = write_run(tmp_path / "a", step_s=0.1, config=config(False, d="a"))
    killed = write_run(tmp_path / "killed", step_s=0.1, config=config(False, d="killed"))
    (killed / "summary.json").unlink()
    one = write_run(tmp_path / "one", step_s=0.1, n=1, config=config(False, d="one"))
    rc, text = _rc_err(capsys, "compare", str(a), str(killed), str(one))
    assert rc == 0
    assert ("B did not finish (no summary.json): its last step record is step 20 of run.steps=20; its 'final "
            "loss' is the last logged one") in text
    assert "C has 1 step record(s): no steady steps after warm-up" in text
    assert "A did not finish" not in text and "A has" not in text


# ------------------------------------------------------------------------- 13. a 64-rank chart
def test_a_bar_chart_of_64_ranks_labels_every_fourth_and_no_values_on_top():
    import re

    from trainperf.monitor import charts as C

    cats = [f"rank {i}" for i in range(64)]
    svg = C.stacked_bars(cats, [("compute", [1.0 + i / 64 for i in range(64)], "#123456")], title="t", ylabel="ms")
    labels = re.findall(r'font-size="11">(rank \d+)</text>', svg)
    assert labels == [f"rank {i}" for i in range(0, 64, 4)]
    assert svg.count("<rect") == 64 + 3  # the bars, the background, the frame and the legend box
    few = C.stacked_bars(cats[:4], [("compute", [1, 2, 3, 4], "#123456")], title="t", ylabel="ms")
    assert re.findall(r'font-size="11">(rank \d+)</text>', few) == cats[:4]


def test_compare_shows_a_null_or_absent_key_as_the_default(tmp_path, capsys):
    """model.n_layer null (the preset's 4) against 2 read '(absent) -> 2', hiding that the preset applied."""
    from tests.unit.test_compare import config, write_run

    ca, cb = config(False, d="a"), config(False, d="b")
    ca["model"], cb["model"] = {"preset": "gpt-tiny", "n_layer": None}, {"preset": "gpt-tiny", "n_layer": 2}
    a = write_run(tmp_path / "a", step_s=0.1, config=ca)
    b = write_run(tmp_path / "b", step_s=0.1, config=cb)
    rc, text = _rc_err(capsys, "compare", str(a), str(b))
    assert rc == 0 and "model.n_layer (default) -> 2" in text and "(absent)" not in text


def test_launch_names_the_rank_that_failed_first(monkeypatch, capsys):
    """rank 1 was killed; rank 0 then ended through fail-fast; the last line said 'rank 0 ended ...'."""
    import torch.distributed.run as torchrun
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    from trainperf.cli.launch import run_torchrun

    def failure(rank, code, ts):
        f = ProcessFailure(local_rank=rank, pid=1000 + rank, exitcode=code, error_file="")
        f.timestamp = ts
        return f

    def boom(args):
        raise ChildFailedError("trainperf", {0: failure(0, 1, 200), 1: failure(1, -9, 100)})
    monkeypatch.setattr(torchrun, "run", boom)
    monkeypatch.setattr(torchrun, "parse_args", lambda argv: argv)
    assert run_torchrun(["--nproc-per-node=2", "-m", "trainperf", "train", "x.yaml"]) == 1
    err = capsys.readouterr().err
    assert "rank 1 ended first, with signal SIGKILL" in err and "rank(s) 0 ended after it" in err


@pytest.mark.parametrize("sets,says", [
    (["parallelism.pipeline=2", "parallelism.interleave=2", "parallelism.pipeline_schedule=gpipe"],
     "parallelism.interleave=2 applies to pipeline_schedule: interleaved_1f1b only (got 'gpipe'"),
    (["parallelism.pipeline=2", "parallelism.interleave=4", "parallelism.pipeline_schedule=1f1b",
      "parallelism.microbatches=2"], "parallelism.interleave=4 applies to pipeline_schedule: interleaved_1f1b"),
    (["parallelism.sequence_parallel=true"], "parallelism.sequence_parallel=true needs parallelism.tensor >= 2"),
])
def test_layout_options_that_were_silently_ignored_are_refused(capsys, monkeypatch, sets, says):
    """interleave=2 with gpipe was ignored, interleave=4 refused with 'choose pipeline <= 1'; sequence_parallel
    without tensor parallelism was ignored."""
    from trainperf.config import load_config
    from trainperf.train.resolve import resolve
    from trainperf.errors import ConfigError

    world = 2 if any("pipeline" in s for s in sets) else 1
    cfg = load_config(CFG, [*sets, "train.global_batch=auto"])
    with pytest.raises(ConfigError, match=None) as exc:
        resolve(cfg, world_size=world)
    assert says in str(exc.value), str(exc.value)
