"""The distributed command line: bad layouts rejected before any work (exit 2), `trainperf launch`
(torchrun wrapper and Slurm script), `trainperf bench comm`, and the acceptance run
(torchrun, 4 processes, data=2 x tensor=2, final_loss within 1e-3 relative of one process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainperf.cli import main

REPO = Path(__file__).resolve().parents[2]
TINY = """\
run: {name: t, steps: 4, seed: 7, log_every: 2, eval_every: 0, eval_batches: 1, sample_tokens: 0, progress: false}
model: {n_layer: 2, n_head: 4, n_embd: 64, block_size: 32, vocab_size: 64}
data: {source: synthetic}
train: {global_batch: 8, micro_batch: 4}
checkpoint: {every: 0, at_end: false}
monitor: {mfu: false}
"""


@pytest.fixture()
def cfg(tmp_path):
    p = tmp_path / "tiny.yaml"
    p.write_text(TINY)
    return str(p)


# ---------------------------------------------------------------------- bad input: exit 2 before work
@pytest.mark.parametrize("world,sets,needle", [
    ("4", ["parallelism.data=3", "parallelism.tensor=2"], "= 6, but the world size is 4"),
    ("3", ["parallelism.tensor=3"], "parallelism.tensor=3 does not divide model.n_head=4"),
    ("4", ["parallelism.pipeline=4"], "exceeds model.n_layer=2"),
    ("2", ["parallelism.data=1", "parallelism.data_shard=2", "parallelism.compression.type=powersgd"],
     "FSDP2, which has no hooks"),
    ("4", ["parallelism.data=2", "parallelism.tensor=2", "parallelism.compression.type=fp16"],
     "no DDP communication hooks"),
])
def test_bad_layout_is_rejected_before_work(cfg, monkeypatch, capsys, world, sets, needle):
    monkeypatch.setenv("WORLD_SIZE", world)  # as under torchrun; no process group is ever created
    argv = ["train", cfg, "--resume", "never"]
    for s in sets:
        argv += ["--set", s]
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2, err
    assert needle in err
    import torch.distributed as dist

    assert not dist.is_initialized()


def test_launch_rejects_a_bad_layout(cfg, capsys):
    rc = main(["launch", "--nproc-per-node", "4", cfg, "--set", "parallelism.data=3", "--dry-run"])
    assert rc == 2
    assert "world size is 4" in capsys.readouterr().err


def test_launch_wraps_torchrun(cfg, capsys):
    rc = main(["launch", "--nproc-per-node", "4", cfg, "--set", "parallelism.tensor=2", "--dry-run"])
    out = capsys.readouterr().out.strip()
    assert rc == 0
    assert "-m torch.distributed.run --nproc-per-node=4 --standalone -m trainperf train" in out
    assert out.endswith("--set parallelism.tensor=2")
    rc = main(["launch", "--nproc-per-node", "8", "--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint",
               "head:29400", cfg, "--set", "train.global_batch=auto", "--dry-run"])  # 8 cannot split over data 16
    out = capsys.readouterr().out
    assert "--nnodes=2 --rdzv-backend=c10d --rdzv-endpoint=head:29400 --node-rank=1" in out


def test_launch_slurm_writes_an_sbatch_script(cfg, tmp_path, capsys):
    script = tmp_path / "job.sbatch"
    rc = main(["launch", "--slurm", "--nnodes", "4", "--nproc-per-node", "8", "--partition", "gpu",
               "--time", "02:00:00", "--job-name", "gpt", "--output", str(script), cfg,
               "--set", "parallelism.tensor=4", "--set", "parallelism.pipeline=2", "--set", "train.global_batch=auto"])
    assert rc == 0
    text = script.read_text()
    assert text.startswith("#!/bin/bash\n")
    for line in ["#SBATCH --job-name=gpt", "#SBATCH --nodes=4", "#SBATCH --ntasks-per-node=1",
                 "#SBATCH --gpus-per-node=8", "#SBATCH --time=02:00:00", "#SBATCH --partition=gpu",
                 "export TORCH_NCCL_ASYNC_ERROR_HANDLING=3"]:
        assert line in text.splitlines(), line
    assert "NCCL_ASYNC_ERROR_HANDLING=0" not in text
    assert 'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)' in text
    assert '--rdzv-endpoint="$head_node:29500"' in text
    assert text.rstrip().endswith(f"-m trainperf train {cfg} --set parallelism.tensor=4 --set parallelism.pipeline=2 "
                                  "--set train.global_batch=auto")
    assert os.access(script, os.X_OK)
    # 4 x 8 = 32 processes: tensor 4 x pipeline 2 leaves data 4 (checked against the model before writing);
    # the file's global batch 8 cannot split over data 4 x 8 pipeline micro-batches: refused before writing
    rc = main(["launch", "--slurm", "--nnodes", "4", "--nproc-per-node", "8", "--output", str(tmp_path / "x"), cfg,
               "--set", "parallelism.tensor=4", "--set", "parallelism.pipeline=2"])
    err = capsys.readouterr().err
    assert rc == 2 and "raise train.global_batch to 32" in err and "lower parallelism.microbatches to 2" in err
    assert not (tmp_path / "x").exists()


def test_bench_comm_is_registered(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "comm", "--help"])
    assert "bytes" in capsys.readouterr().out


# ---------------------------------------------------------------------- acceptance (4 processes)
@pytest.mark.distributed
@pytest.mark.slow
def test_torchrun_data2_tensor2_final_loss_matches_one_process(tmp_path):
    """configs/gpt-tiny.yaml shortened to 6 steps: the README's acceptance command."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    common = ["configs/gpt-tiny.yaml", "--resume", "never", "--set", "run.steps=6", "--set", "run.eval_every=0",
              "--set", "run.eval_batches=1", "--set", "run.sample_tokens=0", "--set", "checkpoint.every=0",
              "--set", "run.progress=false"]
    one = subprocess.run([sys.executable, "-m", "trainperf", "train", *common, "--set", f"run.dir={tmp_path / 'one'}"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert one.returncode == 0, one.stderr[-3000:]
    four = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4",
                           "-m", "trainperf", "train", *common, "--set", f"run.dir={tmp_path / 'four'}",
                           "--set", "parallelism.data=2", "--set", "parallelism.tensor=2"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=400)
    assert four.returncode == 0, four.stderr[-3000:]
    one_s = json.loads((tmp_path / "one" / "summary.json").read_text())
    four_s = json.loads((tmp_path / "four" / "summary.json").read_text())
    for key in ("final_loss", "val_loss"):  # evaluation uses the same batches as one process
        a, b = one_s[key], four_s[key]
        assert abs(a - b) <= 1e-3 * abs(a), (key, a, b)


@pytest.mark.distributed
@pytest.mark.slow
def test_trainer_resumes_a_dcp_checkpoint_on_another_layout(tmp_path, cfg):
    """`trainperf train` under torchrun: a 6-step run at data=2 that saves at step 3 and is killed at
    step 4 (fault injection), resumed in the same run directory at tensor=2, ends on the final loss of
    an uninterrupted data=2 run (1e-4 relative, fp32)."""
    def run(run_dir, *sets, resume="never", fault=None):
        env = dict(os.environ, OMP_NUM_THREADS="1")
        if fault:
            env.update(TRAINPERF_FAULT="exit", TRAINPERF_FAULT_RANK="1", TRAINPERF_FAULT_STEP=str(fault))
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               "-m", "trainperf", "train", cfg, "--resume", resume, "--set", f"run.dir={run_dir}",
               "--set", "run.steps=6", "--set", "distributed.timeout_s=20"]
        for s in sets:
            cmd += ["--set", s]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        if fault:
            assert proc.returncode != 0
            return None
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads((Path(run_dir) / "summary.json").read_text())

    full = run(tmp_path / "a", "parallelism.data=2")
    run(tmp_path / "b", "parallelism.data=2", "checkpoint.every=3", fault=4)
    assert (tmp_path / "b" / "checkpoints" / "step-00000003" / "COMPLETE").exists()
    resumed = run(tmp_path / "b", "parallelism.data=1", "parallelism.tensor=2", resume="auto")
    assert resumed["resumed_from"] == 3 and resumed["steps"] == 6
    assert abs(resumed["final_loss"] - full["final_loss"]) <= 1e-4 * abs(full["final_loss"])


