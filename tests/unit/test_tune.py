"""trainperf tune: the choice, the budget, interrupts, pruning, the JSON and the tuned YAML.

Most tests drive the search with an injected trial runner (figures chosen by the test, a clock
that advances by each trial's cost) so that the search's rules are checked exactly and fast;
the last one runs real trials of the tiny CPU model through the trainer."""

from __future__ import annotations

import json

import pytest
import torch

from tests.conftest import TINY
from trainperf.config import load_config
from trainperf.config.resolve import resolve
from trainperf.tune import space
from trainperf.tune.fit import HEADROOM, Estimator
from trainperf.tune.result import STATUSES
from trainperf.tune.search import Options, _error_status, tune
from trainperf.tune.trial import Measured

BASE = TINY + ["data.source=synthetic", "monitor.jsonl=false"]
CPU = space.Facts("cpu", bf16=False, cpus=2)


class Fake:
    """A trial runner whose tokens/s is ``speed(settings)`` (an exception instance: raised) and a
    clock that advances ``cost`` seconds per trial."""

    def __init__(self, speed, cost=1.0, sbs_ratio=None, won=None):
        self.now, self.cost, self.speed, self.sbs_ratio, self.won = 0.0, cost, speed, sbs_ratio, won
        self.calls: list[dict] = []
        self.sbs_calls = 0

    def clock(self):
        return self.now

    def trial(self, cfg, *, global_batch, warmup, steps):
        s = space.settings_of(cfg)
        self.calls.append(s)
        self.now += self.cost
        v = self.speed(s)
        if isinstance(v, BaseException):
            raise v
        return Measured(v, 1.0 / v, 0.01, self.cost - 0.5, self.cost, 1000, "fake", {})

    def sbs(self, a, b, *, global_batch, rounds, steps, warmup, deadline=None):
        self.sbs_calls += 1
        self.now += self.cost
        ta = self.speed(space.settings_of(a))
        r = self.sbs_ratio
        ratio = r(space.settings_of(b)) if callable(r) else r if r is not None else self.speed(space.settings_of(b)) / ta
        out = {"a_tokens_per_s": ta, "b_tokens_per_s": ta * ratio, "speedup": ratio, "method": "fake"}
        return out if self.won is None else {**out, "b_faster_rounds": self.won, "rounds": 6}


def _run(tmp_path, fake, budget_s=1000.0, overrides=(), **kw):
    cfg = load_config(None, BASE + list(overrides))
    return tune(cfg, out_dir=tmp_path / "tune", options=Options(budget_s=budget_s, progress=False), facts=CPU,
                clock=fake.clock, trial_fn=fake.trial, sbs_fn=fake.sbs, **kw)


def _speed(s):
    if s["compile.enabled"]:
        return RuntimeError("inductor exploded")  # a compile failure
    if s["train.micro_batch"] == 8:
        return torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB")
    if s["memory.checkpointing.mode"] == "selective":
        return 300.0  # the fastest in its own trial ...
    return {4: 100.0, 2: 90.0, 1: 50.0}[s["train.micro_batch"]] * (1.1 if s["data.loader"] == "hybrid" else 1.0)


def test_choice_is_never_a_failed_trial_nor_slower_than_the_default_side_by_side(tmp_path):
    fake = Fake(_speed, sbs_ratio=0.97)  # ... but slower than the default side by side
    res = _run(tmp_path, fake)
    status = {space.label(t.changed): t.status for t in res.trials}
    assert status["micro_batch=8"] == "oom" and status["enabled=True"] == "failed"
    assert "inductor exploded" in next(t.reason for t in res.trials if t.status == "failed")
    # the best trial (selective) and the runner-up within 5% of the default (hybrid) are measured
    assert fake.sbs_calls == 2 and [c["changes"] for c in res.confirmations] == \
        [{"memory.checkpointing.mode": "selective"}, {"data.loader": "hybrid"}]
    assert res.best.settings == res.default.settings and res.speedup == 1.0
    assert any("not faster, not chosen" in n for n in res.notes) and any("default is kept" in n for n in res.notes)
    # side by side faster: the candidate is chosen, with the side-by-side ratio
    fake2 = Fake(_speed, sbs_ratio=1.25)
    res2 = _run(tmp_path, fake2)
    assert res2.best.settings["memory.checkpointing.mode"] == "selective"
    assert res2.speedup == pytest.approx(1.25)
    chosen = next(t for t in res2.trials if t.settings == res2.best.settings)
    assert chosen.status == "ok"
    # the best trial loses side by side, the runner-up wins: the runner-up, with its own ratio
    fake3 = Fake(_speed, sbs_ratio=lambda s: 1.08 if s["data.loader"] == "hybrid" else 0.9)
    res3 = _run(tmp_path, fake3)
    assert res3.best.settings["data.loader"] == "hybrid" and res3.speedup == pytest.approx(1.08)
    assert [round(c["ratio"], 2) for c in res3.confirmations] == [0.9, 1.08]
    # a higher median that won only 3 of 6 rounds is not evidence enough: the default is kept
    res4 = _run(tmp_path, Fake(_speed, sbs_ratio=1.05, won=3))
    assert res4.best.settings == res4.default.settings and len(res4.confirmations) == 2
    assert all("faster in 3 of 6 rounds" in n for n in res4.notes if "measured x1.050" in n)


