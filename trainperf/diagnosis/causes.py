"""What each named cause of lost time is, and what to do about it: one table shared by the rules that charge a
rank's idle GPU time to its host (:mod:`trainperf.diagnosis.rules_idle`) and the rule that charges the others'
waits to a late rank (:func:`trainperf.diagnosis.rules_runtime.late_rank`).

The cause names are those of the trace's attribution (:mod:`trainperf.trace.attribution`,
:mod:`trainperf.trace.blame`): GPU work (``compute``, ``communication``, ``memcpy``, ``memset``) and what the
host was doing (``allocator``, ``sync``, ``launch``, ``dataloader``, ``optimizer``, ``cpu_op``, ``gc``,
``untraced``, ``gpu_wait``). Each entry: how a finding names it, why it costs time, and the fix, written as
PyTorch calls (``code``) and, where trainperf has a setting for it, as that setting (``config``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Cause:
    label: str
    why: str
    code: str
    config: str | None = None

    def fix(self, fixes: str) -> str:
        return self.config if (fixes == "config" and self.config) else self.code


DATALOADER_FIX = ("DataLoader(num_workers=N, pin_memory=True, persistent_workers=True, prefetch_factor=2): N up to "
                  "the CPU cores per GPU (`trainperf doctor` counts them); or trainperf's HybridLoader (disk cache, "
                  "worker processes, device prefetch ring)")

CAUSES: dict[str, Cause] = {
    "allocator": Cause(
        "allocator calls (cudaMalloc/cudaFree)",
        "device memory is allocated and freed through the driver inside the step: cudaFree / hipFree synchronize "
        "the device and block the host, so the launch queue drains while the GPU idles (the caching allocator is "
        "bypassed or emptied every step)",
        "no torch.cuda.empty_cache() inside the training loop; PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
        "(PYTORCH_HIP_ALLOC_CONF on ROCm); do not set PYTORCH_NO_CUDA_MEMORY_CACHING (it turns the caching "
        "allocator off); static shapes (pad or bucket sequence lengths) so cached blocks are reused"),
    "sync": Cause(
        "host syncs",
        "the host waits for the GPU inside the step (a value brought to the host: .item(), .cpu(), printing a "
        "tensor, nonzero(), an explicit synchronize): the launch queue drains, and the GPU idles until the host "
        "has launched again",
        "keep per-step values on the device and bring them to the host every N steps; no synchronize outside "
        "timing; find each one with torch.cuda.set_sync_debug_mode('warn')"),
    "launch": Cause(
        "kernel launches",
        "the host cannot launch kernels as fast as the GPU runs them (many small kernels, Python overhead per op)",
        "torch.compile(model) (fusion: fewer, larger kernels; mode='reduce-overhead' for CUDA graphs); CUDA "
        "graphs for a static step; a larger micro-batch (each launch does more work)",
        "compile.enabled=true (compile.mode=reduce-overhead for CUDA graphs); raise train.micro_batch"),
    "dataloader": Cause(
        "the DataLoader",
        "the step waits for its next batch: loading, decoding and collating sit on the critical path",
        DATALOADER_FIX,
        "data.loader=hybrid with data.prefetch.depth and io_threads; more data.num_workers; data.cache.dir"),
    "optimizer": Cause(
        "the optimizer step",
        "the optimizer updates parameter by parameter: one small kernel (or several) per tensor, launched from "
        "Python",
        "a fused or multi-tensor optimizer: torch.optim.AdamW(..., fused=True) (or foreach=True); zero_grad("
        "set_to_none=True)",
        "optimizer.type=fused_adam"),
    "cpu_op": Cause(
        "host-side ops",
        "the host spends the time inside the operators themselves (dispatch, shape checks, allocation, Python per "
        "op) between launches: each op costs the host more than its kernels cost the GPU",
        "fewer, larger ops: torch.compile(model) (fusion), CUDA graphs (torch.compile(mode='reduce-overhead')) "
        "for a static step, a larger micro-batch; move host-only work (the ops named) off the step's path",
        "compile.enabled=true (compile.mode=reduce-overhead for CUDA graphs); raise train.micro_batch"),
    "gc": Cause(
        "garbage collection",
        "Python's garbage collector pauses the host thread that launches the GPU's work",
        "gc.freeze() after the model and data are set up; or gc.disable() during the steps and gc.collect() "
        "every N steps"),
    "untraced": Cause(
        "untraced host time (Python, sleeps, I/O)",
        "the host thread that launches the GPU's work is busy in code no profiler event covers: Python between "
        "ops, logging, sleeps, I/O",
        "profile with with_stack=True (or py-spy) to name it, then move it off the step's path or to a thread"),
    "gpu_wait": Cause(
        "GPU work waiting on what the trace does not show",
        "work was launched and queued but did not start: it waited on another device, another process, or "
        "events the profiler dropped",
        "profile every rank and process on the device; look for another job sharing the GPU (nvidia-smi)"),
    "compute": Cause(
        "its own compute",
        "this rank computes longer than the others (a slower or throttled device, or more work: an uneven "
        "batch or shard)",
        "look at that rank's device (clocks, temperature, throttling: nvidia-smi -q -d PERFORMANCE) and its data "
        "(equal batch sizes and sequence lengths per rank); balance the work",
        "parallelism.balance.enabled=true (moves micro-batches off a slow rank); check that rank's device and data"),
    "communication": Cause(
        "other collectives",
        "this rank was busy in other collectives (another process group) when the others arrived",
        "order the process groups' collectives the same way on every rank; overlap them with compute"),
    "memcpy": Cause(
        "copies",
        "host-device copies sit on this rank's path",
        "pinned memory and .to(device, non_blocking=True); copy ahead of use"),
    "memset": Cause(
        "fills",
        "memory fills sit on this rank's path",
        "avoid zero-filling buffers each step (zero_grad(set_to_none=True), torch.empty instead of zeros)"),
}


def cause(name: str | None) -> Cause:
    """The entry of ``name`` (an unknown name: a generic one that says its name)."""
    if name in CAUSES:
        return CAUSES[name]
    return Cause(str(name), f"time charged to {name}", "look at what that time is in the trace")


__all__ = ["CAUSES", "Cause", "DATALOADER_FIX", "cause"]
