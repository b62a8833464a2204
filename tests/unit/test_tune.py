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
from trainperf.train.resolve import resolve
from trainperf.tune import space
from trainperf.tune.fit import HEADROOM, Estimator
from trainperf.tune.result import STATUSES
from trainperf.tune.search import Options, _error_status, tune
from trainperf.tune.trial import Measured

BASE = TINY + ["data.source=synthetic", "monitor.jsonl=false"]
REPO = __import__("pathlib").Path(__file__).resolve().parents[2]
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
        if self.won is None:
            return out
        rounds = [ratio + 0.02] * self.won + [ratio - 0.06] * (6 - self.won)  # won of 6 rounds
        return {**out, "b_faster_rounds": self.won, "rounds": 6, "round_ratios": rounds}


def _run(tmp_path, fake, budget_s=1000.0, overrides=(), **kw):
    cfg = load_config(None, BASE + list(overrides))
    return tune(cfg, out_dir=tmp_path / "tune", options=Options(budget_s=budget_s, progress=False), facts=CPU,
                clock=fake.clock, trial_fn=fake.trial, sbs_fn=fake.sbs, **kw)


def _speed(s):
    if s["compile.enabled"]:
        return RuntimeError("inductor exploded")  # a compile failure
    if s["train.micro_batch"] == 8:
        return torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB")
    if s["run.host_memory"] == "retain":
        return 80.0  # slower: not a runner-up
    if s["memory.checkpointing.mode"] == "selective":
        return 300.0  # the fastest in its own trial ...
    # hybrid: within the noise margin (not adopted) but within 5% of the default (a runner-up)
    return {4: 100.0, 2: 90.0, 1: 50.0}[s["train.micro_batch"]] * (1.01 if s["data.loader"] == "hybrid" else 1.0)


def test_choice_is_never_a_failed_trial_nor_slower_than_the_default_side_by_side(tmp_path):
    fake = Fake(_speed, sbs_ratio=0.97)  # ... but slower than the default side by side
    res = _run(tmp_path, fake)
    status = {space.label(t.changed): t.status for t in res.trials}
    assert status["micro_batch=8"] == "oom" and status["enabled=True"] == "failed"
    assert "inductor exploded" in next(t.reason for t in res.trials if t.status == "failed")
    # the best trial (selective) and the runner-up within 5% of the default (hybrid) are measured
    assert fake.sbs_calls == 2 and [c["changes"] for c in res.confirmations] == \
        [{"memory.checkpointing.mode": "selective"},  # each against the default (more recompute is searched last,
         {"data.loader": "hybrid"}]  # after the loader: tune/order.py)
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
    assert any("no candidate could be measured in the 5 s budget" in n and "raise --budget-min" in n
               for n in tiny.notes), tiny.notes  # not "no candidate was faster": none was measured
    assert not any("was faster" in n for n in tiny.notes)
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
    if res.best.settings != res.default.settings and res.speedup is None:  # the final did not fit in the budget
        assert paired is None and any("kept on its paired trials" in n for n in res.notes), res.notes
    elif res.best.settings != res.default.settings:
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


def test_a_trial_in_its_own_process_reports_its_errors_and_its_death():
    """Worker: the candidate's exception comes back with its type's name (an out-of-memory error
    stays one); a worker killed mid-search is a failed trial with the signal named, not a hang."""
    import os
    import signal

    from trainperf.tune.trial import Worker, WorkerError

    cfg = resolve(load_config(None, BASE), world_size=1).cfg
    with pytest.raises(WorkerError) as bad:  # the worker checks the global batch it trains
        Worker(cfg, global_batch=cfg.train.global_batch * 2, warmup=1)
    assert bad.value.kind == "ConfigError" and "global batch" in str(bad.value)
    assert _error_status(bad.value) == ("failed", f"ConfigError: {bad.value}")
    assert _error_status(WorkerError("OutOfMemoryError", "CUDA out of memory"))[0] == "oom"
    late = Worker.__new__(Worker)  # the budget's end: a worker not ready by then is stopped, not waited for
    with pytest.raises(WorkerError) as timed_out:
        late.__init__(cfg, global_batch=cfg.train.global_batch, warmup=1, timeout_s=0.05)
    assert timed_out.value.kind == "Timeout" and "budget" in str(timed_out.value)
    assert not late.proc.is_alive()
    w = Worker(cfg, global_batch=cfg.train.global_batch, warmup=1)
    try:
        assert w.proc.pid != os.getpid() and w.measured.first_step_s > 0
        times = w.steps(2)
        assert len(times) == 2 and all(t > 0 for t in times)
        os.kill(w.proc.pid, signal.SIGKILL)
        with pytest.raises(WorkerError) as died:
            w.steps(1)
        assert died.value.kind == "WorkerDied" and "SIGKILL" in str(died.value)
    finally:
        w.close()
    assert not w.proc.is_alive()


