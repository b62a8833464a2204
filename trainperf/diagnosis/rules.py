"""The one rule table: every diagnosis rule is one entry of :data:`RULES`.

A rule names a symptom, the condition it fires on, the likely cause, what to try, the check that judges
it and the :class:`~trainperf.diagnosis.evidence.Evidence` fields it needs. The check reads fields, never
where they came from; a needed field that the reader could not measure (``Evidence.missing``) makes the
rule "not measured" with the reason the reader recorded, without running the check (the engine,
:func:`trainperf.diagnosis.engine.apply_rules`). A rule of scope "rank" is judged on each rank's evidence
(of traces) and reported once; scope "job" once over all ranks. Adding a rule is adding one entry here
(and its check, next to the checks of its kind): docs/development.md shows one.

The README's troubleshooting table and the rules reference page are generated from the table
(:func:`rules_markdown`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from trainperf.diagnosis import rules_idle as ID
from trainperf.diagnosis import rules_runtime as RT
from trainperf.diagnosis import rules_step as S
from trainperf.diagnosis import rules_trace as TR
from trainperf.diagnosis import rules_xla as X
from trainperf.diagnosis.evidence import FIELD_NAMES, Evidence

SEVERITY_ORDER = {"critical": 0, "warning": 1, "info": 2}
_pct = S.pct


@dataclass(frozen=True)
class Rule:
    id: str
    symptom: str
    condition: str
    cause: str
    fix: str
    check: Callable[[Evidence], dict | None]
    needs: tuple[str, ...] = ()
    """Evidence fields the check reads that a reader may be unable to measure (``gpu.busy_pct`` for a device
    figure); the first one missing from the evidence gives the reason the rule is not measured."""
    scope: str = "rank"
    """"rank": judged on each rank's evidence; "job": once, over every rank (straggler)."""

    def __post_init__(self):
        unknown = [f for f in self.needs if f not in FIELD_NAMES]
        if unknown:
            raise ValueError(f"rule {self.id!r} needs unknown Evidence field(s) {unknown}; see "
                             "trainperf/diagnosis/evidence.py")

    @property
    def not_from(self) -> dict[str, str]:
        """Which readers cannot give this rule what it needs ("run" | "trace" -> the reason they record)."""
        from trainperf.diagnosis.run_evidence import CANNOT_MEASURE as RUN
        from trainperf.diagnosis.trace_evidence import CANNOT_MEASURE as TRACE

        out = {}
        for src, gaps in (("run", RUN), ("trace", TRACE)):
            reason = next((gaps[f] for f in self.needs if f in gaps), None)
            if reason is not None:
                out[src] = reason
        return out


