"""The checks of the rules only a profiler trace (or an Nsight capture) can judge: fp32 math where tensor cores
wait, pageable host copies, host syncs inside the step, low occupancy, and the straggler by each rank's GPU
compute.

Each check takes one rank's :class:`~trainperf.diagnosis.evidence.Evidence` and returns a finding's fields,
None (judged: nothing to report), or ``{"unmeasured": reason}`` when these figures cannot judge it. A finding
fires only where its upper-bound gain is worth it (``MIN_GAIN`` of the step); the smaller ones are what is
left, printed as such.
"""

from __future__ import annotations

from trainperf.diagnosis.evidence import Evidence
from trainperf.diagnosis.gain import step_gain

MIN_GAIN = 0.05  # a trace-only finding fires when its upper bound is at least this share of the step
FP32_WARN, FP32_CRIT = 0.10, 0.30  # fp32 tensor-core-eligible kernel time, share of the step
OCC_LOW_PCT, OCC_MIN_SHARE, OCC_MIN_BUSY = 25.0, 0.30, 50.0
# Dense tensor-core peak over fp32 peak, by compute capability major.minor (NVIDIA datasheets): V100 fp16
# 125 / 15.7 TFLOP/s; T4 fp16 65 / 8.1; A100 bf16 312 / 19.5; H100 SXM bf16 989 / 67. Other parts: the
# catalog (trainperf.hardware.catalog) by name, else no ratio (the bound is then the kernels' whole time).
TC_OVER_FP32 = {"7.0": 8.0, "7.2": 8.0, "7.5": 8.0, "8.0": 16.0, "9.0": 14.8}
def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def _ms(us: float | None) -> str:
    return "n/a" if us is None else f"{us / 1000:.2f} ms"


def _fmt_pct(v) -> str:
    return f"{v:.0f}%" if isinstance(v, (int, float)) else "n/a"


def _cc(ev: Evidence) -> str | None:
    d = ev.device or {}
    cc = d.get("compute_capability")
    return None if cc in (None, "") else str(cc)


def _tc_ratio(ev: Evidence) -> tuple[float | None, str]:
    cc = _cc(ev)
    name = (ev.device or {}).get("name")
    if name:
        from trainperf.hardware.catalog import lookup_gpu

        spec = lookup_gpu(str(name))
        if spec is not None and spec.fp32_tflops:
            return spec.half_tflops / spec.fp32_tflops, f"catalog {spec.key}: {spec.half_tflops:g} {spec.half_dtype} / " \
                                                        f"{spec.fp32_tflops:g} fp32 TFLOP/s dense"
    if cc in TC_OVER_FP32:
        return TC_OVER_FP32[cc], f"compute capability {cc}: tensor-core peak {TC_OVER_FP32[cc]:g}x fp32"
    return None, "no peak ratio known for this device: the bound is the kernels' whole time"


def fp32_on_tensor_cores(ev: Evidence) -> dict | None:
    cc = _cc(ev)
    tc = ev.tensor_cores or {}
    if cc is None:
        return {"unmeasured": "the trace does not say which GPU ran it (no deviceProperties, no "
                              "architecture in the kernel names)"}
    if float(cc) < 7.0:
        return None  # no tensor cores before Volta
    us = tc.get("fp32_eligible_us_per_step")
    step_us = 1e6 * (ev.step_s or 0.0)
    if us is None or not step_us:
        return {"unmeasured": "no GEMM/convolution kernels recognised in the trace"}
    f = us / step_us
    ratio, basis = _tc_ratio(ev)
    saved = us * (1 - 1 / ratio) if ratio else us
    g = step_gain(step_us / 1e6, saved / 1e6, "these fp32 GEMMs/convolutions ran on tensor cores "
                  f"({basis})")
    if f <= FP32_WARN:
        return None
    names = tc.get("top_fp32") or []
    text = (f"fp32 GEMM/convolution kernels that tensor cores could run take {_pct(f)} of the step{ev.where()} "
          f"({_ms(us)} per step, threshold {_pct(FP32_WARN)}) on compute capability {cc}; tensor-core kernels "
          f"{(tc.get('kernel_pct') or 0):.0f}% of kernel time")
    if names:
        text += "; e.g. " + ", ".join(str(n)[:60] for n in names[:3])
    bf16 = float(cc) >= 8.0
    fix = ("torch.autocast('cuda', dtype=torch.bfloat16) around forward and loss" if bf16 else
           "torch.autocast('cuda', dtype=torch.float16) with torch.amp.GradScaler (no bf16 before Ampere)")
    if bf16:
        fix += ("; or keep fp32 and allow TF32: torch.set_float32_matmul_precision('high'), "
                "torch.backends.cudnn.allow_tf32 = True")
    fix += f"; in trainperf: precision.dtype={'bf16' if bf16 else 'fp16'}"
    return {"severity": "critical" if f > FP32_CRIT else "warning", "evidence": text, "fix": fix, "gain": g,
            "fp32_share": f}


