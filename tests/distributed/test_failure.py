"""A rank that dies or hangs ends the whole job within distributed.timeout_s, exit non-zero, with a
message naming the failed rank and the step (torchrun, 2 gloo processes, the real `trainperf train`).

Fault injection: TRAINPERF_FAULT=exit|hang|stop|collective on rank 1 at the start of step 3 (0-based steps done).
"""

from __future__ import annotations

import os
import re
import signal
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


def test_a_rank_stuck_in_a_collective_is_named_and_the_job_ends_within_the_timeout(tmp_path):
    """Rank 1 waits in a receive rank 0 never sends (TRAINPERF_FAULT=collective) while rank 0 waits for it in
    the step's all-reduce: both time out, rank 0 names rank 1, and the job ends within the timeout + 5 s."""
    proc, elapsed, out = _run(tmp_path, "collective")
    assert proc.returncode != 0
    report = [ln for ln in out.splitlines() if ln.startswith("trainperf: rank 0 stopped at step 3")]
    assert report, out[-3000:]
    assert re.search(r"rank 1 hung \(alive, stuck in step 3 for [\d.]+s\)", report[0]), report[0]
    assert elapsed < TIMEOUT_S + 5, elapsed


def test_a_failed_job_tells_diagnose_which_rank_ended_it(tmp_path):
    """The fail-fast report went to stderr only; `trainperf diagnose RUN_DIR` afterwards said nothing of it."""
    from trainperf.diagnosis.engine import diagnose

    proc, _, out = _run(tmp_path, "exit")
    assert proc.returncode != 0
    lines = (tmp_path / "run" / "failures.jsonl").read_text().splitlines()
    assert lines and any('"rank": 0' in ln and "rank 1 died" in ln for ln in lines), lines
    notes = diagnose(tmp_path / "run")["run_notes"]
    assert any(n.startswith("failure: rank 0 stopped at step 3") and "rank 1 died" in n for n in notes), notes


STOP_TIMEOUT_S = 10


def _cont_kill(pid: int) -> None:
    """The test's clean-up: a process of this job still there (stopped or not) is continued, then killed."""
    from trainperf.distributed.failure import process_state

    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if b"trainperf" not in f.read():
                return  # not ours (the pid was reused)
    except OSError:
        return
    if process_state(pid) not in ("gone", "Z"):
        for sig in (signal.SIGCONT, signal.SIGKILL):
            try:
                os.kill(pid, sig)
            except OSError:
                pass


def test_a_stopped_rank_is_named_and_the_job_ends_within_the_timeout(tmp_path):
    """A SIGSTOPped (frozen) rank cannot run its own threads, nor act on torchrun's SIGTERM (torchrun then waits
    30 s before SIGKILL): rank 0 names it frozen / stopped after the collective timeout and ends its process,
    so the whole job ends within distributed.timeout_s + 5 s of the stop, and no stopped process is left."""
    import threading

    from trainperf.distributed.failure import process_state

    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(CONFIG.replace("steps: 20", "steps: 200"))
    env = dict(os.environ, OMP_NUM_THREADS="1", TRAINPERF_FAULT="stop", TRAINPERF_FAULT_RANK="1",
               TRAINPERF_FAULT_STEP="3")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "trainperf", "train", str(cfg), "--resume", "never", "--set", f"run.dir={tmp_path / 'run'}",
           "--set", f"distributed.timeout_s={STOP_TIMEOUT_S}"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)
    reader.start()
    try:
        proc.wait(timeout=240)
        end = time.time()
        reader.join(10)
        out = "".join(lines)
        m = re.search(r"injected fault 'stop' on rank 1 at step 3 \(t=([\d.]+)\) in process (\d+)", out)
        assert m, out[-3000:]
        stopped = int(m.group(2))
        elapsed = end - float(m.group(1))
        assert proc.returncode != 0, out[-3000:]
        report = [ln for ln in out.splitlines() if ln.startswith("trainperf: rank 0 stopped at step 3")]
        assert report, out[-3000:]
        assert re.search(rf"rank 1 frozen / stopped \(its process {stopped} is stopped: SIGSTOP, or traced by a "
                         r"debugger; no sign of life for [\d.]+s; it was in step 3\)", report[0]), report[0]
        assert f"rank 1's stopped process {stopped} killed (SIGKILL)" in report[0], report[0]
        # from the stop to the end of the whole job (torchrun included): the timeout plus 5 s, not torchrun's 30 s
        assert elapsed < STOP_TIMEOUT_S + 5, (elapsed, out[-3000:])
        assert process_state(stopped) in ("gone", "Z"), process_state(stopped)  # nothing left stopped
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        reader.join(10)
        for m in re.finditer(r"injected fault 'stop' .* in process (\d+)", "".join(lines)):
            _cont_kill(int(m.group(1)))  # a rank this test stopped, if the job left it behind


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