# ---------------------------------------------------------------------- refusals: one message, exit 2
def test_refusal_under_torchrun_is_printed_by_rank_0_only(cfg, monkeypatch, capsys):
    argv = ["train", cfg, "--set", "parallelism.tensor=3"]  # refused on every rank before any process group
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(SystemExit) as exit_1:
        main(argv)
    assert exit_1.value.code == 2 and capsys.readouterr().err == ""  # silent
    monkeypatch.setenv("RANK", "0")
    assert main(argv) == 2
    assert "does not divide model.n_head=4" in capsys.readouterr().err


def test_launch_passes_max_restarts(cfg, capsys):
    assert main(["launch", "--nproc-per-node", "2", "--max-restarts", "3", cfg, "--dry-run"]) == 0
    assert "--standalone --max-restarts=3 -m trainperf train" in capsys.readouterr().out
    assert main(["launch", "--nproc-per-node", "2", "--max-restarts", "-1", cfg, "--dry-run"]) == 2


@pytest.mark.distributed
def test_launch_worker_refusal_is_one_message_and_exit_2(tmp_path):
    """A refusal only the workers can find (the data directory) ends launch with exit 2 and rank 0's
    message, without torchrun's ChildFailedError traceback."""
    p = tmp_path / "c.yaml"
    p.write_text(TINY.replace("data: {source: synthetic}", f"data: {{path: {tmp_path / 'nowhere'}, prepare_from: null}}"))
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-m", "trainperf", "launch", "--nproc-per-node", "2", str(p)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[-3000:]
    assert out.count("holds no prepared tokens") == 1, out
    assert "Traceback" not in out and "ChildFailedError" not in out, out
    assert "trainperf launch: stopped: the run was refused" in out


