"""Monitor parts: phase timer (and its own cost), FLOPs/MFU, sampler (with a fake NVML),
Prometheus over real loopback HTTP, TensorBoard, crash survival of the JSONL files."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import types
import urllib.request

import pytest
import torch

from tests.conftest import ROOT, TINY
from trainperf.monitor import flops as F
from trainperf.monitor.phases import PhaseTimer, measure_overhead
from trainperf.monitor.sampler import DeviceSampler
from trainperf.monitor.sinks import JSONLSink, PrometheusEndpoint


# ---------------------------------------------------------------------- phase timer
def test_phase_timer_splits_wall_and_cpu_time_including_comm():
    t = PhaseTimer("cpu")
    t.start_step()
    t.phase("data")
    time.sleep(0.05)  # waiting: wall time, no CPU
    t.phase("forward")
    x = 0
    end = time.perf_counter() + 0.05
    while time.perf_counter() < end:  # busy: CPU time ~ wall time
        x += 1
    t.phase("comm")
    time.sleep(0.02)
    out = t.end_step()
    assert set(out) == {"data", "forward", "comm"}
    assert 0.045 < out["data"] < 0.5 and 0.015 < out["comm"] < 0.5
    assert t.last_cpu["data"] < 0.5 * out["data"]  # a sleep uses (almost) no CPU
    assert t.last_cpu["forward"] > 0.3 * out["forward"]
    assert t.totals["comm"] == pytest.approx(out["comm"])


def test_timer_overhead_is_far_below_one_percent_of_a_step():
    o = measure_overhead(n_steps=500)
    # 5 boundaries per step; the tiny test model's step is ~10 ms, a real step far more.
    assert o["timer_s_per_step"] < 1e-4, o
    from trainperf.monitor.monitor import measure_overhead as monitor_overhead

    m = monitor_overhead(n_steps=200)  # timer + after_step + a JSONL record every step
    assert m["monitor_s_per_step"] < 1e-3, m


# ---------------------------------------------------------------------- FLOPs, MFU
def _gpt(n_layer=2, n_embd=32, block=32):
    from trainperf.models.gpt import GPT, GPTConfig

    return GPT(GPTConfig(n_layer=n_layer, n_head=2, n_embd=n_embd, block_size=block, vocab_size=256))


def _count(model, batch, seq, vocab=256):
    """StepFlopCounter over one forward + backward, as the training step runs it (contiguous targets)."""
    x = torch.randint(0, vocab, (batch, seq + 1), generator=torch.Generator().manual_seed(0))
    idx, tgt = x[:, :-1].contiguous(), x[:, 1:].contiguous()
    with F.StepFlopCounter() as c:
        _, loss = model(idx, tgt)
        loss.backward()
    model.zero_grad(set_to_none=True)
    return c.per_token(batch * seq)


def test_counted_flops_agree_with_the_formula_and_see_recompute():
    from trainperf.memory.ac import apply_ac

    model = _gpt(n_layer=2, n_embd=64)
    formula = F.formula_flops_per_token(model, 32)
    counted, fwd, note = _count(model, 2, 32)
    assert note == "counted" and fwd is not None
    assert 0.6 * formula < counted < 1.2 * formula  # the formula also counts non-matmul params
    # forward share: 3 x forward is the 6N convention (backward = two forwards); lm_head, attention included
    assert 0.9 * formula < 3 * fwd < 1.1 * formula
    apply_ac(model, mode="full")
    counted_ac, fwd_ac, _ = _count(model, 2, 32)
    extra, how = F.recompute_flops_per_token(model, 32, types.SimpleNamespace(mode="full"))
    assert counted_ac > counted  # recompute executes the blocks' forward again
    assert fwd_ac == fwd  # ... inside the backward: the forward share (and the MFU built on it) stays
    # The formula adds one whole forward per block (Narayanan 2021): an upper bound, since
    # non-reentrant checkpointing stops recomputing once the last saved tensor it needs is back.
    assert 0.4 * extra < counted_ac - counted <= 1.01 * extra, how


def test_counting_never_raises_into_the_step(monkeypatch):
    """A FLOP formula that fails is noted; the step it counts runs on."""
    import torch.utils.flop_counter as fc

    def broken(*a, **k):
        raise ValueError("no formula for this shape")

    monkeypatch.setitem(fc.flop_registry, torch.ops.aten.mm, broken)
    model = torch.nn.Linear(8, 8)
    with F.StepFlopCounter() as c:
        model(torch.randn(4, 8)).sum().backward()
    assert model.weight.grad is not None
    total, fwd, note = c.per_token(4)
    assert total is None and "no formula for this shape" in note


def test_attention_flops_are_counted_on_cpu():
    """CPU's fused attention kernel is not in torch's FLOP registry: without our formula a
    long-context model counted 0.44x its formula and HFU read below MFU."""
    model = _gpt(n_layer=2, n_embd=32, block=256)  # attention is over half of the FLOPs at s=256, h=32
    formula = F.formula_flops_per_token(model, 256)
    counted, _, _ = _count(model, 2, 256)
    assert 0.9 * formula < counted < 1.1 * formula


def test_mfu_and_hfu_from_throughput_and_peak():
    fl = {"flops_per_token_formula": 1e6, "flops_per_token_counted": 1.2e6}
    u = F.utilization(1e5, fl, {"peak_flops": 1e12}, world=2)
    assert u["mfu"] == pytest.approx(1e11 / 2e12) and u["hfu"] == pytest.approx(1.2e11 / 2e12)
    assert "6N" in u["mfu_convention"] and "counted" in u["hfu_convention"] and u["mfu_source"] == "formula"
    assert F.utilization(None, fl, {"peak_flops": 1e12})["mfu"] is None
    # no formula: MFU from 3 x the counted forward FLOPs, and it says so
    u = F.utilization(1e5, {"flops_per_token_formula": None, "flops_per_token_counted": 1.2e6,
                            "flops_per_token_counted_forward": 0.3e6}, {"peak_flops": 1e12})
    assert u["mfu"] == pytest.approx(1e5 * 0.9e6 / 1e12) and u["mfu_source"] == "counted"
    assert "3 x its forward" in u["mfu_convention"]
    none = F.utilization(1e5, {"flops_per_token_formula": None}, {"peak_flops": 1e12})
    assert none["mfu"] is None and none["mfu_convention"] is None  # no convention named for a figure not given


def test_cpu_peak_is_measured_and_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINPERF_CACHE", str(tmp_path))
    p = F.measured_matmul_peak(torch.device("cpu"), n=256, reps=2)
    assert p["peak_flops"] > 1e8 and p["peak_source"].startswith("measured: best of ")
    assert "fp32 matmuls of 256x256 on cpu" in p["peak_source"]
    assert "this run" in p["peak_source"]
    # The disk cache keeps the best figure seen: a busy machine's measurement does not lower it.
    cache = tmp_path / "matmul_peak.json"
    data = json.loads(cache.read_text())
    (key,) = data
    data[key]["peak_flops"] = 1e15
    cache.write_text(json.dumps(data))
    F._PEAK_CACHE.clear()
    again = F.measured_matmul_peak(torch.device("cpu"), n=256, reps=2)
    assert again["peak_flops"] == 1e15 and "best seen on this machine" in again["peak_source"]
    F._PEAK_CACHE.clear()


def test_matmul_shapes_are_each_linear_layers_forward_and_gradients():
    from trainperf.models.gpt import GPT, GPTConfig

    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=1024))
    shapes = F.matmul_shapes(model, 4 * 16, limit=100)
    rows = 64
    # q/k/v/o (32 -> 32), fc (32 -> 128), proj (128 -> 32), lm_head (32 -> 1024): forward x @ W.T,
    # input gradient g @ W, weight gradient g.T @ x
    for i, o in ((32, 32), (32, 128), (128, 32), (32, 1024)):
        assert {(rows, i, o, False, True), (rows, o, i, False, False), (o, rows, i, True, False)} <= set(shapes)
    assert len(shapes) == len(set(shapes))
    top = F.matmul_shapes(model, rows, limit=3)  # the largest FLOP shares first: the output layer's
    assert all(1024 in s[:3] for s in top), top
    # a shape above MAX_MATMUL_FLOPS has its token dimension cut, never its weight's
    big = torch.nn.Linear(2048, 2048)
    cut = F.matmul_shapes(big, 1 << 20)
    assert len(cut) == 3
    for m, k, n, at, bt in cut:
        assert 2.0 * m * k * n <= F.MAX_MATMUL_FLOPS and (k if at else m) < (1 << 20)
        assert {k, n} == {2048} if not at else (m, n) == (2048, 2048)
    # one whose operands pass MAX_OPERAND_BYTES (a 16384 x 4096 weight: 256 MiB) is left out: memory
    assert F.matmul_shapes(torch.nn.Linear(4096, 16384), 1 << 20) == []


def test_cpu_peak_holds_for_the_models_own_matmuls(tmp_path, monkeypatch):
    """The peak MFU divides by is at least what the model's own matmuls reach: issue 40 item 7 (gpt-tiny's
    steps ran above a peak measured on 1024^3 matmuls: MFU above 100%)."""
    from trainperf.models.gpt import GPT, GPTConfig

    monkeypatch.setenv("TRAINPERF_CACHE", str(tmp_path))  # a newcomer's machine: nothing cached
    F._PEAK_CACHE.clear()
    model = GPT(GPTConfig())  # the demo's model (4 layers, 128 wide) at the demo's micro-batch rows
    shapes = F.matmul_shapes(model, 16 * 128)
    peak = F.peak_flops(torch.device("cpu"), "fp32", shapes=shapes)
    assert "the model's 8 matmul shapes" in peak["peak_source"] and peak.get("measure")
    # the model's matmuls timed on their own, as a user would: best of 5 each, after one untimed
    achieved = 0.0
    for m, k, n, at, bt in shapes:
        a, b = F._operands((m, k, n, at, bt), torch.float32, torch.device("cpu"))
        a @ b
        best = min(_timed(lambda: a @ b) for _ in range(5))
        achieved = max(achieved, 2.0 * m * k * n / best)
    # the end of a run measures again and keeps the best (what the monitor does): that figure holds. On a
    # loaded machine both can fall in a busy moment (start 67 GFLOP/s against 192 achieved at load 9); the
    # disk cache keeps the best seen, so the next runs' measurements raise it: up to 3 of them here
    held = F.remeasured_peak(peak)
    assert held["peak_flops_start"] == peak["peak_flops"] and held["peak_flops"] >= peak["peak_flops"]
    assert "start and end of the run" in held["peak_source"]
    for _ in range(3):
        if held["peak_flops"] >= 0.9 * achieved:
            break
        held = F.remeasured_peak(held)
    assert held["peak_flops"] >= 0.9 * achieved, (held["peak_source"], achieved / 1e9)
    F._PEAK_CACHE.clear()


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def test_gpu_peak_comes_from_the_dense_catalog(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: "NVIDIA H200")
    p = F.peak_flops(torch.device("cuda", 0), "bf16")
    assert p["peak_flops"] == 989e12 and "dense bf16" in p["peak_source"]


# ---------------------------------------------------------------------- sampler
class _NvmlError(Exception):
    pass


def fake_pynvml():
    nv = types.ModuleType("pynvml")
    nv.NVMLError = _NvmlError
    nv.nvmlInit = lambda: None
    nv.nvmlShutdown = lambda: None
    nv.nvmlDeviceGetCount = lambda: 1
    nv.nvmlDeviceGetHandleByIndex = lambda i: f"gpu{i}"
    nv.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=93, memory=21)
    nv.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(total=80 * 2**30, used=30 * 2**30, free=0)
    nv.nvmlDeviceGetPowerUsage = lambda h: 412_000
    nv.nvmlDeviceGetClockInfo = lambda h, kind: 1980
    nv.nvmlDeviceGetTemperature = lambda h, kind: 61

    def no_gpm(h):
        raise _NvmlError("Not Supported")

    nv.nvmlGpmQueryDeviceSupport = no_gpm
    return nv


def test_sampler_reads_nvml_and_psutil_and_says_what_is_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml())
    got = []
    s = DeviceSampler(got.append, period_s=0.05, use_gpu=True, step_fn=lambda: 7).start()
    time.sleep(0.3)
    s.stop()
    assert got[0]["meta"]["nvml"] == "ok" and got[0]["meta"]["gpm"].startswith("unavailable")
    rec = got[1]
    assert rec["step"] == 7 and rec["gpu_kernel_busy_pct"] == 93 and rec["gpu_mem_copy_util_pct"] == 21
    assert rec["gpu_power_w"] == 412 and rec["gpu_sm_clock_mhz"] == 1980
    assert rec["ram_total_bytes"] > 0 and rec["proc_rss_bytes"] > 0 and "cpu_pct" in rec
    n = len(got)
    time.sleep(0.15)
    assert len(got) == n  # stopped


def test_sampler_reads_sm_and_tensor_activity_from_nvml_gpm(monkeypatch):
    nv = fake_pynvml()
    nv.NVML_GPM_METRICS_GET_VERSION = 1
    nv.nvmlGpmQueryDeviceSupport = lambda h: types.SimpleNamespace(isSupportedDevice=1)
    nv.nvmlGpmSampleAlloc = lambda: object()
    nv.nvmlGpmSampleGet = lambda h, sample: sample
    nv.nvmlGpmSampleFree = lambda sample: None
    values = {2: 71.5, 3: 40.0, 5: 55.0}  # NVML_GPM_METRIC_SM_UTIL, _SM_OCCUPANCY, _ANY_TENSOR_UTIL

    class MetricsGet:
        def __init__(self):
            self.metrics = [types.SimpleNamespace(metricId=0, nvmlReturn=0, value=0.0) for _ in range(98)]

    def metrics_get(req):
        assert req.sample1 is not req.sample2 and req.numMetrics == 3
        for m in req.metrics[:req.numMetrics]:
            m.value = values[m.metricId]

    nv.c_nvmlGpmMetricsGet_t = MetricsGet
    nv.nvmlGpmMetricsGet = metrics_get
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    got = []
    s = DeviceSampler(got.append, period_s=0.05, use_gpu=True).start()
    time.sleep(0.2)
    s.stop()
    assert got[0]["meta"]["gpm"] == "ok"
    assert got[1]["gpu_sm_active_pct"] == 71.5 and got[1]["gpu_sm_occupancy_pct"] == 40.0
    assert got[1]["gpu_tensor_active_pct"] == 55.0


def test_nvtx_ranges_are_balanced_per_phase(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda.nvtx, "range_push", lambda name: calls.append(("push", name)))
    monkeypatch.setattr(torch.cuda.nvtx, "range_pop", lambda: calls.append(("pop",)))
    t = PhaseTimer("cpu")
    t.nvtx = True  # on CUDA: PhaseTimer("cuda", nvtx=True); here the clock is the CPU one
    for _ in range(2):
        t.start_step()
        for p in ("data", "forward", "backward", "optimizer"):
            t.phase(p)
        t.end_step()
    assert calls[:8] == [("push", "trainperf/data"), ("pop",), ("push", "trainperf/forward"), ("pop",),
                         ("push", "trainperf/backward"), ("pop",), ("push", "trainperf/optimizer"), ("pop",)]
    assert len(calls) == 16
    assert not PhaseTimer("cpu", nvtx=True).nvtx  # gated: only where CUDA runs


def test_sampler_without_nvml_still_samples_the_host(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    got = []
    s = DeviceSampler(got.append, period_s=0.05, use_gpu=True).start()
    time.sleep(0.2)
    s.stop()
    assert "unavailable" in got[0]["meta"]["nvml"] and "nvidia-ml-py" in got[0]["meta"]["nvml"]
    assert got[1]["ram_used_bytes"] > 0 and "gpu_kernel_busy_pct" not in got[1]


# ---------------------------------------------------------------------- sinks
def test_prometheus_endpoint_serves_metrics_on_loopback():
    ep = PrometheusEndpoint(0, rank=0)  # port 0: a free port
    try:
        assert ep.host == "127.0.0.1"
        ep.write({"step": 5, "loss": 2.5, "phases_s": {"data": 0.01}, "note": "text is skipped"})
        with urllib.request.urlopen(f"http://127.0.0.1:{ep.port}/metrics", timeout=5) as r:
            assert r.status == 200 and r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            body = r.read().decode()
        assert "# TYPE trainperf_loss gauge" in body
        assert 'trainperf_loss{rank="0"} 2.5' in body and 'trainperf_phases_s_data{rank="0"} 0.01' in body
        assert "note" not in body
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(f"http://127.0.0.1:{ep.port}/other", timeout=5)
    finally:
        ep.close()


def test_tensorboard_sink_or_a_clear_message(tmp_path):
    from trainperf.monitor.sinks import TensorBoardSink

    try:
        import tensorboard  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match=r"trainperf\[tensorboard\]"):
            TensorBoardSink("/tmp/unused")
        # in a run: a warning, the status says why, training goes on
        from trainperf.config import load_config
        from trainperf.monitor.monitor import Monitor

        cfg = load_config(None, ["monitor.tensorboard=true", "monitor.mfu=false"])
        with pytest.warns(UserWarning, match="tensorboard"):
            mon = Monitor(cfg.monitor, tmp_path, rank=0, world=1)
        mon.close()
        assert mon.status["tensorboard"].startswith("off:")
        return
    pytest.skip("tensorboard installed: covered by its own writer")


@pytest.mark.slow
def test_metrics_survive_a_kill_9(tmp_path):
    """The trainer is killed (SIGKILL, no cleanup) after step 3: the lines already written are whole."""
    run_dir = tmp_path / "run"
    script = f"""
