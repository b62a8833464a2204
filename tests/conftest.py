"""Shared fixtures: a small prepared corpus and tiny configs, so tests stay fast."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# A suite started as a background job of a non-interactive shell (`make test &` in a script, some CI
# runners) inherits SIGINT ignored, and so does every command it starts (an ignored signal stays ignored
# across exec): the Ctrl-C tests would then send SIGINT to commands that cannot hear it and time out. They
# test what a user's Ctrl-C does, so the suite gives its commands the terminal's default.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# A tiny GPT that runs a step in milliseconds on one CPU thread.
TINY = [
    "model.preset=tiny", "model.n_layer=2", "model.n_head=2", "model.n_embd=32", "model.block_size=32",
    "train.global_batch=8", "train.micro_batch=4", "run.threads=1", "run.eval_every=0", "run.eval_batches=2",
    "run.sample_tokens=0", "run.log_every=1", "run.progress=false", "schedule.warmup_steps=2",
    "optimizer.lr=3e-3",
]


@pytest.fixture(scope="session")
def corpus(tmp_path_factory) -> str:
    """A prepared token directory made from a slice of the stdlib (real text, ~300 KB)."""
    from trainperf.data.prepare import prepare_tokens

    out = tmp_path_factory.mktemp("corpus")
    prepare_tokens("stdlib", str(out), max_bytes=300_000, val_fraction=0.1)
    return str(out)


@pytest.fixture
def tiny_overrides(corpus, tmp_path):
    return TINY + [f"data.path={corpus}", "data.prepare_from=null", f"run.dir={tmp_path / 'run'}"]


def run_cli(args: list[str], env: dict | None = None, timeout: float = 300):
    """Run ``python -m trainperf ARGS`` in a fresh process; returns CompletedProcess."""
    import subprocess

    e = dict(os.environ)
    e.update({"OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)})
    if env:
        e.update(env)
    return subprocess.run([sys.executable, "-m", "trainperf", *args], capture_output=True, text=True,
                          env=e, timeout=timeout, cwd=str(ROOT))