def pageable_copies(ev: Evidence) -> dict | None:
    m = ev.memcpy or {}
    us = m.get("pageable_us_per_step")
    if us is None:
        return {"unmeasured": "the trace records no memory copies"}
    step_s = ev.step_s or 0.0
    g = step_gain(step_s, us / 1e6, "host copies were pinned and asynchronous (overlapped with compute)")
    if not us or not g or g["fraction"] < MIN_GAIN:
        return None
    return {"severity": "warning", "gain": g,
            "evidence": f"copies from pageable host memory take {_ms(us)} per step{ev.where()} "
                        f"({m.get('pageable_count_per_step', 0):.1f} per step; {_pct(g['fraction'])} of the step, "
                        f"threshold {_pct(MIN_GAIN)}): a pageable copy is staged by the driver and blocks the host"}


COPY_WARN, COPY_CRIT = 0.20, 0.40  # host-device copies no kernel overlaps, share of the step


def copy_bound(ev: Evidence) -> dict | None:
    """The step is spent copying between host and device, with no kernel running beside the copies."""
    f = ev.memcpy_frac
    if f is None or f <= COPY_WARN:
        return None
    step_s = ev.step_s or 0.0
    m = ev.memcpy or {}
    dirs = sorted((m.get("by_direction") or {}).items(), key=lambda kv: -(kv[1].get("us") or 0.0))
    text = (f"host-device copies that no kernel overlaps take {_pct(f)} of the step{ev.where()} "
            f"({f * step_s * 1000:.1f} ms per step, threshold {_pct(COPY_WARN)})")
    if dirs:
        text += "; by direction: " + ", ".join(
            f"{d} {_ms(r.get('us_per_step'))} per step ({r.get('count', 0)} copies, {(r.get('bytes') or 0) / 1e9:.2f} GB"
            + (f", {r['gb_per_s']:.0f} GB/s" if r.get("gb_per_s") else "") + ")" for d, r in dirs[:3])
    pinned = m.get("pinned_us_per_step") or 0.0
    if pinned and pinned >= 0.5 * (m.get("us_per_step") or 0.0):
        text += "; the copies are from pinned memory already: what costs is that they are made at all, in the step"
    return {"severity": "critical" if f > COPY_CRIT else "warning", "evidence": text, "memcpy_share": f,
            "gain": step_gain(step_s, f * step_s, "the copies were not needed in the step, or ran beside compute")}


def host_syncs(ev: Evidence) -> dict | None:
    if ev.attribution is not None:  # the idle charged to the syncs (the drain after them included)
        return _syncs_charged(ev)
    rows = ev.host_syncs
    if rows is None:
        return {"unmeasured": "the trace has no CPU-side runtime events"}
    rows = [r for r in rows if (r.get("count_per_step") or 0) > 0]
    if not rows:
        return None
    blocked = sum(r.get("us_per_step") or 0.0 for r in rows)
    step_s = ev.step_s or 0.0
    idle = ev.gpu.idle_frac
    # the step can gain at most the GPU idle those syncs leave, and no more than the time the host was blocked
    saved_us = min(blocked, (idle or 0.0) * step_s * 1e6) if idle is not None else blocked
    g = step_gain(step_s, saved_us / 1e6, "the host never waited for the GPU inside the step")
    if not g or g["fraction"] < MIN_GAIN:
        return None
    top = sorted(rows, key=lambda r: -(r.get("us_per_step") or 0.0))[:4]
    text = (f"{sum(r['count_per_step'] for r in rows):.0f} host sync(s) per step{ev.where()} block the CPU "
          f"{_ms(blocked)} per step: " + ", ".join(f"{r['name']} x{r['count_per_step']:.0f} ({_ms(r.get('us_per_step'))})"
                                                  for r in top))
    if idle is not None:
        text += f"; the GPU is idle {_pct(idle)} of the time"
    return {"severity": "warning", "evidence": text, "gain": g}


