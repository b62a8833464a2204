"""Device sampler: a background thread reading GPU, CPU and RAM figures every ``sample_every_s``.

Per record (one JSON line in ``samples.jsonl``, or ``samples.rank{R}.jsonl`` on ranks > 0)::

    {"t": unix time, "elapsed_s", "rank", "step", "cpu_pct" (whole machine), "proc_cpu_pct"
     (this process and its children, 100 = one core), "ram_used_bytes", "ram_total_bytes",
     "proc_rss_bytes", "gpu_kernel_busy_pct", "gpu_mem_copy_util_pct", "gpu_memory_used_bytes",
     "gpu_power_w", "gpu_sm_clock_mhz", "gpu_sm_active_pct", "gpu_sm_occupancy_pct",
     "gpu_tensor_active_pct"}

``gpu_kernel_busy_pct`` is NVML's "GPU utilization": the percent of time one or more kernels ran
(kernel-busy time, not efficiency). ``gpu_mem_copy_util_pct`` is NVML's memory utilization (time
device memory was read or written). SM activity, occupancy and tensor-pipe activity come from
NVML GPM (Hopper and newer); DCGM is not read. The first line is ``{"meta": {...}}`` and says
which sources were available and why the others were not.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Callable

_GPM_METRICS = {  # NVML_GPM_METRIC_* ids (nvml.h)
    "gpu_sm_active_pct": 2,  # SM_UTIL: percentage of SMs that were busy
    "gpu_sm_occupancy_pct": 3,  # SM_OCCUPANCY: active warps vs theoretical maximum
    "gpu_tensor_active_pct": 5,  # ANY_TENSOR_UTIL: time SMs did any tensor-core work
}


class _Gpm:
    """NVML GPM: metrics from two samples taken one period apart."""

    def __init__(self, nv, handle):
        self.nv, self.handle = nv, handle
        support = nv.nvmlGpmQueryDeviceSupport(handle)
        if not support.isSupportedDevice:
            raise RuntimeError("this GPU does not support NVML GPM (Hopper or newer needed)")
        self.prev = nv.nvmlGpmSampleGet(handle, nv.nvmlGpmSampleAlloc())

    def read(self) -> dict[str, float | None]:
        nv = self.nv
        cur = nv.nvmlGpmSampleGet(self.handle, nv.nvmlGpmSampleAlloc())
        req = nv.c_nvmlGpmMetricsGet_t()
        req.version = nv.NVML_GPM_METRICS_GET_VERSION
        req.numMetrics = len(_GPM_METRICS)
        req.sample1, req.sample2 = self.prev, cur
        for i, mid in enumerate(_GPM_METRICS.values()):
            req.metrics[i].metricId = mid
        nv.nvmlGpmMetricsGet(req)
        nv.nvmlGpmSampleFree(self.prev)
        self.prev = cur
        out = {}
        for i, name in enumerate(_GPM_METRICS):
            m = req.metrics[i]
            out[name] = float(m.value) if int(m.nvmlReturn) == 0 else None
        return out


def _local_gpu_index() -> int:
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.current_device()
    except Exception:  # noqa: BLE001
        pass
    return int(os.environ.get("LOCAL_RANK", 0))


class DeviceSampler:
    """``start()`` a daemon thread that calls ``write(record)`` every ``period_s``; ``stop()`` it.

    ``step_fn`` returns the current training step (stamped on each record). ``use_gpu`` False
    skips NVML (CPU runs)."""

    def __init__(self, write: Callable[[dict], None], *, period_s: float = 1.0, rank: int = 0,
                 use_gpu: bool = True, step_fn: Callable[[], int] | None = None):
        self.write, self.period_s, self.rank = write, float(period_s), rank
        self.step_fn = step_fn or (lambda: None)
        self.meta: dict[str, Any] = {"rank": rank, "period_s": self.period_s}
        self.samples = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nv = self._handle = self._gpm = None
        self._nvml_sample = None
        self._t0 = time.time()
        self._proc = None
        self._children: dict[int, Any] = {}
        self._setup_psutil()
        if use_gpu:
            self._setup_nvml()
        else:
            self.meta["nvml"] = "not used (no CUDA device in this run)"
            self.meta["gpm"] = "not used (no CUDA device in this run)"
        self.meta["dcgm"] = "not read by trainperf (SM activity comes from NVML GPM where available)"

    # ------------------------------------------------------------------ sources
    def _setup_psutil(self) -> None:
        try:
            import psutil

            self._psutil = psutil
            self._proc = psutil.Process()
            self._proc.cpu_percent(None)  # prime: the next call measures since now
            psutil.cpu_percent(None)
            self.meta["psutil"] = "ok"
        except Exception as exc:  # noqa: BLE001
            self._psutil = None
            self.meta["psutil"] = f"unavailable: {exc}"

    def _setup_nvml(self) -> None:
        try:
            try:
                from trainperf.hardware import nvml as adapter
            except ImportError:
                adapter = None
            if adapter is not None:
                nv = adapter.init()
                self._nvml_sample = adapter.sample
            else:
                import pynvml as nv

                nv.nvmlInit()
            self._nv = nv
            self._handle = nv.nvmlDeviceGetHandleByIndex(_local_gpu_index())
            self.meta["nvml"] = "ok"
        except Exception as exc:  # noqa: BLE001 - NVML is optional
            self.meta["nvml"] = f"unavailable: {exc}"
            self.meta["gpm"] = "unavailable: NVML unavailable"
            return
        try:
            self._gpm = _Gpm(self._nv, self._handle)
            self.meta["gpm"] = "ok"
        except Exception as exc:  # noqa: BLE001
            self.meta["gpm"] = f"unavailable: {type(exc).__name__}: {exc}"

    def _gpu(self) -> dict[str, Any]:
        if self._handle is None:
            return {}
        if self._nvml_sample is not None:
            s = self._nvml_sample(self._handle)
        else:
            s = _pynvml_sample(self._nv, self._handle)
        out = {
            "gpu_kernel_busy_pct": s.get("gpu_util_pct"),
            "gpu_mem_copy_util_pct": s.get("mem_copy_util_pct"),
            "gpu_memory_used_bytes": s.get("memory_used_bytes"),
            "gpu_power_w": s.get("power_w"),
            "gpu_sm_clock_mhz": s.get("sm_clock_mhz"),
        }
        if self._gpm is not None:
            try:
                out.update(self._gpm.read())
            except Exception:  # noqa: BLE001
                pass
        return out

    # ------------------------------------------------------------------ loop
    def sample_once(self) -> dict[str, Any]:
        rec: dict[str, Any] = {"t": round(time.time(), 3), "elapsed_s": round(time.time() - self._t0, 3),
                               "rank": self.rank, "step": self.step_fn()}
        if self._psutil is not None:
            ps = self._psutil
            vm = ps.virtual_memory()
            rec["cpu_pct"] = ps.cpu_percent(None)
            rec["ram_used_bytes"] = vm.total - vm.available
            rec["ram_total_bytes"] = vm.total
            try:
                cpu = self._proc.cpu_percent(None)
                rss = self._proc.memory_info().rss
                for child in self._proc.children(recursive=True):
                    try:
                        rss += child.memory_info().rss
                        cpu += _child_cpu(self, child)
                    except ps.Error:
                        pass
                rec["proc_cpu_pct"] = cpu
                rec["proc_rss_bytes"] = rss
            except ps.Error:
                pass
        try:
            rec.update(self._gpu())
        except Exception as exc:  # noqa: BLE001 - a failing read must not kill training
            rec["gpu_error"] = str(exc)[:200]
        self.samples += 1
        return rec

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            self.write(self.sample_once())

    def start(self) -> "DeviceSampler":
        self.write({"meta": self.meta})
        self._thread = threading.Thread(target=self._run, name="trainperf-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=max(2.0, 2 * self.period_s))
            self._thread = None
        if self._nv is not None:
            try:
                self._nv.nvmlShutdown()
            except Exception:  # noqa: BLE001
                pass
            self._nv = self._handle = None


def _child_cpu(sampler: DeviceSampler, child) -> float:
    """psutil needs the same Process object across calls to measure CPU since the last call."""
    known = sampler._children.get(child.pid)
    if known is None:
        sampler._children[child.pid] = child
        child.cpu_percent(None)
        return 0.0
    return known.cpu_percent(None)


def _pynvml_sample(nv, handle) -> dict[str, Any]:
    def get(fn, *args):
        try:
            return getattr(nv, fn)(handle, *args)
        except Exception:  # noqa: BLE001
            return None

    util = get("nvmlDeviceGetUtilizationRates")
    mem = get("nvmlDeviceGetMemoryInfo")
    power = get("nvmlDeviceGetPowerUsage")
    return {"gpu_util_pct": util.gpu if util else None, "mem_copy_util_pct": util.memory if util else None,
            "memory_used_bytes": mem.used if mem else None,
            "power_w": power / 1000 if isinstance(power, (int, float)) else None,
            "sm_clock_mhz": get("nvmlDeviceGetClockInfo", 1)}
