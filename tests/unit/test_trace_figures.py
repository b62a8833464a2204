"""One rank's figures from a profiler trace, against the peers' own figures on the same files, and the reader
over every format torch has written.

Oracles: HTA 0.5.0 and torch-tb-profiler 0.4.3, run once by scripts/trace_oracles.py (the command and the
peers' versions are stored with the figures, with each trace's sha256), so neither peer is needed here.
Tolerances (the issue's): HTA's idle breakdown within 1 point on every trace; its temporal breakdown and
comm/compute overlap and kernel-type table within 1 point wherever both count the same communication kernels (HTA counts only
``^nccl.*Kernel``; trainperf's table counts DeepEP, NVSHMEM, RCCL... too); the plugin's step-time breakdown
and GPU metrics within 2 points, its step count exactly and its step time within 2%. HTA is compared with
``HTA_DISABLE_NS_ROUNDING=1`` (``hta_unrounded``): by default it rounds float microseconds to whole ones,
an artefact of its storage. The plugin's Kernel is compared as ``kernel + communication``: trainperf splits
the time only communication kernels cover out of it (0.4.3 calls a kernel communication only when it was
launched under an ``nccl:*`` op, which torch 2.x no longer records around most collectives).

Generated traces (tests/data/traces, made by trainperf.tracegen.generate) and the real traces committed under
tests/data/real (every trace of HTA's tests and of the plugin's samples that the oracle file names and that
their public repositories hold: A100 with NCCL, ns units, CPU only, no rank, ROCm, MTIA, sampled ranks,
critical-path and trace-diff inputs, ResNet-50 on a V100, the plugin's GPU-metrics input) run everywhere, CI
included. A trace the oracle file names that is not in the repository fails its test; none is skipped.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import tracemalloc
from pathlib import Path

import pytest

from tests.unit.trace_fixtures import FIXTURES, OWN, REAL, ROOT, TRACES, oracles, real_trace
from trainperf.errors import UserError
from trainperf.trace import analyze_file, classify_kernel, is_tensor_core
from trainperf.tracegen import synth
from trainperf.tracegen.generate import make_trace
from trainperf.trace.hta import hta_type_name
from trainperf.trace.reader import CHUNK, TraceReader, read_all, repair

GENERATED = oracles("generated.json")["traces"]
CORPUS_ORACLES = oracles("corpus.json")["traces"]
HTA_PT, TB_PT, STEP_REL = 1.0, 2.0, 0.02


def sha256(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def compare(r: dict, o: dict) -> tuple[dict, list[str]]:
    """(name -> (ours, theirs)) for every figure both compute on this trace, and why some were not compared."""
    pairs, skipped = {}, []
    h = o.get("hta_unrounded") or o.get("hta") or {}
    for part in ("idle", "temporal"):
        if "error" in (h.get(part) or {}):
            skipped.append(f"HTA's {part} breakdown failed: {h[part]['error']}")
    hidle = (h.get("idle") or {}).get("pct") or {}
    for k, v in hidle.items():
        if v is not None and not math.isnan(v):
            pairs[f"hta.idle.{k}"] = (r["idle_pct"][k], v, HTA_PT)
    theirs_kt = {k: v for k, v in (h.get("kernel_types") or {}).items() if isinstance(v, dict) and "us" in v}
    ours_kt = {hta_type_name(k): v for k, v in (r.get("kernel_type_us") or {}).items()}
    hta_comm = sum(v["us"] for k, v in theirs_kt.items() if "COMMUNICATION" in k)
    our_comm = sum(v for k, v in ours_kt.items() if "COMMUNICATION" in k)
    same_comm = abs(hta_comm - our_comm) <= max(1.0, 0.01 * max(hta_comm, our_comm))
    if same_comm and theirs_kt:  # HTA's kernel-type table (its pct rounded to 0.1)
        ours_pct = {hta_type_name(k): v for k, v in (r.get("kernel_type_pct") or {}).items()}
        for k in set(theirs_kt) | set(ours_pct):
            pairs[f"hta.kernel_type.{k}"] = (ours_pct.get(k, 0.0), theirs_kt.get(k, {}).get("pct", 0.0), HTA_PT)
    t = h.get("temporal")
    if t and "idle_time_pctg" in t and r["temporal_pct"]:
        pairs["hta.temporal.idle"] = (r["temporal_pct"]["idle"], t["idle_time_pctg"], HTA_PT)
        if same_comm:
            pairs["hta.temporal.compute"] = (r["temporal_pct"]["compute"], t["compute_time_pctg"], HTA_PT)
            pairs["hta.temporal.non_compute"] = (r["temporal_pct"]["non_compute"], t["non_compute_time_pctg"], HTA_PT)
        else:
            skipped.append(f"HTA's communication kernels ({hta_comm:.0f} us) are not ours ({our_comm:.0f} us)")
    if same_comm and h.get("overlap_pct") is not None:
        pairs["hta.overlap"] = (r["comm_compute_overlap_pct"], h["overlap_pct"], HTA_PT)
    tb = o.get("tb") or {}
    if "error" in tb or not tb:
        skipped.append(f"the plugin failed: {tb.get('error')}")
    elif tb.get("step_time_us") is None or tb["step_time_us"] <= 0:
        skipped.append(f"the plugin's own figures are invalid (step time {tb.get('step_time_us')})")
    elif not tb.get("gpus") and sum((r.get("kernel_us") or {}).values()) > 0:
        skipped.append("the plugin saw no GPU where the trace has device kernels (0.4.3 reads CUDA devices only)")
    else:
        ours, theirs = r["step_breakdown_pct"], tb["breakdown_pct"]
        for k in ("memcpy", "memset", "runtime", "dataloader", "cpu_exec", "other"):
            pairs[f"tb.breakdown.{k}"] = (ours[k], theirs[k], TB_PT)
        pairs["tb.breakdown.kernel+communication"] = (ours["kernel"] + ours["communication"],
                                                      theirs["kernel"] + theirs["communication"], TB_PT)
        pairs["tb.steps"] = (r["steps"], tb["steps"], 0)
        pairs["tb.step_time_rel"] = (r["step_time_us"] / tb["step_time_us"] - 1.0, 0.0, STEP_REL)
        g = (tb.get("gpus") or {}).get(str(tb.get("main_gpu")))
        if g:
            for k, ok in (("utilization_pct", "gpu_utilization_pct"), ("sm_efficiency_pct", "sm_efficiency_pct"),
                          ("occupancy_pct", "achieved_occupancy_pct"),
                          ("tensor_core_pct", "tensor_core_kernel_pct_tb_list")):
                if g.get(k) is not None:
                    pairs[f"tb.{k}"] = (r[ok], g[k], TB_PT)
    return pairs, skipped


def assert_agrees(r: dict, o: dict) -> dict:
    pairs, skipped = compare(r, o)
    assert pairs, skipped
    bad = {k: (a, b) for k, (a, b, tol) in pairs.items() if a is None or abs(a - b) > tol + 1e-9}
    assert not bad, (bad, skipped)
    return pairs


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_generated_traces_are_what_the_generator_writes(name, tmp_path):
    p = tmp_path / name
    make_trace(p, **FIXTURES[name])

    def text(f: Path) -> bytes:  # compared decompressed: another zlib may deflate the same text differently
        return gzip.decompress(f.read_bytes()) if f.name.endswith(".gz") else f.read_bytes()

    assert text(p) == text(TRACES / name), "regenerate: python -m tests.unit.trace_fixtures"
    assert GENERATED[name]["sha256"] == sha256(TRACES / name), "re-run scripts/trace_oracles.py on tests/data/traces"


@pytest.mark.parametrize("name", sorted(GENERATED))
def test_figures_agree_with_hta_and_the_plugin_on_generated_traces(name):
    o = GENERATED[name]
    p = TRACES / name
    assert sha256(p) == o["sha256"]
    pairs = assert_agrees(analyze_file(p), o)
    if name.startswith("cpu_only") or name in OWN:
        assert "tb.steps" in pairs
    else:
        assert any(k.startswith("hta.idle") for k in pairs) and "tb.utilization_pct" in pairs


@pytest.mark.parametrize("name", sorted(CORPUS_ORACLES))
def test_figures_agree_with_hta_and_the_plugin_on_their_own_traces(name):
    p = real_trace(name)  # committed: a missing trace fails here
    assert sha256(p) == CORPUS_ORACLES[name]["sha256"], f"{p} differs from the file the oracle was computed on"
    assert_agrees(analyze_file(p), CORPUS_ORACLES[name])


def test_the_committed_real_traces_are_the_oracles_files_and_named_in_their_readme():
    files = sorted(str(f.relative_to(REAL)) for f in REAL.rglob("*") if f.is_file()
                   and f.name != "README.md" and not f.name.startswith("LICENSE"))
    assert files == sorted(CORPUS_ORACLES), "every trace the oracle file names is committed, and only those"
    assert sum((REAL / f).stat().st_size for f in files) < 30_000_000  # a few tens of MB at most
    readme = (REAL / "README.md").read_text()
    for f in files:
        assert sha256(REAL / f) == CORPUS_ORACLES[f]["sha256"], f
        assert f in readme, f"{f}: say where it came from in {REAL / 'README.md'}"
    assert all((REAL / f).is_file() for f in ("hta-data/LICENSE", "tb-data/LICENSE", "tb-data/LICENSE-2021-01"))


def test_no_oracle_or_trace_is_looked_for_outside_the_repository():
    """The oracle files were computed on the committed traces (their command names them by repository paths)."""
    command = oracles("corpus.json")["command"]
    assert "--root tests/data/real" in command and not [w for w in command.split() if w.startswith("/")]
    assert all(name in command for name in CORPUS_ORACLES)
    with pytest.raises(FileNotFoundError, match=r"tests/data/real/hta-data/nope\.json\.gz is missing"):
        real_trace("hta-data/nope.json.gz")
    assert real_trace(sorted(CORPUS_ORACLES)[0]).is_relative_to(ROOT / "tests/data/real")


def test_the_moe_all_to_all_is_communication_with_its_overlap_where_hta_calls_it_computation():
    name = "moe_a2a_gen_lines_ns.json.gz"
    r = analyze_file(TRACES / name)
    h = GENERATED[name]["hta_unrounded"]
    kinds = r["comm"]["us_per_kind"]
    assert kinds.get("ep_dispatch", 0) > 0 and kinds.get("ep_combine", 0) > 0 and kinds.get("allreduce", 0) > 0
    assert len(r["comm"]["streams"]) >= 2  # the all-to-all on a stream of its own
    assert 0 < r["comm_compute_overlap_pct"] < 100
    # HTA sees the NCCL all-reduce only: its communication is a fraction of ours
    hta_comm = sum(v["us"] for k, v in h["kernel_types"].items() if "COMMUNICATION" in k)
    ours = sum(v for k, v in r["kernel_type_us"].items() if "communication" in k)
    assert hta_comm < 0.5 * ours
    for top in r["top_kernels"]:
        if "deep_ep" in top["name"]:
            assert top["kind"] == "communication"


def test_formats_layouts_units_and_compression_give_the_same_figures(tmp_path):
    def fig(**kw):
        p = tmp_path / f"t{len(list(tmp_path.iterdir()))}.json{'.gz' if kw.pop('gz', True) else ''}"
        make_trace(p, **kw)
        return {k: v for k, v in analyze_file(p).items() if k not in ("path", "events", "base_time_us")}

    lines = fig(kind="a100_ddp", steps=3, layout="lines", units="us", seed=9)
    single = fig(kind="a100_ddp", steps=3, layout="single", units="us", seed=9)
    plain = fig(kind="a100_ddp", steps=3, layout="single", units="us", seed=9, gz=False)
    assert lines == single == plain
    ns = fig(kind="a100_ddp", steps=3, layout="lines", units="ns", seed=9)
    assert ns["steps"] == lines["steps"] == 3
    for k in ("compute", "non_compute", "idle"):  # ns times carry decimals, us times are whole: close, not equal
        assert ns["temporal_pct"][k] == pytest.approx(lines["temporal_pct"][k], abs=1.0)
    old = fig(kind="v100_18", steps=3, fmt="1.8", units="us", seed=3)
    new = fig(kind="v100_18", steps=3, fmt="2x", units="us", seed=3)
    for k in ("step_time_us", "step_breakdown_pct", "temporal_pct", "idle_pct", "gpu_utilization_pct",
              "tensor_core_kernel_pct", "launch", "memcpy", "dataloader"):
        assert old[k] == new[k], k
    assert old["device_info"]["compute_capability"] == "7.0" and old["device_info"]["from"] == "kernel names"
    assert old["dataloader"]["single_process"] and sum(old["dataloader"]["us_per_step"]) > 0
    assert old["memcpy"]["pageable_us_per_step"] > 0


def test_driver_launches_flows_and_no_profiler_steps(tmp_path):
    r = analyze_file(TRACES / "a100_ddp_gen_lines_ns.json.gz")
    assert r["launch"]["driver_launches"] > 0  # triton kernels via cuLaunchKernel
    assert r["launch"]["kernels"] > r["launch"]["driver_launches"]
    # the same trace with its ProfilerStep spans removed: the whole trace is one step, and it says so
    meta, events = synth.load_trace(TRACES / "a100_ddp_gen_lines_ns.json.gz")
    kept = [e for e in events if not str(e.get("name", "")).startswith("ProfilerStep#")]
    p = tmp_path / "nosteps.json"
    p.write_text(json.dumps({**meta, "traceEvents": kept}))
    r = analyze_file(p)
    assert r["steps"] == 1 and r["steps_found"].startswith("none")
    assert any("whole trace" in n for n in r["notes"])


def test_a_cpu_only_trace_has_cpu_figures_and_no_gpu_ones():
    r = analyze_file(TRACES / "cpu_only_gen_lines_us.json.gz")
    assert r["steps"] == 3 and r["device"] is None and r["step_breakdown_pct"]["cpu_exec"] > 50
    assert r["gpu_utilization_pct"] is None and r["comm_compute_overlap_pct"] is None and r["memcpy"] == {}
    json.dumps(r, allow_nan=False)
    own = analyze_file(TRACES / OWN[0])  # a trace trainperf itself wrote on a CPU run
    assert own["steps"] >= 1 and own["gpu_utilization_pct"] is None


@pytest.mark.parametrize("layout", ["single", "lines"])
def test_the_reader_streams_in_bounded_memory(layout, tmp_path):
    base = tmp_path / "base.json.gz"
    make_trace(base, kind="a100_ddp", steps=20, layout="lines", seed=1)
    peaks, counts = [], []
    for times in (6, 18):
        p = tmp_path / f"x{times}.json.gz"
        info = synth.repeat(base, p, times=times, layout=layout)
        raw = len(gzip.decompress(p.read_bytes()))
        tracemalloc.start()
        n = chunks = 0
        for c in TraceReader(p).chunks():
            n, chunks = n + len(c), chunks + 1
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
        assert n == info["events"] and chunks >= raw // CHUNK
        counts.append(raw)
    assert counts[1] > 2.5 * counts[0]
    assert peaks[1] < 1.3 * peaks[0], peaks  # 3x the file, about the same memory


@pytest.mark.parametrize("bad", ["truncated_single", "truncated_lines", "truncated_gz", "not_a_trace", "empty"])
def test_bad_files_are_user_errors_naming_the_file(bad, tmp_path):
    src = gzip.decompress((TRACES / "a100_ddp_gen_single_us.json.gz").read_bytes())
    lines = gzip.decompress((TRACES / "a100_ddp_gen_lines_ns.json.gz").read_bytes())
    data = {"truncated_single": src[: len(src) * 2 // 3], "truncated_lines": lines[: len(lines) // 2],
            "truncated_gz": gzip.compress(src)[:-2000], "not_a_trace": b'{"traceEvents": [1, 2]}',
            "empty": b"  \n"}[bad]
    p = tmp_path / (f"{bad}.json.gz" if bad == "truncated_gz" else f"{bad}.json")
    p.write_bytes(data)
    with pytest.raises(UserError) as e:
        analyze_file(p)
    assert str(p) in str(e.value)


@pytest.mark.parametrize("name", ["a100_ddp_gen_lines_ns.json.gz", "a100_ddp_gen_single_us.json.gz"])
def test_what_torch_wrote_wrong_is_read_as_the_plugin_reads_it(name, tmp_path):
    """Kineto has written raw control characters in strings, unquoted N/A values and bytes that are not UTF-8
    (the TensorBoard plugin decodes again with strict=False and N/A quoted); some tools add a UTF-8 BOM.
    In every event's args and in the header, in both layouts: the figures are those of the clean trace."""
    import re

    clean = gzip.decompress((TRACES / name).read_bytes())
    bad = re.sub(rb'"args":\s*\{(?=")', b'"args": {"Concrete Inputs": "a\tb\n\xe9", "Grid": N/A, ', clean)
    bad = re.sub(rb'"schemaVersion":\s*1', b'"schemaVersion": 1, "host_name": "h\x01st\xff", "trace_id": N/A', bad)
    assert bad.count(b"N/A") > 100
    with pytest.raises(ValueError):
        json.loads(bad)
    want = {k: v for k, v in analyze_file(TRACES / name).items() if k != "path"}
    for label, data in (("defects", bad), ("bom", b"\xef\xbb\xbf" + clean)):
        p = tmp_path / f"{label}.json.gz"
        p.write_bytes(gzip.compress(data))
        assert {k: v for k, v in analyze_file(p).items() if k != "path"} == want, label


