"""The checks of the rules about where a step's time goes and how well the device is used: data wait,
exposed communication, launch-bound, memory left unused, low MFU, a diverged loss, and the founding
document's utilization targets.

Each check takes one :class:`~trainperf.diagnosis.evidence.Evidence` and returns a finding's fields
(``severity``, ``evidence`` and, where they differ from the rule's, ``cause``, ``fix``, ``gain``), None
(judged: nothing to report) or ``{"unmeasured": reason}``. The rules themselves (symptom, condition,
fields needed) are the entries of :data:`trainperf.diagnosis.rules.RULES`.
"""

from __future__ import annotations

from trainperf.diagnosis.evidence import Evidence, num, value
from trainperf.diagnosis.gain import step_gain

# Thresholds (fractions of step time, or percent for NVML/GPM figures).
DATA_WARN, DATA_CRIT = 0.20, 0.40
COMM_WARN, COMM_CRIT = 0.15, 0.30
IO_CPU_RATIO = 0.3  # CPU seconds per second of data wait (relative to the CPU the process gets) below this: IO
LOW_MFU_CATALOG = 0.30  # against a GPU's dense catalog peak
LAUNCH_BUSY_PCT = 70.0
LAUNCH_MIN_GAIN = 0.05  # launch_bound fires only where the idle the host leaves is at least this share of the step
MEMORY_USED_FRAC = 0.5
TARGET_GPU_UTIL, TARGET_SM_EFF, TARGET_MEMCOPY = 85.0, 70.0, 30.0


def pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def fmt_pct(v) -> str:
    return f"{v:.0f}%" if isinstance(v, (int, float)) else "n/a"


def fmt_us(v) -> str:
    if not isinstance(v, (int, float)):
        return "n/a"
    return f"{v:.1f} us" if v < 1000 else f"{v / 1000:.2f} ms"


# ---------------------------------------------------------------------------- data
def data_bound(ev: Evidence) -> dict | None:
    d = ev.data
    idle = None  # on a trace: the GPU idle charged to the loader along the critical path, its share of the step
    if ev.attribution is not None:
        from trainperf.diagnosis.rules_idle import IDLE_WARN, charged, whatif_gain

        c = charged(ev, "dataloader")
        step_us = ev.attribution.get("step_us") or 0.0
        idle = c["us_per_step"] / step_us if (c and step_us) else 0.0
    if d.fraction <= DATA_WARN and (idle is None or idle < IDLE_WARN):
        return None
    g = step_gain(ev.step_s, d.mean_s, f"{d.waits} were hidden")
    if idle:  # the step replayed without the loader's host time (the critical path's gain)
        g = whatif_gain(ev, c, d.waits)
    sev = "critical" if max(d.fraction, idle or 0.0) > DATA_CRIT else "warning"
    # the loader named (a trace): its kind; else the process CPU during the wait says IO or decoding
    found = _loader_kind(ev) if d.iterators is not None else _wait_kind(ev)
    if idle:
        found["evidence"] += f"; the GPU idles {100 * idle:.1f}% of the step waiting on it (charged along the critical path)"
        found["idle_us_per_step"] = c["us_per_step"]
    return {"severity": sev, "gain": g, **found}


def _loader_kind(ev: Evidence) -> dict:
    """A DataLoader the evidence names: in the training process (num_workers=0) or workers that lag."""
    d = ev.data
    single = bool(d.single_process)
    text = (f"{d.label} {pct(d.fraction)} of step time{ev.where()} ({1000 * d.mean_s:.1f} ms per step over "
            f"{ev.steps_used} step(s), threshold {pct(DATA_WARN)})")
    if d.iterators:
        text += f"; iterator {', '.join(d.iterators)}"
    if single:
        text += ": num_workers=0, batches are loaded in the training process"
        cause = ("the DataLoader runs in the training process (num_workers=0): loading, decoding and collating "
                 "sit on the step's critical path while the GPU idles")
        fix = ("DataLoader(num_workers=N, pin_memory=True, persistent_workers=True, prefetch_factor=2): N up to "
               "the CPU cores per GPU (`trainperf doctor` on that machine counts the cores the job may use); "
               "or trainperf's HybridLoader (disk cache, worker processes, device prefetch ring)")
    else:
        cause = "the DataLoader's workers do not keep up: too few workers, slow storage or heavy per-sample decoding"
        fix = ("raise DataLoader num_workers and prefetch_factor, pin_memory=True; cache or pre-decode the data "
               "(trainperf's HybridLoader: disk cache + prefetch ring; `trainperf data prepare`)")
    return {"evidence": text, "cause": cause, "fix": fix, "kind": "single_process" if single else "workers"}


