"""Diagnosis rules that only a profiler trace can judge: fp32 math where tensor cores wait, pageable host
copies, host syncs inside the step, low occupancy, and the straggler by each rank's GPU compute.

Each ``check(s)`` takes one rank's evidence (:mod:`trainperf.monitor.trace_evidence`) and returns a
finding's fields, None (judged: nothing to report), or ``{"unmeasured": reason}`` when this evidence
cannot judge it. ``NOT_FROM_TRACE`` names the rules of the run directory that a trace cannot judge, with
the reason. A finding fires only where its upper-bound gain is worth it (``MIN_GAIN`` of the step); the
smaller ones are what is left, printed as such.
"""

from __future__ import annotations

from trainperf.monitor.gain import step_gain

MIN_GAIN = 0.05  # a trace-only finding fires when its upper bound is at least this share of the step
FP32_WARN, FP32_CRIT = 0.10, 0.30  # fp32 tensor-core-eligible kernel time, share of the step
OCC_LOW_PCT, OCC_MIN_SHARE, OCC_MIN_BUSY = 25.0, 0.30, 50.0
# Dense tensor-core peak over fp32 peak, by compute capability major.minor (NVIDIA datasheets): V100 fp16
# 125 / 15.7 TFLOP/s; T4 fp16 65 / 8.1; A100 bf16 312 / 19.5; H100 SXM bf16 989 / 67. Other parts: the
# catalog (trainperf.hardware.catalog) by name, else no ratio (the bound is then the kernels' whole time).
TC_OVER_FP32 = {"7.0": 8.0, "7.2": 8.0, "7.5": 8.0, "8.0": 16.0, "9.0": 14.8}
NEEDS_TRACE = ("needs a profiler trace: set monitor.profile.start_step (its profile/ traces are then read), or "
               "pass a torch.profiler trace")
NOT_FROM_TRACE = {
    "memory_bound": "a trace has no peak allocated memory against the device's capacity (profile_memory "
                    "events are not summed); `trainperf memory` or a run directory has it",
    "low_mfu": "MFU needs the model's FLOPs per token and the tokens per second; a trace has neither",
    "mem_copy_above_target": "NVML memory-copy utilization is sampled by trainperf's monitor, not in a trace",
    "host_contention": "a trace has CPU wall time per op but not the CPU time the process got",
    "compile_time": "first-step compilation is outside the profiled steps",
    "oom_recovered": "out-of-memory recovery is recorded by trainperf's trainer, not in a trace",
    "xla_recompile": "XLA compilation counts are recorded by trainperf's XLA backend, not in a torch.profiler trace",
}


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def _on(s: dict) -> str:
    return f" on rank {s['rank']}" if s.get("world", 1) > 1 else ""


def _ms(us: float | None) -> str:
    return "n/a" if us is None else f"{us / 1000:.2f} ms"


def _fmt_pct(v) -> str:
    return f"{v:.0f}%" if isinstance(v, (int, float)) else "n/a"


def _cc(s: dict) -> str | None:
    d = s.get("device") or {}
    cc = d.get("compute_capability")
    return None if cc in (None, "") else str(cc)


def _tc_ratio(s: dict) -> tuple[float | None, str]:
    cc = _cc(s)
    name = (s.get("device") or {}).get("name")
    if name:
        from trainperf.hardware.catalog import lookup_gpu

        spec = lookup_gpu(str(name))
        if spec is not None and spec.fp32_tflops:
            return spec.half_tflops / spec.fp32_tflops, f"catalog {spec.key}: {spec.half_tflops:g} {spec.half_dtype} / " \
                                                        f"{spec.fp32_tflops:g} fp32 TFLOP/s dense"
    if cc in TC_OVER_FP32:
        return TC_OVER_FP32[cc], f"compute capability {cc}: tensor-core peak {TC_OVER_FP32[cc]:g}x fp32"
    return None, "no peak ratio known for this device: the bound is the kernels' whole time"