def test_budget_stops_trials_and_still_returns_a_valid_result(tmp_path):
    fake = Fake(_speed, cost=10.0)
    res = _run(tmp_path, fake, budget_s=35.0)
    ran = [t for t in res.trials if t.status != "pruned"]
    assert len(ran) == 3  # default + 2 trials of 10 s; the next needs 10 s + 10 s side by side
    budget = [t for t in res.trials if t.status == "pruned" and t.reason.startswith("time budget")]
    assert budget and res.elapsed_s <= 35.0
    assert res.speedup is not None and res.best.tokens_per_s is not None
    # a budget below one trial: the default alone (always measured), kept, and said so
    tiny = _run(tmp_path, Fake(_speed, cost=10.0), budget_s=5.0)
    assert [t.status for t in tiny.trials if t.status != "pruned"] == ["ok"]
    assert tiny.best.settings == tiny.default.settings and tiny.speedup == 1.0
    assert json.loads(json.dumps(tiny.to_json(), allow_nan=False))["budget_s"] == 5.0


def test_interrupt_keeps_the_best_so_far_and_writes_it(tmp_path):
    def speed(s):
        if s["train.micro_batch"] == 8:
            return 200.0
        if s["train.micro_batch"] == 2:
            return KeyboardInterrupt()
        return 100.0

    fake = Fake(speed)
    res = _run(tmp_path, fake)
    assert res.interrupted and fake.sbs_calls == 0
    assert res.best.settings["train.micro_batch"] == 8 and res.speedup is None
    assert load_config(res.config_path).train.micro_batch == 8
    lines = (tmp_path / "tune" / "trials.jsonl").read_text().splitlines()
    assert len(lines) == len(res.trials) and json.loads(lines[-1])["settings"]["train.micro_batch"] == 8
    assert json.loads((tmp_path / "tune" / "settings.json").read_text())["interrupted"] is True


def test_memory_estimate_prunes_with_reasons_and_pairs_micro_batch_with_checkpointing(tmp_path):
    est = Estimator()

    def at(mb, *ac):
        over = BASE + [f"train.micro_batch={mb}", *ac]
        return est(resolve(load_config(None, over), world_size=1).cfg).bytes

    full8, half8 = at(8, "memory.checkpointing.mode=full"), at(8, "memory.checkpointing.mode=ratio",
                                                             "memory.checkpointing.ratio=0.5")
    assert full8 < half8 < at(8)
    budget_gb = (full8 + half8) / 2 / HEADROOM / 1e9  # at micro-batch 8 only full checkpointing fits
    fake = Fake(lambda s: 100.0 * s["train.micro_batch"])
    res = _run(tmp_path, fake, overrides=[f"memory.checkpointing.budget_gb={budget_gb}"])
    mb8 = [t for t in res.trials if t.settings["train.micro_batch"] == 8 and t.status == "ok"]
    assert mb8 and mb8[0].settings["memory.checkpointing.mode"] == "full"  # paired with what fits
    assert res.best.settings["train.micro_batch"] == 8
    pruned = [t for t in res.trials if t.status == "pruned" and "memory estimate" in (t.reason or "")]
    assert {t.settings["memory.checkpointing.mode"] for t in pruned if t.dimension == "checkpointing"} == \
        {"none", "selective", "ratio"}
    assert all("MiB per rank >" in t.reason and "memory.checkpointing.budget_gb" in t.reason for t in pruned)
    assert all(t not in fake.calls for t in (p.settings for p in pruned))  # pruned: never run
    # every up-front rejection carries its reason (bf16 on a CPU without native bf16, fp16 without CUDA)
    reasons = [t.reason for t in res.trials if t.status == "pruned"]
    assert all(reasons) and any("no native bf16" in r for r in reasons) and any("needs CUDA" in r for r in reasons)


