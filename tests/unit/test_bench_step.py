"""bench step: runs both loops on the same model and reports the ratio."""

from __future__ import annotations

import json

from trainperf.cli import main


def test_bench_step_json(capsys):
    ov = ["model.n_layer=1", "model.n_embd=32", "model.n_head=2", "model.block_size=16", "train.global_batch=4",
          "train.micro_batch=4", "run.threads=1"]
    assert main(["bench", "step", "--rounds", "2", "--steps", "2", "--warmup", "1", "--json",
                 "--variants", "bf16", "fp16+scaler", *sum((["--set", o] for o in ov), [])]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["trainer_step_s"] > 0 and res["plain_step_s"] > 0
    assert abs(res["overhead"] - (res["trainer_step_s"] / res["plain_step_s"] - 1)) < 1e-12
    assert "interleaved" in res["method"]
    (bf16,) = res["variants"]
    assert bf16["name"] == "bf16" and bf16["speedup_vs_trainer_fp32"] == res["trainer_step_s"] / bf16["step_s"]
    if res["device"] == "cpu":
        assert "needs CUDA" in res["skipped"]["fp16+scaler"]


def test_bench_step_rejects_accumulation(capsys):
    assert main(["bench", "step", "--set", "train.global_batch=8", "--set", "train.micro_batch=4"]) == 2
    assert "global_batch = train.micro_batch" in capsys.readouterr().err