def _wait_kind(ev: Evidence) -> dict:
    """IO- or decode-bound, from the CPU the process used while it waited (against the CPU it got)."""
    d = ev.data
    ratio, share = d.cpu_ratio, ev.cpu_share
    busy = ratio / share if (ratio is not None and share) else ratio
    text = f"{d.label} {pct(d.fraction)} of step time ({1000 * d.mean_s:.0f} ms per step, threshold {pct(DATA_WARN)})"
    if ratio is not None:
        text += f"; the training process used {100 * ratio:.0f}% of a core while waiting"
        if share is not None and share < 0.9:
            text += f" ({100 * share:.0f}% of a core was all it got in forward/backward: a busy machine)"
    if busy is not None and busy < IO_CPU_RATIO:
        kind = "io"
        text += " -> IO-bound"
        cause = "the loader waits on storage: reads are slow and not overlapped with compute (IO-bound)"
        fix = ("data.loader=hybrid with data.prefetch.io_threads=16 and data.prefetch.depth=8 (overlap reads); "
               "data.cache.dir=<local SSD> to cache remote reads")
    else:
        kind = "decode"
        text += " -> CPU-bound" if busy is not None else ""
        cause = "the loader is CPU-bound: decoding/collating batches in the training process (decode-bound)"
        fix = "data.loader=dataloader or hybrid with more data.num_workers; pre-tokenize (`trainperf data prepare`)"
    return {"evidence": text, "cause": cause, "fix": fix, "kind": kind, "data_cpu_ratio": ratio, "cpu_share": share}


# ---------------------------------------------------------------------------- communication
def comm_bound(ev: Evidence) -> dict | None:
    # The ranks that wait show the exposed communication: take the rank that waits most.
    per = {r: v["comm_fraction"] for r, v in ev.ranks.items()}
    rank = max(per, key=per.get) if per else 0
    f = per.get(rank, ev.comm.fraction)
    if f <= COMM_WARN:
        return None
    sec = ev.ranks[rank]["comm_s"] if rank in ev.ranks else ev.comm.mean_s
    step = (ev.ranks[rank].get("step_time_s") if rank in ev.ranks else None) or ev.step_s
    g = step_gain(step, sec, "communication were fully overlapped with compute")
    where = f" on rank {rank}" if len(per) > 1 else ev.where()
    sev = "critical" if f > COMM_CRIT else "warning"
    if ev.fixes == "code":
        return _comm_in_code(ev, f, sec, where, sev, g)
    return {"severity": sev, "gain": g,
            "evidence": f"exposed communication {pct(f)} of step time{where} ({1000 * sec:.0f} ms per step, threshold "
                        f"{pct(COMM_WARN)})",
            "cause": "gradient collectives are not hidden behind backward: too little compute per byte sent, "
                     "or a slow link",
            "fix": "parallelism.compression.type=bf16 (or powersgd); raise train.global_batch (more accumulation "
                   "per all-reduce); FSDP: parallelism.fsdp_reduce_dtype=bf16; check links with `trainperf doctor`"}


