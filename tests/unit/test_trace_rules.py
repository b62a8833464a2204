"""The diagnosis rules over trace evidence, on figures written by hand (as test_diagnose.py writes run
directories by hand): each rule fires on the case it names, with its gain, and stays quiet on a healthy
or an expert-tuned trace; what a trace cannot judge is listed as not measured with the reason."""

from __future__ import annotations

import copy
import json

import pytest

from trainperf.diagnosis.rules import RULES, rules_markdown
from trainperf.diagnosis.engine import contract, diagnose_results
from trainperf.diagnosis.text import format_traces
from trainperf.trace.ranks import across_ranks

BASE = {
    "path": "t.pt.trace.json.gz", "rank": 0, "device": "NVIDIA A100-SXM4-80GB",
    "device_info": {"name": "NVIDIA A100-SXM4-80GB", "compute_capability": "8.0"}, "steps": 4,
    "step_time_us": 100_000.0,
    "step_breakdown_pct": {"kernel": 90.0, "memcpy": 1.0, "memset": 0.0, "runtime": 3.0, "dataloader": 1.0,
                           "cpu_exec": 4.0, "other": 1.0},
    "gpu_utilization_pct": 95.0, "sm_efficiency_pct": 88.0, "achieved_occupancy_pct": 45.0,
    "tensor_core_kernel_pct": 85.0, "temporal_pct": {"compute": 90.0, "non_compute": 6.0, "idle": 4.0},
    "idle_pct": {"host_wait": 50.0, "kernel_wait": 40.0, "other": 10.0}, "comm_compute_overlap_pct": 97.0,
    "top_kernels": [{"name": "sm90_xmma_gemm_e4m3", "kind": "compute", "us": 40_000.0}],
    "launch": {"kernels": 4000, "short_kernel_pct": 5.0, "gpu_us_median": 60.0, "cpu_launch_us_median": 4.0},
    "memcpy": {"pageable_us_per_step": 0.0, "pageable_count_per_step": 0.0},
    "host_syncs": [], "dataloader": {"iterators": ["_MultiProcessingDataLoaderIter"]},
    "tensor_cores": {"fp32_eligible_us_per_step": 300.0, "top_fp32": []},
    "occupancy": {"pct": 60.0, "kernel_share": 0.4, "warp_specialized_share": 0.5},
    "comm": {"exposed_us_per_step": 1_500.0, "us_per_kind": {"allreduce": 20_000.0}},
    "_step_compute_us": [80_000.0] * 4, "_step_comm_us": [20_000.0] * 4, "_comm": [],
}


def trace(**over) -> dict:
    t = copy.deepcopy(BASE)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(t.get(k), dict):
            t[k].update(v)
        else:
            t[k] = v
    return t


def diag(*results):
    results = list(results)
    return diagnose_results(results, across_ranks(results))


def ids(result) -> list[str]:
    return [f["id"] for f in result["findings"]]


def finding(result, fid):
    return next(f for f in result["findings"] if f["id"] == fid)


def test_a_tuned_trace_has_no_alarm_and_says_what_is_left():
    r = diag(trace())
    assert ids(r) == [], ids(r)
    text = format_traces(r)
    assert "no findings" in text and "what is left" in text and "exposed communication 1.5%" in text
    assert {x["id"] for x in r["not_measured"]} >= {"low_mfu", "memory_bound", "straggler"}
    assert all(x["reason"] for x in r["not_measured"])


def test_a_sync_while_the_gpu_is_busy_is_no_finding_and_what_is_left_bounds_it_by_the_idle():
    # DeepSeek's H800 trace: one cudaDeviceSynchronize blocks the host 13% of the step while the GPU is busy
    r = diag(trace(host_syncs=[{"name": "cudaDeviceSynchronize", "count_per_step": 1.0, "us_per_step": 13_000.0}]))
    assert "host_syncs" not in ids(r)
    text = format_traces(r)
    assert "host syncs (up to the GPU idle) 4.0%" in text  # the 4% idle, not the 13% blocked