import os, signal, sys
sys.path.insert(0, {str(ROOT)!r})
from tests.conftest import TINY
from trainperf.config import load_config
from trainperf.train.resolve import resolve
from trainperf.train.build import build_trainer
from trainperf.train.run import fit
cfg = load_config(None, TINY + ["data.source=synthetic", "run.steps=50", "run.dir={run_dir}",
                                "monitor.sample_every_s=0.05"])
tr = build_trainer(resolve(cfg, world_size=1), verbose=False)
orig = tr.train_step
def step():
    if tr.step == 4:
        os.kill(os.getpid(), signal.SIGKILL)
    return orig()
tr.train_step = step
fit(tr, resume="never", verbose=False)
"""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == -signal.SIGKILL, p.stderr[-2000:]
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    recs = [json.loads(x) for x in lines]  # every line parses: nothing half-written
    assert [r["step"] for r in recs] == [1, 2, 3, 4]
    samples = (run_dir / "samples.jsonl").read_text().splitlines()
    assert "meta" in json.loads(samples[0])
    from trainperf.diagnosis.engine import diagnose

    result = diagnose(run_dir)
    assert result["crashed"] and result["summary"]["steps_recorded"] == 4


def test_jsonl_sink_is_line_buffered(tmp_path):
    sink = JSONLSink(tmp_path / "m.jsonl")
    sink.write({"step": 1, "loss": 1.0})
    # visible to another reader before close()
    assert json.loads((tmp_path / "m.jsonl").read_text())["step"] == 1
    sink.close()


def test_oom_snapshot_is_off_without_cuda(tmp_path):
    from trainperf.monitor.profiling import OomSnapshot

    snap = OomSnapshot(tmp_path / "oom.pickle", enabled=True)
    assert snap.enabled is torch.cuda.is_available()
    with pytest.raises(RuntimeError):
        with snap.guard():
            raise RuntimeError("not an OOM")
    assert snap.written is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_oom_writes_a_snapshot_before_the_error(tmp_path):
    from trainperf.monitor.profiling import OomSnapshot

    snap = OomSnapshot(tmp_path / "oom.pickle", enabled=True)
    with pytest.raises(torch.cuda.OutOfMemoryError):
        with snap.guard():
            torch.empty(1 << 50, device="cuda")
    snap.close()
    assert (tmp_path / "oom.pickle").stat().st_size > 0


def test_prometheus_from_a_training_run(tmp_path):
    """monitor.prometheus_port=0 serves while training; the summary says where."""
    from trainperf.config import load_config
    from trainperf.train.resolve import resolve
    from trainperf.monitor.monitor import Monitor

    cfg = load_config(None, TINY + ["monitor.prometheus_port=0", "monitor.sample_every_s=0.05",
                                    f"run.dir={tmp_path / 'run'}"])
    mon = Monitor(cfg.monitor, tmp_path / "run", device="cpu", rank=0, world=1)
    try:
        mon.write({"step": 1, "loss": 3.0, "step_time_s": 0.1, "tokens_per_s": 100.0})
        time.sleep(0.15)
        url = mon.status["prometheus"]
        body = urllib.request.urlopen(url, timeout=5).read().decode()
        assert "trainperf_tokens_per_s" in body and "trainperf_ram_used_bytes" in body  # step + sampler
    finally:
        mon.close()


def test_a_prometheus_port_in_use_is_a_config_error_naming_it():
    # "OSError: [Errno 98] Address already in use" once ended `trainperf train` with a traceback
    import socket

    from trainperf.errors import ConfigError
    from trainperf.monitor.sinks import PrometheusEndpoint

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        busy = s.getsockname()[1]
        with pytest.raises(ConfigError, match=rf"rank 0 cannot serve on 127.0.0.1:{busy} .*choose a free port"):
            PrometheusEndpoint(busy, "127.0.0.1")
    with pytest.raises(ConfigError, match="rank 3 cannot serve on 127.0.0.1:65538"):
        PrometheusEndpoint(65535 + 3, "127.0.0.1", rank=3)  # base port + rank past 65535