def fp32_on_tensor_cores(s: dict) -> dict | None:
    cc = _cc(s)
    tc = s.get("tensor_cores") or {}
    if cc is None:
        return {"unmeasured": "the trace does not say which GPU ran it (no deviceProperties, no "
                              "architecture in the kernel names)"}
    if float(cc) < 7.0:
        return None  # no tensor cores before Volta
    us = tc.get("fp32_eligible_us_per_step")
    step_us = 1e6 * (s.get("step_time_s") or 0.0)
    if us is None or not step_us:
        return {"unmeasured": "no GEMM/convolution kernels recognised in the trace"}
    f = us / step_us
    ratio, basis = _tc_ratio(s)
    saved = us * (1 - 1 / ratio) if ratio else us
    g = step_gain(step_us / 1e6, saved / 1e6, "these fp32 GEMMs/convolutions ran on tensor cores "
                  f"({basis})")
    if f <= FP32_WARN:
        return None
    names = tc.get("top_fp32") or []
    ev = (f"fp32 GEMM/convolution kernels that tensor cores could run take {_pct(f)} of the step{_on(s)} "
          f"({_ms(us)} per step, threshold {_pct(FP32_WARN)}) on compute capability {cc}; tensor-core kernels "
          f"{(tc.get('kernel_pct') or 0):.0f}% of kernel time")
    if names:
        ev += "; e.g. " + ", ".join(str(n)[:60] for n in names[:3])
    bf16 = float(cc) >= 8.0
    fix = ("torch.autocast('cuda', dtype=torch.bfloat16) around forward and loss" if bf16 else
           "torch.autocast('cuda', dtype=torch.float16) with torch.amp.GradScaler (no bf16 before Ampere)")
    if bf16:
        fix += ("; or keep fp32 and allow TF32: torch.set_float32_matmul_precision('high'), "
                "torch.backends.cudnn.allow_tf32 = True")
    fix += f"; in trainperf: precision.dtype={'bf16' if bf16 else 'fp16'}"
    return {"severity": "critical" if f > FP32_CRIT else "warning", "evidence": ev, "fix": fix, "gain": g,
            "fp32_share": f}


def pageable_copies(s: dict) -> dict | None:
    m = s.get("memcpy") or {}
    us = m.get("pageable_us_per_step")
    if us is None:
        return {"unmeasured": "the trace records no memory copies"}
    step_s = s.get("step_time_s") or 0.0
    g = step_gain(step_s, us / 1e6, "host copies were pinned and asynchronous (overlapped with compute)")
    if not us or not g or g["fraction"] < MIN_GAIN:
        return None
    return {"severity": "warning", "gain": g,
            "evidence": f"copies from pageable host memory take {_ms(us)} per step{_on(s)} "
                        f"({m.get('pageable_count_per_step', 0):.1f} per step; {_pct(g['fraction'])} of the step, "
                        f"threshold {_pct(MIN_GAIN)}): a pageable copy is staged by the driver and blocks the host"}


def host_syncs(s: dict) -> dict | None:
    rows = s.get("host_syncs")
    if rows is None:
        return {"unmeasured": "the trace has no CPU-side runtime events"}
    rows = [r for r in rows if (r.get("count_per_step") or 0) > 0]
    if not rows:
        return None
    blocked = sum(r.get("us_per_step") or 0.0 for r in rows)
    step_s = s.get("step_time_s") or 0.0
    idle = s.get("gpu_idle_frac")
    # the step can gain at most the GPU idle those syncs leave, and no more than the time the host was blocked
    saved_us = min(blocked, (idle or 0.0) * step_s * 1e6) if idle is not None else blocked
    g = step_gain(step_s, saved_us / 1e6, "the host never waited for the GPU inside the step")
    if not g or g["fraction"] < MIN_GAIN:
        return None
    top = sorted(rows, key=lambda r: -(r.get("us_per_step") or 0.0))[:4]
    ev = (f"{sum(r['count_per_step'] for r in rows):.0f} host sync(s) per step{_on(s)} block the CPU "
          f"{_ms(blocked)} per step: " + ", ".join(f"{r['name']} x{r['count_per_step']:.0f} ({_ms(r.get('us_per_step'))})"
                                                  for r in top))
    if idle is not None:
        ev += f"; the GPU is idle {_pct(idle)} of the time"
    return {"severity": "warning", "evidence": ev, "gain": g}


