"""A rank that dies or hangs ends the whole job within distributed.timeout_s, exit non-zero, with a
message naming the failed rank and the step (torchrun, 2 gloo processes, the real `trainperf train`).

Fault injection: TRAINPERF_FAULT=exit|hang on rank 1 at the start of step 3 (0-based steps done).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.distributed

TIMEOUT_S = 6
CONFIG = """\
run: {name: fail, steps: 20, seed: 1, log_every: 1, eval_every: 0, eval_batches: 1, sample_tokens: 0, progress: false}
model: {n_layer: 2, n_head: 4, n_embd: 64, block_size: 32, vocab_size: 64}
data: {source: synthetic}
train: {global_batch: 8, micro_batch: 4}
checkpoint: {every: 0, at_end: false}
monitor: {mfu: false}
"""


def _run(tmp_path, fault: str, config: str = CONFIG):
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(config)
    env = dict(os.environ, OMP_NUM_THREADS="1", TRAINPERF_FAULT=fault, TRAINPERF_FAULT_RANK="1",
               TRAINPERF_FAULT_STEP="3")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "trainperf", "train", str(cfg), "--resume", "never", "--set", f"run.dir={tmp_path / 'run'}",
           "--set", f"distributed.timeout_s={TIMEOUT_S}"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    end = time.time()
    out = proc.stdout + proc.stderr
    m = re.search(r"injected fault '\w+' on rank 1 at step 3 \(t=([\d.]+)\)", out)
    assert m, out[-3000:]
    return proc, end - float(m.group(1)), out




def test_hung_rank_ends_the_job_with_a_named_report(tmp_path):
    proc, elapsed, out = _run(tmp_path, "hang")
    assert proc.returncode != 0
    report = [ln for ln in out.splitlines() if ln.startswith("trainperf: rank 0 stopped at step 3")]
    assert report, out[-3000:]
    assert re.search(r"rank 1 hung \(alive, stuck in step 3 for [\d.]+s\)", report[0]), report[0]
    assert f"distributed.timeout_s={TIMEOUT_S}" in report[0]
    # from the fault to the end of the whole job (torchrun included): the timeout plus a margin
    assert elapsed < TIMEOUT_S + 15, elapsed


def test_killed_rank_ends_the_job_with_a_named_report(tmp_path):
    proc, elapsed, out = _run(tmp_path, "exit")
    assert proc.returncode != 0
    report = [ln for ln in out.splitlines() if ln.startswith("trainperf: rank 0 stopped at step 3")]
    assert report, out[-3000:]
    assert re.search(r"rank 1 died \(no sign of life for [\d.]+s; it was in step 3\)", report[0]), report[0]
    assert elapsed < TIMEOUT_S + 15, elapsed


def test_a_failed_job_tells_diagnose_which_rank_ended_it(tmp_path):
    """The fail-fast report went to stderr only; `trainperf diagnose RUN_DIR` afterwards said nothing of it."""
    from trainperf.diagnosis.engine import diagnose

    proc, _, out = _run(tmp_path, "exit")
    assert proc.returncode != 0
    lines = (tmp_path / "run" / "failures.jsonl").read_text().splitlines()
    assert lines and any('"rank": 0' in ln and "rank 1 died" in ln for ln in lines), lines
    notes = diagnose(tmp_path / "run")["run_notes"]
    assert any(n.startswith("failure: rank 0 stopped at step 3") and "rank 1 died" in n for n in notes), notes


def test_a_rank_killed_inside_a_dcp_checkpoint_ends_the_job_with_a_named_report(tmp_path):
    """TRAINPERF_FAULT_KILL_IN_CHECKPOINT reached only the one-process checkpointer: under sharded (DCP)
    checkpoints the fault was dropped and the run finished. Rank 1 now SIGKILLs itself once its step-4 shards
    are written; rank 0 names it in the fail-fast report, and the step-4 checkpoint is never marked complete."""
    from trainperf.distributed.checkpoint import latest, list_checkpoints

    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(CONFIG.replace("checkpoint: {every: 0, at_end: false}", "checkpoint: {every: 2, at_end: false}"))
    env = dict(os.environ, OMP_NUM_THREADS="1", TRAINPERF_FAULT_KILL_IN_CHECKPOINT="4", TRAINPERF_FAULT_RANK="1")
    env.pop("TRAINPERF_FAULT", None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "trainperf", "train", str(cfg), "--resume", "never", "--set", f"run.dir={tmp_path / 'run'}",
           "--set", f"distributed.timeout_s={TIMEOUT_S}"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    out = proc.stdout + proc.stderr
    m = re.search(r"injected fault 'kill in checkpoint' on rank 1 at step 4 \(t=([\d.]+)\)", out)
    assert m, out[-3000:]
    elapsed = time.time() - float(m.group(1))
    assert proc.returncode != 0
    report = [ln for ln in out.splitlines() if ln.startswith("trainperf: rank 0 stopped at step")]
    assert report, out[-3000:]
    assert re.search(r"rank 1 died \(no sign of life for [\d.]+s; it was in step \d\)", report[0]), report[0]
    assert elapsed < TIMEOUT_S + 15, elapsed
    ckpts = tmp_path / "run" / "checkpoints"
    assert [s for s, _ in list_checkpoints(ckpts)] == [2]  # step 4: shards, but no COMPLETE marker
    assert (ckpts / "step-00000004").is_dir() and not (ckpts / "step-00000004" / "COMPLETE").exists()
    assert latest(ckpts).name == "step-00000002"


def test_a_fault_under_dcp_checkpoints_ends_the_job_with_a_named_report(tmp_path):
    """TRAINPERF_FAULT under sharded (DCP) checkpoints, saved every 2 steps: the fault fires at step 3 as without
    checkpoints (the heartbeat injects it at every step's start, whichever checkpointer the run has)."""
    from trainperf.distributed.checkpoint import list_checkpoints

    proc, elapsed, out = _run(tmp_path, "exit", CONFIG.replace("checkpoint: {every: 0,", "checkpoint: {every: 2,"))
    assert proc.returncode != 0
    report = [ln for ln in out.splitlines() if ln.startswith("trainperf: rank 0 stopped at step 3")]
    assert report and re.search(r"rank 1 died", report[0]), out[-3000:]
    assert elapsed < TIMEOUT_S + 15, elapsed
    assert [s for s, _ in list_checkpoints(tmp_path / "run" / "checkpoints")] == [2]
