"""A slowed rank is named under FSDP2, tensor and pipeline parallelism (the run directory's diagnosis).

Two gloo ranks of the real `trainperf train` under torchrun, rank 1 slowed by TRAINPERF_SLOW_RANK=1:3 (it runs
a plain copy of the model forward and backward twice more per step: real compute on its own thread, not a
sleep), then `trainperf diagnose RUN_DIR`. Under tensor parallelism the group's collectives inside every
layer make both ranks take the same step time, and under pipeline parallelism the fast stage waits in its
receives: the trainer's per-rank clock (this thread's CPU time on CPU, collective waits left out) tells the
slow rank apart, and the finding names its tensor-parallel group or its pipeline stage.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
CONFIG = """\
run: {name: s, steps: 12, seed: 7, log_every: 2, eval_every: 0, eval_batches: 1, sample_tokens: 0, progress: false, threads: 1}
model: {n_layer: 2, n_head: 4, n_embd: 64, block_size: 64, vocab_size: 64}
data: {source: synthetic, num_workers: 0, loader: simple}
train: {global_batch: 8, micro_batch: 4}
checkpoint: {every: 0, at_end: false}
monitor: {mfu: false}
"""
LAYOUTS = {
    "fsdp2": ["parallelism.data=1", "parallelism.data_shard=2"],
    "tensor": ["parallelism.data=1", "parallelism.tensor=2"],
    "pipeline": ["parallelism.data=1", "parallelism.pipeline=2", "parallelism.microbatches=2"],
}


def _straggler(tmp_path: Path, layout: str) -> tuple[dict, list[dict]]:
    from trainperf.diagnosis.engine import diagnose

    (tmp_path / "c.yaml").write_text(CONFIG)
    run_dir = tmp_path / layout
    sets = [a for s in LAYOUTS[layout] for a in ("--set", s)]
    env = dict(os.environ, OMP_NUM_THREADS="1", TRAINPERF_SLOW_RANK="1:3")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           "-m", "trainperf", "train", str(tmp_path / "c.yaml"), "--resume", "never",
                           "--set", f"run.dir={run_dir}", *sets], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=240)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    found = {f["id"]: f for f in diagnose(run_dir)["findings"]}
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    assert "straggler" in found, {k: v["evidence"][:200] for k, v in found.items()}
    return found["straggler"], recs


def test_fsdp2_names_the_slowed_rank(tmp_path):
    f, recs = _straggler(tmp_path, "fsdp2")
    assert f["rank"] == 1 and f["ratio"] > 1.3, f["evidence"]
    assert f["clock"] == "thread_cpu" and "rank 1 computes" in f["evidence"]
    assert any(len(r.get("rank_compute_s") or []) == 2 for r in recs)  # one row per data (shard) rank


def test_tensor_parallel_names_the_slowed_rank_and_its_group(tmp_path):
    f, recs = _straggler(tmp_path, "tensor")
    assert f["rank"] == 1 and f["ratio"] > 1.2, f["evidence"]
    assert f["tensor_group"] == [0, 1], f
    assert "tensor-parallel group [0, 1]" in f["evidence"] and "tensor-parallel group [0, 1]" in f["cause"]
    # no data-parallel ranks: the balancer (batch shares between data ranks) is not offered as the fix
    assert "parallelism.balance.enabled=true" not in f["fix"], f["fix"]
    rows = [r for r in recs if "rank_compute_by_rank_s" in r]
    assert rows and all(len(r["rank_compute_by_rank_s"]) == 2 for r in rows)
    assert rows[0]["rank_groups"]["tensor"] == [[0, 1]] and rows[0]["rank_clock"] == "thread_cpu"


def test_pipeline_names_the_slow_stage(tmp_path):
    f, recs = _straggler(tmp_path, "pipeline")
    assert f["rank"] == 1 and f["ratio"] > 1.3, f["evidence"]
    assert f["stage"] == 1 and f["stage_ranks"] == [1], f
    assert "pipeline stage 1, ranks [1]" in f["evidence"] and "bubble" in f["evidence"]
    assert "pipeline stage 1" in f["cause"] and "pipeline stage 1" in f["fix"]
    rows = [r for r in recs if "rank_compute_by_rank_s" in r]
    assert rows and rows[0]["rank_groups"]["pipeline"] == [[0], [1]]