def low_occupancy(s: dict) -> dict | None:
    o = s.get("occupancy") or {}
    occ, share = o.get("pct"), o.get("kernel_share")
    if occ is None:
        return {"unmeasured": "the trace has no 'est. achieved occupancy %' on its kernels (older torch, or "
                              "no CUPTI kernel records)"}
    busy = s.get("gpu_kernel_busy_pct")
    if occ >= OCC_LOW_PCT or (share or 0.0) < OCC_MIN_SHARE or (busy is not None and busy < OCC_MIN_BUSY):
        return None
    ws = o.get("warp_specialized_share") or 0.0
    ev = (f"estimated achieved occupancy {occ:.0f}%{_on(s)} (kernel-time weighted, threshold {OCC_LOW_PCT:.0f}%) "
          f"over {_pct(share)} of kernel time; communication kernels and warp-specialized tensor-core kernels "
          f"(one large block per SM by design{f': {_pct(ws)} of kernel time' if ws else ''}) left out")
    return {"severity": "info", "evidence": ev, "gain": None}


def straggler_by_trace(s: dict) -> dict | None:
    """The straggler from the traces of every rank: by GPU compute per step, never by wall time."""
    tr = s.get("trace_ranks") or {}
    st = tr.get("straggler")
    if tr.get("count", 1) < 2:
        return {"unmeasured": "one rank: the straggler needs the traces of two or more ranks"}
    if not st:
        return {"unmeasured": "no compute time per step on at least two ranks"}
    if not st.get("slower"):
        return None
    r = st["rank"]
    step = s.get("step_time_s")
    waits = st.get("others_wait_us_per_step")
    what = tr.get("compute_definition") or "GPU time in non-communication kernels per step"
    ev = (f"rank {r} computes {_ms(st['compute_us_per_step'])} per step ({what.replace(' per step', '')}) "
          f"against {_ms(st['median_others_us'])} for the median of the other ranks: {st['ratio']:.2f}x "
          f"(threshold {st['threshold_ratio']}x)")
    if waits is not None:
        what_waits = "collectives" if tr.get("compute_definition", "").startswith("step time") else "NCCL kernels"
        ev += (f"; the other ranks wait {_ms(waits)} per step inside their collectives (median), rank {r} "
               f"{_ms(st.get('its_wait_us_per_step'))}: their {what_waits} are long because they wait for it")
    g = step_gain(step, st["excess_us_per_step"] / 1e6, f"rank {r} computed as fast as the median rank")
    return {"severity": "critical" if st["ratio"] > 1.5 else "warning", "rank": r, "ratio": st["ratio"],
            "clock": "trace", "evidence": ev, "gain": g,
            "fix": f"look at rank {r}'s device (clocks, temperature, ECC / throttling: nvidia-smi -q -d "
                   "PERFORMANCE), its data shard and its host load; balance the work (trainperf: "
                   "parallelism.balance.enabled=true moves micro-batches off a slow rank)"}


def data_bound_trace(s: dict, f: float, mean_s: float, sev: str, g: dict | None, warn: float) -> dict:
    """data_bound's finding in a trace's terms (the rule is diagnose._data_bound; ``warn`` its threshold)."""
    dl = s.get("data_loader") or {}
    iters = dl.get("iterators") or []
    single = bool(dl.get("single_process"))
    ev = (f"DataLoader {_pct(f)} of step time{_on(s)} ({1000 * mean_s:.1f} ms per step over {s.get('steps_used')} "
          f"step(s), threshold {_pct(warn)})")
    if iters:
        ev += f"; iterator {', '.join(iters)}"
    if single:
        ev += ": num_workers=0, batches are loaded in the training process"
        cause = ("the DataLoader runs in the training process (num_workers=0): loading, decoding and collating "
                 "sit on the step's critical path while the GPU idles")
        fix = ("DataLoader(num_workers=N, pin_memory=True, persistent_workers=True, prefetch_factor=2): N up to "
               "the CPU cores per GPU (`trainperf doctor` on that machine counts the cores the job may use); "
               "or trainperf's HybridLoader (disk cache, worker processes, device prefetch ring)")
    else:
        cause = "the DataLoader's workers do not keep up: too few workers, slow storage or heavy per-sample decoding"
        fix = ("raise DataLoader num_workers and prefetch_factor, pin_memory=True; cache or pre-decode the data "
               "(trainperf's HybridLoader: disk cache + prefetch ring; `trainperf data prepare`)")
    return {"severity": sev, "evidence": ev, "cause": cause, "fix": fix, "gain": g,
            "kind": "single_process" if single else "workers"}