HOST_MEMORY_PROBE = """
import ctypes, json, resource, sys
from trainperf.hardware import hostmem
note = hostmem.apply(sys.argv[1])
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
faults, n = [], 64 << 20  # above glibc's largest dynamic mmap threshold (32 MiB)
for _ in range(4):
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    p = libc.malloc(n)
    libc.memset(p, 1, n)
    libc.free(p)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
print(json.dumps({"faults": faults, "note": note}))
"""


@pytest.mark.skipif(not __import__("trainperf.hardware.hostmem", fromlist=["x"]).supported()[0], reason="needs glibc")
def test_host_memory_retain_reuses_freed_pages(tmp_path):
    """run.host_memory=retain in a fresh process sets the C allocator as it says: a 64 MiB block
    written, freed and allocated again reuses the pages already mapped, where glibc's default maps
    (and the kernel zero-fills) them afresh every time (minor page faults counted by getrusage;
    64 MiB = 16,384 pages of 4 KiB). How much this buys a training step depends on its allocation
    pattern (PyTorch's 64-byte-aligned blocks reach a steady heap only after some steps), so that
    is not asserted here: `trainperf tune` measures it side by side (BENCHMARKS.md)."""
    import subprocess
    import sys

    out = {}
    for mode in ("release", "retain"):
        env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("MALLOC_")}  # glibc's own knobs
        r = subprocess.run([sys.executable, "-c", HOST_MEMORY_PROBE, mode], capture_output=True, text=True, timeout=120,
                           env=env)
        assert r.returncode == 0, r.stderr[-2000:]
        out[mode] = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["release"]["note"] is None and "mallopt" in out["retain"]["note"]
    pages = (64 << 20) // 4096
    assert all(f > pages // 2 for f in out["release"]["faults"]), out  # every time afresh
    assert out["retain"]["faults"][0] > pages // 2, out  # the first time the heap grows ...
    assert all(f < pages // 20 for f in out["retain"]["faults"][1:]), out  # ... then its pages are reused


def test_host_memory_retain_is_refused_where_it_cannot_apply(monkeypatch):
    from trainperf.errors import ConfigError
    from trainperf.hardware import hostmem

    monkeypatch.setattr(hostmem.platform, "libc_ver", lambda: ("musl", "1.2"))
    with pytest.raises(ConfigError, match="run.host_memory=release"):
        resolve(load_config(None, BASE + ["run.host_memory=retain"]), world_size=1)
    assert hostmem.apply("release") is None  # the default asks nothing of the C library


def test_host_memory_is_searched_on_a_cpu_only():
    cfg = resolve(load_config(None, BASE), world_size=1).cfg
    cpu = space.host_memory(cfg, CPU)
    assert [o.settings for o in cpu.options] == [{"run.host_memory": "retain"}]
    gpu = space.host_memory(cfg, space.Facts("cuda", cpus=2))
    assert not gpu.options and "device memory" in gpu.rejected[0][1]


def test_a_paired_trial_is_faster_only_when_its_rounds_are_too_consistent_for_noise():
    from types import SimpleNamespace

    from trainperf.tune.result import TrialRecord
    from trainperf.tune.search import _Search
    from trainperf.tune.stats import faster, signed_rank_p, verdict

    # exact null distribution: n = 4, every sign pattern 1/16; all four positive is the one pattern of sum 10
    assert signed_rank_p([0.1, 0.2, 0.3, 0.4]) == pytest.approx(1 / 16)
    assert signed_rank_p([-0.1, 0.2, 0.3, 0.4]) == pytest.approx(2 / 16)  # sums 9 and 10
    assert signed_rank_p([-0.1, -0.2, -0.3, -0.4]) == 1.0 and signed_rank_p([]) == 1.0
    # the size of each round counts: one small loss among large wins is still evidence, a large one is not
    assert signed_rank_p([0.05, 0.06, 0.04, 0.07, -0.01, 0.05]) < 0.05 < signed_rank_p([0.05, 0.06, 0.04, 0.07, -0.2, 0.05])
    assert faster([1.05, 1.06, 1.04, 1.07, 1.05]) and not faster([1.05, 1.06, 0.9, 1.07])
    s = SimpleNamespace(opts=Options(), best=None)

    def rec(ratio, p):
        r = TrialRecord({}, "ok")
        r.vs_best, r.rounds_won, r.p_faster = ratio, "-", p
        return r

    assert _Search.better(s, rec(1.05, 0.03)) and _Search.better(s, rec(1.01, 0.001))
    assert not _Search.better(s, rec(1.20, 0.2)) and not _Search.better(s, rec(0.99, 0.01))
    # the sequential verdict: open while close, decided when clear either way
    assert verdict([1.05, 0.98, 1.04, 1.01], margin=0.02) is None
    assert verdict([1.05, 1.03, 1.04, 1.01, 1.02], margin=0.02) == "faster"
    assert verdict([0.9, 0.95, 1.01, 0.93], margin=0.02) == "not faster"


def test_a_close_paired_trial_takes_more_rounds_and_a_clear_one_stops():
    from trainperf.tune.trial import interleave

    class Side:
        def __init__(self, times):
            self.times, self.tokens_per_step, self.faults = iter(times), 100, 0

        def steps(self, k):
            return [next(self.times) for _ in range(k)]

    # b 5% faster in every round: decided after the 4 rounds asked? p = 1/16: one more round (1/32)
    clear = interleave(Side([1.05] * 99), Side([1.0] * 99), rounds=4, steps=1, margin=0.02, max_rounds=12)
    assert clear["rounds"] == 5 and clear["speedup"] == pytest.approx(1.05)
    # alternately faster and slower: no verdict, all 12 rounds
    noisy = interleave(Side([1.0] * 99), Side([0.97, 1.03] * 50), rounds=4, steps=1, margin=0.02, max_rounds=12)
    assert noisy["rounds"] == 12
    # clearly slower: stops at the rounds asked
    slow = interleave(Side([1.0] * 99), Side([1.2] * 99), rounds=4, steps=1, margin=0.02, max_rounds=12)
    assert slow["rounds"] == 4 and slow["speedup"] < 0.9


def test_a_deadline_cuts_no_final_round_before_the_test_can_say_faster():
    """Under load the final side-by-side once ran out of budget after 4 rounds, every one faster at x1.67:
    p = 1/16, "not faster", and the tuned config kept its needless checkpointing. The deadline now stops
    rounds only after MIN_ROUNDS (5: p = 1/32 < 0.05), and one faster round more is then enough."""
    import time

    from trainperf.tune import stats
    from trainperf.tune.trial import interleave

    class Side:
        def __init__(self, t):
            self.t, self.tokens_per_step, self.faults = t, 100, 0

        def steps(self, k):
            return [self.t] * k

    assert stats.MIN_ROUNDS == 5 and 2.0 ** -(stats.MIN_ROUNDS - 1) >= stats.P > 2.0 ** -stats.MIN_ROUNDS
    past = time.monotonic() - 1.0  # the budget is already spent
    cut = interleave(Side(1.67), Side(1.0), rounds=60, steps=1, deadline=past)
    assert cut["rounds"] == 1  # without a floor: the first round only (the least a figure needs)
    held = interleave(Side(1.67), Side(1.0), rounds=60, steps=1, deadline=past, min_rounds=stats.MIN_ROUNDS)
    assert held["rounds"] == stats.MIN_ROUNDS and stats.faster(held["round_ratios"])


def test_a_users_script_without_a_main_guard_starts_workers_once(tmp_path):
    """tune()'s workers never re-import the caller's main module (multiprocessing would, and a script
    without an ``if __name__ == "__main__"`` guard would then run again in every worker)."""
    import subprocess
    import sys

    script = tmp_path / "mine.py"
    script.write_text(
        "from trainperf.config import load_config\n"
        "from trainperf.train.resolve import resolve\n"
        "from trainperf.tune.trial import Worker\n"
        f"cfg = resolve(load_config(None, {BASE!r}), world_size=1).cfg\n"
        "print('script body ran', flush=True)\n"
        "w = Worker(cfg, global_batch=cfg.train.global_batch, warmup=1)\n"
        "print('steps', len(w.steps(2)), flush=True)\n"
        "w.close()\n")
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=180,
                       cwd=str(tmp_path), env={**__import__("os").environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.count("script body ran") == 1 and "steps 2" in r.stdout, r.stdout


@pytest.mark.slow
def test_ctrl_c_on_a_real_tune_keeps_the_best_and_leaves_no_process_behind(tmp_path):
    """The terminal's Ctrl-C (SIGINT to the whole process group: the tuner, its forkserver and its
    trial workers) while trials run: exit code 130, the best so far written and said to be
    unconfirmed, and every worker process gone."""
    import os
    import signal
    import subprocess
    import sys
    import time

    import psutil

    out = tmp_path / "tune"
    args = [sys.executable, "-m", "trainperf", "tune", "configs/gpt-tiny.yaml", "--budget-min", "5", "--out", str(out)]
    for kv in BASE:
        args += ["--set", kv]
    p = subprocess.Popen(args, cwd=str(REPO), env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        trials = out / "trials.jsonl"
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline and p.poll() is None:
            lines = trials.read_text().splitlines() if trials.exists() else []
            if len([x for x in lines if '"status": "ok"' in x]) >= 2:  # the default and one paired trial ran
                break
            time.sleep(0.5)
        assert p.poll() is None, p.communicate()[1][-2000:]
        family = psutil.Process(p.pid).children(recursive=True)
        assert family, "the trials run in worker processes"
        os.killpg(p.pid, signal.SIGINT)
        stdout, stderr = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    assert p.returncode == 130, stderr[-2000:]
    assert "interrupted" in stdout and "Traceback" not in stderr
    assert json.loads((out / "settings.json").read_text())["interrupted"] is True
    _, alive = psutil.wait_procs(family, timeout=20)
    assert not alive, [a.cmdline()[:3] for a in alive]


def test_threads_are_searched_from_four_cpus_per_rank():
    cfg = resolve(load_config(None, BASE + ["run.threads=8"]), world_size=1).cfg
    big = space.threads(cfg, space.Facts("cpu", cpus=8))
    assert [o.settings for o in big.options] == [{"run.threads": 4}]
    small = space.threads(resolve(load_config(None, BASE + ["run.threads=2"]), world_size=1).cfg, CPU)
    assert not small.options and "2 usable CPU(s) per rank" in small.rejected[0][1]
    two_ranks = space.threads(cfg, space.Facts("cpu", cpus=8, world_size=4))
    assert not two_ranks.options  # 2 CPUs per rank


def test_a_default_too_slow_for_the_budget_is_an_error_that_says_what_to_do(tmp_path):
    from trainperf.errors import UserError
    from trainperf.tune.trial import WorkerError

    fake = Fake(lambda s: WorkerError("Timeout", "the trial gave no answer within 55 s, the time left in the budget"))
    with pytest.raises(UserError, match=r"did not finish its first steps within the 1000 s budget .*raise --budget-min"):
        _run(tmp_path, fake)


class FakePaired:
    """:class:`trainperf.tune.trial.Paired` with figures chosen by the test: a candidate's trial is
    ``ratio(settings)`` against the best in every one of its rounds, and takes ``cost`` seconds of the
    :class:`Fake` clock; the deadlines each call was given are kept."""

    def __init__(self, fake, ratio, cost, final_ratio=1.5):
        self.fake, self.ratio, self.cost, self.final_ratio = fake, ratio, cost, final_ratio
        self.deadlines: list[float] = []
        self.finals = 0

    def _measured(self, tps, paired=None):
        return Measured(tps, 100.0 / tps, 0.5, 0.5, self.cost, 1000, "fake", {"minor_faults_per_step": 0}, 1, paired)

    def run_default(self, cfg, *, steps, deadline=None):
        self.fake.now += self.cost
        return self._measured(100.0)

    def run(self, cfg, *, deadline=None):
        import time

        from trainperf.tune.stats import p_faster

        self.deadlines.append(deadline - time.monotonic())  # seconds the trial was allowed
        self.fake.now += self.cost
        r = self.ratio(space.settings_of(cfg))
        rounds = [r] * 5
        return self._measured(100.0 * r, {"speedup": r, "b_faster_rounds": 5 if r > 1 else 0, "rounds": 5,
                                          "p_faster": p_faster(rounds), "b_tokens_per_s": 100.0 * r,
                                          "b_step_s": 1.0 / r, "b_minor_faults_per_step": 0})

    def adopt(self, keep):
        pass

    def final(self, *, rounds, steps, deadline=None):
        self.finals += 1
        r = self.final_ratio
        return {"a_tokens_per_s": 100.0, "b_tokens_per_s": 100.0 * r, "speedup": r, "round_ratios": [r] * 5,
                "b_faster_rounds": 5, "rounds": 5, "p_faster": 1 / 32, "method": "fake"}

    def close(self):
        pass


def test_a_best_adopted_by_paired_trials_is_kept_when_the_final_does_not_fit(tmp_path):
    """CI, under load: the last trial overran, 2 s were left for a 6 s final side-by-side, and the tuner
    kept the default although checkpointing none had won every paired round (x1.47, p = 0.031). A best
    adopted by paired trials is now kept, its chain of paired wins named and no speed-up claimed; with
    the time, the final measures it; a trial's extra rounds stop short of the final's reserve."""
    def ratio(s):
        return 1.5 if s["memory.checkpointing.mode"] == "none" else 0.9

    cfg = load_config(None, BASE + ["memory.checkpointing.mode=full"])

    def run(budget_s, cost):
        fake = Fake(lambda s: 100.0, cost=cost)
        fp = FakePaired(fake, ratio, cost)
        res = tune(cfg, out_dir=tmp_path / f"tune{budget_s}", options=Options(budget_s=budget_s, progress=False),
                   facts=CPU, clock=fake.clock, trial_fn=fake.trial, sbs_fn=fake.sbs, paired=fp)
        return res, fp

    # time for the final: it measures the best against the default, and its ratio is the speed-up
    res, fp = run(1000.0, 1.0)
    assert fp.finals == 1 and res.best.settings["memory.checkpointing.mode"] == "none"
    assert res.speedup == pytest.approx(1.5)
    # the final cannot fit after the first trial (step 1 s per side: 30 s for 6 rounds of 3 steps): kept anyway
    res, fp = run(31.0, 10.0)
    ran = [t for t in res.trials if t.status == "ok"]
    assert ran[1].changed == {"memory.checkpointing.mode": "none"} and fp.finals == 0
    assert res.best.settings["memory.checkpointing.mode"] == "none" and res.speedup is None
    assert any("no time left" in n for n in res.notes)
    assert any("kept on its paired trials" in n and "x1.500" in n and "p=0.031" in n for n in res.notes), res.notes
    assert not any("the default is kept" in n for n in res.notes)
    assert load_config(res.config_path).memory.checkpointing.mode == "none"
    # each trial's deadline leaves the final's reserve: (budget - elapsed) - WRITE_S - 2 x 18 steps x step_s
    from trainperf.tune.search import WRITE_S

    res, fp = run(1000.0, 1.0)
    assert fp.deadlines and fp.deadlines[0] == pytest.approx(1000.0 - 1.0 - WRITE_S - 18 * (1.0 + 1.0), abs=0.5)