def test_repair_makes_torchs_defects_valid_json_and_leaves_the_rest():
    assert json.loads(repair(b'{"a": "x\ty", "b": N/A, "c": [1, N/A], "d": "N/A:", "e": "\xe9"}')) == \
        {"a": "x y", "b": "N/A", "c": [1, "N/A"], "d": "N/A:", "e": "\ufffd"}
    assert repair(b'{"a": "N/A", "b": 1}') is None


def test_times_beyond_float_range_give_no_warning_and_strict_json(tmp_path):
    import warnings

    ev = [{"ph": "X", "cat": "cpu_op", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0, "dur": 100},
          {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 10, "dur": 50},
          {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": -1e308, "dur": 1e308},
          {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1e308, "dur": 1e308}]
    p = tmp_path / "huge.json"
    p.write_text(json.dumps({"traceEvents": ev}))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        r = analyze_file(p)
    json.dumps(r, allow_nan=False)
    assert r["steps"] == 1 and r["step_time_us"] == 100


def test_repair_turns_bare_non_finite_numbers_into_null():
    # Python's json.dump writes NaN / Infinity, C's printf nan / inf: neither is JSON
    fixed = repair(b'{"a": NaN, "b": [Infinity, -Infinity], "c": nan, "d": -inf, "e": "NaN", "f": "inf"}')
    assert json.loads(fixed) == {"a": None, "b": [None, None], "c": None, "d": None, "e": "NaN", "f": "inf"}


def test_corrupt_times_and_ids_are_left_out_and_said(tmp_path, capsys):
    """A trace hand-edited or written by another tool: start times and durations that are not numbers, stream
    and device ids beyond int64 (once an OverflowError). The figures come from the rest, and say so."""
    from trainperf.cli import main

    ev = [{"ph": "X", "cat": "cpu_op", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0, "dur": 100},
          {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 10, "dur": 50, "args": {"stream": 7}},
          {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": float("nan"), "dur": 5},
          {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": "soon", "dur": 5},
          {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 70, "dur": float("nan")},
          {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 80, "dur": -3},
          {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 90, "dur": 5,
           "args": {"stream": 10**30, "device": 1e300}}]
    p = tmp_path / "corrupt.json"
    p.write_text(json.dumps({"traceEvents": ev}))  # NaN written bare, as json.dump does
    assert b"NaN" in p.read_bytes()
    r = analyze_file(p)
    json.dumps(r, allow_nan=False)
    assert r["steps"] == 1 and r["step_time_us"] == 100
    notes = " ".join(r["notes"])
    assert "2 GPU event(s) or runtime call(s) had a start time that is not a number" in notes
    assert "2 GPU event(s) or runtime call(s) had a duration that is negative or not a number" in notes
    assert main(["diagnose", str(p)]) == 0
    assert "note: 2 GPU event(s)" in capsys.readouterr().out


def test_read_all_sees_every_event_of_both_eras():
    for name in ("v100_18_gen_single_us.json", "a100_ddp_gen_lines_ns.json.gz"):
        meta, evs = read_all(TRACES / name)
        want = json.loads(gzip.decompress((TRACES / name).read_bytes()) if name.endswith(".gz")
                          else (TRACES / name).read_bytes())
        assert len(evs) == len(want["traceEvents"])
        assert {e.cat for e in evs} == {e.get("cat") for e in want["traceEvents"]}


@pytest.mark.parametrize("name,kind", [
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)", "communication"),
    ("void deep_ep::intranode::dispatch<8, 768, 8192>(int4*, float*, int*)", "communication"),
    ("void deep_ep::internode::combine<true, 8>(...)", "communication"),
    ("void deep_ep::intranode::notify_dispatch<8>(int const*, int*)", "communication"),
    ("nvshmemi_transfer_rma_kernel", "communication"),
    ("void rccl_kernel_AllGather(...)", "communication"),
    ("ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)", "communication"),  # RCCL 2.18+ (ROCm 6)
    ("ncclDevKernel_Generic_4(ncclDevKernelArgsStorage<4096ul>)", "communication"),
    ("Memcpy HtoD (Pinned -> Device)", "memory"),
    ("ampere_sgemm_128x64_tn", "compute"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float> >", "compute"),
])
def test_kernel_classes_come_from_one_table(name, kind):
    assert classify_kernel(name) == kind


def test_users_extend_the_communication_patterns():
    name = "void my_lib::exchange_tokens_kernel<8>(int*)"
    assert classify_kernel(name) == "compute"
    assert classify_kernel(name, ["exchange_tokens"]) == "communication"
    with pytest.raises(UserError):
        classify_kernel(name, ["("])


@pytest.mark.parametrize("name,tc", [
    ("volta_h884gemm_64x64_ldg8_nn", True),
    ("ampere_fp16_s16816gemm_fp16_128x128_ldg8_f2f_stages_32x5_tn", True),
    ("sm90_xmma_gemm_e4m3bf16_e4m3f32_f32_tn_n_tilesize128x128x128_warpgroupsize1x1x1_execute_segment_k_off", True),
    ("void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<cute::tuple<int, int, int, int>, "
     "cutlass::gemm::collective::CollectiveMma<cutlass::gemm::MainloopSm90TmaGmmaWarpSpecializedPingpong<2>>>>", True),
    ("void cutlass::device_kernel<GemmKernel<cutlass::gemm::KernelTmaWarpSpecializedCooperative>>", True),
    ("nvjet_tst_128x256_64x4_2x1_v_bz_coopB_TNT", True),
    ("void flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, cutlass::bfloat16_t>>", True),
    ("void flash::FlashAttnFwdSm90<...>", True),
    ("sm100_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize256x128x64_cluster2x1x1", True),
    ("ampere_sgemm_128x64_tn", False),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>", False),
    # FP8 training's own kernels, as DeepSeek's H800 trace names them: a GEMM in FP8 is on tensor cores, the
    # casts, scales and reductions named by their dtype are not
    ("void cutlass::device_kernel<dpsk::grouped_gemm::cuda::fp8_ptp128c::GemmKernel>(dpsk::grouped_gemm::P)", True),
    ("void cuda::per_token_cast_to_fp8_with_channels<__nv_bfloat16, 128, false, 128, false>(__nv_bfloat16 const*)",
     False),
    ("void cuda::cast_back_impl<__nv_fp8x2_e4m3>(void const*, void*, float const*, int, int, int, int)", False),
    ("void cuda::reduce_fused_impl<__nv_bfloat16, false, false>(int4 const*, __nv_fp8_interpretation_t)", False),
    ("void fp8_gemm_kernel<128, 128>(float*)", True),
    ("tf32_convert_kernel", False),
    # AMD matrix cores (MFMA): MIOpen's xdlops implicit-GEMM convolutions (gtcx; gtc without x is the VALU
    # one), composable_kernel's xdl kernels, hipBLASLt / Tensile GEMMs (Cijk_), as an MI300X trace names them
    ("igemm_fwd_gtcx3_nhwc_bf16_bx0_ex1_bt128x128x32_wt32x32x8_ws1x1_wr2x2_ta1x8x2x1_1x4x1x32_tb1x8x2x1_1x4x1x32",
     True),
    ("igemm_bwd_gtcx2_nhwc_bf16_bx0_ex1_bt256x128x32_wt32x32x8_ws2x1_wr2x2_ta1x8x4x1_1x4x1x64", True),
    ("igemm_fwd_gtc_nchw_fp32_bx0_ex0_bt64x64x8_wt32x32x2_ws1x1_wr1x1", False),
    ("void ck::kernel_gemm_xdl_cshuffle_v3<ck::GridwiseGemm_xdl_cshuffle_v3<...>>(...)", True),
    ("Cijk_Ailk_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT256x256x64_MI16x16x1_SN_LDSB1_AFC1", True),
    ("Cijk_Alik_Bljk_SB_MT64x16x32_SN_LDSB0_AFC1_AFEM1", True),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>>", False),
])
def test_tensor_cores_on_every_generation(name, tc):
    assert is_tensor_core(name) is tc


def _persistent_fp8_trace(path: Path, gemm_name: str, gemm_args: dict) -> Path:
    """One H800 step: an FP8 GEMM (given), an FP8 cast and an elementwise kernel, as DeepSeek's training
    trace has them (deepseek-ai/profile-data train.json: DeepGEMM's grouped GEMMs run 112 blocks of 384 threads
    on 132 SMs, and Kineto writes 0 for their occupancy; its cast kernels run full)."""
    dev = {"id": 0, "name": "NVIDIA H800", "computeMajor": 9, "computeMinor": 0, "numSms": 132,
           "maxThreadsPerMultiprocessor": 2048, "totalGlobalMem": 84943110144}

    def kernel(name, ts, dur, args):
        return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": ts, "dur": dur,
                "args": {"device": 0, "stream": 7, **args}}

    events = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0,
               "dur": 10_000},
              kernel(gemm_name, 100, 6_000, gemm_args),
              kernel("void cuda::per_token_cast_to_fp8_with_channels<__nv_bfloat16, 128, false, 128, false>(int)",
                     6_200, 1_000, {"grid": [4096, 1, 1], "block": [128, 1, 1], "blocks per SM": 31.03,
                                    "est. achieved occupancy %": 100}),
              kernel("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>",
                     7_300, 2_000, {"grid": [8192, 1, 1], "block": [128, 1, 1], "blocks per SM": 62.06,
                                    "est. achieved occupancy %": 60})]
    path.write_text(json.dumps({"schemaVersion": 1, "deviceProperties": [dev], "traceEvents": events}))
    return path