def comm_bound_trace(s: dict, f: float, sec: float, where: str, sev: str, g: dict | None, warn: float) -> dict:
    """comm_bound's finding in a trace's terms (the rule is diagnose._comm_bound)."""
    c = s.get("comm") or {}
    ev = (f"exposed communication {_pct(f)} of step time{where} ({1000 * sec:.1f} ms per step not overlapped "
          f"with compute, threshold {_pct(warn)}); comm/compute overlap "
          f"{_fmt_pct(c.get('overlap_pct'))}")
    if c.get("wait_s"):
        ev += (f"; a further {1000 * c['wait_s']:.1f} ms per step is waiting for the slowest rank (see "
               "straggler), not counted here")
    if c.get("kinds"):
        ev += "; by kind: " + ", ".join(f"{k} {v / 1000:.1f} ms" for k, v in c["kinds"].items())
    return {"severity": sev, "evidence": ev, "gain": g,
            "cause": "collectives run while the GPU has no compute to overlap them with: launched late, "
                     "serialized behind compute, or too little compute per byte",
            "fix": "DDP: bucket_cap_mb (smaller buckets start earlier), gradient_as_bucket_view=True, "
                   "static_graph=True; FSDP: forward_prefetch=True, backward_prefetch=BACKWARD_PRE, "
                   "limit_all_gathers; compress gradients (DDP comm hook bf16_compress_hook / PowerSGD); "
                   "more accumulation per all-reduce (no_sync); MoE: overlap all-to-all with expert compute"}


TRACE_RULES = [
    dict(id="fp32_on_tensor_cores", symptom="fp32 math on a GPU with tensor cores",
         condition=f"trace: fp32 GEMM/convolution kernels a tensor core could run > {_pct(FP32_WARN)} of the "
                   f"step (critical > {_pct(FP32_CRIT)}), compute capability >= 7.0",
         cause="the model runs in fp32 without TF32: tensor cores sit idle while CUDA cores do the matrix math",
         fix="torch.autocast bf16 (fp16 + GradScaler before Ampere) or TF32; precision.dtype=bf16",
         check=fp32_on_tensor_cores, not_from={"run": NEEDS_TRACE}),
    dict(id="pageable_copies", symptom="host-to-device copies from pageable memory",
         condition=f"trace: pageable memcpy time per step >= {_pct(MIN_GAIN)} of the step",
         cause="tensors copied from pageable memory: the driver stages them and the host blocks; no overlap",
         fix="DataLoader(pin_memory=True) and .to(device, non_blocking=True); pinned buffers (HybridLoader)",
         check=pageable_copies, not_from={"run": NEEDS_TRACE}),
    dict(id="host_syncs", symptom="the host waits for the GPU inside the step",
         condition=f"trace: cudaDeviceSynchronize / cudaStreamSynchronize / aten::item / _local_scalar_dense in "
                   f"the step, the GPU idle they can cost >= {_pct(MIN_GAIN)} of the step",
         cause="a value is brought to the host every step (loss.item(), .cpu(), printing a tensor, nonzero(), "
               "an explicit synchronize): the launch queue drains and the GPU idles until the host catches up",
         fix="keep per-step values on the device and bring them to the host every N steps; no synchronize "
             "outside timing; find them with torch.cuda.set_sync_debug_mode('warn')",
         check=host_syncs, not_from={"run": NEEDS_TRACE}),
    dict(id="low_occupancy", symptom="kernels keep few warps resident on each SM",
         condition=f"trace: estimated achieved occupancy < {OCC_LOW_PCT:.0f}% (kernel-time weighted) over >= "
                   f"{_pct(OCC_MIN_SHARE)} of kernel time while the GPU is >= {OCC_MIN_BUSY:.0f}% busy; "
                   "warp-specialized and persistent tensor-core kernels (wgmma, sm90/sm100 CUTLASS, FlashAttention 3, "
                   "any tensor-core kernel at no more than one block per SM), communication kernels and kernels "
                   "Kineto could not estimate (occupancy 0) are left out (one large block per SM is their design)",
         cause="small grids or heavy per-thread resources (registers, shared memory): latency is not hidden",
         fix="larger batches/sequences per kernel; fuse small ops (torch.compile); scaled_dot_product_attention "
             "for attention; in a custom kernel, fewer registers or shared memory per block",
         check=low_occupancy, not_from={"run": NEEDS_TRACE}),
]

__all__ = ["MIN_GAIN", "NOT_FROM_TRACE", "TRACE_RULES", "comm_bound_trace", "data_bound_trace", "straggler_by_trace"]
