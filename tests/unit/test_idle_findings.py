"""Causes become findings: a real rank edited to carry one known host cause of idle GPU time (trainperf.tracegen
.causes) gets the finding of that cause, with the idle it charges within 5% of the injected time per step, the
cause's own fix, and a gain from the replayed step; an expert-tuned trace gets none of them."""

from __future__ import annotations

import pytest

from tests.unit.trace_fixtures import TRACES, real_trace
from trainperf.diagnosis.engine import diagnose_path
from trainperf.tracegen.causes import inject

BASE = real_trace("tb-data/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz")  # V100, data-bound
NS = real_trace("hta-data/tests/data/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz")  # GPU-bound
NCCL = real_trace("hta-data/tests/data/nccl_parser_config/nccl_data.json.gz")  # A100, host-bound
IDLE_RULES = {"allocator_churn", "host_bound", "optimizer_step", "gc_pauses", "untraced_host", "gpu_wait",
              "launch_bound", "host_syncs"}


def _by_id(path) -> dict:
    return {f["id"]: f for f in diagnose_path(path)["findings"]}


@pytest.fixture(scope="module")
def base():
    return _by_id(BASE)


@pytest.mark.parametrize("src, cause, us, rule, fix_words", [
    (NS, "free", 3000, "allocator_churn", "empty_cache"),
    (NS, "optimizer", 80000, "optimizer_step", "fused=True"),
    (NCCL, "python", 20000, "host_bound", "torch.compile"),
])
def test_an_injected_cause_is_its_finding_with_its_time(tmp_path, src, cause, us, rule, fix_words):
    """The truth is what the edit added to the step (the GPU's work unchanged: the idle it added)."""
    truth = inject(src, tmp_path / f"{cause}.json.gz", cause, us=us)
    got = _by_id(truth["path"])
    assert rule in got, list(got)
    f = got[rule]
    before = (_by_id(src).get(rule) or {}).get("idle_us_per_step", 0.0)
    assert f["idle_us_per_step"] - before == pytest.approx(truth["truth_us_per_step"], rel=0.05)
    assert fix_words in f["fix"] and f["gain"] and f["gain"]["after"] < f["gain"]["before"]


def test_the_allocator_on_rocm_names_is_the_same_finding(tmp_path):
    truth = inject(NS, tmp_path / "hip.json.gz", "free", us=3000, rocm=True)
    f = _by_id(truth["path"])["allocator_churn"]
    assert "hipFree" in f["evidence"] and "PYTORCH_HIP_ALLOC_CONF" in f["fix"]


def test_no_idle_finding_on_an_expert_tuned_trace():
    got = _by_id(TRACES / "fp8_tuned_gen_single_ns.json.gz")
    assert not (IDLE_RULES & set(got)), list(got)


def test_launch_bound_only_where_launches_are_the_cause(base):
    """The ResNet-50 rank idles 43% of its step, a third of it on the DataLoader: not a launch problem."""
    assert "launch_bound" not in base and "data_bound" in base
    assert base["data_bound"]["idle_us_per_step"] > 0