def test_json_shape_and_tuned_yaml_loads(tmp_path):
    fake = Fake(_speed, sbs_ratio=1.1)
    cfg_path = tmp_path / "my.yaml"
    cfg_path.write_text("train: {global_batch: 8, micro_batch: 4}\n")
    cfg = load_config(str(cfg_path), BASE)
    res = tune(cfg, config_path=str(cfg_path), out_dir=tmp_path / "t", options=Options(progress=False), facts=CPU,
               clock=fake.clock, trial_fn=fake.trial, sbs_fn=fake.sbs, doctor={"machine": {"cpu": "x"}})
    doc = json.loads(json.dumps(res.to_json(), allow_nan=False))
    assert set(doc) == {"default", "best", "speedup", "trials", "budget_s", "elapsed_s"}
    assert set(doc["default"]) == {"tokens_per_s", "peak_memory_bytes", "settings"}
    assert set(doc["best"]) == {"tokens_per_s", "peak_memory_bytes", "settings", "config_path"}
    assert all(set(t) == {"settings", "status", "tokens_per_s", "reason"} for t in doc["trials"])
    assert {t["status"] for t in doc["trials"]} <= set(STATUSES)
    assert all(t["reason"] for t in doc["trials"] if t["status"] != "ok")
    assert doc["best"]["config_path"] == str(tmp_path / "my.tuned.yaml")
    tuned = resolve(load_config(doc["best"]["config_path"]), world_size=1).cfg
    assert space.settings_of(tuned)["memory.checkpointing.mode"] == doc["best"]["settings"]["memory.checkpointing.mode"]
    assert tuned.train.global_batch == 8
    for name in ("trials.jsonl", "settings.json", "doctor.json", "tuned.yaml", "result.json"):
        assert (tmp_path / "t" / name).exists()


def test_error_status_classifies_oom():
    assert _error_status(torch.OutOfMemoryError("CUDA out of memory"))[0] == "oom"
    assert _error_status(RuntimeError("DefaultCPUAllocator: can't allocate memory: out of memory"))[0] == "oom"
    assert _error_status(ValueError("bad"))[0] == "failed"


@pytest.mark.slow
@pytest.mark.parametrize("paired", [None, False])
def test_real_trials_on_the_tiny_model(tmp_path, paired):
    """Real trials through the trainer (paired with the best: the CPU default; unpaired with a
    fresh side-by-side: the GPU path): the choice ran, and it is not slower than the default in
    the final side-by-side measurement (or it is the default)."""
    cfg = load_config(None, BASE)
    res = tune(cfg, out_dir=tmp_path / "tune", options=Options(budget_s=40, steps=3, warmup=1, rounds=2,
                                                               compile_prior_s=1e9, progress=False, paired=paired))
    chosen = [t for t in res.trials if t.settings == res.best.settings]
    assert chosen and chosen[0].status == "ok"
    if res.best.settings != res.default.settings:
        sbs = res.side_by_side
        assert res.speedup == sbs["speedup"] > 1 and 2 * sbs["b_faster_rounds"] > sbs["rounds"]
    assert all(t.peak_memory_bytes is None or t.peak_memory_bytes >= 0 for t in res.trials)
    ran = [t for t in res.trials[1:] if t.status == "ok"]
    if paired is None:  # CPU: paired with the best
        assert ran and all(t.vs_best > 0 and "/" in t.rounds_won for t in ran)
    else:
        assert ran and all(t.vs_best is None and t.tokens_per_s > 0 for t in ran)
    assert res.elapsed_s <= 40 + 10  # the default trial and one trial's overrun at most


def test_layout_candidates_are_the_planners_and_resolve_for_the_world_size():
    cfg = resolve(load_config(None, BASE + ["model.n_head=4", "model.n_embd=64", "train.global_batch=16"]),
                  world_size=4).cfg
    dim = space.layouts(cfg, space.Facts("cpu", cpus=8, world_size=4), top=3)
    assert 1 <= len(dim.options) <= 3 and all(o.note.startswith("planner rank") for o in dim.options)
    for opt in dim.options:
        cand = resolve(space.apply(cfg, opt.settings), world_size=4).cfg  # a valid layout for 4 ranks
        p = cand.parallelism
        assert p.data * p.data_shard * p.tensor * p.pipeline == 4 and cand.train.global_batch == 16


def test_cli_rejects_a_bad_budget_and_torchrun(tmp_path, monkeypatch):
    from tests.conftest import run_cli
    from trainperf.errors import UserError

    r = run_cli(["tune", "configs/gpt-tiny.yaml", "--budget-min", "0", "--out", str(tmp_path)])
    assert r.returncode == 2 and "--budget-min must be positive" in r.stderr and "Traceback" not in r.stderr
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(UserError, match="without torchrun"):
        tune(load_config(None, BASE), out_dir=tmp_path)
