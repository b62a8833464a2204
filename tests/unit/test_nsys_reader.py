"""Generated Nsight Systems exports (trainperf.tracegen): the same job read from its nsys export and from its
Kineto twin gives the same figures; steps, ranks, GPU metrics, NCCL ranks and older schemas."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from trainperf.errors import UserError
from trainperf.trace.analyze import analyze_file
from trainperf.trace.nsys import analyze_capture, read_capture
from trainperf.trace.tb import launch_index
from trainperf.tracegen.kineto_twin import make_traces
from trainperf.tracegen.nsys import make_export
from trainperf.tracegen.nsys_job import Job, simulate

ROOT = Path(__file__).resolve().parents[2]
PCT = ["gpu_utilization_pct", "sm_efficiency_pct", "achieved_occupancy_pct", "tensor_core_kernel_pct",
       "comm_compute_overlap_pct"]
PCT_DICTS = ["step_breakdown_pct", "temporal_pct", "idle_pct", "kernel_type_pct"]


def both(tmp: Path, job: Job, schema: str = "3.25", **kw):
    procs = simulate(job)
    make_export(tmp / "job.sqlite", job, procs=procs, schema=schema, **kw)
    kin = make_traces(tmp / "kineto", job, procs=procs)
    return analyze_capture(tmp / "job.sqlite"), [analyze_file(p) for p in kin["paths"]], procs


@pytest.mark.parametrize("causes,ranks,schema", [
    ((), 1, "3.25"),
    (("pageable_copies", "host_sync", "fp32_gemm"), 2, "3.25"),
    (("launch_bound", "dataloader", "allocator"), 2, "2.x"),
])
def test_same_job_as_kineto_and_nsys_within_one_point(tmp_path, causes, ranks, schema):
    ns, ks, _ = both(tmp_path, Job(causes=causes, ranks=ranks), schema)
    assert len(ns) == len(ks) == ranks
    for n, k in zip(ns, ks):
        assert n["steps"] == k["steps"] == 6
        assert n["step_time_us"] == pytest.approx(k["step_time_us"], rel=0.01)
        for key in PCT:
            assert (n[key] is None) == (k[key] is None), key
            if k[key] is not None:
                assert abs(n[key] - k[key]) <= 1.0, (key, n[key], k[key])
        for key in PCT_DICTS:
            for sub, v in k[key].items():
                if v is not None:
                    assert abs(n[key][sub] - v) <= 1.0, (key, sub, n[key][sub], v)
        for sub in ("us_per_step", "pageable_us_per_step"):
            assert n["memcpy"][sub] == pytest.approx(k["memcpy"][sub], rel=0.01, abs=0.01)
        assert n["host_sync"]["blocked_us_per_step"] == pytest.approx(k["host_sync"]["blocked_us_per_step"],
                                                                       rel=0.01, abs=0.01)
        assert [(t["name"], t["count"]) for t in n["top_kernels"]] == [(t["name"], t["count"]) for t in k["top_kernels"]]
        assert n["comm"].get("us_per_step") == pytest.approx(k["comm"].get("us_per_step"), rel=0.01, abs=0.01)


def test_steps_from_the_repeated_top_level_range(tmp_path):
    job = Job(steps=5, step_range="iteration")
    make_export(tmp_path / "a.sqlite", job)
    (r,) = analyze_capture(tmp_path / "a.sqlite")
    assert r["steps"] == 5 and "'iteration'" in r["steps_found"]
    # --step picks another range: the forward pass of each step
    (f,) = analyze_capture(tmp_path / "a.sqlite", step="forward")
    assert f["steps"] == 5 and f["steps_found"] == "NVTX range 'forward' (--step)"
    assert f["step_time_us"] < r["step_time_us"]


def test_no_step_range_is_one_step_and_says_which_ranges_could_be(tmp_path):
    make_export(tmp_path / "a.sqlite", Job(step_range=None))
    (r,) = analyze_capture(tmp_path / "a.sqlite")
    assert r["steps"] == 1
    note = next(n for n in r["notes"] if "--step NAME" in n)
    assert "'forward'" in note and "'backward'" in note and "Optimizer" not in note
    with pytest.raises(UserError, match=r"--step 'nope'.*'forward' \(6x\)"):
        analyze_capture(tmp_path / "a.sqlite", step="nope")


def test_processes_sharing_a_gpu_are_ranks(tmp_path):
    job = Job(ranks=3, share_gpu=True, steps=3)
    got = make_export(tmp_path / "a.sqlite", job)
    res = analyze_capture(tmp_path / "a.sqlite")
    assert [r["rank_hint"]["device"] for r in res] == [0, 0, 0]
    assert sorted(r["rank_hint"]["pid"] for r in res) == [p.pid for p in got["procs"]]
    tls = read_capture(tmp_path / "a.sqlite")
    for (label, tl), p in zip(tls, sorted(got["procs"], key=lambda p: p.pid)):
        assert f"pid {p.pid}" in label
        assert tl.g_ts.size == len(p.kernels) + len(p.copies) + len(p.sets)
        assert tl.r_ts.size == len(p.calls)


def test_one_process_driving_two_gpus_is_two_ranks(tmp_path):
    job = Job(ranks=2, steps=3)
    procs = simulate(job)
    procs[1].pid = procs[0].pid  # one process: its second GPU's calls come from another thread
    from trainperf.tracegen.nsys import Writer
    w = Writer(tmp_path / "a.sqlite", "3.25")
    w.process(procs[0], job=job)
    w.process(procs[1], job=None, corr_offset=1_000_000)
    w.finish(procs[:1], job, None)
    res = analyze_capture(tmp_path / "a.sqlite")
    assert [r["rank_hint"]["device"] for r in res] == [0, 1]
    assert res[0]["rank_hint"]["pid"] == res[1]["rank_hint"]["pid"]
    tls = [tl for _, tl in read_capture(tmp_path / "a.sqlite")]
    for tl, p in zip(tls, procs):  # each GPU's kernels and copies are launched by its own thread's calls
        li = launch_index(tl)
        assert tl.g_ts.size == len(p.kernels) + len(p.copies) + len(p.sets) and (li >= 0).all()
        assert set(tl.r_tid[li].astype(np.int64) + tl.meta["thread_base"]) == {(1 << 48) | (procs[0].pid << 24) | p.tid}
        assert set(tl.r_tid[li]) == {p.tid} and tl.r_tid.dtype == np.int32  # the OS thread, within the process
    # calls linked to no GPU event (syncs, cuBLAS's queries) go to the process's first GPU, once
    assert sum(tl.r_ts.size for tl in tls) == sum(len(p.calls) for p in procs)


def test_several_captures_in_a_directory_are_ranks(tmp_path):
    job = Job(ranks=2, steps=3)
    procs = simulate(job)
    d = tmp_path / "caps"
    d.mkdir()
    for p in procs:
        make_export(d / f"rank{p.rank}.sqlite", job, procs=[p])
    labels = [lab for lab, _ in read_capture(d)]
    assert [lab.split(":")[0] for lab in labels] == ["rank0.sqlite", "rank1.sqlite"]


def test_gpu_metrics_are_measured_from_the_samples(tmp_path):
    job = Job(ranks=2, steps=4)
    got = make_export(tmp_path / "a.sqlite", job, gpu_metrics=True)
    for r in analyze_capture(tmp_path / "a.sqlite"):
        gm = r["gpu_metrics"]
        assert gm["source"] == "measured (nsys GPU_METRICS)" and gm["not_measured"] is None
        base = r["base_time_us"]
        lo = (min(s["start_us"] for s in r["per_step"]) - base) * 1000
        hi = (max(s["start_us"] + s["dur_us"] for s in r["per_step"]) - base) * 1000
        samples = got["gpu_metrics"][r["rank_hint"]["device"]]
        t = np.array(samples["timestamp"])
        inside = (t >= lo) & (t <= hi)
        for key, name in (("sm_active_pct", "SM Active [Throughput %]"), ("sm_issue_pct", "SM Issue [Throughput %]"),
                          ("tensor_active_pct", "Tensor Active [Throughput %]")):
            assert gm[key] == pytest.approx(np.mean(np.array(samples["values"][name])[inside]), rel=1e-9)
        read = np.array(samples["values"]["DRAM Read Bandwidth [Throughput %]"])[inside].mean()
        write = np.array(samples["values"]["DRAM Write Bandwidth [Throughput %]"])[inside].mean()
        assert gm["dram_bw_pct"] == pytest.approx(read + write, rel=1e-9)
        assert gm["sample_interval_us"] == pytest.approx(100.0)
        assert r["figure_sources"]["gpu_metrics"].startswith("measured")
        assert r["figure_sources"]["sm_efficiency_pct"].startswith("estimated")


def test_gpu_metrics_older_names_and_absent(tmp_path):
    make_export(tmp_path / "old.sqlite", Job(steps=3), schema="2.x", gpu_metrics=True)
    (r,) = analyze_capture(tmp_path / "old.sqlite")
    assert r["gpu_metrics"]["sm_active_pct"] > 0 and "SM Active" in r["gpu_metrics"]["metrics"]
    assert r["gpu_metrics"]["tensor_active_pct"] is not None  # "Tensor Active / FP16 Active"
    make_export(tmp_path / "none.sqlite", Job(steps=3))
    (n,) = analyze_capture(tmp_path / "none.sqlite")
    assert n["gpu_metrics"]["sm_active_pct"] is None
    assert "--gpu-metrics-devices=all" in n["gpu_metrics"]["not_measured"]
    assert any("--gpu-metrics-devices=all" in x for x in n["notes"])


def test_nccl_rank_and_device_from_the_capture(tmp_path):
    make_export(tmp_path / "a.sqlite", Job(ranks=2, steps=3))
    res = analyze_capture(tmp_path / "a.sqlite")
    assert [r["rank_hint"]["nccl_rank"] for r in res] == [0, 1]
    assert [r["distributed_info"]["rank"] for r in res] == [0, 1]
    for r in res:
        assert r["capture"]["gpu"]["name"] == "NVIDIA H100 80GB HBM3"
        assert r["capture"]["gpu"]["compute_capability"] == "9.0" and r["capture"]["gpu"]["num_sms"] == 132
        assert r["device_info"]["from"] == "nsys TARGET_INFO_CUDA_DEVICE"
        assert r["comm"]["kernels"] == 3
    make_export(tmp_path / "b.sqlite", Job(ranks=2, steps=3), schema="2.x")
    assert [r["rank_hint"]["nccl_rank"] for r in analyze_capture(tmp_path / "b.sqlite")] == [None, None]


def test_oldest_schema_reads_with_what_it_has(tmp_path):
    make_export(tmp_path / "a.sqlite", Job(steps=3, causes=("pageable_copies",)), schema="1.x")
    (r,) = analyze_capture(tmp_path / "a.sqlite")
    assert r["steps"] == 3 and r["capture"]["schema_version"] is None
    notes = " ".join(r["notes"])
    assert "no srcKind / dstKind" in notes and "names no GPU" in notes
    assert r["rank_hint"]["pid"] is None  # no globalPid on the GPU rows: the GPU is the rank
    assert all("(" not in t["name"] for t in r["top_kernels"])  # shortName only: base names
    assert r["memcpy"]["pageable_us_per_step"] == 0.0  # cannot be told: said, not guessed


def test_timeline_holds_every_cpu_event_and_thread(tmp_path):
    job = Job(steps=2)
    got = make_export(tmp_path / "a.sqlite", job)
    ((_, tl),) = read_capture(tmp_path / "a.sqlite")
    p = got["procs"][0]
    gtid = (1 << 48) | (p.pid << 24) | p.tid
    assert tl.c_ts.dtype == np.float64 and tl.c_dur.dtype == np.float64 and tl.c_kind.dtype == np.int8
    assert tl.c_ts.size == len(p.ranges) + len(p.steps)
    base = tl.meta["thread_base"]
    assert set(np.unique(tl.c_tid).astype(np.int64) + base) == {gtid} == set(np.unique(tl.r_tid).astype(np.int64) + base)
    assert tl.c_tid.dtype == tl.r_tid.dtype == np.int32
    assert set(np.unique(tl.c_kind)) == {0, 1}
    names = {tl.names[i] for i in np.unique(tl.c_name)}
    assert "aten::mm" in names and not any("op_id" in n for n in names)  # emit_nvtx's decorations cut
    ops = {tl.names[i] for i in np.unique(tl.c_name[tl.c_kind == 0])}
    assert ops and all(n.startswith(("aten::", "autograd::", "nccl:")) for n in ops)
    assert tl.r_tid.size == tl.r_ts.size and tl.g_coll.size == tl.g_ts.size


def test_nsys_reader_never_imports_torch(tmp_path):
    make_export(tmp_path / "a.sqlite", Job(steps=2))
    code = ("import sys\nfrom trainperf.trace.nsys import analyze_capture\n"
            f"analyze_capture({str(tmp_path / 'a.sqlite')!r})\nprint('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "False"


def test_progress_counts_bytes_up_to_the_files_size(tmp_path):
    make_export(tmp_path / "a.sqlite", Job(ranks=2, steps=3))
    seen: list[int] = []
    analyze_capture(tmp_path / "a.sqlite", progress=seen.append)
    assert len(seen) > 2 and seen == sorted(seen)
    assert seen[-1] == (tmp_path / "a.sqlite").stat().st_size


@pytest.mark.parametrize("causes,ranks", [
    (("pageable_copies", "host_sync", "fp32_gemm"), 2),
    (("launch_bound", "dataloader", "allocator"), 2),
    (("dataloader",), 1),
])
def test_same_job_as_kineto_and_nsys_gives_the_same_findings(tmp_path, causes, ranks):
    """`trainperf diagnose` on the capture and on its Kineto twin: the same rules fire, the same attribution."""
    from trainperf.diagnosis.engine import diagnose_path

    job = Job(causes=causes, ranks=ranks)
    procs = simulate(job)
    make_export(tmp_path / "job.sqlite", job, procs=procs)
    kin = make_traces(tmp_path / "kineto", job, procs=procs)
    n, k = diagnose_path(tmp_path / "job.sqlite"), diagnose_path(Path(kin["paths"][0]).parent)
    assert n["findings"] and [f["id"] for f in n["findings"]] == [f["id"] for f in k["findings"]]
    for tn, tk in zip(n["traces"], k["traces"]):
        pn, pk = tn["attribution"]["gpu_pct"], tk["attribution"]["gpu_pct"]
        assert all(abs(pn[c] - pk[c]) <= 1.0 for c in pk), (pn, pk)
