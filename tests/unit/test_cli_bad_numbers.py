"""Numbers on any command line: nan / inf and out-of-range counts are errors that name the flag and
exit 2 before any work starts (each of these once crashed with a traceback, hung, or ran on nan)."""

from __future__ import annotations

import pytest

from trainperf.cli import main

TRACE = "tests/data/real/tb-data/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz"


def _run(capsys, argv) -> tuple[int, str]:
    try:
        rc = main(argv)
    except SystemExit as exc:  # argparse's own type errors
        rc = exc.code
    return rc, capsys.readouterr().err


@pytest.mark.parametrize("argv,needle", [
    (["memory", "configs/gpt-tiny.yaml", "--budget-gb", "nan"], "--budget-gb nan: give a finite number"),
    (["tune", "configs/gpt-tiny.yaml", "--budget-min", "nan"], "--budget-min nan: give a finite number"),
    (["tune", "configs/gpt-tiny.yaml", "--budget-min", "inf"], "--budget-min inf: give a finite number"),
    (["bench", "balance", "--slowdown", "nan"], "--slowdown nan: give a finite number"),
    (["plan", "--model", "gpt2-124m", "--measured", "inf"], "--measured inf: give a finite number"),
    (["bench", "step", "configs/gpt-tiny.yaml", "--rounds", "0"], "argument --rounds: 0 is below 1"),
    (["bench", "step", "configs/gpt-tiny.yaml", "--steps", "0"], "argument --steps: 0 is below 1"),
    (["bench", "data", "--batch", "0"], "argument --batch: 0 is below 1"),
    (["bench", "data", "--epochs", "1"], "argument --epochs: 1 is below 2"),  # a cold and a warm epoch
    (["bench", "data", "--latency-ms", "-1"], "argument --latency-ms: -1 must be a finite number >= 0"),
    (["bench", "data", "--latency-ms", "nan"], "argument --latency-ms: nan must be a finite number >= 0"),
    (["bench", "traces", TRACE, "--repeat", "0"], "argument --repeat: 0 is below 1"),
    (["config", "show", "configs/gpt-tiny.yaml", "--world-size", "0"], "argument --world-size: 0 is below 1"),
    # data prepare once wrote 0 training tokens (--val-fraction 1 or 2) or 1 validation token (0 or -0.1)
    (["data", "prepare", "--src", "stdlib", "--out", "unused", "--val-fraction", "1"],
     "--val-fraction 1 must be between 0 and 1 (exclusive)"),
    (["data", "prepare", "--src", "stdlib", "--out", "unused", "--val-fraction", "-0.1"],
     "--val-fraction -0.1 must be between 0 and 1"),
    (["data", "prepare", "--src", "stdlib", "--out", "unused", "--max-bytes", "-5"], "--max-bytes -5 must be at least 1"),
    (["data", "export", "--src", "x", "--out", "y", "--seq-len", "8", "--max-samples", "0"],
     "argument --max-samples: 0 is below 1"),  # once exported 0 samples
    (["data", "export", "--src", "x", "--out", "y", "--seq-len", "8", "--shards", "0"], "argument --shards: 0 is below 1"),
    (["data", "inspect", "x", "--seq-len", "0"], "argument --seq-len: 0 is below 1"),  # was a traceback
    (["launch", "configs/gpt-tiny.yaml", "--node-rank", "-1", "--dry-run"], "--node-rank=-1 must be between 0 and"),
    (["launch", "configs/gpt-tiny.yaml", "--nnodes", "2", "--node-rank", "2", "--dry-run"], "--nnodes - 1 (1)"),
    (["launch", "configs/gpt-tiny.yaml", "--slurm", "--port", "70000", "--dry-run"], "--port=70000 must be a TCP port"),
    (["launch", "configs/gpt-tiny.yaml", "--slurm", "--cpus-per-task", "0", "--dry-run"],
     "--cpus-per-task=0 must be at least 1"),
    # a typo's extra digits: these once searched for ever (plan: divisors of 10**20 GPUs), ran a trial for ever
    # (tune --steps), or ended in a pydantic traceback (launch / tune: a world size past the config's bound)
    (["plan", "--model", "gpt2-124m", "--gpus", "99999999999999999999"], "--gpus: 99999999999999999999 is above"),
    (["plan", "--model", "gpt2-124m", "--global-batch", "99999999999999999999"], "--global-batch: 99999999999999999999 is above"),
    (["plan", "--hidden", "99999999999", "--layers", "2", "--heads", "1"], "--hidden: 99999999999 is above 1048576"),
    (["tune", "configs/gpt-tiny.yaml", "--steps", "99999999999999999999"], "--steps: 99999999999999999999 is above"),
    (["tune", "configs/gpt-tiny.yaml", "--steps", "0"], "argument --steps: 0 is below 1"),
    (["tune", "configs/gpt-tiny.yaml", "--nproc-per-node", "99999999999"], "--nproc-per-node: 99999999999 is above"),
    (["launch", "configs/gpt-tiny.yaml", "--nnodes", "99999999999999", "--dry-run"],
     "--nnodes x --nproc-per-node = 99999999999999 x 1 = 99999999999999 processes is above"),
    # each once crashed the bench's ranks (exit codes [1, 1], the error buried in a rank's output)
    (["bench", "balance", "--micro-steps", "0"], "argument --micro-steps: 0 is below 1"),
    (["bench", "balance", "--dim", "0"], "argument --dim: 0 is below 1"),
    (["bench", "balance", "--sync-every", "0"], "argument --sync-every: 0 is below 1"),
    (["bench", "balance", "--target-ratio", "0"], "argument --target-ratio: 0 must be a finite number > 0"),
    (["bench", "comm", "--steps", "0"], "argument --steps: 0 is below 1"),
    # launch values that went verbatim into the torchrun command or the sbatch script
    (["launch", "configs/gpt-tiny.yaml", "--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint", "host:99999",
      "--dry-run"], "--rdzv-endpoint 'host:99999': give HOST or HOST:PORT"),
    (["launch", "configs/gpt-tiny.yaml", "--slurm", "--time", "abc", "--dry-run"], "--time 'abc': not a Slurm time"),
    (["launch", "configs/gpt-tiny.yaml", "--slurm", "--job-name", "a;rm -rf x", "--dry-run"],
     "--job-name 'a;rm -rf x': use letters"),
    (["launch", "configs/gpt-tiny.yaml", "--slurm", "--output", "tests"], "--output 'tests' is a directory"),  # was a traceback
    (["diagnose", "/dev/null"], "/dev/null is not a regular file or a directory"),  # was NotADirectoryError
    (["report", "/dev/null"], "/dev/null is not a regular file or a directory"),
    (["diagnose", TRACE, "--top", "-1"], "argument --top: -1 is below 1"),  # was read as "all but the last"
    (["report", TRACE, "--top", "0"], "argument --top: 0 is below 1"),
    # an output path that cannot be written: was an IsADirectoryError / FileNotFoundError traceback
    (["report", TRACE, "--out", "tests"], "--out 'tests' is a directory; give a file name"),
    (["report", TRACE, "--out", "no/such/dir/r.html"], "directory"),
])
def test_bad_numbers_exit_2_naming_the_flag(capsys, argv, needle):
    rc, err = _run(capsys, argv)
    assert rc == 2 and needle in err and "Traceback" not in err, err


