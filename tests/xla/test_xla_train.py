"""The trainer on the CPU PJRT device against the eager CPU trainer (run by ``make test-xla``).

Model: configs/gpt-tiny.yaml shrunk with overrides (2 layers, 32 wide, context 32, batch 8) so a
step takes milliseconds; the XLA runs pay their compilations once per distinct graph.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.conftest import ROOT, TINY
from trainperf.config import load_config
from trainperf.train.resolve import resolve
from trainperf.diagnosis.engine import diagnose
from trainperf.train.checkpoint import CheckpointManager
from trainperf.train.build import build_trainer
from trainperf.train.run import fit

pytestmark = pytest.mark.xla

CONFIG = str(ROOT / "configs" / "gpt-tiny.yaml")
STEPS = 30
# fp32 on both sides; XLA fuses and reorders reductions, so the curves differ by rounding only.
# Measured (torch 2.9.1, torch-xla 2.9.0, PJRT CPU): max |loss_xla - loss_eager| over 30 steps 9.5e-7
# (printed by test_loss_curve_follows_eager_cpu with -s). Tolerance: 1e-4 (a real divergence, e.g. a
# wrong data order or a skipped optimizer step, moves the loss by > 1e-2 within a few steps).
LOSS_TOL = 1e-4


def _overrides(corpus: str, run_dir: Path, device: str, steps: int = STEPS, extra=()) -> list[str]:
    return [*TINY, f"data.path={corpus}", "data.prepare_from=null", f"run.dir={run_dir}", f"run.device={device}",
            f"run.steps={steps}", "checkpoint.every=0", "monitor.mfu=false", *extra]


class Preempted(Exception):
    pass


def train(corpus, run_dir, device, steps=STEPS, resume="never", extra=(), wrap_loader=None, stop_after=None):
    cfg = load_config(CONFIG, _overrides(corpus, run_dir, device, steps, extra))
    trainer = build_trainer(resolve(cfg, world_size=1), verbose=False)
    if wrap_loader is not None:
        trainer.data.train.cpu = wrap_loader(trainer.data.train.cpu)
    if stop_after is not None:  # the job is stopped (preempted) before step stop_after + 1
        step = trainer.train_step

        def stopping_step():
            if trainer.step >= stop_after:
                trainer.data.train.close()  # stops the loader threads (and the hybrid loader's workers)
                raise Preempted
            return step()

        trainer.train_step = stopping_step
    summary = fit(trainer, resume=resume, verbose=False)
    return trainer, summary


def step_records(run_dir: Path) -> list[dict]:
    """The step records, each with its loss: on XLA the loss (a lazy tensor) reaches the file in a follow-up
    ``"part": "values"`` line, which the project's reader merges into its step's record."""
    from trainperf.diagnosis.rundir import merge_parts, read_jsonl

    return [r for r in merge_parts(read_jsonl(run_dir / "metrics.jsonl")) if "loss" in r and "step_time_s" in r]


def losses(run_dir: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in step_records(run_dir)}


@pytest.fixture(scope="module")
def runs(corpus, tmp_path_factory):
    """One XLA run and one eager CPU run of the same config."""
    base = tmp_path_factory.mktemp("runs")
    out = {}
    for device in ("xla", "cpu"):
        trainer, summary = train(corpus, base / device, device)
        out[device] = {"dir": base / device, "summary": summary, "trainer": trainer}
    return out


def test_runs_on_the_xla_device(runs):
    s = runs["xla"]["summary"]
    assert s["device"].startswith("xla")
    assert runs["xla"]["trainer"].device.type == "xla"
    assert next(runs["xla"]["trainer"].model.parameters()).device.type == "xla"
    assert s["notes"]["xla"].startswith("xla:0 (CPU)")


def test_loss_curve_follows_eager_cpu(runs):
    cpu, xla = losses(runs["cpu"]["dir"]), losses(runs["xla"]["dir"])
    assert sorted(cpu) == sorted(xla) == list(range(1, STEPS + 1))
    diffs = {s: abs(cpu[s] - xla[s]) for s in cpu}
    worst = max(diffs, key=diffs.get)
    assert diffs[worst] <= LOSS_TOL, f"step {worst}: eager {cpu[worst]:.6f} vs xla {xla[worst]:.6f}"
    assert xla[STEPS] < xla[1] - 0.5, "the XLA run did not learn"  # it trains, not just agrees
    print(f"max |loss_xla - loss_eager| = {diffs[worst]:.2e} at step {worst}")


def test_compilations_stop_growing_after_warmup(runs):
    recs = step_records(runs["xla"]["dir"])
    per_step = [r["xla_step_compiles"] for r in recs]
    assert sum(per_step[:3]) >= 1  # the first steps do compile: the counter is live
    assert per_step[3:] == [0] * (len(per_step) - 3), f"compilations per step: {per_step}"
    assert recs[-1]["xla_compiles"] == recs[3]["xla_compiles"]  # nothing compiled between steps either
    assert recs[-1]["xla_executions"] > recs[3]["xla_executions"]  # while graphs kept running
    assert all(r["xla_batch_shape"] == [8, 32] for r in recs)
    assert "xla_recompile" not in [f["id"] for f in diagnose(runs["xla"]["dir"])["findings"]]


class ChangingSeqLen:
    """Cuts the sequence length of batches after ``start`` to 32, 24, 16, 32, 24, ... (the trap)."""

    def __init__(self, loader, start: int):
        self.loader, self.start, self.n = loader, start, 0

    def next_batch(self, shares=None):
        x, y = self.loader.next_batch()
        self.n += 1
        if self.n > self.start:
            t = (32, 24, 16)[(self.n - self.start) % 3]
            x, y = x[:, :t], y[:, :t]
        return x, y

    def state_dict(self):
        return self.loader.state_dict()

    def load_state_dict(self, state):
        self.loader.load_state_dict(state)


def test_changing_sequence_length_is_reported(corpus, tmp_path):
    run_dir = tmp_path / "recompile"
    train(corpus, run_dir, "xla", steps=20, wrap_loader=lambda ld: ChangingSeqLen(ld, start=10))
    result = diagnose(run_dir)
    found = [f for f in result["findings"] if f["id"] == "xla_recompile"]
    assert found, result["findings"]
    f = found[0]
    assert f["step"] == 11 and f["previous_batch_shape"] == [8, 32] and f["batch_shape"] == [8, 24]
    assert "at step 11 the batch shape changed from [8, 32] to [8, 24]" in f["evidence"]
    print(f"xla_recompile [{f['severity']}]: {f['evidence']}")


def _ckpt_devices(run_dir: Path) -> set[str]:
    step, state = CheckpointManager(run_dir / "checkpoints").load_latest()
    devs = set()

    def walk(x):
        if isinstance(x, torch.Tensor):
            devs.add(x.device.type)
        elif isinstance(x, dict):
            for v in x.values():
                walk(v)
        elif isinstance(x, (list, tuple)):
            for v in x:
                walk(v)

    walk(state)
    return devs


def test_resume_xla_to_cpu_and_back(runs, corpus, tmp_path):
    """XLA steps 1-10, stopped -> eager CPU resumes for 11-20, stopped -> XLA resumes for 21-30, in one
    run directory with a checkpoint every 10 steps. Each leg follows the uninterrupted run of its device
    (same data order, optimizer state and schedule)."""
    run_dir, every = tmp_path / "chain", ["checkpoint.every=10"]
    with pytest.raises(Preempted):
        train(corpus, run_dir, "xla", extra=every, stop_after=10)
    assert _ckpt_devices(run_dir) == {"cpu"}  # written from XLA as CPU tensors
    with pytest.raises(Preempted):
        train(corpus, run_dir, "cpu", resume="auto", extra=every, stop_after=20)
    assert CheckpointManager(run_dir / "checkpoints").steps() == [10, 20]
    _, s3 = train(corpus, run_dir, "xla", resume="auto", extra=every)
    assert s3["resumed_from"] == 20 and s3["steps"] == STEPS
    chain = losses(run_dir)
    assert sorted(chain) == list(range(1, STEPS + 1))
    ref_xla, ref_cpu = losses(runs["xla"]["dir"]), losses(runs["cpu"]["dir"])
    for steps, ref, name in ((range(1, 11), ref_xla, "xla"), (range(11, 21), ref_cpu, "cpu"),
                             (range(21, 31), ref_xla, "xla")):
        for s in steps:
            assert abs(chain[s] - ref[s]) <= LOSS_TOL, f"step {s} ({name} leg): {chain[s]:.6f} vs {ref[s]:.6f}"


def test_torch_compile_openxla_backend(runs, corpus, tmp_path):
    """compile.backend=openxla: torch.compile (dynamo) hands the model's graphs to XLA; same losses."""
    run_dir = tmp_path / "openxla"
    with pytest.raises(Preempted):
        trainer, _ = train(corpus, run_dir, "xla", extra=["compile.enabled=true", "compile.backend=openxla"],
                           stop_after=8)
    got, ref = losses(run_dir), losses(runs["xla"]["dir"])
    assert sorted(got) == list(range(1, 9))
    for s in got:
        assert abs(got[s] - ref[s]) <= LOSS_TOL, f"step {s}: openxla {got[s]:.6f} vs lazy xla {ref[s]:.6f}"


