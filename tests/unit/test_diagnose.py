"""Diagnosis: real tiny runs diagnosed end to end (slow storage -> data_bound, an injected
exposed-communication wait -> comm_bound, a healthy run -> no finding), and each rule on a
run directory written by hand (figures a CPU-only machine cannot produce: NVML, several ranks)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.conftest import TINY
from trainperf.cli import main
from trainperf.config import load_config
from trainperf.train.resolve import resolve
from trainperf.diagnosis.rules import RULES, rules_markdown
from trainperf.diagnosis.engine import diagnose
from trainperf.diagnosis.text import format_findings
from trainperf.train.build import build_trainer
from trainperf.train.run import fit

BASE = TINY + ["data.source=synthetic", "checkpoint.at_end=false", "monitor.sample_every_s=0.1"]


def run_tiny(tmp_path: Path, *overrides: str, steps: int = 8, patch=None, verbose=False) -> tuple[Path, dict]:
    run_dir = tmp_path / "run"
    cfg = load_config(None, BASE + [f"run.dir={run_dir}", f"run.steps={steps}", *overrides])
    trainer = build_trainer(resolve(cfg, world_size=1), verbose=False)
    if patch:
        patch(trainer)
    summary = fit(trainer, resume="never", verbose=verbose)
    return run_dir, summary


def ids(result: dict) -> list[str]:
    return [f["id"] for f in result["findings"]]


# ---------------------------------------------------------------------- end to end
def test_slow_storage_is_diagnosed_data_bound_and_io_bound(tmp_path, capsys):
    # 60 ms per sample read, 4 samples per step read one after another: ~240 ms of data wait per step.
    run_dir, _ = run_tiny(tmp_path, "data.simulate.read_latency_ms=60", "train.global_batch=4", steps=5,
                          verbose=True)
    printed = capsys.readouterr().out  # the trainer prints the findings at the end of the run
    assert "== trainperf diagnosis ==" in printed and "[critical] data_bound" in printed
    result = diagnose(run_dir)
    assert ids(result)[0] == "data_bound", format_findings(result)
    f = result["findings"][0]
    assert f["severity"] == "critical" and f["kind"] == "io"  # sleeping reads: little CPU while waiting
    assert result["summary"]["phase_fractions"]["data"] > 0.4
    assert "data.loader=hybrid" in f["fix"]
    assert "comm_bound" not in ids(result)


def test_cpu_heavy_batches_are_diagnosed_decode_bound(tmp_path):
    def decode_in_process(trainer):
        orig = trainer.data.train.next_batch

        def next_batch(*a, **k):
            end = time.process_time() + 0.08  # 80 ms of CPU work per batch: decoding, augmenting
            while time.process_time() < end:
                pass
            return orig(*a, **k)

        trainer.data.train.next_batch = next_batch

    run_dir, _ = run_tiny(tmp_path, steps=5, patch=decode_in_process)
    result = diagnose(run_dir)
    f = next(f for f in result["findings"] if f["id"] == "data_bound")
    assert f["kind"] == "decode" and "CPU-bound" in f["evidence"], format_findings(result)
    assert "num_workers" in f["fix"]


def test_injected_communication_wait_is_diagnosed_comm_bound(tmp_path):
    def delay_allreduce(trainer):
        orig = trainer._optimizer_step

        def step():
            trainer.timer.phase("comm")  # the hook a data-parallel wrapper uses for exposed all-reduce
            time.sleep(0.1)  # a gradient all-reduce that did not overlap with backward
            trainer.timer.phase("optimizer")
            return orig()

        trainer._optimizer_step = step

    run_dir, summary = run_tiny(tmp_path, steps=6, patch=delay_allreduce)
    assert summary["phase_seconds"]["comm"] > 0.45
    result = diagnose(run_dir)
    assert "comm_bound" in ids(result), format_findings(result)
    f = next(f for f in result["findings"] if f["id"] == "comm_bound")
    assert "exposed communication" in f["evidence"] and "compression" in f["fix"]
    assert "data_bound" not in ids(result)


def test_healthy_run_has_no_finding_and_writes_mfu_and_a_trace(tmp_path):
    run_dir, summary = run_tiny(tmp_path, "monitor.profile.start_step=3", "monitor.profile.steps=1", steps=8)
    result = diagnose(run_dir)
    # host_contention speaks about the machine, not the run: on a shared machine it fires rightly (its own
    # tests pin a busy process next to the trainer); every other rule must stay quiet.
    assert [i for i in ids(result) if i != "host_contention"] == [], format_findings(result)
    assert not result["crashed"]
    # MFU / HFU are in summary.json with the peak and conventions they use
    saved = json.loads((run_dir / "summary.json").read_text())
    for key in ("mfu", "hfu", "flops_per_token_formula", "flops_per_token_counted", "peak_flops", "peak_source"):
        assert saved[key] is not None, key
    assert saved["peak_source"].startswith("measured")
    assert 0 < saved["mfu"] < 1 and 0 < saved["hfu"] < 1
    assert "6N" in saved["mfu_convention"] and "FlopCounterMode" in saved["hfu_convention"]
    # the profiler window wrote a gzipped Chrome trace
    import gzip

    trace = run_dir / "profile" / "trace_rank0_step3.json.gz"
    events = json.loads(gzip.open(trace).read())["traceEvents"]
    assert any("aten::" in str(e.get("name", "")) for e in events)
    assert saved["monitor"]["profile_trace"] == str(trace)
    # every step record carries CPU time per phase and MFU
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in recs if "loss" in r]
    assert len(steps) == 8 and all("phases_cpu_s" in r and "mfu" in r for r in steps)


def test_cli_diagnose_json_and_text(tmp_path, capsys):
    stale = tmp_path / "run" / "metrics.rank3.jsonl"  # left by an earlier 4-rank run in the same directory
    stale.parent.mkdir(parents=True)
    stale.write_text(json.dumps({"step": 1, "loss": 1.0, "step_time_s": 9.0, "phases_s": {"forward": 9.0}}) + "\n")
    run_dir, _ = run_tiny(tmp_path, steps=4)
    assert not stale.exists()
    assert main(["diagnose", str(run_dir), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) >= {"findings", "summary", "missing"}
    assert set(out["summary"]) >= {"mfu", "phase_fractions", "step_time_s", "tokens_per_s"}
    assert any("NVML" in m for m in out["missing"])  # this machine has no NVML: said, not hidden
    assert main(["diagnose", str(run_dir)]) == 0
    assert "trainperf diagnosis" in capsys.readouterr().out


def test_diagnose_of_a_missing_directory_is_a_user_error(tmp_path, capsys):
    assert main(["diagnose", str(tmp_path / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["diagnose", str(tmp_path / "empty")]) == 2


# ---------------------------------------------------------------------- rules on written runs
def write_run(d: Path, ranks: dict[int, list[dict]], samples: list[dict] | None = None, summary=None):
    d.mkdir(parents=True, exist_ok=True)
    for r, recs in ranks.items():
        name = "metrics.jsonl" if r == 0 else f"metrics.rank{r}.jsonl"
        (d / name).write_text("".join(json.dumps(x) + "\n" for x in recs))
    if samples is not None:
        (d / "samples.jsonl").write_text("".join(json.dumps(x) + "\n" for x in samples))
    if summary is not None:
        (d / "summary.json").write_text(json.dumps(summary))
    return d


def steps(n=10, **phases):
    phases = phases or {"data": 0.01, "forward": 0.03, "backward": 0.05, "optimizer": 0.01}
    t = sum(phases.values())
    return [{"step": i, "loss": 1.0, "step_time_s": t, "tokens_per_s": 1000 / t, "phases_s": dict(phases)}
            for i in range(1, n + 1)]


def test_straggler_names_the_slow_rank(tmp_path):
    fast = steps(forward=0.03, backward=0.05, comm=0.04)
    slow = steps(forward=0.05, backward=0.08, comm=0.0)
    d = write_run(tmp_path / "r", {0: fast, 1: fast, 2: slow, 3: fast})
    f = next(f for f in diagnose(d)["findings"] if f["id"] == "straggler")
    assert f["rank"] == 2 and "rank 2" in f["evidence"]
    d2 = write_run(tmp_path / "even", {0: fast, 1: fast})
    assert "straggler" not in ids(diagnose(d2))


def test_gpu_rules_fire_on_nvml_figures_and_stay_quiet_when_good(tmp_path):
    bad = [{"t": i, "elapsed_s": i, "step": i, "gpu_kernel_busy_pct": 50, "gpu_sm_active_pct": 40,
            "gpu_mem_copy_util_pct": 45} for i in range(2, 11)]
    summ = {"mfu": 0.12, "peak_source": "catalog h100-sxm dense bf16 peak 989 TFLOP/s", "device": "cuda:0",
            "mem_peak_bytes": 20 * 2**30, "mem_capacity_bytes": 80 * 2**30}
    got = ids(diagnose(write_run(tmp_path / "bad", {0: steps()}, bad, summ)))
    for rule in ("launch_bound", "memory_bound", "low_mfu", "gpu_util_below_target", "sm_efficiency_below_target",
                 "mem_copy_above_target"):
        assert rule in got, (rule, got)
    good = [dict(x, gpu_kernel_busy_pct=97, gpu_sm_active_pct=80, gpu_mem_copy_util_pct=20) for x in bad]
    summ_good = dict(summ, mfu=0.45, mem_peak_bytes=70 * 2**30)
    assert diagnose(write_run(tmp_path / "good", {0: steps()}, good, summ_good))["findings"] == []


def test_low_mfu_is_not_judged_against_a_measured_cpu_peak(tmp_path):
    summ = {"mfu": 0.01, "peak_source": "measured: best of 5 fp32 1024x1024 matmuls on cpu"}
    assert "low_mfu" not in ids(diagnose(write_run(tmp_path / "r", {0: steps()}, None, summ)))


def test_warm_up_steps_are_left_out(tmp_path):
    recs = steps(10)
    recs[0]["phases_s"]["data"] = 5.0  # first step: cold caches, compilation
    result = diagnose(write_run(tmp_path / "r", {0: recs}))
    assert result["findings"] == [] and result["summary"]["steps_used"] == 9


def test_rule_table_markdown_lists_every_rule():
    table = rules_markdown()
    for rule in RULES:
        assert f"`{rule.id}`" in table
    assert len(table.splitlines()) == len(RULES) + 2


@pytest.mark.parametrize("cut", [True, False])
def test_a_line_cut_by_a_crash_is_skipped(tmp_path, cut):
    d = write_run(tmp_path / "r", {0: steps(5)})
    if cut:
        with open(d / "metrics.jsonl", "a") as f:
            f.write('{"step": 6, "loss": 1.0, "step_ti')
    result = diagnose(d)
    assert result["crashed"] and result["summary"]["steps_recorded"] == 5


# ---------------------------------------------------------------------- host contention
def contended(n=20, cores=1.0, times=None, device="cpu"):
    """Step records whose compute phases got ``cores`` CPU seconds per wall second."""
    times = times or [0.2] * n
    recs = []
    for i, t in enumerate(times, 1):
        ph = {"data": 0.02 * t, "forward": 0.38 * t, "backward": 0.5 * t, "optimizer": 0.1 * t}
        recs.append({"step": i, "loss": 1.0, "step_time_s": t, "tokens_per_s": 1000 / t, "phases_s": ph,
                     "phases_cpu_s": {k: v * cores for k, v in ph.items()}})
    return recs


def host_run(d: Path, recs, threads=1, machine_pct=None, device="cpu") -> Path:
    samples = None if machine_pct is None else [
        {"step": i, "elapsed_s": i, "cpu_pct": machine_pct, "proc_cpu_pct": 64.0} for i in range(3, 20)]
    write_run(d, {0: recs}, samples, {"device": device})
    (d / "config.yaml").write_text(f"run:\n  threads: {threads}\n  device: {device}\n")
    return d


def test_host_contention_a_process_at_64pct_of_a_cpu_with_erratic_steps(tmp_path):
    # The case: 64% of one CPU, steps between 0.12 and 9 s.
    times = [0.12, 0.3, 0.15, 9.0, 0.2, 0.14, 4.5, 0.13, 0.25, 6.0, 0.12, 0.18, 2.0, 0.16, 0.3, 7.5, 0.2, 0.15, 0.9, 0.3]
    result = diagnose(host_run(tmp_path / "r", contended(cores=0.64, times=times), machine_pct=100.0))
    f = next(f for f in result["findings"] if f["id"] == "host_contention")
    assert f["severity"] == "critical", f  # spread > 3x the median
    assert "0.64 cores" in f["evidence"] and "64% of the 1 thread" in f["evidence"]
    assert "from 0.12 to 9 s" in f["evidence"] and f["step_time_spread"] > 3
    assert "machine CPU 100% busy" in f["evidence"]


def test_host_contention_each_trigger_alone_and_quiet_runs(tmp_path):
    def got(name, recs, **kw):
        return next((f for f in diagnose(host_run(tmp_path / name, recs, **kw))["findings"]
                     if f["id"] == "host_contention"), None)

    assert got("quiet", contended(cores=0.98)) is None
    starved = got("starved", contended(cores=0.6))  # steady steps, but well under one core
    assert starved and starved["severity"] == "warning" and "spread" not in starved["evidence"]
    assert starved["step_time_spread"] == pytest.approx(1.0)
    # 2 threads that get 1.1 cores: normal on a quiet machine (small ops run on one thread) ...
    assert got("two_quiet", contended(cores=1.1), threads=2, machine_pct=55.0) is None
    # ... contention when the machine is saturated
    assert got("two_busy", contended(cores=1.1), threads=2, machine_pct=97.0)
    # a GPU run: no CPU-share judgement, but erratic steps still fire
    erratic = [0.1] * 14 + [0.4] * 6
    gpu = got("gpu", contended(times=erratic, cores=0.3), device="cuda:0")
    assert gpu and gpu["cpu_cores_got"] is None and gpu["step_time_spread"] == pytest.approx(4.0)
    assert got("few", contended(n=8, times=[0.1] * 6 + [0.5] * 2)) is None  # < 10 steady steps: not judged


def test_host_contention_on_a_real_run_sharing_its_core_with_a_busy_process(tmp_path):
    import os
    import subprocess
    import sys

    cpu = min(os.sched_getaffinity(0))
    keep = os.sched_getaffinity(0)
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"], preexec_fn=lambda: os.sched_setaffinity(0, {cpu}))
    try:
        os.sched_setaffinity(0, {cpu})  # this process (the trainer) shares one core with the busy loop
        run_dir, _ = run_tiny(tmp_path, steps=12)
    finally:
        os.sched_setaffinity(0, keep)
        busy.kill()
        busy.wait()
    f = next((f for f in diagnose(run_dir)["findings"] if f["id"] == "host_contention"), None)
    assert f is not None, format_findings(diagnose(run_dir))
    assert f["cpu_cores_got"] < 0.75, f  # about half a core: the scheduler splits it with the busy loop


# ---------------------------------------------------------------------- straggler by the trainer's clock
def clock_run(d: Path, windows: list[list[float]], clock="thread_cpu", per_window=5) -> Path:
    """Rank 0's records as the trainer writes them: each record of a log window carries the window's
    ``rank_compute_s``; per-rank wall-clock files say every rank is equally slow (they wait for each other)."""
    recs = []
    for w, comp in enumerate(windows):
        for k in range(per_window):
            step = w * per_window + k + 1
            recs.append({"step": step, "loss": 1.0, "step_time_s": 0.27, "tokens_per_s": 1000,
                         "phases_s": {"forward": 0.1, "backward": 0.17}, "rank_compute_s": comp,
                         "rank_clock": clock})
    return write_run(d, {0: recs, 1: [dict(r, rank=1) for r in recs]})


def test_straggler_by_compute_clock_names_the_slow_rank_and_by_how_much(tmp_path):
    # the case: rank 1 shares its core; its own compute is ~270 ms against ~130 ms
    windows = [[0.131, 0.262], [0.129, 0.275], [0.130, 0.268], [0.132, 0.271], [0.128, 0.266]]
    result = diagnose(clock_run(tmp_path / "r", windows))
    f = next(f for f in result["findings"] if f["id"] == "straggler")
    assert f["rank"] == 1 and f["clock"] == "thread_cpu" and f["severity"] == "critical"
    assert f["ratio"] == pytest.approx(2.07, abs=0.03)
    assert "rank 1 computes 268 ms per step against 130 ms" in f["evidence"]
    assert "median over 5 log windows" in f["evidence"] and "above 1.15x in 100%" in f["evidence"]
    assert "thread CPU time" in f["evidence"] and "balance" in f["fix"]
    # the wall-clock files alone see nothing: both ranks look equally slow
    assert "straggler" not in ids(diagnose(write_run(tmp_path / "wall", {0: steps(), 1: steps()})))


def test_straggler_by_compute_clock_ignores_noise(tmp_path):
    # every rank within 8%: no finding
    noisy = [[0.100, 0.108, 0.103, 0.097], [0.104, 0.099, 0.106, 0.101], [0.099, 0.102, 0.100, 0.107],
             [0.101, 0.105, 0.098, 0.103]]
    assert "straggler" not in ids(diagnose(clock_run(tmp_path / "noise", noisy, clock="cuda_events")))
    # one slow window out of five (a hiccup) is not a straggler: the median over windows decides
    hiccup = [[0.1, 0.1, 0.1, 0.1]] * 2 + [[0.1, 0.1, 0.3, 0.1]] + [[0.1, 0.1, 0.1, 0.1]] * 2
    assert "straggler" not in ids(diagnose(clock_run(tmp_path / "hiccup", hiccup)))
    # a real one among four ranks, on CUDA events
    slow = [[0.1, 0.1, 0.13, 0.1]] * 4
    f = next(f for f in diagnose(clock_run(tmp_path / "four", slow, clock="cuda_events"))["findings"]
             if f["id"] == "straggler")
    assert f["rank"] == 2 and f["severity"] == "warning" and "CUDA events" in f["evidence"]


def test_straggler_under_tensor_and_pipeline_parallelism_names_the_group_and_the_stage(tmp_path):
    """4 ranks as data=2 x tensor=2 (tensor groups [0, 1], [2, 3]) and as pipeline=2 x data=2 (stage 0: ranks
    0, 1; stage 1: ranks 2, 3): the trainer writes every global rank's clock with the groups; rank 3 is slow.
    The data ranks' rows (the slowest of each tensor group) would blame data rank 1 alike for ranks 2 and 3."""
    from trainperf.train.loop import rank_groups
    from trainperf.distributed.parallel_dims import ParallelDims

    def run(d, dims, virtual=1):
        recs = [{"step": i, "loss": 3.0, "step_time_s": 0.3, "tokens_per_s": 100.0,
                 "phases_s": {"forward": 0.1, "backward": 0.2}, "rank_clock": "thread_cpu",
                 "rank_compute_s": [0.1, 0.2], "rank_compute_by_rank_s": [0.1, 0.1, 0.1, 0.2],
                 "rank_cpu_by_rank_s": [0.1, 0.1, 0.1, 0.2], "rank_groups": rank_groups(dims, virtual)}
                for i in range(1, 21)]
        return {x["id"]: x for x in diagnose(write_run(d, {0: recs}))["findings"]}["straggler"]

    tp = run(tmp_path / "tp", ParallelDims(dp_replicate=2, dp_shard=1, tp=2, pp=1, world_size=4))
    assert tp["rank"] == 3 and tp["tensor_group"] == [2, 3] and "stage" not in tp
    assert "rank 3 is in tensor-parallel group [2, 3]" in tp["evidence"] and "[2, 3]" in tp["cause"]
    assert "parallelism.balance.enabled=true (moves micro-batches off the data-parallel rank of rank 3" in tp["fix"]
    pp = run(tmp_path / "pp", ParallelDims(dp_replicate=2, dp_shard=1, tp=1, pp=2, world_size=4))
    assert pp["rank"] == 3 and pp["stage"] == 1 and pp["stage_ranks"] == [2, 3] and "tensor_group" not in pp
    assert "rank 3 is pipeline stage 1, ranks [2, 3]" in pp["evidence"] and "bubble" in pp["evidence"]
    inter = run(tmp_path / "vpp", ParallelDims(dp_replicate=2, dp_shard=1, tp=1, pp=2, world_size=4), virtual=2)
    assert inter["stages"] == [1, 3] and "pipeline rank 1 (stages 1, 3), ranks [2, 3]" in inter["evidence"]


