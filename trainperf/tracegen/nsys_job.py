"""One training job, simulated once, written in several formats (an Nsight Systems export by
:mod:`trainperf.tracegen.nsys`, a torch.profiler trace by :mod:`trainperf.tracegen.kineto_twin`): the same
kernels, copies, calls and CPU ranges at the same nanoseconds, so two readers of the two files must agree.

A process is simulated, not drawn: its CPU thread runs ops that launch work (each launch a runtime call with
a correlation id); each GPU stream runs its work in order, an event starting when its stream is free, its
launch has reached the GPU and what it waits for has ended (the gradient all-reduce waits for the last
backward GEMM, the optimizer for the all-reduce, the forward for the input copy). A launch blocks while
``QUEUE`` launched events have not finished (the launch queue is full), so the host cannot run ahead for
ever. Ranks of a job step together: each rank's all-reduce kernel ends when the last rank's has started plus
its own length, so a slow rank makes the others wait inside the collective.

**Causes** (``Job.causes``), each one a known slowdown that a before/after pair removes:

=====================  ========================================================================================
``pageable_copies``    the input batch (8 MB, copied on the compute stream as ``batch.to("cuda")`` does) comes
                       from pageable memory: 9 GB/s instead of 24, and the call blocks the host until it is done
``host_sync``          ``loss.item()`` after the forward: ``aten::item`` -> ``cudaStreamSynchronize`` waits
``fp32_gemm``          GEMMs in fp32 on CUDA cores (cuBLAS ``sm80_xmma_gemm_f32f32..._ffma``), 4x longer
``launch_bound``       every layer adds 24 tiny elementwise kernels, each shorter than its launch
``dataloader``         the DataLoader takes 6 ms before each step (a single-process loader)
``allocator``          the caching allocator is off: ``cudaMalloc`` / ``cudaFree`` per layer, cudaFree waits
=====================  ========================================================================================
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

US = 1000  # ns per us
QUEUE = 48
CAUSES = ("pageable_copies", "host_sync", "fp32_gemm", "launch_bound", "dataloader", "allocator")
DEVICES = {
    "h100": {"name": "NVIDIA H100 80GB HBM3", "cc": (9, 0), "num_sms": 132, "memory": 85520809984,
             "threads_per_sm": 2048, "smem_per_sm": 233472, "bandwidth": 3352320000000, "chip": "GH100"},
    "a100": {"name": "NVIDIA A100-SXM4-80GB", "cc": (8, 0), "num_sms": 108, "memory": 85899345920,
             "threads_per_sm": 2048, "smem_per_sm": 167936, "bandwidth": 2039000000000, "chip": "GA100"},
}
# (name, grid, block, registers, static smem, dynamic smem)
K_GEMM = ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off"
          "_kernel__5x_cublas", (264, 1, 1), (256, 1, 1), 128, 0, 32768)
K_GEMM32 = ("sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x128x8_stage3_warpsize2x2x1_ffma_aligna4_alignc4_"
            "execute_kernel__5x_cublas", (264, 1, 1), (128, 1, 1), 126, 16384, 0)
K_ADD = ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>, "
         "at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<c10::BFloat16>, at::detail::Array<char*, 3>)",
         (1056, 1, 1), (128, 1, 1), 24, 0, 0)
K_GELU = ("void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, "
          "at::native::GeluType)::{lambda()#2}::operator()() const::{lambda(c10::BFloat16)#1}, "
          "at::detail::Array<char*, 2> >(int, {lambda(c10::BFloat16)#1}, at::detail::Array<char*, 2>)",
          (1056, 1, 1), (128, 1, 1), 32, 0, 0)
K_NORM = ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>(int, float, "
          "c10::BFloat16 const*, c10::BFloat16 const*, c10::BFloat16 const*, float*, float*, c10::BFloat16*)",
          (4096, 1, 1), (256, 1, 1), 40, 2048, 0)
K_TINY = ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, at::detail::Array<char*, "
          "1> >(int, at::native::FillFunctor<float>, at::detail::Array<char*, 1>)", (1, 1, 1), (64, 1, 1), 16, 0, 0)
K_NCCL = ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", (24, 1, 1), (640, 1, 1),
          96, 0, 33344)
K_ADAM = ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::"
          "TensorListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor<c10::BFloat16, 4, "
          "(at::native::ADAM_MODE)1, false>, float*, double, double, double, double, double, double, bool, float*, "
          "float*>(...)", (640, 1, 1), (512, 1, 1), 72, 0, 0)
S_COMPUTE, S_COPY, S_COMM = 7, 13, 20
MEM_PAGEABLE, MEM_PINNED, MEM_DEVICE = 0, 1, 2  # nsys's ENUM_CUDA_MEM_KIND
HTOD, DTOH = 1, 2  # CUPTI memcpy kinds


@dataclass
class Job:
    """What to simulate. ``ranks``: processes, one GPU each (``share_gpu``: all on GPU 0). ``slow``: a rank
    whose compute kernels take ``slow_factor`` times longer."""
    steps: int = 6
    device: str = "h100"
    ranks: int = 1
    share_gpu: bool = False
    layers: int = 4
    causes: tuple = ()
    seed: int = 0
    step_range: str | None = "train_step"  # the NVTX range around a step (None: no step range)
    slow: int | None = None
    slow_factor: float = 1.0
    gemm_us: float = 160.0
    start_ns: int = 10_000_000_000  # the first event, on the capture's clock

    def __post_init__(self):
        bad = [c for c in self.causes if c not in CAUSES]
        if bad:
            raise ValueError(f"unknown cause(s) {bad}; the causes: {CAUSES}")
        if self.device not in DEVICES:
            raise ValueError(f"device {self.device!r}: one of {sorted(DEVICES)}")


@dataclass
class Proc:
    """One process's events, times in ns on the capture's clock."""
    rank: int
    pid: int
    device: int
    tid: int
    kernels: list = field(default_factory=list)  # (start, end, stream, spec, corr)
    copies: list = field(default_factory=list)  # (start, end, stream, kind, src, dst, bytes, corr)
    sets: list = field(default_factory=list)  # (start, end, stream, bytes, corr)
    calls: list = field(default_factory=list)  # (start, end, name, corr)
    ranges: list = field(default_factory=list)  # (start, end, name, role, op_id); role: op anno step dl nccl
    steps: list = field(default_factory=list)  # (start, end) of each step's CPU range


class _Sim:
    def __init__(self, job: Job, rank: int):
        dev = 0 if job.share_gpu else rank
        self.job, self.rng = job, random.Random(job.seed * 1000 + rank)
        self.p = Proc(rank=rank, pid=4000 + rank, device=dev, tid=4000 + rank)
        self.t = job.start_ns + rank * 37 * US
        self.free: dict[int, int] = {}
        self.outstanding: list[int] = []
        self.corr = 0
        self.op_id = 0
        self.last_gemm_end = 0
        self.factor = job.slow_factor if job.slow == rank else 1.0
        self.has = set(job.causes)

    def jit(self, us: float, f: float = 0.04) -> int:
        return int(round(us * US * (1.0 + self.rng.uniform(-f, f))))

    def call(self, name: str, dur_us: float, blocks_until: int = 0) -> tuple[int, int, int]:
        """A runtime call now; returns (start, end, corr). ``blocks_until``: the call returns no earlier."""
        self.corr += 1
        start = self.t
        end = max(start + self.jit(dur_us), blocks_until)
        self.p.calls.append((start, end, name, self.corr))
        self.t = end
        return start, end, self.corr

    def _queue(self) -> int:
        """When a launch can be accepted: once fewer than QUEUE launched events are still unfinished."""
        pending = sorted(e for e in self.outstanding if e > self.t)
        self.outstanding = pending
        return pending[len(pending) - QUEUE] if len(pending) >= QUEUE else 0

    def _place(self, stream: int, call_end: int, dur: int, after: int) -> tuple[int, int]:
        start = max(self.free.get(stream, 0), call_end + 2 * US, after)
        end = start + max(dur, 1)
        self.free[stream] = end
        self.outstanding.append(end)
        return start, end

    def kernel(self, spec: tuple, dur_us: float, stream: int = S_COMPUTE, after: int = 0, api: str = "cudaLaunchKernel"
               ) -> tuple[int, int]:
        _, call_end, corr = self.call(api, 4.5, blocks_until=self._queue())
        scale = self.factor if stream == S_COMPUTE else 1.0
        s, e = self._place(stream, call_end, self.jit(dur_us * scale, 0.03), after)
        self.p.kernels.append((s, e, stream, spec, corr))
        self.t += 1 * US
        return s, e

    def copy(self, nbytes: int, kind: int, src: int, dst: int, gbps: float, stream: int, blocking: bool = False
             ) -> tuple[int, int]:
        dur = int(nbytes / gbps)  # bytes / (GB/s) = ns
        gate = self._queue()
        start_call = self.t
        self.corr += 1
        corr = self.corr
        call_end = max(start_call + self.jit(8.0), gate)
        s, e = self._place(stream, call_end, dur, 0)
        if blocking:  # a pageable copy: the call returns once the driver has staged and copied it
            call_end = e + 3 * US
        self.p.calls.append((start_call, call_end, "cudaMemcpyAsync", corr))
        self.p.copies.append((s, e, stream, kind, src, dst, nbytes, corr))
        self.t = call_end + 1 * US
        return s, e

    def memset(self, nbytes: int) -> None:
        _, call_end, corr = self.call("cudaMemsetAsync", 5.0, blocks_until=self._queue())
        s, e = self._place(S_COMPUTE, call_end, max(int(nbytes / 1500), 1500), 0)
        self.p.sets.append((s, e, S_COMPUTE, nbytes, corr))

    def gemm(self, spec: tuple, us: float, after: int) -> tuple[int, int]:
        out = self.kernel(spec, us, S_COMPUTE, after)
        self.call("cudaStreamIsCapturing", 0.8)  # cuBLAS asks before each launch
        return out

    def rng_range(self, name: str, role: str, body, *args) -> Any:
        """A CPU range (an op, an annotation) around ``body``."""
        self.op_id += 1
        oid = self.op_id
        s = self.t
        self.t += self.jit(3.0)
        out = body(*args) if body else None
        self.t += self.jit(2.0)
        self.p.ranges.append((s, self.t, name, role, oid))
        return out

    def op(self, name: str, body=None, *args):
        return self.rng_range(name, "op", body, *args)

    def sync(self) -> None:
        """aten::item -> _local_scalar_dense -> a 4-byte DtoH copy and cudaStreamSynchronize."""
        def inner():
            self.copy(4, DTOH, MEM_DEVICE, MEM_PAGEABLE, 1.0, S_COMPUTE)
            busy = max(self.free.values()) if self.free else self.t
            self.call("cudaStreamSynchronize", 3.0, blocks_until=busy + 4 * US)
        self.op("aten::item", lambda: self.op("aten::_local_scalar_dense", inner))

    # ------------------------------------------------------------------ one step
    def forward_backward(self, n: int) -> None:
        job, has = self.job, self.has
        s0 = self.t
        self.p.steps.append([s0, None])
        loader = "_SingleProcessDataLoaderIter" if "dataloader" in has else "_MultiProcessingDataLoaderIter"
        self.rng_range(f"enumerate(DataLoader)#{loader}.__next__", "dl",
                       lambda: setattr(self, "t", self.t + self.jit(6000.0 if "dataloader" in has else 150.0)))
        pageable = "pageable_copies" in has
        _, in_end = self.op("aten::to", lambda: self.op("aten::copy_", lambda: self.copy(
            8 << 20, HTOD, MEM_PAGEABLE if pageable else MEM_PINNED, MEM_DEVICE, 9.0 if pageable else 24.0,
            S_COMPUTE, blocking=pageable)))  # batch.to("cuda"): on the current (compute) stream
        gemm = K_GEMM32 if "fp32_gemm" in has else K_GEMM
        g_us = job.gemm_us * (4.0 if "fp32_gemm" in has else 1.0)
        first = [in_end]

        def layer(backward: bool):
            if "allocator" in has:
                self.call("cudaMalloc", 35.0)
            k = 2 if backward else 1
            for _ in range(k):  # emit_nvtx nests PyTorch's op calls: a GEMM is about six ranges, one launch
                self.op("aten::t", self.op, "aten::transpose", self.op, "aten::as_strided")
                self.op("aten::matmul", self.op, "aten::mm", self.gemm, gemm, g_us, first.pop() if first else 0)
            self.op("aten::add", lambda: (self.op("aten::empty_strided"), self.kernel(K_ADD, 18.0)))
            self.op("aten::gelu_backward" if backward else "aten::gelu", self.kernel, K_GELU, 22.0)
            self.op("aten::native_layer_norm", self.kernel, K_NORM, 25.0)
            if "launch_bound" in has:
                for _ in range(24):
                    self.op("aten::fill_", self.kernel, K_TINY, 1.6)
            if "allocator" in has:  # cudaFree waits for the device to finish
                busy = max(self.free.values()) if self.free else self.t
                self.call("cudaFree", 20.0, blocks_until=busy + 2 * US)
        self.rng_range("forward", "anno", lambda: [self.op("aten::linear", layer, False)
                                                        for _ in range(job.layers)])
        if "host_sync" in has:
            self.sync()
        self.op("aten::zero_", self.memset, 64 << 20)
        self.rng_range("backward", "anno", lambda: [self.op("autograd::engine::evaluate_function: MmBackward0",
                                                                layer, True) for _ in range(job.layers)])
        self.last_gemm_end = self.free.get(S_COMPUTE, self.t)

    def all_reduce_ready(self) -> int:
        """Launch the gradient all-reduce; returns when this rank's kernel can start (its inputs are ready)."""
        self._ar_call = None

        def launch():
            _, call_end, corr = self.call("cudaLaunchKernel", 6.0, blocks_until=self._queue())
            self._ar_call = (call_end, corr)
            self.p.ranges.append((self.t - 5 * US, self.t - 1 * US, "ncclAllReduce", "nccl", 0))
        self.op("nccl:all_reduce", launch)
        call_end, _ = self._ar_call
        return max(self.free.get(S_COMM, 0), call_end + 2 * US, self.last_gemm_end)

    def finish_step(self, ar_start: int, ar_end: int) -> None:
        if self.job.ranks > 1:
            _, corr = self._ar_call
            self.p.kernels.append((ar_start, ar_end, S_COMM, K_NCCL, corr))
            self.free[S_COMM] = ar_end
            self.outstanding.append(ar_end)
        after = ar_end if self.job.ranks > 1 else 0
        self.rng_range("Optimizer.step#AdamW.step", "anno",
                       lambda: self.op("aten::_fused_adamw_", self.kernel, K_ADAM, 140.0, S_COMPUTE, after))
        self.p.steps[-1][1] = self.t
        self.t += self.jit(20.0)


