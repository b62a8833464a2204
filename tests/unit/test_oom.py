"""Out-of-memory recovery in one process (injected OutOfMemoryError; the 2-rank case is in
tests/distributed/test_oom.py)."""

from __future__ import annotations

import pytest
import torch

from trainperf.bench import harness as H
from trainperf.distributed.parallelize import is_oom
from trainperf.train.knobs import Knobs, from_environ


def _run(micro: int, on_oom: str, knobs=None, steps: int = 3):
    cfg = H.make_config({"parallelism.data": 1, "train.global_batch": 8, "train.micro_batch": micro,
                         "train.on_oom": on_oom})
    return H.run_trainer(cfg, H.batches(cfg, steps), knobs=knobs)


def test_halving_keeps_the_global_batch_and_the_losses():
    got = _run(8, "halve_micro_batch", Knobs(oom_above=(-1, 2)))  # 8 fails, 4 fails, 2 runs
    ref = _run(2, "error")
    t = got["trainer"]
    assert (t.micro_batch, t.accum) == (2, 4)
    events = [{k: v for k, v in e.items() if k.startswith("oom/")} for e in got["extras"]]
    e = events[0]
    assert (e["oom/old_micro_batch"], e["oom/new_micro_batch"], e["oom/halvings"], e["oom/step"]) == (8, 2, 2, 0)
    assert all(not e for e in events[1:])
    assert "continued with 2 x 4" in t.notes["on_oom"]
    for a, b in zip(got["losses"], ref["losses"]):
        assert abs(a - b) <= 1e-6 * abs(b)


def test_error_policy_stops_with_the_out_of_memory_error():
    with pytest.raises(torch.OutOfMemoryError, match="injected"):
        _run(8, "error", Knobs(oom_above=(-1, 2)))


def test_nothing_smaller_than_one_sample():
    with pytest.raises(torch.OutOfMemoryError):
        _run(2, "halve_micro_batch", Knobs(oom_above=(-1, 0)))


def test_what_counts_as_out_of_memory():
    assert is_oom(torch.OutOfMemoryError("CUDA out of memory"))
    assert is_oom(RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1 bytes"))
    assert not is_oom(RuntimeError("shape mismatch"))


def test_the_cli_knob_comes_from_the_environment_only_at_the_edge():
    assert from_environ({"TRAINPERF_OOM_ABOVE": "1:4"}).oom_above == (1, 4)
    assert from_environ({}) == Knobs()


def test_the_diagnosis_reports_the_recovery(tmp_path):
    import json

    from trainperf.diagnosis.engine import diagnose

    recs = [{"step": i, "loss": 3.0, "lr": 1e-3, "step_time_s": 0.1, "tokens_per_s": 100.0,
             "phases_s": {"data": 0.0, "forward": 0.05, "backward": 0.05}} for i in range(1, 21)]
    recs[0].update({"oom/step": 0, "oom/old_micro_batch": 8, "oom/new_micro_batch": 2, "oom/accumulation": 4,
                    "oom/halvings": 2, "oom/reason": "injected"})
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    found = {f["id"]: f for f in diagnose(tmp_path)["findings"]}
    assert "oom_recovered" in found
    assert "micro-batch 8" in found["oom_recovered"]["evidence"] and "to 2" in found["oom_recovered"]["evidence"]


def test_weights_that_do_not_fit_end_with_what_to_do(monkeypatch, tmp_path, capsys):
    # a typo in model.n_embd: creating the weights fails in the allocator, deep inside Module.to_empty. The CLI
    # exits 2 with the model's size and the ways out, not a traceback. (The allocator is simulated: whether a
    # 4 TB request fails at once depends on the machine's overcommit setting.)
    import trainperf.models.build as mb
    from trainperf.cli import main

    def refuse(model, device, seed):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory: "
                           "you tried to allocate 4398046511104 bytes")

    monkeypatch.setattr(mb, "materialize_model", refuse)
    from pathlib import Path

    tiny = str(Path(__file__).resolve().parents[2] / "configs/gpt-tiny.yaml")
    rc = main(["train", tiny, "--set", "model.n_embd=4096", "--set", "model.n_head=32", "--set", "run.steps=1",
               "--set", f"run.dir={tmp_path / 'run'}"])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err, err
    assert "the model's weights do not fit on cpu" in err and "B parameters" in err
    assert "parallelism.data_shard" in err and "trainperf memory CONFIG" in err


def test_explain_materialize_oom_passes_other_errors_through():
    from trainperf.config import load_config
    from trainperf.distributed.parallelize import explain_materialize_oom
    from trainperf.errors import UserError

    cfg = load_config(None)
    with pytest.raises(ValueError, match="not memory"):
        with explain_materialize_oom(10, torch.device("cpu"), cfg):
            raise ValueError("not memory")
    with pytest.raises(UserError, match=r"1.50B parameters \(6.0 GB in fp32"):
        with explain_materialize_oom(1_500_000_000, torch.device("cpu"), cfg):
            raise torch.OutOfMemoryError("CUDA out of memory")