def test_launch_names_a_divergence_and_suggests_no_restart(tmp_path):
    """A rank whose loss diverges exits 1 like any failure; its error file (torchrun's, written as @record
    does) tells launch it diverged, so launch says so and does not suggest --max-restarts (a restart from
    the newest checkpoint would diverge again)."""
    p = tmp_path / "c.yaml"
    p.write_text(TINY.replace("run: {name: t,", f"run: {{dir: {tmp_path / 'run'}, name: t,")
                 + "optimizer: {lr: 1.0e+6}\nprecision: {dtype: fp32}\n")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-m", "trainperf", "launch", "--nproc-per-node", "2", str(p)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]
    assert "training diverged" in out and "trainperf launch: failed: the loss diverged on rank" in out, out[-3000:]
    assert "--max-restarts N restarts" not in out and "Traceback" not in out, out[-3000:]


def test_one_process_resumes_a_sharded_checkpoint_of_a_distributed_run(tmp_path):
    """The docs say a DCP checkpoint resumes in one process; `trainperf train` in one process started over
    instead (its single-file checkpointer did not look at DCP directories) (fuzzing)."""
    p = tmp_path / "c.yaml"
    p.write_text(TINY.replace("run: {name: t,", f"run: {{dir: {tmp_path / 'run'}, name: t,")
                 .replace("checkpoint: {every: 0, at_end: false}", "checkpoint: {every: 2, at_end: false}"))
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-m", "trainperf", "launch", "--nproc-per-node", "2", str(p),
                           "--set", "parallelism.data=1", "--set", "parallelism.data_shard=2"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert (tmp_path / "run" / "checkpoints" / "step-00000002" / "COMPLETE").is_file()  # at_end: false
    one = subprocess.run([sys.executable, "-m", "trainperf", "train", str(p), "--set", "run.steps=6"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
    out = one.stdout + one.stderr
    assert one.returncode == 0, out[-3000:]
    assert "resume: step 2 from the sharded checkpoint" in out and "starting over" not in out, out[-3000:]
    steps = [json.loads(x)["step"] for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
             if '"step_time_s"' in x]
    assert steps == [1, 2, 3, 4, 5, 6], steps  # 1-2 from the distributed run, 3-6 resumed: none twice
