"""The figures Holistic Trace Analysis (HTA 0.5.0) computes for one rank, by its definitions (read from its
``analyzers/breakdown_analysis.py``, ``communication_analysis.py``, ``cuda_kernel_analysis.py`` and
``common/trace.py``), on interval arrays, and one step beyond it: what is communication comes from the
pattern table, not from ``^nccl.*Kernel`` alone.

* **The window** (HTA's ``include_last_profiler_step=False``): when the trace has two or more profiler
  steps, the GPU events (kernels, copies, fills) launched by a call that starts before the last step
  starts; otherwise every GPU event.
* **Temporal breakdown**: over [first GPU event start, last GPU event end] of the window: *idle* = no GPU
  event on any stream, *compute* = covered by a compute kernel, *non_compute* = the rest (communication,
  copies, fills with no compute kernel running). As in HTA, CUPTI synchronization records that name a stream
  (``cuda_sync``: ``Stream Sync``, ``Stream Wait Event``) count as GPU time, non-compute (HTA's name rule
  would call ``Stream Wait Event`` compute; it is no kernel).
* **Idle breakdown**, per stream: each gap between consecutive GPU events of a stream is *host_wait* if
  the next event's launch call started after the previous event ended (the CPU was late), else
  *kernel_wait* if shorter than 30 us (back-to-back launch overhead), else *other*. Summed over streams,
  in % of the idle time so summed (HTA gives per stream; ``by_stream`` has those).
* **Comm/compute overlap**: the time communication kernels run while a compute kernel runs, over the
  communication kernels' time (union across streams).
* **Kernel-type time** (``get_gpu_kernel_breakdown``): compute only, communication only, and both at once.
* **Launch statistics** (``get_cuda_kernel_launch_stats``): each launch call paired with its GPU event by
  correlation id: CPU duration, GPU duration, launch delay = GPU start - call end (>= 0). Launch calls:
  ``cudaLaunchKernel[ExC]``, ``cudaMemcpyAsync``, ``cudaMemsetAsync`` as HTA, and the driver's
  ``cuLaunchKernel[Ex]``, cooperative launches and HIP's, which HTA misses.

HTA rounds float (nanosecond-decimal) times to whole microseconds (start up, end down) when it loads a
trace; these figures keep the times as recorded (HTA's own ``HTA_DISABLE_NS_ROUNDING=1`` does the same).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from trainperf.trace.columns import percentiles, unique

from trainperf.trace import intervals as iv
from trainperf.trace.timeline import Timeline

KERNEL_WAIT_US = 30.0  # HTA's consecutive_kernel_delay
LAUNCH_CALLS = {"cudaLaunchKernel", "cudaLaunchKernelExC", "cudaMemcpyAsync", "cudaMemsetAsync",
                "cuLaunchKernel", "cuLaunchKernelEx", "cudaLaunchCooperativeKernel", "cuLaunchCooperativeKernel",
                "hipLaunchKernel", "hipExtLaunchKernel", "hipModuleLaunchKernel", "hipExtModuleLaunchKernel",
                "hipMemcpyAsync", "hipMemsetAsync", "hipMemsetD32Async", "hipMemsetD8Async",
                "runFunction - job_prep_and_submit_for_execution"}


def window(tl: Timeline, launch: np.ndarray) -> tuple[np.ndarray, dict]:
    """Mask of the GPU events HTA analyses, and how it was chosen."""
    nums = {n for _, _, n in tl.steps}
    n = tl.g_ts.size
    if len(nums) < 2 or n == 0:
        why = "no ProfilerStep#N" if not nums else "one profiler step"
        return np.ones(n, dtype=bool), {"cutoff_us": None, "rule": f"every GPU event ({why})"}
    cutoff = max(ts for ts, _, _ in tl.steps)
    has = launch >= 0
    m = np.zeros(n, dtype=bool)
    m[has] = tl.r_ts[launch[has]] < cutoff
    return m, {"cutoff_us": float(cutoff), "rule": "GPU events launched before the last profiler step starts "
                                                     "(HTA's include_last_profiler_step=False)"}


def temporal(ts, end, compute, sync_ts=None, sync_end=None) -> dict[str, Any] | None:
    if ts.size == 0:
        return None
    if sync_ts is not None and sync_ts.size:  # HTA counts CUPTI sync records on a stream as GPU time
        ts = np.concatenate([ts, sync_ts])
        end = np.concatenate([end, sync_end])
        compute = np.concatenate([compute, np.zeros(sync_ts.size, dtype=bool)])
    allu = iv.union(ts, end)
    span = float(allu[1][-1] - allu[0][0]) if allu[0].size else 0.0
    if span <= 0:
        return None
    busy = iv.total(allu)
    comp = iv.total(iv.union(ts[compute], end[compute]))
    idle = span - busy
    non = span - comp - idle
    return {"window_us": span, "idle_us": idle, "compute_us": comp, "non_compute_us": max(non, 0.0),
            "pct": {"compute": 100 * comp / span, "non_compute": 100 * max(non, 0.0) / span, "idle": 100 * idle / span}}


def idle_breakdown(ts, end, stream, launch_ts) -> dict[str, Any] | None:
    if ts.size < 2:
        return None
    o = np.lexsort((ts, stream))
    ts, end, stream, lts = ts[o], end[o], stream[o], launch_ts[o]
    same = stream[1:] == stream[:-1]
    gap = ts[1:] - end[:-1]
    prev_end = end[:-1]
    host = same & (lts[1:] > prev_end)  # NaN launch time (no call found) compares False, as HTA
    kern = same & ~host & (gap < KERNEL_WAIT_US)
    other = same & ~host & ~kern
    gap = np.maximum(gap, 0.0)
    by: dict[str, dict[str, float]] = {}
    s_next = stream[1:]
    for name, mask in (("host_wait", host), ("kernel_wait", kern), ("other", other)):
        for s in unique(s_next[mask]):
            by.setdefault(str(int(s)), {"host_wait": 0.0, "kernel_wait": 0.0, "other": 0.0})[name] = \
                float(np.sum(gap[mask & (s_next == s)]))
    us = {k: float(np.sum(gap[m])) for k, m in (("host_wait", host), ("kernel_wait", kern), ("other", other))}
    tot = sum(us.values())
    return {"us": us, "pct": {k: (100 * v / tot if tot > 0 else None) for k, v in us.items()}, "by_stream": by,
            "kernel_wait_threshold_us": KERNEL_WAIT_US}


def overlap(ts, end, comm, compute) -> dict[str, Any]:
    cu = iv.union(ts[comm], end[comm])
    c_us = iv.total(cu)
    if c_us <= 0:
        return {"pct": None, "comm_us": 0.0, "overlap_us": 0.0}
    ov = iv.total(iv.intersect(cu, iv.union(ts[compute], end[compute])))
    return {"pct": 100 * ov / c_us, "comm_us": c_us, "overlap_us": ov}


TYPE_KEYS = ("compute", "communication", "memory")  # HTA's COMPUTATION, COMMUNICATION, MEMORY


def kernel_types(ts, end, comm, compute, memory) -> dict[str, Any]:
    """HTA's kernel-type table (``get_gpu_kernel_breakdown``, memory kernels included as TraceAnalysis's
    default): the union of each type's GPU events, and the time in each combination of types at once
    (``compute``, ``compute_overlapping_communication``, ``compute_overlapping_communication_overlapping_memory``
    ...), in % of the time any runs. One sweep over the three unions' boundaries, as HTA does."""
    sets = [iv.union(ts[m], end[m]) for m in (compute, comm, memory)]
    t = np.concatenate([np.concatenate([a[0], a[1]]) for a in sets])
    d = np.concatenate([np.concatenate([np.full(a[0].size, 1 << i, dtype=np.int8),
                                        np.full(a[1].size, -(1 << i), dtype=np.int8)])
                        for i, a in enumerate(sets)])  # one byte per boundary
    us: dict[str, float] = {}
    if t.size:
        o = np.lexsort((d, t))  # at one instant, ends (negative) before starts: touching pieces do not overlap
        t, d = t[o], d[o]
        del o
        run = np.cumsum(d, dtype=np.int16)[:-1]  # the state: a bit per type, 0..7
        del d
        dur = np.diff(t)
        del t
        for state in unique(run[run > 0]):
            name = "_overlapping_".join(k for i, k in enumerate(TYPE_KEYS) if int(state) & (1 << i))
            v = float(np.sum(dur[run == state]))
            if v > 1e-3:  # below a nanosecond: float noise where two edges nearly meet
                us[name] = v
    tot = sum(us.values())
    return {"us": us, "pct": {k: (100 * v / tot if tot > 0 else None) for k, v in us.items()},
            "memory_us": iv.total(sets[2])}