def test_data_bound_single_process_names_num_workers_with_the_gain():
    r = diag(trace(step_breakdown_pct={"dataloader": 33.3, "kernel": 60.0}, gpu_utilization_pct=60.0,
                   dataloader={"iterators": ["_SingleProcessDataLoaderIter"]}, step_time_us=177_600.0))
    f = finding(r, "data_bound")
    assert f["severity"] == "warning" and "num_workers=0" in f["evidence"] and "num_workers=N" in f["fix"]
    assert "HybridLoader" in f["fix"] and "pin_memory=True" in f["fix"]
    g = f["gain"]
    assert g["fraction"] == pytest.approx(0.333) and g["before"] == pytest.approx(177.6)
    assert g["after"] == pytest.approx(177.6 * (1 - 0.333))
    assert g["text"] == "the step would shrink by up to 33% (177.6 → 118.5 ms) if DataLoader waits were hidden"
    assert "gain:  the step would shrink" in format_traces(r)
    quiet = diag(trace(step_breakdown_pct={"dataloader": 1.3}))
    assert "data_bound" not in ids(quiet)


def test_fp32_on_tensor_cores_fires_with_the_catalog_ratio_and_not_before_volta():
    fp32 = {"tensor_core_kernel_pct": 0.0, "tensor_cores": {"fp32_eligible_us_per_step": 50_000.0,
                                                             "top_fp32": ["ampere_sgemm_128x64_nn"]}}
    f = finding(diag(trace(**fp32)), "fp32_on_tensor_cores")
    assert f["severity"] == "critical" and "autocast" in f["fix"] and "set_float32_matmul_precision" in f["fix"]
    assert f["gain"]["fraction"] == pytest.approx(0.5 * (1 - 19.5 / 312))  # A100: 312 bf16 / 19.5 fp32 dense
    v100 = diag(trace(device="Tesla V100-SXM2-16GB", device_info={"name": "Tesla V100-SXM2-16GB",
                                                                  "compute_capability": "7.0"}, **fp32))
    f = finding(v100, "fp32_on_tensor_cores")
    # the catalog's V100 ratio, 125 fp16 / 15.7 fp32 dense; fp16, since a V100 has no bf16
    assert "GradScaler" in f["fix"] and f["gain"]["fraction"] == pytest.approx(0.5 * (1 - 15.7 / 125), abs=1e-3)
    assert "precision.dtype=fp16" in f["fix"] and "dtype=bf16" not in f["fix"]
    pascal = diag(trace(device_info={"name": "Tesla P100", "compute_capability": "6.0"}, **fp32))
    assert "fp32_on_tensor_cores" not in ids(pascal)
    unknown = diag(trace(device=None, device_info=None, **fp32))
    assert "fp32_on_tensor_cores" not in ids(unknown)
    assert any(x["id"] == "fp32_on_tensor_cores" and "which GPU" in x["reason"] for x in unknown["not_measured"])


def test_pageable_copies_and_host_syncs_fire_on_their_gain():
    r = diag(trace(memcpy={"pageable_us_per_step": 9_000.0, "pageable_count_per_step": 2.0}))
    f = finding(r, "pageable_copies")
    assert "pin_memory=True" in f["fix"] and "non_blocking=True" in f["fix"] and f["gain"]["fraction"] == pytest.approx(0.09)
    assert "pageable_copies" not in ids(diag(trace(memcpy={"pageable_us_per_step": 2_000.0})))
    syncs = [{"name": "aten::item", "count": 8, "us": 40_000.0, "count_per_step": 2.0, "us_per_step": 10_000.0}]
    r = diag(trace(host_syncs=syncs, temporal_pct={"idle": 20.0}))
    f = finding(r, "host_syncs")
    assert "aten::item x2" in f["evidence"] and f["gain"]["fraction"] == pytest.approx(0.10)  # min(blocked, idle)
    r = diag(trace(host_syncs=syncs, temporal_pct={"idle": 3.0}))  # the GPU stays busy: little to gain
    assert "host_syncs" not in ids(r)


def test_launch_bound_from_the_trace_names_compile_and_cuda_graphs():
    r = diag(trace(gpu_utilization_pct=40.0, temporal_pct={"idle": 60.0}, idle_pct={"host_wait": 90.0},
                   launch={"kernels": 9000, "short_kernel_pct": 70.0, "gpu_us_median": 3.0,
                           "cpu_launch_us_median": 6.0}))
    f = finding(r, "launch_bound")
    assert "torch.compile" in f["fix"] and "CUDA graphs" in f["fix"] and "70% of 9000 kernels" in f["evidence"]
    assert f["gain"]["fraction"] == pytest.approx(0.54)  # the idle the host caused: 60% x 90%