def _comm_in_code(ev: Evidence, f: float, sec: float, where: str, sev: str, g: dict | None) -> dict:
    """comm_bound's finding for a job whose fixes are PyTorch calls (any profiled job)."""
    c = ev.comm
    text = (f"exposed communication {pct(f)} of step time{where} ({1000 * sec:.1f} ms per step not overlapped "
            f"with compute, threshold {pct(COMM_WARN)}); comm/compute overlap {fmt_pct(c.overlap_pct)}")
    if c.includes_absent:  # no gain as if it were all transfer: part of it is waiting for ranks not here
        text += ("; this is communication which includes waiting for ranks not in these traces (the job's other "
                 "ranks): the wait cannot be told apart from the transfer")
        g = None
    if c.wait_s:
        text += (f"; a further {1000 * c.wait_s:.1f} ms per step is waiting for the slowest rank (see "
                 "straggler), not counted here")
    if c.kinds_us:
        text += "; by kind: " + ", ".join(f"{k} {v / 1000:.1f} ms" for k, v in c.kinds_us.items())
    return {"severity": sev, "evidence": text, "gain": g,
            "cause": "collectives run while the GPU has no compute to overlap them with: launched late, "
                     "serialized behind compute, or too little compute per byte",
            "fix": "DDP: bucket_cap_mb (smaller buckets start earlier), gradient_as_bucket_view=True, "
                   "static_graph=True; FSDP: forward_prefetch=True, backward_prefetch=BACKWARD_PRE, "
                   "limit_all_gathers; compress gradients (DDP comm hook bf16_compress_hook / PowerSGD); "
                   "more accumulation per all-reduce (no_sync); MoE: overlap all-to-all with expert compute"}


# ---------------------------------------------------------------------------- the device
def launch_bound(ev: Evidence) -> dict | None:
    if ev.attribution is not None:  # a trace: launches are the cause only where the idle is charged to them
        return _launches_charged(ev)
    busy = ev.gpu.busy_pct
    if busy is None or busy >= LAUNCH_BUSY_PCT:
        return None
    other = ev.data.fraction + ev.comm.fraction
    if other > 0.15:
        return None  # the GPU idles for data or communication: those rules speak
    text = (f"{ev.gpu.launch_label} {busy:.0f}% (threshold {LAUNCH_BUSY_PCT:.0f}%) while data + comm are only "
            f"{pct(other)} of step time")
    idle_s = (1 - busy / 100) * (ev.step_s or 0.0)
    hw = ev.gpu.host_wait_frac
    if hw is not None:
        idle_s = hw * (ev.step_time_s or 0.0)  # only the idle the host caused
        text += f"; the GPU waits for the host {pct(hw)} of the step (HTA's host_wait)"
    text += _launch_stats(ev)
    g = step_gain(ev.step_s, idle_s, "the GPU never waited for kernel launches")
    if not g or g["fraction"] < LAUNCH_MIN_GAIN:
        return None  # the GPU is not kept waiting by launches: its low utilization is another finding's
    fix = ("torch.compile(model) (fusion: fewer, larger kernels; mode='reduce-overhead' for CUDA graphs); CUDA "
           "graphs for a static step; a larger micro-batch (each launch does more work)") if ev.fixes == "code" else \
        "compile.enabled=true (compile.mode=reduce-overhead for CUDA graphs); raise train.micro_batch"
    return {"severity": "warning", "evidence": text, "fix": fix, "gain": g,
            "cause": "the host cannot launch kernels fast enough (many small kernels, Python overhead)"}


def _launch_stats(ev: Evidence) -> str:
    launch = ev.launch or {}
    if launch.get("short_kernel_pct") is None:
        return ""
    return (f"; {launch['short_kernel_pct']:.0f}% of {launch.get('kernels', '?')} kernels run shorter than their "
            f"launch (median kernel {fmt_us(launch.get('gpu_us_median'))}, launch "
            f"{fmt_us(launch.get('cpu_launch_us_median'))})")


def _launches_charged(ev: Evidence) -> dict | None:
    from trainperf.diagnosis.causes import cause as cause_of
    from trainperf.diagnosis.rules_idle import IDLE_CRIT, IDLE_WARN, charged, describe, whatif_gain

    c, step_us = charged(ev, "launch"), (ev.attribution or {}).get("step_us") or 0.0
    if c is None or not step_us or c["us_per_step"] / step_us < IDLE_WARN:
        return None
    share = c["us_per_step"] / step_us
    info = cause_of("launch")
    return {"severity": "critical" if share > IDLE_CRIT else "warning", "idle_share": share,
            "idle_us_per_step": c["us_per_step"],
            "evidence": describe(ev, c, share, IDLE_WARN) + _launch_stats(ev), "cause": info.why,
            "fix": info.fix(ev.fixes), "gain": whatif_gain(ev, c, "the launches")}


