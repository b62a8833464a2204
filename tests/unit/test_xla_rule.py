"""The ``xla_recompile`` rule on recorded step figures (no torch_xla needed)."""

from __future__ import annotations

import json

from trainperf.diagnosis.engine import diagnose
from trainperf.diagnosis.rules_xla import recompile_finding


def _records(n: int, compiles_at: dict[int, int], shape_at=lambda step: [8, 64]) -> list[dict]:
    recs, total, secs = [], 0, 0.0
    for step in range(1, n + 1):
        c = compiles_at.get(step, 0)
        total += c
        secs += 2.0 * c
        recs.append({"step": step, "loss": 3.0, "step_time_s": 0.1 + 2.0 * c, "tokens_per_s": 1000.0,
                     "xla_compiles": total, "xla_compile_s": secs, "xla_step_compiles": c,
                     "xla_batch_shape": shape_at(step)})
    return recs


def test_warmup_compiles_only_is_healthy():
    assert recompile_finding(_records(40, {1: 2, 2: 1})) is None


def test_one_late_compile_is_not_growth():
    assert recompile_finding(_records(40, {1: 2, 2: 1, 30: 1})) is None


def test_changing_shape_names_the_step_and_shapes():
    shape = lambda step: [8, 64] if step < 20 else [8, 64 - (step % 4) * 8]  # noqa: E731
    f = recompile_finding(_records(40, {1: 2, 2: 1, 21: 1, 22: 1, 23: 1}, shape))
    assert f is not None
    assert f["step"] == 21
    assert f["previous_batch_shape"] == [8, 64] and f["batch_shape"] == [8, 56]
    assert "at step 21 the batch shape changed from [8, 64] to [8, 56]" in f["evidence"]
    assert f["compiles_after_warmup"] == 3
    assert f["severity"] == "critical"  # 6 s of compiling in ~8 s after warm-up


def test_diagnose_reports_it_from_metrics_jsonl(tmp_path):
    shape = lambda step: [4, 32] if step % 5 else [4, 24]  # noqa: E731
    recs = _records(30, {1: 2, 2: 1, 5: 1, 10: 1, 15: 1}, shape)
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    ids = [f["id"] for f in diagnose(tmp_path)["findings"]]
    assert "xla_recompile" in ids
    # a run without XLA figures never gets it
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps({k: v for k, v in r.items()
                                                                  if not k.startswith("xla")}) for r in recs))
    assert "xla_recompile" not in [f["id"] for f in diagnose(tmp_path)["findings"]]
