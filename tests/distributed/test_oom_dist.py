"""Out-of-memory recovery under DDP (2 gloo processes): an OOM on one rank is agreed on by both,
both halve the micro-batch together, the global batch stays, and training goes on from the same step.

Tolerance: the recovered run and a run that used the smaller micro-batch from the start do the
same arithmetic in the same order (4 micro-steps of 2 per rank), so losses are compared at a
relative 1e-6 and parameters at an absolute 1e-6 (fp32; measured: identical)."""

from __future__ import annotations

import os

import pytest

import dist_cases
from trainperf.distributed.spawn import spawn

pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module")
def oom():
    os.environ["OMP_NUM_THREADS"] = "1"
    return spawn(dist_cases.oom_recovery, 2, timeout_s=dist_cases.COLLECTIVE_TIMEOUT_S)


def test_an_oom_in_the_only_micro_step_is_agreed_before_the_gradient_all_reduce():
    """Micro-batch 8 = the rank's whole batch: its one micro-step is the synchronized one (DDP's all-reduce
    runs in its backward). Rank 1's OOM in the forward is agreed on between forward and backward: both
    ranks go to 4 x 2 together, no hang, and the run matches micro-batch 4 from the start."""
    os.environ["OMP_NUM_THREADS"] = "1"
    got = spawn(dist_cases.oom_recovery, 2, 8, 4, timeout_s=dist_cases.COLLECTIVE_TIMEOUT_S)
    assert got["per_rank"] == [(4, 2), (4, 2)]
    events = [e for e in got["events"] if e]
    assert len(events) == 1 and events[0]["oom/old_micro_batch"] == 8 and events[0]["oom/new_micro_batch"] == 4
    for a, b in zip(got["losses"], got["small_losses"]):
        assert abs(a - b) <= 1e-6 * abs(b), (got["losses"], got["small_losses"])
    worst = max((got["params"][k] - got["small_params"][k]).abs().max().item() for k in got["small_params"])
    assert worst <= 1e-6, worst


def test_both_ranks_shrink_together_and_keep_the_global_batch(oom):
    assert oom["per_rank"] == [(2, 4), (2, 4)]  # every rank: micro-batch 2, accumulation 4 (8 samples per rank)
    events = [e for e in oom["events"] if e]
    assert len(events) == 1 and events[0]["oom/step"] == 0
    assert events[0]["oom/old_micro_batch"] == 4 and events[0]["oom/new_micro_batch"] == 2
    assert "injected" in events[0]["oom/reason"] or "another rank" in events[0]["oom/reason"]


def test_recovered_run_matches_the_small_micro_batch_run(oom):
    assert len(oom["losses"]) == len(oom["small_losses"]) == 4
    for got, ref in zip(oom["losses"], oom["small_losses"]):
        assert abs(got - ref) <= 1e-6 * abs(ref), (oom["losses"], oom["small_losses"])
    worst = max((oom["params"][k] - oom["small_params"][k]).abs().max().item() for k in oom["small_params"])
    assert worst <= 1e-6, worst