RULES: list[Rule] = [
    Rule("loss_diverged", "the loss became nan or inf (training diverged)", "a step record's loss is nan, inf or "
         "null (the trainer's divergence check stops the run there, before summary.json), or summary.json's "
         "final_loss is not finite", "updates too large for the model: learning rate too high or not warmed up, "
         "gradients not clipped, fp16 overflow", "lower optimizer.lr; raise schedule.warmup_steps; "
         "train.grad_clip=1.0; precision.dtype=bf16 instead of fp16", S.loss_diverged, needs=("loss",)),
    Rule("data_bound", "steps wait for batches", f"data phase (trace: DataLoader time) > {_pct(S.DATA_WARN)} of "
         f"step time (critical > {_pct(S.DATA_CRIT)}); IO- vs decode-bound from the process CPU during the wait "
         f"(< {S.IO_CPU_RATIO} of the CPU the process gets: IO); trace: num_workers=0 from the DataLoader iterator",
         "slow storage (IO) or CPU decoding in the training process",
         "data.loader=hybrid, prefetch depth/io_threads, data.cache.dir; more workers (DataLoader num_workers, "
         "pin_memory); pre-tokenize", S.data_bound),
    Rule("comm_bound", "ranks wait on collectives", f"exposed comm phase (trace: communication kernels not "
         f"overlapped by compute, waits for a straggler left out) > {_pct(S.COMM_WARN)} of step time on the rank "
         f"that waits most (critical > {_pct(S.COMM_CRIT)})", "collectives not overlapped with backward; slow links",
         "parallelism.compression.type=bf16/powersgd; larger global batch; fsdp_reduce_dtype=bf16; DDP bucket_cap_mb, "
         "FSDP prefetch", S.comm_bound),
    Rule("straggler", "one rank is slower than the others",
         f"a rank's own compute (the trainer's rank_compute_s: thread CPU time on CPU, CUDA events on GPU) "
         f"> {RT.STRAGGLER_RATIO}x the median of the other ranks', median over the log windows (critical > "
         f"{RT.STRAGGLER_CRIT}x); under tensor / pipeline parallelism by global rank, naming the slow rank's "
         "tensor-parallel group or pipeline stage; without rank_compute_s, each rank file's non-comm wall time; "
         "traces: each rank's GPU time in non-communication kernels per step (never wall time)",
         "one rank is slower (throttled clocks, a shared or slower device, a busy host) and every collective "
         "waits for it", "parallelism.balance.enabled=true; inspect that rank's clocks and host", RT.straggler,
         scope="job"),
    Rule("balancer", "the load balancer moved work between the ranks",
         "a run with parallelism.balance.enabled=true whose step records hold balance/* (a change of the ranks' "
         "speeds seen mid-run, a move tried, a verdict): listed in order, as information",
         "the ranks' speeds differ, or changed during the run (a straggler appeared, grew, moved or went away)",
         "nothing to do: the straggler rule judges what the balancer left; parallelism.balance.* tunes it",
         RT.balancer, scope="job"),
    Rule("late_rank", "the other ranks wait for one rank at their collectives",
         f"traces of two or more ranks: the rank that arrives last at the collectives (clock offsets corrected; "
         f"each collective split into the wait for the last arrival and the transfer) costs the job >= "
         f"{_pct(RT.LATE_WARN)} of the step (critical > {_pct(RT.LATE_CRIT)}), charged to what made it late (its "
         "allocator calls, syncs, DataLoader, launches, host ops, compute...); a late rank slow by its compute "
         "that the straggler rule names is left to it",
         "one rank's own cause (a host stall, its data, its device) holds every rank at the next collective",
         "remove that rank's cause (the finding names it and its fix)", RT.late_rank, scope="job"),
    Rule("host_contention", "the host is shared or unsteady: less CPU than asked, erratic step times",
         f"CPU runs: compute (the forward, backward and optimizer phases only: time between steps or outside "
         f"them, e.g. a loop's own sleep, is not counted) got < {RT.HOST_MIN_CORES} core per wall second, or < "
         f"{_pct(RT.HOST_MIN_SHARE)} of "
         f"run.threads while the machine is >= {RT.MACHINE_BUSY_PCT:.0f}% busy; any run: p90 step time > "
         f"{RT.SPREAD_WARN}x the median over >= {RT.SPREAD_MIN_STEPS} steady steps (critical > {RT.SPREAD_CRIT}x, "
         f"or < {_pct(RT.HOST_CRIT_SHARE)} of the threads)",
         "other processes share the cores (or the host throttles), so figures measured here are slow and noisy",
         "run on a quiet machine or pin the job (taskset / cgroup cpusets) to free cores; set run.threads to "
         "the cores it really gets; look at samples.jsonl (cpu_pct, proc_cpu_pct) and `top`",
         RT.host_contention, needs=("cpu_cores_got",)),
    Rule("oom_recovered", "the run ran out of memory and went on with a smaller micro-batch",
         "metrics.jsonl records oom/* (train.on_oom=halve_micro_batch acted)",
         "the micro-batch's activations did not fit on the device",
         "start with the micro-batch the run settled on (train.micro_batch), or checkpoint activations "
         "(memory.checkpointing) to keep the larger one; `trainperf memory CONFIG` shows the estimate",
         RT.oom_recovered, needs=("oom_events",)),
    Rule("compile_time", "compilation is a large share of the run",
         f"the '{RT.COMPILE_PHASE}' phase > {_pct(RT.COMPILE_INFO_FRAC)} of the training time",
         "torch.compile compiles on the first step (and on each recompilation); short runs do not amortize it",
         "longer runs amortize it; keep TORCHINDUCTOR_CACHE_DIR on a persistent disk so later runs reuse the "
         "kernels; compile.enabled=false for short experiments", RT.compile_time, needs=("compile_s",)),
    Rule("launch_bound", "GPU idle between small kernels (host-bound)", f"trace: the GPU idle charged to kernel "
         f"launches (the launch calls and their latency, on the critical path) >= {_pct(ID.IDLE_WARN)} of the step "
         f"(critical > {_pct(ID.IDLE_CRIT)}); run directory: NVML kernel-busy < {S.LAUNCH_BUSY_PCT:.0f}% with data + "
         f"comm < 15% of step time and the idle >= {_pct(S.LAUNCH_MIN_GAIN)} of the step",
         "Python/launch overhead, many small kernels",
         "compile.enabled=true (mode reduce-overhead: CUDA graphs); larger micro-batch", S.launch_bound,
         needs=("gpu.busy_pct",)),
    *(Rule(rid, symptom, f"trace: the GPU idle charged to {what} (along the critical path: the host thread that "
           f"launched the next GPU work was doing it) >= "
           f"{_pct(ID.UNTRACED_WARN if name == 'untraced' else ID.IDLE_WARN)} of the step (critical > "
           f"{_pct(ID.IDLE_CRIT)}); the gain is the step replayed without that host time", cause, fix,
           ID.idle_cause(name, warn=ID.UNTRACED_WARN if name == "untraced" else ID.IDLE_WARN),
           needs=("attribution",))
      for rid, name, symptom, what, cause, fix in (
        ("allocator_churn", "allocator", "the GPU waits while the host allocates and frees device memory",
         "cudaMalloc / cudaFree (hipMalloc / hipFree) and their host twins",
         "the caching allocator is bypassed or emptied every step: each free synchronizes the device",
         "no torch.cuda.empty_cache() in the loop; PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; do not set "
         "PYTORCH_NO_CUDA_MEMORY_CACHING; static shapes"),
        ("host_bound", "cpu_op", "the GPU waits while the host runs its operators",
         "host-side ops (dispatch, allocation, Python per op) between launches",
         "each op costs the host more than its kernels cost the GPU: many small ops",
         "torch.compile (fusion), CUDA graphs, a larger micro-batch; move host-only ops off the step"),
        ("optimizer_step", "optimizer", "the GPU waits while the host runs the optimizer step",
         "the optimizer step and zero_grad (Optimizer.step#..., Optimizer.zero_grad#...)",
         "a per-parameter optimizer: one small launch (or several) per tensor, from Python",
         "a fused or multi-tensor optimizer (fused=True / foreach=True); optimizer.type=fused_adam"),
        ("gc_pauses", "gc", "the GPU waits while Python collects garbage",
         "Python's garbage collector (gc events in the trace)", "collector pauses on the launching thread",
         "gc.freeze() after set-up; gc.disable() in the steps with gc.collect() every N steps"),
        ("untraced_host", "untraced", "the GPU waits on host time no profiler event covers",
         "untraced host time (no op, annotation or Python event covers it)",
         "Python between ops, logging, sleeps or I/O on the launching thread",
         "profile with with_stack=True (or py-spy) to name it; move it off the step's path"))),
    Rule("gpu_wait", "queued GPU work did not start on an idle device", f"trace: GPU work launched and queued "
         f"(more than 30 us after its launch returned) that did not start while the device idled >= "
         f"{_pct(ID.GPU_WAIT_INFO)} of the step (info: the trace does not show what it waited on)",
         "it waited on another device, another process, or events the profiler dropped",
         "profile every rank and process on the device; look for another job sharing the GPU (nvidia-smi)",
         ID.idle_cause("gpu_wait", warn=ID.GPU_WAIT_INFO, severity="info"), needs=("attribution",)),
    Rule("fp32_on_tensor_cores", "fp32 math on a GPU with tensor cores",
         f"trace: fp32 GEMM/convolution kernels a tensor core could run > {_pct(TR.FP32_WARN)} of the step "
         f"(critical > {_pct(TR.FP32_CRIT)}), compute capability >= 7.0",
         "the model runs in fp32 without TF32: tensor cores sit idle while CUDA cores do the matrix math",
         "torch.autocast bf16 (fp16 + GradScaler before Ampere) or TF32; precision.dtype=bf16",
         TR.fp32_on_tensor_cores, needs=("tensor_cores",)),
    Rule("pageable_copies", "host-to-device copies from pageable memory",
         f"trace: pageable memcpy time per step >= {_pct(TR.MIN_GAIN)} of the step",
         "tensors copied from pageable memory: the driver stages them and the host blocks; no overlap",
         "DataLoader(pin_memory=True) and .to(device, non_blocking=True); pinned buffers (HybridLoader)",
         TR.pageable_copies, needs=("memcpy",)),
    Rule("copy_bound", "the step is spent copying between host and device",
         f"trace: host-device copies that no kernel overlaps > {_pct(TR.COPY_WARN)} of the step (critical > "
         f"{_pct(TR.COPY_CRIT)})", "tensors move between host and device every step (weights offloaded to the host "
         "and brought back, a model or batch copied with .to(device) in the step) with no compute to hide them",
         "keep the weights and optimizer state resident on the GPU when they fit (FSDP CPUOffload / DeepSpeed "
         "offload cost exactly this); prefetch what must move: pinned memory, .to(device, non_blocking=True) on a "
         "side stream, one step or layer ahead", TR.copy_bound, needs=("memcpy",)),
    Rule("host_syncs", "the host waits for the GPU inside the step",
         f"trace: cudaDeviceSynchronize / cudaStreamSynchronize / aten::item / _local_scalar_dense in the step, the "
         f"GPU idle they can cost >= {_pct(TR.MIN_GAIN)} of the step",
         "a value is brought to the host every step (loss.item(), .cpu(), printing a tensor, nonzero(), an explicit "
         "synchronize): the launch queue drains and the GPU idles until the host catches up",
         "keep per-step values on the device and bring them to the host every N steps; no synchronize outside "
         "timing; find them with torch.cuda.set_sync_debug_mode('warn')", TR.host_syncs, needs=("host_syncs",)),
    Rule("low_occupancy", "kernels keep few warps resident on each SM",
         f"trace: estimated achieved occupancy < {TR.OCC_LOW_PCT:.0f}% (kernel-time weighted) over >= "
         f"{_pct(TR.OCC_MIN_SHARE)} of kernel time while the GPU is >= {TR.OCC_MIN_BUSY:.0f}% busy; "
         "warp-specialized and persistent tensor-core kernels (wgmma, sm90/sm100 CUTLASS, FlashAttention 3, any "
         "tensor-core kernel at no more than one block per SM), communication kernels and kernels Kineto could not "
         "estimate (occupancy 0) are left out (one large block per SM is their design)",
         "small grids or heavy per-thread resources (registers, shared memory): latency is not hidden",
         "larger batches/sequences per kernel; fuse small ops (torch.compile); scaled_dot_product_attention for "
         "attention; in a custom kernel, fewer registers or shared memory per block",
         TR.low_occupancy, needs=("occupancy",)),
    Rule("memory_bound", "memory left unused, device under-fed", f"peak allocated < {_pct(S.MEMORY_USED_FRAC)} of "
         "device memory and MFU < 40%", "batch too small for the memory", "raise train.micro_batch; "
         "drop activation checkpointing", S.memory_bound, needs=("mem_peak_bytes",)),
    Rule("low_mfu", "far below the device's peak", f"MFU < {_pct(S.LOW_MFU_CATALOG)} of the catalog dense peak "
         "(GPU only: on CPU, MFU against a measured matmul peak is reported, not judged)", "fp32, eager small kernels, "
         "small model or batch", "precision.dtype=bf16; compile.enabled=true; optimizer.type=fused_adam", S.low_mfu,
         needs=("mfu",)),
    Rule("gpu_util_below_target", "GPU kernel-busy below the founding target",
         f"NVML kernel-busy (trace: GPU utilization) < {S.TARGET_GPU_UTIL:.0f}%", "the GPU waits: see "
         "data/comm/launch findings", "fix the bottleneck named by the other findings",
         S.target("gpu.busy_pct", S.TARGET_GPU_UTIL, True, "gpu.busy_label"), needs=("gpu.busy_pct",)),
    Rule("sm_efficiency_below_target", "SMs idle while kernels run", f"SM activity (NVML GPM / DCGM; trace: "
         f"estimated SM efficiency) < {S.TARGET_SM_EFF:.0f}%", "kernels too small to fill the SMs",
         "raise train.micro_batch; compile.enabled=true",
         S.target("gpu.sm_active_pct", S.TARGET_SM_EFF, True, "gpu.sm_label"), needs=("gpu.sm_active_pct",)),
    Rule("mem_copy_above_target", "device memory busy copying", f"NVML memory-copy utilization > "
         f"{S.TARGET_MEMCOPY:.0f}%", "memory-bound kernels (elementwise, fp32, unfused)",
         "precision.dtype=bf16; compile.enabled=true (fusion); optimizer.type=fused_adam",
         S.target("gpu.mem_copy_util_pct", S.TARGET_MEMCOPY, False, "gpu.mem_copy_label"),
         needs=("gpu.mem_copy_util_pct",)),
    Rule("xla_recompile", "XLA keeps compiling new graphs after warm-up",
         f"XLA compilations inside the step in >= {X.RECOMPILE_STEPS_WARN} steps after warm-up (first 10% of "
         f"steps, at least {X.WARMUP_MIN_STEPS}); critical when compiling takes > "
         f"{100 * X.RECOMPILE_TIME_CRIT:.0f}% of the train time",
         "input shapes change between steps (sequence length, a last partial batch) or a Python value changes "
         "the traced graph, so each variant is compiled again",
         "feed fixed shapes: pad or bucket sequences to a few lengths, data.drop_last=true; keep changing Python "
         "values out of the graph; inspect with PT_XLA_DEBUG_LEVEL=1", X.xla_recompile, needs=("xla_steps",)),
]


def rules_markdown() -> str:
    """The troubleshooting table (README, the rules reference page), generated from RULES."""
    rows = ["| id | symptom | fires when | judged from | likely cause | what to try |", "|---|---|---|---|---|---|"]
    for r in RULES:
        src = ", ".join(x for x in ("run", "trace") if x not in r.not_from)
        rows.append(f"| `{r.id}` | {r.symptom} | {r.condition} | {src} | {r.cause} | {r.fix} |")
    return "\n".join(rows)


__all__ = ["RULES", "Rule", "SEVERITY_ORDER", "rules_markdown"]