def memory_bound(ev: Evidence) -> dict | None:
    peak, cap = ev.mem_peak_bytes, ev.mem_capacity_bytes
    if not peak or not cap:
        return None
    frac = peak / cap
    mfu = ev.mfu
    if frac >= MEMORY_USED_FRAC or (mfu is not None and mfu >= 0.4):
        return None
    return {"severity": "info",
            "evidence": f"peak allocated {peak / 2**30:.1f} GiB of {cap / 2**30:.1f} GiB ({pct(frac)}, threshold "
                        f"{pct(MEMORY_USED_FRAC)})" + (f"; MFU {pct(mfu)}" if mfu is not None else ""),
            "cause": "the batch is too small for the memory: kernels are small and the device is under-fed",
            "fix": "raise train.micro_batch (about x2 per halving of the unused memory; check with "
                   "`trainperf memory CONFIG`); turn memory.checkpointing off if it is on"}


def low_mfu(ev: Evidence) -> dict | None:
    mfu, src = ev.mfu, ev.peak_source or ""
    if mfu is None or not src.startswith("catalog"):
        return None  # against a measured CPU matmul peak MFU is reported, not judged
    limit = LOW_MFU_CATALOG
    if mfu >= limit:
        return None
    return {"severity": "warning",
            "evidence": f"MFU {100 * mfu:.1f}% (threshold {100 * limit:.0f}%) against {src or 'the peak'}",
            "cause": "compute runs far below the device's peak: fp32 math, eager small kernels, or a small model/batch",
            "fix": "precision.dtype=bf16; compile.enabled=true; optimizer.type=fused_adam; raise train.micro_batch"}


def target(name: str, limit: float, above: bool, label_field: str):
    """A founding-document target on the device figure ``name`` (its label in ``label_field``)."""
    def check(ev: Evidence) -> dict | None:
        v = value(ev, name)
        if v is None or (v > limit if above else v < limit):
            return None
        return {"severity": "info", "gain": None,
                "evidence": f"{value(ev, label_field)} {v:.0f}% ({ev.window}{ev.where()}; target "
                            f"{'>' if above else '<'} {limit:.0f}%)"}
    return check


# ---------------------------------------------------------------------------- numerics
def loss_diverged(ev: Evidence) -> dict | None:
    loss = ev.loss
    if not loss:
        return None
    if loss["step"] is not None:
        what = "nan or inf (null in the file, which keeps no other)" if loss["value"] == "nan" else loss["value"]
        where = (f"the loss became {what} at step {loss['step']}; {loss['records']} of the {loss['of']} step records "
                 f"in {loss['file']} hold a loss that is not a number")
    else:
        where = f"summary.json's final_loss is {loss['summary_final_loss']}"
    last = loss.get("last_finite")
    if last:
        where += f"; the last finite loss was {last[1]:.4g} at step {last[0]}"
    if loss["stopped"]:
        where += ("; no summary.json: the run ended there (trainperf train stops a run whose loss is not finite: "
                  "'training diverged')")
    lr, clip, warm, dtype = (num(loss.get("lr")), num(loss.get("grad_clip")), num(loss.get("warmup_steps")),
                             loss.get("dtype"))
    known = lr is not None or clip is not None or warm is not None or dtype is not None
    ways = [f"lower optimizer.lr (now {lr:g}; e.g. {min(lr / 10, 3e-4):g})" if lr else "lower optimizer.lr "
            "(e.g. 3e-4)"]
    if not known or warm is None or warm < 100:
        ways.append("warm the learning rate up over more steps (schedule.warmup_steps" + (
            f", now {warm:g}; e.g. 100)" if warm is not None else ", e.g. 100)"))
    if not known or not clip:
        ways.append("clip gradients (train.grad_clip=1.0" + (", now off)" if clip == 0 else ")"))
    elif clip > 1:
        ways.append(f"clip gradients harder (train.grad_clip, now {clip:g}; e.g. 1.0)")
    if not known or dtype in ("fp16", None):
        ways.append("precision.dtype=bf16 instead of fp16 (fp16 overflows where bf16 does not)")
    return {"severity": "critical", "gain": None, "evidence": where, "step": loss["step"],
            "fix": "; ".join(ways) + "; then resume from a checkpoint before that step, or start over"}
