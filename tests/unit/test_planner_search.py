"""Planner search: ranking, rejects, fixed parts, speed, the founding document's 175B case."""

from __future__ import annotations

import time

import pytest

from trainperf.errors import UserError
from trainperf.hardware.catalog import get_gpu
from trainperf.planner import Fixed, from_preset, search
from trainperf.planner.search import default_global_batch, explain, rank_of

A100 = get_gpu("a100-80gb")


def test_1t_on_3072_gpus_under_two_seconds():
    model = from_preset("gpt3-1t")
    batch, _ = default_global_batch(model, 3072)
    t0 = time.process_time()  # CPU seconds of this process: another job on the machine does not count
    plan = search(model, A100, 3072, batch)
    elapsed = time.process_time() - t0
    print(f"1T on 3072 A100: {plan.evaluated} layouts in {elapsed:.3f} CPU s")
    assert elapsed < 2.0
    assert plan.evaluated > 1000 and plan.candidates
    for est in plan.candidates:
        assert est.fits and est.layout.gpus == 3072


def test_seed_case_ranks_and_is_explained():
    model = from_preset("gpt3-175b")
    plan = search(model, A100, 512, 1536)
    times = [e.step_time_s for e in plan.candidates]
    assert times == sorted(times)
    found = rank_of(plan, 8, 4, 16)
    assert found is not None
    rank, est = found
    assert est.layout.as_dict()["tp"] == 8 and est.memory_bytes <= A100.hbm_bytes
    if rank > 1:
        assert explain(plan.best, est)  # says which components make the best faster
    # Layouts without tensor parallelism cannot hold 175B with 4 pipeline stages: rejected with a shortfall.
    ooms = [r for r in plan.rejected if "out of memory" in r["reason"]]
    assert ooms and all(r["short_by_gib"] > 0 for r in ooms)


def test_fixed_parts_are_respected():
    model = from_preset("gpt3-175b")
    plan = search(model, A100, 512, 1536, Fixed(tp=4, recompute="full", sequence_parallel=False))
    for est in plan.candidates:
        L = est.layout
        assert L.tp == 4 and L.recompute == "full" and not L.sequence_parallel


def test_rejects_name_the_reason():
    model = from_preset("gpt3-175b")
    plan = search(model, A100, 512, 1536)
    reasons = " | ".join(r["reason"] for r in plan.rejected)
    assert "does not divide 96 layers" in reasons


@pytest.mark.parametrize("fixed,match", [
    (Fixed(tp=5), "does not divide the 96 attention heads"),
    (Fixed(pp=7), "does not divide the 96 layers"),
    (Fixed(tp=8, pp=4, dp=8), "must be equal"),
])
def test_bad_fixed_degrees(fixed, match):
    with pytest.raises(UserError, match=match):
        search(from_preset("gpt3-175b"), A100, 512, 1536, fixed)


def test_nothing_fits_says_shortfall_and_fix():
    with pytest.raises(UserError) as exc:
        search(from_preset("gpt3-175b"), get_gpu("a100-40gb"), 8, 64)
    msg = str(exc.value)
    assert "GiB over" in msg and "--gpus" in msg


def test_small_model_prefers_pure_data_parallel():
    # 1.3B fits on one GPU: splitting it by tensor or pipeline only adds communication.
    plan = search(from_preset("gpt3-1.3b"), A100, 8, 256)
    assert (plan.best.layout.tp, plan.best.layout.pp) == (1, 1)