def hta_type_name(key: str) -> str:
    """Our kernel-type key -> HTA's row name (``compute_overlapping_memory`` -> ``COMPUTATION overlapping MEMORY``)."""
    up = {"compute": "COMPUTATION", "communication": "COMMUNICATION", "memory": "MEMORY"}
    return " overlapping ".join(up[k] for k in key.split("_overlapping_"))


def launch_stats(tl: Timeline, mask: np.ndarray, launch: np.ndarray) -> dict[str, Any] | None:
    names = tl.names
    call_ok = np.array([names[i] in LAUNCH_CALLS for i in range(len(names))], dtype=bool)
    has = mask & (launch >= 0)
    idx = np.flatnonzero(has)
    if idx.size == 0:
        return None
    r = launch[idx]
    keep = call_ok[tl.r_name[r]] if call_ok.size else np.zeros(r.size, dtype=bool)
    idx, r = idx[keep], r[keep]
    if idx.size == 0:
        return None
    cpu = tl.r_dur[r]
    gpu = tl.g_dur[idx]
    delay = np.maximum(tl.g_ts[idx] - (tl.r_ts[r] + cpu), 0.0)
    short = gpu < cpu

    def q(a, p):
        return float(percentiles(a, [p])[0])

    return {"kernels": int(idx.size), "cpu_launch_us_median": q(cpu, 50), "cpu_launch_us_p90": q(cpu, 90),
            "gpu_us_median": q(gpu, 50), "gpu_us_p90": q(gpu, 90), "launch_delay_us_median": q(delay, 50),
            "launch_delay_us_p90": q(delay, 90), "short_kernel_pct": 100 * float(short.mean()),
            "short_kernels": int(short.sum()), "cpu_launch_us_total": float(cpu.sum()),
            "gpu_us_total": float(gpu.sum()), "launch_delay_us_total": float(delay.sum()),
            "driver_launches": int(tl.r_driver[r].sum()),
            "definition": "each launch call (cudaLaunchKernel[ExC], cuLaunchKernel[Ex], cudaMemcpyAsync, "
                          "cudaMemsetAsync, hip*) paired with its GPU event by correlation id; short = GPU "
                          "duration < the call's CPU duration; delay = GPU start - call end, >= 0 (as HTA)"}