def test_the_finite_guard_names_a_flag_whose_dest_differs():
    from trainperf.cli import _option_for, build_parser

    parser = build_parser()
    assert _option_for(parser, "budget_min") == "--budget-min"
    assert _option_for(parser, "nproc") == "--nproc-per-node"
    assert _option_for(parser, "no_such_dest") is None


@pytest.mark.parametrize("argv", [
    ["tune", "configs/gpt-tiny.yaml", "--out", "{blocker}"],
    ["data", "prepare", "--src", "stdlib", "--out", "{blocker}"],
    ["data", "prepare", "--src", "stdlib", "--out", "{blocker}/sub"],
    ["data", "export", "--src", "{blocker}", "--out", "{blocker}", "--seq-len", "8"],
])
def test_an_output_directory_with_a_file_in_the_way_exits_2(tmp_path, capsys, argv):
    # each once a FileExistsError / NotADirectoryError traceback
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    if argv[1] == "export":  # export reads --src first: give it prepared tokens
        from trainperf.cli import main as _main

        assert _main(["data", "prepare", "--src", "stdlib", "--out", str(tmp_path / "tok"), "--max-bytes", "200000"]) == 0
        argv = list(argv)
        argv[argv.index("--src") + 1] = str(tmp_path / "tok")
        capsys.readouterr()
    rc, err = _run(capsys, [a.replace("{blocker}", str(blocker)) for a in argv])
    assert rc == 2 and "--out" in err and ("is a file, not a directory" in err or "cannot be created" in err), err
    assert "Traceback" not in err


def test_a_split_left_with_a_single_token_is_refused_and_nothing_is_written(tmp_path, capsys):
    # --val-fraction 1e-300 once prepared 1 validation token (an evaluation of nothing)
    out = tmp_path / "tokens"
    rc, err = _run(capsys, ["data", "prepare", "--src", "stdlib", "--out", str(out), "--val-fraction", "1e-300",
                            "--max-bytes", "200000"])
    assert rc == 2 and "leaves 0 validation and" in err and "use a fraction in [" in err, err
    assert not out.exists()  # a refused command leaves no directory behind
    rc, err = _run(capsys, ["data", "prepare", "--src", "stdlib", "--out", str(out), "--val-fraction", "2"])
    assert rc == 2 and not out.exists()