def test_an_expert_fp8_trace_gets_its_tensor_cores_and_occupancy_right(tmp_path):
    persistent = {"grid": [112, 1, 1], "block": [384, 1, 1], "shared memory": 217700, "blocks per SM": 0.848,
                  "est. achieved occupancy %": 0}
    r = analyze_file(_persistent_fp8_trace(
        tmp_path / "ds.json", "void cutlass::device_kernel<dpsk::grouped_gemm::cuda::fp8_ptp128c::GemmKernel>(P)",
        persistent))
    # the cast is not tensor-core time; the persistent GEMM (one block per SM at most) is warp-specialized by
    # design and its 0 is Kineto's "not estimated": the occupancy figure is the cast's and the add's
    assert r["tensor_core_kernel_pct"] == pytest.approx(100 * 6_000 / 9_000)
    assert r["occupancy"]["warp_specialized_share"] == pytest.approx(6_000 / 9_000)
    assert r["occupancy"]["pct"] == pytest.approx((100 * 1_000 + 60 * 2_000) / 3_000)
    # control: a CUDA-core kernel at the same launch shape and a real low occupancy is counted as it is
    r = analyze_file(_persistent_fp8_trace(tmp_path / "ctl.json", "void my_lib::scatter_rows_kernel<8>(float*)",
                                           {**persistent, "est. achieved occupancy %": 5}))
    assert r["tensor_core_kernel_pct"] == 0 and r["occupancy"]["warp_specialized_share"] == 0
    assert r["occupancy"]["pct"] == pytest.approx((5 * 6_000 + 100 * 1_000 + 60 * 2_000) / 9_000)