def figures(tl: Timeline, launch: np.ndarray, kind: np.ndarray) -> dict[str, Any]:
    """Every HTA-defined figure; ``kind`` per GPU event: 0 compute, 1 communication, 2 memory."""
    mask, how = window(tl, launch)
    s = tl.g_stream
    ok = mask & (s >= 0)  # HTA's GPU events: those with a stream
    ts, end = tl.g_ts[ok], (tl.g_ts + tl.g_dur)[ok]
    k = kind[ok]
    compute, comm, memory = k == 0, k == 1, k == 2
    sm = tl.s_ts < how["cutoff_us"] if how["cutoff_us"] is not None else np.ones(tl.s_ts.size, dtype=bool)
    lts = np.full(tl.g_ts.size, np.nan)
    has = launch >= 0
    lts[has] = tl.r_ts[launch[has]]
    return {"window": how | {"gpu_events": int(ok.sum())},
            "temporal": temporal(ts, end, compute, tl.s_ts[sm], (tl.s_ts + tl.s_dur)[sm]),
            "idle": idle_breakdown(ts, end, s[ok], lts[ok]),
            "overlap": overlap(ts, end, comm, compute),
            "kernel_types": kernel_types(ts, end, comm, compute, memory),
            "launch": launch_stats(tl, mask, launch),
            "mask": ok}


__all__ = ["KERNEL_WAIT_US", "LAUNCH_CALLS", "TYPE_KEYS", "figures", "hta_type_name", "idle_breakdown",
           "kernel_types", "launch_stats",
           "overlap", "temporal", "window"]