def test_exposed_communication_and_its_overlap_on_an_moe_trace():
    moe = trace(comm_compute_overlap_pct=40.0, comm={"exposed_us_per_step": 25_000.0,
                                                     "us_per_kind": {"all_to_all": 30_000.0, "allreduce": 5_000.0}})
    f = finding(diag(moe), "comm_bound")
    assert f["severity"] == "warning" and "all_to_all 30.0 ms" in f["evidence"] and "overlap 40%" in f["evidence"]
    assert "bucket_cap_mb" in f["fix"] and "forward_prefetch" in f["fix"] and "compress" in f["fix"]
    assert f["gain"]["fraction"] == pytest.approx(0.25)


def test_low_occupancy_is_not_flagged_for_warp_specialized_kernels():
    low = diag(trace(occupancy={"pct": 12.0, "kernel_share": 0.6}))
    assert finding(low, "low_occupancy")["gain"] is None
    # an FP8 Hopper trace: the reader leaves the wgmma kernels out, so what remains is small or well occupied
    assert "low_occupancy" not in ids(diag(trace(occupancy={"pct": 12.0, "kernel_share": 0.1})))
    assert "low_occupancy" not in ids(diag(trace(occupancy={"pct": 70.0, "kernel_share": 0.6})))


def test_straggler_across_ranks_by_compute_with_waits_and_gain():
    def rank(r, compute, comm):
        return trace(rank=r, path=f"rank{r}.json", _step_compute_us=[compute] * 4,
                     _comm=[[i * 1000.0, comm, 40, "nccl", i % 4, "allreduce", "0"] for i in range(8)])

    r = diag(rank(0, 80_000.0, 12_000.0), rank(1, 80_000.0, 12_000.0), rank(2, 104_000.0, 2_000.0),
             rank(3, 80_000.0, 12_000.0))
    f = finding(r, "straggler")
    assert f["rank"] == 2 and f["ratio"] == pytest.approx(1.3) and "wait 20.00 ms per step" in f["evidence"]
    assert f["gain"]["fraction"] == pytest.approx(0.24)
    waits = {p["rank"]: p["comm_wait_us_per_step"] for p in r["ranks"]["per_rank"]}
    assert waits == {0: pytest.approx(20_000.0), 1: pytest.approx(20_000.0), 2: 0.0, 3: pytest.approx(20_000.0)}
    # the waits are not exposed communication of their own: comm_bound does not double count them
    assert "comm_bound" not in ids(r)
    assert "across 4 ranks" in format_traces(r)
    # no attribution in these traces: the late rank's causes are unmeasured, not its untraced host time
    late = r["ranks"]["late_arrivals"][0]
    assert late["rank"] == 2 and late["causes_measured"] is False and "not measured" in late["summary"]


def test_the_json_contract_and_private_keys_stripped():
    r = contract(diag(trace(step_breakdown_pct={"dataloader": 40.0},
                            dataloader={"iterators": ["_SingleProcessDataLoaderIter"]})))
    assert set(r) == {"source", "traces", "ranks", "findings", "not_measured"} and r["source"] == "trace"
    t = r["traces"][0]
    for key in ("path", "rank", "device", "steps", "step_time_us", "step_breakdown_pct", "gpu_utilization_pct",
                "sm_efficiency_pct", "achieved_occupancy_pct", "tensor_core_kernel_pct", "temporal_pct", "idle_pct",
                "comm_compute_overlap_pct", "top_kernels", "launch", "memcpy", "host_syncs"):
        assert key in t, key
    assert not any(k.startswith("_") for k in t)
    for f in r["findings"]:
        assert set(f) >= {"id", "severity", "title", "evidence", "cause", "fix", "gain"}
    assert set(r["findings"][0]["gain"]) >= {"text", "fraction", "before", "after"}
    json.loads(json.dumps(r, allow_nan=False))


def test_rule_table_has_the_trace_rules_and_says_what_traces_cannot_judge():
    by_id = {r.id: r for r in RULES}
    for rid in ("data_bound", "launch_bound", "fp32_on_tensor_cores", "pageable_copies", "host_syncs", "comm_bound",
                "straggler", "low_occupancy"):
        assert "trace" not in by_id[rid].not_from, rid
    for rid in ("low_mfu", "memory_bound", "host_contention"):
        assert by_id[rid].not_from["trace"]
    assert "`fp32_on_tensor_cores`" in rules_markdown()
