"""One-line integrations: a Lightning run and a Hugging Face Trainer run, each with an injected slow
dataset, are diagnosed data_bound by ``trainperf diagnose``; without the slowdown, no such finding.
Plus the plain-loop context managers. One tiny model per framework, built in code (nothing downloaded)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

from tests.conftest import run_cli

SEQ, VOCAB, BATCH = 16, 64, 4


class Tokens(torch.utils.data.Dataset):
    """Random token rows; ``delay_s`` per item is the injected slow storage (a real sleep)."""

    def __init__(self, n: int = 64, delay_s: float = 0.0, as_dict: bool = False):
        g = torch.Generator().manual_seed(0)
        self.rows = torch.randint(0, VOCAB, (n, SEQ), generator=g)
        self.delay_s, self.as_dict = delay_s, as_dict

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        if self.delay_s:
            time.sleep(self.delay_s)
        row = self.rows[i]
        return {"input_ids": row, "labels": row.clone()} if self.as_dict else row


def _diagnose(run_dir) -> dict:
    r = run_cli(["diagnose", str(run_dir), "--json"])
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _check_run_dir(run_dir, steps: int) -> dict:
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps_recs = [r for r in recs if "step_time_s" in r]
    assert [r["step"] for r in steps_recs] == list(range(1, steps + 1))
    for r in steps_recs:
        assert set(r["phases_s"]) >= {"data", "forward", "backward", "optimizer"}
        assert r["tokens_per_s"] > 0 and "phases_cpu_s" in r and isinstance(r["loss"], float)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == steps and summary["tokens"] == steps * BATCH * SEQ
    assert summary["peak_flops"] and summary["hfu"] is not None  # counted FLOPs on a real step
    assert (run_dir / "samples.jsonl").exists()
    return summary


# ---------------------------------------------------------------------- Lightning
L = pytest.importorskip("lightning.pytorch", reason="lightning not installed")


class TinyLM(L.LightningModule):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(VOCAB, 32)
        # wide enough that a step's compute (~10-20 ms on one core) outweighs Lightning's own work between batches
        self.mlp = torch.nn.Sequential(torch.nn.Linear(32, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 1024),
                                       torch.nn.GELU(), torch.nn.Linear(1024, VOCAB))

    def training_step(self, batch, batch_idx):
        logits = self.mlp(self.emb(batch[:, :-1]))
        return torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), batch[:, 1:].reshape(-1))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _lightning_fit(run_dir, delay_s: float, steps: int = 12):
    from trainperf.integrations.lightning import TrainperfCallback

    cb = TrainperfCallback(run_dir=run_dir, log_every=4)
    trainer = L.Trainer(max_steps=steps, accelerator="cpu", devices=1, callbacks=[cb], logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    loader = torch.utils.data.DataLoader(Tokens(delay_s=delay_s), batch_size=BATCH)
    trainer.fit(TinyLM(), loader)
    return cb


@pytest.mark.parametrize("delay_s,bound", [(0.01, True), (0.0, False)])
def test_lightning_callback_diagnosed(tmp_path, delay_s, bound):
    cb = _lightning_fit(tmp_path / "run", delay_s)
    summary = _check_run_dir(tmp_path / "run", 12)
    assert summary["integration"] == "lightning" and cb.summary is not None
    ids = [f["id"] for f in _diagnose(tmp_path / "run")["findings"]]
    assert ("data_bound" in ids) is bound, ids
    if bound:  # `trainperf report` reads the same directory
        from trainperf.diagnosis.report import build_report

        rep = build_report(tmp_path / "run")
        assert {"loss", "phases", "throughput"} <= {Path(c).stem for c in rep["charts"]}, rep


def _on_disk_steps(run_dir) -> list[int]:
    p = run_dir / "metrics.jsonl"
    recs = [json.loads(x) for x in p.read_text().splitlines()] if p.exists() else []
    return [r["step"] for r in recs if "step_time_s" in r]


class _Peek:
    """At batch ``at``, wait past monitor.flush_s and read the run directory: the steps so far are on disk
    though run.log_every is far away (a kill now would keep them)."""

    def __init__(self, run_dir, at: int, flush_s: float):
        self.run_dir, self.at, self.flush_s, self.seen, self.samples = run_dir, at, flush_s, None, 0

    def check(self, step: int):
        if step == self.at:
            t = time.time()
            time.sleep(self.flush_s + 1.0)
            self.seen = _on_disk_steps(self.run_dir)
            p = self.run_dir / "samples.jsonl"  # the device sampler's records: each on disk when taken
            recs = [json.loads(x) for x in p.read_text().splitlines()] if p.exists() else []
            self.samples = sum(1 for r in recs if isinstance(r.get("t"), float) and r["t"] >= t)


def test_lightning_run_directory_is_on_disk_within_flush_s(tmp_path):
    from trainperf.integrations.lightning import TrainperfCallback

    peek = _Peek(tmp_path / "run", at=6, flush_s=0.2)

    class PeekCb(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            peek.check(batch_idx + 1)

    cb = TrainperfCallback(run_dir=tmp_path / "run", log_every=1000, monitor={"flush_s": 0.2, "sample_every_s": 0.2})
    trainer = L.Trainer(max_steps=8, accelerator="cpu", devices=1, callbacks=[cb, PeekCb()], logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(TinyLM(), torch.utils.data.DataLoader(Tokens(), batch_size=BATCH))
    assert peek.seen is not None and peek.seen[:5] == [1, 2, 3, 4, 5], peek.seen
    assert peek.samples >= 1  # sampled during the pause (every 0.2 s), on disk before the run ended
    assert _on_disk_steps(tmp_path / "run") == list(range(1, 9))


# ---------------------------------------------------------------------- Hugging Face Trainer
transformers = pytest.importorskip("transformers", reason="transformers not installed")


@pytest.fixture(scope="module")
def tiny_llama_config():
    return transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                    num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=SEQ)


def _hf_train(run_dir, config, delay_s: float, steps: int = 12):
    from trainperf.integrations.hf import TrainperfCallback

    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    args = transformers.TrainingArguments(output_dir=str(run_dir / "hf_out"), max_steps=steps,
                                          per_device_train_batch_size=BATCH, report_to=[], save_strategy="no",
                                          logging_strategy="no", use_cpu=True, disable_tqdm=True,
                                          dataloader_num_workers=0)
    cb = TrainperfCallback(run_dir=run_dir, log_every=4)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=Tokens(delay_s=delay_s, as_dict=True),
                                   callbacks=[cb])
    trainer.train()
    return cb


@pytest.mark.slow  # the first Trainer import (accelerate) takes seconds
def test_hf_trainer_run_directory_is_on_disk_within_flush_s(tmp_path, tiny_llama_config):
    from trainperf.integrations.hf import TrainperfCallback

    peek = _Peek(tmp_path / "run", at=6, flush_s=0.2)

    class PeekCb(transformers.TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            peek.check(state.global_step)

    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(tiny_llama_config)
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "hf_out"), max_steps=8,
                                          per_device_train_batch_size=BATCH, report_to=[], save_strategy="no",
                                          logging_strategy="no", use_cpu=True, disable_tqdm=True,
                                          dataloader_num_workers=0)
    cb = TrainperfCallback(run_dir=tmp_path / "run", log_every=1000, monitor={"flush_s": 0.2, "sample_every_s": 0.2})
    transformers.Trainer(model=model, args=args, train_dataset=Tokens(as_dict=True), callbacks=[cb, PeekCb()]).train()
    assert peek.seen is not None and peek.seen[:5] == [1, 2, 3, 4, 5], peek.seen
    assert peek.samples >= 1
    assert _on_disk_steps(tmp_path / "run") == list(range(1, 9))


@pytest.mark.slow  # the first Trainer import (accelerate) takes seconds
# 40 ms per batch: the Llama step is ~10 ms on a quiet 2-core machine, but beside other jobs it took 4x that,
# and a 10 ms wait then fell under data_bound's 20% (the run read host_contention only)
@pytest.mark.parametrize("delay_s,bound", [(0.04, True), (0.0, False)])
def test_hf_trainer_callback_diagnosed(tmp_path, tiny_llama_config, delay_s, bound):
    cb = _hf_train(tmp_path / "run", tiny_llama_config, delay_s)
    summary = _check_run_dir(tmp_path / "run", 12)
    assert summary["integration"] == "transformers.Trainer"
    assert summary["mfu"] is not None and "PaLM" in summary["flops_formula_note"]  # from the HF config
    ids = [f["id"] for f in _diagnose(tmp_path / "run")["findings"]]
    assert ("data_bound" in ids) is bound, ids
    # What the hooks compute: their thread CPU time. Their wall time moves with the machine's load: beside
    # two CPU hogs the sum over this 0.2-second run once read 26% of the steps (one call held up), and
    # the median step's share 5.8% (4 ms per step in the hooks, 0.2 ms on a quiet machine).
    ovh = cb.summary["monitor_overhead"]
    assert 0 < ovh["cpu_fraction_of_step"] < 0.05, ovh
    assert ovh["median_fraction_of_step"] > 0 and ovh["fraction_of_step"] > 0, ovh


def test_mfu_formula_found_inside_a_lightning_module(tiny_llama_config):
    from trainperf.integrations.core import model_flops_per_token

    class Holder(torch.nn.Module):  # a LightningModule holding a transformers model, as users write them
        def __init__(self):
            super().__init__()
            self.lm = transformers.AutoModelForCausalLM.from_config(tiny_llama_config)

    fpt, note = model_flops_per_token(Holder(), SEQ)
    n = sum(p.numel() for p in Holder().lm.parameters()) - VOCAB * 32  # untied: the input embedding is a lookup
    assert fpt == 6 * n + 12 * 2 * 32 * SEQ and "PaLM" in note
    assert model_flops_per_token(torch.nn.Linear(2, 2), SEQ)[0] is None


# ---------------------------------------------------------------------- plain loop
def test_plain_loop_context_managers(tmp_path):
    import trainperf

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(VOCAB, 16), torch.nn.Linear(16, VOCAB))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = Tokens(n=32)
    compute_s = 0.0
    with trainperf.track(tmp_path / "run", model=model, log_every=3) as tp:
        for i in range(0, 32, BATCH):
            batch = torch.stack([data[j] for j in range(i, i + BATCH)])
            # a slow fetch between steps: the data phase, 3x the last step's compute at least, so the wait
            # dominates even on a loaded machine where this tiny step takes 100+ ms instead of 1 ms
            time.sleep(max(0.05, 3 * compute_s))
            t0 = time.perf_counter()
            with tp.step(batch):
                with tp.phase("forward"):
                    logits = model(batch[:, :-1])
                    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), batch[:, 1:].reshape(-1))
                with tp.phase("backward"):
                    loss.backward()
                with tp.phase("optimizer"):
                    opt.step()
                    opt.zero_grad()
                tp.loss(loss)
            compute_s = time.perf_counter() - t0
    recs = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(recs) == 8 and all(r["phases_s"]["data"] >= 0.049 for r in recs[1:])
    assert recs[0]["phases_s"]["data"] < 0.009  # nothing measured before the first step
    ids = [f["id"] for f in _diagnose(tmp_path / "run")["findings"]]
    assert "data_bound" in ids
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    # no formula for an Embedding + Linear: MFU from the counted forward (the Linear's matmul), and it says so
    assert summary["mfu_source"] == "counted" and "3 x its forward FLOPs" in summary["mfu_convention"]
    # per token of the batch given to tp.step (SEQ per row; the model sees SEQ - 1 of them)
    assert summary["flops_per_token_counted_forward"] == pytest.approx(2 * 16 * VOCAB * (SEQ - 1) / SEQ)


def test_plain_loop_run_directory_is_on_disk_within_flush_s(tmp_path):
    """trainperf.track writes through the same bounded writer: steps and samples on disk long before
    log_every (never reached here) or close()."""
    import trainperf

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(VOCAB, 16), torch.nn.Linear(16, VOCAB))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    peek = _Peek(tmp_path / "run", at=6, flush_s=0.2)
    tp = trainperf.track(tmp_path / "run", model=model, log_every=1000, monitor={"flush_s": 0.2, "sample_every_s": 0.2})
    for step in range(1, 9):
        batch = Tokens(n=BATCH).rows
        with tp.step(batch):
            with tp.phase("forward"):
                loss = torch.nn.functional.cross_entropy(model(batch[:, :-1]).reshape(-1, VOCAB), batch[:, 1:].reshape(-1))
            with tp.phase("backward"):
                loss.backward()
            with tp.phase("optimizer"):
                opt.step()
                opt.zero_grad()
            tp.loss(loss)
        peek.check(step)  # after step 6 closed: 1..6 are due on disk within flush_s
    assert peek.seen == [1, 2, 3, 4, 5, 6], peek.seen
    assert peek.samples >= 1
    recs = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert all(isinstance(r["loss"], float) for r in recs)  # CPU: each loss in its step's line
    tp.close()
    assert _on_disk_steps(tmp_path / "run") == list(range(1, 9))


def test_the_median_steps_hook_share_ignores_one_held_up_call(tmp_path):
    """One hook call held up 0.2 s (a loaded machine's scheduler, a starved writer thread) in a short run:
    the sum over the run says so, the median step's share does not move."""
    from trainperf.integrations.core import StepRecorder

    rec = StepRecorder(tmp_path / "run", framework="test", count_flops=False, log_every=1000)
    phase = rec.timer.phase
    try:
        rec.open_step()
        for i in range(9):
            rec.add_batch(tokens=8)
            if i == 4:
                rec.timer.phase = lambda name: (time.sleep(0.2), phase(name))[1]
            rec.mark("forward")
            rec.timer.phase = phase
            time.sleep(0.02)  # the step's own work
            rec.mark("optimizer")
            rec.close_step()
        ovh = rec.finish()["monitor_overhead"]
    finally:
        rec.close()
    # 0.2 s in the hooks over ~0.4 s of steps plus those 0.2 s (~0.33; a busy machine's longer sleeps lower it):
    # the sum is honest about the held-up call
    assert ovh["fraction_of_step"] > 0.15, ovh
    assert 0 < ovh["median_fraction_of_step"] < 0.05, ovh
    assert ovh["cpu_s_per_step"] < 0.2 / 9, ovh  # a sleep is not CPU time: the held-up call computed nothing


# ---------------------------------------------------------------------- a user's own sleep is not contention
SLEEP_S = 0.05


def _phase_sums(run_dir) -> tuple[dict, dict, int]:
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    recs = [r for r in recs if "phases_s" in r][2:]  # the steady steps (the first count FLOPs)
    wall, cpu = {}, {}
    for r in recs:
        for k, v in r["phases_s"].items():
            wall[k] = wall.get(k, 0.0) + v
        for k, v in r["phases_cpu_s"].items():
            cpu[k] = cpu.get(k, 0.0) + v
    return wall, cpu, len(recs)


def _assert_sleep_is_not_contention(run_dir):
    """The sleep is the "other" phase, not forward/backward/optimizer time, and host_contention does not fire on it:
    the rule reads the timed phases' own CPU per wall second. Counted inside them (as the optimizer phase of a
    callback did), the sleep alone would have read well under 0.75 cores."""
    from trainperf.diagnosis.rules_runtime import HOST_MIN_CORES

    wall, cpu, n = _phase_sums(run_dir)  # the steady steps the diagnosis reads (the first 10% left out)
    timed = ("forward", "backward", "optimizer")
    assert wall.get("other", 0.0) >= 0.9 * SLEEP_S * n, wall  # the sleep is there, outside the timed phases
    phases_only = sum(cpu[k] for k in timed) / sum(wall[k] for k in timed)
    with_sleep = sum(cpu[k] for k in timed) / (sum(wall[k] for k in timed) + wall["other"])
    assert with_sleep < HOST_MIN_CORES, (with_sleep, wall, cpu)  # what the sleep would have made of the figure
    f = next((f for f in _diagnose(run_dir)["findings"] if f["id"] == "host_contention"), None)
    # On a quiet machine it does not fire. Beside other jobs it may, rightly, for a cause that is not the sleep:
    # the timed phases themselves starved of CPU, or step times spread.
    if f is not None:
        assert f["cpu_cores_got"] == pytest.approx(phases_only, rel=1e-6), (f, phases_only, with_sleep)
        assert f["cpu_cores_got"] < HOST_MIN_CORES or "spread" in f["evidence"], f


def test_lightning_a_callback_that_sleeps_after_the_optimizer_step_is_not_host_contention(tmp_path):
    """A user's callback sleeping in on_train_batch_end (before trainperf's) was counted as optimizer time: 0.46
    cores per wall second in forward/backward/optimizer, host_contention. The optimizer phase now ends when
    optimizer.step() returns (a step post-hook)."""
    from trainperf.integrations.lightning import TrainperfCallback

    class Sleeper(L.Callback):
        def on_train_batch_end(self, *args, **kwargs):
            time.sleep(SLEEP_S)

    cb = TrainperfCallback(run_dir=tmp_path / "run", log_every=4)
    trainer = L.Trainer(max_steps=14, accelerator="cpu", devices=1, callbacks=[Sleeper(), cb], logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(TinyLM(), torch.utils.data.DataLoader(Tokens(), batch_size=BATCH))
    _assert_sleep_is_not_contention(tmp_path / "run")
    assert not cb.rec._watched  # the optimizer's hook went with the run


@pytest.mark.slow  # the first Trainer import (accelerate) takes seconds
def test_hf_trainer_a_callback_that_sleeps_at_step_end_is_not_host_contention(tmp_path, tiny_llama_config):
    from trainperf.integrations.hf import TrainperfCallback

    class Sleeper(transformers.TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            time.sleep(SLEEP_S)

    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(tiny_llama_config)
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "hf_out"), max_steps=14,
                                          per_device_train_batch_size=BATCH, report_to=[], save_strategy="no",
                                          logging_strategy="no", use_cpu=True, disable_tqdm=True,
                                          dataloader_num_workers=0)
    cb = TrainperfCallback(run_dir=tmp_path / "run", log_every=4)
    transformers.Trainer(model=model, args=args, train_dataset=Tokens(as_dict=True),
                         callbacks=[Sleeper(), cb]).train()
    _assert_sleep_is_not_contention(tmp_path / "run")


def test_plain_loop_that_sleeps_between_steps_is_not_host_contention(tmp_path):
    """A loop of one's own with tp.step()/tp.phase(), sleeping between steps and inside a step outside any phase:
    neither sleep is forward/backward/optimizer time."""
    import trainperf

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(VOCAB, 64), torch.nn.Linear(64, 512), torch.nn.GELU(),
                                torch.nn.Linear(512, VOCAB))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = Tokens(n=16 * BATCH)
    with trainperf.track(tmp_path / "run", model=model, log_every=4) as tp:
        for i in range(16):
            x = data.rows[i * BATCH:(i + 1) * BATCH]
            time.sleep(SLEEP_S / 2)  # between steps: the data phase
            with tp.step(x):
                with tp.phase("forward"):
                    logits = model(x[:, :-1])
                    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), x[:, 1:].reshape(-1))
                with tp.phase("backward"):
                    loss.backward()
                with tp.phase("optimizer"):
                    opt.step()
                    opt.zero_grad()
                time.sleep(SLEEP_S)  # inside the step, outside any phase: "other"
                tp.loss(loss)
    _assert_sleep_is_not_contention(tmp_path / "run")