def test_inductor_on_xla_is_refused(corpus, tmp_path):
    from trainperf.errors import ConfigError

    cfg = load_config(CONFIG, _overrides(corpus, tmp_path, "xla", extra=["compile.enabled=true"]))
    with pytest.raises(ConfigError, match="compile.backend=openxla"):
        resolve(cfg, world_size=1)


def test_bf16_autocast_on_xla(runs, corpus, tmp_path):
    """precision.dtype=bf16 on XLA: autocast to bf16; the losses stay near the fp32 run's (bf16 rounding)."""
    run_dir = tmp_path / "bf16"
    with pytest.raises(Preempted):
        train(corpus, run_dir, "xla", extra=["precision.dtype=bf16"], stop_after=5)
    got, ref = losses(run_dir), losses(runs["xla"]["dir"])
    assert sorted(got) == list(range(1, 6))
    assert all(abs(got[s] - ref[s]) <= 0.05 for s in got), (got, ref)
    assert any(got[s] != ref[s] for s in got)  # bf16 really changed the arithmetic


def test_resolve_on_xla(corpus, tmp_path):
    from trainperf.errors import ConfigError

    r = resolve(load_config(CONFIG, _overrides(corpus, tmp_path, "xla")), world_size=1)
    c = r.cfg
    assert (c.precision.dtype, c.optimizer.impl, c.distributed.backend) == ("fp32", "foreach", "xla")
    assert "XLA, PJRT device CPU" in r.notes["run.device"]
    with pytest.raises(ConfigError, match="torchrun"):
        resolve(load_config(CONFIG, _overrides(corpus, tmp_path, "xla")), world_size=2)
    with pytest.raises(ConfigError, match="fp16"):
        resolve(load_config(CONFIG, _overrides(corpus, tmp_path, "xla", extra=["precision.dtype=fp16"])), world_size=1)


def test_hybrid_loader_behind_the_xla_loader(runs, corpus, tmp_path):
    """data.loader=hybrid (cache and prefetch tiers, built for the CPU) feeds the same batches."""
    run_dir = tmp_path / "hybrid"
    with pytest.raises(Preempted):
        trainer, _ = train(corpus, run_dir, "xla", extra=["data.loader=hybrid"], stop_after=4)
    got, ref = losses(run_dir), losses(runs["xla"]["dir"])
    assert sorted(got) == [1, 2, 3, 4]
    assert all(abs(got[s] - ref[s]) <= LOSS_TOL for s in got), (got, ref)
