"""Every layout matches one process (CPU, gloo, 2 and 4 processes, tiny GPT, 3 steps), driven
through the real ``Trainer.train_step`` on both sides (trainperf.bench.harness.run_trainer).

Tolerances (fp32): per-step loss within a relative 1e-5 of the one-process loss of the same
global batch, and every gathered parameter within an absolute 1e-4 after the steps (AdamW at
lr 3e-3 moves a parameter by up to 3e-3 a step, so 1e-4 is a thirtieth of one step; only the
summation order differs), and every step's clipped gradient norm within a relative 1e-5 (FSDP2 x
tensor once read 1.5% low: its 2-D shards' norms were not summed over the FSDP group). Compressed gradients (fp16, bf16, PowerSGD) change the numbers by design:
trained 6 steps on one repeated batch (the loss falls by > 0.5), every step's loss must stay
within a relative 1e-2 of the one-process loss (fp16, bf16); PowerSGD rank 4 (a low-rank
approximation, slower on this memorization task) must end within 15% of the reference's final
loss with at least half its drop, and hand at least 10x fewer gradient bytes to all-reduce than
uncompressed DDP (hidden 128).
"""

from __future__ import annotations

import os

import pytest

import dist_cases
from trainperf.distributed.spawn import spawn

pytestmark = pytest.mark.distributed

LOSS_RTOL = 1e-5
GRAD_NORM_RTOL = 1e-5
PARAM_ATOL = 1e-4
COMPRESSED_LOSS_RTOL = 1e-2
POWERSGD_FINAL_RTOL = 0.15


@pytest.fixture(scope="module")
def two():
    os.environ["OMP_NUM_THREADS"] = "1"
    return spawn(dist_cases.two_process, 2, timeout_s=dist_cases.COLLECTIVE_TIMEOUT_S)


@pytest.fixture(scope="module")
def four(tmp_path_factory):
    os.environ["OMP_NUM_THREADS"] = "1"
    return spawn(dist_cases.four_process, 4, str(tmp_path_factory.mktemp("dcp")), timeout_s=dist_cases.COLLECTIVE_TIMEOUT_S)


def _check(res, param_atol=PARAM_ATOL, loss_rtol=LOSS_RTOL):
    assert len(res["losses"]) == len(res["ref_losses"])
    for got, ref in zip(res.get("grad_norms") or [], res.get("ref_grad_norms") or []):
        # the clipped norm is the whole model's, every shard once (FSDP2 x TP once under-counted it by 1.5%)
        assert got is not None and ref is not None and abs(got - ref) <= GRAD_NORM_RTOL * ref, (
            res["grad_norms"], res["ref_grad_norms"])
    for got, ref in zip(res["losses"], res["ref_losses"]):
        assert abs(got - ref) <= loss_rtol * abs(ref), (res["losses"], res["ref_losses"])
    assert set(res["params"]) == set(res["ref_params"]), "gathered parameters must be the full model's"
    worst = max((res["params"][k] - res["ref_params"][k]).abs().max().item() for k in res["ref_params"])
    loss_rel = max(abs(g - r) / abs(r) for g, r in zip(res["losses"], res["ref_losses"]))
    print(f"\n[layout figures] loss rel. diff {loss_rel:.1e}, parameter abs. diff {worst:.1e}")  # pytest -s
    assert worst <= param_atol, f"largest parameter difference {worst:.2e} > {param_atol:.0e}"
    return worst


@pytest.mark.parametrize("case", ["data2", "fsdp2", "tensor2", "tensor2_sp", "pp2_gpipe", "pp2_1f1b",
                                  "pp2_interleaved", "data2_balance"])
def test_two_process_layout_matches_one_process(two, case):
    _check(two[case])


def test_the_balancer_case_ran_the_balanced_step(two):
    assert all(s == [4, 4] for s in two["data2_balance"]["shares"])  # per-rank shares of the global batch 8
    assert all(s is None for s in two["data2"]["shares"])


def test_ddp_bytes_are_counted_per_step(two):
    comm = two["data2"]["comm"]
    n_params = sum(v.numel() for v in two["data2"]["ref_params"].values())
    assert all(c["comm_payload_bytes"] == 4 * n_params for c in comm)  # fp32 gradients, once per step
    assert all(c["comm_wire_bytes"] == 4 * n_params for c in comm)  # ring, n=2: 2(n-1)/n = 1
    half = two["data2_fp16"]["comm"][-1]["comm_payload_bytes"]
    assert half == 2 * n_params


@pytest.mark.parametrize("case", ["data2_fp16", "data2_bf16", "data2_bf16_gather"])
def test_16_bit_compression_reaches_the_reference_loss(two, case):
    _check_compressed(two[case])


def _check_compressed(res):
    ref = res["ref_losses"]
    assert ref[0] - ref[-1] > 0.5, f"the reference should learn the repeated batch: {ref}"
    for got, want in zip(res["losses"], ref):
        assert abs(got - want) <= COMPRESSED_LOSS_RTOL * abs(want), (res["losses"], ref)


def test_uncompressed_repeated_batch_run_is_exact(two):
    _check(two["data2_plain"])


def test_bf16_gather_fallback_sends_16_bit_payloads(two):
    n_params = sum(v.numel() for v in two["data2"]["ref_params"].values())
    assert two["data2_bf16_gather"]["comm"][-1]["comm_payload_bytes"] == 2 * n_params


def test_powersgd_rank4_sends_at_least_10x_fewer_bytes(two):
    plain = two["wide_data2"]["comm"][-1]["comm_payload_bytes"]
    warm = two["wide_powersgd"]["comm"][0]["comm_payload_bytes"]
    compressed = two["wide_powersgd"]["comm"][-1]["comm_payload_bytes"]
    assert warm == plain  # warm-up steps are plain all-reduces
    assert plain / compressed >= 10, f"PowerSGD sent {compressed} bytes vs {plain}: only {plain / compressed:.1f}x"
    # Low-rank gradients learn the repeated batch more slowly: measured final loss 2.94 vs 2.61
    # (12.6% above). Stated tolerance: final loss within 15% and at least half the reference's drop.
    res = two["wide_powersgd"]
    got, ref = res["losses"], res["ref_losses"]
    assert abs(got[-1] - ref[-1]) <= POWERSGD_FINAL_RTOL * ref[-1], (got, ref)
    assert ref[0] - got[-1] >= 0.5 * (ref[0] - ref[-1]), (got, ref)


@pytest.mark.parametrize("case", ["data2_tensor2", "pp2_data2", "hsdp_2x2", "pp2_tp2_sp_ac"])
def test_four_process_layout_matches_one_process(four, case):
    _check(four[case])


@pytest.mark.parametrize("case", ["fsdp2_tensor2", "fsdp2_tensor2_sp"])
def test_fsdp_x_tensor_matches_one_process(four, case):
    """FSDP2 over TP shards the data dim with _StridedShard, whose is_shard() is False in torch 2.13: its norms were
    never summed over the FSDP group, so clipping used 8.72 where one process has 8.84, and the parameters
    drifted 1.6e-4 in 3 steps (once put down to reassociation and given a 5x looser bound)."""
    _check(four[case])


@pytest.mark.parametrize("case", ["resume_data2_tensor2", "resume_pp2_data2"])
def test_resharded_resume_continues_exactly(four, case):
    _check(four[case])