def _syncs_charged(ev: Evidence) -> dict | None:
    from trainperf.diagnosis.rules_idle import IDLE_CRIT, IDLE_WARN, charged, describe, whatif_gain

    c, step_us = charged(ev, "sync"), (ev.attribution or {}).get("step_us") or 0.0
    if c is None or not step_us or c["us_per_step"] / step_us < IDLE_WARN:
        return None
    share = c["us_per_step"] / step_us
    text = describe(ev, c, share, IDLE_WARN) + ": the host waited for the GPU, the launch queue drained and the GPU " \
        "idled until the host launched again"
    rows = sorted((r for r in ev.host_syncs or [] if (r.get("count_per_step") or 0) > 0),
                  key=lambda r: -(r.get("us_per_step") or 0.0))[:4]
    if rows:
        text += "; syncs: " + ", ".join(f"{r['name']} x{r['count_per_step']:.0f}" for r in rows)
    return {"severity": "critical" if share > IDLE_CRIT else "warning", "evidence": text, "idle_share": share,
            "idle_us_per_step": c["us_per_step"], "gain": whatif_gain(ev, c, "the syncs")}


def low_occupancy(ev: Evidence) -> dict | None:
    o = ev.occupancy or {}
    occ, share = o.get("pct"), o.get("kernel_share")
    if occ is None:
        return {"unmeasured": "the trace has no 'est. achieved occupancy %' on its kernels (older torch, or "
                              "no CUPTI kernel records)"}
    busy = ev.gpu.busy_pct
    if occ >= OCC_LOW_PCT or (share or 0.0) < OCC_MIN_SHARE or (busy is not None and busy < OCC_MIN_BUSY):
        return None
    ws = o.get("warp_specialized_share") or 0.0
    text = (f"estimated achieved occupancy {occ:.0f}%{ev.where()} (kernel-time weighted, threshold {OCC_LOW_PCT:.0f}%) "
          f"over {_pct(share)} of kernel time; communication kernels and warp-specialized tensor-core kernels "
          f"(one large block per SM by design{f': {_pct(ws)} of kernel time' if ws else ''}) left out")
    return {"severity": "info", "evidence": text, "gain": None}


def straggler_by_trace(ev: Evidence) -> dict | None:
    """The straggler from the traces of every rank: by GPU compute per step, never by wall time."""
    tr = ev.trace_ranks or {}
    st = tr.get("straggler")
    if tr.get("count", 1) < 2:
        return {"unmeasured": "one rank: the straggler needs the traces of two or more ranks"}
    if not st:
        return {"unmeasured": "no compute time per step on at least two ranks"}
    if not st.get("slower"):
        return None
    r = st["rank"]
    late = next((x for x in tr.get("late_arrivals") or [] if x.get("rank") == r), None)
    if (late and late.get("causes_measured", True) and late.get("cause") not in (None, "compute")
            and (late.get("cause_share") or 0.0) >= 0.5):
        return None  # what made it late is named (its host, its loader...): the late_rank finding speaks
    step = ev.step_s
    waits = st.get("others_wait_us_per_step")
    what = tr.get("compute_definition") or "GPU time in non-communication kernels per step"
    text = (f"rank {r} computes {_ms(st['compute_us_per_step'])} per step ({what.replace(' per step', '')}) "
          f"against {_ms(st['median_others_us'])} for the median of the other ranks: {st['ratio']:.2f}x "
          f"(threshold {st['threshold_ratio']}x)")
    if waits is not None:
        what_waits = "collectives" if tr.get("compute_definition", "").startswith("step time") else "NCCL kernels"
        text += (f"; the other ranks wait {_ms(waits)} per step inside their collectives (median), rank {r} "
               f"{_ms(st.get('its_wait_us_per_step'))}: their {what_waits} are long because they wait for it")
    g = step_gain(step, st["excess_us_per_step"] / 1e6, f"rank {r} computed as fast as the median rank")
    return {"severity": "critical" if st["ratio"] > 1.5 else "warning", "rank": r, "ratio": st["ratio"],
            "clock": "trace", "evidence": text, "gain": g,
            "fix": f"look at rank {r}'s device (clocks, temperature, ECC / throttling: nvidia-smi -q -d "
                   "PERFORMANCE), its data shard and its host load; balance the work (trainperf: "
                   "parallelism.balance.enabled=true moves micro-batches off a slow rank)"}


__all__ = ["COPY_WARN", "MIN_GAIN", "copy_bound", "fp32_on_tensor_cores", "host_syncs", "low_occupancy", "pageable_copies",
           "straggler_by_trace"]
