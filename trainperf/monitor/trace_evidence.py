"""Evidence from profiler traces, in the shape the diagnosis rules read (the same keys as a run's).

:func:`trainperf.trace.ranks.read_traces` analyses each trace file of a PATH (streamed, torch-free), gives each
its rank and computes the figures across ranks.
:func:`evidence` turns one rank's figures into the evidence dict of :mod:`trainperf.monitor.diagnose`:

* ``phase_fractions`` / ``phase_mean_s``: ``data`` = the DataLoader share of the step (the TensorBoard
  plugin's ``dataloader``), ``comm`` = communication kernel time per step not overlapped by compute, less
  the time that rank waited for a slower one (the straggler rule speaks for that);
* ``gpu_kernel_busy_pct`` = the trace's GPU utilization, ``gpu_sm_active_pct`` = its estimated SM
  efficiency (each labelled as such in the findings), ``gpu_idle_frac`` and ``idle_host_wait_frac`` from
  the temporal and idle breakdowns;
* what only a trace has: device, tensor cores, memcpy, host syncs, occupancy, launch statistics, and
  ``trace_ranks`` (the figures across ranks, for the straggler).
"""

from __future__ import annotations

from typing import Any

from trainperf.trace.ranks import read_traces  # noqa: F401  (moved to trainperf.trace.ranks)


def _f(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def public(res: dict) -> dict:
    """A trace's figures as printed: without the keys kept for cross-rank matching (``_...``)."""
    return {k: v for k, v in res.items() if not str(k).startswith("_")}


def _device(res: dict) -> dict | None:
    d = res.get("device_info") or res.get("device")
    if isinstance(d, dict):
        return d
    if isinstance(d, str) and d:
        return {"name": d, "compute_capability": res.get("compute_capability")}
    return None


def evidence(res: dict, across: dict) -> dict[str, Any]:
    """One rank's evidence for the rules (see the module docstring)."""
    step_us = _f(res.get("step_time_us")) or 0.0
    step_s = step_us / 1e6
    bd = res.get("step_breakdown_pct") or {}
    dl_frac = (_f(bd.get("dataloader")) or 0.0) / 100
    comm = res.get("comm") or {}
    per = {p["rank"]: p for p in across.get("per_rank", [])}
    mine = per.get(res.get("rank"), {})
    exposed_us = _f(comm.get("exposed_us_per_step"))
    if exposed_us is None:
        exposed_us = _f(mine.get("exposed_comm_us_per_step"))
    wait_us = _f(mine.get("comm_wait_us_per_step")) or 0.0
    own_us = max(0.0, (exposed_us or 0.0) - wait_us)
    temporal, idle = res.get("temporal_pct") or {}, res.get("idle_pct") or {}
    idle_frac = _f(temporal.get("idle"))
    idle_frac = idle_frac / 100 if idle_frac is not None else None
    hw = _f(idle.get("host_wait"))
    dl = res.get("dataloader") or {}
    iters = dl.get("iterators") or []
    return {
        "source": "trace", "cpu_only": bool(res.get("cpu_only")), "rank": res.get("rank", 0), "world": across.get("count", 1), "path": res.get("path"),
        "steps_used": res.get("steps"), "step_time_s": step_s,
        "phase_fractions": {"data": dl_frac, "comm": own_us / step_us if step_us else 0.0},
        "phase_mean_s": {"data": dl_frac * step_s, "comm": own_us / 1e6},
        "phase_cpu_ratio": {}, "ranks": {}, "rank_compute": None,
        "other_frac": (_f(bd.get("other")) or 0.0) / 100,
        "gpu_kernel_busy_pct": _f(res.get("gpu_utilization_pct")),
        "gpu_kernel_busy_pct_label": "GPU utilization (trace: kernel time over step time, as the TensorBoard plugin)",
        "busy_label": "GPU utilization (trace)",
        "gpu_sm_active_pct": _f(res.get("sm_efficiency_pct")),
        "gpu_sm_active_pct_label": "estimated SM efficiency (trace, as the TensorBoard plugin)",
        "gpu_idle_frac": idle_frac,
        "idle_host_wait_frac": idle_frac * hw / 100 if (idle_frac is not None and hw is not None) else None,
        "device": _device(res),
        "data_loader": {"iterators": iters,
                        "single_process": dl.get("single_process",
                                                 any("SingleProcess" in str(i) for i in iters))},
        "tensor_cores": {"kernel_pct": _f(res.get("tensor_core_kernel_pct")), **(res.get("tensor_cores") or {})},
        "memcpy": res.get("memcpy") if res.get("memcpy") else None,
        "host_syncs": res.get("host_syncs"),
        "occupancy": res.get("occupancy") or {},
        "launch": res.get("launch") or {},
        "comm": {"overlap_pct": _f(res.get("comm_compute_overlap_pct")), "kinds": comm.get("us_per_kind") or {},
                 "wait_s": wait_us / 1e6},
        "trace_ranks": across,
    }


def headroom(ev: dict) -> list[tuple[str, float]]:
    """What is left, as shares of the step, whether or not a rule fired: the small remainders a tuned
    job still has (printed after the findings)."""
    step_us = 1e6 * (ev.get("step_time_s") or 0.0)
    out = [("DataLoader", ev["phase_fractions"].get("data", 0.0)),
           ("exposed communication", ev["phase_fractions"].get("comm", 0.0))]
    if ev.get("idle_host_wait_frac") is not None:
        out.append(("GPU idle waiting for the host", ev["idle_host_wait_frac"]))
    if ev.get("other_frac"):  # the plugin's Other: Python outside torch ops, sleeps, waits on locks or I/O
        out.append(("time in no torch op (Python, sleeps, I/O waits)", ev["other_frac"]))
    m = ev.get("memcpy") or {}
    if step_us and _f(m.get("pageable_us_per_step")) is not None:
        out.append(("pageable copies", m["pageable_us_per_step"] / step_us))
    tc = ev.get("tensor_cores") or {}
    if step_us and _f(tc.get("fp32_eligible_us_per_step")) is not None:
        out.append(("fp32 GEMM/conv off tensor cores", tc["fp32_eligible_us_per_step"] / step_us))
    if step_us and ev.get("host_syncs"):
        # what the syncs can cost the step: the host's blocked time, but no more than the GPU idle (a sync
        # while the GPU is busy costs nothing: DeepSeek's H800 trace blocks 13% of its step on one, at 99% busy)
        blocked = sum(r.get("us_per_step") or 0.0 for r in ev["host_syncs"])
        idle = _f(ev.get("gpu_idle_frac"))
        out.append(("host syncs (up to the GPU idle)", min(blocked, idle * step_us) / step_us if idle is not None
                    else blocked / step_us))
    return out


__all__ = ["evidence", "headroom", "public", "read_traces"]
