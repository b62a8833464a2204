"""``trainperf tune --nproc-per-node 2``: each trial is a group of 2 gloo ranks launched as torchrun
would, the planner's layouts for 2 ranks are candidates, every candidate keeps the global batch,
and a rank that dies ends its group at once (no rank left waiting in a collective)."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from tests.conftest import TINY
from trainperf.config import load_config
from trainperf.train.resolve import resolve
from trainperf.tune.search import Options, tune

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

BASE = TINY + ["data.source=synthetic", "monitor.jsonl=false", "model.n_head=4", "model.n_embd=64",
               "train.global_batch=16", "train.micro_batch=8"]
BUDGET_S = 180


def test_tune_on_two_ranks_searches_the_planners_layouts_and_keeps_the_global_batch(tmp_path):
    cfg = load_config(None, BASE)
    # the budget is generous for a loaded machine: the layouts are searched first (tune/order.py), but each
    # needs the default's measured cost x 1.25 left (a group's default trial took 35 s beside two CPU hogs)
    res = tune(cfg, out_dir=tmp_path / "tune", options=Options(budget_s=BUDGET_S, steps=2, warmup=1, trial_rounds=3,
                                                               trial_max_rounds=4, rounds=3, max_rounds=6,
                                                               compile_prior_s=1e9, progress=False, nproc=2))
    layouts = [t for t in res.trials if t.dimension == "layout"]
    assert layouts and any(t.status == "ok" for t in layouts), [(t.status, t.reason) for t in layouts]
    for t in res.trials:
        if t.status == "ok":  # a group of 2 ranks: whatever the layout, data x shard x tensor x pipeline = 2
            p = {k: t.settings[f"parallelism.{k}"] for k in ("data", "data_shard", "tensor", "pipeline")}
            assert p["data"] * p["data_shard"] * p["tensor"] * p["pipeline"] == 2, t.settings
            assert t.tokens_per_s > 0 and t.vs_best is None or t.vs_best > 0
    chosen = [t for t in res.trials if t.settings == res.best.settings]
    assert chosen and chosen[0].status == "ok"
    tuned = resolve(load_config(res.config_path), world_size=2).cfg  # the tuned YAML runs on 2 ranks
    assert tuned.train.global_batch == 16
    doc = json.loads((tmp_path / "tune" / "result.json").read_text())
    assert doc["best"]["settings"] == res.best.settings and res.elapsed_s <= BUDGET_S + 20


def test_a_rank_that_dies_ends_its_group_without_a_hang():
    from trainperf.tune.trial import WorkerError, WorkerGroup

    cfg = resolve(load_config(None, BASE + ["parallelism.data=2"]), world_size=2).cfg
    g = WorkerGroup(cfg, global_batch=16, warmup=1, nproc=2, timeout_s=120)
    try:
        assert len(g.steps(2)) == 2 and g.measured.peak_memory_source.endswith("(the largest of 2 ranks)")
        os.kill(g.workers[1].proc.pid, signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(WorkerError) as died:
            g.steps(3)  # rank 0 would wait for rank 1 in the all-reduce until the collective timeout
        assert died.value.kind == "WorkerDied" and "rank 1" in str(died.value)
        assert time.monotonic() - t0 < 60
        assert not any(w.proc.is_alive() for w in g.workers)
    finally:
        g.close()
