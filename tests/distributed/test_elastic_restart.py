"""Elastic restart: under ``torchrun --max-restarts 1`` a worker killed from outside (SIGKILL, found by its
RANK in the environment) brings the job back by itself: the restart resumes from the newest complete DCP
checkpoint and finishes with the final loss of an uninterrupted run (2 gloo ranks, CPU: exact, asserted
within 1e-6). The log names the failed rank and the step it was in.

The uninterrupted run goes through ``trainperf launch`` and runs at the same time as the killed one.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.distributed

REPO = Path(__file__).resolve().parents[2]
EVERY = 4
CONFIG = f"""\
run: {{name: elastic, steps: 32, seed: 3, log_every: 1, eval_every: 0, eval_batches: 1, sample_tokens: 0,
      progress: false}}
model: {{n_layer: 2, n_head: 4, n_embd: 64, block_size: 32, vocab_size: 64}}
data: {{source: synthetic}}
train: {{global_batch: 8, micro_batch: 4}}
checkpoint: {{every: {EVERY}, keep: 2}}
monitor: {{mfu: false}}
distributed: {{timeout_s: 10}}
"""


def _last_step(metrics: Path) -> int:
    try:
        lines = metrics.read_text().splitlines()
    except OSError:
        return 0
    steps = []
    for ln in lines:
        try:
            steps.append(int(json.loads(ln).get("step", 0)))
        except (ValueError, AttributeError):
            continue  # a line being written
    return max(steps, default=0)


def _worker(parent_pid: int, rank: str, attempt: str):
    import psutil

    for child in psutil.Process(parent_pid).children(recursive=True):
        try:
            env = child.environ()
        except psutil.Error:
            continue
        if env.get("RANK") == rank and env.get("TORCHELASTIC_RESTART_COUNT") == attempt:
            return child
    return None


def test_killed_rank_restarts_and_ends_with_the_uninterrupted_loss(tmp_path):
    pytest.importorskip("psutil")
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(CONFIG)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    common = [str(cfg), "--resume", "never"]
    ref_dir, run_dir = tmp_path / "ref", tmp_path / "run"
    ref = subprocess.Popen([sys.executable, "-m", "trainperf", "launch", "--nproc-per-node", "2", *common,
                            "--set", f"run.dir={ref_dir}"], cwd=REPO, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, start_new_session=True)
    job = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                            "--max-restarts", "1", "-m", "trainperf", "train", *common, "--set", f"run.dir={run_dir}"],
                           cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           start_new_session=True)
    try:
        killed_at = None
        deadline = time.monotonic() + 120
        while killed_at is None and job.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
            step = _last_step(run_dir / "metrics.jsonl")
            if step >= EVERY + 2:  # past the first checkpoint
                victim = _worker(job.pid, rank="1", attempt="0")
                if victim is not None:
                    victim.send_signal(signal.SIGKILL)
                    killed_at = step
        assert killed_at is not None, "the run ended before rank 1 could be killed"
        out, _ = job.communicate(timeout=150)
        ref_out, _ = ref.communicate(timeout=150)
    finally:
        for p in (job, ref):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    assert ref.returncode == 0, ref_out[-3000:]
    assert job.returncode == 0, out[-3000:]  # completed by itself after the restart
    # the log names the failed rank and the step it was in
    m = re.search(r"trainperf: rank 0 stopped at step (\d+): .*rank 1 died \(.*it was in step (\d+)\)", out)
    reports = [ln for ln in out.splitlines() if ln.startswith("trainperf: rank")]
    assert m, ("no report naming rank 1 dead; the ranks' reports:", reports, out[-1500:])
    assert int(m.group(2)) >= EVERY
    assert "train: restart 1 (torchrun --max-restarts): resuming from the newest complete checkpoint" in out
    summary = json.loads((run_dir / "summary.json").read_text())
    ref_summary = json.loads((ref_dir / "summary.json").read_text())
    assert summary["resumed_from"] is not None and summary["resumed_from"] >= EVERY
    assert summary["resumed_from"] % EVERY == 0 and summary["steps"] == ref_summary["steps"] == 32
    assert f"resume: continuing from the checkpoint of step {summary['resumed_from']}" in out
    print(f"killed rank 1 at step {m.group(2)}; resumed from {summary['resumed_from']}; final_loss "
          f"{summary['final_loss']!r} vs uninterrupted {ref_summary['final_loss']!r}")
    assert abs(summary["final_loss"] - ref_summary["final_loss"]) <= 1e-6, (summary["final_loss"],
                                                                             ref_summary["final_loss"])
