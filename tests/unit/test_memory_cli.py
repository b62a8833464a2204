"""``trainperf memory``: JSON shape, estimate vs measurement, bad input exits 2."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn as nn

from trainperf.cli import main

SMALL = ["--set", "model.n_layer=2", "--set", "model.n_embd=64", "--set", "model.n_head=4",
         "--set", "model.block_size=32", "--set", "train.micro_batch=4", "--set", "train.global_batch=4",
         "--set", "run.device=cpu", "--set", "precision.dtype=fp32"]
KEYS = {"params", "grads", "optimizer", "activations", "total"}


class FlatModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(64, 16)
        self.head = nn.Linear(16, 64)

    def forward(self, idx, targets):
        logits = self.head(self.emb(idx))
        return logits, nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())


def flat_model(cfg):
    return FlatModel()


@pytest.fixture(autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def test_json_measure_every_mode_within_10pct(capsys):
    assert main(["memory", *SMALL, "--measure", "--reps", "1", "--budget-gb", "1", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    labels = [(m["mode"], m["ratio"]) for m in report["modes"]]
    assert labels[:5] == [("none", None), ("ratio", 0.25), ("ratio", 0.5), ("full", None), ("selective", None)]
    for m in report["modes"]:
        assert set(m["estimate_bytes"]) == KEYS and set(m["measured_bytes"]) == KEYS
        est, meas = m["estimate_bytes"], m["measured_bytes"]
        assert abs(est["activations"] / meas["activations"] - 1) <= 0.10, m["label"]
        assert est["params"] == meas["params"] and est["grads"] == meas["grads"]
        assert abs(est["optimizer"] / meas["optimizer"] - 1) <= 0.01
        assert m["step_time_s"] > 0 and m["max_micro_batch"] >= 1
    by = {m["label"]: m for m in report["modes"]}
    assert by["full"]["max_micro_batch"] > by["none"]["max_micro_batch"]


def test_table_without_measure(capsys):
    assert main(["memory", *SMALL, "--budget-gb", "2"]) == 0
    out = capsys.readouterr().out
    assert "ratio 0.25" in out and "selective" in out and "max mb" in out


@pytest.mark.parametrize("argv,needle", [
    (["--set", "memory.checkpointing.mode=ratio", "--set", "memory.checkpointing.ratio=1.5"], "(0, 1]"),
    (["--set", "memory.checkpointing.mode=ratio", "--set", "memory.checkpointing.ratio=0"], "(0, 1]"),
    (["--set", "memory.checkpointing.blocks=transformer.h"], "candidates: 'layers'"),
    (["--budget-gb", "0.000001"], "below the minimum possible"),
    (["--set", "memory.checkpointing.mode=budget", "--set", "memory.checkpointing.budget_gb=0.000001"],
     "below the minimum possible"),
    (["--set", "model.entrypoint=tests.unit.test_memory_cli:flat_model", "--set", "memory.checkpointing.mode=ratio"],
     "needs repeated blocks"),
])
def test_bad_input_exits_2(argv, needle, capsys):
    assert main(["memory", *SMALL, *argv]) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err