# ---------------------------------------------------------------------- compilation
def test_compile_is_its_own_phase_and_not_in_steady_fractions(tmp_path, capsys):
    recs = steps(2)  # a short run: no warm-up step is dropped, so the compile step is in the steady set
    recs[0]["phases_s"]["compile"] = 42.0
    recs[0]["step_time_s"] += 42.0
    result = diagnose(write_run(tmp_path / "r", {0: recs}, None, {"device": "cpu", "train_time_s": 42.2}))
    s = result["summary"]
    assert "compile" not in s["phase_fractions"] and s["phase_fractions"]["data"] == pytest.approx(0.1)
    assert s["compile_s"] == 42.0
    assert "data_bound" not in ids(result)  # 42 s of compilation is not data time
    f = next(f for f in result["findings"] if f["id"] == "compile_time")
    assert f["severity"] == "info" and "42.0 s" in f["evidence"] and "not as data" in f["evidence"]
    assert "left out of the steady-state fractions" in format_findings(result)
    assert main(["diagnose", str(tmp_path / "r"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["summary"]["compile_s"] == 42.0


def test_diagnose_json_is_strict(tmp_path, capsys):
    recs = steps(5)
    recs[-1]["loss"] = float("nan")
    d = write_run(tmp_path / "r", {0: recs}, None, {"mfu": float("nan"), "device": "cpu"})
    assert main(["diagnose", str(d), "--json"]) == 0
    out = capsys.readouterr().out
    assert "NaN" not in out and json.loads(out)["summary"]["mfu_run"] is None


def test_straggler_evidence_says_when_the_rank_waited_for_a_core(tmp_path):
    recs = [{"step": i, "loss": 3.0, "step_time_s": 0.3, "tokens_per_s": 100.0,
             "phases_s": {"data": 0.0, "forward": 0.1, "backward": 0.2},
             "rank_compute_s": [0.07, 0.15], "rank_cpu_s": [0.07, 0.075], "rank_clock": "wall_to_last_grad"}
            for i in range(1, 21)]
    f = {x["id"]: x for x in diagnose(write_run(tmp_path / "r", {0: recs}))["findings"]}["straggler"]
    assert f["rank"] == 1 and "waited for a core" in f["evidence"]
    for r in recs:
        r["rank_cpu_s"] = [0.07, 0.148]  # the same CPU time as its clock: a slower device, not a shared core
    f = {x["id"]: x for x in diagnose(write_run(tmp_path / "s", {0: recs}))["findings"]}["straggler"]
    assert "computes slower" in f["evidence"]


@pytest.mark.parametrize("summary,config,reason", [
    ({"flops_per_token_formula": None, "flops_formula_note": "no FLOP formula for this model", "peak_flops": 1e12},
     {}, "no FLOP formula: no FLOP formula for this model"),
    ({"flops_per_token_formula": 1e6, "peak_flops": None, "peak_source": "unknown GPU"}, {}, "no peak FLOP/s"),
    ({"flops_per_token_formula": None}, {"monitor": {"mfu": False}}, "monitor.mfu=false"),
])
def test_not_measured_mfu_gives_the_real_reason(tmp_path, summary, config, reason):
    import json

    import yaml

    d = write_run(tmp_path / "r", {0: steps(5)})
    (d / "summary.json").write_text(json.dumps(summary))
    (d / "config.yaml").write_text(yaml.safe_dump(config))
    missing = " ".join(diagnose(d)["missing"])
    assert reason in missing, missing


def test_straggler_fix_does_not_suggest_the_balancer_when_it_is_on(tmp_path):
    """With parallelism.balance.enabled=true the fix still said 'parallelism.balance.enabled=true' (fuzzing)."""
    import yaml

    fast = steps(forward=0.03, backward=0.05, comm=0.04)
    slow = steps(forward=0.05, backward=0.08, comm=0.0)
    d = write_run(tmp_path / "r", {0: fast, 1: slow})
    f = next(f for f in diagnose(d)["findings"] if f["id"] == "straggler")
    assert f["fix"].startswith("parallelism.balance.enabled=true")
    (d / "config.yaml").write_text(yaml.safe_dump({"parallelism": {"balance": {"enabled": True}}}))
    f = next(f for f in diagnose(d)["findings"] if f["id"] == "straggler")
    assert f["fix"].startswith("the balancer is on") and "min_share" in f["fix"]