def _diagnose(name: str, capsys) -> dict:
    from trainperf.cli import main

    assert main(["diagnose", str(TRACES / name), "--json"]) == 0
    return json.loads(capsys.readouterr().out, parse_constant=lambda c: pytest.fail(f"non-standard JSON {c}"))


def test_the_rules_on_generated_traces_fire_where_they_should_and_only_there(capsys):
    """Through the whole command: data-bound (1.8-era, num_workers=0) names num_workers with its gain; a
    multi-process DataLoader gets no data finding; launch-bound names torch.compile / CUDA graphs; the
    expert-tuned FP8 H100 trace and the MoE trace (all-to-all hidden under compute) get no alarm."""
    old = _diagnose("v100_18_gen_lines_us.json.gz", capsys)
    f = {x["id"]: x for x in old["findings"]}
    assert "num_workers" in f["data_bound"]["fix"] and f["data_bound"]["gain"]["fraction"] > 0.05
    assert "fp32_on_tensor_cores" in f  # V100 (7.0 from its kernel names), sgemm
    ddp = _diagnose("a100_ddp_gen_lines_ns.json.gz", capsys)
    assert "data_bound" not in {x["id"] for x in ddp["findings"]}
    lb = _diagnose("launch_bound_gen_lines_us.json.gz", capsys)
    f = next(x for x in lb["findings"] if x["id"] == "launch_bound")
    assert "torch.compile" in f["fix"] and "CUDA graph" in f["fix"]
    for name in ("fp8_tuned_gen_single_ns.json.gz", "moe_a2a_gen_lines_ns.json.gz"):
        out = _diagnose(name, capsys)
        assert [x for x in out["findings"] if x["severity"] in ("warning", "critical")] == [], (name, out["findings"])
        assert not {"fp32_on_tensor_cores", "data_bound", "comm_bound", "low_occupancy"} & {x["id"] for x in out["findings"]}
    from trainperf.cli import main

    assert main(["diagnose", str(TRACES / "fp8_tuned_gen_single_ns.json.gz")]) == 0
    text = capsys.readouterr().out
    assert "no findings" in text and "what is left" in text
