"""A user's model (``model.entrypoint``) under torchrun: DDP and FSDP2 end on the one-process loss;
tensor / pipeline parallelism is refused before any work."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from trainperf.cli import main

REPO = Path(__file__).resolve().parents[2]
SPEC = "tests.distributed.test_entrypoint_dist:small_model"
TINY = f"""\
run: {{name: t, steps: 5, seed: 3, log_every: 1, eval_every: 0, eval_batches: 1, sample_tokens: 0, progress: false}}
model: {{entrypoint: "{SPEC}", vocab_size: 64, block_size: 16}}
data: {{source: synthetic}}
train: {{global_batch: 8, micro_batch: 2}}
checkpoint: {{every: 0, at_end: false}}
monitor: {{mfu: false}}
"""


class SmallLM(nn.Module):
    """Not the reference GPT: an embedding, a stack of residual MLPs (``layers``, so FSDP2 shards per
    block), a head. ``forward(idx, targets) -> (logits, mean loss)`` as trainperf expects."""

    def __init__(self, vocab: int, width: int = 32, depth: int = 2):
        super().__init__()
        self.emb = nn.Embedding(vocab, width)
        self.layers = nn.ModuleList(nn.Sequential(nn.LayerNorm(width), nn.Linear(width, 2 * width), nn.GELU(),
                                                  nn.Linear(2 * width, width)) for _ in range(depth))
        self.head = nn.Linear(width, vocab)

    def forward(self, idx, targets=None):
        h = self.emb(idx)
        for block in self.layers:
            h = h + block(h)
        logits = self.head(h)
        if targets is None:
            return logits, None
        return logits, F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(0, 1))


def small_model(cfg):
    vocab = cfg.model.vocab_size if isinstance(cfg.model.vocab_size, int) else 64
    return SmallLM(vocab)


@pytest.fixture()
def cfg(tmp_path):
    p = tmp_path / "tiny.yaml"
    p.write_text(TINY)
    return str(p)


def _train(cfg, run_dir, nproc, *sets):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc)] \
        if nproc > 1 else [sys.executable]
    cmd = [*launch, "-m", "trainperf", "train", cfg, "--resume", "never", "--set", f"run.dir={run_dir}"]
    for s in sets:
        cmd += ["--set", s]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((Path(run_dir) / "summary.json").read_text())


@pytest.mark.distributed
def test_entrypoint_model_trains_with_ddp_and_fsdp2_like_one_process(cfg, tmp_path):
    one = _train(cfg, tmp_path / "one", 1)
    ddp = _train(cfg, tmp_path / "ddp", 2, "parallelism.data=2")
    fsdp = _train(cfg, tmp_path / "fsdp", 2, "parallelism.data=1", "parallelism.data_shard=2")
    assert one["steps"] == ddp["steps"] == fsdp["steps"] == 5
    a = one["final_loss"]
    for name, s in (("ddp", ddp), ("fsdp2", fsdp)):
        assert abs(s["final_loss"] - a) <= 1e-4 * abs(a), (name, s["final_loss"], a)


@pytest.mark.parametrize("sets,needle", [
    (["parallelism.data=1", "parallelism.tensor=2"], "model.entrypoint models train with data parallelism only"),
    (["parallelism.data=1", "parallelism.pipeline=2"], "set both to 1 or use the reference model"),
])
def test_entrypoint_model_refuses_tensor_and_pipeline_parallelism(cfg, monkeypatch, capsys, sets, needle):
    monkeypatch.setenv("WORLD_SIZE", "2")  # as under torchrun; no process group is ever created
    argv = ["train", cfg, "--resume", "never"]
    for s in sets:
        argv += ["--set", s]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err
    import torch.distributed as dist

    assert not dist.is_initialized()
    assert torch.get_num_threads() >= 1