def simulate(job: Job) -> list[Proc]:
    """Every rank's events, step by step (ranks meet in each step's all-reduce)."""
    sims = [_Sim(job, r) for r in range(job.ranks)]
    comm_us = 420.0
    for n in range(job.steps):
        for s in sims:
            s.forward_backward(n)
        ready = [s.all_reduce_ready() if job.ranks > 1 else 0 for s in sims]
        meet = max(ready)
        for s, r in zip(sims, ready):
            s.finish_step(r, meet + int(comm_us * US))
    for s in sims:
        s.p.steps = [tuple(x) for x in s.p.steps]
    return [s.p for s in sims]


def gpu_samples(p: Proc, period_ns: int = 100 * US) -> dict[str, list]:
    """GPU metrics samples of a process's GPU, derived from its events: per ``period_ns`` bin, the share of the
    bin kernels (all, tensor-core GEMMs) and copies cover, as nsys's percentages (integers)."""
    evs = [(s, e, "tc" if spec is K_GEMM else "k") for s, e, _, spec, _ in p.kernels] + \
        [(s, e, "c") for s, e, *_ in p.copies]
    if not evs:
        return {"timestamp": [], "values": {}}
    lo = min(s for s, _, _ in evs) // period_ns * period_ns
    hi = max(e for _, e, _ in evs)
    nb = (hi - lo) // period_ns + 1
    cover = {k: [0.0] * nb for k in ("k", "tc", "c")}
    for s, e, k in evs:
        b = (s - lo) // period_ns
        while b * period_ns + lo < e and b < nb:
            a, z = max(s, lo + b * period_ns), min(e, lo + (b + 1) * period_ns)
            cover[k][b] += (z - a) / period_ns
            if k == "tc":
                cover["k"][b] += (z - a) / period_ns
            b += 1
    k = [min(1.0, x) for x in cover["k"]]
    tc = [min(1.0, x) for x in cover["tc"]]
    c = [min(1.0, x) for x in cover["c"]]
    pct = (lambda xs, f: [int(round(100 * f * x)) for x in xs])
    return {"timestamp": [lo + i * period_ns for i in range(nb)],
            "values": {"SM Active [Throughput %]": pct(k, 0.92), "SM Issue [Throughput %]": pct(k, 0.55),
                       "Tensor Active [Throughput %]": pct(tc, 0.63),
                       "DRAM Read Bandwidth [Throughput %]": [int(round(100 * (0.28 * a + 0.05 * b))) for a, b in zip(k, c)],
                       "DRAM Write Bandwidth [Throughput %]": pct(k, 0.17),
                       "GR Active [Throughput %]": [int(round(100 * max(a, b))) for a, b in zip(k, c)]}}


__all__ = ["CAUSES", "DEVICES", "Job", "Proc", "gpu_samples", "simulate"]
