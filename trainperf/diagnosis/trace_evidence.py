"""One rank of profiler traces as evidence (Kineto traces and Nsight Systems captures alike).

The trace reader (:func:`trainperf.trace.job.read_traces`: streamed, torch-free) gives each rank's figures
and the figures across ranks; :func:`evidence` turns one rank's into the
:class:`~trainperf.diagnosis.evidence.Evidence` the rules read:

* ``data``: the DataLoader's share of the step (the TensorBoard plugin's ``dataloader``) and the iterators
  the trace names; ``comm``: communication kernel time per step not overlapped by compute, less the time
  that rank waited for a slower one (the straggler rule speaks for that);
* ``gpu``: the trace's GPU utilization as the busy figure, its estimated SM efficiency (each labelled as
  such in the findings), the idle share and HTA's host_wait share;
* what only a trace has: device, tensor cores, memcpy, host syncs, occupancy, launch statistics, and
  ``trace_ranks`` (the figures across ranks, for the straggler).

What a trace cannot hold is recorded as missing (:data:`CANNOT_MEASURE`), and on a trace without GPU events
every device figure is ("a CPU-only trace").
"""

from __future__ import annotations

from trainperf.diagnosis.evidence import CommWait, DataWait, Evidence, GpuUse

CANNOT_MEASURE = {
    "loss": "a profiler trace holds no loss values",
    "mem_peak_bytes": "a trace has no peak allocated memory against the device's capacity (profile_memory "
                      "events are not summed); `trainperf memory` or a run directory has it",
    "mfu": "MFU needs the model's FLOPs per token and the tokens per second; a trace has neither",
    "gpu.mem_copy_util_pct": "NVML memory-copy utilization is sampled by trainperf's monitor, not in a trace",
    "cpu_cores_got": "a trace has CPU wall time per op but not the CPU time the process got",
    "compile_s": "first-step compilation is outside the profiled steps",
    "oom_events": "out-of-memory recovery is recorded by trainperf's trainer, not in a trace",
    "xla_steps": "XLA compilation counts are recorded by trainperf's XLA backend, not in a torch.profiler trace",
}
"""Evidence fields no profiler trace holds, with the reason."""
GPU_FIELDS = ("tensor_cores", "memcpy", "host_syncs", "occupancy", "gpu.busy_pct", "gpu.sm_active_pct",
              "gpu.mem_copy_util_pct", "attribution")
CPU_ONLY = "a CPU-only trace (no GPU events): the rule is about GPU work"


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


def evidence(res: dict, across: dict) -> Evidence:
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
    comm_frac = own_us / step_us if step_us else 0.0
    ev = Evidence(
        rank=res.get("rank", 0), world=across.get("count", 1), window="over the profiled steps",
        steps_used=res.get("steps"), fixes="code", device=_device(res), path=res.get("path"),
        step_time_s=step_s, step_s=step_s,
        phase_fractions={"data": dl_frac, "comm": comm_frac}, phase_mean_s={"data": dl_frac * step_s,
                                                                            "comm": own_us / 1e6},
        other_frac=(_f(bd.get("other")) or 0.0) / 100,
        memcpy_frac=(_f(bd.get("memcpy")) or 0.0) / 100 if not res.get("cpu_only") else None,
        data=DataWait(fraction=dl_frac, mean_s=dl_frac * step_s, label="DataLoader", waits="DataLoader waits", iterators=list(iters),
                      single_process=dl.get("single_process", any("SingleProcess" in str(i) for i in iters))),
        comm=CommWait(fraction=comm_frac, mean_s=own_us / 1e6, overlap_pct=_f(res.get("comm_compute_overlap_pct")),
                      kinds_us=comm.get("us_per_kind") or {}, wait_s=wait_us / 1e6,
                      includes_absent=bool(across.get("partial"))),
        gpu=GpuUse(busy_pct=_f(res.get("gpu_utilization_pct")),
                   busy_label="GPU utilization (trace: kernel time over step time, as the TensorBoard plugin)",
                   launch_label="GPU utilization (trace)", sm_active_pct=_f(res.get("sm_efficiency_pct")),
                   sm_label="estimated SM efficiency (trace, as the TensorBoard plugin)", idle_frac=idle_frac,
                   host_wait_frac=idle_frac * hw / 100 if (idle_frac is not None and hw is not None) else None),
        trace_ranks=across, attribution=res.get("attribution"),
        tensor_cores={"kernel_pct": _f(res.get("tensor_core_kernel_pct")), **(res.get("tensor_cores") or {})},
        memcpy=res.get("memcpy") if res.get("memcpy") else None, host_syncs=res.get("host_syncs"),
        occupancy=res.get("occupancy") or {}, launch=res.get("launch") or {})
    gm = res.get("gpu_metrics") or {}
    if _f(gm.get("sm_active_pct")) is not None:  # measured on the device (nsys GPU_METRICS), not estimated
        src = gm.get("source") or "measured (nsys GPU_METRICS)"
        ev.gpu.sm_active_pct, ev.gpu.sm_label = _f(gm["sm_active_pct"]), f"SM active ({src})"
        ev.gpu.tensor_active_pct = _f(gm.get("tensor_active_pct"))
        ev.gpu.measured = src
        if _f(gm.get("dram_bw_pct")) is not None:  # DRAM bandwidth: how busy device memory is, as NVML's util
            ev.gpu.mem_copy_util_pct = _f(gm["dram_bw_pct"])
            ev.gpu.mem_copy_label = f"DRAM bandwidth ({src}), read as memory-copy utilization"
    for name, reason in CANNOT_MEASURE.items():
        if not (name == "gpu.mem_copy_util_pct" and ev.gpu.mem_copy_util_pct is not None):
            ev.lacks(name, reason)
    if res.get("cpu_only"):
        for name in GPU_FIELDS:
            ev.lacks(name, CPU_ONLY)
    return ev


def headroom(ev: Evidence) -> list[tuple[str, float]]:
    """What is left, as shares of the step, whether or not a rule fired: the small remainders a tuned
    job still has (printed after the findings)."""
    step_us = 1e6 * (ev.step_time_s or 0.0)
    out = [("DataLoader", ev.data.fraction), ("exposed communication", ev.comm.fraction)]
    if ev.gpu.host_wait_frac is not None:
        out.append(("GPU idle waiting for the host", ev.gpu.host_wait_frac))
    if ev.other_frac:  # the plugin's Other: Python outside torch ops, sleeps, waits on locks or I/O
        out.append(("time in no torch op (Python, sleeps, I/O waits)", ev.other_frac))
    m = ev.memcpy or {}
    if step_us and _f(m.get("pageable_us_per_step")) is not None:
        out.append(("pageable copies", m["pageable_us_per_step"] / step_us))
    tc = ev.tensor_cores or {}
    if step_us and _f(tc.get("fp32_eligible_us_per_step")) is not None:
        out.append(("fp32 GEMM/conv off tensor cores", tc["fp32_eligible_us_per_step"] / step_us))
    if step_us and ev.host_syncs:
        # what the syncs can cost the step: the host's blocked time, but no more than the GPU idle (a sync
        # while the GPU is busy costs nothing: DeepSeek's H800 trace blocks 13% of its step on one, at 99% busy)
        blocked = sum(r.get("us_per_step") or 0.0 for r in ev.host_syncs)
        idle = _f(ev.gpu.idle_frac)
        out.append(("host syncs (up to the GPU idle)", min(blocked, idle * step_us) / step_us if idle is not None
                    else blocked / step_us))
    return out


__all__ = ["CANNOT_MEASURE", "evidence", "headroom", "public"]
